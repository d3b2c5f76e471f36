"""check_env passes on every registered env and its main configs, and catches broken envs."""

from __future__ import annotations

import pytest

from ragen2.envs import TextEnv, make, names
from ragen2.envs.check import check_env


@pytest.mark.parametrize("name", names())
def test_every_registered_env_passes(name):
    check_env(make(name), seeds=range(10))


@pytest.mark.parametrize(
    "name, cfg",
    [
        ("sokoban", {"dim_room": (7, 7), "num_boxes": 2, "search_depth": 40, "max_actions": 20}),
        ("frozenlake", {"is_slippery": True, "success_rate": 0.5}),
        ("frozenlake", {"size": 6, "p": 0.8, "random_start_goal": False, "max_actions": 20}),
        ("bandit", {"split": "test"}),
    ],
)
def test_configured_envs_pass(name, cfg):
    check_env(make(name, **cfg), seeds=range(10))


class CounterEnv(TextEnv):
    """A one-number env whose flaws are switched on one at a time."""

    instruction = "Say inc."

    def __init__(self, flaw: str = "") -> None:
        self.flaw = flaw
        self.max_actions = 3
        self.calls = 0

    def reset(self, *, seed=None, options=None):
        self.calls += 1
        self.count, self.taken = 0, 0
        return ("0" if self.flaw != "random_reset" else str(self.calls)), {}

    def step(self, action):
        valid = action == "inc" or self.flaw == "changes_on_invalid"
        info = {"action_is_valid": valid, "success": False}
        if self.flaw == "extra_info_key":
            info["debug"] = 1
        if not valid:
            return str(self.count), 0.0, False, False, info
        self.count += 1
        self.taken += 1
        limit = self.max_actions + (1 if self.flaw == "late_truncation" else 0)
        return str(self.count), 0.0, False, self.taken >= limit, info

    def valid_actions(self):
        return ["inc"]


def test_counter_env_is_sound():
    check_env(CounterEnv())


@pytest.mark.parametrize(
    "flaw, message",
    [
        ("random_reset", "different observations for the same seed"),
        ("changes_on_invalid", "action_is_valid must be False"),
        ("extra_info_key", "differ from info_keys"),
        ("late_truncation", "not truncated after max_actions=3"),
    ],
)
def test_check_env_catches(flaw, message):
    with pytest.raises(AssertionError, match=message):
        check_env(CounterEnv(flaw))
