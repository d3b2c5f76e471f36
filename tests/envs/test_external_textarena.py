"""TextArena games through ragen2's contract: the checker, determinism, junk actions, solvers, the opponent."""

from __future__ import annotations

import random

import pytest

pytest.importorskip("textarena")

from env_checks import bad_env_name  # noqa: E402
from ragen2 import envs  # noqa: E402
from ragen2.envs.check import check_env  # noqa: E402
from ragen2.envs.external.textarena_env import GAMES, UNAVAILABLE  # noqa: E402
from ragen2.errors import ConfigError, UnknownNameError  # noqa: E402

# (game id, config): short horizons keep each check to a fraction of a second.
SINGLE = [
    ("Sudoku-v0-very-easy", {}),
    ("TowerOfHanoi-v0", {}),
    ("GuessTheNumber-v0", {}),
    ("FifteenPuzzle-v0", {"max_actions": 15}),
    ("LightsOut-v0", {}),
    ("Mastermind-v0", {"max_actions": 8}),
    ("FrozenLake-v0", {"max_actions": 15}),
    ("Sokoban-v0", {"max_actions": 10}),
    ("Blackjack-v0", {}),
    ("Bandit-v0", {}),
    ("Secretary-v0", {}),
    ("Minesweeper-v0-small", {"max_actions": 15}),
    ("PegJump-v0", {}),
    ("RushHour-v0", {"max_actions": 10, "difficulty": "easy"}),
]
TWO_PLAYER = [("TicTacToe-v0", {}), ("ConnectFour-v0", {"max_actions": 10})]
SOLVED = ["Sudoku-v0-very-easy", "TowerOfHanoi-v0", "GuessTheNumber-v0", "LightsOut-v0", "Mastermind-v0",
          "FrozenLake-v0", "Sokoban-v0", "Secretary-v0", "Minesweeper-v0-small", "PegJump-v0"]
JUNK = ["", "   ", "[", "]", "[]", "[99 99]", "[-1]", "<answer>[A C]</answer>", "[A C] || [A B]", "up up",
        "\x00", "[" * 500, "é✓\n\t", "None", "[1 2 3 4 5 6 7 8 9 10]"]


@pytest.mark.parametrize("game, cfg", SINGLE + TWO_PLAYER, ids=[g for g, _ in SINGLE + TWO_PLAYER])
def test_passes_the_checker(game, cfg):
    check_env(envs.make(f"textarena:{game}", **cfg), seeds=range(2))


@pytest.mark.parametrize("game, cfg", SINGLE[:6] + TWO_PLAYER[:1], ids=[g for g, _ in SINGLE[:6] + TWO_PLAYER[:1]])
def test_episode_follows_from_the_seed_whatever_else_draws_numbers(game, cfg):
    def play(disturb: bool) -> list:
        env = envs.make(f"textarena:{game}", **cfg)
        trace = [env.reset(seed=7)[0]]
        for _ in range(6):
            if disturb:
                random.random(), random.seed(123)
            result = env.step(env.valid_actions()[0])
            trace.append(result)
            if result[2] or result[3]:
                break
        return trace

    assert play(False) == play(True)


@pytest.mark.parametrize("game", ["TowerOfHanoi-v0", "Sudoku-v0-very-easy", "Minesweeper-v0-small", "TicTacToe-v0"])
def test_junk_actions_change_nothing(game):
    env = envs.make(f"textarena:{game}")
    obs, _ = env.reset(seed=0)
    for junk in JUNK:
        new_obs, reward, terminated, truncated, info = env.step(junk)
        assert (new_obs, reward, terminated, truncated, info["action_is_valid"]) == (obs, 0.0, False, False, False), junk
    assert env.step(env.valid_actions()[0])[4]["action_is_valid"]


def test_moves_are_matched_without_brackets_or_case():
    env = envs.make("textarena:TowerOfHanoi-v0")
    env.reset(seed=0)
    assert env.step(" a  c ")[4]["action_is_valid"]
    assert env.step("[A B]")[4]["action_is_valid"]
    assert not env.step("[A C]x")[4]["action_is_valid"]


@pytest.mark.parametrize("game", SOLVED)
def test_solver_reaches_success(game):
    env = envs.make(f"textarena:{game}")
    for seed in range(2):
        env.reset(seed=seed)
        plan = env.solve()
        assert plan, f"{game} seed {seed}: no solution"
        for action in plan:
            _, _, terminated, truncated, info = env.step(action)
            assert info["action_is_valid"], action
            if terminated or truncated:
                break
        assert info["success"] and terminated, f"{game} seed {seed}: the solution did not win"


def test_random_opponent_answers_each_move():
    env = envs.make("textarena:TicTacToe-v0")
    env.reset(seed=3)
    obs, *_ = env.step("[4]")
    assert "Player 1 played" in obs
    assert len(env.valid_actions()) == 7  # the agent's mark and the opponent's


def test_offline_failures_are_named():
    for game in UNAVAILABLE:
        assert game not in GAMES
    with pytest.raises(ConfigError, match="API key"):
        envs.make("textarena:TwentyQuestions-v0")
    with pytest.raises(UnknownNameError, match="not an adapted TextArena game"):
        envs.make("textarena:NoSuchGame-v0")


def test_a_mistyped_game_is_a_bad_env_name_with_the_closest_game():
    """It once read "env.kwargs for 'textarena:TowerOfHanio-v0': ... is not an adapted game", blaming the kwargs."""
    message = bad_env_name("textarena:TowerOfHanio-v0")
    assert message.startswith("env.name='textarena:TowerOfHanio-v0': TowerOfHanio-v0 is not an adapted TextArena game")
    assert "adapted: " in message and "env.kwargs" not in message
    assert "Did you mean: textarena:TowerOfHanoi-v0," in message
