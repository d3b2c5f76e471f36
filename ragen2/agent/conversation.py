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

from ragen2.agent.parsing import ResponseFormat, reasoning_bounds

log = logging.getLogger(__name__)

# Stand-in for an assistant message when rendering the template: whatever the template
# prints after it is the environment text that follows a response.
_SENTINEL = "\u27e6ragen2-response\u27e7"


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

    Usage per turn: `add_observation`, `prompt_ids` (generate from it), `add_response`.
    """

    def __init__(
        self, tokenizer: PreTrainedTokenizerBase, system_prompt: str, context_turns: int | None = None,
        fmt: ResponseFormat = ResponseFormat(), max_len: int | None = None, tools: list[dict] | None = None,
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
        self.tools = list(tools) if tools else None
        self.tokenizer = tokenizer
        self.fmt = fmt
        self.system_prompt = fmt.instruction(system_prompt)
        self.context_turns = context_turns
        self.max_len = max_len
        self._special_ids = frozenset(tokenizer.all_special_ids)
        self._turns: list[_Turn] = []

    # ---- building ----------------------------------------------------------------------

    def add_observation(self, observation: str, actions_left: int, tool_results: list[str] | None = None) -> None:
        """Start the next turn with the environment's state text, or with `tool_results` (one `tool` message
        each, answering the previous turn's tool calls)."""
        if self._turns and self._turns[-1].response_ids is None:
            raise RuntimeError("add_observation() called twice without add_response() in between")
        if tool_results and not self._turns:
            raise RuntimeError("tool results answer an earlier turn's tool calls: the first turn needs an observation")
        messages = ([("tool", r) for r in tool_results] if tool_results
                    else [("user", user_message(len(self._turns) + 1, observation, actions_left))])
        # The head is needed for the first turn, and for every turn when the window can move.
        head = None
        if not self._turns or self.context_turns is not None or self.max_len is not None:
            head = self._encode(self._render(messages, add_generation_prompt=True) + self.fmt.prefix)
        delta = None
        if self._turns and self.context_turns != 0:
            delta = self._encode(self._text_after_response(self._turns[-1], next_messages=messages))
        self._turns.append(_Turn(messages=messages, head_ids=head, delta_ids=delta))
        self._fit_window(len(self._turns) - 1)

    def prompt_ids(self) -> list[int]:
        """Context for the current turn; ends with the assistant generation prefix and `fmt.prefix`."""
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

    def _fit_window(self, k: int) -> None:
        """Choose the first turn of turn k's prompt: the `context_turns` window, then while the
        prompt is longer than `max_len` the oldest turn is dropped, down to turn k alone."""
        turn = self._turns[k]
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

    def _text_after_response(self, turn: _Turn, next_messages: list[tuple[str, str]] | None) -> str:
        """Template text between `turn`'s response and the next generation (or the end).

        Rendered from a two-turn conversation whose assistant message is a sentinel, so the
        cost per turn is constant. A special token that ends the response (EOS) and also
        starts this text is removed from it, so it is not duplicated.
        """
        messages = [*turn.messages, ("assistant", _SENTINEL), *(next_messages or [])]
        rendered = self._render(messages, add_generation_prompt=next_messages is not None)
        text = rendered[rendered.index(_SENTINEL) + len(_SENTINEL) :]
        if next_messages is not None:
            text += self.fmt.prefix
        if turn.response_ids and turn.response_ids[-1] in self._special_ids:
            last = self.tokenizer.decode(turn.response_ids[-1:], skip_special_tokens=False)
            if last and text.startswith(last):
                text = text[len(last) :]
        return text

    def _encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)


def reasoning_span(tokenizer: PreTrainedTokenizerBase, response_ids: list[int]) -> tuple[int, int]:
    """[start, end) of the reasoning tokens inside `response_ids`.

    The reasoning is what lies strictly between `<think>` (normally the end of the prompt,
    or repeated at the start of the response) and the first `</think>`; (0, 0) when there
    is no `</think>`. Tokens that touch a tag are excluded, so with tokenizers that merge
    text across a tag boundary the span is the largest run of tokens fully inside the
    reasoning. Whitespace-only tokens at either end are dropped, so the span is empty
    exactly when the stripped reasoning text is.

    Positions are found by decoding prefixes (a binary search, O(log n) decodes), which
    works for any tokenizer, byte-level or SentencePiece, with or without single-token tags.
    """
    decode = _raw_decoder(tokenizer)
    text = decode(response_ids)
    bounds = reasoning_bounds(text)
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
