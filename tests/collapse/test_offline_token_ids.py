"""Rollout records with token ids (`write_rollout_records`): `ragen2 diagnose` scores the recorded ids when the
scoring tokenizer's vocabulary made them, and the text otherwise."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest

from ragen2.agent.tool_calls import parse_tool_calls
from ragen2.agent.types import Trajectory, Turn
from ragen2.collapse import score_matrix_naive
from ragen2.collapse.offline import diagnose
from ragen2.collapse.rollout_files import read_rollouts
from ragen2.evaluate import tokenizer_fingerprint, write_rollout_records
from ragen2.serve.traces import Call, Episode, episode_trajectory

pytestmark = pytest.mark.usefixtures("one_thread")

ROOMS = ["Room A: box right.", "Room B: box left.", "Room C: no box."]
PLANS = ["push right", "go left then up", "wait here"]


def spelled(tokenizer, text: str) -> list[int]:
    """`text` one character per token: it decodes to `text`, but tokenizing `text` merges characters."""
    return [i for ch in text for i in tokenizer(ch, add_special_tokens=False)["input_ids"]]


def trajectories(tokenizer) -> list[Trajectory]:
    """3 groups x 2 one-turn episodes whose reasoning was sampled spelled out, as a policy may sample it."""
    out = []
    for g, room in enumerate(ROOMS):
        for k in range(2):
            plan = PLANS[(g + k) % len(PLANS)]
            z = spelled(tokenizer, plan)
            tail = tokenizer("</think><answer>Up</answer>", add_special_tokens=False)["input_ids"]
            turn = Turn(prompt_ids=tokenizer(room + "<think>", add_special_tokens=False)["input_ids"],
                        response_ids=z + tail, response_text=plan + "</think><answer>Up</answer>", reasoning=plan,
                        reasoning_span=(0, len(z)), actions=["Up"], format_valid=True, actions_valid=True,
                        reward=1.0, observation=room, logprobs=[-0.5] * (len(z) + len(tail)))
            out.append(Trajectory("sokoban", seed=100 + g, group_id=g, turns=[turn]))
    return out


@pytest.fixture
def records(tmp_path, tiny_tokenizer) -> list[dict]:
    path = tmp_path / "train_step_1.jsonl"
    write_rollout_records(path, trajectories(tiny_tokenizer), tiny_tokenizer)
    return [json.loads(line) for line in path.read_text().splitlines()]


def rewrite(tmp_path, rows: list[dict], name: str = "r.jsonl"):
    path = tmp_path / name
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return read_rollouts(path)


def without_ids(rows: list[dict]) -> list[dict]:
    """The records as a text-only writer (before token ids) wrote them."""
    return [{k: r[k] for k in ("group", "prompt", "reasoning", "response", "reward", "episode", "turn")} for r in rows]


def test_diagnose_scores_the_recorded_ids_not_the_text(tmp_path, tiny_tokenizer, tiny_model, records):
    z = spelled(tiny_tokenizer, PLANS[0])
    assert tiny_tokenizer.decode(z) == PLANS[0] and tiny_tokenizer(PLANS[0])["input_ids"] != z  # re-tokenising differs
    result = diagnose(rewrite(tmp_path, records), tiny_model, tiny_tokenizer, scheme="pairs", micro_batch_size=4)
    assert (result.on_token_ids, result.notes) == (6, [])
    rows = [records[i] for i in result.selection.pairs]
    prompts = [r["prompt_ids"] for r in rows]
    reasonings = [r["response_ids"][slice(*r["reasoning_span"])] for r in rows]
    np.testing.assert_allclose(result.logp, score_matrix_naive(tiny_model, None, prompts, reasonings), atol=1e-4)
    assert result.lengths.tolist() == [len(spelled(tiny_tokenizer, r["reasoning"])) for r in rows]

    # Text that disagrees with the ids changes nothing: the matrix is computed from the ids.
    lies = [{**r, "prompt": "Room Z<think>", "reasoning": "something else"} for r in records]
    lied = diagnose(rewrite(tmp_path, lies), tiny_model, tiny_tokenizer, scheme="pairs", micro_batch_size=4)
    np.testing.assert_array_equal(lied.logp, result.logp)
    # The same file without ids is scored on the re-tokenised text, which gives other numbers.
    text = diagnose(rewrite(tmp_path, without_ids(records)), tiny_model, tiny_tokenizer, scheme="pairs",
                    micro_batch_size=4)
    assert text.on_token_ids == 0 and not np.allclose(text.logp, result.logp, atol=1e-2)


@pytest.mark.parametrize("case", ["added token", "no fingerprint"])
def test_ids_of_another_or_an_unknown_vocabulary_fall_back_to_the_text(case, tmp_path, tiny_tokenizer, tiny_model,
                                                                       records):
    scorer = tiny_tokenizer
    if case == "added token":  # a checkpoint whose tokenizer gained a token: its vocabulary is another one
        scorer = copy.deepcopy(tiny_tokenizer)
        scorer.add_tokens(["<extra>"])
    else:
        records = [{k: v for k, v in r.items() if k != "tokenizer"} for r in records]
    result = diagnose(rewrite(tmp_path, records), tiny_model, scorer, scheme="pairs", micro_batch_size=4)
    text = diagnose(rewrite(tmp_path, without_ids(records), "text.jsonl"), tiny_model, scorer, scheme="pairs",
                    micro_batch_size=4)
    assert result.on_token_ids == 0 and text.notes == []
    np.testing.assert_array_equal(result.logp, text.logp)
    assert result.notes == [f"6 of the 6 records scored carry token ids of another vocabulary than the scoring model's "
                            f"tokenizer (fingerprint {tokenizer_fingerprint(scorer)}), or name none: their text was "
                            "re-tokenised"]


def test_the_fingerprint_survives_saving_and_changes_with_the_vocabulary(tmp_path, tiny_tokenizer):
    from transformers import AutoTokenizer

    tiny_tokenizer.save_pretrained(tmp_path)
    assert tokenizer_fingerprint(AutoTokenizer.from_pretrained(tmp_path)) == tokenizer_fingerprint(tiny_tokenizer)
    grown = copy.deepcopy(tiny_tokenizer)
    grown.add_tokens(["<extra>"])
    assert tokenizer_fingerprint(grown) != tokenizer_fingerprint(tiny_tokenizer)


def test_the_reasoning_cap_cuts_the_recorded_ids(tmp_path, tiny_tokenizer, tiny_model, records):
    result = diagnose(rewrite(tmp_path, records), tiny_model, tiny_tokenizer, scheme="pairs", max_reasoning_tokens=9)
    spans = [records[i]["reasoning_span"] for i in result.selection.pairs]
    assert result.lengths.tolist() == [min(end - start, 9) for start, end in spans]
    assert result.truncated == sum(end - start > 9 for start, end in spans) > 0


def test_a_reasoning_without_tokens_of_its_own_is_scored_on_its_text(tmp_path, tiny_tokenizer, tiny_model, records):
    """A tokenizer may merge a reasoning of a few characters into `</think>`: the span is empty, the text is not."""
    merged = {**records[0], "reasoning": ".", "reasoning_span": [0, 0]}
    result = diagnose(rewrite(tmp_path, [merged, *records[1:]]), tiny_model, tiny_tokenizer, scheme="pairs")
    lengths = dict(zip(result.selection.pairs, result.lengths.tolist()))
    assert lengths[0] == len(tiny_tokenizer(".", add_special_tokens=False)["input_ids"]) > 0


def test_bad_token_ids_skip_the_line_with_the_reason(tmp_path, records):
    good = records[0]
    rows = [
        good,
        {**good, "reasoning_span": None},  # 2
        {**good, "prompt_ids": []},  # 3
        {**good, "response_ids": [1, "2"]},  # 4
        {**good, "reasoning_span": [0, 999]},  # 5
        {**good, "reasoning_span": [0.5, 2]},  # 6
        {**good, "tokenizer": 7},  # 7
        {**good, "prompt_ids": None, "response_ids": None, "reasoning_span": None},  # 8: a text-only record
    ]
    f = rewrite(tmp_path, rows)
    assert [r.line for r in f.records] == [1, 8] and f.records[1].tokens is None
    n = len(good["response_ids"])
    assert f.skipped == [
        (2, "has 'prompt_ids', 'response_ids' but not 'reasoning_span' (token ids come as a set)"),
        (3, "'prompt_ids' is empty"),
        (4, "'response_ids' must be a list of token ids (integers >= 0), got [1, '2']"),
        (5, f"'reasoning_span' must be [start, end] within the {n} response ids, got [0, 999]"),
        (6, f"'reasoning_span' must be [start, end] within the {n} response ids, got [0.5, 2]"),
        (7, "'tokenizer' must be a string or null, got 7"),
    ]
    tokens = f.records[0].tokens
    start, end = good["reasoning_span"]
    assert (tokens.prompt_ids, tokens.reasoning_ids, tokens.tokenizer) == (
        good["prompt_ids"], good["response_ids"][start:end], good["tokenizer"])


def test_an_agent_episodes_calls_are_written_with_their_ids_and_log_probs(tmp_path, tiny_tokenizer):
    """Each served call is a turn: its record holds the call's prompt and completion ids and log-probs."""
    episode = Episode(seed=5, group_id=0, sample_seed=None)
    chat = [{"role": "user", "content": "Which arm?"}]
    for completion in ("<think>go left</think>Left", "Done."):
        prompt = tiny_tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
        prompt_ids = tiny_tokenizer(prompt, add_special_tokens=False)["input_ids"]
        completion_ids = tiny_tokenizer(completion, add_special_tokens=False)["input_ids"]
        logprobs = [-1 / (k + 3) for k in range(len(completion_ids))]
        episode.record(Call(prompt_ids, completion_ids, logprobs, completion, "stop", parse_tool_calls(completion),
                            observation=chat[-1]["content"]))
        chat = chat + [{"role": "assistant", "content": completion}, {"role": "user", "content": "And now?"}]
    trajectory = episode_trajectory("agent", episode, 1.0, None, 1.0, tiny_tokenizer)
    path = tmp_path / "train_step_1.jsonl"
    write_rollout_records(path, [trajectory], tiny_tokenizer)
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["reasoning"] for r in records] == ["go left", "Done."]
    for r, call, turn in zip(records, episode.calls, trajectory.turns):
        assert (r["prompt_ids"], r["response_ids"], r["reasoning_span"], r["role"]) == (
            call.prompt_ids, call.completion_ids, list(turn.reasoning_span), None)
        assert r["logprobs"] == [round(x, 6) for x in call.logprobs] and len(r["logprobs"]) == len(call.completion_ids)
    assert [r.tokens.reasoning_ids for r in read_rollouts(path).records] == [
        call.completion_ids[slice(*turn.reasoning_span)] for call, turn in zip(episode.calls, trajectory.turns)]
