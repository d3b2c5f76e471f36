"""The trainer with rollout.backend=vllm: rollouts come from the engine, and after an update it samples the new policy."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from helpers import tiny_run_config
from ragen2.agent.vllm_backend import VLLMBackend
from ragen2.config import Config
from ragen2.rl import advantage_stage, rollout_stage, trainer, update_stage
from ragen2.rl.run import setup
from ragen2.tracking import read_metrics

pytest.importorskip("vllm", reason="needs the vllm extra: make test-vllm")

@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory, save_random_policy) -> Path:
    """A random tiny Qwen2 whose head size (32) vLLM's CPU attention supports."""
    path = tmp_path_factory.mktemp("policy")
    save_random_policy(path, hidden_size=64, intermediate_size=128)
    return path


def vllm_config(policy_dir: Path, run_dir: Path, *overrides: str) -> Config:
    """`tiny_run_config` with rollouts from vLLM, no collapse proxies and no filter."""
    return tiny_run_config(policy_dir, run_dir, "rollout.backend=vllm", "collapse.enable=false", "filter.strategy=none",
                           "algo.mini_batch_size=8", "algo.micro_batch_size=4", "optim.lr=1e-2", *overrides)


def test_after_an_update_the_engine_samples_the_updated_policy(policy_dir, tmp_path, teacher_forced):
    run = setup(vllm_config(policy_dir, tmp_path / "run"))
    trajectories, _ = rollout_stage.rollout_phase(run, 1)
    assert isinstance(run.backend, VLLMBackend)
    assert len(trajectories) == 8 and all(t.turns for t in trajectories)
    for i, traj in enumerate(trajectories):  # returns that vary within each group: every episode has an advantage
        traj.episode_return = float(i % 3)
    before = {n: p.detach().clone() for n, p in run.policy.named_parameters()}
    update_stage.update_phase(run, advantage_stage.advantage_phase(run, trajectories), step=1, scale=1.0)
    assert any(not torch.equal(p, before[n]) for n, p in run.policy.named_parameters())

    prompts = [t.turns[0].prompt_ids for t in trajectories[:4]]
    stale = run.backend.generate(prompts, max_new_tokens=8, temperature=1.0, top_p=1.0, seeds=[0, 1, 2, 3])
    assert any(
        not torch.allclose(torch.tensor(o.logprobs), teacher_forced(run.policy, p, o.token_ids), atol=1e-4, rtol=0)
        for p, o in zip(prompts, stale)
    )
    rollout_stage.push_weights(run, 1)
    fresh = run.backend.generate(prompts, max_new_tokens=8, temperature=1.0, top_p=1.0, seeds=[0, 1, 2, 3])
    for prompt, out in zip(prompts, fresh):
        hf = teacher_forced(run.policy, prompt, out.token_ids)
        torch.testing.assert_close(torch.tensor(out.logprobs), hf, atol=1e-4, rtol=0)
    run.tracker.close()


def test_a_short_run_trains_with_vllm_rollouts(policy_dir, tmp_path):
    trainer.train(vllm_config(policy_dir, tmp_path / "run"))
    metrics = read_metrics(tmp_path / "run")
    assert [m["step"] for m in metrics] == [1, 2]
    assert all(m["rollout/response_tokens_mean"] > 0 for m in metrics)
