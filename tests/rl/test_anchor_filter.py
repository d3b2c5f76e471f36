"""Anchor-state filtering (`filter.level=anchor`): hand-computed selections, the prompt-level rules when every
anchor group is a prompt group, the batch the trainer builds from it, and a short run."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ragen2.agent.types import Trajectory, Turn
from ragen2.cli import main
from ragen2.config import load_config
from ragen2.errors import ConfigError
from ragen2.filtering import STRATEGIES, FilterRule, select_groups
from ragen2.rl import trainer
from ragen2.rl.gigpo import gigpo_advantages, select_anchor_turns
from ragen2.tracking import read_metrics


@pytest.fixture(autouse=True)
def _single_thread(one_thread):
    """One thread (tests/conftest.py, one_thread)."""


# Group 0 (returns 1, 0, 1, 1): every episode starts at S0; e0 and e1 then meet at S1, e2 goes to S2 alone.
# Step returns (gamma 1): e0 [1, 1], e1 [0, 0], e2 [1, 1], e3 [1]. Anchor groups: S0 [1, 0, 1, 1], RV 0.25;
# S1 [1, 0], RV 0.5; S2 alone. Group 1 (returns 0, 0): T0 shared, RV 0; T1 and T2 alone.
REWARDS = [[0, 1], [0, 0], [0, 1], [1], [0, 0], [0, 0]]
GROUPS = [0, 0, 0, 0, 1, 1]
ANCHORS = [["S0", "S1"], ["S0", "S1"], ["S0", "S2"], ["S0"], ["T0", "T1"], ["T0", "T2"]]


def keep(gamma: float = 1.0, **rule) -> list[list[bool]]:
    return [k.tolist() for k in select_anchor_turns(REWARDS, GROUPS, ANCHORS, FilterRule(**rule), gamma)]


def test_hand_computed_selections():
    # top_p 0.9 over the candidates S1 0.5, S0 0.25 (T0 fails the zero test): 0.9 x 0.75 - 0.01 = 0.665 needs both.
    # S2 is alone in a group whose returns vary: kept. T1, T2 are alone in a group whose returns are equal: dropped.
    t, f = True, False
    assert keep(strategy="top_p", value=0.9) == [[t, t], [t, t], [t, t], [t], [f, t], [f, t]]  # include_zero=True
    assert keep(strategy="top_p", value=0.9, include_zero=False) == [[t, t], [t, t], [t, t], [t], [f, f], [f, f]]
    # 0.5 x 0.75 - 0.01 = 0.365: S1 alone reaches it; S2 stays (a lone turn is not ranked).
    assert keep(strategy="top_p", value=0.5, include_zero=False) == [[f, t], [f, t], [f, t], [f], [f, f], [f, f]]
    # top_k 1/3 of the 3 anchor groups: S1. order=smallest: the lowest score, T0 (RV 0).
    assert keep(strategy="top_k", value=1 / 3) == [[f, t], [f, t], [f, t], [f], [f, t], [f, t]]
    assert keep(strategy="top_k", value=1 / 3, order="smallest") == [[f, f], [f, f], [f, t], [f], [t, t], [t, t]]
    assert keep(strategy="none") == [[t, t], [t, t], [t, t], [t], [t, t], [t, t]]


def test_gamma_discounts_the_step_returns():
    # gamma 0.5: S0's step returns become [0.5, 0, 0.5, 1] (RV 0.1667) and S1's stay [1, 0] (RV 0.5):
    # top_p 0.5 keeps S1 alone either way, min_p 0.4 keeps S1 only at gamma 0.5 (0.1667 < 0.4 x 0.5).
    t, f = True, False
    assert keep(strategy="min_p", value=0.4, gamma=0.5) == [[f, t], [f, t], [f, t], [f], [f, t], [f, t]]
    assert keep(strategy="min_p", value=0.4) == [[t, t], [t, t], [t, t], [t], [f, t], [f, t]]  # 0.25 >= 0.2


def test_one_turn_episodes_select_what_the_prompt_level_selects():
    """With one turn per episode every anchor group is a prompt group and the step returns are the returns."""
    rng = np.random.default_rng(0)
    for case in range(300):
        P, G = int(rng.integers(1, 7)), int(rng.integers(2, 6))
        rewards = rng.choice([0.0, 0.1, 1.0, -0.5], size=(P, G))
        strategy = sorted(STRATEGIES.names())[case % len(STRATEGIES.names())]
        value = {"quartile": 1 + case % 4, "top_k_abs": 1 + case % 3}.get(strategy, float(rng.uniform(0.05, 1)))
        metric = ["reward_variance", "reward_std"][case % 2]
        rule = FilterRule(strategy=strategy, value=value, metric=metric, include_zero=bool(case % 3),
                  order="smallest" if case % 5 == 0 else "largest")
        groups = select_groups(rewards, rule)
        turns = select_anchor_turns([[r] for r in rewards.reshape(-1)], np.repeat(np.arange(P), G).tolist(),
                                    [["start"]] * (P * G), rule)
        kept = sorted({i // G for i, k in enumerate(turns) if k[0]})
        assert kept == groups.tolist(), f"case {case}: {rule}"


def test_bad_arguments_are_refused():
    with pytest.raises(ConfigError, match="anchor filter metric"):
        select_anchor_turns(REWARDS, GROUPS, ANCHORS, FilterRule(metric="length"))
    with pytest.raises(ConfigError, match="episode 0 has 2 step rewards but 1 anchors"):
        select_anchor_turns(REWARDS, GROUPS, [["S0"]] + ANCHORS[1:])


@pytest.mark.parametrize(("overrides", "message"), [
    (["filter.level=anchor"], r"needs algo.name=gigpo \(not grpo\)"),
    (["filter.level=anchor", "algo.name=gigpo", "filter.trajectory_keep=0.5"], "filter.trajectory_keep=1"),
    (["filter.level=anchor", "algo.name=gigpo", "filter.metric=entropy"], "not entropy"),
])
def test_bad_settings_are_refused(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config("bandit", overrides)


# ----------------------------------------------------------------------------- the trainer


def _turn(reward: float, observation: str) -> Turn:
    return Turn(prompt_ids=[], response_ids=[], response_text="", reasoning="", reasoning_span=(0, 0), actions=[],
                format_valid=True, actions_valid=True, reward=reward, observation=observation)


def test_dropped_turns_are_masked_after_gigpos_advantages(policy_dir, tmp_path):
    # e0 sees s0, s1 with rewards 1, 0 (one row); e1 the same states with 0, 0 (one row per turn).
    # Step returns: s0 [1, 0] (RV 0.5), s1 [0, 0] (RV 0): include_zero=False drops s1 in both episodes.
    one_row = [([1, 1, 5, 6, 1, 7, 1], [0, 0, 1, 1, 0, 1, 0])]
    row_per_turn = [([1, 1, 5], [0, 0, 1]), ([1, 6, 7], [0, 1, 1])]
    episodes = [
        Trajectory("frozenlake", 0, 0, [_turn(1.0, "s0"), _turn(0.0, "s1")], one_row, episode_return=1.0),
        Trajectory("frozenlake", 0, 0, [_turn(0.0, "s0"), _turn(0.0, "s1")], row_per_turn, episode_return=0.0),
    ]
    config = load_config("bandit", [
        f"model.path={policy_dir}", "model.device=cpu", f"trainer.run_dir={tmp_path}", "logging.tensorboard=false",
        "rollout.num_groups=1", "rollout.group_size=2", "algo.name=gigpo", "algo.gigpo_mode=mean_norm",
        "filter.level=anchor", "filter.include_zero=false",
    ])
    run = trainer.setup(config)
    kept, metrics = trainer.filter_phase(run, episodes)
    assert [t.trained_turns for t in kept] == [[True, False], [True, False]]
    assert metrics["filter/kept_turn_ratio"] == 0.5 and metrics["filter/kept_groups"] == 1
    assert episodes[0].trained_turns is None  # the rollout's own trajectories are left alone
    batch = trainer.advantage_phase(run, kept)
    a, b = gigpo_advantages([[1, 0], [0, 0]], [0, 0], [["s0", "s1"], ["s0", "s1"]])  # baselines over every turn
    assert (a[0], b[0]) == (1.0, -1.0)
    # e1's second row has no kept turn and is gone; masks shifted by one as in the Batch.
    torch.testing.assert_close(batch.mask, torch.tensor([[0, 1, 1, 0, 0, 0], [0, 1, 0, 0, 0, 0]], dtype=torch.float32))
    torch.testing.assert_close(batch.advantages, torch.tensor([[0, a[0], a[0], 0, 0, 0], [0, b[0], 0, 0, 0, 0]],
                                                              dtype=torch.float32))
    run.lock.release()


def test_a_short_run_trains_on_the_anchor_groups_it_keeps(policy_dir, tmp_path):
    """A random policy never answers in format: each Sokoban turn costs the format penalty and the state never
    changes, so every return is equal (the prompt level would skip the step) while each group's turns form one
    anchor group whose step returns vary with the turns left. top_k 0.5 keeps 2 of the 4 (tied: the first two)."""
    run_dir = tmp_path / "run"
    assert main([
        "train", "sokoban", f"model.path={policy_dir}", "model.device=cpu", f"trainer.run_dir={run_dir}",
        "rollout.num_groups=4", "rollout.group_size=2", "rollout.max_tokens_per_turn=8", "trainer.total_steps=1",
        "trainer.eval_every=0", "algo.mini_batch_size=8", "algo.micro_batch_size=4", "logging.tensorboard=false",
        "logging.progress=false", "algo.name=gigpo", "algo.gamma=0.95", "filter.level=anchor",
        "filter.strategy=top_k", "filter.value=0.5",
    ]) == 0
    (record,) = read_metrics(run_dir)
    assert record["rollout/frac_zero_variance"] == 1.0 and record["turns/anchor_groups"] == 4
    assert record["filter/kept_groups"] == 2 and record["filter/kept_turn_ratio"] == 0.5
    assert record["filter/skipped"] == 0 and np.isfinite(record["train/policy_loss"])
