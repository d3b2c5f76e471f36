"""Where in an episode the reward signal is: reward variance per turn index and per anchor state.

The SNR filter asks whether a prompt's episodes disagree in reward; this asks the same one level
down. Turn k's signal is the variance, within a group (the G episodes of one seed), of the rewards
at turn k: a turn index whose rewards never vary inside a group teaches a group-relative estimator
nothing. Anchor states are GiGPO's step groups: the turns of one group that saw the identical
observation. Their spread of discounted returns is the step-level signal GiGPO trains on; when
every anchor group is a singleton or agrees, GiGPO reduces to GRPO.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import numpy as np

from ragen2.agent.types import Trajectory
from ragen2.rl.advantages import discounted_returns

# Turn indices logged one by one; later turns are pooled into the last entry's "+" key.
MAX_TURN_KEYS = 5


def turn_signal_metrics(trajectories: Sequence[Trajectory], gamma: float = 1.0) -> dict[str, float]:
    """`turns/...` metrics of one batch of rollouts (plain floats, for the metric log).

    turns/reward_var_k: mean over groups of the variance (ddof 0) of the rewards at turn k (1-based)
    among the group's episodes that reached it, over groups with two or more such episodes;
    turns/signal_frac_k: the share of those groups whose variance is above 0 (k > MAX_TURN_KEYS
    pooled as `k+`). turns/anchor_groups: anchor-state groups with two or more turns;
    turns/anchor_size_mean: their mean size; turns/anchor_return_var_mean: the mean variance of
    the discounted returns (`gamma`) inside them; turns/anchor_signal_frac: the share with a
    variance above 0.
    """
    by_group: dict[int, list[Trajectory]] = defaultdict(list)
    for t in trajectories:
        by_group[t.group_id].append(t)
    variances: dict[str, list[float]] = defaultdict(list)
    anchors: dict[tuple[int, str], list[float]] = defaultdict(list)
    for group, episodes in by_group.items():
        longest = max((len(e.turns) for e in episodes), default=0)
        for k in range(longest):
            rewards = [e.turns[k].reward for e in episodes if len(e.turns) > k]
            if len(rewards) >= 2:
                variances[_turn_key(k + 1)].append(float(np.var(rewards)))
        for e in episodes:
            returns = discounted_returns(np.array([turn.reward for turn in e.turns], dtype=np.float64), gamma)
            for turn, value in zip(e.turns, returns):
                anchors[group, turn.observation].append(float(value))
    out = {}
    for key, values in variances.items():
        out[f"turns/reward_var_{key}"] = float(np.mean(values))
        out[f"turns/signal_frac_{key}"] = float(np.mean([v > 0 for v in values]))
    shared = [values for values in anchors.values() if len(values) >= 2]
    out["turns/anchor_groups"] = float(len(shared))
    if shared:
        spreads = [float(np.var(values)) for values in shared]
        out["turns/anchor_size_mean"] = float(np.mean([len(values) for values in shared]))
        out["turns/anchor_return_var_mean"] = float(np.mean(spreads))
        out["turns/anchor_signal_frac"] = float(np.mean([s > 0 for s in spreads]))
    return out


def _turn_key(turn: int) -> str:
    return str(turn) if turn < MAX_TURN_KEYS else f"{MAX_TURN_KEYS}+"
