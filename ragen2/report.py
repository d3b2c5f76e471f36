"""Figures and a one-page HTML report of a run directory, or of several runs overlaid.

Reads each run's `metrics.jsonl` and `events.jsonl` (see `ragen2.tracking`), `config.yaml` and
the sample trajectories in `rollouts/step_N.jsonl`, and writes PNGs under `OUT/figures/` plus
`OUT/report.html`, which shows them with relative paths so the directory can be copied or
zipped as a whole. OUT is the run directory for one run (see `default_out_dir` for several).
The page puts the collapse proxies next to token entropy and success on one step axis, because
the point of the diagnostics is to see the MI proxies fall while entropy looks healthy, before
success drops (RAGEN-2, arXiv 2604.06268).

Several runs (`ragen2 report RUN1 RUN2 ...`, e.g. filter against no filter) share every line
panel: one colour per run, named in the legend, and within a run one line style per series.
Stacked timing bars and gradient-norm bars cannot be overlaid, so those figures get one panel
per run. `smooth` > 0 draws a trailing moving average over that many logged points, with the raw
points kept faint behind it; evaluation points (sparse, with error bars) and bars are never smoothed.

Figures and panels whose metrics no run logged are skipped, not drawn empty; the page lists the
skipped figures. Missing values (null in metrics.jsonl: a collapse proxy a check could not
support, see `ragen2.collapse.mi_metrics`) are skipped point by point; the summary shows "n/a"
with the pair count. Figures are built with `matplotlib.figure.Figure`, which renders PNGs with
the Agg backend and leaves pyplot's global state (and any interactive backend a notebook chose) alone.
"""

from __future__ import annotations

import fnmatch
import html
import json
import math
import os
import re
import textwrap
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from matplotlib.axes import Axes
from matplotlib.colors import to_hex
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator
from matplotlib.transforms import ScaledTranslation

from ragen2.tracking import read_events, read_metrics
from ragen2.verdict import verdict

FIGURE_DIR = "figures"
REPORT_FILE = "report.html"
ROLLOUT_DIR = "rollouts"
# A sample trajectory's observation or response longer than this is cut in the page (a real
# model's prompts can run to thousands of tokens; the file in rollouts/ keeps them whole).
SAMPLE_TEXT_CHARS = 3000

# Columns of the summary table, as in the CLI's end-of-run table (ragen2.rl.summary).
SUMMARY_COLUMNS = ("first", "last", "max")
# Rows of the summary table, in this order, when the run logged them.
SUMMARY_KEYS = (
    "eval/success_rate",
    "rollout/success_rate",
    "rollout/return_mean",
    "eval/return_mean",
    "train/entropy",
    "train/kl",
    "rollout/response_tokens_mean",
    "collapse_first_turn/retrieval_acc",
    "collapse_first_turn/mi_zscore_ema",
    "collapse_trajectory/retrieval_acc",
    "collapse_trajectory/mi_zscore_ema",
    "filter/kept_ratio",
    "rollout/rv_mean",
    "timing_s/step",
)

# Top-level phases of a step in the order it runs them: they add up to `timing_s/step`, so they
# stack. `generate` runs inside `rollout` and is drawn as the lower part of the rollout bar.
TIMING_PHASES = ("rollout", "collapse", "filter", "advantage", "update", "grad_snr", "evaluate", "checkpoint")
_GENERATE, _ROLLOUT_REST, _OTHER = "generate", "rollout (excl. generate)", "other (step − phases)"
THROUGHPUT_KEYS = ("rollout/response_tokens_mean", "rollout/turns_mean", "timing_s/generate")

_BUCKET_KEY = re.compile(r"^grad_snr/bucket(\d+)/")
_ROLLOUT_FILE = re.compile(r"^step_(\d+)\.jsonl$")
_FIRST, _TRAJ = "collapse_first_turn", "collapse_trajectory"
_LINESTYLES = ("-", "--", ":", "-.")
# A panel whose values spread over less than this fraction of their size holds one value up to float
# rounding (a constant learning rate read back from the optimizer): it is drawn at ± CONSTANT_MARGIN.
CONSTANT_RTOL = 1e-6
CONSTANT_MARGIN = 0.1
# A step that takes more than this many times the median step (a slow first step) runs off the top of
# the timing panel, so that it does not flatten the others; its total is written on it.
TIMING_OUTLIER = 3.0


class Metrics:
    """Per-key series of a run's step records: finite numbers only, sorted by step."""

    def __init__(self, records: list[dict[str, Any]]) -> None:
        self.records = sorted(records, key=lambda r: r["step"])
        columns: dict[str, tuple[list[int], list[float]]] = {}
        for record in self.records:
            for key, value in record.items():
                if key == "step" or not _is_number(value):
                    continue
                steps, values = columns.setdefault(key, ([], []))
                steps.append(record["step"])
                values.append(float(value))
        self._columns = {k: (np.asarray(s), np.asarray(v)) for k, (s, v) in columns.items()}

    def has(self, pattern: str) -> bool:
        """Whether any logged key matches `pattern` (an exact key or a glob such as `timing_s/*`)."""
        return bool(self.matching(pattern))

    def matching(self, pattern: str) -> list[str]:
        """Logged keys matching `pattern`, sorted."""
        return sorted(k for k in self._columns if fnmatch.fnmatchcase(k, pattern))

    def series(self, key: str) -> tuple[np.ndarray, np.ndarray]:
        """(steps [N], values [N]) of `key`; both empty when it was never logged."""
        return self._columns.get(key, (np.zeros(0, dtype=int), np.zeros(0)))

    def joint(self, *keys: str) -> tuple[np.ndarray, list[np.ndarray]]:
        """(steps, one value array per key) at the steps where every one of `keys` was logged."""
        steps = sorted(set.intersection(*(set(self.series(k)[0].tolist()) for k in keys)))
        values = []
        for key in keys:
            at = dict(zip(*(a.tolist() for a in self.series(key))))
            values.append(np.asarray([at[s] for s in steps], dtype=float))
        return np.asarray(steps, dtype=int), values

    def point(self, key: str, index: int) -> tuple[int, float] | None:
        """(step, value) of the `index`-th point of `key` (0 the first, -1 the latest), or None when never logged."""
        steps, values = self.series(key)
        return (int(steps[index]), float(values[index])) if len(steps) else None

    def peak(self, key: str) -> tuple[int, float] | None:
        """(step, value) of the largest value of `key` (the first, on ties), or None."""
        steps, values = self.series(key)
        if not len(steps):
            return None
        i = int(np.argmax(values))
        return int(steps[i]), float(values[i])


@dataclass(frozen=True)
class RunData:
    """One run directory as the report reads it."""

    path: Path
    label: str  # legend name: the directory's name (its path where two runs share a name)
    color: str  # the run's colour in overlays
    metrics: Metrics
    events: list[dict[str, Any]]
    config: dict[str, Any]  # config.yaml; {} when the run has none


def load_runs(run_dirs: Sequence[Path]) -> list[RunData]:
    """Read every run directory; labels are directory names, made unique by the path (and by
    the position, for a directory given twice)."""
    paths = [Path(d) for d in run_dirs]
    names = [p.resolve().name for p in paths]
    labels = [name if names.count(name) == 1 else str(path) for name, path in zip(names, paths)]
    labels = [label if labels.count(label) == 1 else f"{label} #{i + 1}" for i, label in enumerate(labels)]
    runs = []
    for i, (path, label) in enumerate(zip(paths, labels)):
        config_path = path / "config.yaml"
        config = yaml.safe_load(config_path.read_text(encoding="utf-8")) if config_path.is_file() else None
        runs.append(RunData(path, label, f"C{i % 10}", Metrics(read_metrics(path)), read_events(path),
                            config if isinstance(config, dict) else {}))
    return runs


def config_value(config: dict[str, Any], dotted: str) -> Any:
    """The value at a dotted key such as `trainer.eval_episodes`, or None when absent."""
    node: Any = config
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def eval_success_stderr(run: RunData) -> np.ndarray | None:
    """Binomial standard error sqrt(p (1 − p) / n) of each point of `eval/success_rate`.

    n is that step's `eval/episodes`, else the config's `trainer.eval_episodes`; None when
    neither is known, and NaN (no bar) at a step with no n.
    """
    steps, p = run.metrics.series("eval/success_rate")
    logged = dict(zip(*(a.tolist() for a in run.metrics.series("eval/episodes"))))
    default = config_value(run.config, "trainer.eval_episodes")
    default = float(default) if _is_number(default) and default > 0 else math.nan
    if not logged and math.isnan(default):
        return None
    n = np.asarray([logged.get(s, default) for s in steps.tolist()], dtype=float)
    return np.sqrt(p * (1 - p) / n)


def success_verdicts(runs: list[RunData]) -> list[str]:
    """"held-out success, step A → B: 0.250 → 0.700: learned: ..." from each run's first evaluation to its
    last (`ragen2.verdict`, with `eval_success_stderr`), led by the run's label when there are several;
    runs with fewer than two evaluations have none."""
    lines = []
    for run in runs:
        steps, p = run.metrics.series("eval/success_rate")
        if len(steps) < 2:
            continue
        stderr = eval_success_stderr(run)
        se = [None if stderr is None or math.isnan(stderr[i]) else float(stderr[i]) for i in (0, -1)]
        line = f"held-out success, step {steps[0]} → {steps[-1]}: {verdict(p[0], se[0], p[-1], se[1])}"
        lines.append(line if len(runs) == 1 else f"{run.label}: {line}")
    return lines


def generation_throughput(run: RunData) -> tuple[np.ndarray, np.ndarray]:
    """(steps, generated tokens per second of `timing_s/generate`) over the whole training batch.

    Tokens per step = tokens per turn × turns per episode × P × G (`rollout.num_groups` ×
    `rollout.group_size` from config.yaml); both arrays are empty when any of them is missing.
    """
    groups = config_value(run.config, "rollout.num_groups")
    size = config_value(run.config, "rollout.group_size")
    if not (_is_number(groups) and _is_number(size)) or not all(run.metrics.has(k) for k in THROUGHPUT_KEYS):
        return np.zeros(0, dtype=int), np.zeros(0)
    steps, (per_turn, turns, seconds) = run.metrics.joint(*THROUGHPUT_KEYS)
    keep = seconds > 0
    return steps[keep], (per_turn * turns * groups * size / seconds)[keep]


def timing_stack(metrics: Metrics) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """(steps, segment name -> seconds at each step, 0 where the phase did not run) of the stacked bars.

    The segments are the top-level phases of `TIMING_PHASES` (then any other `timing_s/` key),
    the rollout split into `generate` and the rest; "other" is the step time no phase accounts
    for, kept only where it reaches 1% of the longest step.
    """
    nested = {"timing_s/step", f"timing_s/{_GENERATE}"}
    keys = [f"timing_s/{p}" for p in TIMING_PHASES if metrics.has(f"timing_s/{p}")]
    keys += [k for k in metrics.matching("timing_s/*") if k not in nested and k not in keys]
    steps = np.asarray(sorted({s for k in [*keys, *nested] for s in metrics.series(k)[0].tolist()}), dtype=int)

    def dense(key: str) -> np.ndarray:
        at = dict(zip(*(a.tolist() for a in metrics.series(key))))
        return np.asarray([at.get(s, 0.0) for s in steps.tolist()], dtype=float)

    stack: dict[str, np.ndarray] = {}
    for key in keys:
        seconds = dense(key)
        if key == "timing_s/rollout" and metrics.has(f"timing_s/{_GENERATE}"):
            generate = np.minimum(dense(f"timing_s/{_GENERATE}"), seconds)
            stack[_GENERATE], stack[_ROLLOUT_REST] = generate, seconds - generate
        else:
            stack[key.removeprefix("timing_s/")] = seconds
    if metrics.has("timing_s/step"):
        step_seconds = metrics.series("timing_s/step")[1]
        total = sum(stack.values(), np.zeros(len(steps)))
        other = np.maximum(dense("timing_s/step") - total, 0.0)  # 0 where the step time is not logged
        if other.max() >= 0.01 * step_seconds.max():
            stack[_OTHER] = other
    return steps, stack


def timing_top(totals: np.ndarray) -> float:
    """Top of the timing panel's y axis for these step totals: 10% above the tallest step that takes at
    most `TIMING_OUTLIER` × the median step, so that one slow step does not flatten the rest."""
    limit = TIMING_OUTLIER * float(np.median(totals))
    typical = totals[totals <= limit] if limit > 0 else totals
    return 1.1 * float(typical.max()) or 1.0  # all zero: any scale shows them


def moving_average(values: np.ndarray, window: int) -> np.ndarray:
    """Trailing mean of the last `window` points at each point (fewer at the start): it never
    looks ahead, so a smoothed curve does not drop before the raw one does."""
    sums = np.cumsum(np.concatenate([[0.0], np.asarray(values, dtype=float)]))
    ends = np.arange(1, len(values) + 1)
    starts = np.maximum(ends - window, 0)
    return (sums[ends] - sums[starts]) / (ends - starts)


Draw = Callable[[Figure, list[RunData], int], None]


@dataclass(frozen=True)
class FigureSpec:
    """One figure: drawn when any run logged any of `keys` (exact or glob), or when
    `available` says so for any run; skipped otherwise."""

    name: str  # file stem under figures/
    title: str
    keys: tuple[str, ...]
    draw: Draw
    available: Callable[[RunData], bool] | None = None
    needs: str = ""  # what the page says a skipped figure needed, when not simply one of `keys`
    always: bool = True  # listed under "not drawn" when skipped; False for figures only some kinds of run have

    def drawable(self, run: RunData) -> bool:
        if self.available is not None:
            return self.available(run)
        return any(run.metrics.has(key) for key in self.keys)


def default_out_dir(run_dirs: Sequence[Path]) -> Path:
    """Where a report goes unless told: the run directory itself for one run; for several,
    `report-A-vs-B` in the working directory (A, B the first two run names), with
    `-and-N-more` appended past two."""
    if len(run_dirs) == 1:
        return Path(run_dirs[0])
    names = [Path(d).resolve().name for d in run_dirs]
    more = f"-and-{len(names) - 2}-more" if len(names) > 2 else ""
    return Path(f"report-{names[0]}-vs-{names[1]}{more}")


def write_report(run_dirs: Path | str | Sequence[Path | str], out_dir: Path | None = None, smooth: int = 0) -> Path:
    """Draw every figure the runs have data for and write `report.html` under `out_dir`
    (default: `default_out_dir`); return its path. Several runs are overlaid."""
    dirs = [Path(run_dirs)] if isinstance(run_dirs, (str, os.PathLike)) else [Path(d) for d in run_dirs]
    if not dirs:
        raise ValueError("write_report needs at least one run directory")
    if smooth < 0:
        raise ValueError(f"smooth is a window of logged points, 0 for none; got {smooth}")
    out = Path(out_dir) if out_dir is not None else default_out_dir(dirs)
    runs = load_runs(dirs)
    fig_dir = out / FIGURE_DIR
    fig_dir.mkdir(parents=True, exist_ok=True)

    drawn: list[FigureSpec] = []
    missing: list[FigureSpec] = []
    for spec in FIGURES:
        path = fig_dir / f"{spec.name}.png"
        if not any(spec.drawable(run) for run in runs):
            if spec.always:
                missing.append(spec)
            path.unlink(missing_ok=True)  # a figure left from an older report would mislead
            continue
        fig = Figure(dpi=100, layout="constrained")
        spec.draw(fig, runs, smooth)
        fig.savefig(path)
        drawn.append(spec)

    page = out / REPORT_FILE
    page.write_text(_html(runs, drawn, missing, smooth), encoding="utf-8")
    return page


# ----------------------------------------------------------------------------- figures


def _panels(fig: Figure, n: int, height: float = 2.4) -> list[Axes]:
    """`n` stacked panels sharing the step axis. Their y ticks have no offset: a nearly flat series
    would otherwise read "1e−16+1e−4" over ticks −1..1 instead of its value."""
    fig.set_size_inches(8, max(3.4, height * n))
    axes = fig.subplots(n, 1, sharex=True, squeeze=False)[:, 0]
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.yaxis.get_major_formatter().set_useOffset(False)
    axes[-1].set_xlabel("step")
    axes[-1].xaxis.set_major_locator(MaxNLocator(integer=True))
    return list(axes)


def _curve(ax: Axes, steps: np.ndarray, values: np.ndarray, label: str, smooth: int, **style: Any) -> None:
    """One series. Sparse series (computed every few steps) get markers so that single points
    stay visible; with `smooth` the moving average carries the label, the raw points stay faint."""
    marker = "o" if len(steps) <= 60 else None
    if smooth > 0:
        ax.plot(steps, values, **{**style, "alpha": 0.25, "linewidth": 1, "marker": marker, "markersize": 2})
        ax.plot(steps, moving_average(values, smooth), label=label, **style)
    else:
        ax.plot(steps, values, label=label, marker=marker, markersize=3, **style)


def _first_label(ax: Axes, label: str) -> str:
    """`label`, or matplotlib's no-legend label when `ax` already has an entry of that name."""
    return "_nolegend_" if label in ax.get_legend_handles_labels()[1] else label


def _legend_key(ax: Axes, label: str, **style: Any) -> None:
    """A gray legend entry (an empty line) for a series style that several runs' colours share."""
    if label not in ax.get_legend_handles_labels()[1]:
        ax.plot([], [], color="gray", label=label, **style)


def _lines(
    ax: Axes,
    runs: list[RunData],
    smooth: int,
    series: Sequence[tuple[str, str]],
    key_series: bool | None = None,
    **style: Any,
) -> None:
    """`series` ((key, label) pairs) of every run. One run: a colour per series (or `style`'s),
    labelled by series. Several: the run's colour and a line style per series; the legend names
    each run once and, when `key_series` (default: with more than one series), each series'
    line style in gray, so it stays short however many series and runs share the panel."""
    several = len(runs) > 1
    drawn = set()
    for run in runs:
        for i, (key, label) in enumerate(series):
            steps, values = run.metrics.series(key)
            if not len(steps):
                continue
            if several:
                kw = {"linestyle": _LINESTYLES[i % len(_LINESTYLES)], **style, "color": run.color}
                _curve(ax, steps, values, _first_label(ax, run.label), smooth, **kw)
            else:
                _curve(ax, steps, values, label, smooth, **{"color": f"C{i}", **style})
            drawn.add(i)
    if several and (len(series) > 1 if key_series is None else key_series):
        for i in sorted(drawn):
            _legend_key(ax, series[i][1], linestyle=style.get("linestyle", _LINESTYLES[i % len(_LINESTYLES)]))


def _eval_points(ax: Axes, runs: list[RunData], key: str, label: str, stderr: bool = False) -> None:
    """Evaluations happen every few steps: large markers (with ± one standard error when
    `stderr`), never joined by a line, which would read as another curve; black for one run. For
    several, each run's colour with a black edge, the runs nudged a few points apart on screen
    (not in the data) so that equal values stay visible."""
    evaluated = [run for run in runs if run.metrics.has(key)]
    for r, run in enumerate(evaluated):
        steps, values = run.metrics.series(key)
        yerr = eval_success_stderr(run) if stderr else None
        name = f"{label} ± SE" if yerr is not None else label
        if len(runs) == 1:
            ax.errorbar(steps, values, yerr=yerr, fmt="D", color="black", markersize=6, capsize=3, zorder=3, label=name)
            continue
        nudge = ScaledTranslation((r - (len(evaluated) - 1) / 2) * 4 / 72, 0, ax.figure.dpi_scale_trans)
        ax.errorbar(steps, values, yerr=yerr, fmt="D", color=run.color, markeredgecolor="black", markersize=6,
                    capsize=3, zorder=3, label=_first_label(ax, run.label), transform=ax.transData + nudge)
        ax.update_datalim(np.column_stack([steps, values]))  # artists off transData do not autoscale
        _legend_key(ax, name, marker="D", markeredgecolor="black", linestyle="none")


def _mark_events(axes: list[Axes], runs: list[RunData]) -> None:
    """Vertical dashed lines at alarms, skipped steps, early stops...: one colour per event kind
    for one run, the run's colour for several; each kind named once in the legend of the top panel."""
    kinds = sorted({str(e["kind"]) for run in runs for e in run.events})
    kind_colors = {kind: f"C{(i + 3) % 10}" for i, kind in enumerate(kinds)}
    for run in runs:
        for event in run.events:
            name = f"event: {event['kind']}"
            color = kind_colors[str(event["kind"])] if len(runs) == 1 else run.color
            for j, ax in enumerate(axes):
                label = _first_label(ax, name) if j == 0 and len(runs) == 1 else "_nolegend_"
                ax.axvline(event["step"], color=color, linestyle="--", linewidth=1, alpha=0.7, label=label)
            if len(runs) > 1:
                _legend_key(axes[0], name, linestyle="--", linewidth=1)


def _frame_constant(ax: Axes) -> None:
    """Autoscaled y limits of a panel whose data hold one value (`CONSTANT_RTOL`) become that value
    ± `CONSTANT_MARGIN` of it, so that its ticks read the value; a constant 0 keeps matplotlib's ±0.05."""
    low, high = ax.dataLim.intervaly
    middle = (low + high) / 2
    if ax.get_autoscaley_on() and middle != 0 and 0 <= high - low <= CONSTANT_RTOL * abs(middle):
        ax.set_ylim(middle - CONSTANT_MARGIN * abs(middle), middle + CONSTANT_MARGIN * abs(middle))


def _finish(axes: list[Axes], runs: list[RunData]) -> None:
    _mark_events(axes, runs)
    for ax in axes:
        _frame_constant(ax)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8, loc="best")


def _rate_axis(ax: Axes, label: str) -> None:
    ax.set_ylim(-0.03, 1.03)
    ax.set_ylabel(label)


def _any(runs: list[RunData], *keys: str) -> bool:
    return any(run.metrics.has(key) for run in runs for key in keys)


def _line_spec(name: str, title: str, panels: Sequence[tuple[str, Sequence[tuple[str, str]]]]) -> FigureSpec:
    """A figure of stacked line panels, (y label, series) each; a panel no run logged is left out."""

    def draw(fig: Figure, runs: list[RunData], smooth: int) -> None:
        present = [(ylabel, series) for ylabel, series in panels if _any(runs, *(k for k, _ in series))]
        axes = _panels(fig, len(present))
        axes[0].set_title(title)
        for ax, (ylabel, series) in zip(axes, present):
            _lines(ax, runs, smooth, series)
            ax.set_ylabel(ylabel)
        _finish(axes, runs)

    return FigureSpec(name, title, tuple(k for _, series in panels for k, _ in series), draw)


def _draw_reward(fig: Figure, runs: list[RunData], smooth: int) -> None:
    """Mean return with a ± std band for one run; several runs' bands would hide each other's lines."""
    (ax,) = _panels(fig, 1)
    ax.set_title("Episode return")
    steps, (mean, std) = runs[0].metrics.joint("rollout/return_mean", "rollout/return_std")
    if len(runs) == 1 and len(steps):
        ax.fill_between(steps, mean - std, mean + std, alpha=0.2, color="C0", label="± std (rollout)")
    _lines(ax, runs, smooth, [("rollout/return_mean", "rollout mean")], key_series=True)
    _eval_points(ax, runs, "eval/return_mean", "eval mean")
    ax.set_ylabel("return")
    _finish([ax], runs)


def _draw_success(fig: Figure, runs: list[RunData], smooth: int) -> None:
    """The report's first figure: the title says whether held-out success rose beyond noise, run by run."""
    (ax,) = _panels(fig, 1)
    lines = [textwrap.fill(v, 110) for v in success_verdicts(runs)]  # 110 9-point characters fit 8 inches
    ax.set_title("\n".join(["Success rate", *lines]), fontsize=9 if lines else None)
    _lines(ax, runs, smooth, [("rollout/success_rate", "rollout (training episodes)")], key_series=True)
    _eval_points(ax, runs, "eval/success_rate", "eval (held-out seeds)", stderr=True)
    _rate_axis(ax, "success rate")
    _finish([ax], runs)


def run_tags(run: RunData) -> list[str]:
    """A mixture run's tags (`<namespace>/<tag>/<metric>` keys): the training tags, then the evaluation-only ones."""
    keys = run.metrics.matching("rollout/*/success_rate") + run.metrics.matching("eval/*/success_rate")
    return list(dict.fromkeys(key.split("/")[1] for key in keys if key.count("/") == 2))


# Panels of the per-tag figure: (y label, the line's key, the held-out points' key), {t} the tag.
_TAG_PANELS = (
    ("success rate", "rollout/{t}/success_rate", "eval/{t}/success_rate"),
    ("Retrieval-Acc (first turn)", "collapse_first_turn/{t}/retrieval_acc", "collapse_eval/{t}/retrieval_acc"),
    ("filter kept ratio", "filter/{t}/kept_ratio", None),
)


def _draw_tags(fig: Figure, runs: list[RunData], smooth: int) -> None:
    """A mixture's tags overlaid, a colour per tag: success and first-turn Retrieval-Acc of training batches as
    lines and of held-out episodes as diamonds (an out-of-distribution tag has diamonds only), then each tag's
    kept ratio. Several runs share the tags' colours and differ in line style."""
    tags = list(dict.fromkeys(t for run in runs for t in run_tags(run)))
    color = {t: f"C{i % 10}" for i, t in enumerate(tags)}

    def logged(key: str | None) -> bool:
        return key is not None and any(run.metrics.has(key.format(t=t)) for run in runs for t in tags)

    shown = [panel for panel in _TAG_PANELS if logged(panel[1]) or logged(panel[2])]
    axes = _panels(fig, len(shown))
    for ax, (label, line_key, point_key) in zip(axes, shown):
        for r, run in enumerate(runs):
            style = _LINESTYLES[r % len(_LINESTYLES)]
            for t in tags:
                steps, values = run.metrics.series(line_key.format(t=t))
                if len(steps):
                    _curve(ax, steps, values, _first_label(ax, t), smooth, color=color[t], linestyle=style)
                steps, values = run.metrics.series(point_key.format(t=t)) if point_key else ([], [])
                if len(steps):
                    ax.plot(steps, values, "D", color=color[t], markeredgecolor="black", markersize=6, zorder=3,
                            label=_first_label(ax, t))
            if len(runs) > 1:
                _legend_key(ax, run.label, linestyle=style)
        _rate_axis(ax, label)
    axes[0].set_title("Per tag: training episodes (lines), held-out evaluations (diamonds)")
    _finish(axes, runs)


def _draw_throughput(fig: Figure, runs: list[RunData], smooth: int) -> None:
    (ax,) = _panels(fig, 1)
    ax.set_title("Generation throughput (whole batch)")
    for run in runs:
        steps, values = generation_throughput(run)
        if len(steps):
            _curve(ax, steps, values, "generated tokens / s" if len(runs) == 1 else run.label, smooth,
                   color="C0" if len(runs) == 1 else run.color)
    ax.set_ylabel("tokens / s")
    ax.set_ylim(bottom=0)
    _finish([ax], runs)


def _draw_timing(fig: Figure, runs: list[RunData], smooth: int) -> None:
    """Stacked bars, one per step: the phases add up to the step, and a phase that runs every
    few steps (evaluation, collapse checks) is a bar segment at those steps, not a line drawn
    across the steps between. One panel per run, with the same y scale and phase colours; the
    scale fits the typical steps (`timing_top`), and a bar above it is cut, with its total
    written on it and named in its panel's title."""
    timed = [(run, *timing_stack(run.metrics)) for run in runs if run.metrics.has("timing_s/*")]
    segments = list(dict.fromkeys(name for _, _, stack in timed for name in stack))
    colors = {name: f"C{i % 10}" for i, name in enumerate(segments)}
    axes = _panels(fig, len(timed), height=2.6)
    fig.set_size_inches(8, max(3.4, 2.6 * len(timed)) + 0.4)
    totals = [sum(stack.values(), np.zeros(len(steps))) for _, steps, stack in timed]
    top = max(timing_top(t) for t in totals)
    for ax, (run, steps, stack), total in zip(axes, timed, totals):
        bottom = np.zeros(len(steps))
        for name, seconds in stack.items():
            shown = seconds > 0
            ax.bar(steps[shown], seconds[shown], bottom=bottom[shown], width=0.8, color=colors[name], label=name)
            bottom += seconds
        ax.set_ylim(0, top)
        ax.set_ylabel("seconds")
        off = np.flatnonzero(total > top)
        for i in off:
            ax.annotate(f"{total[i]:.3g} s", (steps[i], top), xytext=(0, -3), textcoords="offset points",
                        ha="center", va="top", rotation=90, fontsize=7,
                        bbox={"boxstyle": "round,pad=0.15", "facecolor": "white", "alpha": 0.8, "linewidth": 0})
        title = "Time per phase" if len(runs) == 1 else f"Time per phase: {run.label}"
        if len(off):
            listed = "; ".join(f"step {steps[i]}: {total[i]:.3g} s" for i in off[:3])
            more = f" and {len(off) - 3} more" if len(off) > 3 else ""
            title += f"\n{listed}{more}, off scale"
        ax.set_title(title, **({"fontsize": 10} if len(runs) > 1 or len(off) else {}))
    _mark_events(axes, [run for run, _, _ in timed])
    handles = {label: h for ax in axes for h, label in zip(*ax.get_legend_handles_labels())}
    fig.legend(list(handles.values()), list(handles), loc="outside lower center", ncols=4, fontsize=8)


def _draw_filter(fig: Figure, runs: list[RunData], smooth: int) -> None:
    fractions = _any(runs, "filter/kept_ratio", "rollout/frac_zero_variance")
    variance = _any(runs, "rollout/rv_mean")
    axes = _panels(fig, int(fractions) + int(variance))
    axes[0].set_title("SNR-aware filtering")
    if fractions:
        _lines(axes[0], runs, smooth, [("filter/kept_ratio", "kept ratio (groups kept / groups)"),
                                       ("rollout/frac_zero_variance", "zero-variance groups")])
        _rate_axis(axes[0], "fraction of groups")
    if variance:
        _lines(axes[-1], runs, smooth, [("rollout/rv_mean", "mean reward variance over groups")],
               **({"color": "C2"} if len(runs) == 1 else {}))
        axes[-1].set_ylabel("RV")
    _finish(axes, runs)


def _chance_lines(ax: Axes, runs: list[RunData]) -> None:
    """Retrieval-Acc's chance level of each scheme, 1/N over the N distinct inputs a check scored (the
    logged `chance_level`, see `ragen2.collapse.metrics.mi_metrics`): a dashed line, horizontal while N
    holds, in the colour of the scheme's curve for one run and of the run for several. Labelled
    ("chance 1/8 (trajectory)") at the left end for the first turn and the right end for the trajectory,
    so that equal levels do not overprint; in gray and once per distinct label for several runs."""
    written = set()
    for run in runs:
        for i, (prefix, scheme) in enumerate(((_FIRST, "first turn"), (_TRAJ, "trajectory"))):
            steps, chance = run.metrics.series(f"{prefix}/chance_level")
            if not len(steps):
                continue
            color = f"C{i}" if len(runs) == 1 else run.color
            style = {"color": color, "linestyle": "--", "linewidth": 1}
            counts = sorted({round(1 / c) for c in chance})
            if len(counts) == 1:
                ax.axhline(chance[0], **style)
                text = f"chance 1/{counts[0]} ({scheme})"
            else:
                ax.plot(steps, chance, drawstyle="steps-post", **style)
                text = f"chance 1/N, N = {counts[0]} to {counts[-1]} ({scheme})"
            if text not in written:
                written.add(text)
                left = i == 0
                ax.annotate(text, (0.01 if left else 0.99, chance[0] if left else chance[-1]),
                            xycoords=("axes fraction", "data"), xytext=(0, 1), textcoords="offset points",
                            ha="left" if left else "right", va="bottom", fontsize=7,
                            color=color if len(runs) == 1 else "gray")


def _draw_collapse(fig: Figure, runs: list[RunData], smooth: int) -> None:
    """MI proxies, token entropy and success share the step axis: collapse shows up as the
    proxies falling while entropy stays flat, ahead of a drop in success."""
    rows = [
        _any(runs, f"{_FIRST}/retrieval_acc", f"{_TRAJ}/retrieval_acc"),
        _any(runs, f"{_FIRST}/mi_zscore_ema", f"{_TRAJ}/mi_zscore_ema"),
        _any(runs, "train/entropy"),
        _any(runs, "eval/success_rate", "rollout/success_rate"),
    ]
    axes = iter(_panels(fig, sum(rows), height=2.1))
    one = len(runs) == 1
    used = []
    if rows[0]:
        ax = next(axes)
        _lines(ax, runs, smooth, [(f"{_FIRST}/retrieval_acc", "first turn"), (f"{_TRAJ}/retrieval_acc", "trajectory")])
        _chance_lines(ax, runs)
        _rate_axis(ax, "Retrieval-Acc")
        used.append(ax)
    if rows[1]:
        ax = next(axes)
        _lines(ax, runs, smooth, [(f"{_FIRST}/mi_zscore_ema", "first turn"), (f"{_TRAJ}/mi_zscore_ema", "trajectory")])
        ax.axhline(0.0, color="gray", linewidth=0.8)
        ax.set_ylabel("MI-ZScore-EMA")
        used.append(ax)
    if rows[2]:
        ax = next(axes)
        _lines(ax, runs, smooth, [("train/entropy", "token entropy")], **({"color": "C2"} if one else {}))
        ax.set_ylabel("entropy (nats)")
        used.append(ax)
    if rows[3]:
        ax = next(axes)
        _lines(ax, runs, smooth, [("rollout/success_rate", "rollout")], key_series=True, linewidth=1, alpha=0.6)
        _eval_points(ax, runs, "eval/success_rate", "eval", stderr=True)
        _rate_axis(ax, "success rate")
        used.append(ax)
    used[0].set_title("Collapse diagnostics: MI proxies vs token entropy vs success")
    _finish(used, runs)


def _draw_grad_snr(fig: Figure, runs: list[RunData], smooth: int) -> None:
    """The latest probe only: task-gradient norm should rise with reward variance while the
    KL and entropy norms stay flat (RAGEN-2, Fig. 3); bars per RV bucket, low to high; one
    panel per run that probed."""
    probes = []
    for run in runs:
        probe = next((r for r in reversed(run.metrics.records) if any(_BUCKET_KEY.match(k) for k in r)), None)
        if probe is not None:
            probes.append((run, probe))
    fig.set_size_inches(8, 3.8 * len(probes))
    for ax, (run, probe) in zip(fig.subplots(len(probes), 1, squeeze=False)[:, 0], probes):
        buckets = sorted({int(m.group(1)) for k in probe if (m := _BUCKET_KEY.match(k))})
        width = 0.27
        x = np.arange(len(buckets))
        for j, (part, color) in enumerate((("task_norm", "C0"), ("kl_norm", "C3"), ("entropy_norm", "C2"))):
            values = [_number_or_nan(probe.get(f"grad_snr/bucket{b}/{part}")) for b in buckets]
            ax.bar(x + (j - 1) * width, values, width, label=part.removesuffix("_norm"), color=color)
        labels = []
        for b in buckets:
            rv = _number_or_nan(probe.get(f"grad_snr/bucket{b}/rv_mean"))
            labels.append(f"{b}\nRV {rv:.3g}" if math.isfinite(rv) else str(b))
        ax.set_xticks(x, labels)
        ax.set_xlabel("reward-variance bucket (low → high)")
        ax.set_ylabel("gradient L2 norm")
        run_name = "" if len(runs) == 1 else f"{run.label}: "
        ax.set_title(f"{run_name}Gradient norms by RV bucket (probe at step {probe['step']})")
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=8)


FIGURES = (  # success first: whether the run learned is the report's first question
    FigureSpec("success", "Success rate", ("rollout/success_rate", "eval/success_rate"), _draw_success),
    FigureSpec("tags", "Per tag", ("rollout/*/*", "eval/*/*"), _draw_tags, always=False),  # mixtures only
    FigureSpec("reward", "Episode return", ("rollout/return_mean", "eval/return_mean"), _draw_reward),
    FigureSpec(
        "collapse",
        "Collapse diagnostics",
        tuple(f"{p}/{m}" for p in (_FIRST, _TRAJ) for m in ("retrieval_acc", "mi_zscore_ema")),
        _draw_collapse,
    ),
    _line_spec("entropy", "Token entropy", [("nats / token", [("train/entropy", "train/entropy")])]),
    _line_spec("kl", "KL to the reference", [("nats / token", [("train/kl", "train/kl")])]),
    _line_spec("response_length", "Response length",
               [("tokens", [("rollout/response_tokens_mean", "rollout/response_tokens_mean")])]),
    FigureSpec("filter", "Filtering", ("filter/kept_ratio", "rollout/rv_mean"), _draw_filter),
    _line_spec("loss", "Loss", [("policy loss", [("train/policy_loss", "policy (surrogate)")]),
                                ("value loss", [("train/value_loss", "critic")])]),
    _line_spec("grad_norm", "Gradient norm", [("L2 norm", [("train/grad_norm", "actor, before clipping")])]),
    _line_spec("lr", "Learning rate", [("learning rate", [("train/lr", "actor")])]),
    _line_spec("clipfrac", "Clip fraction",
               [("fraction of tokens", [("train/clipfrac", "ratio clipped"), ("train/dual_clipfrac", "dual clip")])]),
    _line_spec("approx_kl", "Approximate KL", [("nats / token", [("train/approx_kl", "sampling → updated policy")])]),
    FigureSpec(
        "throughput",
        "Generation throughput",
        THROUGHPUT_KEYS,
        _draw_throughput,
        available=lambda run: bool(len(generation_throughput(run)[0])),
        needs="all of these, and rollout.num_groups and rollout.group_size in config.yaml",
    ),
    FigureSpec(
        "grad_snr",
        "Gradient norms by RV bucket",
        ("grad_snr/bucket*/task_norm", "grad_snr/bucket*/kl_norm", "grad_snr/bucket*/entropy_norm"),
        _draw_grad_snr,
    ),
    FigureSpec("timing", "Time per phase", ("timing_s/*",), _draw_timing),
)


# ----------------------------------------------------------------------------- html

_CSS = (
    "body{font-family:sans-serif;max-width:96em;margin:2em auto;padding:0 1em}"
    "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:.2em .6em;text-align:left}"
    "td.n{text-align:right;font-family:monospace}img{max-width:100%}"
    ".figures{display:grid;grid-template-columns:repeat(auto-fill,minmax(34em,1fr));gap:1em;align-items:start}"
    "figure{margin:0}pre{background:#f6f6f6;padding:.6em;overflow:auto;white-space:pre-wrap}"
    "details{margin:.3em 0}summary{cursor:pointer}pre.response{background:#eef4ff}"
)


def _html(runs: list[RunData], drawn: list[FigureSpec], missing: list[FigureSpec], smooth: int) -> str:
    esc = html.escape
    title = " vs ".join(run.label for run in runs)
    parts = [
        "<!doctype html>",
        '<html><head><meta charset="utf-8">',
        f"<title>ragen2 report: {esc(title)}</title>",
        f"<style>{_CSS}</style>",
        "</head><body>",
        f"<h1>ragen2 report: {esc(title)}</h1>",
    ]
    if len(runs) == 1:
        parts.append(f"<p>{esc(_extent(runs[0]))}.</p>")
    else:
        parts += ["<h2>Runs</h2>", "<table><tr><th>run</th><th>colour</th><th>directory</th><th>logged</th></tr>"]
        for run in runs:
            swatch = f'<span style="color:{to_hex(run.color)}">■■■</span>'
            parts.append(f"<tr><td>{esc(run.label)}</td><td>{swatch}</td><td><code>{esc(str(run.path))}</code></td>"
                         f"<td>{esc(_extent(run))}</td></tr>")
        parts.append("</table>")
        parts += _config_diff_html(runs)
    if smooth:
        parts.append(f"<p>Lines are moving averages over the last {smooth} logged points; the raw points are faint "
                     "behind them. Evaluation points and bars are not smoothed.</p>")

    parts += _summary_html(runs)
    parts += ["<h2>Figures</h2>", '<div class="figures">']
    for spec in drawn:
        src = f"{FIGURE_DIR}/{spec.name}.png"
        name = esc(spec.title)
        parts.append(f'<figure><img src="{esc(src)}" alt="{name}"><figcaption>{name}</figcaption></figure>')
    parts.append("</div>")
    if missing:
        parts.append("<p>Not drawn, because no run logged their metrics:</p><ul>")
        for spec in missing:
            keys = ", ".join(f"<code>{esc(k)}</code>" for k in spec.keys)
            parts.append(f"<li>{esc(spec.title)}: {keys}{' (' + esc(spec.needs) + ')' if spec.needs else ''}</li>")
        parts.append("</ul>")

    events = [(run, e) for run in runs for e in run.events]
    if events:
        run_th = "" if len(runs) == 1 else "<th>run</th>"
        parts += ["<h2>Events</h2>", f"<table><tr>{run_th}<th>step</th><th>kind</th><th>message</th></tr>"]
        for run, e in events:
            run_td = "" if len(runs) == 1 else f"<td>{esc(run.label)}</td>"
            parts.append(
                f"<tr>{run_td}<td class=n>{esc(str(e['step']))}</td><td>{esc(str(e['kind']))}</td>"
                f"<td>{esc(str(e.get('message', '')))}</td></tr>"
            )
        parts.append("</table>")

    samples = [(run, _trajectories_html(run)) for run in runs]
    if any(block for _, block in samples):
        parts.append("<h2>Sample trajectories</h2>")
        parts.append(f"<p>Held-out evaluation episodes from <code>{ROLLOUT_DIR}/step_N.jsonl</code>, at the first "
                     "and the last evaluation; each turn shows what the context added since the turn before, "
                     "then the model's response.</p>")
        for run, block in samples:
            if block:
                parts += ([] if len(runs) == 1 else [f"<h3>{esc(run.label)}</h3>"]) + block

    configs = [(run, run.path / "config.yaml") for run in runs if (run.path / "config.yaml").is_file()]
    if configs:
        parts.append("<h2>Config</h2>")
        for run, path in configs:
            text = f"<pre>{esc(path.read_text(encoding='utf-8'))}</pre>"
            parts.append(text if len(runs) == 1 else f"<details><summary>{esc(run.label)}</summary>{text}</details>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def _summary_html(runs: list[RunData]) -> list[str]:
    """The summary: each run's held-out success verdict, then first, last and max of each `SUMMARY_KEYS`
    metric with their steps (the columns of the CLI's end-of-run table); for several runs one row per
    metric and a column triple per run, so the runs read side by side."""
    esc = html.escape
    rows = {run.label: {key: row for key in SUMMARY_KEYS if (row := _summary_row(run.metrics, key))} for run in runs}
    keys = [key for key in SUMMARY_KEYS if any(key in rows[run.label] for run in runs)]
    if not keys:
        return []
    parts = ["<h2>Summary</h2>", *(f"<p>{esc(line)}</p>" for line in success_verdicts(runs))]
    if len(runs) == 1:
        parts.append("<table><tr><th>metric</th>" + "".join(f"<th>{c}</th><th>at step</th>" for c in SUMMARY_COLUMNS)
                     + "</tr>")
        for key in keys:
            cells = [f"<td class=n>{esc(text)}</td><td class=n>{step}</td>" for text, step in rows[runs[0].label][key]]
            parts.append(f"<tr><td>{esc(key)}</td>{''.join(cells)}</tr>")
        return parts + ["</table>"]
    head = "".join(f"<th colspan=3>{esc(run.label)}</th>" for run in runs)
    parts += [f"<table><tr><th rowspan=2>metric</th>{head}</tr>",
              "<tr>" + "".join(f"<th>{c} (step)</th>" for c in SUMMARY_COLUMNS) * len(runs) + "</tr>"]
    for key in keys:
        cells = []
        for run in runs:
            row = rows[run.label].get(key, [("", "")] * 3)
            cells += [f"{text} ({step})" if step else text for text, step in row]
        parts.append(f"<tr><td>{esc(key)}</td>" + "".join(f"<td class=n>{esc(c)}</td>" for c in cells) + "</tr>")
    return parts + ["</table>"]


def _extent(run: RunData) -> str:
    steps = [r["step"] for r in run.metrics.records]
    span = f", steps {min(steps)} to {max(steps)}" if steps else ""
    return f"{len(steps)} logged steps{span}; {len(run.events)} events"


def _flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(node, dict) or not node:
        return {prefix: node}
    out: dict[str, Any] = {}
    for key, value in node.items():
        out.update(_flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


def config_differences(runs: list[RunData]) -> dict[str, list[Any]]:
    """Config keys (dotted) whose values are not the same in every run, with each run's value
    (None where absent); `trainer.run_dir` is left out, the runs' labels already say it."""
    flat = [_flatten(run.config) for run in runs]
    keys = sorted({k for f in flat for k in f} - {"trainer.run_dir"})
    return {k: [f.get(k) for f in flat] for k in keys if any(f.get(k) != flat[0].get(k) for f in flat)}


def _config_diff_html(runs: list[RunData]) -> list[str]:
    diff = config_differences(runs)
    if not diff:
        return []
    esc = html.escape
    head = "".join(f"<th>{esc(run.label)}</th>" for run in runs)
    parts = ["<h3>Config keys that differ</h3>", f"<table><tr><th>key</th>{head}</tr>"]
    for key, values in diff.items():
        cells = "".join(f"<td><code>{esc(json.dumps(v))}</code></td>" for v in values)
        parts.append(f"<tr><td><code>{esc(key)}</code></td>{cells}</tr>")
    parts.append("</table>")
    return parts


def rollout_files(run_dir: Path) -> list[tuple[int, Path]]:
    """(step, path) of the run's `rollouts/step_N.jsonl`, by step."""
    folder = Path(run_dir) / ROLLOUT_DIR
    found = [(int(m.group(1)), p) for p in folder.glob("step_*.jsonl") if (m := _ROLLOUT_FILE.match(p.name))]
    return sorted(found)


def _read_records(path: Path) -> list[dict[str, Any]]:
    """Rollout records; a line cut short by a killed run is skipped."""
    records = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict):
            records.append(record)
    return records


def _trajectories_html(run: RunData) -> list[str]:
    """Collapsible episodes of the first and the last rollout file, every text escaped."""
    files = rollout_files(run.path)
    shown = dict.fromkeys([files[0], files[-1]]) if files else {}  # one file when there was one evaluation
    esc = html.escape
    parts = []
    for step, path in shown:
        episodes: dict[Any, list[dict[str, Any]]] = {}
        for record in _read_records(path):
            episodes.setdefault(record.get("episode"), []).append(record)
        for episode, turns in episodes.items():
            turns.sort(key=lambda r: r.get("turn", 0))
            rewards = [r["reward"] for r in turns if _is_number(r.get("reward"))]
            summary = (f"step {step}, episode {episode} (seed {turns[0].get('group')}): {len(turns)} "
                       f"turn{'' if len(turns) == 1 else 's'}, return {sum(rewards):.3g}")
            parts.append(f"<details><summary>{esc(summary)}</summary>")
            context = ""
            for record in turns:
                prompt, response = str(record.get("prompt", "")), str(record.get("response", ""))
                added = prompt[len(context):] if context and prompt.startswith(context) else prompt
                reward = record.get("reward")
                parts.append(f"<p>turn {esc(str(record.get('turn')))}, reward {esc(str(reward))}</p>"
                             f"<pre>{esc(_cut(added))}</pre><pre class=response>{esc(_cut(response))}</pre>")
                context = prompt + response
            parts.append("</details>")
    return parts


def _cut(text: str) -> str:
    extra = len(text) - SAMPLE_TEXT_CHARS
    return text if extra <= 0 else text[:SAMPLE_TEXT_CHARS] + f"\n… [{extra} more characters]"


def _summary_row(metrics: Metrics, key: str) -> list[tuple[str, str]] | None:
    """[(text, step)] of the first, the last and the max of `key`, or None when the run never logged it.

    A collapse proxy that its first or latest check could not support (logged `num_pairs` but not
    the proxy: too few pairs or distinct inputs, see `mi_metrics`) shows "n/a (M pairs)" at that
    check rather than another check's value; the max column keeps the best check that had one.
    """
    checks = key.split("/")[0] + "/num_pairs" if key.startswith("collapse_") else None

    def end(index: int) -> tuple[str, str] | None:
        point, check = metrics.point(key, index), metrics.point(checks, index) if checks else None
        if check is not None and (point is None or point[0] != check[0]):
            return f"n/a ({check[1]:.0f} pair{'' if check[1] == 1 else 's'})", str(check[0])
        return (f"{point[1]:.4g}", str(point[0])) if point is not None else None

    first, last, peak = end(0), end(-1), metrics.peak(key)
    if first is None or last is None:
        return None
    return [first, last, (f"{peak[1]:.4g}", str(peak[0])) if peak is not None else ("n/a", "")]


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _number_or_nan(value: Any) -> float:
    return float(value) if _is_number(value) else float("nan")
