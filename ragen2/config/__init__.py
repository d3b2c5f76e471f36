"""The configuration of a run: one tree of dataclasses, filled from presets and `a.b=c` overrides, checked up front.

Where each part lives:
- `sections`: `Config` and its sections, every key with its default and help text.
- `build`: plain data into the tree and back, with the type of every value checked.
- `presets`: which YAML files a preset name stands for.
- `load`: `load_config` (defaults <- preset layers <- overrides), `config_from_file`, `save_config`.
- `validate`: the checks that need several sections, the machine or the registries.
- `tagged_envs`: the environments env.name / env.mixture / env.eval resolve to.
- `reference`: `--help`'s rows and docs/config.md (`python -m ragen2.config > docs/config.md`).
"""

from ragen2.config.build import all_keys, to_dict
from ragen2.config.load import config_from_file, load_config, save_config
from ragen2.config.presets import preset_layers, preset_names, preset_pattern
from ragen2.config.reference import config_markdown, describe
from ragen2.config.sections import (
    AgentConfig,
    AlgoConfig,
    AsyncConfig,
    CollapseConfig,
    Config,
    EarlyStopConfig,
    EnvConfig,
    EvalEnvConfig,
    FilterConfig,
    GradSNRConfig,
    LoggingConfig,
    MixtureEnvConfig,
    ModelConfig,
    OptimConfig,
    RolloutConfig,
    TrainerConfig,
)
from ragen2.config.validate import check_env_kwargs, check_sizes, validate

__all__ = [
    "AgentConfig", "AlgoConfig", "AsyncConfig", "CollapseConfig", "Config", "EarlyStopConfig", "EnvConfig",
    "EvalEnvConfig", "FilterConfig", "GradSNRConfig", "LoggingConfig", "MixtureEnvConfig", "ModelConfig",
    "OptimConfig", "RolloutConfig", "TrainerConfig",
    "all_keys", "check_env_kwargs", "check_sizes", "config_from_file", "config_markdown", "describe", "load_config",
    "preset_layers", "preset_names", "preset_pattern", "save_config", "to_dict", "validate",
]
