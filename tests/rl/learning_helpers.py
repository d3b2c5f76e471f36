"""What the learning tests share: a small Bandit warm start's settings, an RL run that reports its two evaluations,
and the rise of held-out success in standard errors (tests/rl/test_learning.py, test_learning_check.py)."""

from __future__ import annotations

import math
from pathlib import Path

from ragen2.config import load_config
from ragen2.rl.trainer import train
from ragen2.tracking import read_metrics


# Half the width, half the vocabulary, fewer episodes and fewer steps at twice the learning rate of
# test_learning.py's Bandit warm start: 10 to 13 s instead of 38 s (on a loaded 2-core machine), and
# it still copies the arm names (held-out success about 0.39). In trials, width 128 at lr 5e-3 had not
# learned to copy them after 300 or 400 steps (success about 0.09: answers that name no arm); one
# layer had, but a third of its rollouts at temperature 1.5 were malformed and one RL step broke the
# format of some runs for good.
SMALL_BANDIT_WARMSTART = dict(envs=("bandit",), episodes_per_env=300, steps=500, hidden_size=64,
                              intermediate_size=192, vocab_size=512, num_layers=2, batch_tokens=1024, lr=1e-2,
                              warmup_steps=20)


def train_and_evaluate(
    policy: Path, run_dir: Path, preset: str, steps: int, *overrides: str, seed: int
) -> tuple[dict, dict]:
    """Run RL with `trainer.seed=seed`; return the step-0 and final evaluation records.

    `trainer.eval_every = steps` makes the trainer evaluate the warm start at step 0 and the
    policy after the last step, on the same held-out seeds.
    """
    config = load_config(preset, [
        f"model.path={policy}", "model.device=cpu", f"trainer.run_dir={run_dir}", f"trainer.seed={seed}",
        f"trainer.total_steps={steps}", f"trainer.eval_every={steps}", "trainer.save_every=0",
        "collapse.enable=false", "logging.progress=false", "logging.tensorboard=false", *overrides,
    ])
    train(config)
    evals = [r for r in read_metrics(run_dir) if "eval/success_rate" in r]
    steps_evaluated = [r["step"] for r in evals]
    assert steps_evaluated == [0, steps], (
        f"evaluated at steps {steps_evaluated}: the run stopped early ({run_dir}/events.jsonl says why)"
    )
    return evals[0], evals[-1]


def rise_in_standard_errors(before: dict, after: dict) -> float:
    """The rise of held-out success in units of the standard error of the difference."""
    gain = after["eval/success_rate"] - before["eval/success_rate"]
    return gain / math.sqrt(before["eval/success_stderr"] ** 2 + after["eval/success_stderr"] ** 2)
