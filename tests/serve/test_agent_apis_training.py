"""`ragen2 train agent` with agents that use the endpoint's other ways in: the Responses API, and streamed chat
completions. Each trains 2 steps; every call is answered without an HTTP error, and the turns the run recorded
(rollouts/train_step_N.jsonl) are exactly the tokens the endpoint served."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ragen2.rl.trainer import train
from test_agent_training import agent_config, served_calls

AGENTS = Path(__file__).parent / "api_agents.py"


@pytest.mark.parametrize("function", ["play_responses", "play_streamed_chat"])
def test_an_agent_on_another_api_trains_on_the_served_tokens(function, tool_policy, tmp_path, monkeypatch,
                                                             one_thread):
    log = tmp_path / "served.jsonl"
    monkeypatch.setenv("SERVED_LOG", str(log))
    train(agent_config(tmp_path, tool_policy, function, f"agent.entrypoint={AGENTS}:{function}",
                       "trainer.total_steps=2", "logging.sample_every=1", "logging.sample_trajectories=8",
                       "collapse.enable=false"))
    run = tmp_path / "run"
    steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in steps] == [1, 2]
    # An agent whose request got an HTTP error raises: its episode would count in the error rate.
    assert [m["rollout/error_rate"] for m in steps] == [0.0, 0.0]
    assert any(m["rollout/turns_mean"] > 1 for m in steps)  # the tool was called, then the agent answered
    assert any(m["filter/kept_groups"] > 0 for m in steps)  # a group had reward variance: the policy was updated
    records = [json.loads(line) for step in (1, 2)
               for line in (run / "rollouts" / f"train_step_{step}.jsonl").read_text().splitlines()]
    assert sorted((tuple(r["prompt_ids"]), tuple(r["response_ids"])) for r in records) == served_calls(log)
