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

from ragen2.agent.tool_calls import ParsedToolCalls, ToolCall
from ragen2.agent.types import GenerationOutput


class RequestError(ValueError):
    """A request the endpoint cannot serve; answered with HTTP 400 and this message."""


# The roles chat templates know. A template skips a message whose role it does not know, so an unknown role
# would silently drop that message from the prompt: it is refused instead.
ROLES = ("system", "developer", "user", "assistant", "tool")


def template_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI chat messages as chat templates read them; `developer` (OpenAI's newer name for the system
    message) becomes `system`."""
    if not isinstance(messages, list) or not messages:
        raise RequestError("`messages` must be a non-empty list of chat messages")
    out = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise RequestError(f"messages[{i}] must be an object with a string `role`")
        if message["role"] not in ROLES:
            raise RequestError(f"messages[{i}].role={message['role']!r:.60} is not a chat role: use one of "
                               f"{', '.join(ROLES)}")
        message = dict(message)
        message["role"] = "system" if message["role"] == "developer" else message["role"]
        message["content"] = content_text(message.get("content"), f"messages[{i}].content")
        calls = message.get("tool_calls")
        if calls:
            if not isinstance(calls, list):
                raise RequestError(f"messages[{i}].tool_calls must be a list of tool calls")
            message["tool_calls"] = [_template_tool_call(call, i) for call in calls]
        out.append(message)
    return out


def content_text(content: Any, field: str, parts: tuple[str, ...] = ("text",)) -> str:
    """A content as one string: None is "", a list of parts (of the types `parts`) is their text joined. Other
    parts (images, files) are refused, naming `field`: the policy reads text only."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = [p.get("text") if isinstance(p, dict) and p.get("type") in parts else None for p in content]
        if all(isinstance(t, str) for t in texts):
            return "".join(texts)
    raise RequestError(f"{field} must be a string, null or a list of {' or '.join(parts)} parts")


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


# A chat function tool, as a refusal of a malformed one spells it.
CHAT_TOOL = '{"type": "function", "function": {"name": NAME, "description": TEXT, "parameters": {JSON schema object}}}'


def check_tools(tools: Any, shape: str = CHAT_TOOL) -> list[dict[str, Any]] | None:
    """The request's `tools` (chat-style), refused unless each is a function tool with a name and (if any) a
    JSON-schema object of parameters: a template renders whatever it is given, so a malformed tool would reach
    the policy. `shape` is how the refusal spells a tool: the route's own format (the Responses API's differs)."""
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise RequestError("`tools` must be a list of function tools")
    for i, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) and tool.get("type") == "function" else None
        if not (isinstance(function, dict) and isinstance(function.get("name"), str) and function["name"]
                and isinstance(function.get("parameters", {}), dict)
                and isinstance(function.get("description", ""), str)):
            raise RequestError(f"tools[{i}] must be {shape}")
    return tools or None


def prompt_text(tokenizer: PreTrainedTokenizerBase, messages: list[dict[str, Any]],
                tools: list[dict[str, Any]] | None) -> str:
    """The generation prompt of `messages` (with `tools`, checked by `check_tools`) under the tokenizer's chat
    template."""
    try:
        return tokenizer.apply_chat_template(
            template_messages(messages), tools=tools, add_generation_prompt=True, tokenize=False
        )
    except RequestError:
        raise
    except Exception as e:  # a template that refuses the conversation (jinja raise_exception, a missing key)
        raise RequestError(f"the policy's chat template cannot render these messages: {type(e).__name__}: {e}") from e


def token_bytes(tokenizer: PreTrainedTokenizerBase) -> int:
    """A bound on the bytes of text one token stands for (the longest token's, plus one for the space a lone token
    decodes without): a text of B bytes holds at least B // this many tokens, known without tokenizing it."""
    texts = tokenizer.batch_decode([[i] for i in range(len(tokenizer))], skip_special_tokens=False)
    return max(len(t.encode()) for t in texts) + 1


def reply_parts(out: GenerationOutput, parsed: ParsedToolCalls) -> tuple[str | None, list[ToolCall]]:
    """A generation as a reply, on every route: its text and its tool calls. Well-formed calls leave the text
    around them (None when there is none); when a block does not parse, the whole text is the reply and there
    are no calls, so a malformed call reaches the agent as text rather than being lost."""
    if parsed.valid and parsed.calls:
        return parsed.content or None, parsed.calls
    return out.text, []


def call_id() -> str:
    """A fresh tool call id, shaped as OpenAI's."""
    return f"call_{uuid.uuid4().hex[:24]}"


def completion_reply(
    out: GenerationOutput, parsed: ParsedToolCalls, model: str, prompt: list[int], token_texts: list[str] | None,
    return_token_ids: bool,
) -> dict[str, Any]:
    """An OpenAI `chat.completion` object for one generation (its text and calls as `reply_parts` splits them).

    `token_texts` (one per generated token) adds `logprobs`; `return_token_ids` adds
    `prompt_token_ids` and the choice's `token_ids`, as vLLM names them.
    """
    content, calls = reply_parts(out, parsed)
    message: dict[str, Any] = {"role": "assistant", "content": content}
    finish = out.finish_reason
    if calls:
        message["tool_calls"] = [
            {"id": call_id(), "type": "function", "function": {"name": c.name, "arguments": json.dumps(c.arguments)}}
            for c in calls
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
