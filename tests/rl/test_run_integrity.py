"""A run directory has one writer at a time, and Ctrl-C then --resume redoes exactly what was cut off."""

from __future__ import annotations

import json
import logging
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import ragen2
from ragen2.cli import main
from ragen2.config import load_config
from ragen2.rl import trainer
from ragen2.rl.checkpoint import latest_step
from ragen2.rl.run_lock import LOCK_FILE, RunLock, RunLockedError
from ragen2.tracking import read_metrics

REPO = Path(ragen2.__file__).resolve().parents[1]


def _args(policy_dir: Path, run_dir: Path, *overrides: str) -> list[str]:
    """`ragen2 train` arguments of a Bandit run whose steps take well under a second each."""
    return [
        "train", "bandit", f"model.path={policy_dir}", "model.device=cpu", f"trainer.run_dir={run_dir}",
        "rollout.num_groups=4", "rollout.group_size=4",
        "trainer.eval_every=2", "trainer.eval_episodes=4", "algo.mini_batch_size=4", "algo.micro_batch_size=2",
        "optim.lr=1e-3", "filter.strategy=none", "filter.include_zero=true", "collapse.compute_freq=1",
        "early_stop.eval_floor=false", "logging.progress=false", "logging.tensorboard=false", *overrides,
    ]


def _comparable(record: dict) -> dict:
    return {k: v for k, v in record.items() if not k.startswith(("timing_s/", "system/"))}


# ----------------------------------------------------------------------------- the lock


def test_a_held_lock_refuses_a_second_holder_and_names_the_first(tmp_path):
    with RunLock(tmp_path):
        holder = json.loads((tmp_path / LOCK_FILE).read_text())
        assert holder["pid"] == os.getpid()
        with pytest.raises(RunLockedError, match=rf"in use by another ragen2 process \(pid {os.getpid()} "):
            RunLock(tmp_path).acquire()
    assert not (tmp_path / LOCK_FILE).exists()  # released: removed
    RunLock(tmp_path).acquire().release()  # and free again


def test_a_stale_lock_is_taken_over_with_a_message(tmp_path, caplog):
    (tmp_path / LOCK_FILE).write_text(json.dumps({"pid": 999999, "host": "gone", "since": "yesterday"}))
    with caplog.at_level(logging.WARNING), RunLock(tmp_path):
        assert json.loads((tmp_path / LOCK_FILE).read_text())["pid"] == os.getpid()
    assert "taking over a stale lock" in caplog.text and "pid 999999 on gone" in caplog.text


@pytest.mark.slow
def test_a_fresh_run_into_a_directory_another_process_holds_is_refused_and_leaves_it_alone(policy_dir, tmp_path,
                                                                                           capsys):
    """A second `ragen2 train trainer.run_dir=D` while the first still starts up (D locked, no metrics yet)."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text("the first run's\n")
    with RunLock(run_dir):
        assert main(_args(policy_dir, run_dir, "trainer.total_steps=1")) == 2
        assert f"{run_dir} is in use by another ragen2 process (pid {os.getpid()} " in capsys.readouterr().err
        assert json.loads((run_dir / LOCK_FILE).read_text())["pid"] == os.getpid()
        assert (run_dir / "config.yaml").read_text() == "the first run's\n"
        assert not (run_dir / "metrics.jsonl").exists()


def test_a_second_resume_is_refused_and_a_killed_runs_lock_is_taken_over(policy_dir, tmp_path):
    run_dir = tmp_path / "run"
    assert main(_args(policy_dir, run_dir, "trainer.total_steps=2", "rollout.max_tokens_per_turn=8")) == 0
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    resume = [sys.executable, "-m", "ragen2", "train", "--resume", str(run_dir)]
    first = subprocess.Popen([*resume, "trainer.total_steps=400"], cwd=REPO, env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while max((r["step"] for r in read_metrics(run_dir)), default=0) < 3:  # the first resume is training
        assert first.poll() is None and time.monotonic() < deadline, first.stderr.read() if first.poll() else "timeout"
        time.sleep(0.05)

    second = subprocess.run([*resume, "trainer.total_steps=400"], cwd=REPO, env=env, capture_output=True,
                            text=True, timeout=120)
    assert second.returncode == 2
    assert f"{run_dir} is in use by another ragen2 process (pid {first.pid} " in second.stderr
    assert "Traceback" not in second.stderr and len(second.stderr.strip().splitlines()) == 1

    first.send_signal(signal.SIGKILL)  # dies holding the lock: its file stays behind
    first.wait()
    assert json.loads((run_dir / LOCK_FILE).read_text())["pid"] == first.pid
    third = subprocess.run([*resume, f"trainer.total_steps={latest_step(run_dir) + 2}"], cwd=REPO, env=env,
                           capture_output=True, text=True, timeout=300)
    assert third.returncode == 0, third.stderr
    assert f"taking over a stale lock left by a process that is no longer running (pid {first.pid} " in third.stderr
    steps = [r["step"] for r in read_metrics(run_dir)]
    assert steps == list(range(steps[-1] + 1))  # every step once, in order: nothing interleaved
    assert not (run_dir / LOCK_FILE).exists()


# ----------------------------------------------------------------------------- exact resume after Ctrl-C


@pytest.mark.usefixtures("one_thread")
def test_ctrl_c_after_a_steps_check_then_resume_equals_an_uninterrupted_run(small_bandit_policy, tmp_path,
                                                                           monkeypatch):
    """Ctrl-C lands in step 3 after its MI check moved the EMAs; the resumed run must not apply that move twice."""
    full, cut = tmp_path / "full", tmp_path / "cut"
    assert main(_args(small_bandit_policy, full, "trainer.total_steps=4")) == 0

    filter_phase = trainer.filter_phase

    def interrupted_in_step_3(run, trajectories):
        if run.step == 2:  # steps 1 and 2 are done; step 3's rollout and check have run
            raise KeyboardInterrupt
        return filter_phase(run, trajectories)

    monkeypatch.setattr(trainer, "filter_phase", interrupted_in_step_3)
    with pytest.raises(KeyboardInterrupt):
        trainer.train(load_config("bandit", _args(small_bandit_policy, cut, "trainer.total_steps=4")[2:]))
    monkeypatch.setattr(trainer, "filter_phase", filter_phase)
    assert latest_step(cut) == 2 and not (cut / LOCK_FILE).exists()
    assert main(["train", "--resume", str(cut)]) == 0

    expected, got = read_metrics(full), read_metrics(cut)
    assert [r["step"] for r in got] == [r["step"] for r in expected] == [0, 1, 2, 3, 4]
    emas = {f"step {r['step']} {key}": value for r in got[3:] for key, value in r.items() if "ema" in key}
    assert emas and all(math.isfinite(v) for v in emas.values()), emas  # compared below, and not NaN on both sides
    for want, have in zip(expected, got):
        want, have = _comparable(want), _comparable(have)
        assert set(have) == set(want), f"step {want['step']}"
        for key, value in want.items():
            assert have[key] == pytest.approx(value, rel=1e-6, abs=1e-9, nan_ok=True), f"step {want['step']} {key}"


def test_resuming_a_finished_run_says_how_to_extend_it(policy_dir, tmp_path, caplog):
    run_dir = tmp_path / "run"
    assert main(_args(policy_dir, run_dir, "trainer.total_steps=1", "rollout.max_tokens_per_turn=8")) == 0
    with caplog.at_level(logging.WARNING):
        assert main(["train", "--resume", str(run_dir)]) == 0
    assert (f"{run_dir} finished at step 1: nothing left to train. To extend it: "
            f"`ragen2 train --resume {run_dir} trainer.total_steps=2`") in caplog.text
    assert [r["step"] for r in read_metrics(run_dir)] == [0, 1]
