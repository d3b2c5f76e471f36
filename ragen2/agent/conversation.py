"""The token layout of a multi-turn episode: prompts to generate from, and the sequences to train on.

One class builds it for both consumers: the rollout loop feeds it sampled token ids, the
warm start feeds it demonstration text. Both therefore train on byte-identical layouts.

Layout (full history, StarPO): the whole episode is one sequence

    head      system + user_1 + generation prefix + <think>                      mask 0
    response_1                                                                    mask 1
    delta_2   end-of-turn + user_2 + generation prefix + <think>                  mask 0
    response_2                                                                    mask 1
    ...
    tail      the template's end-of-turn after the last response                 mask 0

and the prompt of turn k is exactly the prefix of that sequence before response_k.
Without thinking (`rollout.enable_think=false`) `<answer>` takes the place of `<think>`.

Native tool calling (`tools`): the system prompt carries the tools as the template renders them,
and after a turn that called tools, their results come back as `tool` messages in place of the next
user message; they are environment tokens (mask 0) like any other.

Two settings cut the history shown: `context_turns` (a sliding window of the last k turns)
and `max_len` (`rollout.max_model_len`: the oldest turns are dropped while a prompt is
longer, as RAGEN does). Prompts are then no longer prefixes of one sequence, and each turn
becomes a training sample of its own, made of exactly the prompt the model saw.
A third, `memory` (`rollout.memory=summary`), lets the policy choose what it keeps: when the next
prompt would leave no room under the budget, the policy is asked for a note (`MEMORY_REQUEST`, the
prompt ending with `<memory>`), and later prompts start again from the turn(s) just before that
request: system prompt, those turns, the request and the note as sampled, then the turns since.
Each such segment is one training sample, holding exactly the prompts its turns were generated from.
Everything that is not a model token comes from the tokenizer's chat template, so the same
code serves ChatML (the tiny model, Qwen) and Llama-style templates. Generated tokens are
never re-tokenised: only the environment text between responses is rendered and encoded,
one turn at a time (no re-rendering of the whole history per turn).

End-of-turn handling: the template closes every assistant message with its end-of-turn
text (`<|im_end|>` for ChatML). When a response already ends with that token (the model
emitted EOS) it is not repeated; when it does not (generation stopped at `</answer>` or hit
the token cap) the end-of-turn tokens are inserted as environment tokens with mask 0, so
the layout is the template's in both cases and the model is never trained on tokens it did
not produce.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from itertools import pairwise

from transformers import PreTrainedTokenizerBase

from ragen2.agent.parsing import ResponseFormat, note_bounds, reasoning_bounds
from ragen2.tags import MEMORY_OPEN

log = logging.getLogger(__name__)

# Stand-in for an assistant message when rendering the template: whatever the template
# prints after it is the environment text that follows a response.
_SENTINEL = "\u27e6ragen2-response\u27e7"


# The user message of a memory turn. The earlier turns are still in its prompt; the next prompts will not hold them.
MEMORY_REQUEST = "Your context is full: earlier turns will be removed. Write what you still need as <memory>note</memory>."


@dataclass(frozen=True)
class MemorySettings:
    """When the policy writes a memory note (`rollout.memory=summary`) and what later prompts keep.

    budget: the most tokens a prompt may hold. A note is asked for at the first turn whose prompt,
        plus a whole response (`response_tokens`) and the request, would not fit: the note's own
        prompt is the previous prompt, its response and the request, so it fits too.
    response_tokens: the most tokens a response takes (`rollout.max_tokens_per_turn`).
    recent_turns: turns before the request that later prompts still show, ahead of the note.
    """

    budget: int
    response_tokens: int
    recent_turns: int = 1

    def __post_init__(self) -> None:
        if self.budget < 1 or self.response_tokens < 1 or self.recent_turns < 0:
            raise ValueError(f"{self} is not allowed: budget and response_tokens >= 1, recent_turns >= 0")


def user_message(turn: int, observation: str, actions_left: int) -> str:
    """The user message of turn `turn` (1-based): the state and the remaining action budget."""
    return f"Turn {turn}:\nState:\n{observation}\nYou have {actions_left} actions left."


@dataclass
class _Turn:
    messages: list[tuple[str, str]]  # (role, content) before the response: the user message, or tool results
    head_ids: list[int] | None  # system + this user message + gen-prefix <think>: a context starting here
    delta_ids: list[int] | None  # end of the previous response's turn + this user message + gen-prefix <think>
    first: int = 0  # index of the first turn shown in this turn's prompt
    dropped: int = 0  # earlier turns left out of this turn's prompt by max_len
    response_ids: list[int] | None = None
    response_text: str = ""
    memory: bool = False  # a memory turn: the prompt ends with <memory>, the response is the note

    @property
    def prefix(self) -> str | None:
        """The tag this turn's prompt ends with, None for an ordinary turn (the format's prefix)."""
        return MEMORY_OPEN if self.memory else None


class Conversation:
    """Token-level state of one episode's chat.

    Args:
        tokenizer: any Hugging Face tokenizer with a chat template.
        system_prompt: the system message (an environment's `instruction`).
        context_turns: None shows the full history (one training sample per episode);
            k >= 0 shows only the last k answered turns before the current one (one training
            sample per turn, since the prompts are then no longer prefixes of each other).
        fmt: the response format; the system prompt is adapted to it (`ResponseFormat.instruction`)
            and every prompt ends with its `prefix`.
        max_len: cap on a prompt's tokens; None = no cap. Turns longer than it show fewer
            earlier turns (oldest dropped first; the system prompt and the current observation
            always stay), and an episode where that happened trains one sample per turn.
        tools: tool schemas (OpenAI's function format) for the chat template to render; tool
            results then follow the tool calls in the history, so the history is shown whole
            (`context_turns` and `max_len` must be None).
        memory: memory notes under a token budget (`MemorySettings`); None = off. Excludes the
            other three cuts.

    Usage per turn: `add_observation`, `prompt_ids` (generate from it), `add_response`. With
    `memory`, `writing_note` says when the prompt asks for a note instead: its response goes to
    `add_response` too, and the observation's own prompt follows.
    """

    def __init__(
        self, tokenizer: PreTrainedTokenizerBase, system_prompt: str, context_turns: int | None = None,
        fmt: ResponseFormat = ResponseFormat(), max_len: int | None = None, tools: list[dict] | None = None,
        memory: MemorySettings | None = None,
    ):
        if context_turns is not None and context_turns < 0:
            raise ValueError(
                f"context_turns={context_turns} is not allowed: use None (full history) or an integer >= 0"
            )
        if max_len is not None and max_len < 1:
            raise ValueError(f"max_len={max_len} is not allowed: use None (no cap) or an integer >= 1")
        if tools and (context_turns is not None or max_len is not None):
            raise ValueError(f"tools need the whole history (tool results answer earlier calls): context_turns="
                             f"{context_turns} and max_len={max_len} must both be None")
        if memory is not None and (context_turns is not None or max_len is not None or tools):
            raise ValueError(f"memory notes decide themselves what a prompt keeps: context_turns={context_turns}, "
                             f"max_len={max_len} and tools must all be None with memory={memory}")
        self.memory = memory
        self.tools = list(tools) if tools else None
        self.tokenizer = tokenizer
        self.fmt = fmt
        self.system_prompt = fmt.instruction(system_prompt)
        self.context_turns = context_turns
        self.max_len = max_len
        self._special_ids = frozenset(tokenizer.all_special_ids)
        self._turns: list[_Turn] = []
        self._waiting: list[tuple[str, str]] | None = None  # the observation a note being written goes before

    # ---- building ----------------------------------------------------------------------

    def add_observation(self, observation: str, actions_left: int, tool_results: list[str] | None = None) -> None:
        """Start the next turn with the environment's state text, or with `tool_results` (one `tool` message
        each, answering the previous turn's tool calls)."""
        if self.awaiting_response:
            raise RuntimeError("add_observation() called twice without add_response() in between")
        if tool_results and not self._turns:
            raise RuntimeError("tool results answer an earlier turn's tool calls: the first turn needs an observation")
        number = sum(not t.memory for t in self._turns) + 1
        messages = ([("tool", r) for r in tool_results] if tool_results
                    else [("user", user_message(number, observation, actions_left))])
        self._append(_Turn(messages=messages, head_ids=None, delta_ids=None))
        k = len(self._turns) - 1
        if self.memory is None or self._leaves_room(k):
            return
        if k > 0 and not self._turns[k - 1].memory:  # something to note since the last note: ask for one first
            self._waiting = self._turns.pop().messages
            self._append(_Turn(messages=[("user", MEMORY_REQUEST)], head_ids=None, delta_ids=None, memory=True))
        else:
            self._warn_no_room(k)

    @property
    def awaiting_response(self) -> bool:
        """A prompt is pending: an observation's, or after a note the observation it went before."""
        return bool(self._turns) and self._turns[-1].response_ids is None

    @property
    def writing_note(self) -> bool:
        """The pending prompt asks for a memory note (it ends with `<memory>`), not for this turn's action."""
        return self.awaiting_response and self._turns[-1].memory

    def prompt_ids(self) -> list[int]:
        """Context for the current turn; ends with the assistant generation prefix and `fmt.prefix` (`<memory>`
        when the turn asks for a note)."""
        if not self._turns or self._turns[-1].response_ids is not None:
            raise RuntimeError("prompt_ids() needs an observation without a response: call add_observation() first")
        return self._context(len(self._turns) - 1)

    @property
    def dropped_turns(self) -> int:
        """Earlier turns that `max_len` left out of the latest turn's prompt (0 without a cap)."""
        return self._turns[-1].dropped if self._turns else 0

    def add_response(self, response_ids: list[int], response_text: str) -> None:
        """Record what the model generated after `<think>` (token ids as sampled, and their text)."""
        if not self._turns or self._turns[-1].response_ids is not None:
            raise RuntimeError("add_response() needs a pending observation: call add_observation() first")
        self._turns[-1].response_ids = list(response_ids)
        self._turns[-1].response_text = response_text
        if self._waiting is not None:  # the note is written: the observation it went before is next
            self._append(_Turn(messages=self._waiting, head_ids=None, delta_ids=None))
            self._waiting = None
            if not self._leaves_room(len(self._turns) - 1):
                self._warn_no_room(len(self._turns) - 1)

    def add_response_text(self, text: str, add_eos: bool = True) -> None:
        """Record a demonstration response given as text (what follows the prompt's `<think>`).

        The text is encoded on its own, as generation would have produced it; with
        `add_eos` the tokenizer's EOS is appended and trained on, so the model learns to
        end its turn. Without it the template's end-of-turn is inserted with mask 0, the
        layout of a rollout that stopped at `</answer>`.
        """
        ids = self._encode(text)
        if add_eos and self.tokenizer.eos_token_id is not None:
            ids.append(self.tokenizer.eos_token_id)
        self.add_response(ids, text)

    # ---- reading -----------------------------------------------------------------------

    def samples(self) -> list[tuple[list[int], list[int]]]:
        """Training sequences as (input_ids, loss_mask); mask is 1 exactly on response tokens.

        Full history: one sample, the whole episode closed by the template's end-of-turn
        text after the last response. Last-k, or full history where `max_len` dropped turns
        from a prompt: one sample per answered turn, its prompt followed by its response.
        """
        answered = [t for t in self._turns if t.response_ids is not None]
        if not answered:
            return []
        if self.memory is not None and any(t.memory for t in answered):
            return self._segment_samples(len(answered))
        if self.context_turns is not None or any(t.dropped for t in answered):
            out = []
            for k, turn in enumerate(answered):
                prompt = self._context(k)
                out.append((prompt + turn.response_ids, [0] * len(prompt) + [1] * len(turn.response_ids)))
            return out
        ids, mask = list(answered[0].head_ids), [0] * len(answered[0].head_ids)
        for prev, turn in pairwise(answered):
            ids += prev.response_ids + turn.delta_ids
            mask += [1] * len(prev.response_ids) + [0] * len(turn.delta_ids)
        tail = self._encode(self._text_after_response(answered[-1], next_messages=None))
        ids += answered[-1].response_ids + tail
        mask += [1] * len(answered[-1].response_ids) + [0] * len(tail)
        return [(ids, mask)]

    def messages(self) -> list[dict[str, str]]:
        """The conversation as chat messages; assistant content is `fmt.prefix` + response text."""
        out = [{"role": "system", "content": self.system_prompt}]
        for turn in self._turns:
            out += [{"role": role, "content": content} for role, content in turn.messages]
            if turn.response_ids is not None:
                out.append({"role": "assistant", "content": self.fmt.prefix + turn.response_text})
        return out

    # ---- internals ---------------------------------------------------------------------

    def _append(self, turn: _Turn) -> None:
        """Add a turn: encode its head (a context starting at it) where the window can move and its delta
        (what follows the previous response), then choose the first turn its prompt shows."""
        cut = self.context_turns is not None or self.max_len is not None or self.memory is not None
        prefix = turn.prefix or self.fmt.prefix
        if not self._turns or cut:
            turn.head_ids = self._encode(self._render(turn.messages, add_generation_prompt=True) + prefix)
        if self._turns and self.context_turns != 0:
            turn.delta_ids = self._encode(self._text_after_response(self._turns[-1], turn.messages, prefix))
        self._turns.append(turn)
        self._fit_window(len(self._turns) - 1)

    def _leaves_room(self, k: int) -> bool:
        """Turn k's prompt, a whole response and the note request after it fit in the memory budget."""
        request = self._text_after_response(self._turns[k], [("user", MEMORY_REQUEST)], MEMORY_OPEN)
        room = self.memory.budget - self.memory.response_tokens - len(self._encode(request))
        return len(self._context(k)) <= room

    def _warn_no_room(self, k: int) -> None:
        number = sum(not t.memory for t in self._turns[: k + 1])
        log.warning("turn %d's prompt is %d tokens, leaving no room for a note under memory budget %d (with a "
                    "response of %d tokens): it is kept whole", number, len(self._context(k)), self.memory.budget,
                    self.memory.response_tokens)

    def _segment_samples(self, count: int) -> list[tuple[list[int], list[int]]]:
        """One sample per run of answered turns whose prompts share their first turn (a segment between notes):
        the last one's prompt and response, mask 1 on the responses of the run's own turns only (the turns
        before the note that it shows were trained in their own segment)."""
        out = []
        end = 0
        while end < count:
            start, first = end, self._turns[end].first
            while end < count and self._turns[end].first == first:
                end += 1
            ids, mask = list(self._turns[first].head_ids), [0] * len(self._turns[first].head_ids)
            for k in range(first, end):
                if k > first:
                    ids += self._turns[k].delta_ids
                    mask += [0] * len(self._turns[k].delta_ids)
                ids += self._turns[k].response_ids
                mask += [int(k >= start)] * len(self._turns[k].response_ids)
            out.append((ids, mask))
        return out

    def _fit_window(self, k: int) -> None:
        """Choose the first turn of turn k's prompt: with memory, the segment's (after a note, `recent_turns`
        before it); else the `context_turns` window, then while the prompt is longer than `max_len` the
        oldest turn is dropped, down to turn k alone."""
        turn = self._turns[k]
        if self.memory is not None:
            previous = self._turns[k - 1] if k else None
            if previous is None:
                turn.first = 0
            elif previous.memory:  # the first turn after a note
                turn.first = max(0, k - 1 - self.memory.recent_turns)
            else:
                turn.first = previous.first
            return
        window = 0 if self.context_turns is None else max(0, k - self.context_turns)
        turn.first = window
        if self.max_len is None:
            return
        while turn.first < k and len(self._context(k)) > self.max_len:
            turn.first += 1
        turn.dropped = turn.first - window
        if turn.first == k and len(turn.head_ids) > self.max_len:
            log.warning("turn %d's prompt is %d tokens without any earlier turn, over max_len=%d: it is kept whole",
                        k + 1, len(turn.head_ids), self.max_len)

    def _context(self, k: int) -> list[int]:
        """Prompt ids of turn k (0-based): its first turn's head, then (response, delta) pairs up to turn k."""
        first = self._turns[k].first
        ids = list(self._turns[first].head_ids)
        for prev, turn in pairwise(self._turns[first : k + 1]):
            ids += prev.response_ids + turn.delta_ids
        return ids

    def _render(self, messages: list[tuple[str, str]], add_generation_prompt: bool) -> str:
        """The chat template applied to the system prompt followed by (role, content) messages."""
        chat = [{"role": "system", "content": self.system_prompt}] + [{"role": r, "content": c} for r, c in messages]
        return self.tokenizer.apply_chat_template(chat, tools=self.tools, tokenize=False,
                                                  add_generation_prompt=add_generation_prompt)

    def _text_after_response(self, turn: _Turn, next_messages: list[tuple[str, str]] | None,
                             next_prefix: str = "") -> str:
        """Template text between `turn`'s response and the next generation, which starts after `next_prefix`
        (or the end, with no next messages).

        Rendered from a two-turn conversation whose assistant message is a sentinel, so the
        cost per turn is constant. A special token that ends the response (EOS) and also
        starts this text is removed from it, so it is not duplicated.
        """
        messages = [*turn.messages, ("assistant", _SENTINEL), *(next_messages or [])]
        rendered = self._render(messages, add_generation_prompt=next_messages is not None)
        text = rendered[rendered.index(_SENTINEL) + len(_SENTINEL) :]
        if next_messages is not None:
            text += next_prefix
        if turn.response_ids and turn.response_ids[-1] in self._special_ids:
            last = self.tokenizer.decode(turn.response_ids[-1:], skip_special_tokens=False)
            if last and text.startswith(last):
                text = text[len(last) :]
        return text

    def _encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)


def reasoning_span(tokenizer: PreTrainedTokenizerBase, response_ids: list[int]) -> tuple[int, int]:
    """[start, end) of the reasoning tokens inside `response_ids` (`text_span` of `reasoning_bounds`)."""
    return text_span(tokenizer, response_ids, reasoning_bounds)


def note_span(tokenizer: PreTrainedTokenizerBase, response_ids: list[int]) -> tuple[int, int]:
    """[start, end) of a memory note's tokens inside a memory turn's `response_ids` (before `</memory>`)."""
    return text_span(tokenizer, response_ids, note_bounds)


def text_span(
    tokenizer: PreTrainedTokenizerBase, response_ids: list[int], bounds_of: Callable[[str], tuple[int, int] | None],
) -> tuple[int, int]:
    """[start, end) of the tokens of the text region `bounds_of(decoded text)` inside `response_ids`.

    The reasoning (`reasoning_bounds`) is what lies strictly between `<think>` (normally the end of the
    prompt, or repeated at the start of the response) and the first `</think>`, a note the same between
    `<memory>` and `</memory>`; (0, 0) when `bounds_of` finds none. Tokens that touch a tag are excluded,
    so with tokenizers that merge text across a tag boundary the span is the largest run of tokens fully
    inside the region. Whitespace-only tokens at either end are dropped, so the span is empty exactly
    when the stripped text is.

    Positions are found by decoding prefixes (a binary search, O(log n) decodes), which
    works for any tokenizer, byte-level or SentencePiece, with or without single-token tags.
    """
    decode = _raw_decoder(tokenizer)
    text = decode(response_ids)
    bounds = bounds_of(text)
    if bounds is None:
        return (0, 0)
    char_start, char_end = bounds

    def token_at(pos: int) -> int:
        """Index of the token that produces character `pos` of `text` (an ASCII tag character)."""
        lo, hi = 0, len(response_ids) - 1
        while lo < hi:
            mid = (lo + hi) // 2
            prefix = decode(response_ids[: mid + 1])
            # A shorter prefix either stops before `pos` or ends in U+FFFD for a partial character.
            if len(prefix) > pos and prefix[pos] == text[pos]:
                hi = mid
            else:
                lo = mid + 1
        return lo

    start = 0 if char_start == 0 else token_at(char_start - 1) + 1
    end = max(token_at(char_end), start)  # a token spanning both tags leaves nothing between them

    def blank(i: int) -> bool:
        return not decode(response_ids[i : i + 1]).strip()

    while start < end and blank(start):
        start += 1
    while end > start and blank(end - 1):
        end -= 1
    return (start, end)


def _raw_decoder(tokenizer: PreTrainedTokenizerBase) -> Callable[[list[int]], str]:
    """Decode keeping special tokens and spacing exactly as generated.

    Fast tokenizers are called directly: transformers' `decode` adds a Python pass over the
    ids, which dominated the rollout's non-generation time (reasoning_span decodes about
    2 log2(n) prefixes per turn).
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        return lambda ids: backend.decode(ids, skip_special_tokens=False)
    return lambda ids: tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
