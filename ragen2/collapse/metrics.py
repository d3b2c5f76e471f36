"""Mutual-information proxies for template collapse, from a cross-scoring matrix (SPEC §4).

Entropy measures diversity *within* one input; it stays flat when every input gets the same
template. These proxies measure whether the reasoning still says which input it came from:
score every reasoning Z_m under every input X_j with the current policy,

    L[m, j] = log p(Z_m | X_j)      (sum over reasoning tokens; see `score_matrix`)

and ask how much better the true input i(m) explains Z_m than the batch's inputs on average.
Formulas follow RAGEN-2 (arXiv 2604.06268), Sec. 4 and App. I; docs/diagnostics.md explains
each returned key and how to read it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from scipy.special import logsumexp

MARGINALS = ("mixture", "token_mean")
MIN_PAIRS = 2  # fewer pairs: no rate, no mean, no spread to speak of
MIN_DISTINCT_INPUTS = 2  # fewer: every reasoning "retrieves" the only input and MI is 0 by construction
ZERO_SPREAD = 1e-9  # sigma at or below this (nats/token) is zero up to rounding: no scale for the z-scores


@dataclass(frozen=True)
class EmaState:
    """Smoothed scale of the per-token marginal, carried from one `mi_metrics` call to the next.

    Pass the `ema_state` a call returned into the next call; it is plain data (`dataclasses.asdict`
    to save it with a checkpoint, `EmaState(**d)` to restore it).
    """

    sigma: float  # sigma_EMA after the last call
    steps: int  # how many calls have been folded in


def mi_metrics(
    logp: np.ndarray,
    source: np.ndarray,
    lengths: np.ndarray | None = None,
    input_ids: Sequence[Sequence[int]] | None = None,
    ks: Sequence[int] = (1, 2, 4, 8),
    ema_state: EmaState | None = None,
    marginal: Literal["mixture", "token_mean"] = "mixture",
    *,
    ema_alpha: float = 0.9,
    eps: float = 1e-3,
) -> dict[str, Any]:
    """Retrieval accuracy, recall@k and MI estimates of I(X; Z) from a cross-scoring matrix.

    Args:
        logp: float [M, P], logp[m, j] = log p(Z_m | X_j), summed over reasoning tokens.
        source: int [M], source[m] = i(m), the column of the input Z_m was sampled from.
        lengths: int [M], T_m = number of tokens in Z_m; per-token metrics divide by it.
            None means all ones (every metric is then per sequence).
        input_ids: P token-id sequences, the inputs themselves. Identical inputs form one class:
            retrieval counts a hit on any member of the true class, and ranks classes, not columns.
            None means all P inputs are distinct.
        ks: the k of each `recall@k`; k >= the number of distinct inputs gives 1.
        ema_state: what the previous call returned under "ema_state", or None on the first call.
        marginal: "mixture" (default, the paper's formula): marginal_m = (1/T_m) log mean_j exp L[m, j];
            "token_mean" (the reference code's variant): marginal_m = log mean_j exp(L[m, j] / T_m).
        ema_alpha: weight of the past in sigma_EMA(t) = a sigma_EMA(t-1) + (1 - a) sigma(t); paper 0.9.
        eps: added to sigma in the z-scores; paper 1e-3.

    Returns:
        A dict of Python floats and ints (see docs/diagnostics.md), plus "ema_state": EmaState
        (None while no step has had a usable sigma). Values that cannot be computed are NaN (below).
        retrieval_acc, recall@k, chance_level, mi_est, mi_seq_est, mi_upper_bound, mi_zscore,
        mi_zscore_ema, marginal_std, marginal_std_ema, cond_entropy, reasoning_entropy,
        num_pairs, num_inputs, num_distinct_inputs.

    Ties in the ranking are broken uniformly at random *in expectation* (a hit counts 1/e when
    the true class shares the top score with e - 1 others), so a fully collapsed matrix, where
    every input scores a reasoning the same, gives exactly the chance level.

    Missing values. A proxy that the batch cannot support is NaN, never a number made up by the
    formula; the counts (num_pairs, num_inputs, num_distinct_inputs) are always there, and
    `proxies_undefined` words the reason:

    - fewer than MIN_PAIRS (2) pairs, or fewer than MIN_DISTINCT_INPUTS (2) distinct inputs:
      retrieval_acc, recall@k, mi_est, mi_seq_est, mi_zscore, mi_zscore_ema are NaN. One pair
      is one hit or miss, not a rate; with one distinct input retrieval is 1 (= chance) and MI
      is 0 whatever the policy does. marginal_std is NaN with fewer than 2 pairs (the spread of
      one value is 0 by construction).
    - zero spread (sigma <= ZERO_SPREAD): mi_zscore is NaN, since mi_est / (0 + eps) is a
      multiple of 1/eps, not of any scale in the data; mi_est itself stays finite.
    - the EMA folds in only a step whose mi_zscore is finite. Any other step returns the state
      it was given, unchanged (None stays None, so the EMA starts at the first usable sigma);
      mi_zscore_ema is mi_est / (sigma_EMA + eps), NaN where mi_est is or while that state is None.
    - cond_entropy, reasoning_entropy, chance_level and mi_upper_bound need one pair and are
      always finite (reasoning_entropy - cond_entropy = mi_est only where mi_est is defined).
    """
    logp, source, lengths, ks = _validate(logp, source, lengths, input_ids, ks, ema_state, marginal, ema_alpha, eps)
    m, p = logp.shape
    rows = np.arange(m)

    # Retrieval over distinct inputs: a class scores as its best member (members score alike).
    classes = _input_classes(input_ids, p)  # [P], class index of each column
    num_classes = int(classes.max()) + 1
    class_logp = np.full((m, num_classes), -np.inf)  # [M, C]
    for c in range(num_classes):
        class_logp[:, c] = logp[:, classes == c].max(axis=1)
    true_score = class_logp[rows, classes[source]]  # [M]
    above = (class_logp > true_score[:, None]).sum(axis=1)  # [M], classes ranked strictly higher
    tied = (class_logp == true_score[:, None]).sum(axis=1)  # [M], including the true class
    # Under a random order of the tied classes, P(true class within the top k) = clip((k - above) / tied).
    recall = {k: float(np.mean(np.clip((k - above) / tied, 0.0, 1.0))) for k in sorted(set(ks) | {1})}

    # Per-sequence and per-token log-likelihood of Z_m under its own input and under the batch mixture.
    matched_seq = logp[rows, source]  # [M]
    marginal_seq = logsumexp(logp, axis=1) - np.log(p)  # [M], log (1/P) sum_j exp L[m, j]
    matched = matched_seq / lengths  # [M] nats per token
    if marginal == "mixture":
        marginal_tok = marginal_seq / lengths
    else:
        marginal_tok = logsumexp(logp / lengths[:, None], axis=1) - np.log(p)
    nan = float("nan")
    defined = proxies_undefined(m, num_classes) is None  # retrieval and MI mean something
    mi_est = float(np.mean(matched - marginal_tok)) if defined else nan

    sigma = float(np.std(marginal_tok)) if m >= MIN_PAIRS else nan  # population std over the batch
    scaled = defined and sigma > ZERO_SPREAD  # mi_zscore has a scale: only then is sigma folded into the EMA
    new_state = ema_state
    if scaled:
        if ema_state is None:
            new_state = EmaState(sigma=sigma, steps=1)
        else:
            smoothed = ema_alpha * ema_state.sigma + (1 - ema_alpha) * sigma
            new_state = EmaState(sigma=smoothed, steps=ema_state.steps + 1)
    sigma_ema = new_state.sigma if new_state is not None else nan

    if not defined:
        recall = {k: nan for k in recall}
    out: dict[str, Any] = {"retrieval_acc": recall[1]}
    out.update({f"recall@{k}": recall[k] for k in ks})
    out.update(
        chance_level=1.0 / num_classes,
        mi_est=mi_est,
        mi_seq_est=float(np.mean(matched_seq - marginal_seq)) if defined else nan,
        mi_upper_bound=float(np.log(p)),
        mi_zscore=mi_est / (sigma + eps) if scaled else nan,
        mi_zscore_ema=mi_est / (sigma_ema + eps) if defined and sigma_ema > ZERO_SPREAD else nan,
        marginal_std=sigma,
        marginal_std_ema=sigma_ema,
        cond_entropy=float(-np.mean(matched)),
        reasoning_entropy=float(-np.mean(marginal_tok)),
        num_pairs=m,
        num_inputs=p,
        num_distinct_inputs=num_classes,
        ema_state=new_state,
    )
    return out


def proxies_undefined(num_pairs: float, num_distinct_inputs: float) -> str | None:
    """Why Retrieval-Acc and the MI estimates cannot be computed from M pairs over C distinct
    inputs, in words (None when they can): they need MIN_PAIRS pairs and MIN_DISTINCT_INPUTS inputs."""
    m, c = int(num_pairs), int(num_distinct_inputs)
    if m < MIN_PAIRS:
        return (f"Retrieval-Acc and MI need at least {MIN_PAIRS} (input, reasoning) pairs from at least "
                f"{MIN_DISTINCT_INPUTS} distinct inputs; one pair is a single hit or miss, not a rate")
    if c < MIN_DISTINCT_INPUTS:
        return (f"every pair has the same input, so retrieval is trivially right and MI is 0 by construction; "
                f"they need pairs from at least {MIN_DISTINCT_INPUTS} distinct inputs")
    return None


def _input_classes(input_ids: Sequence[Sequence[int]] | None, p: int) -> np.ndarray:
    """Class index [P] of each input; identical token sequences share one, numbered by first appearance."""
    if input_ids is None:
        return np.arange(p)
    first_seen: dict[tuple[int, ...], int] = {}
    return np.array([first_seen.setdefault(tuple(int(t) for t in ids), len(first_seen)) for ids in input_ids])


def _validate(
    logp: Any,
    source: Any,
    lengths: Any,
    input_ids: Any,
    ks: Any,
    ema_state: Any,
    marginal: str,
    ema_alpha: float,
    eps: float,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[int]]:
    """Check every argument of `mi_metrics`; return logp, source, lengths and ks as clean arrays."""
    logp = np.asarray(logp, dtype=np.float64)
    if logp.ndim != 2 or logp.shape[0] < 1 or logp.shape[1] < 1:
        raise ValueError(f"logp must be a 2-D array [M reasonings, P inputs] with M, P >= 1, got shape {logp.shape}")
    m, p = logp.shape
    if not np.all(np.isfinite(logp)):
        bad = tuple(int(i) for i in np.argwhere(~np.isfinite(logp))[0])
        raise ValueError(f"logp must be finite, got {logp[bad]} at [m, j] = {list(bad)}; check the scoring step")

    source = np.asarray(source)
    if source.shape != (m,):
        raise ValueError(f"source must have shape [M] = ({m},) to match logp {logp.shape}, got {source.shape}")
    if not np.issubdtype(source.dtype, np.integer):
        raise ValueError(f"source must hold integer column indices, got dtype {source.dtype}")
    if source.min() < 0 or source.max() >= p:
        bad = source[(source < 0) | (source >= p)][0]
        raise ValueError(f"source holds {bad}, out of range for P = {p} inputs (valid: 0..{p - 1})")

    if lengths is None:
        lengths = np.ones(m)
    else:
        lengths = np.asarray(lengths)
        if lengths.shape != (m,):
            raise ValueError(f"lengths must have shape [M] = ({m},) to match logp {logp.shape}, got {lengths.shape}")
        if not np.issubdtype(lengths.dtype, np.integer) or lengths.min() < 1:
            raise ValueError(
                f"lengths must be integer token counts >= 1 (drop empty reasonings first), got {lengths.tolist()}"
            )
        lengths = lengths.astype(np.float64)

    if input_ids is not None and len(input_ids) != p:
        raise ValueError(f"input_ids must hold one token-id sequence per column of logp ({p}), got {len(input_ids)}")
    ks = list(ks)
    if not ks or any(isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1 for k in ks):
        raise ValueError(f"ks must be positive ints, got {ks}")
    if ema_state is not None and not isinstance(ema_state, EmaState):
        raise ValueError(f"ema_state must be the EmaState a previous call returned, or None; got {type(ema_state)}")
    if marginal not in MARGINALS:
        raise ValueError(f"marginal must be one of {MARGINALS}, got {marginal!r}")
    if not 0.0 <= ema_alpha < 1.0:
        raise ValueError(f"ema_alpha must be in [0, 1), got {ema_alpha}")
    if eps <= 0:
        raise ValueError(f"eps must be > 0, got {eps}")
    return logp, source, lengths, [int(k) for k in ks]
