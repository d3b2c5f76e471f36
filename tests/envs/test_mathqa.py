"""Math: answer checking, MetaMathQA/GSM8K file loading with precise errors, the retry reward 1/2^r."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ragen2.envs import make
from ragen2.envs.check import check_env
from ragen2.envs.data import DATA_DIR
from ragen2.envs.mathqa import MathEnv, Problem, answers_match, load_problems
from ragen2.errors import ConfigError

DOCS = Path(__file__).resolve().parents[2] / "docs" / "environments.md"
METAMATH = DATA_DIR / "math_metamathqa_sample.jsonl"
GSM8K = DATA_DIR / "math_gsm8k_sample.jsonl"


@pytest.mark.parametrize(
    "gold, answer",
    [
        ("39", "39"), ("39", " 39. "), ("39", "$39$"), ("39", "\\boxed{39}"), ("2,600", "2600"), ("20", "20.0"),
        ("-3/4", "-0.75"), ("\\frac{7}{8}", "7/8"), ("\\frac{7}{8}", "0.875"), ("3\\sqrt{2}", "\\sqrt{18}"),
        ("5", "x = 5"),
    ],
)
def test_equal_answers_match(gold, answer):
    assert answers_match(gold, answer)


@pytest.mark.parametrize(
    "gold, answer",
    [("39", "40"), ("39", "39 or 40"), ("-3/4", "3/4"), ("\\frac{7}{8}", "7/9"), ("3\\sqrt{2}", "3"), ("39", "forty")],
)
def test_different_answers_do_not_match(gold, answer):
    assert not answers_match(gold, answer)


def test_sample_files_load_in_both_formats():
    metamath, gsm8k = load_problems(METAMATH), load_problems(GSM8K)
    assert len(metamath) == len(gsm8k) == 5
    assert metamath[0] == Problem(
        "A baker fills 7 trays with 12 rolls each and sells 45 rolls. How many rolls are left?", "39"
    )
    assert [p.answer for p in metamath] == ["39", "\\frac{7}{8}", "5", "3\\sqrt{2}", "45"]
    assert [p.answer for p in gsm8k] == ["54", "20", "2,600", "70", "7"]


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n", encoding="utf-8")
    return path


def test_json_list_and_plain_question_answer_pairs(tmp_path):
    path = tmp_path / "plain.json"
    path.write_text(json.dumps([{"question": "What is 6 * 7?", "answer": "42"}]), encoding="utf-8")
    assert load_problems(path) == (Problem("What is 6 * 7?", "42"),)


def test_parquet_files_load(tmp_path):
    pyarrow = pytest.importorskip("pyarrow")
    import pyarrow.parquet

    path = tmp_path / "gsm8k.parquet"
    pyarrow.parquet.write_table(pyarrow.Table.from_pylist([{"question": "1 + 1?", "answer": "so\n#### 2"}]), path)
    assert load_problems(path) == (Problem("1 + 1?", "2"),)


@pytest.mark.parametrize(
    "name, content, message",
    [
        ("a.jsonl", '{"query": "q1", "response": "The answer is: 1"}\n{"query": "q2"}\n',
         r"a.jsonl, line 2: missing field 'response' \(a MetaMathQA record needs 'query', 'response'\)"),
        ("b.jsonl", '{"question": "q", "answer": "Long\\nsolution without marker"}\n',
         r"b.jsonl, line 1: the GSM8K solution has no final answer; it must end with '#### X'"),
        ("c.jsonl", '{"query": "q", "response": "no marker"}\n', r"c.jsonl, line 1: .*'The answer is: X'"),
        ("d.jsonl", '{"question": "q", "answer": "1"}\n\n{not json\n', r"d.jsonl, line 3: not valid JSON"),
        ("e.json", '{"question": "q"}', r"e.json: a .json file must hold a list of objects"),
        ("f.json", '[{"question": "q", "answer": 4}]', r"f.json, item 1: empty or non-string field 'answer'"),
        ("g.csv", "question,answer\n", r"g.csv: unsupported file type '.csv'"),
        ("h.jsonl", "\n", r"h.jsonl holds no records"),
    ],
)
def test_malformed_files_name_file_record_and_field(tmp_path, name, content, message):
    path = tmp_path / name
    path.write_text(content, encoding="utf-8")
    with pytest.raises(ConfigError, match=message):
        MathEnv(path=str(path))


def test_missing_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="is not a file"):
        MathEnv(path=str(tmp_path / "nope.jsonl"))


def test_retries_halve_the_reward_and_running_out_terminates():
    env = make("math", path=str(GSM8K), max_tries=3)
    for wrong_first, reward in [(0, 1.0), (1, 0.5), (2, 0.25)]:
        obs, _ = env.reset(seed=0)
        question, gold = env.question, env.answer
        for _ in range(wrong_first):
            assert env.step("-1") == (f"{question}\nIncorrect, try again.", 0.0, False, False,
                                      {"action_is_valid": True, "success": False})
        assert env.step(gold) == ("Correct.", reward, True, False, {"action_is_valid": True, "success": True})
    env.reset(seed=0)
    env.step("-1")
    env.step("-2")
    assert env.step("-3") == (f"Incorrect. The answer is {gold}.", 0.0, True, False,
                              {"action_is_valid": True, "success": False})
    with pytest.raises(RuntimeError, match="call reset"):
        env.step(gold)


@pytest.mark.parametrize("action", ["", "   ", "4\n2", "\x00", "1" * 101])
def test_invalid_answers_use_no_try(action):
    env = make("math", max_tries=1)
    obs, _ = env.reset(seed=0)
    assert env.step(action) == (obs, 0.0, False, False, {"action_is_valid": False, "success": False})
    assert env.step(env.answer)[1] == 1.0


def test_long_gold_answers_stay_answerable(tmp_path):
    gold = "\\begin{pmatrix} " + " & ".join(str(i) for i in range(40)) + " \\end{pmatrix}"
    path = write_jsonl(tmp_path / "long.jsonl", [{"query": "Write the row.", "response": f"The answer is:\n{gold}"}])
    env = make("math", path=str(path))
    env.reset(seed=0)
    assert len(env.answer) > 100 and "\n" not in env.answer
    assert env.step(env.solve()[0])[4] == {"action_is_valid": True, "success": True}


def test_reasoning_gym_questions_follow_the_config_and_replay_per_seed():
    env = make("math", dataset_kwargs={"min_terms": 2, "max_terms": 2, "max_digits": 1})
    questions = set()
    for seed in range(30):
        obs, _ = env.reset(seed=seed)
        assert obs.startswith("Calculate ") or "=" in obs
        assert sum(ch.isdigit() for ch in obs) <= 2
        questions.add(obs)
        assert env.step(env.solve()[0])[4]["success"]
    assert len(questions) >= 15
    assert make("math").reset(seed=5) == make("math").reset(seed=5)


def test_file_questions_are_drawn_by_seed():
    env = make("math", path=str(METAMATH))
    seen = {env.reset(seed=seed)[0] for seed in range(40)}
    assert seen == {p.question for p in load_problems(METAMATH)}


@pytest.mark.parametrize(
    "cfg, message",
    [
        ({"dataset": "basic_arithmetc"}, "'basic_arithmetc' is not a reasoning-gym dataset.*Did you mean: basic_ari"),
        ({"dataset_kwargs": {"min_term": 2}}, r"\{'min_term': 2\} rejected by reasoning-gym's 'basic_arithmetic'"),
        ({"dataset_kwargs": {"min_terms": 0}}, "min_terms must be positive"),
        ({"path": str(GSM8K), "dataset_kwargs": {"min_terms": 2}}, "drop one"),
        ({"max_tries": 0}, "max_tries=0 is not allowed: use an integer >= 1"),
    ],
)
def test_bad_config_names_the_parameter(cfg, message):
    with pytest.raises(ConfigError, match=message):
        MathEnv(**cfg)


@pytest.mark.parametrize(
    "cfg", [{"path": str(METAMATH)}, {"path": str(GSM8K), "max_tries": 1}, {"dataset": "gsm_symbolic"}]
)
def test_check_env_on_other_sources(cfg):
    check_env(make("math", **cfg), seeds=range(3))


def test_step_before_reset_raises():
    with pytest.raises(RuntimeError, match="call reset"):
        MathEnv().step("1")


def test_docs_show_a_real_episode():
    docs = DOCS.read_text(encoding="utf-8")
    assert f"```text\n{make('math').reset(seed=0)[0]}\n```" in docs
    env = make("math", path=str(GSM8K))
    assert env.instruction in docs
    obs, _ = env.reset(seed=0)
    assert f"```text\n{obs}\n```" in docs
    for action in ["72", env.solve()[0]]:
        obs, reward, *_ = env.step(action)
        assert f"`step({action!r})` gives reward {reward}:\n\n```text\n{obs}\n```" in docs
