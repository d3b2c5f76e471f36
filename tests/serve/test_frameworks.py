"""Agent frameworks nobody here wrote train through the endpoint on loopback: the OpenAI Agents SDK (its default
Responses model and its chat completions one, streamed and not), smolagents and LangGraph over langchain-openai
(tests/serve/framework_agents.py), each 2 steps with the tiny tool policy through `agent.entrypoint`.

Frameworks send fields of their own (`include`, `store`, `parallel_tool_calls`, `stop`, `tool_choice`, ...):
every HTTP answer the endpoint gave is recorded, and a test fails on any 4xx or 5xx, whatever the framework
made of it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

for package in ("agents", "smolagents", "langgraph", "langchain_openai"):
    pytest.importorskip(package, reason="the agent-frameworks extra is not installed: run `make` (it installs it)")

import framework_agents  # noqa: E402
from agents import function_tool  # noqa: E402
from agents.models.chatcmpl_converter import Converter  # noqa: E402
from langchain_core.tools import tool as langchain_tool  # noqa: E402
from langchain_core.utils.function_calling import convert_to_openai_tool  # noqa: E402
from lookup_policy import conversations, fit_policy  # noqa: E402
from smolagents import FinalAnswerTool  # noqa: E402
from smolagents import tool as smolagents_tool  # noqa: E402
from smolagents.models import get_tool_json_schema  # noqa: E402

from ragen2.rl.trainer import train  # noqa: E402
from test_agent_training import agent_config  # noqa: E402

AGENTS = Path(__file__).parent / "framework_agents.py"


@pytest.fixture(scope="session")
def framework_policy(tool_tokenizer, tmp_path_factory) -> Path:
    """The tool policy's two calls learnt with `lookup` declared as each framework declares it (the schema of the
    function, a title, `strict`, smolagents' final_answer tool): the tiny policy calls a tool it has seen, so the
    tool results go back and every framework's whole round trip is served."""
    sdk_tool = Converter.tool_to_openai(function_tool(framework_agents.lookup))
    declared = [
        [sdk_tool],  # Agents SDK, chat completions
        [{"type": "function", "function": {k: v for k, v in sdk_tool["function"].items() if k != "strict"}}],  # Responses
        [convert_to_openai_tool(langchain_tool(framework_agents.lookup))],
        [get_tool_json_schema(t) for t in (smolagents_tool(framework_agents.lookup), FinalAnswerTool())],
    ]
    first_calls = [pair for tools in declared for pair in conversations(tool_tokenizer, tools)[::3]]
    pairs = conversations(tool_tokenizer) + first_calls
    return fit_policy(tool_tokenizer, pairs, tmp_path_factory.mktemp("framework_policy"))


@pytest.mark.parametrize("function", [
    "agents_sdk_responses", "agents_sdk_responses_streamed", "agents_sdk_chat", "agents_sdk_chat_streamed",
    "smolagents_tool_calling", "langgraph_react",
])
def test_a_framework_agent_trains_through_the_endpoint(function, answers, framework_policy, tmp_path, monkeypatch,
                                                       one_thread):
    monkeypatch.setenv("OPENAI_API_KEY", "not-used")  # a framework that builds a client of its own finds a key
    train(agent_config(tmp_path, framework_policy, function, f"agent.entrypoint={AGENTS}:{function}",
                       "trainer.total_steps=2", "logging.sample_every=1", "logging.sample_trajectories=8",
                       "collapse.enable=false", "filter.strategy=none", "filter.include_zero=true"))
    errors = [a for a in answers if a[2] >= 400]
    assert answers and not errors, f"the endpoint answered with HTTP errors: {errors}"
    run = tmp_path / "run"
    steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in steps] == [1, 2]
    assert [m["rollout/error_rate"] for m in steps] == [0.0, 0.0]
    assert all(any(key.startswith("train/") for key in m) for m in steps)  # both steps updated the policy
    records = [json.loads(line) for step in (1, 2)
               for line in (run / "rollouts" / f"train_step_{step}.jsonl").read_text().splitlines()]
    assert len(records) == sum(method == "POST" for method, _, _ in answers)  # every call served was recorded
    assert any(r["turn"] > 0 for r in records)  # the framework ran the tool and sent its result back
