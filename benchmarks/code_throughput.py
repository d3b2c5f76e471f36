"""Benchmark: sandboxed programs per second, sequential vs a pool of 2 and 4 concurrent runs.

The workload is what grading the `code` env runs: every built-in problem's reference
solution on each of its tests (stdin programs, and function problems through their
driver), repeated to N programs, each in the isolated sandbox (own filesystem, PID,
network, IPC and UTS namespaces, own uid, limits, system call filter, session keyring).
Each configuration runs the same N programs; times are the best of --repeats runs
after a warm-up (which also starts the fork server). A reference row runs the same programs unsandboxed, one fresh `python`
per program, as a plain `subprocess.run` would: the cost of starting an interpreter,
without limits, measured in the same run, so that the ratio holds on a busy machine.
The header gives the 1-minute load average at the start.

    python benchmarks/code_throughput.py                      # N=120 programs, pools of 1, 2, 4 and 8
    python benchmarks/code_throughput.py --cores 0 1 --out code_throughput.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import asdict, dataclass

from ragen2.envs.code_problems import BUILTIN_PROBLEMS
from ragen2.envs.codeexec import function_driver
from ragen2.envs.sandbox import Limits, isolation, run_programs


@dataclass
class Args:
    num_programs: int
    workers: list[int]
    repeats: int
    cores: list[int] | None
    out: str | None


def parse_args() -> Args:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--num-programs", type=int, default=120, help="N, programs per timed run")
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4, 8], help="pool sizes to time (1 = sequential)")
    p.add_argument("--repeats", type=int, default=3, help="timed runs per configuration; the fastest counts")
    p.add_argument("--cores", type=int, nargs="+", default=None, help="pin this process and its children to these CPUs")
    p.add_argument("--out", default=None, help="write the results as JSON here")
    return Args(**vars(p.parse_args()))


def grading_jobs(n: int) -> list[tuple[str, str]]:
    """(source, stdin) of every reference solution on every test, cycled to n jobs."""
    jobs = []
    for problem in BUILTIN_PROBLEMS:
        for test in problem.tests:
            if problem.fn_name is None:
                jobs.append((problem.solution, test.input))
            else:
                jobs.append((function_driver(problem.solution, problem.fn_name), json.dumps(test.input)))
    return [jobs[i % len(jobs)] for i in range(n)]


def time_sandboxed(jobs: list[tuple[str, str]], workers: int, repeats: int) -> float:
    run_programs(jobs[: 2 * workers], Limits(), max_workers=workers)  # warm-up
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        results = run_programs(jobs, Limits(), max_workers=workers)
        best = min(best, time.perf_counter() - start)
        assert all(r.exit_code == 0 for r in results), [r.stderr for r in results if r.exit_code]
    return best


def time_unsandboxed(jobs: list[tuple[str, str]], repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for source, stdin in jobs:
            subprocess.run([sys.executable, "-c", source], input=stdin, capture_output=True, text=True, check=True)
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    args = parse_args()
    if args.cores:
        os.sched_setaffinity(0, args.cores)
    jobs = grading_jobs(args.num_programs)
    load = os.getloadavg()[0]
    rows = []
    for workers in args.workers:
        seconds = time_sandboxed(jobs, workers, args.repeats)
        rows.append({"mode": "sandbox, sequential" if workers == 1 else f"sandbox, pool of {workers}",
                     "workers": workers, "seconds": seconds})  # fmt: skip
    seconds = time_unsandboxed(jobs, args.repeats)
    rows.append({"mode": "unsandboxed subprocess, sequential", "workers": 1, "seconds": seconds})
    sequential = next(r["seconds"] for r in rows if r["mode"] == "sandbox, sequential")
    for r in rows:
        r["programs_per_s"] = args.num_programs / r["seconds"]
        r["ms_per_program"] = 1000 * r["seconds"] / args.num_programs
        r["speedup_vs_sequential"] = sequential / r["seconds"]
    cpus = sorted(os.sched_getaffinity(0))
    header = (
        f"{len(cpus)} CPUs {cpus} ({platform.processor() or platform.machine()}), Python {platform.python_version()}, "
        f"uid {os.geteuid()}, isolation {isolation()}, N={args.num_programs} programs, best of {args.repeats}, "
        f"load average {load:.1f}"
    )
    print(header)
    print("| mode | seconds | programs/s | ms/program | vs sandbox sequential |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['mode']} | {r['seconds']:.2f} | {r['programs_per_s']:.1f} | {r['ms_per_program']:.1f} "
              f"| {r['speedup_vs_sequential']:.2f}x |")  # fmt: skip
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"setup": header, "args": asdict(args), "results": rows}, f, indent=2)


if __name__ == "__main__":
    main()
