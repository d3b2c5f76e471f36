"""A user's function named by a config value, `FILE.py:FUNCTION` or `package.module:FUNCTION`: the agent loop of
`agent.entrypoint`, an MCP environment's answer checker.

Free of heavy imports, so that the config check loads it (and refuses a wrong one) in well under a second.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ragen2.errors import ConfigError

AgentFunction = Callable[[Any, int], Any]


def load_entrypoint(
    spec: str, key: str = "agent.entrypoint", arguments: tuple[str, ...] = ("client", "seed")
) -> AgentFunction:
    """The function `spec` names: `path/to/file.py:FUNCTION` or `package.module:FUNCTION`, callable with
    `arguments`; errors name the config `key` that gave it."""
    source, sep, name = spec.rpartition(":")
    if not sep or not source or not name:
        raise ConfigError(f"{key}={spec!r} must look like FILE.py:FUNCTION or package.module:FUNCTION")
    try:
        if source.endswith(".py"):
            path = Path(source)
            if not path.is_file():
                raise ConfigError(f"{key}={spec!r}: there is no file {path}")
            module_name = f"ragen2_agent_{path.stem}_{abs(hash(path.resolve()))}"
            module = sys.modules.get(module_name)
            if module is None:
                loader = importlib.util.spec_from_file_location(module_name, path)
                module = importlib.util.module_from_spec(loader)
                sys.modules[module_name] = module  # dataclasses and pickling look the module up by name
                loader.loader.exec_module(module)
        else:
            module = importlib.import_module(source)
    except ConfigError:
        raise
    except Exception as e:
        raise ConfigError(f"{key}={spec!r}: importing {source} failed: {type(e).__name__}: {e}") from e
    function = getattr(module, name, None)
    if not callable(function):
        found = [n for n, v in vars(module).items() if inspect.isfunction(v) and not n.startswith("_")]
        raise ConfigError(f"{key}={spec!r}: {source} has no function {name!r}; its functions: "
                          f"{', '.join(found) or 'none'}")
    try:
        inspect.signature(function).bind(*arguments)
    except TypeError:
        raise ConfigError(f"{key}={spec!r}: {name} must take {len(arguments)} arguments, "
                          f"({', '.join(arguments)})") from None
    return function


def agent_name(spec: str) -> str:
    """A short name for runs and trajectories: `agent:FILE_STEM:FUNCTION`."""
    source, _, name = spec.rpartition(":")
    return f"agent:{Path(source).stem if source.endswith('.py') else source}:{name}"
