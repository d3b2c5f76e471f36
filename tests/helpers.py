"""Helpers shared by tests in several folders (tests/ is on sys.path, as for chat_templates.py): `import helpers`.

The vLLM tests import it too, in .venv-vllm (`make test-vllm`): only torch, hypothesis and ragen2 at module level."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch
from hypothesis import settings

from ragen2.models.tiny import build_model

if TYPE_CHECKING:
    from ragen2.config import Config

# The size of the tiny random Qwen2 policies (build_model's arguments): two layers, a few thousand parameters.
TINY_MODEL = {"hidden_size": 32, "num_layers": 2, "num_heads": 2, "num_kv_heads": 1, "intermediate_size": 64}

# Property tests of the numerics (advantages, losses): more examples than hypothesis's default, no deadline.
PROPERTY_SETTINGS = settings(max_examples=60, deadline=None)


def t64(values: list) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64)


def tiny_run_config(policy_dir: Path, run_dir: Path, *overrides: str) -> Config:
    """Bandit on the CPU with the policy at `policy_dir`, writing to `run_dir`: 2 steps of 2 groups x 4 episodes of
    at most 8 tokens, no evaluation, no progress bar or TensorBoard; then `overrides`."""
    from ragen2.config import load_config

    return load_config("bandit", [
        f"model.path={policy_dir}", "model.device=cpu", f"trainer.run_dir={run_dir}",
        "rollout.num_groups=2", "rollout.group_size=4", "rollout.max_tokens_per_turn=8",
        "trainer.total_steps=2", "trainer.eval_every=0", "logging.progress=false", "logging.tensorboard=false",
        *overrides,
    ])


class AnsweringBackend:
    """A generation backend that answers each prompt with `self.answer(the prompt's text)`: the answer's tokens (no
    EOS), finish reason "stop". A subclass writes `answer`."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def answer(self, prompt: str) -> str:
        raise NotImplementedError

    def generate(self, prompts, *, max_new_tokens, temperature, top_p, **kwargs):
        from ragen2.agent.types import GenerationOutput

        answers = [self.answer(self.tokenizer.decode(p)) for p in prompts]
        return [GenerationOutput(token_ids=self.tokenizer.encode(a), text=a, finish_reason="stop") for a in answers]


def fine_tune(tokenizer, rows: list[tuple[list[int], list[int]]], steps: int, lr: float, path: Path):
    """A tiny Qwen2 over `tokenizer` (hidden size 64), fitted on one thread by `steps` full-batch AdamW steps at
    `lr` on `rows`, each (token ids, labels: -100 where no loss is taken), padded on the right; saved with
    `tokenizer` at `path`. Returns the model."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    model = build_model(tokenizer, hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=128)
    width = max(len(ids) for ids, _ in rows)
    ids = torch.tensor([r + [tokenizer.pad_token_id] * (width - len(r)) for r, _ in rows])
    labels = torch.tensor([lab + [-100] * (width - len(lab)) for _, lab in rows])
    mask = (torch.arange(width)[None] < torch.tensor([len(r) for r, _ in rows])[:, None]).long()
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    for _ in range(steps):
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    torch.set_num_threads(threads)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return model
