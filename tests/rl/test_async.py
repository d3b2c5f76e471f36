"""Asynchronous training as far as it runs today: its config section, the policy version of every sample,
and its synchronous limit (async.max_staleness=0), which must be the synchronous run exactly."""

from __future__ import annotations

from pathlib import Path

import pytest

from ragen2.config import config_from_file, load_config
from ragen2.errors import ConfigError
from ragen2.rl import trainer
from ragen2.tracking import read_metrics

# Keys that differ between any two runs (wall-clock time, memory) or exist only in the asynchronous schedule.
UNCOMPARED = ("timing_s/", "system/", "async/")


@pytest.fixture(autouse=True)
def _single_thread(one_thread):
    """Every test here runs on one thread (see tests/conftest.py, one_thread)."""


def tiny(policy_dir: Path, run_dir: Path, *overrides: str):
    """Bandit, 2 groups x 4 episodes of at most 8 tokens, 3 steps with an evaluation and the MI diagnostics."""
    return load_config("bandit", [
        f"model.path={policy_dir}", "model.device=cpu", f"trainer.run_dir={run_dir}", "rollout.num_groups=2",
        "rollout.group_size=4", "rollout.max_tokens_per_turn=8", "trainer.total_steps=3", "trainer.eval_every=2",
        "trainer.eval_episodes=4", "algo.mini_batch_size=4", "algo.micro_batch_size=2", "optim.lr=1e-3",
        "filter.include_zero=true", "logging.progress=false", "logging.tensorboard=false", *overrides,
    ])


def test_staleness_zero_is_the_synchronous_run(policy_dir, tmp_path):
    trainer.train(tiny(policy_dir, tmp_path / "sync"))
    trainer.train(tiny(policy_dir, tmp_path / "async", "async.enable=true", "async.max_staleness=0"))
    sync, asynchronous = read_metrics(tmp_path / "sync"), read_metrics(tmp_path / "async")
    assert [r["step"] for r in sync] == [r["step"] for r in asynchronous] == [0, 1, 2, 3]
    for a, b in zip(sync, asynchronous):
        compared = {k for k in a if not k.startswith(UNCOMPARED)}
        assert compared == {k for k in b if not k.startswith(UNCOMPARED)}
        assert {k: a[k] for k in compared} == {k: b[k] for k in compared}, a["step"]
    trained = [r for r in asynchronous if r["step"] > 0]
    assert all(r["async/staleness_mean"] == r["async/staleness_max"] == 0.0 for r in trained)
    assert all(r["async/staleness_frac_0"] == 1.0 and r["async/staleness_frac_1"] == 0.0 for r in trained)
    assert not any(k.startswith("async/") for r in sync for k in r)


def test_samples_record_the_policy_version_that_drew_them(policy_dir, tmp_path):
    run = trainer.setup(tiny(policy_dir, tmp_path / "run"))
    for step in (1, 4):
        trajectories, _ = trainer.rollout_phase(run, step)
        assert {t.policy_version for t in trajectories} == {step - 1}
    metrics = trainer.staleness_metrics(trajectories[:3] + [trainer.dataclasses.replace(trajectories[3],
                                                                                          policy_version=1)], 4)
    assert metrics["async/staleness_mean"] == pytest.approx(0.5) and metrics["async/staleness_max"] == 2.0
    assert (metrics["async/staleness_frac_0"], metrics["async/staleness_frac_2"]) == (0.75, 0.25)
    run.tracker.close()


def test_the_async_section_round_trips_and_refuses_what_does_not_run_yet(policy_dir, tmp_path):
    config = tiny(policy_dir, tmp_path / "run", "async.enable=true", "async.max_staleness=0")
    assert config.async_.enable and config.async_.max_staleness == 0
    trainer.setup(config).tracker.close()
    assert config_from_file(tmp_path / "run" / "config.yaml").async_ == config.async_
    assert "async:\n  enable: true" in (tmp_path / "run" / "config.yaml").read_text()
    with pytest.raises(ConfigError, match="async.max_staleness=1 is not supported yet"):
        tiny(policy_dir, tmp_path / "x", "async.enable=true")
    with pytest.raises(ConfigError, match="async.oversample=2.0 .* not supported yet"):
        tiny(policy_dir, tmp_path / "x", "async.enable=true", "async.max_staleness=0", "async.oversample=2")
    with pytest.raises(ConfigError, match="async.max_staleness=-1 is not allowed"):
        tiny(policy_dir, tmp_path / "x", "async.max_staleness=-1")
    with pytest.raises(ConfigError, match="unknown config key 'async.enabel'.*async.enable"):
        tiny(policy_dir, tmp_path / "x", "async.enabel=true")
