"""benchmarks/cgroup_cost.py: the cgroup's pieces and interleaved runs with and without it (needs root and cgroups)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ragen2.envs.sandbox import cgroup

ROOT = Path(__file__).resolve().parents[1]
with cgroup.memory_cgroup(64 << 20) as _made:
    MEMORY_CGROUP = _made is not None
pytestmark = pytest.mark.skipif(not MEMORY_CGROUP, reason="no memory cgroup can be made here")


def bench(*args: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "cgroup_cost.py"), *args], env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_pieces_time_every_step_of_a_cgroup_for_each_way_of_joining():
    out = bench("--pieces", "--rounds", "3")
    ways = 2 if "cgroup v2" in out else 3  # v2 has no per-thread join for a memory cgroup
    for piece in ("make (mkdir, limits)", "join", "touch 8 MiB", "read oom_kill", "remove", "all"):
        row = re.search(rf"^\| {re.escape(piece)} \|(.*)\|$", out, re.M)
        assert row and len([float(x) for x in row[1].split("|")]) == ways, (piece, out)
    assert re.search(r"^\| join \| 0\.00 \|", out, re.M), out  # the way without a join writes nothing


def test_runs_alternate_variants_and_print_each_trees_ratio():
    out = bench("--base", str(ROOT), "--rounds", "2", "--num-programs", "1")
    for variant in ("this tree, with cgroup", "this tree, without cgroup", "base, with cgroup", "base, without cgroup"):
        assert re.search(rf"^\| {variant} \| [\d.]+ \| [\d.]+ \| [\d.]+ \|$", out, re.M), (variant, out)
    assert re.search(r"^\| this tree, without cgroup \| [\d.]+ \| [\d.]+ \| 1\.000 \|$", out, re.M), out
    for tree in ("this tree", "base"):
        assert re.search(rf"^{tree}: with / without cgroup = [\d.]+ \(ratio of medians\)", out, re.M), out
