"""`rollout_correction`: verl 0.6.1's importance weights and rejection masks, on worked examples and against a
re-statement of verl's code on random cases, and its effect on the policy loss."""

from __future__ import annotations

import math

import pytest
import torch

from ragen2.errors import ConfigError
from ragen2.rl.losses import policy_loss, rollout_correction

# ------------------------------------------------------------------ verl 0.6.1, restated
# verl/trainer/ppo/rollout_corr_helper.py at tag v0.6.1 (github.com/volcengine/verl), and
# verl/utils/torch_functional.py for masked_sum / masked_mean. Only what decides the weights and the mask is
# restated; verl's metrics, its batch normalisation and its token veto (both off by default) are left out.

SAFETY_BOUND = 20.0  # rollout_corr_helper.py:79


def verl_masked_sum(values, mask, axis=None):  # torch_functional.py:163-168
    valid_values = torch.where(mask.bool(), values, 0.0)
    return (valid_values * mask).sum(axis=axis)


def verl_masked_mean(values, mask, axis=None):  # torch_functional.py:171-185
    s = verl_masked_sum(values, mask, axis)
    return s / (mask.sum(axis=axis) + 1e-8)


def verl_weights(log_ratio, response_mask, rollout_is, rollout_is_threshold):
    """compute_rollout_correction_weights, rollout_corr_helper.py:318-427 (batch_normalize=False)."""
    if rollout_is == "token":  # :368-371
        rollout_is_weights = torch.exp(torch.clamp(log_ratio, min=-SAFETY_BOUND, max=SAFETY_BOUND))
    else:  # "sequence", :373-381
        log_ratio_sum = verl_masked_sum(log_ratio, response_mask, axis=-1).unsqueeze(-1)
        rollout_is_weights = torch.exp(torch.clamp(log_ratio_sum, min=-SAFETY_BOUND, max=SAFETY_BOUND)).expand_as(
            log_ratio)
    rollout_is_weights = rollout_is_weights * response_mask  # :387
    rollout_is_weights = rollout_is_weights.clamp(max=rollout_is_threshold)  # :399
    return rollout_is_weights.detach()  # :403


def verl_rejection(log_ratio, response_mask, rollout_rs, rollout_rs_threshold, rollout_rs_threshold_lower):
    """compute_rollout_rejection_mask, rollout_corr_helper.py:82-193."""
    upper_threshold = rollout_rs_threshold  # :130-131
    lower_threshold = rollout_rs_threshold_lower if rollout_rs_threshold_lower is not None else 1.0 / upper_threshold
    if rollout_rs == "token":  # :134-138
        rollout_is_weights = torch.exp(torch.clamp(log_ratio, min=-SAFETY_BOUND, max=SAFETY_BOUND))
    elif rollout_rs == "sequence":  # :140-148
        log_ratio_sum = verl_masked_sum(log_ratio, response_mask, axis=-1).unsqueeze(-1)
        rollout_is_weights = torch.exp(torch.clamp(log_ratio_sum, min=-SAFETY_BOUND, max=SAFETY_BOUND)).expand_as(
            log_ratio)
    else:  # "geometric", :150-158
        log_ratio_mean = verl_masked_mean(log_ratio, response_mask, axis=-1).unsqueeze(-1)
        rollout_is_weights = torch.exp(torch.clamp(log_ratio_mean, min=-SAFETY_BOUND, max=SAFETY_BOUND)).expand_as(
            log_ratio)
    mask = ((rollout_is_weights >= lower_threshold) & (rollout_is_weights <= upper_threshold)).float()  # :164-165
    return response_mask * mask  # :191


def verl_correction(old_log_prob, rollout_log_prob, response_mask, rollout_is, rollout_is_threshold, rollout_rs,
                    rollout_rs_threshold, rollout_rs_threshold_lower):
    """compute_rollout_correction_and_rejection_mask, rollout_corr_helper.py:545-697 (veto off)."""
    log_ratio = old_log_prob - rollout_log_prob  # :615
    weights = None
    if rollout_is is not None and rollout_is_threshold is not None:  # :621
        weights = verl_weights(log_ratio, response_mask, rollout_is, rollout_is_threshold)
    modified_response_mask = response_mask.clone()  # :632
    if rollout_rs is not None:  # :633
        modified_response_mask = verl_rejection(log_ratio, response_mask, rollout_rs, rollout_rs_threshold,
                                                rollout_rs_threshold_lower)
    return weights, modified_response_mask


# ------------------------------------------------------------------ the comparison


def random_case(gen: torch.Generator) -> dict:
    """Log-probs whose ratios straddle the thresholds, ragged masks, and every combination of options."""
    B, T = int(torch.randint(1, 6, (1,), generator=gen)), int(torch.randint(1, 9, (1,), generator=gen))
    logp = -torch.rand(B, T, generator=gen, dtype=torch.float64) * 3
    spread = float(torch.rand(1, generator=gen)) * 2.5
    rollout_logp = logp + torch.randn(B, T, generator=gen, dtype=torch.float64) * spread
    mask = (torch.rand(B, T, generator=gen) < 0.7).double()
    mask[:, 0] = 1.0  # verl refuses a mask with no valid token
    choose = lambda options: options[int(torch.randint(len(options), (1,), generator=gen))]  # noqa: E731
    upper = choose([1.2, 2.0, 5.0])
    return {
        "logp": logp, "rollout_logp": rollout_logp, "mask": mask,
        "rollout_is": choose([None, "token", "sequence"]),
        "rollout_is_threshold": choose([1.5, 2.0, 10.0]),
        "rollout_rs": choose([None, "token", "sequence", "geometric"]),
        "rollout_rs_threshold": upper,
        "rollout_rs_threshold_lower": choose([None, 0.5, 1.0 / (2 * upper)]),
    }


def test_agrees_with_verl_on_random_cases():
    gen = torch.Generator().manual_seed(0)
    seen = {"rejected": 0, "truncated": 0}
    for _ in range(600):
        case = random_case(gen)
        weights, mask = rollout_correction(**case)
        want_weights, want_mask = verl_correction(
            case["logp"], case["rollout_logp"], case["mask"], case["rollout_is"], case["rollout_is_threshold"],
            case["rollout_rs"], case["rollout_rs_threshold"], case["rollout_rs_threshold_lower"],
        )
        assert (weights is None) == (want_weights is None)
        if weights is not None:
            torch.testing.assert_close(weights, want_weights, rtol=1e-12, atol=0)
            seen["truncated"] += int((weights == case["rollout_is_threshold"]).any())
        assert torch.equal(mask, want_mask), case
        seen["rejected"] += int((mask < case["mask"]).any())
    assert seen["rejected"] > 100 and seen["truncated"] > 100  # the cases exercise both rules


def test_token_weights_worked_example():
    logp = torch.log(torch.tensor([[0.5, 0.2, 0.9]]))
    rollout_logp = torch.log(torch.tensor([[0.25, 0.4, 0.3]]))
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    weights, kept = rollout_correction(logp, rollout_logp, mask, rollout_is="token", rollout_is_threshold=1.5)
    # ratios 2.0, 0.5, 3.0 -> truncated at 1.5, kept, and 0 off the mask
    torch.testing.assert_close(weights, torch.tensor([[1.5, 0.5, 0.0]]))
    assert torch.equal(kept, mask)


def test_sequence_weights_are_the_product_over_the_row():
    logp = torch.log(torch.tensor([[0.5, 0.2, 0.9], [0.3, 0.3, 0.3]]))
    rollout_logp = torch.log(torch.tensor([[0.25, 0.8, 0.1], [0.6, 0.3, 0.3]]))
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    weights, _ = rollout_correction(logp, rollout_logp, mask, rollout_is="sequence", rollout_is_threshold=2.0)
    # row 0: 2.0 x 0.25 = 0.5 (token 3 is masked out); row 1: 0.5 x 1 x 1 = 0.5
    torch.testing.assert_close(weights, torch.tensor([[0.5, 0.5, 0.0], [0.5, 0.5, 0.5]]))


@pytest.mark.parametrize("level, expected", [
    ("token", [[0.0, 0.0], [1.0, 1.0]]),  # 4 > 3 and 0.25 < 1/3 go; row 1's 2 and 2 stay
    ("sequence", [[1.0, 1.0], [0.0, 0.0]]),  # products 1 (kept) and 4 (above 3)
    ("geometric", [[1.0, 1.0], [1.0, 1.0]]),  # geometric means 1 and 2, both inside
])
def test_rejection_worked_examples(level: str, expected: list[list[float]]):
    # row 0: ratios 4 and 0.25; row 1: ratios 2 and 2; kept range [1/3, 3]
    logp = torch.log(torch.tensor([[0.8, 0.1], [0.4, 0.6]]))
    rollout_logp = torch.log(torch.tensor([[0.2, 0.4], [0.2, 0.3]]))
    weights, kept = rollout_correction(logp, rollout_logp, torch.ones(2, 2), rollout_rs=level, rollout_rs_threshold=3.0)
    assert weights is None
    assert kept.tolist() == expected


def test_lower_bound_defaults_to_the_inverse_and_can_be_set():
    logp = torch.log(torch.tensor([[0.1, 0.5]]))
    rollout_logp = torch.log(torch.tensor([[0.4, 0.5]]))  # ratios 0.25 and 1
    mask = torch.ones(1, 2)
    _, kept = rollout_correction(logp, rollout_logp, mask, rollout_rs="token", rollout_rs_threshold=2.0)
    assert kept.tolist() == [[0.0, 1.0]]  # 0.25 < 1/2
    _, kept = rollout_correction(logp, rollout_logp, mask, rollout_rs="token", rollout_rs_threshold=2.0,
                                 rollout_rs_threshold_lower=0.2)
    assert kept.tolist() == [[1.0, 1.0]]


def test_both_off_changes_nothing():
    mask = torch.tensor([[1.0, 0.0]])
    weights, kept = rollout_correction(torch.zeros(1, 2), torch.ones(1, 2), mask)
    assert weights is None and torch.equal(kept, mask)


def test_bad_options_name_the_key():
    x, mask = torch.zeros(1, 2), torch.ones(1, 2)
    with pytest.raises(ConfigError, match="algo.rollout_is 'tokens'.*Did you mean: token"):
        rollout_correction(x, x, mask, rollout_is="tokens")
    with pytest.raises(ConfigError, match="algo.rollout_rs_threshold is null"):
        rollout_correction(x, x, mask, rollout_rs="geometric")
    with pytest.raises(ConfigError, match="algo.rollout_is_threshold=0"):
        rollout_correction(x, x, mask, rollout_is="token", rollout_is_threshold=0)


def test_weights_multiply_the_clipped_per_token_loss():
    """A weight of w on a token scales its loss, and its gradient, by w (verl's pg_losses * rollout_is_weights)."""
    logp = torch.log(torch.tensor([[0.5, 0.2]])).requires_grad_()
    old_logp = torch.log(torch.tensor([[0.4, 0.2]]))
    advantages = torch.tensor([[1.0, -2.0]])
    mask = torch.ones(1, 2)
    weights = torch.tensor([[0.5, 2.0]])
    loss, _ = policy_loss(logp, old_logp, advantages, mask, 0.2, 0.28, "token-mean", weights=weights)
    # token 0: ratio 1.25 within [0.8, 1.28] -> -1 x 1.25; token 1: ratio 1 -> +2; weighted mean over 2 tokens
    assert loss.item() == pytest.approx((0.5 * -1.25 + 2.0 * 2.0) / 2)
    loss.backward()
    # d/dlogp of -A r w / 2 = -A r w / 2
    torch.testing.assert_close(logp.grad, torch.tensor([[-1.25 * 0.5 / 2, 2.0 * 2.0 / 2]]))
    assert math.isfinite(loss.item())


# ------------------------------------------------------------------ AReaL's decoupled PPO objective, restated
# Fu et al. 2025, "AReaL" (arXiv 2505.24298), eq. 5; its actor loss with a proximal policy (github.com/inclusionAI/
# AReaL, realhf/impl/model/utils/ppo_functional.py, actor_loss_fn): the clipped ratio is taken against the proximal
# policy, and the behaviour weight pi_prox / pi_behav multiplies the loss, dropped to 0 above its cap; the mean is
# over the original mask.


def areal_decoupled_loss(logprobs, proximal_logprobs, old_logprobs, advantages, eps_clip, eps_clip_higher, c_clip,
                         behav_imp_weight_cap, loss_mask):
    loss_mask = loss_mask.bool()
    ratio = torch.where(loss_mask, torch.exp(logprobs - proximal_logprobs), 0)
    clipped_ratio = torch.clamp(ratio, 1.0 - eps_clip, 1.0 + eps_clip_higher)
    pg_loss = torch.max(-advantages * ratio, -advantages * clipped_ratio)
    pg_loss = torch.min(pg_loss, torch.sign(advantages) * c_clip * advantages)
    behav_imp_weight = (proximal_logprobs - old_logprobs).exp()
    behav_mask = loss_mask if behav_imp_weight_cap is None else (behav_imp_weight <= behav_imp_weight_cap) & loss_mask
    pg_loss = pg_loss * torch.where(behav_mask, behav_imp_weight, 0.0)
    return torch.where(loss_mask, pg_loss, 0).sum() / loss_mask.count_nonzero(), behav_mask


@pytest.mark.parametrize("cap", [None, 2.0])
def test_token_correction_is_areals_decoupled_objective(cap: float | None):
    """pi_old (the policy before the update) is AReaL's proximal policy and the recorded log-probs its behaviour
    policy: token-level weights untruncated give AReaL's loss and gradient exactly; AReaL's cap is rejection of the
    tokens above it (algo.rollout_rs=token, lower bound 0), which also takes them out of the token mean's count,
    where AReaL keeps them with weight 0: the two losses differ by the factor kept / valid tokens."""
    gen = torch.Generator().manual_seed(7)
    for _ in range(200):
        case = random_case(gen)
        prox, behav, mask = case["logp"], case["rollout_logp"], case["mask"]
        advantages = torch.randn(prox.shape, generator=gen, dtype=torch.float64)
        start = prox + torch.randn(prox.shape, generator=gen, dtype=torch.float64) * 0.3
        ours_logp, theirs_logp = start.clone().requires_grad_(), start.clone().requires_grad_()
        weights, kept = rollout_correction(prox, behav, mask, rollout_is="token", rollout_is_threshold=cap or math.inf,
                                           rollout_rs=None if cap is None else "token", rollout_rs_threshold=cap,
                                           rollout_rs_threshold_lower=0.0)
        if not kept.any():
            continue
        ours, _ = policy_loss(ours_logp, prox, advantages, kept, 0.2, 0.28, "token-mean", 3.0, weights=weights)
        theirs, behav_mask = areal_decoupled_loss(theirs_logp, prox, behav, advantages, 0.2, 0.28, 3.0, cap, mask)
        torch.testing.assert_close(kept.bool(), behav_mask)
        factor = kept.sum() / mask.sum()
        torch.testing.assert_close(ours * factor, theirs)
        (ours * factor).backward()
        theirs.backward()
        torch.testing.assert_close(ours_logp.grad, theirs_logp.grad)
