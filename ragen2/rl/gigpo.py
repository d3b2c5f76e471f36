"""GiGPO: advantages over anchor-state groups, and SNR-aware filtering at that level.

GiGPO (verl-agent) compares each turn with the other turns of its episode group that saw the
identical observation, an anchor state, on top of GRPO's episode-level comparison. Filtering
at that level (`filter.level=anchor`) ranks the same anchor groups by the spread of their step
returns with the rules of ragen2.filtering, so the two live here side by side: what the filter
keeps is exactly what the estimator's step baseline is computed over.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Hashable, Sequence

import numpy as np

from ragen2.errors import ConfigError
from ragen2.filtering import (
    REWARD_METRICS,
    FilterRule,
    check_choice,
    check_rule,
    group_scores,
    no_spread,
    select_ranked,
)
from ragen2.rl.advantages import discounted_returns

__all__ = ["gigpo_advantages", "select_anchor_turns"]


def gigpo_advantages(
    step_rewards: Sequence[Sequence[float]],
    group_ids: Sequence[Hashable],
    anchors: Sequence[Sequence[Hashable]],
    gamma: float = 1.0,
    step_weight: float = 1.0,
    mode: str = "mean_norm",
    episode_stats: str = "steps",
    epsilon: float = 1e-6,
) -> list[np.ndarray]:
    """GiGPO: an episode-level group advantage plus a step-level one over anchor-state groups.

    E episodes. step_rewards: E lists, one per episode, of its turns' rewards (turn t of episode
    e: step_rewards[e][t]); group_ids: [E], episodes with one id share their environment seed;
    anchors: E lists of hashable observation keys, one per turn. Returns E float arrays, [T_e]
    each: the advantage of each turn, episode advantage + step_weight x step advantage.

    Episode level: each episode's return (the sum of its rewards) against its group's mean;
    `mode="mean_std_norm"` also divides by the group's std (unbiased) + epsilon. With
    `episode_stats="steps"` the mean and std run over the group's step rows, so an episode counts
    once per turn (verl-agent's code); `"episodes"` counts each episode once (the GiGPO paper).
    A group of one row gets mean 0 and std 1, as in verl-agent.
    Step level: each turn's discounted return (rewards from that turn on, discounted by gamma)
    against the other turns of its episode group that saw the identical observation (an anchor
    state group); a turn alone in its anchor group gets 0.
    """
    if mode not in ("mean_norm", "mean_std_norm"):
        raise ValueError(f"mode={mode!r} is not allowed: use 'mean_norm' or 'mean_std_norm'")
    if episode_stats not in ("steps", "episodes"):
        raise ValueError(f"episode_stats={episode_stats!r} is not allowed: use 'steps' or 'episodes'")
    if not len(step_rewards) == len(group_ids) == len(anchors):
        raise ValueError(f"expected one entry per episode, got {len(step_rewards)} step-reward lists, "
                         f"{len(group_ids)} group ids and {len(anchors)} anchor lists")
    rewards = [np.asarray(r, dtype=np.float64) for r in step_rewards]
    for e, (r, a) in enumerate(zip(rewards, anchors)):
        if len(r) != len(a):
            raise ValueError(f"episode {e} has {len(r)} step rewards but {len(a)} anchors: give one per turn")
    scaled = mode == "mean_std_norm"

    returns = [float(r.sum()) for r in rewards]
    episode_rows: dict[Hashable, list[float]] = defaultdict(list)
    for e, g in enumerate(group_ids):
        episode_rows[g] += [returns[e]] * (len(rewards[e]) if episode_stats == "steps" else 1)
    episode_norm = {g: _normaliser(rows, lone_mean=0.0) for g, rows in episode_rows.items()}

    step_returns = [discounted_returns(r, gamma) for r in rewards]
    step_rows: dict[tuple[Hashable, Hashable], list[float]] = defaultdict(list)
    for e, g in enumerate(group_ids):
        for anchor, value in zip(anchors[e], step_returns[e]):
            step_rows[g, anchor].append(value)
    step_norm = {key: _normaliser(rows, lone_mean=None) for key, rows in step_rows.items()}

    out = []
    for e, g in enumerate(group_ids):
        mean, std = episode_norm[g] if g in episode_norm else (0.0, 1.0)
        episode = (returns[e] - mean) / (std + epsilon if scaled else 1.0)
        step = np.array([
            (value - step_norm[g, anchor][0]) / (step_norm[g, anchor][1] + epsilon if scaled else 1.0)
            for anchor, value in zip(anchors[e], step_returns[e])
        ])
        out.append(episode + step_weight * step if len(step) else np.zeros(0))
    return out


def _normaliser(rows: list[float], lone_mean: float | None) -> tuple[float, float]:
    """(mean, unbiased std) of a group's rows; a single row: (lone_mean or the row itself, 1)."""
    if len(rows) == 1:
        return (rows[0] if lone_mean is None else lone_mean), 1.0
    return float(np.mean(rows)), float(np.std(rows, ddof=1))


def select_anchor_turns(
    step_rewards: Sequence[Sequence[float]],
    group_ids: Sequence[Hashable],
    anchors: Sequence[Sequence[Hashable]],
    rule: FilterRule = FilterRule(),
    gamma: float = 1.0,
) -> list[np.ndarray]:
    """Which turns to train on, filtering at GiGPO's anchor-state level: E bool arrays, [T_e] each.

    E episodes, given as `gigpo_advantages` takes them: step_rewards, E lists
    of their turns' rewards; group_ids, [E]; anchors, E lists of hashable observation keys, one per
    turn. An anchor-state group is the turns of one group whose anchors are equal; its values are
    the turns' step returns, their rewards from that turn on discounted by gamma (GiGPO's).

    The anchor groups of two or more turns are ranked as select_groups ranks prompt groups: scored
    by `rule.metric` (reward_variance, reward_std, mean_reward) over their step returns, dropped by the
    zero test with include_zero=False (std <= zero_tol), ranked across the batch (ties in order of
    first appearance) and kept by the rule's strategy and value (top_k's base: every such group). A kept
    group is kept whole, so GiGPO's step baseline over it is intact.

    A turn alone in its anchor group has no step-level comparison: GiGPO gives it the episode-level
    advantage alone. It is not ranked: it is kept, unless include_zero=False and the returns of its
    episode's group are all equal (std <= zero_tol, or a group of one episode), where that advantage is 0.
    """
    rule = check_rule(rule)
    check_choice("anchor filter metric", rule.metric, REWARD_METRICS)
    if not len(step_rewards) == len(group_ids) == len(anchors):
        raise ConfigError(f"expected one entry per episode, got {len(step_rewards)} step-reward lists, "
                          f"{len(group_ids)} group ids and {len(anchors)} anchor lists")
    rewards = [np.asarray(r, dtype=np.float64) for r in step_rewards]
    members: dict[tuple[Hashable, Hashable], list[tuple[int, int, float]]] = {}  # in order of first appearance
    for e, (g, r) in enumerate(zip(group_ids, rewards)):
        if len(r) != len(anchors[e]):
            raise ConfigError(f"episode {e} has {len(r)} step rewards but {len(anchors[e])} anchors: give one per turn")
        for t, (anchor, ret) in enumerate(zip(anchors[e], discounted_returns(r, gamma))):
            members.setdefault((g, anchor), []).append((e, t, float(ret)))
    shared = [turns for turns in members.values() if len(turns) >= 2]
    values = [np.array([[ret for *_, ret in turns]]) for turns in shared]  # [1, n] each
    score = np.array([group_scores(v, rule.metric, rule.ddof)[0] for v in values])  # [N]
    candidates = np.arange(len(shared))
    if not rule.include_zero:
        zero = [no_spread(v, rule, "the anchor filter")[0] for v in values]
        candidates = candidates[~np.array(zero, dtype=bool)]
    kept_groups = select_ranked(score, candidates, rule)
    keep = [np.zeros(len(r), dtype=bool) for r in rewards]
    for i in kept_groups:
        for e, t, _ in shared[i]:
            keep[e][t] = True
    episode_returns: dict[Hashable, list[float]] = {}
    for g, r in zip(group_ids, rewards):
        episode_returns.setdefault(g, []).append(float(r.sum()))
    for (g, _), turns in members.items():
        if len(turns) == 1 and (rule.include_zero or not _all_equal(episode_returns[g], rule)):
            e, t, _ = turns[0]
            keep[e][t] = True
    return keep


def _all_equal(returns: list[float], rule: FilterRule) -> bool:
    """True when a group's returns have no spread (std <= rule.zero_tol), as a lone episode has none."""
    if len(returns) < 2:
        return True
    return bool(no_spread(np.array([returns]), rule, "the anchor filter")[0])
