"""Benchmark: what the sandbox's memory cgroup per run costs a program, and where that time goes.

Runs (the default): the grading workload of code_throughput.py, N programs per batch, in
rounds; each round runs one batch in every variant, in turn (the order reversed every
other round), so that all variants see the same load: small batches and many rounds
follow a load that changes by the second. Variants: this tree with its
memory cgroup and without one (`cgroup.CGROUP_ROOT` pointed at a missing path), and with
`--base PATH` the same two for the tree at PATH (e.g. a `git worktree` of an earlier
commit). Each variant is a worker process of its own, started once with its tree on
PYTHONPATH, so its fork server stays warm. Prints the median and best ms per program and
each variant's ratio to this tree without a cgroup.

--pieces: the steps of one run's cgroup timed directly, in forked processes as the
launcher is, median of --rounds: making it (mkdir and limits), joining it three ways
(no join; writing the pid to `cgroup.procs`, which moves the whole process; writing "0"
to `tasks`, where a thread moves itself: cgroup v1 only), touching 8 MiB (charging it),
forking and reaping a child there, reading the OOM counter and removing the cgroup.
Needs root and a memory cgroup hierarchy the host may write.

    python benchmarks/cgroup_cost.py --pieces
    git worktree add /tmp/prev fa3d3f3
    python benchmarks/cgroup_cost.py --base /tmp/prev                          # 150 rounds of 2 programs
    python benchmarks/cgroup_cost.py --base /tmp/prev --workers 4 --num-programs 8 --rounds 40
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from code_throughput import grading_jobs

from ragen2.envs.sandbox import cgroup

# A variant's worker: one batch of the jobs per line on stdin, its seconds and failures back on stdout.
WORKER = """
import json, sys, time
from ragen2.envs.sandbox import Limits, cgroup, isolation, run_programs
jobs, with_cgroup, workers = json.loads(sys.argv[1]), sys.argv[2] == "on", int(sys.argv[3])
if not with_cgroup:
    cgroup.CGROUP_ROOT = "/nonexistent/cgroup"
print(json.dumps(isolation()["memory_cgroup"]), flush=True)
run_programs(jobs[:4], Limits(), max_workers=workers)
for _ in sys.stdin:
    start = time.perf_counter()
    results = run_programs(jobs, Limits(), max_workers=workers)
    print(json.dumps([time.perf_counter() - start, sum(r.exit_code != 0 for r in results)]), flush=True)
"""


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pieces", action="store_true", help="time the cgroup's steps directly instead of whole runs")
    p.add_argument("--base", default=None, help="also run the tree at this path (with and without its cgroup)")
    p.add_argument("--num-programs", type=int, default=2, help="N, programs per batch")
    p.add_argument("--workers", type=int, default=1, help="programs at a time within a batch (1 = sequential)")
    p.add_argument("--rounds", type=int, default=150, help="batches per variant (--pieces: repetitions per way)")
    return p.parse_args()


def time_runs(args: argparse.Namespace) -> None:
    jobs = json.dumps(grading_jobs(args.num_programs))
    trees = {"this tree": str(Path(__file__).resolve().parents[1])}
    if args.base:
        trees["base"] = os.path.abspath(args.base)
    names, workers = [], []
    for tree, path in trees.items():
        for mode in ("on", "off"):
            env = {**os.environ, "PYTHONPATH": path}
            proc = subprocess.Popen([sys.executable, "-c", WORKER, jobs, mode, str(args.workers)], cwd=path, env=env,
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)  # fmt: skip
            has_cgroup = json.loads(proc.stdout.readline())
            assert has_cgroup == (mode == "on"), f"{tree}: memory cgroup {has_cgroup}, wanted {mode}"
            names.append(f"{tree}, {'with' if mode == 'on' else 'without'} cgroup")
            workers.append(proc)
    ms = {name: [] for name in names}
    load = [os.getloadavg()[0]]
    for round_ in range(args.rounds):
        order = list(zip(names, workers))
        for name, proc in order if round_ % 2 == 0 else order[::-1]:
            proc.stdin.write("go\n")
            proc.stdin.flush()
            seconds, failed = json.loads(proc.stdout.readline())
            assert failed == 0, f"{name}: {failed} programs failed"
            ms[name].append(1000 * seconds / args.num_programs)
        load.append(os.getloadavg()[0])
    for proc in workers:
        proc.stdin.close()
        proc.wait()
    reference = statistics.median(ms["this tree, without cgroup"])
    print(f"{args.rounds} rounds x {args.num_programs} programs per variant, {args.workers} at a time, "
          f"load average {min(load):.1f}-{max(load):.1f}" + (f", base {args.base}" if args.base else ""))  # fmt: skip
    for tree in trees:
        with_, without = (statistics.median(ms[f"{tree}, {m} cgroup"]) for m in ("with", "without"))
        ratios = [a / b for a, b in zip(ms[f"{tree}, with cgroup"], ms[f"{tree}, without cgroup"])]
        print(f"{tree}: with / without cgroup = {with_ / without:.3f} (ratio of medians), "
              f"{statistics.median(ratios):.3f} (median of per-round ratios), "
              f"{with_ - without:+.1f} ms a program")  # fmt: skip
    print("\n| variant | ms/program, median | best | vs this tree without cgroup |")
    print("|---|---|---|---|")
    for name, values in ms.items():
        median = statistics.median(values)
        print(f"| {name} | {median:.1f} | {min(values):.1f} | {median / reference:.3f} |")


def time_pieces(rounds: int) -> None:
    made = cgroup._create(512 << 20)  # the same cgroup a run gets
    if made is None:
        sys.exit("no memory cgroup can be made here (needs root and a writable memory cgroup hierarchy)")
    made.remove()
    ways = {"none": None, "cgroup.procs, pid": "procs"} | ({} if made.v2 else {'tasks, "0"': "join"})
    times: dict[str, dict[str, list[float]]] = {way: {} for way in ways}
    for _ in range(rounds):
        for way, attribute in ways.items():
            for piece, seconds in _one_cgroup(attribute).items():
                times[way].setdefault(piece, []).append(1000 * seconds)
    print(f"cgroup {'v2' if made.v2 else 'v1'}, median ms of {rounds}, load average {os.getloadavg()[0]:.1f}\n")
    pieces = list(times["none"])
    print("| piece | " + " | ".join(f"join: {way}" for way in ways) + " |")
    print("|---" * (len(ways) + 1) + "|")
    for piece in pieces:
        print(f"| {piece} | " + " | ".join(f"{statistics.median(times[way][piece]):.2f}" for way in ways) + " |")


def _one_cgroup(join: str | None) -> dict[str, float]:
    """One cgroup's life, timed: made, joined by a forked process (`join`: the file it writes to), used, removed."""
    t0 = time.perf_counter()
    made = cgroup._create(512 << 20)
    t1 = time.perf_counter()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # like the launcher: a fresh fork, one thread
        a = time.perf_counter()
        if join is not None:
            with open(getattr(made, join), "w") as f:
                f.write("0" if join == "join" else str(os.getpid()))
        b = time.perf_counter()
        pages = bytearray(8 << 20)
        for i in range(0, len(pages), 4096):
            pages[i] = 1
        c = time.perf_counter()
        if (child := os.fork()) == 0:
            os._exit(0)
        os.waitpid(child, 0)
        d = time.perf_counter()
        os.write(write, json.dumps([b - a, c - b, d - c]).encode())
        os._exit(0)
    os.close(write)
    joined, charged, forked = json.loads(os.read(read, 4096))
    os.close(read)
    os.waitpid(pid, 0)
    t2 = time.perf_counter()
    made.oom_kills()
    t3 = time.perf_counter()
    made.remove()
    t4 = time.perf_counter()
    return {"make (mkdir, limits)": t1 - t0, "join": joined, "touch 8 MiB": charged, "fork and reap a child": forked,
            "process, fork to reaped": t2 - t1, "read oom_kill": t3 - t2, "remove": t4 - t3,
            "all": t4 - t0}  # fmt: skip


def main() -> None:
    args = parse_args()
    if args.pieces:
        time_pieces(args.rounds)
    else:
        time_runs(args)


if __name__ == "__main__":
    main()
