"""Asynchronous training: rollout processes that play the groups of the steps ahead while the trainers update
(docs/scaling.md, "Asynchronous training").

Two roles in one torch.distributed world. Inside its role group (ragen2.rl.distributed.role) a process sees
a world of its role only, so every phase runs as it does data-parallel over that many processes. Two more
groups join the roles, both over gloo (CPU tensors, whatever the roles' own backend):

    weights   the lead trainer and every rollout rank: the lead trainer's broadcasts of the trainable tensors
    finished  the lead rollout rank and every trainer: its broadcasts of the finished groups

    rollout   the rollout ranks play step s's candidate groups with `rollout_phase` (data-parallel over
              them, so a group is the same whoever plays it) with the version of the weights their lead
              chose, the newest that has arrived and at least s - 1 - async.max_staleness (they wait for it);
              their lead stamps the groups with it and sends them to the trainers.
    trainer   takes step s's groups from its buffer (`take`), trains on them with the phases of
              `training_step`, then the lead broadcasts the trainable tensors as version s (`push`),
              without waiting for the rollout ranks to receive them.

The rollout ranks run at most max_staleness + 1 steps ahead, so the buffer holds at most that many steps'
candidates. At the end (`finish`) the lead trainer broadcasts a stop instead of weights, and the trainers
read what the rollout ranks still send up to their "done": every process leaves its collectives and exits.

On one machine without a launcher the trainer starts its own rollout workers (`LocalWorker`: the trainer is
rank 0, the async.local_workers workers ranks 1 to n). A worker that dies or fails ends the trainer's wait for
its groups with a RolloutWorkerError within a poll interval; a worker whose trainer died exits at its next wait. Under
torchrun or accelerate the ranks take the roles `async.rollout_ranks` names, and the launcher stops every
process when one fails. Groups in flight when a run stops are lost: `--resume` regenerates them from the
checkpoint's weights.
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
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from ragen2.agent import Trajectory
from ragen2.config import Config
from ragen2.errors import ConfigError, RolloutWorkerError
from ragen2.models.loading import resolve_device
from ragen2.rl import distributed
from ragen2.rl.rollout_stage import rollout_phase
from ragen2.rl.run import Run, load_trainable_policy

TRAINER = 0  # global rank of the trainer in the world a run on one machine makes with its workers
READY = "worker_ready_"  # store key (+ rank) a worker sets before it joins the process group
START_TIMEOUT_S = 600.0  # a worker that has not joined by then (importing, loading the model) never will
STOP = -1  # the version tag of the lead trainer's last broadcast: no more weights will come


@dataclass
class Roles:
    """Which global ranks train and which generate, and the process groups between them."""

    trainer_ranks: list[int]
    rollout_ranks: list[int]
    trainers: dist.ProcessGroup
    rollouts: dist.ProcessGroup
    weights: dist.ProcessGroup  # the lead trainer and every rollout rank
    finished: dist.ProcessGroup  # the lead rollout rank and every trainer

    @property
    def lead_trainer(self) -> int:
        return self.trainer_ranks[0]

    @property
    def lead_rollout(self) -> int:
        return self.rollout_ranks[0]

    @property
    def trains(self) -> bool:
        return dist.get_rank() in self.trainer_ranks


def make_roles(rollout_ranks: list[int]) -> Roles:
    """The roles of the current world; a collective: every process makes the same groups in the same order."""
    rollout_ranks = sorted(rollout_ranks)
    trainer_ranks = [r for r in range(dist.get_world_size()) if r not in rollout_ranks]
    return Roles(
        trainer_ranks, rollout_ranks, dist.new_group(trainer_ranks), dist.new_group(rollout_ranks),
        dist.new_group([trainer_ranks[0], *rollout_ranks], backend="gloo"),
        dist.new_group([rollout_ranks[0], *trainer_ranks], backend="gloo"),
    )


def launched_roles(config: Config) -> Roles | None:
    """Under torchrun or accelerate with async.max_staleness > 0: the roles `async.rollout_ranks` gives the
    launcher's world (made on every process, which must have joined it). None otherwise: a run without a
    launcher starts its own worker (`rollout_worker`)."""
    ranks, size = config.async_.rollout_ranks, int(os.environ.get("WORLD_SIZE", "1"))
    if size <= 1:
        if ranks:
            raise ConfigError(f"async.rollout_ranks={ranks} names ranks of a torchrun or accelerate world, and this "
                              "run has no launcher: leave it [] and the run starts its own rollout worker")
        return None
    if not (config.async_.enable and config.async_.max_staleness > 0):
        return None
    if not ranks:
        raise ConfigError(f"async.max_staleness={config.async_.max_staleness} under torchrun or accelerate (WORLD_SIZE="
                          f"{size}) needs async.rollout_ranks, the ranks that generate (e.g. [{size - 1}]); the "
                          "others train (docs/scaling.md)")
    if max(ranks) >= size or len(ranks) >= size:
        raise ConfigError(f"async.rollout_ranks={ranks} must name ranks below WORLD_SIZE={size} and leave at least "
                          "one to train")
    if config.model.fsdp and 0 in ranks:
        raise ConfigError(f"async.rollout_ranks={ranks} with model.fsdp=true: rank 0 must train, since the "
                          "checkpoint's sharded state is gathered whole on it")
    check_split(config, len(ranks), "async.rollout_ranks")
    return make_roles(ranks)


def candidates(config: Config) -> int:
    """Groups played per step for the filter to rank: async.oversample x rollout.num_groups."""
    return math.ceil(config.async_.oversample * config.rollout.num_groups - 1e-9)


def check_split(config: Config, players: int, key: str) -> None:
    """The step's candidate groups split evenly over the processes that play them (`key` names their count)."""
    if candidates(config) % players:
        raise ConfigError(f"the {candidates(config)} candidate groups a step plays (rollout.num_groups x "
                          f"async.oversample) do not split over the {players} {key}: use a multiple")


def trainable(policy: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The tensors an update changes (the LoRA adapters only, with LoRA), in the model's order."""
    return [p for p in policy.parameters() if p.requires_grad]


@contextlib.contextmanager
def rollout_worker(run: Run, roles: Roles | None = None) -> Iterator[None]:
    """For the duration of a run: the trainer's end of the rollout ranks in `run.rollouts`, this process in the
    trainer role. `roles`: the launcher's (`launched_roles`); without them the run starts its own worker."""
    local = LocalWorker(run.config) if roles is None else None
    clean = False
    try:
        roles = local.roles if local is not None else roles
        with distributed.role(roles.trainers):
            run.rollouts = AsyncRollouts(run, roles, local.alive if local is not None else _launcher_watches)
            yield
            run.rollouts.finish()
        clean = True
    finally:
        run.rollouts = None
        if local is not None:
            local.close(clean)


class AsyncRollouts:
    """A trainer's end: its buffer of finished groups, and (the lead trainer) the weights it sends."""

    def __init__(self, run: Run, roles: Roles, alive: Callable[..., None]):
        self.config, self.roles, self.alive = run.config, roles, alive
        self.k = run.config.async_.max_staleness
        self.lead = dist.get_rank() == roles.lead_trainer
        # With model.fsdp the replica holds the whole weights, every one trained (no LoRA), after `sync_replica`.
        self.params = list(run.policy.parameters()) if run.trainee is not None else trainable(run.policy)
        self.buffer: dict[int, tuple[int, list[Trajectory], dict[str, float]]] = {}  # step -> version, groups, metrics
        self.pushes: list[dist.Work] = []  # broadcasts the rollout ranks may not have received yet
        if self.lead:  # where they start: this run's directory and step, and its weights
            self.pushes += distributed.send_object((run.run_dir, run.step), roles.lead_trainer, roles.weights)
        self.push(run.step)

    def take(self, step: int) -> tuple[list[Trajectory], dict[str, float]]:
        """Step `step`'s candidate groups and their rollout metrics, waiting for the rollout ranks if they are not in."""
        while step not in self.buffer:
            message = self._receive()
            if message[0] != "groups":
                raise RolloutWorkerError(f"the rollout ranks ended before step {step}'s groups")
            _, made_for, version, trajectories, metrics = message
            self.buffer[made_for] = (version, trajectories, metrics)
        version, trajectories, metrics = self.buffer.pop(step)
        if step - 1 - version > self.k:  # the rollout ranks wait for weights to keep this from happening
            raise RuntimeError(f"step {step} got groups of policy version {version}: staleness above "
                               f"async.max_staleness={self.k}")
        buffered = sum(len(t) for _, t, _ in self.buffer.values()) // self.config.rollout.group_size
        return trajectories, metrics | {"async/buffered_groups": float(buffered)}

    def push(self, version: int) -> None:
        """The lead trainer broadcasts the trainable tensors as `version` (the steps whose updates made them),
        without waiting; not after the last step, whose weights no rollout needs."""
        if self.lead and version < self.config.trainer.total_steps:
            self._broadcast(version)

    def finish(self) -> None:
        """Tell the rollout ranks to stop, read what they still send up to their "done", and wait until every
        broadcast has arrived: then no process is left in a collective."""
        if self.lead:
            self._broadcast(STOP)
        while self._receive()[0] != "done":
            pass
        for work in self.pushes:
            distributed.wait(work, self.alive)

    def _broadcast(self, version: int) -> None:
        self.pushes = [work for work in self.pushes if not work.is_completed()]
        flat = torch.cat([p.detach().reshape(-1) for p in self.params]).cpu()
        tag = torch.tensor([version], dtype=torch.int64)
        self.pushes += [dist.broadcast(t, self.roles.lead_trainer, group=self.roles.weights, async_op=True)
                        for t in (tag, flat)]

    def _receive(self) -> tuple:
        """The lead rollout rank's next message; one that failed, or is gone, raises RolloutWorkerError."""
        try:
            message = distributed.recv_object(self.roles.lead_rollout, self.roles.finished, self.alive)
        except RolloutWorkerError:
            raise
        except RuntimeError as e:  # gloo saw the connection close, maybe before the process is reaped
            self.alive(wait_s=10)
            raise RolloutWorkerError(f"the connection to the rollout worker broke ({e}), so the run stops; resume "
                                     "it with `ragen2 train --resume` from its last checkpoint") from e
        if message[0] == "error":
            raise RolloutWorkerError(f"the rollout worker failed, so the run stops (resume it with `ragen2 train "
                                     f"--resume` from its last checkpoint):\n{message[1]}")
        return message


class LocalWorker:
    """The rollout worker processes a run without a launcher starts (async.local_workers), and the world it
    makes with them: the trainer rank 0, the workers ranks 1 to n, generating data-parallel."""

    def __init__(self, config: Config) -> None:
        n = config.async_.local_workers
        check_split(config, n, "async.local_workers")
        self.store_dir = tempfile.TemporaryDirectory(prefix="ragen2-async-")
        store_path = str(Path(self.store_dir.name) / "store")
        spawn = mp.get_context("spawn")
        self.processes = [
            spawn.Process(target=_worker_main, name=f"ragen2-rollout-worker-{rank}", daemon=True,
                          args=(config, store_path, rank, n + 1, torch.get_num_threads(), os.getpid()))
            for rank in range(1, n + 1)
        ]
        for process in self.processes:
            process.start()
        try:
            store = dist.FileStore(store_path, n + 1)
            deadline = time.monotonic() + START_TIMEOUT_S
            # A worker may fail before it joins: never wait on them blindly.
            while not store.check([f"{READY}{rank}" for rank in range(1, n + 1)]):
                self.alive()
                if time.monotonic() > deadline:
                    raise RolloutWorkerError(f"the rollout workers did not start within {START_TIMEOUT_S:.0f} s")
                time.sleep(0.05)
            dist.init_process_group("gloo", store=store, rank=TRAINER, world_size=n + 1, timeout=distributed.TIMEOUT)
            self.roles = make_roles(list(range(1, n + 1)))
        except BaseException:
            self.close(clean=False)
            raise

    def alive(self, wait_s: float = 0.0) -> None:
        """Raise RolloutWorkerError if a worker has exited (after up to `wait_s` for one that is exiting)."""
        deadline = time.monotonic() + wait_s
        while True:
            for process in self.processes:
                if not process.is_alive():
                    process.join()
                    raise RolloutWorkerError(
                        f"the rollout worker (pid {process.pid}) exited with code {process.exitcode} while the "
                        "trainer waited for its groups, so the run stops; resume it with `ragen2 train --resume` "
                        "from its last checkpoint (the groups in flight are regenerated)"
                    )
            if time.monotonic() >= deadline:
                return
            time.sleep(0.01)

    def close(self, clean: bool) -> None:
        """After a clean finish the workers exit by themselves; otherwise (or if they do not) they are stopped.
        Then the process group is left."""
        deadline = time.monotonic() + (30 if clean else 0)
        for process in self.processes:
            process.join(timeout=max(0.0, deadline - time.monotonic()))
        for process in self.processes:
            if process.is_alive():
                process.terminate()
                process.join(timeout=30)
            if process.is_alive():
                process.kill()
                process.join()
        if dist.is_initialized():
            dist.destroy_process_group()
        self.store_dir.cleanup()


def _worker_main(config: Config, store_path: str, rank: int, world: int, threads: int, parent: int) -> None:
    """A worker process a run without a launcher starts: join the world as `rank`, then serve rollouts.

    Ctrl-C reaches the whole terminal's process group: the worker ignores it, and the trainer, which
    finishes its step and checkpoints first (`_Interrupts`), stops it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    torch.set_num_threads(threads)
    store = dist.FileStore(store_path, world)
    store.set(f"{READY}{rank}", "1")
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=distributed.TIMEOUT)
    roles = make_roles(list(range(1, world)))

    def alive(wait_s: float = 0.0) -> None:  # a worker whose trainer died has nobody to send to: it exits
        if os.getppid() != parent:
            raise SystemExit(f"rollout worker: the trainer (pid {parent}) is gone")

    try:
        serve_rollouts(config, roles, alive)
    except Exception:  # the trainer raises it, with this traceback (the lead's: the others' exits end the run)
        if os.getppid() == parent and rank == roles.lead_rollout:
            for work in distributed.send_object(("error", traceback.format_exc()), rank, roles.finished):
                distributed.wait(work, alive)
        raise


def _launcher_watches(wait_s: float = 0.0) -> None:
    """Under torchrun or accelerate nothing to check: the launcher stops every process when one fails."""


def serve_rollouts(config: Config, roles: Roles, alive: Callable[..., None] = _launcher_watches) -> None:
    """A rollout rank's whole run: play the steps the trainers will take until the lead trainer says stop.
    `alive()` raises when the trainer is gone."""
    with distributed.role(roles.rollouts):
        worker = _Worker(config, roles, alive)
        try:
            worker.run()
        finally:
            if worker.state.agent is not None:  # agent.entrypoint's endpoint
                worker.state.agent.close()


class _Worker:
    """A rollout rank's state: its copy of the policy (the trainable tensors replaced by each version it
    receives), a Run holding what `rollout_phase` reads, and the broadcast of weights it is waiting on."""

    def __init__(self, config: Config, roles: Roles, alive: Callable[..., None]):
        self.config, self.roles, self.alive = config, roles, alive
        self.lead = dist.get_rank() == roles.lead_rollout
        device = resolve_device(config.model.device)
        torch.manual_seed(config.trainer.seed)  # as the trainer's setup: LoRA adapters start alike (then replaced)
        policy, tokenizer = load_trainable_policy(config, device, None)
        self.params = trainable(policy)
        self.size = sum(p.numel() for p in self.params)
        run_dir, self.start = distributed.recv_object(roles.lead_trainer, roles.weights, alive)
        # A Run holding only what rollouts read: config, policy, tokenizer; the backend is made at the first one.
        self.state = Run(config, run_dir, device, policy, tokenizer, optimizer=None,
                         tracker=distributed.SilentTracker(), diagnostics=None)
        self.version, self.stopped = -1, False
        self._post()

    def run(self) -> None:
        k, sends = self.config.async_.max_staleness, []
        self._receive_until(self.start)  # the trainer's weights at the start
        for step in range(self.start + 1, self.config.trainer.total_steps + 1):
            self.alive()
            start = time.perf_counter()
            if self._agree(step - 1 - k) == STOP:
                break
            waited = time.perf_counter()
            newest = self._newest if self.config.async_.partial_rollouts else None
            trajectories, metrics = rollout_phase(self.state, step, candidates(self.config), self.version, newest)
            metrics |= {"async/worker_wait_s": waited - start, "async/worker_rollout_s": time.perf_counter() - waited}
            if self.lead:
                sends = [w for w in sends if not w.is_completed()]
                sends += self._send(("groups", step, self.version, trajectories, metrics))
        if self.lead:
            sends += self._send(("done",))
        self._receive_until(STOP)
        for work in sends:
            distributed.wait(work, self.alive)

    def _send(self, message: tuple) -> list[dist.Work]:
        return distributed.send_object(message, self.roles.lead_rollout, self.roles.finished)

    def _agree(self, oldest: int) -> int:
        """The version every rollout rank plays the next step with: the lead's newest, at least `oldest`
        (waiting for it), or STOP once the lead trainer has said so."""
        if self.lead:
            while not self.stopped and self.version < oldest:
                self._next(block=True)
            while not self.stopped and self._next(block=False):  # whatever newer weights have arrived
                pass
        chosen = distributed.broadcast_object(STOP if self.stopped else self.version)
        self._receive_until(chosen)
        return chosen

    def _newest(self) -> int:
        """Partial rollouts, before every turn: load the weights that have arrived (without waiting for any)."""
        while not self.stopped and self._next(block=False):
            pass
        return self.version

    def _receive_until(self, version: int) -> None:
        """Load broadcasts in order until `version` (STOP: until the stop)."""
        while not self.stopped and (version == STOP or self.version < version):
            self._next(block=True)

    def _next(self, block: bool) -> bool:
        """Load the next broadcast if it has arrived (with `block`, when it arrives); False if it has not."""
        if not all(w.is_completed() for w in self.incoming):
            if not block:
                return False
            for work in self.incoming:
                distributed.wait(work, self.alive)
        for work in self.incoming:
            work.wait()
        if int(self.tag.item()) == STOP:
            self.stopped = True
            return True
        offset = 0
        with torch.no_grad():
            for p in self.params:
                p.copy_(self.flat[offset: offset + p.numel()].view_as(p))
                offset += p.numel()
        self.version = int(self.tag.item())
        self._post()
        return True

    def _post(self) -> None:
        """Start receiving the next broadcast of weights."""
        self.tag = torch.zeros(1, dtype=torch.int64)
        self.flat = torch.empty(self.size, dtype=self.params[0].dtype)
        self.incoming = [dist.broadcast(t, self.roles.lead_trainer, group=self.roles.weights, async_op=True)
                         for t in (self.tag, self.flat)]
