"""`ragen2 eval MODEL [--env A --env B ...]`: load a policy, evaluate it (and a random agent), write and print the results.

The command's half of evaluation, apart from `ragen2.evaluate` (the evaluation itself, which the trainer and
the warm start call too): it loads the model, so it sits above `ragen2.models`, which evaluate must not import.

Each `--env` is a name (`sokoban`), a variant (`sokoban:dim_room=[8, 8]:num_boxes=2`, each `key=value`
a YAML value over the environment preset's kwargs) or a YAML file holding a list of `{name, kwargs,
tag}` entries, as `env.eval` takes them. Each environment plays with its own preset's rollout settings
(Bandit's one turn, Sokoban's five) on the same held-out seeds. One environment named plainly is the
one-environment form: rows "policy" and "uniform-random", and for a run's checkpoint a comparison with the
run's start; several, or a variant, share one table with a row per tag.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import yaml

from ragen2.errors import ConfigError
from ragen2.evaluate import (
    evaluate,
    format_table,
    format_transcript,
    new_results_dir,
    random_agent,
    short_transcript,
    write_rollout_records,
)
from ragen2.mixture import TaggedEnv, is_mixture
from ragen2.progress import heartbeat
from ragen2.tracking import METRICS_FILE, read_metrics
from ragen2.verdict import LEARNED, VS_RANDOM, binomial_se, verdict

if TYPE_CHECKING:
    from ragen2.config import Config, EnvConfig, RolloutConfig

log = logging.getLogger(__name__)

# Episodes of `ragen2 eval` shown on the terminal, the first of the `samples` written.
PRINTED_SAMPLES = 2

# Rollout settings that change what a held-out success rate measures (format_penalty moves returns only;
# the generation engine and prefix reuse give the same samples), compared before a run's start is.
COMPARED_ROLLOUT = ("max_turns", "max_actions_per_turn", "max_tokens_per_turn", "memory", "context_turns",
                    "memory_budget", "end_on_invalid", "top_p", "top_k", "enable_think", "action_sep", "max_model_len")


def parse_env(text: str) -> list[TaggedEnv]:
    """The environments one `--env` value names: a YAML file's list, or `NAME[:key=value]...` (tag: the text)."""
    path = Path(text)
    if path.suffix in (".yaml", ".yml"):
        if not path.is_file():
            raise ConfigError(f"--env {text}: no such file; a YAML file there must list {{name, kwargs, tag}} entries")
        entries = yaml.safe_load(path.read_text())
        if not (isinstance(entries, list) and entries and all(isinstance(e, dict) and "name" in e for e in entries)):
            raise ConfigError(f"--env {text}: the file must hold a non-empty list of {{name, kwargs, tag}} entries, "
                              "e.g. `- {name: sokoban, kwargs: {dim_room: [8, 8]}, tag: sokoban-8x8}`")
        return [TaggedEnv(e["name"], dict(e.get("kwargs") or {}), str(e.get("tag") or e["name"])) for e in entries]
    parts = text.split(":")
    first = next((i for i, p in enumerate(parts) if "=" in p), len(parts))  # a suite's name has a colon too
    kwargs: dict[str, Any] = {}
    for part in parts[first:]:
        key, sep, value = part.partition("=")
        if not sep or not key:
            raise ConfigError(f"--env {text}: {part!r} must look like key=value, e.g. sokoban:num_boxes=2")
        kwargs[key] = yaml.safe_load(value)
    return [TaggedEnv(":".join(parts[:first]), kwargs, text)]


def run_of(model: str) -> Path | None:
    """The run directory `model` is a checkpoint of (runs/X for runs/X/checkpoints/step_N), or None."""
    path = Path(model)
    run_dir = path.parent.parent
    return run_dir if path.parent.name == "checkpoints" and (run_dir / METRICS_FILE).is_file() else None


def _success(metrics: dict) -> tuple[float, float | None]:
    """(held-out success, its binomial standard error over `eval/episodes`) of an evaluation's metrics."""
    rate = metrics["eval/success_rate"]
    return rate, binomial_se(rate, metrics.get("eval/episodes"))


def verdict_lines(
    rows: dict[str, dict[str, float]], run_dir: Path | None, config: Config, cfg: RolloutConfig
) -> list[str]:
    """Whether the policy beats the uniform-random agent, and for a run's checkpoint whether it beats the
    run's first evaluation (`ragen2.verdict`): the numbers say whether the difference is more than noise.

    The run's start is compared only when this evaluation plays what the run's evaluations played (the
    environment, `cfg` with `trainer.eval_temperature`, `COMPARED_ROLLOUT`); otherwise the line says what differs.
    """
    from ragen2.config import config_from_file

    policy = _success(rows["policy"])
    lines = []
    if "uniform-random" in rows:
        baseline = _success(rows["uniform-random"])
        lines.append(f"uniform-random → policy: {verdict(*baseline, *policy, words=VS_RANDOM)}")
    if run_dir is None:
        return lines
    try:
        run = config_from_file(run_dir / "config.yaml")
    except (ConfigError, OSError) as e:
        return [*lines, f"run start → this eval: not compared, the run's config.yaml cannot be read ({e})"]
    if is_mixture(run):  # its eval/success_rate pools several environments, each seed played in a group
        return [*lines, "run start → this eval: not compared, the run evaluated a mixture (docs/mixtures.md); its "
                        "metrics.jsonl has eval/<tag>/success_rate per environment"]

    def settings(env: EnvConfig, temperature: float, rollout_cfg: RolloutConfig) -> dict[str, object]:
        return {"env.name": env.name, "env.kwargs": env.kwargs, "temperature": temperature,
                **{f"rollout.{k}": getattr(rollout_cfg, k) for k in COMPARED_ROLLOUT}}

    ours = settings(config.env, cfg.temperature, cfg)
    theirs = settings(run.env, run.trainer.eval_temperature, run.rollout)
    differ = [f"{k} {ours[k]} (run: {theirs[k]})" for k in ours if ours[k] != theirs[k]]
    first = next((r for r in read_metrics(run_dir) if r.get("eval/success_rate") is not None), None)
    if differ:
        lines.append(f"run start → this eval: not compared, this eval plays other settings: {', '.join(differ)}")
    elif first is None:
        lines.append("run start → this eval: not compared, the run logged no evaluation")
    else:
        start = f"run start (step {first['step']}) → this eval"
        lines.append(f"{start}: {verdict(*_success(first), *policy, words=LEARNED)}")
    return lines


def evaluate_cli(
    model: str,
    envs: list[TaggedEnv],
    episodes: int,
    temperature: float,
    device: str,
    overrides: list[str],
    out: Path | None,
    compare_random: bool,
    samples: int = 4,
) -> dict:
    """`ragen2 eval`: evaluate `model` (and a random agent) on each of `envs`, each with its preset's rollout settings.

    Every environment is checked before the model loads. Writes into `out` (default: a new
    `new_results_dir("eval", model, NAME[+NAME...])`) eval.json (the metrics and the verdicts: against the random
    agent, and in the one-environment form against the run's start for a run's checkpoint, `verdict_lines`) and
    each environment's first `samples` episodes twice: transcripts.txt (the conversations, to read) and
    rollouts.jsonl (rollout records, for `ragen2 diagnose`). Returns the JSON written plus "table" and
    "transcripts" (text for the terminal), "out" and "json_path".
    """
    from ragen2.config import check_env_kwargs, load_config, preset_names
    from ragen2.models.loading import load_policy

    single = len(envs) == 1 and not envs[0].kwargs
    if single:  # its rows, title and log line name the environment, whatever tag a YAML list gave it
        envs = [TaggedEnv(envs[0].name, {}, envs[0].name)]
    tags = [e.tag for e in envs]
    repeated = sorted({t for t in tags if tags.count(t) > 1})
    if repeated:
        raise ConfigError(f"--env names {', '.join(repeated)} more than once: give each environment once (or its "
                          "own tag in a YAML list)")
    configs = []
    for e in envs:
        config = load_config(e.name if e.name in preset_names() else None,
                             [f"env.name={e.name}", f"model.device={device}", *overrides])
        kwargs = {**config.env.kwargs, **e.kwargs}
        check_env_kwargs(f"--env {e.tag}", e.name, kwargs)
        configs.append((dataclasses.replace(e, kwargs=kwargs), config))
    policy, tokenizer = load_policy(None if model == "tiny" else model, configs[0][1].model.device,
                                    configs[0][1].model.dtype)
    rows, verdicts, sampled = {}, [], []
    for env, config in configs:
        cfg = dataclasses.replace(config.rollout, temperature=temperature)
        seed = config.trainer.seed  # the same command gives the same episodes (trainer.seed=N for others)
        torch.manual_seed(seed)
        with heartbeat(f"evaluating {model} on {episodes} {env.tag} episodes", log.info):
            metrics, trajectories = evaluate(policy, tokenizer, env.name, env.kwargs, cfg, episodes)
        own = {"policy": metrics}
        if compare_random:
            own["uniform-random"] = random_agent(env.name, env.kwargs, episodes, cfg, seed=seed)
        if single:
            rows, verdicts = own, verdict_lines(own, run_of(model), config, cfg)
        else:
            rows |= {env.tag if agent == "policy" else f"{env.tag}: {agent}": m for agent, m in own.items()}
            verdicts += [f"{env.tag}: {line}" for line in verdict_lines(own, None, config, cfg)]
        sampled += trajectories[:samples]
    out = out or new_results_dir("eval", model, "+".join(e.name for e in envs))
    out.mkdir(parents=True, exist_ok=True)
    if single:
        [(env, config)] = configs
        played = {"env": env.name, "env_kwargs": env.kwargs, "episodes": episodes, "temperature": temperature,
                  "seed": config.trainer.seed}
        title = f"{env.name}: {episodes} held-out seeds"
    else:
        played = {"envs": [{"tag": e.tag, "name": e.name, "kwargs": e.kwargs} for e, _ in configs],
                  "episodes": episodes, "temperature": temperature}
        title = f"{len(envs)} environments: {episodes} held-out seeds each"
    result = {"model": model, **played, "device": str(policy.device), "results": rows, "verdicts": verdicts,
              "samples": len(sampled)}
    json_path = out / "eval.json"
    json_path.write_text(json.dumps(result, indent=2))
    (out / "transcripts.txt").write_text("\n".join(format_transcript(t, tokenizer) for t in sampled), encoding="utf-8")
    write_rollout_records(out / "rollouts.jsonl", sampled, tokenizer)
    shown = sampled[:PRINTED_SAMPLES]
    text = (f"sample episodes ({len(shown)} of the {len(sampled)} in {out / 'transcripts.txt'}):\n\n"
            + "\n\n".join(short_transcript(t) for t in shown)) if shown else ""
    table = [f"{title}, temperature {temperature}, device {policy.device}", format_table(rows), *verdicts]
    return {"table": "\n".join(table), "transcripts": text, "out": out, "json_path": json_path, **result}
