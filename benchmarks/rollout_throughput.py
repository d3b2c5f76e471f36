"""Rollout throughput of the default Sokoban rollout, and the share of time spent outside generation.

Plays the default training batch (P x G Sokoban episodes, 5 turns x 2 actions) with the
policy, several times, and reports generated tokens/s, episodes/s, and how rollout wall time
splits between the model's `generate` calls and everything else (prompt building, parsing,
env steps, padding). Goal: the part outside generation is 20% or less.

    python benchmarks/rollout_throughput.py [--model tiny] [--device cpu] [--repeats 3] [--out rollout.json]
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from ragen2.agent import HFBackend, RolloutStats, group_seeds, rollout
from ragen2.config import load_config
from ragen2.models.loading import load_policy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny", help="Model directory or 'tiny' (default).")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--preset", default="sokoban")
    parser.add_argument("--repeats", type=int, default=3, help="Rollout batches to time (after one warm-up).")
    parser.add_argument("--out", default=None, help="Write the results as JSON here.")
    parser.add_argument("overrides", nargs="*", help="Config overrides, e.g. rollout.group_size=16.")
    args = parser.parse_args()

    config = load_config(args.preset, [f"model.device={args.device}", *args.overrides])
    model, tokenizer = load_policy(None if args.model == "tiny" else args.model, config.model.device, config.model.dtype)
    backend = HFBackend(model, tokenizer)
    r = config.rollout
    seeds, group_ids = group_seeds(0, r.num_groups, r.group_size)
    torch.manual_seed(0)
    rollout(backend, tokenizer, config.env.name, config.env.kwargs, seeds, group_ids, r)  # warm-up

    stats = RolloutStats()
    episodes = 0
    start = time.perf_counter()
    for i in range(args.repeats):
        seeds, group_ids = group_seeds(1000 * (i + 1), r.num_groups, r.group_size)
        trajs = rollout(backend, tokenizer, config.env.name, config.env.kwargs, seeds, group_ids, r, stats)
        episodes += len(trajs)
    wall = time.perf_counter() - start

    result = {
        "model": args.model,
        "device": str(model.device),
        "torch_threads": torch.get_num_threads(),
        "batch": f"{r.num_groups}x{r.group_size} {config.env.name} episodes, {r.max_turns} turns",
        "repeats": args.repeats,
        "episodes": episodes,
        "turns": stats.turns,
        "generated_tokens": stats.response_tokens,
        "wall_s": round(wall, 3),
        "generated_tokens_per_s": round(stats.response_tokens / wall, 1),
        "episodes_per_s": round(episodes / wall, 3),
        "generate_s": round(stats.generate_s, 3),
        "env_s": round(stats.env_s, 3),
        "outside_generation_share": round(stats.overhead_fraction, 4),
    }
    width = max(map(len, result))
    for key, value in result.items():
        print(f"{key.ljust(width)}  {value}")
    print(f"{'goal: outside_generation_share <= 0.20':<{width}}  {'met' if stats.overhead_fraction <= 0.2 else 'NOT met'}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
