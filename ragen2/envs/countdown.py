"""Countdown: combine the given numbers with + - * / to hit a target, one equation per episode."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from fractions import Fraction
from typing import ClassVar

import gymnasium as gym

from ragen2.envs import ENVS
from ragen2.envs.arith import NotArithmetic, parse_arithmetic
from ragen2.envs.base import TextEnv
from ragen2.errors import ConfigError

# TinyZero's Countdown scoring, used by RAGEN (SPEC §7): 1 for a correct equation,
# 0.1 for a well-formed one that is wrong, 0 for text that is no equation.
SUCCESS_REWARD = 1.0
FORMAT_REWARD = 0.1

# The solver enumerates every value reachable from every subset of the numbers;
# six numbers take about a second when no solution cuts the search short.
MAX_NUMBERS = 6
# Redraws per reset: reasoning-gym can fail to hit a narrow target range, and a
# problem whose target is one of its numbers (about 8% with the defaults) is skipped.
_MAX_DRAWS = 20

EXAMPLE_ACTIONS = ("(3 + 5) * 2", "12 / 4 - 1")


def solve_countdown(numbers: Sequence[int], target: int) -> str | None:
    """An equation that makes `target` from `numbers` (each used at most once), or None.

    Exhaustive search by subset: `best[mask]` maps every value reachable with
    exactly the numbers in `mask` to one expression for it. Masks are visited by
    size, so the equation returned uses as few numbers as possible. Values are
    exact fractions; division by zero is skipped.
    """
    n = len(numbers)
    # value -> (text, top-level operator or "" for a bare number)
    best: list[dict[Fraction, tuple[str, str]]] = [{} for _ in range(1 << n)]
    for i, x in enumerate(numbers):
        best[1 << i][Fraction(x)] = (str(x), "")
    goal = Fraction(target)
    for mask in sorted(range(1, 1 << n), key=lambda m: m.bit_count()):
        if mask.bit_count() > 1:
            sub = (mask - 1) & mask
            while sub:  # every ordered split of mask into two non-empty parts
                _combine(best[sub], best[mask ^ sub], best[mask], commutative_too=sub < mask ^ sub)
                sub = (sub - 1) & mask
        if goal in best[mask]:
            return best[mask][goal][0]
    return None


def _combine(
    left: dict[Fraction, tuple[str, str]],
    right: dict[Fraction, tuple[str, str]],
    out: dict[Fraction, tuple[str, str]],
    commutative_too: bool,
) -> None:
    """Add left op right for every pair; + and * only once per unordered split."""
    for a, a_expr in left.items():
        for b, b_expr in right.items():
            candidates = [("-", a - b)]
            if b != 0:
                candidates.append(("/", a / b))
            if commutative_too:
                candidates += [("+", a + b), ("*", a * b)]
            for op, value in candidates:
                if value not in out:
                    out[value] = (_join(a_expr, op, b_expr), op)


def _join(left: tuple[str, str], op: str, right: tuple[str, str]) -> str:
    """`left op right` with only the parentheses that change the value."""
    (a, a_op), (b, b_op) = left, right
    if op in "*/" and a_op in ("+", "-"):
        a = f"({a})"
    if (op in "-*" and b_op in ("+", "-")) or (op == "/" and b_op):
        b = f"({b})"
    return f"{a} {op} {b}"


def _given_problem(options: dict) -> tuple[tuple[int, ...], int]:
    if "numbers" not in options or "target" not in options:
        raise ConfigError(f"options need both 'numbers' and 'target'; got {sorted(options)}")
    numbers, target = options["numbers"], options["target"]
    if not (
        isinstance(numbers, list | tuple)
        and 2 <= len(numbers) <= MAX_NUMBERS
        and all(type(x) is int and x > 0 for x in numbers)
    ):
        raise ConfigError(f"options['numbers']={numbers!r} must be 2 to {MAX_NUMBERS} positive integers")
    if type(target) is not int or target < 1:
        raise ConfigError(f"options['target']: target={target!r} must be a positive integer")
    return tuple(numbers), target


@ENVS.register("countdown")
class CountdownEnv(TextEnv):
    """Make the target number from the given numbers with one arithmetic equation.

    ## Description
    Each reset draws a problem from reasoning-gym's Countdown generator (a random
    expression over `min_numbers`..`max_numbers` numbers in
    `min_value`..`max_value` whose value lies in `min_target`..`max_target`), so
    every problem has a solution that uses all its numbers. Problems whose target
    is itself one of the numbers are redrawn. The defaults (3-4 numbers up to
    20, targets 10-100) keep problems within reach of a small model.
    `solve()` returns an equation that uses as few numbers as possible, found by
    exhaustive search (`solve_countdown`).
    `reset(options={"numbers": [3, 5, 8], "target": 16})` poses a given problem.

    ## Actions
    One equation: integers, `+ - * /` and parentheses, optionally followed by
    `= <result>` (only the left side is evaluated). Evaluation is exact
    (fractions) and safe (`ragen2.envs.arith`, never `eval`). Unary minus,
    powers, decimals and any other text are not equations: invalid actions that
    leave the episode going. `×`, `÷` and `−` are read as `*`, `/` and `-`.

    ## Observation
    The problem, e.g. `Numbers: 3, 5, 8. Target: 16.`; after the equation, a
    verdict such as `Correct: 8 * (5 - 3) = 16.` or `Wrong: 3 + 5 = 8, not 16.`

    ## Rewards
    1 for an equation that equals the target and uses only the given numbers,
    each at most once (a subset is fine); 0.1 for any other equation (wrong
    value, numbers not given or used twice, division by zero); 0 for an invalid
    action.

    ## Episode end
    Terminated by the first equation, right or wrong (`max_actions` is 1); never
    truncated.

    ## Info
    - `action_is_valid` (bool): the action is an equation.
    - `success` (bool): the equation hits the target with the given numbers.
    - `uses_given_numbers` (bool): the equation uses only the given numbers, each at most once.
    """

    instruction: ClassVar[str] = (
        "You are playing Countdown. Combine the given numbers with +, -, * and / to make the target number.\n"
        "Use each given number at most once; you do not have to use them all. Parentheses are allowed, "
        "nothing else (no powers, no negative signs in front of a number).\n"
        "Action: one equation such as (3 + 5) * 2 or 12 / 4 - 1, optionally followed by = and its result.\n"
        "Rewards: 1 for an equation that equals the target using only the given numbers, "
        "0.1 for any other equation.\n"
        "Answer as <think>...</think><answer>(3 + 5) * 2</answer>: exactly one equation, not several joined by ||."
    )
    info_keys: ClassVar[frozenset[str]] = frozenset({"action_is_valid", "success", "uses_given_numbers"})
    max_actions: int = 1

    def __init__(
        self,
        min_numbers: int = 3,
        max_numbers: int = 4,
        min_value: int = 1,
        max_value: int = 20,
        min_target: int = 10,
        max_target: int = 100,
    ) -> None:
        if not 2 <= min_numbers <= max_numbers <= MAX_NUMBERS:
            raise ConfigError(
                f"min_numbers={min_numbers}, max_numbers={max_numbers} are not allowed: "
                f"use 2 <= min_numbers <= max_numbers <= {MAX_NUMBERS}"
            )
        if not 1 <= min_value <= max_value:
            raise ConfigError(
                f"min_value={min_value}, max_value={max_value} are not allowed: use 1 <= min_value <= max_value"
            )
        if not 1 <= min_target <= max_target:
            raise ConfigError(
                f"min_target={min_target}, max_target={max_target} are not allowed: "
                "use 1 <= min_target <= max_target"
            )
        self._config = dict(
            min_numbers=min_numbers, max_numbers=max_numbers, min_value=min_value, max_value=max_value,
            min_target=min_target, max_target=max_target,
        )
        self._numbers: tuple[int, ...] | None = None
        self._target = 0
        self._done = False

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[str, dict]:
        """Draw a problem; `options={"numbers": [3, 5, 8], "target": 16}` poses a given one instead."""
        gym.Env.reset(self, seed=seed)  # seeds self.np_random; TextEnv.reset is abstract
        if options and ("numbers" in options or "target" in options):
            numbers, target = _given_problem(options)
        else:
            numbers, target = self._draw_problem()
        self._numbers, self._target, self._done = numbers, target, False
        return self._prompt(), {}

    def _draw_problem(self) -> tuple[tuple[int, ...], int]:
        import reasoning_gym  # imported on first use: it takes seconds, `import ragen2.envs` stays fast

        for _ in range(_MAX_DRAWS):
            problem_seed = int(self.np_random.integers(2**31))
            try:
                item = reasoning_gym.create_dataset("countdown", seed=problem_seed, size=1, **self._config)[0]
            except ValueError:  # no expression landed in the target range for this seed
                continue
            numbers, target = item["metadata"]["numbers"], int(item["metadata"]["target"])
            if target not in numbers:
                return tuple(int(x) for x in numbers), target
        raise RuntimeError(
            f"no Countdown problem found in {_MAX_DRAWS} draws for {self._config}; widen the target range"
        )

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        numbers = self._require_problem()
        if self._done:
            raise RuntimeError("step() called after the episode ended: call reset() first")
        try:
            parsed = parse_arithmetic(action)
        except NotArithmetic:
            info = {"action_is_valid": False, "success": False, "uses_given_numbers": False}
            return self._prompt(), 0.0, False, False, info
        self._done = True
        equation = str(action).split("=")[0].strip()
        uses_given = not Counter(parsed.numbers) - Counter(numbers)
        success = uses_given and parsed.value == self._target
        if success:
            feedback = f"Correct: {equation} = {self._target}."
        elif not uses_given:
            allowed = ", ".join(map(str, numbers))
            feedback = f"Wrong: {equation} uses numbers not given; use {allowed}, each at most once."
        elif parsed.value is None:
            feedback = f"Wrong: {equation} divides by zero."
        else:
            feedback = f"Wrong: {equation} = {parsed.value}, not {self._target}."
        reward = SUCCESS_REWARD if success else FORMAT_REWARD
        info = {"action_is_valid": True, "success": success, "uses_given_numbers": uses_given}
        return feedback, reward, True, False, info

    def valid_actions(self) -> list[str]:
        """Example equations from the instruction: always well-formed, blind to the problem.

        Equations are open-ended, so a random agent draws from these examples; it
        earns the 0.1 format reward and succeeds only when an example happens to fit.
        """
        return list(EXAMPLE_ACTIONS)

    def solve(self) -> list[str] | None:
        """One equation for the current problem, using as few numbers as possible."""
        equation = solve_countdown(self._require_problem(), self._target)
        return None if equation is None else [equation]

    @property
    def numbers(self) -> tuple[int, ...]:
        """The given numbers, in the order shown."""
        return self._require_problem()

    @property
    def target(self) -> int:
        self._require_problem()
        return self._target

    def _require_problem(self) -> tuple[int, ...]:
        if self._numbers is None:
            raise RuntimeError("CountdownEnv has no problem yet: call reset() first")
        return self._numbers

    def _prompt(self) -> str:
        return f"Numbers: {', '.join(map(str, self._numbers))}. Target: {self._target}."
