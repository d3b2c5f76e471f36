"""The filter's top_k_abs strategy and entropy_variance / entropy_std metrics, against RAGEN's rollout filter.

Reference: ragen/trainer/rollout_filter.py at github.com/mll-lab-nu/RAGEN 20daedc, restated below.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ragen2.config import load_config
from ragen2.errors import ConfigError
from ragen2.filtering import FilterRule, group_scores, select_groups

CASES = 500


def reference_select(scores: torch.Tensor, strategy: str, value: float, filter_type: str, include_zero: bool) -> list[int]:
    """RolloutFilter._select_top_groups (lines 68-80) with its top_k_abs branch (lines 152-164)."""
    assert strategy == "top_k_abs"
    scores = scores.float()
    indices = torch.arange(len(scores))
    if not include_zero:
        non_zero_mask = torch.abs(scores) > 1e-10
        scores, indices = scores[non_zero_mask], indices[non_zero_mask]
        if indices.numel() == 0:
            return []
    k = max(min(int(value), indices.numel()), 1)
    local = (-scores).topk(k).indices if filter_type == "smallest" else scores.topk(k).indices
    return sorted(indices[local].tolist())


def reference_entropy_scores(entropys: torch.Tensor, loss_mask: torch.Tensor, num_groups: int, metric: str) -> torch.Tensor:
    """EntropyRolloutFilter.filter's selection scores (lines 663-720, one row per episode): each episode's masked
    mean token entropy, then per group the mean (entropy) or the std (entropy_variance, also called entropy_std)."""
    token_counts = loss_mask.sum(dim=-1).clamp(min=1)
    entropy_per_traj = (entropys * loss_mask).sum(dim=-1) / token_counts
    entropy_per_group = entropy_per_traj.view(num_groups, -1)
    return entropy_per_group.mean(dim=-1) if metric == "entropy" else entropy_per_group.std(dim=-1)


def per_episode_entropy(entropys: torch.Tensor, loss_mask: torch.Tensor) -> np.ndarray:
    """What the trainer's _measured_scores passes: each episode's mean token entropy, [P * G]."""
    return ((entropys * loss_mask).sum(-1) / loss_mask.sum(-1).clamp(min=1)).double().numpy()


def same_selection(ours: np.ndarray, theirs: list[int], scores: np.ndarray) -> bool:
    """Equal groups, or, where scores tie at the cut (torch.topk breaks ties its own way), equal kept scores."""
    return list(ours) == theirs or sorted(scores[ours]) == pytest.approx(sorted(scores[theirs]), rel=1e-6)


# ----------------------------------------------------------------------------- top_k_abs


def test_top_k_abs_hand_computed():
    rewards = np.array([[0, 1, 0, 1], [1, 1, 1, 1], [0, 0, 0, 3], [0, 0, 1, 1], [2, 2, 2, 0]], float)
    # reward std: 0.577, 0, 1.5, 0.577, 1.0
    assert select_groups(rewards, FilterRule("top_k_abs", 2, "reward_std")).tolist() == [2, 4]
    assert select_groups(rewards, FilterRule("top_k_abs", 3, "reward_std")).tolist() == [0, 2, 4]  # the tie keeps group 0
    assert select_groups(rewards, FilterRule("top_k_abs", 2, "reward_std", order="smallest")).tolist() == [0, 1]
    assert select_groups(rewards, FilterRule("top_k_abs", 9, "reward_std", include_zero=False)).tolist() == [0, 2, 3, 4]


@pytest.mark.parametrize("include_zero", [True, False])
@pytest.mark.parametrize("order", ["largest", "smallest"])
def test_top_k_abs_agrees_with_ragen(include_zero, order):
    rng = np.random.default_rng(5)
    for case in range(CASES):
        num_groups, group_size = int(rng.integers(1, 9)), int(rng.integers(2, 6))
        rewards = rng.choice([0.0, 1.0, 0.5, -1.0], size=(num_groups, group_size))
        if rng.random() < 0.5:
            rewards = rewards + rng.normal(0, 0.3, size=(num_groups, 1)) * (rng.random((num_groups, group_size)) < 0.5)
        value = float(rng.choice([rng.integers(1, num_groups + 3), rng.uniform(0.1, num_groups + 2)]))
        ours = select_groups(rewards, FilterRule("top_k_abs", value, "reward_std", include_zero=include_zero, order=order))
        std = torch.tensor(rewards).std(dim=-1)  # RewardRolloutFilter's score (lines 428-433)
        theirs = reference_select(std, "top_k_abs", value, order, include_zero)
        assert same_selection(ours, theirs, std.numpy()), f"case {case}: {ours} vs {theirs}"


@pytest.mark.parametrize("value", [0, -1, True])
def test_top_k_abs_needs_a_positive_count(value):
    with pytest.raises(ConfigError, match="top_k_abs"):
        select_groups(np.array([[0.0, 1.0]]), FilterRule("top_k_abs", value))


# ----------------------------------------------------------------------------- entropy_variance / entropy_std


def test_entropy_spread_hand_computed():
    rewards = np.zeros((2, 3))
    entropies = np.array([[1.0, 2.0, 3.0], [0.5, 0.5, 0.8]])
    np.testing.assert_allclose(group_scores(rewards, "entropy_variance", scores=entropies), [1.0, 0.03])
    np.testing.assert_allclose(group_scores(rewards, "entropy_std", scores=entropies), [1.0, np.sqrt(0.03)])
    np.testing.assert_allclose(group_scores(rewards, "entropy_variance", ddof=0, scores=entropies), [2 / 3, 0.02])


@pytest.mark.parametrize("metric", ["entropy", "entropy_std", "entropy_variance"])
def test_entropy_metrics_agree_with_ragen(metric):
    rng = np.random.default_rng(6)
    for case in range(CASES):
        num_groups, group_size, length = int(rng.integers(1, 7)), int(rng.integers(2, 6)), int(rng.integers(1, 9))
        entropys = torch.tensor(rng.uniform(0, 3, size=(num_groups * group_size, length)), dtype=torch.float32)
        loss_mask = torch.tensor(rng.random((num_groups * group_size, length)) < 0.7, dtype=torch.float32)
        scores = per_episode_entropy(entropys, loss_mask).reshape(num_groups, group_size)
        ours = group_scores(np.zeros((num_groups, group_size)), metric, scores=scores)
        theirs = reference_entropy_scores(entropys, loss_mask, num_groups, metric).double().numpy()
        if metric == "entropy_variance":
            theirs = theirs**2  # ragen2's entropy_variance is the variance; RAGEN's, under that name, the std
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6, err_msg=f"case {case}")
        value = int(rng.integers(1, num_groups + 2))
        kept = select_groups(np.zeros((num_groups, group_size)), FilterRule("top_k_abs", value, metric), scores=scores)
        assert same_selection(kept, reference_select(torch.tensor(theirs), "top_k_abs", value, "largest", True), theirs)


def test_entropy_spread_needs_per_episode_scores():
    with pytest.raises(ConfigError, match=r"expected \(2, 3\) to match rewards"):
        group_scores(np.zeros((2, 3)), "entropy_std", scores=np.ones(2))


# ----------------------------------------------------------------------------- config


def test_config_keys_and_refusals():
    f = load_config("bandit", ["filter.strategy=top_k_abs", "filter.value=3", "filter.metric=entropy_variance"]).filter
    assert (f.strategy, f.value, f.metric) == ("top_k_abs", 3, "entropy_variance")
    with pytest.raises(ConfigError, match="filter.value=0.5 is not allowed with filter.strategy=top_k_abs"):
        load_config("bandit", ["filter.strategy=top_k_abs", "filter.value=0.5"])
    with pytest.raises(ConfigError, match="filter.metric=entropy_std needs rollout.group_size >= 2"):
        load_config("bandit", ["filter.metric=entropy_std", "rollout.group_size=1", "algo.name=reinforce_pp"])
