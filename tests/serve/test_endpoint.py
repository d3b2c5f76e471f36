"""The OpenAI-compatible endpoint over loopback with the real `openai` client: tools, token ids, batching."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading

import openai
import pytest

import lookup_agent
from ragen2.serve.batcher import Sampling
from ragen2.serve.chat import prompt_text
from ragen2.serve.traces import Episode


def test_tool_call_round_trip(served):
    endpoint, service, tokenizer = served
    client = openai.OpenAI(base_url=f"{endpoint.url}/v1", api_key="x", max_retries=0)
    messages = lookup_agent.first_messages(0)
    reply = client.chat.completions.create(model="policy", messages=messages, tools=lookup_agent.TOOLS, seed=1,
                                           temperature=0, logprobs=True, extra_body={"return_token_ids": True})
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert [(c.function.name, c.function.arguments) for c in choice.message.tool_calls] == [("lookup", '{"key": "a"}')]
    # The prompt is the policy's template with the tools rendered; the ids are what was generated from.
    rendered = prompt_text(tokenizer, messages, lookup_agent.TOOLS)
    assert reply.model_extra["prompt_token_ids"] == tokenizer.encode(rendered, add_special_tokens=False)
    assert '"name": "lookup"' in tokenizer.decode(reply.model_extra["prompt_token_ids"])
    ids = choice.model_extra["token_ids"]
    assert tokenizer.decode(ids, skip_special_tokens=True).startswith("<tool_call>")
    assert len(choice.logprobs.content) == len(ids) == reply.usage.completion_tokens
    # The assistant message and its tool result go back in the next request, rendered by the template.
    messages.append(choice.message.model_dump(exclude_none=True))
    messages.append({"role": "tool", "tool_call_id": choice.message.tool_calls[0].id, "content": "7"})
    second = client.chat.completions.create(model="policy", messages=messages, tools=lookup_agent.TOOLS, seed=2,
                                            extra_body={"return_token_ids": True})
    assert second.choices[0].message.tool_calls is None
    assert "<tool_response>\n7\n</tool_response>" in tokenizer.decode(second.model_extra["prompt_token_ids"])


def test_episode_calls_are_recorded_and_batched(served):
    endpoint, service, tokenizer = served
    episodes = {f"e{i}": Episode(seed=i, group_id=0, sample_seed=100 + i, max_calls=1) for i in range(4)}
    service.episodes.update(episodes)
    service.limits.forced = Sampling(48, 1.0)
    # The batch goes when all four wait (the training loop passes the live episodes the same way).
    service.batcher.expected, service.batcher.wait_s = (lambda: len(episodes)), 30.0
    replies = {}

    def run(key: str) -> None:
        client = openai.OpenAI(base_url=endpoint.episode_url(key), api_key="x", max_retries=0)
        replies[key] = client.chat.completions.create(model="policy", messages=lookup_agent.first_messages(0),
                                                      tools=lookup_agent.TOOLS, extra_body={"return_token_ids": True})

    threads = [threading.Thread(target=run, args=(key,)) for key in episodes]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert service.batcher.batch_sizes == [4]  # the concurrent requests shared one generate call
    for key, episode in episodes.items():
        (call,) = episode.calls
        assert call.completion_ids == replies[key].choices[0].model_extra["token_ids"]
        assert call.prompt_ids == replies[key].model_extra["prompt_token_ids"]
        assert len(call.logprobs) == len(call.completion_ids)
    # rollout.max_turns: a call past the cap is refused, and the episode is marked truncated.
    client = openai.OpenAI(base_url=endpoint.episode_url("e0"), api_key="x", max_retries=0)
    with pytest.raises(openai.BadRequestError, match="rollout.max_turns=1"):
        client.chat.completions.create(model="policy", messages=lookup_agent.first_messages(0))
    assert episodes["e0"].refused
    with pytest.raises(openai.BadRequestError, match="no episode 'gone'"):
        openai.OpenAI(base_url=endpoint.episode_url("gone"), api_key="x", max_retries=0).chat.completions.create(
            model="policy", messages=lookup_agent.first_messages(0))


def _default_interrupt() -> None:
    """In the child: Ctrl-C as a shell gives it. A child inherits an ignored or blocked SIGINT from the process
    that starts it, and in the full suite `ragen2 serve` once sat through the SIGINT this test sends."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT])


def test_serve_command_in_a_subprocess(tool_policy, tmp_path):
    """`ragen2 serve MODEL --port 0 --max-model-len 2048`: an agent in another process calls it, a longer prompt
    is refused; Ctrl-C stops it cleanly."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "ragen2", "serve", str(tool_policy), "--port", "0", "--device", "cpu",
               "--max-model-len", "2048"]
    # Its log goes to a file: a pipe nobody reads while the server runs can fill, and the server would block on it.
    log = tmp_path / "serve.log"
    with log.open("w") as err:
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=err, text=True, env=env,
                                preexec_fn=_default_interrupt)
    try:
        line = proc.stdout.readline()
        url = re.search(r"at (http://\S+/v1)", line)
        assert url, line + log.read_text()
        client = openai.OpenAI(base_url=url.group(1), api_key="x", max_retries=0)
        reply = client.chat.completions.create(model="policy", messages=lookup_agent.first_messages(0),
                                               tools=lookup_agent.TOOLS, temperature=0)
        assert reply.choices[0].message.tool_calls[0].function.name == "lookup"
        with pytest.raises(openai.BadRequestError, match=r"maximum context length is 2048 tokens \(--max-model-len\), "
                           r"but the prompt has 21\d\d tokens"):
            client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "a " * 2100}])
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            code = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = f"still running 30 s after Ctrl-C; its log:\n{log.read_text()}"
    assert code == 130, code
