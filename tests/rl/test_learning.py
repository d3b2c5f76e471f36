"""End to end: RL from a warm start raises held-out success (slow; each test a few minutes on 2 cores).

Each environment gets its own small warm start (only that environment's demonstrations, a
2-layer model), cached for the module in a temporary directory. Success is measured by the
trainer itself: `trainer.eval_every = trainer.total_steps` gives an evaluation of the warm
start at step 0 and one after the last step, on the same held-out seeds.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from ragen2.config import load_config
from ragen2.models.warmstart import warmstart
from ragen2.rl.trainer import train
from ragen2.tracking import read_metrics

# `learning`: run by `make test-learning`, kept out of `make test` until their budgets are tuned for CI.
pytestmark = [pytest.mark.slow, pytest.mark.learning]

# A 2-layer model learns to copy the state's names and coordinates into its reasoning within
# these steps; small batches (many steps per second) get it there soonest.
WARMSTART = dict(num_layers=2, batch_tokens=1024, lr=5e-3, warmup_steps=20)


@pytest.fixture(autouse=True)
def _single_thread(one_thread):
    """Every test here runs on one thread (see conftest.one_thread)."""


@pytest.fixture(scope="module")
def bandit_policy(tmp_path_factory) -> Path:
    # The Bandit oracle pulls a random arm, so the warm start knows the format, not the better arm.
    return warmstart(tmp_path_factory.mktemp("warmstart") / "bandit", envs=("bandit",), episodes_per_env=500,
                     steps=800, **WARMSTART)


def _train(policy: Path, run_dir: Path, preset: str, steps: int, *overrides: str) -> tuple[dict, dict]:
    """Run RL; return the step-0 and final evaluation records."""
    config = load_config(preset, [
        f"model.path={policy}", "model.device=cpu", f"trainer.run_dir={run_dir}",
        f"trainer.total_steps={steps}", f"trainer.eval_every={steps}", "trainer.save_every=0",
        "collapse.enable=false", "logging.progress=false", "logging.tensorboard=false", *overrides,
    ])
    train(config)
    evals = [r for r in read_metrics(run_dir) if "eval/success_rate" in r]
    assert [r["step"] for r in evals] == [0, steps]
    return evals[0], evals[-1]


@pytest.mark.parametrize("algo", ["grpo", "ppo"])
def test_bandit_learns_the_high_expected_value_arm(bandit_policy, tmp_path, algo):
    before, after = _train(
        bandit_policy, tmp_path, f"bandit-{algo}", 20, "trainer.eval_episodes=200", "optim.lr=5e-4",
    )
    assert before["eval/success_rate"] < 0.7
    assert after["eval/success_rate"] >= 0.8, (before, after)
