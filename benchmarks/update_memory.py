"""Memory of the update's loss pass: log-probs and entropy in one pass (the trainer's) against the two separate functions.

One micro-batch of the update, on a real model: `--batch` sequences of `--tokens` tokens, the last
`--response` of each under the loss mask (as a multi-turn FrozenLake sequence of SmolLM2 is about
700 tokens with a few hundred sampled), through `response_logits`, then either
`token_logprobs_and_entropy` (the trainer's: backward keeps only the logits) or `token_logprobs`
and `entropy_from_logits` composed from torch ops (autograd keeps their softmaxes and float32
copies), a token-mean loss with an entropy bonus, and backward. Each side runs in a fresh process,
`--repeats` passes, alternating; the number is the process's peak resident memory during the
passes above what it held before the first (on CUDA, peak allocated memory above the same).
Both sides must give the same loss and gradient norm.

    python benchmarks/update_memory.py [--model smollm2-135m|tiny|DIR] [--lora-rank 8] [--batch 4] [--tokens 700]
        [--response 300] [--repeats 2] [--gradient-checkpointing] [--threads 1] [--device cpu] [--out update_memory.json]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

import torch

from ragen2.models.loading import load_policy
from ragen2.rl.batch import Batch, response_logits
from ragen2.rl.losses import aggregate, entropy_from_logits, token_logprobs, token_logprobs_and_entropy

SIDES = ("separate", "fused")


def resident_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def peak_mb(device: str) -> float:
    if device == "cuda":
        return torch.cuda.max_memory_allocated() / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kB on Linux


def one_side(args: argparse.Namespace) -> dict:
    """Run `args.side`'s passes in this process and return its numbers."""
    torch.set_num_threads(args.threads)
    model, tokenizer = load_policy(args.model, device=args.device)
    if args.gradient_checkpointing:  # as model.gradient_checkpointing=true does in the trainer
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    torch.manual_seed(0)  # the adapters' initialisation, the same on both sides
    if args.lora_rank:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=args.lora_rank, lora_alpha=2 * args.lora_rank,
                                                 target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]))
    model.train()
    gen = torch.Generator().manual_seed(0)
    input_ids = torch.randint(0, len(tokenizer), (args.batch, args.tokens), generator=gen).to(args.device)
    mask = torch.zeros(args.batch, args.tokens - 1, device=args.device)
    mask[:, -args.response:] = 1.0
    rows = torch.arange(args.batch, device=args.device)
    batch = Batch(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), targets=input_ids[:, 1:], mask=mask,
                  returns=torch.zeros(args.batch, device=args.device), group_ids=rows, traj_index=rows)
    vocab = model.get_output_embeddings().weight.shape[0]
    if args.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated() / 2**20 if args.device == "cuda" else resident_mb()
    peak_before = peak_mb(args.device)
    times, losses, norms = [], [], []
    for _ in range(args.repeats):
        model.zero_grad(set_to_none=True)
        start = time.perf_counter()
        logits, first = response_logits(model, batch)
        labels = batch.targets[:, first:]
        if args.side == "fused":
            logp, entropy = token_logprobs_and_entropy(logits, labels)
        else:
            logp, entropy = token_logprobs(logits, labels), entropy_from_logits(logits)
        m = batch.mask[:, first:]
        loss = -aggregate(logp, m, "token-mean") - 0.01 * aggregate(entropy, m, "token-mean")
        loss.backward()
        times.append(time.perf_counter() - start)
        losses.append(loss.item())
        norms.append(torch.sqrt(sum((p.grad.float() ** 2).sum() for p in model.parameters() if p.grad is not None)).item())
        del logits, logp, entropy, loss
    peak = peak_mb(args.device)
    return {"side": args.side, "vocab": vocab, "logits_mb": args.batch * args.response * vocab * 4 / 2**20,
            "held_before_mb": before, "peak_mb": peak, "pass_mb": peak - before,
            "peak_reached_before_the_passes": peak_before >= peak, "pass_s": min(times), "loss": losses[-1],
            "grad_norm": norms[-1]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m", help="smollm2-135m, tiny or a model directory")
    parser.add_argument("--lora-rank", type=int, default=8, help="0 trains every weight")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=700)
    parser.add_argument("--response", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=2, help="processes per side, alternating")
    parser.add_argument("--gradient-checkpointing", action="store_true",
                        help="recompute the layers' activations in backward, so the logits are more of the memory")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", help="write the rows as JSON here")
    parser.add_argument("--side", choices=SIDES, help=argparse.SUPPRESS)  # a child process's one side
    args = parser.parse_args()
    args.model = None if args.model == "tiny" else args.model
    if args.side:
        print(json.dumps(one_side(args)))
        return
    rows = []
    for repeat in range(args.repeats):
        for side in SIDES:
            child = [sys.executable, __file__, *sys.argv[1:], "--side", side]
            done = subprocess.run(child, check=True, capture_output=True, text=True)
            rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
            r = rows[-1]
            print(f"{side} run {repeat + 1}: pass {r['pass_mb']:.0f} MB above {r['held_before_mb']:.0f} MB, "
                  f"{r['pass_s']:.2f} s, loss {r['loss']:.6f}, grad norm {r['grad_norm']:.6f}", flush=True)
    print(f"\nmodel {args.model or 'tiny'} (vocabulary {rows[0]['vocab']}), LoRA rank {args.lora_rank}, {args.batch} x "
          f"{args.tokens} tokens, {args.response} under the mask, gradient checkpointing "
          f"{'on' if args.gradient_checkpointing else 'off'}, {args.device}, {args.threads} thread(s); "
          f"float32 logits of the masked columns: {rows[0]['logits_mb']:.0f} MB")
    print("| side | pass memory MB (min over runs) | peak resident MB | pass s (min) | loss | grad norm |")
    print("|---|---|---|---|---|---|")
    best = {}
    for side in SIDES:
        mine = [r for r in rows if r["side"] == side]
        best[side] = min(r["pass_mb"] for r in mine)
        print(f"| {side} | {best[side]:.0f} | {min(r['peak_mb'] for r in mine):.0f} | {min(r['pass_s'] for r in mine):.2f} "
              f"| {mine[0]['loss']:.6f} | {mine[0]['grad_norm']:.6f} |")
    if any(r["peak_reached_before_the_passes"] for r in rows):
        print("warning: a process peaked before its passes (loading the model): its pass memory is a lower bound")
    print(f"separate / fused pass memory: {best['separate'] / best['fused']:.2f}x")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
