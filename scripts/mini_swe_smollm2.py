"""How many of mini-swe-agent's commands parse and run when SmolLM2-135M-Instruct (LoRA) drives it, over 2 training
steps on the CPU.

    OMP_NUM_THREADS=1 python scripts/mini_swe_smollm2.py --out runs/mini-swe-smollm2 [KEY=VALUE ...]

The run is `ragen2 train agent` with `play` below as its agent.entrypoint: mini-swe-agent 2.4.6 with its own
prompts (mini_textbased.yaml: a THOUGHT, then exactly one command in a ```mswea_bash_command block) on the shipped
task (ragen2/coding/tasks/mean), every command run in the sandbox, the reward the host's run of the task's tests.
Each episode's record goes to episodes.jsonl in the run directory; afterwards the script prints, over all
episodes, the model calls, the replies mini-swe-agent parsed into a command, the commands run and how they
ended (exit 0, 127: command not found, 2: a usage or syntax error, other), the rewards and each step's metrics.
KEY=VALUE pairs override the run's config (trainer.total_steps=1, rollout.group_size=2, ...).
"""

from __future__ import annotations

import argparse
import json
import os
from collections import Counter
from pathlib import Path

from ragen2.coding import RepoTask
from ragen2.coding.mini_swe_agent import run_episode

STEP_LIMIT = 4
LOG = "RAGEN2_MINI_SWE_LOG"


def play(client, seed: int) -> float:
    """The agent.entrypoint: one mini-swe-agent run on the shipped task, recorded in $RAGEN2_MINI_SWE_LOG."""
    result = run_episode(client, RepoTask.load("mean"), step_limit=STEP_LIMIT)
    with open(os.environ[LOG], "a") as f:
        f.write(json.dumps({"seed": seed, **result.to_dict()}) + "\n")
    return result.reward


def summary(episodes: list[dict]) -> str:
    calls = sum(e["model_calls"] for e in episodes)
    unparsed = sum(e["format_errors"] for e in episodes)
    commands = [c for e in episodes for c in e["commands"]]
    ended = Counter("exit 0" if c["returncode"] == 0 else "127 (command not found)" if c["returncode"] == 127
                    else "2 (usage or syntax error)" if c["returncode"] == 2 else "timed out" if c["timed_out"]
                    else "other non-zero" for c in commands)
    lines = [f"episodes: {len(episodes)}, model calls: {calls}",
             f"replies parsed into a command: {calls - unparsed} of {calls}; not parsed: {unparsed}",
             f"commands run in the sandbox: {len(commands)}, every one at PID 1 of its own namespace: "
             f"{all(c['sandbox'].get('pid') == 1 for c in commands)}",
             "how they ended: " + ", ".join(f"{k}: {v}" for k, v in sorted(ended.items())),
             f"episodes ended by: {dict(Counter(e['exit_status'] for e in episodes))}",
             f"rewards (host's test run): {[e['reward'] for e in episodes]}", "commands:"]
    lines += [f"  [{c['returncode']}] {c['command'][:100]!r}" for c in commands]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/mini-swe-smollm2"), help="the run directory")
    parser.add_argument("overrides", nargs="*", help="KEY=VALUE config overrides")
    args = parser.parse_args()
    from ragen2.config import load_config
    from ragen2.rl.trainer import train

    args.out.mkdir(parents=True, exist_ok=False)
    os.environ[LOG] = str(args.out / "episodes.jsonl")
    config = load_config("agent", [
        f"agent.entrypoint={Path(__file__).resolve()}:play", "model.path=smollm2-135m", "model.device=cpu",
        "model.lora_rank=8", "optim.lr=1e-3", "rollout.num_groups=2", "rollout.group_size=4",
        f"rollout.max_turns={STEP_LIMIT}", "rollout.max_tokens_per_turn=192", "trainer.total_steps=2",
        "trainer.eval_every=0", "trainer.save_every=0", "collapse.enable=false", "algo.micro_batch_size=1",
        "logging.tensorboard=false", "logging.sample_every=1", f"trainer.run_dir={args.out / 'run'}",
        *args.overrides])
    train(config)
    episodes = [json.loads(line) for line in Path(os.environ[LOG]).read_text().splitlines()]
    print(summary(episodes))
    for line in (args.out / "run" / "metrics.jsonl").read_text().splitlines():
        m = json.loads(line)
        keys = ("rollout/return_mean", "rollout/turns_mean", "rollout/response_tokens_mean", "timing_s/rollout",
                "timing_s/update", "timing_s/step", "system/peak_memory_mb")
        print(f"step {m.get('step')}: " + ", ".join(f"{k} {m[k]:.3g}" for k in keys if k in m)
              + ("" if any(k.startswith("train/") for k in m) else " (no update: no group kept)"))


if __name__ == "__main__":
    main()
