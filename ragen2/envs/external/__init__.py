"""Environments from other suites, named `SUITE:GAME`: `textarena:Sudoku-v0`, `textworld:coin_collector`, `gym:Blackjack-v1`.
The tools of an MCP server are one too: `mcp:calculator`, or `mcp:NAME` with `env.kwargs.command`, and so is
an OpenEnv environment class: `openenv:MODULE:CLASS`, and a verifiers taskset: `verifiers:TASKSET`.

Each suite is an optional extra (`ragen2[textarena]`, `ragen2[textworld]`; Gymnasium is a core
dependency) and is imported only when one of its names is used, so `import ragen2.envs` never
needs it.
"""

from __future__ import annotations

import importlib
from typing import Any

from ragen2.envs.base import TextEnv
from ragen2.errors import ConfigError, UnknownNameError, did_you_mean

# Suite prefix -> (adapter module, the extra that installs the suite).
SUITES: dict[str, tuple[str, str | None]] = {
    "textarena": ("ragen2.envs.external.textarena_env", "textarena"),
    "textworld": ("ragen2.envs.external.textworld_env", "textworld"),
    "gym": ("ragen2.envs.external.gym_env", None),
    "mcp": ("ragen2.envs.external.mcp_env", "agents"),
    "openenv": ("ragen2.envs.external.openenv_env", "openenv"),
    "verifiers": ("ragen2.envs.external.verifiers_env", "verifiers"),
}
# Suites whose extras `make` leaves out of .venv (pyproject.toml says why); .venv-envs has them.
OWN_VENV = {"openenv", "verifiers"}


def is_external(name: str) -> bool:
    """Whether `name` has a suite prefix (`textarena:...`); says nothing of whether the game exists."""
    return name.partition(":")[0] in SUITES and ":" in name


def make(name: str, **cfg: Any) -> TextEnv:
    """Build `SUITE:GAME` with the suite's adapter; a missing suite names the extra that installs it,
    an unknown one the suites and the built-in environments, with the closest suite."""
    suite, _, game = name.partition(":")
    if suite not in SUITES:
        from ragen2.envs import names  # ragen2.envs imports this module

        raise UnknownNameError(
            f"env.name={name!r}: {suite!r} is not an environment suite; suites: "
            f"{', '.join(f'{s}:GAME' for s in SUITES)}; built-in environments: {', '.join(names())}."
            + did_you_mean(suite, SUITES, shown=lambda s: f"{s}:{game}")
        )
    module_name, extra = SUITES[suite]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        hint = f": pip install 'ragen2[{extra}]'" if extra else ""
        if suite in OWN_VENV:
            hint += "; `make` leaves it out of .venv, and .venv-envs has it (`make test-envs` builds it)"
        raise ConfigError(f"{name} needs the {suite} package, which is not installed{hint} ({e})") from e
    return module.make(game, **cfg)


__all__ = ["SUITES", "is_external", "make"]
