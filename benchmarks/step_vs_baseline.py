"""The default run's step time on this checkout against another commit's, in one session, same config and seeds.

Runs Part 1 of benchmarks/step_throughput.py (the default config, `ragen2 train sokoban`: tiny policy, Sokoban,
8 x 8 episodes, GRPO, filter and diagnostics on) as a fresh process importing ragen2 from each
checkout, alternating (this, baseline, baseline, this, ...) over --repeats so that a change in
the machine's load biases neither side. The same script and seeds serve both sides; only the
`ragen2` package differs. Prints each side's mean step time, its parts, and baseline / this.

    git worktree add /tmp/base HEAD~1
    python benchmarks/step_vs_baseline.py --baseline /tmp/base [--steps 6] [--repeats 2] [--threads N] [--out F.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FIELDS = ("step_s", "step_s_without_diagnose", "generated_tokens_per_step")


def run_side(checkout: Path, steps: int, threads: int | None, out: Path) -> dict:
    """One Part 1 run of step_throughput.py with `ragen2` imported from `checkout`."""
    command = [sys.executable, str(REPO / "benchmarks" / "step_throughput.py"), "--skip-trl", "--steps", str(steps),
               "--out", str(out)] + (["--threads", str(threads)] if threads else [])
    subprocess.run(command, cwd=checkout, env={**os.environ, "PYTHONPATH": str(checkout)}, check=True,
                   capture_output=True, text=True)
    return json.loads(out.read_text())["default"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", required=True, type=Path, help="A checkout of the commit to compare against.")
    parser.add_argument("--steps", type=int, default=6, help="Steps per run; the first is warm-up (default 6: "
                        "the diagnostics run at steps 1 and 5, as every 5 steps in a long run).")
    parser.add_argument("--repeats", type=int, default=2, help="Runs per side.")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    sides = {"this": REPO, "baseline": args.baseline.resolve()}
    results: dict[str, list[dict]] = {name: [] for name in sides}
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            for name in (("this", "baseline") if repeat % 2 == 0 else ("baseline", "this")):
                result = run_side(sides[name], args.steps, args.threads, Path(tmp) / f"{name}{repeat}.json")
                results[name].append(result)
                print(f"{name} run {repeat + 1}: step {result['step_s']:.2f} s", flush=True)
    summary = {}
    for name, runs in results.items():
        row = {field: statistics.mean(r[field] for r in runs) for field in FIELDS}
        row["collapse_s_when_run"] = statistics.mean(r["phases"].get("collapse", {}).get("mean_s_when_run", 0.0) for r in runs)
        row["generate_s"] = statistics.mean(r["phases"]["generate"]["mean_s_when_run"] for r in runs)
        summary[name] = row
    print(f"\n{args.steps} steps per run (first left out), {args.repeats} runs per side, alternating")
    print("| side | step s | step s w/o diagnose | generate s | collapse s (when run) | tokens/step |")
    print("|---|---|---|---|---|---|")
    for name, row in summary.items():
        print(f"| {name} | {row['step_s']:.3f} | {row['step_s_without_diagnose']:.3f} | {row['generate_s']:.3f} | "
              f"{row['collapse_s_when_run']:.3f} | {row['generated_tokens_per_step']:.0f} |")
    ratio = summary["baseline"]["step_s"] / summary["this"]["step_s"]
    print(f"baseline / this step time: {ratio:.3f}x")
    if args.out:
        Path(args.out).write_text(json.dumps({"summary": summary, "ratio": ratio, "runs": results}, indent=2))


if __name__ == "__main__":
    main()
