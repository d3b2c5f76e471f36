"""No request starves the others: over-long and malformed requests are refused at once with HTTP 400, while every
other client keeps being answered (the tool policy served on loopback, the real `openai` client)."""

from __future__ import annotations

import asyncio
import os
import threading
import time

import httpx
import openai
import pytest

import lookup_agent
from ragen2.serve.batcher import Sampling
from ragen2.serve.chat import prompt_text
from ragen2.serve.traces import Episode

CONTEXT = 4096  # the tool policy's max_position_embeddings
EXACT = r"maximum context length is 4096 tokens \(max_position_embeddings\), but the prompt has {} tokens"
HUGE = 600_000  # tokens: the prompt that ran for minutes and took gigabytes before it was refused
# Fields over a good request, and what the 400 says.
MALFORMED = [
    ({"messages": [{"role": "critic", "content": "hi"}]}, r"messages\[0\].role='critic' is not a chat role"),
    ({"messages": "hi"}, "`messages` must be a non-empty list"),
    ({"messages": [{"role": "user", "content": 5}]}, r"messages\[0\].content must be a string"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]}, r"messages\[0\].content must be"),
    ({"messages": [{"role": "assistant", "tool_calls": {"id": "call_0"}}]}, r"messages\[0\].tool_calls must be a list"),
    ({"tools": "lookup"}, "`tools` must be a list of function tools"),
    ({"tools": [{"type": "function", "function": {"parameters": {}}}]}, r"tools\[0\] must be"),
    ({"tools": [{"type": "function", "function": {"name": "lookup", "parameters": "key"}}]}, r"tools\[0\] must be"),
    ({"max_tokens": "many"}, "max_tokens='many' is not allowed: use an integer >= 1"),
    ({"max_tokens": 0}, "max_tokens=0 is not allowed"),
    ({"temperature": "hot"}, "temperature='hot' is not allowed: use a number >= 0"),
    ({"top_p": 0}, r"top_p=0 is not allowed: use a number in \(0, 1\]"),
    ({"seed": 2**70}, "seed=1180591620717411303424 is not allowed: use a 64-bit integer"),
    ({"seed": 1.5}, "seed=1.5 is not allowed"),
    ({"n": 2}, "n=2 is not allowed: one completion per request"),
    ({"logprobs": "yes"}, "logprobs='yes' is not allowed: use true or false"),
]


def user_messages(tokenizer, tokens: int) -> list[dict[str, str]]:
    """One user message whose prompt is about `tokens` tokens long (the test tokenizer reads "a " as one token)."""
    frame = prompt_text(tokenizer, [{"role": "user", "content": ""}], None)
    return [{"role": "user", "content": "a " * (tokens - len(tokenizer.encode(frame, add_special_tokens=False)))}]


def prompt_length(tokenizer, messages: list[dict[str, str]]) -> int:
    return len(tokenizer.encode(prompt_text(tokenizer, messages, None), add_special_tokens=False))


def test_malformed_requests_get_a_400_naming_the_field(served):
    endpoint, service, _ = served
    client = openai.OpenAI(base_url=f"{endpoint.url}/v1", api_key="x", max_retries=0, timeout=10)
    for fields, says in MALFORMED:
        with pytest.raises(openai.BadRequestError, match=says):
            client.chat.completions.create(model="policy", messages=lookup_agent.first_messages(0), extra_body=fields)
    for body, says in [(b"{", "not JSON"), (b"[]", "must be a JSON object")]:
        reply = httpx.post(f"{endpoint.url}/v1/chat/completions", content=body, timeout=10)
        assert reply.status_code == 400 and says in reply.json()["error"]["message"]
    assert service.batcher.batch_sizes == []  # none of them reached the model


def test_an_over_long_prompt_is_refused_at_once_while_another_client_is_served(served):
    endpoint, _, tokenizer = served
    answered, failed, stop = [], [], threading.Event()

    def other_client() -> None:
        client = openai.OpenAI(base_url=f"{endpoint.url}/v1", api_key="x", max_retries=0, timeout=30)
        while not stop.is_set():
            try:
                client.chat.completions.create(model="policy", messages=lookup_agent.first_messages(0),
                                               tools=lookup_agent.TOOLS)
            except Exception as e:
                failed.append(e)
                return
            answered.append(time.monotonic())

    thread = threading.Thread(target=other_client)
    thread.start()
    client = openai.OpenAI(base_url=f"{endpoint.url}/v1", api_key="x", max_retries=0, timeout=30)
    try:
        while not answered and not failed:
            time.sleep(0.01)
        full = user_messages(tokenizer, CONTEXT)  # no room left for a completion
        for messages, says in [(full, EXACT.format(prompt_length(tokenizer, full))),
                               (user_messages(tokenizer, HUGE), EXACT.format(r"at least \d+"))]:
            start = time.monotonic()
            with pytest.raises(openai.BadRequestError, match=says):
                client.chat.completions.create(model="policy", messages=messages)
            assert time.monotonic() - start < 1.0
        served_before = len(answered)
        deadline = time.monotonic() + 30
        while len(answered) < served_before + 2 and not failed and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        stop.set()
        thread.join()
    assert not failed and len(answered) >= served_before + 2


def test_max_tokens_is_clamped_to_the_room_the_prompt_leaves(served):
    """A huge max_tokens is cut to the endpoint's cap, and to what the context leaves after the prompt: a
    conversation near the limit still gets an answer, ending "length"."""
    endpoint, _, tokenizer = served
    client = openai.OpenAI(base_url=f"{endpoint.url}/v1", api_key="x", max_retries=0, timeout=30)
    reply = client.chat.completions.create(model="policy", messages=lookup_agent.first_messages(0),
                                           tools=lookup_agent.TOOLS, max_tokens=10**9, seed=0)
    assert reply.usage.completion_tokens <= 48  # the endpoint's cap (`ragen2 serve --max-tokens`)
    messages = lookup_agent.first_messages(0)
    frame = prompt_length(tokenizer, messages)
    messages[0]["content"] += " a" * (CONTEXT - 3 - frame)  # 3 tokens of room
    replies = [client.chat.completions.create(model="policy", messages=messages, max_tokens=48, seed=seed)
               for seed in range(3)]
    assert {r.usage.prompt_tokens for r in replies} == {CONTEXT - 3}
    assert max(r.usage.completion_tokens for r in replies) == 3
    assert "length" in {r.choices[0].finish_reason for r in replies}


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


# Measured on a 2-core CPU running other jobs (load average 6), five runs: the slowest of the 128 answers took
# 2.0-2.3 s, the slowest refusal 0.2 s, and the process (server and clients) grew by 34-57 MB; without the
# refusal of a prompt before it is tokenized it grew by 350 MB. The bounds leave 3.5x for a slower, busier machine.
ANSWER_BOUND_S = 8.0
RSS_BOUND_MB = 200


def test_64_concurrent_episodes_with_bad_requests_among_them(served):
    """64 training episodes at once, every fourth sending an over-long or malformed request between its two calls:
    every good call is answered within ANSWER_BOUND_S and recorded exactly as served, every bad one is a 400, and
    the server's memory grows by less than RSS_BOUND_MB."""
    endpoint, service, tokenizer = served
    episodes = {f"e{i}": Episode(seed=i, group_id=i // 4, sample_seed=1000 + i, max_calls=2) for i in range(64)}
    service.episodes.update(episodes)
    service.limits.forced = Sampling(48, 1.0)
    live = [len(episodes)]
    service.batcher.expected = lambda: live[0]  # as in training: a batch goes when every live episode waits
    over = user_messages(tokenizer, CONTEXT + 100)
    bad = [({"messages": over}, EXACT.format(prompt_length(tokenizer, over))),
           ({"messages": user_messages(tokenizer, HUGE)}, EXACT.format(r"at least \d+")), *MALFORMED]
    answer_s, refusal_s, served_calls = [], [], {}

    async def episode(i: int, key: str) -> None:
        client = openai.AsyncOpenAI(base_url=endpoint.episode_url(key), api_key="x", max_retries=0, timeout=60)
        messages, served_calls[key] = lookup_agent.first_messages(i), []
        try:
            for turn in range(2):
                if turn == 1 and i % 4 == 0:
                    fields, says = bad[(i // 4) % len(bad)]
                    start = time.monotonic()
                    with pytest.raises(openai.BadRequestError, match=says):
                        await client.chat.completions.create(model="policy", messages=messages, extra_body=fields)
                    refusal_s.append(time.monotonic() - start)
                start = time.monotonic()
                reply = await client.chat.completions.create(
                    model="policy", messages=messages, tools=lookup_agent.TOOLS, max_tokens=10**9 if i % 2 else 16,
                    extra_body={"return_token_ids": True})
                answer_s.append(time.monotonic() - start)
                choice = reply.choices[0]
                served_calls[key].append((reply.model_extra["prompt_token_ids"], choice.model_extra["token_ids"]))
                messages = messages + [choice.message.model_dump(exclude_none=True),
                                       {"role": "user", "content": "And the value of b?"}]
        finally:
            live[0] -= 1
            service.batcher.wake()
            await client.close()

    async def all_episodes() -> None:
        await asyncio.gather(*(episode(i, key) for i, key in enumerate(episodes)))

    before, peak, done = rss_mb(), [0.0], threading.Event()

    def watch_memory() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], rss_mb())
            time.sleep(0.02)

    watcher = threading.Thread(target=watch_memory)
    watcher.start()
    start = time.monotonic()
    try:
        asyncio.run(all_episodes())
    finally:
        done.set()
        watcher.join()
    print(f"64 episodes in {time.monotonic() - start:.1f} s: {len(answer_s)} answers, slowest {max(answer_s):.2f} s; "
          f"{len(refusal_s)} refusals, slowest {max(refusal_s):.3f} s; RSS +{peak[0] - before:.0f} MB")
    assert len(answer_s) == 128 and max(answer_s) < ANSWER_BOUND_S
    assert len(refusal_s) == 16 and max(refusal_s) < ANSWER_BOUND_S
    assert peak[0] - before < RSS_BOUND_MB
    assert not service.backend_errors
    for key, recorded in episodes.items():  # every good call recorded as served, no refused one
        assert [(c.prompt_ids, c.completion_ids) for c in recorded.calls] == served_calls[key]


def test_rollout_max_model_len_caps_a_training_prompt(served):
    """While training, `rollout.max_model_len` holds the prompt alone (as it does in ragen2's own rollouts)."""
    endpoint, service, tokenizer = served
    service.limits.max_prompt_tokens = 200
    client = openai.OpenAI(base_url=f"{endpoint.url}/v1", api_key="x", max_retries=0, timeout=30)
    messages = user_messages(tokenizer, 201)
    with pytest.raises(openai.BadRequestError, match=f"the prompt has {prompt_length(tokenizer, messages)} tokens, "
                       "over rollout.max_model_len=200"):
        client.chat.completions.create(model="policy", messages=messages)
    reply = client.chat.completions.create(model="policy", messages=user_messages(tokenizer, 190), max_tokens=48)
    assert reply.usage.prompt_tokens <= 200
