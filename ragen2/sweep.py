"""Grids of training runs from one YAML spec: expand, run (resumably, several at a time), tabulate.

A spec names a base config and the axes to vary; every combination of axis values and seeds
is one run of `ragen2 train` in its own directory, named from its values:

    description: Paper filter vs none.        # optional, copied into sweep.md
    preset: sokoban                           # optional `ragen2 train` preset of every run
    base:                                     # dotted config keys set in every run
      trainer.total_steps: 20
    axes:
      algo.name: [grpo, ppo]                  # a plain axis: values of one key
      filter:                                 # a bundle axis: label -> keys set together
        paper: {filter.strategy: top_p, filter.value: 0.9, filter.include_zero: false}
        none: {filter.strategy: none, filter.include_zero: true}
    seeds: [0, 1, 2]                          # trainer.seed, the innermost repetition
    exclude:                                  # optional: drop points whose labels match
      - {algo.name: ppo, filter: none}
    warmstart:                                # optional: the policy of every run, warm-started
      envs: [frozenlake]                      # (and cached) before the first run starts;
      steps: 700                              # keys of ragen2.models.warmstart.WarmStartConfig
    environment:                              # optional: environment variables of every run's process
      ATEN_CPU_CAPABILITY: default            # e.g. torch's other CPU kernels (another float rounding)

`warmstart` lets an experiment bring its own policy, e.g. one warm-started only part of the way
so that RL has room to improve it: the sweep builds it like `ragen2 warmstart` (once; cached by
its settings) and sets `model.path` to it, unless an override sets `model.path`. `device: cuda`
in it fine-tunes on a GPU. With `base: MODEL` it fine-tunes that pretrained model instead, like
`ragen2 warmstart --base` (keys `lora_rank` and `eval_episodes` as well).

`preset` may also be an axis or sit in a bundle (environments need their own presets). The
run of algo.name=ppo, filter=paper, seed 1 lives in `OUT/algo.name=ppo__filter=paper__seed=1`.

Running is resumable: a run whose training process exited 0 is skipped, one with a checkpoint
is continued with `ragen2 train --resume`, anything else is started afresh. Ctrl-C or SIGTERM to the
sweep stops its runs as Ctrl-C stops `ragen2 train` (at a complete step, checkpointed), waits for
them and exits; a second Ctrl-C stops them at once. Every point's
config is resolved and validated before the first run starts, and a directory holding a run
with another config is refused rather than mixed in. `jobs` runs go at once as subprocesses,
each with OMP_NUM_THREADS set so that jobs x threads never exceeds the cores: torch threads
spin-wait on oversubscribed cores (docs/benchmarks.md). By default each run gets cores // jobs
threads, capped by the caller's own OMP_NUM_THREADS when that is set (a shared machine).

The tables (`sweep.csv`: one row per run; `sweep.md`: mean +- standard error over seeds per
grid point) are read back from each run's metrics.jsonl, so they are exactly what the runs logged.
"""

from __future__ import annotations

import contextlib
import csv
import itertools
import json
import logging
import math
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from ragen2.config import config_from_file, load_config, to_dict
from ragen2.errors import ConfigError, did_you_mean
from ragen2.rl.checkpoint import latest_step
from ragen2.tracking import read_metrics

log = logging.getLogger(__name__)

SPEC_KEYS = ("description", "preset", "base", "axes", "seeds", "exclude", "warmstart", "environment")
GRID_FILE = "sweep.json"  # the expanded grid, written next to the run directories
STATUS_FILE = "sweep_run.json"  # in a run directory: how its last training process ended
LOG_FILE = "train.log"  # in a run directory: the training process's stdout and stderr
# Every sweep run writes no progress bar into its log file; a spec's base may turn it back on.
SWEEP_DEFAULTS = {"logging.progress": False}


@dataclass
class Point:
    """One run of the grid: its labels (axis -> label), seed, preset and config overrides."""

    name: str
    labels: dict[str, str]
    seed: int
    preset: str | None
    overrides: dict[str, Any] = field(default_factory=dict)

    def override_args(self, run_dir: Path) -> list[str]:
        """The `key=value` overrides of this run in `run_dir`, seed and run directory included."""
        items = self.overrides | {"trainer.seed": self.seed, "trainer.run_dir": str(run_dir)}
        return [f"{k}={_yaml_value(v)}" for k, v in items.items()]

    def train_args(self, run_dir: Path) -> list[str]:
        """`ragen2 train` arguments that start this run in `run_dir`."""
        return ([self.preset] if self.preset else []) + self.override_args(run_dir)


@dataclass
class Spec:
    """A parsed sweep spec; `points()` expands it."""

    name: str
    description: str
    preset: str | None
    base: dict[str, Any]
    axes: dict[str, dict[str, dict[str, Any]]]  # axis -> label -> overrides (`preset` included)
    seeds: list[int]
    exclude: list[dict[str, str]]
    warmstart: dict[str, Any] | None = None  # WarmStartConfig settings (and `device`) of the runs' policy
    environment: dict[str, str] = field(default_factory=dict)  # environment variables set in every run's process

    def points(self, overrides: dict[str, Any] | None = None, seeds: Sequence[int] | None = None) -> list[Point]:
        """Every grid point that no `exclude` entry matches; seeds vary slowest, so a partial
        sweep has every point of seed 0 before any of seed 1.

        `overrides` (dotted key -> value) win over the spec in every run, e.g. a smoke test's
        trainer.total_steps=2; `seeds` runs only those of the spec's seeds.
        """
        if seeds is not None and not set(seeds) <= set(self.seeds):
            raise ConfigError(f"seeds {sorted(set(seeds) - set(self.seeds))} are not in the spec's seeds {self.seeds}")
        points = []
        for seed in self.seeds if seeds is None else [s for s in self.seeds if s in seeds]:
            for combo in itertools.product(*(self.axes[a].items() for a in self.axes)):
                labels = {axis: label for axis, (label, _) in zip(self.axes, combo)}
                matchable = labels | {"seed": str(seed)}  # an exclude entry may also name a seed
                if any(all(matchable.get(k) == v for k, v in e.items()) for e in self.exclude):
                    continue
                settings = SWEEP_DEFAULTS | {"preset": self.preset} | self.base
                for _, axis_settings in combo:
                    settings |= axis_settings
                settings |= overrides or {}
                preset = settings.pop("preset")
                name = "__".join([f"{axis}={_safe(label)}" for axis, label in labels.items()] + [f"seed={seed}"])
                points.append(Point(name, labels, seed, preset, settings))
        return points


def load_spec(path: Path) -> Spec:
    """Parse and check a sweep spec; errors name the spec file and the offending entry."""
    path = Path(path)
    if not path.is_file():
        specs = sorted(str(p) for p in Path("experiments").glob("*.yaml"))
        raise ConfigError(f"sweep spec {path} does not exist" + (f"; specs in experiments/: {', '.join(specs)}."
                                                                  + did_you_mean(str(path), specs) if specs else ""))
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"{path} is not valid YAML: {' '.join(str(e).split())}") from e
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a sweep spec is a mapping with keys {', '.join(SPEC_KEYS)}")
    for key in data:
        if key not in SPEC_KEYS:
            raise ConfigError(f"{path}: unknown spec key {key!r}; valid: {', '.join(SPEC_KEYS)}." + did_you_mean(key, SPEC_KEYS))
    base = data.get("base") or {}
    if not isinstance(base, dict):
        raise ConfigError(f"{path}: base must map dotted config keys to values, e.g. trainer.total_steps: 20")
    axes: dict[str, dict[str, dict[str, Any]]] = {}
    for axis, values in (data.get("axes") or {}).items():
        if isinstance(values, list) and values:  # plain axis: the label is the value
            axes[axis] = {_yaml_value(v): {axis: v} for v in values}
        elif isinstance(values, dict) and values and all(isinstance(v, dict) for v in values.values()):
            axes[axis] = {str(label): dict(overrides) for label, overrides in values.items()}
        else:
            raise ConfigError(
                f"{path}: axis {axis!r} must be a non-empty list of values of that key, or a mapping "
                "label -> {dotted.key: value, ...} of settings varied together"
            )
    seeds = data.get("seeds", [0])
    if not (isinstance(seeds, list) and seeds and all(isinstance(s, int) and not isinstance(s, bool) for s in seeds)):
        raise ConfigError(f"{path}: seeds must be a non-empty list of integers, e.g. [0, 1, 2]; got {seeds!r}")
    exclude = data.get("exclude") or []
    if not (isinstance(exclude, list) and all(isinstance(e, dict) for e in exclude)):
        raise ConfigError(f"{path}: exclude must be a list of {{axis: label}} mappings")
    for entry in exclude:
        for axis in entry:
            if axis not in axes and axis != "seed":
                raise ConfigError(f"{path}: exclude names {axis!r}, which is not an axis; axes: {', '.join(axes)}")
    warmstart = data.get("warmstart")
    if warmstart is not None:
        warmstart = _check_warmstart(path, warmstart)
    environment = data.get("environment") or {}
    if not (isinstance(environment, dict) and all(isinstance(v, (str, int, float)) and not isinstance(v, bool)
                                                   for v in environment.values())):
        raise ConfigError(f"{path}: environment must map variable names to strings or numbers, "
                          "e.g. {ATEN_CPU_CAPABILITY: default}")
    return Spec(
        name=path.stem,
        description=str(data.get("description", "")).strip(),
        preset=data.get("preset"),
        base=dict(base),
        axes=axes,
        seeds=list(seeds),
        exclude=[{str(k): _yaml_value(v) for k, v in e.items()} for e in exclude],
        warmstart=warmstart,
        environment={str(k): str(v) for k, v in environment.items()},
    )


# Keys of a spec's `warmstart` that are not WarmStartConfig fields: where it trains, and with `base`, the
# pretrained model and how it is fine-tuned (ragen2.models.base_warmstart).
WARMSTART_RUN_KEYS = ("seed", "device")
BASE_WARMSTART_KEYS = ("base", "lora_rank", "eval_episodes")


def _check_warmstart(path: Path, settings: Any) -> dict[str, Any]:
    """The spec's `warmstart` mapping, checked by building its (Base)WarmStartConfig (nothing is trained)."""
    from ragen2.models.base_warmstart import ARCHITECTURE_SETTINGS
    from ragen2.models.warmstart import WarmStartConfig

    if not isinstance(settings, dict):
        raise ConfigError(f"{path}: warmstart must map warm-start settings to values, e.g. {{envs: [frozenlake], steps: 700}}")
    allowed = [f.name for f in fields(WarmStartConfig)] + list(WARMSTART_RUN_KEYS)
    if "base" in settings:
        allowed = [k for k in allowed if k not in ARCHITECTURE_SETTINGS] + list(BASE_WARMSTART_KEYS)
    for key in settings:
        if key not in allowed:
            raise ConfigError(f"{path}: unknown warmstart key {key!r}; valid: {', '.join(allowed)}." + did_you_mean(key, allowed))
    settings = {k: tuple(v) if k == "envs" else v for k, v in settings.items()}
    warmstart_policy(settings, build=False)  # naming the cache directory builds the config, which checks it
    return settings


def warmstart_policy(settings: dict[str, Any], build: bool) -> Path:
    """The directory of the spec's warm-started policy in the cache; trained first when `build` and not cached.

    With `base` the policy is that pretrained model fine-tuned (ragen2.models.base_warmstart), else the tiny one."""
    from ragen2.models import base_warmstart, warmstart

    seed, device = settings.get("seed", 0), settings.get("device", "cpu")
    config_settings = {k: v for k, v in settings.items() if k not in WARMSTART_RUN_KEYS}
    if "base" in config_settings:
        if build:
            return base_warmstart.warmstart_base(seed=seed, device=device, **config_settings)
        return base_warmstart.base_cache_path(base_warmstart.make_base_config(seed=seed, **config_settings))
    if build:
        return warmstart.warmstart(seed=seed, device=device, **config_settings)
    return warmstart.cache_path(warmstart.make_config(seed, config_settings))


# ----------------------------------------------------------------------------- running


def available_cores() -> int:
    """Cores this process may run on (the affinity mask where the OS has one)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def plan(point: Point, run_dir: Path) -> str:
    """What a sweep does with `run_dir`: "skip" (finished), "resume" (has a checkpoint) or "start"."""
    status = run_dir / STATUS_FILE
    if status.is_file() and json.loads(status.read_text()).get("returncode") == 0:
        return "skip"
    if (run_dir / "config.yaml").is_file() and latest_step(run_dir) is not None:
        return "resume"
    return "start"


def check_config(point: Point, run_dir: Path) -> None:
    """Resolve and validate the point's config; refuse a directory whose run has another config."""
    config = load_config(point.preset, point.override_args(run_dir))
    saved = run_dir / "config.yaml"
    if saved.is_file():
        old, new = _flatten(to_dict(config_from_file(saved))), _flatten(to_dict(config))
        # The run directory may be spelled differently (relative, absolute) from one call to the next.
        changed = sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k) and k != "trainer.run_dir")
        if changed:
            diff = ", ".join(f"{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in changed[:5])
            raise ConfigError(
                f"{run_dir} holds a run with another config ({diff}); delete that directory to rerun it, "
                "or give the sweep another --out"
            )


def run_sweep(
    spec_path: Path,
    out: Path | None = None,
    jobs: int = 1,
    threads: int | None = None,
    dry_run: bool = False,
    overrides: Sequence[str] = (),
    seeds: Sequence[int] | None = None,
    python: str = sys.executable,
) -> dict[str, str]:
    """Run every point of the spec not finished yet, then write the tables; returns {run name: action}.

    Actions: "skip" (finished before), "start", "resume", and after running "done" or "failed (rc N)".
    With `dry_run` nothing runs and the planned actions are returned. `overrides` are `key=value`
    strings set in every run (see `Spec.points`); `seeds` restricts the run to some of the spec's seeds.
    """
    spec = load_spec(spec_path)
    extra = {}
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"override {item!r} must look like key=value, e.g. trainer.total_steps=2")
        extra[key] = yaml.safe_load(value)
    out = Path(out) if out is not None else Path("sweeps") / spec.name
    cores = available_cores()
    if jobs < 1 or jobs > cores:
        raise ConfigError(f"--jobs {jobs} is not allowed: use 1 to {cores} (the cores available); more would oversubscribe them")
    if threads is None:  # the cores shared out, but no more than an OMP_NUM_THREADS the caller set
        threads = max(1, cores // jobs)
        if os.environ.get("OMP_NUM_THREADS", "").isdigit():
            threads = max(1, min(threads, int(os.environ["OMP_NUM_THREADS"])))
    if jobs * threads > cores:
        raise ConfigError(f"--jobs {jobs} x --threads {threads} exceeds the {cores} cores available")
    if spec.warmstart is not None and "model.path" not in extra:
        policy = warmstart_policy(spec.warmstart, build=not dry_run)
        spec.base = spec.base | {"model.path": str(policy)}
    points = spec.points(extra, seeds)
    for point in points:  # every config is checked before anything runs
        check_config(point, out / point.name)
    actions = {p.name: plan(p, out / p.name) for p in points}
    if dry_run:
        return actions
    out.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(spec_path, out / "spec.yaml")
    _write_grid(out, spec, spec.points(extra))  # the whole grid, also when `seeds` runs part of it now
    todo = [p for p in points if actions[p.name] != "skip"]
    log.info("sweep %s: %d runs, %d finished, %d to run, %d at a time x %d thread(s)",
             spec.name, len(points), len(points) - len(todo), len(todo), jobs, threads)
    env = os.environ | spec.environment | {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    running: list[tuple[Point, subprocess.Popen, float, Any]] = []
    queue = list(todo)
    with _stop_on_sigterm():
        try:
            while queue or running:
                while queue and len(running) < jobs:
                    point = queue.pop(0)
                    running.append(_launch(point, out / point.name, actions[point.name], python, env))
                time.sleep(0.2)
                for item in [r for r in running if r[1].poll() is not None]:
                    running.remove(item)
                    _finish(item, out, actions)
        except KeyboardInterrupt:
            _interrupt(running, out, actions)
            raise
        finally:
            write_tables(out)
    return actions


def _finish(item: tuple[Point, subprocess.Popen, float, Any], out: Path, actions: dict[str, str],
            interrupted: bool = False) -> None:
    """Record a run's exit: its status file (exit code, wall time, command) and its action."""
    point, proc, start, handle = item
    handle.close()
    seconds = time.perf_counter() - start
    (out / point.name / STATUS_FILE).write_text(
        json.dumps({"returncode": proc.returncode, "seconds": round(seconds, 1), "command": proc.args}) + "\n"
    )
    actions[point.name] = ("done" if proc.returncode == 0 else "interrupted" if interrupted
                           else f"failed (rc {proc.returncode})")
    log.info("%s: %s in %.0f s", point.name, actions[point.name], seconds)


def _interrupt(running: list[tuple[Point, subprocess.Popen, float, Any]], out: Path, actions: dict[str, str]) -> None:
    """Ctrl-C or SIGTERM to the sweep: each running run gets one Ctrl-C (it checkpoints its last complete step, as
    `ragen2 train` does) and is waited for; a second Ctrl-C passes on to them, which then stop at once."""
    log.warning("sweep interrupted: stopping %d run(s) at their next complete step; call the sweep again to resume",
                len(running))
    for _, proc, _, _ in running:
        proc.send_signal(signal.SIGINT)
    for item in running:
        while True:
            try:
                item[1].wait()
                break
            except KeyboardInterrupt:
                item[1].send_signal(signal.SIGINT)
        _finish(item, out, actions, interrupted=True)


@contextlib.contextmanager
def _stop_on_sigterm() -> Iterator[None]:
    """SIGTERM (`kill`, a scheduler's preemption) stops the sweep as Ctrl-C does; handlers need the main thread."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum, frame) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _launch(point: Point, run_dir: Path, action: str, python: str, env: dict[str, str]):
    if action == "start" and run_dir.exists():  # a run cut off before its first checkpoint
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / STATUS_FILE).unlink(missing_ok=True)
    args = ["--resume", str(run_dir)] if action == "resume" else point.train_args(run_dir)
    command = [python, "-m", "ragen2", "train", *args]
    handle = open(run_dir / LOG_FILE, "a", encoding="utf-8")
    handle.write(f"$ {shlex.join(command)}\n")
    handle.flush()
    log.info("%s %s", action, point.name)
    # Its own session: a Ctrl-C at the terminal reaches the sweep alone, which passes exactly one to each run.
    proc = subprocess.Popen(command, stdout=handle, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    return point, proc, time.perf_counter(), handle


def _write_grid(out: Path, spec: Spec, points: Sequence[Point]) -> None:
    prefix = "".join(f"{k}={shlex.quote(v)} " for k, v in spec.environment.items())
    grid = {
        "spec": spec.name,
        "description": spec.description,
        "axes": list(spec.axes),
        "runs": [
            {"name": p.name, "labels": p.labels, "seed": p.seed,
             "command": prefix + "ragen2 train " + shlex.join(p.train_args(out / p.name))}
            for p in points
        ],
    }
    (out / GRID_FILE).write_text(json.dumps(grid, indent=1) + "\n")


# ----------------------------------------------------------------------------- tables


@dataclass(frozen=True)
class Column:
    """One number per run, reduced from a metric's series over the run's steps."""

    name: str
    key: str
    reduce: str  # first | last | max | mean
    help: str


TRAIN_STEP_KEY = "train_step_s"  # derived: timing_s/step minus the evaluation and checkpoint in it

COLUMNS = (
    Column("initial_success", "eval/success_rate", "first", "held-out success before training (step 0)"),
    Column("final_success", "eval/success_rate", "last", "held-out success at the last evaluation"),
    Column("peak_success", "eval/success_rate", "max", "best held-out success over all evaluations, step 0 included"),
    Column("final_train_success", "rollout/success_rate", "last", "success of the last training batch"),
    Column("retrieval_acc_ft", "collapse_first_turn/retrieval_acc", "last", "Retrieval-Acc, first turns, last check"),
    Column("mi_est_ft", "collapse_first_turn/mi_est", "last", "MI-Est, first turns, last check"),
    Column("mi_zscore_ema_ft", "collapse_first_turn/mi_zscore_ema", "last", "MI-ZScore-EMA, first turns, last check"),
    Column("retrieval_acc_traj", "collapse_trajectory/retrieval_acc", "last", "Retrieval-Acc, trajectory pairs, last check"),
    Column("mi_est_traj", "collapse_trajectory/mi_est", "last", "MI-Est, trajectory pairs, last check"),
    Column("mi_zscore_ema_traj", "collapse_trajectory/mi_zscore_ema", "last", "MI-ZScore-EMA, trajectory pairs, last check"),
    Column("reasoning_entropy_ft", "collapse_first_turn/reasoning_entropy", "last", "H(Z), first turns, last check"),
    Column("reasoning_entropy_traj", "collapse_trajectory/reasoning_entropy", "last", "H(Z), trajectory pairs, last check"),
    Column("token_entropy", "train/entropy", "last", "token entropy of the trained tokens, last update"),
    Column("kept_ratio", "filter/kept_ratio", "mean", "share of groups the filter kept, mean over steps"),
    Column(TRAIN_STEP_KEY, TRAIN_STEP_KEY, "mean", "seconds per training step without evaluation and checkpoint, mean"),
)
REDUCERS: dict[str, Callable[[np.ndarray], float]] = {
    "first": lambda v: float(v[0]),
    "last": lambda v: float(v[-1]),
    "max": lambda v: float(v.max()),
    "mean": lambda v: float(v.mean()),
}


def series(records: Sequence[dict[str, Any]], key: str) -> tuple[np.ndarray, np.ndarray]:
    """(steps, values) of a metric over a run's records, finite values only, in step order.

    `train_step_s` is derived per step: timing_s/step minus timing_s/evaluate and
    timing_s/checkpoint, the training work a step does whatever the evaluation schedule.
    """
    points = []
    for r in sorted(records, key=lambda r: r["step"]):
        if key == TRAIN_STEP_KEY:
            value = r.get("timing_s/step")
            if value is not None:
                value = value - (r.get("timing_s/evaluate") or 0.0) - (r.get("timing_s/checkpoint") or 0.0)
        else:
            value = r.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            points.append((r["step"], float(value)))
    steps, values = zip(*points) if points else ((), ())
    return np.asarray(steps, dtype=np.int64), np.asarray(values, dtype=np.float64)


def summarize_run(run_dir: Path) -> dict[str, float]:
    """The COLUMNS of one run directory (NaN where the run never logged the metric), plus `steps`."""
    records = read_metrics(run_dir) if (Path(run_dir) / "metrics.jsonl").is_file() else []
    row = {"steps": float(max((r["step"] for r in records), default=0))}
    for column in COLUMNS:
        _, values = series(records, column.key)
        row[column.name] = REDUCERS[column.reduce](values) if len(values) else math.nan
    return row


def run_status(run_dir: Path) -> str:
    """done | failed | incomplete | missing, from the status file the sweep writes."""
    status = Path(run_dir) / STATUS_FILE
    if status.is_file():
        return "done" if json.loads(status.read_text()).get("returncode") == 0 else "failed"
    return "incomplete" if (Path(run_dir) / "metrics.jsonl").is_file() else "missing"


def read_grid(out: Path) -> dict[str, Any]:
    """The expanded grid a sweep wrote into `out` when it started."""
    path = Path(out) / GRID_FILE
    if not path.is_file():
        raise ConfigError(f"{out} holds no {GRID_FILE}: it is not a sweep directory, or its sweep never started")
    return json.loads(path.read_text())


def read_sweep(out: Path) -> list[dict[str, Any]]:
    """One row per run of the sweep in `out`: name, axis labels, seed, status and the COLUMNS."""
    grid = read_grid(out)
    rows = []
    for run in grid["runs"]:
        run_dir = Path(out) / run["name"]
        rows.append({"run": run["name"], **run["labels"], "seed": run["seed"], "status": run_status(run_dir),
                     **summarize_run(run_dir)})
    return rows


def mean_se(values: Sequence[float]) -> tuple[float, float, int]:
    """Mean, standard error (sample std / sqrt(n); NaN for n < 2) and n of the finite values."""
    v = np.asarray([x for x in values if math.isfinite(x)], dtype=np.float64)
    if len(v) == 0:
        return math.nan, math.nan, 0
    se = float(v.std(ddof=1) / math.sqrt(len(v))) if len(v) > 1 else math.nan
    return float(v.mean()), se, len(v)


def format_mean_se(values: Sequence[float]) -> str:
    mean, se, n = mean_se(values)
    if n == 0:
        return "–"
    return f"{mean:.3g} ± {se:.2g}" if n > 1 else f"{mean:.3g} (n=1)"


def write_tables(out: Path) -> tuple[Path, Path]:
    """sweep.csv (one row per run) and sweep.md (mean ± SE over seeds per grid point) in `out`."""
    out = Path(out)
    grid = read_grid(out)
    rows = read_sweep(out)
    axes = grid["axes"]
    fields = ["run", *axes, "seed", "status", "steps", *(c.name for c in COLUMNS)]
    with open(out / "sweep.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: ("" if isinstance(v, float) and math.isnan(v) else v) for k, v in row.items()})
    groups: dict[tuple[str, ...], list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault(tuple(row[a] for a in axes), []).append(row)
    lines = [f"# Sweep `{grid['spec']}`", ""]
    if grid["description"]:
        lines += [grid["description"], ""]
    done = sum(r["status"] == "done" for r in rows)
    lines += [
        f"{len(rows)} runs, {done} finished. Mean ± standard error over the finished seeds of each grid point "
        "(a run still going would mix in an earlier step); every run, finished or not, is a row of `sweep.csv`.",
        "",
        "| " + " | ".join([*axes, "finished", *(c.name for c in COLUMNS)]) + " |",
        "|" + "---|" * (len(axes) + 1 + len(COLUMNS)),
    ]
    for labels, members in groups.items():
        finished = [m for m in members if m["status"] == "done"]
        cells = [*labels, f"{len(finished)}/{len(members)}"]
        cells += [format_mean_se([m[c.name] for m in finished]) for c in COLUMNS]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "Columns:", ""] + [f"- `{c.name}`: {c.help} (`{c.key}`)." for c in COLUMNS]
    (out / "sweep.md").write_text("\n".join(lines) + "\n")
    return out / "sweep.csv", out / "sweep.md"


# ----------------------------------------------------------------------------- helpers


def _yaml_value(value: Any) -> str:
    """A value as `key=value` needs it on the command line (YAML flow style: [6, 6], null, true)."""
    if isinstance(value, str):
        return value
    return yaml.safe_dump(value, default_flow_style=True, width=10**6).strip().removesuffix("...").strip()


def _safe(label: str) -> str:
    """A label as part of a directory name: no path separators or spaces."""
    return "".join(c if c.isalnum() or c in "._-+=," else "-" for c in label)


def _flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            out |= _flatten(value, f"{prefix}{key}.")
        else:
            out[f"{prefix}{key}"] = value
    return out
