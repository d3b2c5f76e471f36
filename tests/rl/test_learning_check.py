"""The short learning check of `make test`: GRPO from a small Bandit warm start raises held-out success.

Unit tests check each piece of the update; this checks that together they still learn. A flipped
advantage sign, an all-zero loss mask and a skipped optimizer step each failed it; a mask that also
trains on prompt tokens only slowed learning (group members share their prompt and GRPO's advantages
sum to zero in a group) and passed: test_trainer.py's batch and advantage tests catch that one
(docs/testing.md). About 40 s on one thread, warm start included, where test_learning.py's Bandit
tests (`make test-learning`) take minutes.

The Bandit oracle pulls a random arm, so the warm start knows the answer format, not the better
arm: RL has to learn it from rewards. `RAGEN2_LEARNING_SEED` sets `trainer.seed` here too.
"""

from __future__ import annotations

import pytest
from learning_helpers import rise_in_standard_errors, train_and_evaluate, warmstart_one_thread

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]

# Half the width, half the vocabulary, fewer episodes and fewer steps at twice the learning rate of
# test_learning.py's Bandit warm start: 10 to 13 s instead of 38 s (on a loaded 2-core machine), and
# it still copies the arm names (held-out success about 0.39). In trials, width 128 at lr 5e-3 had not
# learned to copy them after 300 or 400 steps (success about 0.09: answers that name no arm); one
# layer had, but a third of its rollouts at temperature 1.5 were malformed and one RL step broke the
# format of some runs for good.
WARMSTART = dict(envs=("bandit",), episodes_per_env=300, steps=500, hidden_size=64, intermediate_size=192,
                 vocab_size=512, num_layers=2, batch_tokens=1024, lr=1e-2, warmup_steps=20)
# test_learning.py's Bandit GRPO at twice its learning rate and temperature 1.0, for 20 steps instead of
# 50; 400 held-out episodes (cheap: under a second each time) put the standard error of the rise
# at 0.031 to 0.035, against gains of 0.22 to 0.45 on trainer seeds 0..4.
STEPS = 20
RL = ("trainer.eval_episodes=400", "optim.lr=1e-3", "rollout.num_groups=64", "rollout.group_size=4",
      "algo.ppo_epochs=2")


def test_grpo_raises_bandit_success_from_a_small_warm_start(tmp_path, learning_seed):
    policy = warmstart_one_thread(tmp_path / "warmstart", **WARMSTART)
    before, after = train_and_evaluate(policy, tmp_path / "run", "bandit-grpo", STEPS, *RL, seed=learning_seed)
    assert rise_in_standard_errors(before, after) > 3, (before, after)
