"""Plain data (YAML, merged overrides) into the dataclass tree and back, checking every value's type on the way in.

Kept apart from the tree itself (`sections`) so that the declarations read as a list of keys, and apart
from where the data comes from (`load`, `presets`): this module only knows the shapes of the dataclasses.
An unknown key names its full dotted path and the closest valid keys; a value of the wrong type names
its key and what it must be.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Iterator
from typing import Any, Literal

from ragen2.config.sections import Config, config_key
from ragen2.errors import ConfigError, did_you_mean

# Keys that were removed, with what replaces them: a clear message instead of "unknown key".
REMOVED_KEYS = {
    "filter.eps": (
        "it mixed two tolerances, now separate keys. filter.zero_tol is the zero-variance test of "
        "include_zero=false, on the reward std (reference 1e-10; filter.eps was a tolerance on the variance, "
        "so eps=0.01 is zero_tol=0.1); filter.selection_eps is the slack of top_p's threshold (reference 0.01)."
    ),
}


def build(cls: type, data: dict[str, Any], prefix: str) -> Any:
    """An instance of the section `cls` from the mapping `data`, whose keys sit under the dotted `prefix`."""
    hints = typing.get_type_hints(cls)
    attrs = {config_key(f): f.name for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in data.items():
        path = f"{prefix}{key}"
        if path in REMOVED_KEYS:
            raise ConfigError(f"config key {path!r} no longer exists: {REMOVED_KEYS[path]}")
        if key not in attrs:
            while isinstance(value, dict) and value:  # `trainr.total_steps=5` arrives as {trainr: {total_steps: 5}}
                child, value = next(iter(value.items()))
                path = f"{path}.{child}"
            raise ConfigError(f"unknown config key {path!r}." + did_you_mean(path, all_keys()))
        tp = hints[attrs[key]]
        if dataclasses.is_dataclass(tp):
            if not isinstance(value, dict):
                raise ConfigError(f"{path} is a section; set its keys, e.g. {path}.{dataclasses.fields(tp)[0].name}=...")
            kwargs[attrs[key]] = build(tp, value, f"{path}.")
        else:
            kwargs[attrs[key]] = _check_value(path, value, tp)
    return cls(**kwargs)


def _check_value(path: str, value: Any, tp: Any) -> Any:
    """Return `value` converted to type `tp`, or raise ConfigError naming `path`."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in (a for a in args if a is not type(None)):
            try:
                return _check_value(path, value, arg)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(errors[0] if len(errors) == 1 else f"{path}: {value!r} fits none of {tp}")
    if origin is Literal:
        if value not in args:
            raise ConfigError(
                f"{path}={value!r} is not allowed; allowed values: {', '.join(map(repr, args))}."
                + did_you_mean(str(value), [str(a) for a in args])
            )
        return value
    if origin is list:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{path}={value!r} must be a list")
        return [_check_value(f"{path}[{i}]", v, args[0]) for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{path}={value!r} must be a mapping")
        return dict(value)
    if dataclasses.is_dataclass(tp):  # an element of a list of sections, such as env.mixture[0]
        if not isinstance(value, dict):
            raise ConfigError(f"{path}={value!r} must be a mapping of keys, e.g. {{name: sokoban}}")
        return build(tp, value, f"{path}.")
    if tp is Any:
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{path}={value!r} must be true or false")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{path}={value!r} must be an integer")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{path}={value!r} must be a number")
        return float(value)
    if tp is str:
        if value is None:
            raise ConfigError(f"{path} must be a string, got null")
        return str(value)
    raise TypeError(f"unsupported config type {tp} at {path}")


def leaves(cls: type = Config, prefix: str = "") -> Iterator[tuple[str, dataclasses.Field]]:
    """(dotted key, field) of every key under the section `cls`, e.g. ('algo.clip_high', ...), in declaration order."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            yield from leaves(hints[f.name], f"{prefix}{config_key(f)}.")
        else:
            yield f"{prefix}{f.name}", f


def all_keys(cls: type = Config, prefix: str = "") -> list[str]:
    """Every dotted key of the tree, e.g. 'algo.clip_high'."""
    return [key for key, _ in leaves(cls, prefix)]


def to_dict(config: Config) -> dict[str, Any]:
    """The tree as plain data under its config keys (`async`, not `async_`), as `build` reads it back."""
    return {config_key(f): dataclasses.asdict(getattr(config, f.name)) for f in dataclasses.fields(config)}
