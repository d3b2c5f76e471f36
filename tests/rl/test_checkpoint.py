"""Checkpoints: atomic layout, clear errors on bad ones, exact resume after SIGKILL, Ctrl-C."""

from __future__ import annotations

import hashlib
import logging
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import ragen2
from ragen2.config import load_config
from ragen2.errors import CheckpointError
from ragen2.rl.checkpoint import latest_step, load_checkpoint, mark_latest, rng_state, save_checkpoint, set_rng_state
from ragen2.tracking import read_events, read_metrics

REPO = Path(ragen2.__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def policy(tmp_path_factory, save_random_policy):
    """A tiny random policy saved as a Hugging Face directory: (path, model, tokenizer)."""
    path = tmp_path_factory.mktemp("policy")
    return path, *save_random_policy(path)


def _saved(run_dir: Path, policy, step: int = 3) -> Path:
    _, model, tokenizer = policy
    path = save_checkpoint(run_dir, step, model, tokenizer, load_config("bandit"), {"optimizer": {}})
    mark_latest(run_dir, step)
    return path


# ----------------------------------------------------------------------------- layout and errors


def test_checkpoint_layout_and_latest_pointer(policy, tmp_path):
    stale = tmp_path / "checkpoints" / ".step_2.tmp-abc"  # what a kill during a write leaves
    stale.mkdir(parents=True)
    assert latest_step(tmp_path) is None
    path = _saved(tmp_path, policy)
    assert path == tmp_path / "checkpoints" / "step_3"
    for name in ("config.json", "model.safetensors", "tokenizer.json", "config.yaml", "trainer_state.pt"):
        assert (path / name).is_file(), name
    assert not stale.exists()
    assert latest_step(tmp_path) == 3
    checkpoint = load_checkpoint(tmp_path)
    assert checkpoint.step == 3 and checkpoint.path == path and checkpoint.critic_path is None
    assert set(checkpoint.state) >= {"optimizer", "step", "rng"}


def test_latest_is_only_moved_by_mark_latest(policy, tmp_path):
    _saved(tmp_path, policy, step=2)
    _, model, tokenizer = policy
    save_checkpoint(tmp_path, 4, model, tokenizer, load_config("bandit"), {})
    assert latest_step(tmp_path) == 2  # step 4 exists but its metrics may not be on disk yet
    with pytest.raises(CheckpointError, match="step_7"):
        mark_latest(tmp_path, 7)


def test_missing_checkpoint_names_the_path(tmp_path):
    with pytest.raises(CheckpointError, match=str(tmp_path / "checkpoints" / "latest")):
        load_checkpoint(tmp_path)


def test_corrupt_trainer_state_names_the_file(policy, tmp_path):
    path = _saved(tmp_path, policy)
    (path / "trainer_state.pt").write_bytes(b"not a torch file")
    with pytest.raises(CheckpointError, match=r"step_3/trainer_state\.pt cannot be read.*corrupt"):
        load_checkpoint(tmp_path)


def test_incomplete_checkpoint_names_what_is_missing(policy, tmp_path):
    path = _saved(tmp_path, policy)
    (path / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"step_3 is incomplete: missing model\.safetensors"):
        load_checkpoint(tmp_path)


def test_garbled_pointer(policy, tmp_path):
    _saved(tmp_path, policy)
    (tmp_path / "checkpoints" / "latest").write_text("step_x\n")
    with pytest.raises(CheckpointError, match="expected 'step_N'"):
        load_checkpoint(tmp_path)
    (tmp_path / "checkpoints" / "latest").write_text("step_9\n")
    with pytest.raises(CheckpointError, match="step_9.*does not exist"):
        load_checkpoint(tmp_path)


# ----------------------------------------------------------------------------- checksums


def test_untouched_checkpoint_loads_and_matches_its_checksums(policy, tmp_path):
    _, model, tokenizer = policy
    path = save_checkpoint(tmp_path, 3, model, tokenizer, load_config("bandit"), {"optimizer": {}}, critic=model)
    mark_latest(tmp_path, 3)
    assert load_checkpoint(tmp_path).step == 3
    lines = (path / "checksums.sha256").read_text().splitlines()
    recorded = {name: digest for digest, name in (line.split("  ", 1) for line in lines)}
    files = {p.relative_to(path).as_posix() for p in path.rglob("*") if p.is_file()} - {"checksums.sha256"}
    assert set(recorded) == files and {"model.safetensors", "trainer_state.pt", "critic/model.safetensors"} <= files
    for name, digest in recorded.items():
        assert hashlib.sha256((path / name).read_bytes()).hexdigest() == digest, name


def test_garbage_after_the_safetensors_header_is_refused_naming_the_file(policy, tmp_path):
    """The header stays valid, so the file loads; without checksums the run later looked diverged."""
    for step in (1, 2):
        _saved(tmp_path, policy, step)
    path = _saved(tmp_path, policy, step=3)
    weights = path / "model.safetensors"
    data = bytearray(weights.read_bytes())
    start = 8 + int.from_bytes(data[:8], "little")
    data[start : start + 64] = b"\xff" * 64  # NaN floats where the first tensor's values were
    weights.write_bytes(data)
    with pytest.raises(CheckpointError) as refused:
        load_checkpoint(tmp_path)
    assert str(refused.value) == (
        f"checkpoint {weights} does not match the sha256 written in checksums.sha256 when it was saved: its bytes "
        f"changed since, it is corrupt; resume from an earlier checkpoint by writing its name (step_2, the one "
        f"before; also saved: step_1) into {tmp_path / 'checkpoints' / 'latest'}"
    )


def test_a_flipped_byte_in_the_optimizer_state_is_refused(policy, tmp_path):
    _, model, tokenizer = policy
    exp_avg = torch.full((256,), 1.5)
    path = save_checkpoint(tmp_path, 3, model, tokenizer, load_config("bandit"), {"optimizer": {"exp_avg": exp_avg}})
    mark_latest(tmp_path, 3)
    data = bytearray((path / "trainer_state.pt").read_bytes())
    data[data.find(exp_avg[:4].numpy().tobytes()) + 5] ^= 0xFF  # still a readable torch file, one value changed
    (path / "trainer_state.pt").write_bytes(data)
    with pytest.raises(CheckpointError, match=r"step_3/trainer_state\.pt does not match the sha256.*no earlier checkpoint"):
        load_checkpoint(tmp_path)


def test_checkpoint_saved_without_checksums_still_loads(policy, tmp_path, caplog):
    path = _saved(tmp_path, policy)
    (path / "checksums.sha256").unlink()  # as every checkpoint saved before checksums were written
    with caplog.at_level(logging.DEBUG, logger="ragen2.rl.checkpoint"):
        assert load_checkpoint(tmp_path).step == 3
    assert "loading it unverified" in caplog.text


def test_rng_state_round_trip():
    state = rng_state()
    expected = (random.random(), np.random.rand(), torch.rand(1).item())
    random.random(), np.random.rand(), torch.rand(3)
    set_rng_state(state)
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == expected


# ----------------------------------------------------------------------------- interrupted runs


def _train_command(policy_dir: Path, run_dir: Path, total_steps: int) -> list[str]:
    return [
        sys.executable, "-m", "ragen2", "train", "bandit",
        f"model.path={policy_dir}", "model.device=cpu", f"trainer.run_dir={run_dir}",
        "rollout.num_groups=2", "rollout.group_size=4", "rollout.max_tokens_per_turn=8",
        f"trainer.total_steps={total_steps}", "trainer.save_every=2", "trainer.eval_every=2",
        "trainer.eval_episodes=4", "algo.mini_batch_size=4", "algo.micro_batch_size=2", "optim.lr=1e-3",
        "filter.include_zero=true", "filter.strategy=none", "algo.kl_coef=0.01",
        "logging.tensorboard=false",
        # The random policy never succeeds: without this the run stops at step 8, maybe before the test's signal.
        "early_stop.eval_floor=false",
    ]


def _env() -> dict[str, str]:
    # One thread in every process: equal float reductions, so the runs can be compared exactly.
    return {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}


def _logged_steps(run_dir: Path) -> list[int]:
    try:
        return [r["step"] for r in read_metrics(run_dir)]
    except (FileNotFoundError, ValueError):
        return []


def _wait_for(condition, proc: subprocess.Popen, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if proc.poll() is not None:
            raise AssertionError(f"training exited early with {proc.returncode}:\n{proc.stderr.read()}")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError("timed out waiting for the training subprocess")
        time.sleep(0.02)


def _comparable(record: dict) -> dict:
    return {k: v for k, v in record.items() if not k.startswith(("timing_s/", "system/"))}


@pytest.mark.slow
def test_resume_after_sigkill_matches_an_uninterrupted_run(policy, tmp_path):
    policy_dir = policy[0]
    steps = 4
    full_dir, killed_dir = tmp_path / "full", tmp_path / "killed"
    kwargs = dict(cwd=REPO, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    full = subprocess.Popen(_train_command(policy_dir, full_dir, steps), **kwargs)
    killed = subprocess.Popen(_train_command(policy_dir, killed_dir, steps), **kwargs)
    # Kill once a checkpoint is marked and the next step is logged, so the resume must drop it.
    _wait_for(lambda: (latest_step(killed_dir) or 0) >= 2 and max(_logged_steps(killed_dir), default=0) > latest_step(killed_dir), killed)
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    checkpoint = latest_step(killed_dir)
    assert checkpoint < steps and max(_logged_steps(killed_dir)) > checkpoint

    resumed = subprocess.run(
        [sys.executable, "-m", "ragen2", "train", "--resume", str(killed_dir)],
        cwd=REPO, env=_env(), capture_output=True, text=True, timeout=300,
    )
    assert resumed.returncode == 0, resumed.stderr
    assert full.wait(timeout=300) == 0, full.stderr.read()

    expected = read_metrics(full_dir)
    got = read_metrics(killed_dir)
    assert [r["step"] for r in got] == list(range(steps + 1))  # step 0 is the initial evaluation
    assert [r["step"] for r in expected] == list(range(steps + 1))
    for want, have in zip(expected, got):
        want, have = _comparable(want), _comparable(have)
        assert set(have) == set(want), f"step {want['step']}"
        for key, value in want.items():
            assert have[key] == pytest.approx(value, rel=1e-5, abs=1e-7, nan_ok=True), f"step {want['step']} {key}"
    assert latest_step(killed_dir) == steps
    assert "run dir" in resumed.stdout


def test_resume_without_checkpoint_is_refused(policy, tmp_path):
    from ragen2.rl.trainer import train

    config = load_config("bandit", [f"model.path={policy[0]}", "model.device=cpu"])
    with pytest.raises(CheckpointError, match="no complete checkpoint"):
        train(config, resume_dir=tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])  # Ctrl-C; `kill` or a scheduler's preemption
def test_ctrl_c_checkpoints_the_last_completed_step(policy, tmp_path, signum):
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(
        _train_command(policy[0], run_dir, total_steps=50), cwd=REPO, env=_env(),
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    _wait_for(lambda: max(_logged_steps(run_dir), default=0) >= 1, proc)
    proc.send_signal(signum)
    assert proc.wait(timeout=120) == 130, proc.stderr.read()
    last = max(_logged_steps(run_dir))
    assert 1 <= last < 50
    assert latest_step(run_dir) == last
    assert load_checkpoint(run_dir).step == last
    assert read_events(run_dir)[-1]["kind"] == "interrupted"


def test_extending_a_finished_run_continues_it_as_a_longer_run(policy, tmp_path, capsys):
    """`--resume RUN trainer.total_steps=4` on a finished 2-step run logs steps 3 and 4 as a 4-step run does."""
    from ragen2.cli import main

    def train_args(run_dir: Path, steps: int) -> list[str]:
        return _train_command(policy[0], run_dir, steps)[3:]  # without `python -m ragen2`

    long, short = tmp_path / "long", tmp_path / "short"
    assert main(train_args(long, 4)) == 0
    assert main(train_args(short, 2)) == 0
    capsys.readouterr()
    assert main(["train", "--resume", str(short), "trainer.total_steps=1"]) == 2
    assert "trainer.total_steps=1 is below the step of the checkpoint to resume" in capsys.readouterr().err
    assert main(["train", "--resume", str(short), "trainer.total_steps=4", "optim.lr=1e-2"]) == 2
    assert (f"--resume {short}: optim.lr cannot change on resume" in capsys.readouterr().err)
    assert main(["train", "--resume", str(short), "trainer.total_steps=4"]) == 0

    expected, got = read_metrics(long), read_metrics(short)
    assert [r["step"] for r in got] == list(range(5))
    for want, have in zip(expected, got):
        want, have = _comparable(want), _comparable(have)
        assert set(have) == set(want), f"step {want['step']}"
        for key, value in want.items():
            assert have[key] == pytest.approx(value, rel=1e-5, abs=1e-7, nan_ok=True), f"step {want['step']} {key}"
    assert "total_steps: 4" in (short / "config.yaml").read_text()  # a later --resume continues to 4
    changed = [e for e in read_events(short) if e["kind"] == "total_steps_changed"]
    assert [(e["step"], e["message"]) for e in changed] == [(2, "trainer.total_steps 2 -> 4 on resume from step 2")]
