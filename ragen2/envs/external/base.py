"""The one wrapper every adapted suite shares: ragen2's TextEnv contract around a game someone else wrote.

Suites differ in how they start a game, list its moves and judge one; they agree on nothing
else. `ExternalEnv` owns the parts of the contract that must not differ between them: the
seed, matching an action text against the moves the game lists, invalid actions that change
nothing, the action count and truncation at `max_actions`, a stuck game (no move left) ending
the episode, and the info dict.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass
from typing import ClassVar

import gymnasium as gym

from ragen2.envs.base import TextEnv
from ragen2.errors import ConfigError, UnknownNameError, did_you_mean


@dataclass(frozen=True)
class Outcome:
    """What one accepted move did: the next observation, its reward, and whether the game is over."""

    observation: str
    reward: float
    done: bool
    success: bool


def unknown_game(suite: str, game: str, problem: str, known: Iterable[str]) -> UnknownNameError:
    """The error for a game `suite` does not have: `problem` (with the choices) and the closest `known` games.

    An UnknownNameError, not a ConfigError: config validation reports a ConfigError raised while
    building the environment as a bad env.kwargs, and this is a bad env.name.
    """
    return UnknownNameError(
        f"env.name='{suite}:{game}': {problem}." + did_you_mean(game, known, shown=lambda g: f"{suite}:{g}")
    )


def action_key(text: str) -> str:
    """How actions are compared: case, runs of whitespace and one pair of enclosing brackets are ignored.

    So `[A C]`, `a c` and ` [a  c] ` name the same TextArena move; anything else around it does not.
    """
    key = " ".join(str(text).split()).lower()
    if key.startswith("[") and key.endswith("]") and key.count("[") == 1:
        key = " ".join(key[1:-1].split())
    return key


class ExternalEnv(TextEnv):
    """Base of the adapters: a subclass starts the game, lists its moves and applies one.

    Subclasses implement `_start(seed)` (the first observation), `_moves()` (the moves the game
    accepts now, in the form the agent should write them) and `_apply(move)` (an `Outcome`, or
    None when the game itself rejected the move; the subclass then leaves its state as it was).
    `_solution()` may return a move list that wins from the current state.
    """

    info_keys: ClassVar[frozenset[str]] = frozenset({"action_is_valid", "success"})

    def __init__(self, max_actions: int) -> None:
        if not isinstance(max_actions, int) or max_actions < 1:
            raise ConfigError(f"max_actions={max_actions!r} is not allowed: use an integer >= 1")
        self.max_actions = max_actions
        self._started = False
        self._done = False
        self._taken = 0
        self._observation = ""
        self._moves_now: list[str] | None = None

    @abstractmethod
    def _start(self, seed: int) -> str:
        """Start a new game from `seed`; return its first observation."""

    @abstractmethod
    def _moves(self) -> list[str]:
        """The moves the game accepts now."""

    @abstractmethod
    def _apply(self, move: str) -> Outcome | None:
        """Play one listed move; None when the game rejected it (state unchanged)."""

    def _solution(self) -> list[str] | None:
        return None

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[str, dict]:
        gym.Env.reset(self, seed=seed)  # seeds self.np_random; the game's own seed is drawn from it
        self._observation = self._start(int(self.np_random.integers(2**31)))
        self._started, self._done, self._taken, self._moves_now = True, False, 0, None
        return self._observation, {}

    def valid_actions(self) -> list[str]:
        self._require_running()
        if self._moves_now is None:
            self._moves_now = self._moves()
        return list(self._moves_now)

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        self._require_running()
        move = {action_key(m): m for m in self.valid_actions()}.get(action_key(action))
        outcome = None if move is None else self._apply(move)
        if outcome is None:
            return self._observation, 0.0, False, False, {"action_is_valid": False, "success": False}
        self._taken += 1
        self._moves_now = None
        done = outcome.done or (not outcome.success and not self.valid_actions())  # a stuck game is over
        truncated = not outcome.success and self._taken >= self.max_actions
        terminated = done and not truncated
        self._done = terminated or truncated
        self._observation = outcome.observation
        info = {"action_is_valid": True, "success": outcome.success}
        return outcome.observation, float(outcome.reward), terminated, truncated, info

    def solve(self) -> list[str] | None:
        """A move list that wins from the current state, where the suite or a small search gives one."""
        self._require_running()
        return self._solution()

    def _require_running(self) -> None:
        if not self._started:
            raise RuntimeError(f"{type(self).__name__} has no game yet: call reset() first")
        if self._done:
            raise RuntimeError("step() called after the episode ended: call reset() first")
