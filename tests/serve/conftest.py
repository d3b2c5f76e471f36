"""A tiny policy that calls tools in Qwen2.5's format, fine-tuned in seconds for the endpoint tests, the endpoint
serving it on loopback, and a record of every HTTP answer the endpoints give (`answers`)."""

from __future__ import annotations

import json
from pathlib import Path

import lookup_agent
import openai
import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer

from chat_templates import QWEN25_TOOLS
from lookup_policy import ANSWERS, TOOL_CALL, conversations, fit_policy
from ragen2.agent.backends import HFBackend
from ragen2.models.tiny import build_tokenizer
from ragen2.serve.batcher import Batcher
import ragen2.serve.endpoint as endpoint_module
from ragen2.serve.endpoint import ChatService, Endpoint, Limits


@pytest.fixture(scope="session")
def tool_tokenizer():
    corpus = [TOOL_CALL, *ANSWERS, json.dumps(lookup_agent.TOOLS), "Question 0: what is the value of a?",
              "<tool_response>\n7\n</tool_response>", "# Tools You may call one or more functions"] * 10
    tokenizer = build_tokenizer(corpus, vocab_size=400)
    tokenizer.chat_template = QWEN25_TOOLS
    return tokenizer


@pytest.fixture(scope="session")
def tool_policy(tool_tokenizer, tmp_path_factory) -> Path:
    """A directory holding a tiny Qwen2 policy that calls `lookup` first, then answers."""
    return fit_policy(tool_tokenizer, conversations(tool_tokenizer), tmp_path_factory.mktemp("tool_policy"))


@pytest.fixture
def served(tool_policy, one_thread):
    """The tool policy behind a real endpoint on loopback (max 48 tokens a completion, its 4096-token context):
    (endpoint, service, tokenizer)."""
    model = AutoModelForCausalLM.from_pretrained(tool_policy)
    tokenizer = AutoTokenizer.from_pretrained(tool_policy)
    batcher = Batcher(HFBackend(model, tokenizer, stop_strings=()), wait_s=0.2)
    service = ChatService(tokenizer, batcher, Limits.of(model, max_tokens=48))
    with Endpoint(service) as endpoint:
        yield endpoint, service, tokenizer
    batcher.close()


@pytest.fixture
def client(served):
    """An `openai.OpenAI` on the served endpoint's `/v1` that records the HTTP status of every answer: the test
    fails if any was an error, so a good request answered with a 4xx or 5xx cannot pass unseen."""
    endpoint = served[0]
    statuses: list[int] = []
    http = openai.DefaultHttpxClient(event_hooks={"response": [lambda r: statuses.append(r.status_code)]})
    client = openai.OpenAI(base_url=f"{endpoint.url}/v1", api_key="x", max_retries=0, timeout=60, http_client=http)
    yield client
    client.close()
    assert statuses and all(status < 400 for status in statuses), f"HTTP statuses: {statuses}"


@pytest.fixture
def answers(monkeypatch) -> list[tuple[str, str, int]]:
    """(method, path, status) of every HTTP answer of the endpoints started while the test runs."""
    seen: list[tuple[str, str, int]] = []
    create_app = endpoint_module.create_app

    def recording_app(service):
        app = create_app(service)

        @app.middleware("http")
        async def record(request, call_next):
            response = await call_next(request)
            seen.append((request.method, request.url.path, response.status_code))
            return response

        return app

    monkeypatch.setattr(endpoint_module, "create_app", recording_app)
    return seen
