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
from learning_helpers import rise_in_standard_errors, train_and_evaluate

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]

# test_learning.py's Bandit GRPO at twice its learning rate and temperature 1.0, for 20 steps instead of
# 50; 400 held-out episodes (cheap: under a second each time) put the standard error of the rise
# at 0.031 to 0.035, against gains of 0.22 to 0.45 on trainer seeds 0..4.
STEPS = 20
RL = ("trainer.eval_episodes=400", "optim.lr=1e-3", "rollout.num_groups=64", "rollout.group_size=4",
      "algo.ppo_epochs=2")


def test_grpo_raises_bandit_success_from_a_small_warm_start(small_bandit_policy, tmp_path, learning_seed):
    before, after = train_and_evaluate(small_bandit_policy, tmp_path / "run", "bandit-grpo", STEPS, *RL,
                                       seed=learning_seed)
    assert rise_in_standard_errors(before, after) > 3, (before, after)
