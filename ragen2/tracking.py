"""Metric sinks for a run directory: `metrics.jsonl` (always), TensorBoard, Weights & Biases.

`metrics.jsonl` is the record of truth: one JSON object per step, `{"step": N, "train/kl": ...}`,
flushed and fsync'd line by line so a killed run loses at most the line being written. The
report (`ragen2.report`) and any notebook read it back with `read_metrics`. TensorBoard and W&B
are views of the same numbers for people who already live in those tools.

Resuming: construct a `Tracker` over the existing run directory, then call
`truncate_after(checkpoint_step)`; steps logged after the checkpoint are dropped from the JSONL
files and purged from TensorBoard, so every step appears exactly once after the resume.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, TextIO

import numpy as np

from ragen2.errors import ConfigError

log = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"
EVENTS_FILE = "events.jsonl"
WANDB_ID_FILE = "wandb_run_id.txt"


class Tracker:
    """Writes each step's metrics to every enabled sink; one instance per run directory.

    Call `log` once per step with all of that step's metrics: steps must strictly increase,
    which is what makes "one JSON object per step" hold, and what catches a resume that forgot
    `truncate_after`.
    """

    def __init__(
        self,
        run_dir: Path,
        config: Mapping[str, Any],
        tensorboard: bool = True,
        wandb: bool = False,
        wandb_project: str = "ragen2",
    ) -> None:
        """Open the sinks over `run_dir`, creating it or continuing the files already there.

        `config` (the resolved config as plain data) is sent to W&B with the run; `config.yaml`
        itself is written by whoever resolves the config.
        """
        # Fail before anything is written when W&B is asked for but missing.
        wandb_module = _import_wandb() if wandb else None
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._metrics_path = self.run_dir / METRICS_FILE
        self._events_path = self.run_dir / EVENTS_FILE
        self._wandb_run = _start_wandb(wandb_module, self.run_dir, config, wandb_project) if wandb_module else None

        # A run killed mid-write leaves an unterminated last line; appending to it would glue
        # two records together, so repair both files before opening them for append.
        for path in (self._metrics_path, self._events_path):
            if path.exists():
                _rewrite(path, lambda record: True)
        self._last_step = self._last_logged_step()
        self._metrics_file = open(self._metrics_path, "a", encoding="utf-8")
        self._events_file = open(self._events_path, "a", encoding="utf-8")

        # TensorBoard's writer opens on first use, so that a resumed run's only new event file
        # is the one that starts with the purge marker written by `truncate_after`.
        self._tensorboard = tensorboard
        self._tb: Any = None
        self._tb_purge_step: int | None = None

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Record one step's metrics. Non-finite values (and None) become null in the JSONL and
        are left out of TensorBoard and W&B, whose charts a single NaN would otherwise break."""
        step = int(step)
        if self._last_step is not None and step <= self._last_step:
            raise ValueError(
                f"step {step} was already logged (last logged step: {self._last_step}); log each step "
                f"once, and after resuming from a checkpoint call truncate_after(checkpoint_step) first"
            )
        if "step" in metrics:
            raise ValueError("'step' is reserved for the step number; pass it as the `step` argument")
        values = {key: _to_float(key, value) for key, value in metrics.items()}
        finite = {key: v for key, v in values.items() if v is not None and math.isfinite(v)}
        record = {"step": step, **{key: (v if key in finite else None) for key, v in values.items()}}
        _append_line(self._metrics_file, record)
        self._last_step = step

        if self._tensorboard:
            writer = self._tensorboard_writer()
            for key, value in finite.items():
                writer.add_scalar(key, value, step)
            writer.flush()
        if self._wandb_run is not None:
            self._wandb_run.log(finite, step=step)

    def log_event(self, kind: str, message: str, step: int, **data: Any) -> None:
        """Append a discrete event (an alarm, a skipped step, an early stop) to `events.jsonl`.

        Events are rare and explain the curves, so the report draws them as vertical lines,
        TensorBoard shows them as text under `events/<kind>`, and the terminal shows them as they happen.
        """
        log.warning("%s", message if message.startswith(f"step {step}") else f"step {step}: {message}")
        record = {"step": int(step), "kind": kind, "message": message, "time": time.time(), **data}
        _append_line(self._events_file, record)
        if self._tensorboard:
            writer = self._tensorboard_writer()
            writer.add_text(f"events/{kind}", message, int(step))
            writer.flush()

    def truncate_after(self, step: int) -> None:
        """Drop every metric line and event with step > `step` (and any partial last line).

        Called on resume with the checkpoint's step: the steps after it are about to be run again.
        The files are rewritten atomically, so a crash here leaves either the old or the new file.
        TensorBoard is reopened with `purge_step = step + 1`, which makes its readers discard the
        stale points from the earlier event files. W&B keeps its history; a resumed W&B run
        ignores steps it has already seen.
        """
        step = int(step)
        for handle in (self._metrics_file, self._events_file):
            handle.close()
        for path in (self._metrics_path, self._events_path):
            _rewrite(path, lambda record: record.get("step", 0) <= step)
        self._last_step = self._last_logged_step()
        self._metrics_file = open(self._metrics_path, "a", encoding="utf-8")
        self._events_file = open(self._events_path, "a", encoding="utf-8")
        if self._tb is not None:
            self._tb.close()
            self._tb = None
        self._tb_purge_step = step + 1

    def close(self) -> None:
        """Flush and close every sink. Safe to call twice."""
        self._metrics_file.close()
        self._events_file.close()
        if self._tb is not None:
            self._tb.close()
            self._tb = None
        if self._wandb_run is not None:
            self._wandb_run.finish()
            self._wandb_run = None

    def __enter__(self) -> Tracker:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _last_logged_step(self) -> int | None:
        if not self._metrics_path.exists():
            return None
        records = read_metrics(self.run_dir)
        return max(r["step"] for r in records) if records else None

    def _tensorboard_writer(self) -> Any:
        """The SummaryWriter, opened on first use. Event files go straight into the run directory,
        so that `tensorboard --logdir runs/` shows one curve per run, named after its directory."""
        if self._tb is None:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(log_dir=str(self.run_dir), purge_step=self._tb_purge_step)
        return self._tb


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """The step records of `run_dir/metrics.jsonl`, in file order; nulls stay None.

    A last line cut off by a crash is ignored; a malformed line elsewhere raises ValueError.
    """
    path = Path(run_dir) / METRICS_FILE
    if not path.exists():
        raise FileNotFoundError(f"no {METRICS_FILE} in {run_dir}: is this a ragen2 run directory?")
    return [record for record, _ in _read_jsonl(path)]


def read_events(run_dir: Path) -> list[dict[str, Any]]:
    """The records of `run_dir/events.jsonl` (empty when the run logged none)."""
    path = Path(run_dir) / EVENTS_FILE
    return [record for record, _ in _read_jsonl(path)] if path.exists() else []


def _read_jsonl(path: Path) -> list[tuple[dict[str, Any], str]]:
    """(record, raw line) pairs. The last line may lack its newline: it is kept when it parses
    (a file written by hand) and dropped when it does not (a write cut off by a kill)."""
    text = path.read_text(encoding="utf-8")
    lines = text.split("\n")  # the element after the last "\n" is "" or an unterminated line
    out = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            if number == len(lines):
                break
            raise ValueError(f"{path}:{number} is not valid JSON ({e}); only the last line may be cut off") from e
        if not isinstance(record, dict):
            raise ValueError(f"{path}:{number} holds {type(record).__name__}, expected a JSON object")
        out.append((record, line))
    return out


def _rewrite(path: Path, keep: Callable[[dict[str, Any]], bool]) -> None:
    """Atomically rewrite a JSONL file with the records `keep(record)` accepts, each
    newline-terminated; write to a temp file, fsync, rename over the original."""
    kept = [line for record, line in _read_jsonl(path) if keep(record)]
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write("".join(line + "\n" for line in kept))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def _fsync_dir(path: Path) -> None:
    """Make a rename durable; directories cannot be opened for fsync on Windows, so skip there."""
    if os.name == "posix":
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _append_line(handle: TextIO, record: dict[str, Any]) -> None:
    """One JSON object per line; fsync so that the line survives a SIGKILL or power loss."""
    handle.write(json.dumps(_jsonable(record), allow_nan=False, default=str) + "\n")
    handle.flush()
    os.fsync(handle.fileno())


def _jsonable(value: Any) -> Any:
    """Replace non-finite floats (at any depth) by None: JSON has no NaN or Infinity."""
    if isinstance(value, np.generic):  # numpy scalars in event data
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def _to_float(key: str, value: Any) -> float | None:
    """Python float of a metric value (int, bool, numpy scalar, 0-d tensor); None stays None."""
    if value is None:
        return None
    try:
        return float(value)
    except (TypeError, ValueError) as e:
        raise TypeError(f"metric {key!r} must be a number, got {type(value).__name__}: {value!r}") from e


def _import_wandb() -> Any:
    try:
        import wandb
    except ImportError as e:
        raise ConfigError(
            "logging.wandb=true but the wandb package is not installed; install it with "
            "`pip install wandb` (then `wandb login`), or set logging.wandb=false"
        ) from e
    return wandb


def _start_wandb(wandb: Any, run_dir: Path, config: Mapping[str, Any], project: str) -> Any:
    """Start (or, on resume, continue) a W&B run. The run id is kept in the run directory so a
    resumed training run appends to the same W&B run instead of starting a new one."""
    id_path = run_dir / WANDB_ID_FILE
    run_id = id_path.read_text().strip() if id_path.exists() else wandb.util.generate_id()
    id_path.write_text(run_id + "\n")
    return wandb.init(
        project=project, name=run_dir.name, id=run_id, resume="allow", dir=str(run_dir), config=dict(config)
    )
