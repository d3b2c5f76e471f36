"""Training-step throughput of the default config, and ragen2's GRPO step against TRL's GRPOTrainer.

Part 1, the default config. `ragen2 train sokoban`, Config's defaults (the tiny policy on Sokoban, P=8
groups x G=8 episodes of up to 5 turns, GRPO, SNR-aware filter, collapse diagnostics on) runs
`--steps` steps with evaluation, intermediate checkpoints, the progress bar and TensorBoard
off; the end-of-run checkpoint is left out of the step time. Everything comes from the
trainer's own `timing_s/*` metrics. Reported, as means over the measured steps (the first
`--skip` are warm-up): generated tokens per second of generation time (`timing_s/generate`,
the model's share of the rollout) and per second of step time, episodes per second, and
every phase's seconds and share of the step. The collapse diagnostics run at step 1 and every
`collapse.compute_freq` (5) steps, so with the default 3 steps they fall on the warm-up step
only; `collapse` is then reported from the step(s) it ran on, flagged, and the step time is
also given without it (`step_s_without_diagnose`), which is the step time of the 4 in 5 steps
that do not compute it. `--steps 5` or more also measures a diagnose step.

Part 2, ragen2 vs TRL on the same job. One single-turn task, Bandit, trained by TRL's
`GRPOTrainer` and by ragen2's GRPO from the same weights with the same tokenizer: the same
P prompts x G generations per step (the same seeds, in the same order, so the same prompts
step by step), the same cap on new tokens, temperature 1.0, top-p 1, no top-k, no KL
(beta = 0), one optimizer step per generation batch in micro-batches of the same size, the
same clip range (0.2 below, 0.28 above: ragen2's clip-higher default), the same entropy
bonus (0.001), token-mean loss aggregation (ragen2's `grpo` default `token-mean` over the
mini-batch; TRL's `loss_type="dapo"`, the same normalisation by the generation batch's
active tokens), std-scaled group advantages, AdamW (torch's, not TRL's default fused one) with
the same lr and betas, a constant schedule, grad-norm clip 1.0, no gradient checkpointing
(TRL defaults it on), float32 on CPU (`use_cpu=True`, no bf16), dropout off, and nothing
logged, saved or evaluated. Both stop a completion at EOS or `</answer>` (ragen2's stop
string; TRL gets it as an extra EOS id). TRL's prompt is the exact string ragen2 renders:
system (the environment's instruction) + user (`Turn 1:\\nState:...`) through the chat
template with the generation prompt, then `<think>`, passed as a plain-text prompt so TRL
tokenises it to the same ids (checked). TRL's reward function parses the completion with
`ragen2.agent.parse_response` and steps a fresh Bandit with the same seed, giving the reward
ragen2 gives, format penalty (-0.1) included.

Time per step: TRL's wall time from `on_step_begin` to `on_step_end` (a TrainerCallback; this
includes its generation, reward and the accumulated forward/backward passes); ragen2's
`timing_s/step` (rollout, filter, advantage, update). Runs alternate sides (ragen2, TRL,
TRL, ragen2, ...) with `--repeats`, so a change in machine load biases neither side, and
the first `--skip` steps of each run are left out. `--threads` sets torch's intra-op threads
for both (default: torch's default); the thread count seen during each side's steps is
recorded.

What remains different: ragen2's rollout also builds each turn's reasoning span and the
per-turn records the diagnostics and the filter read, and the two sides draw different
samples from the same distribution, so tokens per step differ a little (the table shows
both). Like TRL in this setting, ragen2 takes the pre-update log-probabilities from the loss
pass itself (one optimizer step per batch) and computes the output layer only on the
positions that predict completion tokens.

    python benchmarks/step_throughput.py [--model tiny] [--threads N] [--steps 3] [--skip 1]
        [--bandit-steps 4] [--groups 8] [--group-size 8] [--max-new-tokens 64]
        [--micro-batch-size 8] [--repeats 2] [--skip-trl] [--skip-default]
        [--out step_throughput.json] [overrides for Part 1 ...]
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ragen2 import envs
from ragen2.agent.conversation import Conversation, user_message
from ragen2.agent.parsing import ANSWER_CLOSE, THINK_OPEN, parse_response
from ragen2.config import Config, load_config
from ragen2.rl.trainer import train
from ragen2.tracking import read_metrics

TRL_INSTALL = "pip install 'ragen2[trl]'"

# Off in every ragen2 run of this benchmark: they are not part of a training step's work.
QUIET = ["trainer.eval_every=0", "trainer.save_every=0", "logging.progress=false", "logging.tensorboard=false"]

BANDIT_PRESET = "bandit"

# The trainer's phases in the order a step runs them (ragen2/rl/trainer.py); `generate` is part of `rollout`.
PHASE_ORDER = ("rollout", "generate", "collapse", "filter", "grad_snr", "advantage", "update", "evaluate")


# ----------------------------------------------------------------------------- shared


def model_overrides(model: str) -> list[str]:
    return [] if model == "tiny" else [f"model.path={model}"]


def _mean(values: list[float]) -> float:
    return float(np.mean(values)) if values else float("nan")


def _std(values: list[float]) -> float:
    return float(statistics.stdev(values)) if len(values) > 1 else 0.0


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def step_time(record: dict[str, Any]) -> float:
    """The step's wall time without the end-of-run checkpoint (which TRL's side does not write)."""
    return record["timing_s/step"] - (record.get("timing_s/checkpoint") or 0.0)


def generated_tokens(record: dict[str, Any], episodes: int) -> float:
    """Tokens the policy generated in the step: per-turn mean x turns per episode x episodes."""
    return record["rollout/response_tokens_mean"] * record["rollout/turns_mean"] * episodes


# ----------------------------------------------------------------------------- part 1


def run_default(args: argparse.Namespace, run_dir: Path) -> dict[str, Any]:
    """Part 1: `args.steps` steps of the default config; per-phase means and throughput."""
    overrides = [*QUIET, *model_overrides(args.model), f"model.device={args.device}",
                 f"trainer.total_steps={args.steps}", f"trainer.run_dir={run_dir}", *args.overrides]
    config = load_config(args.preset, overrides)
    episodes = config.rollout.num_groups * config.rollout.group_size
    start = time.perf_counter()
    train(config)
    wall = time.perf_counter() - start
    records = [r for r in read_metrics(run_dir) if r["step"] >= 1]
    measured = [r for r in records if r["step"] > args.skip]

    found = {k.removeprefix("timing_s/") for r in records for k in r
             if k.startswith("timing_s/") and k not in ("timing_s/step", "timing_s/checkpoint")}
    phases = [p for p in PHASE_ORDER if p in found] + sorted(found - set(PHASE_ORDER))
    step_s = [step_time(r) for r in measured]
    step_mean = _mean(step_s)
    without_diagnose = [step_time(r) - (r.get("timing_s/collapse") or 0.0) for r in measured]
    phase_rows = {}
    for phase in phases:
        key = f"timing_s/{phase}"
        ran = [r for r in measured if r.get(key) is not None]
        if ran:
            values = [r[key] for r in ran]
            share = _mean(values) / _mean([step_time(r) for r in ran])  # of the steps it ran in
        else:  # e.g. the diagnostics ran on the warm-up step only: report that, and its share of a measured step
            ran = [r for r in records if r.get(key) is not None]
            values = [r[key] for r in ran]
            share = _mean(values) / (_mean(without_diagnose) + _mean(values))
        phase_rows[phase] = {
            "mean_s_when_run": _mean(values),
            "steps_run": [r["step"] for r in ran],
            "from_warmup_step": all(r["step"] <= args.skip for r in ran),
            # Mean over the measured steps, 0 where the phase did not run: what it adds to an average step.
            "mean_s_per_measured_step": _mean([r.get(key) or 0.0 for r in measured]),
            "share_of_step": share,
        }
    top_level = [p for p in phase_rows if p != "generate"]
    other = [step_time(r) - sum(r.get(f"timing_s/{p}") or 0.0 for p in top_level) for r in measured]
    phase_rows["other (untimed)"] = {
        "mean_s_when_run": _mean(other), "steps_run": [r["step"] for r in measured], "from_warmup_step": False,
        "mean_s_per_measured_step": _mean(other), "share_of_step": _mean(other) / step_mean,
    }
    tokens = [generated_tokens(r, episodes) for r in measured]
    generate_s = [r["timing_s/generate"] for r in measured]
    return {
        "config": f"{'default (`ragen2 train sokoban`)' if args.preset is None else args.preset}"
                  f"{' with overrides' if args.overrides else ''}: {config.env.name}, "
                  f"{config.algo.name}, {config.rollout.num_groups}x{config.rollout.group_size} episodes of up to "
                  f"{config.rollout.max_turns} turns, {config.rollout.max_tokens_per_turn} tokens/turn, "
                  f"filter {config.filter.strategy}, diagnostics {'on' if config.collapse.enable else 'off'} "
                  f"(every {config.collapse.compute_freq} steps and at step 1)",
        "overrides": overrides,
        "steps": args.steps,
        "skipped_warmup_steps": args.skip,
        "episodes_per_step": episodes,
        "wall_s_including_setup": wall,
        "step_s": step_mean,
        "step_s_std": _std(step_s),
        "step_s_without_diagnose": _mean(without_diagnose),
        "diagnose_compute_freq": config.collapse.compute_freq if config.collapse.enable else None,
        "diagnose_s_amortised_per_step": (phase_rows["collapse"]["mean_s_when_run"] / config.collapse.compute_freq
                                          if "collapse" in phase_rows else 0.0),
        "filter_skipped_steps": [r["step"] for r in measured if r.get("filter/skipped")],
        "generated_tokens_per_step": _mean(tokens),
        "tokens_per_generate_s": sum(tokens) / sum(generate_s) if sum(generate_s) else float("nan"),
        "tokens_per_step_s": sum(tokens) / sum(step_s) if sum(step_s) else float("nan"),
        "episodes_per_s": episodes * len(step_s) / sum(step_s) if sum(step_s) else float("nan"),
        # The trainer's per-step peak: allocated CUDA memory on a GPU, the process's resident set on a CPU.
        "peak_memory_mb": max(r["system/peak_memory_mb"] for r in records),
        "phases": phase_rows,
        "per_step": [{k: v for k, v in r.items() if k.startswith(("timing_s/", "rollout/", "filter/")) or k == "step"}
                     for r in records],
    }


def print_default(result: dict[str, Any]) -> None:
    print(f"\nPart 1: {result['config']}; {result['steps']} steps, first {result['skipped_warmup_steps']} "
          "left out (seconds are means over the measured steps)")
    print(_table(
        ["step_s", "step_s w/o diagnose", "tokens/step", "tokens/s of generate", "tokens/s of step", "episodes/s",
         "peak memory MB"],
        [[f"{result['step_s']:.2f}", f"{result['step_s_without_diagnose']:.2f}",
          f"{result['generated_tokens_per_step']:.0f}", f"{result['tokens_per_generate_s']:.1f}",
          f"{result['tokens_per_step_s']:.1f}", f"{result['episodes_per_s']:.2f}", f"{result['peak_memory_mb']:.0f}"]],
    ))
    rows = []
    for phase, row in result["phases"].items():
        name = f"{phase} (part of rollout)" if phase == "generate" else phase
        note = f"steps {row['steps_run']}" + (" (warm-up only)" if row["from_warmup_step"] else "")
        rows.append([name, f"{row['mean_s_when_run']:.3f}", f"{100 * row['share_of_step']:.1f}%", note])
    print()
    print(_table(["phase", "s (when run)", "share of step", "ran on"], rows))
    if "collapse" in result["phases"]:
        print(f"diagnose runs every {result['diagnose_compute_freq']} steps (and at step 1): "
              f"{result['diagnose_s_amortised_per_step']:.3f} s per step amortised")
    if result["filter_skipped_steps"]:
        print(f"note: the filter kept no group at measured step(s) {result['filter_skipped_steps']}, "
              "so they had no advantage or update phase")


# ----------------------------------------------------------------------------- part 2: ragen2 side


def bandit_overrides(args: argparse.Namespace) -> list[str]:
    """ragen2's side of Part 2 (TRL's side is configured from the resolved config)."""
    P, G = args.groups, args.group_size
    return [
        *QUIET, *model_overrides(args.model), "model.device=cpu", "model.dtype=float32",
        "rollout.max_turns=1", f"rollout.num_groups={P}", f"rollout.group_size={G}",
        f"rollout.max_tokens_per_turn={args.max_new_tokens}", "rollout.temperature=1.0", "rollout.top_p=1.0",
        "filter.strategy=none", "filter.include_zero=true", "collapse.enable=false", "grad_snr.enable=false",
        "algo.name=grpo", "algo.kl_coef=0", "algo.ppo_epochs=1",
        f"algo.mini_batch_size={P * G}", f"algo.micro_batch_size={args.micro_batch_size}",
        f"trainer.total_steps={args.bandit_steps}",
    ]


def run_ragen2(args: argparse.Namespace, run_dir: Path) -> list[dict[str, float]]:
    config = load_config(BANDIT_PRESET, [*bandit_overrides(args), f"trainer.run_dir={run_dir}"])
    episodes = args.groups * args.group_size
    train(config)
    threads = torch.get_num_threads()
    return [{"step": r["step"], "step_s": step_time(r), "tokens": generated_tokens(r, episodes),
             "generate_s": r["timing_s/generate"], "update_s": r.get("timing_s/update") or 0.0,
             "threads": threads} for r in read_metrics(run_dir) if r["step"] >= 1]


# ----------------------------------------------------------------------------- part 2: TRL side


def bandit_seeds(config: Config, steps: int) -> list[int]:
    """The environment seeds ragen2's trainer uses at steps 1..`steps`, group by group, in order."""
    from ragen2.envs import EVAL_SEED_OFFSET
    from ragen2.rl.rollout_stage import derived_seed

    P = config.rollout.num_groups
    seeds = []
    for step in range(1, steps + 1):
        base = derived_seed(config.trainer.seed, step, "env") % (EVAL_SEED_OFFSET - P)
        seeds += [base + g for g in range(P)]
    return seeds


def bandit_prompt(tokenizer: Any, config: Config, seed: int) -> str:
    """ragen2's first-turn prompt for `seed` as text (system + user + generation prefix + `<think>`).

    Raises when TRL's tokenisation of the text (`tokenizer(text=...)`) would differ from the
    ids ragen2's `Conversation` generates from, so both sides certainly see the same input.
    """
    env = envs.make(config.env.name, **config.env.kwargs)
    observation, _ = env.reset(seed=seed)
    conv = Conversation(tokenizer, env.instruction, config.rollout.context_turns)
    conv.add_observation(observation, env.max_actions)
    messages = [{"role": "system", "content": env.instruction},
                {"role": "user", "content": user_message(1, observation, env.max_actions)}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) + THINK_OPEN
    if tokenizer(text=[text])["input_ids"][0] != conv.prompt_ids():
        raise RuntimeError(f"seed {seed}: TRL would tokenise the prompt differently from ragen2")
    return text


def ragen2_turn_reward(text: str, seed: int, config: Config) -> float:
    """The reward ragen2's rollout gives a single-turn response (env rewards + format penalty)."""
    r = config.rollout
    parsed = parse_response(text, r.max_actions_per_turn)
    env = envs.make(config.env.name, **config.env.kwargs)
    env.reset(seed=seed)
    reward, valid = 0.0, parsed.valid
    for action in parsed.actions:
        _, step_reward, terminated, truncated, info = env.step(action)
        reward += float(step_reward)
        if not info["action_is_valid"]:
            valid = False
            break
        if terminated or truncated:
            break
    return reward + (0.0 if valid else r.format_penalty)


def trl_available() -> bool:
    try:
        import datasets  # noqa: F401
        import trl  # noqa: F401
    except ImportError:
        return False
    return True


def _grpo_config(GRPOConfig: type, config: Config, out_dir: Path, steps: int) -> Any:
    """TRL's settings for the job ragen2's `config` describes (see the module docstring for each choice)."""
    r, a, o = config.rollout, config.algo, config.optim
    P, G = r.num_groups, r.group_size
    return GRPOConfig(
        output_dir=str(out_dir), use_cpu=True, bf16=False, fp16=False, seed=config.trainer.seed,
        max_steps=steps, num_generations=G, per_device_train_batch_size=a.micro_batch_size,
        gradient_accumulation_steps=P * G // a.micro_batch_size,  # steps_per_generation defaults to this:
        num_iterations=1,  # one generation batch = one optimizer step
        max_completion_length=r.max_tokens_per_turn, temperature=r.temperature, top_p=r.top_p, top_k=0,
        repetition_penalty=1.0, beta=a.kl_coef, epsilon=a.clip_low, epsilon_high=a.clip_high,
        loss_type="dapo", scale_rewards="group", entropy_coef=a.entropy_coef, mask_truncated_completions=False,
        learning_rate=o.lr, adam_beta1=o.betas[0], adam_beta2=o.betas[1], weight_decay=o.weight_decay,
        optim="adamw_torch", lr_scheduler_type="constant", warmup_steps=0, max_grad_norm=o.grad_clip,
        disable_dropout=True, gradient_checkpointing=False,  # TRL's default is True; ragen2's (and HF's) False
        shuffle_dataset=False, remove_unused_columns=False,
        report_to="none", save_strategy="no", logging_strategy="no", eval_strategy="no", disable_tqdm=True,
        log_completions=False, dataloader_num_workers=0,
    )


def run_trl(args: argparse.Namespace, out_dir: Path) -> tuple[list[dict[str, float]], dict[str, Any]]:
    """TRL's GRPOTrainer on the same Bandit job; per-step wall times from a callback."""
    import datasets
    import transformers
    from transformers import TrainerCallback
    from transformers.trainer_callback import PrinterCallback, ProgressCallback
    from trl import GRPOConfig, GRPOTrainer

    from ragen2.models.loading import load_policy

    transformers.logging.set_verbosity_error()
    config = load_config(BANDIT_PRESET, bandit_overrides(args))
    model, tokenizer = load_policy(config.model.path, device="cpu", dtype="float32")  # ragen2's loader, same weights
    notes = {}
    stop = tokenizer.encode(ANSWER_CLOSE, add_special_tokens=False)
    eos = model.generation_config.eos_token_id
    eos = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
    if len(stop) == 1:  # ragen2 stops at `</answer>`; TRL stops only at EOS ids, so make it one
        model.generation_config.eos_token_id = sorted({tokenizer.eos_token_id, *eos, stop[0]} - {None})
    else:
        notes["stop"] = f"{ANSWER_CLOSE!r} is {len(stop)} tokens: TRL does not stop there, ragen2 does"

    seeds = bandit_seeds(config, args.bandit_steps)
    dataset = datasets.Dataset.from_dict({"prompt": [bandit_prompt(tokenizer, config, s) for s in seeds],
                                          "seed": seeds})
    tokens_per_call: list[int] = []

    def bandit_reward(prompts: list[str], completions: list[str], completion_ids: list[list[int]],
                      seed: list[int], **_: Any) -> list[float]:
        tokens_per_call.append(sum(len(ids) for ids in completion_ids))
        return [ragen2_turn_reward(text, s, config) for text, s in zip(completions, seed)]

    class StepTimer(TrainerCallback):
        def __init__(self) -> None:
            self.times: list[float] = []
            self.cycles: list[float | None] = []  # step end to step end: adds data loading and logging hooks
            self.threads: list[int] = []
            self._t0 = 0.0
            self._last_end: float | None = None

        def on_step_begin(self, *_: Any, **__: Any) -> None:
            self._t0 = time.perf_counter()

        def on_step_end(self, *_: Any, **__: Any) -> None:
            now = time.perf_counter()
            self.times.append(now - self._t0)
            self.cycles.append(None if self._last_end is None else now - self._last_end)
            self._last_end = now
            self.threads.append(torch.get_num_threads())

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        grpo = _grpo_config(GRPOConfig, config, out_dir, args.bandit_steps)
    timer = StepTimer()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        trainer = GRPOTrainer(model=model, reward_funcs=[bandit_reward], args=grpo, train_dataset=dataset,
                              processing_class=tokenizer, callbacks=[timer])
    for callback in (PrinterCallback, ProgressCallback):
        trainer.remove_callback(callback)
    generate_s: list[float] = []  # TRL's model.generate call and its EOS masking: ragen2's timing_s/generate
    generate = trainer._generate_single_turn

    def timed_generate(*a: Any, **k: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return generate(*a, **k)
        finally:
            generate_s.append(time.perf_counter() - t0)

    trainer._generate_single_turn = timed_generate
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # transformers' renames of gradient-checkpointing names
        trainer.train()
    if len(timer.times) != args.bandit_steps or len(tokens_per_call) != args.bandit_steps:
        raise RuntimeError(f"TRL ran {len(timer.times)} steps with {len(tokens_per_call)} generation batches; "
                           f"expected {args.bandit_steps} of each (one generation per optimizer step)")
    rows = [{"step": i + 1, "step_s": t, "tokens": float(n), "generate_s": g, "threads": th, "cycle_s": c}
            for i, (t, n, g, th, c) in enumerate(
                zip(timer.times, tokens_per_call, generate_s, timer.threads, timer.cycles))]
    return rows, notes


# ----------------------------------------------------------------------------- part 2: driver


SIDES = ("ragen2", "trl")


def run_comparison(args: argparse.Namespace, tmp: Path) -> dict[str, Any] | None:
    if args.skip_trl:
        return None
    if not trl_available():
        print(f"\nPart 2 skipped: TRL is not installed. Install it with: {TRL_INSTALL}")
        return {"skipped": f"trl not installed ({TRL_INSTALL})"}
    import trl

    per_step: dict[str, list[dict[str, float]]] = {side: [] for side in SIDES}
    notes: dict[str, Any] = {}
    for repeat in range(args.repeats):
        order = list(SIDES) if repeat % 2 == 0 else list(reversed(SIDES))
        for side in order:
            if args.threads:
                torch.set_num_threads(args.threads)
            run_dir = tmp / f"{side}-{repeat}"
            if side == "ragen2":
                rows = run_ragen2(args, run_dir)
            else:
                rows, notes = run_trl(args, run_dir)
            per_step[side] += [row | {"repeat": repeat, "measured": row["step"] > args.skip} for row in rows]

    summary = {}
    for side, rows in per_step.items():
        measured = [row for row in rows if row["measured"]]
        times = [row["step_s"] for row in measured]
        tokens = [row["tokens"] for row in measured]
        generate = [row["generate_s"] for row in measured]
        summary[side] = {
            "step_s": _mean(times), "step_s_std": _std(times), "steps_measured": len(times),
            "generate_s": _mean(generate), "rest_s": _mean(times) - _mean(generate),
            "tokens_per_step": _mean(tokens), "tokens_per_s": sum(tokens) / sum(times) if sum(times) else float("nan"),
            "threads": sorted({row["threads"] for row in measured}),
        }
        cycles = [row["cycle_s"] for row in measured if row.get("cycle_s") is not None]
        if cycles:  # TRL: step end to step end, a check that on_step_begin..on_step_end misses little
            summary[side]["cycle_s"] = _mean(cycles)
    config = load_config(BANDIT_PRESET, bandit_overrides(args))
    ratio = summary["ragen2"]["step_s"] / summary["trl"]["step_s"]
    return {
        "task": f"bandit, single turn, {args.groups} prompts x {args.group_size} generations, "
                f"<= {args.max_new_tokens} new tokens, micro-batch {args.micro_batch_size}, lr {config.optim.lr}",
        "trl_version": trl.__version__,
        "ragen2_overrides": bandit_overrides(args),
        "steps": args.bandit_steps,
        "skipped_warmup_steps": args.skip,
        "repeats": args.repeats,
        "summary": summary,
        "ratio_ragen2_over_trl": ratio,
        "notes": notes,
        "per_step": per_step,
    }


def print_comparison(result: dict[str, Any]) -> None:
    if "skipped" in result:
        return
    print(f"\nPart 2: {result['task']}; {result['steps']} steps x {result['repeats']} run(s) per side, "
          f"first {result['skipped_warmup_steps']} of each left out; TRL {result['trl_version']}")
    rows = []
    for side, s in result["summary"].items():
        rows.append([side, f"{s['step_s']:.3f}", f"{s['step_s_std']:.3f}", f"{s['generate_s']:.3f}",
                     f"{s['rest_s']:.3f}", f"{s['tokens_per_step']:.0f}", f"{s['tokens_per_s']:.1f}",
                     str(s["steps_measured"]), ",".join(map(str, s["threads"]))])
    ratio = {key: result["summary"]["ragen2"][key] / result["summary"]["trl"][key]
             for key in ("generate_s", "rest_s", "tokens_per_step")}
    rows.append(["ragen2 / trl", f"{result['ratio_ragen2_over_trl']:.3f}", "", f"{ratio['generate_s']:.3f}",
                 f"{ratio['rest_s']:.3f}", f"{ratio['tokens_per_step']:.3f}", "", "", ""])
    print(_table(["side", "step_s mean", "std", "generate_s", "rest_s", "tokens/step", "tokens/s", "steps",
                  "threads"], rows))
    for key, note in result["notes"].items():
        print(f"note ({key}): {note}")


# ----------------------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny", help="Model directory or 'tiny' (the cached warm-started policy).")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads for every run (default: torch's).")
    parser.add_argument("--out", default=None, help="Write the results as JSON here.")
    parser.add_argument("--skip", type=int, default=1, help="First steps of each run left out of the means (warm-up).")
    g1 = parser.add_argument_group("part 1: the default config")
    g1.add_argument("--skip-default", action="store_true", help="Do not run Part 1.")
    g1.add_argument("--preset", default=None, help="Config preset for Part 1 (default: none, Config's defaults: Sokoban).")
    g1.add_argument("--device", default="auto", help="Part 1's model.device.")
    g1.add_argument("--steps", type=int, default=3, help="Training steps of Part 1.")
    g1.add_argument("overrides", nargs="*", help="Config overrides for Part 1, e.g. rollout.num_groups=4.")
    g2 = parser.add_argument_group("part 2: TRL GRPOTrainer vs ragen2 GRPO on Bandit (CPU, float32)")
    g2.add_argument("--skip-trl", action="store_true", help="Do not run Part 2.")
    g2.add_argument("--bandit-steps", type=int, default=4, help="Training steps per run of each side.")
    g2.add_argument("--groups", type=int, default=8, help="P: prompts (Bandit seeds) per step.")
    g2.add_argument("--group-size", type=int, default=8, help="G: generations per prompt.")
    g2.add_argument("--max-new-tokens", type=int, default=64, help="Cap on generated tokens (the bandit preset's).")
    g2.add_argument("--micro-batch-size", type=int, default=8, help="Sequences per forward/backward on both sides.")
    g2.add_argument("--repeats", type=int, default=2, help="Runs per side, alternating the order.")
    args = parser.parse_args()
    if not args.skip_default and args.skip >= args.steps:
        parser.error(f"--skip {args.skip} leaves no step of Part 1 to measure out of --steps {args.steps}")
    if not args.skip_trl and args.skip >= args.bandit_steps:
        parser.error(f"--skip {args.skip} leaves no step of Part 2 to measure out of --bandit-steps {args.bandit_steps}")
    if (args.groups * args.group_size) % args.micro_batch_size:
        parser.error(f"--micro-batch-size {args.micro_batch_size} must divide --groups x --group-size "
                     f"({args.groups * args.group_size}): TRL accumulates whole micro-batches")
    if args.group_size < 2:
        parser.error("--group-size must be at least 2 (GRPO's group baseline)")
    logging.basicConfig(level=logging.WARNING)
    if args.threads:
        torch.set_num_threads(args.threads)

    result: dict[str, Any] = {"model": args.model, "threads": args.threads or torch.get_num_threads(),
                              "torch": torch.__version__}
    with tempfile.TemporaryDirectory(prefix="step_throughput-") as tmp:
        if not args.skip_default:
            result["default"] = run_default(args, Path(tmp) / "default")
            print_default(result["default"])
        comparison = run_comparison(args, Path(tmp))
        if comparison is not None:
            result["trl_comparison"] = comparison
            print_comparison(comparison)
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
