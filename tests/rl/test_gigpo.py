"""GiGPO's advantages: hand-computed cases, agreement with verl-agent's code on random cases, and the
spreading of per-turn values over each turn's tokens."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pytest
import torch

from ragen2.rl.advantages import turn_values_to_tokens
from ragen2.rl.gigpo import gigpo_advantages


def test_hand_computed_case():
    # Group 0: episode A sees s0 then s1 (rewards 0, 1); episode B sees s0 then s2 (rewards 0, 0).
    # Returns A = 1, B = 0; rows per group = 4 (two per episode): mean 0.5.
    # Step returns (gamma 0.5): A: [0.5, 1], B: [0, 0]. Anchor s0 is shared: mean 0.25 -> A +0.25, B -0.25;
    # s1 and s2 are alone -> 0.
    a, b = gigpo_advantages([[0, 1], [0, 0]], [0, 0], [["s0", "s1"], ["s0", "s2"]], gamma=0.5)
    np.testing.assert_allclose(a, [0.5 + 0.25, 0.5 + 0.0])
    np.testing.assert_allclose(b, [-0.5 - 0.25, -0.5 + 0.0])


def test_episode_statistics_over_steps_or_episodes_and_std_scaling():
    # A: 3 turns, return 3; B: 1 turn, return 0. Over step rows: mean of [3, 3, 3, 0] = 2.25;
    # over episodes: mean of [3, 0] = 1.5. Anchors all distinct: no step term.
    rewards, groups, anchors = [[1, 1, 1], [0]], ["g", "g"], [["x", "y", "z"], ["w"]]
    steps = gigpo_advantages(rewards, groups, anchors)
    np.testing.assert_allclose(steps[0], [0.75] * 3)
    np.testing.assert_allclose(steps[1], [-2.25])
    episodes = gigpo_advantages(rewards, groups, anchors, episode_stats="episodes")
    np.testing.assert_allclose(episodes[0], [1.5] * 3)
    scaled = gigpo_advantages(rewards, groups, anchors, mode="mean_std_norm", episode_stats="episodes")
    np.testing.assert_allclose(scaled[0], [1.5 / (np.std([3, 0], ddof=1) + 1e-6)] * 3)


def test_a_group_of_one_row_keeps_its_return_and_the_step_weight_scales_the_step_term():
    (only,) = gigpo_advantages([[2.0]], [7], [["s"]])
    assert only.tolist() == [2.0]  # mean 0 and std 1 for a lone row, as verl-agent does
    plain = gigpo_advantages([[0, 1], [0, 0]], [0, 0], [["s0", "s1"], ["s0", "s2"]], step_weight=0.0)
    np.testing.assert_allclose(plain[0], [0.5, 0.5])


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="episode 0 has 2 step rewards but 1 anchors"):
        gigpo_advantages([[0, 1]], [0], [["s"]])
    with pytest.raises(ValueError, match="mode='std'"):
        gigpo_advantages([[0]], [0], [["s"]], mode="std")


# ----------------------------------------------------------------------------- against verl-agent


def reference_gigpo(step_rewards, group_ids, anchors, gamma, step_weight, mode):
    """verl-agent's GiGPO restated on step rows (one row per turn), in float32 as it computes.

    From gigpo/core_gigpo.py of github.com/langfengQ/verl-agent as mirrored at vanzll/verl-agent
    d0b97244c50f17fb43a6ef0a15bca0e95a044ff7: compute_step_discounted_returns (lines 87-132),
    compute_gigpo_outcome_advantage (138-171), episode_norm_reward (174-240, with its default
    compute_mean_std_cross_steps=True), build_step_group (243-331, exact matching) and
    step_norm_reward (334-384). The episode score of a row is the episode's total reward, which
    agent_system/reward_manager/episode.py (lines 72-79) places on every step row.
    """
    rows = [(g, e, t) for e, g in enumerate(group_ids) for t in range(len(step_rewards[e]))]
    epsilon, remove_std = 1e-6, mode == "mean_norm"
    # compute_step_discounted_returns
    step_returns = {}
    for e, rewards in enumerate(step_rewards):
        running = 0
        for t in reversed(range(len(rewards))):
            running = np.float32(rewards[t]) + gamma * running
            step_returns[e, t] = running
    # episode_norm_reward
    scores = torch.tensor([float(np.float32(sum(np.float32(r) for r in step_rewards[e]))) for _, e, _ in rows])
    id2score = defaultdict(list)
    for i, (g, _, _) in enumerate(rows):
        id2score[g].append(scores[i])
    id2mean, id2std = {}, {}
    for idx, values in id2score.items():
        if len(values) == 1:
            id2mean[idx], id2std[idx] = torch.tensor(0.0), torch.tensor(1.0)
        else:
            id2mean[idx], id2std[idx] = torch.mean(torch.tensor(values)), torch.std(torch.tensor([values]))
    episode = scores.clone()
    for i, (g, _, _) in enumerate(rows):
        episode[i] = scores[i] - id2mean[g] if remove_std else (scores[i] - id2mean[g]) / (id2std[g] + epsilon)
    # build_step_group + step_norm_reward
    step_scores = torch.tensor([float(step_returns[e, t]) for _, e, t in rows])
    clusters = defaultdict(list)
    for i, (g, e, t) in enumerate(rows):
        clusters[g, anchors[e][t]].append(step_scores[i])
    step = step_scores.clone()
    for i, (g, e, t) in enumerate(rows):
        values = clusters[g, anchors[e][t]]
        mean = torch.mean(torch.tensor(values))
        std = torch.tensor(1.0) if len(values) == 1 else torch.std(torch.tensor([values]))
        step[i] = step_scores[i] - mean if remove_std else (step_scores[i] - mean) / (std + epsilon)
    joint = episode + step_weight * step
    out = [np.zeros(len(r)) for r in step_rewards]
    for i, (_, e, t) in enumerate(rows):
        out[e][t] = joint[i].item()
    return out


@pytest.mark.parametrize("mode", ["mean_norm", "mean_std_norm"])
def test_agrees_with_verl_agent_on_random_cases(mode):
    rng = np.random.default_rng(0)
    for case in range(500):
        episodes = int(rng.integers(1, 9))
        groups = rng.integers(0, 3, size=episodes).tolist()
        lengths = rng.integers(1, 5, size=episodes)
        # Binary fractions, so that a group whose values are all equal has a mean equal to them in float32 too:
        # its std is then 0 in both, where float32 rounding divided by epsilon would differ wildly.
        rewards = [rng.choice([0.0, 0.0, 1.0, -0.25, 0.5], size=n).tolist() for n in lengths]
        anchors = [[f"s{int(a)}" for a in rng.integers(0, 3, size=n)] for n in lengths]  # shared states are common
        gamma, weight = float(rng.choice([1.0, 0.75, 0.5])), float(rng.choice([1.0, 0.5]))
        ours = gigpo_advantages(rewards, groups, anchors, gamma=gamma, step_weight=weight, mode=mode)
        theirs = reference_gigpo(rewards, groups, anchors, gamma, weight, mode)
        for e, (a, b) in enumerate(zip(ours, theirs)):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4, err_msg=f"case {case}, episode {e}")


# ----------------------------------------------------------------------------- onto tokens


def test_turn_values_land_on_their_turns_tokens():
    # Row 0: trajectory 0 in one row, two turns (runs at 1-2 and 4). Rows 1 and 2: trajectory 1,
    # one row per turn.
    mask = torch.tensor([[0, 1, 1, 0, 1, 0], [0, 0, 1, 1, 0, 0], [0, 1, 0, 0, 0, 0]], dtype=torch.float32)
    out = turn_values_to_tokens([[10.0, 20.0], [-1.0, -2.0]], torch.tensor([0, 1, 1]), mask)
    assert out.tolist() == [[0, 10, 10, 0, 20, 0], [0, 0, -1, -1, 0, 0], [0, -2, 0, 0, 0, 0]]


def test_turn_values_must_match_the_turns():
    mask = torch.tensor([[0, 1, 0, 1]], dtype=torch.float32)
    with pytest.raises(ValueError, match="trajectory 0 has 2 runs of model tokens but 1 turn values"):
        turn_values_to_tokens([[1.0]], torch.tensor([0]), mask)


def test_the_trainer_puts_each_turns_gigpo_advantage_on_that_turns_tokens(policy_dir, tmp_path):
    from ragen2.agent.types import Trajectory, Turn
    from ragen2.config import load_config
    from ragen2.rl import trainer

    def turn(reward: float, observation: str) -> Turn:
        return Turn(prompt_ids=[], response_ids=[], response_text="", reasoning="", reasoning_span=(0, 0),
                    actions=[], format_valid=True, actions_valid=True, reward=reward, observation=observation)

    # Episode 0 in one row (two turns: tokens 2-3 and 5), episode 1 one row per turn; one group.
    one_row = [([1, 1, 5, 6, 1, 7, 1], [0, 0, 1, 1, 0, 1, 0])]
    row_per_turn = [([1, 1, 5], [0, 0, 1]), ([1, 6, 7], [0, 1, 1])]
    episodes = [
        Trajectory("frozenlake", 0, 0, [turn(0.0, "s0"), turn(1.0, "s1")], one_row, episode_return=1.0),
        Trajectory("frozenlake", 0, 0, [turn(0.0, "s0"), turn(0.0, "s2")], row_per_turn, episode_return=0.0),
    ]
    config = load_config("bandit", [f"model.path={policy_dir}", "model.device=cpu", f"trainer.run_dir={tmp_path}",
                                    "algo.name=gigpo", "algo.gamma=0.5", "algo.gigpo_mode=mean_norm",
                                    "logging.tensorboard=false"])
    run = trainer.setup(config)
    batch = trainer.advantage_phase(run, episodes)
    a, b = gigpo_advantages([[0, 1], [0, 0]], [0, 0], [["s0", "s1"], ["s0", "s2"]], gamma=0.5)  # the hand case above
    expected = [[0, a[0], a[0], 0, a[1], 0], [0, b[0], 0, 0, 0, 0], [b[1], b[1], 0, 0, 0, 0]]  # mask shifted by one
    torch.testing.assert_close(batch.advantages, torch.tensor(expected, dtype=torch.float32))
    run.lock.release()
