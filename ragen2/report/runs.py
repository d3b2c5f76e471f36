"""The run directories as the report reads them: metrics, events, config and sample rollouts.

The figures (`ragen2.report.figures`) and the page (`ragen2.report.page`) both read a run through
`RunData`, so that they agree on what it logged. `Metrics` keeps finite numbers only: a missing
value (null in metrics.jsonl, such as a collapse proxy a check could not support, see
`ragen2.collapse.mi_metrics`) is skipped point by point rather than drawn or summarised as a number.
The held-out success verdict is here too, because the first figure's title and the page's summary
both state it and must state it the same way.
"""

from __future__ import annotations

import fnmatch
import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from ragen2.tracking import read_events, read_metrics
from ragen2.verdict import verdict

ROLLOUT_DIR = "rollouts"
_ROLLOUT_FILE = re.compile(r"^step_(\d+)\.jsonl$")


class Metrics:
    """Per-key series of a run's step records: finite numbers only, sorted by step."""

    def __init__(self, records: list[dict[str, Any]]) -> None:
        self.records = sorted(records, key=lambda r: r["step"])
        columns: dict[str, tuple[list[int], list[float]]] = {}
        for record in self.records:
            for key, value in record.items():
                if key == "step" or not is_number(value):
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
    default = float(default) if is_number(default) and default > 0 else math.nan
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


def rollout_files(run_dir: Path) -> list[tuple[int, Path]]:
    """(step, path) of the run's `rollouts/step_N.jsonl`, by step."""
    folder = Path(run_dir) / ROLLOUT_DIR
    found = [(int(m.group(1)), p) for p in folder.glob("step_*.jsonl") if (m := _ROLLOUT_FILE.match(p.name))]
    return sorted(found)


def read_rollout_records(path: Path) -> list[dict[str, Any]]:
    """The records of one rollout file; a line cut short by a killed run is skipped."""
    records = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict):
            records.append(record)
    return records


def is_number(value: Any) -> bool:
    """Whether `value` is a finite int or float (not a bool, not None, not NaN)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
