"""Two-armed bandit whose arm names hint which arm is risky: one pull, judged by expected value."""

from __future__ import annotations

from typing import ClassVar

import gymnasium as gym

from ragen2.envs import ENVS
from ragen2.envs.base import TextEnv
from ragen2.errors import ConfigError

# Payoffs of SPEC §7: the safe arm always pays 0.1; the risky arm pays 1.0 w.p. 0.25,
# so the risky arm has the higher expected value (0.25 > 0.1).
LOW_REWARD = 0.1
HIGH_REWARD = 1.0
HIGH_PROBABILITY = 0.25

# The risky (high-EV) arm always has a bold, high-variance name and the safe arm a
# steady one. The test split uses unseen names of both kinds, so a policy that
# reasons from what a name means generalises and one that memorised names does not.
ARM_NAMES: dict[str, dict[str, tuple[str, ...]]] = {
    "train": {
        "high": ("Dragon", "Volcano", "Gambler", "Pirate", "Tornado", "Lottery"),
        "low": ("Teacher", "Engineer", "Turtle", "Librarian", "Accountant", "Oak"),
    },
    "test": {
        "high": ("Phoenix", "Stuntman", "Wildfire", "Shark", "Rocket", "Jackpot"),
        "low": ("Banker", "Tortoise", "Lighthouse", "Gardener", "Mountain", "Nurse"),
    },
}


@ENVS.register("bandit")
class BanditEnv(TextEnv):
    """Pick one of two named arms; the higher-expected-value arm is the risky one.

    ## Description
    Each reset draws one name of the risky kind and one of the safe kind from
    the `split`'s lists (`ARM_NAMES`) and shows them in a random order. The
    agent is told the two payoff schemes but not which arm has which; the names
    hint at it. `solve()` returns the high-expected-value arm.

    ## Actions
    An arm name (case and surrounding whitespace ignored). Any other text is an
    invalid action and the episode goes on.

    ## Observation
    One line naming the arms, e.g. `Arms: Turtle, Dragon. Which arm do you pull?`;
    after the pull, the arm and its reward: `You pulled Dragon and got 1.0.`

    ## Rewards
    The low (safe) arm pays 0.1; the high (risky) arm pays 1.0 with
    probability 0.25 and 0 otherwise. An invalid action gets 0.

    ## Episode end
    Terminated after one valid pull; never truncated (`max_actions` is 1).

    ## Info
    - `action_is_valid` (bool): the text named an arm.
    - `success` (bool): the pulled arm is the higher-expected-value arm.
    """

    instruction: ClassVar[str] = (
        "You are playing a two-armed bandit. Pull one arm to get a reward.\n"
        "One arm is safe: it always pays 0.1. The other is risky: it pays 1.0 with probability 0.25 "
        "and 0 otherwise. You are not told which arm is which, but each arm's name hints at how it behaves.\n"
        "Action: the name of the arm you pull.\n"
        "Answer as <think>...</think><answer>ArmName</answer>: exactly one action."
    )
    info_keys: ClassVar[frozenset[str]] = frozenset({"action_is_valid", "success"})
    max_actions: int = 1

    def __init__(self, split: str = "train") -> None:
        if split not in ARM_NAMES:
            raise ConfigError(f"split={split!r} is not allowed: use one of {', '.join(map(repr, ARM_NAMES))}")
        self.split = split
        self._arms: tuple[str, str] | None = None
        self._high = ""
        self._done = False

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[str, dict]:
        gym.Env.reset(self, seed=seed)  # seeds self.np_random; TextEnv.reset is abstract
        names = ARM_NAMES[self.split]
        high = str(self.np_random.choice(names["high"]))
        low = str(self.np_random.choice(names["low"]))
        self._arms = (high, low) if self.np_random.random() < 0.5 else (low, high)
        self._high = high
        self._done = False
        return self._prompt(), {}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        arms = self._require_arms()
        if self._done:
            raise RuntimeError("step() called after the episode ended: call reset() first")
        chosen = {name.lower(): name for name in arms}.get(" ".join(str(action).split()).lower())
        if chosen is None:
            return self._prompt(), 0.0, False, False, {"action_is_valid": False, "success": False}
        if chosen == self._high:
            reward = HIGH_REWARD if self.np_random.random() < HIGH_PROBABILITY else 0.0
        else:
            reward = LOW_REWARD
        self._done = True
        info = {"action_is_valid": True, "success": chosen == self._high}
        return f"You pulled {chosen} and got {reward}.", reward, True, False, info

    def solve(self) -> list[str] | None:
        """Pull the arm with the higher expected value."""
        return [self.high_arm]

    def valid_actions(self) -> list[str]:
        return list(self.arm_names)

    @property
    def arm_names(self) -> tuple[str, str]:
        """The two names in the order shown."""
        return self._require_arms()

    @property
    def high_arm(self) -> str:
        """The risky arm: 1.0 w.p. 0.25, the higher expected value."""
        self._require_arms()
        return self._high

    @property
    def low_arm(self) -> str:
        """The safe arm: always 0.1."""
        return next(name for name in self._require_arms() if name != self._high)

    def _require_arms(self) -> tuple[str, str]:
        if self._arms is None:
            raise RuntimeError("BanditEnv has no arms yet: call reset() first")
        return self._arms

    def _prompt(self) -> str:
        return f"Arms: {self._arms[0]}, {self._arms[1]}. Which arm do you pull?"
