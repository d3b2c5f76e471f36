"""Learning tests under several float arithmetics and training seeds: the table of docs/testing.md.

torch picks its CPU kernels by ATEN_CPU_CAPABILITY (`default`, `avx2`, `avx512`), and each rounds
differently, so one machine stands in for three kinds of CPU. For each arithmetic and each seed this
runs pytest on the named tests with `RAGEN2_LEARNING_SEED=SEED` and a `--basetemp` of its own, then reads
the first and last evaluation of every run directory the tests left there (their metrics.jsonl). Each
test asserts its own criterion (a rise of more than 3 SE); the table shows pytest's verdict beside the numbers,
so name one test per call (its verdict is the call's).

    python scripts/learning_arithmetics.py tests/rl/test_learning_check.py -k "not another_cpus" \\
        [--arithmetics default,avx2,avx512] [--seeds 0,1,2,3,4] [--jobs 2]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


def run_tests(arithmetic: str, seed: int, pytest_args: list[str], root: Path) -> list[dict]:
    """pytest under one arithmetic and seed; one row per run directory (test) it left."""
    base = root / f"{arithmetic}-seed{seed}"
    env = os.environ | {"ATEN_CPU_CAPABILITY": arithmetic, "RAGEN2_LEARNING_SEED": str(seed)}
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--basetemp={base}",
                           *pytest_args], env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    outcome = {0: "passed", 1: "failed"}.get(done.returncode, f"pytest exit {done.returncode}")
    rows = []
    for metrics in sorted(base.rglob("metrics.jsonl")):
        evals = [r for r in map(json.loads, metrics.read_text().splitlines()) if "eval/success_rate" in r]
        first, last = evals[0], evals[-1]
        rise = last["eval/success_rate"] - first["eval/success_rate"]
        se = math.hypot(first["eval/success_stderr"], last["eval/success_stderr"])
        test = metrics.relative_to(base).parts[0]  # pytest names a test's tmp_path after the test
        rows.append({"arithmetic": arithmetic, "seed": seed, "test": test, "start": first["eval/success_rate"],
                     "end": last["eval/success_rate"], "rise_se": rise / se, "outcome": outcome, "wall_s": wall})
    return rows or [{"arithmetic": arithmetic, "seed": seed, "test": "(no run)", "outcome": done.stdout[-500:],
                     "wall_s": wall}]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arithmetics", default="default,avx2,avx512")
    parser.add_argument("--seeds", default="0,1,2,3,4")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--out", default="learning_arithmetics.json")
    args, pytest_args = parser.parse_known_args()
    jobs = [(a, int(s)) for a in args.arithmetics.split(",") for s in args.seeds.split(",")]
    rows = []
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(args.jobs) as pool:
        for future in [pool.submit(run_tests, a, s, pytest_args, Path(tmp)) for a, s in jobs]:
            for r in future.result():
                rows.append(r)
                print(json.dumps(r), flush=True)
    print("\n| test | arithmetic | trainer.seed | held-out success, before → after | rise | pytest | wall |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        if "start" in r:
            print(f"| {r['test']} | {r['arithmetic']} | {r['seed']} | {r['start']:.3f} → {r['end']:.3f} | "
                  f"{r['rise_se']:.1f} SE | {r['outcome']} | {r['wall_s'] / 60:.1f} min |")
        else:
            print(f"| {r['test']} | {r['arithmetic']} | {r['seed']} | | | {r['outcome']!r} | |")
    Path(args.out).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
