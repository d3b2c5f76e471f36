"""Data parallelism: 2 processes (gloo, CPU) train like 1 process with the same global batch and seed.

The 2-process runs are real subprocesses: `torchrun --standalone --nproc_per_node 2` on this
file, whose `__main__` trains a tiny random policy on Bandit and records the groups the filter
kept at every step (kept_rank<r>.jsonl, one line per step); the 1-process run is the pytest
process itself. The random policy never answers in format, so every return is equal: the
filter ranks groups by entropy (top half) and PPO's critic gives non-zero advantages, so the
update has a real gradient to compare.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoModelForTokenClassification

from ragen2.config import Config, load_config
from ragen2.errors import ConfigError
from ragen2.rl import distributed, trainer
from ragen2.tracking import read_metrics

ROOT = Path(__file__).resolve().parents[2]
STEPS = 2


FSDP_OVERRIDES = ("model.fsdp=true",)  # the policy's training copy and PPO's critic sharded over the processes
# Two tags of 2 groups each, filtered within each tag and evaluated on a third environment as well.
MIXTURE_OVERRIDES = (
    "env.mixture=[{name: bandit, tag: train-names, groups: 2}, {name: bandit, kwargs: {split: test}, tag: test-names, "
    "groups: 2}]", "env.eval=[{tag: test-names}, {name: frozenlake, tag: lake, episodes: 8}]", "filter.scope=tag",
)


def tiny_config(policy_dir: Path, run_dir: Path, *overrides: str) -> Config:
    """4 groups x 4 episodes, 2 groups kept; 2 PPO epochs over mini-batches of 7 and 1 sequences (so rank 1 has
    no row in one), KL, evaluations at steps 0 and 2, checkpoints every step."""
    return load_config("bandit", [
        f"model.path={policy_dir}", "model.device=cpu", f"trainer.run_dir={run_dir}",
        "rollout.num_groups=4", "rollout.group_size=4", "rollout.max_tokens_per_turn=8",
        f"trainer.total_steps={STEPS}", "trainer.eval_every=2", "trainer.eval_episodes=4", "trainer.save_every=1",
        "algo.name=ppo", "algo.kl_coef=0.01", "algo.ppo_epochs=2", "algo.mini_batch_size=7", "algo.micro_batch_size=2",
        "filter.include_zero=true", "filter.metric=entropy", "filter.strategy=top_k", "filter.value=0.5",
        "optim.lr=1e-3", "logging.progress=false", "logging.tensorboard=false", *overrides,
    ])


def launch(processes: int, policy_dir: Path, run_dir: Path, resume: bool = False, fsdp: bool = False,
           mixture: bool = False) -> None:
    """Train in `processes` fresh processes under torchrun, as a user would launch them."""
    script = [str(Path(__file__)), str(policy_dir), str(run_dir)] + (["--resume"] if resume else []) + (
        ["--fsdp"] if fsdp else []) + (["--mixture"] if mixture else [])
    launcher = ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    result = subprocess.run([sys.executable, *launcher, *script], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


def kept_groups(run_dir: Path, rank: int) -> dict[int, list[int]]:
    lines = (run_dir / f"kept_rank{rank}.jsonl").read_text().splitlines()
    return {r["step"]: r["groups"] for r in map(json.loads, lines)}


def comparable(record: dict) -> dict:
    """A metrics line without wall times and memory, which differ between any two runs."""
    return {k: v for k, v in record.items() if not k.startswith(("timing_s/", "system/"))}


def assert_same_metrics(got: list[dict], expected: list[dict]) -> None:
    assert [r["step"] for r in got] == [r["step"] for r in expected]
    for g, e in zip(map(comparable, got), map(comparable, expected)):
        assert g.keys() == e.keys(), (g["step"], g.keys() ^ e.keys())
        for key, value in e.items():
            # Processes sum in another order than one process, and CPUs with other vector units round
            # differently. A loss is a sum of terms that nearly cancel (GRPO's advantages sum to zero in a
            # group), so its rounding error is absolute, not relative to the small result: 0.0186265 vs
            # 0.0186235 on an AVX-512 machine, where an AVX2 one matched to 1e-4.
            assert math.isclose(g[key], value, rel_tol=1e-4, abs_tol=1e-5), (e["step"], key, g[key], value)


def weights(model_dir: Path) -> torch.Tensor:
    """Every parameter of a saved policy, flattened into one vector."""
    return torch.cat([p.detach().flatten() for p in AutoModelForCausalLM.from_pretrained(model_dir).parameters()])


@pytest.mark.slow
def test_two_processes_train_like_one_and_resume(policy_dir, tmp_path, monkeypatch, one_thread):
    one, two, resumed = tmp_path / "one", tmp_path / "two", tmp_path / "resumed"
    record_kept_groups(monkeypatch.setattr)
    trainer.train(tiny_config(policy_dir, one))  # 1 process: this one
    launch(2, policy_dir, two)

    # The filter saw the same [P, G] batch: the same groups kept on both ranks and in the 1-process run.
    selections = kept_groups(one, 0)
    assert list(selections) == [1, 2] and all(len(groups) == 2 for groups in selections.values())
    assert kept_groups(two, 0) == kept_groups(two, 1) == selections
    # Metrics logged once (rank 0), equal to the 1-process run's up to float rounding: rollout and
    # filter statistics of the gathered batch, the update's losses and gradient norm, evaluation.
    records = read_metrics(one)
    assert [r["step"] for r in records] == [0, 1, 2]  # step 0: the evaluation before training
    assert all(r["train/grad_norm"] > 0 and r["train/value_loss"] > 0 for r in records[1:])
    assert_same_metrics(read_metrics(two), records)
    # The same weights, up to float rounding (which Adam's normalisation magnifies for gradients near 0).
    start, w1, w2 = (weights(d) for d in (policy_dir, one / "checkpoints" / "step_2", two / "checkpoints" / "step_2"))
    assert (w2 - w1).norm() < 1e-2 * (w1 - start).norm()

    # Resume the 2-process run from its step-1 checkpoint: step 2 is redone as the uninterrupted run did it.
    shutil.copytree(two, resumed)
    (resumed / "checkpoints" / "latest").write_text("step_1\n")
    launch(2, policy_dir, resumed, resume=True)
    assert_same_metrics(read_metrics(resumed), read_metrics(two))
    assert kept_groups(resumed, 1)[2] == selections[2]
    assert torch.equal(weights(resumed / "checkpoints" / "step_2"), w2)


@pytest.mark.slow
def test_fsdp_over_two_processes_trains_like_one_unsharded_process_and_resumes(policy_dir, tmp_path, monkeypatch,
                                                                                 one_thread):
    one, two, resumed = tmp_path / "one", tmp_path / "two", tmp_path / "resumed"
    record_kept_groups(monkeypatch.setattr)
    trainer.train(tiny_config(policy_dir, one))  # 1 process, no sharding
    launch(2, policy_dir, two, fsdp=True)

    assert kept_groups(two, 0) == kept_groups(two, 1) == kept_groups(one, 0)
    records = read_metrics(one)
    assert all(r["train/grad_norm"] > 0 and r["train/value_loss"] > 0 for r in records[1:])
    assert_same_metrics(read_metrics(two), records)
    start, w1, w2 = (weights(d) for d in (policy_dir, one / "checkpoints" / "step_2", two / "checkpoints" / "step_2"))
    assert (w1 - start).norm() > 0
    assert (w2 - w1).norm() < 1e-2 * (w1 - start).norm()  # the replica's weights, refreshed from the shards

    # The sharded critic, gathered whole into the checkpoint: its value head (which starts at 0) as trained unsharded.
    heads = [AutoModelForTokenClassification.from_pretrained(d / "checkpoints" / "step_2" / "critic").score.weight
             for d in (one, two)]
    assert heads[0].norm() > 0 and (heads[1] - heads[0]).norm() < 1e-2 * heads[0].norm()
    # The checkpoint holds the optimizer states gathered whole; a resume shards them again and redoes step 2.
    shutil.copytree(two, resumed)
    (resumed / "checkpoints" / "latest").write_text("step_1\n")
    launch(2, policy_dir, resumed, resume=True, fsdp=True)
    assert_same_metrics(read_metrics(resumed), read_metrics(two))
    assert torch.allclose(weights(resumed / "checkpoints" / "step_2"), w2, atol=1e-6)


@pytest.mark.slow
def test_two_processes_train_on_a_mixture_like_one(policy_dir, tmp_path, monkeypatch, one_thread):
    one, two = tmp_path / "one", tmp_path / "two"
    record_kept_groups(monkeypatch.setattr)
    trainer.train(tiny_config(policy_dir, one, *MIXTURE_OVERRIDES))
    launch(2, policy_dir, two, mixture=True)  # rank 0 rolls out the train-names groups, rank 1 the test-names ones

    selections = kept_groups(one, 0)  # top_k 0.5 within each tag: one group of each
    assert all(len(groups) == 2 and groups[0] < 2 <= groups[1] for groups in selections.values())
    assert kept_groups(two, 0) == kept_groups(two, 1) == selections
    records = read_metrics(one)
    assert all(r["filter/train-names/kept_ratio"] == r["filter/test-names/kept_ratio"] == 0.5 for r in records[1:])
    assert {"eval/lake/pass@4", "rollout/test-names/success_rate"} <= set(records[-1])
    assert_same_metrics(read_metrics(two), records)


@pytest.mark.parametrize("overrides", [("model.lora_rank=8",), ("grad_snr.enable=true",)])
def test_fsdp_refuses_what_it_cannot_shard(policy_dir, tmp_path, overrides):
    with pytest.raises(ConfigError, match="model.fsdp=true does not work with"):
        tiny_config(policy_dir, tmp_path, *FSDP_OVERRIDES, *overrides)


def test_fsdp_needs_several_processes(policy_dir, tmp_path):
    with pytest.raises(ConfigError, match="model.fsdp=true shards over several processes"):
        trainer.setup(tiny_config(policy_dir, tmp_path / "run", *FSDP_OVERRIDES))


def test_groups_must_split_evenly_over_the_processes(policy_dir, tmp_path, monkeypatch):
    monkeypatch.setattr(distributed, "world_size", lambda: 3)
    with pytest.raises(ConfigError, match=r"rollout.num_groups=4 is not divisible by the 3 processes"):
        trainer.setup(tiny_config(policy_dir, tmp_path / "run"))


def test_accelerate_fsdp_launch_turns_model_fsdp_on(policy_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")  # what `accelerate launch` sets for distributed_type: FSDP
    with pytest.raises(ConfigError, match="model.fsdp=true shards over several processes"):  # a 1-process launch
        trainer.train(tiny_config(policy_dir, tmp_path / "run"))


def test_each_row_goes_to_one_rank_in_micro_batches_of_similar_length(monkeypatch):
    monkeypatch.setattr(distributed, "world_size", lambda: 2)
    lengths = torch.tensor([5, 90, 7, 80, 6])  # longest first: rows 1, 3, 2, 4, 0
    parts = []
    for r in (0, 1):
        monkeypatch.setattr(distributed, "rank", lambda r=r: r)
        parts.append([rows.tolist() for rows in distributed.my_rows(lengths, 2)])
    assert parts == [[[1, 2], [0]], [[3, 4]]]
    assert distributed.my_rows(torch.tensor([3]), 2) == []  # rank 1 of a 1-row mini-batch: nothing to compute


def record_kept_groups(patch=setattr) -> None:
    """Wrap the trainer's filter phase so each rank appends {"step", "groups"} to kept_rank<r>.jsonl."""
    filter_phase = trainer.filter_phase

    def recording(run: trainer.Run, trajectories: list) -> tuple[list, dict[str, float]]:
        kept, metrics = filter_phase(run, trajectories)
        line = {"step": run.step + 1, "groups": sorted({t.group_id for t in kept})}
        with open(run.run_dir / f"kept_rank{distributed.rank()}.jsonl", "a") as f:
            f.write(json.dumps(line) + "\n")
        return kept, metrics

    patch(trainer, "filter_phase", recording)


if __name__ == "__main__":  # one training process, launched by `launch`
    policy, run_dir = Path(sys.argv[1]), Path(sys.argv[2])
    torch.set_num_threads(1)
    record_kept_groups()
    overrides = (FSDP_OVERRIDES if "--fsdp" in sys.argv[3:] else ()) + (
        MIXTURE_OVERRIDES if "--mixture" in sys.argv[3:] else ())
    trainer.train(tiny_config(policy, run_dir, *overrides), resume_dir=run_dir if "--resume" in sys.argv[3:] else None)
