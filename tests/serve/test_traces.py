"""Known-answer and property tests of what an agent episode trains as, and of the chat messages' normalisation."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ragen2.agent.tool_calls import ParsedToolCalls
from ragen2.serve.chat import RequestError, template_messages
from ragen2.serve.traces import Call, call_samples


def call(prompt: list[int], completion: list[int]) -> Call:
    return Call(prompt, completion, [0.0] * len(completion), "", "stop", ParsedToolCalls(""), "")


def test_calls_that_extend_the_history_join_and_the_others_start_anew():
    first = call([1, 2], [3, 4])
    extends = call([1, 2, 3, 4, 5], [6])  # the template kept the history: one sequence
    rewritten = call([1, 2, 9, 5, 6, 7], [8])  # an earlier completion re-rendered (a dropped <think>)
    assert call_samples([first, extends, rewritten]) == [
        ([1, 2, 3, 4, 5, 6], [0, 0, 1, 1, 0, 1]),
        ([1, 2, 9, 5, 6, 7, 8], [0, 0, 0, 0, 0, 0, 1]),
    ]


@given(st.lists(st.tuples(st.booleans(), st.lists(st.integers(0, 5), max_size=3),
                          st.lists(st.integers(0, 5), min_size=1, max_size=3)), min_size=1, max_size=5))
def test_every_completion_is_trained_once_right_after_its_prompt(steps):
    """Whatever the prompts, each call's completion is trained exactly once, preceded by exactly its prompt."""
    calls, history = [], [7]
    for extend, new, completion in steps:
        prompt = (history + new) if extend else ([7] + new)
        calls.append(call(prompt, completion))
        history = prompt + completion
    samples = call_samples(calls)
    assert sum(sum(mask) for _, mask in samples) == sum(len(c.completion_ids) for c in calls)
    for c in calls:
        p, n = len(c.prompt_ids), len(c.completion_ids)
        assert any(ids[:p] == c.prompt_ids and ids[p: p + n] == c.completion_ids and mask[p: p + n] == [1] * n
                   for ids, mask in samples)


def test_openai_messages_become_template_messages():
    messages = template_messages([
        {"role": "system", "content": [{"type": "text", "text": "Be "}, {"type": "text", "text": "brief."}]},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": '{"key": "a"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "7"},
    ])
    assert messages[0]["content"] == "Be brief." and messages[1]["content"] == ""
    assert messages[1]["tool_calls"][0]["function"] == {"name": "lookup", "arguments": {"key": "a"}}
    with pytest.raises(RequestError, match="arguments of lookup are not JSON"):
        template_messages([{"role": "assistant", "tool_calls": [{"function": {"name": "lookup", "arguments": "{"}}]}])
    with pytest.raises(RequestError, match=r"messages\[0\] must be an object with a string `role`"):
        template_messages([{"content": "hi"}])
