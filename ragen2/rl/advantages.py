"""Advantage estimators as pure tensor functions.

Layout shared by every function here: a batch of B training sequences padded to
length T. ``response_mask [B, T]`` is 1 on tokens the model generated (the ones
trained) and 0 on prompt tokens, environment tokens between turns and padding.
A whole multi-turn trajectory is one sequence, so model tokens come in several
runs separated by environment tokens.

Outcome estimators (GRPO, Dr.GRPO, RLOO) map one episode return per sequence to
one advantage per sequence, ``[B] -> [B]``; ``broadcast_to_tokens`` spreads it
over the model tokens. Token estimators (GAE, REINFORCE++) return ``[B, T]``.
Turn-level estimators (GiGPO, in ragen2.rl.gigpo) give one advantage per turn of each
episode; ``turn_values_to_tokens`` spreads each over its turn's model tokens.
RAGEN's options around the estimator (``normalize_returns`` before it,
``soft_reweight_weights`` and ``length_weighted`` after it) are at the end.

Advantages are targets, not something to differentiate: compute them from
detached rollout tensors (or under ``torch.no_grad()``). No function here reads
a config object.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Hashable, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from ragen2.rl.losses import _check_same_shape, masked_whiten

__all__ = [
    "bi_level_gae",
    "broadcast_to_tokens",
    "discounted_returns",
    "drgrpo_advantages",
    "gae_advantages",
    "grpo_advantages",
    "length_weighted",
    "normalize_returns",
    "place_terminal_reward",
    "reinforce_pp_advantages",
    "reinforce_pp_baseline_advantages",
    "rloo_advantages",
    "soft_reweight_weights",
    "turn_ends",
    "turn_values_to_tokens",
]


def _check_batch(returns: Tensor, group_ids: Tensor) -> None:
    if returns.ndim != 1 or group_ids.shape != returns.shape:
        raise ValueError(
            f"expected returns [B] and group_ids [B], got {tuple(returns.shape)} and "
            f"{tuple(group_ids.shape)}; pass one episode return and one group id per sequence."
        )


def place_terminal_reward(returns: Tensor, response_mask: Tensor) -> Tensor:
    """Put each episode return on the last model token of its sequence.

    returns: [B] float; response_mask: [B, T] -> token_rewards [B, T], zero
    everywhere except the last position where ``response_mask`` is 1. This is
    the token-reward layout GAE and REINFORCE++ expect for outcome rewards. A
    sequence with no model token has nowhere to carry its return: its row is 0.
    """
    if returns.ndim != 1 or response_mask.ndim != 2 or response_mask.shape[0] != returns.shape[0]:
        raise ValueError(
            f"expected returns [B] and response_mask [B, T], got {tuple(returns.shape)} and "
            f"{tuple(response_mask.shape)}."
        )
    valid = response_mask > 0
    positions = torch.arange(valid.shape[1], device=valid.device)
    last = torch.where(valid, positions, -1).amax(dim=1)  # [B], -1 when the row is empty
    rewards = torch.zeros(valid.shape, dtype=returns.dtype, device=returns.device)
    carried = torch.where(last >= 0, returns, 0.0)
    return rewards.scatter_(1, last.clamp_min(0)[:, None], carried[:, None])


def broadcast_to_tokens(advantages: Tensor, response_mask: Tensor) -> Tensor:
    """Give every model token of a sequence that sequence's advantage.

    advantages: [B]; response_mask: [B, T] -> [B, T], 0 on masked-out tokens.
    """
    if advantages.ndim != 1 or response_mask.ndim != 2 or response_mask.shape[0] != advantages.shape[0]:
        raise ValueError(
            f"expected advantages [B] and response_mask [B, T], got {tuple(advantages.shape)} and "
            f"{tuple(response_mask.shape)}."
        )
    return torch.where(response_mask > 0, advantages[:, None], 0.0).to(advantages.dtype)


def _group_sums(values: Tensor, group_ids: Tensor) -> tuple[Tensor, Tensor]:
    """Per-sequence group statistics without a Python loop over groups.

    values: [B]; group_ids: [B] any integers -> (size of each sequence's group
    [B], sum of ``values`` over each sequence's group [B]).
    """
    _, index = torch.unique(group_ids, return_inverse=True)  # [B] in 0..K-1
    num_groups = int(index.max()) + 1 if index.numel() else 0
    sizes = torch.zeros(num_groups, dtype=values.dtype, device=values.device).index_add_(
        0, index, torch.ones_like(values)
    )
    sums = torch.zeros(num_groups, dtype=values.dtype, device=values.device).index_add_(0, index, values)
    return sizes[index], sums[index]


def grpo_advantages(
    returns: Tensor, group_ids: Tensor, scale_by_std: bool = True, eps: float = 1e-6
) -> Tensor:
    """Group-relative advantages: A_i = (R_i - mean_g) / (std_g + eps).

    GRPO, Shao et al. 2024 (DeepSeekMath, arXiv 2402.03300, sec. 4.1.2, outcome
    supervision). returns: [B] episode returns; group_ids: [B] ints, equal for
    sequences that share a prompt / env seed (any values, any order, groups may
    differ in size) -> advantages [B].

    std_g is the unbiased (n - 1) sample standard deviation, as ``torch.std``
    in verl's ``compute_grpo_outcome_advantage``. ``scale_by_std=False`` drops
    the division (Dr.GRPO, see ``drgrpo_advantages``). A group whose returns are
    all equal gets 0 for every member. A group of one has no baseline: its
    advantage is 0 (verl passes the raw return through instead, which puts that
    sequence on a different scale from the rest of the batch).
    """
    _check_batch(returns, group_ids)
    size, total = _group_sums(returns, group_ids)
    mean = total / size
    centered = returns - mean
    if scale_by_std:
        _, sq_sum = _group_sums(centered**2, group_ids)
        std = torch.sqrt(sq_sum / (size - 1).clamp_min(1.0))
        centered = centered / (std + eps)
    # Exactly 0 for a group whose returns are all equal: the float mean of equal values can
    # round away from them (8 x -1.3), which would push the whole group one way.
    same_group = group_ids[:, None] == group_ids[None, :]  # [B, B]
    varies = ((returns[:, None] != returns[None, :]) & same_group).any(dim=1)  # [B]
    return torch.where((size > 1) & varies, centered, 0.0)


def drgrpo_advantages(returns: Tensor, group_ids: Tensor) -> Tensor:
    """Dr.GRPO advantages: A_i = R_i - mean_g, no division by the group std.

    Liu et al. 2025, "Understanding R1-Zero-Like Training" (arXiv 2503.20783):
    dividing by std up-weights groups whose returns barely vary (too easy or too
    hard prompts). returns, group_ids: [B] -> [B]. Pair with the
    ``seq-mean-token-sum`` aggregation, the other half of the Dr.GRPO fix.
    """
    return grpo_advantages(returns, group_ids, scale_by_std=False)


def rloo_advantages(returns: Tensor, group_ids: Tensor) -> Tensor:
    """Leave-one-out advantages: A_i = R_i - mean of the other G - 1 returns of the group.

    RLOO, Ahmadian et al. 2024, "Back to Basics" (arXiv 2402.14740); Kool et
    al. 2019. returns, group_ids: [B] -> [B]. The baseline excludes R_i, so the
    gradient estimate stays unbiased; algebraically A_i = G / (G - 1) *
    (R_i - mean_g). A group of one has no other member: its advantage is 0.
    """
    _check_batch(returns, group_ids)
    size, total = _group_sums(returns, group_ids)
    leave_one_out = (total - returns) / (size - 1).clamp_min(1.0)
    return torch.where(size > 1, returns - leave_one_out, 0.0)


def _gae_over_model_tokens(
    token_rewards: Tensor, values: Tensor, valid: Tensor, gamma: float, lam: float
) -> Tensor:
    """Raw GAE where the time axis is the sequence of model tokens only.

    token_rewards, values: [B, T]; valid: [B, T] bool -> advantages [B, T], 0
    where ``valid`` is False. At an environment token neither the running
    advantage nor the "next value" changes, so token t's successor is the next
    model token, possibly in the next turn. Rewards and values at masked-out
    positions are never read.
    """
    batch, length = token_rewards.shape
    advantages = torch.zeros_like(token_rewards)
    next_value = token_rewards.new_zeros(batch)  # V of the next model token; 0 after the last
    running = token_rewards.new_zeros(batch)
    for t in reversed(range(length)):  # a backward recursion: T steps, vectorised over B
        is_model = valid[:, t]
        delta = token_rewards[:, t] + gamma * next_value - values[:, t]
        running = torch.where(is_model, delta + gamma * lam * running, running)
        next_value = torch.where(is_model, values[:, t], next_value)
        advantages[:, t] = torch.where(is_model, running, 0.0)
    return advantages


def gae_advantages(
    token_rewards: Tensor,
    values: Tensor,
    response_mask: Tensor,
    gamma: float = 1.0,
    lam: float = 1.0,
    whiten: bool = True,
) -> tuple[Tensor, Tensor]:
    """Generalised advantage estimation over the model tokens of multi-turn sequences.

    Schulman et al. 2016 (arXiv 1506.02438). token_rewards, values,
    response_mask: [B, T] -> (advantages [B, T], returns [B, T]), both 0 on
    masked-out tokens.

        delta_t = r_t + gamma * V(next model token) - V_t
        A_t     = delta_t + gamma * lam * A_(next model token)

    Environment tokens are not actions, so they are not time steps: the chain
    skips them and the value after a turn's last token is the value of the next
    turn's first token (the same convention as verl's multi-turn GAE). After
    the last model token the value is 0: a sequence is a whole episode, and
    truncated episodes are not bootstrapped, as in the reference. Rewards and
    values on masked-out tokens are ignored, so put rewards on model tokens
    (``place_terminal_reward``). ``returns = A + V`` (before whitening) are the
    critic's targets. ``whiten=True`` normalises advantages over all valid
    tokens of the batch (verl's default). Defaults gamma = lam = 1 are the RAGEN
    reference settings.
    """
    _check_same_shape(token_rewards=token_rewards, values=values, response_mask=response_mask)
    valid = response_mask > 0
    advantages = _gae_over_model_tokens(token_rewards, values, valid, gamma, lam)
    returns = torch.where(valid, advantages + values, 0.0)
    if whiten:
        advantages = torch.where(valid, masked_whiten(advantages, response_mask), 0.0)
    return advantages, returns


def bi_level_gae(
    token_rewards: Tensor,
    values: Tensor,
    mask: Tensor,
    gamma: float = 1.0,
    lam: float = 1.0,
    high_level_gamma: float = 0.95,
) -> tuple[Tensor, Tensor]:
    """GAE on two levels, as RAGEN's `bi_level_gae`: over the turns of an episode, then over the tokens of a turn.

    token_rewards, values, mask: [B, T], each turn's reward on its last model token (a turn is a
    run of mask-1 tokens). Returns (advantages [B, T], whitened over the batch's model tokens;
    returns [B, T], the critic's targets), both 0 off the model tokens.

    Turn level: GAE over the turn ends only, with `high_level_gamma` and `lam`, on the critic's
    values there (0 after the last turn). The turn's return (its advantage + its value) then
    replaces the reward at its end. Token level: GAE with `gamma` and `lam` within each turn,
    ending at that return with no value after it, so the last token's advantage is the turn-level one.
    """
    _check_same_shape(token_rewards=token_rewards, values=values, mask=mask)
    valid = mask > 0
    ends = turn_ends(mask)
    turn_returns = _gae_over_model_tokens(token_rewards, values, ends, high_level_gamma, lam) + values  # at ends
    advantages = torch.zeros_like(token_rewards)
    next_value = token_rewards.new_zeros(token_rewards.shape[0])
    running = token_rewards.new_zeros(token_rewards.shape[0])
    for t in reversed(range(token_rewards.shape[1])):  # vectorised over B; a turn end restarts the recursion
        is_end, is_model = ends[:, t], valid[:, t]
        reward = torch.where(is_end, turn_returns[:, t], token_rewards[:, t])
        delta = reward + gamma * torch.where(is_end, 0.0, next_value) - values[:, t]
        running = torch.where(is_model, delta + gamma * lam * torch.where(is_end, 0.0, running), running)
        next_value = torch.where(is_model, values[:, t], next_value)
        advantages[:, t] = torch.where(is_model, running, 0.0)
    returns = torch.where(valid, advantages + values, 0.0)
    return torch.where(valid, masked_whiten(advantages, mask), 0.0), returns


def reinforce_pp_advantages(rewards: Tensor, response_mask: Tensor, gamma: float = 1.0) -> Tensor:
    """REINFORCE++ advantages: discounted return-to-go, whitened over the batch.

    Hu 2025, "REINFORCE++" (arXiv 2501.03262). rewards: [B] episode returns
    (placed on each sequence's last model token) or [B, T] token rewards;
    response_mask: [B, T] -> advantages [B, T], 0 on masked-out tokens.

    The return-to-go runs over model tokens only, like ``gae_advantages``
    (it is GAE with V = 0 and lam = 1), so earlier turns see the rewards of
    later turns; verl's version restarts the sum at every masked-out token,
    which in a multi-turn sequence would cut each turn off from the final
    reward. Whitening uses every valid token of the batch, so the baseline
    is the batch's token-weighted mean return rather than a per-prompt one;
    long sequences weigh more in that mean.
    """
    token_rewards = place_terminal_reward(rewards, response_mask) if rewards.ndim == 1 else rewards
    _check_same_shape(token_rewards=token_rewards, response_mask=response_mask)
    valid = response_mask > 0
    # With V = 0 and lam = 1, the GAE recursion is exactly the discounted return-to-go.
    returns_to_go = _gae_over_model_tokens(
        token_rewards, torch.zeros_like(token_rewards), valid, gamma, 1.0
    )
    return torch.where(valid, masked_whiten(returns_to_go, response_mask), 0.0)


def reinforce_pp_baseline_advantages(
    returns: Tensor, group_ids: Tensor, response_mask: Tensor, traj_index: Tensor | None = None
) -> Tensor:
    """REINFORCE++-baseline: the return minus its group's mean on every model token, whitened over the batch.

    Hu 2025 (arXiv 2501.03262), verl's ``reinforce_plus_plus_baseline``. returns, group_ids: [N],
    one per trajectory; response_mask: [B, T]; traj_index: [B], the trajectory of each row
    (default: row i holds trajectory i) -> advantages [B, T], 0 on masked-out tokens. The group
    mean removes each prompt's difficulty, as in GRPO; the scale comes from the whole batch
    instead of each group's std, so a group whose returns barely vary keeps small advantages.
    A group of one gets 0 before whitening, as in ``grpo_advantages`` (verl keeps its raw return).
    """
    centered = drgrpo_advantages(returns, group_ids)  # [N]
    tokens = broadcast_to_tokens(centered if traj_index is None else centered[traj_index], response_mask)
    return torch.where(response_mask > 0, masked_whiten(tokens, response_mask), 0.0)


# ----------------------------------------------------------------------------- turn-level credit


def discounted_returns(rewards: np.ndarray, gamma: float) -> np.ndarray:
    """[T] -> [T]: returns[t] = rewards[t] + gamma * returns[t + 1], what follows each turn, that turn included."""
    out = np.zeros_like(rewards)
    running = 0.0
    for t in range(len(rewards) - 1, -1, -1):
        running = rewards[t] + gamma * running
        out[t] = running
    return out


def turn_ends(response_mask: Tensor) -> Tensor:
    """[B, T] -> [B, T] bool: True on the last model token of each turn (each run of mask-1 tokens)."""
    valid = response_mask > 0
    return valid & ~F.pad(valid, (0, 1))[:, 1:]


def turn_values_to_tokens(per_turn: Sequence[Sequence[float]], traj_index: Tensor, response_mask: Tensor) -> Tensor:
    """Give every model token the value of the turn it belongs to.

    per_turn: one sequence per trajectory, a value per turn; traj_index: [B], the trajectory of
    each row; response_mask: [B, T]. A trajectory's turns are its runs of model tokens, in order
    across its rows (one row holding every turn, or one row per turn). Returns [B, T], 0 off the
    model tokens. Raises ValueError when a trajectory's runs and turns do not match in number.
    """
    valid = response_mask > 0
    starts = valid & ~F.pad(valid, (1, 0))[:, :-1]  # [B, T], the first token of each run
    run_in_row = starts.long().cumsum(dim=1) - 1  # [B, T]
    runs_per_row = starts.sum(dim=1).tolist()
    flat, first_turn = [], []  # concatenated turn values; index of each trajectory's first turn in `flat`
    for values in per_turn:
        first_turn.append(len(flat))
        flat.extend(float(v) for v in values)
    seen = defaultdict(int)  # runs met so far per trajectory
    offset = []
    for row, traj in enumerate(traj_index.tolist()):
        offset.append(first_turn[traj] + seen[traj])
        seen[traj] += runs_per_row[row]
    for traj, values in enumerate(per_turn):
        if traj in seen and seen[traj] != len(values):
            raise ValueError(f"trajectory {traj} has {seen[traj]} runs of model tokens but {len(values)} turn values")
    index = run_in_row + torch.tensor(offset, device=response_mask.device)[:, None]
    table = torch.tensor(flat + [0.0], dtype=torch.float32, device=response_mask.device)
    return torch.where(valid, table[index.clamp(0, len(flat))], 0.0)


# ----------------------------------------------------------------------------- RAGEN's options around the estimator

REWARD_NORM_METHODS = ("identity", "mean", "mean_std", "asym_clip")


def normalize_returns(returns: Tensor, groups: Sequence[Hashable], method: str = "identity") -> Tensor:
    """RAGEN's reward normalisation: each episode's return against the other returns of its group.

    returns: [N] episode returns; groups: N hashable keys (episodes with one key are normalised
    together) -> [N]. Methods: identity; mean, the return minus its group's mean; mean_std, also
    divided by the group's unbiased std + 1e-6, where a group whose std is <= 1e-6 (returns all
    equal, or a single episode) becomes 0; asym_clip, mean_std clipped to [-1, 3], so a rare success
    can stand out three times as far as a rare failure. As in RAGEN, nothing is normalised when
    every episode is its own group: there is nothing to compare a return with.
    """
    if method not in REWARD_NORM_METHODS:
        raise ValueError(f"method={method!r} is not allowed: use one of {', '.join(REWARD_NORM_METHODS)}")
    if returns.ndim != 1 or len(groups) != len(returns):
        raise ValueError(f"expected returns [N] and N group keys, got {tuple(returns.shape)} and {len(groups)} keys")
    rows_of: dict[Hashable, list[int]] = defaultdict(list)
    for i, key in enumerate(groups):
        rows_of[key].append(i)
    if method == "identity" or len(rows_of) == len(returns):
        return returns
    out = returns.clone()
    for rows in rows_of.values():
        x = returns[rows]
        centered = x - x.mean()
        if method != "mean":
            std = x.std() if len(rows) > 1 else x.new_zeros(())
            centered = centered / (std + 1e-6) if std > 1e-6 else torch.zeros_like(x)
            if method == "asym_clip":
                centered = centered.clamp(-1.0, 3.0)
        out[rows] = centered
    return out


def soft_reweight_weights(returns: Tensor, group_ids: Tensor, eps: float = 1e-6) -> Tensor:
    """RAGEN's soft advantage reweighting: a weight per episode, its group's return std over the batch's largest.

    returns, group_ids: [N] -> weights [N] in [0, 1). The soft form of SNR-aware filtering: instead
    of dropping the groups whose returns barely vary, their advantages shrink in proportion to the
    spread. std is the unbiased one, as GRPO's; a group of one has no spread and counts 0 (RAGEN
    gives it GRPO's placeholder std, 1, which would set the scale of every other group).
    """
    _check_batch(returns, group_ids)
    size, total = _group_sums(returns, group_ids)
    _, sq_sum = _group_sums((returns - total / size) ** 2, group_ids)
    std = torch.where(size > 1, torch.sqrt(sq_sum / (size - 1).clamp_min(1.0)), 0.0)
    return std / (std.max() + eps)


def length_weighted(advantages: Tensor, response_mask: Tensor) -> Tensor:
    """RAGEN's grpo_advantage_length_weight: each row's advantages over its length relative to the batch's mean.

    advantages, response_mask: [B, T] -> [B, T]. A sequence twice the mean length gets half the
    per-token advantage, so under token-mean aggregation every sequence carries about the same
    total weight, whatever its length, and long answers stop dominating the update.
    """
    _check_same_shape(advantages=advantages, response_mask=response_mask)
    lengths = response_mask.sum(dim=-1).float()  # [B]
    return advantages / ((lengths + 1e-6) / lengths.mean())[:, None]
