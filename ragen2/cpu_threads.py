"""How many threads torch computes with on the CPU: chosen for the policy's size and the run's processes.

torch starts one thread per core, and between operations its threads spin-wait for each other. When
another process holds one of the cores, every operation waits for the thread that lost its core: the
default run's steps took 50 to 100 s beside a package install where they take about 11 s on idle
cores. A policy of a few million parameters gains nothing from a second thread anyway (its matrix
products are too small to split; docs/benchmarks.md, "Threads: a busy core"), so it runs on one, and a busy core
elsewhere does not slow it. A larger policy gets the cores that are free when the run starts (those
other processes keep busy left out), shared out among the processes the run starts on this machine (a
trainer and its rollout workers, or a launcher's ranks).

`model.cpu_threads` or `OMP_NUM_THREADS` set by the user wins over the choice.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator

import torch

# Below this many parameters a policy runs on one thread (the tiny policies: 0.5M to 2M).
SMALL_POLICY_PARAMETERS = 20_000_000


def available_cores() -> int:
    """The cores this process may run on (its affinity; a container's or taskset's limit included)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def busy_cores(interval_s: float = 0.2) -> float:
    """How many cores' worth of time the machine spent busy over `interval_s` (Linux's /proc/stat; 0 elsewhere).

    Called while this process sleeps, so what it counts is other processes' work."""
    def sample() -> tuple[int, int]:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
        return sum(fields[:8]), idle

    try:
        total0, idle0 = sample()
        time.sleep(interval_s)
        total1, idle1 = sample()
    except (OSError, ValueError, IndexError):
        return 0.0
    if total1 <= total0:
        return 0.0
    return (os.cpu_count() or 1) * (1 - (idle1 - idle0) / (total1 - total0))


def choose_threads(num_parameters: int, processes: int = 1) -> int:
    """One thread for a small policy; otherwise the cores that are free (available, less those other processes
    keep busy) shared among `processes`."""
    if num_parameters < SMALL_POLICY_PARAMETERS:
        return 1
    free = available_cores() - round(busy_cores())
    return max(1, free // max(1, processes))


def set_cpu_threads(setting: int, num_parameters: int, processes: int = 1) -> tuple[int, str]:
    """Set torch's thread count: `setting` when positive, else the user's OMP_NUM_THREADS when set, else
    `choose_threads`. Returns the count and where it came from, for the run's log."""
    if setting > 0:
        threads, why = setting, "model.cpu_threads"
    elif os.environ.get("OMP_NUM_THREADS", "").strip().isdigit() and int(os.environ["OMP_NUM_THREADS"]) > 0:
        threads, why = int(os.environ["OMP_NUM_THREADS"]), "OMP_NUM_THREADS"
    else:
        threads = choose_threads(num_parameters, processes)
        why = (f"a policy of {num_parameters / 1e6:.2g}M parameters" if num_parameters < SMALL_POLICY_PARAMETERS
               else f"the free cores of {available_cores()} for {processes} process{'es' if processes > 1 else ''}")
    torch.set_num_threads(threads)
    return threads, why


@contextlib.contextmanager
def callers_threads_restored() -> Iterator[None]:
    """Whatever sets torch's thread count inside (a run's `set_cpu_threads`), the caller's count comes back after."""
    threads = torch.get_num_threads()
    try:
        yield
    finally:
        torch.set_num_threads(threads)
