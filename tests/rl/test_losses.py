"""Losses, KL estimators, entropy and aggregation: worked examples, references and invariances."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from helpers import PROPERTY_SETTINGS, t64
from ragen2.errors import ConfigError
from ragen2.rl.losses import (
    AGG_MODES,
    KL_ESTIMATORS,
    aggregate,
    entropy_from_logits,
    kl_penalty,
    masked_mean,
    masked_whiten,
    policy_loss,
    token_logprobs,
    token_logprobs_and_entropy,
    value_loss,
)


@st.composite
def ragged_batch(draw: st.DrawFn) -> tuple[torch.Tensor, torch.Tensor]:
    """A [B, T] loss matrix and a 0/1 mask whose rows have different lengths (some empty)."""
    batch = draw(st.integers(1, 5))
    length = draw(st.integers(1, 7))
    cells = batch * length
    values = draw(st.lists(st.floats(-10, 10), min_size=cells, max_size=cells))
    mask = draw(st.lists(st.integers(0, 1), min_size=cells, max_size=cells))
    return t64(values).reshape(batch, length), t64(mask).reshape(batch, length)


def aggregate_reference(
    loss: torch.Tensor, mask: torch.Tensor, mode: str, norm_tokens: float | None
) -> float:
    rows = [
        [float(x) for x, m in zip(loss_row, mask_row) if m > 0] for loss_row, mask_row in zip(loss, mask)
    ]
    rows = [row for row in rows if row]
    if not rows:
        return 0.0
    if mode == "token-mean":
        return sum(map(sum, rows)) / sum(map(len, rows))
    if mode == "seq-mean-token-mean":
        return sum(sum(row) / len(row) for row in rows) / len(rows)
    return sum(sum(row) / (norm_tokens or 1.0) for row in rows) / len(rows)


# --- masked helpers ------------------------------------------------------------------------------


def test_masked_mean_and_whiten_known_answer() -> None:
    values = t64([[1.0, 100.0, 3.0], [5.0, -7.0, 100.0]])
    mask = t64([[1, 0, 1], [1, 1, 0]])
    assert float(masked_mean(values, mask)) == pytest.approx(0.5)
    torch.testing.assert_close(masked_mean(values, mask, dim=1), t64([2.0, -1.0]))
    # valid entries 1, 3, 5, -7: mean 0.5, unbiased variance 83 / 3
    whitened = masked_whiten(values, mask)
    std = math.sqrt(83 / 3 + 1e-8)
    torch.testing.assert_close(whitened[mask > 0], t64([0.5, 2.5, 4.5, -7.5]) / std)
    rescaled = masked_whiten(values, mask, shift_mean=False)
    torch.testing.assert_close(rescaled[mask > 0], t64([0.5, 2.5, 4.5, -7.5]) / std + 0.5)


def test_masked_helpers_on_empty_and_single_selection() -> None:
    values = t64([[3.0, 4.0]])
    assert float(masked_mean(values, torch.zeros(1, 2))) == 0.0
    assert float(masked_whiten(values, t64([[0, 1]]))[0, 1]) == 0.0


def test_masked_out_inf_and_nan_do_not_leak() -> None:
    values = t64([[1.0, math.inf, 3.0, math.nan]])
    mask = t64([[1, 0, 1, 0]])
    assert float(masked_mean(values, mask)) == 2.0
    expected = {"token-mean": 2.0, "seq-mean-token-mean": 2.0, "seq-mean-token-sum": 4.0}
    for mode in AGG_MODES:
        assert float(aggregate(values, mask, mode)) == expected[mode]


# --- aggregation ---------------------------------------------------------------------------------


def test_aggregate_modes_on_ragged_mask() -> None:
    loss = t64([[1, 2, 3, 4], [5, 6, 7, 8], [9, 9, 9, 9]])
    mask = t64([[1, 1, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0]])  # lengths 2, 4, and an empty row
    assert float(aggregate(loss, mask, "token-mean")) == pytest.approx(29 / 6)
    assert float(aggregate(loss, mask, "seq-mean-token-mean")) == pytest.approx((1.5 + 6.5) / 2)
    assert float(aggregate(loss, mask, "seq-mean-token-sum")) == pytest.approx((3 + 26) / 2)
    dr_grpo = aggregate(loss, mask, "seq-mean-token-sum", norm_tokens=4)
    assert float(dr_grpo) == pytest.approx((3 + 26) / 2 / 4)


def test_aggregate_of_all_masked_batch_is_zero() -> None:
    for mode in AGG_MODES:
        assert float(aggregate(torch.ones(2, 3), torch.zeros(2, 3), mode)) == 0.0


@PROPERTY_SETTINGS
@given(ragged_batch(), st.sampled_from(AGG_MODES), st.sampled_from([None, 3.0]))
def test_aggregate_matches_loop_reference(
    case: tuple[torch.Tensor, torch.Tensor], mode: str, norm_tokens: float | None
) -> None:
    loss, mask = case
    norm = norm_tokens if mode == "seq-mean-token-sum" else None
    got = float(aggregate(loss, mask, mode, norm))
    assert got == pytest.approx(aggregate_reference(loss, mask, mode, norm), abs=1e-9)


@PROPERTY_SETTINGS
@given(ragged_batch(), st.sampled_from(AGG_MODES), st.integers(1, 5))
def test_micro_batches_with_batch_counts_sum_to_the_full_loss(
    case: tuple[torch.Tensor, torch.Tensor], mode: str, micro: int
) -> None:
    """Gradient accumulation invariance: k micro-batches of size n equal one batch of k * n."""
    loss, mask = case
    tokens = (mask > 0).sum()
    seqs = ((mask > 0).sum(dim=1) > 0).sum()
    pieces = [
        aggregate(l, m, mode, batch_tokens=tokens, batch_seqs=seqs)
        for l, m in zip(loss.split(micro), mask.split(micro))
    ]
    assert float(sum(pieces)) == pytest.approx(float(aggregate(loss, mask, mode)), abs=1e-9)


def test_aggregate_rejects_unknown_mode_with_suggestion() -> None:
    with pytest.raises(ConfigError, match=r"algo.loss_agg.*Did you mean: token-mean"):
        aggregate(torch.ones(1, 2), torch.ones(1, 2), "token_mean")


def test_aggregate_rejects_norm_tokens_outside_token_sum() -> None:
    with pytest.raises(ConfigError, match="norm_tokens=4 only applies to 'seq-mean-token-sum'"):
        aggregate(torch.ones(1, 2), torch.ones(1, 2), "token-mean", norm_tokens=4)


def test_aggregate_rejects_mismatched_shapes() -> None:
    with pytest.raises(ValueError, match=r"loss_mat \(2, 3\), mask \(2, 4\)"):
        aggregate(torch.ones(2, 3), torch.ones(2, 4))


# --- policy loss ---------------------------------------------------------------------------------


def test_policy_loss_known_answer() -> None:
    ratios = t64([[1.5, 0.9, 0.5, 1.1]])
    adv = t64([[1.0, 1.0, -1.0, -1.0]])
    # per token: max(-1.5, -1.28) = -1.28, -0.9, max(0.5, 0.8) = 0.8, 1.1 -> mean -0.07
    old = torch.zeros(1, 4, dtype=torch.float64)
    loss, stats = policy_loss(ratios.log(), old, adv, torch.ones(1, 4))
    assert float(loss) == pytest.approx(-0.07)
    assert float(stats["clipfrac"]) == pytest.approx(0.5)
    assert float(stats["clipfrac_high"]) == pytest.approx(0.25)
    assert float(stats["clipfrac_low"]) == pytest.approx(0.25)
    assert float(stats["dual_clipfrac"]) == 0.0
    assert float(stats["ratio_mean"]) == pytest.approx(1.0)
    expected_kl = sum(r - 1 - math.log(r) for r in (1.5, 0.9, 0.5, 1.1)) / 4
    assert float(stats["approx_kl"]) == pytest.approx(expected_kl)
    assert all(not v.requires_grad and v.ndim == 0 for v in stats.values())


def test_policy_loss_dual_clip_caps_negative_advantage_tokens() -> None:
    logp = t64([[math.log(5.0), math.log(5.0)]])
    adv = t64([[-1.0, 1.0]])
    # A < 0, r = 5: max(5, 1.28) = 5, capped at 3. A > 0, r = 5: -1.28, untouched.
    loss, stats = policy_loss(logp, torch.zeros_like(logp), adv, torch.ones(1, 2), dual_clip=3.0)
    assert float(loss) == pytest.approx((3.0 - 1.28) / 2)
    assert float(stats["dual_clipfrac"]) == pytest.approx(0.5)


def _grad_at_ratio(ratio: float, advantage: float, dual_clip: float | None = None) -> float:
    logp = torch.tensor([[math.log(ratio)]], dtype=torch.float64, requires_grad=True)
    old = torch.zeros(1, 1, dtype=torch.float64)
    loss, _ = policy_loss(logp, old, t64([[advantage]]), torch.ones(1, 1), dual_clip=dual_clip)
    loss.backward()
    return float(logp.grad)


@pytest.mark.parametrize("ratio", [0.3, 0.79, 0.81, 1.0, 1.2, 1.27, 1.29, 1.6, 4.0])
def test_clip_higher_gradient_support(ratio: float) -> None:
    """Positive advantage: gradient stops above 1 + 0.28. Negative: it stops below 1 - 0.2."""
    grad_pos = _grad_at_ratio(ratio, 1.0)
    grad_neg = _grad_at_ratio(ratio, -1.0)
    if ratio > 1.28:
        assert grad_pos == 0.0
    else:
        assert grad_pos == pytest.approx(-ratio)  # d(-A r)/dlogp = -A r
    if ratio < 0.8:
        assert grad_neg == 0.0
    else:
        assert grad_neg == pytest.approx(ratio)


@pytest.mark.parametrize("clip_ratio_c, expected", [(3.0, 3.0), (None, 5.0)])
def test_dual_clip_known_answer_at_ratio_5(clip_ratio_c: float | None, expected: float) -> None:
    """A = -1, r = 5, clip 0.2 / 0.28: max(5, 1.28) = 5, capped at -A c = 3; the capped token has no gradient."""
    logp = torch.tensor([[math.log(5.0)]], dtype=torch.float64, requires_grad=True)
    loss, stats = policy_loss(
        logp, torch.zeros(1, 1, dtype=torch.float64), t64([[-1.0]]), torch.ones(1, 1), 0.2, 0.28, "token-mean",
        clip_ratio_c,
    )
    loss.backward()
    assert float(loss.detach()) == pytest.approx(expected)
    assert float(logp.grad) == (0.0 if clip_ratio_c else pytest.approx(5.0))  # d(-A r)/dlogp = r
    assert float(stats["dual_clipfrac"]) == (1.0 if clip_ratio_c else 0.0)


@pytest.mark.parametrize("ratio", [2.0, 2.9, 3.1, 6.0])
def test_dual_clip_gradient_support(ratio: float) -> None:
    grad = _grad_at_ratio(ratio, -1.0, dual_clip=3.0)
    assert grad == (0.0 if ratio > 3.0 else pytest.approx(ratio))


@PROPERTY_SETTINGS
@given(
    st.lists(
        st.tuples(st.floats(-3, 3), st.floats(-3, 3), st.floats(-2, 2), st.integers(0, 1)),
        min_size=1,
        max_size=12,
    ),
    st.floats(0.0, 0.5),
    st.floats(0.0, 0.5),
)
def test_policy_loss_matches_loop_reference(
    tokens: list[tuple[float, float, float, int]], clip_low: float, clip_high: float
) -> None:
    logp, old, adv, mask = (t64([[tok[i] for tok in tokens]]) for i in range(4))
    loss, _ = policy_loss(logp, old, adv, mask, clip_low=clip_low, clip_high=clip_high)
    terms = []
    for lp, ol, a, m in tokens:
        if m:
            r = math.exp(lp - ol)
            terms.append(max(-a * r, -a * min(max(r, 1 - clip_low), 1 + clip_high)))
    expected = sum(terms) / len(terms) if terms else 0.0
    assert float(loss) == pytest.approx(expected, abs=1e-9)


@pytest.mark.parametrize("agg", AGG_MODES)
def test_masked_tokens_never_affect_policy_loss_or_its_gradient(agg: str) -> None:
    gen = torch.Generator().manual_seed(1)
    shape = (3, 6)
    mask = t64([[1, 1, 0, 1, 0, 0], [0, 1, 1, 1, 1, 0], [1, 0, 0, 0, 0, 0]])
    logp = torch.randn(shape, generator=gen, dtype=torch.float64)
    old = logp + 0.3 * torch.randn(shape, generator=gen, dtype=torch.float64)
    adv = torch.randn(shape, generator=gen, dtype=torch.float64)
    junk = 50 * torch.randn(shape, generator=gen, dtype=torch.float64)

    def run(lp: torch.Tensor, ol: torch.Tensor, a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        lp = lp.clone().requires_grad_(True)
        loss, _ = policy_loss(lp, ol, a, mask, agg=agg, dual_clip=3.0)
        loss.backward()
        return loss.detach(), lp.grad

    off = mask == 0
    base_loss, base_grad = run(logp, old, adv)
    loss, grad = run(
        torch.where(off, junk, logp), torch.where(off, -junk, old), torch.where(off, junk, adv)
    )
    torch.testing.assert_close(loss, base_loss)
    torch.testing.assert_close(grad, base_grad)
    assert torch.all(grad[off] == 0)


def test_policy_loss_rejects_bad_clip_values() -> None:
    z = torch.zeros(1, 1)
    with pytest.raises(ConfigError, match="clip_low=1.2"):
        policy_loss(z, z, z, z, clip_low=1.2)
    with pytest.raises(ConfigError, match="dual_clip=0.5 must be > 1"):
        policy_loss(z, z, z, z, dual_clip=0.5)


# --- value loss ----------------------------------------------------------------------------------


def test_value_loss_known_answer() -> None:
    values = t64([[1.0, 2.0, 7.0]])
    old = t64([[0.0, 2.0, 7.0]])
    returns = t64([[1.0, 0.0, 7.0]])
    mask = t64([[1, 1, 0]])
    # token 0: max((1-1)^2, (0.5-1)^2) = 0.25 (clipped); token 1: max(4, 4) = 4 -> 0.5 * mean = 1.0625
    loss, stats = value_loss(values, old, returns, mask, clip=0.5)
    assert float(loss) == pytest.approx(1.0625)
    assert float(stats["clipfrac"]) == pytest.approx(0.5)
    loss, stats = value_loss(values, old, returns, mask, clip=None)
    assert float(loss) == pytest.approx(1.0)
    assert float(stats["clipfrac"]) == 0.0


def test_value_loss_gradient_stops_when_clipped_term_dominates() -> None:
    values = t64([[1.0, 0.2]]).requires_grad_(True)
    loss, _ = value_loss(values, t64([[0.0, 0.0]]), t64([[1.0, 1.0]]), torch.ones(1, 2), clip=0.5)
    loss.backward()
    # token 0 moved 1.0 > clip toward the target: clipped error dominates, no gradient.
    # token 1 moved 0.2 < clip: plain squared error, d(0.5 * mean((v - R)^2)) = 0.5 * (v - R).
    torch.testing.assert_close(values.grad, t64([[0.0, 0.5 * (0.2 - 1.0)]]))


# --- KL estimators -------------------------------------------------------------------------------


def test_kl_estimators_known_answer() -> None:
    logp, ref = t64([math.log(0.5)]), t64([math.log(0.25)])  # d = log 2
    d = math.log(2)
    assert float(kl_penalty(logp, ref, "k1")) == pytest.approx(d)
    assert float(kl_penalty(logp, ref, "k2")) == pytest.approx(0.5 * d**2)
    assert float(kl_penalty(logp, ref, "k3")) == pytest.approx(0.5 + d - 1)
    assert float(kl_penalty(logp, ref, "low_var_kl")) == pytest.approx(0.5 + d - 1)


def test_low_var_kl_is_clamped() -> None:
    logp, ref = t64([-40.0]), t64([0.0])  # unclamped k3 = exp(40) - 41; d clamped to -20: exp(20) - 21
    assert float(kl_penalty(logp, ref, "k3")) == pytest.approx(math.exp(20) - 21)
    assert float(kl_penalty(logp, ref, "low_var_kl")) == 10.0


@pytest.mark.parametrize("d", [-100.0, -1000.0, 100.0, 1000.0])
def test_k3_stays_finite_in_float32_for_huge_log_ratios(d: float) -> None:
    """exp(-d) overflows float32 once d < -88; k3 clamps d (not its value) to +-20."""
    logp, ref = torch.tensor([d], dtype=torch.float32), torch.zeros(1, dtype=torch.float32)
    k3 = kl_penalty(logp, ref, "k3")
    assert torch.isfinite(k3).all()
    clamped = max(-20.0, min(20.0, d))
    assert float(k3) == pytest.approx(math.exp(-clamped) + clamped - 1, rel=1e-5)


@PROPERTY_SETTINGS
@given(st.lists(st.floats(-19.9, 19.9), min_size=1, max_size=10))
def test_k3_equals_the_unclamped_formula_inside_the_clamp(diffs: list[float]) -> None:
    d = t64(diffs)
    expected = torch.exp(-d) + d - 1.0
    torch.testing.assert_close(kl_penalty(d, torch.zeros_like(d), "k3"), expected, rtol=1e-12, atol=0.0)


def test_default_kl_estimator_is_k1_as_the_ragen_base_config() -> None:
    from ragen2.config import AlgoConfig

    assert AlgoConfig().kl_estimator == "k1"
    logp, ref = t64([-0.5, -3.0]), t64([-1.0, -1.0])
    torch.testing.assert_close(kl_penalty(logp, ref), logp - ref)


@PROPERTY_SETTINGS
@given(st.lists(st.tuples(st.floats(-8, 0), st.floats(-8, 0)), min_size=1, max_size=10))
def test_kl_estimators_zero_at_equality_and_nonnegative(pairs: list[tuple[float, float]]) -> None:
    logp, ref = t64([p for p, _ in pairs]), t64([r for _, r in pairs])
    for kind in KL_ESTIMATORS:
        assert torch.all(kl_penalty(logp, logp, kind) == 0)
    for kind in ("k2", "k3", "low_var_kl"):
        assert torch.all(kl_penalty(logp, ref, kind) >= 0)


def test_k1_and_k3_are_unbiased_estimates_of_kl() -> None:
    """Averaged exactly under the sampling policy pi, k1 and k3 equal KL(pi || pi_ref)."""
    gen = torch.Generator().manual_seed(2)
    logp = torch.log_softmax(torch.randn(7, generator=gen, dtype=torch.float64), dim=0)
    ref = torch.log_softmax(torch.randn(7, generator=gen, dtype=torch.float64), dim=0)
    p = logp.exp()
    kl = float((p * (logp - ref)).sum())
    for kind in ("k1", "k3"):
        assert float((p * kl_penalty(logp, ref, kind)).sum()) == pytest.approx(kl, rel=1e-12)


def test_kl_rejects_unknown_estimator_with_suggestion() -> None:
    expected = r"algo.kl_estimator.*valid: k1, k2, k3, low_var_kl.*Did you mean: k3"
    with pytest.raises(ConfigError, match=expected):
        kl_penalty(torch.zeros(1), torch.zeros(1), "k4")


# --- entropy and log-probs -----------------------------------------------------------------------


def test_entropy_of_uniform_logits_is_log_vocab() -> None:
    for vocab in (2, 7, 1000):
        ent = entropy_from_logits(torch.full((2, 3, vocab), 4.2))
        torch.testing.assert_close(ent, torch.full((2, 3), math.log(vocab)))


def test_entropy_of_a_peaked_distribution_is_near_zero_and_finite() -> None:
    logits = torch.zeros(1, 1, 50)
    logits[0, 0, 3] = 1e4
    ent = entropy_from_logits(logits)
    assert torch.isfinite(ent).all() and float(ent) == pytest.approx(0.0, abs=1e-6)


def test_entropy_matches_categorical_and_chunking_changes_nothing() -> None:
    gen = torch.Generator().manual_seed(3)
    logits = 5 * torch.randn(3, 5, 11, generator=gen)
    expected = torch.distributions.Categorical(logits=logits).entropy()
    torch.testing.assert_close(entropy_from_logits(logits), expected)
    torch.testing.assert_close(entropy_from_logits(logits, chunk_size=4), expected)
    bf16 = entropy_from_logits(logits.bfloat16(), chunk_size=2)
    assert bf16.dtype == torch.float32
    rounded = logits.bfloat16().float()
    torch.testing.assert_close(bf16, torch.distributions.Categorical(logits=rounded).entropy())


def test_entropy_gradient_flows_through_chunks() -> None:
    gen = torch.Generator().manual_seed(4)
    logits = torch.randn(2, 3, 5, generator=gen, dtype=torch.float64, requires_grad=True)
    entropy_from_logits(logits, chunk_size=2).sum().backward()
    chunked = logits.grad.clone()
    logits.grad = None
    torch.distributions.Categorical(logits=logits).entropy().sum().backward()
    torch.testing.assert_close(chunked, logits.grad.double())


def test_token_logprobs_known_answer() -> None:
    logits = torch.tensor([[[0.0, math.log(3.0)], [2.0, 2.0]]])
    got = token_logprobs(logits, torch.tensor([[1, 0]]))
    torch.testing.assert_close(got, torch.tensor([[math.log(0.75), math.log(0.5)]]))


def test_token_logprobs_matches_log_softmax_and_handles_ignore_index() -> None:
    gen = torch.Generator().manual_seed(5)
    logits = 3 * torch.randn(2, 6, 13, generator=gen)
    labels = torch.randint(0, 13, (2, 6), generator=gen)
    labels[1, 4] = -100
    log_probs = torch.log_softmax(logits, dim=-1)
    expected = log_probs.gather(-1, labels.clamp_min(0)[..., None]).squeeze(-1)
    expected[1, 4] = 0.0
    torch.testing.assert_close(token_logprobs(logits, labels), expected)
    torch.testing.assert_close(token_logprobs(logits, labels, chunk_size=5), expected)


def test_token_logprobs_rejects_unaligned_labels() -> None:
    with pytest.raises(ValueError, match=r"labels \(2, 5\) must match logits \(2, 6, 9\)"):
        token_logprobs(torch.zeros(2, 6, 9), torch.zeros(2, 5, dtype=torch.long))


def test_chunk_size_must_be_positive() -> None:
    with pytest.raises(ValueError, match="chunk_size=0"):
        entropy_from_logits(torch.zeros(2, 3, 4), chunk_size=0)


# --- log-probs and entropy in one pass, for the update ---------------------------------------------
def _separately(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return token_logprobs(logits, labels), entropy_from_logits(logits)


@pytest.mark.parametrize("chunk_size", [1, 3, 512])
def test_fused_logprobs_and_entropy_equal_the_separate_functions_with_their_gradients(chunk_size: int) -> None:
    gen = torch.Generator().manual_seed(6)
    # A strided slice, as the trainer passes (logits[:, :-1]), with an ignored label.
    base = 4 * torch.randn(3, 8, 17, generator=gen, dtype=torch.float64)
    labels = torch.randint(0, 17, (3, 7), generator=gen)
    labels[2, 5] = -100
    w_logp, w_entropy = torch.randn(3, 7, generator=gen, dtype=torch.float64), torch.randn(3, 7, generator=gen, dtype=torch.float64)
    grads = []
    for fn in (lambda x, y: token_logprobs_and_entropy(x, y, chunk_size=chunk_size), _separately):
        logits = base.clone().requires_grad_(True)
        logp, entropy = fn(logits[:, :-1], labels)
        ((logp * w_logp).sum() + (entropy * w_entropy).sum()).backward()
        grads.append((logp.detach(), entropy.detach(), logits.grad))
    for fused, separate in zip(*grads):
        torch.testing.assert_close(fused, separate)
    assert torch.count_nonzero(grads[0][2][:, -1]) == 0  # the dropped last position gets no gradient


def test_fused_gradient_passes_gradcheck_and_either_output_alone_works() -> None:
    gen = torch.Generator().manual_seed(7)
    logits = torch.randn(2, 4, 6, generator=gen, dtype=torch.float64, requires_grad=True)
    labels = torch.randint(0, 6, (2, 4), generator=gen)
    assert torch.autograd.gradcheck(lambda x: token_logprobs_and_entropy(x, labels, chunk_size=3), (logits,))
    for pick in (0, 1):
        logits.grad = None
        token_logprobs_and_entropy(logits, labels, chunk_size=3)[pick].sum().backward()
        expected = torch.autograd.grad(_separately(logits, labels)[pick].sum(), logits)[0]
        torch.testing.assert_close(logits.grad, expected)


def test_fused_backward_keeps_the_logits_alone_where_the_separate_functions_keep_several_copies() -> None:
    """What autograd saves for backward, in bytes of [*, V] tensors, for a bfloat16 [2, 64, 1000] input."""
    gen = torch.Generator().manual_seed(8)
    labels = torch.randint(0, 1000, (2, 64), generator=gen)
    logits_bytes = 2 * 64 * 1000 * 2

    def saved_bytes(fn) -> int:
        logits = torch.randn(2, 64, 1000, generator=gen).bfloat16().requires_grad_(True)
        storages: dict[int, int] = {}

        def pack(t: torch.Tensor) -> torch.Tensor:
            if t.dim() and t.shape[-1] == 1000:
                storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            logp, entropy = fn(logits, labels)
            (logp.sum() + entropy.sum()).backward()
        return sum(storages.values())

    assert saved_bytes(lambda x, y: token_logprobs_and_entropy(x, y, chunk_size=16)) == logits_bytes
    assert saved_bytes(_separately) >= 4 * logits_bytes  # float32 upcasts and softmaxes: 2x the bytes each


def test_fused_rejects_unaligned_labels_and_bad_chunks() -> None:
    with pytest.raises(ValueError, match=r"labels \(2, 5\) \[B, T\]"):
        token_logprobs_and_entropy(torch.zeros(2, 6, 9), torch.zeros(2, 5, dtype=torch.long))
    with pytest.raises(ValueError, match="chunk_size=0"):
        token_logprobs_and_entropy(torch.zeros(2, 6, 9), torch.zeros(2, 6, dtype=torch.long), chunk_size=0)
