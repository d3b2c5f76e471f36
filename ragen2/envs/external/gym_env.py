"""Gymnasium environments with discrete actions as ragen2 environments: `make("gym:Blackjack-v1")`.

Observations become text through a renderer: one written for the environment where
`RENDERERS` has it (named actions, the state in words), else a generic one (the ansi
rendering when the environment has one, else the observation's repr; actions are then
the numbers 0..n-1).
"""

from __future__ import annotations

from collections.abc import Callable
import re
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np

from ragen2.envs.base import SEVERAL_ACTIONS_ANSWER
from ragen2.envs.external.base import ExternalEnv, Outcome, unknown_game
from ragen2.errors import ConfigError


@dataclass(frozen=True)
class Renderer:
    """How one Gymnasium environment reads as text."""

    actions: tuple[str, ...]
    """The name of each discrete action, by index."""
    text: Callable[[gym.Env, Any], str]
    """(env, observation) -> the observation text."""
    success: Callable[[float, bool], bool]
    """(last reward, terminated) -> whether the episode was won."""
    about: str
    """The task, the actions and the rewards, for the instruction."""


def _blackjack(env: gym.Env, obs: Any) -> str:
    player, dealer, usable_ace = obs
    return f"Your hand sums to {player}{' (with a usable ace)' if usable_ace else ''}; the dealer shows {dealer}."


def _ansi(env: gym.Env, obs: Any) -> str:
    """The ansi rendering without its colour codes (a highlighted cell keeps only its letter)."""
    return re.sub(r"\x1b\[[0-9;]*m", "", str(env.render())).strip("\n")


def _frozenlake(env: gym.Env, obs: Any) -> str:
    rows = [[c.decode() for c in row] for row in env.unwrapped.desc]
    r, c = divmod(int(obs), len(rows[0]))
    rows[r][c] = "P"
    return "\n".join("".join(row) for row in rows) + f"\nYou are at (row {r}, col {c})."


def _taxi(env: gym.Env, obs: Any) -> str:
    """The map (its colours stripped) and, in words, what the colours showed."""
    row, col, passenger, destination = env.unwrapped.decode(int(obs))
    locs = env.unwrapped.locs
    where = "in the taxi" if passenger == 4 else f"waiting at {'RGYB'[passenger]} (row {locs[passenger][0]}, col {locs[passenger][1]})"
    return (_ansi(env, obs).split("\n  (")[0] + f"\nTaxi at (row {row}, col {col}); passenger {where}; destination "
            f"{'RGYB'[destination]} (row {locs[destination][0]}, col {locs[destination][1]}).")


RENDERERS: dict[str, Renderer] = {
    "Blackjack-v1": Renderer(
        ("Stick", "Hit"), _blackjack, lambda r, t: t and r > 0,
        "Blackjack against a dealer. Hit draws a card, Stick ends your turn. Rewards: +1 win, -1 loss, 0 draw."),
    "FrozenLake-v1": Renderer(
        ("Left", "Down", "Right", "Up"), _frozenlake, lambda r, t: t and r > 0,
        "FrozenLake: walk from the start S to the goal G over frozen cells F without falling into a hole H; P is you. "
        "Rows count from 0 at the top. The ice is slippery by default. Rewards: 1 at the goal."),
    "CliffWalking-v1": Renderer(
        ("Up", "Right", "Down", "Left"), _ansi, lambda r, t: t,
        "CliffWalking: walk from the bottom-left corner to the goal at the bottom-right without stepping off the "
        "cliff (C) between them; x is you. Rewards: -1 per step, -100 for the cliff."),
    "Taxi-v4": Renderer(
        ("South", "North", "East", "West", "Pickup", "Dropoff"), _taxi, lambda r, t: t and r > 0,
        "Taxi: drive to the passenger, pick them up, drive to the destination and drop them off; rows count "
        "from 0 at the top, South increases the row. Rewards: -1 per step, +20 for a delivery, -10 for a wrong pickup or dropoff."),
}


class GymnasiumEnv(ExternalEnv):
    """One Gymnasium environment with a discrete action space, read as text.

    ## Observation / Actions
    `RENDERERS`' text and action names for the environments it has; otherwise the ansi
    rendering (or the observation's repr) and the action numbers `0`..`n-1`.

    ## Rewards / Episode end
    Gymnasium's rewards; terminated when Gymnasium terminates, truncated after `max_actions`
    actions (Gymnasium's own time limit, when shorter, also ends the episode).

    ## Info
    - `action_is_valid` (bool), `success` (bool: the renderer's rule, else a positive final reward).
    """

    def __init__(self, env_id: str, max_actions: int = 100, **gym_kwargs: Any) -> None:
        if env_id not in gym.registry:
            raise unknown_game("gym", env_id, f"{env_id} is not a registered Gymnasium environment; with text "
                               f"renderers: {', '.join(RENDERERS)} (any other registered id with a Discrete "
                               "action space plays with numbered actions)", gym.registry)
        spec = gym.registry[env_id]
        renderer = RENDERERS.get(env_id)
        modes = spec.kwargs.get("render_modes") or getattr(gym.envs.registration.load_env_creator(spec.entry_point),
                                                          "metadata", {}).get("render_modes", [])
        if "ansi" in modes and "render_mode" not in gym_kwargs:
            gym_kwargs["render_mode"] = "ansi"
        self.env = gym.make(env_id, **gym_kwargs)
        if not isinstance(self.env.action_space, gym.spaces.Discrete):
            raise ConfigError(f"gym:{env_id} has a {type(self.env.action_space).__name__} action space; "
                              "only Discrete ones have a list of actions to name")
        n = int(self.env.action_space.n)
        self.renderer = renderer or Renderer(
            tuple(str(i) for i in range(n)),
            _ansi if self.env.render_mode == "ansi" else lambda env, obs: repr(obs),
            lambda r, t: t and r > 0,
            f"the Gymnasium environment {env_id}. Actions are the numbers 0 to {n - 1}.",
        )
        super().__init__(max_actions)
        self.env_id = env_id
        self.instruction = (
            f"You are playing {self.renderer.about}\n"
            f"Actions: {', '.join(self.renderer.actions)}.\n" + SEVERAL_ACTIONS_ANSWER
        )

    def _start(self, seed: int) -> str:
        obs, _ = self.env.reset(seed=seed)
        self.env.action_space.seed(seed)
        return self.renderer.text(self.env, obs)

    def _moves(self) -> list[str]:
        return list(self.renderer.actions)

    def _apply(self, move: str) -> Outcome:
        obs, reward, terminated, truncated, _ = self.env.step(self.renderer.actions.index(move))
        reward = float(np.asarray(reward).item())
        success = bool(self.renderer.success(reward, bool(terminated)))
        return Outcome(self.renderer.text(self.env, obs), reward, bool(terminated or truncated), success)


def make(env_id: str, **cfg: Any) -> GymnasiumEnv:
    return GymnasiumEnv(env_id, **cfg)
