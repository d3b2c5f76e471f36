"""KL in the reward (`algo.kl_in_reward`): the penalty and the fixed / adaptive controller by hand, against a
re-statement of verl's code on random cases, in the trainer, and across a checkpoint and resume.

Reference: verl at d62da49 (the verl submodule of RAGEN 20daedc, whose trainer calls verl's apply_kl_penalty).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from ragen2.cli import main
from ragen2.config import load_config
from ragen2.errors import ConfigError
from ragen2.rl.kl_control import KLController, kl_reward_penalty, mean_sequence_kl
from ragen2.tracking import read_metrics

CASES = 500
# ragen2's estimator names and verl's (`algorithm.kl_penalty`); ragen2's unclamped k3 has no verl name.
VERL_NAMES = {"k1": "kl", "k2": "mse", "low_var_kl": "low_var_kl"}


@pytest.fixture(autouse=True)
def _single_thread(one_thread):
    """Every test here runs on one thread (see tests/conftest.py, one_thread)."""


# ----------------------------------------------------------------------------- verl, restated


class VerlAdaptiveKLController:
    """verl/trainer/ppo/core_algos.py, lines 150-171 (AdaptiveKLController)."""

    def __init__(self, init_kl_coef, target_kl, horizon):
        self.value = init_kl_coef
        self.target = target_kl
        self.horizon = horizon

    def update(self, current_kl, n_steps):
        target = self.target
        proportional_error = np.clip(current_kl / target - 1, -0.2, 0.2)
        mult = 1 + proportional_error * n_steps / self.horizon
        self.value *= mult


class VerlFixedKLController:
    """verl/trainer/ppo/core_algos.py, lines 174-187 (FixedKLController)."""

    def __init__(self, kl_coef):
        self.value = kl_coef

    def update(self, current_kl, n_steps):
        pass


def verl_kl_penalty_forward(logprob, ref_logprob, kl_penalty):
    """verl/trainer/ppo/core_algos.py, lines 1438-1473 (kl_penalty_forward), the branches ragen2 has."""
    if kl_penalty in ("kl", "k1"):
        return logprob - ref_logprob
    if kl_penalty in ("mse", "k2"):
        return 0.5 * (logprob - ref_logprob).square()
    if kl_penalty in ("low_var_kl", "k3"):
        kl = ref_logprob - logprob
        kl = torch.clamp(kl, min=-20, max=20)
        ratio = torch.exp(kl)
        kld = (ratio - kl - 1).contiguous()
        return torch.clamp(kld, min=-10, max=10)
    raise NotImplementedError


def verl_masked_mean(values, mask, axis=None):
    """verl/utils/torch_functional.py, lines 163-185 (masked_sum, masked_mean)."""
    valid_values = torch.where(mask.bool(), values, 0.0)
    return (valid_values * mask).sum(axis=axis) / (mask.sum(axis=axis) + 1e-8)


def verl_apply_kl_penalty(token_level_scores, old_log_probs, ref_log_prob, response_mask, kl_ctrl, kl_penalty):
    """verl/trainer/ppo/ray_trainer.py, lines 121-160 (apply_kl_penalty), on tensors instead of a DataProto."""
    batch_size = token_level_scores.shape[0]
    kld = verl_kl_penalty_forward(old_log_probs, ref_log_prob, kl_penalty)
    kld = kld * response_mask
    beta = kl_ctrl.value
    token_level_rewards = token_level_scores - beta * kld
    current_kl = verl_masked_mean(kld, mask=response_mask, axis=-1)
    current_kl = torch.mean(current_kl, dim=0).item()
    kl_ctrl.update(current_kl=current_kl, n_steps=batch_size)
    metrics = {"actor/reward_kl_penalty": current_kl, "actor/reward_kl_penalty_coeff": beta}
    return token_level_rewards, metrics


# ----------------------------------------------------------------------------- by hand


def test_penalty_by_hand():
    # d = logp - ref = [0.5, -1, 2] on two model tokens of row 0 and one of row 1; beta 0.1.
    logp = torch.tensor([[-1.0, -2.0, 0.0], [-1.0, 0.0, 0.0]])
    ref = torch.tensor([[-1.5, -1.0, 0.0], [-3.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    rewards = torch.tensor([[0.0, 1.0, 0.0], [2.0, 0.0, 0.0]])
    k1 = kl_reward_penalty(rewards, logp, ref, mask, beta=0.1, kind="k1")
    torch.testing.assert_close(k1, torch.tensor([[-0.05, 1.1, 0.0], [1.8, 0.0, 0.0]]))
    k2 = kl_reward_penalty(rewards, logp, ref, mask, beta=0.1, kind="k2")  # d^2 / 2 = 0.125, 0.5, 2
    torch.testing.assert_close(k2, torch.tensor([[-0.0125, 0.95, 0.0], [1.8, 0.0, 0.0]]))
    # Sequence means: row 0 (0.5 - 1) / 2 = -0.25, row 1: 2; their mean 0.875. k2: (0.3125 + 2) / 2.
    assert mean_sequence_kl(logp, ref, mask, "k1") == pytest.approx(0.875)
    assert mean_sequence_kl(logp, ref, mask, "k2") == pytest.approx(1.15625)


def test_a_sequence_without_model_tokens_is_left_out_of_the_mean():
    logp, ref = torch.tensor([[1.0, 1.0], [5.0, 5.0]]), torch.zeros(2, 2)
    mask = torch.tensor([[1.0, 1.0], [0.0, 0.0]])
    assert mean_sequence_kl(logp, ref, mask) == pytest.approx(1.0)  # verl: (1 + 0) / 2
    assert math.isnan(mean_sequence_kl(logp, ref, torch.zeros(2, 2)))


def test_adaptive_update_by_hand():
    ctrl = KLController(0.1, target=0.1, horizon=100)
    ctrl.update(0.15, n_steps=10)  # error 0.5, clipped to 0.2: beta x (1 + 0.2 x 10 / 100) = 0.102
    assert ctrl.value == pytest.approx(0.102)
    ctrl.update(0.09, n_steps=10)  # error -0.1: x 0.99
    assert ctrl.value == pytest.approx(0.102 * 0.99)
    ctrl.update(0.0, n_steps=50)  # error -1, clipped to -0.2: x 0.9
    assert ctrl.value == pytest.approx(0.102 * 0.99 * 0.9)
    ctrl.update(float("nan"), n_steps=10)  # a non-finite KL leaves beta alone
    assert ctrl.value == pytest.approx(0.102 * 0.99 * 0.9)


def test_fixed_controller_never_moves_and_state_round_trips():
    fixed = KLController(0.3)
    fixed.update(5.0, n_steps=1000)
    assert fixed.value == 0.3
    adaptive = KLController(0.1, target=0.1, horizon=10)
    adaptive.update(1.0, n_steps=10)
    restored = KLController(0.1, target=0.1, horizon=10)
    restored.load_state_dict(adaptive.state_dict())
    assert restored.value == adaptive.value == pytest.approx(0.12)
    with pytest.raises(ValueError, match="target > 0 and horizon > 0"):
        KLController(0.1, target=0.0)


# ----------------------------------------------------------------------------- against verl


def test_penalty_and_controllers_agree_with_verl_on_random_cases():
    rng = np.random.default_rng(0)
    for case in range(CASES):
        B, T = int(rng.integers(1, 7)), int(rng.integers(1, 12))
        mask = torch.tensor(rng.random((B, T)) < 0.6, dtype=torch.float32)
        mask[torch.arange(B), torch.tensor(rng.integers(0, T, B))] = 1.0  # every row has a model token
        logp = torch.tensor(-rng.exponential(2.0, (B, T)), dtype=torch.float32)
        ref = torch.tensor(-rng.exponential(2.0, (B, T)), dtype=torch.float32)
        scores = torch.tensor(rng.normal(size=(B, T)), dtype=torch.float32) * mask
        kind = list(VERL_NAMES)[case % 3]
        beta, target, horizon = float(rng.uniform(0, 0.5)), float(rng.uniform(0.01, 2)), int(rng.integers(1, 200))
        adaptive = bool(case % 2)
        ours = KLController(beta, target, horizon) if adaptive else KLController(beta)
        theirs = VerlAdaptiveKLController(beta, target, horizon) if adaptive else VerlFixedKLController(beta)
        for _ in range(3):  # three steps, so the updated beta is used
            want, metrics = verl_apply_kl_penalty(scores, logp, ref, mask, theirs, VERL_NAMES[kind])
            got = kl_reward_penalty(scores, logp, ref, mask, ours.value, kind)
            kl = mean_sequence_kl(logp, ref, mask, kind)
            assert metrics["actor/reward_kl_penalty_coeff"] == pytest.approx(ours.value, rel=1e-6), f"case {case}"
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5, msg=f"case {case}")
            assert kl == pytest.approx(metrics["actor/reward_kl_penalty"], rel=1e-5, abs=1e-6), f"case {case}"
            ours.update(kl, B)
            assert ours.value == pytest.approx(theirs.value, rel=1e-6), f"case {case}"


# ----------------------------------------------------------------------------- config and the trainer


@pytest.mark.parametrize(("overrides", "message"), [
    (["algo.kl_in_reward=true"], "algo.kl_in_reward=true puts the KL penalty on token rewards"),
    (["algo.kl_in_reward=true", "algo.name=gigpo"], "not algo.name=gigpo"),
    (["algo.kl_in_reward=true", "algo.name=ppo", "algo.kl_ctrl=adaptive", "algo.kl_target=0"], "algo.kl_target=0"),
    (["algo.kl_in_reward=true", "algo.name=ppo", "algo.kl_reward_coef=-1"], "algo.kl_reward_coef=-1"),
])
def test_bad_settings_are_refused(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config("bandit", overrides)


def train_args(policy_dir: Path, run_dir: Path, steps: int, *overrides: str) -> list[str]:
    """`ragen2 train` on Bandit, 2 groups x 4 episodes, nothing filtered: every step trains on 8 sequences."""
    return [
        "train", "bandit", f"model.path={policy_dir}", "model.device=cpu", f"trainer.run_dir={run_dir}",
        "rollout.num_groups=2", "rollout.group_size=4", "rollout.max_tokens_per_turn=8",
        f"trainer.total_steps={steps}", "trainer.save_every=2", "trainer.eval_every=0",
        "algo.mini_batch_size=4", "algo.micro_batch_size=2", "optim.lr=1e-2", "filter.include_zero=true",
        "filter.strategy=none", "logging.tensorboard=false", "logging.progress=false",
        "algo.kl_in_reward=true", "algo.kl_ctrl=adaptive", "algo.kl_reward_coef=0.05", "algo.kl_target=0.001",
        "algo.kl_horizon=40", "algo.kl_estimator=low_var_kl", *overrides,
    ]


@pytest.mark.parametrize("algo", ["ppo", "reinforce_pp"])
def test_a_run_logs_beta_and_kl_and_moves_beta_by_verls_rule(policy_dir, tmp_path, algo):
    run_dir = tmp_path / "run"
    assert main(train_args(policy_dir, run_dir, 3, f"algo.name={algo}")) == 0
    records = read_metrics(run_dir)
    assert records[0]["train/reward_kl_coef"] == 0.05
    assert records[0]["train/reward_kl"] == pytest.approx(0.0, abs=1e-6)  # step 1: the policy is its reference
    for before, after in zip(records, records[1:]):
        expected = KLController(before["train/reward_kl_coef"], 0.001, 40)
        expected.update(before["train/reward_kl"], n_steps=8)
        assert after["train/reward_kl_coef"] == pytest.approx(expected.value, rel=1e-9)
    assert records[1]["train/reward_kl_coef"] == pytest.approx(0.05 * (1 - 0.2 * 8 / 40))  # KL 0 < target: down 4%
    assert records[1]["train/reward_kl"] > 0.001  # the policy moved past the target: beta goes up again
    assert records[2]["train/reward_kl_coef"] > records[1]["train/reward_kl_coef"]
    assert "train/kl" not in records[-1]  # no KL loss term (algo.kl_coef=0)


def test_beta_survives_a_checkpoint_and_resume(policy_dir, tmp_path):
    """A 2-step run resumed to 4 steps uses the betas of an uninterrupted 4-step run."""
    long, short = tmp_path / "long", tmp_path / "short"
    assert main(train_args(policy_dir, long, 4, "algo.name=ppo")) == 0
    assert main(train_args(policy_dir, short, 2, "algo.name=ppo")) == 0
    assert main(["train", "--resume", str(short), "trainer.total_steps=4"]) == 0
    want, got = read_metrics(long), read_metrics(short)
    assert [r["step"] for r in got] == [1, 2, 3, 4]
    assert got[2]["train/reward_kl_coef"] != 0.05  # beta at step 3 came from the checkpoint, not the config
    for a, b in zip(want, got):
        for key in ("train/reward_kl_coef", "train/reward_kl", "train/policy_loss"):
            assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-7), f"step {a['step']} {key}"
