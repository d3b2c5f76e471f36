"""`ragen2 eval MODEL --env A --env B ...`: one policy on several environments and variants, in one table.

Each `--env` is a name (`sokoban`), a variant (`sokoban:dim_room=[8, 8]:num_boxes=2`, each `key=value`
a YAML value over the environment preset's kwargs) or a YAML file holding a list of `{name, kwargs,
tag}` entries, as `env.eval` takes them. Each environment plays with its own preset's rollout settings
(Bandit's one turn, Sokoban's five), on the same held-out seeds as `ragen2 eval` with one `--env`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path
from typing import Any

import torch
import yaml

from ragen2.errors import ConfigError
from ragen2.evaluate import (
    PRINTED_SAMPLES,
    evaluate,
    format_table,
    format_transcript,
    new_results_dir,
    random_agent,
    short_transcript,
    write_rollout_records,
)
from ragen2.mixture import TaggedEnv
from ragen2.progress import heartbeat
from ragen2.verdict import VS_RANDOM, binomial_se, verdict

log = logging.getLogger(__name__)


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


def evaluate_envs_cli(
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
    """Evaluate `model` (and a random agent) on each of `envs`; one table, one results directory.

    Writes eval.json (per tag: the environment, its rows and its verdict against the random agent),
    and the first `samples` episodes of each environment to transcripts.txt and rollouts.jsonl.
    Returns what evaluate_cli returns: the JSON written plus "table", "transcripts", "out", "json_path".
    """
    from ragen2.config import check_env_kwargs, load_config, preset_names
    from ragen2.models.loading import load_policy

    tags = [e.tag for e in envs]
    repeated = sorted({t for t in tags if tags.count(t) > 1})
    if repeated:
        raise ConfigError(f"--env names {', '.join(repeated)} more than once: give each environment once (or its "
                          "own tag in a YAML list)")
    configs = []
    for e in envs:  # every environment is checked before the model loads
        config = load_config(e.name if e.name in preset_names() else None,
                             [f"env.name={e.name}", f"model.device={device}", *overrides])
        kwargs = {**config.env.kwargs, **e.kwargs}
        check_env_kwargs(f"--env {e.tag}", e.name, kwargs)
        configs.append((dataclasses.replace(e, kwargs=kwargs), config))
    policy, tokenizer = load_policy(None if model == "tiny" else model, configs[0][1].model.device,
                                    configs[0][1].model.dtype)
    rows, verdicts, per_env, sampled = {}, [], [], []
    for env, config in configs:
        cfg = dataclasses.replace(config.rollout, temperature=temperature)
        seed = config.trainer.seed
        torch.manual_seed(seed)
        with heartbeat(f"evaluating {model} on {episodes} {env.tag} episodes", log.info):
            metrics, trajectories = evaluate(policy, tokenizer, env.name, env.kwargs, cfg, episodes)
        rows[env.tag] = metrics
        if compare_random:
            rows[f"{env.tag}: uniform-random"] = baseline = random_agent(env.name, env.kwargs, episodes, cfg, seed=seed)
            rates = [(m["eval/success_rate"], binomial_se(m["eval/success_rate"], episodes))
                     for m in (baseline, metrics)]
            verdicts.append(f"{env.tag}: uniform-random → policy: {verdict(*rates[0], *rates[1], words=VS_RANDOM)}")
        per_env.append({"tag": env.tag, "name": env.name, "kwargs": env.kwargs})
        sampled += trajectories[:samples]
    out = out or new_results_dir("eval", model, "+".join(e.name for e in envs))
    out.mkdir(parents=True, exist_ok=True)
    result = {"model": model, "envs": per_env, "episodes": episodes, "temperature": temperature,
              "device": str(policy.device), "results": rows, "verdicts": verdicts, "samples": len(sampled)}
    json_path = out / "eval.json"
    json_path.write_text(json.dumps(result, indent=2))
    (out / "transcripts.txt").write_text("\n".join(format_transcript(t, tokenizer) for t in sampled), encoding="utf-8")
    write_rollout_records(out / "rollouts.jsonl", sampled, tokenizer)
    title = (f"{len(envs)} environments: {episodes} held-out seeds each, temperature {temperature}, "
             f"device {policy.device}")
    shown = sampled[:PRINTED_SAMPLES]
    text = (f"sample episodes ({len(shown)} of the {len(sampled)} in {out / 'transcripts.txt'}):\n\n"
            + "\n\n".join(short_transcript(t) for t in shown)) if shown else ""
    return {"table": "\n".join([title, format_table(rows), *verdicts]), "transcripts": text, "out": out,
            "json_path": json_path, **result}
