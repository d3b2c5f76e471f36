"""Native tool calls in the Hermes / Qwen2.5 format: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`.

Qwen2.5, Qwen3, Hermes and the templates derived from them render a tool call this way and
teach the model to write it so; one parser therefore serves the OpenAI-compatible endpoint
(its `tool_calls` field) and the tool-calling environments (`rollout.tool_calls`,
`parse_tool_turn`). Parsing never raises on text: a block that is unterminated or not a JSON
object with a string `name` makes the response `valid=False`, and the caller decides what that
costs.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ragen2.agent.parsing import ParsedTurn, ResponseFormat, reasoning_bounds
from ragen2.tags import TAGS, THINK_CLOSE

TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"
_BLOCK = re.compile(re.escape(TOOL_CALL_OPEN) + r"(.*?)" + re.escape(TOOL_CALL_CLOSE), re.DOTALL)


@dataclass(frozen=True)
class ToolCall:
    """One call: the tool's name and its arguments (a JSON object)."""

    name: str
    arguments: dict[str, Any]

    def to_json(self) -> str:
        """The call as the model writes it between the tags."""
        return json.dumps({"name": self.name, "arguments": self.arguments})


@dataclass(frozen=True)
class ParsedToolCalls:
    """A response split into its text and its tool calls."""

    content: str  # the text outside the tool-call blocks, stripped
    calls: list[ToolCall] = field(default_factory=list)  # [] whenever valid is False
    valid: bool = True  # every block closed and held a JSON object with a string "name"


def parse_tool_calls(text: str) -> ParsedToolCalls:
    """Every `<tool_call>` block of `text`, in order, and the text around them.

    `arguments` may be an object or a JSON string holding one (some models write either);
    a missing `arguments` is {}. A response without any block is valid with no calls.
    """
    calls, valid = [], True
    for body in _BLOCK.findall(text):
        call = _call(body)
        if call is None:
            valid = False
        else:
            calls.append(call)
    content = _BLOCK.sub("", text)
    if TOOL_CALL_OPEN in content or TOOL_CALL_CLOSE in content:  # an unterminated or stray tag
        valid = False
    return ParsedToolCalls(content=content.strip(), calls=calls if valid else [], valid=valid)


def _call(body: str) -> ToolCall | None:
    try:
        data = json.loads(body)
    except json.JSONDecodeError:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("name"), str):
        return None
    arguments = data.get("arguments", data.get("parameters", {}))
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return None
    return ToolCall(data["name"], arguments) if isinstance(arguments, dict) else None


def render_tool_calls(calls: list[ToolCall]) -> str:
    """The text a model writes for `calls` (what `parse_tool_calls` reads back)."""
    return "".join(f"{TOOL_CALL_OPEN}\n{call.to_json()}\n{TOOL_CALL_CLOSE}" for call in calls)


def parse_tool_turn(
    text: str, fmt: ResponseFormat, max_actions: int | None, to_action: Callable[[str, dict[str, Any]], str | None],
) -> ParsedTurn:
    """A turn of native tool calling: `<think>reasoning</think>` (with thinking), then one or more tool calls.

    Each call becomes an environment action through `to_action(name, arguments)` (None: no such tool, or
    its arguments are wrong). Valid means: the think block as `parse_response` requires it, at least one
    call, every block well formed, every call an action, and no `<answer>` or further think tags; text
    around the calls is allowed (a model may say what it does). The first `max_actions` calls are kept.
    """
    bounds = reasoning_bounds(text) if fmt.think else None
    reasoning = text[bounds[0]: bounds[1]].strip() if bounds else ""
    if fmt.think and bounds is None:
        return ParsedTurn(reasoning=reasoning)
    body = text[bounds[1] + len(THINK_CLOSE):] if bounds else text
    parsed = parse_tool_calls(body)
    if not parsed.valid or not parsed.calls or any(tag in body for tag in TAGS):
        return ParsedTurn(reasoning=reasoning)
    actions = [to_action(call.name, call.arguments) for call in parsed.calls[:max_actions]]
    if any(action is None for action in actions):
        return ParsedTurn(reasoning=reasoning)
    return ParsedTurn(reasoning=reasoning, actions=actions, valid=True)
