"""KL to the reference folded into the reward, with a fixed or adaptive coefficient.

The loss-term KL (`algo.kl_coef`) pulls the policy toward the reference through the gradient of
a penalty. RAGEN (through verl's `apply_kl_penalty`, `algorithm.use_kl_in_reward`) can instead
subtract the penalty from the token rewards before the advantage estimator, so the critic and the
return-to-go see it as a cost like any other:

    r'_t = r_t - beta * KL_t        (KL_t from the policy that sampled the batch and the reference)

beta is fixed, or adapted after every step toward a target KL (Ziegler et al. 2019,
arXiv 1909.08593, as verl's `AdaptiveKLController`):

    e = clip(KL / target - 1, -0.2, 0.2);   beta <- beta * (1 + e * n / horizon)

with KL the batch's mean KL and n the number of sequences in the batch. The controller's beta
is training state: checkpoints save it (`state_dict`), so a resumed run continues with it.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ragen2.rl.losses import _check_same_shape, kl_penalty

__all__ = ["KLController", "kl_reward_penalty", "mean_sequence_kl"]

MAX_ERROR = 0.2  # the adaptive controller's clip on the proportional error (verl, Ziegler et al.)


class KLController:
    """The coefficient beta of the KL in the reward: fixed, or adaptive toward `target`.

    `target=None` gives the fixed controller (`update` changes nothing). Otherwise `update`
    applies verl's rule above; a non-finite measured KL leaves beta unchanged, so one diverged
    batch cannot turn every later reward into NaN.
    """

    def __init__(self, value: float, target: float | None = None, horizon: float = 10000) -> None:
        if target is not None and not (target > 0 and horizon > 0):
            raise ValueError(f"the adaptive KL controller needs target > 0 and horizon > 0, got {target} and {horizon}")
        self.value, self.target, self.horizon = float(value), target, horizon

    def update(self, current_kl: float, n_steps: int) -> None:
        """Move beta after a batch of `n_steps` sequences whose mean KL was `current_kl`."""
        if self.target is None or not math.isfinite(current_kl):
            return
        error = float(np.clip(current_kl / self.target - 1, -MAX_ERROR, MAX_ERROR))
        self.value *= 1 + error * n_steps / self.horizon

    def state_dict(self) -> dict[str, Any]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.value = float(state["value"])


def kl_reward_penalty(
    token_rewards: Tensor, logp: Tensor, ref_logp: Tensor, mask: Tensor, beta: float, kind: str = "k1"
) -> Tensor:
    """token_rewards - beta * KL per model token: [B, T] each -> [B, T].

    logp: log-probs of the sampled tokens under the policy that sampled them; ref_logp: under
    the reference; mask: 1 on model tokens. `kind` is the estimator (`kl_penalty`). Tokens off
    the mask keep their reward (0 there in the trainer).
    """
    _check_same_shape(token_rewards=token_rewards, logp=logp, ref_logp=ref_logp, mask=mask)
    return token_rewards - beta * torch.where(mask > 0, kl_penalty(logp, ref_logp, kind), 0.0)


def mean_sequence_kl(logp: Tensor, ref_logp: Tensor, mask: Tensor, kind: str = "k1") -> float:
    """The KL the adaptive controller reads: each sequence's mean over its model tokens, then
    the mean over sequences (verl's `current_kl`). logp, ref_logp, mask: [B, T].

    A sequence without a model token is left out (verl counts it as 0); NaN when none has one.
    """
    _check_same_shape(logp=logp, ref_logp=ref_logp, mask=mask)
    valid = mask > 0
    tokens = valid.sum(dim=1)  # [B]
    per_sequence = torch.where(valid, kl_penalty(logp, ref_logp, kind), 0.0).sum(dim=1) / tokens.clamp_min(1)
    rows = tokens > 0
    return float(per_sequence[rows].double().mean()) if rows.any() else float("nan")
