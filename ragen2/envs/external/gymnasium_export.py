"""ragen2's own environments in Gymnasium's registry: `gymnasium.make("ragen2/sokoban-v0")` after `import ragen2.envs`.

Any code that speaks Gymnasium can then play them (also `gymnasium.make("ragen2.envs:ragen2/sokoban-v0")`,
which imports ragen2 itself). Gymnasium's checks want an observation and an action space: both are
text, of any characters (observations hold grid symbols and newlines, which `gymnasium.spaces.Text`'s
default alphabet lacks).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym

from ragen2.envs.base import TextEnv

NAMESPACE = "ragen2"
MAX_TEXT = 1 << 20


class AnyText(gym.spaces.Text):
    """A text space that holds every string up to `max_length` characters, whatever its characters."""

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and len(x) <= self.max_length


def gymnasium_id(name: str) -> str:
    return f"{NAMESPACE}/{name}-v0"


def make_for_gymnasium(name: str, **cfg: Any) -> TextEnv:
    """Gymnasium's entry point: the ragen2 env with text observation and action spaces."""
    from ragen2 import envs

    env = envs.make(name, **cfg)
    env.observation_space = AnyText(MAX_TEXT)
    env.action_space = AnyText(MAX_TEXT)
    return env


def register(names: list[str]) -> None:
    """Register each name as `ragen2/NAME-v0` (once; a second import registers nothing)."""
    for name in names:
        if gymnasium_id(name) not in gym.registry:
            gym.register(gymnasium_id(name), entry_point=make_for_gymnasium, kwargs={"name": name},
                         disable_env_checker=False, order_enforce=True)
