"""Warm start of a pretrained model: supervised fine-tuning (LoRA or full) on the solver demonstrations.

A small pretrained instruct model (SmolLM2-135M) seldom answers in the
`<think>..</think><answer>..</answer>` format (none of 72 turns at temperature 0.5,
docs/environments.md), so most RL groups have no reward variance and the filter skips them.
Fine-tuning it on the demonstrations the tiny policy learns from (`ragen2.models.demos`)
teaches the format in minutes; RL then starts from a policy whose turns earn rewards.

    demos ─► Conversation(base tokenizer) ─► SFT on the assistant tokens (warmstart.sft)
        ─► merge LoRA ─► save_pretrained (atomic) ─► evaluate before / after ─► warmstart.json

The demonstrations are rendered through `ragen2.agent.Conversation` with the base model's own
tokenizer and chat template, so every training sequence is byte-identical to what a rollout
of the same responses would store. The saved directory is a plain Hugging Face model (LoRA is
merged into the weights): `model.path=OUT` loads it like any other model.

`ENV+tools` entries teach native tool calls (`rollout.tool_calls=true`): the demonstrations are
rendered with `tools=`, and their held-out evaluation runs with tool calls. A base whose template
ignores `tools=` (SmolLM2's) gets a tools-aware ChatML template first (`ensure_tools_template`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from jinja2 import TemplateError
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ragen2.cache import default_cache_dir
from ragen2.envs.base import bracket_tool
from ragen2.errors import ConfigError
from ragen2.models.demos import PRETRAINED_ORACLES
from ragen2.models.lora import add_lora
from ragen2.models.tiny import TOOLS_CHAT_TEMPLATE
from ragen2.progress import heartbeat
from ragen2.models.policy_store import INFO_FILE, save_atomically
from ragen2.models.warmstart import WarmStartConfig, demo_env, demo_samples, make_config, make_demos, sft

log = logging.getLogger(__name__)

# Bump when the demonstrations' rendering, the training or the evaluation change.
BASE_WARMSTART_VERSION = "2"

# Sized on SmolLM2-135M with 2 CPU cores (docs/environments.md has the run): 160 LoRA steps of about
# 6 s (15 minutes) took held-out FrozenLake success from 0 to 0.75 (random: 0.125) and every turn to
# the format; 40 steps taught the format but not the path. Sokoban's long samples are left to a GPU.
BASE_DEFAULTS: dict[str, Any] = {
    "envs": ("bandit", "frozenlake"),
    "episodes_per_env": 300,
    "steps": 160,
    "lr": 1e-3,
    "warmup_steps": 5,
    "batch_tokens": 1024,
}
EVAL_EPISODES = 32  # held-out episodes per environment before and after: standard errors of about 0.08
# WarmStartConfig fields that describe the tiny model and its tokenizer; a pretrained base has its own.
ARCHITECTURE_SETTINGS = ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads", "intermediate_size")


@dataclass(frozen=True)
class BaseWarmStartConfig:
    """Everything that decides a pretrained model's warm start; its hash names the cache directory."""

    base: str
    """The pretrained model: a directory, a hub name, a .gguf file or `smollm2-135m`."""
    demos: WarmStartConfig
    """Demonstrations and SFT settings (envs, episodes_per_env, steps, lr, batch_tokens, ...), shared with the tiny warm start."""
    lora_rank: int = 16
    """LoRA rank on every linear layer, merged into the saved weights; 0 fine-tunes every weight."""
    eval_episodes: int = EVAL_EPISODES
    """Held-out episodes per environment for the before / after / random evaluation."""

    def __post_init__(self) -> None:
        if self.lora_rank < 0:
            raise ConfigError(f"warmstart --lora-rank {self.lora_rank} is not allowed: use 0 (full fine-tuning) or a rank >= 1")
        if self.eval_episodes < 0:
            raise ConfigError(f"warmstart --eval-episodes {self.eval_episodes} is not allowed: use 0 (no evaluation) or more")

    def key(self) -> str:
        """Short hash of the settings and BASE_WARMSTART_VERSION: equal keys mean interchangeable results."""
        blob = json.dumps({"version": BASE_WARMSTART_VERSION, **dataclasses.asdict(self)}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:12]


def make_base_config(base: str, seed: int = 0, lora_rank: int = 16, eval_episodes: int = EVAL_EPISODES, **settings: Any) -> BaseWarmStartConfig:
    """`settings` (WarmStartConfig fields) over BASE_DEFAULTS; the tiny model's architecture fields are refused."""
    misplaced = [k for k in settings if k in ARCHITECTURE_SETTINGS]
    if misplaced:
        raise ConfigError(
            f"warmstart --base {base}: {', '.join(misplaced)} set(s) the tiny model's architecture, which a "
            "pretrained base does not have; drop it, or use --lora-rank for the size of the update"
        )
    if settings.get("stop_at_success"):
        raise ConfigError(f"warmstart --base {base}: stop_at_success stops the tiny policy's warm start only; a "
                          "pretrained base trains its `steps` and reports held-out success before and after")
    return BaseWarmStartConfig(
        base=base, demos=make_config(seed, BASE_DEFAULTS | settings), lora_rank=lora_rank, eval_episodes=eval_episodes
    )


def base_cache_path(config: BaseWarmStartConfig, cache_dir: str | Path | None = None) -> Path:
    """Where the warm start of `config` lives in the cache: named by the base and the settings' hash."""
    name = Path(config.base.rstrip("/")).name.replace(".gguf", "") or "model"
    return Path(cache_dir or default_cache_dir()) / f"warmstart-{name}-{config.key()}"


def warmstart_base(
    base: str, out_dir: str | Path | None = None, seed: int = 0, force: bool = False, device: str = "cpu",
    lora_rank: int = 16, eval_episodes: int = EVAL_EPISODES, **settings: Any,
) -> Path:
    """Fine-tune the pretrained `base` on the solver demonstrations into `out_dir` (default: the cache); return it.

    `settings` are WarmStartConfig fields (envs, episodes_per_env, steps, lr, warmup_steps,
    batch_tokens, ...) over BASE_DEFAULTS. The directory appears atomically and is reused when
    it already holds this warm start (unless `force`). Its warmstart.json records, per
    environment, the held-out success and valid-format rates before and after fine-tuning and
    the uniform-random agent's, each with its n and standard error.
    """
    config = make_base_config(base, seed=seed, lora_rank=lora_rank, eval_episodes=eval_episodes, **settings)
    out = Path(out_dir) if out_dir is not None else base_cache_path(config)
    return save_atomically(out, config.key(), lambda tmp: _build_base(config, tmp, device), force)


def _build_base(config: BaseWarmStartConfig, out: Path, device: str) -> None:
    from ragen2.models.loading import load_policy

    start = time.perf_counter()
    model, tokenizer = load_policy(config.base, device=device)
    demos_config = config.demos
    template = "own"
    if any(demo_env(entry)[1] for entry in demos_config.envs):
        template = ensure_tools_template(tokenizer, config.base)
    rng = np.random.default_rng(demos_config.seed)
    demos = make_demos(demos_config, rng, PRETRAINED_ORACLES)
    samples, env_of_sample = demo_samples(demos, tokenizer, demos_config.envs, demos_config.env_memory)
    lengths = [len(ids) for ids, _ in samples]
    log.info("warm start of %s: %d samples, %d tokens (max length %d)", config.base, len(samples), sum(lengths), max(lengths))

    evaluation = {env: {"before": _evaluate(model, tokenizer, env, config)} for env in demos_config.envs}
    policy = model
    if config.lora_rank:
        model = add_lora(model, config.lora_rank, 2 * config.lora_rank, "all-linear")
        policy = model.get_base_model()  # the base with the adapters injected: what `sft` trains
    sft_start = time.perf_counter()
    losses = sft(policy, tokenizer, samples, env_of_sample, demos_config, rng)
    sft_time = time.perf_counter() - sft_start
    if config.lora_rank:
        model = model.merge_and_unload()  # plain weights: the directory loads without peft
    for env in demos_config.envs:
        evaluation[env]["after"] = _evaluate(model, tokenizer, env, config)
        evaluation[env]["random"] = _evaluate(None, tokenizer, env, config)

    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    tail = losses[-max(1, len(losses) // 10) :]
    info = {
        "key": config.key(),
        "version": BASE_WARMSTART_VERSION,
        "base": config.base,
        "settings": dataclasses.asdict(config),
        "num_parameters": model.num_parameters(),
        "num_samples": len(samples),
        "num_tokens": sum(lengths),
        "sft_loss_initial": losses[0],
        "sft_loss_final": float(np.mean(tail)),
        "sft_time_s": round(sft_time, 1),
        "chat_template": template,
        "threads": torch.get_num_threads(),
        "device": device,
        "eval": evaluation,
        "wall_time_s": round(time.perf_counter() - start, 1),
    }
    (out / INFO_FILE).write_text(json.dumps(info, indent=2) + "\n")


def ensure_tools_template(tokenizer: PreTrainedTokenizerBase, base: str) -> str:
    """Make `tokenizer`'s chat template render tools for the `ENV+tools` demonstrations; returns which it uses.

    "own" when the base's template already shows the schemas passed as `tools=` (Qwen2.5, Qwen3,
    Llama 3.1+). Many templates ignore `tools=` (SmolLM2-Instruct's renders every message as plain
    ChatML): the policy would be trained to call tools it was never shown. A ChatML base (its
    vocabulary has `<|im_start|>` and `<|im_end|>`) then gets the tiny policy's tools-aware ChatML
    template, which lays tools out as Qwen2.5's does and renders tool-less chats as plain ChatML;
    the saved tokenizer carries it, so rollouts use the layout the demonstrations were trained on.
    Any other base is refused, since a ChatML template would not match its special tokens.
    """
    if _renders_tools(tokenizer):
        return "own"
    if not {"<|im_start|>", "<|im_end|>"} <= tokenizer.get_vocab().keys():
        raise ConfigError(
            f"warmstart --base {base}: its chat template ignores tools=, and it is not a ChatML model, so the "
            "ENV+tools demonstrations cannot show the tools; use a base whose template renders tools (Qwen2.5, "
            "Qwen3, Llama 3.1+), or name the plain envs"
        )
    log.warning("warm start of %s: its chat template ignores tools=; using the tools-aware ChatML template "
                "(ragen2.models.tiny.TOOLS_CHAT_TEMPLATE), which the saved tokenizer carries", base)
    tokenizer.chat_template = TOOLS_CHAT_TEMPLATE
    return "tools ChatML"


def _renders_tools(tokenizer: PreTrainedTokenizerBase) -> bool:
    """Whether the chat template shows a tool passed as `tools=` (one that raises on it does not)."""
    probe = bracket_tool("ragen2_probe_tool", "A probe.", "x", "A probe.")
    chat = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    try:
        text = tokenizer.apply_chat_template(chat, tools=[probe], tokenize=False, add_generation_prompt=True)
    except TemplateError:
        return False
    return "ragen2_probe_tool" in text


def _evaluate(
    model: PreTrainedModel | None, tokenizer: PreTrainedTokenizerBase, entry: str, config: BaseWarmStartConfig
) -> dict[str, float]:
    """Held-out success and valid-format rate of `model` (None: the uniform-random agent) on the preset of
    `entry`'s env (with `rollout.tool_calls=true` for `ENV+tools`), with n and standard errors. The format
    rate is over turns; its error treats turns as independent."""
    from ragen2.config import load_config
    from ragen2.evaluate import evaluate, random_agent

    n = config.eval_episodes
    if n == 0:
        return {"episodes": 0}
    env, tool_calls = demo_env(entry)
    preset = load_config(env, ["rollout.tool_calls=true"] if tool_calls else [])
    cfg = dataclasses.replace(preset.rollout, temperature=preset.trainer.eval_temperature)
    if model is None:
        metrics = random_agent(env, preset.env.kwargs, n, cfg, seed=config.demos.seed)
        turns = round(metrics["eval/turns_mean"] * n)
    else:
        torch.manual_seed(config.demos.seed)
        start = time.perf_counter()
        with heartbeat(f"warm start: evaluating on {n} {env} episodes", log.info):
            metrics, trajectories = evaluate(model, tokenizer, env, preset.env.kwargs, cfg, n)
        turns = sum(len(t.turns) for t in trajectories)
        log.info("warm start: %s evaluated on %d episodes in %.0fs: success %.3f ± %.3f, valid format %.3f, "
                 "return %.3f", env, n, time.perf_counter() - start, metrics["eval/success_rate"],
                 metrics["eval/success_stderr"], metrics["eval/valid_format_rate"], metrics["eval/return_mean"])
    fmt = metrics["eval/valid_format_rate"]
    return {
        "episodes": n,
        "success_rate": metrics["eval/success_rate"],
        "success_stderr": metrics["eval/success_stderr"],
        "valid_format_rate": fmt,
        "valid_format_stderr": math.sqrt(fmt * (1 - fmt) / max(turns, 1)),
        "turns": turns,
        "return_mean": metrics["eval/return_mean"],
    }


def format_summary(path: str | Path) -> str:
    """The before / after / random table of a warm start's warmstart.json, for the terminal."""
    info = json.loads((Path(path) / INFO_FILE).read_text())
    width = max([12, *(len(env) + 2 for env in info["eval"])])  # `searchqa+tools` is longer than the plain names
    lines = [f"{'env':<{width}}{'agent':<8}{'n':>4}{'success':>16}{'valid format':>18}"]
    for env, rows in info["eval"].items():
        for agent, m in rows.items():
            if m["episodes"]:
                lines.append(
                    f"{env:<{width}}{agent:<8}{m['episodes']:>4}{m['success_rate']:>9.3f} ± {m['success_stderr']:.3f}"
                    f"{m['valid_format_rate']:>11.3f} ± {m['valid_format_stderr']:.3f}"
                )
    return "\n".join(lines)
