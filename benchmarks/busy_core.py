"""Step time of the default run with one core held by another process, against idle cores, per thread choice.

torch's threads spin-wait for each other between operations, so when another process holds a core every
operation waits for the thread that lost it. This runs `ragen2 train` (the default run, evaluation off,
`--steps` steps) as a user would, in a subprocess without OMP_NUM_THREADS, four ways: on idle cores and
beside a busy process (a Python loop that never sleeps, started before the run and killed after), each
with ragen2's thread choice (`model.cpu_threads=0`) and with torch's own (one thread per available core,
what runs got before ragen2 chose). Runs alternate so that a drift in the machine's load biases no
variant. Prints the mean step time after `--skip` steps, busy / idle per choice, and the choices' ratio.

    python benchmarks/busy_core.py [--steps 5] [--skip 1] [--preset default] [--out busy_core.json] [overrides ...]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from ragen2.cpu_threads import available_cores

BUSY_LOOP = "while True: pass"


def mean_step_time(preset: str, threads: int, busy: bool, steps: int, skip: int, overrides: list[str],
                   run_dir: Path) -> float:
    """One run's mean `timing_s/step` over the steps after `skip`."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    command = [sys.executable, "-m", "ragen2", "train", preset, f"trainer.total_steps={steps}", "trainer.eval_every=0",
               "trainer.save_every=0", f"trainer.run_dir={run_dir}", f"model.cpu_threads={threads}", *overrides]
    hog = subprocess.Popen([sys.executable, "-c", BUSY_LOOP]) if busy else None
    try:
        subprocess.run(command, env=env, check=True, capture_output=True)
    finally:
        if hog is not None:
            hog.kill()
            hog.wait()
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return float(np.mean([r["timing_s/step"] for r in records if r.get("step", 0) > skip and "timing_s/step" in r]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="default")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--skip", type=int, default=1, help="Leading steps left out.")
    parser.add_argument("--out", default="busy_core.json")
    parser.add_argument("overrides", nargs="*", help="Config overrides for every run.")
    args = parser.parse_args()
    choices = {"ragen2's choice": 0, f"torch's default ({available_cores()} threads)": available_cores()}
    order = [("idle", c) for c in choices] + [("busy", c) for c in reversed(choices)]
    times: dict[str, dict[str, float]] = {c: {} for c in choices}
    with tempfile.TemporaryDirectory() as tmp:
        for i, (load, choice) in enumerate(order):
            times[choice][load] = mean_step_time(args.preset, choices[choice], load == "busy", args.steps, args.skip,
                                                 args.overrides, Path(tmp) / f"run-{i}")
            print(f"{choice:30s} {load}: {times[choice][load]:.1f} s a step", flush=True)
    print("\n| threads | idle cores, s/step | one core busy, s/step | busy / idle |\n|---|---|---|---|")
    for choice, t in times.items():
        print(f"| {choice} | {t['idle']:.1f} | {t['busy']:.1f} | **{t['busy'] / t['idle']:.2f}x** |")
    new, old = (times[c] for c in choices)
    print(f"\nragen2's choice against torch's default: {old['idle'] / new['idle']:.2f}x as fast on idle cores, "
          f"{old['busy'] / new['busy']:.2f}x with one core busy")
    Path(args.out).write_text(json.dumps({"args": vars(args), "times": times}, indent=2))


if __name__ == "__main__":
    main()
