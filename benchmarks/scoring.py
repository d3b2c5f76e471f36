"""Benchmark: prefix-cached cross-scoring (`score_matrix`) vs the naive baseline (`score_matrix_naive`).

Both score the same M reasonings under the same P prompts with the same randomly initialised
Qwen2 model and the same micro-batch size; the naive one re-encodes the prompt for every pair.
Each method runs in a fresh process so that peak memory is its own (CPU: peak RSS above the RSS
before the call, sampled every 2 ms; CUDA: torch.cuda.max_memory_allocated above the start).
Times are the best of --repeats runs after a warm-up; CPU time (all threads) is reported next to
wall time because it is less disturbed by other work on a shared machine.

    python benchmarks/scoring.py                                   # tiny and small presets on CPU
    python benchmarks/scoring.py --preset qwen2.5-0.5b --device cuda --out scoring_cuda.json
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import platform
import threading
import time
from dataclasses import asdict, dataclass

import numpy as np
import psutil
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from ragen2.collapse import score_matrix, score_matrix_naive

# Model shapes: hidden, layers, attention heads, key/value heads, MLP width, vocabulary.
PRESETS = {
    "tiny": dict(hidden_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                 intermediate_size=384, vocab_size=2000),
    "small": dict(hidden_size=512, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=2,
                  intermediate_size=1408, vocab_size=8000),
    # Qwen2.5-0.5B's published config, with random weights (no download).
    "qwen2.5-0.5b": dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                         intermediate_size=4864, vocab_size=151936),
}  # fmt: skip
METHODS = {"cached": score_matrix, "naive": score_matrix_naive}


@dataclass
class Args:
    preset: list[str]
    device: str
    dtype: str
    num_prompts: int
    prompt_len: int
    num_reasonings: int
    reasoning_len: int
    micro_batch_size: int
    threads: int
    repeats: int
    seed: int
    out: str | None


def parse_args() -> Args:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", nargs="+", default=["tiny", "small"], choices=list(PRESETS), help="model shapes to run")
    p.add_argument("--device", default="cpu", help="cpu or cuda[:i]")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="model weights dtype")
    p.add_argument("--num-prompts", type=int, default=8, help="P, distinct inputs")
    p.add_argument("--prompt-len", type=int, default=200, help="mean prompt length (uniform within +-20%%)")
    p.add_argument("--num-reasonings", type=int, default=64, help="M, reasonings scored under every prompt")
    p.add_argument("--reasoning-len", type=int, default=40, help="mean reasoning length (uniform within +-50%%)")
    p.add_argument("--micro-batch-size", type=int, default=32, help="sequences per forward, both methods")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    p.add_argument("--repeats", type=int, default=3, help="timed runs per method; the fastest counts")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="write the results as JSON here")
    return Args(**vars(p.parse_args()))


def make_inputs(args: Args, vocab_size: int) -> tuple[list[list[int]], list[list[int]]]:
    rng = np.random.default_rng(args.seed)
    lo, hi = int(0.8 * args.prompt_len), int(1.2 * args.prompt_len)
    prompts = [rng.integers(0, vocab_size, rng.integers(lo, hi + 1)).tolist() for _ in range(args.num_prompts)]
    lo, hi = max(1, int(0.5 * args.reasoning_len)), int(1.5 * args.reasoning_len)
    reasonings = [rng.integers(0, vocab_size, rng.integers(lo, hi + 1)).tolist() for _ in range(args.num_reasonings)]
    return prompts, reasonings


def build_model(preset: str, args: Args) -> Qwen2ForCausalLM:
    torch.manual_seed(args.seed)
    config = Qwen2Config(**PRESETS[preset], max_position_embeddings=4096, tie_word_embeddings=True)
    model = Qwen2ForCausalLM(config).to(getattr(torch, args.dtype))
    return model.to(args.device).eval()


class PeakRss:
    """Peak resident memory of this process above its level at start, sampled in a thread."""

    def __init__(self, interval_s: float = 0.002) -> None:
        self.proc, self.interval_s = psutil.Process(), interval_s
        self.base = self.peak = self.proc.memory_info().rss
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.proc.memory_info().rss)
            time.sleep(self.interval_s)

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.proc.memory_info().rss)

    @property
    def delta_mb(self) -> float:
        return (self.peak - self.base) / 2**20


def measure(preset: str, method: str, args: Args, queue: mp.Queue) -> None:
    """Child process: build the model, warm up, time full scorings; report (logp, wall s, CPU s, MB)."""
    if args.threads:
        torch.set_num_threads(args.threads)
    model = build_model(preset, args)
    prompts, reasonings = make_inputs(args, PRESETS[preset]["vocab_size"])
    fn = METHODS[method]
    fn(model, None, prompts[:1], reasonings[: args.micro_batch_size], micro_batch_size=args.micro_batch_size)
    cuda = model.device.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    wall, cpu = [], []
    with PeakRss() as rss:
        for _ in range(args.repeats):
            start, start_cpu = time.perf_counter(), time.process_time()
            logp = fn(model, None, prompts, reasonings, micro_batch_size=args.micro_batch_size)
            if cuda:
                torch.cuda.synchronize()
            wall.append(time.perf_counter() - start)
            cpu.append(time.process_time() - start_cpu)
    peak_mb = (torch.cuda.max_memory_allocated() - base) / 2**20 if cuda else rss.delta_mb
    queue.put((logp, min(wall), min(cpu), peak_mb))


def run_in_child(preset: str, method: str, args: Args) -> tuple[np.ndarray, float, float, float]:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=measure, args=(preset, method, args, queue))
    proc.start()
    result = queue.get()
    proc.join()
    return result


def main() -> None:
    args = parse_args()
    rows = []
    for preset in args.preset:
        cached, t_cached, cpu_cached, mb_cached = run_in_child(preset, "cached", args)
        naive, t_naive, cpu_naive, mb_naive = run_in_child(preset, "naive", args)
        prompts, reasonings = make_inputs(args, PRESETS[preset]["vocab_size"])
        rows.append(
            dict(
                preset=preset,
                num_prompts=len(prompts),
                num_reasonings=len(reasonings),
                mean_prompt_tokens=float(np.mean([len(x) for x in prompts])),
                mean_reasoning_tokens=float(np.mean([len(z) for z in reasonings])),
                max_abs_diff=float(np.abs(cached - naive).max()),
                cached_s=t_cached,
                naive_s=t_naive,
                speedup=t_naive / t_cached,
                cached_cpu_s=cpu_cached,
                naive_cpu_s=cpu_naive,
                cpu_speedup=cpu_naive / cpu_cached,
                cached_peak_mb=mb_cached,
                naive_peak_mb=mb_naive,
            )
        )
    device = torch.cuda.get_device_name(args.device) if args.device.startswith("cuda") else platform.processor()
    header = (
        f"device={args.device} ({device or platform.machine()}), dtype={args.dtype}, "
        f"threads={args.threads or torch.get_num_threads()}, micro_batch_size={args.micro_batch_size}, "
        f"best of {args.repeats}"
    )
    print(header)
    print(
        "| preset | P x M | prompt / reasoning tokens | max abs diff | naive s | cached s | speed-up "
        "| CPU-time speed-up | naive peak MB | cached peak MB |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['preset']} | {r['num_prompts']} x {r['num_reasonings']} "
            f"| {r['mean_prompt_tokens']:.0f} / {r['mean_reasoning_tokens']:.0f} | {r['max_abs_diff']:.2e} "
            f"| {r['naive_s']:.2f} | {r['cached_s']:.2f} | {r['speedup']:.1f}x | {r['cpu_speedup']:.1f}x "
            f"| {r['naive_peak_mb']:.0f} | {r['cached_peak_mb']:.0f} |"
        )
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"setup": header, "args": asdict(args), "results": rows}, f, indent=2)


if __name__ == "__main__":
    main()
