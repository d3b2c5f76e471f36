"""Countdown: the safe arithmetic parser, the exhaustive solver, the reward scheme and seeded problems."""

from __future__ import annotations

import itertools
import operator
import random
from collections import Counter
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from env_checks import check_docs_episode
from ragen2.envs import make
from ragen2.envs.arith import MAX_CHARS, NotArithmetic, parse_arithmetic
from ragen2.envs.check import check_env
from ragen2.envs.countdown import CountdownEnv, solve_countdown
from ragen2.errors import ConfigError

OPERATIONS = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv}


@pytest.mark.parametrize(
    "text, value, numbers",
    [
        ("(3 + 5) * 2", 16, (3, 5, 2)),
        ("(3+5)*2 = 16", 16, (3, 5, 2)),
        ("7 / 2 * 2", 7, (7, 2, 2)),  # exact: no float rounding
        ("1 - 7 / 2", Fraction(-5, 2), (1, 7, 2)),
        ("3 × 4 ÷ 6 − 1", 1, (3, 4, 6, 1)),
        ("((((12))))", 12, (12,)),
        ("1 / (2 - 2)", None, (1, 2, 2)),  # well-formed, undefined
    ],
)
def test_parser_known_values(text, value, numbers):
    parsed = parse_arithmetic(text)
    assert parsed.value == value and parsed.numbers == numbers


@pytest.mark.parametrize(
    "text",
    [
        "", "=", "-3 + 5", "2 ** 3", "7 // 2", "1.5 + 1", "1e3", "0x10", "1_000", "05 + 1", "3 4", "(3)(4)",
        "abs(3)", "__import__('os')", "1 = 2 = 3", "1 + 1 = x", "9999999 + 1", "+".join(["1"] * 17),
        "1" * (MAX_CHARS + 1),
    ],
)
def test_parser_rejects_everything_else(text):
    with pytest.raises(NotArithmetic):
        parse_arithmetic(text)


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(max_size=40), st.text(alphabet="0123456789+-*/() =×÷−", max_size=MAX_CHARS + 5)))
def test_parser_raises_only_not_arithmetic(text):
    try:
        parse_arithmetic(text)
    except NotArithmetic:
        pass


def expressions(depth: int = 3):
    """(text, exact value or None, numbers) of random fully parenthesised expressions."""
    leaf = st.integers(min_value=0, max_value=999).map(lambda n: (str(n), Fraction(n), (n,)))
    if depth == 0:
        return leaf
    sub = expressions(depth - 1)

    def join(a, op, b):
        undefined = a[1] is None or b[1] is None or (op == "/" and b[1] == 0)
        value = None if undefined else OPERATIONS[op](a[1], b[1])
        return f"({a[0]}) {op} ({b[0]})", value, a[2] + b[2]

    return st.one_of(leaf, st.builds(join, sub, st.sampled_from(sorted(OPERATIONS)), sub))


@settings(max_examples=300, deadline=None)
@given(expressions())
def test_parser_agrees_with_direct_fraction_arithmetic(expr):
    text, value, numbers = expr
    parsed = parse_arithmetic(text)
    assert (parsed.value, parsed.numbers) == (value, numbers)


def reachable(values: tuple[Fraction, ...]) -> set[Fraction]:
    """Slow reference: every value made by repeatedly combining two of the remaining values."""
    found = set(values)
    for i, j in itertools.permutations(range(len(values)), 2):
        a, b = values[i], values[j]
        rest = tuple(v for k, v in enumerate(values) if k not in (i, j))
        for value in [a + b, a - b, a * b] + ([a / b] if b else []):
            found |= reachable(rest + (value,))
    return found


@pytest.mark.parametrize("seed", range(40))
def test_solver_agrees_with_the_slow_reference(seed):
    rng = random.Random(seed)
    numbers = [rng.randint(1, 12) for _ in range(rng.randint(2, 4))]
    target = rng.randint(1, 60)
    equation = solve_countdown(numbers, target)
    assert (equation is not None) == (Fraction(target) in reachable(tuple(map(Fraction, numbers))))
    if equation is not None:
        parsed = parse_arithmetic(equation)
        assert parsed.value == target and not Counter(parsed.numbers) - Counter(numbers)


def test_solver_uses_as_few_numbers_as_possible():
    assert solve_countdown([3, 5, 8], 16) == "(5 - 3) * 8"
    assert solve_countdown([7, 1, 9], 63) == "7 * 9"
    assert solve_countdown([2, 2, 2], 7) is None
    assert parse_arithmetic(solve_countdown([25, 50, 75, 100, 3, 6], 952)).value == 952


def test_problems_follow_the_config_and_the_solver_solves_them():
    env = make("countdown")
    problems = set()
    for seed in range(60):
        obs, _ = env.reset(seed=seed)
        numbers, target = env.numbers, env.target
        assert obs == f"Numbers: {', '.join(map(str, numbers))}. Target: {target}."
        assert 3 <= len(numbers) <= 4 and all(1 <= x <= 20 for x in numbers) and 10 <= target <= 100
        assert target not in numbers
        problems.add((numbers, target))
        (equation,) = env.solve()
        obs, reward, terminated, truncated, info = env.step(equation)
        assert (reward, terminated, truncated) == (1.0, True, False)
        assert info == {"action_is_valid": True, "success": True, "uses_given_numbers": True}
        assert obs == f"Correct: {equation} = {target}."
    assert len(problems) >= 55
    assert make("countdown").reset(seed=7) == make("countdown").reset(seed=7)


def test_config_reaches_the_generator():
    env = make("countdown", min_numbers=5, max_numbers=5, min_value=30, max_value=40, min_target=200, max_target=900)
    for seed in range(5):
        env.reset(seed=seed)
        assert len(env.numbers) == 5 and all(30 <= x <= 40 for x in env.numbers) and 200 <= env.target <= 900
        assert env.step(env.solve()[0])[4]["success"]


def fixed_problem(numbers: list[int], target: int) -> CountdownEnv:
    env = make("countdown")
    env.reset(options={"numbers": numbers, "target": target})
    return env


@pytest.mark.parametrize(
    "action, reward, uses_given, feedback",
    [
        ("8 * (5 - 3)", 1.0, True, "Correct: 8 * (5 - 3) = 16."),
        ("(5 - 3) * 8 = 16", 1.0, True, "Correct: (5 - 3) * 8 = 16."),
        ("3 + 5 + 8", 1.0, True, "Correct: 3 + 5 + 8 = 16."),
        ("3 + 5 = 16", 0.1, True, "Wrong: 3 + 5 = 8, not 16."),  # the claimed result is not what counts
        ("8 + 8", 0.1, False, "Wrong: 8 + 8 uses numbers not given; use 3, 5, 8, each at most once."),
        ("2 * 8", 0.1, False, "Wrong: 2 * 8 uses numbers not given; use 3, 5, 8, each at most once."),
    ],
)
def test_rewards_follow_the_tinyzero_scheme(action, reward, uses_given, feedback):
    env = fixed_problem([3, 5, 8], 16)
    obs, r, terminated, truncated, info = env.step(action)
    assert (r, terminated, truncated) == (reward, True, False)
    assert info == {"action_is_valid": True, "success": reward == 1.0, "uses_given_numbers": uses_given}
    assert obs == feedback


def test_division_by_zero_with_given_numbers_is_wrong_not_invalid():
    env = fixed_problem([3, 5, 8, 8], 16)
    obs, reward, terminated, _, info = env.step("3 / (8 - 8)")
    assert (obs, reward, terminated) == ("Wrong: 3 / (8 - 8) divides by zero.", 0.1, True)
    assert info["uses_given_numbers"] and not info["success"]


@pytest.mark.parametrize(
    "action", ["", "sixteen", "8 * (5 - 3", "-3 + 19", "2 ** 4", "<answer>8 * 2</answer>", "8*2 || 3"]
)
def test_non_equations_are_invalid_and_change_nothing(action):
    env = make("countdown")
    obs, _ = env.reset(seed=3)
    invalid = {"action_is_valid": False, "success": False, "uses_given_numbers": False}
    assert env.step(action) == (obs, 0.0, False, False, invalid)
    env.step(env.solve()[0])
    with pytest.raises(RuntimeError, match="call reset"):
        env.step(env.solve()[0])


@pytest.mark.parametrize(
    "options, message",
    [
        ({"numbers": [3, 5]}, "options need both 'numbers' and 'target'"),
        ({"numbers": [3], "target": 3}, "2 to 6 positive integers"),
        ({"numbers": [3, 0], "target": 3}, "2 to 6 positive integers"),
        ({"numbers": [3, 5], "target": 2.5}, "target=2.5 must be a positive integer"),
    ],
)
def test_bad_problem_options_are_refused(options, message):
    with pytest.raises(ConfigError, match=message):
        make("countdown").reset(options=options)


def test_step_before_reset_raises():
    with pytest.raises(RuntimeError, match="call reset"):
        CountdownEnv().step("1 + 2")


@pytest.mark.parametrize(
    "cfg, message",
    [
        ({"min_numbers": 1}, "min_numbers=1, max_numbers=4 are not allowed"),
        ({"max_numbers": 7}, "max_numbers <= 6"),
        ({"min_value": 0}, "min_value=0, max_value=20 are not allowed"),
        ({"min_target": 50, "max_target": 20}, "min_target=50, max_target=20 are not allowed"),
    ],
)
def test_bad_config_names_the_parameter(cfg, message):
    with pytest.raises(ConfigError, match=message):
        CountdownEnv(**cfg)


def test_unreachable_target_range_says_how_to_fix_it():
    env = CountdownEnv(min_numbers=2, max_numbers=2, max_value=2, min_target=50, max_target=60)
    with pytest.raises(RuntimeError, match="widen the target range"):
        env.reset(seed=0)


def test_check_env_on_a_larger_config():
    env = make("countdown", min_numbers=4, max_numbers=6, max_value=50, min_target=100, max_target=500)
    check_env(env, seeds=range(3))


def test_docs_show_a_real_episode():
    assert len(check_docs_episode(make("countdown"), seed=2)) == 1  # one answer solves it
