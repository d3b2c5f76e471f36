"""A finished reply sent as server-sent events, in the pieces and events the `openai` client reassembles.

The batcher generates whole batches, so a reply is complete before its first piece is sent; it is
then streamed as a server streaming during generation would stream it, its text cut where its
tokens end. The stream is made from the reply object the non-streamed call returns, so both carry
the same text, tool calls and token ids, which are the ones recorded for training.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from itertools import count
from typing import Any

from transformers import PreTrainedTokenizerBase

from ragen2.agent.types import GenerationOutput


# Tokens decoded before a new one to find its text: decoders join neighbouring tokens (spaces, bytes of a character).
CONTEXT_TOKENS = 4


def text_pieces(tokenizer: PreTrainedTokenizerBase, out: GenerationOutput, text: str) -> list[tuple[str, int]]:
    """`text` as (piece, tokens) pairs whose pieces join to `text` and whose token counts sum to the completion's.

    When `text` is the whole completion, it is cut after each token whose text is known (decoded after a few
    tokens of context, and matching `text` there; a token ending inside a character waits for the next), in time
    linear in its length; a reply's text around tool calls is one piece.
    """
    ids = out.token_ids
    if text != out.text:
        return [(text, len(ids))]
    pieces, sent, used = [], 0, 0
    for n in range(1, len(ids) + 1):
        start = max(0, used - CONTEXT_TOKENS)
        head, grown = tokenizer.batch_decode([ids[start:used], ids[start:n]], skip_special_tokens=True)
        piece = grown[len(head):]
        if piece and grown.startswith(head) and text.startswith(piece, sent):
            pieces.append((piece, n - used))
            sent, used = sent + len(piece), n
    if used < len(ids) or sent < len(text):  # tokens that decode to nothing (end of turn), or a tail not matched
        pieces.append((text[sent:], len(ids) - used))
    return pieces


def chat_chunks(reply: dict[str, Any], pieces: list[tuple[str, int]], include_usage: bool) -> Iterator[dict[str, Any]]:
    """The `chat.completion.chunk`s of a `chat.completion`: the role, the content piece by piece (each with its
    tokens' `logprobs` and `token_ids` when the reply has them), the tool calls, the finish reason, and with
    `include_usage` a last chunk with the usage and no choices (the others carry `usage: null`)."""
    choice, message = reply["choices"][0], reply["choices"][0]["message"]
    head = {"id": reply["id"], "object": "chat.completion.chunk", "created": reply["created"], "model": reply["model"]}
    if include_usage:
        head["usage"] = None

    def chunk(delta: dict[str, Any], finish: str | None = None, **fields: Any) -> dict[str, Any]:
        return {**head, "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None,
                                     **fields}]}

    first = chunk({"role": "assistant", "content": None if message["content"] is None else ""})
    if "prompt_token_ids" in reply:
        first["prompt_token_ids"] = reply["prompt_token_ids"]
    yield first
    logprobs, ids, start = choice["logprobs"], choice.get("token_ids"), 0
    for text, n in pieces:
        fields: dict[str, Any] = {}
        if logprobs is not None:
            fields["logprobs"] = {"content": logprobs["content"][start: start + n]}
        if ids is not None:
            fields["token_ids"] = ids[start: start + n]
        start += n
        yield chunk({"content": text} if text else {}, **fields)
    for index, call in enumerate(message.get("tool_calls") or []):
        yield chunk({"tool_calls": [{"index": index, **call}]})
    yield chunk({}, choice["finish_reason"])
    if include_usage:
        yield {**head, "choices": [], "usage": reply["usage"]}


def response_events(response: dict[str, Any], pieces: list[tuple[str, int]]) -> Iterator[dict[str, Any]]:
    """The typed events of a `response`, in the order the client's stream state requires: created, in progress,
    each output item added, its content (text deltas, or the call's arguments) and done, then `response.completed`
    with the whole response (also for one cut at `max_output_tokens`: clients wait for `response.completed`)."""
    numbers = count()

    def event(kind: str, **fields: Any) -> dict[str, Any]:
        return {"type": kind, "sequence_number": next(numbers), **fields}

    started = {**response, "status": "in_progress", "output": [], "usage": None, "incomplete_details": None}
    yield event("response.created", response=started)
    yield event("response.in_progress", response=started)
    for index, item in enumerate(response["output"]):
        where = {"item_id": item["id"], "output_index": index}
        if item["type"] == "message":
            yield event("response.output_item.added", output_index=index,
                        item={**item, "status": "in_progress", "content": []})
            part = item["content"][0]
            yield event("response.content_part.added", **where, content_index=0, part={**part, "text": ""})
            for text, _ in pieces:
                if text:
                    yield event("response.output_text.delta", **where, content_index=0, delta=text, logprobs=[])
            yield event("response.output_text.done", **where, content_index=0, text=part["text"], logprobs=[])
            yield event("response.content_part.done", **where, content_index=0, part=part)
        else:
            yield event("response.output_item.added", output_index=index,
                        item={**item, "status": "in_progress", "arguments": ""})
            yield event("response.function_call_arguments.delta", **where, delta=item["arguments"])
            yield event("response.function_call_arguments.done", **where, arguments=item["arguments"])
        yield event("response.output_item.done", output_index=index, item=item)
    yield event("response.completed", response=response)


def sse(events: Iterable[dict[str, Any]], done: bool) -> Iterator[str]:
    """Server-sent events: `event: TYPE` and `data: JSON` for typed events (Responses), `data: JSON` alone for
    chunks (chat), and `data: [DONE]` after the last when `done` (chat's end of stream)."""
    for payload in events:
        kind = payload.get("type")
        yield (f"event: {kind}\n" if kind else "") + f"data: {json.dumps(payload)}\n\n"
    if done:
        yield "data: [DONE]\n\n"
