"""Gradient SNR probe on a tiny random Qwen2: RV buckets, per-term gradient norms, no side effects."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch

from ragen2.agent.types import Trajectory
from ragen2.rl.grad_snr import grad_snr_probe, group_reward_variance, rv_buckets
from ragen2.rl.advantages import broadcast_to_tokens, grpo_advantages
from ragen2.rl.batch import Batch, build_batch
from ragen2.rl.losses import aggregate, token_logprobs

# Six groups of four episodes, 0/1 returns: RV (ddof=1) 0, 0, 0.25, 0.25, 1/3, 1/3.
RETURNS = {0: [0, 0, 0, 0], 1: [1, 1, 1, 1], 2: [0, 0, 0, 1], 3: [1, 0, 0, 0], 4: [0, 1, 0, 1], 5: [1, 1, 0, 0]}


def _trajectories(vocab_size: int, seed: int = 0) -> list[Trajectory]:
    """One random sequence per episode: an 8-token prompt, then 4..11 "model" tokens."""
    rng = np.random.default_rng(seed)
    trajectories = []
    for group, returns in RETURNS.items():
        for ret in returns:
            prompt, response = rng.integers(3, vocab_size, 8), rng.integers(3, vocab_size, rng.integers(4, 12))
            ids = [*prompt.tolist(), *response.tolist()]
            mask = [0] * len(prompt) + [1] * len(response)
            trajectories.append(
                Trajectory("sokoban", seed=group, group_id=group, samples=[(ids, mask)], episode_return=float(ret))
            )
    return trajectories


def _grpo_batch(trajectories: list[Trajectory]) -> Batch:
    """The trainer's GRPO advantage phase: one advantage per trajectory, spread over its model tokens."""
    batch = build_batch(trajectories, pad_id=0)
    returns = torch.tensor([t.episode_return for t in trajectories])
    groups = torch.tensor([t.group_id for t in trajectories])
    batch.advantages = broadcast_to_tokens(grpo_advantages(returns, groups)[batch.traj_index], batch.mask)
    return batch


@pytest.fixture
def setup(tiny_model, one_thread):
    trajectories = _trajectories(tiny_model.config.vocab_size)
    reference = copy.deepcopy(tiny_model)
    with torch.no_grad():  # a reference the policy has drifted from, so the KL gradient is not 0
        gen = torch.Generator().manual_seed(1)
        for p in reference.parameters():
            p.add_(0.02 * torch.randn(p.shape, generator=gen))
    return tiny_model, reference, _grpo_batch(trajectories), group_reward_variance(trajectories)


def test_group_reward_variance_is_the_filters_ddof1_variance():
    trajectories = _trajectories(50)
    rv = group_reward_variance(trajectories)
    assert rv == pytest.approx({0: 0.0, 1: 0.0, 2: 0.25, 3: 0.25, 4: 1 / 3, 5: 1 / 3})
    same = [Trajectory("sokoban", 0, 7, episode_return=0.1) for _ in range(3)]
    assert group_reward_variance(same) == {7: 0.0}  # equal returns: exactly 0, not ~1e-33
    assert group_reward_variance(trajectories, ddof=0)[2] == pytest.approx(0.1875)


def test_rv_buckets_are_equal_count_quantiles_lowest_first():
    rv = {g: v for g, v in enumerate([0.5, 0.0, 0.3, 0.0, 0.9, 0.1, 0.0, 0.7, 0.2, 0.4, 0.6, 0.8])}
    assert rv_buckets(rv, 6) == [[1, 3], [6, 5], [8, 2], [9, 0], [10, 7], [11, 4]]  # ties by group id
    assert rv_buckets(rv, 5) == [[1, 3, 6], [5, 8, 2], [9, 0], [10, 7], [11, 4]]  # sizes differ by at most 1
    assert rv_buckets({4: 0.2, 9: 0.1}, 6) == [[9], [4]]  # fewer groups than buckets: one group each
    assert rv_buckets({}, 6) == []
    with pytest.raises(ValueError, match="num_buckets=0"):
        rv_buckets(rv, 0)


def test_probe_changes_neither_weights_nor_grads(setup):
    policy, reference, batch, rv = setup
    before = {name: p.detach().clone() for name, p in policy.named_parameters()}
    params = list(policy.parameters())
    marker = torch.full_like(params[0], 3.0)
    params[0].grad = marker  # a gradient the trainer may be holding; the others are None
    grad_snr_probe(policy, batch, rv, reference=reference, num_buckets=3, micro_batch_size=5)
    assert params[0].grad is marker and torch.all(marker == 3.0)
    assert all(p.grad is None for p in params[1:])
    assert all(torch.equal(p, before[name]) for name, p in policy.named_parameters())


def test_zero_variance_bucket_has_exactly_zero_task_gradient(setup):
    policy, reference, batch, rv = setup
    out = grad_snr_probe(
        policy, batch, rv, reference=reference, num_buckets=3, micro_batch_size=5, kl_coef=0.1, entropy_coef=0.01
    )
    assert out["grad_snr/bucket0/rv_mean"] == 0.0 and out["grad_snr/bucket0/num_groups"] == 2.0  # groups 0 and 1
    assert out["grad_snr/bucket0/task_norm"] == 0.0  # GRPO gives zero-variance groups zero advantage
    for i, rv_mean in enumerate([0.0, 0.25, 1 / 3]):
        assert out[f"grad_snr/bucket{i}/rv_mean"] == pytest.approx(rv_mean)
        for term in ("kl", "entropy"):  # the regularisers pull on every bucket, whatever its RV
            assert math.isfinite(out[f"grad_snr/bucket{i}/{term}_norm"]) and out[f"grad_snr/bucket{i}/{term}_norm"] > 0
        assert out[f"grad_snr/bucket{i}/kl_norm_scaled"] == pytest.approx(0.1 * out[f"grad_snr/bucket{i}/kl_norm"])
        assert out[f"grad_snr/bucket{i}/entropy_norm_scaled"] == pytest.approx(
            0.01 * out[f"grad_snr/bucket{i}/entropy_norm"]
        )
    assert out["grad_snr/bucket1/task_norm"] > 0 and out["grad_snr/bucket2/task_norm"] > 0
    assert len(out) == 3 * 7


def test_task_norm_is_the_policy_gradient_norm_whatever_the_micro_batch(setup):
    """At ratio 1 the clipped surrogate's gradient is -mean_t(A_t grad log pi_t): check it by hand."""
    policy, reference, batch, rv = setup
    out = grad_snr_probe(policy, batch, rv, reference=reference, num_buckets=1, micro_batch_size=24)
    logits = policy(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits[:, :-1]
    loss = aggregate(-batch.advantages * token_logprobs(logits, batch.targets), batch.mask, "token-mean")
    grads = torch.autograd.grad(loss, [p for p in policy.parameters() if p.requires_grad], allow_unused=True)
    expected = torch.linalg.vector_norm(torch.stack([g.norm() for g in grads if g is not None])).item()
    assert out["grad_snr/bucket0/task_norm"] == pytest.approx(expected, rel=1e-4)
    small = grad_snr_probe(policy, batch, rv, reference=reference, num_buckets=1, micro_batch_size=3)
    for key, value in out.items():
        assert small[key] == pytest.approx(value, rel=1e-4), key


def test_kl_norm_needs_a_reference_that_differs_from_the_policy(setup):
    policy, _, batch, rv = setup
    without = grad_snr_probe(policy, batch, rv, num_buckets=2)
    assert all(math.isnan(without[f"grad_snr/bucket{i}/kl_norm"]) for i in range(2))
    same = grad_snr_probe(policy, batch, rv, reference=copy.deepcopy(policy), num_buckets=2, kl_estimator="k3")
    assert all(same[f"grad_snr/bucket{i}/kl_norm"] == 0.0 for i in range(2))  # k3 is flat at d = 0


def test_probe_refuses_a_batch_it_cannot_bucket(setup):
    policy, _, batch, rv = setup
    with pytest.raises(ValueError, match=r"no reward variance for the batch's groups \[5\]"):
        grad_snr_probe(policy, batch, {g: v for g, v in rv.items() if g != 5})
    with pytest.raises(ValueError, match="unknown terms"):
        grad_snr_probe(policy, batch, rv, terms=("task", "value"))
    batch.advantages = None
    with pytest.raises(ValueError, match="needs batch.advantages for the task term"):
        grad_snr_probe(policy, batch, rv)


def test_terms_selects_what_is_measured(setup):
    policy, reference, batch, rv = setup
    full = grad_snr_probe(policy, batch, rv, reference=reference, num_buckets=2, kl_coef=0.1)
    task_only = grad_snr_probe(policy, batch, rv, reference=reference, num_buckets=2, kl_coef=0.1, terms=("task",))
    assert sorted(k.split("/")[-1] for k in task_only if k.startswith("grad_snr/bucket0/")) == [
        "num_groups", "rv_mean", "task_norm"
    ]
    assert all(full[key] == pytest.approx(value) for key, value in task_only.items())


def test_probe_on_the_trainers_own_batch(tiny_tokenizer, tiny_model, tmp_path, one_thread):
    """The call the trainer makes: its rollout and advantage phases on every group, then the probe."""
    from ragen2.config import load_config
    from ragen2.rl import advantage_stage, rollout_stage
    from ragen2.rl.run import setup

    tiny_model.save_pretrained(tmp_path / "policy")
    tiny_tokenizer.save_pretrained(tmp_path / "policy")
    config = load_config("bandit", [
        f"model.path={tmp_path / 'policy'}", "model.device=cpu", f"trainer.run_dir={tmp_path / 'run'}",
        "rollout.num_groups=3", "rollout.group_size=4", "rollout.max_tokens_per_turn=8", "algo.kl_coef=0.01",
        "logging.progress=false", "logging.tensorboard=false",
    ])
    run = setup(config)
    with run.tracker:
        trajectories, _ = rollout_stage.rollout_phase(run, 1)
        for i, traj in enumerate(trajectories):  # group 0 all equal, groups 1 and 2 varied
            traj.episode_return = 0.0 if traj.group_id == 0 else float(i % 2 + traj.group_id)
        batch = advantage_stage.advantage_phase(run, [t for t in trajectories if t.samples])
        out = grad_snr_probe(run.policy, batch, group_reward_variance(trajectories), reference=run.reference,
                             num_buckets=3, micro_batch_size=config.algo.micro_batch_size)
    assert [out[f"grad_snr/bucket{i}/num_groups"] for i in range(3)] == [1.0, 1.0, 1.0]
    assert out["grad_snr/bucket0/rv_mean"] == 0.0 and out["grad_snr/bucket0/task_norm"] == 0.0
    assert out["grad_snr/bucket2/task_norm"] > 0
    assert out["grad_snr/bucket0/kl_norm"] == 0.0  # step 1: the policy is its own reference, k3 is flat
