"""Forward passes over a Batch in micro-batches: the log-probs and per-token values the stages need.

The advantage stage (old and reference log-probs), the update (the PPO ratio's denominator), the
filter (entropy scores) and the critic all run a model over a whole batch without building a graph
for it at once; these helpers cut it into `algo.micro_batch_size` rows, give each process its rows
(ragen2.rl.distributed) and reassemble one [B, T-1] tensor, the same on every process.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ragen2.rl import distributed, fsdp
from ragen2.rl.batch import Batch, response_logits
from ragen2.rl.losses import token_logprobs


def logprobs(model: torch.nn.Module, mb: Batch) -> torch.Tensor:
    logits, start = response_logits(model, mb)  # [b, t-1-start, V]
    return F.pad(token_logprobs(logits, mb.targets[:, start:]), (start, 0))  # [b, t-1]


def logprobs_of_rows(model: torch.nn.Module, batch: Batch, rows: torch.Tensor, size: int) -> torch.Tensor:
    """`model`'s log-probs [B, T-1] of `batch`'s `rows`, zeros in the others (no forward pass for no rows)."""
    out = torch.zeros_like(batch.mask)
    if len(rows):
        part = in_micro_batches(lambda mb: logprobs(model, mb), batch.select(rows), size)
        out[rows, : part.shape[1]] = part
    return out


def in_micro_batches(fn, batch: Batch, size: int, lockstep: bool = False) -> torch.Tensor:
    """Run `fn(micro_batch) -> [b, t-1]` over `batch` and reassemble the full [B, T-1] result.

    With several processes each runs `fn` on its rows only; the zeros elsewhere make the sum
    over processes the full result, on every process. `lockstep` (an FSDP-sharded model) pads
    each rank to the same number of calls, with results thrown away.
    """
    out = torch.zeros(batch.mask.shape, dtype=torch.float32, device=batch.mask.device)
    micro_batches = distributed.my_rows(batch.attention_mask.sum(dim=1), size)
    for rows in micro_batches:
        piece = fn(batch.select(rows))
        out[rows, : piece.shape[1]] = piece.float()
    if lockstep:
        pad_to_lockstep(batch, size, len(micro_batches), fn, backward=False)
    return distributed.all_reduce_sum(out)


def pad_to_lockstep(batch: Batch, size: int, done: int, fn, backward: bool) -> None:
    """FSDP: after `done` micro-batches of `batch`, run `fn` on its first row until this rank has made
    as many passes as the busiest one, so every rank joins the same gathers and gradient reductions.
    The results are thrown away; with `backward` their gradient is multiplied by 0."""
    for _ in range(fsdp.lockstep_passes(len(batch), size, done)):
        out = fn(batch.select(torch.arange(1, device=batch.mask.device)))
        if backward:
            (0.0 * out.sum()).backward()

