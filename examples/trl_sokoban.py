"""Train a Sokoban agent with TRL's GRPOTrainer, ragen2's SNR-aware filter and collapse diagnostics.

The environment is ragen2's Sokoban (6x6, one box, 5 turns of up to 2 actions), played
multi-turn through TRL's `rollout_func` (`EnvRollout`): each episode is one TRL completion,
the environment's turns masked out of the loss. The reward is the episode's return.

    pip install 'ragen2[trl]'
    python examples/trl_sokoban.py                              # the tiny policy, CPU, a few minutes
    python examples/trl_sokoban.py --model Qwen/Qwen2.5-0.5B-Instruct --steps 200 --groups 8 --group-size 16
    ragen2 diagnose trl-sokoban/completions/completions_00010.parquet --model trl-sokoban/final

The run writes TRL's logs under --out (metrics in `trainer_state.json`, completions under
`completions/`) and the final weights under `--out/final`.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from ragen2.config import load_config
from ragen2.integrations.trl import EnvRollout, Ragen2GRPOConfig, Ragen2GRPOTrainer, episode_return
from ragen2.models.loading import load_policy


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny", help="Model directory, hub name, or 'tiny' (ragen2's policy).")
    parser.add_argument("--out", default="trl-sokoban", help="Output directory.")
    parser.add_argument("--steps", type=int, default=10, help="Optimizer steps.")
    parser.add_argument("--groups", type=int, default=4, help="P: Sokoban seeds (prompts) per step.")
    parser.add_argument("--group-size", type=int, default=8, help="G: episodes per seed.")
    parser.add_argument("--max-turns", type=int, default=None, help="Turns per episode (preset: 5).")
    parser.add_argument("--max-tokens-per-turn", type=int, default=None, help="Cap per turn (preset: 96).")
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--device", default="cpu", help="cpu or cuda.")
    args = parser.parse_args(argv)
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is marked experimental in TRL

    overrides = [f"rollout.{key}={value}" for key, value in
                 (("max_turns", args.max_turns), ("max_tokens_per_turn", args.max_tokens_per_turn)) if value]
    config = load_config("sokoban", overrides)
    model, tokenizer = load_policy(args.model, device=args.device)
    env_rollout = EnvRollout("sokoban", tokenizer, config.rollout, env_kwargs=config.env.kwargs)
    dataset = env_rollout.dataset(range(args.steps * args.groups))  # a fresh seed for every prompt

    P, G = args.groups, args.group_size
    grpo = Ragen2GRPOConfig(
        output_dir=args.out, max_steps=args.steps, learning_rate=args.lr, seed=0,
        num_generations=G, per_device_train_batch_size=P * G, gradient_accumulation_steps=1,
        max_completion_length=config.rollout.max_turns * config.rollout.max_tokens_per_turn,
        temperature=1.0, top_p=1.0, beta=0.0, loss_type="grpo", scale_rewards="group",
        use_cpu=args.device == "cpu", bf16=False, gradient_checkpointing=False,
        shuffle_dataset=False, logging_steps=1, log_completions=True, num_completions_to_print=0,
        report_to="none", save_strategy="no", disable_tqdm=True,
        # ragen2: the paper's filter (top-p 0.9 of the reward variance, zero-variance groups dropped) ...
        reward_variance_filtering="top_p", reward_variance_top_p=0.9,
        # ... and the MI proxies of template collapse at step 1 and every 5 steps.
        collapse_diagnostics=True, collapse_compute_freq=5,
    )
    trainer = Ragen2GRPOTrainer(model=model, reward_funcs=[episode_return], args=grpo, train_dataset=dataset,
                                processing_class=tokenizer, rollout_func=env_rollout)
    trainer.train()
    final = Path(args.out) / "final"
    trainer.save_model(str(final))
    tokenizer.save_pretrained(str(final))
    for record in trainer.state.log_history:
        if "step" in record and "reward" in record:
            retrieval = record.get("collapse/retrieval_acc")  # only on the steps the diagnostics ran
            print(f"step {record['step']:3d}  reward {record['reward']:+.3f}  "
                  f"kept groups {record['reward_variance/kept_groups']:.0f}/{P}"
                  + (f"  Retrieval-Acc {retrieval:.3f} (chance {record['collapse/chance_level']:.3f})"
                     if retrieval is not None else ""))
    print(f"completions: {Path(args.out) / 'completions'}; weights: {final}")


if __name__ == "__main__":
    main()
