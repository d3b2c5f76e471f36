"""Bi-level GAE: a hand-computed case and agreement with RAGEN's code on random cases."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from ragen2.rl.advantages import bi_level_gae


def test_hand_computed_case():
    # Two turns of two model tokens; rewards 1 and 2 on the turn ends; gamma = lam = 1, high-level gamma 0.5.
    # Turn level: end 2: 2 - 0.4 = 1.6; end 1: 1 + 0.5 * 0.4 - 0.2 + 0.5 * 1.6 = 1.8. Turn returns: 2.0 and 2.0.
    # Token level: 1.6, then 0.4 - 0.3 + 1.6 = 1.7; 1.8, then 0.2 - 0.1 + 1.8 = 1.9.
    mask = torch.tensor([[1.0, 1, 0, 1, 1]])
    rewards = torch.tensor([[0.0, 1, 0, 0, 2]])
    values = torch.tensor([[0.1, 0.2, 0.0, 0.3, 0.4]])
    advantages, returns = bi_level_gae(rewards, values, mask, gamma=1.0, lam=1.0, high_level_gamma=0.5)
    torch.testing.assert_close(returns, torch.tensor([[2.0, 2.0, 0, 2.0, 2.0]]))
    raw = torch.tensor([1.9, 1.8, 1.7, 1.6])
    whitened = (raw - 1.75) / math.sqrt(0.05 / 3 + 1e-8)
    torch.testing.assert_close(advantages[0, [0, 1, 3, 4]], whitened)
    assert advantages[0, 2] == 0


def test_a_turn_with_zero_reward_is_still_a_turn():
    """RAGEN finds turn ends by their nonzero rewards; a row whose last model token has reward 0
    crashes there. Here a turn ends where its run of model tokens ends, whatever its reward."""
    mask = torch.tensor([[1.0, 1, 0, 1]])
    advantages, returns = bi_level_gae(torch.zeros(1, 4), torch.zeros(1, 4), mask)
    assert returns.abs().sum() == 0 and torch.isfinite(advantages).all()


# ----------------------------------------------------------------------------- against RAGEN


def reference_bi_level_gae(token_level_rewards, values, loss_mask, gamma, lam, high_level_gamma):
    """RAGEN's compute_bi_level_gae_advantage_return restated (ragen/trainer/core_algos.py, lines 94-182,
    github.com/mll-lab-nu/RAGEN at 20daedc), with verl's masked_whiten (verl/utils/torch_functional.py:
    masked mean, unbiased masked variance, rsqrt(var + 1e-8)) written out."""
    token_level_rewards = token_level_rewards.float()
    reward_mask = token_level_rewards.bool()
    batch_size, _ = token_level_rewards.shape
    advantages = torch.zeros_like(token_level_rewards)
    returns = torch.zeros_like(token_level_rewards)
    updated_reward = token_level_rewards.clone()
    for b in range(batch_size):
        eos_positions = reward_mask[b].nonzero(as_tuple=True)[0]
        lastgaelam = 0.0
        for i in range(len(eos_positions) - 1, -1, -1):
            curr_pos = eos_positions[i]
            nextvalue = values[b, eos_positions[i + 1]] if i < len(eos_positions) - 1 else 0.0
            delta = updated_reward[b, curr_pos] + high_level_gamma * nextvalue - values[b, curr_pos]
            lastgaelam = delta + high_level_gamma * lam * lastgaelam
            advantages[b, curr_pos] = lastgaelam
        for pos in eos_positions:
            returns[b, pos] = advantages[b, pos] + values[b, pos]
            updated_reward[b, pos] = advantages[b, pos] + values[b, pos]
        lastgaelam = 0.0
        valid_positions = loss_mask[b].nonzero(as_tuple=True)[0]
        for i in range(len(valid_positions) - 1, -1, -1):
            curr_pos = valid_positions[i]
            if curr_pos not in eos_positions:
                nextvalue = values[b, valid_positions[i + 1]]
            else:
                nextvalue = 0.0
                lastgaelam = 0.0
            delta = updated_reward[b, curr_pos] + gamma * nextvalue - values[b, curr_pos]
            lastgaelam = delta + gamma * lam * lastgaelam
            advantages[b, curr_pos] = lastgaelam
            returns[b, curr_pos] = lastgaelam + values[b, curr_pos]
    mean = (advantages * loss_mask).sum() / loss_mask.sum()
    centered = advantages - mean
    var = (centered**2 * loss_mask).sum() / loss_mask.sum() * loss_mask.sum() / (loss_mask.sum() - 1)
    return centered * torch.rsqrt(var + 1e-8), returns


def _random_case(rng: np.random.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rows of 1 to 4 turns, each a run of model tokens whose last token carries a nonzero reward
    (where RAGEN's turn ends, found by nonzero rewards, and ragen2's, found by the runs, agree)."""
    rows = int(rng.integers(1, 5))
    masks, rewards = [], []
    for _ in range(rows):
        mask, reward = [0] * int(rng.integers(0, 3)), []
        for _ in range(int(rng.integers(1, 5))):
            run = int(rng.integers(1, 5))
            mask += [1] * run + [0] * int(rng.integers(1, 3))
        reward = [0.0] * len(mask)
        for t in range(len(mask)):
            if mask[t] and not mask[t + 1]:
                reward[t] = float(rng.choice([1.0, -0.5, 0.3, 2.0]))
        masks.append(mask)
        rewards.append(reward)
    width = max(len(m) for m in masks)
    mask = torch.tensor([m + [0] * (width - len(m)) for m in masks], dtype=torch.float32)
    reward = torch.tensor([r + [0.0] * (width - len(r)) for r in rewards])
    values = torch.tensor(rng.normal(size=mask.shape), dtype=torch.float32)
    return reward, values, mask


def test_agrees_with_ragen_on_random_cases():
    rng = np.random.default_rng(0)
    for case in range(500):
        rewards, values, mask = _random_case(rng)
        gamma, lam, high = (float(rng.choice(c)) for c in ([1.0, 0.99, 0.9], [1.0, 0.95, 0.5], [0.95, 1.0, 0.8]))
        ours = bi_level_gae(rewards, values, mask, gamma, lam, high)
        theirs = reference_bi_level_gae(rewards, values, mask, gamma, lam, high)
        valid = mask > 0
        if valid.sum() < 2:
            continue  # one token has no spread: whitening divides 0 by sqrt(1e-8) on both sides
        for name, a, b in zip(("advantages", "returns"), ours, theirs):
            torch.testing.assert_close(a[valid], b[valid], rtol=1e-4, atol=1e-4, msg=f"case {case}: {name}")


@pytest.mark.parametrize("shape", [(2, 3), (3, 5)])
def test_shapes_must_agree(shape):
    with pytest.raises(ValueError):
        bi_level_gae(torch.zeros(shape), torch.zeros(2, 4), torch.ones(shape))


def test_the_trainer_places_turn_rewards_on_turn_ends_for_bi_level_gae(policy_dir, tmp_path):
    from ragen2.agent.types import Trajectory, Turn
    from ragen2.config import load_config
    from ragen2.rl import trainer

    def turn(reward: float) -> Turn:
        return Turn(prompt_ids=[], response_ids=[], response_text="", reasoning="", reasoning_span=(0, 0),
                    actions=[], format_valid=True, actions_valid=True, reward=reward, observation="")

    episode = Trajectory("frozenlake", 0, 0, [turn(0.5), turn(2.0)], [([1, 1, 5, 6, 1, 7, 1], [0, 0, 1, 1, 0, 1, 0])],
                         episode_return=2.5)
    config = load_config("bandit-ppo", [f"model.path={policy_dir}", "model.device=cpu", f"trainer.run_dir={tmp_path}",
                                        "algo.bi_level_gae=true", "algo.turn_rewards=true", "algo.gamma=0.9",
                                        "algo.lam=0.8", "algo.high_level_gamma=0.7", "logging.tensorboard=false"])
    run = trainer.setup(config)
    batch = trainer.advantage_phase(run, [episode])
    token_rewards = torch.tensor([[0.0, 0, 0.5, 0, 2.0, 0]])  # the mask shifted by one: turns end at 2 and 4
    expected, targets = bi_level_gae(token_rewards, batch.old_values, batch.mask, 0.9, 0.8, 0.7)
    torch.testing.assert_close(batch.advantages, expected)
    torch.testing.assert_close(batch.value_targets, targets)
    run.lock.release()


def test_bi_level_gae_and_turn_rewards_need_an_estimator_that_reads_them():
    from ragen2.config import load_config
    from ragen2.errors import ConfigError

    with pytest.raises(ConfigError, match="algo.bi_level_gae=true needs the critic of algo.name=ppo"):
        load_config("bandit", ["algo.bi_level_gae=true"])
    with pytest.raises(ConfigError, match="algo.turn_rewards=true places rewards on tokens"):
        load_config("bandit", ["algo.turn_rewards=true"])
