"""OpenEnv environments: `make("openenv:MODULE:CLASS")` runs an OpenEnv `Environment` class in the process.

OpenEnv (`openenv-core`) environments are `Environment` subclasses whose `reset(seed=...)` and
`step(action)` return pydantic `Observation`s (`done`, `reward`, `metadata` and the environment's
own fields), and whose actions are pydantic `Action`s; OpenEnv serves them over HTTP from a
container. The adapter calls the class directly, which is what that server does inside the
container, so nothing runs over the network and an environment works offline.
"""

from __future__ import annotations

import importlib
import json
import typing
from typing import Any, ClassVar

import gymnasium as gym
from openenv.core.env_server.interfaces import Environment  # the `openenv` extra: this module loads only for openenv:
from pydantic import ValidationError

from ragen2.envs.base import TextEnv
from ragen2.errors import ConfigError

# Observation fields that OpenEnv itself defines; the rest are the environment's and make the text.
_PROTOCOL_FIELDS = ("done", "reward", "metadata")
_EXAMPLE = {"integer": 1, "number": 1.5, "string": "x", "boolean": True}  # an example value by JSON type


def _import(target: str, what: str) -> type:
    module_name, _, name = target.partition(":")
    if not module_name or not name:
        raise ConfigError(f"{what}={target!r}: use MODULE:CLASS, e.g. openenv:my_envs.guess:GuessEnvironment")
    try:
        return getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError) as e:
        raise ConfigError(f"{what}={target!r}: cannot import it ({type(e).__name__}: {e})") from e


class OpenEnvEnv(TextEnv):
    """An OpenEnv environment with text actions and observations.

    ## Description
    `target` (MODULE:CLASS) names an `openenv.core.env_server.Environment` subclass, built with `init_kwargs`.
    Its action class is the annotation of its `step`'s `action` parameter.

    ## Actions
    An action with a single text field (e.g. `message: str`) is written as plain text; any other as a
    JSON object of its fields, e.g. `{"row": 1, "col": 2}`. Text the action class refuses is invalid.

    ## Observation
    The observation's own fields: the value itself when there is one, else a JSON object of them.

    ## Rewards
    The observation's `reward` (None counts as 0).

    ## Episode end
    Terminated when the observation says `done`; truncated after `max_actions` actions.

    ## Info
    - `action_is_valid` (bool): the action class accepted the text.
    - `success` (bool): the episode ended (`done`) with a reward of at least `success_reward`.
    """

    info_keys: ClassVar[frozenset[str]] = frozenset({"action_is_valid", "success"})

    def __init__(self, target: str, max_actions: int = 10, success_reward: float = 1.0, init_kwargs: dict | None = None,
                 instruction: str | None = None) -> None:
        if not isinstance(max_actions, int) or max_actions < 1:
            raise ConfigError(f"max_actions={max_actions!r} is not allowed: use an integer >= 1")
        cls = _import(target, "openenv")
        if not (isinstance(cls, type) and issubclass(cls, Environment)):
            raise ConfigError(f"openenv:{target} is not an openenv Environment class (got {cls!r})")
        self.max_actions, self.success_reward = max_actions, float(success_reward)
        self._env = cls(**(init_kwargs or {}))
        self._action_cls = typing.get_type_hints(cls.step).get("action")
        if self._action_cls is None:
            raise ConfigError(f"openenv:{target}: its step() does not annotate `action` with its Action class")
        self._text_field = _single_text_field(self._action_cls)
        syntax = "plain text" if self._text_field else f"a JSON object matching {json.dumps(_action_schema(self._action_cls))}"
        self.instruction = instruction or (
            f"You are acting in the environment {cls.__name__}. {' '.join((cls.__doc__ or '').split())}".strip() + "\n"
            f"Each action is {syntax}.\n"
            "Answer as <think>...</think><answer>A1 || A2</answer>: one or more actions separated by ||."
        )
        self._taken, self._done, self._last = 0, True, ""

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[str, dict]:
        gym.Env.reset(self, seed=seed)
        self._taken, self._done = 0, False
        self._last = _text(self._env.reset(seed=seed))
        return self._last, {}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        if self._done:
            raise RuntimeError("step() needs a running episode: call reset() first")
        try:
            parsed = (self._action_cls(**{self._text_field: action}) if self._text_field
                      else self._action_cls.model_validate_json(action))
        except ValidationError:
            return self._last, 0.0, False, False, {"action_is_valid": False, "success": False}
        observation = self._env.step(parsed)
        self._taken += 1
        reward = float(observation.reward or 0.0)
        terminated = bool(observation.done)
        truncated = not terminated and self._taken >= self.max_actions
        self._done, self._last = terminated or truncated, _text(observation)
        return self._last, reward, terminated, truncated, {
            "action_is_valid": True, "success": terminated and reward >= self.success_reward}

    def valid_actions(self) -> list[str]:
        """An example action (the action space is open-ended): what random agents and checkers try."""
        if self._text_field:
            return ["x"]
        return [json.dumps({name: _EXAMPLE.get(spec.get("type"), "x") for name, spec in _action_schema(self._action_cls).items()})]

    def close(self) -> None:
        self._env.close()



def _action_schema(action_cls: type) -> dict[str, Any]:
    """The JSON schema of the action's own fields (`metadata` is OpenEnv's)."""
    properties = action_cls.model_json_schema().get("properties", {})
    return {name: spec for name, spec in properties.items() if name != "metadata"}


def _single_text_field(action_cls: type) -> str | None:
    """The action's only own field when it is text, so an action is written as the text itself."""
    fields = {name: f for name, f in action_cls.model_fields.items() if name != "metadata"}
    if len(fields) == 1:
        (name, field), = fields.items()
        return name if field.annotation is str else None
    return None


def _text(observation: Any) -> str:
    """The observation's own fields: the value alone when there is one, else a JSON object."""
    own = {k: v for k, v in observation.model_dump().items() if k not in _PROTOCOL_FIELDS}
    if len(own) == 1:
        (value,) = own.values()
        return value if isinstance(value, str) else json.dumps(value)
    return json.dumps(own, ensure_ascii=False)


def make(target: str, **cfg: Any) -> OpenEnvEnv:
    return OpenEnvEnv(target, **cfg)
