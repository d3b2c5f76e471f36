"""The table `ragen2 train` prints at the end of a run (docs/metrics.md, "The end-of-run summary table").

It is read back from metrics.jsonl rather than kept in memory, so a resumed run is summarised whole.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from ragen2.collapse.online import SCHEMES, summary_rows
from ragen2.tracking import read_metrics
from ragen2.verdict import LEARNED, ROSE, Words, binomial_se, verdict

if TYPE_CHECKING:
    from ragen2.rl.run import Run

# se(record, value, n_train): a value's standard error from what its step logged, None where that is not enough.
StandardError = Callable[[dict, float, int], float | None]


def summary_table(run: Run) -> str:
    """The end-of-run table the CLI prints.

    A fixed-width block gives first, last and peak of the main metrics with standard errors; name / value
    rows follow: whether held-out success and the MI proxies changed from first to last (`ragen2.verdict`),
    the filter's mean kept ratio, step time, memory and the last MI check.
    """
    records = read_metrics(run.run_dir)

    def series(key: str) -> list[tuple[int, float]]:
        return [(r["step"], r[key]) for r in records if r.get(key) is not None]

    kept, step_times, memory = series("filter/kept_ratio"), series("timing_s/step"), series("system/peak_memory_mb")
    n_train = run.config.rollout.num_groups * run.config.rollout.group_size
    trends = _trend_rows(records, n_train)
    rows = _verdict_rows(records, n_train)
    if kept:
        ratios = [v for _, v in kept]
        rows.append(("filter kept ratio", f"mean {np.mean(ratios):.3f} over {len(ratios)} steps "
                                          f"(min {min(ratios):.3f}, max {max(ratios):.3f})"))
    if step_times:
        rows.append(("mean step time", f"{np.mean([v for _, v in step_times]):.1f} s"))
    if memory:
        rows.append(("peak memory", f"{max(v for _, v in memory):.0f} MB"))
    rows += summary_rows(records)  # the last MI check per scheme, "n/a" with its pair count
    rows.append(("run dir", str(run.run_dir)))
    if run.stop_reason:
        rows.append(("stopped early", run.stop_reason))
    tags = tag_table(records)
    steps = ("steps", f"{run.step} / {run.config.trainer.total_steps}")
    width = max(len(name) for name, _ in [steps, *rows, *trends])
    lines = [f"{steps[0].ljust(width)}  {steps[1]}"]
    if trends:
        block = [("", ["first (step)", "last (step)", "peak (step)"]), *trends]
        cell = max(len(c) for _, cells in block for c in cells)
        lines += ["  ".join([name.ljust(width), *(c.ljust(cell) for c in cells)]).rstrip() for name, cells in block]
    return "\n".join(lines + [f"{name.ljust(width)}  {value}" for name, value in rows] + tags)


def tag_table(records: list[dict]) -> list[str]:
    """A mixture's tags side by side (lines of a table; none without per-tag metrics): the last evaluation's
    success ± SE and pass@k, the last step's training success, the filter's mean kept ratio, the last MI check and
    the last evaluation's first-turn Retrieval-Acc on held-out episodes."""
    tags = list(dict.fromkeys(key.split("/")[1] for namespace in ("rollout/", "eval/") for r in records for key in r
                              if key.count("/") == 2 and key.startswith(namespace) and key.endswith("/success_rate")))
    if not tags:
        return []

    def last(key: str) -> dict | None:
        return next((r for r in reversed(records) if _finite(r, key)), None)

    def cell(tag: str, key: str, se: bool = False) -> str:
        r = last(key.format(tag=tag))
        if r is None:
            return "-"
        value = r[key.format(tag=tag)]
        err = binomial_se(value, r.get(f"eval/{tag}/episodes")) if se else None
        return f"{value:.3f}" + (f" ± {err:.3f}" if err is not None else "")

    def mean_kept(tag: str) -> str:
        kept = [r[f"filter/{tag}/kept_ratio"] for r in records if _finite(r, f"filter/{tag}/kept_ratio")]
        return f"{np.mean(kept):.3f}" if kept else "-"

    pass_key = next((k for r in records for k in r if k.startswith("eval/") and "/pass@" in k), None)
    rows = [("eval success (last)", [cell(t, "eval/{tag}/success_rate", se=True) for t in tags])]
    if pass_key is not None:
        k = pass_key.rsplit("@", 1)[1]
        rows.append((f"eval pass@{k} (last)", [cell(t, "eval/{tag}/pass@" + k) for t in tags]))
    rows += [
        ("train success (last)", [cell(t, "rollout/{tag}/success_rate") for t in tags]),
        ("filter kept ratio (mean)", [mean_kept(t) for t in tags]),
        ("Retrieval-Acc first turn", [cell(t, "collapse_first_turn/{tag}/retrieval_acc") for t in tags]),
        ("MI-ZScore-EMA first turn", [cell(t, "collapse_first_turn/{tag}/mi_zscore_ema") for t in tags]),
        ("Retrieval-Acc held out", [cell(t, "collapse_eval/{tag}/retrieval_acc") for t in tags]),
    ]
    width = max(len(name) for name, _ in rows)
    widths = [max(len(c) for c in column) for column in zip(tags, *(cs for _, cs in rows))]  # one per tag

    def line(name: str, cells: list[str]) -> str:
        return (name.ljust(width) + "  " + "  ".join(c.ljust(w) for c, w in zip(cells, widths))).rstrip()

    return ["", line("per tag", tags)] + [line(name, cs) for name, cs in rows]


def _trend_specs() -> list[tuple[str, str, str, StandardError | None, Words | None]]:
    """(label, key, key marking a measurement, standard error, verdict words) of each row of the trend block.

    The standard error, `se(record, value, n_train)` with n_train = P x G episodes, uses only what the step
    logged; None where that is not enough (no spread is logged for entropy, MI-ZScore-EMA or the format rate).
    Training SEs treat the batch's episodes as independent, although a group's G episodes share a seed.
    Rows with verdict words also get a first → last verdict row: held-out success and the MI proxies, the
    numbers that say whether the run learned and whether its reasoning still depends on the input.
    """
    specs: list[tuple[str, str, str, StandardError | None, Words | None]] = [
        ("eval success", "eval/success_rate", "eval/success_rate",
         lambda r, v, n: binomial_se(v, r.get("eval/episodes")), LEARNED),
        ("train success", "rollout/success_rate", "rollout/success_rate", lambda r, v, n: binomial_se(v, n), None),
        ("train return", "rollout/return_mean", "rollout/return_mean",
         lambda r, v, n: r["rollout/return_std"] / math.sqrt(n) if r.get("rollout/return_std") is not None else None,
         None),
        ("train valid format", "rollout/valid_format_rate", "rollout/valid_format_rate", None, None),
        ("train entropy", "train/entropy", "train/entropy", None, None),
    ]
    for scheme in SCHEMES:  # a check logs num_pairs even where a proxy is undefined: that check shows n/a
        prefix, name = f"collapse_{scheme}/", scheme.replace("_", " ")
        specs += [
            (f"Retrieval-Acc ({name})", prefix + "retrieval_acc", prefix + "num_pairs",
             lambda r, v, n, pairs=prefix + "num_pairs": binomial_se(v, r.get(pairs)), ROSE),
            (f"MI-ZScore-EMA ({name})", prefix + "mi_zscore_ema", prefix + "num_pairs", None, ROSE),
        ]
    return specs


def _finite(record: dict, key: str) -> bool:
    return record.get(key) is not None and math.isfinite(record[key])


def _trend_rows(records: list[dict], n_train: int) -> list[tuple[str, list[str]]]:
    """(label, [first, last, peak]) for each main metric the run logged: "value ± SE (step)", peak the highest.

    A measured value that is missing or not finite (null in metrics.jsonl) shows as "n/a (step)", and a
    standard error that cannot be computed as "± n/a", rather than a made-up number.
    """
    rows = []
    for label, key, marker, se, _ in _trend_specs():
        measured = [r for r in records if marker in r]
        if not measured:
            continue

        def cell(r: dict) -> str:
            if not _finite(r, key):
                return f"n/a ({r['step']})"
            err = se(r, r[key], n_train) if se else None
            return f"{r[key]:.3f} ± {'n/a' if err is None else format(err, '.3f')} ({r['step']})"

        finite = [r for r in measured if _finite(r, key)]
        peak = cell(max(finite, key=lambda r: r[key])) if finite else "n/a"
        rows.append((label, [cell(measured[0]), cell(measured[-1]), peak]))
    return rows


def _verdict_rows(records: list[dict], n_train: int) -> list[tuple[str, str]]:
    """("Δ label", "first → last: verdict") for each verdict row measured at least twice.

    First and last are the trend block's, so a last measurement without a value reads "n/a" here too.
    """
    rows = []
    for label, key, marker, se, words in _trend_specs():
        measured = [r for r in records if marker in r]
        if words is None or len(measured) < 2:
            continue
        ends = [(r.get(key), se(r, r[key], n_train) if se and _finite(r, key) else None)
                for r in (measured[0], measured[-1])]
        rows.append((f"Δ {label}", verdict(*ends[0], *ends[1], words=words)))
    return rows
