"""The Responses API (`POST /v1/responses`) in terms of chat: its input items as chat messages, its function
tools as chat tools, and a generation back as a `response` object.

A Responses request is turned into the chat conversation it stands for (`instructions` a system
message, `function_call` items the assistant's `tool_calls`, `function_call_output` items `tool`
messages) and rendered by the same chat template, so a harness gets the prompt over this route
that a chat client sending the same conversation gets, and its calls train the same way. Nothing
is stored: each request carries its whole conversation, and `previous_response_id` is refused.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from ragen2.agent.tool_calls import ParsedToolCalls
from ragen2.agent.types import GenerationOutput
from ragen2.serve.batcher import Sampling
from ragen2.serve.chat import RequestError, call_id, check_tools, content_text, reply_parts

# A Responses function tool, as a refusal of a malformed one spells it.
RESPONSES_TOOL = '{"type": "function", "name": NAME, "description": TEXT, "parameters": {JSON schema object}}'
MESSAGE_ROLES = ("user", "assistant", "system", "developer")
TEXT_PARTS = ("input_text", "output_text")


def request_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The chat messages of a request's `instructions` and `input` (a string, or a list of items)."""
    instructions = body.get("instructions")
    messages: list[dict[str, Any]] = [{"role": "system", "content": instructions}] if instructions else []
    items = body.get("input")
    if isinstance(items, str):
        return messages + [{"role": "user", "content": items}]
    if not isinstance(items, list) or not items:
        raise RequestError("`input` must be a string or a non-empty list of input items")
    for i, item in enumerate(items):
        kind = item.get("type", "message") if isinstance(item, dict) else None
        if kind == "message":
            role = item.get("role")
            if role not in MESSAGE_ROLES:
                raise RequestError(f"input[{i}].role={role!r:.60} is not a message role: use one of "
                                   f"{', '.join(MESSAGE_ROLES)}")
            content = content_text(item.get("content"), f"input[{i}].content", TEXT_PARTS)
            messages.append({"role": role, "content": content})
        elif kind == "function_call":
            _add_call(messages, item, i)
        elif kind == "function_call_output":
            if not isinstance(item.get("call_id"), str):
                raise RequestError(f"input[{i}].call_id must be a string: the call this output answers")
            messages.append({"role": "tool", "tool_call_id": item["call_id"],
                             "content": content_text(item.get("output"), f"input[{i}].output", TEXT_PARTS)})
        else:
            raise RequestError(f"input[{i}].type={kind!r:.60} is not served: use messages, function_call and "
                               "function_call_output items")
    return messages


def _add_call(messages: list[dict[str, Any]], item: dict[str, Any], i: int) -> None:
    """A `function_call` item as a tool call of the assistant message before it (the text a reply held, and the
    calls after it, are one chat message), or of a new one."""
    name, arguments, call = item.get("name"), item.get("arguments"), item.get("call_id")
    if not (isinstance(name, str) and isinstance(arguments, str) and isinstance(call, str)):
        raise RequestError(f"input[{i}] must be a function_call with string `call_id`, `name` and `arguments`")
    try:
        parsed = json.loads(arguments) if arguments.strip() else {}
    except json.JSONDecodeError as e:
        raise RequestError(f"input[{i}].arguments of {name} are not JSON: {e}") from e
    tool_call = {"id": call, "type": "function", "function": {"name": name, "arguments": parsed}}
    if not (messages and messages[-1]["role"] == "assistant"):
        messages.append({"role": "assistant", "content": ""})
    messages[-1].setdefault("tool_calls", []).append(tool_call)


def request_tools(tools: Any) -> list[dict[str, Any]] | None:
    """A request's function tools in chat's shape, checked as chat tools are (refusals spell the Responses shape).
    Tools of other types (web search, file search, ...) are refused: the policy has no such tools."""
    if isinstance(tools, list):
        tools = [_chat_tool(tool) for tool in tools]
    return check_tools(tools, RESPONSES_TOOL)


def _chat_tool(tool: Any) -> Any:
    if not (isinstance(tool, dict) and tool.get("type") == "function"):
        return tool  # check_tools refuses it
    return {"type": "function", "function": {
        key: tool[key] for key in ("name", "description", "parameters") if tool.get(key) is not None}}


def response_object(out: GenerationOutput, parsed: ParsedToolCalls, model: str, prompt: list[int],
                    body: dict[str, Any], sampling: Sampling, return_token_ids: bool) -> dict[str, Any]:
    """A `response` object for one generation: a `message` item with the reply's text (left out when the reply
    is only tool calls) and a `function_call` item per call. A reply cut at the token cap has status
    `incomplete` (reason `max_output_tokens`). `return_token_ids` adds `prompt_token_ids` and `token_ids`, the
    names the chat route gives them."""
    content, calls = reply_parts(out, parsed)
    cut = out.finish_reason == "length"
    output: list[dict[str, Any]] = []
    if content or not calls:
        output.append({"type": "message", "id": f"msg_{uuid.uuid4().hex}", "role": "assistant",
                       "status": "incomplete" if cut else "completed",
                       "content": [{"type": "output_text", "text": content or "", "annotations": [], "logprobs": []}]})
    output += [{"type": "function_call", "id": f"fc_{uuid.uuid4().hex}", "call_id": call_id(), "name": c.name,
                "arguments": json.dumps(c.arguments), "status": "completed"} for c in calls]
    now = time.time()
    response: dict[str, Any] = {
        "id": f"resp_{uuid.uuid4().hex}", "object": "response", "created_at": now, "completed_at": now,
        "model": model, "status": "incomplete" if cut else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if cut else None, "error": None,
        "output": output, "instructions": body.get("instructions"), "previous_response_id": None,
        "tools": body.get("tools") or [], "tool_choice": body.get("tool_choice", "auto"),
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "temperature": sampling.temperature, "top_p": sampling.top_p, "max_output_tokens": sampling.max_new_tokens,
        "usage": {"input_tokens": len(prompt), "output_tokens": len(out.token_ids),
                  "total_tokens": len(prompt) + len(out.token_ids),
                  "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
                  "output_tokens_details": {"reasoning_tokens": 0}},
    }
    if return_token_ids:
        response["prompt_token_ids"] = list(prompt)
        response["token_ids"] = list(out.token_ids)
    return response
