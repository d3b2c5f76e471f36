"""Text environments behind one registry: `ragen2.envs.make(name, **cfg)`."""

from __future__ import annotations

from collections.abc import Callable

from ragen2.envs.base import TextEnv
from ragen2.registry import Registry

ENVS: Registry[Callable[..., TextEnv]] = Registry("environment")


def make(name: str, **cfg) -> TextEnv:
    """Build the environment registered under `name` with its keyword config."""
    return ENVS.get(name)(**cfg)


def names() -> list[str]:
    return ENVS.names()


# Registration happens on import of each env module.
from ragen2.envs import bandit, frozenlake, sokoban  # noqa: E402,F401

__all__ = ["ENVS", "TextEnv", "make", "names"]
