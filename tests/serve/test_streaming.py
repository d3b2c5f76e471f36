"""Streamed chat completions over loopback with the real `openai` client, and streamed calls of an episode recorded
as streamed (the tool policy served on loopback)."""

from __future__ import annotations

import asyncio
import json

import httpx
import openai
from openai.types.chat import ChatCompletionChunk

import api_agents
import lookup_agent
from ragen2.agent.types import GenerationOutput
from ragen2.serve.batcher import Sampling
from ragen2.serve.streaming import text_pieces
from ragen2.serve.traces import Episode


def conversations() -> list[list[dict]]:
    """lookup_agent's two calls: the first is answered with a tool call, the second in text."""
    first = lookup_agent.first_messages(0)
    call = {"id": "call_0", "type": "function", "function": {"name": "lookup", "arguments": '{"key": "a"}'}}
    return [first, first + [{"role": "assistant", "content": "", "tool_calls": [call]},
                            {"role": "tool", "tool_call_id": "call_0", "content": "7"}]]


def test_a_completion_is_cut_where_its_tokens_end(tool_tokenizer):
    """Known answer on a byte-level tokenizer: a piece per token, a character of several byte tokens in one piece
    (never half of it), the end-of-turn token in a last empty piece; a reply's text around tool calls whole."""
    tokenizer = tool_tokenizer
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    ids = tokenizer.encode("The value is 7. 東京", add_special_tokens=False) + [end]
    out = GenerationOutput(ids, tokenizer.decode(ids, skip_special_tokens=True), "stop")
    pieces = text_pieces(tokenizer, out, out.text)
    assert [p for p, _ in pieces] == ["The", " value", " is", " ", "7", ".", " ", "東", "京", ""]
    assert [n for _, n in pieces] == [1, 1, 1, 1, 1, 1, 1, 3, 3, 1] and sum(n for _, n in pieces) == len(ids)
    assert text_pieces(tokenizer, out, "The value") == [("The value", len(ids))]


def test_a_streamed_chat_completion_is_the_completion(served, client):
    """At the same seed the chunks reassemble to the plain reply: its content piece by piece, its tool calls, its
    finish reason, token ids and log-probs; with include_usage the last chunk has the usage and no choices, and
    the stream ends with `data: [DONE]`."""
    endpoint = served[0]
    for messages in conversations():
        ask = {"model": "policy", "messages": messages, "tools": lookup_agent.TOOLS, "seed": 5, "logprobs": True,
               "extra_body": {"return_token_ids": True}}
        plain = client.chat.completions.create(**ask)
        chunks = list(client.chat.completions.create(**ask, stream=True, stream_options={"include_usage": True}))
        for chunk in chunks:
            ChatCompletionChunk.model_validate(chunk.to_dict())
        *pieces, last = chunks
        assert last.choices == [] and last.usage == plain.usage and all(c.usage is None for c in pieces)
        assert pieces[0].choices[0].delta.role == "assistant"
        assert pieces[0].model_extra["prompt_token_ids"] == plain.model_extra["prompt_token_ids"]
        choices = [c.choices[0] for c in pieces]
        assert [c.finish_reason for c in choices] == [None] * (len(choices) - 1) + [plain.choices[0].finish_reason]
        content = "".join(c.delta.content or "" for c in choices)
        message = plain.choices[0].message
        assert content == (message.content or "")
        assert [(d.function.name, d.function.arguments) for c in choices for d in c.delta.tool_calls or []] == [
            (t.function.name, t.function.arguments) for t in message.tool_calls or []]
        streamed_ids = sum((c.model_extra.get("token_ids", []) for c in choices), [])
        assert streamed_ids == plain.choices[0].model_extra["token_ids"]
        logprobs = [(lp.token, lp.logprob) for c in choices if c.logprobs for lp in c.logprobs.content]
        assert logprobs == [(lp.token, lp.logprob) for lp in plain.choices[0].logprobs.content]
        # The client's own stream helper builds the same message.
        with client.chat.completions.stream(**ask) as stream:
            final = stream.get_final_completion().choices[0].message
        assert final.content == message.content
        assert [(t.function.name, t.function.arguments) for t in final.tool_calls or []] == [
            (t.function.name, t.function.arguments) for t in message.tool_calls or []]
    assert sum(bool(c.delta.content) for c in choices) > 1  # the text answer came in pieces
    raw = httpx.post(f"{endpoint.url}/v1/chat/completions", timeout=30, json={
        "model": "policy", "messages": conversations()[1], "stream": True})
    events = raw.text.split("\n\n")
    assert raw.status_code == 200 and raw.headers["content-type"].startswith("text/event-stream")
    assert events[-2:] == ["data: [DONE]", ""] and all(e.startswith("data: {") for e in events[:-2])


def test_streamed_calls_of_an_episode_are_recorded_as_streamed(served):
    """While training, a streamed call samples with the run's settings and records exactly the tokens streamed, on
    both routes."""
    endpoint, service, tokenizer = served
    episode = Episode(seed=0, group_id=0, sample_seed=7, max_calls=4)
    service.episodes["e0"] = episode
    service.limits.forced = Sampling(48, 1.0)
    client = openai.AsyncOpenAI(base_url=endpoint.episode_url("e0"), api_key="x", max_retries=0, timeout=60)

    async def play() -> list[tuple[list[int], list[int]]]:
        served_ids = []
        for messages in conversations():
            stream = await client.chat.completions.create(
                model="policy", messages=messages, tools=lookup_agent.TOOLS, temperature=0, stream=True,
                stream_options={"include_usage": True}, extra_body={"return_token_ids": True})
            _, prompt, ids = await api_agents.streamed_message(stream)
            served_ids.append((prompt, ids))
        stream = await client.responses.create(
            model="policy", instructions=api_agents.INSTRUCTIONS, input=api_agents.first_input(0),
            tools=api_agents.RESPONSES_TOOLS, temperature=0, stream=True, extra_body={"return_token_ids": True})
        final = [event async for event in stream][-1].response
        assert final.temperature == 1.0  # the run's, not the request's
        served_ids.append((final.model_extra["prompt_token_ids"], final.model_extra["token_ids"]))
        calls = [(item.name, json.loads(item.arguments)) for item in final.output if item.type == "function_call"]
        text = tokenizer.decode(final.model_extra["token_ids"], skip_special_tokens=True)
        recorded = episode.calls[-1]
        assert calls == [(c.name, c.arguments) for c in recorded.tools.calls] and text == recorded.text
        await client.close()
        return served_ids

    served_ids = asyncio.run(play())
    assert [(c.prompt_ids, c.completion_ids) for c in episode.calls] == served_ids
    assert all(len(c.logprobs) == len(c.completion_ids) for c in episode.calls)
