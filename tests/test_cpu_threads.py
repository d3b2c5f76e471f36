"""torch's CPU thread count: one for a small policy, the cores shared out for a large one, the user's setting first."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
import torch

from ragen2 import cpu_threads
from ragen2.config import load_config
from ragen2.errors import ConfigError
from ragen2.rl.run import local_processes


@pytest.fixture(autouse=True)
def _restore_threads(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def test_a_small_policy_gets_one_thread_and_a_large_one_the_free_cores_shared_among_the_processes(monkeypatch):
    monkeypatch.setattr(cpu_threads, "available_cores", lambda: 8)
    monkeypatch.setattr(cpu_threads, "busy_cores", lambda: 0.1)
    assert cpu_threads.choose_threads(471_680) == 1
    assert cpu_threads.choose_threads(135_000_000) == 8
    assert cpu_threads.choose_threads(135_000_000, processes=2) == 4
    assert cpu_threads.choose_threads(135_000_000, processes=3) == 2
    assert cpu_threads.choose_threads(135_000_000, processes=16) == 1
    monkeypatch.setattr(cpu_threads, "busy_cores", lambda: 2.8)  # other processes hold about 3 cores
    assert cpu_threads.choose_threads(135_000_000) == 5
    assert cpu_threads.choose_threads(135_000_000, processes=2) == 2
    assert cpu_threads.choose_threads(471_680) == 1


def test_a_process_spinning_on_one_core_counts_as_about_one_busy_core():
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)
        busy = cpu_threads.busy_cores(0.5)
    finally:
        spinner.kill()
        spinner.wait()
    assert 0.7 < busy <= (os.cpu_count() or 1) + 1e-9


def test_the_setting_wins_then_omp_num_threads_then_the_choice(monkeypatch):
    monkeypatch.setattr(cpu_threads, "available_cores", lambda: 2)
    monkeypatch.setattr(cpu_threads, "busy_cores", lambda: 0.0)
    assert cpu_threads.set_cpu_threads(0, 471_680) == (1, "a policy of 0.47M parameters")
    assert torch.get_num_threads() == 1
    assert cpu_threads.set_cpu_threads(0, 135_000_000) == (2, "the free cores of 2 for 1 process")
    assert torch.get_num_threads() == 2
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert cpu_threads.set_cpu_threads(0, 471_680) == (2, "OMP_NUM_THREADS")
    assert cpu_threads.set_cpu_threads(1, 135_000_000) == (1, "model.cpu_threads")
    assert torch.get_num_threads() == 1


def test_the_run_counts_its_own_processes(monkeypatch):
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert local_processes(load_config("sokoban")) == 1
    assert local_processes(load_config("sokoban", ["async.enable=true", "async.max_staleness=1"])) == 2
    assert local_processes(load_config("sokoban", ["async.enable=true", "async.max_staleness=1",
                                                   "async.local_workers=2", "rollout.num_groups=8"])) == 3
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert local_processes(load_config("sokoban")) == 4


def test_a_negative_thread_count_is_refused_naming_the_key():
    with pytest.raises(ConfigError, match=r"model\.cpu_threads=-1"):
        load_config("sokoban", ["model.cpu_threads=-1"])
