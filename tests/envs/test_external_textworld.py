"""TextWorld challenges as ragen2 envs: generated per seed and cached, checked, and won by their walkthrough.

Generating a game takes seconds, so each challenge is checked on one small game (cached in
textworld/ in ragen2's cache, or $RAGEN2_TEXTWORLD_CACHE, for later runs).
"""

from __future__ import annotations

import pytest

pytest.importorskip("textworld")

from ragen2 import envs  # noqa: E402
from ragen2.envs.check import check_env  # noqa: E402
from ragen2.envs.external.textworld_env import game_file  # noqa: E402
from ragen2.errors import ConfigError, UnknownNameError  # noqa: E402

SMALL = [("coin_collector", {"level": 1}), ("treasure_hunter", {"level": 1}), ("cooking", {"recipe": 1, "take": 1})]


@pytest.mark.parametrize("challenge, settings", SMALL, ids=[c for c, _ in SMALL])
def test_checker_junk_and_walkthrough(challenge, settings):
    env = envs.make(f"textworld:{challenge}", max_actions=8, **settings)
    check_env(env, seeds=[0])
    obs, _ = env.reset(seed=0)
    for junk in ["", "dance", "<answer>look</answer>", "go north || look", "\x00"]:
        assert env.step(junk)[0:4] == (obs, 0.0, False, False)
    assert "look" in env.valid_actions()
    env = envs.make(f"textworld:{challenge}", **settings)
    env.reset(seed=0)
    for command in env.solve():
        _, _, terminated, truncated, info = env.step(command)
    assert info["success"] and terminated


def test_games_are_cached_per_seed():
    env = envs.make("textworld:coin_collector", level=1)
    env.reset(seed=0)
    path = game_file("coin_collector", env.settings, 1_234)  # a seed no test plays: generated now
    assert path.exists() and path.with_suffix(".json").exists()
    assert game_file("coin_collector", env.settings, 1_234) == path


def test_unknown_challenge_and_setting():
    with pytest.raises(UnknownNameError, match="not a TextWorld challenge"):
        envs.make("textworld:zork")
    with pytest.raises(UnknownNameError, match="Did you mean: textworld:coin_collector"):
        envs.make("textworld:coin_colector")
    with pytest.raises(ConfigError, match="no setting 'colour'"):
        envs.make("textworld:coin_collector", colour="red")
