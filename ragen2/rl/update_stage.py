"""The update stage: clipped policy-gradient epochs over mini-batches, and PPO's critic.

Read top to bottom: `update_phase` (the policy before the update, off-policy correction, the
learning rate, the epochs), `policy_step` (one optimizer step accumulated over micro-batches),
`critic_step`, then the small helpers. The losses are pure functions in ragen2.rl.losses.
"""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np
import torch
import torch.nn.functional as F

from ragen2.config import Config
from ragen2.errors import ConfigError
from ragen2.rl import distributed, fsdp
from ragen2.rl.batch import Batch, response_logits
from ragen2.rl.critic import critic_values
from ragen2.rl.forward import in_micro_batches, logprobs, logprobs_of_rows, pad_to_lockstep
from ragen2.rl.losses import (
    aggregate,
    kl_penalty,
    policy_loss,
    rollout_correction,
    token_logprobs_and_entropy,
    value_loss,
)
from ragen2.rl.rollout_stage import derived_seed
from ragen2.rl.run import Run


# Loss aggregation each algorithm uses when `algo.loss_agg` is null (docs/algorithms.md).
DEFAULT_LOSS_AGG = {
    "ppo": "token-mean",
    "grpo": "token-mean",
    "drgrpo": "seq-mean-token-sum",
    "dapo": "token-mean",
    "rloo": "token-mean",
    "reinforce_pp": "token-mean",
    "reinforce_pp_baseline": "token-mean",
    "gigpo": "token-mean",
}


def update_phase(run: Run, batch: Batch, step: int, scale: float) -> dict[str, float]:
    """`algo.ppo_epochs` passes over `batch` in shuffled mini-batches, one optimizer step each.

    `scale` multiplies the actor loss (`filter.loss_scale`). Returns `train/...` metrics:
    means over the optimizer steps, and the count of steps skipped for a non-finite value.
    """
    a, cfg = run.config.algo, run.config
    correcting = a.rollout_is is not None or a.rollout_rs is not None
    if correcting and batch.rollout_logp is None:
        raise ConfigError("algo.rollout_is / algo.rollout_rs need the behaviour log-probs of every sampled token, "
                          "and this rollout did not record them (a backend or agent loop without log-probs): set "
                          "both to null")
    # The policy before this update, the denominator of the PPO ratio. Until the first optimizer step
    # nothing has changed, so the first mini-batch's own forward pass gives its rows' log-probs (detached,
    # in `policy_step`, which makes their importance weights there too) and a pass before it gives only
    # the other rows'; with one epoch of one mini-batch that pass is saved. Rejection (algo.rollout_rs)
    # changes the mask, and with it the loss's token counts, before the loss: it needs every row's first.
    order = torch.Generator().manual_seed(derived_seed(cfg.trainer.seed, step, "minibatch"))
    epochs = [torch.randperm(len(batch), generator=order).to(run.device) for _ in range(a.ppo_epochs)]
    own_first = batch.old_logp is None and a.rollout_rs is None
    with torch.no_grad():
        if batch.old_logp is None:
            old_logp = logprobs_of_rows(run.policy, batch, epochs[0][a.mini_batch_size:] if own_first else epochs[0],
                                         a.micro_batch_size)
            batch.old_logp = None if own_first else old_logp
        if a.kl_coef > 0 and batch.ref_logp is None:  # algo.kl_in_reward computed it already
            batch.ref_logp = in_micro_batches(lambda mb: logprobs(run.reference, mb), batch, a.micro_batch_size)
        correction = off_policy_correction(run, batch) if correcting and batch.old_logp is not None else {}
    factor = lr_factor(step, cfg.optim.warmup_steps, cfg.optim.schedule, cfg.trainer.total_steps)
    _set_lr(run.optimizer, cfg.optim.lr * factor)
    if run.critic_optimizer is not None:
        _set_lr(run.critic_optimizer, a.critic_lr * factor)
    history: dict[str, list[float]] = defaultdict(list)
    for permutation in epochs:
        for rows in permutation.split(a.mini_batch_size):
            mini = batch.select(rows)
            stats = policy_step(run, mini, scale)
            if batch.old_logp is None:  # the first mini-batch: its log-probs complete the old ones
                with torch.no_grad():
                    old_logp[rows, : mini.old_logp.shape[1]] = mini.old_logp
                    batch.old_logp = old_logp
                    if correcting:
                        correction = off_policy_correction(run, batch)
            if run.critic is not None:
                critic_stats = critic_step(run, mini)
                stats["value_loss"] = critic_stats["value_loss"]
                stats["skipped_nonfinite"] += critic_stats["skipped_nonfinite"]
            for key, value in stats.items():
                history[key].append(value)
    skipped = sum(history.pop("skipped_nonfinite"))
    if skipped:
        run.tracker.log_event(
            "skipped_nonfinite", f"{skipped:.0f} optimizer step(s) skipped: loss or gradient not finite", step
        )
    if run.trainee is not None:
        fsdp.sync_replica(run.trainee, run.policy)
    metrics = {f"train/{key}": _finite_mean(values) for key, values in history.items()} | correction
    return metrics | {"train/lr": cfg.optim.lr * factor, "train/skipped_nonfinite": float(skipped)}


def off_policy_correction(run: Run, batch: Batch) -> dict[str, float]:
    """`algo.rollout_is` / `algo.rollout_rs`: importance weights and rejection of the batch, from the policy
    before this update against the behaviour log-probs recorded at sampling (verl's order: once per step,
    before the mini-batches). Sets `batch.is_weights` and narrows `batch.mask`; returns `rollout_corr/...`."""
    a = run.config.algo
    weights, mask = rollout_correction(
        batch.old_logp, batch.rollout_logp, batch.mask, a.rollout_is, a.rollout_is_threshold, a.rollout_rs,
        a.rollout_rs_threshold, a.rollout_rs_threshold_lower,
    )
    valid = batch.mask.bool()
    tokens = valid.sum().clamp_min(1)
    metrics = {
        "rollout_corr/kl": float((batch.rollout_logp - batch.old_logp)[valid].sum() / tokens),
        "rollout_corr/rejected_frac": float((batch.mask - mask).sum() / tokens),
    }
    if weights is not None:
        metrics |= {
            "rollout_corr/is_weight_mean": float(weights[valid].sum() / tokens),
            "rollout_corr/is_weight_max": float(weights[valid].max()) if valid.any() else 0.0,
            "rollout_corr/is_truncated_frac": float((weights[valid] >= a.rollout_is_threshold).sum() / tokens),
        }
    batch.mask, batch.is_weights = mask, weights
    return metrics


def policy_step(run: Run, mini: Batch, scale: float) -> dict[str, float]:
    """One actor optimizer step on a mini-batch, accumulating gradients over micro-batches.

    Every micro-batch loss is normalised by the *mini-batch's* token and sequence counts, so
    the accumulated gradient is that of the whole mini-batch's aggregated loss, not a mean of
    per-micro-batch means. With several processes each computes its rows of the mini-batch
    (`distributed.my_rows`) and the gradients and statistics are summed over processes, which
    by the same normalisation gives the whole mini-batch's (with FSDP, the sharded model sums
    them itself, and ranks with fewer rows run passes that add nothing, to keep in lockstep).
    A non-finite loss or gradient norm skips the step: gradients are dropped and the weights
    and optimizer state stay as they were. Without `mini.old_logp` (an update's first mini-batch, see
    `update_phase`) the step's own log-probs, detached, are the policy before it: their importance
    weights (algo.rollout_is) are made here, and they are left in `mini.old_logp`, on every process,
    for the later mini-batches and the weights' metrics.
    """
    a = run.config.algo
    model = run.trainee or run.policy
    agg, norm = loss_agg(run.config), norm_tokens(run.config)
    counts = {"batch_tokens": mini.mask.sum(), "batch_seqs": (mini.mask.sum(dim=1) > 0).sum()}
    tokens = counts["batch_tokens"].clamp_min(1)
    totals: dict[str, torch.Tensor] = defaultdict(lambda: torch.zeros((), device=run.device))
    run.optimizer.zero_grad(set_to_none=True)
    micro_batches = distributed.my_rows(mini.attention_mask.sum(dim=1), a.micro_batch_size)
    grad_scale = fsdp.gradient_scale() if run.trainee is not None else 1.0
    own_logp = torch.zeros_like(mini.mask) if mini.old_logp is None else None
    for rows in micro_batches:
        mb = mini.select(rows)
        logits, start = response_logits(model, mb)  # [b, t-1-start, V]
        # Log-probs and full-vocabulary entropy [b, t-1], in one pass whose backward keeps only the logits.
        logp, entropy = (F.pad(x, (start, 0)) for x in token_logprobs_and_entropy(logits, mb.targets[:, start:]))
        old_logp, weights = mb.old_logp, mb.is_weights
        if own_logp is not None:
            old_logp = logp.detach()
            own_logp[rows, : old_logp.shape[1]] = old_logp
            if a.rollout_is is not None:
                weights, _ = rollout_correction(old_logp, mb.rollout_logp, mb.mask, a.rollout_is,
                                                a.rollout_is_threshold)
        pg_loss, pg_stats = policy_loss(
            logp, old_logp, mb.advantages, mb.mask, a.clip_low, a.clip_high, agg, a.clip_ratio_c,
            norm_tokens=norm, weights=weights, **counts,
        )
        loss = pg_loss
        if a.entropy_coef:  # without a bonus the entropy is only logged, and backward skips its gradient
            loss = loss - a.entropy_coef * aggregate(entropy, mb.mask, agg, norm, **counts)
        if a.kl_coef > 0:
            kl = kl_penalty(logp, mb.ref_logp, a.kl_estimator)  # [b, t-1]
            loss = loss + a.kl_coef * aggregate(kl, mb.mask, agg, norm, **counts)
            totals["kl"] += (kl.detach() * mb.mask).sum() / tokens
        (scale * grad_scale * loss).backward()
        share = mb.mask.sum() / tokens  # this micro-batch's part of the mini-batch's tokens
        totals["loss"] += loss.detach()
        totals["policy_loss"] += pg_loss.detach()
        totals["entropy"] += (entropy.detach() * mb.mask).sum() / tokens
        totals["clipfrac"] += pg_stats["clipfrac"] * share
        totals["approx_kl"] += pg_stats["approx_kl"] * share
        totals["dual_clipfrac"] += pg_stats["dual_clipfrac"] * share
    if run.trainee is not None:
        pad_to_lockstep(mini, a.micro_batch_size, len(micro_batches), lambda mb: response_logits(model, mb)[0],
                         backward=True)
    totals = _sum_over_ranks(totals, ["loss", "policy_loss", "entropy", "clipfrac", "dual_clipfrac", "approx_kl"]
                             + (["kl"] if a.kl_coef > 0 else []))
    if run.trainee is None:
        distributed.all_reduce_grads(_trainable(run.optimizer))
    if own_logp is not None:
        mini.old_logp = distributed.all_reduce_sum(own_logp)
    grad_norm = _clip_and_step(run.optimizer, totals.pop("loss"), run.config.optim.grad_clip)
    return {key: value.item() for key, value in totals.items()} | grad_norm


def critic_step(run: Run, mini: Batch) -> dict[str, float]:
    """One critic optimizer step (PPO) on the mini-batch: clipped value regression onto the GAE returns."""
    a = run.config.algo
    counts = {"batch_tokens": mini.mask.sum(), "batch_seqs": (mini.mask.sum(dim=1) > 0).sum()}
    total = torch.zeros((), device=run.device)
    sharded = run.trainee is not None
    grad_scale = fsdp.gradient_scale() if sharded else 1.0
    run.critic_optimizer.zero_grad(set_to_none=True)
    micro_batches = distributed.my_rows(mini.attention_mask.sum(dim=1), a.micro_batch_size)
    for rows in micro_batches:
        mb = mini.select(rows)
        values = critic_values(run.critic, mb.input_ids)  # [b, t-1]
        loss, _ = value_loss(values, mb.old_values, mb.value_targets, mb.mask, a.value_clip, "token-mean", **counts)
        (grad_scale * loss).backward()
        total += loss.detach()
    if sharded:
        pad_to_lockstep(mini, a.micro_batch_size, len(micro_batches),
                         lambda mb: critic_values(run.critic, mb.input_ids), backward=True)
    distributed.all_reduce_sum(total)
    if not sharded:
        distributed.all_reduce_grads(_trainable(run.critic_optimizer))
    result = _clip_and_step(run.critic_optimizer, total, run.config.optim.grad_clip)
    return {"value_loss": total.item(), "skipped_nonfinite": result["skipped_nonfinite"]}


def lr_factor(step: int, warmup_steps: int, schedule: str, total_steps: int) -> float:
    """Multiplier of the base learning rate at RL step `step` (1-based).

    Linear warm-up over the first `warmup_steps` steps, then constant, or a linear or cosine
    decay that would reach 0 one step after `total_steps` (so the last step still learns).
    """
    if step <= warmup_steps:
        return step / warmup_steps
    progress = (step - warmup_steps - 1) / max(1, total_steps - warmup_steps)  # in [0, 1)
    if schedule == "linear":
        return 1.0 - progress
    if schedule == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * progress))
    return 1.0


def loss_agg(config: Config) -> str:
    return config.algo.loss_agg or DEFAULT_LOSS_AGG[config.algo.name]


def norm_tokens(config: Config) -> float | None:
    """Dr.GRPO's constant divisor for seq-mean-token-sum: the generation budget of one sequence."""
    if loss_agg(config) != "seq-mean-token-sum":
        return None
    r = config.rollout
    return float(r.max_tokens_per_turn * (1 if r.memory == "window" else r.max_turns))


def _sum_over_ranks(totals: dict[str, torch.Tensor], keys: list[str]) -> dict[str, torch.Tensor]:
    """`totals[key]` summed over processes, for `keys` (a rank without rows has none of them yet)."""
    summed = distributed.all_reduce_sum(torch.stack([totals[key] for key in keys]))  # [K]
    return dict(zip(keys, summed))


def _trainable(optimizer: torch.optim.Optimizer) -> list[torch.nn.Parameter]:
    return [p for group in optimizer.param_groups for p in group["params"]]


def _clip_and_step(optimizer: torch.optim.Optimizer, loss: torch.Tensor, max_norm: float) -> dict[str, float]:
    """Clip the gradient norm and step, or drop the gradients when the loss or norm is not finite."""
    params = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
    norm = fsdp.grad_norm_value(torch.nn.utils.clip_grad_norm_(params, max_norm if max_norm > 0 else float("inf")))
    if not (torch.isfinite(loss) and torch.isfinite(norm)):
        optimizer.zero_grad(set_to_none=True)
        return {"grad_norm": float("nan"), "skipped_nonfinite": 1.0}
    optimizer.step()
    return {"grad_norm": norm.item(), "skipped_nonfinite": 0.0}


def _set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


def _finite_mean(values: list[float]) -> float:
    finite = [v for v in values if math.isfinite(v)]
    return float(np.mean(finite)) if finite else float("nan")

