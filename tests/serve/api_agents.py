"""The lookup agent (`lookup_agent.py`) written against the endpoint's other ways in: the Responses API, and chat
completions streamed. Each appends the token ids it was served to the JSONL file named by $SERVED_LOG, as
`lookup_agent` does, so a test can compare them with what training used.
"""

import json
import os
import threading

import lookup_agent

# lookup_agent's tool and system prompt in the Responses API's shapes.
RESPONSES_TOOLS = [{"type": "function", **tool["function"]} for tool in lookup_agent.TOOLS]
INSTRUCTIONS = lookup_agent.first_messages(0)[0]["content"]
_lock = threading.Lock()


def first_input(seed: int) -> list[dict]:
    """The Responses input of lookup_agent's first call (its system message goes as `instructions`)."""
    return lookup_agent.first_messages(seed)[1:]


def log(seed: int, prompt: list[int], completion: list[int]) -> None:
    path = os.environ.get("SERVED_LOG")
    if path:
        with _lock, open(path, "a") as f:
            f.write(json.dumps({"seed": seed, "prompt": prompt, "completion": completion}) + "\n")


def after_response(items: list, response) -> float | None:
    """Extend the input with the response's output items and their tool results; the reward once the model
    answered in text."""
    items += response.output
    calls = [item for item in response.output if item.type == "function_call"]
    if not calls:
        return 1.0 if lookup_agent.TABLE["a"] in response.output_text else 0.0
    for call in calls:
        key = json.loads(call.arguments).get("key", "")
        items.append({"type": "function_call_output", "call_id": call.call_id,
                      "output": lookup_agent.TABLE.get(key, "unknown")})
    return None


def play_responses(client, seed: int) -> float:
    items = first_input(seed)
    for _ in range(3):
        response = client.responses.create(model="policy", instructions=INSTRUCTIONS, input=items,
                                           tools=RESPONSES_TOOLS, max_output_tokens=48,
                                           extra_body={"return_token_ids": True})
        log(seed, response.model_extra["prompt_token_ids"], response.model_extra["token_ids"])
        reward = after_response(items, response)
        if reward is not None:
            return reward
    return 0.0


async def streamed_message(stream) -> tuple[dict, list[int], list[int]]:
    """A streamed chat completion put back together as a chat message, with the prompt's and the completion's
    token ids (`return_token_ids`); raises unless the stream ended with its usage chunk."""
    message, calls, prompt, ids, usage = {"role": "assistant", "content": ""}, {}, None, [], None
    async for chunk in stream:
        prompt = chunk.model_extra.get("prompt_token_ids", prompt)
        usage = chunk.usage or usage
        for choice in chunk.choices:
            message["content"] += choice.delta.content or ""
            ids += choice.model_extra.get("token_ids", [])
            for delta in choice.delta.tool_calls or []:
                call = calls.setdefault(delta.index, {"id": delta.id, "type": "function",
                                                      "function": {"name": "", "arguments": ""}})
                call["function"]["name"] += delta.function.name or ""
                call["function"]["arguments"] += delta.function.arguments or ""
    if usage is None or usage.completion_tokens != len(ids):
        raise AssertionError(f"the stream's usage chunk is {usage}, for {len(ids)} tokens")
    if calls:
        message["tool_calls"] = [calls[k] for k in sorted(calls)]
    return message, prompt, ids


async def play_streamed_chat(client, seed: int) -> float:
    messages = lookup_agent.first_messages(seed)
    for _ in range(3):
        stream = await client.chat.completions.create(
            model="policy", messages=messages, tools=lookup_agent.TOOLS, max_tokens=48, stream=True,
            stream_options={"include_usage": True}, extra_body={"return_token_ids": True})
        message, prompt, ids = await streamed_message(stream)
        log(seed, prompt, ids)
        messages.append(message)
        if "tool_calls" not in message:
            return 1.0 if lookup_agent.TABLE["a"] in message["content"] else 0.0
        for call in message["tool_calls"]:
            key = json.loads(call["function"]["arguments"]).get("key", "")
            result = lookup_agent.TABLE.get(key, "unknown")
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})
    return 0.0
