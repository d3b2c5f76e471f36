"""Held-out evaluation: success, return, turns and format validity on seeds training never sees.

Also what eval and training save of sample episodes, so a rate can be read next to what the model
said: rollout records (the format `ragen2 diagnose` reads), transcripts, and the results
directories of `ragen2 eval` and `ragen2 diagnose`.

It evaluates a policy its caller has loaded (the trainer's, the warm start's) and loads none itself, so
`ragen2.models` may use it; the `ragen2 eval` command, which loads the model, is `ragen2.eval_cli`.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ragen2 import envs
from ragen2.agent.backends import HFBackend
from ragen2.agent.rollout import RolloutConfig, group_seeds, rollout, stop_strings, summarize
from ragen2.agent.types import Trajectory, Turn
from ragen2.mixture import TaggedEnv, tagged_metrics

if TYPE_CHECKING:
    from ragen2.serve.agent_loop import AgentRunner
    from ragen2.serve.batcher import Sampling


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
    backend = HFBackend(model, tokenizer, stop_strings(cfg), batch_size=batch_size, prefix_reuse=cfg.prefix_reuse)
    trajectories = rollout(backend, tokenizer, env_name, env_kwargs, seeds, list(range(episodes)), cfg)
    return _eval_metrics(summarize(trajectories), [t.success for t in trajectories]), trajectories


def evaluate_agent(
    runner: AgentRunner, episodes: int, sampling: Sampling, seed: int
) -> tuple[dict[str, float], list[Trajectory]]:
    """`evaluate` for an agent loop (`agent.entrypoint`): one episode per held-out seed, sampled with `sampling`,
    each from its own stream derived from `seed`."""
    from ragen2.agent.rollout import stable_seed

    seeds = envs.eval_seeds(episodes)
    trajectories = runner.play(seeds, list(range(episodes)), [stable_seed(seed, i) for i in range(episodes)], sampling)
    return _eval_metrics(summarize(trajectories), [t.success for t in trajectories]), trajectories


def evaluate_mixture(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    entries: list[TaggedEnv],
    cfg: RolloutConfig,
    group_size: int,
    batch_size: int | None = None,
) -> tuple[dict[str, float], list[Trajectory]]:
    """Each entry's `count` held-out episodes as groups of `group_size` episodes per seed, in one rollout.

    Returns the `eval/...` metrics of `evaluate` over every episode, the same per entry as
    `eval/<tag>/...` plus `eval/<tag>/pass@<group_size>` (`pass_at_k`), and the trajectories.
    """
    specs, seeds, group_ids = [], [], []
    for entry in entries:
        entry_seeds, ids = group_seeds(envs.EVAL_SEED_OFFSET, entry.count // group_size, group_size)
        specs += [entry] * len(entry_seeds)
        seeds += entry_seeds
        group_ids += [len(set(group_ids)) + g for g in ids]
    backend = HFBackend(model, tokenizer, stop_strings(cfg), batch_size=batch_size, prefix_reuse=cfg.prefix_reuse)
    trajectories = rollout(backend, tokenizer, "", {}, seeds, group_ids, cfg, episode_envs=specs)

    def metrics_of(part: list[Trajectory]) -> dict[str, float]:
        successes = np.array([t.success for t in part]).reshape(-1, group_size)  # [groups, G]
        return _eval_metrics(summarize(part), [t.success for t in part]) | {
            f"eval/pass@{group_size}": pass_at_k(successes)
        }

    overall = _eval_metrics(summarize(trajectories), [t.success for t in trajectories])
    return overall | tagged_metrics(metrics_of, trajectories, [t.tag for t in trajectories]), trajectories


def pass_at_k(successes: np.ndarray) -> float:
    """The fraction of groups with at least one success; successes: bool [groups, k], one row per seed."""
    return float(successes.any(axis=1).mean()) if len(successes) else 0.0


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
    } | {f"eval/{key}": summary[f"rollout/{key}"]  # a policy's rollouts have them, the random agent's not
         for key in ("prompt_tokens_mean", "memory_turns_mean", "memory_valid_rate") if f"rollout/{key}" in summary}


def format_table(rows: dict[str, dict[str, float]]) -> str:
    """A plain-text table: one row per agent, one column per metric."""
    cols = ["success_rate", "success_stderr", "return_mean", "turns_mean", "valid_format_rate"]
    width = max(len(name) for name in rows) + 2
    lines = ["agent".ljust(width) + "".join(c.rjust(19) for c in cols)]
    for name, metrics in rows.items():
        lines.append(name.ljust(width) + "".join(f"{metrics['eval/' + c]:19.3f}" for c in cols))
    return "\n".join(lines)


def write_rollout_records(path: Path, trajectories: list[Trajectory], tokenizer: PreTrainedTokenizerBase) -> None:
    """One JSON object per turn, in the rollout-record format `ragen2 diagnose` reads (DESIGN §4).

    `group` is the environment seed (turns of the same input share it); `prompt` is the
    full context the model saw, chat template included. The text fields are for people and
    text-only readers; the token ids are what the model saw and sampled, so a trace can be
    scored, replayed or trained on without re-tokenising (which need not give the same ids).
    Log-probs are rounded to 6 decimals: float32 carries about 7 significant digits, and the
    full repr of each would double the size of the field.
    """
    vocab = tokenizer_fingerprint(tokenizer)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for episode, traj in enumerate(trajectories):
            for turn_index, turn in enumerate(traj.turns):
                record = {
                    "group": traj.seed,
                    "prompt": tokenizer.decode(turn.prompt_ids, skip_special_tokens=False),
                    "reasoning": turn.reasoning,
                    "response": turn.response_text,
                    "reward": turn.reward,
                    "episode": episode,
                    "turn": turn_index,
                    "role": turn.role,
                    "prompt_ids": list(turn.prompt_ids),
                    "response_ids": list(turn.response_ids),
                    "reasoning_span": list(turn.reasoning_span),
                    "logprobs": None if turn.logprobs is None else [round(x, 6) for x in turn.logprobs],
                    "tokenizer": vocab,
                    **({"memory": True} if turn.memory else {}),
                }
                f.write(json.dumps(record) + "\n")


def tokenizer_fingerprint(tokenizer: PreTrainedTokenizerBase) -> str:
    """First 16 hex digits of the sha256 of the vocabulary (token -> id, added tokens included).

    Token ids mean the same to two tokenizers exactly when their vocabularies are equal, whatever
    their names, paths or pre-tokenisers: a checkpoint's tokenizer matches its base model's.
    """
    vocab = json.dumps(sorted(tokenizer.get_vocab().items()))
    return hashlib.sha256(vocab.encode()).hexdigest()[:16]


def new_results_dir(kind: str, source: str | Path, *details: str) -> Path:
    """Create and return `kind/<name>[-<details>]-<time>/` in the current directory, for `ragen2 eval` / `diagnose`.

    <name> is the source's file stem (or, for a directory or hub name, its last part), prefixed with the
    run's name when the source sits in a run's checkpoints/ or rollouts/: runs/X/checkpoints/step_30 ->
    X-step_30. A new directory each time, so a later command never overwrites an earlier one's results.
    """
    p = Path(source)
    name = p.stem if p.is_file() else p.name
    if p.parent.name in ("checkpoints", "rollouts") and p.parent.parent.name:
        name = f"{p.parent.parent.name}-{name}"
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", "-".join([name, *details])).strip("._") or kind
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out, n = Path(kind) / f"{name}-{stamp}", 1
    while out.exists():
        n += 1
        out = Path(kind) / f"{name}-{stamp}-{n}"
    out.mkdir(parents=True)
    return out


def _episode_header(traj: Trajectory) -> str:
    outcome = "success" if traj.success else "no success"
    end = "error" if traj.error else "terminated" if traj.terminated else "truncated" if traj.truncated else "ended"
    turns = f"{len(traj.turns)} turn{'' if len(traj.turns) == 1 else 's'}"
    return f"seed {traj.seed}: {outcome}, return {traj.episode_return:.3f}, {turns}, {end}"


def _feedback(turn: Turn) -> str:
    """What the environment made of a turn: the parsed actions, validity and the turn's reward."""
    actions = ", ".join(turn.actions) if turn.actions else "none"
    checks = [] if turn.format_valid else ["format invalid"]
    if turn.format_valid and not turn.actions_valid:
        checks.append("an action was invalid")
    return f"actions {actions}; {'; '.join(checks) + '; ' if checks else ''}reward {turn.reward:.3f}"


def format_transcript(traj: Trajectory, tokenizer: PreTrainedTokenizerBase) -> str:
    """The whole conversation of one episode as text: every prompt, model output and environment response.

    A turn's prompt is shown as the text added after the previous turn's output when the context
    grew by appending (the full history), else in full (rollout.context_turns cut the history).
    """
    lines = [f"=== {_episode_header(traj)}"]
    if traj.error:
        lines.append(f"environment error: {traj.error}")
    previous: list[int] | None = None
    for k, turn in enumerate(traj.turns, start=1):
        if previous is not None and turn.prompt_ids[: len(previous)] == previous:
            shown, what = turn.prompt_ids[len(previous):], f"prompt (the text added after turn {k - 1}'s output)"
        else:
            shown, what = turn.prompt_ids, "prompt (whole context, chat template included)"
        lines += [f"--- turn {k}: {what}", tokenizer.decode(shown, skip_special_tokens=False),
                  f"--- turn {k}: model output", turn.response_text,
                  f"--- turn {k}: environment: {_feedback(turn)}"]
        previous = list(turn.prompt_ids) + list(turn.response_ids)
    return "\n".join(lines) + "\n"


def short_transcript(traj: Trajectory, max_turns: int = 3, width: int = 160) -> str:
    """A few terminal lines of one episode: the first state, then each turn's output and what it earned.

    An output longer than `width` keeps its start and its end, where the answer is, around "...".
    """

    def cut(text: str) -> str:
        text = " ".join(text.split())
        head = width // 3
        return text if len(text) <= width else text[:head] + " ... " + text[len(text) - (width - head - 5):]

    lines = [_episode_header(traj)]
    if traj.turns:
        lines += ["  first state:", *("    " + line[:width] for line in traj.turns[0].observation.splitlines()[:10])]
    for k, turn in enumerate(traj.turns[:max_turns], start=1):
        lines += [f"  turn {k} output: {cut(turn.response_text)}", f"  turn {k} {_feedback(turn)}"]
    hidden = len(traj.turns) - max_turns
    if hidden > 0:
        lines.append(f"  ({hidden} more turn{'' if hidden == 1 else 's'} in transcripts.txt)")
    if traj.error:
        lines.append(f"  environment error: {cut(traj.error)}")
    return "\n".join(lines)
