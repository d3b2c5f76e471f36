"""Generation speed: ragen2's HF backend against a bare `model.generate`, and multi-turn prefix reuse against none.

Part 1, one call on the same prompts. The first turn of P x G Bandit episodes (the environment's
instruction and state through the chat template), generated three ways on the same model:
a bare `model.generate` (left padding, do_sample from torch's RNG, temperature 1, top-p 1,
top-k off, EOS and `</answer>` as the stops), and ragen2's `HFBackend.generate` with per-episode
seeds, with `prefix_reuse` off (every prompt prefilled whole, as generate does) and on (the
system prompt the batch shares prefilled once). Sampled lengths differ between sides, so the
sampled comparison is generated tokens per second, over `--repeats` calls per side in
alternation (different seeds each repeat); the greedy comparison generates identical tokens
on every side, so its ratio is of wall times.

Part 2, a multi-turn rollout. P x G Sokoban episodes of up to 5 turns (the default rollout),
played greedily by `ragen2.agent.rollout` with `rollout.prefix_reuse` off and on, alternating
over `--repeats`; reports whether both sides generated the same tokens, the largest difference
of a token's log-probability between them, generated tokens per second of rollout time, and the
ratio. Greedy, because with sampling the two sides' float rounding differs by about 1e-5, and on
a 49k-token vocabulary a uniform draw that lands among tail tokens narrower than that can pick a
neighbour: the same distribution, not always the same token.

`--model random-0.5b` is a randomly initialised Qwen2 with Qwen2.5-0.5B's layers (24 x 896,
14 heads, 2 key/value heads, MLP 4864) on the tiny policy's tokenizer: no download, for a GPU
without a model hub. It never stops early, so every row generates the full budget. `--vllm`
adds a vLLM engine holding the same weights to Part 1 (a GPU and vLLM's environment needed).

    python benchmarks/generation.py [--model tiny|smollm2-135m|random-0.5b|DIR] [--device cpu|cuda] [--threads N]
        [--groups 8] [--group-size 8] [--max-new-tokens 64] [--turn-tokens 96] [--repeats 3] [--vllm]
        [--skip-single-turn] [--skip-multi-turn] [--out generation.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import torch

from ragen2 import envs
from ragen2.agent import Conversation, HFBackend, RolloutStats, group_seeds, rollout
from ragen2.config import RolloutConfig
from ragen2.models.loading import load_policy
from ragen2.models.tiny import build_model


def load(name: str, device: str):
    """The benchmark's model and tokenizer (see the module docstring for `random-0.5b`)."""
    if name != "random-0.5b":
        return load_policy(None if name == "tiny" else name, device)
    _, tokenizer = load_policy(None, "cpu")
    model = build_model(tokenizer, hidden_size=896, num_layers=24, num_heads=14, num_kv_heads=2, intermediate_size=4864)
    return model.to(device).eval(), tokenizer


def first_turn_prompts(tokenizer, env_name: str, seeds: list[int]) -> list[list[int]]:
    prompts = []
    for seed in seeds:
        env = envs.make(env_name)
        observation, _ = env.reset(seed=seed)
        conv = Conversation(tokenizer, env.instruction)
        conv.add_observation(observation, env.max_actions)
        prompts.append(conv.prompt_ids())
    return prompts


def bare_generate(model, backend: HFBackend, prompts: list[list[int]], max_new_tokens: int, sample: bool) -> int:
    """One plain `model.generate` call on the prompts; returns the tokens it generated (up to each row's stop)."""
    width = max(map(len, prompts))
    input_ids = torch.tensor([[backend.pad_id] * (width - len(p)) + p for p in prompts], device=model.device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=model.device)
    stops = backend.eos_ids + backend.stop_ids
    sampling = {"do_sample": True, "temperature": 1.0, "top_p": 1.0, "top_k": 0} if sample else {"do_sample": False}
    with torch.no_grad():
        out = model.generate(input_ids=input_ids, attention_mask=mask, max_new_tokens=max_new_tokens,
                             pad_token_id=backend.pad_id, eos_token_id=stops, **sampling)
    generated = 0
    for row in out[:, width:].tolist():
        cut = next((i + 1 for i, t in enumerate(row) if t in stops), len(row))
        generated += cut
    return generated


def part_one(model, tokenizer, args) -> dict[str, Any]:
    seeds, _ = group_seeds(0, args.groups, args.group_size)
    prompts = first_turn_prompts(tokenizer, "bandit", seeds)
    sides = {
        "bare generate": None,
        "ragen2, prefix_reuse=false": HFBackend(model, tokenizer, prefix_reuse=False),
        "ragen2, prefix_reuse=true": HFBackend(model, tokenizer, prefix_reuse=True),
    }
    if args.vllm:
        from ragen2.agent.vllm_backend import VLLMBackend

        sides["ragen2, vllm"] = VLLMBackend(model, tokenizer, gpu_memory_utilization=0.3, seed=0)
    reference = sides["ragen2, prefix_reuse=false"]
    result: dict[str, Any] = {"prompts": len(prompts), "prompt_tokens_mean": statistics.mean(map(len, prompts))}
    for mode in ("sampled", "greedy"):
        sample = mode == "sampled"
        times: dict[str, list[float]] = {name: [] for name in sides}
        tokens: dict[str, list[int]] = {name: [] for name in sides}
        for repeat in range(args.repeats + 1):  # the first round warms up and is left out
            names = list(sides) if repeat % 2 else list(sides)[::-1]
            for name in names:
                backend = sides[name]
                torch.manual_seed(repeat)
                sync(model)
                start = time.perf_counter()
                if backend is None:
                    n = bare_generate(model, reference, prompts, args.max_new_tokens, sample)
                else:
                    outs = backend.generate(
                        prompts, max_new_tokens=args.max_new_tokens, temperature=1.0 if sample else 0.0, top_p=1.0,
                        seeds=[1000 * repeat + i for i in range(len(prompts))],
                    )
                    n = sum(len(o.token_ids) for o in outs)
                sync(model)
                if repeat:
                    times[name].append(time.perf_counter() - start)
                    tokens[name].append(n)
        rows = {}
        for name in sides:
            rows[name] = {"call_s": round(statistics.mean(times[name]), 4), "tokens": round(statistics.mean(tokens[name]), 1),
                          "tokens_per_s": round(sum(tokens[name]) / sum(times[name]), 1)}
        bare = rows["bare generate"]
        for name in list(sides)[1:]:
            rows[name]["time_vs_bare"] = round(
                (bare["tokens_per_s"] / rows[name]["tokens_per_s"]) if sample else rows[name]["call_s"] / bare["call_s"], 3
            )
        if not sample:  # identical work on the HF sides (vLLM's kernels may break near-ties differently)
            hf_sides = [name for name in sides if "vllm" not in name]
            assert len({statistics.mean(tokens[name]) for name in hf_sides}) == 1, "greedy sides generated different tokens"
        result[mode] = rows
    return result


def sync(model) -> None:
    if model.device.type == "cuda":
        torch.cuda.synchronize()


def part_two(model, tokenizer, args) -> dict[str, Any]:
    cfg = {reuse: RolloutConfig(max_tokens_per_turn=args.turn_tokens, temperature=0.0, prefix_reuse=reuse)
           for reuse in (False, True)}
    seeds, group_ids = group_seeds(0, args.groups, args.group_size)
    stats = {reuse: RolloutStats() for reuse in (False, True)}
    outputs: dict[bool, list] = {}
    for repeat in range(args.repeats + 1):
        for reuse in ((False, True) if repeat % 2 else (True, False)):
            backend = HFBackend(model, tokenizer, prefix_reuse=reuse)
            calls = outputs[reuse] = []
            generate = backend.generate

            def recorded(prompts, _generate=generate, _calls=calls, **kwargs):
                _calls.append(out := _generate(prompts, **kwargs))
                return out

            backend.generate = recorded
            rollout(backend, tokenizer, "sokoban", {}, seeds, group_ids, cfg[reuse], stats[reuse] if repeat else None)
    pairs = [(a, b) for call_a, call_b in zip(outputs[False], outputs[True]) for a, b in zip(call_a, call_b)]
    same = len(outputs[False]) == len(outputs[True]) and all(a.token_ids == b.token_ids for a, b in pairs)
    logprob_gap = max(abs(x - y) for a, b in pairs for x, y in zip(a.logprobs, b.logprobs))
    rows = {}
    for reuse, s in stats.items():
        rows[f"prefix_reuse={str(reuse).lower()}"] = {
            "rollout_s": round(s.total_s / args.repeats, 3), "turns": s.turns // args.repeats,
            "generated_tokens": s.response_tokens // args.repeats, "tokens_per_s": round(s.response_tokens / s.total_s, 1),
        }
    speedup = rows["prefix_reuse=true"]["tokens_per_s"] / rows["prefix_reuse=false"]["tokens_per_s"]
    return {"episodes": len(seeds), "same_tokens": same, "max_logprob_difference": logprob_gap, "sides": rows,
            "speedup": round(speedup, 3)}


def table(rows: dict[str, dict[str, Any]]) -> str:
    keys = list(dict.fromkeys(k for row in rows.values() for k in row))
    lines = ["| side | " + " | ".join(keys) + " |", "|---" * (len(keys) + 1) + "|"]
    lines += [f"| {name} | " + " | ".join(str(row.get(k, "")) for k in keys) + " |" for name, row in rows.items()]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny", help="'tiny' (default), 'smollm2-135m', a .gguf file or a model directory.")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's).")
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=64, help="Part 1's cap on new tokens.")
    parser.add_argument("--turn-tokens", type=int, default=96, help="Part 2's cap on tokens per turn.")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--vllm", action="store_true", help="Add a vLLM engine to Part 1.")
    parser.add_argument("--skip-single-turn", action="store_true")
    parser.add_argument("--skip-multi-turn", action="store_true")
    parser.add_argument("--out", default=None, help="Write the results as JSON here.")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    model, tokenizer = load(args.model, args.device)
    result: dict[str, Any] = {"model": args.model, "parameters": sum(p.numel() for p in model.parameters()),
                              "device": str(model.device), "threads": torch.get_num_threads(),
                              "batch": f"{args.groups}x{args.group_size}"}
    if not args.skip_single_turn:
        result["single_turn"] = part_one(model, tokenizer, args)
        for mode in ("sampled", "greedy"):
            print(f"Part 1, {mode}, {args.groups}x{args.group_size} Bandit prompts, up to {args.max_new_tokens} tokens:")
            print(table(result["single_turn"][mode]) + "\n")
    if not args.skip_multi_turn:
        result["multi_turn"] = part_two(model, tokenizer, args)
        multi = result["multi_turn"]
        print(f"Part 2, {args.groups}x{args.group_size} Sokoban episodes, greedy, up to {args.turn_tokens} tokens per "
              f"turn (same tokens: {multi['same_tokens']}, largest log-prob difference {multi['max_logprob_difference']:.2g}):")
        print(table(result["multi_turn"]["sides"]))
        print(f"speed-up with reuse: {result['multi_turn']['speedup']}x")
    if model.device.type == "cuda":
        result["peak_memory_mb"] = round(torch.cuda.max_memory_allocated() / 2**20)
        print(f"peak CUDA memory: {result['peak_memory_mb']} MB")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
