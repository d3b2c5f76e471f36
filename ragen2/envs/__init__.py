"""Text environments behind one registry: `ragen2.envs.make(name, **cfg)`."""

from __future__ import annotations

from collections.abc import Callable

from ragen2.envs import external
from ragen2.envs.base import TextEnv
from ragen2.registry import Registry

# Held-out evaluation seeds start here; training and warm-start seeds stay below it.
EVAL_SEED_OFFSET = 1_000_000

ENVS: Registry[Callable[..., TextEnv]] = Registry("environment")


def make(name: str, **cfg) -> TextEnv:
    """Build the environment registered under `name` (or another suite's `SUITE:GAME`) with its keyword config."""
    if ":" in name:  # built-in names have no colon: SUITE:GAME, or a mistyped suite the suites' error names
        return external.make(name, **cfg)
    return ENVS.get(name)(**cfg)


def exists(name: str) -> bool:
    """A registered name, or a `SUITE:GAME` one: building it tells whether the suite and the game exist,
    with the choices and the closest one (config validation would otherwise list only the built-in names)."""
    return name in ENVS or ":" in name


def names() -> list[str]:
    return ENVS.names()


def eval_seeds(n: int) -> list[int]:
    """The first `n` held-out seeds: the same for every evaluation, disjoint from training."""
    return list(range(EVAL_SEED_OFFSET, EVAL_SEED_OFFSET + n))


def validation_seeds(n: int) -> list[int]:
    """`n` seeds for choosing among policies (a warm start's stop, `stop_at_success`): disjoint from the
    training seeds and from the held-out ones, so a choice made on them does not select on the episodes
    that later measure the chosen policy."""
    return list(range(2 * EVAL_SEED_OFFSET, 2 * EVAL_SEED_OFFSET + n))


# Registration happens on import of each env module.
from ragen2.envs import bandit, codeexec, corridor, countdown, frozenlake, mathqa, searchqa, sokoban, webshop  # noqa: E402,F401,E501
from ragen2.envs.external import gymnasium_export  # noqa: E402

gymnasium_export.register(names())  # gymnasium.make("ragen2/sokoban-v0") works after `import ragen2.envs`

__all__ = ["ENVS", "EVAL_SEED_OFFSET", "TextEnv", "eval_seeds", "exists", "make", "names"]
