"""Policy and value losses, KL estimators, entropy and loss aggregation as pure tensor functions.

Shapes: B sequences padded to T tokens, vocabulary V. ``mask [B, T]`` is 1 on
the tokens being trained (the model's own tokens) and 0 on prompt, environment
and padding tokens. Masked-out entries never change a loss or its gradient,
whatever they hold, as long as they are finite.

The trainer combines them per step (``algo.*`` keys, see docs/algorithms.md),
with ``agg = algo.loss_agg``:

    loss = policy_loss(logp, old_logp, advantages, mask, clip_low, clip_high, agg, clip_ratio_c)[0]
         + algo.kl_coef * aggregate(kl_penalty(logp, ref_logp, algo.kl_estimator), mask, agg)
         - algo.entropy_coef * aggregate(entropy_from_logits(logits), mask, agg)

(the update takes ``logp`` and the entropy from ``token_logprobs_and_entropy(logits, labels)`` in one
pass that keeps only the logits for backward).

Statistics come back as detached 0-d tensors so that logging does not force a
device sync per micro-batch; call ``.item()`` when writing them out.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from ragen2.errors import ConfigError, did_you_mean

__all__ = [
    "AGG_MODES",
    "KL_ESTIMATORS",
    "aggregate",
    "entropy_from_logits",
    "kl_penalty",
    "masked_mean",
    "masked_whiten",
    "policy_loss",
    "rollout_correction",
    "token_logprobs",
    "token_logprobs_and_entropy",
    "value_loss",
]

AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")
KL_ESTIMATORS = ("k1", "k2", "k3", "low_var_kl")
ROLLOUT_IS_LEVELS = ("token", "sequence")
ROLLOUT_RS_LEVELS = ("token", "sequence", "geometric")

# verl clamps log-ratios to +-20 before exp so that one wild token cannot overflow the loss.
_MAX_LOG_RATIO = 20.0


def _check_same_shape(**tensors: Tensor) -> None:
    shapes = {name: tuple(t.shape) for name, t in tensors.items()}
    if len(set(shapes.values())) > 1:
        listed = ", ".join(f"{name} {shape}" for name, shape in shapes.items())
        raise ValueError(f"shape mismatch: {listed}; these tensors must have the same shape.")


def _check_choice(value: str, choices: tuple[str, ...], what: str) -> None:
    if value not in choices:
        raise ConfigError(
            f"unknown {what} {value!r}; valid: {', '.join(choices)}." + did_you_mean(value, choices)
        )


def masked_mean(values: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean of ``values`` over the entries where ``mask`` is 1.

    values, mask: same shape, e.g. [B, T]. ``dim=None`` reduces over everything
    to a 0-d tensor, otherwise over ``dim``. An empty selection gives 0, not
    NaN, so an all-masked micro-batch contributes nothing.
    """
    selected = torch.where(mask > 0, values, 0.0)
    if dim is None:
        return selected.sum() / (mask > 0).sum().clamp_min(1)
    return selected.sum(dim) / (mask > 0).sum(dim).clamp_min(1)


def masked_whiten(values: Tensor, mask: Tensor, shift_mean: bool = True, eps: float = 1e-8) -> Tensor:
    """Normalise ``values`` to zero mean and unit variance over the entries where ``mask`` is 1.

    values, mask: same shape, e.g. [B, T] -> same shape. The statistics pool
    every valid entry of the batch and use the unbiased (n - 1) variance, as
    verl's ``masked_whiten``. ``shift_mean=False`` rescales but keeps the mean.
    Masked-out entries are transformed too; callers zero them. A single valid
    entry has no spread and whitens to 0.
    """
    mean = masked_mean(values, mask)
    centered = values - mean
    count = (mask > 0).sum()
    var = masked_mean(centered**2, mask) * count / (count - 1).clamp_min(1)
    whitened = centered * torch.rsqrt(var + eps)
    return whitened if shift_mean else whitened + mean


def aggregate(
    loss_mat: Tensor,
    mask: Tensor,
    mode: str = "token-mean",
    norm_tokens: float | None = None,
    *,
    batch_tokens: float | Tensor | None = None,
    batch_seqs: float | Tensor | None = None,
) -> Tensor:
    """Reduce a per-token loss to a scalar; verl's ``agg_loss`` modes.

    loss_mat, mask: [B, T] -> 0-d tensor. With l the loss and m the mask:

    - ``token-mean``: sum_it m l / sum_it m. Every token weighs the same, so
      long sequences weigh more (DAPO's choice, verl's default).
    - ``seq-mean-token-mean``: mean over sequences of (sum_t m l / sum_t m).
      Every sequence weighs the same (the original GRPO objective).
    - ``seq-mean-token-sum``: mean over sequences of sum_t m l / norm_tokens,
      ``norm_tokens`` defaulting to 1. Dividing by a constant instead of the
      sequence's own length removes GRPO's length bias (Dr.GRPO, arXiv
      2503.20783, whose code passes the generation budget as the constant).
      ``norm_tokens`` applies only to this mode.

    A sequence without valid tokens is not counted in the seq-mean modes.
    ``batch_tokens`` / ``batch_seqs`` replace the valid-token / non-empty-sequence
    counts of this call by those of a larger batch: when a mini-batch is split
    into micro-batches, passing the mini-batch's counts to each call makes the
    sum of the micro-batch losses equal the loss of the whole mini-batch, in
    every mode.
    """
    _check_same_shape(loss_mat=loss_mat, mask=mask)
    _check_choice(mode, AGG_MODES, "loss aggregation mode (algo.loss_agg)")
    if norm_tokens is not None and mode != "seq-mean-token-sum":
        raise ConfigError(
            f"norm_tokens={norm_tokens} only applies to 'seq-mean-token-sum', not {mode!r}; drop it."
        )
    valid = mask > 0
    token_loss = torch.where(valid, loss_mat, 0.0)
    if mode == "token-mean":
        count = valid.sum() if batch_tokens is None else batch_tokens
        return token_loss.sum() / torch.as_tensor(count).clamp_min(1)
    seq_tokens = valid.sum(dim=-1)  # [B]
    seq_loss = token_loss.sum(dim=-1)  # [B]
    if mode == "seq-mean-token-mean":
        seq_loss = seq_loss / seq_tokens.clamp_min(1)
    elif norm_tokens is not None:
        seq_loss = seq_loss / norm_tokens
    count = (seq_tokens > 0).sum() if batch_seqs is None else batch_seqs
    return seq_loss.sum() / torch.as_tensor(count).clamp_min(1)


def policy_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    agg: str = "token-mean",
    dual_clip: float | None = None,
    *,
    norm_tokens: float | None = None,
    batch_tokens: float | Tensor | None = None,
    batch_seqs: float | Tensor | None = None,
    weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO clipped surrogate with asymmetric clipping ("clip-higher").

    Schulman et al. 2017 (arXiv 1707.06347); clip-higher from DAPO, Yu et al.
    2025 (arXiv 2503.14476); dual clip from Ye et al. 2020 (arXiv 1912.09729).
    logp, old_logp, advantages, mask: [B, T] -> (loss 0-d, stats).

        r_t    = exp(logp_t - old_logp_t)
        loss_t = max(-A_t r_t, -A_t clip(r_t, 1 - clip_low, 1 + clip_high))

    A raised upper bound (0.28 vs 0.2) lets unlikely tokens with positive
    advantage gain more probability per step, which keeps entropy from
    collapsing. With ``dual_clip = c > 1`` the loss of a negative-advantage
    token is also capped at -c A_t, so a huge ratio on a bad token cannot blow
    up the update (verl's ``clip_ratio_c``, 3.0 there). Defaults 0.2 / 0.28
    are the RAGEN reference. Aggregation: see ``aggregate`` (``agg`` and the
    keyword-only counts are passed through). ``weights`` [B, T] (``rollout_correction``'s importance
    weights) multiply the per-token loss after clipping, as verl applies them.

    stats (detached 0-d tensors, means over valid tokens): ``clipfrac`` (tokens
    whose gradient the clip removed), ``clipfrac_high`` (A > 0, r > 1 +
    clip_high), ``clipfrac_low`` (A < 0, r < 1 - clip_low), ``dual_clipfrac``
    (0 when dual clip is off), ``approx_kl`` (k3 estimate of KL(old || new),
    (r - 1) - log r, non-negative and lower-variance than -log r), ``ratio_mean``.
    """
    _check_same_shape(logp=logp, old_logp=old_logp, advantages=advantages, mask=mask)
    if not (0.0 <= clip_low < 1.0 and clip_high >= 0.0):
        raise ConfigError(
            f"clip range needs 0 <= algo.clip_low < 1 and algo.clip_high >= 0, got "
            f"clip_low={clip_low}, clip_high={clip_high}; the reference uses 0.2 and 0.28."
        )
    if dual_clip is not None and dual_clip <= 1.0:
        raise ConfigError(f"dual_clip={dual_clip} must be > 1 (verl uses 3.0), or None to turn it off.")

    log_ratio = (logp - old_logp).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    per_token = torch.maximum(unclipped, clipped)
    dual_clipped = torch.zeros_like(per_token, dtype=torch.bool)
    if dual_clip is not None:
        cap = -advantages * dual_clip
        dual_clipped = (advantages < 0) & (per_token > cap)
        per_token = torch.where(dual_clipped, cap, per_token)
    if weights is not None:
        per_token = per_token * weights
    loss = aggregate(
        per_token, mask, agg, norm_tokens, batch_tokens=batch_tokens, batch_seqs=batch_seqs
    )

    with torch.no_grad():
        stats = {
            "clipfrac": masked_mean((clipped > unclipped).float(), mask),
            "clipfrac_high": masked_mean(((advantages > 0) & (ratio > 1.0 + clip_high)).float(), mask),
            "clipfrac_low": masked_mean(((advantages < 0) & (ratio < 1.0 - clip_low)).float(), mask),
            "dual_clipfrac": masked_mean(dual_clipped.float(), mask),
            "approx_kl": masked_mean((ratio - 1.0) - log_ratio, mask),
            "ratio_mean": masked_mean(ratio, mask),
        }
    return loss, {name: value.detach() for name, value in stats.items()}


def rollout_correction(
    logp: Tensor,
    rollout_logp: Tensor,
    mask: Tensor,
    rollout_is: str | None = None,
    rollout_is_threshold: float = 2.0,
    rollout_rs: str | None = None,
    rollout_rs_threshold: float | None = None,
    rollout_rs_threshold_lower: float | None = None,
) -> tuple[Tensor | None, Tensor]:
    """Off-policy correction for samples drawn by another policy than the one being trained (verl 0.6.1,
    ``verl/trainer/ppo/rollout_corr_helper.py``; Yao et al., "Your efficient RL framework secretly brings you
    off-policy RL training"). logp, rollout_logp, mask: [B, T] -> (weights [B, T] or None, mask [B, T]).

    ``logp`` is the trained policy's log-probs before the update (the PPO ratio's denominator),
    ``rollout_logp`` the behaviour policy's, recorded at sampling time (a stale policy under asynchronous
    training, or another engine's numerics). With r = exp(logp - rollout_logp), the log-ratio clamped to
    +-20 before exp:

    - ``rollout_is`` (truncated importance sampling, TIS): ``"token"`` weights each token by r_t,
      ``"sequence"`` every token of a row by prod_t r_t; both truncated at ``rollout_is_threshold`` and
      0 off the mask. Detached: they multiply the per-token policy loss, they are not optimised.
    - ``rollout_rs`` (rejection, MIS): tokens (``"token"``), whole rows by prod_t r_t (``"sequence"``)
      or by the geometric mean exp(mean_t log r_t) (``"geometric"``) whose ratio lies outside
      [``rollout_rs_threshold_lower``, ``rollout_rs_threshold``] are dropped from the returned mask;
      the lower bound defaults to 1 / upper.

    With both off it returns (None, mask).
    """
    _check_same_shape(logp=logp, rollout_logp=rollout_logp, mask=mask)
    log_ratio = (logp - rollout_logp).detach()
    weights = None
    if rollout_is is not None:
        _check_choice(rollout_is, ROLLOUT_IS_LEVELS, "algo.rollout_is")
        if rollout_is_threshold <= 0:
            raise ConfigError(f"algo.rollout_is_threshold={rollout_is_threshold} must be > 0 (verl's default: 2.0).")
        weights = (_level_ratio(log_ratio, mask, rollout_is) * mask).clamp(max=rollout_is_threshold)
    if rollout_rs is not None:
        _check_choice(rollout_rs, ROLLOUT_RS_LEVELS, "algo.rollout_rs")
        if rollout_rs_threshold is None:
            raise ConfigError("algo.rollout_rs is set but algo.rollout_rs_threshold is null: give the upper bound "
                              "of the kept ratios (e.g. 2.0; the lower one defaults to its inverse).")
        lower = 1.0 / rollout_rs_threshold if rollout_rs_threshold_lower is None else rollout_rs_threshold_lower
        ratio = _level_ratio(log_ratio, mask, rollout_rs)
        mask = mask * ((ratio >= lower) & (ratio <= rollout_rs_threshold)).to(mask.dtype)
    return weights, mask


def _level_ratio(log_ratio: Tensor, mask: Tensor, level: str) -> Tensor:
    """[B, T] ratios at `level`: per token, or one per row (product, or geometric mean) broadcast over it."""
    if level == "token":
        per = log_ratio
    else:
        total = (torch.where(mask.bool(), log_ratio, 0.0) * mask).sum(dim=-1, keepdim=True)  # [B, 1]
        per = total if level == "sequence" else total / mask.sum(dim=-1, keepdim=True).clamp_min(1)
    return torch.exp(per.clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)).expand_as(log_ratio)


def value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    mask: Tensor,
    clip: float | None = 0.5,
    agg: str = "token-mean",
    *,
    norm_tokens: float | None = None,
    batch_tokens: float | Tensor | None = None,
    batch_seqs: float | Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Clipped critic loss: 0.5 * max((V - R)^2, (clip(V, V_old - c, V_old + c) - R)^2).

    PPO's value clipping as in verl's ``compute_value_loss`` and the PPO
    baselines. values (current critic, with grad), old_values (critic at
    rollout time), returns (targets, e.g. from ``gae_advantages``), mask:
    [B, T] -> (loss 0-d, stats). ``clip`` is in units of the return; the
    default 0.5 is verl's ``critic.cliprange_value``, which the RAGEN reference
    inherits; None turns clipping off. stats: ``clipfrac``, the fraction of
    valid tokens where the clipped term is the larger one (detached 0-d).
    """
    _check_same_shape(values=values, old_values=old_values, returns=returns, mask=mask)
    unclipped = (values - returns) ** 2
    if clip is None:
        per_token = unclipped
        clipfrac = torch.zeros((), device=values.device)
    else:
        clipped_values = old_values + (values - old_values).clamp(-clip, clip)
        clipped = (clipped_values - returns) ** 2
        per_token = torch.maximum(unclipped, clipped)
        clipfrac = masked_mean((clipped > unclipped).float(), mask)
    loss = 0.5 * aggregate(
        per_token, mask, agg, norm_tokens, batch_tokens=batch_tokens, batch_seqs=batch_seqs
    )
    return loss, {"clipfrac": clipfrac.detach()}


def kl_penalty(logp: Tensor, ref_logp: Tensor, kind: str = "k1") -> Tensor:
    """Per-token estimate of KL(pi || pi_ref) from tokens sampled by pi.

    Schulman, "Approximating KL Divergence" (2020). logp, ref_logp: [B, T] ->
    [B, T]. With d = logp - ref_logp:

    - ``k1`` = d: unbiased, high variance, can be negative per token (the
      default: RAGEN's base config sets ``kl_loss_type: kl``).
    - ``k2`` = d^2 / 2: biased, low variance, >= 0.
    - ``k3`` = exp(-d) + d - 1: Schulman's k3 (GRPO's choice), unbiased, low
      variance, >= 0, with d clamped to +-20 so that it stays finite (exp(-d)
      overflows float32 once d < -88; beyond +-20 its gradient is 0); the value
      itself is not clamped.
    - ``low_var_kl``: k3 with d clamped to +-20 and the result to <= 10, as
      verl's ``low_var_kl`` (its default ``kl_loss_type``; verl's "k3" means
      this one), against rare huge ratios.

    Aggregate with ``aggregate`` and the training mask.
    """
    _check_same_shape(logp=logp, ref_logp=ref_logp)
    _check_choice(kind, KL_ESTIMATORS, "KL estimator (algo.kl_estimator)")
    diff = logp - ref_logp
    if kind == "k1":
        return diff
    if kind == "k2":
        return 0.5 * diff**2
    diff = diff.clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
    k3 = torch.exp(-diff) + diff - 1.0
    return k3 if kind == "k3" else k3.clamp(max=10.0)


def _over_token_chunks(
    fn: Callable[..., Tensor], logits: Tensor, *per_token: Tensor, chunk_size: int | None
) -> Tensor:
    """Apply ``fn`` to rows of the flattened [N, V] logits, ``chunk_size`` rows at a time.

    logits: [..., V]; per_token: tensors shaped like logits[..., 0] -> fn's
    per-row output reshaped to logits.shape[:-1].
    """
    if chunk_size is not None and chunk_size < 1:
        raise ValueError(f"chunk_size={chunk_size} must be a positive number of tokens, or None.")
    lead = logits.shape[:-1]
    flat = logits.reshape(-1, logits.shape[-1])
    extras = [t.reshape(-1) for t in per_token]
    if chunk_size is None or chunk_size >= flat.shape[0]:
        return fn(flat, *extras).reshape(lead)
    pieces = [
        fn(flat[i : i + chunk_size], *(t[i : i + chunk_size] for t in extras))
        for i in range(0, flat.shape[0], chunk_size)
    ]
    return torch.cat(pieces).reshape(lead)


def _at_least_float32(x: Tensor) -> Tensor:
    return x if x.dtype in (torch.float32, torch.float64) else x.float()


def _entropy_rows(logits: Tensor) -> Tensor:
    logits = _at_least_float32(logits)
    probs = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - (probs * logits).sum(dim=-1)


def entropy_from_logits(logits: Tensor, chunk_size: int | None = None) -> Tensor:
    """Entropy of the full next-token distribution at every position.

    logits: [B, T, V] (any leading shape) -> entropy [B, T], float32 (float64
    for float64 input). H = logsumexp(z) - sum_v softmax(z)_v z_v, stable for
    any finite logits (no log of a probability that underflowed). bf16/fp16
    logits are upcast because half precision loses the normaliser's accuracy
    over a large vocabulary.

    Memory: each step builds [N, V] float32 temporaries (N = tokens). With
    ``chunk_size`` the tokens are processed that many at a time, bounding the
    temporaries; this is what keeps entropy logging affordable at V ~ 150k.
    Under autograd every chunk's softmax is still kept for backward, so chunking
    bounds the forward peak only.
    """
    return _over_token_chunks(_entropy_rows, logits, chunk_size=chunk_size)


def _logprob_rows(logits: Tensor, labels: Tensor) -> Tensor:
    logits = _at_least_float32(logits)
    picked = logits.gather(-1, labels.clamp_min(0)[:, None]).squeeze(-1)
    return torch.where(labels >= 0, picked - torch.logsumexp(logits, dim=-1), 0.0)


def token_logprobs(logits: Tensor, labels: Tensor, chunk_size: int | None = None) -> Tensor:
    """log softmax(logits)[label] at every position.

    logits: [B, T, V]; labels: [B, T] int -> log-probs [B, T], float32
    (float64 for float64 input).
    The logits must already be aligned with the labels: logits[:, t] is the
    distribution that produced labels[:, t]. For a causal LM called on
    input_ids that means ``token_logprobs(out.logits[:, :-1], input_ids[:, 1:])``;
    the shift stays with the caller, who knows the layout. A negative label
    (Hugging Face's -100 ignore index) gives 0. Computed as z[label] -
    logsumexp(z), which never materialises the [N, V] log-softmax
    output; ``chunk_size`` as in ``entropy_from_logits``.
    """
    if labels.shape != logits.shape[:-1]:
        raise ValueError(
            f"labels {tuple(labels.shape)} must match logits {tuple(logits.shape)} without the "
            "vocabulary dimension; align them first (logits[:, :-1] with input_ids[:, 1:])."
        )
    return _over_token_chunks(_logprob_rows, logits, labels, chunk_size=chunk_size)


# Tokens per chunk of `token_logprobs_and_entropy`: at a 49k vocabulary a float32 [chunk, V] temporary is 100 MB.
LOGITS_CHUNK_TOKENS = 512


class _LogprobAndEntropy(torch.autograd.Function):
    """log softmax(z)[label] and the entropy of softmax(z) at every position of z [B, T, V], with a backward that
    keeps z only.

    Composed from torch ops, autograd would keep the softmax and other [B, T, V] float32 temporaries
    until backward: several times the logits, which is what fills memory with a large vocabulary.
    Here forward and backward walk each row `chunk` positions at a time (slices of z, so a strided
    z, such as `logits[:, :-1]`, is never copied), and backward recomputes each chunk's softmax from z
    and the saved log-normaliser. With p = softmax(z): d logp / dz = onehot(label) - p and
    d H / dz = -p * (z - E_p[z]), where E_p[z] = logsumexp(z) - H.
    """

    @staticmethod
    def forward(ctx, logits: Tensor, labels: Tensor, chunk: int) -> tuple[Tensor, Tensor]:
        out_dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
        logp = torch.empty(logits.shape[:-1], dtype=out_dtype, device=logits.device)
        entropy, lse = torch.empty_like(logp), torch.empty_like(logp)
        for at in _chunks(logits.shape[:-1], chunk):
            z, y = _at_least_float32(logits[at]), labels[at]
            lse[at] = normaliser = torch.logsumexp(z, dim=-1)
            entropy[at] = normaliser - (torch.exp(z - normaliser[:, None]) * z).sum(dim=-1)
            logp[at] = torch.where(y >= 0, z.gather(-1, y.clamp_min(0)[:, None]).squeeze(-1) - normaliser, 0.0)
        ctx.save_for_backward(logits, labels, lse, entropy)
        ctx.chunk = chunk
        ctx.set_materialize_grads(False)
        return logp, entropy

    @staticmethod
    def backward(ctx, grad_logp: Tensor | None, grad_entropy: Tensor | None) -> tuple[Tensor | None, None, None]:
        logits, labels, lse, entropy = ctx.saved_tensors
        grad = torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)
        for at in _chunks(logits.shape[:-1], ctx.chunk):
            z = _at_least_float32(logits[at])
            p = torch.exp(z - lse[at][:, None])
            g = torch.zeros_like(z)
            if grad_logp is not None:
                y = labels[at]
                weight = torch.where(y >= 0, grad_logp[at], 0.0)[:, None]
                g.sub_(p * weight).scatter_add_(-1, y.clamp_min(0)[:, None], weight)
            if grad_entropy is not None:
                g.sub_(p * (z - (lse[at] - entropy[at])[:, None]) * grad_entropy[at][:, None])
            grad[at] = g
        return grad, None, None


def _chunks(shape: torch.Size, chunk: int) -> list[tuple[int, slice]]:
    """Indices (row, positions) that cover a [B, T] grid, at most `chunk` positions each."""
    rows, length = shape
    return [(b, slice(t, t + chunk)) for b in range(rows) for t in range(0, length, chunk)]


def token_logprobs_and_entropy(
    logits: Tensor, labels: Tensor, chunk_size: int = LOGITS_CHUNK_TOKENS
) -> tuple[Tensor, Tensor]:
    """``token_logprobs(logits, labels)`` and ``entropy_from_logits(logits)`` in one pass, for training.

    logits: [B, T, V]; labels: [B, T] int -> (log-probs [B, T], entropy [B, T]), both float32 (float64
    for float64 input), with gradients to the logits. The values and gradients are those of the two
    functions, but backward keeps the logits alone, not their softmaxes, and forward and backward
    build [chunk_size, V] temporaries at a time: the update then holds about one copy of the logits,
    however large the vocabulary.
    """
    if logits.dim() != 3 or labels.shape != logits.shape[:-1]:
        raise ValueError(
            f"logits {tuple(logits.shape)} must be [B, T, V] and labels {tuple(labels.shape)} [B, T]; align "
            "them first (logits[:, :-1] with input_ids[:, 1:])."
        )
    if chunk_size < 1:
        raise ValueError(f"chunk_size={chunk_size} must be a positive number of tokens.")
    return _LogprobAndEntropy.apply(logits, labels, chunk_size)
