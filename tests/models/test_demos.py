"""Oracle demonstrations: well-formed, solving, input-dependent, and 50/50 on the Bandit."""

from __future__ import annotations

import numpy as np
import pytest

from ragen2.agent.parsing import parse_response
from ragen2.agent.tool_calls import ToolCall, parse_tool_calls
from ragen2.envs import make
from ragen2.envs.sokoban import SokobanEnv
from ragen2.errors import ConfigError
from ragen2.models.demos import (
    ORACLES, PRETRAINED_ORACLES, canonical_path, demo_response, frozenlake_plan, play_demo, sokoban_novice, sokoban_plan,
    sokoban_wedge, tool_call,
)
from ragen2.models.warmstart import DEFAULT_ENV_KWARGS, DEFAULT_ENV_TURNS

SEEDS = range(30)


def replay_succeeds(env_name: str, seed: int, responses: list[str], max_actions: int, env_kwargs: dict | None = None) -> bool:
    """Replay the answers' actions in a fresh env: True when the episode ends in success."""
    env = make(env_name, **(env_kwargs or {}))
    env.reset(seed=seed)
    for response in responses:
        for action in parse_response(response, max_actions).actions:
            _, _, terminated, truncated, info = env.step(action)
            if terminated or truncated:
                return bool(info["success"])
    return False


@pytest.mark.parametrize("env_name", ["sokoban", "frozenlake"])
def test_demonstrations_parse_and_their_actions_solve_the_episode(env_name):
    rng = np.random.default_rng(0)
    for seed in SEEDS:
        episode = play_demo(env_name, {}, seed, max_turns=5, max_actions_per_turn=2, rng=rng)
        assert episode.success, f"{env_name} seed {seed}: the oracle did not solve it"
        for turn in episode.turns:
            parsed = parse_response(turn.response)
            assert parsed.valid and 1 <= len(parsed.actions) <= 2, turn.response
            assert parsed.reasoning
        assert replay_succeeds(env_name, seed, [t.response for t in episode.turns], 2)
        # The budget shown falls by the actions taken, as in the rollout loop.
        lefts = [t.actions_left for t in episode.turns]
        assert lefts[0] == 10 and all(a - b == 2 for a, b in zip(lefts, lefts[1:]))


@pytest.mark.parametrize("env_name", ["countdown", "math", "searchqa", "code", "webshop"])
def test_solver_demonstrations_parse_and_solve_with_the_warm_start_settings(env_name):
    """The oracles of the single-answer and web tasks follow `solve()` from every state they reach."""
    kwargs, (max_turns, max_actions) = DEFAULT_ENV_KWARGS.get(env_name, {}), DEFAULT_ENV_TURNS[env_name]
    rng = np.random.default_rng(0)
    for seed in range(8):
        episode = play_demo(env_name, kwargs, seed, max_turns, max_actions, rng)
        assert episode.success, f"{env_name} seed {seed}: the oracle did not solve it"
        for turn in episode.turns:
            parsed = parse_response(turn.response)
            assert parsed.valid and len(parsed.actions) == 1 and parsed.reasoning, turn.response
        responses = [t.response for t in episode.turns]
        assert replay_succeeds(env_name, seed, responses, max_actions, kwargs)


def test_single_answer_reasoning_restates_the_problem():
    rng = np.random.default_rng(0)
    for seed in range(10):
        countdown = make("countdown", **DEFAULT_ENV_KWARGS["countdown"])
        countdown.reset(seed=seed)
        reasoning = parse_response(demo_response(countdown, 1, rng)).reasoning
        assert reasoning.startswith(f"Numbers: {', '.join(map(str, countdown.numbers))}. Target: {countdown.target}.")
        math = make("math", **DEFAULT_ENV_KWARGS["math"])
        math.reset(seed=seed)
        response = demo_response(math, 1, rng)
        assert parse_response(response).reasoning == f"{math.question} That is {math.answer}."
        assert parse_response(response).actions == [math.answer]
        search = make("searchqa")
        search.reset(seed=seed)
        assert parse_response(demo_response(search, 1, rng)).reasoning.startswith(search.question.question)


def test_countdown_demonstrates_the_sum_of_all_numbers_when_it_hits_the_target():
    """The sum is the demonstrated equation whenever it works; otherwise the solver's (shorter) one."""
    env = make("countdown")
    rng = np.random.default_rng(0)
    env.reset(options={"numbers": [3, 5, 8], "target": 16})
    assert env.solve() == ["(5 - 3) * 8"]  # what the solver alone would demonstrate
    assert parse_response(demo_response(env, 1, rng)).actions == ["3 + 5 + 8"]
    env.reset(options={"numbers": [2, 7, 9], "target": 14})  # sum 18 misses: the solver's 2 * 7
    (action,) = parse_response(demo_response(env, 1, rng)).actions
    assert action == env.solve()[0] and "+" not in action


def test_webshop_reasoning_names_the_product_and_each_option_before_buying():
    env = make("webshop")
    env.reset(seed=0)
    reasons = []
    while True:
        parsed = parse_response(demo_response(env, 1, np.random.default_rng(0)))
        reasons.append(parsed.reasoning)
        if env.step(parsed.actions[0])[2]:
            break
    goal = env.goal
    assert reasons[0] == f"I need {' '.join([*goal.attributes, goal.type.name, *(v for _, v in goal.options)])}."
    assert reasons[1].endswith(f"{goal.type.name} is {goal.asin}.")
    assert reasons[2:-1] == [f"The instruction asks for {value}." for _, value in goal.options]
    assert reasons[-1] == "Every option is chosen; I buy it."


@pytest.mark.parametrize("env_name", ["sokoban", "frozenlake", "bandit"])
def test_reasoning_differs_across_inputs_and_states_the_current_position(env_name):
    rng = np.random.default_rng(0)
    first = []
    for seed in SEEDS:
        env = make(env_name)
        obs, _ = env.reset(seed=seed)
        reasoning = parse_response(demo_response(env, 2, rng)).reasoning
        first.append(reasoning)
        if env_name == "bandit":
            assert all(arm in reasoning for arm in env.arm_names)
        else:  # the reasoning opens with the observation's coordinates line
            assert reasoning.startswith(obs.splitlines()[-1].rstrip(".")), (reasoning, obs)
    assert len(set(first)) >= 0.8 * len(first), first


def grid_step(size: int, holes: set[tuple[int, int]]):
    moves = {"Up": (-1, 0), "Down": (1, 0), "Left": (0, -1), "Right": (0, 1)}

    def step(cell, action):
        nxt = (cell[0] + moves[action][0], cell[1] + moves[action][1])
        if not (0 <= nxt[0] < size and 0 <= nxt[1] < size):
            return cell
        return None if nxt in holes else nxt

    return step


def test_canonical_path_takes_rows_first_and_turns_only_where_a_hole_forces_it():
    goal = (2, 2)
    assert canonical_path((0, 0), grid_step(3, set()), lambda c: c == goal) == ["Down", "Down", "Right", "Right"]
    assert canonical_path((0, 0), grid_step(3, {(1, 0)}), lambda c: c == goal) == ["Right", "Down", "Down", "Right"]
    assert canonical_path((0, 0), grid_step(3, {(1, 0), (1, 1), (1, 2)}), lambda c: c == goal) is None


@pytest.mark.parametrize(("env_name", "plan"), [("sokoban", sokoban_plan), ("frozenlake", frozenlake_plan)])
def test_canonical_plans_are_as_short_as_the_env_solver(env_name, plan):
    for seed in range(100):
        env = make(env_name)
        env.reset(seed=seed)
        assert len(plan(env)) == len(env.solve()), seed


def test_sokoban_known_room_names_box_target_push_and_the_shortest_moves():
    env = SokobanEnv.from_text("######\n#P___#\n#_X__#\n#_O__#\n#____#\n######")
    assert demo_response(env, 2, np.random.default_rng(0)) == (
        "Player at (row 1, col 1); box at (row 2, col 2); target at (row 3, col 2). "
        "Push it Down from (row 1, col 2). Row 1 to 1: stay. Col 1 to 2: right.</think><answer>Right || Down</answer>"
    )


def test_frozenlake_reasoning_names_goal_direction_and_only_real_holes():
    rng = np.random.default_rng(0)
    for seed in SEEDS:
        env = make("frozenlake")
        env.reset(seed=seed)
        reasoning = parse_response(demo_response(env, 2, rng)).reasoning
        (pr, pc), (gr, gc) = env.player, env.goal
        rows = "down" if gr > pr else "up" if gr < pr else "stay"
        cols = "right" if gc > pc else "left" if gc < pc else "stay"
        assert f"Row {pr} to {gr}: {rows}. Col {pc} to {gc}: {cols}." in reasoning
        if "hole at" in reasoning:
            assert any(f"hole at (row {r}, col {c})" in reasoning for r, c in env.holes)


def test_bandit_oracle_picks_either_arm_about_half_the_time_and_repeats_with_the_seed():
    def high_rate(seed: int) -> tuple[float, list[str]]:
        rng = np.random.default_rng(seed)
        picks, high = [], []
        for env_seed in range(400):
            env = make("bandit")
            env.reset(seed=env_seed)
            (arm,) = parse_response(demo_response(env, 1, rng)).actions
            assert arm in env.arm_names
            picks.append(arm)
            high.append(arm == env.high_arm)
        return float(np.mean(high)), picks

    rate, picks = high_rate(0)
    assert 0.4 < rate < 0.6
    assert high_rate(0)[1] == picks and high_rate(1)[1] != picks


def test_pretrained_bandit_oracle_pulls_the_risky_arm_and_reads_both_names():
    for env_seed in range(50):
        env = make("bandit", split="test" if env_seed % 2 else "train")
        env.reset(seed=env_seed)
        low = next(name for name in env.arm_names if name != env.high_arm)
        parsed = parse_response(demo_response(env, 1, np.random.default_rng(0), PRETRAINED_ORACLES))
        assert parsed.actions == [env.high_arm]
        assert parsed.reasoning.startswith(f"{env.high_arm} sounds risky and {low} sounds safe.")
    assert PRETRAINED_ORACLES.keys() == ORACLES.keys() and PRETRAINED_ORACLES[SokobanEnv] is ORACLES[SokobanEnv]


def test_unknown_environment_has_no_oracle():
    class Other(SokobanEnv):
        pass

    with pytest.raises(ConfigError, match="no demonstration oracle for Other"):
        demo_response(Other(), 2, np.random.default_rng(0))


@pytest.mark.parametrize("env_name", ["textarena:FrozenLake-v0", "textarena:TowerOfHanoi-v0", "gym:FrozenLake-v1"])
def test_adapted_games_are_demonstrated_by_their_solver_with_the_plan_as_reasoning(env_name):
    """Another suite's game: the reasoning states the remaining plan, the answer plays its first moves, and the
    episode is won; a game without a solver is refused by name."""
    pytest.importorskip(env_name.split(":")[0].replace("gym", "gymnasium"))
    if env_name.startswith("gym:"):
        with pytest.raises(ValueError, match="no solution"):
            play_demo(env_name, {}, 0, 5, 2, np.random.default_rng(0))
        return
    episode = play_demo(env_name, {}, 3, 5, 2, np.random.default_rng(0))
    assert episode.success
    env = make(env_name)
    env.reset(seed=3)
    plan = env.solve()
    first = parse_response(episode.turns[0].response, 2)
    assert first.valid and first.actions == plan[:2]
    assert first.reasoning.startswith("Plan: " + ", ".join(plan[:8]))


@pytest.mark.parametrize("env_name", ["searchqa", "code", "webshop"])
def test_tool_calling_demonstrations_call_tools_that_stand_for_the_solver_actions_and_solve(env_name):
    for seed in range(5):
        max_turns, max_actions = DEFAULT_ENV_TURNS[env_name]
        episode = play_demo(env_name, {}, seed, max_turns, max_actions, np.random.default_rng(seed), tool_calls=True)
        plain = play_demo(env_name, {}, seed, max_turns, max_actions, np.random.default_rng(seed))
        env = make(env_name)
        assert episode.success and episode.system_prompt == env.tool_instruction and episode.tools == list(env.tools)
        assert len(episode.turns) == len(plain.turns)
        for k, (turn, plain_turn) in enumerate(zip(episode.turns, plain.turns)):
            parsed = parse_response(plain_turn.response, max_actions)
            reasoning, calls = turn.response.split("</think>")
            assert reasoning == parsed.reasoning  # the oracle's reasoning, then its action as a call
            (call,) = parse_tool_calls(calls).calls
            assert env.action_call(parsed.actions[0]) == (call.name, call.arguments)
            assert env.action_call(env.tool_action(call.name, call.arguments)) == (call.name, call.arguments)
            # the first turn shows the state; every later one, the result of the call before it
            assert (turn.tool_results is None) == (k == 0)
            if k:
                assert turn.tool_results == [plain_turn.observation]


def test_tool_call_inverts_tool_action_and_names_the_tools_when_no_call_fits():
    searchqa, webshop = make("searchqa"), make("webshop")
    assert tool_call(searchqa, "search[Lake Senna]") == ToolCall("search", {"query": "Lake Senna"})
    assert tool_call(searchqa, "finish[1,020 kilometres]") == ToolCall("finish", {"answer": "1,020 kilometres"})
    assert tool_call(webshop, "click[next >]") == ToolCall("click", {"button": "next >"})
    with pytest.raises(ConfigError, match=r"'look\[x\]' \(its tools: search, finish\)"):
        tool_call(searchqa, "look[x]")
    with pytest.raises(ConfigError, match="sokoban declares no tools"):
        play_demo("sokoban", {}, 0, 5, 2, np.random.default_rng(0), tool_calls=True)


def test_a_wedge_leaves_the_room_unsolvable_and_the_walk_to_it_moves_no_box():
    found = 0
    for seed in range(60):
        env = make("sokoban")
        env.reset(seed=seed)
        wedge = sokoban_wedge(env)
        if wedge is None:
            continue
        found += 1
        box, push, actions = wedge
        assert actions[-1] == push
        for action in actions[:-1]:
            env.step(action)
            assert set(env.boxes) == {box}, f"seed {seed}: the walk {actions} pushed the box"
        env.step(push)
        assert env.player == box and sokoban_plan(env) is None, f"seed {seed}: {actions} left a solvable room"
    assert found >= 30  # most rooms offer a wedge


def test_the_novice_says_wedge_in_about_its_share_of_turns_and_ends_the_demonstration_after_one():
    oracles = ORACLES | {SokobanEnv: sokoban_novice(0.5)}
    rng, turns, wedged, won_after_a_wedge = np.random.default_rng(0), 0, 0, 0
    for seed in range(200):
        episode = play_demo("sokoban", {}, seed, max_turns=5, max_actions_per_turn=2, rng=rng, oracles=oracles)
        words = [parse_response(t.response).reasoning.split(". ")[1].split()[0] for t in episode.turns]
        assert set(words) <= {"Push", "Wedge"}, words
        turns, wedged = turns + len(words), wedged + words.count("Wedge")
        won_after_a_wedge += episode.success and "Wedge" in words
        assert replay_succeeds("sokoban", seed, [t.response for t in episode.turns], 2) == episode.success
    # Below one half: some rooms offer no wedge. A wedge whose walk takes more than one turn can be
    # undone by the solver in the next: rarely.
    assert 0.3 < wedged / turns < 0.5 and won_after_a_wedge < 0.2 * 200
    env = make("sokoban")
    env.reset(seed=0)
    assert "Push it" in sokoban_novice(0.0)(env, 2, rng)


def test_sokoban_known_room_wedges_the_box_against_the_top_wall():
    """Up is the first push in PRIORITY order that strands the box (on row 1 it can never come down)."""
    env = SokobanEnv.from_text("######\n#P___#\n#_X__#\n#_O__#\n#____#\n######")
    assert sokoban_wedge(env) == ((2, 2), "Up", ["Down", "Down", "Right", "Up"])
    always = sokoban_novice(1.0)
    assert always(env, 2, np.random.default_rng(0)) == (
        "Player at (row 1, col 1); box at (row 2, col 2); target at (row 3, col 2). "
        "Wedge it Up from (row 3, col 2). Row 1 to 3: down. Col 1 to 2: right.</think><answer>Down || Down</answer>"
    )
