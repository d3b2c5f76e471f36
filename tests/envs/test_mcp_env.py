"""MCP tools as an environment: real MCP servers (the built-in calculator, and a glossary written for these
tests with the `mcp` package) started over stdio, checked, played through tool calls and trained on."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from chat_templates import QWEN25_TOOLS
from env_checks import check_docstring
from ragen2 import envs
from ragen2.agent.rollout import conversation
from ragen2.agent.tool_calls import ToolCall, render_tool_calls
from ragen2.config import RolloutConfig, load_config
from ragen2.envs.check import check_env
from ragen2.errors import ConfigError
from ragen2.rl.trainer import train

GLOSSARY = [sys.executable, str(Path(__file__).parent / "mcp_glossary.py")]


@pytest.fixture
def glossary_env(tmp_path):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("\n".join(json.dumps({"prompt": f"What is a {w}?", "answer": w_def, "solution": [
        f'define {{"word": "{w}"}}', f'finish {{"answer": "{w_def}"}}']})
        for w, w_def in [("lumen", "luminous flux"), ("parsec", "distance")]))
    checker = f"{Path(__file__).parent / 'mcp_glossary.py'}:contains"
    return envs.make("mcp:glossary", command=GLOSSARY, tasks=str(tasks), checker=checker, max_actions=3)


def test_calculator_keeps_the_env_contract():
    env = envs.make("mcp:calculator")
    check_env(env)
    check_docstring(type(env).__doc__, env.info_keys)
    obs, _ = env.reset(seed=3)
    total, steps = 0.0, env.solve()
    for action in steps:
        obs, reward, terminated, truncated, info = env.step(action)
        total += reward
    assert terminated and info["success"] and total == 1.0  # multiply, add, finish with the right number


def test_a_server_of_ones_own_with_tasks_and_a_checker(glossary_env):
    env = glossary_env
    assert [t["function"]["name"] for t in env.tools] == ["define", "finish"]
    assert env.tools[0]["function"]["parameters"]["required"] == ["word"]  # the server's own schema
    obs, _ = env.reset(seed=0)
    word = obs.split("What is a ")[1].rstrip("?")
    obs, reward, terminated, _, info = env.step(f'define {{"word": "{word}"}}')
    assert "a unit of" in obs and info["action_is_valid"] and not info["tool_error"] and reward == 0
    obs, _, _, _, info = env.step('define {"word": "nothing"}')
    assert info["tool_error"] and "Error executing tool define" in obs  # the server's error, shown to the policy
    assert env.step("define [lumen]")[4]["action_is_valid"] is False  # arguments must be a JSON object
    obs, reward, terminated, _, info = env.step(env.solve()[-1])
    assert terminated and reward == 1.0 and info["success"]


def test_tool_calls_drive_the_server_with_an_exact_layout(glossary_env, tmp_path):
    """The policy's tool calls, as a template renders them, reach the server; its results come back masked."""
    from ragen2.models.tiny import build_tokenizer

    env = glossary_env
    tokenizer = build_tokenizer([env.tool_instruction, json.dumps(env.tools)] * 5, vocab_size=400)
    tokenizer.chat_template = QWEN25_TOOLS
    cfg = RolloutConfig(tool_calls=True)
    conv = conversation(tokenizer, env.tool_instruction, cfg, list(env.tools))
    obs, _ = env.reset(seed=0)
    word = obs.split("What is a ")[1].rstrip("?")
    conv.add_observation(obs, env.max_actions)
    conv.add_response_text(f"I look up {word}.</think>" + render_tool_calls([ToolCall("define", {"word": word})]))
    action = env.tool_action("define", {"word": word})
    result = env.step(action)[0]
    conv.add_observation("", env.max_actions, tool_results=[result])
    assert '"name": "define"' in tokenizer.decode(conv.prompt_ids())  # the server's schema, rendered
    conv.add_response_text("Done.</think>" + render_tool_calls([ToolCall("finish", {"answer": "x"})]))
    (ids, mask), = conv.samples()
    trained = tokenizer.decode([t for t, m in zip(ids, mask) if m])
    assert "a unit of" in tokenizer.decode(ids) and "a unit of" not in trained
    assert env.tool_action("define", {"word": "x"}) == 'define {"word": "x"}' and env.tool_action("nope", {}) is None


def test_mcp_needs_a_command_and_valid_tasks(tmp_path):
    with pytest.raises(ConfigError, match="mcp:other needs the command"):
        envs.make("mcp:other")
    (tmp_path / "bad.jsonl").write_text(json.dumps({"prompt": "p"}))
    with pytest.raises(ConfigError, match="missing field 'answer'"):
        envs.make("mcp:calculator", tasks=str(tmp_path / "bad.jsonl"))
    with pytest.raises(ConfigError, match="did not start"):
        envs.make("mcp:broken", command=[sys.executable, "-c", "import sys; sys.exit(3)"], timeout_s=20)


@pytest.mark.slow
def test_mcp_environment_trains_end_to_end(save_random_policy, tmp_path, one_thread):
    """Two steps of GRPO with native tool calls on the calculator server (a random tiny policy: the layout, the
    rollout and the update run; no learning is asked of it)."""
    policy = tmp_path / "policy"
    _, tokenizer = save_random_policy(policy)
    tokenizer.chat_template = QWEN25_TOOLS
    tokenizer.save_pretrained(policy)
    config = load_config("mcp:calculator", [
        f"model.path={policy}", "model.device=cpu", "rollout.tool_calls=true", "rollout.max_turns=2",
        "rollout.max_tokens_per_turn=16", "rollout.num_groups=2", "rollout.group_size=2", "trainer.total_steps=2",
        "trainer.eval_every=0", f"trainer.run_dir={tmp_path / 'run'}", "logging.tensorboard=false",
        "logging.progress=false", "collapse.enable=false", "filter.strategy=none",
    ])
    train(config)
    steps = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in steps] == [1, 2] and all(m["rollout/turns_mean"] >= 1 for m in steps)
