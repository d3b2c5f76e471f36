"""Asynchronous training on one machine: a rollout worker process that plays the groups of the steps ahead
while the trainer updates (docs/scaling.md, "Asynchronous training").

Two roles in one torch.distributed world over gloo: the trainer (rank 0) and the worker (rank 1), each
with its role group (inside it, ragen2.rl.distributed sees a world of one, so every phase runs as in a
single process), plus two groups of both: one carries the weights, the other the finished groups.

    worker   plays step s's candidate groups with `rollout_phase` (the seeds and sample streams of step s,
             so a group is the same whoever plays it), stamps them with its weights' version, and sends
             them to the trainer (`send_object`). Before step s it needs weights of
             version >= s - 1 - async.max_staleness, and waits for them if it has none that new;
             between rollout calls it takes the newest weights that have arrived.
    trainer  takes step s's groups from its buffer (`take`), trains on them with the phases of
             `training_step`, then broadcasts the trainable tensors as version s (`push`), without
             waiting for the worker to receive them.

The worker runs at most max_staleness + 1 steps ahead, so the buffer holds at most that many steps'
candidates. A worker that dies or fails ends the trainer's wait for its groups with a RolloutWorkerError
within a poll interval; a worker whose trainer died exits at its next wait. Groups in flight when
either stops are lost: `--resume` regenerates them from the checkpoint's weights.
"""

from __future__ import annotations

import contextlib
import math
import multiprocessing as mp
import os
import signal
import tempfile
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from ragen2.agent import Trajectory
from ragen2.config import Config
from ragen2.errors import ConfigError, RolloutWorkerError
from ragen2.models.loading import resolve_device
from ragen2.rl import distributed
from ragen2.rl.run import Run, load_trainable_policy

TRAINER, WORKER = 0, 1  # global ranks on one machine
READY = "worker_ready"  # store key the worker sets before it joins the process group
START_TIMEOUT_S = 600.0  # a worker that has not joined by then (importing, loading the model) never will


@dataclass
class _Groups:
    """The process groups of the two roles, made in the same order in both processes."""

    trainers: dist.ProcessGroup
    rollouts: dist.ProcessGroup
    weights: dist.ProcessGroup  # trainer and worker: the weight broadcasts
    finished: dist.ProcessGroup  # trainer and worker: the finished groups


def _make_groups() -> _Groups:
    return _Groups(dist.new_group([TRAINER]), dist.new_group([WORKER]), dist.new_group([TRAINER, WORKER]),
                   dist.new_group([TRAINER, WORKER]))


def candidates(config: Config) -> int:
    """Groups played per step for the filter to rank: async.oversample x rollout.num_groups."""
    return math.ceil(config.async_.oversample * config.rollout.num_groups - 1e-9)


def trainable(policy: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The tensors an update changes (the LoRA adapters only, with LoRA), in the model's order."""
    return [p for p in policy.parameters() if p.requires_grad]


@contextlib.contextmanager
def rollout_worker(run: Run) -> Iterator[None]:
    """For the duration of a run: its rollout worker started (`run.rollouts`), this process in the trainer role."""
    rollouts = AsyncRollouts(run)
    try:
        with distributed.role(rollouts.groups.trainers):
            run.rollouts = rollouts
            yield
    finally:
        run.rollouts = None
        rollouts.close()


class AsyncRollouts:
    """The trainer's end: the worker process, its buffer of finished groups, and the weights it is sent."""

    def __init__(self, run: Run):
        if int(os.environ.get("WORLD_SIZE", "1")) > 1:
            raise ConfigError("async.max_staleness > 0 runs on one machine with one trainer process for now; under "
                              "torchrun or accelerate (WORLD_SIZE > 1) the roles (async.rollout_ranks) are not "
                              "supported yet (docs/scaling.md): use async.max_staleness=0 there")
        self.config = run.config
        self.k = run.config.async_.max_staleness
        self.buffer: dict[int, tuple[int, list[Trajectory], dict[str, float]]] = {}  # step -> version, groups, metrics
        self.pushes: list[tuple[dist.Work, ...]] = []  # broadcasts the worker may not have received yet
        self.store_dir = tempfile.TemporaryDirectory(prefix="ragen2-async-")
        store_path = str(Path(self.store_dir.name) / "store")
        context = mp.get_context("spawn")
        self.process = context.Process(
            target=_worker_main, name="ragen2-rollout-worker", daemon=True,
            args=(run.config, run.run_dir, store_path, run.step, torch.get_num_threads(), os.getpid()),
        )
        self.process.start()
        try:
            store = dist.FileStore(store_path, 2)
            deadline = time.monotonic() + START_TIMEOUT_S
            while not store.check([READY]):  # the worker may fail before it joins: never wait on it blindly
                self._alive()
                if time.monotonic() > deadline:
                    raise RolloutWorkerError(f"the rollout worker did not start within {START_TIMEOUT_S:.0f} s")
                time.sleep(0.05)
            dist.init_process_group("gloo", store=store, rank=TRAINER, world_size=2, timeout=distributed.TIMEOUT)
            self.groups = _make_groups()
            self.push(run.policy, run.step)  # the weights it starts from: the trainer's, resumed or not
        except BaseException:
            self.close()
            raise

    def take(self, step: int) -> tuple[list[Trajectory], dict[str, float]]:
        """Step `step`'s candidate groups and their rollout metrics, waiting for the worker if they are not in."""
        while step not in self.buffer:
            message = self._receive()
            if message[0] == "error":
                raise RolloutWorkerError(f"the rollout worker failed, so the run stops (resume it with `ragen2 "
                                         f"train --resume` from its last checkpoint):\n{message[1]}")
            _, made_for, version, trajectories, metrics = message
            self.buffer[made_for] = (version, trajectories, metrics)
        version, trajectories, metrics = self.buffer.pop(step)
        if step - 1 - version > self.k:  # the worker waits for weights to keep this from happening
            raise RuntimeError(f"step {step} got groups of policy version {version}: staleness above "
                               f"async.max_staleness={self.k}")
        buffered = sum(len(t) for _, t, _ in self.buffer.values()) // self.config.rollout.group_size
        return trajectories, metrics | {"async/buffered_groups": float(buffered)}

    def push(self, policy: torch.nn.Module, version: int) -> None:
        """Broadcast the trainable tensors as `version` (the steps whose updates made them), without waiting;
        not after the last step, whose weights no rollout needs."""
        if version >= self.config.trainer.total_steps:
            return
        self.pushes = [works for works in self.pushes if not all(w.is_completed() for w in works)]
        flat = torch.cat([p.detach().reshape(-1) for p in trainable(policy)]).cpu()
        tag = torch.tensor([version], dtype=torch.int64)
        self.pushes.append(tuple(dist.broadcast(t, TRAINER, group=self.groups.weights, async_op=True)
                                 for t in (tag, flat)))

    def close(self) -> None:
        """Stop the worker (it may be waiting for weights that will not come) and leave the process group."""
        if self.process.is_alive():
            self.process.terminate()
        self.process.join(timeout=30)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
        if dist.is_initialized():
            dist.destroy_process_group()
        self.store_dir.cleanup()

    def _receive(self) -> tuple:
        """The worker's next message; a worker that is gone, or whose connection broke, raises RolloutWorkerError."""
        try:
            return distributed.recv_object(WORKER, self.groups.finished, self._alive)
        except RolloutWorkerError:
            raise
        except RuntimeError as e:  # gloo saw the connection close, maybe before the process is reaped
            self.process.join(timeout=10)
            self._alive()
            raise RolloutWorkerError(f"the connection to the rollout worker broke ({e}), so the run stops; resume "
                                     "it with `ragen2 train --resume` from its last checkpoint") from e

    def _alive(self) -> None:
        if not self.process.is_alive():
            raise RolloutWorkerError(
                f"the rollout worker (pid {self.process.pid}) exited with code {self.process.exitcode} while the "
                "trainer waited for its groups, so the run stops; resume it with `ragen2 train --resume` from its "
                "last checkpoint (the groups in flight are regenerated)"
            )


def _worker_main(config: Config, run_dir: Path, store_path: str, start: int, threads: int, parent: int) -> None:
    """The worker process: join the world as rank 1, then play steps start+1 .. trainer.total_steps.

    Ctrl-C reaches the whole terminal's process group: the worker ignores it, and the trainer, which
    finishes its step and checkpoints first (`_Interrupts`), stops it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    torch.set_num_threads(threads)
    store = dist.FileStore(store_path, 2)
    store.set(READY, "1")
    dist.init_process_group("gloo", store=store, rank=WORKER, world_size=2, timeout=distributed.TIMEOUT)
    groups = _make_groups()
    try:
        with distributed.role(groups.rollouts):
            _Worker(config, run_dir, groups, start, parent).run()
    except Exception:  # the trainer raises it, with this traceback
        if os.getppid() == parent:
            works = distributed.send_object(("error", traceback.format_exc()), WORKER, groups.finished)
            for work in works:
                distributed.wait(work, lambda: _check_parent(parent))
        raise


def _check_parent(parent: int) -> None:
    """A worker whose trainer died has nobody to send to: it exits."""
    if os.getppid() != parent:
        raise SystemExit(f"rollout worker: the trainer (pid {parent}) is gone")


class _Worker:
    """The worker's state: its copy of the policy (the trainable tensors replaced by each version it
    receives), a Run holding what `rollout_phase` reads, and the broadcast of weights it is waiting on."""

    def __init__(self, config: Config, run_dir: Path, groups: _Groups, start: int, parent: int):
        from ragen2.rl.trainer import rollout_phase  # the trainer imports this module

        self.rollout_phase = rollout_phase
        self.config, self.groups, self.start, self.parent = config, groups, start, parent
        device = resolve_device(config.model.device)
        torch.manual_seed(config.trainer.seed)  # as the trainer's setup: LoRA adapters start alike (then replaced)
        policy, tokenizer = load_trainable_policy(config, device, None)
        self.params = trainable(policy)
        self.size = sum(p.numel() for p in self.params)
        # A Run holding only what rollouts read: config, policy, tokenizer; the backend is made at the first one.
        self.state = Run(config, run_dir, device, policy, tokenizer, optimizer=None,
                         tracker=distributed.SilentTracker(), diagnostics=None)
        self.version = -1
        self._post()

    def run(self) -> None:
        k, sends = self.config.async_.max_staleness, []
        self.receive(block=True)  # the trainer's weights at the start
        for step in range(self.start + 1, self.config.trainer.total_steps + 1):
            self._check_parent()
            start = time.perf_counter()
            while self.version < step - 1 - k:
                self.receive(block=True)
            self.receive(block=False)  # whatever newer weights have arrived
            waited = time.perf_counter()
            trajectories, metrics = self.rollout_phase(self.state, step, candidates(self.config), self.version)
            metrics |= {"async/worker_wait_s": waited - start, "async/worker_rollout_s": time.perf_counter() - waited}
            sends = [w for w in sends if not w.is_completed()]
            sends += distributed.send_object(("groups", step, self.version, trajectories, metrics), WORKER,
                                              self.groups.finished)
        for work in sends:
            distributed.wait(work, self._check_parent)

    def receive(self, block: bool) -> None:
        """Load the newest weights that have arrived; with `block`, wait for at least one version."""
        while True:
            if not all(w.is_completed() for w in self.incoming):
                if not block:
                    return
                for work in self.incoming:
                    distributed.wait(work, self._check_parent)
            for work in self.incoming:
                work.wait()
            self._load()
            self._post()
            block = False

    def _post(self) -> None:
        """Start receiving the next broadcast of weights."""
        self.tag = torch.zeros(1, dtype=torch.int64)
        self.flat = torch.empty(self.size, dtype=self.params[0].dtype)
        self.incoming = [dist.broadcast(t, TRAINER, group=self.groups.weights, async_op=True)
                         for t in (self.tag, self.flat)]

    def _load(self) -> None:
        offset = 0
        with torch.no_grad():
            for p in self.params:
                p.copy_(self.flat[offset: offset + p.numel()].view_as(p))
                offset += p.numel()
        self.version = int(self.tag.item())

    def _check_parent(self) -> None:
        _check_parent(self.parent)
