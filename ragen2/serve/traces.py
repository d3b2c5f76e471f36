"""What an agent episode leaves behind: its calls, as served, and the `Trajectory` they train as.

Every call keeps the prompt token ids the endpoint rendered and the completion ids it sampled,
with their log-probs. Training uses exactly those: a completion is trained in the context it was
sampled in, never in a re-rendering of the conversation. Reasoning models' templates
(Qwen3-style) drop earlier `<think>` blocks from the history, so a later call's prompt is not the
earlier prompt plus its completion; each call is then a training sequence of its own. Calls that
do extend the previous sequence token for token (templates that keep the history, and clients
that send it back unchanged) are joined into one sequence, which trains the same tokens in the
same contexts at a fraction of the cost.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from transformers import PreTrainedTokenizerBase

from ragen2.agent.conversation import reasoning_span
from ragen2.agent.parsing import reasoning_bounds
from ragen2.agent.rollout import turn_seed
from ragen2.agent.tool_calls import ParsedToolCalls
from ragen2.agent.types import Trajectory, Turn


@dataclass
class Call:
    """One call an episode made (a chat completion or a response, streamed or not), as served."""

    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]  # per completion token, under the sampling distribution (temperature applied)
    text: str
    finish_reason: str
    tools: ParsedToolCalls
    observation: str  # the last message of the request: what this call answers
    role: str | None = None  # who in the agent made it: the X-Ragen2-Role header, else the request's model


@dataclass
class Episode:
    """One run of the agent function: its seed, group and the calls it made, in the order they were served."""

    seed: int
    group_id: int
    sample_seed: int | None  # the episode's sampling stream (training); None draws a fresh seed per call
    max_calls: int | None = None  # rollout.max_turns: calls beyond it are refused
    calls: list[Call] = field(default_factory=list)
    started: int = 0  # calls accepted so far (served or in flight)
    refused: bool = False  # a call was refused at max_calls: the episode is truncated
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def next_call(self) -> int | None:
        """Index of a new call, or None when it would exceed `max_calls`."""
        with self._lock:
            if self.max_calls is not None and self.started >= self.max_calls:
                self.refused = True
                return None
            self.started += 1
            return self.started - 1

    def seed_of(self, call: int) -> int | None:
        return None if self.sample_seed is None else turn_seed(self.sample_seed, call)

    def record(self, call: Call) -> None:
        with self._lock:
            self.calls.append(call)


def call_samples(calls: list[Call]) -> list[tuple[list[int], list[int]]]:
    """Training sequences (input_ids, loss_mask) of an episode's calls; mask 1 exactly on completion tokens.

    A call whose prompt starts with the whole current sequence extends it (the new prompt
    tokens with mask 0, its completion with mask 1); any other call starts a new sequence.
    """
    samples: list[tuple[list[int], list[int]]] = []
    for call in calls:
        if samples and call.prompt_ids[: len(samples[-1][0])] == samples[-1][0]:
            ids, mask = samples[-1]
            new = call.prompt_ids[len(ids):]
            samples[-1] = (ids + new + call.completion_ids, mask + [0] * len(new) + [1] * len(call.completion_ids))
        else:
            samples.append((call.prompt_ids + call.completion_ids,
                            [0] * len(call.prompt_ids) + [1] * len(call.completion_ids)))
    return samples


def call_reasoning(tokenizer: PreTrainedTokenizerBase, call: Call) -> tuple[str, tuple[int, int]]:
    """The reasoning of a call for the collapse diagnostics: its `<think>` block when it has one, else the
    whole completion (what the policy wrote in answer to its input), without a closing special token."""
    bounds = reasoning_bounds(call.text)
    if bounds is not None:
        return call.text[bounds[0]: bounds[1]].strip(), reasoning_span(tokenizer, call.completion_ids)
    ids = call.completion_ids
    end = len(ids) - (1 if ids and ids[-1] in set(tokenizer.all_special_ids) else 0)
    return call.text.strip(), (0, end) if call.text.strip() else (0, 0)


def episode_trajectory(
    name: str, episode: Episode, reward: float, error: str | None, success_reward: float,
    tokenizer: PreTrainedTokenizerBase,
) -> Trajectory:
    """The `Trajectory` an episode trains as: one turn per call, the reward on the last one.

    A turn's `format_valid` says whether its tool-call blocks parsed; its actions are the names
    of the tools it called; its `logprobs` are the served completion's (None if the backend gave none),
    for off-policy correction.
    """
    traj = Trajectory(env_name=name, seed=episode.seed, group_id=episode.group_id, error=error)
    for k, call in enumerate(episode.calls):
        reasoning, span = call_reasoning(tokenizer, call)
        traj.turns.append(Turn(
            prompt_ids=call.prompt_ids, response_ids=call.completion_ids, response_text=call.text,
            reasoning=reasoning, reasoning_span=span, actions=[c.name for c in call.tools.calls],
            format_valid=call.tools.valid, actions_valid=call.tools.valid,
            reward=reward if k == len(episode.calls) - 1 else 0.0, observation=call.observation,
            logprobs=list(call.logprobs) if len(call.logprobs) == len(call.completion_ids) else None,
            role=call.role,
        ))
    traj.samples = call_samples(episode.calls)
    traj.episode_return = reward
    traj.success = error is None and reward >= success_reward
    traj.truncated = episode.refused
    traj.terminated = error is None and not episode.refused
    return traj
