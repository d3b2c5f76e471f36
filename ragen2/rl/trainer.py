"""The RL training loop: the schedule of a step, its stop and interrupt handling.

One step is a list of named, timed phases (each logged as `timing_s/<phase>`), each in a module
of its own under ragen2/rl/, so the schedule below reads top to bottom:

    rollout    play P groups x G episodes with the current policy (rollout_stage.py)
    collapse   MI proxies of template collapse on the whole batch (ragen2.collapse.online); with a
               rollout worker, also on the groups of each staleness
    filter     keep the groups whose returns vary most (filter_stage.py over ragen2.filtering, RAGEN-2 §6)
    grad_snr   every `grad_snr.freq` steps when enabled: task / KL / entropy gradient
               norms per reward-variance bucket, no optimizer step (grad_snr.py)
    advantage  advantages of the kept groups only, so group baselines stay intact (with
               `algo.kl_in_reward`, the KL penalty in the rewards, then beta's update; advantage_stage.py)
    update     clipped policy-gradient epochs over mini-batches (+ the critic for PPO; update_stage.py)
    evaluate   held-out episodes every `trainer.eval_every` steps and at the end
    checkpoint every `trainer.save_every` steps and at the end (ragen2.rl.checkpoint)

A run's state and how it starts (run directory, models, optimizers, resume) live in
ragen2.rl.run; the end-of-run table in ragen2.rl.summary.

After the update and after an evaluation the early-stop guards (`early_stop.*`,
ragen2.rl.guards) read the step's metrics; one that fires ends the run after this step,
with a checkpoint and an `early_stop` event.

Reproducibility: all randomness of a step is drawn from seeds derived from
(`trainer.seed`, step): the environment seeds, each episode's sampling stream (torch's
global RNG for evaluation), and the mini-batch order. Nothing carries over from one step to the next
except the weights and optimizer state, which checkpoints hold, so a run resumed from a
checkpoint samples and updates exactly as the uninterrupted run would (bit for bit on CPU;
GPU kernels may differ in the last bits).

Asynchronous training (`async.enable`, `async.max_staleness` > 0; ragen2.rl.async_rollout): the
same step, with the rollout on a worker process that plays the steps ahead with weights at most
`async.max_staleness` updates old (docs/scaling.md).

Data parallelism: under `torchrun` or `accelerate launch` each process rolls out its share of
the groups and the phases run on the gathered batch, so N processes select the same groups,
log the same metrics and apply the same updates as one process with the same config, up to
float rounding (ragen2.rl.distributed, docs/scaling.md).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import logging
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import torch

from ragen2.agent import Trajectory
from ragen2.agent.backends import reuse_prefixes
from ragen2.agent.prefix_cache import PrefixStore
from ragen2.collapse.alarm import AlarmDecision
from ragen2.collapse.online import held_out_proxies
from ragen2.config import Config, validate
from ragen2.cpu_threads import callers_threads_restored
from ragen2.evaluate import evaluate, evaluate_agent, evaluate_mixture, write_rollout_records
from ragen2.filtering import loss_scale
from ragen2.mixture import eval_envs, is_mixture
from ragen2.models.loading import resolve_device
from ragen2.progress import Progress
from ragen2.rl import distributed, fsdp
from ragen2.rl.advantage_stage import advantage_phase, kl_control_phase
from ragen2.rl.async_rollout import candidates, launched_roles, rollout_worker, serve_rollouts
from ragen2.rl.checkpoint import mark_latest, save_checkpoint
from ragen2.rl.filter_stage import filter_phase
from ragen2.rl.grad_snr import grad_snr_probe, group_reward_variance
from ragen2.rl.rollout_stage import (
    agent_of,
    agent_sampling,
    backend_of,
    derived_seed,
    finite_sampling,
    group_staleness,
    push_weights,
    rollout_phase,
    save_training_samples,
    staleness_metrics,
    throughput_metrics,
)
from ragen2.rl.run import Run, setup
from ragen2.rl.summary import summary_table
from ragen2.rl.update_stage import loss_agg, norm_tokens, update_phase

log = logging.getLogger(__name__)


def train(config: Config, resume_dir: Path | None = None) -> str:
    """Train `config`'s policy on its environment; returns the summary table as text.

    With `resume_dir` the run continues from that directory's latest checkpoint, and the
    steps after the checkpoint are logged again (each step appears once in metrics.jsonl).
    Ctrl-C stops after writing a checkpoint of the last completed step, then re-raises
    KeyboardInterrupt. Under a multi-process launcher the processes train data-parallel
    (ragen2.rl.distributed); rank 0 returns the table, the others an empty string. Asynchronous
    runs there give the ranks of `async.rollout_ranks` to generation (ragen2.rl.async_rollout).
    """
    if os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true" and not config.model.fsdp:
        # `accelerate launch` with distributed_type: FSDP. Its other FSDP_* options are not read:
        # ragen2 shards every transformer block and the rest (docs/scaling.md).
        config = dataclasses.replace(config, model=dataclasses.replace(config.model, fsdp=True))
        validate(config)
    with distributed.process_group(resolve_device(config.model.device).type):
        roles = launched_roles(config)  # under a launcher, with async.rollout_ranks: who generates, who trains
        if roles is not None and not roles.trains:
            serve_rollouts(config, roles)
            return ""
        # setup chooses the run's torch threads (model.cpu_threads); the caller's come back after
        with distributed.role(roles.trainers) if roles is not None else contextlib.nullcontext(), \
                callers_threads_restored():
            run = setup(config, resume_dir)
            try:
                asynchronous = config.async_.enable and config.async_.max_staleness > 0
                with rollout_worker(run, roles) if asynchronous else contextlib.nullcontext():
                    _train_loop(run)
                return summary_table(run) if distributed.is_main() else ""
            finally:
                if run.agent is not None:
                    run.agent.close()
                if run.lock is not None:
                    run.lock.release()


def _train_loop(run: Run) -> None:
    total = run.config.trainer.total_steps
    show = run.config.logging.progress and distributed.is_main()
    interval = run.config.logging.progress_interval_s
    progress = Progress(total, show, start=run.step, interval_s=interval)
    with run.tracker, _Interrupts() as interrupts, progress:
        try:
            run.diagnostics_at_step = copy.deepcopy(run.diagnostics.state_dict())
            if run.step >= total and distributed.is_main():
                log.warning("%s finished at step %d: nothing left to train. To extend it: `ragen2 train --resume "
                            "%s trainer.total_steps=%d` (any number above %d)", run.run_dir, run.step, run.run_dir,
                            2 * total, run.step)
            if run.step == 0 and run.config.trainer.eval_every > 0:
                progress.doing("initial evaluation (step 0)")
                initial_evaluation(run)
            for step in range(run.step + 1, total + 1):
                if run.stop_reason:
                    break
                progress.doing(f"step {step}/{total}")
                metrics = training_step(run, step, interrupts)
                progress.update(
                    step,
                    reward=metrics["rollout/return_mean"],
                    success=metrics["rollout/success_rate"],
                    entropy=metrics.get("train/entropy"),
                    eval_success=metrics.get("eval/success_rate"),
                )
            if run.stop_reason:
                log.warning("stopped after step %d: %s", run.step, run.stop_reason)
        except KeyboardInterrupt:
            on_interrupt(run)
            raise


def training_step(run: Run, step: int, interrupts: _Interrupts) -> dict[str, float]:
    """One RL iteration, phase by phase; returns the metrics it logged for `step`.

    Two halves meet at the filter: `produce_groups` (rollout, or a rollout worker's finished groups with
    `async.*`, and the diagnostics) and `train_on_kept` (advantages, update, evaluation, checkpoint,
    logging). Both schedules run this same function; only where the groups come from differs.
    """
    timer = _PhaseTimer()
    trajectories, metrics = produce_groups(run, step, timer)
    with timer("filter"):
        kept, filter_metrics = filter_phase(run, trajectories)
    metrics |= filter_metrics
    if run.config.async_.enable:
        metrics |= staleness_metrics(kept, step)
    return train_on_kept(run, step, trajectories, kept, metrics, timer, interrupts)


def produce_groups(run: Run, step: int, timer: _PhaseTimer) -> tuple[list[Trajectory], dict[str, float]]:
    """The step's groups, every candidate the filter will rank, and their rollout and diagnostic metrics.

    Synchronous: `rollout_phase` here, with the current weights. Asynchronous (`run.rollouts`): the groups
    a rollout worker played for this step with weights at most `async.max_staleness` updates old;
    `timing_s/rollout` is then the time the trainer waited for them.
    """
    diagnosed = run.diagnostics.should_run(step)
    # On a diagnosed step the rollout's keys/values outlive it, up to the diagnostics: they score the
    # rollout's prompts from them instead of encoding them again. Closed before the weights change.
    keep = diagnosed and run.config.collapse.rollout_cache and run.rollouts is None
    with reuse_prefixes(backend_of(run), keep_finished=True) if keep else contextlib.nullcontext() as prefixes:
        with timer("rollout"):
            if run.rollouts is not None:
                trajectories, metrics = run.rollouts.take(step)
            else:
                trajectories, metrics = rollout_phase(run, step, candidates(run.config))
        save_training_samples(run, step, trajectories)
        if diagnosed:
            with timer("collapse"):
                metrics |= diagnose_phase(run, trajectories, step, prefixes)
    return trajectories, metrics


def train_on_kept(
    run: Run, step: int, trajectories: list[Trajectory], kept: list[Trajectory], metrics: dict[str, float],
    timer: _PhaseTimer, interrupts: _Interrupts,
) -> dict[str, float]:
    """The step from the filter's choice on: advantages and update of the kept groups (or a skipped step),
    the new weights to the rollout engines, guards, evaluation, checkpoint and the step's log line."""
    cfg = run.config.trainer
    diagnosed = run.diagnostics.should_run(step)
    if run.config.grad_snr.enable and step > 1 and step % run.config.grad_snr.freq == 0:  # step 1: policy = reference
        with timer("grad_snr"):
            metrics |= grad_snr_phase(run, trajectories)
    with interrupts.deferred():  # the weights change from here on: finish the step before stopping
        run.clean = False
        if kept:
            with timer("advantage"):
                batch = advantage_phase(run, kept)
                if run.kl_ctrl is not None:
                    metrics |= kl_control_phase(run, batch)
            scale = loss_scale(int(metrics["filter/kept_groups"]), run.config.rollout.num_groups,
                               run.config.filter.loss_scale)
            with timer("update"):
                metrics |= update_phase(run, batch, step, scale)
                push_weights(run, step)
            if math.isfinite(metrics["train/grad_norm"]):
                run.skipped_in_a_row = 0
            else:  # every policy optimizer step was dropped for a non-finite loss or gradient: no update
                skip_step(run, step, metrics, nonfinite=True)
        else:
            skip_step(run, step, metrics)
            push_weights(run, step)  # unchanged weights, but a waiting rollout worker may move on to the next version
        check_guards(run, step, metrics)
        run.stop_reason = distributed.broadcast_object(run.stop_reason)  # rank 0 decides: no rank stops alone
        last = step == cfg.total_steps or run.stop_reason is not None
        if cfg.eval_every > 0 and (step % cfg.eval_every == 0 or last):
            with timer("evaluate"):
                metrics |= evaluate_phase(run, step)
            check_guards(run, step, metrics)
        save = last or run.stop_reason is not None or (cfg.save_every > 0 and step % cfg.save_every == 0)
        if save:
            with timer("checkpoint"):
                checkpoint_phase(run, step)
        metrics |= timer.metrics() | {"system/peak_memory_mb": _peak_memory_mb(run.device)}
        if run.config.async_.enable:
            metrics |= throughput_metrics(len(trajectories) // run.config.rollout.group_size,
                                          int(metrics["filter/kept_groups"]), metrics["timing_s/step"])
        run.tracker.log(step, metrics)
        if save:  # only now, with the step's metrics on disk, may a resume start after it
            if distributed.is_main():
                mark_latest(run.run_dir, step)
            run.saved_step = step
        run.step, run.clean = step, True
        if diagnosed:  # only the diagnostics phase moves that state
            run.diagnostics_at_step = copy.deepcopy(run.diagnostics.state_dict())
    return metrics


# ----------------------------------------------------------------------------- phases


def diagnose_phase(
    run: Run, trajectories: list[Trajectory], step: int, prefixes: PrefixStore | None = None
) -> dict[str, float]:
    """MI proxies on the batch before filtering (they describe the policy that sampled it); with a rollout
    worker, also those of each staleness's groups alone, to show whether lag erodes input dependence."""
    lag = group_staleness(trajectories, step) if run.rollouts is not None else None
    result = run.diagnostics.step(run.policy, run.tokenizer, trajectories, step, prefixes, lag)
    if result.alarm is not None:
        collapse_alarm(run, result.alarm)
    return result.metrics


def grad_snr_phase(run: Run, trajectories: list[Trajectory]) -> dict[str, float]:
    """Gradient norms of the task, KL and entropy terms per RV bucket, on the *unfiltered* batch.

    The low-RV groups the filter drops are the point of the probe (SPEC §6): there the task
    gradient vanishes while the regularisers' does not. No optimizer step is taken.
    """
    cfg = run.config
    batch = advantage_phase(run, [t for t in trajectories if t.samples])
    return grad_snr_probe(
        run.policy,
        batch,
        group_reward_variance(trajectories, cfg.filter.ddof),
        reference=run.reference,
        kl_estimator=cfg.algo.kl_estimator,
        num_buckets=cfg.grad_snr.num_buckets,
        micro_batch_size=cfg.algo.micro_batch_size,
        agg=loss_agg(cfg),
        norm_tokens=norm_tokens(cfg),
        kl_coef=cfg.algo.kl_coef,
        entropy_coef=cfg.algo.entropy_coef,
    )


def evaluate_phase(run: Run, step: int) -> dict[str, float]:
    """Held-out episodes at `trainer.eval_temperature`; a few are written to rollouts/step_N.jsonl.

    With several processes rank 0 evaluates alone (the same episodes as one process) and the
    others receive its metrics.
    """
    return distributed.on_main(lambda: _evaluate(run, step))


def _evaluate(run: Run, step: int) -> dict[str, float]:
    cfg = run.config
    torch.manual_seed(derived_seed(cfg.trainer.seed, step, "evaluate"))
    rollout_cfg = dataclasses.replace(cfg.rollout, temperature=cfg.trainer.eval_temperature)
    with finite_sampling(run, step, "evaluation episodes"):
        if cfg.agent.entrypoint:
            metrics, trajectories = evaluate_agent(
                agent_of(run), cfg.trainer.eval_episodes, agent_sampling(cfg, cfg.trainer.eval_temperature),
                derived_seed(cfg.trainer.seed, step, "evaluate"),
            )
        elif is_mixture(cfg):
            metrics, trajectories = evaluate_mixture(
                run.policy, run.tokenizer, eval_envs(cfg), rollout_cfg, cfg.rollout.group_size
            )
            if cfg.collapse.enable:
                seed = derived_seed(cfg.trainer.seed, step, "collapse_eval")
                metrics |= held_out_proxies(run.policy, run.tokenizer, trajectories, cfg.collapse, seed)
        else:
            metrics, trajectories = evaluate(
                run.policy, run.tokenizer, cfg.env.name, cfg.env.kwargs, rollout_cfg, cfg.trainer.eval_episodes
            )
    write_rollout_records(
        run.run_dir / "rollouts" / f"step_{step}.jsonl", trajectories[: cfg.logging.sample_trajectories], run.tokenizer
    )
    return metrics


def checkpoint_phase(run: Run, step: int) -> None:
    """Rank 0 writes the checkpoint (every rank holds the same weights and optimizer state); the others wait.

    With FSDP the optimizer state is sharded: every rank first helps gather it whole on rank 0.
    """
    gathered: dict[str, dict] = {}
    if run.trainee is not None:
        gathered["optimizer"] = fsdp.full_optimizer_state(run.trainee, run.optimizer)
        if run.critic is not None:
            gathered["critic_optimizer"] = fsdp.full_optimizer_state(run.critic, run.critic_optimizer)
            gathered["critic_weights"] = fsdp.full_model_state(run.critic)
    distributed.on_main(lambda: _save(run, step, gathered))


def _save(run: Run, step: int, gathered: dict[str, dict] | None = None) -> None:
    """Write the checkpoint; `gathered` holds what FSDP shards, gathered whole by `checkpoint_phase`."""
    gathered = gathered or {}
    critic_optimizer = gathered.get("critic_optimizer") or (run.critic_optimizer.state_dict() if run.critic_optimizer else None)
    state = {
        "optimizer": gathered.get("optimizer") or run.optimizer.state_dict(),
        "critic_optimizer": critic_optimizer,
        "skipped_in_a_row": run.skipped_in_a_row,
        "diagnostics": run.diagnostics.state_dict(),
        "guards": run.guards.state_dict(),
    } | ({"kl_ctrl": run.kl_ctrl.state_dict()} if run.kl_ctrl is not None else {})
    save_checkpoint(run.run_dir, step, run.policy, run.tokenizer, run.config, state, run.critic,
                    gathered.get("critic_weights"))


def collapse_alarm(run: Run, alarm: AlarmDecision) -> None:
    """The template-collapse alarm fired: record it (the tracker prints it), and with `collapse.alarm=stop` end after this step."""
    run.tracker.log_event("collapse_alarm", alarm.message, alarm.step, **alarm.data)
    if alarm.stop:
        run.stop_reason = f"template-collapse alarm (collapse.alarm=stop): {alarm.message}"


def check_guards(run: Run, step: int, metrics: dict[str, float]) -> None:
    """Feed the step's metrics to the early-stop guards; the first one to fire ends the run after this step."""
    reason = run.guards.update(step, metrics)
    if reason and run.stop_reason is None:
        run.stop_reason = reason
        run.tracker.log_event("early_stop", reason, step)


def skip_step(run: Run, step: int, metrics: dict[str, float], nonfinite: bool = False) -> None:
    """Record a step without an update; stop the run after `trainer.max_skipped_steps` in a row.

    A step is skipped when filtering kept nothing to train on (event `skipped_step`), or, with
    `nonfinite`, when the loss or gradient was NaN or infinite in every policy optimizer step,
    so the update changed nothing (event `nonfinite_step`).
    """
    run.skipped_in_a_row += 1
    limit = run.config.trainer.max_skipped_steps
    if nonfinite:
        reason = "the loss or gradient was not finite in every optimizer step, so the weights did not change"
        run.tracker.log_event("nonfinite_step", f"step {step} skipped: {reason}", step)
        if run.skipped_in_a_row >= limit:
            run.stop_reason = (
                f"{limit} consecutive steps were skipped (the last: {reason}). Lower optim.lr "
                f"(now {run.config.optim.lr:g}), keep optim.grad_clip > 0 (now {run.config.optim.grad_clip:g}), "
                "or look for NaN rewards in the environment."
            )
            run.tracker.log_event("early_stop", run.stop_reason, step)
        return
    zero, f = metrics["rollout/frac_zero_variance"], run.config.filter
    if not metrics["filter/kept_groups"]:
        reason = (
            f"no group kept: {zero:.0%} of the {candidates(run.config)} groups have zero reward variance "
            f"(std <= filter.zero_tol={f.zero_tol})"
            + ("" if zero == 1 else f", and filter.strategy={f.strategy} kept none of the others"
               + (f" (top_p keeps none when filter.value x their summed score <= filter.selection_eps="
                  f"{f.selection_eps})" if f.strategy == "top_p" else ""))
        )
    else:
        reason = "no kept group has a training sample"
    run.tracker.log_event("skipped_step", f"step {step} skipped: {reason}", step)
    if run.skipped_in_a_row >= limit:
        run.stop_reason = (
            f"{limit} consecutive steps had nothing to train on ({reason}). Every rollout of a seed gets "
            "the same return: the task is solved or out of reach. Try filter.include_zero=true, a larger "
            "rollout.group_size or a higher rollout.temperature."
        )
        run.tracker.log_event("early_stop", run.stop_reason, step)


def initial_evaluation(run: Run) -> None:
    """Evaluate the starting policy as step 0, so learning shows against it."""
    start = time.perf_counter()
    metrics = evaluate_phase(run, 0)
    run.tracker.log(0, metrics | {"timing_s/evaluate": time.perf_counter() - start})
    check_guards(run, 0, metrics)


def on_interrupt(run: Run) -> None:
    """Ctrl-C: checkpoint the last completed step unless a step was cut off mid-update."""
    if not run.clean:
        log.warning("aborted inside step %d's update: no checkpoint written (latest: step %d)", run.step + 1, run.saved_step)
        return
    if run.step > run.saved_step and run.trainee is not None:
        log.warning("interrupted: with model.fsdp the optimizer state is sharded and gathering it needs every "
                    "process, so the latest checkpoint (step %d) stands", run.saved_step)
    elif run.step > run.saved_step:
        if run.diagnostics_at_step is not None:  # undo the cut-off step's check, which a resume redoes
            run.diagnostics.load_state_dict(run.diagnostics_at_step)
        if distributed.is_main():  # no collective here: the other ranks may be stopped anywhere
            _save(run, run.step)
            mark_latest(run.run_dir, run.step)
        run.saved_step = run.step
    where = f"checkpoint at step {run.saved_step}" if run.saved_step else "no checkpoint yet"
    run.tracker.log_event("interrupted", f"interrupted after step {run.step}; {where}", run.step)
    if run.saved_step:
        log.warning("interrupted: resume with `ragen2 train --resume %s`", run.run_dir)


# ----------------------------------------------------------------------------- helpers


def _peak_memory_mb(device: torch.device) -> float:
    """Peak accelerator memory of the step on CUDA; peak resident memory of the process on CPU."""
    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(device) / 2**20
        torch.cuda.reset_peak_memory_stats(device)
        return peak
    import resource  # POSIX only

    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / 2**20 if sys.platform == "darwin" else rss / 2**10  # bytes on macOS, KiB on Linux


class _PhaseTimer:
    """`with timer("rollout"): ...` records the phase's wall time as timing_s/rollout."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[phase] = time.perf_counter() - t0

    def metrics(self) -> dict[str, float]:
        return {f"timing_s/{k}": v for k, v in self.seconds.items()} | {"timing_s/step": time.perf_counter() - self.start}


class _Interrupts:
    """Ctrl-C that never leaves a half-updated step behind.

    Outside `deferred()` Ctrl-C raises KeyboardInterrupt at once: the weights are still those
    of the last completed step, which the trainer then checkpoints. Inside it (update through
    logging, where the weights change) the first Ctrl-C is held until the step is complete
    and logged; a second one aborts at once, without a checkpoint. SIGTERM (`kill`, a batch
    scheduler's preemption notice) is handled the same way. Signal handlers can only be set
    from the main thread; elsewhere both keep Python's default behaviour.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self.pending = False
        self._deferring = False
        self._previous: dict[int, object] = {}

    def __enter__(self) -> _Interrupts:
        if threading.current_thread() is threading.main_thread():
            self._previous = {s: signal.signal(s, self._handle) for s in self.SIGNALS}
        return self

    def __exit__(self, *exc) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)

    def _handle(self, signum, frame) -> None:
        if self._deferring and not self.pending:
            self.pending = True
            log.warning("Ctrl-C: finishing the current step, then checkpointing; press Ctrl-C again to abort now")
            return
        raise KeyboardInterrupt

    @contextlib.contextmanager
    def deferred(self) -> Iterator[None]:
        self._deferring = True
        try:
            yield
        finally:
            self._deferring = False
        if self.pending:
            raise KeyboardInterrupt
