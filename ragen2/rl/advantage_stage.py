"""The advantage stage: pad the kept trajectories into a Batch and attach advantages.

The estimators are pure tensor functions in ragen2.rl.advantages (and ragen2.rl.gigpo); this stage
chooses one by `algo.name`, applies RAGEN's options around it in RAGEN's order, and with
`algo.kl_in_reward` puts the KL penalty in the rewards and lets the controller move beta.
"""

from __future__ import annotations

import torch

from ragen2.agent import Trajectory
from ragen2.errors import Ragen2Error
from ragen2.rl.advantages import (
    bi_level_gae,
    broadcast_to_tokens,
    drgrpo_advantages,
    gae_advantages,
    grpo_advantages,
    length_weighted,
    normalize_returns,
    place_terminal_reward,
    reinforce_pp_advantages,
    reinforce_pp_baseline_advantages,
    rloo_advantages,
    soft_reweight_weights,
    turn_ends,
    turn_values_to_tokens,
)
from ragen2.rl.batch import Batch, build_batch
from ragen2.rl.critic import critic_values
from ragen2.rl.forward import in_micro_batches, logprobs
from ragen2.rl.gigpo import gigpo_advantages
from ragen2.rl.kl_control import kl_reward_penalty, mean_sequence_kl
from ragen2.rl.run import Run


# Outcome estimators: one advantage per trajectory from its return and its group's returns.
OUTCOME_ADVANTAGES = {
    "grpo": grpo_advantages,
    "dapo": grpo_advantages,
    "drgrpo": drgrpo_advantages,
    "rloo": rloo_advantages,
}


# What groups episodes for reward normalisation (`algo.reward_norm_grouping`; RAGEN's group_id, tag, one batch).
REWARD_NORM_GROUPING = {
    "state": lambda t: t.group_id,
    "inductive": lambda t: t.env_name,
    "batch": lambda t: None,
}


def advantage_phase(run: Run, kept: list[Trajectory]) -> Batch:
    """Pad the kept trajectories into a Batch and attach advantages (and PPO's value targets).

    In RAGEN's order (docs/algorithms.md): returns normalised within their groups, the estimator,
    soft reweighting by group std, length weighting, `algo.task_advantage_scale`.
    """
    a = run.config.algo
    batch = build_batch(kept, run.tokenizer.pad_token_id).to(run.device)
    if a.kl_in_reward:  # the policy that sampled the batch and the reference, for the KL in the reward
        with torch.no_grad():
            batch.old_logp = in_micro_batches(lambda mb: logprobs(run.policy, mb), batch, a.micro_batch_size)
            batch.ref_logp = in_micro_batches(lambda mb: logprobs(run.reference, mb), batch, a.micro_batch_size)
    # Per trajectory, not per sequence: with one sequence per turn, a long episode must
    # not weigh more in its group's baseline.
    returns = torch.tensor([t.episode_return for t in kept], device=run.device)  # [N]
    groups = torch.tensor([t.group_id for t in kept], device=run.device)  # [N]
    if a.reward_norm_method != "identity":
        keys = [REWARD_NORM_GROUPING[a.reward_norm_grouping](t) for t in kept]
        returns = normalize_returns(returns, keys, a.reward_norm_method)
        batch.returns = returns[batch.traj_index]  # what the token-reward estimators read
    if a.name == "ppo":
        with torch.no_grad():
            batch.old_values = in_micro_batches(
                lambda mb: critic_values(run.critic, mb.input_ids), batch, a.micro_batch_size,
                lockstep=run.trainee is not None,  # with FSDP the critic is sharded too
            )
        token_rewards, values = _token_rewards(run, kept, batch), batch.old_values
        if a.bi_level_gae:
            advantages, batch.value_targets = bi_level_gae(token_rewards, values, batch.mask, a.gamma, a.lam,
                                                           a.high_level_gamma)
        else:
            advantages, batch.value_targets = gae_advantages(token_rewards, values, batch.mask, a.gamma, a.lam)
    elif a.name == "reinforce_pp":
        advantages = reinforce_pp_advantages(_token_rewards(run, kept, batch), batch.mask, a.gamma)
    elif a.name == "gigpo":  # one advantage per turn: anchor states are the observations each turn saw
        per_turn = gigpo_advantages(
            [[turn.reward for turn in t.turns] for t in kept], [t.group_id for t in kept],
            [[turn.observation for turn in t.turns] for t in kept], gamma=a.gamma, step_weight=a.gigpo_step_weight,
            mode=a.gigpo_mode, episode_stats=a.gigpo_episode_stats,
        )
        advantages = turn_values_to_tokens(per_turn, batch.traj_index, batch.mask)  # [B, T-1]
    elif a.name == "reinforce_pp_baseline":
        advantages = reinforce_pp_baseline_advantages(returns, groups, batch.mask, batch.traj_index)
    else:
        per_trajectory = OUTCOME_ADVANTAGES[a.name](returns, groups)  # [N]
        advantages = broadcast_to_tokens(per_trajectory[batch.traj_index], batch.mask)  # [B, T-1]
    if a.soft_advantage_reweight:
        advantages = advantages * soft_reweight_weights(returns, groups)[batch.traj_index, None]
    if a.grpo_advantage_length_weight:
        advantages = length_weighted(advantages, batch.mask)
    batch.advantages = a.task_advantage_scale * advantages
    roles = run.config.agent.train_roles
    if roles or any(t.trained_turns is not None for t in kept):
        batch = kept_turns_only(kept, batch, roles)
    return batch


def trained_turns(trajectory: Trajectory, train_roles: list[str] | None) -> list[bool]:
    """Which turns of `trajectory` train: those `filter.level=anchor` kept (`trained_turns`; every turn without
    it) whose role is one of `agent.train_roles` (any role when it is empty or null)."""
    kept = trajectory.trained_turns or [True] * len(trajectory.turns)
    return [k and (not train_roles or turn.role in train_roles) for k, turn in zip(kept, trajectory.turns)]


def kept_turns_only(kept: list[Trajectory], batch: Batch, train_roles: list[str] | None = None) -> Batch:
    """The batch with the turns that do not train (`trained_turns`) masked out, after the advantages (their turns
    still counted in the returns and GiGPO's baselines), and without the rows left with no trained token."""
    flags = [[float(k) for k in trained_turns(t, train_roles)] for t in kept]
    trained = turn_values_to_tokens(flags, batch.traj_index, batch.mask)  # [B, T-1], 1 on trained turns' tokens
    batch.mask, batch.advantages = batch.mask * trained, batch.advantages * trained
    rows = batch.mask.any(dim=1).nonzero().squeeze(1)
    if train_roles and len(rows) == 0:
        seen = sorted({str(turn.role) for t in kept for turn in t.turns})
        raise Ragen2Error(f"agent.train_roles={train_roles}: no call of the batch has one of these roles (the calls' "
                          f"roles: {', '.join(seen)}); send X-Ragen2-Role or set the model field to a role to train")
    return batch.select(rows)


def _token_rewards(run: Run, kept: list[Trajectory], batch: Batch) -> torch.Tensor:
    """[B, T-1]: each turn's reward on its last model token (algo.turn_rewards), else each row's return on its last;
    with `algo.kl_in_reward`, minus beta x the KL to the reference on every model token."""
    a = run.config.algo
    if a.turn_rewards:
        per_turn = [[turn.reward for turn in t.turns] for t in kept]
        rewards = turn_values_to_tokens(per_turn, batch.traj_index, batch.mask) * turn_ends(batch.mask)
    else:
        rewards = place_terminal_reward(batch.returns, batch.mask)
    if a.kl_in_reward:
        rewards = kl_reward_penalty(rewards, batch.old_logp, batch.ref_logp, batch.mask, run.kl_ctrl.value,
                                    a.kl_estimator)
    return rewards


def kl_control_phase(run: Run, batch: Batch) -> dict[str, float]:
    """`algo.kl_in_reward`: log the beta this step's rewards used and the batch's mean KL, then let the
    controller move beta for the next step (verl's `apply_kl_penalty` order)."""
    a = run.config.algo
    kl = mean_sequence_kl(batch.old_logp, batch.ref_logp, batch.mask, a.kl_estimator)
    metrics = {"train/reward_kl": kl, "train/reward_kl_coef": run.kl_ctrl.value}
    run.kl_ctrl.update(kl, len(batch))
    return metrics

