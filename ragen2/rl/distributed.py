"""Data parallelism over torch.distributed: who this process is, and the few collectives the trainer needs.

A run with N processes (`torchrun --nproc_per_node N -m ragen2 train ...` or `accelerate launch
-m ragen2 train ...`; both set RANK, WORLD_SIZE, LOCAL_RANK and MASTER_ADDR/PORT) splits each
step like this (docs/scaling.md):

    rollout    rank r plays groups [r P/N, (r+1) P/N) with per-episode sampling seeds, so an
               episode samples the same tokens as in a 1-process run; then every rank gathers
               all P x G trajectories (`gather_objects`)
    collapse,  computed identically on every rank from the gathered batch, so alarms, filter
    filter     selections and early stops agree (the trainer still broadcasts rank 0's decision
               to stop, so that no rank can leave the others waiting)
    update     every rank holds the whole kept batch of token ids; the model work on it is split
               by rows (`my_rows`), losses are normalised by the whole mini-batch's counts and
               gradients summed over ranks (`all_reduce_grads`): each optimizer step applies
               the gradient a single process would compute (with model.fsdp a sharded copy
               of the policy trains instead and FSDP reduces the gradients: ragen2.rl.fsdp)
    evaluate,  on rank 0 (`on_main`); the others receive its result
    checkpoint,
    logging

One process (no WORLD_SIZE, or WORLD_SIZE=1) sends no messages: every function here then
does what a single process needs (all rows, its own objects, no reductions).
"""

from __future__ import annotations

import contextlib
import datetime
import os
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from ragen2.errors import ConfigError

T = TypeVar("T")

# Ranks other than 0 wait in a collective while rank 0 evaluates or writes a checkpoint, which
# for a 7B model can take minutes; torch's default (10 minutes for NCCL) would kill the run.
TIMEOUT = datetime.timedelta(hours=2)


def rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def is_main() -> bool:
    """Rank 0: the process that writes the run directory."""
    return rank() == 0


@contextlib.contextmanager
def process_group(device_type: str) -> Iterator[None]:
    """Join the process group the launcher describes in the environment, for the duration of a run.

    gloo on CPU, NCCL on CUDA (each process on GPU `LOCAL_RANK`). Without WORLD_SIZE > 1, or
    when the caller already initialised torch.distributed, nothing is done.
    """
    size = int(os.environ.get("WORLD_SIZE", "1"))
    if size <= 1 or dist.is_initialized():
        yield
        return
    if device_type == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))  # "cuda" now means this process's GPU
    dist.init_process_group("nccl" if device_type == "cuda" else "gloo", timeout=TIMEOUT)
    try:
        yield
    finally:
        dist.destroy_process_group()


def group_range(num_groups: int) -> range:
    """The groups (prompts) this rank rolls out: a contiguous block of P / world_size."""
    size = world_size()
    if num_groups % size:
        raise ConfigError(
            f"rollout.num_groups={num_groups} is not divisible by the {size} processes of this run: "
            f"use a multiple of {size} (each process rolls out the same number of groups)"
        )
    per_rank = num_groups // size
    return range(rank() * per_rank, (rank() + 1) * per_rank)


def my_rows(n: int, size: int, device: torch.device | str = "cpu") -> list[torch.Tensor]:
    """The rows of a shared n-row batch this rank computes, in micro-batches of at most `size`.

    Every world_size-th row from the rank's own index: interleaved rather than in blocks, so
    each rank gets a similar mix of long and short sequences. A rank may get none ([]).
    """
    rows = torch.arange(n, device=device)[rank() :: world_size()]
    return list(rows.split(size)) if len(rows) else []


def gather_objects(items: list[T]) -> list[T]:
    """Every rank's `items`, concatenated in rank order, on every rank (picklable objects)."""
    if world_size() == 1:
        return items
    parts: list[list[T] | None] = [None] * world_size()
    dist.all_gather_object(parts, items)
    return [item for part in parts for item in part]


def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    """Sum `tensor` over ranks, in place, and return it."""
    if world_size() > 1:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def all_reduce_grads(parameters: list[torch.nn.Parameter]) -> None:
    """Sum the gradients of `parameters` over ranks (what DDP does, without its wrapper).

    A rank may have had no rows in a mini-batch, so a missing gradient counts as zeros. The
    reduction is not averaged: each rank's loss is already normalised by the global counts.
    """
    if world_size() == 1:
        return
    for p in parameters:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    handles = [dist.all_reduce(p.grad, op=dist.ReduceOp.SUM, async_op=True) for p in parameters]
    for handle in handles:
        handle.wait()


def broadcast_object(obj: T) -> T:
    """Rank 0's `obj` on every rank."""
    if world_size() == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def on_main(fn: Callable[[], T]) -> T:
    """Run `fn` on rank 0 only and return its result on every rank.

    An exception on rank 0 is raised on every rank, so no rank is left waiting in a collective.
    """
    if world_size() == 1:
        return fn()
    outcome: tuple[bool, Any] = (True, None)
    if is_main():
        try:
            outcome = (True, fn())
        except Exception as e:  # sent to the other ranks, then raised here too
            outcome = (False, e)
    ok, value = broadcast_object(outcome)
    if not ok:
        raise value
    return value


class SilentTracker:
    """What ranks other than 0 log to: nothing. Same methods as ragen2.tracking.Tracker."""

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        pass

    def log_event(self, kind: str, message: str, step: int, **data: Any) -> None:
        pass

    def truncate_after(self, step: int) -> None:
        pass

    def close(self) -> None:
        pass

    def __enter__(self) -> SilentTracker:
        return self

    def __exit__(self, *exc: object) -> None:
        pass
