"""Code: write a Python program that passes a problem's hidden tests (DeepCoder-style), run in a sandbox.

The module is `codeexec` so that it never shadows the standard library's `code` module; the
env is registered as "code".
"""

from __future__ import annotations

import json
import math
import re
import textwrap
from dataclasses import dataclass, replace
from decimal import Decimal, InvalidOperation
from typing import Any, ClassVar

import gymnasium as gym

from ragen2.envs import ENVS
from ragen2.envs.base import TextEnv, bracket_tool
from ragen2.envs.code_problems import BUILTIN_PROBLEMS, CodeTest, Problem, call_text, load_problems
from ragen2.envs.sandbox import Limits, RunResult, prepare, run_programs
from ragen2.errors import ConfigError, did_you_mean

# The blanks after a fence are one possessive run: two runs around an optional tag split a long
# run of spaces every way before failing, quadratic in the reply's length.
_FENCE = re.compile(r"```[ \t]*+(?:(?:python3?|py)[ \t]*+)?\n(.*?)```", flags=re.S | re.I)
# Marks the return value printed by the function-test driver, after anything the program printed.
_RESULT_MARKER = "\x1eragen2-result\x1e"
_CLIP = 200  # characters of each feedback field
# The instruction's two example programs; they are also `valid_actions()`.
_FUNCTION_EXAMPLE = "def double(x):\n    return 2 * x"
_STDIN_EXAMPLE = "print(input().upper())"
# What a program must do and may use, and the reward: shared by the instruction and the tool instruction.
_TASK_RULES = (
    "If the problem names a function, define it: it is called with each test's arguments and its return "
    'value is checked. For "Write double(x) returning twice x":\n'
    f"{_FUNCTION_EXAMPLE}\n"
    'Otherwise read standard input and print the answer. For "Print the input line in capitals":\n'
    f"{_STDIN_EXAMPLE}\n"
    "Only the standard library is available; the network, subprocesses and files outside the working "
    "directory are not.\n"
    "Reward: the fraction of hidden tests your program passes. "
)
_LIMIT_MESSAGES = {
    "wall_time": "time limit exceeded",
    "cpu_time": "time limit exceeded",
    "memory": "memory limit exceeded",
    "output_limit": "output limit exceeded",
    "file_size": "file size limit exceeded",
}


def extract_program(text: str) -> str:
    """The program in an answer: the last ```python fenced block if there is one, else the whole text.

    An unclosed opening fence is dropped too. The result is dedented and stripped of
    trailing whitespace; "" means there is no program.
    """
    blocks = _FENCE.findall(text)
    if blocks:
        text = blocks[-1]
    elif text.lstrip().startswith("```"):  # an unclosed fence: drop its opening line
        text = text.lstrip().partition("\n")[2].rstrip().removesuffix("```")
    return textwrap.dedent(text).rstrip()


def parse_program(text: str) -> str | None:
    """The program in `text` when it is a compilable Python 3 program, else None (an invalid action).

    Compiling runs nothing; it only rejects text that is not a program at all, so a
    program that fails at run time is a valid action with reward 0.
    """
    program = extract_program(text)
    if not program.strip():
        return None
    try:
        program.encode("utf-8")
        compile(program, "solution.py", "exec", dont_inherit=True)
    except (SyntaxError, ValueError, UnicodeError, RecursionError, MemoryError, OverflowError):
        return None
    return program + "\n"


def function_driver(program: str, fn_name: str) -> str:
    """A program that defines `program`'s names, calls `fn_name` on the JSON arguments in stdin and prints the result.

    The program runs as module `solution` (not `__main__`), so its own `if __name__ ==
    "__main__":` block does not read the arguments. LeetCode-style `class Solution`
    methods are found too. The driver holds no expected value: the host compares the
    printed result, so nothing in the sandbox tells a program what would pass.
    """
    return f"""import json
import sys

namespace = {{"__name__": "solution"}}
exec(compile({program!r}, "solution.py", "exec"), namespace)
if {fn_name!r} in namespace:
    function = namespace[{fn_name!r}]
elif "Solution" in namespace:
    function = getattr(namespace["Solution"](), {fn_name!r})
else:
    raise NameError({f"the program does not define {fn_name}"!r})
result = function(*json.loads(sys.stdin.read()))
sys.stdout.write("\\n" + {_RESULT_MARKER!r} + json.dumps(result) + "\\n")
"""


@dataclass(frozen=True)
class GradedTest:
    """How a program did on one test."""

    passed: bool
    got: str
    """What it produced, as shown in feedback: stdout, the return value's repr, an error or a limit."""
    run: RunResult


def grade(problem: Problem, program: str, limits: Limits, workers: int = 4) -> list[GradedTest]:
    """Run `program` on every test of `problem` in the sandbox, `workers` tests at a time."""
    if problem.fn_name is None:
        jobs = [(program, test.input) for test in problem.tests]
    else:
        driver = function_driver(program, problem.fn_name)
        jobs = [(driver, json.dumps(test.input)) for test in problem.tests]
    runs = run_programs(jobs, limits, max_workers=workers)
    return [GradedTest(*_check(problem, test, run), run) for test, run in zip(problem.tests, runs)]


def _check(problem: Problem, test: CodeTest, result: RunResult) -> tuple[bool, str]:
    if result.killed_reason is not None:
        return False, _LIMIT_MESSAGES[result.killed_reason]
    if result.exit_code != 0:
        error = result.stderr.strip().rpartition("\n")[2] or f"exit status {result.exit_code}"
        return False, f"error: {error}"
    if problem.fn_name is None:
        return same_output(result.stdout, test.expected), result.stdout
    _, found, encoded = result.stdout.rpartition(_RESULT_MARKER)
    if not found:
        return False, "no return value"
    try:
        got = json.loads(encoded)
    except (ValueError, RecursionError):
        return False, "unreadable return value"
    return any(same_value(got, want) for want in (test.expected, *test.also_accepted)), repr(got)


# Numbers compare as judges' "absolute or relative error at most 1e-6": two floats are equal when
# |x - y| <= max(REL_TOL * max(|x|, |y|), ABS_TOL). Integers compare exactly (see same_output).
REL_TOL = 1e-6
ABS_TOL = 1e-6
_EXACT_INT = 2**53  # floats hold every integer up to this magnitude, and skip some above it
# A number token; it is an integer when no group matched (no point, no exponent).
_NUMBER = re.compile(r"[+-]?(?:[0-9]+(\.[0-9]*)?|(\.)[0-9]+)([eE][+-]?[0-9]+)?")
_PLAIN_KEYS = (str, int, float, bool, type(None))


def same_output(got: str, expected: str) -> bool:
    """stdout equality as judges use it.

    Equal when the lines match ignoring trailing spaces and trailing blank lines; else when
    the whitespace-separated tokens match one by one, as identical text or as equal numbers
    (ASCII digits with an optional sign, decimal point and exponent):
    - two integers (sign and digits only) exactly, at any size: as floats, an approximation
      of a 19-digit answer or any two numbers past 1.8e308 would be equal;
    - two floats within REL_TOL or ABS_TOL (see above), both finite: inf, nan and a
      literal that overflows a float equal no other token;
    - an integer and a float when the float rounds to the integer and lies within the
      tolerance of it ("3.0" is 3, "999999006.0" is not 1000000006); past 2**53, where
      floats skip integers, the float's text must denote exactly that integer.
    """
    if _lines(got) == _lines(expected):
        return True
    got_tokens, expected_tokens = got.split(), expected.split()
    return len(got_tokens) == len(expected_tokens) and all(map(_same_token, got_tokens, expected_tokens))


def same_value(got: Any, expected: Any) -> bool:
    """Return-value equality after a JSON round trip; never raises.

    Numbers follow `same_output`'s rules (ints exact at any size, floats within the
    tolerance, non-finite floats equal nothing, a bool is no number); lists and tuples
    compare element-wise, dicts key by key. Only JSON's types (and tuples) can be equal:
    any other object is unequal without its `__eq__` being called, so a value cannot
    decide its own comparison. Nesting is walked without recursion, and a pair of
    containers met again (a cycle) adds nothing.
    """
    pending, seen = [(got, expected)], set()
    while pending:
        a, b = pending.pop()
        if type(a) in (list, tuple, dict):
            if (id(a), id(b)) in seen:
                continue
            seen.add((id(a), id(b)))
        if type(a) in (list, tuple) and type(b) in (list, tuple):
            if len(a) != len(b):
                return False
            pending.extend(zip(a, b))
        elif type(a) is dict and type(b) is dict:
            plain = all(type(k) in _PLAIN_KEYS for k in (*a, *b))
            if not (plain and a.keys() == b.keys()):
                return False
            pending.extend((a[k], b[k]) for k in a)
        elif type(a) in (int, float) and type(b) in (int, float):
            if not _same_numbers(a, b):
                return False
        elif not (type(a) is type(b) and type(a) in (str, bool, type(None)) and a == b):
            return False
    return True


def _same_numbers(x: int | float, y: int | float) -> bool:
    """Python ints and floats by `same_output`'s rules; an int past 2**53 equals only the float of exactly its value."""
    if type(x) is int and type(y) is int:
        return x == y
    if type(x) is int:
        x, y = y, x
    if not math.isfinite(x):
        return False
    if type(y) is float:
        return math.isfinite(y) and math.isclose(x, y, rel_tol=REL_TOL, abs_tol=ABS_TOL)
    if abs(y) > _EXACT_INT:
        return x == y  # Python compares an int and a float exactly
    return round(x) == y and math.isclose(x, y, rel_tol=REL_TOL, abs_tol=ABS_TOL)


def _same_token(a: str, b: str) -> bool:
    if a == b:
        return True
    a_number, b_number = _NUMBER.fullmatch(a), _NUMBER.fullmatch(b)
    if not (a_number and b_number):
        return False
    a_int, b_int = a_number.lastindex is None, b_number.lastindex is None
    if a_int and b_int:
        return Decimal(a) == Decimal(b)  # exact; int() refuses more than 4300 digits
    if not (a_int or b_int):
        return _same_numbers(float(a), float(b))
    integer, number = (Decimal(a), b) if a_int else (Decimal(b), a)
    x = float(number)
    if not math.isfinite(x):
        return False
    if integer.copy_abs() <= _EXACT_INT:
        return _same_numbers(x, int(integer))
    try:
        return Decimal(number) == integer
    except InvalidOperation:  # an exponent past Decimal's range: a float that small is no large integer
        return False


def _lines(text: str) -> list[str]:
    lines = [line.rstrip() for line in text.replace("\r\n", "\n").split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def _clip(text: str) -> str:
    text = text.rstrip("\n")
    return text if len(text) <= _CLIP else text[:_CLIP] + "..."


@ENVS.register("code")
class CodeEnv(TextEnv):
    """Write a Python program that passes a programming problem's hidden tests.

    ## Description
    Each reset picks a problem (from `seed`): by default one of the 28 built-in easy
    problems (`code_problems.BUILTIN_PROBLEMS`: sums, string reversal, FizzBuzz,
    palindromes, counting, ...; 18 read stdin and print, 10 ask for a function), or
    one from a local JSONL file in the TACO, LiveCodeBench or DeepCoder layout
    (`problems=path`, see `code_problems.load_problems`). The program is run once per
    test in the sandbox (`ragen2.envs.sandbox`: own filesystem with nothing of the
    project, own PID and network namespaces, own uid, CPU/memory/output/process
    limits), `workers` tests at a time. It gets only the test's input (on stdin, or the
    arguments through a driver); the expected outputs stay in the host, which compares.
    Where the machine cannot isolate programs the env refuses to start
    (`SandboxUnavailable`), unless `limits={"allow_unsandboxed": True}`.
    `reset(options={"problem": id})` picks a problem by id. `solve()` returns the
    problem's reference solution (every built-in problem has one).

    ## Actions
    One Python 3 program, optionally inside a ```python fenced block (the last fenced
    block is used). stdin problems read standard input and print the answer; function
    problems define the named function (or a `Solution` class method), which is called
    with each test's arguments. Text that is not a compilable program (empty, prose,
    a syntax error) is an invalid action. `valid_actions()` gives the
    instruction's two example programs (print the input in capitals; define
    `double`): well-formed, and they solve no built-in problem.
    With `rollout.tool_calls=true` the action is the tool `submit(program)`, called in
    the policy's native format; the program is the argument's text (a fenced block in it
    works too).

    ## Observation
    At reset, the problem statement (built-ins add the first test as an example). After
    an attempt: `Passed k/n tests.`; with `feedback=True` a failed attempt also shows
    the first failing test (input, expected, got; each clipped to 200 characters) and
    the attempts left.

    ## Rewards
    The fraction of tests the program passes. With `feedback=True` each attempt's
    reward is its pass fraction minus the previous attempt's, so an episode's return
    is the pass fraction of its final attempt, wherever the episode stops.

    ## Episode end
    `feedback=False` (default): terminated after the one attempt. `feedback=True`:
    terminated when every test passes, truncated after `max_tries` attempts.
    Invalid actions do not count as attempts.

    ## Info
    - `action_is_valid` (bool): the text held a compilable program.
    - `success` (bool): the program passed every test.
    """

    instruction: ClassVar[str] = (
        "You are solving a programming problem in Python 3. Write one complete program.\n"
        + _TASK_RULES
        + "When failing tests are reported back, you may answer again with a corrected program.\n"
        "Answer as <think>...</think><answer>```python\n...your program...\n```</answer>: exactly one program. "
        "Never write || in it: || separates actions."
    )
    tools: ClassVar[tuple[dict[str, Any], ...]] = (
        bracket_tool("submit", "Run a complete Python 3 program on the problem's hidden tests; the result says how "
                     "many passed (and, when failing tests are reported, the first one).", "program",
                     "The whole program: its source code, with newlines."),
    )
    tool_instruction: ClassVar[str] = (
        "You are solving a programming problem in Python 3 with the tool submit, which runs one complete program "
        "on the problem's hidden tests.\n"
        + _TASK_RULES
        + "When failing tests are reported back, you may submit a corrected program.\n"
        "Think inside <think>...</think>, then call submit once with the whole program."
    )
    info_keys: ClassVar[frozenset[str]] = frozenset({"action_is_valid", "success"})

    def __init__(
        self,
        problems: str | None = None,
        feedback: bool = False,
        max_tries: int = 3,
        max_tests: int | None = None,
        limits: dict | None = None,
        workers: int = 4,
    ) -> None:
        if max_tries < 1:
            raise ConfigError(f"max_tries={max_tries} is not allowed: use an integer >= 1")
        if max_tests is not None and max_tests < 1:
            raise ConfigError(f"max_tests={max_tests} is not allowed: use null (all tests) or an integer >= 1")
        if workers < 1:
            raise ConfigError(f"workers={workers} is not allowed: use an integer >= 1")
        if problems is None:
            self.problems = [replace(p, tests=p.tests[:max_tests]) for p in BUILTIN_PROBLEMS]
        else:
            self.problems = load_problems(problems, max_tests=max_tests)
        self._by_id = {p.id: p for p in self.problems}
        self.feedback = feedback
        self.max_tries = max_tries
        self.max_actions = max_tries if feedback else 1
        self.limits = Limits.from_dict(limits)
        prepare(self.limits)  # a machine that cannot isolate programs refuses here, not mid-training
        self.workers = workers
        self._problem: Problem | None = None
        self._tries = 0
        self._last_fraction = 0.0
        self._observation = ""
        self._done = False

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[str, dict]:
        """Pick a problem from `seed`, or `options["problem"]` (an id) when given."""
        gym.Env.reset(self, seed=seed)  # seeds self.np_random; TextEnv.reset is abstract
        if options and "problem" in options:
            pid = options["problem"]
            if pid not in self._by_id:
                raise ConfigError(f"unknown problem id {pid!r}." + did_you_mean(str(pid), self._by_id))
            self._problem = self._by_id[pid]
        else:
            self._problem = self.problems[int(self.np_random.integers(len(self.problems)))]
        self._tries, self._last_fraction, self._done = 0, 0.0, False
        self._observation = self._problem.statement
        return self._observation, {}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        problem = self._require_running()
        program = parse_program(str(action))
        if program is None:
            return self._observation, 0.0, False, False, {"action_is_valid": False, "success": False}
        outcomes = grade(problem, program, self.limits, self.workers)
        passed = sum(o.passed for o in outcomes)
        fraction = passed / len(outcomes)
        reward = fraction - self._last_fraction
        self._tries += 1
        self._last_fraction = fraction
        success = passed == len(outcomes)
        terminated = success or not self.feedback
        truncated = not terminated and self._tries >= self.max_tries
        self._done = terminated or truncated
        self._observation = self._report(problem, outcomes)
        return self._observation, reward, terminated, truncated, {"action_is_valid": True, "success": success}

    def _report(self, problem: Problem, outcomes: list[GradedTest]) -> str:
        passed = sum(o.passed for o in outcomes)
        text = f"Passed {passed}/{len(outcomes)} tests."
        failed = next((i for i, o in enumerate(outcomes) if not o.passed), None)
        if not self.feedback or failed is None:
            return text
        test = problem.tests[failed]
        given = test.input if problem.fn_name is None else call_text(problem.fn_name, test.input)
        expected = test.expected if problem.fn_name is None else repr(test.expected)
        text += (
            f"\nFirst failing test:\nInput:\n{_clip(given)}\nExpected:\n{_clip(expected)}\n"
            f"Got:\n{_clip(outcomes[failed].got) or '(no output)'}"
        )
        left = self.max_tries - self._tries
        return text + (f"\nAttempts left: {left}. Answer with a corrected program." if left else "")

    def tool_action(self, name: str, arguments: dict[str, Any]) -> str | None:
        """The call submit(program) is the program itself as the action; anything else is no action."""
        program = arguments.get("program")
        return program if name == "submit" and set(arguments) == {"program"} and isinstance(program, str) else None

    def action_call(self, action: str) -> tuple[str, dict[str, Any]] | None:
        """submit(program) with the action's program, unfenced (None when the action holds no program)."""
        program = parse_program(action)
        return None if program is None else ("submit", {"program": program})

    def valid_actions(self) -> list[str]:
        """The instruction's two example programs: well-formed, and they solve no built-in problem."""
        return [_STDIN_EXAMPLE, _FUNCTION_EXAMPLE]

    def solve(self) -> list[str] | None:
        """The problem's reference program as the one action, or None when it has none."""
        solution = self._require_problem().solution
        return None if solution is None else [solution]

    @property
    def problem(self) -> Problem:
        return self._require_problem()

    def _require_problem(self) -> Problem:
        if self._problem is None:
            raise RuntimeError("CodeEnv has no problem yet: call reset() first")
        return self._problem

    def _require_running(self) -> Problem:
        problem = self._require_problem()
        if self._done:
            raise RuntimeError("step() called after the episode ended: call reset() first")
        return problem
