"""Gradient SNR probe: how strong the task gradient is next to the regularisers, per RV bucket.

RAGEN-2 (§5, Fig. 3) explains template collapse with a signal-to-noise argument. With
group-relative advantages A_g = R_g - mean(R), the task gradient of a prompt x obeys

    ||g_task(x)|| <= sqrt(RV(x)) * sqrt(E[||grad log pi||^2 | x]),

while the gradients of the KL penalty and the entropy bonus do not depend on RV(x). The
probe measures exactly that: it splits the batch's groups into RV quantile buckets and, per
bucket, back-propagates the three loss terms *separately* and records the L2 norm of each
gradient. Nothing is stepped: the weights never change, and the parameters' `.grad` are
put back as they were, so the probe can run in the middle of a training step.

Buckets hold (nearly) equal numbers of groups, lowest RV first: `bucket0` is the lowest-RV
quantile, as `ragen2.report` draws them. Equal sizes matter because each bucket's loss is a
mean over its tokens, and the norm of a mean shrinks with the number of samples averaged
(noise ~ 1/sqrt(n)); buckets of different sizes would not be comparable.

Each term is the loss the trainer would compute if the bucket were its mini-batch (same
aggregation, same normalisation), without coefficients:

    task     policy_loss(logp, logp.detach(), A, mask, agg)   ratio = 1, where clipping is inactive,
                                                            so the gradient is -mean(A * grad log pi)
    kl       aggregate(kl_penalty(logp, ref_logp, estimator), mask, agg)
    entropy  aggregate(H(pi(. | prefix)), mask, agg)         full-vocabulary token entropy

Cost: per bucket and term, one forward and one backward pass over the bucket (plus one
reference forward for the KL term), so about three backward passes over the batch in all;
memory is one gradient buffer, as in an ordinary update.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ragen2.agent.types import Trajectory
from ragen2.filtering import group_scores
from ragen2.rl.batch import Batch, response_logits
from ragen2.rl.losses import aggregate, entropy_from_logits, kl_penalty, policy_loss, token_logprobs

__all__ = ["TERMS", "grad_snr_probe", "group_reward_variance", "rv_buckets"]

TERMS = ("task", "kl", "entropy")


def group_reward_variance(trajectories: Sequence[Trajectory], ddof: int = 1) -> dict[int, float]:
    """RV of every group: {group_id: variance of its episode returns}.

    Computed as the filter computes it (`ragen2.filtering.group_scores`, so equal returns
    give exactly 0); groups may differ in size. Every group needs at least two episodes.
    """
    returns: dict[int, list[float]] = defaultdict(list)
    for traj in trajectories:
        returns[traj.group_id].append(traj.episode_return)
    return {
        group: float(group_scores(np.array([values]), "reward_variance", ddof)[0])
        for group, values in returns.items()
    }


def rv_buckets(group_rv: Mapping[int, float], num_buckets: int) -> list[list[int]]:
    """Split group ids into RV quantile buckets, lowest RV first.

    group_rv: {group_id: RV}, P groups -> min(num_buckets, P) lists of group ids whose sizes
    differ by at most one (the larger ones first). Groups are ranked by (RV, group id), so
    ties are split deterministically; with many zero-RV groups the lowest buckets are all
    zero-RV groups rather than one oversized bucket.
    """
    if num_buckets < 1:
        raise ValueError(f"num_buckets={num_buckets} must be at least 1 (the paper uses 6).")
    ranked = sorted(group_rv, key=lambda group: (group_rv[group], group))
    if not ranked:
        return []
    return [chunk.tolist() for chunk in np.array_split(np.array(ranked), min(num_buckets, len(ranked)))]


def grad_snr_probe(
    policy: nn.Module,
    batch: Batch,
    group_rv: Mapping[int, float],
    *,
    reference: nn.Module | None = None,
    kl_estimator: str = "low_var_kl",
    num_buckets: int = 6,
    micro_batch_size: int = 8,
    agg: str = "token-mean",
    norm_tokens: float | None = None,
    kl_coef: float | None = None,
    entropy_coef: float | None = None,
    terms: Sequence[str] = TERMS,
) -> dict[str, float]:
    """Per-bucket L2 norms of the task, KL and entropy gradients of `policy` on `batch`.

    batch:     every group of the step, unfiltered (the low-RV groups are the point),
               with `advantages` [B, T-1] filled and `group_ids` [B].
    group_rv:  {group_id: RV} for every group in `batch` (`group_reward_variance`);
               groups with no row in `batch` are ignored.
    reference: the frozen policy the KL term pulls toward. None: no KL is measured and
               `kl_norm` is NaN. The KL to the current policy itself would say nothing:
               for k2 / k3 its value and gradient are exactly 0, and for k1 its gradient is
               the plain score function, not a pull toward anything.
    kl_estimator, agg, norm_tokens: as the trainer's loss (`algo.kl_estimator`, the
               algorithm's aggregation, Dr.GRPO's constant divisor). The default stays
               low_var_kl, not the trainer's k1: k1's gradient does not depend on the reference.
    micro_batch_size: sequences per forward/backward; gradients accumulate, so the result
               does not depend on it.
    kl_coef, entropy_coef: when given, the norms multiplied by them are reported too,
               i.e. the size of each term's contribution to the actual update.
    terms:     which of "task", "kl", "entropy" to measure; the others' keys are left out
               (e.g. only "task" to compare advantage estimators on one batch).

    Returns, for each bucket i (0 = lowest RV), `grad_snr/bucket{i}/` + `rv_mean`,
    `num_groups` and `{term}_norm` for each measured term (+ `kl_norm_scaled`,
    `entropy_norm_scaled` with the coefficients). Norms are over the parameters that require grad (the LoRA
    adapters under LoRA). The policy's weights and `.grad` are unchanged afterwards.
    """
    unknown = [term for term in terms if term not in TERMS]
    if unknown:
        raise ValueError(f"unknown terms {unknown}; choose from {', '.join(TERMS)}.")
    if batch.advantages is None and "task" in terms:
        raise ValueError("grad_snr_probe() needs batch.advantages for the task term; compute them before probing.")
    present = sorted(set(batch.group_ids.tolist()))
    missing = [group for group in present if group not in group_rv]
    if missing:
        raise ValueError(f"group_rv has no reward variance for the batch's groups {missing}.")
    params = [p for p in policy.parameters() if p.requires_grad]
    saved = [p.grad for p in params]
    metrics: dict[str, float] = {}
    try:
        with torch.enable_grad():
            for i, groups in enumerate(rv_buckets({g: group_rv[g] for g in present}, num_buckets)):
                rows = torch.isin(batch.group_ids, torch.tensor(groups, device=batch.group_ids.device))
                bucket = batch.select(rows.nonzero().squeeze(1))
                prefix = f"grad_snr/bucket{i}/"
                metrics[prefix + "rv_mean"] = float(np.mean([group_rv[g] for g in groups]))
                metrics[prefix + "num_groups"] = float(len(groups))
                for term in terms:
                    if term == "kl" and reference is None:
                        norm = float("nan")
                    else:
                        norm = _term_grad_norm(
                            policy, params, bucket, term, reference, kl_estimator, micro_batch_size, agg, norm_tokens
                        )
                    metrics[prefix + f"{term}_norm"] = norm
                if kl_coef is not None and "kl" in terms:
                    metrics[prefix + "kl_norm_scaled"] = kl_coef * metrics[prefix + "kl_norm"]
                if entropy_coef is not None and "entropy" in terms:
                    metrics[prefix + "entropy_norm_scaled"] = entropy_coef * metrics[prefix + "entropy_norm"]
    finally:
        for p, grad in zip(params, saved):
            p.grad = grad
    return metrics


def _term_grad_norm(
    policy: nn.Module,
    params: list[nn.Parameter],
    bucket: Batch,
    term: str,
    reference: nn.Module | None,
    kl_estimator: str,
    micro_batch_size: int,
    agg: str,
    norm_tokens: float | None,
) -> float:
    """||grad of one loss term over `bucket`||_2, accumulated over micro-batches from zero.

    Every micro-batch loss is normalised by the whole bucket's token and sequence counts
    (as the trainer does for a mini-batch), so the accumulated gradient is that of the
    bucket's aggregated loss.
    """
    counts = {"batch_tokens": bucket.mask.sum(), "batch_seqs": (bucket.mask.sum(dim=1) > 0).sum()}
    for p in params:
        p.grad = None
    for rows in torch.arange(len(bucket), device=bucket.mask.device).split(micro_batch_size):
        mb = bucket.select(rows)
        logits, start = response_logits(policy, mb)  # [b, t-1-start, V]
        if term == "entropy":
            loss = aggregate(F.pad(entropy_from_logits(logits), (start, 0)), mb.mask, agg, norm_tokens, **counts)
        else:
            logp = F.pad(token_logprobs(logits, mb.targets[:, start:]), (start, 0))  # [b, t-1]
            if term == "task":
                loss, _ = policy_loss(logp, logp.detach(), mb.advantages, mb.mask, agg=agg,
                                      norm_tokens=norm_tokens, **counts)
            else:
                with torch.no_grad():
                    ref_logits, _ = response_logits(reference, mb)
                    ref_logp = F.pad(token_logprobs(ref_logits, mb.targets[:, start:]), (start, 0))  # [b, t-1]
                loss = aggregate(kl_penalty(logp, ref_logp, kl_estimator), mb.mask, agg, norm_tokens, **counts)
        loss.backward()
    norm = _global_norm([p.grad for p in params if p.grad is not None])
    for p in params:
        p.grad = None
    return norm


def _global_norm(grads: list[Tensor]) -> float:
    """L2 norm of all gradients taken together (0 when nothing received a gradient)."""
    if not grads:
        return 0.0
    return torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.detach().float()) for g in grads])).item()
