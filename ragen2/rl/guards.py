"""Early-stop guards: end a run whose learning signal or held-out success has gone.

RAGEN-2's reference trainer stops a run in two situations (SPEC §6):

- **reward-variance collapse**: the batch's mean reward variance (`rollout/rv_mean`) stays
  below `fraction` (10%) of its mean over the first `warmup` (10) steps for `patience` (5)
  consecutive steps. With A = R - mean(R) the task gradient of a group is bounded by
  sqrt(RV), and under any group baseline it is 0 at RV = 0, so once nearly every group's
  rollouts return the same reward there is nothing left to learn from, and what remains of
  the update is the input-agnostic regularisers that drive template collapse.
- **validation floor**: held-out success (`eval/success_rate`) stays below `floor` (1%) for
  `patience` (5) consecutive evaluations: the run is not learning the task at all.

The guards are pure bookkeeping over the per-step metric dicts: `update(step, metrics)`
returns the reason in words when a guard fires and None otherwise; the trainer decides what
stopping means. Each guard reads only its own key and ignores a step it has already seen,
so feeding the same step twice (once after the update, once after the evaluation) is safe,
and so is replaying the steps after a checkpoint. `state_dict` goes into checkpoints.
"""

from __future__ import annotations

import math
from typing import Any

from ragen2.config import EarlyStopConfig

__all__ = ["EarlyStopGuards", "RewardVarianceGuard", "ValidationFloorGuard"]

RV_KEY = "rollout/rv_mean"
EVAL_KEY = "eval/success_rate"


class RewardVarianceGuard:
    """Stop when `rollout/rv_mean` stays below `fraction` x its warm-up mean for `patience` steps.

    The baseline is the mean over the first `warmup` steps that report the key; the
    comparisons start at the next one, so the earliest firing step is warmup + patience.
    A run with no reward variance at all during warm-up has no baseline to fall from: the
    guard stays quiet (`trainer.max_skipped_steps` ends such runs). Non-finite values are
    not counted.
    """

    def __init__(self, fraction: float = 0.1, warmup: int = 10, patience: int = 5) -> None:
        self.fraction, self.warmup, self.patience = fraction, warmup, patience
        self.warmup_values: list[float] = []
        self.baseline: float | None = None  # mean rv_mean over the warm-up steps
        self.streak = 0  # consecutive steps below the threshold, up to the last one seen
        self.last_step = 0

    @property
    def threshold(self) -> float | None:
        return None if self.baseline is None else self.fraction * self.baseline

    def update(self, step: int, metrics: dict[str, float]) -> str | None:
        value = metrics.get(RV_KEY)
        if step <= self.last_step or value is None or not math.isfinite(value):
            return None
        self.last_step = step
        if self.baseline is None:
            self.warmup_values.append(value)
            if len(self.warmup_values) == self.warmup:
                self.baseline = sum(self.warmup_values) / self.warmup
            return None
        self.streak = self.streak + 1 if value < self.threshold else 0
        if self.streak < self.patience:
            return None
        return (
            f"reward-variance collapse: {RV_KEY} = {value:.4g} at step {step}, below {self.fraction:.0%} of its "
            f"mean over the first {self.warmup} steps ({self.baseline:.4g}, threshold {self.threshold:.4g}) for "
            f"{self.streak} consecutive steps. The rollouts of each prompt now return (nearly) the same reward, "
            "so the task gradient has vanished: the policy solves or fails each seed every time. Continue anyway "
            "with early_stop.rv_collapse=false; a higher rollout.temperature or a larger rollout.group_size "
            "restores variance."
        )

    def state_dict(self) -> dict[str, Any]:
        return {
            "warmup_values": list(self.warmup_values),
            "baseline": self.baseline,
            "streak": self.streak,
            "last_step": self.last_step,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.warmup_values = [float(v) for v in state["warmup_values"]]
        self.baseline = state["baseline"]
        self.streak = int(state["streak"])
        self.last_step = int(state["last_step"])


class ValidationFloorGuard:
    """Stop when `eval/success_rate` stays below `floor` for `patience` evaluations in a row.

    Only steps whose metrics hold an evaluation count; any evaluation at or above the floor
    resets the count.
    """

    def __init__(self, floor: float = 0.01, patience: int = 5) -> None:
        self.floor, self.patience = floor, patience
        self.streak = 0  # consecutive evaluations below the floor
        self.first_below: int | None = None  # step of the first evaluation of the current streak
        self.last_step = -1  # step 0 is the evaluation of the starting policy

    def update(self, step: int, metrics: dict[str, float]) -> str | None:
        value = metrics.get(EVAL_KEY)
        if step <= self.last_step or value is None or not math.isfinite(value):
            return None
        self.last_step = step
        if value >= self.floor:
            self.streak, self.first_below = 0, None
            return None
        self.streak += 1
        if self.first_below is None:
            self.first_below = step
        if self.streak < self.patience:
            return None
        return (
            f"validation floor: {EVAL_KEY} = {value:.3g} at step {step}, below {self.floor:.3g} for {self.streak} "
            f"consecutive evaluations (since step {self.first_below}). The policy is not learning the task; check "
            "the reward and the response format (rollout/ metrics), or lower optim.lr. Continue anyway with "
            "early_stop.eval_floor=false."
        )

    def state_dict(self) -> dict[str, Any]:
        return {"streak": self.streak, "first_below": self.first_below, "last_step": self.last_step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.streak = int(state["streak"])
        self.first_below = state["first_below"]
        self.last_step = int(state["last_step"])


class EarlyStopGuards:
    """The guards `early_stop.*` switches on, updated together; the first reason wins."""

    def __init__(self, config: EarlyStopConfig) -> None:
        self.rv: RewardVarianceGuard | None = None
        if config.rv_collapse:
            self.rv = RewardVarianceGuard(config.rv_fraction, config.rv_warmup, config.rv_patience)
        self.eval = ValidationFloorGuard(config.eval_success_floor, config.eval_patience) if config.eval_floor else None

    def update(self, step: int, metrics: dict[str, float]) -> str | None:
        reasons = [guard.update(step, metrics) for guard in (self.rv, self.eval) if guard is not None]
        return next((reason for reason in reasons if reason), None)

    def state_dict(self) -> dict[str, Any]:
        return {name: guard.state_dict() for name, guard in (("rv", self.rv), ("eval", self.eval)) if guard is not None}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the enabled guards; a guard the checkpoint did not have starts afresh."""
        for name, guard in (("rv", self.rv), ("eval", self.eval)):
            if guard is not None and name in state:
                guard.load_state_dict(state[name])
