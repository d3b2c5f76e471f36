"""Agent loops ragen2 did not write, played through the endpoint: `agent.entrypoint=FILE.py:FUNCTION`.

FUNCTION(client, seed) runs one episode of the user's own agent and returns its reward. It is
called with an `openai.OpenAI` client (an `openai.AsyncOpenAI` one for an `async def`) whose
base URL is this episode's address on ragen2's endpoint, so every call it makes (chat completions
or the Responses API, streamed or not) is sampled from the current policy and recorded. Episodes
with the same seed form a group. All episodes of a batch run at once (threads for plain functions,
one event loop for async ones) and the endpoint batches their requests.

An episode whose function raises trains on the calls it made, with reward 0 and
`Trajectory.error` set, as an environment that fails does in the rollout loop; when every
episode of a batch raised, the first error is raised, since the agent itself is broken.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from transformers import PreTrainedTokenizerBase

from ragen2.agent.backends import HFBackend, reuse_prefixes
from ragen2.agent.rollout import RolloutStats
from ragen2.agent.types import Trajectory
from ragen2.config import AgentConfig, RolloutConfig
from ragen2.errors import Ragen2Error
from ragen2.serve.batcher import Batcher, Sampling
from ragen2.serve.endpoint import ChatService, Endpoint, Limits
from ragen2.entrypoint import agent_name, load_entrypoint
from ragen2.serve.traces import Episode, episode_trajectory

class AgentRunner:
    """The endpoint and the agent function of a run; `play` runs one batch of episodes through them."""

    def __init__(self, backend: HFBackend, tokenizer: PreTrainedTokenizerBase, rollout: RolloutConfig,
                 agent: AgentConfig):
        self.function = load_entrypoint(agent.entrypoint)
        self.name = agent_name(agent.entrypoint)
        self.backend, self.tokenizer, self.agent = backend, tokenizer, agent
        self._live = 0
        self._live_lock = threading.Lock()
        self.batcher = Batcher(backend, agent.batch_wait_s, expected=lambda: self._live)
        limits = Limits.of(backend.model, rollout.max_tokens_per_turn, max_prompt_tokens=rollout.max_model_len)
        self.service = ChatService(tokenizer, self.batcher, limits)
        self.endpoint = Endpoint(self.service, agent.host, agent.port)
        self.max_calls = rollout.max_turns

    def play(self, seeds: list[int], group_ids: list[int], sample_seeds: list[int], sampling: Sampling,
             stats: RolloutStats | None = None) -> list[Trajectory]:
        """One episode per seed (in the order of `seeds`), every call sampled with `sampling` from the
        episode's stream `sample_seeds[i]`."""
        if not len(seeds) == len(group_ids) == len(sample_seeds):
            raise ValueError(f"{len(seeds)} seeds, {len(group_ids)} group ids and {len(sample_seeds)} sample "
                             "seeds: pass one of each per episode")
        start, generate_s, calls_before = time.perf_counter(), self.batcher.generate_s, len(self.batcher.batch_sizes)
        episodes = {uuid.uuid4().hex[:16]: Episode(s, g, ss, self.max_calls)
                    for s, g, ss in zip(seeds, group_ids, sample_seeds)}
        self.service.episodes.update(episodes)
        self.service.limits.forced = sampling
        self.service.backend_errors.clear()
        self._live = len(episodes)
        try:
            with reuse_prefixes(self.backend, keep_finished=True):  # episodes return to the batch in any order
                if inspect.iscoroutinefunction(self.function):
                    results = asyncio.run(self._play_async(list(episodes)))
                else:
                    with ThreadPoolExecutor(max_workers=len(episodes), thread_name_prefix="ragen2-agent") as pool:
                        results = list(pool.map(self._play_sync, list(episodes)))
        finally:
            for key in episodes:
                self.service.episodes.pop(key, None)
        if self.service.backend_errors:
            raise self.service.backend_errors[0]
        trajectories = [
            episode_trajectory(self.name, e, reward, error, self.agent.success_reward, self.tokenizer)
            for e, (reward, error) in zip(episodes.values(), results)
        ]
        unexpected = [t.error for t, e in zip(trajectories, episodes.values()) if t.error and not e.refused]
        if len(unexpected) == len(trajectories):
            raise Ragen2Error(f"every episode of agent.entrypoint={self.agent.entrypoint} raised; the first: "
                              f"{unexpected[0]}")
        if stats is not None:
            stats.total_s += time.perf_counter() - start
            stats.generate_s += self.batcher.generate_s - generate_s
            stats.generate_calls += len(self.batcher.batch_sizes) - calls_before
            stats.turns += sum(len(t.turns) for t in trajectories)
            stats.response_tokens += sum(len(turn.response_ids) for t in trajectories for turn in t.turns)
        return trajectories

    def _play_sync(self, key: str) -> tuple[float, str | None]:
        import openai

        client = openai.OpenAI(base_url=self.endpoint.episode_url(key), api_key="ragen2", max_retries=0,
                               timeout=self.agent.request_timeout_s)
        try:
            return self._reward(lambda: self.function(client, self.service.episodes[key].seed))
        finally:
            client.close()
            self._episode_done()

    async def _play_async(self, keys: list[str]) -> list[tuple[float, str | None]]:
        import openai

        async def one(key: str) -> tuple[float, str | None]:
            client = openai.AsyncOpenAI(base_url=self.endpoint.episode_url(key), api_key="ragen2", max_retries=0,
                                        timeout=self.agent.request_timeout_s)
            try:
                try:
                    value = await self.function(client, self.service.episodes[key].seed)
                except Exception as e:
                    return 0.0, f"{type(e).__name__}: {e}"
                return self._reward(lambda: value)
            finally:
                await client.close()
                self._episode_done()

        return list(await asyncio.gather(*(one(key) for key in keys)))

    def _reward(self, call: Callable[[], Any]) -> tuple[float, str | None]:
        """(reward, None), or (0.0, the error) when the function raised or returned no finite number."""
        try:
            value = call()
        except Exception as e:
            return 0.0, f"{type(e).__name__}: {e}"
        try:
            reward = float(value)
        except (TypeError, ValueError):
            reward = math.nan
        if not math.isfinite(reward):
            return 0.0, f"ValueError: the agent function returned {value!r}; return a finite number (the reward)"
        return reward, None

    def _episode_done(self) -> None:
        with self._live_lock:
            self._live -= 1
        self.batcher.wake()

    def close(self) -> None:
        self.endpoint.close()
        self.batcher.close()
