"""`logging.sample_every`: training episodes saved to rollouts/train_step_N.jsonl, without changing the run."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from ragen2.agent.types import Trajectory, Turn
from ragen2.config import Config, describe, load_config
from ragen2.errors import ConfigError
from ragen2.rl import distributed, trainer
from ragen2.tracking import read_metrics


def config(policy_dir: Path, run_dir: Path, *overrides: str) -> Config:
    """Bandit, 2 groups x 2 episodes of at most 8 tokens, 6 PPO steps (its critic gives the random policy
    non-zero advantages, so the weights change), evaluations at steps 0 and 6."""
    return load_config("bandit", [
        f"model.path={policy_dir}", "model.device=cpu", f"trainer.run_dir={run_dir}",
        "rollout.num_groups=2", "rollout.group_size=2", "rollout.max_tokens_per_turn=8",
        "trainer.total_steps=6", "trainer.eval_every=6", "trainer.eval_episodes=2",
        "algo.name=ppo", "filter.include_zero=true", "filter.strategy=none", "algo.mini_batch_size=4",
        "algo.micro_batch_size=2", "optim.lr=1e-3", "logging.progress=false", "logging.tensorboard=false",
        "logging.sample_trajectories=4",
        *overrides,
    ])


def comparable(record: dict) -> dict:
    return {k: v for k, v in record.items() if not k.startswith(("timing_s/", "system/"))}


@pytest.fixture(scope="module")
def runs(policy_dir, tmp_path_factory) -> dict[int, Path]:
    """The same 6-step run with logging.sample_every=3 and =0."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    out = {}
    for every in (3, 0):
        out[every] = tmp_path_factory.mktemp("runs") / f"every{every}"
        trainer.train(config(policy_dir, out[every], f"logging.sample_every={every}"))
    torch.set_num_threads(threads)
    return out


def test_training_samples_are_written_at_the_steps_divisible_by_sample_every(runs):
    files = sorted(p.name for p in (runs[3] / "rollouts").iterdir())
    assert files == ["step_0.jsonl", "step_6.jsonl", "train_step_3.jsonl", "train_step_6.jsonl"]
    metrics = {r["step"]: r for r in read_metrics(runs[3])}
    for step in (3, 6):
        lines = (runs[3] / "rollouts" / f"train_step_{step}.jsonl").read_text().splitlines()
        records = [json.loads(line) for line in lines]
        assert set(records[0]) == {"group", "prompt", "reasoning", "response", "reward", "episode", "turn", "role",
                                   "prompt_ids", "response_ids", "reasoning_span", "logprobs", "tokenizer"}
        episodes = sorted({r["episode"] for r in records})
        assert episodes == [0, 1, 2, 3]  # all 4 of the batch (sample_trajectories=4)
        groups = [next(r["group"] for r in records if r["episode"] == e) for e in episodes]
        assert groups[0] != groups[1] and groups[:2] == groups[2:]  # one per group in turn
        # The rewards are those of that step's training batch: their mean is the step's logged mean return.
        returns = [sum(r["reward"] for r in records if r["episode"] == e) for e in episodes]
        assert sum(returns) / 4 == pytest.approx(metrics[step]["rollout/return_mean"])
    assert sorted(p.name for p in (runs[0] / "rollouts").iterdir()) == ["step_0.jsonl", "step_6.jsonl"]


def test_sample_every_does_not_change_the_run(runs):
    with_samples, without = read_metrics(runs[3]), read_metrics(runs[0])
    assert [comparable(r) for r in with_samples] == [comparable(r) for r in without]
    assert [r["step"] for r in with_samples] == list(range(7))
    assert len({r["train/entropy"] for r in with_samples[1:]}) > 1  # the policy changes step to step


def test_only_rank_0_writes_and_the_pick_takes_groups_in_turn(tmp_path, monkeypatch):
    tokenizer = SimpleNamespace(decode=lambda ids, skip_special_tokens: " ".join(map(str, ids)), get_vocab=dict)
    turn = Turn(prompt_ids=[1, 2], response_ids=[3], response_text="x", reasoning="", reasoning_span=(0, 0),
                actions=[], format_valid=False, actions_valid=False, reward=-0.1, observation="")
    batch = [Trajectory("bandit", seed=100 + g, group_id=g, turns=[turn]) for g in range(3) for _ in range(2)]
    cfg = config(tmp_path, tmp_path / "run", "rollout.num_groups=3", "logging.sample_every=2",
                 "logging.sample_trajectories=4")
    run = SimpleNamespace(config=cfg, run_dir=tmp_path / "run", tokenizer=tokenizer)
    path = tmp_path / "run" / "rollouts" / "train_step_4.jsonl"
    monkeypatch.setattr(distributed, "is_main", lambda: False)
    trainer.save_training_samples(run, 4, batch)
    assert not path.exists()
    monkeypatch.setattr(distributed, "is_main", lambda: True)
    trainer.save_training_samples(run, 3, batch)  # not a multiple of 2
    assert not path.parent.exists()
    trainer.save_training_samples(run, 4, batch)
    assert [json.loads(line)["group"] for line in path.read_text().splitlines()] == [100, 101, 102, 100]


def test_sample_every_is_checked_and_defaults_to_every_10_steps():
    assert {k: d for k, d, _ in describe()}["logging.sample_every"] == "10"
    with pytest.raises(ConfigError, match=r"logging.sample_every=-1 must be 0 or more \(0 turns it off\)"):
        load_config("bandit", ["logging.sample_every=-1"])
    with pytest.raises(ConfigError, match="logging.sample_every='x' must be an integer"):
        load_config("bandit", ["logging.sample_every=x"])
