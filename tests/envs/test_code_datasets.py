"""Loading TACO, LiveCodeBench and DeepCoder JSONL files: layouts, grading semantics, clear errors."""

from __future__ import annotations

import base64
import json
import pickle
import zlib

import pytest

from ragen2.envs.code_problems import load_problems
from ragen2.envs.codeexec import CodeEnv
from ragen2.errors import ConfigError

SUM_PROGRAM = "a, b = map(int, input().split())\nprint(a + b)"


def write_jsonl(tmp_path, rows, name="problems.jsonl"):
    path = tmp_path / name
    path.write_text("".join((row if isinstance(row, str) else json.dumps(row)) + "\n" for row in rows))
    return path


def play(path, program, problem_index=0, **cfg):
    env = CodeEnv(problems=str(path), **cfg)
    env.reset(options={"problem": env.problems[problem_index].id})
    return env.step(program)


def compress(cases):
    """LiveCodeBench's published encoding of private tests."""
    return base64.b64encode(zlib.compress(pickle.dumps(json.dumps(cases)))).decode()


TACO_STDIN = {
    "id": "taco-sum",
    "question": "Print the sum of two integers.",
    "input_output": json.dumps({"inputs": ["1 2\n", ["3 4", ""]], "outputs": ["3\n", ["7"]]}),
    "solutions": json.dumps([SUM_PROGRAM]),
}
TACO_FUNCTION = {
    "question": "Return the larger of a and b.",
    "starter_code": "def larger(a, b):\n    ",
    "input_output": json.dumps({"fn_name": "larger", "inputs": [[1, 2], [5, 3]], "outputs": [[2], [5]]}),
}


def test_taco_stdin_and_function_layouts(tmp_path):
    path = write_jsonl(tmp_path, [TACO_STDIN, TACO_FUNCTION])
    stdin_problem, function_problem = load_problems(path)
    assert stdin_problem.id == "taco-sum" and stdin_problem.fn_name is None
    assert [t.input for t in stdin_problem.tests] == ["1 2\n", "3 4\n"]  # a list of lines is joined
    assert function_problem.id == "problems:2" and function_problem.fn_name == "larger"
    assert "Starter code:\n```python\ndef larger(a, b):\n```" in function_problem.statement
    assert play(path, CodeEnv(problems=str(path)).problems[0].solution)[1] == 1.0
    # TACO wraps each expected return value in a list; the bare value passes, as in TACO's checker.
    assert play(path, "def larger(a, b):\n    return max(a, b)", 1)[1] == 1.0
    assert play(path, "def larger(a, b):\n    return [max(a, b)]", 1)[1] == 1.0
    assert play(path, "def larger(a, b):\n    return a", 1)[1] == 0.5


def test_livecodebench_layout_with_compressed_private_tests(tmp_path):
    stdin_row = {
        "question_id": "lcb-1",
        "question_content": "Print the sum of two integers.",
        "public_test_cases": json.dumps([{"input": "1 2\n", "output": "3\n", "testtype": "stdin"}]),
        "private_test_cases": compress([{"input": "10 -3\n", "output": "7\n", "testtype": "stdin"}]),
        "metadata": "{}",
    }
    functional_row = {
        "question_id": "lcb-2",
        "question_content": "Given nums and k, return how many values are below k.",
        "starter_code": "class Solution:\n    def countBelow(self, nums: List[int], k: int) -> int:\n        ",
        "public_test_cases": json.dumps([{"input": "[1, 5, 3]\n4", "output": "2", "testtype": "functional"}]),
        "private_test_cases": compress([{"input": "[]\n1", "output": "0", "testtype": "functional"}]),
        "metadata": json.dumps({"func_name": "countBelow"}),
    }
    path = write_jsonl(tmp_path, [stdin_row, functional_row])
    first, second = load_problems(path)
    assert len(first.tests) == 2 and first.tests[1].input == "10 -3\n"
    assert second.fn_name == "countBelow" and [t.input for t in second.tests] == [[[1, 5, 3], 4], [[], 1]]
    assert play(path, SUM_PROGRAM)[1] == 1.0
    solution = "class Solution:\n    def countBelow(self, nums, k):\n        return sum(x < k for x in nums)"
    assert play(path, solution, 1)[1] == 1.0


def test_deepcoder_layouts(tmp_path):
    listed = {
        "problem": "Return the number of vowels in s.",
        "tests": json.dumps([
            {"input": '"banana"', "output": "3", "testtype": "functional", "metadata": {"func_name": "vowels"}},
            {"input": '"xyz"', "output": "0", "testtype": "functional"},
        ]),
    }  # fmt: skip
    taco_style = {
        "problem": "Print the sum of two integers.",
        "tests": {"inputs": ["2 2\n"], "outputs": ["4\n"]},
        "metadata": {"func_name": None},
    }
    path = write_jsonl(tmp_path, [listed, taco_style])
    first, second = load_problems(path)
    assert first.fn_name == "vowels" and first.tests[0].input == ["banana"]
    assert second.fn_name is None
    assert play(path, "def vowels(s):\n    return sum(c in 'aeiou' for c in s)")[1] == 1.0
    assert play(path, SUM_PROGRAM, 1)[1] == 1.0


def test_max_tests_keeps_the_first_tests(tmp_path):
    path = write_jsonl(tmp_path, [TACO_STDIN])
    assert len(load_problems(path, max_tests=1)[0].tests) == 1
    assert len(CodeEnv(problems=str(path), max_tests=1).problems[0].tests) == 1


@pytest.mark.parametrize(
    "row, message",
    [
        ("{not json", r"problems.jsonl:2: not a JSON object"),
        ({"title": "x", "body": "y"}, r"problems.jsonl:2: unknown problem layout with keys \['body', 'title'\]"),
        ({"question": "", "input_output": "{}"}, r":2: TACO layout needs a non-empty text field 'question'"),
        ({"question": "q", "input_output": '{"inputs": [1]}'}, r":2: input_output must be an object with 'inputs' and"),
        ({"question": "q", "input_output": '{"inputs": [1], "outputs": []}'}, r":2: 'inputs' and 'outputs' must be"),
        ({"question_content": "q"}, r":2: LiveCodeBench layout needs public_test_cases or private_test_cases"),
        ({"problem": "q"}, r":2: DeepCoder layout needs a 'tests' field"),
        ({"problem": "q", "tests": "[{\"input\": \"1\"}]"}, r":2: test 0 must be an object with 'input' and 'output'"),
        ({"problem": "q", "tests": [{"input": "1", "output": "1", "testtype": "functional"}]}, r"need a function name"),
        ({"problem": "q", "tests": [{"input": "1", "output": "1", "testtype": "functional",
                                     "metadata": {"func_name": "f"}}, {"input": "1", "output": "1"}]},
         r"mixes stdin and functional tests"),
        ({"problem": "q", "tests": []}, r":2: the problem has no tests"),
    ],
)  # fmt: skip
def test_errors_name_the_file_the_line_and_what_is_missing(tmp_path, row, message):
    path = write_jsonl(tmp_path, [TACO_STDIN, row])
    with pytest.raises(ConfigError, match=message):
        load_problems(path)


class Boom:
    def __reduce__(self):
        return (print, ("this must never run",))


def test_compressed_tests_never_unpickle_code(tmp_path, capsys):
    packed = base64.b64encode(zlib.compress(pickle.dumps(Boom()))).decode()
    row = {"question_content": "q", "private_test_cases": packed}
    path = write_jsonl(tmp_path, [row])
    with pytest.raises(ConfigError, match="refusing to load builtins.print"):
        load_problems(path)
    assert "this must never run" not in capsys.readouterr().out


def test_empty_file(tmp_path):
    with pytest.raises(ConfigError, match="no problems in the file"):
        load_problems(write_jsonl(tmp_path, []))
