"""Corridor: the exit's colour is shown once, in the first room; the doors are at the end. A task for memory."""

from __future__ import annotations

from typing import ClassVar

import gymnasium as gym

from ragen2.envs import ENVS
from ragen2.envs.base import TextEnv
from ragen2.errors import ConfigError

COLORS = ("red", "green", "blue", "yellow", "white", "black")
FORWARD = "Forward"


def open_action(color: str) -> str:
    return f"Open {color}"


@ENVS.register("corridor")
class CorridorEnv(TextEnv):
    """Walk down a corridor and open the exit door, whose colour a sign showed only in the first room.

    ## Description
    The episode starts in room 1 of `rooms`, where a sign names the exit door's colour, drawn
    uniformly from the first `doors` of red, green, blue, yellow, white, black. Later rooms do not
    repeat it. At the last room the doors are listed; opening the exit wins. The colour is needed
    only at the end, so an agent that sees only its last turn (`rollout.memory=window`) must guess
    (success 1 / `doors`), while one that sees the whole history, or wrote the colour into a memory
    note (`rollout.memory=summary`), can read it (docs/memory.md).

    ## Actions
    `Forward` (in every room but the last) and `Open COLOR` (in the last room, COLOR one of the
    doors); case and spacing are ignored.

    ## Observation
    `Room k of N.`, then in room 1 the sign (`A sign here reads: the exit is the green door.`),
    in the rooms between `The corridor goes on: Forward.`, and in the last room the doors
    (`The end of the corridor. Doors: red, green, blue, yellow.`).

    ## Rewards
    1 for opening the exit, 0 otherwise (a wrong door, invalid actions).

    ## Episode end
    Terminated when a door is opened (success if it is the exit). Truncated after `max_actions`
    valid actions (default: `rooms` + 2). Invalid actions do not count.

    ## Info
    - `action_is_valid` (bool): the text was an action of this room.
    - `success` (bool): the exit was opened.
    """

    instruction: ClassVar[str] = (
        "You walk down a corridor of rooms to its end, where there are doors of several colours. One is the exit. "
        "A sign in the first room tells which; no later room repeats it.\n"
        "Actions: Forward (to the next room), or Open COLOR at the end (e.g. Open red).\n"
        "Rewards: 1 for opening the exit, 0 for any other door; opening a door ends the game.\n"
        "Answer as <think>...</think><answer>Action</answer>: one action per turn (several are separated by ||)."
    )

    def __init__(self, rooms: int = 6, doors: int = 4, max_actions: int | None = None) -> None:
        if rooms < 2:
            raise ConfigError(f"rooms={rooms} is not allowed: use an integer >= 2 (the sign's room and the doors')")
        if not 2 <= doors <= len(COLORS):
            raise ConfigError(f"doors={doors} is not allowed: use an integer from 2 to {len(COLORS)}")
        max_actions = rooms + 2 if max_actions is None else max_actions
        if max_actions < rooms:
            raise ConfigError(f"max_actions={max_actions} is not allowed: reaching the doors takes {rooms - 1} "
                              f"moves and opening one more, so use an integer >= {rooms}")
        self.rooms, self.doors, self.max_actions = rooms, doors, max_actions
        self.colors = COLORS[:doors]
        self.exit = ""
        self.room = 0  # 0-based
        self._taken = 0
        self._done = True

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[str, dict]:
        gym.Env.reset(self, seed=seed)
        self.exit = self.colors[int(self.np_random.integers(self.doors))]
        self.room, self._taken, self._done = 0, 0, False
        return self._text(), {}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        if self._done:
            raise RuntimeError("step() called after the episode ended: call reset() first")
        wanted = " ".join(str(action).split()).lower()
        chosen = next((a for a in self.valid_actions() if a.lower() == wanted), None)
        if chosen is None:
            return self._text(), 0.0, False, False, {"action_is_valid": False, "success": False}
        self._taken += 1
        if chosen == FORWARD:
            self.room += 1
            success = terminated = False
        else:
            success, terminated = chosen == open_action(self.exit), True
        truncated = not terminated and self._taken >= self.max_actions
        self._done = terminated or truncated
        observation = f"You opened the {chosen.split()[1]} door." if terminated else self._text()
        return observation, float(success), terminated, truncated, {"action_is_valid": True, "success": success}

    def valid_actions(self) -> list[str]:
        return [FORWARD] if self.room < self.rooms - 1 else [open_action(c) for c in self.colors]

    def solve(self) -> list[str] | None:
        return [FORWARD] * (self.rooms - 1 - self.room) + [open_action(self.exit)]

    def _text(self) -> str:
        where = f"Room {self.room + 1} of {self.rooms}."
        if self.room == self.rooms - 1:
            return f"{where} The end of the corridor. Doors: {', '.join(self.colors)}."
        if self.room == 0:
            return f"{where} A sign here reads: the exit is the {self.exit} door. The corridor goes on: {FORWARD}."
        return f"{where} The corridor goes on: {FORWARD}."
