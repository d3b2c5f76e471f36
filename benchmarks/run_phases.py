"""Where a training run's time and memory went: mean seconds per step of each phase, and peak memory.

Reads the `timing_s/*` and `system/peak_memory_mb` records that `ragen2 train` writes to every
step of metrics.jsonl, so it measures the runs as they ran (threads, load and all). Several run
directories are pooled: each phase is averaged over every step of every run.

    python benchmarks/run_phases.py sweeps/smollm2_filter_frozenlake/*/
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from pathlib import Path

import numpy as np

from ragen2.tracking import read_metrics

PHASES = ("generate", "rollout", "collapse", "filter", "advantage", "update", "step")


def phase_table(run_dirs: list[Path]) -> str:
    """A markdown table: per phase, the mean and SE of its seconds over the steps that ran it."""
    times: dict[str, list[float]] = defaultdict(list)
    evaluations, memory, steps = [], [], 0
    for run_dir in run_dirs:
        for record in read_metrics(run_dir):
            if "timing_s/step" in record:
                steps += 1
                for phase in PHASES:
                    if f"timing_s/{phase}" in record:
                        times[phase].append(record[f"timing_s/{phase}"])
            if "timing_s/evaluate" in record:
                evaluations.append(record["timing_s/evaluate"])
            if "system/peak_memory_mb" in record:
                memory.append(record["system/peak_memory_mb"])
    lines = [f"{len(run_dirs)} runs, {steps} training steps", "", "| phase | steps with it | mean s | ± SE |", "|---|---|---|---|"]
    for phase, values in [*((p, times[p]) for p in PHASES if times[p]), ("evaluation", evaluations)]:
        if values:
            se = np.std(values, ddof=1) / np.sqrt(len(values)) if len(values) > 1 else 0.0
            lines.append(f"| {phase} | {len(values)} | {np.mean(values):.1f} | {se:.1f} |")
    if memory:
        lines += ["", f"peak memory (largest over the steps of every run): {max(memory):.0f} MB"]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run directories (each with a metrics.jsonl)")
    print(phase_table(parser.parse_args().runs))


if __name__ == "__main__":
    main()
