"""Bandit: names by split and kind, random order, payoffs with the documented expected values."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from ragen2.envs import make
from ragen2.envs.bandit import ARM_NAMES, BanditEnv
from ragen2.errors import ConfigError


def test_name_lists_are_disjoint_across_splits_and_kinds():
    lists = [set(ARM_NAMES[split][kind]) for split in ("train", "test") for kind in ("high", "low")]
    for a, b in itertools.combinations(lists, 2):
        assert not a & b
    lowered = [name.lower() for names in lists for name in names]
    assert len(lowered) == len(set(lowered))


@pytest.mark.parametrize("split", ["train", "test"])
def test_arms_come_from_the_split_in_random_order(split):
    env = make("bandit", split=split)
    first_is_high = []
    for seed in range(200):
        obs, _ = env.reset(seed=seed)
        assert set(env.arm_names) == {env.high_arm, env.low_arm}
        assert env.high_arm in ARM_NAMES[split]["high"] and env.low_arm in ARM_NAMES[split]["low"]
        assert obs == f"Arms: {env.arm_names[0]}, {env.arm_names[1]}. Which arm do you pull?"
        first_is_high.append(env.arm_names[0] == env.high_arm)
    assert 0.35 < np.mean(first_is_high) < 0.65
    assert len({make("bandit", split=split).reset(seed=s)[0] for s in range(200)}) > 30


def test_payoffs_and_success():
    env = make("bandit")
    high, low = [], []
    for seed in range(4000):
        env.reset(seed=seed)
        arm = env.high_arm if seed % 2 else env.low_arm
        obs, reward, terminated, truncated, info = env.step(arm)
        assert terminated and not truncated and info == {"action_is_valid": True, "success": arm == env.high_arm}
        assert obs == f"You pulled {arm} and got {reward}."
        (high if seed % 2 else low).append(reward)
    assert set(low) == {0.1}
    assert set(high) == {0.0, 1.0}
    assert abs(np.mean(high) - 0.25) < 0.03  # 2000 pulls: 3 standard errors is 0.029


def test_arm_names_are_case_and_whitespace_tolerant():
    env = make("bandit")
    env.reset(seed=0)
    assert env.step(f"  {env.high_arm.upper()}\n")[4]["action_is_valid"]


@pytest.mark.parametrize("action", ["", "arm 1", "both", "Dragon!", "left"])
def test_other_text_is_invalid_and_keeps_the_episode_going(action):
    env = make("bandit")
    obs, _ = env.reset(seed=0)
    assert env.step(action) == (obs, 0.0, False, False, {"action_is_valid": False, "success": False})
    assert env.step(env.low_arm)[2]
    with pytest.raises(RuntimeError, match="call reset"):
        env.step(env.low_arm)


def test_solver_picks_the_high_arm():
    env = make("bandit")
    for seed in range(20):
        env.reset(seed=seed)
        assert env.solve() == [env.high_arm]


def test_bad_split_names_the_parameter():
    with pytest.raises(ConfigError, match="split='val'.*'train', 'test'"):
        BanditEnv(split="val")
