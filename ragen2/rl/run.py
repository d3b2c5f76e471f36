"""A training run's state, `Run`, and how a run starts: `setup`.

`setup` makes (or, on resume, locks and reads) the run directory, writes config.yaml, loads the
policy (with LoRA and gradient checkpointing as configured), the critic and the frozen reference,
builds the optimizers and the metric tracker, and on resume restores the checkpoint's optimizer,
RNG, diagnostics and guard state. ragen2.rl.trainer runs the steps on what it returns.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import torch
import yaml
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ragen2.agent import GenerationBackend, Trajectory
from ragen2.collapse.online import OnlineDiagnostics
from ragen2.mixture import is_mixture, label
from ragen2.config import Config, config_from_file, save_config, to_dict
from ragen2.cpu_threads import set_cpu_threads
from ragen2.errors import CheckpointError, ConfigError
from ragen2.models.loading import (
    check_model_dir,
    check_model_path,
    load_policy,
    resolve_device,
    resolve_model_path,
)
from ragen2.models.lora import add_lora
from ragen2.rl import distributed, fsdp
from ragen2.rl.checkpoint import Checkpoint, load_checkpoint, resume_fix, set_rng_state
from ragen2.rl.critic import load_critic
from ragen2.rl.guards import EarlyStopGuards
from ragen2.rl.kl_control import KLController
from ragen2.rl.run_lock import RunLock
from ragen2.entrypoint import agent_name
from ragen2.tracking import Tracker

if TYPE_CHECKING:
    from ragen2.serve.agent_loop import AgentRunner

log = logging.getLogger(__name__)


class RolloutSource(Protocol):
    """Where an asynchronous run's groups come from (ragen2.rl.async_rollout's end of the worker in the
    trainer): the groups played for a step, and the news that the weights of a step are ready."""

    def take(self, step: int) -> tuple[list[Trajectory], dict[str, float]]: ...

    def push(self, step: int) -> None: ...


@dataclass
class Run:
    """Everything the phases read or update; a checkpoint saves the parts that change."""

    config: Config
    run_dir: Path
    device: torch.device
    policy: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    optimizer: torch.optim.Optimizer
    tracker: Tracker | distributed.SilentTracker  # silent on ranks other than 0
    diagnostics: OnlineDiagnostics
    critic: PreTrainedModel | None = None  # PPO only
    critic_optimizer: torch.optim.Optimizer | None = None
    reference: PreTrainedModel | None = None  # frozen initial policy: for a KL penalty or the grad-SNR probe
    guards: EarlyStopGuards | None = None  # early_stop.*; None only for a Run built by hand
    kl_ctrl: KLController | None = None  # beta of the KL in the reward (algo.kl_in_reward)
    step: int = 0  # last completed (logged) step
    saved_step: int = 0  # step of the newest checkpoint marked latest
    skipped_in_a_row: int = 0  # consecutive steps where filtering kept nothing
    stop_reason: str | None = None  # set when the run ends before trainer.total_steps
    clean: bool = True  # False while a step's update has changed the weights but is not logged yet
    backend: GenerationBackend | None = None  # rollout engine, built at the first rollout (make_backend)
    # model.fsdp: the sharded copy that trains; `policy` is then its full replica for everything else
    trainee: torch.nn.Module | None = None
    lock: RunLock | None = None  # held by rank 0 while the run trains: one process per run directory
    # The diagnostics' state (MI EMAs, alarm) as of `step`: a step cut off by Ctrl-C after its check
    # has already moved the live state, and the checkpoint written then must not include that move.
    diagnostics_at_step: dict | None = None
    agent: AgentRunner | None = None  # agent.entrypoint: its endpoint and function, made at the first rollout
    rollouts: RolloutSource | None = None  # async.max_staleness > 0: the rollout worker's end in the trainer


def setup(config: Config, resume_dir: Path | None = None) -> Run:
    """Build the run: directory, config.yaml, policy (+ critic, reference), optimizers, tracker.

    On resume, weights, optimizer states and RNG states come from the latest checkpoint of
    `resume_dir`, and its metrics after that checkpoint are dropped (they will be redone).
    With several processes rank 0 chooses and writes the run directory (which must be on a
    file system all of them see) and logs; every process loads the same weights.
    """
    distributed.group_range(config.rollout.num_groups)  # P must split evenly over the processes
    if config.model.fsdp and distributed.world_size() < 2:
        raise ConfigError("model.fsdp=true shards over several processes: launch with torchrun or accelerate "
                          "(docs/scaling.md), or set model.fsdp=false for one process")
    # A resume locks first, so that nothing is read while another process may be writing.
    lock = RunLock(resume_dir).acquire() if resume_dir is not None and distributed.is_main() else None
    fresh = runs_made = False
    try:
        checkpoint = load_checkpoint(resume_dir) if resume_dir is not None else None
        if checkpoint is not None and checkpoint.step > config.trainer.total_steps:
            raise ConfigError(f"trainer.total_steps={config.trainer.total_steps} is below the step of the checkpoint "
                              f"to resume ({checkpoint.path}, step {checkpoint.step}): give a larger value")
        # Files are checked before a run directory exists: a run that cannot start leaves nothing behind.
        if checkpoint is not None:
            _check_checkpoint_models(checkpoint, config)
        if checkpoint is None or config.model.lora_rank > 0 or _uses_reference(config):
            check_model_path(config.model.path)  # weights load from model.path: the policy, LoRA's base, the reference
        distributed.on_main(lambda: resolve_model_path(config.model.path))  # a tiny policy is built once, not per rank
        if resume_dir is None:
            new_dir = not (config.trainer.run_dir and Path(config.trainer.run_dir).exists())
            made_runs = new_dir and not config.trainer.run_dir and not Path("runs").exists()
            run_dir = distributed.on_main(lambda: _new_run_dir(config))
            if distributed.is_main():  # refused here, the directory is another process's: it is left as it is
                lock = RunLock(run_dir).acquire()
            fresh, runs_made = new_dir, made_runs
        else:
            run_dir = Path(resume_dir)
        config = dataclasses.replace(config, trainer=dataclasses.replace(config.trainer, run_dir=str(run_dir)))
        run = _build_run(config, run_dir, checkpoint)
        run.lock = lock
        return run
    except BaseException:
        if lock is not None:
            lock.release()
        if fresh and distributed.is_main():  # it holds only config.yaml (and maybe an empty log): remove it
            shutil.rmtree(run_dir, ignore_errors=True)
            if runs_made:
                with contextlib.suppress(OSError):  # runs/ itself, unless another run has appeared in it
                    run_dir.parent.rmdir()
        raise


def _build_run(config: Config, run_dir: Path, checkpoint: Checkpoint | None) -> Run:
    """`setup` once the run directory exists: config.yaml, models, optimizers, tracker, restored state."""
    saved = None  # the saved trainer.total_steps of a resumed run (rank 0 reads it)
    if distributed.is_main():
        saved = config_from_file(run_dir / "config.yaml").trainer.total_steps if checkpoint is not None else None
        save_config(config, run_dir / "config.yaml")  # on resume, the same config, or a new trainer.total_steps
    device = resolve_device(config.model.device)
    if distributed.is_main():
        log.info("%s", run_header(config, run_dir, device))
        log.debug("resolved config:\n%s", yaml.safe_dump(to_dict(config), sort_keys=False))
    torch.manual_seed(config.trainer.seed)  # initialisation of new heads and adapters
    policy, tokenizer = load_trainable_policy(config, device, checkpoint)
    threads, why = set_cpu_threads(config.model.cpu_threads, policy.num_parameters(), local_processes(config))
    if distributed.is_main() and device.type == "cpu":
        log.info("torch on %d CPU thread%s per process (%s), %s kernels (ATEN_CPU_CAPABILITY)", threads,
                 "s" if threads > 1 else "", why, torch.backends.cpu.get_cpu_capability().lower())
    critic = None
    if config.algo.name == "ppo":
        source = checkpoint.critic_path if checkpoint else None
        if checkpoint is not None and source is None:
            raise CheckpointError(f"checkpoint {checkpoint.path} has no critic/ directory, which algo.name=ppo needs")
        critic = load_critic(str(source or resolve_model_path(config.model.path)), device, config.model.dtype,
                             fresh_head=source is None)
        critic.train()
        if config.model.fsdp:
            fsdp.shard(critic)
    reference = _reference_policy(config, policy, device) if _uses_reference(config) else None
    trainee = None
    if config.model.fsdp:
        trainee = fsdp.shard_policy(policy)
        policy.requires_grad_(False)  # the replica generates and scores; only the shards train
    o = config.optim
    optimizer = torch.optim.AdamW(
        [p for p in (trainee or policy).parameters() if p.requires_grad], lr=o.lr, betas=tuple(o.betas),
        weight_decay=o.weight_decay,
    )
    critic_optimizer = None
    if critic is not None:
        critic_optimizer = torch.optim.AdamW(
            critic.parameters(), lr=config.algo.critic_lr, betas=tuple(o.betas), weight_decay=o.weight_decay
        )
    tracker = Tracker(
        run_dir, to_dict(config), tensorboard=config.logging.tensorboard,
        wandb=config.logging.wandb, wandb_project=config.logging.wandb_project,
    ) if distributed.is_main() else distributed.SilentTracker()
    diagnostics = OnlineDiagnostics(config.collapse, config.trainer.seed, run=config, per_tag=is_mixture(config))
    run = Run(config, run_dir, device, policy, tokenizer, optimizer, tracker, diagnostics, critic, critic_optimizer,
              reference, EarlyStopGuards(config.early_stop), kl_controller(config), trainee=trainee)
    if checkpoint is not None:
        _restore(run, checkpoint)
        if saved is not None and saved != config.trainer.total_steps:
            run.tracker.log_event("total_steps_changed", f"trainer.total_steps {saved} -> "
                                  f"{config.trainer.total_steps} on resume from step {checkpoint.step}", checkpoint.step)
    return run


def local_processes(config: Config) -> int:
    """The run's processes on this machine that compute with torch: a launcher's local ranks, or the trainer and
    the rollout workers it starts itself (async.local_workers)."""
    launched = int(os.environ.get("LOCAL_WORLD_SIZE", "0"))
    if launched:
        return launched
    c = config.async_
    return 1 + (c.local_workers if c.enable and c.max_staleness > 0 else 0)


def _uses_reference(config: Config) -> bool:
    """Whether the frozen initial policy is needed: a KL penalty (loss or reward), or the grad-SNR probe's KL."""
    g = config.grad_snr
    return config.algo.kl_coef > 0 or config.algo.kl_in_reward or (g.enable and g.kl_reference)


def kl_controller(config: Config) -> KLController | None:
    """The controller of `algo.kl_ctrl` at its starting beta, or None without `algo.kl_in_reward`."""
    a = config.algo
    if not a.kl_in_reward:
        return None
    return KLController(a.kl_reward_coef, a.kl_target if a.kl_ctrl == "adaptive" else None, a.kl_horizon)


def run_header(config: Config, run_dir: Path, device: torch.device) -> str:
    """The few lines a run starts with: what trains, on what, and where its files go (the rest is in config.yaml)."""
    f, r, m = config.filter, config.rollout, config.model
    filtering = "none" if f.strategy == "none" else f"{f.strategy} {f.value:g}"
    filtering += "" if f.include_zero else " (zero-variance groups dropped)"
    filtering += " over anchor states" if f.level == "anchor" else ""
    lora = f", LoRA rank {m.lora_rank}" if m.lora_rank > 0 else ""
    steps = (f"{_count(config.trainer.total_steps, 'step')} of {_count(r.num_groups, 'group')} x "
             f"{_count(r.group_size, 'episode')}")
    c = config.async_
    if c.enable and c.max_staleness > 0:
        steps += (f", asynchronous (a rollout worker, staleness <= {c.max_staleness}"
                  + (f", {c.oversample:g}x candidates" if c.oversample != 1 else "") + ")")
    return (f"run {run_dir}: {task_name(config)}, {config.algo.name}, filter {filtering}; "
            f"model {m.path or 'tiny (built-in)'}{lora} on {device}; {steps}\n"
            f"  config: {run_dir / 'config.yaml'} (printed with -v)")


def task_name(config: Config) -> str:
    """What the run trains on: env.name, the mixture's tags joined by `+`, or `agent:FILE:FUNCTION` for
    agent.entrypoint."""
    return agent_name(config.agent.entrypoint) if config.agent.entrypoint else label(config)


def _count(n: int, noun: str) -> str:
    """'1 step', '30 steps'."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _check_checkpoint_models(checkpoint: Checkpoint, config: Config) -> None:
    """Refuse a checkpoint whose policy (or critic) files are missing, truncated or corrupt, naming the
    file and the earlier checkpoint to resume from, as `load_checkpoint` does for trainer_state.pt."""
    fix = resume_fix(checkpoint.path.parent, checkpoint.step)
    lora = config.model.lora_rank > 0
    check_model_dir(checkpoint.path, f"checkpoint {checkpoint.path}", fix, tokenizer=not lora, adapter=lora)
    if checkpoint.critic_path is not None:
        check_model_dir(checkpoint.critic_path, f"checkpoint {checkpoint.path}'s critic", fix, tokenizer=False)


def _new_run_dir(config: Config) -> Path:
    """`trainer.run_dir`, or runs/<env>-<algo>-<time>; refuses a directory that already holds a run."""
    if config.trainer.run_dir:
        run_dir = Path(config.trainer.run_dir)
        if (run_dir / "metrics.jsonl").exists():
            raise ConfigError(
                f"trainer.run_dir={run_dir} already holds a run; continue it with "
                f"`ragen2 train --resume {run_dir}` or choose another directory"
            )
    else:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        env = re.sub(r"[^\w.-]", "_", task_name(config))  # textarena:Sudoku-v0 -> textarena_Sudoku-v0: a plain file name
        run_dir = Path("runs") / f"{env}-{config.algo.name}-{stamp}"
        n = 1
        while run_dir.exists():
            n += 1
            run_dir = Path("runs") / f"{env}-{config.algo.name}-{stamp}-{n}"
    run_dir.mkdir(parents=True, exist_ok=True)
    return run_dir


def load_trainable_policy(config: Config, device: torch.device, checkpoint) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The policy (from the checkpoint when resuming), with LoRA and gradient checkpointing as configured."""
    m = config.model
    try:
        if m.lora_rank > 0:
            base, tokenizer = load_policy(m.path, m.device, m.dtype)
            policy = add_lora(base, m.lora_rank, m.lora_alpha, list(m.lora_target_modules),
                              saved=checkpoint.path if checkpoint is not None else None)
        else:
            policy, tokenizer = load_policy(str(checkpoint.path) if checkpoint else m.path, m.device, m.dtype)
    except (OSError, ValueError) as e:
        if checkpoint is None:
            raise
        raise CheckpointError(f"checkpoint {checkpoint.path}: cannot load the policy ({type(e).__name__}: {e})") from e
    if m.gradient_checkpointing:
        policy.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    policy.to(device).train()
    return policy, tokenizer


def _reference_policy(config: Config, policy: PreTrainedModel, device: torch.device) -> PreTrainedModel:
    """The frozen initial policy the KL penalty pulls toward.

    Loaded from `model.path`, not copied from the policy, so a resumed run keeps the same
    reference. With LoRA the base weights are the reference: the adapter-free model.
    """
    if config.model.lora_rank > 0:
        return _AdapterFree(policy)
    reference, _ = load_policy(config.model.path, config.model.device, config.model.dtype)
    reference.to(device).eval().requires_grad_(False)
    return reference


class _AdapterFree(torch.nn.Module):
    """A LoRA policy seen with its adapters switched off: the frozen base model, without a copy."""

    def __init__(self, peft_model: torch.nn.Module):
        super().__init__()
        self.peft_model = peft_model

    def forward(self, **inputs):
        with self.peft_model.disable_adapter():
            return self.peft_model(**inputs)


def _restore(run: Run, checkpoint) -> None:
    state = checkpoint.state
    try:
        _load_optimizer_state(run, run.trainee, run.optimizer, state["optimizer"])
        if run.critic_optimizer is not None:
            _load_optimizer_state(run, run.critic, run.critic_optimizer, state["critic_optimizer"])
        set_rng_state(state["rng"])
        run.diagnostics.load_state_dict(state["diagnostics"])
        run.guards.load_state_dict(state.get("guards", {}))
        if run.kl_ctrl is not None:
            run.kl_ctrl.load_state_dict(state["kl_ctrl"])
    except (KeyError, ValueError, TypeError, RuntimeError) as e:
        raise CheckpointError(
            f"checkpoint {checkpoint.path}: its trainer state does not fit this run ({type(e).__name__}: {e})"
        ) from e
    run.step = run.saved_step = checkpoint.step
    run.skipped_in_a_row = int(state.get("skipped_in_a_row", 0))
    run.tracker.truncate_after(checkpoint.step)
    log.info("resumed from %s (step %d)", checkpoint.path, checkpoint.step)


def _load_optimizer_state(run: Run, model: torch.nn.Module | None, optimizer: torch.optim.Optimizer, state: dict) -> None:
    """A checkpoint's optimizer state into `optimizer`: re-sharded under FSDP (saved whole, keyed by name)."""
    if run.trainee is not None:
        fsdp.load_full_optimizer_state(model, optimizer, state)
    else:
        optimizer.load_state_dict(state)


