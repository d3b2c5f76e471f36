"""Learning parity: held-out success after the same number of updates, asynchronous (a rollout worker,
async.max_staleness=1) against synchronous, over several seeds, in one run.

Each seed trains both variants from the same initial policy and seeds (`trainer.seed`), evaluates the
final policy on held-out seeds (`eval/success_rate`, `trainer.eval_episodes` episodes; step 0's
evaluation shows where both started), and the script prints each variant's mean and standard error
over the seeds, the mean of the per-seed differences (async - sync) with its standard error, and
whether that difference is within two standard errors of 0.

    python benchmarks/async_parity.py [--model tiny] [--preset bandit] [--steps 15] [--seeds 1 2 3]
        [--out async_parity.json] [overrides ...]
"""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
from pathlib import Path

import numpy as np
import torch

from async_step_time import VARIANTS
from filter_step_time import add_run_arguments, train_records


def mean_se(values: list[float]) -> tuple[float, float]:
    """Mean and standard error (0 for one value)."""
    x = np.asarray(values, float)
    return float(x.mean()), float(x.std(ddof=1) / np.sqrt(len(x))) if len(x) > 1 else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_arguments(parser, "bandit", 15)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--threads", type=int, default=1, help="torch threads of each process.")
    parser.add_argument("--out", default="async_parity.json")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(args.threads)
    success: dict[str, list[float]] = {v: [] for v in VARIANTS}
    initial: list[float] = []  # step 0's evaluation: the same policy in both variants
    with tempfile.TemporaryDirectory() as tmp:
        for seed in args.seeds:
            for variant in VARIANTS:
                extra = [*VARIANTS[variant], f"trainer.seed={seed}", f"trainer.eval_every={args.steps}"]
                records = train_records(args, extra, Path(tmp) / f"{variant}-{seed}")
                success[variant].append(records[-1]["eval/success_rate"])
            initial.append(records[0]["eval/success_rate"])
    m, se = mean_se(initial)
    print(f"initial held-out success: {m:.3f} +- {se:.3f}")
    for variant, values in success.items():
        m, se = mean_se(values)
        print(f"{variant:6s} held-out success after {args.steps} updates: {m:.3f} +- {se:.3f} "
              f"(seeds {args.seeds}: {', '.join(f'{v:.3f}' for v in values)})")
    diff, se = mean_se([a - s for a, s in zip(success["async"], success["sync"])])
    verdict = "within" if abs(diff) <= 2 * se else "outside"
    print(f"async - sync: {diff:+.3f} +- {se:.3f} ({verdict} two standard errors of 0)")
    result = {"args": vars(args), "initial": initial, "success": success, "diff": diff, "se": se}
    Path(args.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
