"""Metric sinks: the JSONL record of truth, resume truncation, TensorBoard, W&B, console progress."""

from __future__ import annotations

import json
import math
import sys
import time
import types
from pathlib import Path

import numpy as np
import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from ragen2.errors import ConfigError
from ragen2.tracking import Tracker, read_events, read_metrics


def _scalars(run_dir: Path, tag: str) -> list[tuple[int, float]]:
    """(step, value) of every point TensorBoard would show for `tag`, after purges."""
    acc = EventAccumulator(str(run_dir))
    acc.Reload()
    if tag not in acc.Tags()["scalars"]:
        return []
    return [(e.step, e.value) for e in acc.Scalars(tag)]


def test_log_writes_one_json_object_per_step_and_reads_back(tmp_path: Path) -> None:
    with Tracker(tmp_path, {"seed": 0}, tensorboard=False) as tracker:
        tracker.log(1, {"train/kl": 0.5, "filter/kept_groups": 3})
        tracker.log(2, {"train/kl": np.float32(0.25), "rollout/success_rate": torch.tensor(0.75)})
        tracker.log(4, {"train/kl": 0.125})

    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == [
        {"step": 1, "train/kl": 0.5, "filter/kept_groups": 3.0},
        {"step": 2, "train/kl": 0.25, "rollout/success_rate": 0.75},
        {"step": 4, "train/kl": 0.125},
    ]
    assert read_metrics(tmp_path) == [json.loads(line) for line in lines]


def test_non_finite_values_are_null_in_jsonl_and_absent_from_tensorboard(tmp_path: Path) -> None:
    with Tracker(tmp_path, {}) as tracker:
        tracker.log(1, {"train/kl": 0.1, "train/grad_norm": 2.0})
        tracker.log(2, {"train/kl": float("nan"), "train/grad_norm": float("inf"), "eval/success_rate": None})
        tracker.log(3, {"train/kl": 0.3, "train/grad_norm": -float("inf")})

    text = (tmp_path / "metrics.jsonl").read_text()
    assert "NaN" not in text and "Infinity" not in text  # strict JSON, readable by any parser
    records = read_metrics(tmp_path)
    assert records[1] == {"step": 2, "train/kl": None, "train/grad_norm": None, "eval/success_rate": None}
    assert records[2]["train/grad_norm"] is None
    assert _scalars(tmp_path, "train/kl") == [(1, pytest.approx(0.1)), (3, pytest.approx(0.3))]
    assert _scalars(tmp_path, "train/grad_norm") == [(1, 2.0)]


def test_tensorboard_event_files_hold_every_scalar(tmp_path: Path) -> None:
    with Tracker(tmp_path, {}) as tracker:
        for step in range(1, 6):
            tracker.log(step, {"rollout/return_mean": step / 10, "timing_s/step": 2.0 * step})

    assert list(tmp_path.glob("events.out.tfevents.*"))
    assert _scalars(tmp_path, "rollout/return_mean") == [(s, pytest.approx(s / 10)) for s in range(1, 6)]
    assert _scalars(tmp_path, "timing_s/step") == [(s, 2.0 * s) for s in range(1, 6)]


def test_tensorboard_can_be_turned_off(tmp_path: Path) -> None:
    with Tracker(tmp_path, {}, tensorboard=False) as tracker:
        tracker.log(1, {"train/kl": 0.1})
        tracker.log_event("alarm", "x", step=1)
    assert not list(tmp_path.glob("events.out.tfevents.*"))


def test_resume_truncates_after_checkpoint_step_including_a_partial_line(tmp_path: Path) -> None:
    with Tracker(tmp_path, {}) as tracker:
        for step in range(1, 6):
            tracker.log(step, {"train/kl": float(step)})
            tracker.log_event("alarm", f"alarm at {step}", step=step)
    # A SIGKILL while step 6 was being written leaves half a line.
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 6, "train/k')
    # TensorBoard orders event files by the second in their name: make the resumed file's later.
    time.sleep(1.01 - time.time() % 1)

    with Tracker(tmp_path, {}) as tracker:  # resume from the checkpoint of step 3
        tracker.truncate_after(3)
        for step in (4, 5):
            tracker.log(step, {"train/kl": 100.0 + step})

    assert [(r["step"], r["train/kl"]) for r in read_metrics(tmp_path)] == [
        (1, 1.0),
        (2, 2.0),
        (3, 3.0),
        (4, 104.0),
        (5, 105.0),
    ]
    assert [e["step"] for e in read_events(tmp_path)] == [1, 2, 3]
    assert _scalars(tmp_path, "train/kl") == [(1, 1.0), (2, 2.0), (3, 3.0), (4, 104.0), (5, 105.0)]


def test_reopening_repairs_a_partial_last_line_before_appending(tmp_path: Path) -> None:
    with Tracker(tmp_path, {}, tensorboard=False) as tracker:
        tracker.log(1, {"train/kl": 1.0})
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 2, "tr')
    with Tracker(tmp_path, {}, tensorboard=False) as tracker:
        tracker.log(2, {"train/kl": 2.0})

    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == [{"step": 1, "train/kl": 1.0}, {"step": 2, "train/kl": 2.0}]


def test_read_metrics_tolerates_only_a_cut_off_last_line(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "a": 1}\n{"step": 2, "a": 2}\n{"step": 3, "a"')
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2]

    path.write_text('{"step": 1, "a": 1}\n{"step": 2, "a": 2}')  # complete, just no final newline
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2]

    path.write_text('{"step": 1, "a": 1}\n{"step": 2, "a\n{"step": 3, "a": 3}\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl:2 is not valid JSON"):
        read_metrics(tmp_path)

    with pytest.raises(FileNotFoundError, match="no metrics.jsonl"):
        read_metrics(tmp_path / "elsewhere")


def test_logging_a_step_twice_fails_and_names_truncate_after(tmp_path: Path) -> None:
    with Tracker(tmp_path, {}, tensorboard=False) as tracker:
        tracker.log(1, {"train/kl": 1.0})
        tracker.log(2, {"train/kl": 2.0})
    with Tracker(tmp_path, {}, tensorboard=False) as tracker:
        with pytest.raises(ValueError, match=r"step 2 was already logged .*truncate_after"):
            tracker.log(2, {"train/kl": 2.0})
        tracker.log(3, {"train/kl": 3.0})
        with pytest.raises(TypeError, match="'train/kl' must be a number"):
            tracker.log(4, {"train/kl": "high"})


def test_log_event_appends_to_events_jsonl(tmp_path: Path) -> None:
    with Tracker(tmp_path, {}, tensorboard=False) as tracker:
        tracker.log_event("skipped_step", "no group kept", step=7, kept_groups=0)
        tracker.log_event("early_stop", "RV collapsed", step=9, rv_mean=np.float32("nan"), means=[0.5, math.inf])

    events = read_events(tmp_path)
    assert [(e["kind"], e["step"], e["message"]) for e in events] == [
        ("skipped_step", 7, "no group kept"),
        ("early_stop", 9, "RV collapsed"),
    ]
    assert events[0]["kept_groups"] == 0
    assert events[1]["rv_mean"] is None and events[1]["means"] == [0.5, None]
    assert read_events(tmp_path / "no-run") == []


def test_wandb_enabled_but_not_installed_fails_with_the_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)  # makes `import wandb` raise ImportError
    with pytest.raises(ConfigError, match=r"logging\.wandb.*pip install wandb"):
        Tracker(tmp_path / "run", {}, wandb=True)
    assert not (tmp_path / "run").exists()


def test_wandb_receives_finite_metrics_and_keeps_its_run_id(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, object]] = []

    class FakeRun:
        def log(self, metrics: dict, step: int) -> None:
            calls.append(("log", (step, metrics)))

        def finish(self) -> None:
            calls.append(("finish", None))

    def init(**kwargs: object) -> FakeRun:
        calls.append(("init", kwargs))
        return FakeRun()

    fake = types.SimpleNamespace(init=init, util=types.SimpleNamespace(generate_id=lambda: "abc123"))
    monkeypatch.setitem(sys.modules, "wandb", fake)
    with Tracker(tmp_path, {"algo": {"name": "grpo"}}, tensorboard=False, wandb=True, wandb_project="p") as tracker:
        tracker.log(1, {"train/kl": 0.5, "train/grad_norm": float("nan")})

    kind, kwargs = calls[0]
    assert kind == "init" and kwargs["project"] == "p" and kwargs["id"] == "abc123"
    assert kwargs["config"] == {"algo": {"name": "grpo"}}
    assert calls[1:] == [("log", (1, {"train/kl": 0.5})), ("finish", None)]
    assert (tmp_path / "wandb_run_id.txt").read_text().strip() == "abc123"
