"""The text-environment contract: Gymnasium's API with strings for observations and actions."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

import gymnasium as gym

# The last line of an instruction whose turn may play several actions, in the default turn format.
SEVERAL_ACTIONS_ANSWER = (
    "Answer as <think>...</think><answer>Action1 || Action2</answer>: one or more actions separated by ||."
)


class TextEnv(gym.Env, ABC):
    """Base of every ragen2 environment.

    One `step` takes ONE action string (the agent layer splits an answer on
    `rollout.action_sep`, `||` by default, and calls `step` once per action). An action the env cannot use never raises:
    `info["action_is_valid"]` is False, the state is unchanged, the reward is 0;
    the agent layer applies the format penalty.

    Subclasses set:
      instruction       -- system text for the agent: the task, the action syntax, the rewards.
                           Written for the default turn format, `Answer as <think>...</think>
                           <answer>A1 || A2</answer>`: the agent layer removes `<think>...</think>`
                           for rollout.enable_think=false and replaces `||` by rollout.action_sep.
      max_actions       -- episode length in actions; reaching it is truncation.
      info_keys         -- the keys every `step` info dict carries (a test checks it).

    Native tool calling (`rollout.tool_calls=true`; docs/agents.md) needs, in addition:
      tools             -- the actions as tool schemas (OpenAI's function format, `bracket_tool`),
                           which the policy's chat template renders;
      tool_instruction  -- the system text for that mode (the tools themselves are not repeated);
      tool_action       -- the action text a call stands for (by default `NAME[value]`);
      action_call       -- its inverse, the call that stands for an action (demonstrations write them).
    """

    metadata: ClassVar[dict[str, Any]] = {"render_modes": []}
    instruction: ClassVar[str] = ""
    info_keys: ClassVar[frozenset[str]] = frozenset({"action_is_valid", "success"})
    max_actions: int = 10
    tools: ClassVar[tuple[dict[str, Any], ...]] = ()
    tool_instruction: ClassVar[str] = ""

    @abstractmethod
    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[str, dict]:
        """Start an episode. The same seed always gives the same episode.

        Implementations call `gym.Env.reset(self, seed=seed)` first to seed `self.np_random`.
        """

    @abstractmethod
    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        """Apply one action text; returns (obs_text, reward, terminated, truncated, info)."""

    @abstractmethod
    def valid_actions(self) -> list[str]:
        """The action names `step` accepts right now (random agents and checkers draw from it)."""

    def solve(self) -> list[str] | None:
        """A shortest action list from the current state, or None when the env has no solver."""
        return None

    def tool_action(self, name: str, arguments: dict[str, Any]) -> str | None:
        """The action a tool call stands for, or None when no tool has that name or its argument is not text.

        The default reads tools made by `bracket_tool`: the call `NAME(value)` is the action `NAME[value]`.
        """
        for tool in self.tools:
            function = tool["function"]
            if function["name"] == name:
                (parameter,) = function["parameters"]["required"]
                value = arguments.get(parameter)
                return f"{name}[{value}]" if isinstance(value, str) and set(arguments) == {parameter} else None
        return None

    def action_call(self, action: str) -> tuple[str, dict[str, Any]] | None:
        """The tool call (name, arguments) that `tool_action` turns into `action`, or None when no call does.

        The tool-calling demonstrations write the oracle's actions as these calls. The default reads
        tools made by `bracket_tool`: the action `NAME[value]` is the call `NAME(value)`.
        """
        for tool in self.tools:
            function = tool["function"]
            name = function["name"]
            if action.startswith(f"{name}[") and action.endswith("]"):
                (parameter,) = function["parameters"]["required"]
                arguments = {parameter: action[len(name) + 1 : -1]}
                if self.tool_action(name, arguments) == action:
                    return name, arguments
        return None


def bracket_tool(name: str, description: str, parameter: str, about: str) -> dict[str, Any]:
    """The schema of a tool with one text argument, standing for the action `name[argument]`."""
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": {parameter: {"type": "string", "description": about}},
                           "required": [parameter]},
        },
    }
