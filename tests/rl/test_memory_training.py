"""RL with memory notes (rollout.memory=summary) on the corridor: every estimator trains the notes with the episode's
credit, and the step logs the notes' metrics beside the reasoning's."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ragen2.config import load_config
from ragen2.models.demos import play_demo
from ragen2.models.warmstart import _corpus
from ragen2.rl import trainer
from ragen2.rl.advantage_stage import advantage_phase
from ragen2.rl.rollout_stage import rollout_phase
from ragen2.rl.run import setup
from ragen2.tracking import read_metrics

BUDGET = 1000  # this tokenizer of 300 tokens spells the corridor out at length: a turn takes about 90 of them


@pytest.fixture(scope="module")
def corridor_policy(tmp_path_factory, save_random_policy):
    """A random tiny policy whose tokenizer knows the corridor's words: its 32-token replies fill prompts fast."""
    path = tmp_path_factory.mktemp("corridor_policy")
    rng = np.random.default_rng(0)
    save_random_policy(path, corpus=_corpus([play_demo("corridor", {}, s, 7, 1, rng) for s in range(20)]))
    return path


def corridor_config(policy, run_dir, *overrides):
    return load_config("corridor", [
        f"model.path={policy}", "model.device=cpu", f"trainer.run_dir={run_dir}", "rollout.num_groups=2",
        "rollout.group_size=4", "trainer.total_steps=1", "trainer.eval_every=0", "collapse.num_samples=8",
        "algo.mini_batch_size=8", "algo.micro_batch_size=8", "logging.progress=false", "logging.tensorboard=false",
        f"rollout.memory_budget={BUDGET}", *overrides,
    ])


@pytest.mark.parametrize("algo", [["algo.name=grpo"], ["algo.name=ppo", "algo.bi_level_gae=true"],
                                  ["algo.name=gigpo"], ["algo.name=ppo", "algo.turn_rewards=true"]])
def test_every_estimator_credits_the_notes(corridor_policy, tmp_path, one_thread, algo):
    run = setup(corridor_config(corridor_policy, tmp_path / "run", *algo))
    try:
        trajectories, metrics = rollout_phase(run, 1)
        batch = advantage_phase(run, trajectories)
    finally:
        run.lock.release()
    notes = [turn for t in trajectories for turn in t.turns if turn.memory]
    assert notes and metrics["rollout/memory_turns_mean"] == len(notes) / len(trajectories)
    assert all(len(turn.prompt_ids) <= BUDGET for t in trajectories for turn in t.turns)
    # Every sampled token, notes included, is trained, and carries an advantage wherever its episode has one.
    assert int(batch.mask.sum()) == sum(len(turn.response_ids) for t in trajectories for turn in t.turns)
    assert batch.advantages.shape == batch.mask.shape and bool(((batch.advantages != 0) <= (batch.mask > 0)).all())


def test_a_memory_run_logs_the_notes_beside_the_reasoning(corridor_policy, tmp_path, one_thread):
    trainer.train(corridor_config(corridor_policy, tmp_path / "run", "trainer.total_steps=2", "filter.strategy=none",
                                  "filter.include_zero=true"))
    steps = [m for m in read_metrics(tmp_path / "run") if m["step"] >= 1]
    assert len(steps) == 2
    for m in steps:
        assert m["rollout/memory_turns_mean"] > 0 and math.isfinite(m["train/policy_loss"])
        assert m["rollout/prompt_tokens_mean"] <= BUDGET
    first = steps[0]  # the MI check: a random policy's notes rarely close, so they may all be empty
    assert 0 <= first["collapse_memory/valid_thinking_rate"] <= 1 and "collapse_memory/num_pairs" in first
