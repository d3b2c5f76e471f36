"""RAGEN's options around the advantage estimator, each against a re-statement of RAGEN's (or verl's) code.

Reward normalisation, soft advantage reweighting, length weighting and REINFORCE++-baseline: a
hand-computed case each, 500 random cases against the reference, and their order in the trainer.
References: github.com/mll-lab-nu/RAGEN at 20daedc, and its verl submodule at d62da49.
"""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np
import pytest
import torch

from ragen2.agent.types import Trajectory
from ragen2.config import load_config
from ragen2.errors import ConfigError
from ragen2.rl.advantages import (
    grpo_advantages,
    length_weighted,
    normalize_returns,
    reinforce_pp_baseline_advantages,
    soft_reweight_weights,
)

CASES = 500

# ----------------------------------------------------------------------------- the references, restated


def reference_normalize(raw_rewards: list[float], group_tags: list, method: str) -> torch.Tensor:
    """ContextManager._normalize_episode_rewards (ragen/llm_agent/ctx_manager.py, lines 299-349), penalties 0.
    `_normalize_score_tensor` (lines 223-274, full-history mode) applies the same rule to the last-token scores."""
    if method == "mean_std":
        norm_func = lambda x: (x - x.mean()) / (x.std() + 1e-6) if x.std().abs() > 1e-6 else torch.zeros_like(x)  # noqa: E731
    elif method == "mean":
        norm_func = lambda x: (x - x.mean())  # noqa: E731
    elif method == "asym_clip":
        norm_func = lambda x: ((x - x.mean()) / (x.std() + 1e-6) if x.std().abs() > 1e-6 else torch.zeros_like(x)).clamp(min=-1, max=3)  # noqa: E731, E501
    else:
        norm_func = lambda x: x  # noqa: E731
    normalized = torch.tensor(raw_rewards, dtype=torch.float32) + torch.zeros(len(raw_rewards))
    group2index = defaultdict(list)
    for i, tag in enumerate(group_tags):
        group2index[tag].append(i)
    if len(group2index) < len(raw_rewards):
        for indices in group2index.values():
            indices_tensor = torch.tensor(indices)
            normalized[indices_tensor] = norm_func(normalized[indices_tensor])
    return normalized


def reference_grpo(scores: torch.Tensor, index: list, epsilon: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor]:
    """compute_grpo_outcome_advantage with return_group_std=True (ragen/trainer/core_algos.py, lines 26-91),
    one score per row (rewards summed), no episode_ids: (advantages [B], group_std [B])."""
    scores = scores.clone()
    id2score, id2mean, id2std = defaultdict(list), {}, {}
    for i in range(len(scores)):
        id2score[index[i]].append(scores[i])
    for idx, members in id2score.items():
        if len(members) == 1:
            id2mean[idx], id2std[idx] = torch.tensor(0.0), torch.tensor(1.0)
        else:
            id2mean[idx], id2std[idx] = torch.mean(torch.stack(members)), torch.std(torch.stack(members))
    for i in range(len(scores)):
        scores[i] = (scores[i] - id2mean[index[i]]) / (id2std[index[i]] + epsilon)
    group_std = torch.stack([id2std[index[i]] for i in range(len(scores))])
    return scores, group_std


def reference_soft_reweight(advantages: torch.Tensor, group_std: torch.Tensor, index: list) -> torch.Tensor:
    """RayAgentTrainer.fit's soft advantage reweighting (ragen/trainer/agent_trainer.py, lines 1376-1395)."""
    unique_idx, inverse = np.unique(np.array(index), return_inverse=True)
    prompt_std = torch.zeros(len(unique_idx))
    for i in range(len(unique_idx)):
        prompt_std[i] = group_std[inverse == i][0]
    prompt_weight = prompt_std / (prompt_std.max() + 1e-6)
    sample_weight = prompt_weight[torch.from_numpy(inverse)]
    return advantages * sample_weight.unsqueeze(-1)


def reference_length_weight(advantages: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """grpo_advantage_length_weight (ragen/trainer/agent_trainer.py, lines 1411-1416)."""
    response_relative_lengths = (torch.sum(response_mask, dim=-1) + 1e-6) / torch.sum(response_mask, dim=-1).float().mean()
    return advantages / response_relative_lengths.unsqueeze(-1)


def reference_rf_pp_baseline(token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: list) -> torch.Tensor:
    """verl's compute_reinforce_plus_plus_baseline_outcome_advantage (verl/trainer/ppo/core_algos.py, lines
    423-471 at d62da49), with masked_whiten (verl/utils/torch_functional.py, lines 171-223) written out."""
    response_length = token_level_rewards.shape[-1]
    scores = token_level_rewards.sum(dim=-1)
    id2score, id2mean = defaultdict(list), {}
    for i in range(len(scores)):
        id2score[index[i]].append(scores[i])
    for idx, members in id2score.items():
        id2mean[idx] = torch.tensor(0.0) if len(members) == 1 else torch.mean(torch.stack(members))
    for i in range(len(scores)):
        scores[i] = scores[i] - id2mean[index[i]]
    scores = scores.unsqueeze(-1).tile([1, response_length]) * response_mask
    mean = (scores * response_mask).sum() / (response_mask.sum() + 1e-8)
    variance = ((scores - mean) ** 2 * response_mask).sum() / (response_mask.sum() + 1e-8)
    variance = variance * response_mask.sum() / (response_mask.sum() - 1)
    return (scores - mean) * torch.rsqrt(variance + 1e-8) * response_mask


# ----------------------------------------------------------------------------- random cases


def random_returns(rng: np.random.Generator, min_group: int = 1) -> tuple[torch.Tensor, list[int]]:
    """1 to 6 groups of min_group to 5 episodes, shuffled; returns 0/1, shaped (halves), or continuous."""
    sizes = rng.integers(min_group, 6, size=int(rng.integers(1, 7)))
    groups = [g for g, size in enumerate(sizes) for _ in range(size)]
    kind = rng.integers(3)
    if kind == 0:
        values = rng.integers(0, 2, size=len(groups)).astype(float)
    elif kind == 1:
        values = rng.choice([-1.0, -0.5, 0.0, 0.5, 2.0], size=len(groups))
    else:
        values = rng.normal(0, 3, size=len(groups))
    order = rng.permutation(len(groups))
    return torch.tensor(values[order], dtype=torch.float32), [int(g) for g in np.array(groups)[order]]


def random_mask(rng: np.random.Generator, rows: int) -> torch.Tensor:
    """[rows, T]: each row a prompt, then 1 to 3 turns of model tokens separated by environment tokens, then padding."""
    masks = []
    for _ in range(rows):
        mask = [0] * int(rng.integers(0, 3))
        for _ in range(int(rng.integers(1, 4))):
            mask += [1] * int(rng.integers(1, 6)) + [0] * int(rng.integers(0, 3))
        masks.append(mask)
    width = max(len(m) for m in masks)
    return torch.tensor([m + [0] * (width - len(m)) for m in masks], dtype=torch.float32)


# ----------------------------------------------------------------------------- reward normalisation


def test_normalize_hand_computed():
    returns = torch.tensor([0.0, 1.0, 2.0, 3.0, 3.0, 5.0])
    groups = ["a", "a", "a", "b", "b", "c"]
    # a: mean 1, std 1; b: all equal; c: alone.
    torch.testing.assert_close(normalize_returns(returns, groups, "mean"), torch.tensor([-1.0, 0, 1, 0, 0, 0]))
    z = torch.tensor([-1.0, 0, 1]) / (1 + 1e-6)
    torch.testing.assert_close(normalize_returns(returns, groups, "mean_std"), torch.cat([z, torch.zeros(3)]))
    # One success among nine failures: z = 2.846 for it, -0.316 for the others; asym_clip keeps both.
    # One failure among nine successes: -2.846 is clipped to -1.
    rare = torch.tensor([1.0] + [0.0] * 9)
    std = math.sqrt(0.9 / 9)
    torch.testing.assert_close(normalize_returns(rare, [0] * 10, "asym_clip"), (rare - 0.1) / (std + 1e-6))
    torch.testing.assert_close(normalize_returns(1 - rare, [0] * 10, "asym_clip")[0], torch.tensor(-1.0))
    torch.testing.assert_close(normalize_returns(returns, groups, "identity"), returns)
    # Every episode its own group: unchanged, as in RAGEN.
    torch.testing.assert_close(normalize_returns(returns, list(range(6)), "mean_std"), returns)


@pytest.mark.filterwarnings("ignore:std\\(\\)")  # the reference takes the std of a lone episode (NaN)
@pytest.mark.parametrize("method", ["identity", "mean", "mean_std", "asym_clip"])
def test_normalize_agrees_with_ragen(method):
    rng = np.random.default_rng(1)
    for case in range(CASES):
        returns, groups = random_returns(rng)
        grouping = rng.choice(["state", "batch", "alone"])
        tags = {"state": groups, "batch": [1] * len(groups), "alone": list(range(len(groups)))}[grouping]
        torch.testing.assert_close(normalize_returns(returns, tags, method),
                                   reference_normalize(returns.tolist(), tags, method),
                                   rtol=1e-5, atol=1e-5, msg=f"case {case} ({grouping})")


def test_normalize_rejects_unknown_method():
    with pytest.raises(ValueError, match="method='z' is not allowed"):
        normalize_returns(torch.zeros(2), [0, 0], "z")


# ----------------------------------------------------------------------------- soft advantage reweighting


def test_soft_reweight_hand_computed():
    returns = torch.tensor([0.0, 2.0, 0.0, 1.0, 1.0, 1.0])
    groups = torch.tensor([0, 0, 1, 1, 2, 2])  # stds sqrt(2), sqrt(0.5), 0
    expected = torch.tensor([1.0, 1.0, 0.5, 0.5, 0.0, 0.0]) * math.sqrt(2) / (math.sqrt(2) + 1e-6)
    torch.testing.assert_close(soft_reweight_weights(returns, groups), expected)


def test_soft_reweight_agrees_with_ragen():
    """Groups of at least two: a lone episode is where ragen2 differs (std 0 here, GRPO's placeholder 1 there)."""
    rng = np.random.default_rng(2)
    for case in range(CASES):
        returns, groups = random_returns(rng, min_group=2)
        ids = torch.tensor(groups)
        ours = grpo_advantages(returns, ids) * soft_reweight_weights(returns, ids)
        advantages, group_std = reference_grpo(returns, groups)
        theirs = reference_soft_reweight(advantages[:, None], group_std, groups)[:, 0]
        torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-4, msg=f"case {case}")


def test_a_lone_episode_does_not_set_the_scale():
    returns, groups = torch.tensor([0.0, 1.0, 5.0]), torch.tensor([0, 0, 1])
    assert soft_reweight_weights(returns, groups).tolist() == pytest.approx([1.0, 1.0, 0.0], abs=1e-5)


# ----------------------------------------------------------------------------- length weighting


def test_length_weight_hand_computed():
    mask = torch.tensor([[1.0, 1, 0, 0], [1.0, 1, 1, 1]])  # lengths 2 and 4, mean 3
    advantages = torch.tensor([[1.0, 1, 0, 0], [1.0, 1, 1, 1]])
    expected = torch.tensor([[1.5, 1.5, 0, 0], [0.75, 0.75, 0.75, 0.75]])
    torch.testing.assert_close(length_weighted(advantages, mask), expected)


def test_length_weight_agrees_with_ragen():
    rng = np.random.default_rng(3)
    for case in range(CASES):
        mask = random_mask(rng, int(rng.integers(1, 9)))
        advantages = torch.tensor(rng.normal(size=mask.shape), dtype=torch.float32) * mask
        torch.testing.assert_close(length_weighted(advantages, mask), reference_length_weight(advantages, mask),
                                   msg=f"case {case}")


# ----------------------------------------------------------------------------- REINFORCE++-baseline


def test_reinforce_pp_baseline_hand_computed():
    # Group 0: returns 1, 3 (mean 2) -> -1, +1; group 1: 5, 5 -> 0, 0. Tokens: 2 + 1 + 1 + 2 = 6 valid.
    mask = torch.tensor([[1.0, 1], [0, 1], [1, 0], [1, 1]])
    out = reinforce_pp_baseline_advantages(torch.tensor([1.0, 3, 5, 5]), torch.tensor([0, 0, 1, 1]), mask)
    values = torch.tensor([-1.0, -1, 1, 0, 0, 0])  # mean -1/6
    std = math.sqrt(((values + 1 / 6) ** 2).sum().item() / 5 + 1e-8)
    torch.testing.assert_close(out[mask > 0], (values + 1 / 6) / std)
    assert out[mask == 0].abs().sum() == 0


def test_reinforce_pp_baseline_agrees_with_verl():
    rng = np.random.default_rng(4)
    for case in range(CASES):
        returns, groups = random_returns(rng, min_group=2)
        mask = random_mask(rng, len(groups))
        rewards = torch.zeros(mask.shape)
        rewards[torch.arange(len(groups)), 0] = returns  # verl sums each row's rewards into its score
        ours = reinforce_pp_baseline_advantages(returns, torch.tensor(groups), mask)
        theirs = reference_rf_pp_baseline(rewards, mask, groups)
        torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-4, msg=f"case {case}")


def test_reinforce_pp_baseline_spreads_a_trajectory_over_its_rows():
    """One row per turn: a trajectory counts once in its group's mean, and each of its rows gets its advantage."""
    mask = torch.tensor([[1.0, 1], [1, 0], [1, 1]])  # rows 0 and 1: trajectory 0 (return 0); row 2: trajectory 1 (1)
    out = reinforce_pp_baseline_advantages(torch.tensor([0.0, 1]), torch.tensor([0, 0]), mask, torch.tensor([0, 0, 1]))
    values = torch.tensor([-0.5, -0.5, -0.5, 0.5, 0.5])  # the group mean is 0.5, not the rows' 1/3
    centered = values - values.mean()
    torch.testing.assert_close(out[mask > 0], centered / torch.sqrt(centered.pow(2).sum() / 4 + 1e-8))


# ----------------------------------------------------------------------------- the trainer: keys, order, refusals


def test_the_trainer_applies_the_options_in_ragens_order(policy_dir, tmp_path):
    """Normalise returns (batch-wide mean_std), GRPO, soft reweight, length weight: RAGEN's pipeline, restated."""
    from ragen2.rl import advantage_stage
    from ragen2.rl.run import setup

    lengths = [3, 5, 2, 4, 6, 3]  # model tokens per episode
    raw = [1.0, 0.0, 2.0, 2.0, 0.5, 3.0]
    groups = [0, 0, 1, 1, 2, 2]
    episodes = [Trajectory("bandit", g, g, [], [([1] * (n + 2), [0, 0] + [1] * n)], episode_return=r)
                for g, n, r in zip(groups, lengths, raw)]
    config = load_config("bandit", [
        f"model.path={policy_dir}", "model.device=cpu", f"trainer.run_dir={tmp_path}", "logging.tensorboard=false",
        "algo.reward_norm_method=mean_std", "algo.reward_norm_grouping=batch", "algo.soft_advantage_reweight=true",
        "algo.grpo_advantage_length_weight=true", "algo.task_advantage_scale=0.5",
    ])
    run = setup(config)
    batch = advantage_stage.advantage_phase(run, episodes)
    normalised = reference_normalize(raw, [1] * 6, "mean_std")
    advantages, group_std = reference_grpo(normalised, groups)
    expected = reference_soft_reweight(advantages[:, None] * batch.mask, group_std, groups)
    expected = 0.5 * reference_length_weight(expected, batch.mask)
    torch.testing.assert_close(batch.advantages, expected, rtol=1e-5, atol=1e-6)
    run.lock.release()


@pytest.mark.parametrize(("overrides", "message"), [
    (["algo.reward_norm_method=mean", "algo.name=gigpo"], "algo.reward_norm_method=mean normalises episode returns"),
    (["algo.reward_norm_method=mean_std", "algo.name=ppo", "algo.turn_rewards=true"], "algo.turn_rewards=true trains"),
    (["algo.soft_advantage_reweight=true", "algo.name=rloo"], "algo.soft_advantage_reweight=true applies to GRPO"),
    (["algo.grpo_advantage_length_weight=true", "algo.name=ppo"], "algo.grpo_advantage_length_weight=true applies"),
    (["algo.name=reinforce_pp_baseline", "rollout.group_size=1"], "needs rollout.group_size >= 2"),
    (["algo.reward_norm_method=zscore"], "reward_norm_method"),
])
def test_bad_combinations_are_refused(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config("bandit", overrides)


def test_defaults_leave_the_returns_alone():
    a = load_config("bandit", []).algo
    assert (a.reward_norm_grouping, a.reward_norm_method) == ("state", "identity")
    assert not a.soft_advantage_reweight and not a.grpo_advantage_length_weight
