"""Advantage estimators: worked examples, loop references, and the identities they must satisfy."""

from __future__ import annotations

import math
import random
import statistics
from collections import defaultdict

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from helpers import PROPERTY_SETTINGS, t64
from ragen2.rl.advantages import (
    broadcast_to_tokens,
    drgrpo_advantages,
    gae_advantages,
    grpo_advantages,
    place_terminal_reward,
    reinforce_pp_advantages,
    rloo_advantages,
)


# --- slow references: one Python loop per definition ------------------------------------------

Rows = list[list[float]]


def grpo_reference(
    returns: list[float], groups: list[int], scale_by_std: bool, eps: float
) -> list[float]:
    members: dict[int, list[float]] = defaultdict(list)
    for r, g in zip(returns, groups):
        members[g].append(r)
    out = []
    for r, g in zip(returns, groups):
        peers = members[g]
        if len(peers) == 1:
            out.append(0.0)
        elif scale_by_std:
            out.append((r - statistics.fmean(peers)) / (statistics.stdev(peers) + eps))
        else:
            out.append(r - statistics.fmean(peers))
    return out


def rloo_reference(returns: list[float], groups: list[int]) -> list[float]:
    out = []
    for i, (r, g) in enumerate(zip(returns, groups)):
        others = [returns[j] for j in range(len(returns)) if groups[j] == g and j != i]
        out.append(r - statistics.fmean(others) if others else 0.0)
    return out


def whiten_reference(rows: Rows, mask: list[list[int]]) -> Rows:
    flat = [x for row, m in zip(rows, mask) for x, keep in zip(row, m) if keep]
    mean = statistics.fmean(flat)
    var = statistics.variance(flat) if len(flat) > 1 else 0.0
    return [
        [(x - mean) / math.sqrt(var + 1e-8) if keep else 0.0 for x, keep in zip(row, m)]
        for row, m in zip(rows, mask)
    ]


def gae_reference(
    rewards: Rows, values: Rows, mask: list[list[int]], gamma: float, lam: float
) -> tuple[Rows, Rows]:
    """Textbook GAE on each row's model tokens, taken out of the sequence and put back."""
    advantages, returns = [], []
    for r_row, v_row, m_row in zip(rewards, values, mask):
        steps = [t for t, keep in enumerate(m_row) if keep]
        adv_row, ret_row = [0.0] * len(m_row), [0.0] * len(m_row)
        running = 0.0
        for k in reversed(range(len(steps))):
            t = steps[k]
            next_value = v_row[steps[k + 1]] if k + 1 < len(steps) else 0.0
            delta = r_row[t] + gamma * next_value - v_row[t]
            running = delta + gamma * lam * running
            adv_row[t] = running
            ret_row[t] = running + v_row[t]
        advantages.append(adv_row)
        returns.append(ret_row)
    return advantages, returns


def return_to_go_reference(rewards: Rows, mask: list[list[int]], gamma: float) -> Rows:
    out = []
    for r_row, m_row in zip(rewards, mask):
        row = [0.0] * len(m_row)
        running = 0.0
        for t in reversed(range(len(m_row))):
            if m_row[t]:
                running = r_row[t] + gamma * running
                row[t] = running
        out.append(row)
    return out


# --- strategies -----------------------------------------------------------------------------------

finite = st.floats(-5.0, 5.0, allow_nan=False, allow_infinity=False)


@st.composite
def grouped_returns(draw: st.DrawFn) -> tuple[list[float], list[int]]:
    """Groups of different sizes (singletons included), arbitrary ids, shuffled order."""
    sizes = draw(st.lists(st.integers(1, 5), min_size=1, max_size=5))
    ids = draw(st.lists(st.integers(-50, 50), min_size=len(sizes), max_size=len(sizes), unique=True))
    groups = [g for g, n in zip(ids, sizes) for _ in range(n)]
    groups = draw(st.permutations(groups))
    returns = draw(st.lists(finite, min_size=len(groups), max_size=len(groups)))
    return returns, list(groups)


@st.composite
def token_batch(draw: st.DrawFn) -> tuple[Rows, Rows, list[list[int]]]:
    """Rewards, values and a mask with interleaved model / env tokens, at least one model token."""
    batch = draw(st.integers(1, 4))
    length = draw(st.integers(1, 9))
    cells = batch * length
    rewards = draw(st.lists(finite, min_size=cells, max_size=cells))
    values = draw(st.lists(finite, min_size=cells, max_size=cells))
    mask = draw(st.lists(st.integers(0, 1), min_size=cells, max_size=cells).filter(any))

    def rows(flat: list) -> list[list]:
        return [flat[i * length : (i + 1) * length] for i in range(batch)]

    return rows(rewards), rows(values), rows(mask)


# --- GRPO / Dr.GRPO / RLOO ------------------------------------------------------------------------


def test_grpo_known_answer_with_unordered_ids_and_unequal_groups() -> None:
    returns = t64([1.0, 0.0, 2.0, 4.0, 3.0])
    groups = torch.tensor([7, 3, 7, 3, 7])
    # group 7: mean 2, unbiased std 1; group 3: mean 2, unbiased std sqrt(8)
    expected = t64([-1.0, -2.0 / math.sqrt(8), 0.0, 2.0 / math.sqrt(8), 1.0])
    torch.testing.assert_close(grpo_advantages(returns, groups, eps=0.0), expected)
    std = t64([1.0, math.sqrt(8), 1.0, math.sqrt(8), 1.0])
    torch.testing.assert_close(grpo_advantages(returns, groups), expected * std / (std + 1e-6))


def test_drgrpo_known_answer() -> None:
    returns = t64([1.0, 0.0, 2.0, 4.0, 3.0])
    groups = torch.tensor([7, 3, 7, 3, 7])
    expected = t64([-1.0, -2.0, 0.0, 2.0, 1.0])
    torch.testing.assert_close(drgrpo_advantages(returns, groups), expected)
    torch.testing.assert_close(grpo_advantages(returns, groups, scale_by_std=False), expected)


def test_rloo_known_answer() -> None:
    returns = t64([1.0, 0.0, 2.0, 4.0, 3.0])
    groups = torch.tensor([7, 3, 7, 3, 7])
    # 1 - mean(2, 3), 0 - 4, 2 - mean(1, 3), 4 - 0, 3 - mean(1, 2)
    expected = t64([-1.5, -4.0, 0.0, 4.0, 1.5])
    torch.testing.assert_close(rloo_advantages(returns, groups), expected)


def test_singleton_and_constant_groups_get_zero() -> None:
    returns = t64([5.0, 2.0, 2.0, 2.0])
    groups = torch.tensor([0, 1, 1, 1])
    for fn in (grpo_advantages, drgrpo_advantages, rloo_advantages):
        torch.testing.assert_close(fn(returns, groups), torch.zeros(4, dtype=torch.float64))


def test_grpo_rejects_mismatched_shapes() -> None:
    with pytest.raises(ValueError, match=r"returns \[B\] and group_ids \[B\]"):
        grpo_advantages(torch.zeros(3), torch.zeros(4, dtype=torch.long))


@PROPERTY_SETTINGS
@given(grouped_returns(), st.booleans())
def test_grpo_matches_loop_reference(case: tuple[list[float], list[int]], scale_by_std: bool) -> None:
    returns, groups = case
    got = grpo_advantages(t64(returns), torch.tensor(groups), scale_by_std=scale_by_std)
    expected = t64(grpo_reference(returns, groups, scale_by_std, 1e-6))
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-6)


@PROPERTY_SETTINGS
@given(grouped_returns())
def test_rloo_matches_loop_reference(case: tuple[list[float], list[int]]) -> None:
    returns, groups = case
    got = rloo_advantages(t64(returns), torch.tensor(groups))
    torch.testing.assert_close(got, t64(rloo_reference(returns, groups)), atol=1e-9, rtol=1e-9)


@PROPERTY_SETTINGS
@given(grouped_returns())
def test_group_advantages_sum_to_zero_within_each_group(case: tuple[list[float], list[int]]) -> None:
    returns, groups = case
    ids = torch.tensor(groups)
    for fn in (grpo_advantages, drgrpo_advantages, rloo_advantages):
        adv = fn(t64(returns), ids)
        for g in set(groups):
            assert abs(float(adv[ids == g].sum())) < 1e-6


@PROPERTY_SETTINGS
@given(grouped_returns())
def test_rloo_is_rescaled_mean_baseline(case: tuple[list[float], list[int]]) -> None:
    """Leave-one-out equals G / (G - 1) times the mean-baseline advantage (Kool et al. 2019)."""
    returns, groups = case
    ids = torch.tensor(groups)
    sizes = t64([groups.count(g) for g in groups])
    scale = torch.where(sizes > 1, sizes / (sizes - 1).clamp_min(1), 0.0)
    expected = scale * drgrpo_advantages(t64(returns), ids)
    torch.testing.assert_close(rloo_advantages(t64(returns), ids), expected, atol=1e-9, rtol=1e-9)


@PROPERTY_SETTINGS
@given(grouped_returns(), finite, st.randoms(use_true_random=False))
def test_group_advantages_ignore_shift_and_batch_order(
    case: tuple[list[float], list[int]], shift: float, rng: random.Random
) -> None:
    returns, groups = case
    order = list(range(len(groups)))
    rng.shuffle(order)
    perm = torch.tensor(order)
    for fn in (grpo_advantages, drgrpo_advantages, rloo_advantages):
        base = fn(t64(returns), torch.tensor(groups))
        shifted = fn(t64(returns) + shift, torch.tensor(groups))
        permuted = fn(t64(returns)[perm], torch.tensor(groups)[perm])
        torch.testing.assert_close(shifted, base, atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(permuted, base[perm])


# --- token layout helpers ------------------------------------------------------------------------


def test_place_terminal_reward_uses_last_model_token() -> None:
    mask = t64([[0, 1, 1, 0, 1, 1, 0], [1, 1, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0, 0]])
    got = place_terminal_reward(t64([2.0, -1.0, 5.0]), mask)
    expected = t64([[0, 0, 0, 0, 0, 2, 0], [0, -1, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0, 0]])
    torch.testing.assert_close(got, expected)


def test_broadcast_to_tokens() -> None:
    mask = t64([[0, 1, 1, 0], [1, 0, 0, 0]])
    expected = t64([[0, 0.5, 0.5, 0], [-2, 0, 0, 0]])
    torch.testing.assert_close(broadcast_to_tokens(t64([0.5, -2.0]), mask), expected)


def test_broadcast_rejects_token_level_input() -> None:
    with pytest.raises(ValueError, match=r"advantages \[B\]"):
        broadcast_to_tokens(torch.zeros(2, 4), torch.ones(2, 4))


# --- GAE -----------------------------------------------------------------------------------------


def test_gae_known_answer_skips_env_tokens() -> None:
    # model, env, model, model. The env token's reward (5) and value (9) must be ignored.
    mask = t64([[1, 0, 1, 1]])
    rewards = t64([[0.0, 5.0, 0.0, 1.0]])
    values = t64([[0.5, 9.0, 0.2, 0.4]])
    # Over the model tokens: deltas 0 + 0.9*0.2 - 0.5 = -0.32, 0 + 0.9*0.4 - 0.2 = 0.16, 1 - 0.4 = 0.6
    # gamma * lam = 0.72: A = 0.6, 0.16 + 0.72*0.6 = 0.592, -0.32 + 0.72*0.592 = 0.10624
    adv, ret = gae_advantages(rewards, values, mask, gamma=0.9, lam=0.8, whiten=False)
    torch.testing.assert_close(adv, t64([[0.10624, 0.0, 0.592, 0.6]]))
    torch.testing.assert_close(ret, t64([[0.60624, 0.0, 0.792, 1.0]]))


def test_gae_with_unit_gamma_lambda_is_return_minus_value() -> None:
    mask = t64([[0, 1, 1, 0, 1, 1, 0], [1, 1, 0, 0, 0, 0, 0]])
    rewards = place_terminal_reward(t64([2.0, -1.0]), mask)
    values = t64([[3, 0.5, 0.25, 3, 1.0, 1.5, 3], [0.0, -0.5, 3, 3, 3, 3, 3]])
    adv, ret = gae_advantages(rewards, values, mask, whiten=False)
    torch.testing.assert_close(adv, t64([[0, 1.5, 1.75, 0, 1.0, 0.5, 0], [-1.0, -0.5, 0, 0, 0, 0, 0]]))
    torch.testing.assert_close(ret, t64([[0, 2, 2, 0, 2, 2, 0], [-1, -1, 0, 0, 0, 0, 0]]))


@PROPERTY_SETTINGS
@given(token_batch(), st.floats(0.0, 1.0), st.floats(0.0, 1.0), st.booleans())
def test_gae_matches_loop_reference(
    case: tuple[Rows, Rows, list[list[int]]], gamma: float, lam: float, whiten: bool
) -> None:
    rewards, values, mask = case
    adv, ret = gae_advantages(t64(rewards), t64(values), t64(mask), gamma=gamma, lam=lam, whiten=whiten)
    ref_adv, ref_ret = gae_reference(rewards, values, mask, gamma, lam)
    if whiten:
        ref_adv = whiten_reference(ref_adv, mask)
    torch.testing.assert_close(adv, t64(ref_adv), atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(ret, t64(ref_ret), atol=1e-9, rtol=1e-9)


@PROPERTY_SETTINGS
@given(token_batch(), st.floats(-100, 100))
def test_gae_ignores_masked_out_entries(
    case: tuple[Rows, Rows, list[list[int]]], junk: float
) -> None:
    rewards, values, mask = case
    m = t64(mask)
    base = gae_advantages(t64(rewards), t64(values), m)
    noisy = gae_advantages(
        torch.where(m > 0, t64(rewards), junk), torch.where(m > 0, t64(values), -junk), m
    )
    for a, b in zip(base, noisy):
        torch.testing.assert_close(a, b)


def test_gae_whitened_advantages_have_zero_mean_unit_std_on_valid_tokens() -> None:
    gen = torch.Generator().manual_seed(0)
    mask = (torch.rand(6, 20, generator=gen) > 0.3).double()
    rewards, values = torch.randn(2, 6, 20, generator=gen, dtype=torch.float64)
    adv, _ = gae_advantages(rewards, values, mask, gamma=0.95, lam=0.9)
    valid = adv[mask > 0]
    assert abs(float(valid.mean())) < 1e-9
    assert abs(float(valid.std()) - 1.0) < 1e-6
    assert torch.all(adv[mask == 0] == 0)


# --- REINFORCE++ ---------------------------------------------------------------------------------


def test_reinforce_pp_known_answer() -> None:
    mask = t64([[1, 1, 0, 1], [1, 0, 0, 0]])
    # Returns-to-go with gamma 0.5 over model tokens: row 0 -> 0.25, 0.5, (env), 1; row 1 -> -1.
    # Their mean is 0.1875 and the unbiased variance 2.171875 / 3.
    std = math.sqrt(2.171875 / 3 + 1e-8)
    expected = t64([[0.0625 / std, 0.3125 / std, 0.0, 0.8125 / std], [-1.1875 / std, 0, 0, 0]])
    torch.testing.assert_close(reinforce_pp_advantages(t64([1.0, -1.0]), mask, gamma=0.5), expected)
    token_rewards = place_terminal_reward(t64([1.0, -1.0]), mask)
    torch.testing.assert_close(reinforce_pp_advantages(token_rewards, mask, gamma=0.5), expected)


@PROPERTY_SETTINGS
@given(token_batch(), st.floats(0.0, 1.0))
def test_reinforce_pp_matches_loop_reference(
    case: tuple[Rows, Rows, list[list[int]]], gamma: float
) -> None:
    rewards, _, mask = case
    got = reinforce_pp_advantages(t64(rewards), t64(mask), gamma=gamma)
    expected = whiten_reference(return_to_go_reference(rewards, mask, gamma), mask)
    torch.testing.assert_close(got, t64(expected), atol=1e-6, rtol=1e-6)


def test_token_estimators_accept_float32_and_keep_dtype() -> None:
    mask = torch.tensor([[1.0, 0.0, 1.0]])
    rewards = torch.tensor([[0.0, 0.0, 1.0]])
    adv, ret = gae_advantages(rewards, torch.zeros(1, 3), mask)
    assert adv.dtype == ret.dtype == torch.float32
    assert reinforce_pp_advantages(rewards, mask).dtype == torch.float32


def test_gae_rejects_mismatched_shapes() -> None:
    with pytest.raises(ValueError, match="shape mismatch"):
        gae_advantages(torch.zeros(2, 3), torch.zeros(2, 4), torch.ones(2, 3))


def test_equal_returns_give_exactly_zero_even_when_the_mean_rounds():
    """8 x -1.3 has a float mean that is not -1.3; the advantages must still be exactly 0."""
    returns = torch.full((8,), -1.3)
    group_ids = torch.zeros(8, dtype=torch.long)
    assert torch.equal(grpo_advantages(returns, group_ids), torch.zeros(8))
    assert torch.equal(drgrpo_advantages(returns, group_ids), torch.zeros(8))
