"""The `ragen2` command line: train | eval | warmstart | report | diagnose | sweep | serve.

Library code never prints; this module is the only place that talks to the terminal.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import textwrap
import traceback
from collections.abc import Callable
from pathlib import Path

from typing import TYPE_CHECKING

from ragen2.errors import Ragen2Error, did_you_mean

if TYPE_CHECKING:
    from ragen2.config import Config

TRAIN_EPILOG = """\
examples:
  ragen2 train                                  # the default run (preset `default`): tiny policy on FrozenLake
  ragen2 train frozenlake-ppo trainer.total_steps=50
  ragen2 train sokoban model.path=Qwen/Qwen2.5-0.5B-Instruct model.device=cuda
  ragen2 train --resume runs/sokoban-grpo-20261130-120000
  ragen2 train --resume runs/sokoban-grpo-20261130-120000 trainer.total_steps=60   # extend a finished run
  ragen2 train --list-keys                      # every config key with default and help
"""

# `ragen2 train` with no preset: ragen2/configs/default.yaml, a run whose RL raises held-out success on every
# seed and CPU arithmetic tried (docs/benchmarks.md, "The default run learns, whatever the CPU's arithmetic").
DEFAULT_PRESET = "default"

# Whether RL from each preset's starting policy raises held-out success, as measured (the evidence and
# the commands are in docs/environments.md, "Does RL from the preset's starting policy learn?").
PRESET_LEARNING = (
    ("default", "learns: +3.9 to +8.9 SE in 20 steps on trainer.seed 0 to 4 under three CPU arithmetics, 15 of 15 "
     "runs (the default run: FrozenLake from the part-way policy tiny:frozenlake, which ships with ragen2)"),
    ("bandit", "not measurably at its defaults (+0.2 SE in 30 steps); learns with optim.lr=1e-3 "
     "rollout.num_groups=64 rollout.group_size=4 algo.ppo_epochs=2 (+10.5 and +13.8 SE in 20 steps)"),
    ("sokoban", "not measurably in 20 to 30 steps"),
    ("frozenlake", "not measurably: the tiny policy starts near its ceiling (0.86); from the part-way policy "
     "model.path=tiny:frozenlake it learns (the default run)"),
    ("countdown", "not measured"),
    ("collapse", "not without the filter, by design: held-out success rises from 0.35 to 0.60 by step 20, then "
     "sinks to 0.48 ± 0.07 at step 60 as MI falls (trainer.seed 0 to 2); with the paper's filter it learns "
     "(0.66 ± 0.02): docs/results.md"),
    ("corridor", "not measured (its warm start, tiny:corridor, is evaluated under each rollout.memory in "
     "docs/memory.md)"),
    ("math, searchqa, code, webshop, tools-mix", "not expected, not measured: their policy solves 0 to 1 "
     "in 100 held-out episodes"),
    ("planning-mix", "not measurably in 20 steps"),
    ("SUITE:GAME", "not from the tiny policy on the games checked (TowerOfHanoi, gym:Blackjack-v1: the "
     "same return in every episode, so the filter drops every group); for a game with a solver, warm-start "
     "on it with model.path=tiny:SUITE:GAME (TextArena FrozenLake's warm start learns)"),
    ("agent, mcp:*, openenv:*, verifiers:*", "depends on the model and task given: not measured"),
)


def _learning_help() -> str:
    lines = ["Does RL from the preset's starting policy raise held-out success? (docs/environments.md)"]
    for names, verdict in PRESET_LEARNING:
        lines += textwrap.wrap(f"{names}: {verdict}", width=100, initial_indent="  ", subsequent_indent="      ")
    return "\n".join(lines)


DIAGNOSE_EPILOG = """\
examples:
  ragen2 diagnose runs/sokoban-grpo-X/rollouts/step_30.jsonl --model runs/sokoban-grpo-X/checkpoints/step_30
  ragen2 diagnose out/completions/completions_00100.parquet --model Qwen/Qwen3-0.6B --device cuda
  ragen2 diagnose rollouts.jsonl --model tiny --scheme trajectory --out diag
  ragen2 eval tiny --samples 64 && ragen2 diagnose eval/tiny-sokoban-<time>/rollouts.jsonl --model tiny
"""


SWEEP_EPILOG = """\
examples:
  ragen2 sweep experiments/filter_sokoban.yaml --jobs 2    # two runs at a time, one thread each on 2 cores
  ragen2 sweep experiments/filter_sokoban.yaml --dry-run   # validate every config, list start / resume / skip
  ragen2 sweep experiments/filter_sokoban.yaml             # again later: finished runs are skipped
  ragen2 sweep experiments/filter_sokoban.yaml trainer.total_steps=2 --seeds 0 --out /tmp/smoke   # a smoke test
"""


def _config_help() -> str:
    from ragen2.config import describe

    lines = ["config keys (set as key=value):"]
    for key, default, help_text in describe():
        lines.append(f"  {key} = {default}\n      {help_text}")
    return "\n".join(lines)


def cmd_warmstart(args: argparse.Namespace) -> int:
    from ragen2.models.policy_store import compare_weights, shipped_policy
    from ragen2.models.warmstart import make_config, parse_settings, warmstart

    settings = parse_settings(args.settings)
    if args.envs:
        settings["envs"] = tuple(e.strip() for e in args.envs.split(","))
    out_dir = Path(args.out) if args.out else None
    if args.base is None:
        path = warmstart(out_dir=out_dir, seed=args.seed, force=args.force, device=args.device, **settings)
        print(f"tiny policy ready: {path}")
        config = make_config(args.seed, settings)
        shipped = shipped_policy(config.key())
        if shipped is not None:  # tiny:ENV loads the shipped copy: say whether this CPU rebuilt it exactly
            difference = compare_weights(path, shipped)
            same = "the same weights, bit for bit" if difference == 0 else (
                f"weights that differ by up to {difference:.3g} (floats rounded differently: another kind of CPU, "
                "torch version or ATEN_CPU_CAPABILITY)")
            print(f"model.path=tiny:{','.join(config.envs)} loads the copy shipped with "
                  f"ragen2 ({shipped}), built on an AVX-512 CPU; this rebuild has {same}. "
                  f"Train from the rebuild with model.path={path}")
        return 0
    from ragen2.models.base_warmstart import format_summary, warmstart_base

    path = warmstart_base(
        args.base, out_dir=out_dir, seed=args.seed, force=args.force, device=args.device,
        lora_rank=args.lora_rank, eval_episodes=args.eval_episodes, **settings,
    )
    print(format_summary(path))
    print(f"warm start of {args.base} ready: {path} (train from it with model.path={path})")
    return 0


def _latest_checkpoint(model: str) -> str:
    """`model`, or for a run directory its latest checkpoint (what `ragen2 eval` and `ragen2 serve` load)."""
    latest = Path(model) / "checkpoints" / "latest"
    return str(Path(model) / "checkpoints" / latest.read_text().strip()) if latest.is_file() else model


def cmd_eval(args: argparse.Namespace) -> int:
    if args.model is None or "=" in args.model:  # nothing, or `ragen2 eval a.b=c`
        got = f" (got the override {args.model!r} there)" if args.model else ""
        raise Ragen2Error(
            f"ragen2 eval needs the model to evaluate first{got}: a model directory (e.g. "
            "runs/RUN/checkpoints/step_30), a run directory (its latest checkpoint), a hub name, or tiny; "
            "e.g. `ragen2 eval tiny --env sokoban`"
        )
    if args.episodes < 1:
        raise Ragen2Error(f"--episodes {args.episodes} is not allowed: use an integer >= 1")
    if args.samples < 0:
        raise Ragen2Error(f"--samples {args.samples} is not allowed: use an integer >= 0")
    if args.out and Path(args.out).suffix == ".json":
        raise Ragen2Error(f"--out {args.out}: --out is a directory (it gets eval.json, transcripts.txt and "
                          f"rollouts.jsonl); e.g. --out {Path(args.out).with_suffix('')}")
    from ragen2.models.hub import check_model_name

    model = _latest_checkpoint(args.model)
    check_model_name(model, f"model {model}")  # a mistyped hub name fails before torch loads
    from ragen2.eval_cli import evaluate_cli, parse_env
    from ragen2.models.loading import check_model_path

    envs = [e for text in args.env or ["sokoban"] for e in parse_env(text)]
    check_model_path(model, f"model {model}")  # before the model loads, with the file that is wrong
    result = evaluate_cli(model, envs, args.episodes, args.temperature, args.device, args.overrides,
                          Path(args.out) if args.out else None, compare_random=not args.no_random,
                          samples=args.samples)
    print(result["table"])
    if result["transcripts"]:
        print("\n" + result["transcripts"] + "\n")
    print(f"wrote eval.json, transcripts.txt and rollouts.jsonl in {result['out']}")
    return 0


# Keys a resumed run may change: the checkpoint's weights, optimizer and RNG states were made under
# the saved config, so anything else would make the continuation a different run than the one saved.
RESUME_OVERRIDES = ("trainer.total_steps",)


def cmd_train(args: argparse.Namespace) -> int:
    from ragen2.config import load_config

    if args.list_keys:
        print(_config_help())
        return 0
    preset = args.preset
    overrides = list(args.overrides)
    if preset and "=" in preset:  # `ragen2 train a.b=c` with no preset
        overrides.insert(0, preset)
        preset = None
    default = not preset and not args.resume
    preset = DEFAULT_PRESET if default else preset
    if args.resume:
        if preset:
            raise Ragen2Error(f"--resume continues a run with its saved config; drop the preset {preset!r}")
        config = _resumed_config(Path(args.resume), overrides)
    else:
        if preset and "." in preset and Path(preset).suffix not in (".yaml", ".yml") and not Path(preset).exists():
            raise Ragen2Error(  # `ragen2 train trainer.total_steps`: a key without its value
                f"{preset!r} is not a preset; overrides are key=value, e.g. {_override_example(preset)}"
            )
        config = load_config(preset, overrides)
        if preset == "agent" and not config.agent.entrypoint:
            raise Ragen2Error("the agent preset trains your own agent loop: give it as "
                              "agent.entrypoint=FILE.py:FUNCTION, FUNCTION(client, seed) -> reward (docs/agents.md)")
        logging.getLogger("ragen2").info("preset %s%s", preset, " (the default)" if default else "")
    from ragen2.models.hub import check_model_name

    check_model_name(config.model.path, f"model.path={config.model.path}")
    from ragen2.rl.trainer import train  # after the config is checked: a bad one is refused in well under a second

    summary = train(config, resume_dir=Path(args.resume) if args.resume else None)
    if summary:  # empty on data-parallel ranks other than 0
        print(summary)
    return 0


def _resumed_config(run_dir: Path, overrides: list[str]) -> Config:
    """The run's saved config, with only the RESUME_OVERRIDES keys changed (extending a finished run)."""
    from ragen2.config import load_config

    if not (run_dir / "config.yaml").exists():
        raise Ragen2Error(f"--resume {run_dir}: no config.yaml there; is it a ragen2 run directory?")
    for item in overrides:
        key = item.partition("=")[0]
        if key not in RESUME_OVERRIDES:
            raise Ragen2Error(
                f"--resume {run_dir}: {key} cannot change on resume: the checkpoint's weights, optimizer and "
                f"random states were made under the saved config, so a resumed run keeps it; only "
                f"{', '.join(k + '=N' for k in RESUME_OVERRIDES)} may be given (to extend or shorten the run). "
                "Start a new run for other settings."
            )
    return load_config(str(run_dir / "config.yaml"), overrides)


def cmd_serve(args: argparse.Namespace) -> int:
    if not 0 <= args.port <= 65535 or args.max_tokens < 1:
        raise Ragen2Error(f"--port {args.port} --max-tokens {args.max_tokens}: need a port in 0..65535 and "
                          "max tokens >= 1")
    if args.max_model_len is not None and args.max_model_len < 1:
        raise Ragen2Error(f"--max-model-len {args.max_model_len}: need a context length >= 1")
    from ragen2.models.loading import check_model_path, load_policy
    from ragen2.serve.endpoint import serve_policy

    model = _latest_checkpoint(args.model)
    if model != "tiny":
        check_model_path(model, f"model {model}")
    path = None if model == "tiny" else model
    policy, tokenizer = load_policy(path, args.device)
    endpoint = serve_policy(policy, tokenizer, path, args.host, args.port, args.max_tokens,
                            max_model_len=args.max_model_len)
    print(f"serving {model} at {endpoint.url}/v1 (POST /v1/chat/completions); Ctrl-C stops", flush=True)
    try:
        endpoint.wait()
    finally:
        endpoint.close()
    return 0


def cmd_diagnose(args: argparse.Namespace) -> int:
    from ragen2.collapse.offline import diagnose_cli

    result = diagnose_cli(
        args.rollouts,
        args.model,
        format=args.format,
        out=Path(args.out) if args.out else None,
        scheme=args.scheme,
        num_samples=args.num_samples,
        seed=args.seed,
        device=args.device,
        dtype=args.dtype,
        micro_batch_size=args.micro_batch_size,
        marginal=args.marginal,
        max_reasoning_tokens=args.max_reasoning_tokens,
    )
    print(result["table"])
    print(f"wrote {result['json_path']} and {result['heatmap_path']}")
    return 0


def cmd_sweep(args: argparse.Namespace) -> int:
    from ragen2.sweep import run_sweep, write_tables

    if args.tables_only:
        csv_path, md_path = write_tables(Path(args.out or Path("sweeps") / Path(args.spec).stem))
        print(f"wrote {csv_path} and {md_path}")
        return 0
    try:
        seeds = [int(s) for s in args.seeds.split(",")] if args.seeds else None
    except ValueError:
        raise Ragen2Error(f"--seeds {args.seeds}: give integers separated by commas, e.g. --seeds 0,1,2") from None
    actions = run_sweep(Path(args.spec), Path(args.out) if args.out else None, jobs=args.jobs,
                        threads=args.threads, dry_run=args.dry_run, overrides=args.overrides, seeds=seeds)
    for name, action in actions.items():
        print(f"{action:12s} {name}")
    failed = [name for name, action in actions.items() if action.startswith("failed")]
    if failed:
        print(f"{len(failed)} run(s) failed; see train.log in their directories", file=sys.stderr)
    return 1 if failed else 0


def cmd_report(args: argparse.Namespace) -> int:
    if args.smooth < 0:
        raise Ragen2Error(f"ragen2 report --smooth {args.smooth}: give a window of logged points, or 0 for none")
    run_dirs = [Path(d) for d in args.run_dirs]
    for run_dir in run_dirs:
        if not run_dir.is_dir():
            parent = run_dir.parent if run_dir.parent.is_dir() else None
            runs = [p.name for p in parent.iterdir() if (p / "metrics.jsonl").is_file()] if parent else []
            raise Ragen2Error(
                f"ragen2 report {run_dir}: no such directory; pass a run directory written by `ragen2 train` "
                "(runs/ENV-ALGO-TIME)." + did_you_mean(run_dir.name, runs)
            )
        if not (run_dir / "metrics.jsonl").is_file():
            raise Ragen2Error(
                f"ragen2 report {run_dir}: no metrics.jsonl there; pass a run directory written by `ragen2 train` "
                "(a run that logged no step yet has nothing to plot)"
            )
    from ragen2.report import write_report

    html = write_report(run_dirs, Path(args.out) if args.out else None, smooth=args.smooth)
    print(f"wrote {html}")
    return 0


def _command(
    sub: argparse._SubParsersAction, func: Callable[[argparse.Namespace], int], name: str, help: str,
    description: str, epilog: str | None = None,
) -> argparse.ArgumentParser:
    """The subcommand `name`, run by `func`. An epilog (examples, one a line) keeps its line breaks, and so
    does the description then."""
    p = sub.add_parser(name, help=help, description=description, epilog=epilog,
                       formatter_class=argparse.RawDescriptionHelpFormatter if epilog else argparse.HelpFormatter)
    p.set_defaults(func=func)
    return p


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ragen2",
        description="Multi-turn RL for LLM agents with reasoning-collapse diagnostics and SNR-aware filtering.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="Debug logging, and a traceback with each error.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = _command(
        sub, cmd_train, "train",
        help="Run multi-turn RL (default: tiny policy on Sokoban).",
        description=(
            "Run multi-turn RL. PRESET is ENV, ENV-ALGO or ENV-ALGO-FILTER (e.g. frozenlake, frozenlake-ppo,\n"
            "sokoban-grpo-nofilter), or a YAML file; then any number of key=value overrides.\n"
            "  ENV     a built-in environment (bandit, code, countdown, frozenlake, math, searchqa, sokoban,\n"
            "          webshop) or a suite's game (textarena:TowerOfHanoi-v0, gym:FrozenLake-v1, textworld:...)\n"
            "  ALGO    ppo, grpo, drgrpo, dapo, rloo, reinforce_pp, reinforce_pp_baseline or gigpo\n"
            "  FILTER  paper (the paper's SNR-aware filter) or nofilter\n\n" + _learning_help()
        ),
        epilog=TRAIN_EPILOG,
    )
    p.add_argument("preset", nargs="?", help="ENV, ENV-ALGO, ENV-ALGO-FILTER or a path to a YAML file "
                   f"(none: {DEFAULT_PRESET!r}, the default run).")
    p.add_argument("overrides", nargs="*", help="Dotted overrides, e.g. algo.name=ppo filter.value=0.9.")
    p.add_argument("--resume", metavar="RUN_DIR",
                   help="Continue a run from its last checkpoint, with its saved config; trainer.total_steps=N "
                   "may follow, to extend a finished run (the only key a resumed run may change; a linear or cosine "
                   "optim.schedule then decays over the new total from the resumed step on).")
    p.add_argument("--list-keys", action="store_true", help="Print every config key with its default and help.")

    p = _command(
        sub, cmd_eval, "eval",
        help="Evaluate a policy on held-out seeds.",
        description="Success rate, mean return, mean turns and valid-format rate on held-out seeds; "
        "prints a table (with a uniform-random agent for comparison), whether the policy beats that agent by more "
        "than 3 standard errors (and, for a run or its checkpoint, the run's first evaluation), a few sample "
        "episodes, and writes "
        "eval.json, transcripts.txt (the sample episodes' conversations) and rollouts.jsonl (the same episodes "
        "as rollout records, for `ragen2 diagnose`) into a results directory: eval/<model name>-<env>-<time>/ "
        "in the current directory (a run's checkpoint is named <run>-step_N), or --out DIR.",
    )
    p.add_argument("model", nargs="?", help="Model directory, run directory (its latest checkpoint), hub name or "
                   ".gguf file; 'tiny' = the built-in warm-started policy, 'smollm2-135m' = SmolLM2-135M-Instruct.")
    p.add_argument("--env", action="append", metavar="ENV",
                   help="Environment name (default: sokoban). Repeat it for several in one table; a variant is "
                   "NAME:key=value[:key=value] over the preset's kwargs (sokoban:dim_room=[8,8]), and a .yaml file "
                   "lists {name, kwargs, tag} entries (docs/mixtures.md).")
    p.add_argument("--episodes", type=int, default=200, help="Held-out episodes (default: 200).")
    p.add_argument("--temperature", type=float, default=0.5, help="Sampling temperature (default: 0.5).")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda (default: auto).")
    p.add_argument("--out", metavar="DIR",
                   help="Results directory (default: a new eval/<model name>-<env>-<time>/ in the current directory).")
    p.add_argument("--samples", type=int, default=4,
                   help="Episodes written to transcripts.txt and rollouts.jsonl; the first two are also printed "
                   "(default: 4).")
    p.add_argument("--no-random", action="store_true", help="Skip the uniform-random baseline.")
    p.add_argument("overrides", nargs="*", help="Config overrides, e.g. env.kwargs.size=6 rollout.max_turns=5.")

    p = _command(
        sub, cmd_warmstart, "warmstart",
        help="Build the tiny built-in policy (tokenizer + Qwen2 model + SFT on solver demos), or with --base "
        "fine-tune a pretrained model on the same demos.",
        description="Build and cache the tiny policy: byte-level BPE tokenizer with a chat template, a small "
        "Qwen2 model, fine-tuned on solver demonstrations. With --base MODEL, fine-tune that pretrained model "
        "(LoRA or full) on the demonstrations, rendered with its own chat template. Reused when already cached. "
        "The default run's policy (--envs frozenlake, model.path=tiny:frozenlake) ships with ragen2, built on an "
        "AVX-512 CPU; rebuilding it here says whether this CPU gives the same weights (docs/models.md).",
    )
    p.add_argument("--out", help="Output directory (default: the cache, $RAGEN2_CACHE or ~/.cache/ragen2).")
    p.add_argument("--seed", type=int, default=0, help="Seed (default: 0).")
    p.add_argument("--force", action="store_true", help="Rebuild even when cached.")
    p.add_argument(
        "--envs",
        help="Comma-separated environments to demonstrate (default: sokoban,frozenlake,bandit, the default policy; "
        "countdown is the Countdown preset's policy and countdown,math,searchqa,code,webshop the one the math, "
        "searchqa, code and webshop presets use: model.path=tiny:ENV,...; ENV+tools demonstrates ENV's native tool "
        "calls, e.g. searchqa+tools,webshop+tools for rollout.tool_calls=true, with or without --base; with --base the "
        "default is bandit,frozenlake).",
    )
    p.add_argument(
        "--base", metavar="MODEL",
        help="Fine-tune this pretrained model (a directory, hub name, .gguf file or smollm2-135m) on the "
        "demonstrations instead of building the tiny policy; writes a Hugging Face directory (LoRA merged) and "
        "a warmstart.json with held-out success and valid-format rate before and after, per env (default out: "
        "the cache, keyed by base and settings). Settings: episodes_per_env, steps, lr, warmup_steps, "
        "weight_decay, batch_tokens, grad_clip.",
    )
    p.add_argument("--lora-rank", type=int, default=16,
                   help="With --base: LoRA rank on every linear layer, merged when saved; 0 = full fine-tuning "
                   "(default: 16).")
    p.add_argument("--eval-episodes", type=int, default=32,
                   help="With --base: held-out episodes per env for the before/after/random evaluation; 0 skips "
                   "it (default: 32).")
    p.add_argument("--device", default="cpu", help="Where the fine-tuning runs: cpu | cuda (default: cpu).")
    p.add_argument(
        "settings", nargs="*", metavar="KEY=VALUE",
        help="Model and training settings over the defaults, for a larger policy on a GPU, e.g. hidden_size=512 "
        "num_layers=8 num_heads=8 num_kv_heads=4 intermediate_size=1536 lr=1e-3 (with --out, then "
        "model.path=OUT). Keys: episodes_per_env, vocab_size, hidden_size, num_layers, num_heads, num_kv_heads, "
        "intermediate_size, steps, lr, warmup_steps, weight_decay, batch_tokens, grad_clip; stop_at_success=0.4 "
        "(with check_every, check_episodes) stops at the first check whose validation success reaches 0.4.",
    )

    p = _command(
        sub, cmd_serve, "serve",
        help="Serve a policy behind an OpenAI-compatible endpoint (/v1/chat/completions, tools included).",
        description="Serve a policy for agent loops that run as separate processes: POST /v1/chat/completions "
        "with the OpenAI request shape, `tools` rendered by the policy's chat template and `<tool_call>` blocks "
        "returned as tool_calls; concurrent requests are batched. Sampling follows each request (temperature, "
        "top_p, seed, max_tokens up to --max-tokens); `logprobs` and vLLM's `return_token_ids` are honoured. "
        "Training serves the same endpoint itself (`ragen2 train agent`, docs/agents.md).",
    )
    p.add_argument("model", help="Model directory, run directory (its latest checkpoint), hub name, .gguf file or "
                   "'tiny'.")
    p.add_argument("--host", default="127.0.0.1", help="Address to listen on (default: 127.0.0.1).")
    p.add_argument("--port", type=int, default=8000, help="Port (default: 8000; 0 = any free port).")
    p.add_argument("--max-tokens", type=int, default=1024, help="Cap on a completion's tokens (default: 1024).")
    p.add_argument("--max-model-len", type=int,
                   help="Context length: a prompt of this many tokens or more is refused (HTTP 400), a completion "
                   "is cut where prompt + completion reach it (default: the model's max_position_embeddings).")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda (default: auto).")

    p = _command(
        sub, cmd_diagnose, "diagnose",
        help="MI proxies (template collapse) of saved rollouts, scored by a model.",
        description="Score every reasoning of a rollout file under every input with MODEL, print the MI "
        "proxies (Retrieval-Acc, MI-Est, MI-ZScore, ...), write diagnose.json and a heatmap PNG. Reads the "
        "rollout records of `ragen2 train` (rollouts/step_N.jsonl, rollouts/train_step_N.jsonl) and `ragen2 eval` "
        '(rollouts.jsonl), any JSONL of {"group", "prompt", "reasoning"} objects, and TRL GRPOTrainer completion '
        "logs. See docs/diagnostics.md.",
        epilog=DIAGNOSE_EPILOG,
    )
    p.add_argument("rollouts", help="Rollout file: records .jsonl, TRL completions .parquet / .jsonl / W&B .json, "
                   "or a verl rollout dump (trainer.rollout_data_dir) .jsonl.")
    p.add_argument("--model", required=True,
                   help="Scoring model: a Hugging Face directory, hub name or .gguf file; 'tiny' = the built-in "
                   "policy, 'smollm2-135m' = SmolLM2-135M-Instruct.")
    p.add_argument("--format", default="auto", choices=["auto", "ragen2", "trl", "verl", "records"],
                   help="Input format (default: auto; ragen2 = records).")
    p.add_argument("--out", metavar="DIR",
                   help="Results directory (default: a new diagnose/<file name>-<time>/ in the current directory; "
                   "a run's rollouts/step_N.jsonl is named <run>-step_N).")
    p.add_argument("--scheme", default="first_turn", choices=["first_turn", "trajectory", "pairs", "memory"],
                   help="Pair sampling (default: first_turn; see docs/diagnostics.md).")
    p.add_argument("--num-samples", type=int, default=64, help="Pairs to score (default: 64, the reference).")
    p.add_argument("--seed", type=int, default=0, help="Seed of the pair sampling (default: 0).")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda (default: auto).")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                   help="Model dtype (default: float32).")
    p.add_argument("--micro-batch-size", type=int, default=32, help="Reasonings per forward pass (default: 32).")
    p.add_argument("--marginal", default="mixture", choices=["mixture", "token_mean"],
                   help="MI-Est marginal: the paper's mixture (default) or the reference code's token_mean.")
    p.add_argument("--max-reasoning-tokens", type=int, default=512,
                   help="Keep the first N tokens of each reasoning, so memory stays bounded whatever the file "
                   "holds; the truncated ones are counted (default: 512; 0 = no cap).")

    p = _command(
        sub, cmd_sweep, "sweep",
        help="Run a grid of training runs from a YAML spec and tabulate them.",
        description="Expand SPEC (a base config, axes of dotted config keys, seeds) into one `ragen2 train` run "
        "per grid point, each in OUT/<axis=label>__...__seed=N, and write OUT/sweep.csv (one row per run) and "
        "OUT/sweep.md (mean +- standard error over seeds). Resumable: finished runs are skipped, interrupted "
        "ones continue from their last checkpoint. The spec format is in ragen2/sweep.py and experiments/README.md.",
        epilog=SWEEP_EPILOG,
    )
    p.add_argument("spec", help="Sweep spec, a YAML file (e.g. experiments/filter_sokoban.yaml).")
    p.add_argument("overrides", nargs="*",
                   help="key=value set in every run, over the spec (e.g. trainer.total_steps=2 for a smoke test).")
    p.add_argument("--seeds", help="Comma-separated seeds: run only these of the spec's seeds.")
    p.add_argument("--out", help="Directory of the runs and tables (default: sweeps/<spec name>).")
    p.add_argument("--jobs", type=int, default=1, help="Runs at once, each a subprocess (default: 1; at most the cores).")
    p.add_argument("--threads", type=int,
                   help="OMP_NUM_THREADS of each run (default: cores // jobs, capped by OMP_NUM_THREADS when set; "
                   "jobs x threads may not exceed the cores).")
    p.add_argument("--dry-run", action="store_true", help="Check every config and print what would run; run nothing.")
    p.add_argument("--tables-only", action="store_true", help="Only rewrite sweep.csv and sweep.md from the runs there.")

    p = _command(
        sub, cmd_report, "report",
        help="Write PNG figures and report.html for a run directory, or for several runs overlaid.",
        description="Write PNG figures (OUT/figures/) and OUT/report.html: return, success with error bars, "
        "collapse proxies, entropy, losses, gradient norm, learning rate, clip fraction, approximate KL, "
        "throughput, timing per phase, sample trajectories (docs/report.md). Several run directories are "
        "overlaid, one colour per run (e.g. filter against no filter).",
    )
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="A run directory written by `ragen2 train`.")
    p.add_argument("--out", metavar="DIR",
                   help="Directory of report.html and figures/ (default: the run directory for one run; for several, "
                   "report-FIRST-vs-SECOND in the working directory, -and-N-more appended past two).")
    p.add_argument("--smooth", type=int, default=0, metavar="N",
                   help="Draw lines as moving averages over the last N logged points, raw points faint behind "
                   "(default 0: off).")
    for p in sub.choices.values():  # -v also after the command: `ragen2 train sokoban -v`
        p.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    return parser


# Commands whose free arguments are `key=value` config overrides.
_OVERRIDE_COMMANDS = ("train", "eval", "sweep")


def _override_example(key: str) -> str:
    """`key=<its default>` for a config key, else `key=VALUE`."""
    from ragen2.config import describe

    default = {k: d for k, d, _ in describe()}.get(key)
    return f"{key}={default}" if default not in (None, "null", "", "[]", "{}") else f"{key}=VALUE"


def _dashed_override(argv: list[str]) -> str | None:
    """The message for `--trainer.total_steps=5` (a config key written as an option), or None."""
    command = next((a for a in argv if not a.startswith("-")), None)
    if command not in _OVERRIDE_COMMANDS:
        return None
    for i, arg in enumerate(argv):
        key, eq, value = arg.lstrip("-").partition("=")
        if arg.startswith("--") and "." in key:
            value = value if eq else (argv[i + 1] if i + 1 < len(argv) and not argv[i + 1].startswith("-") else "")
            fixed = f"{key}={value}" if value else _override_example(key)
            return f"{arg}: config overrides are written key=value without dashes, e.g. `ragen2 {command} {fixed}`"
    return None


def _quiet_libraries() -> None:
    """Turn off the libraries' progress bars and load reports ("Loading weights", "Writing model shards",
    the LOAD REPORT of a newly initialised critic head): they bury the run's own lines. -v keeps them.
    The variables are read at import, so this runs before the commands import the libraries."""
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    for name in ("httpx", "httpx2"):  # the HTTP clients of `openai`: a line per request of an agent loop
        logging.getLogger(name).setLevel(logging.WARNING)
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    if "transformers" in sys.modules:  # main() called from Python after an import
        import transformers

        transformers.logging.set_verbosity_error()
        transformers.logging.disable_progress_bar()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    dashed = _dashed_override(argv)
    if dashed:
        print(f"error: {dashed}", file=sys.stderr)
        return 2
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    # argparse takes positionals in one run: overrides after an option (`eval tiny --env bandit a.b=c`)
    # come back unparsed. They are still overrides.
    if extra and hasattr(args, "overrides") and all("=" in a and not a.startswith("-") for a in extra):
        args.overrides = [*args.overrides, *extra]
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if not args.verbose:
        _quiet_libraries()
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    # huggingface_hub prints through a handler of its own; passed on to the root handler as well, each
    # of its lines (a download retry, say) would print twice.
    logging.getLogger("huggingface_hub").propagate = False
    try:
        return args.func(args)
    except Ragen2Error as e:
        if args.verbose:
            traceback.print_exc()
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
