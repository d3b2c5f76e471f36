"""The collapse demo's one picture: MI proxies, token entropy and held-out success, without and with the filter.

`make collapse-demo` runs `experiments/collapse_demo.yaml` (the `collapse` preset, its `filter` axis
`none` vs `paper`, three seeds) and then this module on the sweep directory:

    python -m ragen2.report.collapse_demo sweeps/collapse_demo [--out FIGURE.png]

It draws one row of four panels in the spirit of RAGEN-2's first figure (the first turn's
MI-ZScore-EMA and Retrieval-Acc, the token entropy, held-out success over steps), a line per arm
(the mean over its seeds, its runs thin behind it) and a dashed line at every `collapse_alarm`
event of a run, in its arm's colour. It also prints, per arm, the changes that docs/results.md
judges (late minus early quarter of each run, mean ± SE over seeds) and the alarms' steps.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from ragen2.report.runs import RunData, load_runs
from ragen2.sweep import mean_se, read_sweep

MI_KEY = "collapse_first_turn/mi_zscore_ema"
RETRIEVAL_KEY = "collapse_first_turn/retrieval_acc"
ENTROPY_KEY = "train/entropy"
SUCCESS_KEY = "eval/success_rate"
PANELS = ((MI_KEY, "MI-ZScore-EMA (first turn)"), (RETRIEVAL_KEY, "Retrieval-Acc (first turn)"),
          (ENTROPY_KEY, "token entropy (nats)"), (SUCCESS_KEY, "held-out success"))
ARM_COLORS = {"none": "C3", "paper": "C0"}  # red: no filter; blue: the paper's filter; other arms C4, C5, ... by position
ALARM = "collapse_alarm"


@dataclass(frozen=True)
class Arm:
    """The finished runs of one label of the sweep's axis."""

    name: str
    runs: list[RunData]
    color: str


def load_arms(sweep_dir: Path, axis: str = "filter") -> list[Arm]:
    """The sweep's finished runs grouped by their label on `axis`, in the grid's order."""
    arms: dict[str, list[Path]] = {}
    for row in read_sweep(sweep_dir):
        if row["status"] == "done":
            arms.setdefault(str(row[axis]), []).append(Path(sweep_dir) / row["run"])
    return [Arm(name, load_runs(paths), ARM_COLORS.get(name, f"C{4 + i}")) for i, (name, paths) in enumerate(arms.items())]


def early_late(values: np.ndarray) -> tuple[float, float]:
    """Mean of the first and of the last quarter of a series (at least one point each)."""
    k = max(1, len(values) // 4)
    return float(values[:k].mean()), float(values[-k:].mean())


def change(run: RunData, key: str, relative: bool = False) -> float:
    """Late minus early level of `key` over the run, divided by the early level when `relative`; NaN if never logged."""
    _, values = run.metrics.series(key)
    if not len(values):
        return math.nan
    early, late = early_late(values)
    return (late - early) / abs(early) if relative else late - early


def alarm_steps(run: RunData) -> list[int]:
    return [int(e["step"]) for e in run.events if e.get("kind") == ALARM]


def summary(arms: Sequence[Arm]) -> list[str]:
    """One line per arm: the judged changes (mean ± SE over its runs) and each run's alarm steps."""
    def fmt(values: list[float]) -> str:
        mean, se, n = mean_se(values)
        return f"{mean:+.3f} ± {se:.3f}" if n > 1 else (f"{mean:+.3f}" if n else "–")

    lines = []
    for arm in arms:
        alarms = ["/".join(map(str, alarm_steps(r))) or "none" for r in arm.runs]
        lines.append(
            f"{arm.name:>6} ({len(arm.runs)} runs): Δ MI-ZScore-EMA {fmt([change(r, MI_KEY) for r in arm.runs])}, "
            f"Δ Retrieval-Acc {fmt([change(r, RETRIEVAL_KEY) for r in arm.runs])}, "
            f"Δ token entropy {fmt([change(r, ENTROPY_KEY, relative=True) for r in arm.runs])} (relative), "
            f"Δ held-out success {fmt([change(r, SUCCESS_KEY) for r in arm.runs])}; alarms at step {', '.join(alarms)}"
        )
    return lines


def _mean_curve(runs: Sequence[RunData], key: str) -> tuple[np.ndarray, np.ndarray]:
    """The mean over runs at the steps every run logged `key`."""
    series = [dict(zip(*(a.tolist() for a in r.metrics.series(key)))) for r in runs]
    steps = sorted(set.intersection(*(set(s) for s in series))) if series else []
    return np.asarray(steps), np.asarray([np.mean([s[t] for s in series]) for t in steps])


def draw(arms: Sequence[Arm], out: Path, title: str = "") -> Path:
    """The four panels, a line per arm, alarms dashed; written to `out` (PNG)."""
    fig = Figure(figsize=(4.2 * len(PANELS), 3.4), dpi=110, layout="constrained")
    axes = fig.subplots(1, len(PANELS))
    for ax, (key, label) in zip(axes, PANELS):
        for arm in arms:
            for run in arm.runs:
                ax.plot(*run.metrics.series(key), color=arm.color, alpha=0.25, linewidth=0.8)
            steps, mean = _mean_curve(arm.runs, key)
            ax.plot(steps, mean, color=arm.color, linewidth=2, marker="o" if key == SUCCESS_KEY else None,
                    markersize=3, label=f"filter: {arm.name} (mean of {len(arm.runs)})")
            for run in arm.runs:
                for step in alarm_steps(run):
                    ax.axvline(step, color=arm.color, linestyle="--", linewidth=1, alpha=0.8)
        ax.set_title(label, fontsize=10)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    if any(alarm_steps(r) for arm in arms for r in arm.runs):
        axes[0].plot([], [], color="gray", linestyle="--", linewidth=1, label="collapse alarm (one run)")
    axes[0].legend(fontsize=8, loc="best")
    if title:
        fig.suptitle(title, fontsize=11)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m ragen2.report.collapse_demo",
        description="Draw the collapse demo's figure from a finished sweep directory (experiments/collapse_demo.yaml) "
                    "and print each arm's changes and alarm steps.",
    )
    parser.add_argument("sweep", type=Path, help="the sweep directory, e.g. sweeps/collapse_demo")
    parser.add_argument("--out", type=Path, help="the PNG to write (default: SWEEP/collapse_demo.png)")
    parser.add_argument("--axis", default="filter", help="the sweep axis whose labels are the arms (default: filter)")
    args = parser.parse_args(argv)
    arms = load_arms(args.sweep, args.axis)
    if not arms:
        parser.error(f"{args.sweep} has no finished run yet: run `ragen2 sweep experiments/collapse_demo.yaml` first")
    out = draw(arms, args.out or args.sweep / "collapse_demo.png", "Collapse you can watch: no filter vs the paper's filter")
    print("\n".join(summary(arms)))
    print(f"figure: {out}")


if __name__ == "__main__":
    main()
