"""An agent loop written with the `openai` client, as a user would write one: a question, one tool.

The model may call `lookup(key)`; the loop runs the call, sends the result back as a `tool`
message and asks again, until the model answers in text. The reward is 1 when the answer holds
the looked-up value. Every reply's token ids (vLLM's `return_token_ids`) are appended to the
JSONL file named by $SERVED_LOG, so a test can compare them with what training used.
"""

import json
import os
import threading

TOOLS = [{
    "type": "function",
    "function": {
        "name": "lookup",
        "description": "The value stored under a key.",
        "parameters": {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]},
    },
}]
TABLE = {"a": "7", "b": "3"}
_lock = threading.Lock()


def first_messages(seed: int) -> list[dict]:
    return [{"role": "system", "content": "Answer with the value of key a."},
            {"role": "user", "content": f"Question {seed % 3}: what is the value of a?"}]


def _log(seed: int, reply) -> None:
    path = os.environ.get("SERVED_LOG")
    if not path:
        return
    record = {"seed": seed, "prompt": reply.model_extra["prompt_token_ids"],
              "completion": reply.choices[0].model_extra["token_ids"]}
    with _lock, open(path, "a") as f:
        f.write(json.dumps(record) + "\n")


def _after(messages: list[dict], message) -> float | None:
    """Extend `messages` with the reply and its tool results; the reward once the model answered in text."""
    messages.append(message.model_dump(exclude_none=True))
    if not message.tool_calls:
        return 1.0 if TABLE["a"] in (message.content or "") else 0.0
    for call in message.tool_calls:
        key = json.loads(call.function.arguments).get("key", "")
        messages.append({"role": "tool", "tool_call_id": call.id, "content": TABLE.get(key, "unknown")})
    return None


def _converse(client, seed: int, messages: list[dict]) -> float | None:
    """Up to three calls until the agent answers; its reward, or None when it never did."""
    for _ in range(3):
        reply = client.chat.completions.create(model="policy", messages=messages, tools=TOOLS, max_tokens=48,
                                               extra_body={"return_token_ids": True})
        _log(seed, reply)
        reward = _after(messages, reply.choices[0].message)
        if reward is not None:
            return reward
    return None


def play(client, seed: int) -> float:
    return _converse(client, seed, first_messages(seed)) or 0.0


def play_follow_up(client, seed: int) -> float:
    """`play`, then one more question after the answer: with a template that drops earlier `<think>` blocks,
    the last call's prompt no longer holds the answer as it was sampled."""
    messages = first_messages(seed)
    reward = _converse(client, seed, messages)
    messages.append({"role": "user", "content": "Question 1: what is the value of a?"})
    reply = client.chat.completions.create(model="policy", messages=messages, tools=TOOLS, max_tokens=48,
                                           extra_body={"return_token_ids": True})
    _log(seed, reply)
    return reward or 0.0


async def play_async(client, seed: int) -> float:
    messages = first_messages(seed)
    for _ in range(3):
        reply = await client.chat.completions.create(model="policy", messages=messages, tools=TOOLS, max_tokens=48,
                                                     extra_body={"return_token_ids": True})
        _log(seed, reply)
        reward = _after(messages, reply.choices[0].message)
        if reward is not None:
            return reward
    return 0.0
