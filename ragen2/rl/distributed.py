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

Asynchronous training puts processes of two roles (trainer, rollout worker) in one world. Inside
`role(group)` the functions above see only the process's role group: a lone trainer is rank 0 of
1, whatever the world. The roles talk by `send_object` / `recv_object` and by broadcasts, on groups of
their own (ragen2.rl.async_rollout).
"""

from __future__ import annotations

import contextlib
import datetime
import os
import pickle
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from ragen2.errors import ConfigError

T = TypeVar("T")

# Ranks other than 0 wait in a collective while rank 0 evaluates or writes a checkpoint, which
# for a 7B model can take minutes; torch's default (10 minutes for NCCL) would kill the run.
TIMEOUT = datetime.timedelta(hours=2)


# This process's role group while roles share the world (`role`); None: the whole world is one role.
_role_group: dist.ProcessGroup | None = None


def rank() -> int:
    return dist.get_rank(_role_group) if dist.is_initialized() else 0


def world_size() -> int:
    return dist.get_world_size(_role_group) if dist.is_initialized() else 1


def role_group() -> dist.ProcessGroup | None:
    """The process group of this process's role (asynchronous training), None for the whole world."""
    return _role_group


@contextlib.contextmanager
def role(group: dist.ProcessGroup) -> Iterator[None]:
    """Within: rank, world size and the collectives here are those of `group`, this process's role."""
    global _role_group
    previous, _role_group = _role_group, group
    try:
        yield
    finally:
        _role_group = previous


def _root() -> int:
    """The global rank of rank 0 of this process's role."""
    return 0 if _role_group is None else dist.get_global_rank(_role_group, 0)


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


def my_rows(lengths: torch.Tensor, size: int) -> list[torch.Tensor]:
    """The rows of a shared batch this rank computes, in micro-batches of at most `size`; `lengths` [n]:
    each row's token count.

    Rows go longest first and are dealt round-robin over the ranks, so each rank gets a similar mix of
    long and short sequences, and each micro-batch holds rows of similar length: it is cut to its longest
    row, and attention costs the square of that width. A rank may get none ([]).
    """
    rows = torch.argsort(lengths, descending=True, stable=True)[rank() :: world_size()]
    return list(rows.split(size)) if len(rows) else []


def gather_objects(items: list[T]) -> list[T]:
    """Every rank's `items`, concatenated in rank order, on every rank (picklable objects)."""
    if world_size() == 1:
        return items
    parts: list[list[T] | None] = [None] * world_size()
    dist.all_gather_object(parts, items, group=_role_group)
    return [item for part in parts for item in part]


def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    """Sum `tensor` over ranks, in place, and return it."""
    if world_size() > 1:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=_role_group)
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
    handles = [dist.all_reduce(p.grad, op=dist.ReduceOp.SUM, async_op=True, group=_role_group) for p in parameters]
    for handle in handles:
        handle.wait()


def broadcast_object(obj: T) -> T:
    """Rank 0's `obj` on every rank."""
    if world_size() == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=_root(), group=_role_group)
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


def send_object(obj: Any, src: int, group: dist.ProcessGroup) -> list[dist.Work]:
    """Start sending a picklable `obj` from this process, global rank `src`, to the other member of `group`,
    a group of two; returns the operations, to keep until they complete. The receiver calls `recv_object`.

    The size, then the bytes, each as a broadcast: gloo completes a point-to-point receive only inside
    `wait()`, so a receiver could not watch for a dead sender while it waits; a broadcast it can poll.
    """
    data = torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8)
    size = torch.tensor([data.numel()], dtype=torch.int64)
    return [dist.broadcast(t, src, group=group, async_op=True) for t in (size, data)]


def recv_object(src: int, group: dist.ProcessGroup, alive: Callable[[], None] = lambda: None,
                poll_s: float = 0.01) -> Any:
    """The next object global rank `src` sends on `group` with `send_object`. While waiting, `alive()` is
    called every `poll_s` seconds: it raises when the sender is gone, so a dead peer ends the wait."""
    size = torch.zeros(1, dtype=torch.int64)
    wait(dist.broadcast(size, src, group=group, async_op=True), alive, poll_s)
    data = torch.empty(int(size.item()), dtype=torch.uint8)
    wait(dist.broadcast(data, src, group=group, async_op=True), alive, poll_s)
    return pickle.loads(data.numpy().tobytes())


def wait(work: dist.Work, alive: Callable[[], None], poll_s: float = 0.01) -> None:
    """Wait for an asynchronous operation, calling `alive()` (which raises if the peer is gone) as it runs."""
    while not work.is_completed():
        alive()
        time.sleep(poll_s)
    work.wait()


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
