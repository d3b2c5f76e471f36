"""OpenAI chat messages in, the policy's prompt token ids out; a generation back out as an OpenAI reply.

The prompt is rendered by the policy's own chat template with the request's `tools`, so a
model sees tools exactly as its template presents them. Messages arrive in OpenAI's shape and are
handed to the template in the shape Hugging Face templates read: `content` a string, and a tool
call's `arguments` a mapping rather than a JSON string (Qwen2.5's template writes
`arguments | tojson`, which would quote a string a second time).
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from transformers import PreTrainedTokenizerBase

from ragen2.agent.tool_calls import ParsedToolCalls
from ragen2.agent.types import GenerationOutput


class RequestError(ValueError):
    """A request the endpoint cannot serve; answered with HTTP 400 and this message."""


def template_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI chat messages as chat templates read them."""
    if not isinstance(messages, list) or not messages:
        raise RequestError("`messages` must be a non-empty list of chat messages")
    out = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise RequestError(f"messages[{i}] must be an object with a string `role`")
        message = dict(message)
        message["content"] = _text(message.get("content"), i)
        if message.get("tool_calls"):
            message["tool_calls"] = [_template_tool_call(call, i) for call in message["tool_calls"]]
        out.append(message)
    return out


def _text(content: Any, i: int) -> str:
    """A message's content as one string: None is "", a list of parts is their text joined."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    raise RequestError(f"messages[{i}].content must be a string, null or a list of text parts")


def _template_tool_call(call: dict[str, Any], i: int) -> dict[str, Any]:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise RequestError(f"messages[{i}].tool_calls: each call needs function.name")
    arguments = function.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as e:
            raise RequestError(f"messages[{i}].tool_calls: arguments of {function['name']} are not JSON: {e}") from e
    return {**call, "function": {"name": function["name"], "arguments": arguments}}


def prompt_ids(tokenizer: PreTrainedTokenizerBase, messages: list[dict[str, Any]],
               tools: list[dict[str, Any]] | None) -> list[int]:
    """The generation prompt of `messages` (with `tools`) under the tokenizer's chat template, as token ids."""
    try:
        text = tokenizer.apply_chat_template(
            template_messages(messages), tools=tools or None, add_generation_prompt=True, tokenize=False
        )
    except RequestError:
        raise
    except Exception as e:  # a template that refuses the conversation (jinja raise_exception, a missing key)
        raise RequestError(f"the policy's chat template cannot render these messages: {type(e).__name__}: {e}") from e
    return tokenizer.encode(text, add_special_tokens=False)


def completion_reply(
    out: GenerationOutput, parsed: ParsedToolCalls, model: str, prompt: list[int], token_texts: list[str] | None,
    return_token_ids: bool,
) -> dict[str, Any]:
    """An OpenAI `chat.completion` object for one generation.

    Well-formed tool calls become `tool_calls` and leave the text around them as `content`;
    when a block does not parse, the whole text is the content and there are no calls.
    `token_texts` (one per generated token) adds `logprobs`; `return_token_ids` adds
    `prompt_token_ids` and the choice's `token_ids`, as vLLM names them.
    """
    message: dict[str, Any] = {"role": "assistant", "content": out.text}
    finish = out.finish_reason
    if parsed.valid and parsed.calls:
        message["content"] = parsed.content or None
        message["tool_calls"] = [
            {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
             "function": {"name": c.name, "arguments": json.dumps(c.arguments)}}
            for c in parsed.calls
        ]
        finish = "tool_calls" if finish == "stop" else finish
    choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": finish, "logprobs": None}
    if token_texts is not None:
        choice["logprobs"] = {"content": [
            {"token": t, "logprob": lp, "bytes": list(t.encode()), "top_logprobs": []}
            for t, lp in zip(token_texts, out.logprobs or [])
        ]}
    reply: dict[str, Any] = {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
        "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(out.token_ids),
                  "total_tokens": len(prompt) + len(out.token_ids)},
    }
    if return_token_ids:
        reply["prompt_token_ids"] = list(prompt)
        choice["token_ids"] = list(out.token_ids)
    return reply
