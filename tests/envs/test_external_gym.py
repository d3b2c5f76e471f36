"""Gymnasium environments as ragen2 envs (`gym:ID`), and ragen2's envs in Gymnasium's registry."""

from __future__ import annotations

import gymnasium as gym
import pytest

from env_checks import bad_env_name
from ragen2 import envs
from ragen2.envs.check import check_env
from ragen2.errors import ConfigError, UnknownNameError

ADAPTED = ["Blackjack-v1", "FrozenLake-v1", "CliffWalking-v1", "Taxi-v4", "CartPole-v1"]


@pytest.mark.parametrize("env_id", ADAPTED)
def test_passes_the_checker(env_id):
    check_env(envs.make(f"gym:{env_id}", max_actions=20), seeds=range(3))


def test_named_actions_and_text():
    env = envs.make("gym:FrozenLake-v1", is_slippery=False)
    obs, _ = env.reset(seed=0)
    assert obs.startswith("PFFF") and env.valid_actions() == ["Left", "Down", "Right", "Up"]
    for action in ["Down", "Down", "Right", "Right", "Down"]:
        obs, reward, terminated, truncated, info = env.step(action)
    obs, reward, terminated, truncated, info = env.step("right")
    assert (reward, terminated, info["success"]) == (1.0, True, True)


def test_junk_actions_change_nothing():
    env = envs.make("gym:Blackjack-v1")
    obs, _ = env.reset(seed=0)
    for junk in ["", "0", "hit me", "<answer>Hit</answer>", "\x00", "Hit || Stick"]:
        assert env.step(junk)[0:4] == (obs, 0.0, False, False)


def test_continuous_actions_are_refused():
    with pytest.raises(ConfigError, match="Box action space"):
        envs.make("gym:Pendulum-v1")


@pytest.mark.parametrize("name", envs.names())
def test_ragen2_envs_through_gymnasium(name):
    env = gym.make(f"ragen2/{name}-v0")
    obs, _ = env.reset(seed=0)
    first = env.unwrapped.valid_actions()[0]
    obs2, reward, terminated, truncated, info = env.step(first)
    assert isinstance(obs, str) and isinstance(obs2, str) and info["action_is_valid"]
    assert gym.make(f"ragen2/{name}-v0").reset(seed=0)[0] == obs


def test_suite_names_resolve_as_presets_and_env_names():
    from ragen2.config import load_config

    config = load_config("gym:Blackjack-v1-ppo-nofilter")
    assert (config.env.name, config.algo.name, config.filter.strategy) == ("gym:Blackjack-v1", "ppo", "none")
    assert load_config(None, ["env=gym:Taxi-v4"]).env.name == "gym:Taxi-v4"
    with pytest.raises(UnknownNameError, match="not a registered Gymnasium environment"):
        load_config(None, ["env.name=gym:NoSuchEnv-v0"])


def test_a_mistyped_id_is_a_bad_env_name_with_the_closest_id():
    """It once read "env.kwargs for 'gym:Blackjak-v1': ...", blaming the kwargs, with no suggestion."""
    message = bad_env_name("gym:Blackjak-v1")
    assert message.startswith("env.name='gym:Blackjak-v1': Blackjak-v1 is not a registered Gymnasium environment")
    assert "with text renderers: Blackjack-v1, FrozenLake-v1" in message and "env.kwargs" not in message
    assert "Did you mean: gym:Blackjack-v1" in message


def test_a_mistyped_suite_names_the_suites_and_the_closest():
    """It once listed only the built-in environments."""
    message = bad_env_name("textarna:Foo-v0")
    assert message.startswith("env.name='textarna:Foo-v0': 'textarna' is not an environment suite; suites: "
                              "textarena:GAME, textworld:GAME, gym:GAME, mcp:GAME, openenv:GAME, verifiers:GAME; "
                              "built-in environments: bandit, ")
    assert "Did you mean: textarena:Foo-v0" in message
