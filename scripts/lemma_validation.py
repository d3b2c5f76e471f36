"""Controlled check of Lemma I.1 (RAGEN-2): mixing in a shared template lowers I(X; Z), entropy misses it.

Synthetic policy with exact likelihoods. Each of P inputs x has its own token distribution p_x
over a vocabulary of V tokens; a reasoning is T i.i.d. tokens. With probability a the whole
reasoning instead comes from one shared template distribution q:

    p_a(z | x) = (1 - a) prod_t p_x(z_t) + a prod_t q(z_t)

Every p_x and q is a permutation of the same base distribution, so all have the same entropy:
the template is exactly as "diverse" as the input-specific reasoning. The lemma says
I_a(X; Z) <= (1 - a) I_0(X; Z). We sample G reasonings per input, score each under every
input's exact mixture likelihood, and feed the matrix to `mi_metrics`. Retrieval-Acc falls to
chance and MI to 0 as a -> 1, while the entropy a policy would report (the mean entropy of its
next-token distribution along the sampled reasonings) stays flat at the ends and *rises* in
between, because a mixture of equal-entropy distributions has more entropy, not less.

    python scripts/lemma_validation.py
    python scripts/lemma_validation.py --update-docs docs/diagnostics.md
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.special import logsumexp

from ragen2.collapse import mi_metrics

BEGIN, END = "<!-- lemma-table:begin -->", "<!-- lemma-table:end -->"


@dataclass
class Setting:
    """Size of the synthetic problem."""

    num_inputs: int = 8  # P
    vocab_size: int = 16  # V
    length: int = 6  # T, tokens per reasoning
    samples_per_input: int = 64  # G
    temperature: float = 3.0  # base distribution softmax(-rank / temperature); lower = more peaked


def base_distribution(s: Setting) -> np.ndarray:
    """[V] probabilities, decreasing with rank."""
    logits = -np.arange(s.vocab_size) / s.temperature
    return np.exp(logits - logsumexp(logits))


def make_distributions(s: Setting, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """log p_x [P, V] for every input and the template's log q [V]: permutations of one base distribution."""
    base = base_distribution(s)
    log_p = np.log(np.stack([base[rng.permutation(s.vocab_size)] for _ in range(s.num_inputs)]))
    return log_p, np.log(base[rng.permutation(s.vocab_size)])


def sample_and_score(
    s: Setting, log_p: np.ndarray, log_q: np.ndarray, mix: float, rng: np.random.Generator
) -> dict[str, float]:
    """One batch at template weight `mix`: MI proxies from exact likelihoods, plus the policy's token entropy."""
    source = np.repeat(np.arange(s.num_inputs), s.samples_per_input)  # [M]
    m = len(source)
    from_template = rng.random(m) < mix  # [M], whole reasoning drawn from q
    token_logp = np.where(from_template[:, None], log_q[None], log_p[source])  # [M, V], each sample's generator
    cdf = np.cumsum(np.exp(token_logp), axis=1)
    u = rng.random((m, s.length))
    z = np.minimum((u[:, :, None] > cdf[:, None, :]).sum(-1), s.vocab_size - 1)  # [M, T] inverse-CDF sampling

    with np.errstate(divide="ignore"):  # log(0) = -inf at mix in {0, 1} is exact and logaddexp handles it
        log_keep, log_mix = np.log1p(-mix), np.log(mix)
    prefix_p = np.cumsum(log_p[:, z], axis=-1)  # [P, M, T], log prod_{s<=t} p_j(z_s)
    prefix_q = np.cumsum(log_q[z], axis=-1)  # [M, T]
    logp = np.logaddexp(log_keep + prefix_p[:, :, -1], log_mix + prefix_q[None, :, -1]).T  # [M, P]

    # Policy token entropy along each sample: the next-token distribution given x and z_<t is the
    # posterior-weighted mixture w_t q + (1 - w_t) p_x, w_t = P(template | x, z_<t).
    own_prefix_p = prefix_p[source, np.arange(m)]  # [M, T]
    prev_p = np.concatenate([np.zeros((m, 1)), own_prefix_p[:, :-1]], axis=1)  # log p_x(z_<t)
    prev_q = np.concatenate([np.zeros((m, 1)), prefix_q[:, :-1]], axis=1)
    log_w = log_mix + prev_q - np.logaddexp(log_keep + prev_p, log_mix + prev_q)  # [M, T]
    w = np.exp(log_w)[:, :, None]
    next_token = w * np.exp(log_q)[None, None] + (1 - w) * np.exp(log_p[source])[:, None, :]  # [M, T, V]
    token_entropy = float(np.mean(-(next_token * np.log(np.maximum(next_token, 1e-300))).sum(-1)))

    out = mi_metrics(logp, source, np.full(m, s.length))
    return {
        "retrieval_acc": out["retrieval_acc"],
        "chance_level": out["chance_level"],
        "mi_seq_est": out["mi_seq_est"],
        "mi_est": out["mi_est"],
        "mi_zscore": out["mi_zscore"],
        "cond_entropy": out["cond_entropy"],
        "token_entropy": token_entropy,
        "reasoning_entropy": out["reasoning_entropy"],
    }


def run_sweep(s: Setting, mixes: Sequence[float], seeds: Sequence[int]) -> list[dict[str, float]]:
    """Per mix weight: mean and std over seeds of every measure, and the lemma's bound (1 - a) I_0.

    Each seed fixes p_x and q across the sweep, so I_0 (the a = 0 estimate) bounds the rest.
    """
    per_seed = []
    for seed in seeds:
        rng = np.random.default_rng(seed)
        log_p, log_q = make_distributions(s, rng)
        per_seed.append([sample_and_score(s, log_p, log_q, a, rng) for a in mixes])
    i0 = np.mean([results[0]["mi_seq_est"] for results in per_seed])  # mixes[0] is 0: checked by the caller
    rows = []
    for i, a in enumerate(mixes):
        row: dict[str, float] = {"mix": a, "bound": float((1 - a) * i0)}
        for key in per_seed[0][i]:
            values = np.array([results[i][key] for results in per_seed])
            row[key], row[key + "_std"] = float(values.mean()), float(values.std())
        rows.append(row)
    return rows


COLUMNS = [  # (key, header)
    ("retrieval_acc", "Retrieval-Acc"),
    ("chance_level", "chance"),
    ("mi_seq_est", "MI-Seq-Est (nats/seq)"),
    ("bound", "(1-a)·I_0"),
    ("mi_est", "MI-Est (nats/token)"),
    ("mi_zscore", "MI-ZScore"),
    ("token_entropy", "policy token entropy"),
    ("cond_entropy", "H(Z\\|X)/token"),  # pipe escaped for markdown tables
    ("reasoning_entropy", "H(Z)/token"),
]


def markdown_table(rows: list[dict[str, float]], s: Setting, seeds: Sequence[int]) -> str:
    lines = [
        f"P={s.num_inputs} inputs, V={s.vocab_size} tokens, T={s.length} tokens per reasoning, "
        f"G={s.samples_per_input} samples per input, {len(seeds)} seeds (mean ± std over seeds); "
        f"every p_x and q has entropy {_entropy(base_distribution(s)):.3f} nats/token.",
        "",
        "| a | " + " | ".join(h for _, h in COLUMNS) + " |",
        "|---" * (len(COLUMNS) + 1) + "|",
    ]
    for row in rows:
        cells = []
        for key, _ in COLUMNS:
            std = row.get(key + "_std")
            cells.append(f"{row[key]:.3f}" + (f" ± {std:.3f}" if std is not None and std >= 5e-4 else ""))
        lines.append(f"| {row['mix']:g} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _entropy(probs: np.ndarray) -> float:
    return float(-(probs * np.log(probs)).sum())


def write_between_markers(path: str, text: str) -> None:
    """Replace what lies between the lemma-table markers in `path` with `text`."""
    with open(path) as f:
        doc = f.read()
    if BEGIN not in doc or END not in doc:
        raise SystemExit(f"{path} has no {BEGIN} ... {END} markers to write the table between")
    head, rest = doc.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    with open(path, "w") as f:
        f.write(f"{head}{BEGIN}\n{text}\n{END}{tail}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    d = Setting()
    p.add_argument("--inputs", type=int, default=d.num_inputs, help="P, number of inputs")
    p.add_argument("--vocab", type=int, default=d.vocab_size, help="V, vocabulary size")
    p.add_argument("--length", type=int, default=d.length, help="T, tokens per reasoning")
    p.add_argument("--samples-per-input", type=int, default=d.samples_per_input, help="G")
    p.add_argument("--temperature", type=float, default=d.temperature, help="base distribution temperature")
    p.add_argument("--mix", type=float, nargs="+", default=[0.0, 0.25, 0.5, 0.75, 0.9, 1.0], help="template weights a")
    p.add_argument("--seeds", type=int, default=5, help="number of seeds")
    p.add_argument("--update-docs", default=None, metavar="PATH", help="also write the table into PATH")
    args = p.parse_args()
    if args.mix[0] != 0.0:
        p.error("--mix must start with 0 (the a = 0 run gives I_0 for the bound)")
    s = Setting(args.inputs, args.vocab, args.length, args.samples_per_input, args.temperature)
    seeds = list(range(args.seeds))
    table = markdown_table(run_sweep(s, args.mix, seeds), s, seeds)
    print(table)
    if args.update_docs:
        write_between_markers(args.update_docs, table)


if __name__ == "__main__":
    main()
