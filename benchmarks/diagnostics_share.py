"""The collapse diagnostics' share of the default run's step time: this tree's diagnostics vs a baseline's.

Both sides train the default config (`ragen2 train sokoban`, Config's defaults: the tiny policy on
Sokoban, 8 groups x 8 episodes of up to 5 turns, diagnostics at step 1 and every
`collapse.compute_freq` = 5 steps) for `--steps` steps from the same seed, with evaluation,
intermediate checkpoints, the progress bar and TensorBoard off (step_throughput.py's QUIET);
the end-of-run checkpoint is left out of the step time. Times are the trainer's own
`timing_s/step` and `timing_s/collapse`. Each run is its own process. The "after" side imports
ragen2 from this working tree; the "before" side from a copy of it whose diagnostics' code
(`--paths`: ragen2/collapse/, and the prefix store, backend and trainer that keep the rollout's
keys/values for it) is `--base`'s (default HEAD; once the change measured is committed, the
commit before it), so the two differ in that code only: uncommitted work elsewhere in the tree
is on both sides, and so is the cached tiny policy. With `--repeats 2` or more the sides
alternate (before, after, after, before, ...), so a change in machine load biases neither; the
"after / before" ratio of the step time without the diagnostics, the same work on both sides,
shows how much the load moved.

Share, as the default run experiences it: the diagnostics run on f = 7 of its 30 steps
(step 1 and every 5th of `trainer.total_steps`), so with c the mean `timing_s/collapse` of the
measured steps that ran them and s the mean step time without it over all measured steps,

    share = f c / (s + f c)        (mean collapse time per step / mean step time, default schedule)

The plain share of the measured steps (sum of collapse / sum of step time) is printed too; with
few steps it over-weights the diagnosed ones (2 of the 5 steps of `--steps 5`), and `--steps 30`
is the whole default run, where the two agree. A check costs more the longer and more varied
the batch's episodes are, so the checks of a few steps give c only roughly (steps 1 and 5 were
cheaper than the average of the default run's seven). Both sides
sample and train alike (the diagnostics draw from their own seeded generator), so their logged
`collapse_*` numbers are compared step by step as well.

    OMP_NUM_THREADS=1 python benchmarks/diagnostics_share.py [--steps 5] [--repeats 1] [--base HEAD]
        [--out diagnostics_share.json] [overrides ...]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SIDES = ("before", "after")


def run_side(steps: int, run_dir: Path, overrides: list[str]) -> dict[str, Any]:
    """Train `steps` steps of the default config in this process; per-step times and collapse numbers."""
    import ragen2
    from ragen2.collapse.online import OnlineDiagnostics
    from ragen2.config import load_config
    from ragen2.rl.trainer import train
    from ragen2.tracking import read_metrics
    from step_throughput import QUIET, step_time  # imported here, so that ragen2 comes from this side's tree

    config = load_config(None, [*QUIET, f"trainer.total_steps={steps}", f"trainer.run_dir={run_dir}", *overrides])
    train(config)
    rows = []
    for record in read_metrics(run_dir):
        if record["step"] < 1:
            continue
        rows.append({
            "step": record["step"],
            "step_s": step_time(record),
            "collapse_s": record.get("timing_s/collapse"),
            "collapse": {k: v for k, v in record.items() if k.startswith("collapse_")},
            "return_mean": record["rollout/return_mean"],
        })
    schedule = load_config(None, overrides)  # the run these steps stand for: trainer.total_steps as configured
    total = schedule.trainer.total_steps
    diagnosed = sum(OnlineDiagnostics(schedule.collapse, 0).should_run(s) for s in range(1, total + 1))
    return {"ragen2": ragen2.__file__, "rows": rows, "default_total_steps": total,
            "default_diagnosed_fraction": diagnosed / total}


# The diagnostics' code: the scorer and the online proxies, and the rollout's keys/values that the
# trainer keeps for them on a diagnosed step.
DIAGNOSTICS_PATHS = ("ragen2/collapse", "ragen2/agent/prefix_cache.py", "ragen2/agent/backends.py", "ragen2/rl/trainer.py")


def baseline_tree(base: str, dest: Path, paths: list[str]) -> Path:
    """A copy of this tree's ragen2 package with `base`'s version of `paths` in place of its own."""
    shutil.copytree(ROOT / "ragen2", dest / "ragen2", ignore=shutil.ignore_patterns("__pycache__"))
    for path in paths:
        target = dest / path
        if target.is_dir():
            shutil.rmtree(target)
        elif target.exists():
            target.unlink()
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", base, *paths], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)
    return dest


def run_in_subprocess(pythonpath: Path, steps: int, run_dir: Path, overrides: list[str]) -> dict[str, Any]:
    out = run_dir.with_suffix(".json")
    env = os.environ | {"PYTHONPATH": str(pythonpath)}
    cmd = [sys.executable, __file__, "--side-json", str(out), "--steps", str(steps), "--run-dir", str(run_dir),
           *overrides]
    subprocess.run(cmd, env=env, check=True, cwd=pythonpath)
    return json.loads(out.read_text())


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One side's share (both definitions) over all its runs' steps."""
    rows = [row for run in runs for row in run["rows"]]
    collapse = [row["collapse_s"] for row in rows if row["collapse_s"] is not None]
    without = [row["step_s"] - (row["collapse_s"] or 0.0) for row in rows]
    f = runs[0]["default_diagnosed_fraction"]
    c, s = float(np.mean(collapse)), float(np.mean(without))
    return {
        "ragen2": runs[0]["ragen2"],
        "steps": len(rows),
        "diagnosed_steps": len(collapse),
        "collapse_s_when_run": c,
        "step_s_without_collapse": s,
        "share_default_schedule": f * c / (s + f * c),
        "share_of_measured_steps": sum(collapse) / sum(row["step_s"] for row in rows),
        "default_diagnosed_fraction": f,
    }


def logged_difference(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """Largest |after - before| over every collapse_* number both logged at the same step of the same repeat."""
    worst, where, compared, only_one_side = 0.0, None, 0, []
    for b, a in zip(before["rows"], after["rows"]):
        only_one_side += sorted(set(a["collapse"]) ^ set(b["collapse"]))
        for key in set(a["collapse"]) & set(b["collapse"]):
            compared += 1
            diff = abs(a["collapse"][key] - b["collapse"][key])
            if diff > worst:
                worst, where = diff, f"{key} at step {a['step']}"
    same_training = all(a["return_mean"] == b["return_mean"] for b, a in zip(before["rows"], after["rows"]))
    return {"max_abs_diff": worst, "where": where, "numbers_compared": compared,
            "keys_on_one_side_only": only_one_side, "same_returns_every_step": same_training}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=5, help="Training steps per run (5: diagnostics at steps 1 and 5).")
    parser.add_argument("--repeats", type=int, default=1, help="Runs per side, alternating the order.")
    parser.add_argument("--base", default="HEAD", help="Git revision whose diagnostics' code is the 'before' side.")
    parser.add_argument("--paths", nargs="+", default=list(DIAGNOSTICS_PATHS),
                        help="What the 'before' side takes from --base (default: the diagnostics' code).")
    parser.add_argument("--out", default=None, help="Write the results as JSON here.")
    parser.add_argument("--side-json", default=None, help=argparse.SUPPRESS)  # internal: run one side, write JSON
    parser.add_argument("--run-dir", default=None, help=argparse.SUPPRESS)
    parser.add_argument("overrides", nargs="*", help="Config overrides for both sides, e.g. model.device=cpu.")
    args = parser.parse_args()
    if args.side_json:
        result = run_side(args.steps, Path(args.run_dir), args.overrides)
        Path(args.side_json).write_text(json.dumps(result))
        return
    if args.steps < 1 or args.repeats < 1:
        parser.error("--steps and --repeats must be at least 1")

    runs: dict[str, list[dict[str, Any]]] = {side: [] for side in SIDES}
    with tempfile.TemporaryDirectory(prefix="diagnostics_share-") as tmp:
        paths = {"before": baseline_tree(args.base, Path(tmp) / "before-tree", args.paths), "after": ROOT}
        for repeat in range(args.repeats):
            for side in SIDES if repeat % 2 == 0 else SIDES[::-1]:
                print(f"repeat {repeat + 1}/{args.repeats}: {side} ({args.steps} steps) ...", flush=True)
                runs[side].append(run_in_subprocess(paths[side], args.steps, Path(tmp) / f"{side}-{repeat}",
                                                    args.overrides))
        summary = {side: summarise(runs[side]) for side in SIDES}
    logged = [logged_difference(b, a) for b, a in zip(runs["before"], runs["after"])]
    b, a = summary["before"], summary["after"]
    f = b["default_diagnosed_fraction"]

    print(f"\nDefault config, {args.steps} steps x {args.repeats} run(s) per side, OMP_NUM_THREADS="
          f"{os.environ.get('OMP_NUM_THREADS', 'unset')}; before = {' '.join(args.paths)} at {args.base}, after = this tree.")
    print(f"share (default schedule) = f c / (s + f c), f = {f:.3f} of the default run's steps diagnosed, "
          "c = collapse s when run, s = step s without collapse\n")
    print("| side | steps (diagnosed) | c: collapse s when run | s: step s without collapse "
          "| share, default schedule | share of measured steps |")
    print("| --- | --- | --- | --- | --- | --- |")
    for side in SIDES:
        r = summary[side]
        print(f"| {side} | {r['steps']} ({r['diagnosed_steps']}) | {r['collapse_s_when_run']:.3f} "
              f"| {r['step_s_without_collapse']:.3f} | {r['share_default_schedule']:.2%} "
              f"| {r['share_of_measured_steps']:.2%} |")
    print(f"| after / before | | {a['collapse_s_when_run'] / b['collapse_s_when_run']:.3f} "
          f"| {a['step_s_without_collapse'] / b['step_s_without_collapse']:.3f} "
          f"| {a['share_default_schedule'] / b['share_default_schedule']:.3f} "
          f"| {a['share_of_measured_steps'] / b['share_of_measured_steps']:.3f} |")
    worst = max(logged, key=lambda d: d["max_abs_diff"])
    print(f"\nlogged collapse_* numbers, after vs before: max |diff| {worst['max_abs_diff']:.2e} ({worst['where']}), "
          f"{sum(d['numbers_compared'] for d in logged)} compared; keys on one side only: "
          f"{sorted({k for d in logged for k in d['keys_on_one_side_only']}) or 'none'}; "
          f"same rollout returns every step: {all(d['same_returns_every_step'] for d in logged)}")
    if args.out:
        Path(args.out).write_text(json.dumps({"summary": summary, "logged_difference": logged, "runs": runs,
                                              "steps": args.steps, "repeats": args.repeats, "base": args.base,
                                              "paths": args.paths},
                                             indent=2) + "\n")


if __name__ == "__main__":
    main()
