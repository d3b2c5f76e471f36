"""Figures and a one-page HTML report of a run directory.

Reads `metrics.jsonl` and `events.jsonl` (see `ragen2.tracking`) and writes PNGs under
`RUN_DIR/figures/` plus `RUN_DIR/report.html`, which shows them with relative paths so the
directory can be copied or zipped as a whole. The page puts the collapse proxies next to token
entropy and success on one step axis, because the point of the diagnostics is to see the MI
proxies fall while entropy looks healthy, before success drops (RAGEN-2, arXiv 2604.06268).

Figures whose metrics a run never logged are skipped, not drawn empty; the page lists them.
Missing values (null in metrics.jsonl: a collapse proxy a check could not support, see
`ragen2.collapse.mi_metrics`) are skipped point by point; the summary shows "n/a" with the pair count.
Figures are built with `matplotlib.figure.Figure`, which renders PNGs with the Agg backend and
leaves pyplot's global state (and any interactive backend a notebook chose) alone.
"""

from __future__ import annotations

import fnmatch
import html
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from ragen2.tracking import read_events, read_metrics

FIGURE_DIR = "figures"
REPORT_FILE = "report.html"

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

_BUCKET_KEY = re.compile(r"^grad_snr/bucket(\d+)/")
_FIRST, _TRAJ = "collapse_first_turn", "collapse_trajectory"


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

    def last(self, key: str) -> tuple[int, float] | None:
        """(step, value) of the latest point of `key`, or None when never logged."""
        steps, values = self.series(key)
        return (int(steps[-1]), float(values[-1])) if len(steps) else None

    def peak(self, key: str) -> tuple[int, float] | None:
        """(step, value) of the largest value of `key` (the first, on ties), or None."""
        steps, values = self.series(key)
        if not len(steps):
            return None
        i = int(np.argmax(values))
        return int(steps[i]), float(values[i])


@dataclass(frozen=True)
class FigureSpec:
    """One figure: drawn when any of `keys` (exact or glob) was logged, skipped otherwise."""

    name: str  # file stem under figures/
    title: str
    keys: tuple[str, ...]
    draw: Callable[[Figure, Metrics, list[dict[str, Any]]], None]


def write_report(run_dir: Path) -> Path:
    """Draw every figure the run has data for and write `report.html`; return its path."""
    run_dir = Path(run_dir)
    metrics = Metrics(read_metrics(run_dir))
    events = read_events(run_dir)
    fig_dir = run_dir / FIGURE_DIR
    fig_dir.mkdir(exist_ok=True)

    drawn: list[FigureSpec] = []
    missing: list[FigureSpec] = []
    for spec in FIGURES:
        path = fig_dir / f"{spec.name}.png"
        if not any(metrics.has(key) for key in spec.keys):
            missing.append(spec)
            path.unlink(missing_ok=True)  # a figure left from an older report would mislead
            continue
        fig = Figure(dpi=100, layout="constrained")
        spec.draw(fig, metrics, events)
        fig.savefig(path)
        drawn.append(spec)

    out = run_dir / REPORT_FILE
    out.write_text(_html(run_dir, metrics, events, drawn, missing), encoding="utf-8")
    return out


# ----------------------------------------------------------------------------- figures


def _panels(fig: Figure, n: int, height: float = 2.4) -> list[Axes]:
    """`n` stacked panels sharing the step axis."""
    fig.set_size_inches(8, max(3.4, height * n))
    axes = fig.subplots(n, 1, sharex=True, squeeze=False)[:, 0]
    for ax in axes:
        ax.grid(alpha=0.3)
    axes[-1].set_xlabel("step")
    return list(axes)


def _plot(ax: Axes, metrics: Metrics, key: str, label: str | None = None, **style: Any) -> bool:
    """Plot one series if it was logged; return whether it was. Sparse series (computed every few
    steps) get markers so that single points stay visible."""
    steps, values = metrics.series(key)
    if not len(steps):
        return False
    style.setdefault("marker", "o" if len(steps) <= 60 else None)
    style.setdefault("markersize", 3)
    ax.plot(steps, values, label=label or key, **style)
    return True


def _eval_markers(ax: Axes, metrics: Metrics, key: str, label: str) -> None:
    """Evaluations happen every few steps; draw them as large markers, not as a trend line."""
    _plot(ax, metrics, key, label, linestyle="none", marker="D", markersize=6, color="black", zorder=3)


def _mark_events(axes: list[Axes], events: list[dict[str, Any]]) -> None:
    """Vertical dashed lines at alarms, skipped steps, early stops...; one colour per event kind,
    named once in the legend of the top panel."""
    kinds = sorted({str(e["kind"]) for e in events})
    colors = {kind: f"C{(i + 3) % 10}" for i, kind in enumerate(kinds)}
    labelled: set[str] = set()
    for event in events:
        kind = str(event["kind"])
        for j, ax in enumerate(axes):
            label = f"event: {kind}" if j == 0 and kind not in labelled else None
            ax.axvline(event["step"], color=colors[kind], linestyle="--", linewidth=1, alpha=0.7, label=label)
        labelled.add(kind)


def _finish(axes: list[Axes], events: list[dict[str, Any]]) -> None:
    _mark_events(axes, events)
    for ax in axes:
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8, loc="best")


def _rate_axis(ax: Axes, label: str) -> None:
    ax.set_ylim(-0.03, 1.03)
    ax.set_ylabel(label)


def _draw_reward(fig: Figure, metrics: Metrics, events: list[dict[str, Any]]) -> None:
    (ax,) = _panels(fig, 1)
    ax.set_title("Episode return")
    steps, mean = metrics.series("rollout/return_mean")
    std_steps, std = metrics.series("rollout/return_std")
    if len(steps) and np.array_equal(steps, std_steps):
        ax.fill_between(steps, mean - std, mean + std, alpha=0.2, color="C0", label="± std (rollout)")
    _plot(ax, metrics, "rollout/return_mean", "rollout mean", color="C0")
    _eval_markers(ax, metrics, "eval/return_mean", "eval mean")
    ax.set_ylabel("return")
    _finish([ax], events)


def _draw_success(fig: Figure, metrics: Metrics, events: list[dict[str, Any]]) -> None:
    (ax,) = _panels(fig, 1)
    ax.set_title("Success rate")
    _plot(ax, metrics, "rollout/success_rate", "rollout (training episodes)", color="C0")
    _eval_markers(ax, metrics, "eval/success_rate", "eval (held-out seeds)")
    _rate_axis(ax, "success rate")
    _finish([ax], events)


def _single(key: str, title: str, ylabel: str) -> Callable[[Figure, Metrics, list[dict[str, Any]]], None]:
    """A figure with one series."""

    def draw(fig: Figure, metrics: Metrics, events: list[dict[str, Any]]) -> None:
        (ax,) = _panels(fig, 1)
        ax.set_title(title)
        _plot(ax, metrics, key, color="C0")
        ax.set_ylabel(ylabel)
        _finish([ax], events)

    return draw


def _draw_timing(fig: Figure, metrics: Metrics, events: list[dict[str, Any]]) -> None:
    """Lines, not a stacked area: phases can nest (generate runs inside rollout), so a stack
    would double-count; the whole step is the thick black line."""
    (ax,) = _panels(fig, 1)
    ax.set_title("Time per phase")
    for i, key in enumerate(k for k in metrics.matching("timing_s/*") if k != "timing_s/step"):
        _plot(ax, metrics, key, key.removeprefix("timing_s/"), color=f"C{i % 10}", linewidth=1)
    _plot(ax, metrics, "timing_s/step", "whole step", color="black", linewidth=2.5)
    ax.set_ylabel("seconds")
    ax.set_ylim(bottom=0)
    _finish([ax], events)


def _draw_filter(fig: Figure, metrics: Metrics, events: list[dict[str, Any]]) -> None:
    fractions = metrics.has("filter/kept_ratio") or metrics.has("rollout/frac_zero_variance")
    variance = metrics.has("rollout/rv_mean")
    axes = _panels(fig, int(fractions) + int(variance))
    axes[0].set_title("SNR-aware filtering")
    if fractions:
        ax = axes[0]
        _plot(ax, metrics, "filter/kept_ratio", "kept ratio (groups kept / groups)", color="C0")
        _plot(ax, metrics, "rollout/frac_zero_variance", "zero-variance groups", color="C1")
        _rate_axis(ax, "fraction of groups")
    if variance:
        ax = axes[-1]
        _plot(ax, metrics, "rollout/rv_mean", "mean reward variance over groups", color="C2")
        ax.set_ylabel("RV")
    _finish(axes, events)


def _draw_collapse(fig: Figure, metrics: Metrics, events: list[dict[str, Any]]) -> None:
    """MI proxies, token entropy and success share the step axis: collapse shows up as the
    proxies falling while entropy stays flat, ahead of a drop in success."""
    has = metrics.has
    rows = [
        has(f"{_FIRST}/retrieval_acc") or has(f"{_TRAJ}/retrieval_acc"),
        has(f"{_FIRST}/mi_zscore_ema") or has(f"{_TRAJ}/mi_zscore_ema"),
        has("train/entropy"),
        has("eval/success_rate") or has("rollout/success_rate"),
    ]
    axes = iter(_panels(fig, sum(rows), height=2.1))
    used = []
    if rows[0]:
        ax = next(axes)
        _plot(ax, metrics, f"{_FIRST}/retrieval_acc", "first turn", color="C0")
        _plot(ax, metrics, f"{_TRAJ}/retrieval_acc", "trajectory", color="C1")
        _plot(ax, metrics, f"{_FIRST}/chance_level", "chance (first turn)", color="gray", linestyle=":")
        _rate_axis(ax, "Retrieval-Acc")
        used.append(ax)
    if rows[1]:
        ax = next(axes)
        _plot(ax, metrics, f"{_FIRST}/mi_zscore_ema", "first turn", color="C0")
        _plot(ax, metrics, f"{_TRAJ}/mi_zscore_ema", "trajectory", color="C1")
        ax.axhline(0.0, color="gray", linewidth=0.8)
        ax.set_ylabel("MI-ZScore-EMA")
        used.append(ax)
    if rows[2]:
        ax = next(axes)
        _plot(ax, metrics, "train/entropy", "token entropy", color="C2")
        ax.set_ylabel("entropy (nats)")
        used.append(ax)
    if rows[3]:
        ax = next(axes)
        _plot(ax, metrics, "rollout/success_rate", "rollout", color="C0", linewidth=1, alpha=0.6)
        _eval_markers(ax, metrics, "eval/success_rate", "eval")
        _rate_axis(ax, "success rate")
        used.append(ax)
    used[0].set_title("Collapse diagnostics: MI proxies vs token entropy vs success")
    _finish(used, events)


def _draw_grad_snr(fig: Figure, metrics: Metrics, events: list[dict[str, Any]]) -> None:
    """The latest probe only: task-gradient norm should rise with reward variance while the
    KL and entropy norms stay flat (RAGEN-2, Fig. 3); bars per RV bucket, low to high."""
    probe = next(r for r in reversed(metrics.records) if any(_BUCKET_KEY.match(k) for k in r))
    buckets = sorted({int(m.group(1)) for k in probe if (m := _BUCKET_KEY.match(k))})
    fig.set_size_inches(8, 3.8)
    ax = fig.subplots()
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
    ax.set_title(f"Gradient norms by RV bucket (probe at step {probe['step']})")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)


FIGURES = (
    FigureSpec("reward", "Episode return", ("rollout/return_mean", "eval/return_mean"), _draw_reward),
    FigureSpec("success", "Success rate", ("rollout/success_rate", "eval/success_rate"), _draw_success),
    FigureSpec(
        "collapse",
        "Collapse diagnostics",
        tuple(f"{p}/{m}" for p in (_FIRST, _TRAJ) for m in ("retrieval_acc", "mi_zscore_ema")),
        _draw_collapse,
    ),
    FigureSpec(
        "entropy", "Token entropy", ("train/entropy",), _single("train/entropy", "Token entropy", "nats / token")
    ),
    FigureSpec("kl", "KL to the reference", ("train/kl",), _single("train/kl", "KL to the reference", "nats / token")),
    FigureSpec(
        "response_length",
        "Response length",
        ("rollout/response_tokens_mean",),
        _single("rollout/response_tokens_mean", "Response length", "tokens"),
    ),
    FigureSpec("filter", "Filtering", ("filter/kept_ratio", "rollout/rv_mean"), _draw_filter),
    FigureSpec(
        "grad_snr",
        "Gradient norms by RV bucket",
        ("grad_snr/bucket*/task_norm", "grad_snr/bucket*/kl_norm", "grad_snr/bucket*/entropy_norm"),
        _draw_grad_snr,
    ),
    FigureSpec("timing", "Time per phase", ("timing_s/*",), _draw_timing),
)


# ----------------------------------------------------------------------------- html


def _html(
    run_dir: Path,
    metrics: Metrics,
    events: list[dict[str, Any]],
    drawn: list[FigureSpec],
    missing: list[FigureSpec],
) -> str:
    esc = html.escape
    steps = [r["step"] for r in metrics.records]
    parts = [
        "<!doctype html>",
        '<html><head><meta charset="utf-8">',
        f"<title>ragen2 report: {esc(run_dir.name)}</title>",
        "<style>body{font-family:sans-serif;max-width:60em;margin:2em auto;padding:0 1em}"
        "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:.2em .6em;text-align:left}"
        "td.n{text-align:right;font-family:monospace}img{max-width:100%}"
        "pre{background:#f6f6f6;padding:1em;overflow:auto}</style>",
        "</head><body>",
        f"<h1>ragen2 report: {esc(run_dir.name)}</h1>",
        f"<p>{len(steps)} logged steps"
        + (f", steps {min(steps)} to {max(steps)}" if steps else "")
        + f"; {len(events)} events.</p>",
    ]

    rows = [row for key in SUMMARY_KEYS if (row := _summary_row(metrics, key)) is not None]
    if rows:
        parts += [
            "<h2>Summary</h2>",
            "<table><tr><th>metric</th><th>last</th><th>at step</th><th>max</th><th>at step</th></tr>",
        ]
        for key, last, last_step, peak, peak_step in rows:
            parts.append(
                f"<tr><td>{esc(key)}</td><td class=n>{esc(last)}</td><td class=n>{last_step}</td>"
                f"<td class=n>{esc(peak)}</td><td class=n>{peak_step}</td></tr>"
            )
        parts.append("</table>")

    parts.append("<h2>Figures</h2>")
    for spec in drawn:
        src = f"{FIGURE_DIR}/{spec.name}.png"
        title = esc(spec.title)
        parts.append(f'<figure><img src="{esc(src)}" alt="{title}"><figcaption>{title}</figcaption></figure>')
    if missing:
        parts.append("<p>Not drawn, because the run logged none of their metrics:</p><ul>")
        for spec in missing:
            keys = ", ".join(f"<code>{esc(k)}</code>" for k in spec.keys)
            parts.append(f"<li>{esc(spec.title)}: {keys}</li>")
        parts.append("</ul>")

    if events:
        parts += ["<h2>Events</h2>", "<table><tr><th>step</th><th>kind</th><th>message</th></tr>"]
        for e in events:
            parts.append(
                f"<tr><td class=n>{esc(str(e['step']))}</td><td>{esc(str(e['kind']))}</td>"
                f"<td>{esc(str(e.get('message', '')))}</td></tr>"
            )
        parts.append("</table>")

    config = run_dir / "config.yaml"
    if config.exists():
        parts += ["<h2>Config</h2>", f"<pre>{esc(config.read_text(encoding='utf-8'))}</pre>"]
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def _summary_row(metrics: Metrics, key: str) -> tuple[str, str, str, str, str] | None:
    """(key, last, at step, max, at step) as text, or None when the run never logged `key`.

    A collapse proxy whose latest check could not support it (logged `num_pairs` but not the
    proxy: too few pairs or distinct inputs, see `mi_metrics`) shows "n/a (M pairs)" at that
    check rather than an older value; the max column keeps the best check that had one.
    """
    last, peak = metrics.last(key), metrics.peak(key)
    check = metrics.last(key.split("/")[0] + "/num_pairs") if key.startswith("collapse_") else None
    if check is not None and (last is None or last[0] < check[0]):
        pairs = f"{check[1]:.0f} pair{'' if check[1] == 1 else 's'}"
        last_text, last_step = f"n/a ({pairs})", str(check[0])
    elif last is not None:
        last_text, last_step = f"{last[1]:.4g}", str(last[0])
    else:
        return None
    peak_text, peak_step = (f"{peak[1]:.4g}", str(peak[0])) if peak is not None else ("n/a", "")
    return key, last_text, last_step, peak_text, peak_step


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _number_or_nan(value: Any) -> float:
    return float(value) if _is_number(value) else float("nan")
