"""Presets: which YAML files a preset name stands for, lowest priority first, and how config files are read.

A preset is a file in `ragen2/configs/`, or a name composed as ENV, ENV-ALGO or ENV-ALGO-FILTER from
one file of each of `configs/envs/`, `configs/algos/` and `configs/filters/`, or another suite's game
(`textarena:Sudoku-v0-ppo`), or a path to a .yaml file. This module only finds and reads the layers;
`load` merges them with the overrides.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from ragen2.errors import ConfigError, did_you_mean

# A preset name is ENV, ENV-ALGO or ENV-ALGO-FILTER: one file from each of these folders, in this order.
_PRESET_PARTS = ("envs", "algos", "filters")


def _preset_dir() -> Path:
    return Path(str(resources.files("ragen2") / "configs"))


def _preset_choices() -> dict[str, list[str]]:
    """{folder: preset file stems} for the parts of a composed preset name."""
    d = _preset_dir()
    return {part: sorted(p.stem for p in (d / part).glob("*.yaml")) for part in _PRESET_PARTS}


def preset_names() -> list[str]:
    """Presets are `ENV`, `ENV-ALGO` (e.g. `frozenlake-ppo`) or `ENV-ALGO-FILTER` (e.g.
    `sokoban-ppo-nofilter`), plus any file in configs/."""
    choices = _preset_choices()
    extra = sorted(p.stem for p in _preset_dir().glob("*.yaml"))
    pairs = [f"{e}-{a}" for e in choices["envs"] for a in choices["algos"]]
    return extra + choices["envs"] + pairs + [f"{p}-{f}" for p in pairs for f in choices["filters"]]


def preset_pattern() -> str:
    """The preset names in one line (listing all of them would take a page)."""
    parts = "; ".join(
        f"{part.removesuffix('s').upper()} one of {', '.join(f'`{c}`' for c in choices)}"
        for part, choices in _preset_choices().items()
    )
    extra = "".join(f"; also `{p.stem}`" for p in sorted(_preset_dir().glob("*.yaml")))
    names = "`ENV`, `ENV-ALGO` or `ENV-ALGO-FILTER` (e.g. `sokoban-ppo-nofilter`)"
    return f"{names}, layered in that order, with {parts}{extra}"


def load_yaml(path: Path) -> dict[str, Any]:
    """A config file's mapping; refuses invalid YAML (with its line and column) and an empty file."""
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(
            f"{path}: invalid YAML{where}: {problem}; write one `key: value` per line, nested keys indented"
        ) from e
    if data is None:
        raise ConfigError(
            f"{path} is empty (nothing but blanks or comments): a config file must set at least one key, "
            "e.g. `trainer: {total_steps: 50}`"
        )
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a config file must be a mapping of keys, got {type(data).__name__}")
    return data


def preset_layers(name: str) -> list[dict[str, Any]]:
    """The YAML layers a preset name stands for, lowest priority first."""
    d = _preset_dir()
    if (d / f"{name}.yaml").exists():
        return [load_yaml(d / f"{name}.yaml")]
    files = [d / part / f"{stem}.yaml" for part, stem in zip(_PRESET_PARTS, name.split("-"))]
    if len(name.split("-")) <= len(_PRESET_PARTS) and all(f.exists() for f in files):
        return [load_yaml(f) for f in files]
    external = _external_preset(name)
    if external is not None:
        return external
    path = Path(name)
    if path.suffix in (".yaml", ".yml") and path.is_file():
        return [load_yaml(path)]
    if path.suffix in (".yaml", ".yml"):
        raise ConfigError(f"preset file {name} does not exist; pass an existing .yaml file or a preset name "
                          f"({preset_pattern()})")
    raise ConfigError(
        f"unknown preset {name!r}; presets: {preset_pattern()} (or a path to a .yaml file)."
        + did_you_mean(name, preset_names())
    )


def _external_preset(name: str) -> list[dict[str, Any]] | None:
    """Another suite's environment as a preset: `textarena:Sudoku-v0`, optionally followed by -ALGO[-FILTER]."""
    from ragen2.envs.external import is_external

    if not is_external(name):
        return None
    choices, parts = _preset_choices(), name.split("-")
    for tail in (2, 1, 0):  # the longest -ALGO-FILTER / -ALGO suffix that names shipped files
        env, rest = "-".join(parts[: len(parts) - tail]), parts[len(parts) - tail:]
        if all(stem in choices[part] for part, stem in zip(_PRESET_PARTS[1:], rest)) and len(parts) > tail:
            return [{"env": {"name": env}}] + [load_yaml(_preset_dir() / p / f"{s}.yaml") for p, s in zip(_PRESET_PARTS[1:], rest)]
    return None
