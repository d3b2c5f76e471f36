"""FrozenLake: solvable maps, solver paths reach the goal, holes end the episode, slips follow success_rate."""

from __future__ import annotations

import re

import pytest

from ragen2.envs import make
from ragen2.envs.frozenlake import FrozenLakeEnv
from ragen2.errors import ConfigError

MOVES = {"Left": (0, -1), "Down": (1, 0), "Right": (0, 1), "Up": (-1, 0)}


def test_solver_reaches_the_goal_on_every_map():
    env = make("frozenlake")
    for seed in range(300):
        env.reset(seed=seed)
        solution = env.solve()
        assert solution is not None and 1 <= len(solution) <= env.max_actions
        for i, action in enumerate(solution):
            obs, reward, terminated, truncated, info = env.step(action)
            last = i == len(solution) - 1
            assert (reward, terminated, info["success"]) == ((1.0, True, True) if last else (0.0, False, False))
            assert not truncated
        assert env.player == env.goal
        assert "√" in obs


def test_solution_is_shortest_on_an_open_lake():
    env = make("frozenlake", p=1.0)
    for seed in range(50):
        env.reset(seed=seed)
        (pr, pc), (gr, gc) = env.player, env.goal
        assert len(env.solve()) == abs(pr - gr) + abs(pc - gc)


def test_falling_into_a_hole_ends_the_episode_without_reward():
    env = make("frozenlake", p=0.6)
    fell = 0
    for seed in range(100):
        env.reset(seed=seed)
        r, c = env.player
        for name, (dr, dc) in MOVES.items():
            if (r + dr, c + dc) in env.holes:
                obs, reward, terminated, truncated, info = env.step(name)
                assert (reward, terminated, truncated, info["success"]) == (0.0, True, False, False)
                assert "X" in obs and env.solve() is None
                fell += 1
                break
    assert fell > 10


def test_walking_off_the_grid_is_valid_and_ineffective():
    env = make("frozenlake", random_start_goal=False)
    env.reset(seed=0)
    assert env.player == (0, 0) and env.goal == (3, 3)
    obs, reward, terminated, truncated, info = env.step("Up")
    assert env.player == (0, 0) and reward == 0.0 and not terminated
    assert info == {"action_is_valid": True, "action_is_effective": False, "success": False}


def test_invalid_action_and_truncation():
    env = make("frozenlake", random_start_goal=False, max_actions=3, max_solution_length=6)
    obs, _ = env.reset(seed=1)
    invalid = {"action_is_valid": False, "action_is_effective": False, "success": False}
    assert env.step("leftt") == (obs, 0.0, False, False, invalid)
    results = [env.step(" up ") for _ in range(3)]  # (0, 0) against the top edge: no move
    assert [r[3] for r in results] == [False, False, True]
    with pytest.raises(RuntimeError, match="call reset"):
        env.step("Up")


def test_zero_success_rate_never_moves_as_intended():
    env = make("frozenlake", p=1.0, is_slippery=True, success_rate=0.0)
    moved_sideways = 0
    for seed in range(100):
        env.reset(seed=seed)
        (r, c), name = env.player, ["Left", "Down", "Right", "Up"][seed % 4]
        env.step(name)
        dr, dc = MOVES[name]
        assert env.player != (r + dr, c + dc)
        moved_sideways += env.player != (r, c)
    assert moved_sideways > 50


def test_full_success_rate_is_deterministic():
    env = make("frozenlake", is_slippery=True, success_rate=1.0)
    for seed in range(50):
        env.reset(seed=seed)
        for action in env.solve():
            *_, info = env.step(action)
        assert info["success"]


def test_observation_matches_the_properties():
    env = make("frozenlake")
    for seed in range(30):
        obs, info = env.reset(seed=seed)
        *grid, coords = obs.split("\n")
        assert info == {}
        assert len(grid) == 4 and all(len(row) == 4 for row in grid)
        cells = {(r, c): ch for r, row in enumerate(grid) for c, ch in enumerate(row)}
        assert sorted(p for p, ch in cells.items() if ch == "O") == env.holes
        assert cells[env.player] == "P" and cells[env.goal] == "G"
        (pr, pc), (gr, gc) = env.player, env.goal
        assert coords == f"Player at (row {pr}, col {pc}); goal at (row {gr}, col {gc})."


def test_start_and_goal_vary_with_the_seed():
    env = make("frozenlake")
    starts = {env.reset(seed=s) and env.player for s in range(100)}
    assert len(starts) > 8
    assert len({re.sub(r"\s", "", env.reset(seed=s)[0]) for s in range(100)}) > 80


@pytest.mark.parametrize(
    "cfg, match",
    [
        ({"size": 1}, "size=1"),
        ({"p": 0.0}, "p=0.0"),
        ({"success_rate": 1.5}, "success_rate=1.5"),
        ({"max_actions": 0}, "max_actions=0"),
        ({"max_solution_length": 0}, "max_solution_length=0"),
        ({"random_start_goal": False, "max_actions": 5}, "max_solution_length=5 .* use at least 6"),
    ],
)
def test_bad_config_names_the_parameter(cfg, match):
    with pytest.raises(ConfigError, match=match):
        FrozenLakeEnv(**cfg)
