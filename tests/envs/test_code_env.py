"""The `code` env: program extraction, output comparison, grading, single- and multi-try episodes, built-in problems."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from chat_templates import QWEN25_TOOLS
from ragen2.agent.parsing import ResponseFormat, parse_response
from ragen2.agent.rollout import conversation
from ragen2.agent.tool_calls import ToolCall, parse_tool_turn, render_tool_calls
from ragen2.config import RolloutConfig, load_config
from ragen2.envs import make
from ragen2.envs.check import check_env
from ragen2.envs.code_problems import BUILTIN_PROBLEMS
from ragen2.envs.codeexec import CodeEnv, extract_program, parse_program, same_output, same_value
from ragen2.errors import ConfigError
from ragen2.models.tiny import build_tokenizer

DOCS = Path(__file__).resolve().parents[2] / "docs" / "environments.md"
PRESET = Path(__file__).resolve().parents[2] / "ragen2" / "configs" / "envs" / "code.yaml"


@pytest.mark.parametrize(
    "text, program",
    [
        ("print(1)", "print(1)"),
        ("```python\nprint(1)\n```", "print(1)"),
        ("Here it is:\n```py\nx = 1\nprint(x)\n```\nDone.", "x = 1\nprint(x)"),
        ("```python\nprint(1)\n```\nbetter:\n```python\nprint(2)\n```", "print(2)"),
        ("```python\nprint(3)", "print(3)"),
        ("```\n    if True:\n        print(4)\n```", "if True:\n    print(4)"),
    ],
)
def test_extract_program(text, program):
    assert extract_program(text) == program


@pytest.mark.parametrize("text", ["", "   \n", "```python\n```", "Sure! I will solve it.", "def f(:\n", "\x00 x"])
def test_text_that_is_not_a_program_is_rejected(text):
    assert parse_program(text) is None


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=80))
def test_parsing_never_raises(text):
    program = parse_program(text)
    assert program is None or program.endswith("\n")


@pytest.mark.parametrize(
    "got, expected, same",
    [
        ("5\n", "5", True),
        ("1 2  \n3\n\n", "1 2\n3", True),
        ("0.3333333\n", "0.33333333", True),
        ("1.0", "1", True),
        ("5", "6", False),
        ("YES", "yes", False),
        ("1 2", "1\n2", True),  # token by token
        ("1 2 3", "1 2", False),
    ],
)
def test_same_output(got, expected, same):
    assert same_output(got, expected) is same


@pytest.mark.parametrize(
    "got, expected, same",
    [
        (212.00000001, 212.0, True),
        ([1, [2.0, 3]], [1, [2, 3]], True),
        ({"a": 1}, {"a": 1.0}, True),
        (True, 1, False),
        ([1, 2], [2, 1], False),
        ("a", "a", True),
        (None, 0, False),
    ],
)
def test_same_value(got, expected, same):
    assert same_value(got, expected) is same


# A Stirling series for n!: within 1e-9 of 20!, and wrong in its last digits.
STIRLING = "int(math.exp(n * math.log(n) - n + 0.5 * math.log(2 * math.pi * n) + 1 / (12 * n) - 1 / (360 * n**3)))"


def test_an_approximate_large_integer_gets_no_reward(tmp_path):
    approximation, exact = eval(STIRLING, {"math": math, "n": 20}), math.factorial(20)
    assert approximation != exact and math.isclose(approximation, exact, rel_tol=1e-9)
    factorial = {
        "question": "Read n and print n!.",
        "input_output": json.dumps({"inputs": ["20\n", "25\n"], "outputs": [f"{exact}\n", f"{math.factorial(25)}\n"]}),
    }
    power = {
        "question": "Return 7 to the power n.",
        "input_output": json.dumps({"fn_name": "power7", "inputs": [[474], [1]], "outputs": [[7**474], [7]]}),
    }
    path = tmp_path / "problems.jsonl"
    path.write_text(json.dumps(factorial) + "\n" + json.dumps(power) + "\n")
    env = CodeEnv(problems=str(path))
    stirling = f"import math\nn = int(input())\nprint({STIRLING})"
    for program, reward in [(stirling, 0.0), ("import math\nprint(math.factorial(int(input())))", 1.0)]:
        env.reset(options={"problem": env.problems[0].id})
        assert env.step(program)[1] == reward, program
    for body, reward in [("return 2**1024", 0.0), ("return 10**400", 0.0), ("return 7**n", 1.0)]:
        env.reset(options={"problem": env.problems[1].id})  # compared as floats, each raised OverflowError
        assert env.step(f"def power7(n):\n    {body}")[1] == reward, body


def test_builtin_problems():
    ids = [p.id for p in BUILTIN_PROBLEMS]
    assert len(ids) == len(set(ids)) == 28
    assert sum(p.fn_name is None for p in BUILTIN_PROBLEMS) == 18
    for problem in BUILTIN_PROBLEMS:
        assert len(problem.tests) >= 3 and problem.solution
        assert len(problem.statement) < 200, problem.id
        assert ("Example input:" in problem.statement) == (problem.fn_name is None)


def test_every_reference_solution_passes_every_test():
    env = make("code")
    for problem in BUILTIN_PROBLEMS:
        assert env.reset(options={"problem": problem.id})[0] == problem.statement
        obs, reward, terminated, truncated, info = env.step(env.solve()[0])
        assert (reward, terminated, truncated, info["success"]) == (1.0, True, False, True), (problem.id, obs)
        n = len(problem.tests)
        assert obs == f"Passed {n}/{n} tests."


def test_partial_credit_and_a_single_attempt():
    env = make("code")
    env.reset(options={"problem": "palindrome_word"})  # tests: level, abca, a, abba
    obs, reward, terminated, truncated, info = env.step("print('YES')")
    assert (obs, reward, terminated, truncated, info) == (
        "Passed 3/4 tests.", 0.75, True, False, {"action_is_valid": True, "success": False}
    )
    with pytest.raises(RuntimeError, match="call reset"):
        env.step("print('YES')")


def test_function_problems_accept_solution_classes_and_ignore_main_blocks():
    env = make("code")
    env.reset(options={"problem": "is_anagram"})
    program = (
        "class Solution:\n"
        "    def is_anagram(self, a, b):\n"
        "        print('debug output is fine')\n"
        "        return sorted(a) == sorted(b)\n"
        "if __name__ == '__main__':\n"
        "    print(input())\n"
    )
    assert env.step(program)[1] == 1.0


def test_feedback_mode_rewards_add_up_to_the_final_attempt():
    env = make("code", feedback=True, max_tries=3)
    env.reset(options={"problem": "palindrome_word"})
    first = env.step("print('NO')")  # passes abca only
    assert first[1:4] == (0.25, False, False)
    assert first[0] == (
        "Passed 1/4 tests.\nFirst failing test:\nInput:\nlevel\nExpected:\nYES\nGot:\nNO\n"
        "Attempts left: 2. Answer with a corrected program."
    )
    second = env.step("w = input()\nprint('YES' if w == w[::-1] else 'NO')")
    assert second[1:4] == (0.75, True, False) and second[4]["success"]
    assert first[1] + second[1] == 1.0


def test_feedback_mode_truncates_after_max_tries_and_shows_errors():
    env = make("code", feedback=True, max_tries=2, limits={"wall_s": 1.0, "cpu_s": 1})
    env.reset(options={"problem": "sum_two"})
    assert env.step("not a program")[4]["action_is_valid"] is False  # not an attempt
    obs, reward, terminated, truncated, _ = env.step("print(undefined_name)")
    assert (reward, terminated, truncated) == (0.0, False, False)
    assert "Got:\nerror: NameError: name 'undefined_name' is not defined" in obs
    obs, reward, terminated, truncated, _ = env.step("while True:\n    pass")
    assert (reward, terminated, truncated) == (0.0, False, True)
    assert "Got:\ntime limit exceeded" in obs and "Attempts left" not in obs


def test_random_text_is_invalid_or_graded_never_raises():
    env = make("code")
    for seed, text in enumerate(["", "hello world", "```python\n```", "x = (", "pass", "import os\nos.fork()"]):
        obs, _ = env.reset(seed=seed)
        new_obs, reward, terminated, _, info = env.step(text)
        if not info["action_is_valid"]:
            assert (new_obs, reward, terminated) == (obs, 0.0, False)
        else:
            assert reward == 0.0 and terminated


def test_valid_actions_are_programs_that_solve_nothing():
    env = make("code")
    rewards = []
    for problem in BUILTIN_PROBLEMS:
        env.reset(options={"problem": problem.id})
        actions = env.valid_actions()
        assert len(actions) == 2 and all(parse_program(a) and a in env.instruction for a in actions)
        _, reward, _, _, info = env.step(actions[0])
        assert not info["success"]
        rewards.append(reward)
    assert 0 < sum(rewards) / len(rewards) < 0.1  # printing the input passes the odd test


def test_seeds_pick_problems_reproducibly():
    env = make("code")
    first = [env.reset(seed=s)[0] for s in range(40)]
    assert first == [env.reset(seed=s)[0] for s in range(40)]
    assert len(set(first)) > 15


def test_checker_passes_in_both_modes():
    check_env(make("code", feedback=True, max_tries=2), seeds=range(3))


@pytest.mark.parametrize(
    "cfg, match",
    [
        ({"max_tries": 0}, "max_tries=0"),
        ({"workers": 0}, "workers=0"),
        ({"max_tests": 0}, "max_tests=0"),
        ({"limits": {"cpu": 1}}, "unknown sandbox limit 'cpu'"),
        ({"problems": "/nonexistent/problems.jsonl"}, "does not exist"),
    ],
)
def test_bad_config_names_the_parameter(cfg, match):
    with pytest.raises(ConfigError, match=match):
        CodeEnv(**cfg)


def test_unknown_problem_id_suggests_close_ones():
    with pytest.raises(ConfigError, match="unknown problem id 'sum_twoo'.*Did you mean: sum_two"):
        make("code").reset(options={"problem": "sum_twoo"})


def test_preset_builds_the_env():
    preset = yaml.safe_load(PRESET.read_text())
    env = make(preset["env"]["name"], **preset["env"]["kwargs"])
    assert isinstance(env, CodeEnv) and preset["rollout"]["max_turns"] == env.max_actions


def test_docs_show_real_observations():
    docs = DOCS.read_text(encoding="utf-8")
    env = make("code")
    assert env.instruction in docs and f"```text\n{env.tool_instruction}\n```" in docs
    assert f"```text\n{env.reset(seed=0)[0]}\n```" in docs
    feedback = make("code", feedback=True)
    feedback.reset(options={"problem": "palindrome_word"})
    assert f"```text\n{feedback.step('print(input())')[0]}\n```" in docs


# ---- native tool calling: submit(program) ----

WRONG = "x = 1"  # compiles, prints nothing, defines no function: fails every built-in test


def test_the_submit_tool_is_a_json_schema_whose_calls_are_programs():
    jsonschema = pytest.importorskip("jsonschema")
    env = make("code")
    (tool,) = json.loads(json.dumps(env.tools))  # plain JSON, as chat templates serialise it
    assert tool["function"]["name"] == "submit"
    jsonschema.Draft202012Validator.check_schema(tool["function"]["parameters"])
    arguments = jsonschema.Draft202012Validator(tool["function"]["parameters"])
    assert arguments.is_valid({"program": "print(1)"})
    assert not arguments.is_valid({}) and not arguments.is_valid({"program": 3})
    assert env.tool_action("submit", {"program": "print(1)"}) == "print(1)"
    for name, bad in [("run", {"program": "print(1)"}), ("submit", {"program": 3}), ("submit", {}),
                      ("submit", {"program": "print(1)", "language": "python"})]:
        assert env.tool_action(name, bad) is None
    assert env.action_call("```python\nprint(1)\n```") == ("submit", {"program": "print(1)\n"})
    assert env.action_call("Sure, here it is.") is None
    assert load_config("code", ["rollout.tool_calls=true"]).rollout.tool_calls


@pytest.mark.parametrize("feedback", [False, True])
@pytest.mark.parametrize("problem", ["two_sum", "palindrome_word"])  # a function problem, a stdin problem
def test_a_submit_call_scores_as_the_same_program_answered_in_text_does(problem, feedback):
    """The rollout's two paths from a reply to a step: the tool call's program and the fenced answer's
    get the same observation, reward and end; a correct program earns 1, a wrong one 0."""
    env = make("code", feedback=feedback)
    env.reset(options={"problem": problem})
    (solution,) = env.solve()
    for program, reward in [(solution, 1.0), (WRONG, 0.0)]:
        called = parse_tool_turn("I define it.</think>" + render_tool_calls([ToolCall("submit", {"program": program})]),
                                 ResponseFormat(), 1, env.tool_action)
        answered = parse_response(f"I define it.</think><answer>```python\n{program}\n```</answer>", 1)
        assert called.valid and answered.valid
        steps = []
        for (action,) in (called.actions, answered.actions):
            env.reset(options={"problem": problem})
            steps.append(env.step(action))
        assert steps[0] == steps[1]
        assert steps[0][1] == reward and steps[0][4]["success"] == (reward == 1.0)
        assert steps[0][2] is (reward == 1.0 or not feedback)  # feedback mode keeps a failed episode going


def test_the_tool_calling_layout_renders_submit_and_masks_the_test_report():
    """Two attempts in feedback mode: the prompt is the template's rendering of the messages (tools in the
    system prompt, the report as a tool response), and only the two sampled replies are trained."""
    env = make("code", feedback=True)
    observation, _ = env.reset(options={"problem": "two_sum"})
    (solution,) = env.solve()
    replies = [f"Attempt {k}.</think>" + render_tool_calls([ToolCall("submit", {"program": p})])
               for k, p in enumerate([WRONG, solution], start=1)]
    tokenizer = build_tokenizer([env.tool_instruction, json.dumps(env.tools), observation, *replies], vocab_size=400,
                                chat_template=QWEN25_TOOLS)
    conv = conversation(tokenizer, env.tool_instruction, RolloutConfig(tool_calls=True, max_turns=3), list(env.tools))
    conv.add_observation(observation, env.max_actions)
    conv.add_response_text(replies[0])
    (action,) = parse_tool_turn(replies[0], ResponseFormat(), 1, env.tool_action).actions
    report, reward, terminated, _, _ = env.step(action)
    assert reward == 0.0 and not terminated and "First failing test" in report
    conv.add_observation("", env.max_actions - 1, tool_results=[report])
    messages = conv.messages()
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool"]
    expected = tokenizer.apply_chat_template(messages, tools=list(env.tools), tokenize=False,
                                             add_generation_prompt=True) + "<think>"
    assert tokenizer.decode(conv.prompt_ids()) == expected
    assert '"name": "submit"' in expected and f"<tool_response>\n{report}\n</tool_response>" in expected
    conv.add_response_text(replies[1])
    (action,) = parse_tool_turn(replies[1], ResponseFormat(), 1, env.tool_action).actions
    assert env.step(action)[1] == 1.0
    (ids, mask), = conv.samples()
    trained = [t for t, m in zip(ids, mask) if m]
    eos = [tokenizer.eos_token_id]
    assert trained == [t for r in replies for t in tokenizer.encode(r, add_special_tokens=False) + eos]
    assert "First failing test" not in tokenizer.decode(trained)  # the report is the environment's, masked
