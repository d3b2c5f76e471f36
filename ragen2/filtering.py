"""SNR-aware filtering: choose the prompt groups a training step learns from.

Why (RAGEN-2, "The SNR mechanism" and "SNR-Aware Filtering"): with group-relative
advantages A_g = R_g - mean(R), the task gradient of a prompt x is bounded by

    ||g_task(x)|| <= sqrt(RV(x)) * sqrt(E[||grad log pi||^2 | x]),

where RV(x) is the variance of the G returns of x's group, while the KL and entropy
gradients do not depend on RV at all. A low-RV group's update is therefore mostly
regulariser, which is the same for every input and pushes reasoning toward
input-agnostic templates. Filtering trains only on the groups that carry signal.

Per step, on rewards [P, G] (P groups of G episodes that share a prompt and seed):

    1. score every group (default: its reward variance, ddof=1);
    2. with include_zero=False, drop the groups whose reward std is <= zero_tol (1e-10, the
       reference's test: returns that are all equal); they are never kept;
    3. rank the remaining groups (the candidates) by score, ties in group order, and keep
       the part of that ranking the strategy decides: a prefix, or one quarter (`quartile`).

The defaults select what the RAGEN reference code (`ragen/trainer/rollout_filter.py`)
selects, with metric="reward_std" as it ranks; docs/filtering.md tables every difference.
Scores never depend on the order of a group's episodes, and every threshold is compared
with a tolerance of 1e-9 of its scale, so an exact boundary selects what exact arithmetic
selects (1 - 0.9 is 0.09999999999999998 in floats).

Whole groups are kept, so group baselines (GRPO mean, RLOO leave-one-out) stay intact.
`select_trajectories` is the trajectory-level alternative of the paper's ablation: keep
every group, but only its most spread-out episodes. `ragen2.rl.gigpo.select_anchor_turns` applies the same rules
one level down, to GiGPO's anchor-state groups (the turns of a group that saw the same observation).
The formulas, a worked example and the logged metrics are in docs/filtering.md.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields, replace
from numbers import Real
from typing import Any

import numpy as np

from ragen2.errors import ConfigError, UnknownNameError, did_you_mean
from ragen2.registry import Registry

REWARD_METRICS = ("reward_variance", "reward_std", "mean_reward")
MEASURED_METRICS = ("length", "entropy")  # per-group numbers the rewards do not contain
METRICS = REWARD_METRICS + MEASURED_METRICS
SPREAD_METRICS = ("entropy_variance", "entropy_std")  # the spread within each group of per-episode scores [P, G]
ORDERS = ("largest", "smallest")
LOSS_SCALE_MODES = ("none", "linear", "sqrt")

SELECTION_EPS = 0.01  # slack of the linear top_p threshold (reference: rollout_filter_selection_eps)
ZERO_TOL = 1e-10  # a reward std <= this is zero variance (reference: |score| <= 1e-10)
REL_TOL = 1e-9  # thresholds are compared with this tolerance, relative to their scale

# Linear mass and ratio-to-the-best rules only make sense for non-negative scores.
_NON_NEGATIVE_STRATEGIES = ("top_p", "min_p")


@dataclass(frozen=True)
class Rule:
    """What a strategy knows besides the ranked scores."""

    value: float  # rho
    largest: bool  # False for order="smallest", where "best" means lowest
    num_groups: int  # P, every group of the step, dropped ones included (top_k's base, as the reference's)
    selection_eps: float  # top_p's slack


# A strategy gets the candidates' scores in ranked order (best first) and returns the ranks
# to keep, as a slice of that ranking (a prefix for every rule but `quartile`).
Strategy = Callable[[np.ndarray, Rule], slice]
STRATEGIES: Registry[Strategy] = Registry("filter strategy")


@dataclass(frozen=True)
class FilterRule:
    """Which groups a step keeps: the rule's eight settings, with the defaults `select_groups` uses.

    `filter.*` holds the same names (ragen2.config.FilterConfig; `FilterRule.of` takes them from it), and
    the verl and TRL integrations build one from their own options.

    strategy:      how many ranked candidates to keep (s = the candidates' scores, rho = value):
                   top_p          smallest prefix whose score sum reaches rho * sum(s) - selection_eps
                                  (the paper's rule with the reference's slack; rho >= 1 keeps every
                                  candidate, and the prefix is empty when rho * sum(s) <= selection_eps);
                   top_p_softmax  smallest prefix whose softmax(s) mass reaches rho (the reference's
                                  top_p_prob_mode=softmax); rho >= 1 keeps every candidate;
                   top_k          floor(rho * P) groups of all P, at most the candidates, at least 1;
                   top_k_abs      int(rho) groups, at most the candidates, at least 1 (the reference's
                                  top_k_abs: a fixed count, whatever P is);
                   min_p          groups with s >= rho * max(s);
                   quartile       one quarter of the ranking: value 1 the best quarter
                                  (highest RV) ... 4 the worst (RAGEN-2's quartile ablation);
                   none           every candidate.
    value:         rho, in [0, 1] ((0, 1] for top_k; 1, 2, 3 or 4 for quartile; > 0, a count, for
                   top_k_abs); ignored by none.
                   0.9 is the paper's keep rate.
    metric:        the score: reward_variance (default, the paper's formula), reward_std (what the
                   reference code ranks by), mean_reward, or from `scores`: length, entropy (their
                   group means), entropy_variance / entropy_std (the variance / std of the group's
                   per-episode entropies; the reference's entropy_variance ranks by the std).
    include_zero:  False drops the groups whose reward std is <= zero_tol before ranking (the
                   paper's main setting; the default True drops nothing). The test is on the
                   rewards whatever the metric, so it always means "no learning signal" and
                   matches rollout/frac_zero_variance.
    ddof:          delta degrees of freedom of the variance (1: unbiased, the paper's).
    order:         "largest" keeps the highest scores; "smallest" walks the same rule up from the
                   lowest scores (ablation).
    selection_eps: top_p's slack (reference: 0.01); 0 is the paper's formula as written.
    zero_tol:      the zero-variance tolerance on the reward std (reference: 1e-10).

    """

    strategy: str = "top_p"
    value: float = 0.9
    metric: str = "reward_variance"
    include_zero: bool = True
    ddof: int = 1
    order: str = "largest"
    selection_eps: float = SELECTION_EPS
    zero_tol: float = ZERO_TOL

    @classmethod
    def of(cls, settings: Any) -> FilterRule:
        """The rule of anything holding these eight settings by name, such as a FilterConfig."""
        return cls(**{f.name: getattr(settings, f.name) for f in fields(cls)})


def select_groups(rewards: np.ndarray, rule: FilterRule = FilterRule(), scores: np.ndarray | None = None) -> np.ndarray:
    """Indices of the groups to train on: int64 [K], sorted ascending, 0 <= K <= P.

    rewards:       float [P, G], episode returns; row i holds group i's G episodes.
    rule:          the strategy, its value, the metric and the rest (FilterRule).
    scores:        float [P] or [P, G] (averaged over G); required by the measured metrics, [P, G] for
                   entropy_variance / entropy_std.

    Totals and maxima in a rule are over the candidates (groups not dropped by include_zero);
    top_k's count is a fraction of all P groups. Every strategy keeps a prefix of the stable
    ranking, except quartile, which cuts the C candidates' ranking into four runs of C // 4,
    the first C % 4 of them one longer (as numpy.array_split), so with C < 4 the last
    quartiles are empty. When no candidate is left the result is empty and the trainer skips
    the step.
    """
    rewards = _check_rewards(rewards)
    rule = check_rule(rule)
    score = group_scores(rewards, rule.metric, rule.ddof, scores)  # [P]
    candidates = np.arange(len(score))
    if not rule.include_zero:
        candidates = candidates[~no_spread(rewards, rule, needed_by="include_zero=False")]
    return select_ranked(score, candidates, rule)


def check_rule(rule: FilterRule) -> FilterRule:
    """Refuse an unknown strategy or order, a value out of the strategy's range or a negative tolerance;
    returns the rule with its value as a float."""
    STRATEGIES.get(rule.strategy)
    value = _check_value(rule.strategy, rule.value)
    check_choice("filter order", rule.order, ORDERS)
    for name, tol in (("selection_eps", rule.selection_eps), ("zero_tol", rule.zero_tol)):
        if isinstance(tol, bool) or not (isinstance(tol, Real) and tol >= 0):
            raise ConfigError(f"filter {name} {tol!r} must be a number >= 0 (reference: "
                              f"{SELECTION_EPS if name == 'selection_eps' else ZERO_TOL}).")
    return replace(rule, value=value)


def select_ranked(score: np.ndarray, candidates: np.ndarray, rule: FilterRule) -> np.ndarray:
    """The units (prompt groups, or GiGPO's anchor groups) a checked `rule` keeps: int64 [K], ascending.

    score: float [N], every unit's score; candidates: int [C], the units left after the zero test.
    N, every unit, is top_k's base.
    """
    if candidates.size == 0:
        return np.empty(0, dtype=np.int64)
    cand_score = score[candidates]  # [C]
    if rule.strategy in _NON_NEGATIVE_STRATEGIES and (cand_score < 0).any():
        worst = int(np.argmin(cand_score))
        raise ConfigError(
            f"filter strategy {rule.strategy!r} needs non-negative scores, but metric {rule.metric!r} "
            f"gives group {candidates[worst]} the score {cand_score[worst]:.4g}. Use strategy "
            "'top_k' or 'top_p_softmax', or a non-negative metric (reward_variance, reward_std)."
        )
    largest = rule.order == "largest"
    # Stable sort: equal scores keep group order, so ties at the cut keep the lower index.
    rank = np.argsort(-cand_score if largest else cand_score, kind="stable")  # [C]
    kept = STRATEGIES.get(rule.strategy)(cand_score[rank], Rule(rule.value, largest, len(score), float(rule.selection_eps)))
    return np.sort(candidates[rank[kept]]).astype(np.int64)


def group_scores(
    rewards: np.ndarray,
    metric: str = "reward_variance",
    ddof: int = 1,
    scores: np.ndarray | None = None,
) -> np.ndarray:
    """The per-group score `select_groups` ranks by: float [P].

    rewards: float [P, G]. scores: float [P] or [P, G], only for the measured metrics
    (length, entropy), which the caller computes from the trajectories; [P, G] for
    entropy_variance / entropy_std, whose score is the variance (ddof) / std of each row. Each
    group's episodes are sorted before any sum, so a score does not depend on their order.
    """
    rewards = _check_rewards(rewards)
    check_choice("filter metric", metric, METRICS + SPREAD_METRICS, error=UnknownNameError)
    if metric in MEASURED_METRICS + SPREAD_METRICS:
        scores = _check_scores(scores, metric, rewards.shape)
        if metric in SPREAD_METRICS:
            spread = _reward_variance(scores, ddof, needed_by=f"metric {metric!r}")
            return _without_rounding_noise(spread if metric == "entropy_variance" else np.sqrt(spread))
        return _without_rounding_noise(np.sort(scores, axis=1).mean(axis=1) if scores.ndim == 2 else scores)
    if scores is not None:
        raise ConfigError(
            f"scores= is only used by the metrics {', '.join(MEASURED_METRICS)}; metric "
            f"{metric!r} is computed from the rewards. Drop scores= or pick one of those (or "
            f"{' / '.join(SPREAD_METRICS)}, with per-episode scores [P, G])."
        )
    if metric == "mean_reward":
        return _without_rounding_noise(np.sort(rewards, axis=1).mean(axis=1))
    rv = _reward_variance(rewards, ddof, needed_by=f"metric {metric!r}")
    return _without_rounding_noise(rv if metric == "reward_variance" else np.sqrt(rv))


def _without_rounding_noise(score: np.ndarray) -> np.ndarray:
    """Scores rounded to 12 significant digits: float [P].

    Groups whose scores are equal in exact arithmetic can differ in the last bits ([0.1, 0.2] and
    [0, 0.1] have the same variance, 0.005, but not in floats), which would break their tie by
    rounding instead of by group index. 12 digits keep every real difference of returns.
    """
    return np.array([float(f"{s:.12g}") for s in score], dtype=np.float64)


def select_groups_by_tag(rewards: np.ndarray, tags: Sequence[str], rule: FilterRule = FilterRule(),
                         scores: np.ndarray | None = None) -> np.ndarray:
    """`select_groups` within each tag's groups (`filter.scope=tag`): the same rule, so the same fraction, from each.

    rewards: float [P, G]; tags: [P], group i's tag; rule and scores ([P, G] or None) as `select_groups`'s.
    Returns the kept group indices into all P, int64 [K], sorted ascending. With returns on different
    scales (Sokoban's +10 against Bandit's 0/1) a batch-wide ranking would keep mostly one tag.
    """
    kept = []
    for tag in dict.fromkeys(tags):
        rows = np.array([i for i, t in enumerate(tags) if t == tag])
        part = None if scores is None else scores[rows]
        kept.append(rows[select_groups(rewards[rows], rule, part)])
    return np.sort(np.concatenate(kept)).astype(np.int64)


def group_stats(rewards: np.ndarray, ddof: int = 1, zero_tol: float = ZERO_TOL) -> dict[str, float]:
    """Reward-variance statistics of a batch, logged as rollout/<key>.

    rewards: float [P, G]. Returns
      rv_mean             mean over groups of RV_i;
      rv_std_over_mean    std over groups of RV_i (population, ddof=0) / rv_mean, 0 when
                          rv_mean is 0. RAGEN-2 uses this spread as a cheap predictor of the
                          gain from filtering: when every group has the same RV, ranking by
                          RV has nothing to choose between;
      frac_zero_variance  fraction of groups whose reward std is <= zero_tol (the groups that
                          include_zero=False drops).
    """
    rv = _reward_variance(_check_rewards(rewards), ddof, needed_by="group_stats")
    mean = float(rv.mean())
    return {
        "rv_mean": mean,
        "rv_std_over_mean": float(rv.std()) / mean if mean > 0 else 0.0,
        "frac_zero_variance": float(np.mean(_zero_variance(rv, zero_tol))),
    }


def loss_scale(kept: int, total: int, mode: str) -> float:
    """Factor the policy loss is multiplied by after keeping `kept` of `total` groups.

    The loss is averaged over the kept groups (RAGEN-2), so each kept episode weighs
    total/kept times what it would without filtering: a step on a 10% subset is as large
    as a step on the whole batch, but its gradient is noisier. With r = kept / total:
      none    1       the paper's setting: the mean over kept groups as is;
      linear  r       restores the unfiltered per-episode weight (the same as averaging
                      over all P groups with the dropped ones contributing zero);
      sqrt    sqrt(r) holds the step's noise at the unfiltered level: the mean over n
                      groups has noise ~ 1/sqrt(n), so the kept mean is 1/sqrt(r) noisier.
    The factor is at most 1; it is 0 for linear / sqrt when nothing is kept.
    """
    check_choice("loss scale mode", mode, LOSS_SCALE_MODES)
    if not (isinstance(total, int | np.integer) and total >= 1):
        raise ConfigError(
            f"loss_scale total {total!r} must be an integer >= 1 (the number of groups)."
        )
    if not (isinstance(kept, int | np.integer) and 0 <= kept <= total):
        raise ConfigError(f"loss_scale kept {kept!r} must be an integer in [0, total={total}].")
    ratio = kept / total
    if mode == "linear":
        return float(ratio)
    if mode == "sqrt":
        return math.sqrt(ratio)
    return 1.0


def select_trajectories(rewards: np.ndarray, keep: float) -> np.ndarray:
    """Which episodes of each group to train on: bool [P, G] (trajectory-level filtering).

    The alternative RAGEN-2 compares prompt-level filtering against (its Table 7): keep every
    group, but only k = max(2, floor(keep * G)) of its G episodes (all of them at keep = 1),
    the k whose returns vary most. The most spread-out k-subset is always some j lowest plus
    k - j highest returns, so the k + 1 such splits are tried; ties go to the most balanced
    split (j closest to k / 2, then fewer low ones), so with distinct extremes this is the
    top k/2 and bottom k/2 episodes. Equal returns are ordered by episode index.

    rewards: float [P, G]; keep: the share of each group's episodes kept, in (0, 1].
    """
    rewards = _check_rewards(rewards)
    if isinstance(keep, bool) or not (isinstance(keep, Real) and 0 < keep <= 1):
        raise ConfigError(
            f"trajectory keep {keep!r} must be a fraction in (0, 1]: the share of each group's episodes "
            "kept (1 keeps them all; 0.5 keeps the most spread-out half)."
        )
    num_groups, group_size = rewards.shape
    k = min(group_size, max(2, math.floor(keep * group_size + 1e-9)))  # + 1e-9: as top_k
    mask = np.zeros((num_groups, group_size), dtype=bool)
    for i, returns in enumerate(rewards):
        mask[i, _most_spread(returns, k)] = True
    return mask


def _most_spread(returns: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k of `returns` [G] with the largest variance: j lowest + (k - j) highest."""
    order = np.argsort(returns, kind="stable")  # [G], ascending, ties by index
    best, best_var = order[:0], -1.0
    for j in sorted(range(k + 1), key=lambda j: (abs(2 * j - k), j)):  # most balanced first
        picked = np.concatenate([order[:j], order[len(order) - (k - j):]])
        var = float(returns[picked].var())
        if var > best_var * (1 + 1e-9) + 1e-12:  # clearly better: ties (up to rounding) keep the balanced split
            best, best_var = picked, var
    return best


# ----------------------------------------------------------------------------- strategies


@STRATEGIES.register("top_p")
def _top_p(ranked: np.ndarray, rule: Rule) -> slice:
    """The paper's rule with the reference's slack: the smallest prefix reaching rho * total - eps.

    The reference adds ranked groups while their running sum is below the threshold (and stops at
    a score <= 0, where, scores being >= 0, only zeros are left); the same prefix is the smallest k
    with sum(s[:k]) >= threshold. It is empty when the threshold is <= 0: a batch whose whole score
    lies within the slack has nothing worth training on.
    """
    if rule.value >= 1:
        return slice(len(ranked))
    total = float(ranked.sum())
    threshold = rule.value * total - rule.selection_eps
    return slice(_smallest_prefix_reaching(ranked, threshold, tol=REL_TOL * total, at_least=0))


@STRATEGIES.register("top_p_softmax")
def _top_p_softmax(ranked: np.ndarray, rule: Rule) -> slice:
    """Nucleus-style: smallest prefix whose softmax probability sums to `value` (at least one group).

    Softmax is shift- but not scale-invariant: variances of 0/1 rewards lie in [0, 0.3],
    where softmax is close to uniform and this behaves like top_k(value).
    """
    if rule.value >= 1:
        return slice(len(ranked))
    logits = ranked if rule.largest else -ranked  # ranked order puts the largest logit first
    prob = np.exp(logits - logits.max())
    return slice(_smallest_prefix_reaching(prob / prob.sum(), rule.value, tol=REL_TOL, at_least=1))


@STRATEGIES.register("top_k")
def _top_k(ranked: np.ndarray, rule: Rule) -> slice:
    """floor(value * P) of all P groups (as the reference), at most the candidates, at least one."""
    # + REL_TOL: 0.29 * 100 == 28.999999999999996 in floats, and must keep 29 groups.
    return slice(max(1, min(len(ranked), math.floor(rule.value * rule.num_groups + REL_TOL))))


@STRATEGIES.register("top_k_abs")
def _top_k_abs(ranked: np.ndarray, rule: Rule) -> slice:
    """A fixed number of groups, int(value) (at least one), at most the candidates: the same count whatever P is."""
    return slice(max(1, min(len(ranked), int(rule.value))))


@STRATEGIES.register("min_p")
def _min_p(ranked: np.ndarray, rule: Rule) -> slice:
    """Keep score >= value * best; for order="smallest", score <= best / value.

    The reference's 1e-10 slack, plus REL_TOL of the threshold so that equal floats on both
    sides of a product compare as equal (relative to the threshold, not to the best score, so
    that a tiny value still drops the groups the reference drops)."""
    best = ranked[0]
    tol = ZERO_TOL + REL_TOL * abs(rule.value * best if rule.largest else best)
    keep = ranked >= rule.value * best - tol if rule.largest else rule.value * ranked <= best + tol
    return slice(int(np.count_nonzero(keep)))


@STRATEGIES.register("quartile")
def _quartile(ranked: np.ndarray, rule: Rule) -> slice:
    """Quarter `value` of the ranking (1 = best). RAGEN-2 trains on one RV quartile at a time to
    show that the signal, not the amount of data, drives learning: every quartile is the same size."""
    q, (size, extra) = int(rule.value), divmod(len(ranked), 4)  # the first `extra` quarters get one more
    return slice((q - 1) * size + min(q - 1, extra), q * size + min(q, extra))


@STRATEGIES.register("none")
def _keep_all(ranked: np.ndarray, rule: Rule) -> slice:
    return slice(len(ranked))


def _smallest_prefix_reaching(mass: np.ndarray, threshold: float, tol: float, at_least: int) -> int:
    """Smallest k >= at_least with sum(mass[:k]) >= threshold - tol, for mass >= 0 (len(mass) if none).

    `tol` absorbs the rounding of the running sum and of the threshold itself, so a prefix that
    reaches the threshold exactly in real arithmetic counts as reaching it.
    """
    reached = np.concatenate([[0.0], np.cumsum(mass)]) >= threshold - tol  # [C + 1], by prefix length
    reached[:at_least] = False
    return int(np.argmax(reached)) if reached.any() else len(mass)


# ----------------------------------------------------------------------------- checks

_VALUE_MEANING = {
    "top_p": "the keep rate rho, the fraction of the total score kept (paper: 0.9)",
    "top_p_softmax": "the softmax probability mass kept",
    "top_k": "the fraction of groups kept (0.25 keeps the top quarter)",
    "min_p": "the fraction of the best score a group needs",
}


def _check_value(strategy: str, value: float) -> float:
    if strategy == "none":  # keeps everything; value has no meaning there
        return 1.0
    if strategy == "top_k_abs":
        if isinstance(value, bool) or not (isinstance(value, Real) and value > 0):
            raise ConfigError(
                f"filter value {value!r} is out of range for strategy 'top_k_abs': it is the number of groups "
                "kept, a number > 0 (its whole part, at least 1)."
            )
        return float(value)
    if strategy == "quartile":
        if isinstance(value, bool) or value not in (1, 2, 3, 4):
            raise ConfigError(
                f"filter value {value!r} is out of range for strategy 'quartile': it is the quartile "
                "kept, 1 (the highest scores), 2, 3 or 4 (the lowest)."
            )
        return float(value)
    low_open = strategy == "top_k"  # keeping 0% of the groups is not a top_k setting
    in_range = isinstance(value, Real) and not isinstance(value, bool) and (
        0 < value <= 1 if low_open else 0 <= value <= 1
    )
    if not in_range:
        bounds = "(0, 1]" if low_open else "[0, 1]"
        raise ConfigError(
            f"filter value {value!r} is out of range for strategy {strategy!r}: it is "
            f"{_VALUE_MEANING[strategy]} and must be in {bounds}."
        )
    return float(value)


def check_choice(
    kind: str, name: str, valid: Sequence[str], error: type[Exception] = ConfigError
) -> None:
    if name not in valid:
        raise error(
            f"unknown {kind} {name!r}; valid: {', '.join(valid)}." + did_you_mean(name, valid)
        )


def _check_rewards(rewards: np.ndarray) -> np.ndarray:
    rewards = np.asarray(rewards, dtype=np.float64)
    if rewards.ndim != 2 or rewards.shape[0] == 0 or rewards.shape[1] == 0:
        raise ConfigError(
            f"rewards must be a non-empty float array [P groups, G episodes]; got shape "
            f"{rewards.shape}. Reshape flat returns with rewards.reshape(P, G)."
        )
    bad = np.argwhere(~np.isfinite(rewards))
    if len(bad):
        i, j = bad[0]
        raise ConfigError(
            f"rewards[{i}, {j}] is {rewards[i, j]} (group {i}, episode {j}); every return "
            "must be finite. Fix the reward, or drop the group before filtering."
        )
    return rewards


def _check_scores(scores: np.ndarray | None, metric: str, shape: tuple[int, int]) -> np.ndarray:
    if scores is None:
        raise ConfigError(
            f"metric {metric!r} ranks groups by a per-group number the rewards do not "
            f"contain; pass scores= as an array [P] or [P, G] (P={shape[0]}, G={shape[1]})."
        )
    scores = np.asarray(scores, dtype=np.float64)
    allowed = (shape,) if metric in SPREAD_METRICS else ((shape[0],), shape)
    if scores.shape not in allowed:
        raise ConfigError(
            f"scores for metric {metric!r} has shape {scores.shape}; expected "
            f"{' or '.join(map(str, allowed))} to match rewards."
        )
    if not np.isfinite(scores).all():
        raise ConfigError(
            f"scores for metric {metric!r} contain NaN or inf; every score must be finite."
        )
    return scores


def no_spread(rewards: np.ndarray, rule: FilterRule, needed_by: str) -> np.ndarray:
    """bool [P]: the groups whose reward std is <= rule.zero_tol, the ones include_zero=False drops."""
    return _zero_variance(_reward_variance(rewards, rule.ddof, needed_by), rule.zero_tol)


def _zero_variance(rv: np.ndarray, zero_tol: float) -> np.ndarray:
    """bool [P]: the groups whose reward std is <= zero_tol, the ones include_zero=False drops."""
    return np.sqrt(rv) <= zero_tol


def _reward_variance(rewards: np.ndarray, ddof: int, needed_by: str) -> np.ndarray:
    """RV_i, the variance of group i's G returns, independent of their order: float [P]."""
    num_episodes = rewards.shape[1]
    if num_episodes < 2:
        raise ConfigError(
            f"{needed_by} needs the reward variance of each group, which needs at least 2 "
            f"episodes per group; rewards has shape {rewards.shape} (G={num_episodes}). "
            "Roll out G >= 2 episodes per group."
        )
    if not (isinstance(ddof, int | np.integer) and 0 <= ddof < num_episodes):
        raise ConfigError(
            f"ddof {ddof!r} must be an integer in [0, G-1={num_episodes - 1}] "
            "(1: unbiased variance, the paper's setting)."
        )
    # Sorted first: floating-point sums depend on their order, and np.var of [0,0,0,0,1,1,1] and of
    # [1,1,1,0,0,0,0] differ by 5.6e-17, enough to split equal groups at a threshold or a tie.
    rv = np.sort(rewards, axis=1).var(axis=1, ddof=ddof)
    # Equal returns can leave ~1e-33 through the rounded mean ([0.1, 0.1, 0.1] does):
    # make them exactly 0, so an all-zero batch is recognised as having no signal.
    rv[(rewards == rewards[:, :1]).all(axis=1)] = 0.0
    return rv
