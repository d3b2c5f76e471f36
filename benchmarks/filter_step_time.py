"""Step time with SNR-aware filtering vs without, through the trainer's real phases, in one run.

RAGEN-2 reports that filtering also makes steps 26-41% shorter: the update trains on the
kept groups only. This benchmark trains the same policy twice from the same seeds, once with
the paper's filter (`top_p`, rho = 0.9, zero-variance groups dropped) and once without
(`strategy=none`, every group kept), and compares the per-step wall time the trainer logs
(`timing_s/*`). Diagnostics, evaluation and intermediate checkpoints are off; the final
checkpoint's time is left out of the step time. Step 1 of both runs samples the same batch
(same seeds, same weights); later steps differ because the updates differ.

Runs alternate (filter, no filter, no filter, filter, ...) with `--repeats 2` or more, so a
change in machine load between runs biases neither side.

Columns, means over the measured steps: `step_s` (whole step), `rollout_s`, `advantage_s`,
`update_s` (the phases), `kept_ratio` (groups trained on) and `response_tokens_mean`
(generated tokens per episode: the rollout's work, which differs between the runs after step
1 because their policies do). Filtering can only shorten advantage and update; how much of
the step that saves depends on how much of it the update is, which is small where generation
is slow (a CPU) and large on GPUs with a fast inference engine.

    python benchmarks/filter_step_time.py [--model tiny] [--preset sokoban] [--steps 4] [--skip 1]
        [--repeats 1] [--out filter_step_time.json] [overrides ...]
"""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
from pathlib import Path

import numpy as np

from ragen2.config import load_config
from ragen2.rl.trainer import train
from ragen2.tracking import read_metrics
from step_throughput import step_time

VARIANTS = {
    "filter": ["filter.strategy=top_p", "filter.value=0.9", "filter.include_zero=false"],
    "nofilter": ["filter.strategy=none", "filter.include_zero=true"],
}
BENCH_OVERRIDES = [
    "collapse.enable=false",
    "trainer.eval_every=0",
    "trainer.save_every=0",
    "logging.progress=false",
    "logging.tensorboard=false",
]
COLUMNS = ("step_s", "rollout_s", "advantage_s", "update_s", "kept_ratio", "response_tokens_mean")


def train_records(args: argparse.Namespace, variant: list[str], run_dir: Path) -> list[dict]:
    """Train `args.steps` steps of `args.preset` with the benchmark's overrides, then `variant`'s, then the
    command line's; returns the run's metrics.jsonl records."""
    model = [] if args.model == "tiny" else [f"model.path={args.model}"]
    overrides = [*BENCH_OVERRIDES, *model, f"model.device={args.device}", f"trainer.total_steps={args.steps}",
                 f"trainer.run_dir={run_dir}", *variant, *args.overrides]
    train(load_config(args.preset, overrides))
    return read_metrics(run_dir)


def add_run_arguments(parser: argparse.ArgumentParser, preset: str, steps: int) -> None:
    """The options `train_records` reads: --model, --device, --preset, --steps and the overrides."""
    parser.add_argument("--model", default="tiny", help="Model directory or 'tiny' (the cached warm-started policy).")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--preset", default=preset, help="Config preset, e.g. sokoban or sokoban-ppo.")
    parser.add_argument("--steps", type=int, default=steps, help="Training steps per run.")
    parser.add_argument("overrides", nargs="*", help="Config overrides for every run, e.g. rollout.num_groups=16.")


def run_variant(args: argparse.Namespace, variant: str, run_dir: Path) -> list[dict[str, float]]:
    """Train `args.steps` steps of one variant; per-step timings and kept ratio from metrics.jsonl."""
    rows = []
    for record in train_records(args, VARIANTS[variant], run_dir):
        if record["step"] < 1:
            continue
        rows.append({
            "step": record["step"],
            "step_s": step_time(record),
            "rollout_s": record["timing_s/rollout"],
            "advantage_s": record.get("timing_s/advantage") or 0.0,  # absent on a skipped step
            "update_s": record.get("timing_s/update") or 0.0,
            "kept_ratio": record["filter/kept_ratio"],
            "skipped": record["filter/skipped"],
            "response_tokens_mean": record["rollout/response_tokens_mean"],  # rollout work, for reading rollout_s
        })
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_arguments(parser, "sokoban", 4)
    parser.add_argument("--skip", type=int, default=1, help="First steps of each run left out of the means (warm-up).")
    parser.add_argument("--repeats", type=int, default=1, help="Runs per variant, alternating the order.")
    parser.add_argument("--out", default=None, help="Write the results as JSON here.")
    args = parser.parse_args()
    if args.skip >= args.steps:
        parser.error(f"--skip {args.skip} leaves no step to measure out of --steps {args.steps}")
    logging.basicConfig(level=logging.WARNING)

    per_step: dict[str, list[dict[str, float]]] = {name: [] for name in VARIANTS}
    with tempfile.TemporaryDirectory(prefix="filter_step_time-") as tmp:
        for repeat in range(args.repeats):
            order = list(VARIANTS) if repeat % 2 == 0 else list(reversed(VARIANTS))
            for variant in order:
                rows = run_variant(args, variant, Path(tmp) / f"{variant}-{repeat}")
                per_step[variant] += [row | {"repeat": repeat, "measured": row["step"] > args.skip} for row in rows]

    measured = {name: [r for r in rows if r["measured"]] for name, rows in per_step.items()}
    means = {name: {col: float(np.mean([r[col] for r in rows])) for col in COLUMNS} for name, rows in measured.items()}
    ratio = {col: means["filter"][col] / means["nofilter"][col] if means["nofilter"][col] else float("nan")
             for col in COLUMNS}
    config = load_config(args.preset, args.overrides)
    result = {
        "model": args.model,
        "preset": args.preset,
        "algo": config.algo.name,
        "batch": f"{config.rollout.num_groups}x{config.rollout.group_size} {config.env.name} episodes",
        "steps": args.steps,
        "skipped_warmup_steps": args.skip,
        "repeats": args.repeats,
        "overrides": args.overrides,
        "variants": {name: " ".join(VARIANTS[name]) for name in VARIANTS},
        "mean": means,
        "ratio_filter_over_nofilter": ratio,
        "skipped_steps": {name: int(sum(r["skipped"] for r in rows)) for name, rows in measured.items()},
        "per_step": per_step,
    }

    header = ["variant", *COLUMNS]
    table = [header, ["---"] * len(header)]
    table += [[name, *(f"{means[name][col]:.3f}" for col in COLUMNS)] for name in VARIANTS]
    table.append(["filter / nofilter", *(f"{ratio[col]:.3f}" for col in COLUMNS)])
    print(f"{result['batch']}, {args.preset} ({config.algo.name}), {args.steps} steps x {args.repeats} run(s) per "
          f"variant, first {args.skip} step(s) of each run left out; seconds per step")
    for row in table:
        print("| " + " | ".join(row) + " |")
    if any(result["skipped_steps"].values()):
        print(f"steps skipped by the filter (nothing kept): {result['skipped_steps']}")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
