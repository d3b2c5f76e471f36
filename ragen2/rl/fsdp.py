"""Fully sharded training state (`model.fsdp=true`, torch FSDP2) for policies too big to train on one device.

Data parallelism alone keeps the whole training state on every device: weights, gradients and
Adam's two moments, 16 bytes per parameter in float32. With FSDP the training copy of the
policy is sharded over the N processes (each holds 1/N of every tensor), so that state costs
16 / N bytes per parameter. Its forward and backward passes gather and scatter the shards, so
every process must run them in lockstep: the same number of micro-batches, in the same order
(`lockstep_passes` pads the shorter ranks with passes that add nothing to the gradient).

Generation cannot run in lockstep (each rank plays its own episodes, of different lengths), so
rollouts, scoring, evaluation and checkpointed weights use a full, untrained replica of the
policy (2 bytes per parameter in bfloat16), refreshed from the shards after every update
(`sync_replica`): the layout of RL trainers that pair a sharded trainer with a separate
inference copy. PPO's critic is sharded in place (`shard`): it only trains and computes
values, which the trainer runs in lockstep too, so it needs no replica.
"""

from __future__ import annotations

import copy
import math

import torch
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

from ragen2.rl import distributed


def shard(model: torch.nn.Module) -> torch.nn.Module:
    """Shard `model` in place over all processes of this role (`distributed.role`: the trainers of an
    asynchronous run) and return it: each transformer block is its own FSDP unit (the classes HF models
    list in `_no_split_modules`), the rest the root unit.

    FSDP averages gradients over the processes; the trainer's losses are normalised by the whole
    mini-batch's counts, for a sum, so it scales them by `gradient_scale()` first.
    """
    group = distributed.role_group()
    device = next(model.parameters()).device.type
    mesh = None if group is None else DeviceMesh.from_group(group, device)  # None: the whole world
    block_classes = set(getattr(model, "_no_split_modules", None) or [])
    for module in list(model.modules()):
        if type(module).__name__ in block_classes:
            fully_shard(module, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def shard_policy(policy: torch.nn.Module) -> torch.nn.Module:
    """A sharded training copy of `policy`, which stays whole as the replica."""
    return shard(copy.deepcopy(policy))


def gradient_scale() -> float:
    """Loss multiplier that turns FSDP's average over processes into the sum the trainer's
    normalisation expects (a divide factor of 1 would need a reduction gloo does not have)."""
    return float(distributed.world_size())


@torch.no_grad()
def sync_replica(trainee: torch.nn.Module, replica: torch.nn.Module) -> None:
    """Copy the sharded weights into the full replica (every process: it all-gathers each tensor)."""
    target = dict(replica.named_parameters())
    for name, param in trainee.named_parameters():
        target[name].copy_(param.full_tensor() if isinstance(param, DTensor) else param)


def lockstep_passes(n_rows: int, micro_batch_size: int, mine: int) -> int:
    """Extra forward/backward passes this process runs so that all run as many as the busiest.

    Rows are dealt round-robin (`distributed.my_rows`), so rank 0 has the most micro-batches.
    """
    busiest = math.ceil(len(range(0, n_rows, distributed.world_size())) / micro_batch_size)
    return busiest - mine


def full_model_state(model: torch.nn.Module) -> dict:
    """A sharded model's weights gathered whole on rank 0 ({} on the others); every process must call it."""
    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def full_optimizer_state(trainee: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """The optimizer state gathered whole (keyed by parameter name) on rank 0; {} on the others.
    Every process must call it (it all-gathers)."""
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_optimizer_state_dict(trainee, optimizer, options=options)


def load_full_optimizer_state(trainee: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict) -> None:
    """Load a `full_optimizer_state` into the sharded optimizer (every process holds the whole `state`)."""
    set_optimizer_state_dict(trainee, optimizer, optim_state_dict=state, options=StateDictOptions(full_state_dict=True))


def grad_norm_value(norm: torch.Tensor) -> torch.Tensor:
    """A gradient norm as a plain tensor (clip_grad_norm_ over sharded gradients returns a DTensor)."""
    return norm.full_tensor() if isinstance(norm, DTensor) else norm
