"""Held-out evaluation: success, return, turns and format validity on seeds training never sees."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ragen2 import envs
from ragen2.agent.backends import HFBackend
from ragen2.agent.rollout import RolloutConfig, rollout, summarize
from ragen2.agent.types import Trajectory


def evaluate(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    env_name: str,
    env_kwargs: dict,
    cfg: RolloutConfig,
    episodes: int,
    batch_size: int | None = None,
) -> tuple[dict[str, float], list[Trajectory]]:
    """Play `episodes` held-out episodes (one per seed) with `cfg` (its temperature included).

    Returns `eval/...` metrics (success_rate, success_stderr, return_mean, turns_mean,
    valid_format_rate) and the trajectories.
    """
    seeds = envs.eval_seeds(episodes)
    backend = HFBackend(model, tokenizer, batch_size=batch_size)
    trajectories = rollout(backend, tokenizer, env_name, env_kwargs, seeds, list(range(episodes)), cfg)
    return _eval_metrics(summarize(trajectories), [t.success for t in trajectories]), trajectories


def random_agent(env_name: str, env_kwargs: dict, episodes: int, cfg: RolloutConfig, seed: int = 0) -> dict[str, float]:
    """A uniform-random agent with the same turn and action budget, always well-formed.

    The floor any trained policy must clear: each turn it plays `max_actions_per_turn`
    actions drawn uniformly from `env.valid_actions()`.
    """
    rng = np.random.default_rng(seed)
    returns, successes, turns = [], [], []
    for s in envs.eval_seeds(episodes):
        env = envs.make(env_name, **env_kwargs)
        env.reset(seed=s)
        total, done, success, played = 0.0, False, False, 0
        for _ in range(cfg.max_turns):
            played += 1
            for _ in range(cfg.max_actions_per_turn):
                actions = env.valid_actions()
                _, reward, terminated, truncated, info = env.step(actions[rng.integers(len(actions))])
                total += reward
                success = bool(info.get("success", False))
                done = terminated or truncated
                if done:
                    break
            if done:
                break
        returns.append(total)
        successes.append(success)
        turns.append(played)
    summary = {"rollout/return_mean": float(np.mean(returns)), "rollout/turns_mean": float(np.mean(turns)),
               "rollout/valid_format_rate": 1.0}
    return _eval_metrics(summary, successes)


def _eval_metrics(summary: dict[str, float], successes: list[bool]) -> dict[str, float]:
    n = len(successes)
    rate = float(np.mean(successes)) if n else 0.0
    return {
        "eval/success_rate": rate,
        "eval/success_stderr": math.sqrt(rate * (1 - rate) / n) if n else 0.0,
        "eval/return_mean": summary["rollout/return_mean"],
        "eval/turns_mean": summary["rollout/turns_mean"],
        "eval/valid_format_rate": summary["rollout/valid_format_rate"],
        "eval/episodes": float(n),
    }


def format_table(rows: dict[str, dict[str, float]]) -> str:
    """A plain-text table: one row per agent, one column per metric."""
    cols = ["success_rate", "success_stderr", "return_mean", "turns_mean", "valid_format_rate"]
    width = max(len(name) for name in rows) + 2
    lines = ["agent".ljust(width) + "".join(c.rjust(19) for c in cols)]
    for name, metrics in rows.items():
        lines.append(name.ljust(width) + "".join(f"{metrics['eval/' + c]:19.3f}" for c in cols))
    return "\n".join(lines)


def evaluate_cli(
    model: str,
    env_name: str,
    episodes: int,
    temperature: float,
    device: str,
    overrides: list[str],
    out: Path | None,
    compare_random: bool,
) -> dict:
    """`ragen2 eval`: evaluate a model (and a random agent) with the env's preset rollout settings."""
    from ragen2.config import load_config, preset_names
    from ragen2.models.loading import load_policy

    preset = env_name if env_name in preset_names() else None
    config = load_config(preset, [f"env.name={env_name}", f"model.device={device}", *overrides])
    cfg = dataclasses.replace(config.rollout, temperature=temperature)
    policy, tokenizer = load_policy(None if model == "tiny" else model, config.model.device, config.model.dtype)
    rows = {}
    metrics, _ = evaluate(policy, tokenizer, env_name, config.env.kwargs, cfg, episodes)
    rows["policy"] = metrics
    if compare_random:
        rows["uniform-random"] = random_agent(env_name, config.env.kwargs, episodes, cfg)
    out = out or Path(f"eval-{env_name}.json")
    result = {
        "model": model,
        "env": env_name,
        "env_kwargs": config.env.kwargs,
        "episodes": episodes,
        "temperature": temperature,
        "device": str(policy.device),
        "results": rows,
    }
    out.write_text(json.dumps(result, indent=2))
    title = f"{env_name}: {episodes} held-out seeds, temperature {temperature}, device {policy.device}"
    return {"table": title + "\n" + format_table(rows), "json_path": out, **result}
