"""Math questions with one final answer, checked by math-verify; each retry is worth half the last."""

from __future__ import annotations

import functools
import re
import threading
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any, ClassVar

import gymnasium as gym

from ragen2.envs import ENVS
from ragen2.envs.base import TextEnv
from ragen2.envs.data import read_records, require_fields
from ragen2.errors import ConfigError, did_you_mean

# An answer is one line of printable text, at most this long (or as long as the gold
# answer, when that is longer): a final answer, not a derivation.
MAX_ANSWER_CHARS = 100
EXAMPLE_ACTIONS = ("42", "-3/4")

# MetaMathQA solutions end with "The answer is: X"; GSM8K solutions with "#### X".
_ANSWER_MARKERS = {"MetaMathQA": "The answer is", "GSM8K": "####"}
_NUMBER = re.compile(r"[-+]?\d+(\.\d+)?(/\d+)?")
_THOUSANDS = re.compile(r"[-+]?\d{1,3}(,\d{3})+(\.\d+)?")
_BOXED = re.compile(r"\\boxed\{(.*)\}")


@dataclass(frozen=True)
class Problem:
    question: str
    answer: str  # the gold final answer


def load_problems(path: str | Path) -> tuple[Problem, ...]:
    """Questions and gold answers from a MetaMathQA- or GSM8K-format file (.jsonl, .json or .parquet).

    The format is detected from the first record: `query` + `response` (the
    response ends with `The answer is: X`) is MetaMathQA; `question` + `answer`
    is GSM8K when the answer holds `#### X`, and a plain question/answer pair
    when the answer is one short line. Loaded files are cached per path and
    modification time, since the rollout builds one env per episode.

    Raises:
        ConfigError: naming the file, the record and the missing field or marker.
    """
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"path={str(path)!r} is not a file: pass a MetaMathQA or GSM8K .jsonl/.json/.parquet file")
    return _load_problems(str(path.resolve()), path.stat().st_mtime_ns)


@functools.lru_cache(maxsize=8)
def _load_problems(path: str, mtime_ns: int) -> tuple[Problem, ...]:  # mtime_ns keys the cache: edits reload
    problems, fields, kind = [], (), ""
    for where, record in read_records(path):
        if not fields:
            fields = ("query", "response") if "query" in record else ("question", "answer")
            kind = "MetaMathQA" if fields[0] == "query" else "GSM8K"
        require_fields(path, where, record, fields, kind)
        question, solution = record[fields[0]].strip(), record[fields[1]].strip()
        problems.append(Problem(question, _gold_answer(path, where, kind, solution)))
    if not problems:
        raise ConfigError(f"{path} holds no records")
    return tuple(problems)


def _gold_answer(path: str, where: str, kind: str, solution: str) -> str:
    marker = _ANSWER_MARKERS[kind]
    if marker in solution:
        answer = " ".join(solution.rsplit(marker, 1)[1].lstrip(":").split())
        if answer:
            return answer
    if kind == "GSM8K" and "\n" not in solution and len(solution) <= MAX_ANSWER_CHARS:
        return solution  # a plain question/answer pair
    expected = "'The answer is: X'" if kind == "MetaMathQA" else "'#### X' (or a one-line answer)"
    raise ConfigError(f"{path}, {where}: the {kind} solution has no final answer; it must end with {expected}")


def answers_match(gold: str, answer: str) -> bool:
    """True when `answer` equals the gold answer as mathematics.

    Fast path: after trimming `$`, `\\boxed{}`, a final period and thousands
    separators, two plain numbers (integers, decimals, a/b) are compared exactly
    and equal strings match. Everything else goes to math-verify, which parses
    both as LaTeX and compares them symbolically (`1/2` = `\\frac{1}{2}` = `0.5`).
    Its 1-second timeouts use SIGALRM, which only the main thread may set; in
    other threads it runs without them (answers are at most 100 characters).
    """
    gold, answer = _normalise(gold), _normalise(answer)
    if gold == answer:
        return True
    gold_number, answer_number = _as_number(gold), _as_number(answer)
    if gold_number is not None and answer_number is not None:
        return gold_number == answer_number
    from math_verify import parse, verify  # imported on first use: it loads sympy's LaTeX parser

    timeout = 1 if threading.current_thread() is threading.main_thread() else None
    gold_parsed = parse(f"${gold}$", parsing_timeout=timeout)
    answer_parsed = parse(f"${answer}$", parsing_timeout=timeout)
    return bool(gold_parsed and answer_parsed and verify(gold_parsed, answer_parsed, timeout_seconds=timeout))


def _normalise(text: str) -> str:
    text = text.strip().strip("$").strip()
    boxed = _BOXED.fullmatch(text)
    if boxed:
        text = boxed.group(1).strip()
    text = text.removesuffix(".").strip()
    if _THOUSANDS.fullmatch(text):
        text = text.replace(",", "")
    return text


def _as_number(text: str) -> Fraction | None:
    if not _NUMBER.fullmatch(text):
        return None
    try:
        return Fraction(text)
    except ZeroDivisionError:
        return None


@ENVS.register("math")
class MathEnv(TextEnv):
    """Answer a math question; a wrong answer may be retried, for half the reward each time.

    ## Description
    Questions come from a reasoning-gym generator (`dataset`, default
    `basic_arithmetic`, configured by `dataset_kwargs`; reasoning-gym's defaults
    when None), or from a local file given as `path`: MetaMathQA format
    (`query`, `response` ending with `The answer is: X`) or GSM8K format
    (`question`, `answer` ending with `#### X`), as .jsonl, .json or .parquet
    (see `load_problems`). The paper's MetaMathQA is such a file. Answers are
    checked by `answers_match`: exact comparison of plain numbers first, then
    math-verify. `solve()` returns the gold answer.

    ## Actions
    One final answer: a single line of printable text, at most 100 characters
    (or the gold answer's length when that is longer),
    e.g. `42`, `-3/4`, `\\frac{3}{4}`, `2\\sqrt{3}`. An empty, multi-line or
    longer text is an invalid action (no try is used).

    ## Observation
    The question, e.g. `Calculate 5 - 3.`; after a wrong answer with tries
    left, the question followed by `Incorrect, try again.`; at the end
    `Correct.` or `Incorrect. The answer is 2.`

    ## Rewards
    A correct answer at try r (counting from 0) earns 1/2^r: 1, 0.5, 0.25, ...
    A wrong answer earns 0, as does an invalid action.

    ## Episode end
    Terminated by a correct answer (`success`) or by the last wrong answer of
    `max_tries` (the task is over, so this is termination, not truncation).
    `max_actions` equals `max_tries`, so the episode is never truncated.

    ## Info
    - `action_is_valid` (bool): the action is one line of printable text within the length limit.
    - `success` (bool): the answer is correct.
    """

    instruction: ClassVar[str] = (
        "You are solving a math problem. Give only the final answer: a number or a short expression, "
        "without units or words.\n"
        "You have several tries. A correct answer earns 1 on the first try, 0.5 on the second, 0.25 on the third "
        "and so on; after a wrong answer you are told it is incorrect and may try again.\n"
        "Answer as <think>...</think><answer>42</answer>: exactly one answer such as 42 or -3/4, "
        "not several joined by ||."
    )
    info_keys: ClassVar[frozenset[str]] = frozenset({"action_is_valid", "success"})

    def __init__(
        self,
        dataset: str = "basic_arithmetic",
        dataset_kwargs: dict[str, Any] | None = None,
        path: str | None = None,
        max_tries: int = 3,
    ) -> None:
        if not isinstance(max_tries, int) or max_tries < 1:
            raise ConfigError(f"max_tries={max_tries!r} is not allowed: use an integer >= 1")
        self.max_tries = self.max_actions = max_tries
        self.dataset, self.dataset_kwargs = dataset, dict(dataset_kwargs or {})
        self._file_problems: tuple[Problem, ...] | None = None
        if path is not None:
            if dataset_kwargs:
                raise ConfigError(
                    f"dataset_kwargs={dataset_kwargs} configure reasoning-gym datasets, not path={path!r}: drop one"
                )
            self._file_problems = load_problems(path)
        else:
            self._check_dataset()
        self._problem: Problem | None = None
        self._wrong = 0
        self._done = False

    def _check_dataset(self) -> None:
        """Build one item now, so a bad name or config fails at construction with the reason."""
        import reasoning_gym  # imported on first use: it takes seconds, `import ragen2.envs` stays fast
        from reasoning_gym.factory import DATASETS

        if self.dataset not in DATASETS:
            raise ConfigError(
                f"dataset={self.dataset!r} is not a reasoning-gym dataset (e.g. 'basic_arithmetic', "
                f"'gsm_symbolic', 'chain_sum')." + did_you_mean(self.dataset, DATASETS)
            )
        try:
            reasoning_gym.create_dataset(self.dataset, seed=0, size=1, **self.dataset_kwargs)[0]
        except (TypeError, AssertionError, ValueError) as e:
            raise ConfigError(
                f"dataset_kwargs={self.dataset_kwargs} rejected by reasoning-gym's {self.dataset!r}: {e}"
            ) from e

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[str, dict]:
        gym.Env.reset(self, seed=seed)  # seeds self.np_random; TextEnv.reset is abstract
        if self._file_problems is not None:
            self._problem = self._file_problems[int(self.np_random.integers(len(self._file_problems)))]
        else:
            import reasoning_gym

            item_seed = int(self.np_random.integers(2**31))
            item = reasoning_gym.create_dataset(self.dataset, seed=item_seed, size=1, **self.dataset_kwargs)[0]
            # one line, like file answers, so `solve()` is always a valid action
            self._problem = Problem(str(item["question"]).strip(), " ".join(str(item["answer"]).split()))
        self._wrong, self._done = 0, False
        return self._problem.question, {}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        problem = self._require_problem()
        if self._done:
            raise RuntimeError("step() called after the episode ended: call reset() first")
        answer = str(action).strip()
        if not answer or len(answer) > max(MAX_ANSWER_CHARS, len(problem.answer)) or not answer.isprintable():
            return self._observation(), 0.0, False, False, {"action_is_valid": False, "success": False}
        if answers_match(problem.answer, answer):
            self._done = True
            reward = 0.5**self._wrong
            return "Correct.", reward, True, False, {"action_is_valid": True, "success": True}
        self._wrong += 1
        self._done = self._wrong >= self.max_tries
        obs = f"Incorrect. The answer is {problem.answer}." if self._done else self._observation()
        return obs, 0.0, self._done, False, {"action_is_valid": True, "success": False}

    def valid_actions(self) -> list[str]:
        """Example answers from the instruction: well-formed, right only by chance.

        Answers are open-ended, so a random agent draws from these examples.
        """
        return list(EXAMPLE_ACTIONS)

    def solve(self) -> list[str] | None:
        """The gold answer."""
        return [self._require_problem().answer]

    @property
    def question(self) -> str:
        return self._require_problem().question

    @property
    def answer(self) -> str:
        """The gold final answer."""
        return self._require_problem().answer

    def _require_problem(self) -> Problem:
        if self._problem is None:
            raise RuntimeError("MathEnv has no question yet: call reset() first")
        return self._problem

    def _observation(self) -> str:
        question = self._require_problem().question
        return question if self._wrong == 0 else f"{question}\nIncorrect, try again."
