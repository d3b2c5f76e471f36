"""The multi-turn rollout loop (StarPO): P groups x G episodes played in lockstep, one generate call per turn.

Each turn every unfinished episode shows its state, all their prompts go to the backend in
one batch, each response is parsed into up to `max_actions_per_turn` actions and those are
applied to the episode's environment. The generated token ids are kept as sampled; the
`Conversation` of each episode turns them into training samples with loss masks.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from transformers import PreTrainedTokenizerBase

from ragen2 import envs
from ragen2.agent.backends import GenerationBackend, reuse_prefixes
from ragen2.agent.conversation import MEMORY_REQUEST, Conversation, MemorySettings, note_span, reasoning_span
from ragen2.agent.parsing import ResponseFormat, parse_note, parse_response
from ragen2.agent.tool_calls import parse_tool_turn
from ragen2.agent.types import GenerationOutput, Trajectory, Turn
from ragen2.config import RolloutConfig
from ragen2.config.tagged_envs import TaggedEnv
from ragen2.envs.base import TextEnv
from ragen2.errors import ConfigError
from ragen2.tags import ANSWER_CLOSE, MEMORY_CLOSE


@dataclass
class RolloutStats:
    """Where rollout time goes, in seconds. Accumulates when the same object is passed to several rollouts."""

    total_s: float = 0.0  # wall time of rollout() calls
    generate_s: float = 0.0  # inside backend.generate
    env_s: float = 0.0  # inside env.reset / env.step
    generate_calls: int = 0
    turns: int = 0  # turns played, summed over episodes
    response_tokens: int = 0  # tokens generated, summed over turns

    @property
    def overhead_fraction(self) -> float:
        """Share of rollout time spent outside generation (env, parsing, prompt building)."""
        return 1.0 - self.generate_s / self.total_s if self.total_s > 0 else 0.0


@dataclass
class _Episode:
    traj: Trajectory
    conv: Conversation
    env: TextEnv | None = None
    observation: str = ""
    actions_left: int = 0
    done: bool = False
    action_turns: int = 0  # turns that acted (memory turns are not counted against rollout.max_turns)
    tool_results: list[str] = field(default_factory=list)  # rollout.tool_calls: the last turn's calls' results


def group_seeds(base_seed: int, num_groups: int, group_size: int) -> tuple[list[int], list[int]]:
    """Seeds and group ids of P x G episodes: group g is G copies of seed `base_seed + g`.

    Returns two lists of length P*G, group-major ([g0, g0, ..., g1, g1, ...]). Seeds of one
    call are consecutive, so callers keep training and evaluation apart by their base seeds.
    """
    if num_groups < 1 or group_size < 1:
        raise ConfigError(f"num_groups={num_groups}, group_size={group_size}: both must be integers >= 1")
    group_ids = [g for g in range(num_groups) for _ in range(group_size)]
    return [base_seed + g for g in group_ids], group_ids


def rollout(
    backend: GenerationBackend,
    tokenizer: PreTrainedTokenizerBase,
    env_name: str,
    env_kwargs: dict,
    seeds: list[int],
    group_ids: list[int],
    cfg: RolloutConfig,
    stats: RolloutStats | None = None,
    sample_seeds: list[int] | None = None,
    episode_envs: list[TaggedEnv] | None = None,
    newest_weights: Callable[[], int] | None = None,
) -> list[Trajectory]:
    """Play one episode per seed with `ragen2.envs.make(env_name, **env_kwargs)`, returned in the order of `seeds`.

    `episode_envs` (one per episode) plays a mixture instead: episode i builds `episode_envs[i]` and its
    trajectory carries that entry's tag; without it every trajectory's tag is `env_name`.

    Rewards: each turn's reward is the sum of its env rewards plus `cfg.format_penalty` when
    the response is malformed or an action was invalid. Actions of a turn stop at the first
    invalid action or at the end of the episode. An environment that raises ends only its
    own episode, with `Trajectory.error` set. Pass `stats` to get the timing breakdown.

    `sample_seeds` (one per episode) gives each episode its own sampling stream, turn by
    turn (`turn_seed`), so an episode samples the same tokens whichever other episodes share
    the call; without it the backend draws from torch's global RNG.

    `newest_weights` (partial rollouts) is called before every turn: it may replace the backend's weights
    with newer ones, and returns their version, which the turn records (`Turn.policy_version`). When it
    changes, the keys/values cached from the older weights are dropped.
    """
    if len(seeds) != len(group_ids):
        raise ValueError(f"{len(seeds)} seeds but {len(group_ids)} group ids: pass one group id per seed")
    if sample_seeds is not None and len(sample_seeds) != len(seeds):
        raise ValueError(f"{len(sample_seeds)} sample seeds for {len(seeds)} episodes: pass one per episode, or None")
    if episode_envs is not None and len(episode_envs) != len(seeds):
        raise ValueError(f"{len(episode_envs)} environments for {len(seeds)} episodes: pass one per episode, or None")
    specs = episode_envs or [TaggedEnv(env_name, env_kwargs, env_name)] * len(seeds)
    stats = stats if stats is not None else RolloutStats()
    start = time.perf_counter()
    episodes = [
        _start_episode(spec, seed, gid, tokenizer, cfg, stats) for spec, seed, gid in zip(specs, seeds, group_ids)
    ]
    version = None
    with reuse_prefixes(backend) as prefixes:  # an episode's next turn starts from the keys/values of its last one
        while active := [i for i, e in enumerate(episodes) if not e.done]:
            if newest_weights is not None:
                previous, version = version, newest_weights()
                if prefixes is not None and previous is not None and version != previous:
                    prefixes.clear()
            active_episodes = [episodes[i] for i in active]
            for e in active_episodes:
                if not e.conv.awaiting_response:  # after a note, the observation it went before is pending
                    e.conv.add_observation(e.observation, e.actions_left, e.tool_results)
                    e.tool_results = []
            prompts = [e.conv.prompt_ids() for e in active_episodes]
            turn_seeds = None if sample_seeds is None else [
                turn_seed(sample_seeds[i], len(episodes[i].traj.turns)) for i in active]
            t0 = time.perf_counter()
            outputs = backend.generate(
                prompts, max_new_tokens=cfg.max_tokens_per_turn, temperature=cfg.temperature, top_p=cfg.top_p,
                **({} if cfg.top_k == -1 else {"top_k": cfg.top_k}),
                **({} if turn_seeds is None else {"seeds": turn_seeds}),
            )
            stats.generate_s += time.perf_counter() - t0
            stats.generate_calls += 1
            for e, prompt, out in zip(active_episodes, prompts, outputs):
                note = e.conv.writing_note
                e.conv.add_response(out.token_ids, out.text)
                (_write_note if note else _play_turn)(e, prompt, out, tokenizer, cfg, stats)
                if version is not None:
                    e.traj.turns[-1].policy_version = version
                if not e.done and e.action_turns == cfg.max_turns:
                    e.done = e.traj.truncated = True
    for e in episodes:
        e.traj.samples = e.conv.samples()
        e.traj.episode_return = sum(t.reward for t in e.traj.turns)
    stats.total_s += time.perf_counter() - start
    return [e.traj for e in episodes]


def stable_seed(*parts: object) -> int:
    """A 63-bit seed that depends only on `parts` (hashed, so it is the same in every process and run)."""
    digest = hashlib.sha256("/".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def turn_seed(episode_seed: int, turn: int) -> int:
    """The sampling seed of one turn of an episode."""
    return stable_seed(episode_seed, turn)


def _start_episode(
    spec: TaggedEnv, seed: int, group_id: int, tokenizer: PreTrainedTokenizerBase, cfg: RolloutConfig,
    stats: RolloutStats,
) -> _Episode:
    traj = Trajectory(env_name=spec.name, seed=seed, group_id=group_id, tag=spec.tag)
    t0 = time.perf_counter()
    try:
        env = envs.make(spec.name, **spec.kwargs)
        observation, _ = env.reset(seed=seed)
    except Exception as exc:  # a broken env ends its episode, not the rollout
        traj.error = f"{type(exc).__name__}: {exc}"
        return _Episode(traj=traj, conv=conversation(tokenizer, "", cfg), done=True)
    finally:
        stats.env_s += time.perf_counter() - t0
    if cfg.tool_calls:
        conv = conversation(tokenizer, env.tool_instruction, cfg, list(env.tools))
    else:
        conv = conversation(tokenizer, env.instruction, cfg)
    return _Episode(traj=traj, conv=conv, env=env, observation=observation, actions_left=env.max_actions)


def conversation(
    tokenizer: PreTrainedTokenizerBase, instruction: str, cfg: RolloutConfig, tools: list[dict] | None = None,
) -> Conversation:
    """An episode's `Conversation` as the rollout builds it from `cfg` (memory mode, turn format, length cap),
    with the environment's `tools` for native tool calling."""
    fmt = ResponseFormat(think=cfg.enable_think, action_sep=cfg.action_sep)
    window = kept_turns(cfg) if cfg.memory == "window" else None
    return Conversation(tokenizer, instruction, window, fmt, cfg.max_model_len, tools, memory_settings(cfg))


def kept_turns(cfg: RolloutConfig) -> int:
    """`rollout.context_turns`, null meaning 1: the turns a window shows, or that a note keeps before it."""
    return 1 if cfg.context_turns is None else cfg.context_turns


def stop_strings(cfg: RolloutConfig) -> tuple[str, ...]:
    """What ends a turn's generation besides EOS: `</answer>`, and `</memory>` where notes are written."""
    return (ANSWER_CLOSE, MEMORY_CLOSE) if cfg.memory == "summary" else (ANSWER_CLOSE,)


def memory_settings(cfg: RolloutConfig) -> MemorySettings | None:
    """The notes' budget and what later prompts keep, for `rollout.memory=summary`; None for the other modes."""
    if cfg.memory != "summary":
        return None
    return MemorySettings(cfg.memory_budget, cfg.max_tokens_per_turn, kept_turns(cfg))


def _write_note(
    e: _Episode, prompt: list[int], out: GenerationOutput, tokenizer: PreTrainedTokenizerBase, cfg: RolloutConfig,
    stats: RolloutStats,
) -> None:
    """Record a memory turn: the note the policy wrote when asked (nothing is played). A note that does not parse
    gets the format penalty, as a malformed action turn does; it is shown to later turns as written."""
    note, valid = parse_note(out.text)
    e.traj.turns.append(
        Turn(
            prompt_ids=prompt,
            response_ids=list(out.token_ids),
            response_text=out.text,
            reasoning=note,
            reasoning_span=note_span(tokenizer, out.token_ids),
            actions=[],
            format_valid=valid,
            actions_valid=valid,
            reward=0.0 if valid else cfg.format_penalty,
            observation=MEMORY_REQUEST,  # what the prompt showed last (GiGPO compares the group's notes)
            logprobs=None if out.logprobs is None else list(out.logprobs),
            memory=True,
        )
    )
    stats.turns += 1
    stats.response_tokens += len(out.token_ids)


def _play_turn(
    e: _Episode, prompt: list[int], out: GenerationOutput, tokenizer: PreTrainedTokenizerBase, cfg: RolloutConfig,
    stats: RolloutStats,
) -> None:
    """Apply one response's actions (its tool calls, with `rollout.tool_calls`) to the env and record the turn."""
    response_ids, response_text = out.token_ids, out.text
    fmt = e.conv.fmt
    if e.conv.tools:
        parsed = parse_tool_turn(response_text, fmt, cfg.max_actions_per_turn, e.env.tool_action)
    else:
        parsed = parse_response(response_text, cfg.max_actions_per_turn, fmt)
    shown = e.observation
    reward, actions_valid = 0.0, parsed.valid
    t0 = time.perf_counter()
    try:
        for action in parsed.actions:
            e.observation, r, terminated, truncated, info = e.env.step(action)
            if e.conv.tools:  # every call executed is answered by a tool message
                e.tool_results.append(e.observation)
            reward += float(r)
            if not info["action_is_valid"]:
                actions_valid = False
                break
            e.actions_left -= 1  # invalid actions do not use the budget (the envs' contract)
            e.traj.success = bool(info["success"])
            if terminated or truncated:
                e.traj.terminated, e.traj.truncated, e.done = bool(terminated), bool(truncated), True
                break
    except Exception as exc:
        e.traj.error = f"{type(exc).__name__}: {exc}"
        e.done = True
    finally:
        stats.env_s += time.perf_counter() - t0
    if not actions_valid:
        reward += cfg.format_penalty
        if cfg.end_on_invalid and not parsed.valid and not e.done:
            e.done = e.traj.truncated = True
    e.traj.turns.append(
        Turn(
            prompt_ids=prompt,
            response_ids=list(response_ids),
            response_text=response_text,
            reasoning=parsed.reasoning,
            reasoning_span=reasoning_span(tokenizer, response_ids) if fmt.think else (0, 0),
            actions=parsed.actions,
            format_valid=parsed.valid,
            actions_valid=actions_valid,
            reward=reward,
            observation=shown,
            dropped_turns=e.conv.dropped_turns,
            logprobs=None if out.logprobs is None else list(out.logprobs),
        )
    )
    e.action_turns += 1
    stats.turns += 1
    stats.response_tokens += len(response_ids)


def summarize(trajectories: list[Trajectory]) -> dict[str, float]:
    """Batch-level rollout metrics (`rollout/...`); rates over turns are over all acting turns of the batch.

    valid_action_rate counts a turn as valid when it parsed and every action it executed
    was accepted, so it never exceeds valid_format_rate. truncated_turns counts the earlier
    turns `rollout.max_model_len` left out of prompts, summed over the batch's turns.
    prompt_tokens_mean is over every turn, memory turns included. Memory turns (`rollout.memory=summary`)
    are counted apart: memory_turns_mean and memory_valid_rate, logged when the batch has one.
    """
    if not trajectories:
        raise ValueError("summarize() needs at least one trajectory")
    n = len(trajectories)
    every = [t for traj in trajectories for t in traj.turns]
    turns = [t for t in every if not t.memory]
    notes = [t for t in every if t.memory]
    per_turn = max(len(turns), 1)  # a batch where every env failed has no turns: rates are 0
    return {
        "rollout/success_rate": sum(t.success for t in trajectories) / n,
        "rollout/return_mean": sum(t.episode_return for t in trajectories) / n,
        "rollout/turns_mean": len(turns) / n,
        "rollout/valid_format_rate": sum(t.format_valid for t in turns) / per_turn,
        "rollout/valid_action_rate": sum(t.actions_valid for t in turns) / per_turn,
        "rollout/response_tokens_mean": sum(len(t.response_ids) for t in turns) / per_turn,
        "rollout/prompt_tokens_mean": sum(len(t.prompt_ids) for t in every) / max(len(every), 1),
        "rollout/error_rate": sum(t.error is not None for t in trajectories) / n,
        "rollout/truncated_turns": float(sum(t.dropped_turns for t in turns)),
    } | ({"rollout/memory_turns_mean": len(notes) / n,
          "rollout/memory_valid_rate": sum(t.format_valid for t in notes) / len(notes)} if notes else {})
