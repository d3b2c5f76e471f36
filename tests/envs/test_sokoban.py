"""Sokoban: generated rooms are solvable within the horizon, rewards follow the scheme, the solver is optimal."""

from __future__ import annotations

import re

import pytest

from ragen2.envs import make
from ragen2.envs.sokoban import SokobanEnv
from ragen2.errors import ConfigError


def replay(env: SokobanEnv, actions: list[str]) -> tuple[list[float], list[int], list[tuple]]:
    """Rewards, boxes-on-target counts (before the first action and after each) and step results."""
    on_target = [len(set(env.boxes) & set(env.targets))]
    rewards, results = [], []
    for action in actions:
        result = env.step(action)
        results.append(result)
        rewards.append(result[1])
        on_target.append(len(set(env.boxes) & set(env.targets)))
    return rewards, on_target, results


def test_500_generated_rooms_are_solvable_and_replaying_the_solution_earns_the_predicted_return():
    env = make("sokoban")
    lengths = []
    for seed in range(500):
        env.reset(seed=seed)
        solution = env.solve()
        assert solution is not None, f"seed {seed} unsolvable:\n{env.room_text()}"
        assert 2 <= len(solution) <= env.max_actions
        lengths.append(len(solution))
        rewards, _, results = replay(env, solution)
        # One box and a shortest solution: the only target event is the final push, onto the target.
        assert sum(rewards) == pytest.approx(-0.1 * len(solution) + 1 + 10)
        *_, (_, _, terminated, truncated, info) = results
        assert terminated and not truncated and info["success"]
        assert not any(r[2] for r in results[:-1]), "terminated before the last solution action"
    # Documented in the docstring and docs/environments.md: short rooms, rarely over 8 actions.
    assert max(lengths) <= 10 and sum(lengths) / len(lengths) < 5


def test_generation_is_deterministic_and_varied():
    a, b = make("sokoban"), make("sokoban")
    assert [a.reset(seed=s)[0] for s in range(50)] == [b.reset(seed=s)[0] for s in range(50)]
    assert len({a.reset(seed=s)[0] for s in range(100)}) >= 95
    assert len({make("sokoban").reset()[0] for _ in range(20)}) > 1  # seed=None draws a fresh seed


def test_solution_length_range_is_respected():
    env = make("sokoban", min_solution_length=6, max_solution_length=8)
    for seed in range(30):
        env.reset(seed=seed)
        assert 6 <= len(env.solve()) <= 8


def test_multi_box_rooms_are_solvable():
    env = make("sokoban", dim_room=(7, 7), num_boxes=2, search_depth=40, max_actions=20)
    for seed in range(50):
        env.reset(seed=seed)
        assert len(env.boxes) == 2
        solution = env.solve()
        rewards, on_target, results = replay(env, solution)
        on_events = sum(max(b - a, 0) for a, b in zip(on_target, on_target[1:]))
        off_events = sum(max(a - b, 0) for a, b in zip(on_target, on_target[1:]))
        assert sum(rewards) == pytest.approx(-0.1 * len(solution) + on_events - off_events + 10)
        assert results[-1][2] and results[-1][4]["success"]


def test_observation_format():
    obs, info = make("sokoban").reset(seed=0)
    *grid, coords = obs.split("\n")
    assert info == {}
    assert len(grid) == 6 and all(len(row) == 6 and set(row) <= set("#_OX√PS") for row in grid)
    cell = r"\(row \d, col \d\)"
    assert re.fullmatch(rf"Player at {cell}; box at {cell}; target at {cell}\.", coords)


def test_room_text_round_trips():
    room = "#######\n#O_X_X#\n#_√_S_#\n#######"
    env = SokobanEnv.from_text(room)
    assert env.room_text().split("\n")[:4] == room.split("\n")
    assert env.player == (2, 4)
    assert env.boxes == [(1, 3), (1, 5), (2, 2)]
    assert env.targets == [(1, 1), (2, 2), (2, 4)]
    assert (0, 0) in env.walls and (1, 1) not in env.walls
    assert env.room_text().endswith(
        "Player at (row 2, col 4); boxes at (row 1, col 3), (row 1, col 5), (row 2, col 2); "
        "targets at (row 1, col 1), (row 2, col 2), (row 2, col 4)."
    )
    # The observation itself is accepted as room text: its coordinates line is ignored.
    assert SokobanEnv.from_text(env.room_text()).room_text() == env.room_text()


def step_rewards(room: str, actions: list[str]) -> list[tuple]:
    env = SokobanEnv.from_text(room)
    return [env.step(a) for a in actions]


def test_push_onto_target_solves_the_room():
    (obs, reward, terminated, truncated, info), = step_rewards("#####\n#PXO#\n#####", ["Right"])
    assert reward == pytest.approx(-0.1 + 1 + 10)
    assert terminated and not truncated
    assert info == {"action_is_valid": True, "action_is_effective": True, "success": True}
    assert obs.split("\n")[1] == "#_P√#"


def test_push_off_target_then_onto_another():
    room = "#######\n#P√_O_#\n#__X__#\n#######"
    (_, off, *_), (obs, on, terminated, _, _) = step_rewards(room, ["Right", "Right"])
    assert off == pytest.approx(-0.1 - 1)
    assert on == pytest.approx(-0.1 + 1)
    assert not terminated  # the second box is still off target
    assert obs.split("\n")[1] == "#_OP√_#"


def test_push_from_target_to_target_is_neutral():
    (_, reward, terminated, _, _), = step_rewards("######\n#P√O_#\n#__X_#\n######", ["Right"])
    assert reward == pytest.approx(-0.1)
    assert not terminated


@pytest.mark.parametrize(
    "room, action",
    [
        ("#####\n#P_O#\n#_X_#\n#####", "Left"),  # walk into a wall
        ("#####\n#PX##\n#__O#\n#####", "Right"),  # push a box into a wall
        ("######\n#PXX_#\n#_OO_#\n######", "Right"),  # push a box into a box
        ("###\nPXO", "Left"),  # the grid edge counts as a wall
    ],
)
def test_blocked_moves_are_valid_and_cost_a_step(room, action):
    env = SokobanEnv.from_text(room)
    before = env.room_text()
    obs, reward, terminated, truncated, info = env.step(action)
    assert obs == before
    assert reward == pytest.approx(-0.1)
    assert info == {"action_is_valid": True, "action_is_effective": False, "success": False}
    assert not terminated and not truncated


@pytest.mark.parametrize("action", ["up", " Up ", "UP", "\tdown\n", "LeFt", "right"])
def test_actions_are_case_and_whitespace_tolerant(action):
    env = SokobanEnv.from_text("#####\n#___#\n#_P_#\n#XO_#\n#####")
    assert env.step(action)[4]["action_is_valid"]


@pytest.mark.parametrize("action", ["", "upp", "Up || Down", "Up.", "north", "<answer>Up</answer>", "1"])
def test_other_text_is_invalid_and_changes_nothing(action):
    env = SokobanEnv.from_text("#####\n#___#\n#_P_#\n#XO_#\n#####")
    before = env.room_text()
    invalid = {"action_is_valid": False, "action_is_effective": False, "success": False}
    assert env.step(action) == (before, 0.0, False, False, invalid)
    assert env.room_text() == before


def test_truncation_counts_only_valid_actions():
    env = SokobanEnv.from_text("#####\n#P_O#\n#_X_#\n#####", max_actions=3)
    for _ in range(2):
        assert env.step("Left")[3] is False
        assert env.step("jump")[3] is False
    obs, reward, terminated, truncated, info = env.step("Left")
    assert truncated and not terminated and not info["success"]
    with pytest.raises(RuntimeError, match="call reset"):
        env.step("Left")


def test_step_before_reset_raises():
    with pytest.raises(RuntimeError, match="reset"):
        make("sokoban").step("Up")


def test_solver_straight_line():
    env = SokobanEnv.from_text("#######\n#P_X_O#\n#######")
    assert env.solve() == ["Right", "Right", "Right"]
    rewards, _, _ = replay(env, env.solve())
    assert sum(rewards) == pytest.approx(-0.3 + 1 + 10)


def test_solver_finds_the_optimal_six_moves_around_a_corner():
    # The box needs 3 pushes (2 down, 1 right), one step to get behind it first and
    # two to walk round it when the push direction changes: 6 at best.
    env = SokobanEnv.from_text("######\n#P___#\n#_X__#\n#____#\n#__O_#\n######")
    solution = env.solve()
    assert len(solution) == 6
    *_, results = replay(env, solution)
    assert results[-1][4]["success"]


def test_solver_returns_none_for_a_dead_box_and_empty_when_solved():
    assert SokobanEnv.from_text("#####\n#X__#\n#_P_#\n#__O#\n#####").solve() is None
    assert SokobanEnv.from_text("####\n#P√#\n####").solve() == []


def test_solver_is_from_the_current_state():
    env = SokobanEnv.from_text("#######\n#P_X_O#\n#######")
    env.step("Right")
    assert env.solve() == ["Right", "Right"]


@pytest.mark.parametrize(
    "cfg, match",
    [
        ({"dim_room": (2, 6)}, "dim_room"),
        ({"dim_room": (4, 4), "num_boxes": 3}, "dim_room"),
        ({"num_boxes": 0}, "num_boxes=0"),
        ({"search_depth": 0}, "search_depth=0"),
        ({"max_actions": 0}, "max_actions=0"),
        ({"min_solution_length": 0}, "min_solution_length=0"),
        ({"min_solution_length": 11}, "min_solution_length=11, max_solution_length=10"),
        ({"max_solution_length": 1}, "max_solution_length=1"),
    ],
)
def test_bad_config_names_the_parameter(cfg, match):
    with pytest.raises(ConfigError, match=match):
        SokobanEnv(**cfg)


@pytest.mark.parametrize("room", ["", "#####\n#_X_#\n#_O_#", "#####\n#PX_#\n#___#", "####\n#P#\n##"])
def test_bad_room_text_raises_config_error(room):
    with pytest.raises(ConfigError, match="room text"):
        SokobanEnv.from_text(room)


def test_symbols_redraw_the_same_room_and_name_themselves_in_the_instruction():
    plain, redrawn = make("sokoban"), make("sokoban", symbols="W.TBbAa")
    obs, _ = plain.reset(seed=4)
    other, _ = redrawn.reset(seed=4)
    grid, coords = obs.rsplit("\n", 1)
    assert other == grid.translate(str.maketrans("#_OX√PS", "W.TBbAa")) + "\n" + coords
    assert "#" not in other.rsplit("\n", 1)[0] and "W" in other
    legend = "Symbols: W wall, . floor, T target, B box, b box on target, A player, a player on target."
    assert legend in redrawn.instruction
    assert "# wall" in plain.instruction
    # Dynamics unchanged: the solver's actions solve the redrawn room with the same rewards.
    for action in plain.solve():
        a, b = plain.step(action), redrawn.step(action)
        assert a[1:] == b[1:]
    assert b[2] and b[4]["success"]


@pytest.mark.parametrize("symbols", ["#_OX", "##OX√PS", "#_OX √P"])
def test_symbols_must_be_seven_distinct_characters(symbols):
    with pytest.raises(ConfigError, match="symbols=.* is not allowed: use 7 distinct non-blank characters"):
        make("sokoban", symbols=symbols)
