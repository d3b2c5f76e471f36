"""The trainer options of the ablations: quartile and trajectory-level filtering, regulariser-only updates."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ragen2.config import Config, load_config
from ragen2.errors import ConfigError
from ragen2.rl import advantage_stage, filter_stage, rollout_stage, trainer, update_stage
from ragen2.rl.run import setup


@pytest.fixture(autouse=True)
def _single_thread(one_thread):
    """One thread (tests/conftest.py, one_thread)."""


def config(policy_dir: Path, run_dir: Path, *overrides: str) -> Config:
    """Bandit, 4 groups x 4 episodes of at most 8 tokens."""
    return load_config("bandit", [
        f"model.path={policy_dir}", "model.device=cpu", f"trainer.run_dir={run_dir}", "rollout.num_groups=4",
        "rollout.group_size=4", "rollout.max_tokens_per_turn=8", "trainer.eval_every=0", "algo.mini_batch_size=16",
        "algo.micro_batch_size=8", "optim.lr=1e-3", "logging.progress=false", "logging.tensorboard=false", *overrides,
    ])


def rollout_with_returns(run: trainer.Run, returns: list[float]):
    """A real rollout batch (group-major) whose returns are overwritten."""
    trajectories, _ = rollout_stage.rollout_phase(run, 1)
    for traj, ret in zip(trajectories, returns):
        traj.episode_return = ret
    return trajectories


# Group g's returns: RV 0 (g0), 1.667 (g1), 0.333 (g2), 6.667 (g3), ddof=1.
RETURNS = [1, 1, 1, 1] + [0, 1, 2, 3] + [0, 0, 1, 1] + [0, 2, 4, 6]


@pytest.mark.parametrize(("quartile", "group"), [(1, 3), (2, 1), (3, 2), (4, 0)])
def test_quartile_keeps_one_group_of_four(policy_dir, tmp_path, quartile, group):
    run = setup(config(policy_dir, tmp_path, "filter.strategy=quartile", f"filter.value={quartile}",
                               "filter.include_zero=true"))
    kept, metrics = filter_stage.filter_phase(run, rollout_with_returns(run, RETURNS))
    assert {t.group_id for t in kept} == {group} and len(kept) == 4
    assert metrics["filter/kept_ratio"] == 0.25
    run.tracker.close()


def test_trajectory_level_keeps_the_spread_out_half_of_every_group(policy_dir, tmp_path):
    run = setup(config(policy_dir, tmp_path, "filter.strategy=none", "filter.include_zero=true",
                               "filter.trajectory_keep=0.5"))
    trajectories = rollout_with_returns(run, RETURNS)
    kept, metrics = filter_stage.filter_phase(run, trajectories)
    # k = 2 per group, the lowest and the highest return: episodes 0 and 3 of each (g0 is all ties: by index).
    assert [trajectories.index(t) for t in kept] == [0, 3, 4, 7, 8, 11, 12, 15]
    assert metrics["filter/kept_ratio"] == 1.0
    # Group baselines over the kept pair: returns {0, 3} -> GRPO advantages -/+0.7071.
    batch = advantage_stage.advantage_phase(run, kept[2:4])
    token_advantages = batch.advantages[batch.mask.bool()]
    assert token_advantages.min().item() == pytest.approx(-0.7071, abs=1e-4)
    assert token_advantages.max().item() == pytest.approx(0.7071, abs=1e-4)
    run.tracker.close()


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["filter.trajectory_keep=0"], r"filter.trajectory_keep=0.0 is not allowed: use a fraction in \(0, 1\]"),
        (["filter.strategy=quartile", "filter.value=0.9"],
         r"filter.value=0.9 is not allowed with filter.strategy=quartile: use 1 \(highest RV\), 2, 3 or 4"),
    ],
)
def test_bad_filter_options_fail_at_start(policy_dir, tmp_path, overrides, message):
    with pytest.raises(ConfigError, match=message):
        config(policy_dir, tmp_path, *overrides)


@pytest.mark.parametrize(("scale", "entropy_coef", "moves"), [(0.0, 0.0, False), (0.0, 0.1, True), (1.0, 0.0, True)])
def test_regulariser_only_updates(policy_dir, tmp_path, scale, entropy_coef, moves):
    """Task advantage x0 with no regulariser is the no-update control; the entropy bonus alone still moves the policy."""
    run = setup(config(policy_dir, tmp_path, f"algo.task_advantage_scale={scale}",
                               f"algo.entropy_coef={entropy_coef}", "filter.strategy=none", "filter.include_zero=true"))
    before = {n: p.detach().clone() for n, p in run.policy.named_parameters()}
    batch = advantage_stage.advantage_phase(run, rollout_with_returns(run, RETURNS))
    assert bool(batch.advantages.abs().sum() > 0) == (scale > 0)
    update_stage.update_phase(run, batch, step=1, scale=1.0)
    changed = any(not torch.equal(p, before[n]) for n, p in run.policy.named_parameters())
    assert changed == moves
    run.tracker.close()
