"""Roles: a solver and a critic share the policy in one episode (roles_agent.py); `agent.train_roles=[solver]` gives
the critic's tokens zero loss weight while its calls are still served, recorded and logged per role."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ragen2.agent.types import Trajectory, Turn
from ragen2.config import load_config
from ragen2.errors import ConfigError, Ragen2Error
from ragen2.rl.advantage_stage import advantage_phase, kept_turns_only, trained_turns
from ragen2.rl.batch import build_batch
from ragen2.rl.rollout_stage import rollout_phase
from ragen2.rl.run import setup
from ragen2.rl.trainer import train

AGENT = Path(__file__).parent / "roles_agent.py"


def roles_config(tmp_path: Path, policy: Path, *overrides: str):
    return load_config("agent", [
        f"agent.entrypoint={AGENT}:play", f"model.path={policy}", "model.device=cpu", "rollout.num_groups=2",
        "rollout.group_size=2", "rollout.max_turns=4", "rollout.max_tokens_per_turn=48", "trainer.eval_every=0",
        f"trainer.run_dir={tmp_path / 'run'}", "logging.tensorboard=false", "logging.progress=false",
        "algo.mini_batch_size=4", "algo.micro_batch_size=4", "collapse.num_samples=4", *overrides,
    ])


def turn(role: str | None) -> Turn:
    return Turn([1], [2], "", "", (0, 0), [], True, True, 0.0, "", role=role)


def test_trained_turns_keeps_the_chosen_roles_and_the_filters_choice():
    t = Trajectory("agent", 0, 0, turns=[turn("solver"), turn("critic"), turn("solver"), turn(None)])
    assert trained_turns(t, None) == trained_turns(t, []) == [True] * 4
    assert trained_turns(t, ["solver"]) == [True, False, True, False]
    t.trained_turns = [False, True, True, True]  # filter.level=anchor dropped the first turn
    assert trained_turns(t, ["solver"]) == [False, False, True, False]
    assert trained_turns(t, None) == [False, True, True, True]


def test_a_batch_with_no_call_of_a_trained_role_is_refused():
    """A role no call carries (a typo, or a framework sending its own model name) would train on nothing: the
    error names the roles the calls had."""
    t = Trajectory("agent", 0, 0, turns=[turn("gpt-4o")], samples=[([1, 2], [0, 1])])
    batch = build_batch([t], 0)
    batch.advantages = batch.mask.clone()
    assert int(kept_turns_only([t], batch, ["gpt-4o"]).mask.sum()) == 1
    with pytest.raises(Ragen2Error, match=r"the calls' roles: gpt-4o"):
        kept_turns_only([t], batch, ["solver"])


@pytest.mark.parametrize("overrides, trained", [(["agent.train_roles=[solver]"], {"solver"}),
                                                ([], {"solver", "critic"})])
def test_only_the_chosen_roles_calls_carry_loss_weight(tool_policy, tmp_path, one_thread, overrides, trained):
    """The batch the update trains on: with train_roles=[solver] its mask covers exactly the solver's completion
    tokens (the critic's calls are in the episodes, with their roles, and weigh nothing); without it, every call's."""
    run = setup(roles_config(tmp_path, tool_policy, *overrides))
    try:
        trajectories, metrics = rollout_phase(run, 1)
        batch = advantage_phase(run, [t for t in trajectories if t.samples])
    finally:
        run.agent.close()
        run.lock.release()
    turns = [turn for t in trajectories for turn in t.turns]
    assert {turn.role for turn in turns} == {"solver", "critic"}
    assert sum(turn.role == "critic" for turn in turns) == len(trajectories)  # one review per episode
    assert int(batch.mask.sum()) == sum(len(turn.response_ids) for turn in turns if turn.role in trained)
    for role in ("solver", "critic"):
        assert metrics[f"rollout/{role}/calls_mean"] == sum(turn.role == role for turn in turns) / len(trajectories)
        assert 0 <= metrics[f"rollout/{role}/valid_format_rate"] <= 1
        assert metrics[f"rollout/{role}/response_tokens_mean"] > 0


def test_a_two_step_run_records_and_logs_both_roles(tool_policy, tmp_path, one_thread):
    train(roles_config(tmp_path, tool_policy, "agent.train_roles=[solver]", "trainer.total_steps=2",
                       "logging.sample_every=1"))
    run_dir = tmp_path / "run"
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in steps] == [1, 2]
    assert all("rollout/solver/calls_mean" in m and "rollout/critic/calls_mean" in m for m in steps)
    role_pairs = {k: v for k, v in steps[0].items() if k.startswith("collapse_role/") and k.endswith("/num_pairs")}
    assert role_pairs and set(role_pairs) <= {"collapse_role/solver/num_pairs", "collapse_role/critic/num_pairs"}
    assert sum(role_pairs.values()) == steps[0]["collapse_trajectory/num_pairs"]  # the MI check splits by role
    for step in (1, 2):
        records = [json.loads(line) for line in (run_dir / "rollouts" / f"train_step_{step}.jsonl").open()]
        assert {r["role"] for r in records} == {"solver", "critic"}


def test_train_roles_needs_names_and_an_agent(tool_policy, tmp_path):
    with pytest.raises(ConfigError, match="non-empty strings"):
        roles_config(tmp_path, tool_policy, 'agent.train_roles=[solver," "]')
    with pytest.raises(ConfigError, match="set agent.entrypoint"):
        load_config("bandit", ["agent.train_roles=[solver]"])
    assert load_config("bandit", ["agent.train_roles=[]"]).agent.train_roles == []
