"""Native tool calling: the `<tool_call>` parser, the token layout with tools and tool results, and search QA
with `rollout.tool_calls=true` rolled out and trained by a tiny policy fine-tuned on tool-call demonstrations, and the
tool-call warm start (`tiny:ENV+tools`) calling tools in a valid format on held-out seeds."""

from __future__ import annotations

import json

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from chat_templates import QWEN25_TOOLS
from helpers import fine_tune
from ragen2 import envs
from ragen2.agent.backends import HFBackend
from ragen2.agent.parsing import ResponseFormat
from ragen2.agent.rollout import conversation, rollout, summarize
from ragen2.agent.tool_calls import ToolCall, parse_tool_calls, parse_tool_turn, render_tool_calls
from ragen2.config import RolloutConfig, load_config
from ragen2.envs import eval_seeds
from ragen2.errors import ConfigError
from ragen2.models import warmstart as ws
from ragen2.models.loading import load_policy
from ragen2.models.tiny import build_tokenizer
from ragen2.rl.trainer import train

ENV_KWARGS = {"top_k": 1, "snippet_chars": 40, "max_actions": 3}
CFG = RolloutConfig(tool_calls=True, max_turns=3, max_actions_per_turn=1, max_tokens_per_turn=64)


def test_parse_tool_calls():
    text = 'Let me look.<tool_call>\n{"name": "search", "arguments": {"query": "Lake Senna"}}\n</tool_call>'
    parsed = parse_tool_calls(text)
    assert parsed.valid and parsed.content == "Let me look."
    assert parsed.calls == [ToolCall("search", {"query": "Lake Senna"})]
    assert parse_tool_calls('<tool_call>{"name": "f", "arguments": "{\\"x\\": 1}"}</tool_call>').calls == [
        ToolCall("f", {"x": 1})]  # arguments as a JSON string, as some models write them
    assert parse_tool_calls("plain text") == parse_tool_calls("plain text") and parse_tool_calls("hi").calls == []
    for broken in ["<tool_call>{not json}</tool_call>", '<tool_call>{"name": "f"}', '<tool_call>["f"]</tool_call>',
                   '<tool_call>{"arguments": {}}</tool_call>', '</tool_call>{"name": "f"}']:
        assert not parse_tool_calls(broken).valid and parse_tool_calls(broken).calls == []


@given(st.lists(st.tuples(st.text(min_size=1, max_size=8), st.dictionaries(st.text(max_size=5), st.text(max_size=8),
                                                                          max_size=3)), max_size=3))
def test_rendered_calls_parse_back(calls):
    calls = [ToolCall(name, arguments) for name, arguments in calls]
    assert parse_tool_calls(render_tool_calls(calls)).calls == calls


def test_parse_tool_turn_maps_calls_to_actions():
    to_action = envs.make("searchqa").tool_action
    call = '<tool_call>\n{"name": "finish", "arguments": {"answer": "1850"}}\n</tool_call>'
    turn = parse_tool_turn("The year is given.</think>" + call, ResponseFormat(), 1, to_action)
    assert turn.valid and turn.actions == ["finish[1850]"] and turn.reasoning == "The year is given."
    assert not parse_tool_turn(call, ResponseFormat(), 1, to_action).valid  # the think block is missing
    assert parse_tool_turn(call, ResponseFormat(think=False), 1, to_action).actions == ["finish[1850]"]
    for bad in ['{"name": "fly", "arguments": {"answer": "x"}}', '{"name": "finish", "arguments": {"query": "x"}}',
                '{"name": "finish", "arguments": {"answer": 3}}']:
        assert not parse_tool_turn(f"r</think><tool_call>{bad}</tool_call>", ResponseFormat(), 1, to_action).valid
    assert not parse_tool_turn("r</think>no call", ResponseFormat(), 1, to_action).valid
    assert not parse_tool_turn("r</think><answer>x</answer>" + call, ResponseFormat(), 1, to_action).valid


def demonstrations(seeds) -> list[list[tuple[str, str | list[str]]]]:
    """Per episode, (observation or tool results, response text) per turn of search QA's solver, as tool calls."""
    episodes = []
    for seed in seeds:
        env = envs.make("searchqa", **ENV_KWARGS)
        observation, _ = env.reset(seed=seed)
        turns, results = [], None
        for action in env.solve():
            name, argument = action[:-1].split("[", 1)
            call = ToolCall(name, {"query" if name == "search" else "answer": argument})
            turns.append((results or observation, f"I {name} {argument}.</think>" + render_tool_calls([call])))
            results = [env.step(action)[0]]
        episodes.append(turns)
    return episodes


@pytest.fixture(scope="module")
def searchqa_tool_policy(tmp_path_factory):
    """A tiny policy fine-tuned on the solver's tool calls; its template renders tools Qwen2.5's way."""
    episodes = demonstrations(range(8))
    env = envs.make("searchqa", **ENV_KWARGS)
    corpus = [env.tool_instruction, json.dumps(env.tools)] + [
        text for turns in episodes for shown, response in turns for text in ([shown] if isinstance(shown, str)
                                                                            else shown) + [response]]
    tokenizer = build_tokenizer(corpus * 3, vocab_size=600)
    tokenizer.chat_template = QWEN25_TOOLS
    rows = []
    for turns in episodes:
        conv = conversation(tokenizer, env.tool_instruction, CFG, list(env.tools))
        for shown, response in turns:
            if isinstance(shown, str):
                conv.add_observation(shown, env.max_actions)
            else:
                conv.add_observation("", env.max_actions, tool_results=shown)
            conv.add_response_text(response)
        rows += conv.samples()
    labelled = [(ids, [t if m else -100 for t, m in zip(ids, mask)]) for ids, mask in rows]
    path = tmp_path_factory.mktemp("searchqa_tools")
    # 60 steps passed on one machine and left only 4% and 17% of the turns valid on another (AVX-512, other
    # rounding); 150 steps there: 50% and 56%.
    model = fine_tune(tokenizer, labelled, steps=150, lr=5e-3, path=path)
    return path, model, tokenizer


def test_layout_renders_tools_and_masks_tool_results(searchqa_tool_policy):
    _, _, tokenizer = searchqa_tool_policy
    env = envs.make("searchqa", **ENV_KWARGS)
    observation, _ = env.reset(seed=0)
    conv = conversation(tokenizer, env.tool_instruction, CFG, list(env.tools))
    conv.add_observation(observation, env.max_actions)
    response = "I search Vessaly.</think>" + render_tool_calls([ToolCall("search", {"query": "Vessaly"})])
    conv.add_response_text(response)
    conv.add_observation("", env.max_actions, tool_results=["[1] Vessaly: an archipelago"])
    messages = conv.messages()
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool"]
    expected = tokenizer.apply_chat_template(messages, tools=list(env.tools), tokenize=False,
                                             add_generation_prompt=True) + "<think>"
    prompt = conv.prompt_ids()
    assert tokenizer.decode(prompt) == expected
    assert '"name": "search"' in expected
    assert "<tool_response>\n[1] Vessaly: an archipelago\n</tool_response>" in expected
    conv.add_response_text("I finish.</think>" + render_tool_calls([ToolCall("finish", {"answer": "x"})]))
    (ids, mask), = conv.samples()
    trained = tokenizer.decode([t for t, m in zip(ids, mask) if m])
    assert "<tool_response>" not in trained and "Vessaly: an archipelago" not in trained  # tool results are masked
    assert trained.count("<tool_call>") == 2


@pytest.mark.slow
def test_tool_calling_searchqa_rolls_out_and_trains(searchqa_tool_policy, tmp_path, one_thread):
    path, model, tokenizer = searchqa_tool_policy
    torch.manual_seed(0)
    trajectories = rollout(HFBackend(model, tokenizer, stop_strings=()), tokenizer, "searchqa", ENV_KWARGS,
                           list(range(100, 108)), list(range(8)), CFG)
    metrics = summarize(trajectories)
    # A minute of fine-tuning teaches the format, not yet which argument each tool takes: some turns are valid
    # (a random policy's are not); the valid ones search and finish.
    assert metrics["rollout/valid_format_rate"] > 0.2, metrics
    for traj in trajectories:
        (ids, mask), = traj.samples
        trained = [t for t, m in zip(ids, mask) if m]
        assert trained == [t for turn in traj.turns for t in turn.response_ids]  # exactly the sampled tokens
    assert any(turn.actions and turn.actions[0].startswith("search[") for t in trajectories for turn in t.turns)
    config = load_config("searchqa", [
        f"model.path={path}", "model.device=cpu", "rollout.tool_calls=true", "rollout.max_turns=3",
        "rollout.max_tokens_per_turn=64", "rollout.num_groups=2", "rollout.group_size=4",
        *[f"env.kwargs.{k}={v}" for k, v in ENV_KWARGS.items()], "trainer.total_steps=2", "trainer.eval_every=0",
        f"trainer.run_dir={tmp_path / 'run'}", "logging.tensorboard=false", "logging.progress=false",
        "collapse.num_samples=8", "filter.strategy=none", "algo.micro_batch_size=8",
    ])
    train(config)
    steps = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in steps if m["step"] > 0] == [1, 2]
    assert all(m["train/grad_norm"] > 0 for m in steps if m["step"] > 0)


@pytest.mark.slow
def test_the_tool_call_warm_start_calls_tools_in_a_valid_format_in_most_held_out_turns(tmp_path, one_thread):
    """`tiny:searchqa+tools` at a size that builds in about a minute: its demonstrations go through the
    warm start's own path (demos, tokenizer, tools template, SFT) and it is rolled out on held-out seeds
    as `ragen2 eval` rolls out (temperature 0.5, the preset's 128 tokens a turn)."""
    path = ws.warmstart(tmp_path / "policy", envs=("searchqa+tools",), env_kwargs={"searchqa": ENV_KWARGS},
                        env_turns={"searchqa": (3, 1)}, episodes_per_env=40, episode_shares={}, steps=300,
                        warmup_steps=10, vocab_size=600, num_layers=2, batch_tokens=4096)
    model, tokenizer = load_policy(str(path), "cpu")
    torch.manual_seed(0)
    cfg = RolloutConfig(tool_calls=True, max_turns=3, max_actions_per_turn=1, max_tokens_per_turn=128, temperature=0.5)
    trajectories = rollout(HFBackend(model, tokenizer, stop_strings=()), tokenizer, "searchqa", ENV_KWARGS,
                           eval_seeds(32), list(range(32)), cfg)
    metrics = summarize(trajectories)
    assert metrics["rollout/valid_format_rate"] > 0.5, metrics  # an untrained policy: 0
    searches = [t for traj in trajectories for t in traj.turns if t.format_valid and t.actions[0].startswith("search[")]
    finishes = [t for traj in trajectories for t in traj.turns if t.format_valid and t.actions[0].startswith("finish[")]
    assert searches and finishes


def test_tool_calls_need_an_env_with_tools():
    with pytest.raises(ConfigError, match="env.name=sokoban has none"):
        load_config("sokoban", ["rollout.tool_calls=true"])
    with pytest.raises(ConfigError, match="rollout.memory=full"):
        load_config("searchqa", ["rollout.tool_calls=true", "rollout.memory=window"])


def test_webshop_tools_are_its_actions():
    env = envs.make("webshop")
    env.reset(seed=0)
    search = env.tool_action("search", {"keywords": "t-shirt"})
    assert search == "search[t-shirt]" and env.step(search)[4]["action_is_valid"]
    click = env.tool_action("click", {"button": "next >"})
    assert click == "click[next >]" and env.step(click)[4]["action_is_valid"]
    assert env.tool_action("click", {"button": "x", "extra": "y"}) is None
