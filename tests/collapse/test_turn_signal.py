"""Reward signal per turn index and per anchor state: a hand-computed batch, and the trainer logs it."""

from __future__ import annotations

import pytest

from ragen2.agent.types import Trajectory, Turn
from ragen2.rl.turn_signal import turn_signal_metrics


def _turn(reward: float, observation: str) -> Turn:
    return Turn(prompt_ids=[], response_ids=[], response_text="", reasoning="", reasoning_span=(0, 0), actions=[],
                format_valid=True, actions_valid=True, reward=reward, observation=observation)


def test_hand_computed_batch():
    # Group 0: A sees s0, s1 (rewards 0, 1); B sees s0, s2, s3 (0, 0, 0.5). Group 1: one episode.
    a = Trajectory("x", 0, 0, [_turn(0, "s0"), _turn(1, "s1")])
    b = Trajectory("x", 0, 0, [_turn(0, "s0"), _turn(0, "s2"), _turn(0.5, "s3")])
    c = Trajectory("x", 1, 1, [_turn(1, "s0")])
    metrics = turn_signal_metrics([a, b, c], gamma=0.5)
    # Turn 1: rewards [0, 0] in group 0 (group 1 has one episode): no signal. Turn 2: [1, 0]: variance 0.25.
    # Turn 3: only B reached it. Anchor s0 of group 0: returns 0 + 0.5 * 1 = 0.5 and 0.5 * 0.5 * 0.5 = 0.125.
    assert metrics == pytest.approx({
        "turns/reward_var_1": 0.0, "turns/signal_frac_1": 0.0,
        "turns/reward_var_2": 0.25, "turns/signal_frac_2": 1.0,
        "turns/anchor_groups": 1.0, "turns/anchor_size_mean": 2.0,
        "turns/anchor_return_var_mean": (0.5 - 0.125) ** 2 / 4, "turns/anchor_signal_frac": 1.0,
    })


def test_late_turns_are_pooled_and_no_shared_state_means_no_anchor_statistics():
    episodes = [Trajectory("x", 0, 0, [_turn(float(i * k), f"s{i}-{k}") for k in range(7)]) for i in range(2)]
    metrics = turn_signal_metrics(episodes)
    assert {k for k in metrics if k.startswith("turns/reward_var")} == {f"turns/reward_var_{k}" for k in
                                                                         ("1", "2", "3", "4", "5+")}
    assert metrics["turns/reward_var_5+"] == pytest.approx((16 / 4 + 25 / 4 + 36 / 4) / 3)  # [0, k] at turns 5, 6, 7
    assert metrics["turns/anchor_groups"] == 0 and "turns/anchor_size_mean" not in metrics


def test_the_trainer_logs_turn_signal_every_step(save_random_policy, tmp_path):
    from ragen2.config import load_config
    from ragen2.rl.trainer import train
    from ragen2.tracking import read_metrics

    policy_dir = tmp_path / "policy"
    save_random_policy(policy_dir)
    train(load_config("bandit", [f"model.path={policy_dir}", "model.device=cpu", f"trainer.run_dir={tmp_path / 'run'}",
                                 "rollout.num_groups=2", "rollout.group_size=2", "rollout.max_tokens_per_turn=8",
                                 "trainer.total_steps=2", "trainer.eval_every=0", "filter.strategy=none",
                                 "filter.include_zero=true", "logging.tensorboard=false", "logging.progress=false"]))
    steps = [r for r in read_metrics(tmp_path / "run") if r["step"] > 0]
    assert len(steps) == 2 and all("turns/reward_var_1" in r and "turns/anchor_groups" in r for r in steps)
