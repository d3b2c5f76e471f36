"""The default run under several float arithmetics: does `ragen2 train` learn whatever the CPU rounds like?

torch picks its vectorised CPU kernels by ATEN_CPU_CAPABILITY (`default`, `avx2`, `avx512`), and each
rounds differently, so one machine can stand in for three kinds of CPU. For each arithmetic and each
trainer.seed this runs `ragen2 train trainer.seed=S` as a user would (no other argument, an empty
RAGEN2_CACHE of its own, the thread count ragen2 chooses) and reads the held-out success of its first
and last evaluation from metrics.jsonl. The criterion, fixed before the runs: the rise exceeds 3
standard errors of the difference on every run.

    python benchmarks/default_run_arithmetics.py [--arithmetics default,avx2,avx512] [--seeds 0,1,2,3,4]
        [--jobs 2] [--out default_run_arithmetics.json] [overrides ...]

`--jobs` runs that many at a time (each on the one thread ragen2 gives the tiny policy).
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

CRITERION_SE = 3.0


def run_one(arithmetic: str, seed: int, overrides: list[str], root: Path) -> dict:
    """`ragen2 train trainer.seed=SEED` under ATEN_CPU_CAPABILITY=arithmetic with an empty cache; its evaluations."""
    run_dir = root / f"{arithmetic}-seed{seed}"
    cache = root / f"cache-{arithmetic}-seed{seed}"
    cache.mkdir()
    env = os.environ | {"ATEN_CPU_CAPABILITY": arithmetic, "RAGEN2_CACHE": str(cache)}
    command = [sys.executable, "-m", "ragen2", "train", f"trainer.seed={seed}", f"trainer.run_dir={run_dir}",
               *overrides]
    start = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} under {arithmetic} failed:\n{done.stderr[-3000:]}")
    evals = [r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
             if "eval/success_rate" in r]
    first, last = evals[0], evals[-1]
    rise = last["eval/success_rate"] - first["eval/success_rate"]
    se = math.hypot(first["eval/success_stderr"], last["eval/success_stderr"])
    return {"arithmetic": arithmetic, "seed": seed, "start": first["eval/success_rate"],
            "by_step": {r["step"]: r["eval/success_rate"] for r in evals}, "end": last["eval/success_rate"],
            "rise": rise, "se": se, "rise_se": rise / se, "wall_s": wall, "cache_after": sorted(os.listdir(cache))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arithmetics", default="default,avx2,avx512")
    parser.add_argument("--seeds", default="0,1,2,3,4")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--out", default="default_run_arithmetics.json")
    parser.add_argument("overrides", nargs="*", help="Config overrides for every run (none: the default run).")
    args = parser.parse_args()
    jobs = [(a, int(s)) for a in args.arithmetics.split(",") for s in args.seeds.split(",")]
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(args.jobs) as pool:
        futures = [pool.submit(run_one, a, s, args.overrides, Path(tmp)) for a, s in jobs]
        rows = []
        for future in futures:
            rows.append(future.result())
            r = rows[-1]
            print(f"{r['arithmetic']:8s} seed {r['seed']}: {r['start']:.3f} -> {r['end']:.3f} "
                  f"({r['rise']:+.3f} ± {r['se']:.3f}, {r['rise_se']:.1f} SE) in {r['wall_s'] / 60:.1f} min", flush=True)
    print("\n| arithmetic | trainer.seed | held-out success by step | rise | rise / SE | wall |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        steps = " → ".join(f"{v:.3f} ({k})" for k, v in r["by_step"].items())
        print(f"| {r['arithmetic']} | {r['seed']} | {steps} | {r['rise']:+.3f} ± {r['se']:.3f} | "
              f"**{r['rise_se']:.1f}** | {r['wall_s'] / 60:.1f} min |")
    passed = sum(r["rise_se"] > CRITERION_SE for r in rows)
    print(f"\n{passed} of {len(rows)} runs rose by more than {CRITERION_SE:g} SE; rise {min(r['rise_se'] for r in rows):.1f} "
          f"to {max(r['rise_se'] for r in rows):.1f} SE; caches left empty: "
          f"{all(not r['cache_after'] for r in rows)}")
    Path(args.out).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
