"""Parse one agent turn, `<think>reasoning</think><answer>a1 || a2</answer>`, into reasoning and actions.

The prompt already ends with `<think>` (generation starts inside the reasoning), so a
response normally begins with the reasoning itself; a repeated leading `<think>` is accepted
too. Parsing never raises on text: a response that is not exactly one think block followed
by one non-empty answer block is `valid=False` with no actions, so the rollout applies the
format penalty instead of crashing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"
TAGS = (THINK_OPEN, THINK_CLOSE, ANSWER_OPEN, ANSWER_CLOSE)
ACTION_SEPARATOR = "||"

# Generation may stop after an end-of-turn marker that was decoded as text
# (`<|im_end|>`, `<|eot_id|>`, `</s>`, ...); such trailing markers are ignored.
_END_MARKERS = ("</s>", "<eos>", "<end_of_turn>")
_LEADING_THINK = re.compile(r"\A\s*" + re.escape(THINK_OPEN))


@dataclass(frozen=True)
class ParsedTurn:
    """What one response says: its reasoning text, its actions, and whether the format held."""

    reasoning: str  # text strictly between <think> and the first </think>, stripped; "" without </think>
    actions: list[str] = field(default_factory=list)  # [] whenever valid is False
    valid: bool = False


def reasoning_bounds(text: str) -> tuple[int, int] | None:
    """Character range [start, end) of the reasoning in `text`, or None when `</think>` is missing.

    `start` is after a leading `<think>` when the response repeats it, else 0; `end` is the
    first `</think>`. Shared by `parse_response` and the token-level `reasoning_span` so the
    reasoning text and the reasoning tokens always describe the same region.
    """
    lead = _LEADING_THINK.match(text)
    start = lead.end() if lead else 0
    end = text.find(THINK_CLOSE, start)
    return None if end < 0 else (start, end)


def parse_response(text: str, max_actions: int | None = None) -> ParsedTurn:
    """Split a response into reasoning and at most `max_actions` actions.

    Valid means: optional whitespace and `<think>`, then reasoning, `</think>`, optional
    whitespace, `<answer>`, a non-empty answer, `</answer>`, optional whitespace or trailing
    end-of-turn markers, and no other tag anywhere. The answer is split on `||`; pieces are
    stripped and empty ones dropped. An answer with more than `max_actions` actions keeps
    the first `max_actions` and stays valid (the reference agent truncates the same way);
    the extra actions are simply never executed. Empty reasoning is valid format (the
    diagnostics drop and count it separately).
    """
    if max_actions is not None and max_actions < 1:
        raise ValueError(f"max_actions={max_actions} is not allowed: use an integer >= 1 or None")
    bounds = reasoning_bounds(text)
    reasoning = text[bounds[0] : bounds[1]].strip() if bounds else ""
    body = _strip_end_markers(text)
    lead = _LEADING_THINK.match(body)
    body = body[lead.end() :] if lead else body
    # Exactly one of each remaining tag, in order, with only whitespace between the blocks.
    if any(body.count(tag) != (0 if tag == THINK_OPEN else 1) for tag in TAGS):
        return ParsedTurn(reasoning=reasoning)
    think_end, answer_start, answer_end = (body.index(tag) for tag in (THINK_CLOSE, ANSWER_OPEN, ANSWER_CLOSE))
    between = body[think_end + len(THINK_CLOSE) : answer_start]
    if not think_end < answer_start < answer_end or between.strip() or body[answer_end + len(ANSWER_CLOSE) :].strip():
        return ParsedTurn(reasoning=reasoning)
    answer = body[answer_start + len(ANSWER_OPEN) : answer_end]
    actions = [a.strip() for a in answer.split(ACTION_SEPARATOR) if a.strip()]
    if not actions:
        return ParsedTurn(reasoning=reasoning)
    return ParsedTurn(reasoning=reasoning, actions=actions[:max_actions], valid=True)


def _strip_end_markers(text: str) -> str:
    """Drop trailing whitespace and end-of-turn markers such as `<|im_end|>` or `</s>`."""
    while True:
        text = text.rstrip()
        marker = next((m for m in _END_MARKERS if text.endswith(m)), None)
        if marker is None and text.endswith("|>"):
            start = text.rfind("<|", 0, len(text) - 2)
            if start >= 0 and not set(text[start + 2 : -2]) & set("<>|"):
                marker = text[start:]
        if marker is None:
            return text
        text = text[: -len(marker)]
