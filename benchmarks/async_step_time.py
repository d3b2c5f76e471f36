"""Time per update, asynchronous (a rollout worker, async.max_staleness=1) against synchronous, in one run.

The same config trains twice from the same seeds: synchronously (generate, then update, in one process)
and with `async.enable=true async.max_staleness=1` (the worker generates step s + 1 while the trainer
updates on step s). Diagnostics, evaluation and intermediate checkpoints are off; the final checkpoint's
time is left out. Runs alternate (sync, async, async, sync, ...) with `--repeats 2` or more, so a change
in machine load between runs biases neither side.

Per variant, means over the measured steps (after `--skip`): `step_s` (time per update, the trainer's
wall time of a step), `rollout_s` (sync: the rollout; async: the trainer's wait for the worker's groups),
`train_s` (step_s - rollout_s: the trainer's own work), `worker_rollout_s` (async: the worker's rollout
of a step) and `kept_groups_per_s` (useful throughput). The ideal asynchronous step is the longer of
the two phases measured in the async run, max(train_s, worker_rollout_s); the script prints
sync step_s / async step_s and async step_s / ideal.

Both processes share the machine's cores: with one core each the overlap is real; on a machine
loaded by other jobs it is not, and the ratios say so.

    python benchmarks/async_step_time.py [--model tiny] [--preset sokoban] [--steps 4] [--skip 1]
        [--repeats 1] [--threads 0] [--sync-threads N] [--out async_step_time.json] [overrides ...]
"""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
from pathlib import Path

import numpy as np

from filter_step_time import add_run_arguments, train_records
from step_throughput import step_time

VARIANTS = {"sync": [], "async": ["async.enable=true", "async.max_staleness=1"]}
COLUMNS = ("step_s", "rollout_s", "train_s", "worker_rollout_s", "kept_groups_per_s")


def run_variant(args: argparse.Namespace, variant: str, run_dir: Path, threads: int) -> list[dict[str, float]]:
    """Train `args.steps` steps of one variant on `threads` torch threads a process (0: ragen2's choice); per-step
    timings from metrics.jsonl."""
    rows = []
    for record in train_records(args, [*VARIANTS[variant], f"model.cpu_threads={threads}"], run_dir):
        if record["step"] <= args.skip:
            continue
        step_s = step_time(record)
        rows.append({
            "step_s": step_s,
            "rollout_s": record["timing_s/rollout"],
            "train_s": step_s - record["timing_s/rollout"],
            "worker_rollout_s": record.get("async/worker_rollout_s", float("nan")),
            "kept_groups_per_s": record["filter/kept_groups"] / step_s,
        })
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_arguments(parser, "sokoban", 4)
    parser.add_argument("--skip", type=int, default=1, help="Leading steps left out (the worker's start-up).")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--threads", type=int, default=0,
                        help="torch threads of each process (model.cpu_threads; 0: ragen2's choice, as a user gets it).")
    parser.add_argument("--sync-threads", type=int, default=None,
                        help="torch threads of the synchronous run (default: --threads); with --threads 1 on 2 cores, "
                             "--sync-threads 2 gives the synchronous run the two cores the async run's processes share.")
    parser.add_argument("--out", default="async_step_time.json")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    threads = {"sync": args.threads if args.sync_threads is None else args.sync_threads, "async": args.threads}
    order = [v for r in range(args.repeats) for v in (("sync", "async") if r % 2 == 0 else ("async", "sync"))]
    rows: dict[str, list[dict[str, float]]] = {v: [] for v in VARIANTS}
    with tempfile.TemporaryDirectory() as tmp:
        for i, variant in enumerate(order):
            rows[variant] += run_variant(args, variant, Path(tmp) / f"{variant}-{i}", threads[variant])
    means = {v: {c: float(np.mean([r[c] for r in rs])) for c in COLUMNS} for v, rs in rows.items()}
    print(f"{'variant':8s} " + " ".join(f"{c:>17s}" for c in COLUMNS))
    for variant, m in means.items():
        print(f"{variant:8s} " + " ".join(f"{m[c]:17.3f}" for c in COLUMNS))
    a = means["async"]
    ideal = max(a["train_s"], a["worker_rollout_s"])
    speedup = means["sync"]["step_s"] / a["step_s"]
    print(f"time per update, sync / async: {speedup:.2f}x over {len(rows['async'])} measured steps each")
    print(f"async step / ideal (the longer phase, {ideal:.3f} s): {a['step_s'] / ideal:.2f}")
    Path(args.out).write_text(json.dumps({"args": vars(args), "means": means, "speedup": speedup,
                                          "ideal_s": ideal}, indent=2))


if __name__ == "__main__":
    main()
