"""A memory cgroup per run, where the machine lets the host make one: one cap over all a run allocates.

RLIMIT_AS holds per process and counts neither kernel memory (pipe and socket
buffers) nor tmpfs pages; a memory cgroup charges all of them to the run. The host
makes `ragen2-sandbox-<pid>-<n>` under a `ragen2` cgroup below its own, in the cgroup
v2 hierarchy when it has the memory controller, else in v1's memory hierarchy. Where
none can be made (not root, no delegation, a read-only cgroupfs) the run goes on with
the address-space cap split over its processes (`host.process_limits`).

How the launcher joins it decides what the cgroup costs a run. Moving a process
(`cgroup.procs`) takes the kernel's global cgroup_threadgroup_rwsem for writing, which
waits for an RCU grace period: about 11 ms on this project's machines, a third of a
short run. A thread that moves only itself (it writes "0" to v1's `tasks`) skips that
lock (Linux 5.5, "cgroup: Optimize single thread migration", and 5.4 releases since
2022): 0.4 ms. The launcher is a fresh fork, so its one thread is the whole process,
and what it forks is born in the cgroup. cgroup v2 has no such file for a memory
cgroup (`cgroup.threads` is for threaded cgroups, which the memory controller is not),
so there the launcher writes "0" to `cgroup.procs` and pays the lock
(docs/benchmarks.md, "What the memory cgroup per run costs").
"""

from __future__ import annotations

import itertools
import logging
import os
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass

log = logging.getLogger(__package__)

CGROUP_ROOT = "/sys/fs/cgroup"
PREFIX = "ragen2-sandbox-"
_names = itertools.count()
_logged = False


@dataclass(frozen=True)
class MemoryCgroup:
    """One run's cgroup: the launcher joins it by writing "0" to `join`, its children are born in it."""

    path: str
    v2: bool

    @property
    def procs(self) -> str:
        return os.path.join(self.path, "cgroup.procs")

    @property
    def join(self) -> str:
        """Where a single-threaded process writes "0" to move itself in (see the module docstring)."""
        return self.procs if self.v2 else os.path.join(self.path, "tasks")

    def oom_kills(self) -> int:
        """How many of the run's processes the OOM killer ended (the cap was hit)."""
        events = os.path.join(self.path, "memory.events" if self.v2 else "memory.oom_control")
        with suppress(OSError), open(events) as f:
            for line in f:
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        return 0

    def remove(self, timeout_s: float = 5.0) -> None:
        """Kill what is left in it and remove it; a killed process leaves it a moment later, hence the retries.

        After a run usually only the exiting launcher is left, for a few tenths of a
        millisecond: the first retries come soon, later ones back off to 5 ms.
        """
        deadline = time.monotonic() + timeout_s
        delay = 0.0005
        while True:
            with suppress(OSError), open(self.procs) as f:
                for pid in f.read().split():
                    with suppress(ProcessLookupError):
                        os.kill(int(pid), signal.SIGKILL)
            try:
                os.rmdir(self.path)
                return
            except FileNotFoundError:
                return
            except OSError as e:
                if time.monotonic() > deadline:
                    log.warning("could not remove the memory cgroup %s: %s", self.path, e)
                    return
            time.sleep(delay)
            delay = min(2 * delay, 0.005)


@contextmanager
def memory_cgroup(memory_bytes: int) -> Iterator[MemoryCgroup | None]:
    """A run's cgroup capped at `memory_bytes` (None where none can be made), removed with what is left in it."""
    made = _create(memory_bytes)
    try:
        yield made
    finally:
        if made is not None:
            made.remove()


def _create(memory_bytes: int) -> MemoryCgroup | None:
    """A new cgroup capped at `memory_bytes`, swap included, or None where none can be made (logged once)."""
    global _logged
    path = None
    try:
        parent, v2 = _parent()
        path = os.path.join(parent, f"{PREFIX}{os.getpid()}-{next(_names)}")
        os.mkdir(path)
        if v2:
            _write(path, "memory.max", memory_bytes)
            with suppress(FileNotFoundError):  # no swap accounting: no swap to cap
                _write(path, "memory.swap.max", 0)
        else:
            _write(path, "memory.limit_in_bytes", memory_bytes)
            with suppress(FileNotFoundError):  # memory plus swap; absent without swap accounting
                _write(path, "memory.memsw.limit_in_bytes", memory_bytes)
            with suppress(OSError):  # deprecated; where it still works, kernel memory gets the same cap
                _write(path, "memory.kmem.limit_in_bytes", memory_bytes)
        return MemoryCgroup(path, v2)
    except (OSError, KeyError, ValueError) as e:
        if path is not None:
            with suppress(OSError):
                os.rmdir(path)
        if not _logged:
            _logged = True
            log.debug("no memory cgroup per run (%s): the memory cap is split over the run's processes", e)
        return None


def _parent() -> tuple[str, bool]:
    """The `ragen2` cgroup under the host's own one, made if needed, and whether it is in cgroup v2."""
    with open("/proc/self/cgroup") as f:
        own = dict(line.rstrip("\n").split(":", 2)[1:] for line in f)
    controllers = os.path.join(CGROUP_ROOT, "cgroup.controllers")
    if os.path.exists(controllers):
        with open(controllers) as f:
            if "memory" not in f.read().split():
                raise OSError("cgroup v2 has no memory controller")
        base = CGROUP_ROOT + own[""]
        parent = os.path.join(base, "ragen2")
        _make(parent)
        # Children get the controller only where their parents hand it down.
        for cgroup in (base, parent):
            _write(cgroup, "cgroup.subtree_control", "+memory")
        return parent, True
    memory = next((path for names, path in own.items() if "memory" in names.split(",")), None)
    if memory is None:
        raise OSError("no cgroup v1 memory hierarchy")
    parent = os.path.join(CGROUP_ROOT, "memory") + memory.rstrip("/") + "/ragen2"
    _make(parent)
    return parent, False


def _make(cgroup: str) -> None:
    """mkdir, not makedirs: a cgroup is made only where its parent is already a cgroup."""
    with suppress(FileExistsError):
        os.mkdir(cgroup)


def _write(cgroup: str, name: str, value: object) -> None:
    with open(os.path.join(cgroup, name), "w") as f:
        f.write(str(value))
