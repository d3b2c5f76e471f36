"""SNR-aware filtering: worked examples by hand, edge cases, properties, pinned errors."""

from __future__ import annotations

import math
import statistics
from fractions import Fraction

import hypothesis.extra.numpy as hnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ragen2.errors import ConfigError, UnknownNameError
from ragen2.filtering import (
    METRICS,
    ORDERS,
    STRATEGIES,
    FilterRule,
    group_scores,
    group_stats,
    loss_scale,
    select_groups,
    select_trajectories,
)

# The rules whose `value` is a fraction and that keep a prefix of the ranking (quartile is neither).
PREFIX_STRATEGIES = [s for s in STRATEGIES.names() if s != "quartile"]

# The worked example of docs/filtering.md: 6 groups x 4 episodes.
# Reward variances (ddof=1):
#   g0 [0, 0, 0, 0]    0
#   g1 [0, 0, 0, 1]    mean 0.25, squared deviations 3*0.0625 + 0.5625 = 0.75 -> 0.75/3 = 0.25
#   g2 [0, 0, 1, 1]    mean 0.5,  4*0.25 = 1                               -> 1/3
#   g3 [1, 1, 1, 1]    0
#   g4 [0, 2, 0, 2]    mean 1,    4*1 = 4                                  -> 4/3
#   g5 [0, 0, 0, 0.1]  mean 0.025, 3*0.000625 + 0.005625 = 0.0075          -> 0.0025
# Total 23.03/12 = 1.919166...; ranked: g4 1.3333, g2 0.3333, g1 0.25, g5 0.0025, g0 0, g3 0.
WORKED = np.array(
    [
        [0, 0, 0, 0],
        [0, 0, 0, 1],
        [0, 0, 1, 1],
        [1, 1, 1, 1],
        [0, 2, 0, 2],
        [0, 0, 0, 0.1],
    ]
)
WORKED_RV = [0.0, 0.25, 1 / 3, 0.0, 4 / 3, 0.0025]


def kept(rewards, scores=None, **rule) -> list[int]:
    out = select_groups(rewards, FilterRule(**rule), scores)
    assert out.dtype == np.int64
    assert list(out) == sorted(out)
    return out.tolist()


# ----------------------------------------------------------------------------- worked examples


def test_worked_example_scores():
    np.testing.assert_allclose(group_scores(WORKED), WORKED_RV, rtol=1e-11)
    np.testing.assert_allclose(group_scores(WORKED, "reward_std"), np.sqrt(WORKED_RV), rtol=1e-11)
    np.testing.assert_allclose(group_scores(WORKED, "mean_reward"), [0, 0.25, 0.5, 1, 1, 0.025])
    rv_ddof0 = np.array(WORKED_RV) * 3 / 4
    np.testing.assert_allclose(group_scores(WORKED, ddof=0), rv_ddof0, rtol=1e-11)


@pytest.mark.parametrize(
    ("value", "include_zero", "expected"),
    [
        # tau = 0.9 * 1.91917 - 0.01 = 1.71725; cumulative 1.3333, 1.6667, 1.9167 -> 3 groups.
        (0.9, True, [1, 2, 4]),
        # Candidates g1, g2, g4, g5: tau = 0.9 * 1.91917 - 0.01 = 1.71725; same three.
        (0.9, False, [1, 2, 4]),
        # tau = 0.5 * 1.91917 - 0.01 = 0.9496 <= 1.3333: g4 alone.
        (0.5, True, [4]),
        # tau = 0.7 * 1.91917 - 0.01 = 1.3334 > 1.3333: g4 then g2.
        (0.7, True, [2, 4]),
        # value 1: every candidate, the zero-variance ones included (the reference's rho >= 1).
        (1.0, True, [0, 1, 2, 3, 4, 5]),
        (1.0, False, [1, 2, 4, 5]),
        # value 0: the threshold 0 * total - 0.01 is reached by the empty prefix.
        (0.0, True, []),
    ],
)
def test_top_p_worked(value, include_zero, expected):
    assert kept(WORKED, strategy="top_p", value=value, include_zero=include_zero) == expected


def test_top_p_softmax_worked():
    # exp(RV): g0 1, g1 1.28403, g2 1.39561, g3 1, g4 3.79367, g5 1.00250; sum 9.47581.
    # probabilities ranked: g4 .40035, g2 .14728, g1 .13551, g5 .10580, g0 .10553, g3 .10553;
    # cumulative .40035, .54763, .68314, .78894, .89447, 1.
    assert kept(WORKED, strategy="top_p_softmax", value=0.5) == [2, 4]
    assert kept(WORKED, strategy="top_p_softmax", value=0.75) == [1, 2, 4, 5]
    # Near-uniform softmax over small variances: 0.9 keeps the whole batch.
    assert kept(WORKED, strategy="top_p_softmax", value=0.9) == [0, 1, 2, 3, 4, 5]
    # Candidates g1, g2, g4, g5: exp 1.28403, 1.39561, 3.79367, 1.00250, sum 7.47581 -> g4 .50746 >= 0.5.
    assert kept(WORKED, strategy="top_p_softmax", value=0.5, include_zero=False) == [4]


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (0.5, [1, 2, 4]),  # floor(0.5 * 6) = 3
        (0.34, [2, 4]),  # floor(2.04) = 2
        (0.1, [4]),  # floor(0.6) = 0 -> at least 1
        (1.0, [0, 1, 2, 3, 4, 5]),
    ],
)
def test_top_k_worked(value, expected):
    assert kept(WORKED, strategy="top_k", value=value) == expected


def test_min_p_worked():
    # best 4/3: 0.2 * 4/3 = 0.2667 keeps g2 (0.3333), g4; 0.18 * 4/3 = 0.24 also keeps g1 (0.25).
    assert kept(WORKED, strategy="min_p", value=0.2) == [2, 4]
    assert kept(WORKED, strategy="min_p", value=0.18) == [1, 2, 4]
    assert kept(WORKED, strategy="min_p", value=1.0) == [4]
    assert kept(WORKED, strategy="min_p", value=0.0) == [0, 1, 2, 3, 4, 5]


def test_none_keeps_every_candidate():
    assert kept(WORKED, strategy="none") == [0, 1, 2, 3, 4, 5]
    assert kept(WORKED, strategy="none", include_zero=False) == [1, 2, 4, 5]


def test_include_zero_false_drops_zero_variance_groups():
    # std <= 1e-10: g0 and g3; g5 (std 0.05) stays. top_k 0.5 keeps floor(0.5 * 6) = 3 of all 6 groups.
    assert kept(WORKED, strategy="top_k", value=0.5, include_zero=False) == [1, 2, 4]
    assert kept(WORKED, strategy="top_k", value=1.0, include_zero=False) == [1, 2, 4, 5]
    # zero_tol 0.1 is a tolerance on the std: g5's 0.05 is under it.
    assert kept(WORKED, strategy="none", include_zero=False, zero_tol=0.1) == [1, 2, 4]


def test_include_zero_tests_variance_whatever_the_metric():
    assert kept(WORKED, strategy="none", metric="reward_std", include_zero=False) == [1, 2, 4, 5]
    # mean_reward ranks g3 (mean 1, RV 0) first unless zero-variance groups are dropped.
    by_mean = {"strategy": "top_k", "value": 0.2, "metric": "mean_reward"}
    assert kept(WORKED, **by_mean) == [3]
    assert kept(WORKED, **by_mean, include_zero=False) == [4]


def test_top_p_total_counts_only_candidates():
    # zero_tol 0.55 (on the std) leaves g2 (RV 1/3, std .577) and g4 (4/3): tau = 0.75 * 5/3 - 0.01 = 1.24
    # <= 4/3, so g4 alone.
    assert kept(WORKED, strategy="top_p", value=0.75, include_zero=False, zero_tol=0.55) == [4]
    # Over all groups tau = 0.75 * 1.91917 - 0.01 = 1.4294 > 4/3, so g2 is needed too.
    assert kept(WORKED, strategy="top_p", value=0.75, include_zero=True) == [2, 4]


def test_order_smallest_keeps_lowest_scores():
    # Ascending, ties in group order: g0 0, g3 0, g5 0.0025, g1 0.25, g2 0.3333, g4 1.3333.
    assert kept(WORKED, strategy="top_k", value=0.5, order="smallest") == [0, 3, 5]
    # Candidates ascending: g5, g1, g2, g4; top_k keeps floor(0.5 * 6) = 3.
    bottom = {"value": 0.5, "order": "smallest", "include_zero": False}
    assert kept(WORKED, strategy="top_k", **bottom) == [1, 2, 5]
    # min_p mirrored: score <= best / value = 0.0025 / 0.5 = 0.005 keeps g5 alone.
    assert kept(WORKED, strategy="min_p", **bottom) == [5]
    # Linear top_p from the bottom: tau = 0.5 * 1.91917 - 0.01 = 0.9496; 0.0025, 0.2525, 0.5858, then g4.
    assert kept(WORKED, strategy="top_p", **bottom) == [1, 2, 4, 5]
    # softmax(-RV) over g5, g1, g2, g4: exp(-.0025) .99750, exp(-.25) .77880, exp(-1/3) .71653,
    # exp(-4/3) .26360, sum 2.75643 -> .36188, .28254, .25995, .09563; 0.5 needs g5 and g1.
    assert kept(WORKED, strategy="top_p_softmax", **bottom) == [1, 5]


# ----------------------------------------------------------------------------- edge cases

TIES = np.array(
    [
        [0, 0, 0, 1],  # g0 0.25
        [0, 0, 1, 1],  # g1 1/3
        [1, 0, 0, 0],  # g2 0.25, the same variance as g0
        [1, 1, 1, 1],  # g3 0
    ]
)


def test_ties_broken_by_group_index():
    # top_k 0.5 keeps 2: g1, then g0 before g2.
    assert kept(TIES, strategy="top_k", value=0.5) == [0, 1]
    # tau = 0.6 * 5/6 - 0.01 = 0.49; g1 1/3, + g0 = 0.5833 >= 0.49.
    assert kept(TIES, strategy="top_p", value=0.6) == [0, 1]
    # Ascending: g3, then g0 before g2.
    assert kept(TIES, strategy="top_k", value=0.5, order="smallest") == [0, 3]
    # Swapping g0 and g2 swaps nothing in the scores, so the lower index still wins.
    assert kept(TIES[[2, 1, 0, 3]], strategy="top_k", value=0.5) == [0, 1]


def test_all_zero_variance():
    rewards = np.ones((4, 3))
    # top_p: 0.9 * 0 - 0.01 < 0 is reached by the empty prefix (the reference's behaviour); value 1
    # keeps every candidate; min_p keeps all (every score equals the best).
    assert kept(rewards, strategy="top_p", value=0.9) == []
    assert kept(rewards, strategy="top_p", value=1.0) == [0, 1, 2, 3]
    assert kept(rewards, strategy="min_p", value=0.9) == [0, 1, 2, 3]
    # Uniform softmax, 0.25 per group: 0.5 needs two; top_k takes the first by index.
    assert kept(rewards, strategy="top_p_softmax", value=0.5) == [0, 1]
    assert kept(rewards, strategy="top_k", value=0.5) == [0, 1]
    # The paper's setting drops every group: empty, and the trainer skips the step.
    for strategy in STRATEGIES:
        value = 1 if strategy == "quartile" else 0.5
        out = select_groups(rewards, FilterRule(strategy=strategy, value=value, include_zero=False))
        assert out.dtype == np.int64 and out.shape == (0,)


def test_equal_returns_have_exactly_zero_variance():
    # numpy alone gives 2.9e-34 for [0.1, 0.1, 0.1]; that must still read as "no signal".
    rewards = np.full((3, 3), 0.1)
    assert group_scores(rewards).tolist() == [0.0, 0.0, 0.0]
    assert kept(rewards, strategy="top_p", value=1.0, include_zero=False) == []
    assert kept(np.array([[0.1, 0.1, 0.1], [0.0, 0.0, 1.0]]), strategy="top_p", value=0.99) == [1]


def test_single_group():
    assert kept(np.array([[0.0, 1.0]]), strategy="top_p", value=0.9) == [0]
    assert kept(np.array([[0.0, 1.0]]), strategy="top_k", value=0.1) == [0]
    assert kept(np.array([[1.0, 1.0]]), strategy="top_p", value=1.0) == [0]
    assert kept(np.array([[1.0, 1.0]]), strategy="top_p") == []  # nothing above the slack
    assert kept(np.array([[1.0, 1.0]]), strategy="top_p", include_zero=False) == []


def test_one_episode_per_group_works_without_variance():
    rewards = np.array([[0.2], [0.9], [0.5]])
    assert kept(rewards, strategy="top_k", value=0.34, metric="mean_reward") == [1]
    lengths = [10, 30, 20]
    assert kept(rewards, strategy="min_p", value=0.5, metric="length", scores=lengths) == [1, 2]


def test_top_k_rounding():
    # 100 groups with distinct variances, group i's RV increasing with i.
    rewards = np.stack([np.zeros(100), np.linspace(0.1, 10.0, 100)], axis=1)
    # 0.29 * 100 == 28.999999999999996 in floats; the rule means 29.
    assert len(select_groups(rewards, FilterRule(strategy="top_k", value=0.29))) == 29
    assert select_groups(rewards, FilterRule(strategy="top_k", value=0.29)).tolist() == list(range(71, 100))
    assert len(select_groups(rewards, FilterRule(strategy="top_k", value=0.999))) == 99
    assert len(select_groups(rewards, FilterRule(strategy="top_k", value=0.001))) == 1
    assert len(select_groups(rewards[:5], FilterRule(strategy="top_k", value=0.5))) == 2


def test_measured_metrics_use_scores():
    lengths = np.array([[10, 20], [50, 70], [5, 5]])  # [P, G], averaged to 15, 60, 5
    rewards = np.array([[0.0, 1.0], [0.0, 0.0], [1.0, 0.0]])
    np.testing.assert_allclose(group_scores(rewards, "length", scores=lengths), [15, 60, 5])
    assert kept(rewards, strategy="top_k", value=0.34, metric="length", scores=lengths) == [1]
    entropy = [0.3, 0.1, 0.2]
    assert kept(rewards, strategy="top_k", value=0.34, metric="entropy", scores=entropy) == [0]
    # The zero-variance test still uses the rewards: g1 (RV 0) goes first.
    by_length = {"strategy": "top_k", "value": 0.5, "metric": "length", "scores": lengths}
    assert kept(rewards, **by_length, include_zero=False) == [0]


def test_negative_scores_allowed_where_the_rule_is_defined():
    rewards = np.array([[-1.0, -0.5], [-0.1, -0.2], [-2.0, -3.0]])  # means -0.75, -0.15, -2.5
    assert kept(rewards, strategy="top_k", value=0.34, metric="mean_reward") == [1]
    assert kept(rewards, strategy="top_p_softmax", value=0.5, metric="mean_reward") == [1]
    lowest = {"strategy": "top_k", "value": 0.34, "metric": "mean_reward", "order": "smallest"}
    assert kept(rewards, **lowest) == [2]


def test_slow_reference_for_scores_and_stats():
    rng = np.random.default_rng(0)
    rewards = rng.normal(size=(7, 5)).round(2)
    rewards[3] = 0.5  # one zero-variance group
    rv = [statistics.variance(row) for row in rewards.tolist()]
    np.testing.assert_allclose(group_scores(rewards), rv, rtol=1e-11)
    pv = [statistics.pvariance(row) for row in rewards.tolist()]
    np.testing.assert_allclose(group_scores(rewards, ddof=0), pv, rtol=1e-11)
    stats = group_stats(rewards)
    assert stats["rv_mean"] == pytest.approx(statistics.fmean(rv))
    assert stats["rv_std_over_mean"] == pytest.approx(statistics.pstdev(rv) / statistics.fmean(rv))
    assert stats["frac_zero_variance"] == pytest.approx(1 / 7)


def test_group_stats_worked_and_all_zero():
    stats = group_stats(WORKED)
    assert stats["rv_mean"] == pytest.approx(23.03 / 12 / 6)
    spread = statistics.pstdev(WORKED_RV) / statistics.fmean(WORKED_RV)  # 1.47610
    assert stats["rv_std_over_mean"] == pytest.approx(spread)
    assert stats["frac_zero_variance"] == pytest.approx(1 / 3)  # g0, g3
    flat = {"rv_mean": 0.0, "rv_std_over_mean": 0.0, "frac_zero_variance": 1.0}
    assert group_stats(np.ones((3, 4))) == flat


def test_loss_scale():
    assert loss_scale(3, 12, "none") == 1.0
    assert loss_scale(3, 12, "linear") == 0.25
    assert loss_scale(3, 12, "sqrt") == 0.5
    assert loss_scale(12, 12, "sqrt") == 1.0
    assert loss_scale(0, 12, "linear") == 0.0
    assert loss_scale(np.int64(4), 16, "sqrt") == 0.5


# ----------------------------------------------------------------------------- errors


def test_unknown_names_list_valid_ones_and_suggest():
    msg = r"unknown filter strategy 'top-p'; valid: .*Did you mean: top_p"
    with pytest.raises(UnknownNameError, match=msg):
        select_groups(WORKED, FilterRule(strategy="top-p"))
    msg = r"unknown filter metric 'reward_var'; valid: .*Did you mean: reward_variance"
    with pytest.raises(UnknownNameError, match=msg):
        select_groups(WORKED, FilterRule(metric="reward_var"))
    msg = r"unknown filter order 'largets'; valid: largest, smallest\. Did you mean: largest"
    with pytest.raises(ConfigError, match=msg):
        select_groups(WORKED, FilterRule(order="largets"))
    msg = r"unknown loss scale mode 'squareroot'; valid: none, linear, sqrt"
    with pytest.raises(ConfigError, match=msg):
        loss_scale(1, 2, "squareroot")


@pytest.mark.parametrize(
    ("strategy", "value", "bounds"),
    [
        ("top_p", 1.5, r"\[0, 1\]"),
        ("top_p", -0.1, r"\[0, 1\]"),
        ("top_p_softmax", 2, r"\[0, 1\]"),
        ("min_p", float("nan"), r"\[0, 1\]"),
        ("top_k", 0, r"\(0, 1\]"),
        ("top_k", 1.01, r"\(0, 1\]"),
        ("top_k", "0.5", r"\(0, 1\]"),
    ],
)
def test_value_out_of_range_names_the_value(strategy, value, bounds):
    msg = rf"filter value {value!r} is out of range for strategy '{strategy}'.*{bounds}"
    with pytest.raises(ConfigError, match=msg):
        select_groups(WORKED, FilterRule(strategy=strategy, value=value))


def test_none_ignores_value():
    assert kept(WORKED, strategy="none", value=7) == [0, 1, 2, 3, 4, 5]
    assert kept(WORKED, strategy="none", value=None) == [0, 1, 2, 3, 4, 5]


def test_one_episode_refused_for_variance():
    rewards = np.zeros((3, 1))
    msg = r"metric 'reward_variance' needs .* at least 2 episodes .*\(3, 1\) \(G=1\)"
    with pytest.raises(ConfigError, match=msg):
        select_groups(rewards)
    with pytest.raises(ConfigError, match=r"metric 'reward_std' needs"):
        select_groups(rewards, FilterRule(metric="reward_std"))
    with pytest.raises(ConfigError, match=r"include_zero=False needs"):
        select_groups(rewards, FilterRule(metric="mean_reward", include_zero=False))
    with pytest.raises(ConfigError, match=r"group_stats needs"):
        group_stats(rewards)


def test_bad_rewards_refused():
    rewards = WORKED.astype(float).copy()
    rewards[1, 2] = np.nan
    with pytest.raises(ConfigError, match=r"rewards\[1, 2\] is nan \(group 1, episode 2\)"):
        select_groups(rewards)
    rewards[1, 2] = np.inf
    with pytest.raises(ConfigError, match=r"rewards\[1, 2\] is inf"):
        group_stats(rewards)
    with pytest.raises(ConfigError, match=r"got shape \(8,\)"):
        select_groups(np.zeros(8))
    with pytest.raises(ConfigError, match=r"got shape \(0, 4\)"):
        select_groups(np.zeros((0, 4)))


def test_bad_options_refused():
    with pytest.raises(ConfigError, match=r"ddof 4 must be an integer in \[0, G-1=3\]"):
        select_groups(WORKED, FilterRule(ddof=4))
    with pytest.raises(ConfigError, match=r"filter selection_eps -0\.1 must be a number >= 0"):
        select_groups(WORKED, FilterRule(selection_eps=-0.1))
    with pytest.raises(ConfigError, match=r"filter zero_tol -1 must be a number >= 0"):
        select_groups(WORKED, FilterRule(zero_tol=-1))
    negative = np.array([[-1.0, -1.0], [1.0, 0.0]])  # mean rewards -1, 0.5
    msg = r"strategy 'top_p' needs non-negative scores, but metric 'mean_reward' gives group 0 the"
    msg += r" score -1\. Use strategy 'top_k' or 'top_p_softmax'"
    with pytest.raises(ConfigError, match=msg):
        select_groups(negative, FilterRule(metric="mean_reward"))
    with pytest.raises(ConfigError, match=r"strategy 'min_p' needs non-negative scores"):
        select_groups(negative, FilterRule(strategy="min_p", metric="mean_reward"))


def test_bad_scores_refused():
    msg = r"metric 'length' ranks groups by .* pass scores= .*\(P=6, G=4\)"
    with pytest.raises(ConfigError, match=msg):
        select_groups(WORKED, FilterRule(metric="length"))
    msg = r"scores for metric 'entropy' has shape \(5,\); expected \(6,\) or \(6, 4\)"
    with pytest.raises(ConfigError, match=msg):
        select_groups(WORKED, FilterRule(metric="entropy"), scores=np.ones(5))
    msg = r"scores= is only used by the metrics length, entropy; metric 'reward_variance'"
    with pytest.raises(ConfigError, match=msg):
        select_groups(WORKED, scores=np.ones(6))
    with pytest.raises(ConfigError, match=r"contain NaN or inf"):
        select_groups(WORKED, FilterRule(metric="length"), scores=[1, 2, np.nan, 4, 5, 6])


def test_loss_scale_bad_counts_refused():
    with pytest.raises(ConfigError, match=r"kept 5 must be an integer in \[0, total=4\]"):
        loss_scale(5, 4, "linear")
    with pytest.raises(ConfigError, match=r"total 0 must be an integer >= 1"):
        loss_scale(0, 0, "linear")


# ----------------------------------------------------------------------------- properties

# Few distinct values, so ties and zero-variance groups are common, plus arbitrary floats.
reward_value = st.one_of(st.sampled_from([0.0, 1.0, -1.0, 0.1, 0.5, 10.0]), st.floats(-10, 10))
reward_matrix = st.tuples(st.integers(1, 10), st.integers(2, 6)).flatmap(
    lambda shape: hnp.arrays(np.float64, shape, elements=reward_value)
)
unit = st.one_of(st.sampled_from([0.0, 0.25, 0.5, 0.9, 1.0]), st.floats(0, 1))


def reference_ranking(rewards: np.ndarray, include_zero: bool, order: str) -> tuple[list[int], list[float]]:
    """Candidates ranked best first with Python's sort (ties by index), and their RV.

    The RVs are group_scores' own (checked against `statistics` above), so a property
    failure here is about selection, not about the last bit of a variance.
    """
    rv = group_scores(rewards).tolist()
    cand = [i for i in range(len(rv)) if include_zero or math.sqrt(rv[i]) > 1e-10]
    sign = -1 if order == "largest" else 1
    ranked = sorted(cand, key=lambda i: (sign * rv[i], i))
    return ranked, [rv[i] for i in ranked]


@settings(max_examples=300, deadline=None)
@given(
    rewards=reward_matrix,
    strategy=st.sampled_from(PREFIX_STRATEGIES),
    value=unit.filter(lambda v: v > 0),
    include_zero=st.booleans(),
    order=st.sampled_from(ORDERS),
)
def test_kept_set_is_a_prefix_of_the_stable_ranking(rewards, strategy, value, include_zero, order):
    options = {"value": value, "include_zero": include_zero, "order": order}
    out = select_groups(rewards, FilterRule(strategy=strategy, **options))
    ranked, _ = reference_ranking(rewards, include_zero, order)
    assert out.tolist() == sorted(ranked[: len(out)])
    if strategy != "top_p":  # top_p alone may keep nothing of a batch whose score lies within its slack
        assert (len(out) == 0) == (len(ranked) == 0)


@settings(max_examples=300, deadline=None)
@given(rewards=reward_matrix, include_zero=st.booleans(), strategy=st.sampled_from(["top_p", "top_p_softmax"]))
def test_value_one_keeps_every_candidate(rewards, include_zero, strategy):
    """The reference's rho >= 1: every candidate, zero scores included."""
    out = select_groups(rewards, FilterRule(strategy=strategy, value=1.0, include_zero=include_zero))
    assert out.tolist() == sorted(reference_ranking(rewards, include_zero, "largest")[0])


@settings(max_examples=300, deadline=None)
@given(rewards=reward_matrix, value=unit.filter(lambda v: v < 1), include_zero=st.booleans(),
       order=st.sampled_from(ORDERS), selection_eps=st.sampled_from([0.0, 0.01, 0.5]))
def test_top_p_is_the_smallest_prefix_reaching_the_target(rewards, value, include_zero, order, selection_eps):
    options = {"value": value, "include_zero": include_zero, "order": order, "selection_eps": selection_eps}
    out = select_groups(rewards, FilterRule(strategy="top_p", **options))
    _, ranked_rv = reference_ranking(rewards, include_zero, order)
    total = math.fsum(ranked_rv)
    k = len(out)
    target = value * total - selection_eps
    tol = 1e-9 * total
    assert math.fsum(ranked_rv[:k]) >= target - tol
    if k > 0:
        assert math.fsum(ranked_rv[: k - 1]) < target + tol


@settings(max_examples=200, deadline=None)
@given(rewards=reward_matrix, value=unit.filter(lambda v: v > 0), include_zero=st.booleans())
def test_top_k_count_and_min_p_threshold(rewards, value, include_zero):
    ranked, ranked_rv = reference_ranking(rewards, include_zero, "largest")
    top_k = select_groups(rewards, FilterRule(strategy="top_k", value=value, include_zero=include_zero))
    expected = max(1, min(len(ranked), math.floor(value * len(rewards) + 1e-9))) if ranked else 0
    assert len(top_k) == expected  # a fraction of all P groups, as the reference's int(rho * P)
    min_p = select_groups(rewards, FilterRule(strategy="min_p", value=value, include_zero=include_zero))
    rv = group_scores(rewards)
    threshold = value * rv[ranked[0]] if ranked else 0.0
    assert min_p.tolist() == sorted(i for i in ranked if rv[i] >= threshold - 1e-10 - 1e-9 * threshold)


def test_min_p_with_a_tiny_value_drops_zero_groups_as_the_reference():
    """Threshold 1e-9 * 0.5 = 5e-10: the reference's 1e-10 slack does not reach a zero score."""
    rewards = np.array([[0.0, 1.0], [1.0, 1.0]])
    assert select_groups(rewards, FilterRule(strategy="min_p", value=1e-9, include_zero=True)).tolist() == [0]


# ----------------------------------------------------------------------------- the reference's rule, exactly


def exact_reference_selection(
    rewards: list[list[str]], strategy: str, value: str, include_zero: bool, order: str, selection_eps: str
) -> list[int]:
    """RAGEN's `_select_top_groups` (ragen/trainer/rollout_filter.py), restated over exact rationals.

    Rewards and settings are decimal strings, so every sum and threshold is exact: this is the
    selection the reference makes when its float rounding does not interfere. Scores are the
    unbiased variances (the rule is the same whatever it ranks).
    """
    rows = [[Fraction(r) for r in row] for row in rewards]
    scores = []
    for row in rows:
        mean = sum(row) / len(row)
        scores.append(sum((r - mean) ** 2 for r in row) / (len(row) - 1))
    rho, eps = Fraction(value), Fraction(selection_eps)
    indices = [i for i in range(len(scores)) if include_zero or scores[i] != 0]
    if not indices:
        return []
    ranked = sorted(indices, key=lambda i: (-scores[i] if order == "largest" else scores[i], i))
    if strategy == "top_p":
        if rho >= 1:
            return sorted(indices)
        threshold = rho * sum(scores[i] for i in indices) - eps
        cumulative, count = Fraction(0), 0
        for i in ranked:  # the reference's loop
            if cumulative >= threshold or scores[i] <= 0:
                break
            cumulative += scores[i]
            count += 1
        return sorted(ranked[:count]) if cumulative >= threshold else []
    if strategy == "top_k":
        k = max(1, min(len(indices), math.floor(rho * len(scores))))
        return sorted(ranked[:k])
    best = scores[ranked[0]]  # min_p
    if order == "largest":
        return sorted(i for i in indices if scores[i] >= rho * best)
    return sorted(i for i in indices if rho * scores[i] <= best)


decimal_reward = st.sampled_from(["0", "1", "-1", "0.1", "-0.1", "0.2", "-0.3", "0.5", "2", "10"])
decimal_matrix = st.tuples(st.integers(1, 10), st.integers(2, 5)).flatmap(
    lambda shape: st.lists(st.lists(decimal_reward, min_size=shape[1], max_size=shape[1]),
                           min_size=shape[0], max_size=shape[0])
)


@settings(max_examples=600, deadline=None)
@given(
    rewards=decimal_matrix,
    strategy=st.sampled_from(["top_p", "top_k", "min_p"]),
    value=st.sampled_from(["0", "0.1", "0.25", "0.3", "0.5", "0.6", "0.75", "0.8", "0.9", "1"]),
    include_zero=st.booleans(),
    order=st.sampled_from(ORDERS),
    selection_eps=st.sampled_from(["0", "0.01"]),
)
def test_selection_equals_the_reference_rule_in_exact_arithmetic(
    rewards, strategy, value, include_zero, order, selection_eps
):
    if strategy == "top_k" and value == "0":
        return  # not a top_k setting here: value must be in (0, 1]
    if strategy == "top_p" and order == "smallest":
        return  # the reference stops at the first zero score from the bottom; ragen2 walks on (docs/filtering.md)
    expected = exact_reference_selection(rewards, strategy, value, include_zero, order, selection_eps)
    out = select_groups(np.array([[float(r) for r in row] for row in rewards]), FilterRule(strategy, float(value), include_zero=include_zero, order=order, selection_eps=float(selection_eps)))
    assert out.tolist() == expected


@pytest.mark.parametrize("strategy", ["top_p", "top_p_softmax"])
@pytest.mark.parametrize("group", [[0, 0, 0, 1], [0, 1], [-0.1, -0.1, -0.2, -0.3]])
def test_identical_groups_keep_exactly_the_fraction_asked(strategy, group):
    """n identical groups and value k/n keep exactly k (F5): no rounding adds a group at the boundary."""
    for n in range(1, 21):
        rewards = np.tile(group, (n, 1))
        for k in range(1, n):
            out = select_groups(rewards, FilterRule(strategy, k / n, selection_eps=0.0))
            assert len(out) == k, (n, k)
            assert out.tolist() == list(range(k))  # ties keep the lower index


# ----------------------------------------------------------------------------- permutations

permutable = st.tuples(reward_matrix, st.randoms(use_true_random=False))


@settings(max_examples=300, deadline=None)
@given(
    data=permutable,
    strategy=st.sampled_from(STRATEGIES.names()),
    value=unit.filter(lambda v: v > 0),
    include_zero=st.booleans(),
    order=st.sampled_from(ORDERS),
)
def test_selection_does_not_depend_on_the_order_of_episodes_or_groups(data, strategy, value, include_zero, order):
    """Shuffling each group's episodes changes nothing; shuffling the groups moves the same selection
    with them (as kept scores: of groups tied at the cut, the lower index is kept wherever it lands)."""
    rewards, rng = data
    if strategy == "quartile":
        value = 1 + int(value * 3.999)
    options = {"strategy": strategy, "value": value, "include_zero": include_zero, "order": order}
    out = select_groups(rewards, FilterRule(**options))
    shuffled = np.array([rng.sample(list(row), len(row)) for row in rewards])
    assert select_groups(shuffled, FilterRule(**options)).tolist() == out.tolist()

    perm = np.array(rng.sample(range(len(rewards)), len(rewards)))  # new group i is old group perm[i]
    moved = select_groups(rewards[perm], FilterRule(**options))
    scores = group_scores(rewards)
    assert sorted(scores[perm[moved]].tolist()) == sorted(scores[out].tolist())
    if len(np.unique(scores)) == len(scores):  # no ties: the very same groups
        assert sorted(perm[moved].tolist()) == out.tolist()


def test_equal_groups_in_any_episode_order_are_equal():
    """F4: np.var of [0,0,0,0,1,1,1] and [1,1,1,0,0,0,0] differ by 5.6e-17; both groups must tie."""
    rewards = np.array([[0, 0, 0, 0, 1, 1, 1], [1, 1, 1, 0, 0, 0, 0]], dtype=float)
    assert group_scores(rewards)[0] == group_scores(rewards)[1]
    assert kept(rewards, strategy="min_p", value=1.0) == [0, 1]
    four = np.array([[1, 1, 1, 0, 0, 0, 0], [0, 0, 0, 0, 1, 1, 1]] * 2, dtype=float)
    assert kept(four, strategy="top_k", value=0.5) == [0, 1]  # ties keep the lower index


def test_every_metric_and_strategy_runs():
    scores = np.arange(6.0)
    for metric in METRICS:
        for strategy in PREFIX_STRATEGIES:
            measured = scores if metric in ("length", "entropy") else None
            out = select_groups(WORKED, FilterRule(strategy=strategy, value=0.5, metric=metric), measured)
            assert 1 <= len(out) <= 6


# ----------------------------------------------------------------------------- quartiles


@pytest.mark.parametrize(
    ("include_zero", "order", "expected"),
    [
        # Ranked g4, g2, g1, g5, g0, g3: six candidates cut 2, 2, 1, 1 (array_split).
        (True, "largest", [[2, 4], [1, 5], [0], [3]]),
        # Lowest first (ties by index): g0, g3, g5, g1, g2, g4.
        (True, "smallest", [[0, 3], [1, 5], [2], [4]]),
        # Candidates g4, g2, g1, g5 (g0, g3 have RV 0): one each.
        (False, "largest", [[4], [2], [1], [5]]),
    ],
)
def test_quartile_worked(include_zero, order, expected):
    for q in (1, 2, 3, 4):
        assert kept(WORKED, strategy="quartile", value=q, include_zero=include_zero, order=order) == expected[q - 1]


def test_quartiles_partition_eight_groups_by_rv():
    # Group i has returns [0, i]: RV = i^2 / 2, so group 7 has the highest.
    rewards = np.array([[0.0, float(i)] for i in range(8)])
    quarters = [kept(rewards, strategy="quartile", value=q) for q in (1, 2, 3, 4)]
    assert quarters == [[6, 7], [4, 5], [2, 3], [0, 1]]
    assert kept(rewards, strategy="quartile", value=4.0) == [0, 1]  # YAML gives a float


@pytest.mark.parametrize("value", [0, 5, 0.5, 2.5, True, "1"])
def test_quartile_value_must_be_one_to_four(value):
    with pytest.raises(ConfigError, match=rf"filter value {value!r} .*'quartile'.*1 \(the highest scores\)"):
        select_groups(WORKED, FilterRule(strategy="quartile", value=value))


# ----------------------------------------------------------------------------- trajectory level


def test_select_trajectories_worked():
    rewards = np.array(
        [
            # Ascending order 0,0,0,1,1,5,10,10; k = 4. Variances (population) of j lowest + 4-j highest:
            # j=0 {1,5,10,10} 14.25, j=1 {0,5,10,10} 17.19, j=2 {0,0,10,10} 25, j=3 {0,0,0,10} 18.75, j=4 ~0.19.
            [10, 0, 1, 0, 5, 1, 0, 10],
            # j=1 {0,10,10,10} 18.75 beats j=2 {0,9,10,10} 17.69 and j=3 {0,9,9,10} 16.5: not always 2 + 2.
            [0, 9, 10, 10, 10, 10, 9, 9],
            # Every split but j=4 gives {0,0,0,10}: the tie goes to the balanced one, bottom 2 + top 2 by index.
            [0, 0, 0, 0, 0, 0, 0, 10],
        ]
    )
    mask = select_trajectories(rewards, 0.5)
    assert mask.dtype == bool and mask.shape == (3, 8)
    assert [np.flatnonzero(row).tolist() for row in mask] == [[0, 1, 3, 7], [0, 3, 4, 5], [0, 1, 6, 7]]


def test_select_trajectories_counts():
    rewards = np.arange(24.0).reshape(3, 8)
    assert select_trajectories(rewards, 1.0).all()
    assert (select_trajectories(rewards, 0.75).sum(axis=1) == 6).all()
    assert (select_trajectories(rewards, 0.01).sum(axis=1) == 2).all()  # at least 2: a group baseline needs two
    assert (select_trajectories(rewards[:, :2], 0.5).sum(axis=1) == 2).all()


@pytest.mark.parametrize("keep", [0, 1.5, -0.5, True, "0.5"])
def test_select_trajectories_bad_keep(keep):
    with pytest.raises(ConfigError, match=rf"trajectory keep {keep!r} must be a fraction in \(0, 1\]"):
        select_trajectories(WORKED, keep)


@settings(max_examples=150, deadline=None)
@given(rewards=reward_matrix, keep=unit.filter(lambda v: v > 0))
def test_select_trajectories_maximises_variance(rewards, keep):
    """Slow reference: the best variance over every k-subset equals the selected subset's."""
    import itertools

    mask = select_trajectories(rewards, keep)
    for row, chosen in zip(rewards, mask):
        k = int(chosen.sum())
        best = max(np.var(row[list(c)]) for c in itertools.combinations(range(len(row)), k))
        assert np.var(row[chosen]) == pytest.approx(best, rel=1e-9, abs=1e-9)


# ----------------------------------------------------------------------------- the reference's worked cases


def test_shaped_rewards_keep_what_the_reference_keeps():
    """F1: group 0's RV 0.0092 is signal, not zero. Std 0.0957, 0.5774, 0; threshold
    0.9 * 0.6731 - 0.01 = 0.5958 > 0.5774, so group 0 joins group 1."""
    rewards = np.array([[-0.1, -0.1, -0.2, -0.3], [0, 0, 1, 1], [-0.1, -0.1, -0.1, -0.1]])
    assert kept(rewards, strategy="top_p", value=0.9, metric="reward_std", include_zero=False) == [0, 1]
    # Ranked by variance (the paper's formula): 0.0092, 0.3333; threshold 0.9 * 0.3425 - 0.01 = 0.2983.
    assert kept(rewards, strategy="top_p", value=0.9, include_zero=False) == [1]


def test_value_one_keeps_every_candidate_worked():
    """F2: rho = 1 keeps every candidate, zero scores included."""
    rewards = np.array([[0, 1], [1, 1], [0, 0]])
    assert kept(rewards, strategy="top_p", value=1.0, include_zero=True) == [0, 1, 2]
    assert kept(rewards, strategy="top_p", value=1.0, include_zero=False) == [0]


def test_top_k_counts_all_groups():
    """F3: int(0.5 * 4) = 2 of all four groups, though only two are candidates."""
    rewards = np.array([[0, 1], [0, 1], [1, 1], [0, 0]])
    assert kept(rewards, strategy="top_k", value=0.5, include_zero=False) == [0, 1]


def test_exact_boundaries():
    """F5: ten groups of [0, 0, 0, 1] (std 0.5): 0.9 of the total 5 is reached by nine, exactly."""
    rewards = np.tile([0.0, 0.0, 0.0, 1.0], (10, 1))
    assert len(select_groups(rewards, FilterRule("top_p", 0.9, "reward_std", selection_eps=0.0))) == 9
    assert len(select_groups(rewards, FilterRule("top_p", 0.9, "reward_std"))) == 9
    # Six equal groups, softmax 1/6 each: 0.5 is reached by three.
    assert kept(np.tile([0.0, 1.0], (6, 1)), strategy="top_p_softmax", value=0.5) == [0, 1, 2]
