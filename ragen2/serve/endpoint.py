"""An OpenAI-compatible endpoint serving the current policy: `POST /v1/chat/completions`, tools included.

Each agent episode gets a base URL of its own, `http://HOST:PORT/episodes/<id>/v1`, so the calls
an unmodified `openai` client makes are recorded against their episode (the token ids of prompt
and completion and the log-probs, `ragen2.serve.traces`). `/v1` itself serves without recording,
for agents and tools outside a training step (`ragen2 serve`).

While training, the run's sampling settings win over the request's (`rollout.temperature`,
`top_p`, `top_k`; `max_tokens` is capped at `rollout.max_tokens_per_turn`): the recorded
log-probs must be those of the distribution the update assumes. Each call of an episode samples
from its own seeded stream, so an episode's tokens do not depend on which other calls share its batch.
Not supported: `n` > 1 and streaming (answered with HTTP 400). `tool_choice` is not enforced: the
policy decides whether to call a tool, as its template presents them.
"""

from __future__ import annotations

import asyncio
import random
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ragen2.agent.tool_calls import parse_tool_calls
from ragen2.serve.batcher import Batcher, Sampling
from ragen2.serve.chat import RequestError, completion_reply, prompt_ids, template_messages
from ragen2.serve.traces import Call, Episode


@dataclass
class Limits:
    """What a request may ask for, and, while training, the sampling it gets whatever it asks."""

    max_tokens: int  # cap on a completion's tokens
    max_prompt_tokens: int | None = None  # rollout.max_model_len: longer prompts are refused
    forced: Sampling | None = None  # training: every call samples with these settings


class ChatService:
    """The endpoint's logic, without HTTP: render, generate through the batcher, record, reply."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, batcher: Batcher, limits: Limits,
                 model_name: str = "policy"):
        self.tokenizer = tokenizer
        self.batcher = batcher
        self.limits = limits
        self.model_name = model_name
        self.episodes: dict[str, Episode] = {}
        self.backend_errors: list[BaseException] = []  # generation failures (not the client's fault)
        self._rng = random.Random()

    async def complete(self, body: dict[str, Any], episode_id: str | None) -> dict[str, Any]:
        episode = None
        if episode_id is not None:
            episode = self.episodes.get(episode_id)
            if episode is None:
                raise RequestError(f"no episode {episode_id!r} is running on this endpoint")
        if body.get("stream"):
            raise RequestError("streaming is not supported: leave `stream` unset")
        if body.get("n", 1) != 1:
            raise RequestError(f"n={body.get('n')} is not supported: one completion per request")
        messages, tools = body.get("messages"), body.get("tools")
        prompt = prompt_ids(self.tokenizer, messages, tools)
        if self.limits.max_prompt_tokens is not None and len(prompt) > self.limits.max_prompt_tokens:
            raise RequestError(f"the prompt is {len(prompt)} tokens, over rollout.max_model_len="
                               f"{self.limits.max_prompt_tokens}: send a shorter conversation")
        sampling = self._sampling(body)
        index = None if episode is None else episode.next_call()
        if episode is not None and index is None:
            raise RequestError(f"episode {episode_id} has made its rollout.max_turns={episode.max_calls} calls: "
                               "it is truncated there")
        seed = episode.seed_of(index) if episode is not None else None
        if seed is None:
            seed = int(body["seed"]) if body.get("seed") is not None else self._rng.getrandbits(63)
        try:
            out = await asyncio.wrap_future(self.batcher.submit(prompt, sampling, seed))
        except Exception as e:
            self.backend_errors.append(e)
            raise
        parsed = parse_tool_calls(out.text)
        if episode is not None:
            last = template_messages(messages)[-1]["content"]
            episode.record(Call(prompt, list(out.token_ids), list(out.logprobs or []), out.text, out.finish_reason,
                                parsed, last))
        texts = None
        if body.get("logprobs"):
            texts = [self.tokenizer.decode([t], skip_special_tokens=False) for t in out.token_ids]
        return completion_reply(out, parsed, self.model_name, prompt, texts, bool(body.get("return_token_ids")))

    def _sampling(self, body: dict[str, Any]) -> Sampling:
        asked = body.get("max_completion_tokens") or body.get("max_tokens") or self.limits.max_tokens
        if not isinstance(asked, int) or asked < 1:
            raise RequestError(f"max_tokens={asked!r} is not allowed: use an integer >= 1")
        max_tokens = min(asked, self.limits.max_tokens)
        if self.limits.forced is not None:
            f = self.limits.forced
            return Sampling(max_tokens, f.temperature, f.top_p, f.top_k)
        temperature, top_p = body.get("temperature", 1.0), body.get("top_p", 1.0)
        if not (isinstance(temperature, (int, float)) and temperature >= 0 and isinstance(top_p, (int, float))
                and 0 < top_p <= 1):
            raise RequestError(f"temperature={temperature!r}, top_p={top_p!r}: "
                               "need temperature >= 0 and 0 < top_p <= 1")
        return Sampling(max_tokens, float(temperature), float(top_p))


def create_app(service: ChatService) -> FastAPI:
    """The HTTP routes over `service`."""
    app = FastAPI(title="ragen2 policy endpoint")

    async def answer(request: Request, episode_id: str | None) -> JSONResponse:
        try:
            body = await request.json()
        except ValueError:
            return _error(400, "the request body is not JSON")
        try:
            return JSONResponse(await service.complete(body, episode_id))
        except RequestError as e:
            return _error(400, str(e))
        except Exception as e:  # generation failed: the trainer re-raises it (ChatService.backend_errors)
            return _error(500, f"generation failed: {type(e).__name__}: {e}")

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> JSONResponse:
        return await answer(request, None)

    @app.post("/episodes/{episode_id}/v1/chat/completions")
    async def episode_chat(episode_id: str, request: Request) -> JSONResponse:
        return await answer(request, episode_id)

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
                 batch_wait_s: float = 0.05) -> Endpoint:
    """An endpoint serving a loaded policy (`ragen2 serve`, which loads it: the models sit above the serving layer):
    sampling as each request asks, nothing recorded; `model_name` is the id its replies give."""
    from ragen2.agent.backends import HFBackend

    batcher = Batcher(HFBackend(model, tokenizer, stop_strings=()), batch_wait_s)
    return Endpoint(ChatService(tokenizer, batcher, Limits(max_tokens), model_name=model_name), host, port)


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
