"""Cross-scoring: the log-likelihood of every reasoning under every input, L[m, j] = log p(Z_m | X_j).

This is the M x P matrix the MI proxies are computed from (SPEC §4). Done naively it is M*P
teacher-forced passes over [X_j | Z_m]; prompts are long (the whole dialogue so far) and
reasonings short, so almost all of that work re-encodes the same P prompts. `score_matrix` runs
each prompt once, keeps its key/value cache, and scores all M reasonings against copies of it in
micro-batches. `score_matrix_naive` is the slow reference it is tested against.

Works with any Hugging Face decoder-only causal LM, including PEFT-wrapped ones. The cache goes
in under the forward's own name for it (`cache` in recent transformers, `past_key_values` before):
an unknown keyword would be swallowed by `**kwargs` and silently score without the prompt.
Scores are float32 log-softmax values summed in float64.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Iterator, Sequence

import numpy as np
import torch
from transformers import DynamicCache

TokenIds = Sequence[int] | np.ndarray | torch.Tensor


def score_matrix(
    model: torch.nn.Module,
    tokenizer_or_none: object | None,
    prompts: Sequence[TokenIds],
    reasonings: Sequence[TokenIds],
    *,
    micro_batch_size: int = 32,
    device: torch.device | str | None = None,
) -> np.ndarray:
    """Sequence log-probs of every reasoning under every prompt, reusing each prompt's KV cache.

    Args:
        model: a causal LM (`AutoModelForCausalLM`, possibly PEFT-wrapped), already on its device.
        tokenizer_or_none: only its `pad_token_id` is used, to fill padding; may be None.
        prompts: P token-id sequences X_j (each ends where the reasoning starts, e.g. after `<think>`).
        reasonings: M token-id sequences Z_m (reasoning tokens only, non-empty).
        micro_batch_size: reasonings scored per forward pass; bounds memory at about
            micro_batch_size x (prompt + reasoning) cached tokens and micro_batch_size x len x vocab logits.
        device: where the inputs go; defaults to the device of the model's parameters.

    Returns:
        logp: float64 [M, P], logp[m, j] = sum_t log p(Z_m[t] | X_j, Z_m[:t]).

    Per distinct prompt (identical prompts, e.g. the first turns of one group, are scored once
    and their column copied): one forward over X_j fills the cache and gives the logits that
    predict Z_m[0]; then for each micro-batch the cache is repeated along the batch dimension,
    the reasonings are right-padded, and one forward over them (positions len(X_j) + t) gives the
    rest. Right padding is safe under causal attention: a real token never attends to a pad that
    comes after it.
    """
    prompt_ts, reasoning_ts = _as_token_tensors(prompts, reasonings, micro_batch_size)
    distinct: dict[tuple[int, ...], int] = {}
    column_of = [distinct.setdefault(tuple(p.tolist()), len(distinct)) for p in prompt_ts]  # [P] -> distinct index
    prompt_ts = [torch.tensor(key, dtype=torch.long) for key in distinct]
    device = _resolve_device(model, device)
    batches = list(_micro_batches(reasoning_ts, micro_batch_size, _pad_id(tokenizer_or_none), device))
    logp = np.empty((len(reasoning_ts), len(prompt_ts)), dtype=np.float64)
    cache_arg = cache_keyword(model)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for j, prompt in enumerate(prompt_ts):
                prompt = prompt.to(device)[None]  # [1, Lp]
                prefix_cache = DynamicCache(config=model.config)
                out = model(input_ids=prompt, use_cache=True, **{cache_arg: prefix_cache})
                first_logp = torch.log_softmax(out.logits[0, -1].float(), dim=-1)  # [V], predicts Z[0]
                for rows, tokens, mask in batches:
                    b, t = tokens.shape
                    cache = copy.deepcopy(prefix_cache)
                    cache.batch_repeat_interleave(b)
                    attention_mask = torch.cat([mask.new_ones(b, prompt.shape[1]), mask], dim=1)  # [b, Lp+T]
                    positions = prompt.shape[1] + torch.arange(t, device=device).expand(b, t)  # [b, T]
                    logits = model(
                        input_ids=tokens, attention_mask=attention_mask, position_ids=positions, **{cache_arg: cache}
                    ).logits  # [b, T, V]; logits[:, t] predicts tokens[:, t + 1]
                    token_logp = torch.cat(
                        [first_logp[tokens[:, :1]], _target_logp(logits[:, :-1], tokens[:, 1:])], dim=1
                    )  # [b, T]
                    logp[rows, j] = _masked_sum(token_logp, mask)
    finally:
        model.train(was_training)
    return logp[:, column_of]


def cache_keyword(model: torch.nn.Module) -> str:
    """The forward's keyword for a key/value cache: `cache` (recent transformers) or `past_key_values` (older)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # PEFT forwards take **kwargs
    params = inspect.signature(base.forward).parameters
    return "past_key_values" if "past_key_values" in params and "cache" not in params else "cache"


def score_matrix_naive(
    model: torch.nn.Module,
    tokenizer_or_none: object | None,
    prompts: Sequence[TokenIds],
    reasonings: Sequence[TokenIds],
    *,
    micro_batch_size: int = 1,
    device: torch.device | str | None = None,
) -> np.ndarray:
    """The slow reference for `score_matrix`: one forward over each concatenation [X_j | Z_m].

    Same arguments and return value as `score_matrix`. With `micro_batch_size=1` (default) every
    pair is its own unpadded forward pass, which is the definition of L[m, j]; larger values batch
    the concatenations of one prompt (right-padded), the fair baseline for benchmarks.
    """
    prompt_ts, reasoning_ts = _as_token_tensors(prompts, reasonings, micro_batch_size)
    device = _resolve_device(model, device)
    batches = list(_micro_batches(reasoning_ts, micro_batch_size, _pad_id(tokenizer_or_none), device))
    logp = np.empty((len(reasoning_ts), len(prompt_ts)), dtype=np.float64)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for j, prompt in enumerate(prompt_ts):
                prompt = prompt.to(device)
                lp = prompt.shape[0]
                for rows, tokens, mask in batches:
                    b = tokens.shape[0]
                    input_ids = torch.cat([prompt.expand(b, lp), tokens], dim=1)  # [b, Lp+T]
                    attention_mask = torch.cat([mask.new_ones(b, lp), mask], dim=1)
                    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits  # [b, Lp+T, V]
                    token_logp = _target_logp(logits[:, lp - 1 : -1], tokens)  # [b, T]
                    logp[rows, j] = _masked_sum(token_logp, mask)
    finally:
        model.train(was_training)
    return logp


def _target_logp(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log softmax(logits)[target] in float32 without materialising the full log-softmax.

    logits [B, T, V], targets [B, T] -> [B, T].
    """
    logits = logits.float()
    picked = logits.gather(-1, targets[..., None])[..., 0]
    return picked - torch.logsumexp(logits, dim=-1)


def _masked_sum(token_logp: torch.Tensor, mask: torch.Tensor) -> np.ndarray:
    """Sum per-token log-probs [B, T] over real tokens (mask 1) in float64 -> [B]."""
    return (token_logp.double() * mask).sum(dim=1).cpu().numpy()


def _micro_batches(
    reasonings: list[torch.Tensor], size: int, pad_id: int, device: torch.device
) -> Iterator[tuple[np.ndarray, torch.Tensor, torch.Tensor]]:
    """Yield (row indices [b], right-padded tokens [b, T], mask [b, T]) over the reasonings.

    Rows are taken in order of length so each batch pads little; the indices say where each
    result goes.
    """
    order = np.argsort([len(z) for z in reasonings], kind="stable")
    for start in range(0, len(order), size):
        rows = order[start : start + size]
        batch = [reasonings[i] for i in rows]
        width = max(len(z) for z in batch)
        tokens = torch.full((len(batch), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for r, z in enumerate(batch):
            tokens[r, : len(z)] = z
            mask[r, : len(z)] = 1
        yield rows, tokens.to(device), mask.to(device)


def _as_token_tensors(
    prompts: Sequence[TokenIds], reasonings: Sequence[TokenIds], micro_batch_size: int
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Validate the inputs and turn every sequence into a 1-D long tensor."""
    if isinstance(micro_batch_size, bool) or not isinstance(micro_batch_size, int) or micro_batch_size < 1:
        raise ValueError(f"micro_batch_size must be a positive int, got {micro_batch_size!r}")
    out = []
    for name, seqs in (("prompts", prompts), ("reasonings", reasonings)):
        if len(seqs) == 0:
            raise ValueError(f"{name} is empty: pass at least one token-id sequence")
        tensors = [_to_long_tensor(s) for s in seqs]
        for i, t in enumerate(tensors):
            if t.numel() == 0:
                raise ValueError(f"{name}[{i}] is empty: every sequence needs a token (drop empty reasonings)")
        out.append(tensors)
    return out[0], out[1]


def _to_long_tensor(seq: TokenIds) -> torch.Tensor:
    if isinstance(seq, torch.Tensor):
        return seq.detach().to("cpu", torch.long).reshape(-1)
    return torch.as_tensor(np.asarray(seq, dtype=np.int64)).reshape(-1)


def _resolve_device(model: torch.nn.Module, device: torch.device | str | None) -> torch.device:
    return torch.device(device) if device is not None else next(model.parameters()).device


def _pad_id(tokenizer_or_none: object | None) -> int:
    """Any valid id will do (padded positions are masked and never scored); prefer the tokenizer's."""
    pad = getattr(tokenizer_or_none, "pad_token_id", None)
    return int(pad) if pad is not None else 0
