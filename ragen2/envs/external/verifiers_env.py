"""verifiers environments: `make("verifiers:TASKSET")` plays a verifiers taskset's tasks, scored by their own rewards.

In verifiers (0.4, `verifiers.v1`) an environment is a taskset, whose `load()` yields tasks (a prompt and the
data to score it with), plus a harness: the agent program that answers a task through a model endpoint. The
task's `@vf.reward` functions then score the run's trace, and their weighted sum is its reward. Here ragen2's
rollout loop is the harness: the task's prompt is the observation, the policy's answer is the reply, and the
task scores a trace of that conversation, as verifiers scores its own runs. Nothing runs over the network.

TASKSET is what verifiers' `--env.taskset.id` takes: a taskset that ships with verifiers, or an importable module
that exports a `Taskset` subclass in `__all__`.
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import logging
import pkgutil
from typing import Any, ClassVar

import gymnasium as gym
import verifiers.v1 as vf  # the `verifiers` extra: this module loads only for verifiers:
from pydantic import ValidationError
from verifiers.v1 import tasksets as builtin_tasksets
from verifiers.v1.state import state_cls
from verifiers.v1.utils.loaders import taskset_class, taskset_config_type

from ragen2.envs.base import TextEnv
from ragen2.envs.external.base import unknown_game
from ragen2.errors import ConfigError

logger = logging.getLogger(__name__)


class VerifiersEnv(TextEnv):
    """A verifiers taskset: one task per episode, one reply, scored by the task's rewards.

    ## Description
    `taskset` names a verifiers taskset, built with `taskset_config` (its `TasksetConfig` fields). The seed
    picks one of its tasks (the first `max_tasks` of an endless taskset).

    ## Actions
    One reply: the text in `<answer>`, which the task's rewards read as the agent's last reply. An empty
    reply, or one with control characters other than newlines and tabs, is invalid.

    ## Observation
    The task's prompt (its messages' text), after its system prompt when the tasks do not share one (a
    shared one is in the instruction). After the reply: the rewards it got.

    ## Rewards
    The task's `@vf.reward` functions (and rewards plugged through `taskset_config.task.rewards`) score a
    trace of the system prompt, the prompt and the reply; the reward is their weighted sum, as verifiers
    computes it. A reward function that raises scores the reply 0, as in verifiers.

    ## Episode end
    Terminated by the reply.

    ## Info
    - `action_is_valid` (bool): the reply is non-empty printable text (newlines and tabs allowed).
    - `success` (bool): the reward is at least `success_reward`.
    """

    info_keys: ClassVar[frozenset[str]] = frozenset({"action_is_valid", "success"})
    max_actions = 1

    def __init__(self, taskset: str, taskset_config: dict[str, Any] | None = None, success_reward: float = 1.0,
                 max_tasks: int = 10_000, instruction: str | None = None) -> None:
        if not isinstance(max_tasks, int) or max_tasks < 1:
            raise ConfigError(f"max_tasks={max_tasks!r} is not allowed: use an integer >= 1")
        cls = _taskset_class(taskset)
        try:
            config = taskset_config_type(taskset).model_validate({**(taskset_config or {}), "id": taskset})
        except ValidationError as e:
            raise ConfigError(f"taskset_config={taskset_config!r} rejected by verifiers:{taskset}: {e}") from e
        self.tasks: list[vf.Task] = list(itertools.islice(cls(config), max_tasks))
        if not self.tasks:
            raise ConfigError(f"verifiers:{taskset} loaded no task with taskset_config={taskset_config!r}")
        _require_offline(taskset, self.tasks[0])
        self.success_reward = float(success_reward)
        system_prompts = {task.data.system_prompt for task in self.tasks}
        self._shared_system_prompt = system_prompts.pop() if len(system_prompts) == 1 else None
        about = " ".join((type(self.tasks[0]).__doc__ or "").split())
        self.instruction = instruction or "\n".join(filter(None, [
            f"You are solving a task of the verifiers taskset {taskset}. {about}".strip(),
            self._shared_system_prompt,
            "Answer as <think>...</think><answer>your reply</answer>: one reply, not several joined by ||.",
        ]))
        self.task: vf.Task | None = None
        self._observation = ""
        self.trace: vf.Trace | None = None
        """The last reply's scored trace (its rewards and metrics), as verifiers records it."""

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[str, dict]:
        gym.Env.reset(self, seed=seed)
        self.task, self.trace = self.tasks[int(self.np_random.integers(len(self.tasks)))], None
        own = self.task.data.system_prompt if self._shared_system_prompt is None else None
        self._observation = "\n\n".join(filter(None, [own, self.task.data.prompt_text]))
        return self._observation, {}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        if self.task is None or self.trace is not None:
            raise RuntimeError("step() needs a running episode: call reset() first")
        reply = str(action).strip()
        if not reply or not all(c.isprintable() or c in "\n\t" for c in reply):
            return self._observation, 0.0, False, False, {"action_is_valid": False, "success": False}
        self.trace = _trace(self.task, reply)
        try:
            asyncio.run(self.task.score(self.trace))
        except vf.TaskError as e:
            logger.warning("verifiers task %s: scoring the reply failed, reward 0: %s", type(self.task).__name__, e)
        reward = float(self.trace.reward)  # 0 (an int) when nothing was scored
        scores = ", ".join(f"{name}={r.score:g}" for name, r in self.trace.rewards.items() if r is not None)
        return (f"Scored: {scores or 'nothing'}; reward {reward:g}.", reward, True, False,
                {"action_is_valid": True, "success": reward >= self.success_reward})

    def valid_actions(self) -> list[str]:
        """An example reply (replies are open-ended): what random agents and checkers try."""
        return ["42"]


def _taskset_class(taskset: str) -> type[vf.Taskset]:
    """The taskset class as verifiers resolves `--env.taskset.id`; a bad id says what an id can be."""
    builtin = sorted(m.name for m in pkgutil.iter_modules(builtin_tasksets.__path__))
    try:
        return taskset_class(taskset)
    except (ImportError, TypeError, AttributeError, ValueError) as e:
        raise unknown_game("verifiers", taskset, f"{taskset!r} is not a verifiers taskset ({e}); use verifiers:TASKSET "
                           "with a module that exports a Taskset subclass in __all__, or a taskset that ships with "
                           f"verifiers: {', '.join(builtin)}", builtin) from e


def _require_offline(taskset: str, task: vf.Task) -> None:
    """Refuse tasks whose scoring or play needs what only verifiers' own harness provides: a runtime (a
    sandbox the agent worked in), tool servers, a container or model judges."""
    needs_runtime = [fn.__name__ for fn in [*task.hooks("reward"), *task.hooks("metric")] if _needs_runtime(fn)]
    needs = [
        *([f"a runtime for {', '.join(needs_runtime)}"] if needs_runtime else []),
        *(["tool servers (toolsets)"] if type(task).toolsets(task.config) else []),
        *(["a container"] if task.NEEDS_CONTAINER else []),
        *([f"model judges ({', '.join(j.reward_name for j in task.plugged_judges())})"] if task.config.judges else []),
    ]
    if needs:
        raise ConfigError(f"verifiers:{taskset}: its tasks need {'; '.join(needs)}, which only verifiers' own harness "
                          "provides; `verifiers:` plays tasks scored from the reply alone (docs/agents.md)")


def _needs_runtime(fn: Any) -> bool:
    """Whether a scoring function requires `runtime` (verifiers skips those when scoring without one)."""
    parameter = inspect.signature(fn).parameters.get("runtime")
    return parameter is not None and parameter.default is inspect.Parameter.empty


def _trace(task: vf.Task, reply: str) -> vf.Trace:
    """A verifiers trace of one exchange: the task's system prompt and prompt, then the reply as the sampled turn."""
    prompt = task.data.prompt
    messages: list[vf.Message] = [
        *([vf.SystemMessage(content=task.data.system_prompt)] if task.data.system_prompt else []),
        *(prompt if isinstance(prompt, list) else [vf.UserMessage(content=prompt)] if prompt else []),
        vf.AssistantMessage(content=reply),
    ]
    nodes = [vf.MessageNode(parent=i - 1 if i else None, message=m, sampled=i == len(messages) - 1)
             for i, m in enumerate(messages)]
    return vf.Trace(task=vf.TraceTask(type=type(task).__name__, data=task.data, key=task.key, hash=task.hash),
                    agent=vf.AgentInfo(config=vf.AgentConfig()), state=state_cls(type(task))(), nodes=nodes,
                    is_completed=True, ok=True)


def make(taskset: str, **cfg: Any) -> VerifiersEnv:
    return VerifiersEnv(taskset, **cfg)
