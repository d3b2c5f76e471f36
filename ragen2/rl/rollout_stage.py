"""The rollout stage: play a step's groups with the current policy, and what goes with it.

Seeds (every episode samples from its own stream, derived from trainer.seed and the step), the
rollout engine (`generate` on the policy, or vLLM) and agent loops behind an endpoint, the new
weights pushed to them after an update, the training samples written to the run directory, and
the staleness and throughput metrics of asynchronous training (ragen2.rl.async_rollout plays
`rollout_phase` on a worker process).
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import numpy as np
import torch

from ragen2.agent import GenerationBackend, HFBackend, RolloutStats, Trajectory, Turn, group_seeds, rollout, summarize
from ragen2.agent.rollout import stable_seed, stop_strings
from ragen2.agent.vllm_backend import VLLMBackend
from ragen2.config import Config
from ragen2.envs import EVAL_SEED_OFFSET
from ragen2.errors import DivergedError
from ragen2.evaluate import write_rollout_records
from ragen2.mixture import is_mixture, per_group, tagged_metrics, training_envs
from ragen2.rl import distributed
from ragen2.rl.run import Run
from ragen2.rl.turn_signal import turn_signal_metrics
from ragen2.serve.batcher import Sampling

if TYPE_CHECKING:
    from ragen2.serve.agent_loop import AgentRunner


def derived_seed(seed: int, step: int, purpose: str) -> int:
    """A 63-bit seed that depends only on (seed, step, purpose).

    Reseeding every step from this, rather than letting one RNG stream run through the
    whole training, is what makes a resumed run sample exactly like an uninterrupted one.
    """
    return stable_seed(seed, step, purpose)


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
    with finite_sampling(run, step, "training rollouts"):
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
    } | role_metrics(trajectories)
    if is_mixture(cfg):
        metrics |= tagged_metrics(rollout_metrics, trajectories, [t.tag for t in trajectories])
    return trajectories, metrics


def rollout_metrics(trajectories: list[Trajectory]) -> dict[str, float]:
    """`summarize`'s rates and means, and the spread of the episode returns."""
    return summarize(trajectories) | {"rollout/return_std": float(np.std([t.episode_return for t in trajectories]))}


def role_metrics(trajectories: list[Trajectory]) -> dict[str, float]:
    """`rollout/<role>/...` of an agent loop's calls, per role (`Turn.role`): the calls an episode made in it, their
    response tokens and the share whose tool-call blocks parsed. Roles split the calls, not the episodes, so no
    return or success is given per role; calls without a role (ragen2's own rollout loop) give nothing."""
    by_role: dict[str, list[Turn]] = defaultdict(list)
    for turn in (turn for t in trajectories for turn in t.turns if turn.role is not None):
        by_role[turn.role].append(turn)
    metrics = {}
    for role, turns in by_role.items():
        metrics |= {f"rollout/{role}/calls_mean": len(turns) / len(trajectories),
                    f"rollout/{role}/response_tokens_mean": float(np.mean([len(t.response_ids) for t in turns])),
                    f"rollout/{role}/valid_format_rate": float(np.mean([t.format_valid for t in turns]))}
    return metrics


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
            run.policy, run.tokenizer, stop_strings=stop_strings(r), gpu_memory_utilization=r.vllm_gpu_memory_utilization,
            seed=run.config.trainer.seed,
        )
    return HFBackend(run.policy, run.tokenizer, stop_strings=stop_strings(r), prefix_reuse=r.prefix_reuse)


def push_weights(run: Run, step: int) -> None:
    """After step `step`, a vLLM engine gets the new weights, so the next rollout samples the policy being
    trained; with a rollout worker (async), they are sent to it as version `step`."""
    if isinstance(run.backend, VLLMBackend):
        run.backend.load_weights(run.policy)
    if run.rollouts is not None:
        run.rollouts.push(step)


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


@contextlib.contextmanager
def finite_sampling(run: Run, step: int, what: str) -> Iterator[None]:
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

