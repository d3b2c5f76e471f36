"""The RL training loop: multi-turn rollouts, SNR-aware filtering and a PPO-style update.

One step is a list of named, timed phases (each logged as `timing_s/<phase>`):

    rollout    play P groups x G episodes with the current policy (ragen2.agent.rollout)
    collapse   MI proxies of template collapse on the whole batch (ragen2.collapse.online); with a
               rollout worker, also on the groups of each staleness
    filter     keep the groups whose returns vary most (ragen2.filtering, RAGEN-2 §6)
    grad_snr   every `grad_snr.freq` steps when enabled: task / KL / entropy gradient
               norms per reward-variance bucket, no optimizer step (ragen2.collapse.grad_snr)
    advantage  advantages of the kept groups only, so group baselines stay intact (with
               `algo.kl_in_reward`, the KL penalty in the rewards, then beta's update)
    update     clipped policy-gradient epochs over mini-batches (+ the critic for PPO)
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
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn.functional as F

from ragen2.agent import GenerationBackend, HFBackend, RolloutStats, Trajectory, group_seeds, rollout, summarize
from ragen2.agent.backends import reuse_prefixes
from ragen2.agent.prefix_cache import PrefixStore
from ragen2.agent.rollout import stable_seed
from ragen2.agent.vllm_backend import VLLMBackend
from ragen2.cpu_threads import callers_threads_restored
from ragen2.collapse.alarm import AlarmDecision
from ragen2.collapse.grad_snr import grad_snr_probe, group_reward_variance
from ragen2.collapse.online import held_out_proxies
from ragen2.collapse.turn_signal import turn_signal_metrics
from ragen2.config import Config, FilterConfig, validate
from ragen2.envs import EVAL_SEED_OFFSET
from ragen2.errors import ConfigError, DivergedError
from ragen2.evaluate import evaluate, evaluate_agent, evaluate_mixture, write_rollout_records
from ragen2.filtering import (
    group_scores,
    group_stats,
    loss_scale,
    select_anchor_turns,
    select_groups,
    select_groups_by_tag,
    select_trajectories,
)
from ragen2.mixture import eval_envs, is_mixture, per_group, tagged_metrics, training_envs
from ragen2.models.loading import resolve_device
from ragen2.progress import Progress
from ragen2.rl import distributed, fsdp
from ragen2.rl.async_rollout import candidates, launched_roles, rollout_worker, serve_rollouts
from ragen2.rl.advantages import (
    bi_level_gae,
    broadcast_to_tokens,
    drgrpo_advantages,
    gae_advantages,
    gigpo_advantages,
    grpo_advantages,
    length_weighted,
    normalize_returns,
    place_terminal_reward,
    reinforce_pp_advantages,
    reinforce_pp_baseline_advantages,
    rloo_advantages,
    soft_reweight_weights,
    turn_ends,
    turn_values_to_tokens,
)
from ragen2.rl.batch import Batch, build_batch, response_logits
from ragen2.rl.checkpoint import mark_latest, save_checkpoint
from ragen2.rl.critic import critic_values
from ragen2.rl.kl_control import kl_reward_penalty, mean_sequence_kl
from ragen2.rl.losses import (
    aggregate,
    entropy_from_logits,
    kl_penalty,
    policy_loss,
    rollout_correction,
    token_logprobs,
    token_logprobs_and_entropy,
    value_loss,
)
from ragen2.rl.run import Run, setup
from ragen2.rl.summary import summary_table
from ragen2.serve.batcher import Sampling

if TYPE_CHECKING:
    from ragen2.serve.agent_loop import AgentRunner

log = logging.getLogger(__name__)

# Loss aggregation each algorithm uses when `algo.loss_agg` is null (docs/algorithms.md).
DEFAULT_LOSS_AGG = {
    "ppo": "token-mean",
    "grpo": "token-mean",
    "drgrpo": "seq-mean-token-sum",
    "dapo": "token-mean",
    "rloo": "token-mean",
    "reinforce_pp": "token-mean",
    "reinforce_pp_baseline": "token-mean",
    "gigpo": "token-mean",
}

# Outcome estimators: one advantage per trajectory from its return and its group's returns.
OUTCOME_ADVANTAGES = {
    "grpo": grpo_advantages,
    "dapo": grpo_advantages,
    "drgrpo": drgrpo_advantages,
    "rloo": rloo_advantages,
}

# What groups episodes for reward normalisation (`algo.reward_norm_grouping`; RAGEN's group_id, tag, one batch).
REWARD_NORM_GROUPING = {
    "state": lambda t: t.group_id,
    "inductive": lambda t: t.env_name,
    "batch": lambda t: None,
}


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


def rollout_phase(
    run: Run, step: int, num_groups: int | None = None, version: int | None = None,
    newest_weights: Callable[[], int] | None = None,
) -> tuple[list[Trajectory], dict[str, float]]:
    """P x G episodes on training seeds; group g is G episodes of one environment seed.

    Every episode samples from its own stream, seeded by (trainer.seed, step, its index in
    the batch), so with several processes each rolls out its block of groups and the
    gathered batch is the one a single process would have sampled. A rollout worker
    (ragen2.rl.async_rollout) plays `num_groups` candidates instead of rollout.num_groups
    (async.oversample) with weights of `version` (default: those the step's own update starts from), or
    with partial rollouts (`newest_weights`, see `ragen2.agent.rollout.rollout`) with the newest weights at
    each turn: an episode then counts as the version of its first turn.
    """
    cfg = run.config
    P, G = num_groups or cfg.rollout.num_groups, cfg.rollout.group_size
    base = derived_seed(cfg.trainer.seed, step, "env") % (EVAL_SEED_OFFSET - P)  # below the held-out seeds
    seeds, group_ids = group_seeds(base, P, G)
    sample_seeds = [derived_seed(cfg.trainer.seed, step, f"sample/{i}") for i in range(P * G)]
    group_envs = per_group(training_envs(cfg, P))  # [P]: group g plays group_envs[g]
    episode_envs = [group_envs[g] for g in group_ids]
    groups = distributed.group_range(P)
    mine = slice(groups.start * G, groups.stop * G)  # this rank's episodes, group-major
    torch.manual_seed(derived_seed(cfg.trainer.seed, step, "rollout"))
    stats = RolloutStats()
    with _finite_sampling(run, step, "training rollouts"):
        if cfg.agent.entrypoint:
            sampling = agent_sampling(cfg, cfg.rollout.temperature)
            trajectories = agent_of(run).play(seeds[mine], group_ids[mine], sample_seeds[mine], sampling, stats)
        else:
            trajectories = rollout(
                backend_of(run), run.tokenizer, cfg.env.name, cfg.env.kwargs, seeds[mine], group_ids[mine],
                cfg=cfg.rollout, stats=stats, sample_seeds=sample_seeds[mine], episode_envs=episode_envs[mine],
                newest_weights=newest_weights,
            )
    fixed = step - 1 if version is None else version  # the steps whose updates made the weights
    for t in trajectories:
        if newest_weights is None:
            for turn in t.turns:
                turn.policy_version = fixed
        t.policy_version = min((turn.policy_version for turn in t.turns), default=fixed)
    trajectories = distributed.gather_objects(trajectories)  # all P x G, in group order, on every rank
    metrics = rollout_metrics(trajectories) | turn_signal_metrics(trajectories, cfg.algo.gamma) | {
        "timing_s/generate": stats.generate_s,
    }
    if is_mixture(cfg):
        metrics |= tagged_metrics(rollout_metrics, trajectories, [t.tag for t in trajectories])
    return trajectories, metrics


def rollout_metrics(trajectories: list[Trajectory]) -> dict[str, float]:
    """`summarize`'s rates and means, and the spread of the episode returns."""
    return summarize(trajectories) | {"rollout/return_std": float(np.std([t.episode_return for t in trajectories]))}


def save_training_samples(run: Run, step: int, trajectories: list[Trajectory]) -> None:
    """Every `logging.sample_every` steps rank 0 writes `logging.sample_trajectories` of the step's training
    episodes, rewards included, to rollouts/train_step_N.jsonl.

    They are taken one group at a time (episode 0 of each group, then episode 1, ...) so that a few samples
    cover several inputs, as `ragen2 diagnose` needs. Nothing here draws a random number: the run trains
    the same with or without it. Every rank holds the gathered batch, so no collective is needed.
    """
    every = run.config.logging.sample_every
    if every == 0 or step % every or not distributed.is_main():
        return
    G = run.config.rollout.group_size
    order = sorted(range(len(trajectories)), key=lambda i: (i % G, i // G))
    picked = [trajectories[i] for i in order[: run.config.logging.sample_trajectories]]
    write_rollout_records(run.run_dir / "rollouts" / f"train_step_{step}.jsonl", picked, run.tokenizer)


def backend_of(run: Run) -> GenerationBackend:
    """The run's rollout engine, made on first use."""
    run.backend = run.backend or make_backend(run)
    return run.backend


def agent_of(run: Run) -> AgentRunner:
    """`agent.entrypoint`'s endpoint and function, started on first use (closed when `train` returns)."""
    from ragen2.serve.agent_loop import AgentRunner  # the web server's packages are the `agents` extra

    run.agent = run.agent or AgentRunner(backend_of(run), run.tokenizer, run.config.rollout, run.config.agent)
    return run.agent


def agent_sampling(config: Config, temperature: float) -> Sampling:
    """How an agent loop's calls sample: the run's settings at `temperature`, whatever the request asks, so the
    recorded log-probs are of the distribution the update assumes."""
    r = config.rollout
    return Sampling(r.max_tokens_per_turn, temperature, r.top_p, r.top_k)


def make_backend(run: Run) -> GenerationBackend:
    """The engine of `rollout.backend`: `generate` on the policy itself, or a vLLM engine holding a copy of its weights.

    Agent loops (`agent.entrypoint`) end a completion at the end-of-turn token only: their replies are chat
    messages, not `<answer>` blocks.
    """
    r = run.config.rollout
    if run.config.agent.entrypoint:
        return HFBackend(run.policy, run.tokenizer, stop_strings=(), prefix_reuse=r.prefix_reuse)
    if r.backend == "vllm":
        return VLLMBackend(
            run.policy, run.tokenizer, gpu_memory_utilization=r.vllm_gpu_memory_utilization, seed=run.config.trainer.seed
        )
    return HFBackend(run.policy, run.tokenizer, prefix_reuse=r.prefix_reuse)


def push_weights(run: Run, step: int) -> None:
    """After step `step`, a vLLM engine gets the new weights, so the next rollout samples the policy being
    trained; with a rollout worker (async), they are sent to it as version `step`."""
    if isinstance(run.backend, VLLMBackend):
        run.backend.load_weights(run.policy)
    if run.rollouts is not None:
        run.rollouts.push(step)


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


def filter_phase(run: Run, trajectories: list[Trajectory]) -> tuple[list[Trajectory], dict[str, float]]:
    """SNR-aware filtering: keep whole groups, ranked by reward variance (or `filter.metric`), and with
    `filter.trajectory_keep` < 1 only the most spread-out episodes of each (trajectory-level filtering);
    with `filter.level=anchor`, GiGPO's anchor-state groups instead of prompt groups (`anchor_filter`)."""
    f, G = run.config.filter, run.config.rollout.group_size
    P = len(trajectories) // G  # rollout.num_groups, or more candidates with async.oversample
    rewards = np.array([t.episode_return for t in trajectories]).reshape(P, G)  # [P, G], group-major
    tags = [t.tag for t in trajectories[::G]]  # [P], each group's tag
    metrics = {f"rollout/{k}": v for k, v in group_stats(rewards, f.ddof, f.zero_tol).items()}
    if f.level == "anchor":
        kept_trajectories, metrics["filter/kept_turn_ratio"] = anchor_filter(run, trajectories)
        kept = {t.group_id for t in kept_trajectories}
    else:
        scores = _measured_scores(run, trajectories, f.metric)  # [P, G] for length / entropy, else None
        rule = dict(strategy=f.strategy, value=f.value, metric=f.metric, include_zero=f.include_zero, ddof=f.ddof,
                    order=f.order, selection_eps=f.selection_eps, zero_tol=f.zero_tol)
        if f.scope == "tag":
            kept_groups = select_groups_by_tag(rewards, tags, scores, **rule)
        else:
            kept_groups = select_groups(rewards, scores=scores, **rule)
        kept = set(best_groups(kept_groups, group_scores(rewards, f.metric, f.ddof, scores), f.order,
                               run.config.rollout.num_groups).tolist())
        spread = select_trajectories(rewards, f.trajectory_keep).reshape(-1)  # [P*G]; all True at trajectory_keep=1
        kept_trajectories = [t for t, keep in zip(trajectories, spread) if keep and t.group_id in kept and t.samples]
    metrics |= {
        "filter/kept_ratio": len(kept) / P,
        "filter/kept_groups": float(len(kept)),
        "filter/skipped": float(not kept),
    }
    if is_mixture(run.config):
        metrics |= tagged_metrics(lambda ids: _group_metrics(rewards[ids], ids, kept, f), range(P), tags)
    return kept_trajectories, metrics


def best_groups(kept: np.ndarray, scores: np.ndarray, order: str, limit: int) -> np.ndarray:
    """At most `limit` of the groups the filter `kept`, its best by `scores` (ties: the lower index),
    ascending: with async.oversample the filter ranks more candidates than a step trains on."""
    if len(kept) <= limit:
        return kept
    rank = np.argsort(-scores[kept] if order == "largest" else scores[kept], kind="stable")
    return np.sort(kept[rank[:limit]])


def throughput_metrics(candidates: int, kept: int, seconds: float) -> dict[str, float]:
    """`async/`: groups per second of the step's wall time, every candidate (raw) and those the filter kept
    (useful); with a rollout worker the step's time is the trainer's, generation overlapping it."""
    return {"async/candidate_groups": float(candidates), "async/groups_per_s": candidates / seconds,
            "async/kept_groups_per_s": kept / seconds}


def staleness_metrics(kept: list[Trajectory], step: int) -> dict[str, float]:
    """`async/`: how many updates old the policy that sampled each kept episode is when step `step` trains on
    it (0 in the synchronous schedule): mean, max and the share at each staleness up to 4; and the share of
    episodes whose turns came from more than one version (partial rollouts)."""
    lag = np.array([staleness(t, step) for t in kept]) if kept else np.zeros(1)
    mixed = [len({turn.policy_version for turn in t.turns}) > 1 for t in kept]
    return {"async/staleness_mean": float(lag.mean()), "async/staleness_max": float(lag.max())} | {
        f"async/staleness_frac_{k}": float((lag == k).mean()) for k in range(5)
    } | {"async/mixed_version_frac": float(np.mean(mixed)) if mixed else 0.0}


def staleness(trajectory: Trajectory, step: int) -> int:
    """Updates between the policy that sampled `trajectory` and the one step `step` updates."""
    return step - 1 - trajectory.policy_version


def group_staleness(trajectories: list[Trajectory], step: int) -> dict[int, int]:
    """Each group's staleness (group id -> updates): that of its stalest episode. A group is played by one
    rollout with one version, so its episodes agree; were they mixed, it would count as its oldest."""
    lag: dict[int, int] = {}
    for t in trajectories:
        lag[t.group_id] = max(lag.get(t.group_id, 0), staleness(t, step))
    return lag


def _group_metrics(rewards: np.ndarray, ids: list[int], kept: set[int], f: FilterConfig) -> dict[str, float]:
    """One tag's reward-variance statistics and kept ratio; rewards [p, G] of its groups `ids`."""
    stats = {f"rollout/{k}": v for k, v in group_stats(rewards, f.ddof, f.zero_tol).items()}
    return stats | {"filter/kept_ratio": len(kept.intersection(ids)) / len(ids)}


def anchor_filter(run: Run, trajectories: list[Trajectory]) -> tuple[list[Trajectory], float]:
    """`filter.level=anchor`: the filter's rules over GiGPO's anchor-state groups (`select_anchor_turns`).

    Returns every episode of each group that kept a turn, as copies whose `trained_turns` name the
    kept turns (the others stay in for GiGPO's episode-level baseline, and train on nothing), and
    the share of the batch's turns kept.
    """
    f, a = run.config.filter, run.config.algo
    keep = select_anchor_turns(
        [[turn.reward for turn in t.turns] for t in trajectories], [t.group_id for t in trajectories],
        [[turn.observation for turn in t.turns] for t in trajectories], a.gamma, f.strategy, f.value, f.metric,
        f.include_zero, f.ddof, f.order, selection_eps=f.selection_eps, zero_tol=f.zero_tol,
    )
    groups = {t.group_id for t, k in zip(trajectories, keep) if k.any()}
    kept = [dataclasses.replace(t, trained_turns=k.tolist())
            for t, k in zip(trajectories, keep) if t.group_id in groups and t.samples]
    turns = sum(len(k) for k in keep)
    return kept, sum(int(k.sum()) for k in keep) / turns if turns else 0.0


def advantage_phase(run: Run, kept: list[Trajectory]) -> Batch:
    """Pad the kept trajectories into a Batch and attach advantages (and PPO's value targets).

    In RAGEN's order (docs/algorithms.md): returns normalised within their groups, the estimator,
    soft reweighting by group std, length weighting, `algo.task_advantage_scale`.
    """
    a = run.config.algo
    batch = build_batch(kept, run.tokenizer.pad_token_id).to(run.device)
    if a.kl_in_reward:  # the policy that sampled the batch and the reference, for the KL in the reward
        with torch.no_grad():
            batch.old_logp = _in_micro_batches(lambda mb: _logprobs(run.policy, mb), batch, a.micro_batch_size)
            batch.ref_logp = _in_micro_batches(lambda mb: _logprobs(run.reference, mb), batch, a.micro_batch_size)
    # Per trajectory, not per sequence: with one sequence per turn, a long episode must
    # not weigh more in its group's baseline.
    returns = torch.tensor([t.episode_return for t in kept], device=run.device)  # [N]
    groups = torch.tensor([t.group_id for t in kept], device=run.device)  # [N]
    if a.reward_norm_method != "identity":
        keys = [REWARD_NORM_GROUPING[a.reward_norm_grouping](t) for t in kept]
        returns = normalize_returns(returns, keys, a.reward_norm_method)
        batch.returns = returns[batch.traj_index]  # what the token-reward estimators read
    if a.name == "ppo":
        with torch.no_grad():
            batch.old_values = _in_micro_batches(
                lambda mb: critic_values(run.critic, mb.input_ids), batch, a.micro_batch_size,
                lockstep=run.trainee is not None,  # with FSDP the critic is sharded too
            )
        token_rewards, values = _token_rewards(run, kept, batch), batch.old_values
        if a.bi_level_gae:
            advantages, batch.value_targets = bi_level_gae(token_rewards, values, batch.mask, a.gamma, a.lam,
                                                           a.high_level_gamma)
        else:
            advantages, batch.value_targets = gae_advantages(token_rewards, values, batch.mask, a.gamma, a.lam)
    elif a.name == "reinforce_pp":
        advantages = reinforce_pp_advantages(_token_rewards(run, kept, batch), batch.mask, a.gamma)
    elif a.name == "gigpo":  # one advantage per turn: anchor states are the observations each turn saw
        per_turn = gigpo_advantages(
            [[turn.reward for turn in t.turns] for t in kept], [t.group_id for t in kept],
            [[turn.observation for turn in t.turns] for t in kept], gamma=a.gamma, step_weight=a.gigpo_step_weight,
            mode=a.gigpo_mode, episode_stats=a.gigpo_episode_stats,
        )
        advantages = turn_values_to_tokens(per_turn, batch.traj_index, batch.mask)  # [B, T-1]
    elif a.name == "reinforce_pp_baseline":
        advantages = reinforce_pp_baseline_advantages(returns, groups, batch.mask, batch.traj_index)
    else:
        per_trajectory = OUTCOME_ADVANTAGES[a.name](returns, groups)  # [N]
        advantages = broadcast_to_tokens(per_trajectory[batch.traj_index], batch.mask)  # [B, T-1]
    if a.soft_advantage_reweight:
        advantages = advantages * soft_reweight_weights(returns, groups)[batch.traj_index, None]
    if a.grpo_advantage_length_weight:
        advantages = length_weighted(advantages, batch.mask)
    batch.advantages = a.task_advantage_scale * advantages
    if any(t.trained_turns is not None for t in kept):
        batch = kept_turns_only(kept, batch)
    return batch


def kept_turns_only(kept: list[Trajectory], batch: Batch) -> Batch:
    """`filter.level=anchor`: the batch with the turns the filter dropped masked out, after the advantages
    (their turns still counted in GiGPO's baselines), and without the rows left with no trained token."""
    flags = [[float(k) for k in (t.trained_turns or [True] * len(t.turns))] for t in kept]
    trained = turn_values_to_tokens(flags, batch.traj_index, batch.mask)  # [B, T-1], 1 on kept turns' tokens
    batch.mask, batch.advantages = batch.mask * trained, batch.advantages * trained
    return batch.select(batch.mask.any(dim=1).nonzero().squeeze(1))


def _token_rewards(run: Run, kept: list[Trajectory], batch: Batch) -> torch.Tensor:
    """[B, T-1]: each turn's reward on its last model token (algo.turn_rewards), else each row's return on its last;
    with `algo.kl_in_reward`, minus beta x the KL to the reference on every model token."""
    a = run.config.algo
    if a.turn_rewards:
        per_turn = [[turn.reward for turn in t.turns] for t in kept]
        rewards = turn_values_to_tokens(per_turn, batch.traj_index, batch.mask) * turn_ends(batch.mask)
    else:
        rewards = place_terminal_reward(batch.returns, batch.mask)
    if a.kl_in_reward:
        rewards = kl_reward_penalty(rewards, batch.old_logp, batch.ref_logp, batch.mask, run.kl_ctrl.value,
                                    a.kl_estimator)
    return rewards


def kl_control_phase(run: Run, batch: Batch) -> dict[str, float]:
    """`algo.kl_in_reward`: log the beta this step's rewards used and the batch's mean KL, then let the
    controller move beta for the next step (verl's `apply_kl_penalty` order)."""
    a = run.config.algo
    kl = mean_sequence_kl(batch.old_logp, batch.ref_logp, batch.mask, a.kl_estimator)
    metrics = {"train/reward_kl": kl, "train/reward_kl_coef": run.kl_ctrl.value}
    run.kl_ctrl.update(kl, len(batch))
    return metrics


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
        agg=_loss_agg(cfg),
        norm_tokens=_norm_tokens(cfg),
        kl_coef=cfg.algo.kl_coef,
        entropy_coef=cfg.algo.entropy_coef,
    )


def update_phase(run: Run, batch: Batch, step: int, scale: float) -> dict[str, float]:
    """`algo.ppo_epochs` passes over `batch` in shuffled mini-batches, one optimizer step each.

    `scale` multiplies the actor loss (`filter.loss_scale`). Returns `train/...` metrics:
    means over the optimizer steps, and the count of steps skipped for a non-finite value.
    """
    a, cfg = run.config.algo, run.config
    correcting = a.rollout_is is not None or a.rollout_rs is not None
    if correcting and batch.rollout_logp is None:
        raise ConfigError("algo.rollout_is / algo.rollout_rs need the behaviour log-probs of every sampled token, "
                          "and this rollout did not record them (a backend or agent loop without log-probs): set "
                          "both to null")
    # The policy before this update, the denominator of the PPO ratio. Until the first optimizer step
    # nothing has changed, so the first mini-batch's own forward pass gives its rows' log-probs (detached,
    # in `policy_step`, which makes their importance weights there too) and a pass before it gives only
    # the other rows'; with one epoch of one mini-batch that pass is saved. Rejection (algo.rollout_rs)
    # changes the mask, and with it the loss's token counts, before the loss: it needs every row's first.
    order = torch.Generator().manual_seed(derived_seed(cfg.trainer.seed, step, "minibatch"))
    epochs = [torch.randperm(len(batch), generator=order).to(run.device) for _ in range(a.ppo_epochs)]
    own_first = batch.old_logp is None and a.rollout_rs is None
    with torch.no_grad():
        if batch.old_logp is None:
            old_logp = _logprobs_of_rows(run.policy, batch, epochs[0][a.mini_batch_size:] if own_first else epochs[0],
                                         a.micro_batch_size)
            batch.old_logp = None if own_first else old_logp
        if a.kl_coef > 0 and batch.ref_logp is None:  # algo.kl_in_reward computed it already
            batch.ref_logp = _in_micro_batches(lambda mb: _logprobs(run.reference, mb), batch, a.micro_batch_size)
        correction = off_policy_correction(run, batch) if correcting and batch.old_logp is not None else {}
    factor = lr_factor(step, cfg.optim.warmup_steps, cfg.optim.schedule, cfg.trainer.total_steps)
    _set_lr(run.optimizer, cfg.optim.lr * factor)
    if run.critic_optimizer is not None:
        _set_lr(run.critic_optimizer, a.critic_lr * factor)
    history: dict[str, list[float]] = defaultdict(list)
    for permutation in epochs:
        for rows in permutation.split(a.mini_batch_size):
            mini = batch.select(rows)
            stats = policy_step(run, mini, scale)
            if batch.old_logp is None:  # the first mini-batch: its log-probs complete the old ones
                with torch.no_grad():
                    old_logp[rows, : mini.old_logp.shape[1]] = mini.old_logp
                    batch.old_logp = old_logp
                    if correcting:
                        correction = off_policy_correction(run, batch)
            if run.critic is not None:
                critic_stats = critic_step(run, mini)
                stats["value_loss"] = critic_stats["value_loss"]
                stats["skipped_nonfinite"] += critic_stats["skipped_nonfinite"]
            for key, value in stats.items():
                history[key].append(value)
    skipped = sum(history.pop("skipped_nonfinite"))
    if skipped:
        run.tracker.log_event(
            "skipped_nonfinite", f"{skipped:.0f} optimizer step(s) skipped: loss or gradient not finite", step
        )
    if run.trainee is not None:
        fsdp.sync_replica(run.trainee, run.policy)
    metrics = {f"train/{key}": _finite_mean(values) for key, values in history.items()} | correction
    return metrics | {"train/lr": cfg.optim.lr * factor, "train/skipped_nonfinite": float(skipped)}


def off_policy_correction(run: Run, batch: Batch) -> dict[str, float]:
    """`algo.rollout_is` / `algo.rollout_rs`: importance weights and rejection of the batch, from the policy
    before this update against the behaviour log-probs recorded at sampling (verl's order: once per step,
    before the mini-batches). Sets `batch.is_weights` and narrows `batch.mask`; returns `rollout_corr/...`."""
    a = run.config.algo
    weights, mask = rollout_correction(
        batch.old_logp, batch.rollout_logp, batch.mask, a.rollout_is, a.rollout_is_threshold, a.rollout_rs,
        a.rollout_rs_threshold, a.rollout_rs_threshold_lower,
    )
    valid = batch.mask.bool()
    tokens = valid.sum().clamp_min(1)
    metrics = {
        "rollout_corr/kl": float((batch.rollout_logp - batch.old_logp)[valid].sum() / tokens),
        "rollout_corr/rejected_frac": float((batch.mask - mask).sum() / tokens),
    }
    if weights is not None:
        metrics |= {
            "rollout_corr/is_weight_mean": float(weights[valid].sum() / tokens),
            "rollout_corr/is_weight_max": float(weights[valid].max()) if valid.any() else 0.0,
            "rollout_corr/is_truncated_frac": float((weights[valid] >= a.rollout_is_threshold).sum() / tokens),
        }
    batch.mask, batch.is_weights = mask, weights
    return metrics


def policy_step(run: Run, mini: Batch, scale: float) -> dict[str, float]:
    """One actor optimizer step on a mini-batch, accumulating gradients over micro-batches.

    Every micro-batch loss is normalised by the *mini-batch's* token and sequence counts, so
    the accumulated gradient is that of the whole mini-batch's aggregated loss, not a mean of
    per-micro-batch means. With several processes each computes its rows of the mini-batch
    (`distributed.my_rows`) and the gradients and statistics are summed over processes, which
    by the same normalisation gives the whole mini-batch's (with FSDP, the sharded model sums
    them itself, and ranks with fewer rows run passes that add nothing, to keep in lockstep).
    A non-finite loss or gradient norm skips the step: gradients are dropped and the weights
    and optimizer state stay as they were. Without `mini.old_logp` (an update's first mini-batch, see
    `update_phase`) the step's own log-probs, detached, are the policy before it: their importance
    weights (algo.rollout_is) are made here, and they are left in `mini.old_logp`, on every process,
    for the later mini-batches and the weights' metrics.
    """
    a = run.config.algo
    model = run.trainee or run.policy
    agg, norm = _loss_agg(run.config), _norm_tokens(run.config)
    counts = {"batch_tokens": mini.mask.sum(), "batch_seqs": (mini.mask.sum(dim=1) > 0).sum()}
    tokens = counts["batch_tokens"].clamp_min(1)
    totals: dict[str, torch.Tensor] = defaultdict(lambda: torch.zeros((), device=run.device))
    run.optimizer.zero_grad(set_to_none=True)
    micro_batches = distributed.my_rows(mini.attention_mask.sum(dim=1), a.micro_batch_size)
    grad_scale = fsdp.gradient_scale() if run.trainee is not None else 1.0
    own_logp = torch.zeros_like(mini.mask) if mini.old_logp is None else None
    for rows in micro_batches:
        mb = mini.select(rows)
        logits, start = response_logits(model, mb)  # [b, t-1-start, V]
        # Log-probs and full-vocabulary entropy [b, t-1], in one pass whose backward keeps only the logits.
        logp, entropy = (F.pad(x, (start, 0)) for x in token_logprobs_and_entropy(logits, mb.targets[:, start:]))
        old_logp, weights = mb.old_logp, mb.is_weights
        if own_logp is not None:
            old_logp = logp.detach()
            own_logp[rows, : old_logp.shape[1]] = old_logp
            if a.rollout_is is not None:
                weights, _ = rollout_correction(old_logp, mb.rollout_logp, mb.mask, a.rollout_is,
                                                a.rollout_is_threshold)
        pg_loss, pg_stats = policy_loss(
            logp, old_logp, mb.advantages, mb.mask, a.clip_low, a.clip_high, agg, a.clip_ratio_c,
            norm_tokens=norm, weights=weights, **counts,
        )
        loss = pg_loss
        if a.entropy_coef:  # without a bonus the entropy is only logged, and backward skips its gradient
            loss = loss - a.entropy_coef * aggregate(entropy, mb.mask, agg, norm, **counts)
        if a.kl_coef > 0:
            kl = kl_penalty(logp, mb.ref_logp, a.kl_estimator)  # [b, t-1]
            loss = loss + a.kl_coef * aggregate(kl, mb.mask, agg, norm, **counts)
            totals["kl"] += (kl.detach() * mb.mask).sum() / tokens
        (scale * grad_scale * loss).backward()
        share = mb.mask.sum() / tokens  # this micro-batch's part of the mini-batch's tokens
        totals["loss"] += loss.detach()
        totals["policy_loss"] += pg_loss.detach()
        totals["entropy"] += (entropy.detach() * mb.mask).sum() / tokens
        totals["clipfrac"] += pg_stats["clipfrac"] * share
        totals["approx_kl"] += pg_stats["approx_kl"] * share
        totals["dual_clipfrac"] += pg_stats["dual_clipfrac"] * share
    if run.trainee is not None:
        _pad_to_lockstep(mini, a.micro_batch_size, len(micro_batches), lambda mb: response_logits(model, mb)[0],
                         backward=True)
    totals = _sum_over_ranks(totals, ["loss", "policy_loss", "entropy", "clipfrac", "dual_clipfrac", "approx_kl"]
                             + (["kl"] if a.kl_coef > 0 else []))
    if run.trainee is None:
        distributed.all_reduce_grads(_trainable(run.optimizer))
    if own_logp is not None:
        mini.old_logp = distributed.all_reduce_sum(own_logp)
    grad_norm = _clip_and_step(run.optimizer, totals.pop("loss"), run.config.optim.grad_clip)
    return {key: value.item() for key, value in totals.items()} | grad_norm


def critic_step(run: Run, mini: Batch) -> dict[str, float]:
    """One critic optimizer step (PPO) on the mini-batch: clipped value regression onto the GAE returns."""
    a = run.config.algo
    counts = {"batch_tokens": mini.mask.sum(), "batch_seqs": (mini.mask.sum(dim=1) > 0).sum()}
    total = torch.zeros((), device=run.device)
    sharded = run.trainee is not None
    grad_scale = fsdp.gradient_scale() if sharded else 1.0
    run.critic_optimizer.zero_grad(set_to_none=True)
    micro_batches = distributed.my_rows(mini.attention_mask.sum(dim=1), a.micro_batch_size)
    for rows in micro_batches:
        mb = mini.select(rows)
        values = critic_values(run.critic, mb.input_ids)  # [b, t-1]
        loss, _ = value_loss(values, mb.old_values, mb.value_targets, mb.mask, a.value_clip, "token-mean", **counts)
        (grad_scale * loss).backward()
        total += loss.detach()
    if sharded:
        _pad_to_lockstep(mini, a.micro_batch_size, len(micro_batches),
                         lambda mb: critic_values(run.critic, mb.input_ids), backward=True)
    distributed.all_reduce_sum(total)
    if not sharded:
        distributed.all_reduce_grads(_trainable(run.critic_optimizer))
    result = _clip_and_step(run.critic_optimizer, total, run.config.optim.grad_clip)
    return {"value_loss": total.item(), "skipped_nonfinite": result["skipped_nonfinite"]}


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
    with _finite_sampling(run, step, "evaluation episodes"):
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


def derived_seed(seed: int, step: int, purpose: str) -> int:
    """A 63-bit seed that depends only on (seed, step, purpose).

    Reseeding every step from this, rather than letting one RNG stream run through the
    whole training, is what makes a resumed run sample exactly like an uninterrupted one.
    """
    return stable_seed(seed, step, purpose)


def lr_factor(step: int, warmup_steps: int, schedule: str, total_steps: int) -> float:
    """Multiplier of the base learning rate at RL step `step` (1-based).

    Linear warm-up over the first `warmup_steps` steps, then constant, or a linear or cosine
    decay that would reach 0 one step after `total_steps` (so the last step still learns).
    """
    if step <= warmup_steps:
        return step / warmup_steps
    progress = (step - warmup_steps - 1) / max(1, total_steps - warmup_steps)  # in [0, 1)
    if schedule == "linear":
        return 1.0 - progress
    if schedule == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * progress))
    return 1.0


def _logprobs(model: torch.nn.Module, mb: Batch) -> torch.Tensor:
    logits, start = response_logits(model, mb)  # [b, t-1-start, V]
    return F.pad(token_logprobs(logits, mb.targets[:, start:]), (start, 0))  # [b, t-1]


def _logprobs_of_rows(model: torch.nn.Module, batch: Batch, rows: torch.Tensor, size: int) -> torch.Tensor:
    """`model`'s log-probs [B, T-1] of `batch`'s `rows`, zeros in the others (no forward pass for no rows)."""
    out = torch.zeros_like(batch.mask)
    if len(rows):
        part = _in_micro_batches(lambda mb: _logprobs(model, mb), batch.select(rows), size)
        out[rows, : part.shape[1]] = part
    return out


def _in_micro_batches(fn, batch: Batch, size: int, lockstep: bool = False) -> torch.Tensor:
    """Run `fn(micro_batch) -> [b, t-1]` over `batch` and reassemble the full [B, T-1] result.

    With several processes each runs `fn` on its rows only; the zeros elsewhere make the sum
    over processes the full result, on every process. `lockstep` (an FSDP-sharded model) pads
    each rank to the same number of calls, with results thrown away.
    """
    out = torch.zeros(batch.mask.shape, dtype=torch.float32, device=batch.mask.device)
    micro_batches = distributed.my_rows(batch.attention_mask.sum(dim=1), size)
    for rows in micro_batches:
        piece = fn(batch.select(rows))
        out[rows, : piece.shape[1]] = piece.float()
    if lockstep:
        _pad_to_lockstep(batch, size, len(micro_batches), fn, backward=False)
    return distributed.all_reduce_sum(out)


def _pad_to_lockstep(batch: Batch, size: int, done: int, fn, backward: bool) -> None:
    """FSDP: after `done` micro-batches of `batch`, run `fn` on its first row until this rank has made
    as many passes as the busiest one, so every rank joins the same gathers and gradient reductions.
    The results are thrown away; with `backward` their gradient is multiplied by 0."""
    for _ in range(fsdp.lockstep_passes(len(batch), size, done)):
        out = fn(batch.select(torch.arange(1, device=batch.mask.device)))
        if backward:
            (0.0 * out.sum()).backward()


def _measured_scores(run: Run, trajectories: list[Trajectory], metric: str) -> np.ndarray | None:
    """Per-episode scores [P, G] for the filter metrics the returns do not contain."""
    G = run.config.rollout.group_size
    P = len(trajectories) // G
    if metric == "length":
        return np.array([sum(len(t.response_ids) for t in traj.turns) for traj in trajectories], float).reshape(P, G)
    if metric not in ("entropy", "entropy_variance", "entropy_std"):
        return None
    present = [i for i, t in enumerate(trajectories) if t.samples]  # episodes whose env did not fail at reset
    batch = build_batch([trajectories[i] for i in present], run.tokenizer.pad_token_id).to(run.device)

    def entropy(mb: Batch) -> torch.Tensor:
        logits, start = response_logits(run.policy, mb)
        return F.pad(entropy_from_logits(logits), (start, 0))

    with torch.no_grad():
        token_entropy = _in_micro_batches(entropy, batch, run.config.algo.micro_batch_size)  # [B, T-1]
    sums = torch.zeros(len(present), device=run.device).index_add_(0, batch.traj_index, (token_entropy * batch.mask).sum(1))
    counts = torch.zeros(len(present), device=run.device).index_add_(0, batch.traj_index, batch.mask.sum(1))
    scores = np.zeros(len(trajectories))
    scores[present] = (sums / counts.clamp_min(1)).cpu().numpy()  # mean token entropy of each episode
    return scores.reshape(P, G)


def _loss_agg(config: Config) -> str:
    return config.algo.loss_agg or DEFAULT_LOSS_AGG[config.algo.name]


def _norm_tokens(config: Config) -> float | None:
    """Dr.GRPO's constant divisor for seq-mean-token-sum: the generation budget of one sequence."""
    if _loss_agg(config) != "seq-mean-token-sum":
        return None
    r = config.rollout
    return float(r.max_tokens_per_turn * (r.max_turns if r.context_turns is None else 1))


def _sum_over_ranks(totals: dict[str, torch.Tensor], keys: list[str]) -> dict[str, torch.Tensor]:
    """`totals[key]` summed over processes, for `keys` (a rank without rows has none of them yet)."""
    summed = distributed.all_reduce_sum(torch.stack([totals[key] for key in keys]))  # [K]
    return dict(zip(keys, summed))


def _trainable(optimizer: torch.optim.Optimizer) -> list[torch.nn.Parameter]:
    return [p for group in optimizer.param_groups for p in group["params"]]


def _clip_and_step(optimizer: torch.optim.Optimizer, loss: torch.Tensor, max_norm: float) -> dict[str, float]:
    """Clip the gradient norm and step, or drop the gradients when the loss or norm is not finite."""
    params = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
    norm = fsdp.grad_norm_value(torch.nn.utils.clip_grad_norm_(params, max_norm if max_norm > 0 else float("inf")))
    if not (torch.isfinite(loss) and torch.isfinite(norm)):
        optimizer.zero_grad(set_to_none=True)
        return {"grad_norm": float("nan"), "skipped_nonfinite": 1.0}
    optimizer.step()
    return {"grad_norm": norm.item(), "skipped_nonfinite": 0.0}


@contextlib.contextmanager
def _finite_sampling(run: Run, step: int, what: str) -> Iterator[None]:
    """torch's sampling error on NaN / inf probabilities, as one line naming the cause and the fix."""
    try:
        yield
    except RuntimeError as e:
        if "probability tensor contains" not in str(e):
            raise
        o = run.config.optim
        raise DivergedError(
            f"step {step}: the policy's next-token probabilities are NaN or infinite while sampling {what}: its "
            f"weights diverged (optim.lr={o.lr:g}, optim.grad_clip={o.grad_clip:g}); start again with a lower "
            "optim.lr (events.jsonl lists the steps skipped for a non-finite loss or gradient)"
        ) from e


def _set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


def _finite_mean(values: list[float]) -> float:
    finite = [v for v in values if math.isfinite(v)]
    return float(np.mean(finite)) if finite else float("nan")


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
