"""Benchmark: seconds from `ragen2 ...` to its answer, for the commands that should answer at once.

Each command runs --repeats times as a fresh process (`python -m ragen2 ...`, what the `ragen2`
script runs); the median is reported. With --baseline DIR (a checkout of another commit, e.g. a
`git worktree` of the previous one) the same commands run from that checkout in the same
session, and the ratio baseline / this checkout is printed.

    python benchmarks/cli_startup.py
    git worktree add /tmp/base HEAD~1 && python benchmarks/cli_startup.py --baseline /tmp/base
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
COMMANDS = [
    ["--help"],
    ["train", "--help"],
    ["train", "optim.lr=-1"],  # refused by validation, before any model is loaded
    ["train", "nosuchpreset"],
    ["train", "sokoban", "no.such_key=1"],
]


def time_command(checkout: Path, args: list[str], repeats: int) -> float:
    """Median wall seconds of `python -m ragen2 ARGS` importing ragen2 from `checkout`."""
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "ragen2", *args], cwd=checkout, env=env, capture_output=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=5, help="Runs per command; the median is reported (default: 5).")
    p.add_argument("--baseline", type=Path, help="Another checkout to time the same commands from.")
    args = p.parse_args()
    header = f"{'command':36s} {'this (s)':>9s}" + (f" {'baseline (s)':>13s} {'ratio':>7s}" if args.baseline else "")
    print(header)
    for command in COMMANDS:
        now = time_command(REPO, command, args.repeats)
        line = f"{'ragen2 ' + ' '.join(command):36s} {now:9.2f}"
        if args.baseline:
            before = time_command(args.baseline.resolve(), command, args.repeats)
            line += f" {before:13.2f} {before / now:6.1f}x"
        print(line, flush=True)


if __name__ == "__main__":
    main()
