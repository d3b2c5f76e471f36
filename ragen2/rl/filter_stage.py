"""The filter stage: SNR-aware filtering of a step's groups (ragen2.filtering, RAGEN-2 §6).

The rules themselves are pure functions in ragen2.filtering; this stage feeds them the step's
returns (and the entropy or length scores some metrics need), applies `filter.*` as a
`FilterRule`, caps the kept groups at rollout.num_groups when async.oversample played more, and
logs the reward-variance statistics.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch
import torch.nn.functional as F

from ragen2.agent import Trajectory
from ragen2.config import FilterConfig
from ragen2.filtering import FilterRule, group_scores, group_stats, select_groups, select_groups_by_tag, select_trajectories
from ragen2.mixture import is_mixture, tagged_metrics
from ragen2.rl.batch import Batch, build_batch, response_logits
from ragen2.rl.forward import in_micro_batches
from ragen2.rl.gigpo import select_anchor_turns
from ragen2.rl.losses import entropy_from_logits
from ragen2.rl.run import Run


def filter_phase(run: Run, trajectories: list[Trajectory]) -> tuple[list[Trajectory], dict[str, float]]:
    """SNR-aware filtering: keep whole groups, ranked by reward variance (or `filter.metric`), and with
    `filter.trajectory_keep` < 1 only the most spread-out episodes of each (trajectory-level filtering);
    with `filter.level=anchor`, GiGPO's anchor-state groups instead of prompt groups (`anchor_filter`)."""
    f, G = run.config.filter, run.config.rollout.group_size
    P = len(trajectories) // G  # rollout.num_groups, or more candidates with async.oversample
    rewards = np.array([t.episode_return for t in trajectories]).reshape(P, G)  # [P, G], group-major
    tags = [t.tag for t in trajectories[::G]]  # [P], each group's tag
    metrics = {f"rollout/{k}": v for k, v in group_stats(rewards, f.ddof, f.zero_tol).items()}
    if f.level == "anchor":
        kept_trajectories, metrics["filter/kept_turn_ratio"] = anchor_filter(run, trajectories)
        kept = {t.group_id for t in kept_trajectories}
    else:
        scores = _measured_scores(run, trajectories, f.metric)  # [P, G] for length / entropy, else None
        rule = FilterRule.of(f)
        if f.scope == "tag":
            kept_groups = select_groups_by_tag(rewards, tags, rule, scores)
        else:
            kept_groups = select_groups(rewards, rule, scores)
        kept = set(best_groups(kept_groups, group_scores(rewards, f.metric, f.ddof, scores), f.order,
                               run.config.rollout.num_groups).tolist())
        spread = select_trajectories(rewards, f.trajectory_keep).reshape(-1)  # [P*G]; all True at trajectory_keep=1
        kept_trajectories = [t for t, keep in zip(trajectories, spread) if keep and t.group_id in kept and t.samples]
    metrics |= {
        "filter/kept_ratio": len(kept) / P,
        "filter/kept_groups": float(len(kept)),
        "filter/skipped": float(not kept),
    }
    if is_mixture(run.config):
        metrics |= tagged_metrics(lambda ids: _group_metrics(rewards[ids], ids, kept, f), range(P), tags)
    return kept_trajectories, metrics


def best_groups(kept: np.ndarray, scores: np.ndarray, order: str, limit: int) -> np.ndarray:
    """At most `limit` of the groups the filter `kept`, its best by `scores` (ties: the lower index),
    ascending: with async.oversample the filter ranks more candidates than a step trains on."""
    if len(kept) <= limit:
        return kept
    rank = np.argsort(-scores[kept] if order == "largest" else scores[kept], kind="stable")
    return np.sort(kept[rank[:limit]])


def _group_metrics(rewards: np.ndarray, ids: list[int], kept: set[int], f: FilterConfig) -> dict[str, float]:
    """One tag's reward-variance statistics and kept ratio; rewards [p, G] of its groups `ids`."""
    stats = {f"rollout/{k}": v for k, v in group_stats(rewards, f.ddof, f.zero_tol).items()}
    return stats | {"filter/kept_ratio": len(kept.intersection(ids)) / len(ids)}


def anchor_filter(run: Run, trajectories: list[Trajectory]) -> tuple[list[Trajectory], float]:
    """`filter.level=anchor`: the filter's rules over GiGPO's anchor-state groups (`select_anchor_turns`).

    Returns every episode of each group that kept a turn, as copies whose `trained_turns` name the
    kept turns (the others stay in for GiGPO's episode-level baseline, and train on nothing), and
    the share of the batch's turns kept.
    """
    keep = select_anchor_turns(
        [[turn.reward for turn in t.turns] for t in trajectories], [t.group_id for t in trajectories],
        [[turn.observation for turn in t.turns] for t in trajectories], FilterRule.of(run.config.filter),
        run.config.algo.gamma,
    )
    groups = {t.group_id for t, k in zip(trajectories, keep) if k.any()}
    kept = [dataclasses.replace(t, trained_turns=k.tolist())
            for t, k in zip(trajectories, keep) if t.group_id in groups and t.samples]
    turns = sum(len(k) for k in keep)
    return kept, sum(int(k.sum()) for k in keep) / turns if turns else 0.0


def _measured_scores(run: Run, trajectories: list[Trajectory], metric: str) -> np.ndarray | None:
    """Per-episode scores [P, G] for the filter metrics the returns do not contain."""
    G = run.config.rollout.group_size
    P = len(trajectories) // G
    if metric == "length":
        return np.array([sum(len(t.response_ids) for t in traj.turns) for traj in trajectories], float).reshape(P, G)
    if metric not in ("entropy", "entropy_variance", "entropy_std"):
        return None
    present = [i for i, t in enumerate(trajectories) if t.samples]  # episodes whose env did not fail at reset
    batch = build_batch([trajectories[i] for i in present], run.tokenizer.pad_token_id).to(run.device)

    def entropy(mb: Batch) -> torch.Tensor:
        logits, start = response_logits(run.policy, mb)
        return F.pad(entropy_from_logits(logits), (start, 0))

    with torch.no_grad():
        token_entropy = in_micro_batches(entropy, batch, run.config.algo.micro_batch_size)  # [B, T-1]
    sums = torch.zeros(len(present), device=run.device).index_add_(0, batch.traj_index, (token_entropy * batch.mask).sum(1))
    counts = torch.zeros(len(present), device=run.device).index_add_(0, batch.traj_index, batch.mask.sum(1))
    scores = np.zeros(len(trajectories))
    scores[present] = (sums / counts.clamp_min(1)).cpu().numpy()  # mean token entropy of each episode
    return scores.reshape(P, G)

