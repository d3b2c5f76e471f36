"""An OpenEnv environment written for the tests with `openenv-core`'s own classes: guess a number from 1 to 9."""

from __future__ import annotations

import random

from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State


class GuessAction(Action):
    guess: int


class GuessObservation(Observation):
    hint: str = ""


class GuessEnvironment(Environment):
    """Guess the hidden number from 1 to 9; each wrong guess is answered with higher or lower."""

    def __init__(self, high: int = 9) -> None:
        super().__init__()
        self.high = high
        self._state = State(step_count=0)
        self._number = 1

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs) -> GuessObservation:
        self._number = random.Random(seed).randint(1, self.high)
        self._state = State(episode_id=episode_id, step_count=0)
        return GuessObservation(hint=f"Guess a number from 1 to {self.high}.", done=False, reward=0.0)

    def step(self, action: GuessAction, timeout_s: float | None = None, **kwargs) -> GuessObservation:
        self._state.step_count += 1
        if action.guess == self._number:
            return GuessObservation(hint="Right.", done=True, reward=1.0)
        return GuessObservation(hint="Higher." if action.guess < self._number else "Lower.", done=False, reward=0.0)

    @property
    def state(self) -> State:
        return self._state


class EchoAction(Action):
    message: str


class EchoObservation(Observation):
    echoed: str = ""
    length: int = 0


class EchoEnvironment(Environment):
    """Echo the message back (OpenEnv's template environment, trimmed)."""

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs) -> EchoObservation:
        return EchoObservation(echoed="ready")

    def step(self, action: EchoAction, timeout_s: float | None = None, **kwargs) -> EchoObservation:
        return EchoObservation(echoed=action.message, length=len(action.message), reward=0.1 * len(action.message))

    @property
    def state(self) -> State:
        return State()
