"""The ways a checked `Config` is made: from a preset and `a.b=c` overrides, or from a run's saved config.yaml.

Both end in `validate`, so no work starts on a config that cannot run; this module is where the
layers (`presets`), the builder (`build`) and the checks (`validate`) meet.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from omegaconf import OmegaConf

from ragen2.config.build import build, to_dict
from ragen2.config.presets import load_yaml, preset_layers
from ragen2.config.sections import AsyncConfig, Config
from ragen2.config.validate import validate
from ragen2.errors import ConfigError


def load_config(preset: str | None = None, overrides: list[str] | None = None) -> Config:
    """Defaults <- preset layers <- `a.b=c` overrides, validated into a `Config`."""
    layers = [OmegaConf.create(layer) for layer in (preset_layers(preset) if preset else [])]
    for item in overrides or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"override {item!r} must look like key=value, e.g. algo.name=ppo")
        if key == "env":  # `env=frozenlake` is shorthand for env.name=frozenlake
            item = f"env.name={value}"
        layers.append(OmegaConf.from_dotlist([item]))
    merged = OmegaConf.to_container(OmegaConf.merge(*layers), resolve=True) if layers else {}
    config = build(Config, _async_defaults(merged), "")
    validate(config)
    return config


def _async_defaults(merged: dict[str, Any]) -> dict[str, Any]:
    """With async.enable and async.max_staleness above 0, algo.rollout_is=token (truncated at
    algo.rollout_is_threshold, 2.0) unless a layer sets algo.rollout_is, null included: stale samples
    are corrected by default."""
    a = merged.get("async") or {}
    staleness = a.get("max_staleness", AsyncConfig.max_staleness)
    if a.get("enable") and isinstance(staleness, int) and staleness > 0 and "rollout_is" not in (
            merged.get("algo") or {}):
        merged = {**merged, "algo": {**(merged.get("algo") or {}), "rollout_is": "token"}}
    return merged


def save_config(config: Config, path: Path) -> None:
    """Write the resolved config as YAML, the form `config_from_file` reads back."""
    path.write_text(yaml.safe_dump(to_dict(config), sort_keys=False))


def config_from_file(path: Path) -> Config:
    """Re-load a resolved config.yaml written by `save_config` (for --resume and eval)."""
    config = build(Config, load_yaml(path), "")
    validate(config)
    return config
