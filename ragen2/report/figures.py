"""The report's figures: one PNG per `FigureSpec` in `FIGURES`, for one run or several overlaid.

Several runs (`ragen2 report RUN1 RUN2 ...`, e.g. filter against no filter) share every line
panel: one colour per run, named in the legend, and within a run one line style per series.
Stacked timing bars and gradient-norm bars cannot be overlaid, so those figures get one panel
per run. `smooth` > 0 draws a trailing moving average over that many logged points, with the raw
points kept faint behind it; evaluation points (sparse, with error bars) and bars are never smoothed.
The collapse figure puts the MI proxies next to token entropy and success on one step axis, because
the point of the diagnostics is to see the proxies fall while entropy looks healthy, before success
drops (RAGEN-2, arXiv 2604.06268).

Figures and panels whose metrics no run logged are skipped, not drawn empty (`draw_figures` says
which, for the page to list). Figures are built with `matplotlib.figure.Figure`, which renders PNGs
with the Agg backend and leaves pyplot's global state (and any interactive backend a notebook chose)
alone.
"""

from __future__ import annotations

import dataclasses
import math
import re
import textwrap
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator
from matplotlib.transforms import ScaledTranslation

from ragen2.report.runs import Metrics, RunData, config_value, eval_success_stderr, is_number, success_verdicts

# Top-level phases of a step in the order it runs them: they add up to `timing_s/step`, so they
# stack. `generate` runs inside `rollout` and is drawn as the lower part of the rollout bar.
TIMING_PHASES = ("rollout", "collapse", "filter", "advantage", "update", "grad_snr", "evaluate", "checkpoint")
_GENERATE, _ROLLOUT_REST, _OTHER = "generate", "rollout (excl. generate)", "other (step − phases)"
THROUGHPUT_KEYS = ("rollout/response_tokens_mean", "rollout/turns_mean", "timing_s/generate")

_BUCKET_KEY = re.compile(r"^grad_snr/bucket(\d+)/")
_FIRST, _TRAJ = "collapse_first_turn", "collapse_trajectory"
_LINESTYLES = ("-", "--", ":", "-.")
# A panel whose values spread over less than this fraction of their size holds one value up to float
# rounding (a constant learning rate read back from the optimizer): it is drawn at ± CONSTANT_MARGIN.
CONSTANT_RTOL = 1e-6
CONSTANT_MARGIN = 0.1
# A step that takes more than this many times the median step (a slow first step) runs off the top of
# the timing panel, so that it does not flatten the others; its total is written on it.
TIMING_OUTLIER = 3.0


def generation_throughput(run: RunData) -> tuple[np.ndarray, np.ndarray]:
    """(steps, generated tokens per second of `timing_s/generate`) over the whole training batch.

    Tokens per step = tokens per turn × turns per episode × P × G (`rollout.num_groups` ×
    `rollout.group_size` from config.yaml); both arrays are empty when any of them is missing.
    """
    groups = config_value(run.config, "rollout.num_groups")
    size = config_value(run.config, "rollout.group_size")
    if not (is_number(groups) and is_number(size)) or not all(run.metrics.has(k) for k in THROUGHPUT_KEYS):
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
    dataclasses.replace(  # memory runs only (rollout.memory=summary): the notes beside the reasoning
        _line_spec("memory", "Memory notes: MI proxies beside the reasoning's, and what the notes cost", [
            ("Retrieval-Acc", [("collapse_memory/retrieval_acc", "memory notes"),
                               ("collapse_memory/chance_level", "notes' chance level"),
                               ("collapse_trajectory/retrieval_acc", "reasoning (trajectory)")]),
            ("MI-ZScore-EMA", [("collapse_memory/mi_zscore_ema", "memory notes"),
                               ("collapse_trajectory/mi_zscore_ema", "reasoning (trajectory)")]),
            ("per episode / rate", [("rollout/memory_turns_mean", "notes per episode"),
                                    ("rollout/memory_valid_rate", "share of notes that parse")]),
            ("prompt tokens", [("rollout/prompt_tokens_mean", "per turn")]),
        ]),
        available=lambda run: any(run.metrics.has(k) for k in ("collapse_memory/num_pairs", "rollout/memory_turns_mean")),
        needs="collapse_memory/num_pairs or rollout/memory_turns_mean (rollout.memory=summary)", always=False,
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


def draw_figures(runs: list[RunData], fig_dir: Path, smooth: int = 0) -> tuple[list[FigureSpec], list[FigureSpec]]:
    """Write `fig_dir/NAME.png` for every figure of `FIGURES` some run has data for; return (drawn, missing),
    missing the skipped figures the page should list (`FigureSpec.always`). A skipped figure's PNG left
    from an older report is deleted, because the page would not show it and the directory would mislead."""
    fig_dir.mkdir(parents=True, exist_ok=True)
    drawn: list[FigureSpec] = []
    missing: list[FigureSpec] = []
    for spec in FIGURES:
        path = fig_dir / f"{spec.name}.png"
        if not any(spec.drawable(run) for run in runs):
            if spec.always:
                missing.append(spec)
            path.unlink(missing_ok=True)
            continue
        fig = Figure(dpi=100, layout="constrained")
        spec.draw(fig, runs, smooth)
        fig.savefig(path)
        drawn.append(spec)
    return drawn, missing


def _number_or_nan(value: Any) -> float:
    return float(value) if is_number(value) else float("nan")
