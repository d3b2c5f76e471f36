"""`check_env`: Gymnasium's env checker, for text environments."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from ragen2.envs.base import TextEnv

# No env names an action like this: it must be rejected without a state change.
INVALID_ACTION = "\x00 not an action \x00"


def check_env(env: TextEnv, seeds: Iterable[int] = range(5)) -> None:
    """Raise AssertionError, naming the broken rule, when `env` breaks the TextEnv contract.

    Checks: the class attributes; reset gives a str and is deterministic per seed;
    an invalid action leaves the observation unchanged with reward 0 and
    `action_is_valid` False; `step` returns (str, float, bool, bool, dict) whose
    info keys equal `info_keys`; the same seed and actions replay identically;
    truncation comes exactly at `max_actions` valid actions, never together with
    termination. The episode checks play random actions from
    `env.valid_actions()` when the env has that method.
    """
    name = type(env).__name__
    _require(isinstance(env.instruction, str) and env.instruction.strip() != "", f"{name}.instruction is empty")
    _require(
        {"action_is_valid", "success"} <= set(env.info_keys),
        f"{name}.info_keys must contain 'action_is_valid' and 'success'; got {sorted(env.info_keys)}",
    )
    _require(
        isinstance(env.max_actions, int) and env.max_actions >= 1,
        f"{name}.max_actions must be an int >= 1; got {env.max_actions!r}",
    )
    for seed in seeds:
        where = f"{name}.reset(seed={seed})"
        obs, info = env.reset(seed=seed)
        _require(isinstance(obs, str) and obs != "", f"{where} must return a non-empty str observation; got {obs!r}")
        _require(isinstance(info, dict), f"{where} must return an info dict; got {type(info).__name__}")
        _require(env.reset(seed=seed)[0] == obs, f"{where} gave two different observations for the same seed")
        _check_invalid_action(env, obs, f"{name} seed {seed}")
        if hasattr(env, "valid_actions"):
            first = _play(env, seed)
            _require(_play(env, seed) == first, f"{name}: seed {seed} replayed with the same actions differed")


def _check_invalid_action(env: TextEnv, obs: str, where: str) -> None:
    result = env.step(INVALID_ACTION)
    _check_step_types(env, result, where)
    new_obs, reward, terminated, truncated, info = result
    _require(info["action_is_valid"] is False, f"{where}: action_is_valid must be False for {INVALID_ACTION!r}")
    _require(new_obs == obs, f"{where}: an invalid action changed the observation from {obs!r} to {new_obs!r}")
    _require(reward == 0, f"{where}: an invalid action must give reward 0; got {reward}")
    _require(not terminated and not truncated, f"{where}: an invalid action must not end the episode")


def _play(env: TextEnv, seed: int) -> list[tuple[Any, ...]]:
    """One episode of random valid actions (drawn from `seed`); returns every step result."""
    rng = np.random.default_rng(seed)
    obs, _ = env.reset(seed=seed)
    history: list[tuple[Any, ...]] = [(obs,)]
    for count in range(1, env.max_actions + 1):
        actions = env.valid_actions()
        action = actions[rng.integers(len(actions))]
        where = f"{type(env).__name__} seed {seed} action {count} {action!r}"
        result = env.step(action)
        _check_step_types(env, result, where)
        _, _, terminated, truncated, info = result
        history.append((action, *result))
        _require(info["action_is_valid"] is True, f"{where}: an action from valid_actions() was rejected")
        if terminated:
            _require(not truncated, f"{where}: terminated and truncated at once")
            return history
        if count < env.max_actions:
            _require(not truncated, f"{where}: truncated before max_actions={env.max_actions}")
        else:
            _require(truncated, f"{where}: not truncated after max_actions={env.max_actions} actions")
    return history


def _check_step_types(env: TextEnv, result: Any, where: str) -> None:
    _require(isinstance(result, tuple) and len(result) == 5, f"{where}: step must return a 5-tuple; got {result!r}")
    obs, reward, terminated, truncated, info = result
    _require(isinstance(obs, str), f"{where}: observation must be str; got {type(obs).__name__}")
    _require(isinstance(reward, float), f"{where}: reward must be float; got {type(reward).__name__}")
    _require(isinstance(terminated, bool), f"{where}: terminated must be bool; got {type(terminated).__name__}")
    _require(isinstance(truncated, bool), f"{where}: truncated must be bool; got {type(truncated).__name__}")
    _require(isinstance(info, dict), f"{where}: info must be a dict; got {type(info).__name__}")
    _require(
        set(info) == set(env.info_keys),
        f"{where}: info keys {sorted(info)} differ from info_keys {sorted(env.info_keys)}",
    )
    _require(isinstance(info["success"], bool), f"{where}: info['success'] must be bool")


def _require(condition: bool, message: str) -> None:
    # An explicit raise, so the checks also run under `python -O`.
    if not condition:
        raise AssertionError(message)
