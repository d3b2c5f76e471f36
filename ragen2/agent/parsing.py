"""Parse one agent turn, `<think>reasoning</think><answer>a1 || a2</answer>`, into reasoning and actions.

The prompt already ends with `<think>` (generation starts inside the reasoning), so a
response normally begins with the reasoning itself; a repeated leading `<think>` is accepted
too. Without thinking (`rollout.enable_think=false`, RAGEN's no-think RL) the prompt ends
with `<answer>` and a turn is `a1 || a2</answer>`. The separator is `rollout.action_sep`.
Parsing never raises on text: a response that does not have exactly the expected blocks is
`valid=False` with no actions, so the rollout applies the format penalty instead of crashing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ragen2.tags import (
    ACTION_SEPARATOR, ANSWER_CLOSE, ANSWER_OPEN, MEMORY_CLOSE, MEMORY_OPEN, TAGS, THINK_CLOSE, THINK_OPEN,
    valid_action_sep,
)

# Generation may stop after an end-of-turn marker that was decoded as text
# (`<|im_end|>`, `<|eot_id|>`, `</s>`, ...); such trailing markers are ignored.
_END_MARKERS = ("</s>", "<eos>", "<end_of_turn>")
_LEADING_THINK = re.compile(r"\A\s*" + re.escape(THINK_OPEN))
_LEADING_ANSWER = re.compile(r"\A\s*" + re.escape(ANSWER_OPEN))
_LEADING_MEMORY = re.compile(r"\A\s*" + re.escape(MEMORY_OPEN))


@dataclass(frozen=True)
class ResponseFormat:
    """What a turn must look like: with or without a think block, and how actions are separated.

    The defaults are ragen2's and RAGEN's (`enable_think: True`, `action_sep: "||"`).
    """

    think: bool = True
    action_sep: str = ACTION_SEPARATOR

    def __post_init__(self) -> None:
        if not valid_action_sep(self.action_sep):
            raise ValueError(f"action_sep={self.action_sep!r} is not allowed: use non-empty text without a tag")

    @property
    def prefix(self) -> str:
        """The tag the generation prompt ends with: the model writes what follows it."""
        return THINK_OPEN if self.think else ANSWER_OPEN

    def instruction(self, text: str) -> str:
        """An environment's instruction adapted to this format.

        Instructions are written for the default format (`Answer as <think>...</think><answer>A1 || A2</answer>`);
        without thinking the `<think>...</think>` part is removed, and `||` becomes `action_sep`.
        The default format returns `text` unchanged.
        """
        if not self.think:
            text = text.replace(f"{THINK_OPEN}...{THINK_CLOSE}", "")
        return text.replace(ACTION_SEPARATOR, self.action_sep)


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


def parse_response(text: str, max_actions: int | None = None, fmt: ResponseFormat = ResponseFormat()) -> ParsedTurn:
    """Split a response into reasoning and at most `max_actions` actions.

    Valid means: optional whitespace and `<think>`, then reasoning, `</think>`, optional
    whitespace, `<answer>`, a non-empty answer, `</answer>`, optional whitespace or trailing
    end-of-turn markers, and no other tag anywhere. Without thinking (`fmt.think` false) the
    think block is absent: optional whitespace and `<answer>`, the answer, `</answer>`, and
    the reasoning is always "". The answer is split on `fmt.action_sep`; pieces are
    stripped and empty ones dropped. An answer with more than `max_actions` actions keeps
    the first `max_actions` and stays valid (the reference agent truncates the same way);
    the extra actions are simply never executed. Empty reasoning is valid format (the
    diagnostics drop and count it separately).
    """
    if max_actions is not None and max_actions < 1:
        raise ValueError(f"max_actions={max_actions} is not allowed: use an integer >= 1 or None")
    bounds = reasoning_bounds(text) if fmt.think else None
    reasoning = text[bounds[0] : bounds[1]].strip() if bounds else ""
    body = _strip_end_markers(text)
    lead = (_LEADING_THINK if fmt.think else _LEADING_ANSWER).match(body)
    body = body[lead.end() :] if lead else body
    # Exactly one of each remaining tag, in order, with only whitespace between the blocks.
    expected = {THINK_OPEN: 0, THINK_CLOSE: int(fmt.think), ANSWER_OPEN: int(fmt.think), ANSWER_CLOSE: 1}
    if any(body.count(tag) != n for tag, n in expected.items()):
        return ParsedTurn(reasoning=reasoning)
    if fmt.think:
        think_end, answer_start = body.index(THINK_CLOSE), body.index(ANSWER_OPEN)
        if not think_end < answer_start or body[think_end + len(THINK_CLOSE) : answer_start].strip():
            return ParsedTurn(reasoning=reasoning)
        body = body[answer_start + len(ANSWER_OPEN) :]
    answer, closed, rest = body.partition(ANSWER_CLOSE)
    if not closed or rest.strip():
        return ParsedTurn(reasoning=reasoning)
    actions = [a.strip() for a in answer.split(fmt.action_sep) if a.strip()]
    if not actions:
        return ParsedTurn(reasoning=reasoning)
    return ParsedTurn(reasoning=reasoning, actions=actions[:max_actions], valid=True)


def note_bounds(text: str) -> tuple[int, int] | None:
    """Character range [start, end) of a memory note in `text` (what follows a prompt ending with `<memory>`),
    or None when `</memory>` is missing. A repeated leading `<memory>` is skipped, as `<think>` is."""
    lead = _LEADING_MEMORY.match(text)
    start = lead.end() if lead else 0
    end = text.find(MEMORY_CLOSE, start)
    return None if end < 0 else (start, end)


def parse_note(text: str) -> tuple[str, bool]:
    """(the note, valid) of a memory turn's response, `note</memory>`: valid when a non-empty note is closed by
    `</memory>` with only whitespace or end-of-turn markers after it and no other tag anywhere."""
    bounds = note_bounds(text)
    if bounds is None:
        return "", False
    note, rest = text[bounds[0] : bounds[1]], text[bounds[1] + len(MEMORY_CLOSE) :]
    tags = (*TAGS, MEMORY_OPEN, MEMORY_CLOSE)
    valid = bool(note.strip()) and not _strip_end_markers(rest) and not any(tag in note for tag in tags)
    return note.strip(), valid


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
