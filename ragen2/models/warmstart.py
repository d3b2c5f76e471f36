"""Warm start of the tiny policy: solver demonstrations -> BPE tokenizer -> small Qwen2 -> supervised fine-tuning.

`ragen2 train` with no model must do real RL on a 2-core CPU within minutes (DESIGN §5).
A randomly initialised model never produces a parseable `<think>..</think><answer>..</answer>`
turn, so RL would have no reward to learn from. This module builds a policy that already
answers in format, reasons about the state in front of it and beats a random agent, in
about three minutes on two cores, and caches it.

    demos (ragen2.models.demos) ─► tokenizer (tiny.build_tokenizer) ─► Conversation samples
        ─► tiny.build_model ─► SFT on the response tokens ─► save_pretrained (atomic) ─► cache

Demonstrations go through `ragen2.agent.Conversation`, the code path that builds rollout
samples, so the warm start trains on exactly the token layout RL later trains on.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import os
import re
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ragen2.agent.conversation import user_message
from ragen2.agent.parsing import TAGS
from ragen2.envs import EVAL_SEED_OFFSET  # demonstrations stay on training seeds, below it
from ragen2.errors import ConfigError, did_you_mean
from ragen2.models.demos import DemoEpisode, play_demo
from ragen2.models.tiny import build_model, build_tokenizer

log = logging.getLogger(__name__)

# Bump when the demonstrations, the tokenizer or the training change, so old caches are not reused.
WARMSTART_VERSION = "2"

INFO_FILE = "warmstart.json"

# How the environments name a grid cell; every cell named in the demonstrations becomes one token.
CELL_PATTERN = re.compile(r"\(row \d+, col \d+\)")


@dataclass(frozen=True)
class WarmStartConfig:
    """Everything that decides the warm-started weights; its hash names the cache directory.

    Defaults are sized for the 5-minute budget on 2 CPU cores.
    """

    seed: int = 0
    """Seeds the demonstration seeds, the Bandit oracle's choices, the initialisation and the data order."""
    envs: tuple[str, ...] = ("sokoban", "frozenlake", "bandit")
    """Environments to demonstrate; each needs an oracle in `ragen2.models.demos.ORACLES`."""
    env_kwargs: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Per-environment constructor kwargs, e.g. {"sokoban": {"dim_room": [6, 6]}}; missing = env defaults."""
    episodes_per_env: int = 2000
    """Demonstration episodes per environment, on training seeds (below EVAL_SEED_OFFSET)."""
    max_turns: int = 5
    """Turns per demonstration episode (the rollout default: 5 turns x 2 actions)."""
    max_actions_per_turn: int = 2
    """Actions per demonstrated answer (the rollout default)."""
    vocab_size: int = 1024
    """Byte-level BPE vocabulary, special and tag tokens included."""
    hidden_size: int = 128
    """Model width."""
    num_layers: int = 4
    """Transformer blocks."""
    num_heads: int = 4
    """Attention heads."""
    num_kv_heads: int = 2
    """Key/value heads (grouped-query attention, as in Qwen2)."""
    intermediate_size: int = 384
    """MLP width."""
    steps: int = 600
    """Optimizer steps of supervised fine-tuning."""
    lr: float = 2e-3
    """Peak AdamW learning rate (linear warm-up, cosine decay to a tenth)."""
    warmup_steps: int = 30
    """Steps of linear learning-rate warm-up."""
    weight_decay: float = 0.01
    """AdamW weight decay."""
    batch_tokens: int = 8192
    """Padded tokens per batch; sequences of similar length are batched together."""
    grad_clip: float = 1.0
    """Global gradient-norm clip."""

    def __post_init__(self) -> None:
        for name in ("episodes_per_env", "max_turns", "max_actions_per_turn", "steps", "batch_tokens"):
            if getattr(self, name) < 1:
                raise ConfigError(f"warmstart {name}={getattr(self, name)} is not allowed: use an integer >= 1")
        if not self.envs:
            raise ConfigError("warmstart envs=() is not allowed: name at least one environment")
        if self.lr <= 0:
            raise ConfigError(f"warmstart lr={self.lr} is not allowed: use a positive number")
        object.__setattr__(self, "envs", tuple(self.envs))

    def key(self) -> str:
        """Short hash of the settings and WARMSTART_VERSION: equal keys mean interchangeable weights."""
        blob = json.dumps({"version": WARMSTART_VERSION, **dataclasses.asdict(self)}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:12]


def default_cache_dir() -> Path:
    """`$RAGEN2_CACHE`, else `~/.cache/ragen2`."""
    return Path(os.environ.get("RAGEN2_CACHE") or Path.home() / ".cache" / "ragen2")


def cache_path(config: WarmStartConfig, cache_dir: str | Path | None = None) -> Path:
    """Where the warm start of `config` lives in the cache."""
    return Path(cache_dir or default_cache_dir()) / f"tiny-policy-{config.key()}"


def ensure_tiny_policy(seed: int = 0, cache_dir: str | Path | None = None) -> Path:
    """The default tiny policy's directory, warm-started on first use and cached after."""
    return warmstart(cache_path(WarmStartConfig(seed=seed), cache_dir), seed=seed)


def warmstart(out_dir: str | Path | None = None, seed: int = 0, force: bool = False, **settings: Any) -> Path:
    """Build the warm-started tiny policy into `out_dir` (default: the cache) and return that directory.

    `settings` are `WarmStartConfig` fields (steps, envs, episodes_per_env, ...). A directory
    that already holds a warm start with the same settings is reused unless `force`. The
    result appears atomically: it is written to a temporary sibling and renamed, so an
    interrupted run never leaves a directory that looks complete. It loads with
    `AutoModelForCausalLM.from_pretrained` and `AutoTokenizer.from_pretrained`.
    """
    config = _make_config(seed, settings)
    out = Path(out_dir) if out_dir is not None else cache_path(config)
    if out.exists() and not force:
        if _stored_key(out) == config.key():
            log.info("warm start: reusing %s", out)
            return out
        if any(out.iterdir()):
            raise ConfigError(
                f"{out} exists and does not hold a warm start with these settings (key {config.key()}); "
                "choose another directory or pass force=True to replace it"
            )
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        _build(config, tmp)
        if force and out.exists():
            shutil.rmtree(out)
        try:
            os.rename(tmp, out)  # atomic; fails when `out` is a non-empty directory
        except OSError:
            if _stored_key(out) != config.key():
                raise
            log.info("warm start: another process saved %s first; using it", out)
            shutil.rmtree(tmp)
            return out
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log.info("warm start: saved %s", out)
    return out


def _make_config(seed: int, settings: dict[str, Any]) -> WarmStartConfig:
    names = [f.name for f in dataclasses.fields(WarmStartConfig)]
    for key in settings:
        if key not in names or key == "seed":
            raise ConfigError(f"unknown warmstart setting {key!r}; valid: {', '.join(n for n in names if n != 'seed')}." + did_you_mean(key, names))
    return WarmStartConfig(seed=seed, **settings)


def _stored_key(path: Path) -> str | None:
    try:
        return json.loads((path / INFO_FILE).read_text())["key"]
    except (OSError, ValueError, KeyError):
        return None


def _build(config: WarmStartConfig, out: Path) -> None:
    """The warm start proper: demos, tokenizer, model, SFT, then save into `out`."""
    start = time.perf_counter()
    rng = np.random.default_rng(config.seed)
    demos = make_demos(config, rng)
    log.info("warm start: %d demonstration episodes in %.1fs", len(demos), time.perf_counter() - start)

    tokenizer = demo_tokenizer(demos, config.vocab_size)
    samples = [s for ep in demos for s in ep.conversation(tokenizer).samples()]
    lengths = [len(ids) for ids, _ in samples]
    log.info(
        "warm start: tokenizer of %d tokens; %d samples, %d tokens (max length %d)",
        len(tokenizer), len(samples), sum(lengths), max(lengths),
    )

    model = build_model(
        tokenizer,
        hidden_size=config.hidden_size,
        num_layers=config.num_layers,
        num_heads=config.num_heads,
        num_kv_heads=config.num_kv_heads,
        intermediate_size=config.intermediate_size,
        max_position_embeddings=max(4096, 2 * max(lengths)),
        seed=config.seed,
    )
    log.info("warm start: model of %.2fM parameters", model.num_parameters() / 1e6)
    losses = sft(model, tokenizer, samples, config, rng)

    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    tail = losses[-max(1, len(losses) // 10) :]
    info = {
        "key": config.key(),
        "version": WARMSTART_VERSION,
        "settings": dataclasses.asdict(config),
        "num_parameters": model.num_parameters(),
        "num_samples": len(samples),
        "num_tokens": sum(lengths),
        "sft_loss_initial": losses[0],
        "sft_loss_final": float(np.mean(tail)),
        "wall_time_s": round(time.perf_counter() - start, 1),
    }
    (out / INFO_FILE).write_text(json.dumps(info, indent=2) + "\n")


def make_demos(config: WarmStartConfig, rng: np.random.Generator) -> list[DemoEpisode]:
    """Oracle episodes of every env on distinct training seeds drawn below EVAL_SEED_OFFSET."""
    demos = []
    for name in config.envs:
        seeds = rng.choice(EVAL_SEED_OFFSET, size=config.episodes_per_env, replace=False)
        kwargs = config.env_kwargs.get(name, {})
        demos += [
            play_demo(name, kwargs, int(s), config.max_turns, config.max_actions_per_turn, rng) for s in seeds
        ]
    return demos


def demo_tokenizer(demos: list[DemoEpisode], vocab_size: int) -> PreTrainedTokenizerBase:
    """The tiny policy's tokenizer: BPE trained on the demonstrations, each grid cell one token."""
    corpus = _corpus(demos)
    cells = sorted({cell for text in corpus for cell in CELL_PATTERN.findall(text)})
    return build_tokenizer(corpus, vocab_size=vocab_size, phrases=cells)


def _corpus(demos: list[DemoEpisode]) -> list[str]:
    """Texts to train the BPE on: what the chat template will show, tags removed (they are added tokens)."""
    texts = ["system\nuser\nassistant\n"]
    for ep in demos:
        texts.append(ep.system_prompt)
        for k, turn in enumerate(ep.turns, start=1):
            texts.append(user_message(k, turn.observation, turn.actions_left))
            response = turn.response
            for tag in TAGS:
                response = response.replace(tag, "\n")
            texts.append(response)
    return texts


def sft(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    samples: list[tuple[list[int], list[int]]],
    config: WarmStartConfig,
    rng: np.random.Generator,
) -> list[float]:
    """Supervised fine-tuning on the mask-1 tokens of `samples`; returns the loss of every step.

    Batches hold sequences with the same opening (one environment's system prompt) and similar
    length, so little compute goes to padding and the shared prefix is computed once per
    batch (see `batch_loss`); their order is reshuffled every epoch from `rng`.
    """
    torch.manual_seed(config.seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, betas=(0.9, 0.95), weight_decay=config.weight_decay)
    model.train()
    losses: list[float] = []
    batches: list[list[int]] = []
    start = time.perf_counter()
    for step in range(config.steps):
        if not batches:
            batches = _length_buckets(samples, config.batch_tokens, rng)
        for group in optimizer.param_groups:
            group["lr"] = _lr_at(step, config)
        loss = batch_loss(model, [samples[i] for i in batches.pop()], tokenizer.pad_token_id)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
        optimizer.step()
        losses.append(loss.item())
        if (step + 1) % 100 == 0 or step == config.steps - 1:
            log.info(
                "warm start: step %d/%d loss %.4f (mean of the last 100) lr %.2e (%.0fs)",
                step + 1, config.steps, np.mean(losses[-100:]), _lr_at(step, config), time.perf_counter() - start,
            )
    model.eval()
    return losses


def batch_loss(model: PreTrainedModel, batch: list[tuple[list[int], list[int]]], pad_id: int) -> torch.Tensor:
    """Mean cross-entropy over the mask-1 tokens of `batch`, with its common prefix computed once.

    Equal to one forward pass over the right-padded batch (a test checks loss and gradients):
    the prefix that every sequence shares and that holds no scored token (in the warm start:
    the system prompt, about half of every sequence) runs once, its key/value cache is
    repeated across the batch, and only the rest of each sequence runs per row. Gradients
    flow back through the repeated cache into the prefix.
    """
    first_scored = min(seq_mask.index(1) for _, seq_mask in batch)
    shared = _common_prefix_length([seq for seq, _ in batch])
    # Token t is predicted at position t-1, so the prefix ends before the first scored token's predecessor.
    p = min(shared, first_scored - 1)
    ids, mask, attention = _pad([(seq[p:], seq_mask[p:]) for seq, seq_mask in batch], pad_id)  # [B, T-p] each
    cache = None
    if p > 0:
        cache = model.base_model(input_ids=torch.tensor([batch[0][0][:p]]), use_cache=True).cache
        cache.batch_repeat_interleave(len(batch))  # [1, ...] -> [B, ...] per layer
        attention = torch.cat([torch.ones(len(batch), p, dtype=attention.dtype), attention], dim=1)  # [B, T]
    hidden = model.base_model(input_ids=ids, attention_mask=attention, cache=cache).last_hidden_state
    # hidden: [B, T-p, H]. Position t predicts token t+1; only scored positions go through the
    # output layer, since most of a sequence is prompt.
    scored = mask[:, 1:].bool()  # [B, T-p-1]
    logits = model.get_output_embeddings()(hidden[:, :-1][scored])  # [N, V]
    return F.cross_entropy(logits, ids[:, 1:][scored])


def _common_prefix_length(seqs: list[list[int]]) -> int:
    n = min(len(s) for s in seqs)
    for i in range(n):
        if any(s[i] != seqs[0][i] for s in seqs):
            return i
    return n


def _length_buckets(samples: list[tuple[list[int], list[int]]], batch_tokens: int, rng: np.random.Generator) -> list[list[int]]:
    """One epoch of batches of `batch_tokens` padded tokens at most, in random order.

    Samples are grouped by their first tokens (which system prompt they open with), then
    sorted by length with ties broken at random, and cut into batches within each group.
    """
    openings: dict[tuple[int, ...], int] = {}
    for ids, _ in samples:
        openings.setdefault(tuple(ids[:_OPENING_TOKENS]), len(openings))
    tiebreak = rng.permutation(len(samples))
    order = sorted(
        range(len(samples)),
        key=lambda i: (openings[tuple(samples[i][0][:_OPENING_TOKENS])], len(samples[i][0]), tiebreak[i]),
    )
    batches, current = [], []
    for i in order:
        # Within a group `order` is ascending, so the newest sample sets the padded width of the batch.
        new_group = current and samples[i][0][:_OPENING_TOKENS] != samples[current[0]][0][:_OPENING_TOKENS]
        if current and (new_group or (len(current) + 1) * len(samples[i][0]) > batch_tokens):
            batches.append(current)
            current = []
        current.append(i)
    batches.append(current)
    return [batches[j] for j in rng.permutation(len(batches))]


# Tokens that identify a sample's system prompt, for grouping; a wrong guess costs speed, not correctness.
_OPENING_TOKENS = 32


def _pad(batch: list[tuple[list[int], list[int]]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-pad to the longest sequence: input ids, loss mask and attention mask, each [B, T]."""
    width = max(len(ids) for ids, _ in batch)
    ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    attention = torch.zeros((len(batch), width), dtype=torch.long)
    for row, (seq, seq_mask) in enumerate(batch):
        ids[row, : len(seq)] = torch.tensor(seq)
        mask[row, : len(seq)] = torch.tensor(seq_mask)
        attention[row, : len(seq)] = 1
    return ids, mask, attention


def _lr_at(step: int, config: WarmStartConfig) -> float:
    """Linear warm-up, then cosine decay to a tenth of the peak (nanoGPT's schedule)."""
    if step < config.warmup_steps:
        return config.lr * (step + 1) / config.warmup_steps
    progress = (step - config.warmup_steps) / max(1, config.steps - config.warmup_steps)
    return config.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))
