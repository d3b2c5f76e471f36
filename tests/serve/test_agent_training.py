"""`ragen2 train agent`: a black-box agent written with the `openai` client trains through the endpoint.

What must hold: the tokens the update trains on are exactly the ones the endpoint served (prompt ids
as rendered, completion ids as sampled), also when the template drops earlier `<think>` blocks from
the history; several steps run on the CPU with the filter and the diagnostics on.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer

from chat_templates import QWEN3_DROP_THINK
from ragen2.config import Config, load_config
from ragen2.errors import ConfigError
from ragen2.rl.async_rollout import rollout_worker
from ragen2.rl.batch import build_batch
from ragen2.rl.losses import token_logprobs
from ragen2.rl.run import setup
from ragen2.rl.rollout_stage import rollout_phase
from ragen2.rl.trainer import train

AGENT = Path(__file__).parent / "lookup_agent.py"


def agent_config(tmp_path: Path, policy: Path, function: str, *overrides: str) -> Config:
    return load_config("agent", [
        f"agent.entrypoint={AGENT}:{function}", f"model.path={policy}", "model.device=cpu",
        "rollout.num_groups=2", "rollout.group_size=4", "rollout.max_turns=4", "rollout.max_tokens_per_turn=48",
        "trainer.eval_every=0", f"trainer.run_dir={tmp_path / 'run'}", "logging.tensorboard=false",
        "logging.progress=false", "algo.mini_batch_size=8", "algo.micro_batch_size=8", "collapse.num_samples=8",
        *overrides,
    ])


def served_calls(log: Path) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    records = [json.loads(line) for line in log.read_text().splitlines()]
    return sorted((tuple(r["prompt"]), tuple(r["completion"])) for r in records)


def assert_trained_as_served(trajectories, served, pad_id: int) -> None:
    """Every served completion is trained, right after its served prompt, and nothing else is trained."""
    turns = sorted((tuple(t.prompt_ids), tuple(t.response_ids)) for traj in trajectories for t in traj.turns)
    assert turns == served
    batch = build_batch([t for t in trajectories if t.samples], pad_id)
    for prompt, completion in served:
        p, c = len(prompt), len(completion)
        rows = [r for r in range(len(batch)) if batch.input_ids[r, :p].tolist() == list(prompt)
                and batch.input_ids[r, p: p + c].tolist() == list(completion)]
        assert rows, "a served call is missing from the training batch"
        assert batch.mask[rows[0], p - 1: p - 1 + c].eq(1).all()  # mask column t trains token t + 1
    assert int(batch.mask.sum()) == sum(len(c) for _, c in served)


def run_one_rollout(config: Config):
    run = setup(config)
    try:
        trajectories, metrics = rollout_phase(run, 1)
    finally:
        run.agent.close()
        run.lock.release()
    return run, trajectories, metrics


def test_async_agent_trains_on_the_served_tokens(tool_policy, tmp_path, monkeypatch, one_thread):
    log = tmp_path / "served.jsonl"
    monkeypatch.setenv("SERVED_LOG", str(log))
    run, trajectories, metrics = run_one_rollout(agent_config(tmp_path, tool_policy, "play_async"))
    assert [t.seed for t in trajectories][::4] == [trajectories[0].seed, trajectories[4].seed]  # groups of 4
    assert len({t.seed for t in trajectories[:4]}) == 1 and trajectories[0].seed != trajectories[4].seed
    assert all(t.error is None for t in trajectories)
    assert any(turn.actions == ["lookup"] for t in trajectories for turn in t.turns)  # the tool was called
    assert_trained_as_served(trajectories, served_calls(log), run.tokenizer.pad_token_id)
    assert metrics["rollout/turns_mean"] > 1  # most episodes called the tool, then answered


def test_a_rollout_worker_plays_the_agent_loop(tool_policy, tmp_path, monkeypatch, one_thread):
    """async.max_staleness=1: the rollout worker process starts its own endpoint and plays the agent's episodes
    there; the groups it sends train on exactly the tokens its endpoint served, stamped with their version."""
    log = tmp_path / "served.jsonl"
    monkeypatch.setenv("SERVED_LOG", str(log))  # the worker inherits it
    config = agent_config(tmp_path, tool_policy, "play_async", "async.enable=true", "trainer.total_steps=1")
    run = setup(config)
    try:
        with rollout_worker(run):
            trajectories, metrics = run.rollouts.take(1)
    finally:
        run.lock.release()
    assert run.agent is None  # the trainer started no endpoint: the worker played
    assert all(t.error is None and t.policy_version == 0 for t in trajectories) and len(trajectories) == 8
    for turn in (turn for t in trajectories for turn in t.turns):  # the behaviour log-probs of the weights sent
        ids = torch.tensor([turn.prompt_ids + turn.response_ids])
        with torch.no_grad():
            logits = run.policy(input_ids=ids).logits[:, len(turn.prompt_ids) - 1: -1]
        forced = token_logprobs(logits, ids[:, len(turn.prompt_ids):])[0]
        torch.testing.assert_close(torch.tensor(turn.logprobs), forced, atol=1e-4, rtol=0)
    assert_trained_as_served(trajectories, served_calls(log), run.tokenizer.pad_token_id)
    assert metrics["rollout/turns_mean"] > 1
    with pytest.raises(ConfigError, match="agent.port=8000 with async.max_staleness=1"):
        agent_config(tmp_path, tool_policy, "play", "async.enable=true", "agent.port=8000")
    with pytest.raises(ConfigError, match="an agent loop .* plays its episodes with one version"):
        agent_config(tmp_path, tool_policy, "play", "async.enable=true", "async.partial_rollouts=true")


@pytest.mark.slow
def test_an_asynchronous_agent_run_trains_with_off_policy_correction(tool_policy, tmp_path, one_thread):
    """Three steps with a rollout worker playing the agent: groups up to one update old, their importance
    weights made from the log-probs the worker's endpoint recorded."""
    train(agent_config(tmp_path, tool_policy, "play", "trainer.total_steps=3", "async.enable=true"))
    steps = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in steps] == [1, 2, 3]
    assert all(m["async/staleness_max"] <= 1 and m["rollout_corr/is_weight_mean"] > 0 for m in steps)
    assert sum(m["async/staleness_frac_1"] for m in steps) > 0


def test_reasoning_template_trains_each_completion_in_its_own_context(tool_policy, tmp_path, monkeypatch,
                                                                      one_thread):
    policy = tmp_path / "qwen3_style"
    shutil.copytree(tool_policy, policy)
    tokenizer = AutoTokenizer.from_pretrained(policy)
    tokenizer.chat_template = QWEN3_DROP_THINK
    tokenizer.save_pretrained(policy)
    log = tmp_path / "served.jsonl"
    monkeypatch.setenv("SERVED_LOG", str(log))
    run, trajectories, _ = run_one_rollout(agent_config(tmp_path, policy, "play_follow_up"))
    assert_trained_as_served(trajectories, served_calls(log), run.tokenizer.pad_token_id)
    dropped = 0
    for traj in trajectories:
        for before, after in zip(traj.turns, traj.turns[1:]):
            history = before.prompt_ids + before.response_ids
            if "</think>" in before.response_text and after.prompt_ids[: len(history)] != history:
                dropped += 1  # the template re-rendered the answer without its reasoning
        # One training sequence per break in the history, each holding its calls exactly as served.
        breaks = sum(a.prompt_ids[: len(b.prompt_ids) + len(b.response_ids)] != b.prompt_ids + b.response_ids
                     for b, a in zip(traj.turns, traj.turns[1:]))
        assert len(traj.samples) == 1 + breaks
    assert dropped > 0


@pytest.mark.slow
def test_agent_preset_trains_several_steps(tool_policy, tmp_path, one_thread):
    config = agent_config(tmp_path, tool_policy, "play", "trainer.total_steps=3", "trainer.eval_every=3",
                          "trainer.eval_episodes=4", "logging.sample_every=1", "collapse.compute_freq=1")
    table = train(config)
    run_dir = tmp_path / "run"
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    by_step = {m["step"]: m for m in steps}
    assert {1, 2, 3} <= set(by_step)
    assert "collapse_first_turn/retrieval_acc" in by_step[1]
    assert any(by_step[s].get("filter/kept_groups", 0) > 0 for s in (1, 2, 3))
    assert "eval/success_rate" in by_step[3]
    for step in (1, 2, 3):
        lines = (run_dir / "rollouts" / f"train_step_{step}.jsonl").read_text().splitlines()
        records = [json.loads(line) for line in lines]
        assert records and all("<|im_start|>system" in r["prompt"] for r in records)
    assert "eval/success_rate" in table or "success" in table


@pytest.mark.slow
def test_train_agent_command(tool_policy, tmp_path):
    """`ragen2 train agent agent.entrypoint=FILE.py:FUNCTION` in a subprocess, as a user runs it."""
    run_dir = tmp_path / "cli_run"
    command = [sys.executable, "-m", "ragen2", "train", "agent", f"agent.entrypoint={AGENT}:play",
               f"model.path={tool_policy}", "model.device=cpu", "rollout.num_groups=2", "rollout.group_size=2",
               "trainer.total_steps=1", "trainer.eval_every=0", f"trainer.run_dir={run_dir}", "collapse.num_samples=4"]
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"},
                          timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "agent:lookup_agent:play" in done.stderr and "HTTP Request" not in done.stderr
    assert (run_dir / "checkpoints" / "step_1").is_dir()
    refused = subprocess.run([sys.executable, "-m", "ragen2", "train", "agent"], capture_output=True, text=True)
    assert refused.returncode == 2 and "agent.entrypoint=FILE.py:FUNCTION" in refused.stderr
