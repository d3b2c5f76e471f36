"""The report's one HTML page, and `write_report`, which draws its figures and writes it.

`report.html` shows the figures with relative paths (`figures/NAME.png`), so that the output
directory can be copied or zipped as a whole; OUT is the run directory for one run (see
`default_out_dir` for several). Above the figures a summary gives each run's held-out success
verdict and the first, last and largest value of the main metrics; a collapse proxy that a check
could not support shows "n/a" with the pair count there, not another check's value. Below them are
the events, a few sample trajectories (escaped: a model's text must not become markup) and the
configs. The page lists the figures it left out and the metrics they needed, so that a figure a
run could not have is told apart from one that failed.
"""

from __future__ import annotations

import html
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from matplotlib.colors import to_hex

from ragen2.report.figures import FigureSpec, draw_figures
from ragen2.report.runs import (
    ROLLOUT_DIR,
    Metrics,
    RunData,
    is_number,
    load_runs,
    read_rollout_records,
    rollout_files,
    success_verdicts,
)

FIGURE_DIR = "figures"
REPORT_FILE = "report.html"
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
    drawn, missing = draw_figures(runs, out / FIGURE_DIR, smooth)
    page = out / REPORT_FILE
    page.write_text(_html(runs, drawn, missing, smooth), encoding="utf-8")
    return page


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


def _trajectories_html(run: RunData) -> list[str]:
    """Collapsible episodes of the first and the last rollout file, every text escaped."""
    files = rollout_files(run.path)
    shown = dict.fromkeys([files[0], files[-1]]) if files else {}  # one file when there was one evaluation
    esc = html.escape
    parts = []
    for step, path in shown:
        episodes: dict[Any, list[dict[str, Any]]] = {}
        for record in read_rollout_records(path):
            episodes.setdefault(record.get("episode"), []).append(record)
        for episode, turns in episodes.items():
            turns.sort(key=lambda r: r.get("turn", 0))
            rewards = [r["reward"] for r in turns if is_number(r.get("reward"))]
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
