"""An OpenAI-compatible endpoint serving the current policy: `POST /v1/chat/completions` and
`POST /v1/responses` (`ragen2.serve.responses`), tools included, streamed or not.

Each agent episode gets a base URL of its own, `http://HOST:PORT/episodes/<id>/v1`, so the calls
an unmodified `openai` client makes are recorded against their episode (the token ids of prompt
and completion and the log-probs, `ragen2.serve.traces`). `/v1` itself serves without recording,
for agents and tools outside a training step (`ragen2 serve`).

While training, the run's sampling settings win over the request's (`rollout.temperature`,
`top_p`, `top_k`; `max_tokens` is capped at `rollout.max_tokens_per_turn`): the recorded
log-probs must be those of the distribution the update assumes. Each call of an episode samples
from its own seeded stream, so an episode's tokens do not depend on which other calls share its batch.
Not supported: `n` > 1 (answered with HTTP 400). `stream` sends the finished reply as server-sent
events (`ragen2.serve.streaming`). `tool_choice` is not enforced: the policy decides whether to
call a tool, as its template presents them. `stop` is not applied, and fields the endpoint does not
read are ignored, so frameworks' requests (docs/agents.md, "Frameworks tested") are served as sent.

No request may hold up the others: a prompt that does not fit the model's context (`Limits`) is
refused with HTTP 400 naming both lengths before it reaches the model, `max_tokens` is clamped to
the room left, and a malformed request (unknown role, malformed tool, a field of the wrong type) is
a 400 naming the field, never a 500 from inside generation.

A call's role (docs/agents.md, "Roles") is its `X-Ragen2-Role` header, else the request's `model`: agents
sharing the policy in one episode say which of them made each call, and `agent.train_roles` picks the
roles that train. The role is recorded with the call; it changes nothing in how the call is served.
"""

from __future__ import annotations

import asyncio
import math
import random
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ragen2.agent.tool_calls import ParsedToolCalls, parse_tool_calls
from ragen2.agent.types import GenerationOutput
from ragen2.serve.batcher import Batcher, Sampling
from ragen2.serve.chat import (RequestError, check_tools, completion_reply, prompt_text, reply_parts,
                               template_messages, token_bytes)
from ragen2.serve.responses import request_messages, request_tools, response_object
from ragen2.serve.streaming import chat_chunks, response_events, sse, text_pieces
from ragen2.serve.traces import Call, Episode


ROLE_HEADER = "X-Ragen2-Role"


@dataclass
class Limits:
    """What a request may ask for, and, while training, the sampling it gets whatever it asks."""

    max_tokens: int  # cap on a completion's tokens
    max_prompt_tokens: int | None = None  # rollout.max_model_len: longer prompts are refused (the prompt alone)
    max_model_len: int | None = None  # prompt + completion: the model's context; longer prompts are refused
    max_model_len_from: str = "max_position_embeddings"  # what set max_model_len, named in refusals
    forced: Sampling | None = None  # training: every call samples with these settings

    @classmethod
    def of(cls, model: PreTrainedModel, max_tokens: int, max_model_len: int | None = None,
           max_prompt_tokens: int | None = None) -> Limits:
        """The limits of serving `model`: its context is its `max_position_embeddings`, or `max_model_len`
        (`ragen2 serve --max-model-len`) when that is given."""
        if max_model_len is not None:
            return cls(max_tokens, max_prompt_tokens, max_model_len, "--max-model-len")
        return cls(max_tokens, max_prompt_tokens, getattr(model.config, "max_position_embeddings", None))


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _integer(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


# The request fields the endpoint reads, each with its test and the words a refusal says. A value of another type
# is refused here rather than failing later inside generation, where it would be a 500 (or, while training, stop
# the run). FIELDS are read on both routes, CHAT_FIELDS and RESPONSES_FIELDS add each route's own.
FIELDS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "model": (lambda v: isinstance(v, str), "use a string (the served model's id, or a role)"),
    "stream": (lambda v: isinstance(v, bool), "use true or false"),
    "temperature": (lambda v: _number(v) and v >= 0, "use a number >= 0"),
    "top_p": (lambda v: _number(v) and 0 < v <= 1, "use a number in (0, 1]"),
    "seed": (lambda v: _integer(v) and -(2**63) <= v < 2**63, "use a 64-bit integer"),
    "return_token_ids": (lambda v: isinstance(v, bool), "use true or false"),
}
CHAT_FIELDS = FIELDS | {
    "n": (lambda v: _integer(v) and v == 1, "one completion per request (n=1)"),
    "max_tokens": (lambda v: _integer(v) and v >= 1, "use an integer >= 1"),
    "max_completion_tokens": (lambda v: _integer(v) and v >= 1, "use an integer >= 1"),
    "logprobs": (lambda v: isinstance(v, bool), "use true or false"),
    "stream_options": (lambda v: isinstance(v, dict) and isinstance(v.get("include_usage", False), bool),
                       'use {"include_usage": true or false}'),
}
# Nothing is stored (a request carries its whole conversation), so the fields that point at stored state are
# refused and `store` is accepted and ignored.
STATELESS = "this endpoint stores no responses or conversations: send the whole conversation as `input`"
RESPONSES_FIELDS = FIELDS | {
    "max_output_tokens": (lambda v: _integer(v) and v >= 1, "use an integer >= 1"),
    "instructions": (lambda v: isinstance(v, str), "use a string"),
    "store": (lambda v: isinstance(v, bool), "use true or false"),
    "previous_response_id": (lambda v: False, STATELESS),
    "conversation": (lambda v: False, STATELESS),
}


def check_fields(body: Any, fields: dict[str, tuple[Callable[[Any], bool], str]], what: str) -> dict[str, Any]:
    """`body`, refused (RequestError) unless it is a JSON object (`what`) whose `fields` pass their tests."""
    if not isinstance(body, dict):
        raise RequestError(f"the request body must be a JSON object: {what}")
    for name, (ok, need) in fields.items():
        value = body.get(name)
        if value is not None and not ok(value):
            raise RequestError(f"{name}={value!r:.60} is not allowed: {need}")
    return body


@dataclass
class Served:
    """One call as it was served (and, in an episode, recorded)."""

    prompt: list[int]
    out: GenerationOutput
    parsed: ParsedToolCalls
    sampling: Sampling


class ChatService:
    """The endpoint's logic, without HTTP: check, render, generate through the batcher, record, reply. Both routes
    (chat completions, Responses) turn their request into chat messages and tools and `serve` them, so a call is
    limited, sampled, recorded and trained the same way whichever route it came by."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, batcher: Batcher, limits: Limits,
                 model_name: str = "policy"):
        self.tokenizer = tokenizer
        self.batcher = batcher
        self.limits = limits
        self.model_name = model_name
        self.episodes: dict[str, Episode] = {}
        self.backend_errors: list[BaseException] = []  # generation failures (not the client's fault)
        self._rng = random.Random()
        self._token_bytes = token_bytes(tokenizer)

    async def complete(self, body: Any, episode_id: str | None,
                       role: str | None = None) -> dict[str, Any] | Iterator[str]:
        """`POST /v1/chat/completions`: a `chat.completion`, or with `stream` its chunks as server-sent events."""
        body = check_fields(body, CHAT_FIELDS, "a chat completion request")
        asked = body.get("max_completion_tokens") or body.get("max_tokens")
        served = await self.serve(body.get("messages"), check_tools(body.get("tools")), asked, body, episode_id,
                                  role)
        texts = None
        if body.get("logprobs"):
            texts = [self.tokenizer.decode([t], skip_special_tokens=False) for t in served.out.token_ids]
        reply = completion_reply(served.out, served.parsed, self.model_name, served.prompt, texts,
                                 bool(body.get("return_token_ids")))
        if not body.get("stream"):
            return reply
        usage = bool((body.get("stream_options") or {}).get("include_usage"))
        return sse(chat_chunks(reply, await self._pieces(served), usage), done=True)

    async def respond(self, body: Any, episode_id: str | None,
                      role: str | None = None) -> dict[str, Any] | Iterator[str]:
        """`POST /v1/responses`: a `response`, or with `stream` its typed events as server-sent events."""
        body = check_fields(body, RESPONSES_FIELDS, "a Responses API request")
        messages, tools = request_messages(body), request_tools(body.get("tools"))
        served = await self.serve(messages, tools, body.get("max_output_tokens"), body, episode_id, role)
        response = response_object(served.out, served.parsed, self.model_name, served.prompt, body, served.sampling,
                                   bool(body.get("return_token_ids")))
        if not body.get("stream"):
            return response
        return sse(response_events(response, await self._pieces(served)), done=False)

    async def serve(self, messages: Any, tools: list[dict[str, Any]] | None, max_tokens: int | None,
                    body: dict[str, Any], episode_id: str | None, role: str | None = None) -> Served:
        """Render `messages` and `tools`, generate (sampling as `body` asks, within the limits; the run's while
        training) and record the call in its episode, as `role` (the header's), else as `body`'s model."""
        episode = None
        if episode_id is not None:
            episode = self.episodes.get(episode_id)
            if episode is None:
                raise RequestError(f"no episode {episode_id!r} is running on this endpoint")
        # Rendering and tokenizing a long prompt takes a while: on a thread, while the event loop serves the others.
        prompt = await asyncio.to_thread(self._prompt, messages, tools)
        sampling = self._sampling(max_tokens, body, len(prompt))
        index = None if episode is None else episode.next_call()
        if episode is not None and index is None:
            raise RequestError(f"episode {episode_id} has made its rollout.max_turns={episode.max_calls} calls: "
                               "it is truncated there")
        seed = episode.seed_of(index) if episode is not None else None
        if seed is None:
            seed = body["seed"] if body.get("seed") is not None else self._rng.getrandbits(63)
        try:
            out = await asyncio.wrap_future(self.batcher.submit(prompt, sampling, seed))
        except Exception as e:
            self.backend_errors.append(e)
            raise
        parsed = parse_tool_calls(out.text)
        if episode is not None:
            last = template_messages(messages)[-1]["content"]
            episode.record(Call(prompt, list(out.token_ids), list(out.logprobs or []), out.text, out.finish_reason,
                                parsed, last, role or body.get("model")))
        return Served(prompt, out, parsed, sampling)

    async def _pieces(self, served: Served) -> list[tuple[str, int]]:
        """The reply's text in streaming pieces (a long completion takes a while to decode token by token: on a
        thread, as rendering is)."""
        text = reply_parts(served.out, served.parsed)[0]
        return await asyncio.to_thread(text_pieces, self.tokenizer, served.out, text or "")

    def _prompt(self, messages: Any, tools: Any) -> list[int]:
        """The prompt's token ids, refused when over the limits. A text too long to fit is refused before it is
        tokenized: tokenizing megabytes takes seconds and a gigabyte (3 million tokens: 5 s and +1 GB)."""
        text = prompt_text(self.tokenizer, messages, tools)
        self._check_length(len(text.encode()) // self._token_bytes, exact=False)
        prompt = self.tokenizer.encode(text, add_special_tokens=False)
        self._check_length(len(prompt), exact=True)
        return prompt

    def _check_length(self, tokens: int, exact: bool) -> None:
        """Refuse a prompt of `tokens` tokens (`exact`, or at least that many) over the limits, before it reaches
        the model: one prompt far beyond the context holds every other request up for minutes."""
        count = str(tokens) if exact else f"at least {tokens}"
        cap = self.limits.max_prompt_tokens
        if cap is not None and tokens > cap:
            raise RequestError(f"the prompt has {count} tokens, over rollout.max_model_len={cap}: "
                               "send a shorter conversation")
        context = self.limits.max_model_len
        if context is not None and tokens >= context:
            raise RequestError(f"This model's maximum context length is {context} tokens "
                               f"({self.limits.max_model_len_from}), but the prompt has {count} tokens, which leaves "
                               "no room for a completion: send a shorter conversation")

    def _sampling(self, asked: int | None, body: dict[str, Any], prompt_tokens: int) -> Sampling:
        """The request's sampling (the run's while training). The `asked` tokens are clamped, never refused: to the
        cap, and to the context the prompt leaves, so a conversation near the limit still gets an answer (cut,
        "length")."""
        max_tokens = min(asked or self.limits.max_tokens, self.limits.max_tokens)
        if self.limits.max_model_len is not None:
            max_tokens = min(max_tokens, self.limits.max_model_len - prompt_tokens)
        if self.limits.forced is not None:
            f = self.limits.forced
            return Sampling(max_tokens, f.temperature, f.top_p, f.top_k)
        temperature, top_p = body.get("temperature"), body.get("top_p")
        return Sampling(max_tokens, 1.0 if temperature is None else float(temperature),
                        1.0 if top_p is None else float(top_p))


def create_app(service: ChatService) -> FastAPI:
    """The HTTP routes over `service`: each API at `/v1` (nothing recorded) and at an episode's `/episodes/<id>/v1`."""
    app = FastAPI(title="ragen2 policy endpoint")

    async def answer(request: Request, serve: Callable[..., Any], episode_id: str | None) -> Response:
        try:
            body = await request.json()
        except ValueError:
            return _error(400, "the request body is not JSON")
        try:
            reply = await serve(body, episode_id, request.headers.get(ROLE_HEADER) or None)
        except RequestError as e:
            return _error(400, str(e))
        except Exception as e:  # generation failed: the trainer re-raises it (ChatService.backend_errors)
            return _error(500, f"generation failed: {type(e).__name__}: {e}")
        if isinstance(reply, dict):
            return JSONResponse(reply)
        return StreamingResponse(reply, media_type="text/event-stream")

    def add(path: str, serve: Callable[..., Any]) -> None:
        async def plain(request: Request) -> Response:
            return await answer(request, serve, None)

        async def episode(episode_id: str, request: Request) -> Response:
            return await answer(request, serve, episode_id)

        app.post(f"/v1/{path}")(plain)
        app.post(f"/episodes/{{episode_id}}/v1/{path}")(episode)

    add("chat/completions", service.complete)
    add("responses", service.respond)

    @app.get("/v1/models")
    @app.get("/episodes/{episode_id}/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": service.model_name, "object": "model", "owned_by": "ragen2"}]}

    return app


def _error(status: int, message: str) -> JSONResponse:
    """OpenAI's error shape, which the `openai` client turns into BadRequestError and the like."""
    return JSONResponse({"error": {"message": message, "type": "invalid_request_error", "code": status}}, status)


def serve_policy(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, model_name: str | None,
                 host: str = "127.0.0.1", port: int = 8000, max_tokens: int = 1024,
                 batch_wait_s: float = 0.05, max_model_len: int | None = None) -> Endpoint:
    """An endpoint serving a loaded policy (`ragen2 serve`, which loads it: the models sit above the serving layer):
    sampling as each request asks, nothing recorded; `model_name` is the id its replies give. `max_model_len`
    replaces the model's context length (`Limits.of`)."""
    from ragen2.agent.backends import HFBackend

    batcher = Batcher(HFBackend(model, tokenizer, stop_strings=()), batch_wait_s)
    limits = Limits.of(model, max_tokens, max_model_len)
    return Endpoint(ChatService(tokenizer, batcher, limits, model_name=model_name), host, port)


SHUTDOWN_GRACE_S = 5  # seconds in-flight requests get to finish when the endpoint closes


class Endpoint:
    """`create_app(service)` served by uvicorn on a background thread; `url` is its base URL.

    Port 0 takes any free port. Use as a context manager, or call `close()`.
    """

    def __init__(self, service: ChatService, host: str = "127.0.0.1", port: int = 0):
        self.service = service
        self._socket = socket.create_server((host, port))
        self.host, self.port = self._socket.getsockname()[:2]
        # A bounded graceful shutdown: Ctrl-C on `ragen2 serve` or the end of a run must not wait on a client
        # that keeps its connection or request open.
        config = uvicorn.Config(create_app(service), log_level="warning", access_log=False, lifespan="off",
                                timeout_graceful_shutdown=SHUTDOWN_GRACE_S)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._socket]},
                                        name="ragen2-endpoint", daemon=True)
        self._thread.start()
        while not self._server.started:
            if not self._thread.is_alive():
                raise RuntimeError(f"the endpoint did not start on {self.host}:{self.port}")
            time.sleep(0.01)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def episode_url(self, episode_id: str) -> str:
        """The base URL to give an episode's client."""
        return f"{self.url}/episodes/{episode_id}/v1"

    def close(self) -> None:
        self._server.should_exit = True
        self._thread.join()
        self._socket.close()

    def wait(self) -> None:
        """Block until the server stops (Ctrl-C raises KeyboardInterrupt here)."""
        while self._thread.is_alive():
            self._thread.join(0.5)

    def __enter__(self) -> Endpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
