"""SearchQA: SQuAD F1, the built-in corpus and questions, BM25 retrieval, actions, loaders for user data."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from env_checks import check_docs_episode
from ragen2.envs import make
from ragen2.envs.check import check_env
from ragen2.envs.data import read_records
from ragen2.envs.searchqa import (
    BUILTIN_CORPUS,
    BUILTIN_QUESTIONS,
    SearchQAEnv,
    f1_score,
    normalize_answer,
)
from ragen2.errors import ConfigError

NOTHING = {"action_is_valid": False, "success": False, "exact_match": False, "found_gold": False}


@pytest.mark.parametrize(
    "prediction, gold, f1",
    [
        ("The Grey Heron", "the Grey Heron", 1.0),
        ("Grey Heron ship", "the Grey Heron", 0.8),  # precision 2/3, recall 1
        ("heron", "the Grey Heron", 2 / 3),  # precision 1, recall 1/2
        ("2140 metres", "2,140 metres", 1.0),
        ("a", "the", 0.0),  # both normalise to nothing
        ("Brisk!", "brisk", 1.0),
        ("Velt", "Port Odrin", 0.0),
    ],
)
def test_squad_f1(prediction, gold, f1):
    assert f1_score(prediction, gold) == pytest.approx(f1)


def test_squad_normalisation():
    assert normalize_answer("  The Salt-Hours, an Epic!  ") == "salthours epic"


def builtin():
    docs = {r["id"]: r for _, r in read_records(BUILTIN_CORPUS)}
    questions = [r for _, r in read_records(BUILTIN_QUESTIONS)]
    return docs, questions


def test_builtin_data_is_consistent():
    docs, questions = builtin()
    assert len(docs) == 60 and len(questions) == 50
    assert sum(len(q["gold_ids"]) == 2 for q in questions) == 18
    assert len({q["question"] for q in questions}) == 50
    for q in questions:
        # the answer is written in the last document a reader needs
        assert normalize_answer(q["answer"]) in normalize_answer(docs[q["gold_ids"][-1]]["text"]), q


def test_the_oracle_finds_every_gold_document_and_answers_exactly():
    env = make("searchqa")
    solved = set()
    for seed in range(400):
        env.reset(seed=seed)
        question = env.question
        *searches, finish = env.solve()
        for action, gold_id in zip(searches, question.gold_ids, strict=True):
            obs, reward, terminated, truncated, info = env.step(action)
            assert info["found_gold"] and (reward, terminated, truncated) == (0.0, False, False), (action, obs)
            title = next(d.title for d in env.index.docs if d.id == gold_id)
            assert f"] {title}: " in obs
        obs, reward, terminated, truncated, info = env.step(finish)
        assert (reward, terminated, truncated) == (1.0, True, False)
        assert info == {"action_is_valid": True, "success": True, "exact_match": True, "found_gold": False}
        solved.add(question.question)
    assert len(solved) == 50  # 400 seeds reach every question


def test_searching_the_question_itself_finds_a_gold_document():
    env = make("searchqa")
    top3 = [any(d.id in q.gold_ids for d in env.index.search(q.question, 3)) for q in env.questions]
    top1 = [env.index.search(q.question, 1)[0].id in q.gold_ids for q in env.questions]
    assert (sum(top3), sum(top1)) == (50, 45)


def test_observations_show_question_and_truncated_results():
    env = make("searchqa", top_k=2, snippet_chars=40)
    obs, _ = env.reset(seed=0)
    assert obs == f"Question: {env.question.question}"
    obs, *_ = env.step("search[Mount Tarrow]")
    assert obs == (
        f"Question: {env.question.question}\n"
        'Results for "Mount Tarrow":\n'
        "[1] Mount Tarrow: Mount Tarrow is a dormant volcano on ...\n"  # cut at a word boundary
        "[2] Tarrow Ibex: The Tarrow ibex is a wild goat found ..."
    )
    obs, *_ = env.step("search[zeppelin]")
    assert obs.endswith('\nNo results for "zeppelin".')


@pytest.mark.parametrize("action", ["search[ Lake Senna ]", "SEARCH [Lake Senna]", "  Search[Lake Senna]  "])
def test_search_syntax_variants_are_valid(action):
    env = make("searchqa")
    env.reset(seed=0)
    assert env.step(action)[4]["action_is_valid"]


@pytest.mark.parametrize(
    "action",
    [
        "", "search[]", "search[  ]", "finish[]", "search Lake Senna", "lookup[Lake Senna]", "search[Lake\nSenna]",
        "search[Lake Senna", "finish[x] finish[y]", "search[[x]]", "<answer>finish[Brisk]</answer>",
        "search[" + "x" * 201 + "]",
    ],
)
def test_other_text_is_invalid_and_changes_nothing(action):
    env = make("searchqa")
    obs, _ = env.reset(seed=0)
    assert env.step(action) == (obs, 0.0, False, False, NOTHING)


def test_partial_answers_earn_f1_and_success_from_0_3():
    env = make("searchqa")
    env.reset(seed=0)
    gold = env.question.answer  # "Hob Tennant"
    obs, reward, terminated, _, info = env.step("finish[Tennant the keeper]")
    assert reward == pytest.approx(f1_score("Tennant the keeper", gold)) == pytest.approx(0.5)
    assert terminated and info["success"] and not info["exact_match"]
    assert obs.endswith(f'\nYou answered "Tennant the keeper"; the answer is "{gold}" (F1 0.50).')
    env.reset(seed=0)
    _, reward, _, _, info = env.step("finish[Tennant, or maybe someone else]")
    assert reward == pytest.approx(2 / 7) and not info["success"]  # precision 1/5, recall 1/2


def test_truncated_after_max_actions_searches_and_solver_fits_the_budget_left():
    env = make("searchqa", max_actions=3)
    env.reset(seed=0)
    assert len(env.question.gold_ids) == 2
    assert env.step("search[Lake Senna]")[2:4] == (False, False)
    assert env.solve() == ["search[Cape Dunmore]", "finish[Hob Tennant]"]
    assert env.step("search[Lake Senna]")[2:4] == (False, False)
    assert env.solve() == ["finish[Hob Tennant]"]
    assert env.step("search[Lake Senna]")[2:4] == (False, True)
    with pytest.raises(RuntimeError, match="call reset"):
        env.step("finish[Hob Tennant]")


def test_same_seed_same_question():
    assert make("searchqa").reset(seed=11) == make("searchqa").reset(seed=11)
    assert len({make("searchqa").reset(seed=s)[0] for s in range(60)}) > 30


def write_jsonl(path: Path, records: list[dict]) -> str:
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n", encoding="utf-8")
    return str(path)


def test_user_corpus_and_questions(tmp_path):
    corpus = write_jsonl(tmp_path / "corpus.jsonl", [
        {"id": 1, "title": "Blue Fox", "text": "The blue fox lives in the north and eats berries."},
        {"id": 2, "title": "Red Owl", "text": "The red owl hunts at night over the marsh."},
    ])
    questions = write_jsonl(tmp_path / "questions.jsonl", [
        {"question": "What does the blue fox eat?", "answer": "berries", "gold_ids": ["1"]},
        {"question": "When does the red owl hunt?", "answer": "at night", "supporting_facts": [["Red Owl", 0]]},
    ])
    env = make("searchqa", corpus_path=corpus, questions_path=questions)
    assert [q.gold_ids for q in env.questions] == [("1",), ("2",)]
    check_env(env, seeds=range(4))
    for seed in range(4):
        env.reset(seed=seed)
        for action in env.solve():
            *_, info = env.step(action)
        assert info["exact_match"]


def test_hotpotqa_file_brings_its_own_corpus(tmp_path):
    path = tmp_path / "hotpot_dev.json"
    path.write_text(json.dumps([
        {
            "_id": "x1",
            "question": "Which river flows past the town where Ada Finch was born?",
            "answer": "the Wend",
            "supporting_facts": [["Ada Finch", 0], ["Kirrow", 1]],
            "context": [
                ["Ada Finch", ["Ada Finch is a chemist.", " She was born in Kirrow."]],
                ["Kirrow", ["Kirrow is a market town.", " The Wend flows past it."]],
                ["Loam Hill", ["Loam Hill is a low hill."]],
            ],
        }
    ]), encoding="utf-8")
    env = make("searchqa", questions_path=str(path))
    assert [d.title for d in env.index.docs] == ["Ada Finch", "Kirrow", "Loam Hill"]
    assert env.index.docs[0].text == "Ada Finch is a chemist. She was born in Kirrow."
    env.reset(seed=0)
    assert env.solve() == ["search[Ada Finch]", "search[Kirrow]", "finish[the Wend]"]
    for action in env.solve():
        _, reward, *_ = env.step(action)
    assert reward == 1.0


def test_questions_without_gold_documents_search_the_question(tmp_path):
    questions = write_jsonl(tmp_path / "q.jsonl", [{"question": "Where is Harl [town]?", "answer": "Ost [island]"}])
    env = make("searchqa", questions_path=questions)
    env.reset(seed=0)
    assert env.solve() == ["search[Where is Harl (town)?]", "finish[Ost (island)]"]  # brackets would be invalid
    for action in env.solve():
        *_, info = env.step(action)
        assert info["action_is_valid"]
    assert info["exact_match"]


@pytest.mark.parametrize(
    "files, message",
    [
        ({"questions": [{"question": "q"}]}, r"q.jsonl, line 1: missing field 'answer'"),
        ({"questions": [{"question": "q", "answer": "a", "gold_ids": ["nope"]}]},
         r"q.jsonl, line 1: gold documents \['nope'\] are not in the corpus"),
        ({"questions": [{"question": "q", "answer": "a", "gold_ids": "kesh"}]}, "'gold_ids' must be a list"),
        ({"questions": [{"question": "q", "answer": "a", "context": [["only a title"]]}]},
         r"line 1: each 'context' entry must be \[title, \[sentence, ...\]\]"),
        ({"corpus": [{"id": "a", "title": "A"}], "questions": [{"question": "q", "answer": "a"}]},
         r"c.jsonl, line 1: missing field 'text'"),
        ({"corpus": [{"id": "a", "title": "A", "text": "x"}, {"id": "a", "title": "B", "text": "y"}],
          "questions": [{"question": "q", "answer": "a"}]}, r"c.jsonl, line 2: duplicate document id 'a'"),
    ],
)
def test_malformed_user_files_name_file_record_and_field(tmp_path, files, message):
    paths = {kind: write_jsonl(tmp_path / f"{kind[0]}.jsonl", records) for kind, records in files.items()}
    with pytest.raises(ConfigError, match=message):
        SearchQAEnv(corpus_path=paths.get("corpus"), questions_path=paths["questions"])


@pytest.mark.parametrize(
    "cfg, message",
    [
        ({"top_k": 0}, "top_k=0 is not allowed: use an integer >= 1"),
        ({"snippet_chars": 5}, "snippet_chars=5 is not allowed: use an integer >= 20"),
        ({"max_actions": 0}, "max_actions=0 is not allowed"),
        ({"corpus_path": str(BUILTIN_CORPUS)}, "needs questions_path"),
        ({"questions_path": "missing.jsonl"}, "'missing.jsonl' is not a file"),
    ],
)
def test_bad_config_names_the_parameter(cfg, message):
    with pytest.raises(ConfigError, match=message):
        SearchQAEnv(**cfg)


def test_step_before_reset_raises():
    with pytest.raises(RuntimeError, match="call reset"):
        SearchQAEnv().step("search[Kesh]")


def test_docs_show_a_real_episode():
    check_docs_episode(make("searchqa"), seed=2)
