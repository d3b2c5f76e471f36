"""Agent layer: prompts, response parsing, environment groups and the multi-turn rollout loop."""

from ragen2.agent.backends import GenerationBackend, HFBackend
from ragen2.agent.conversation import Conversation, reasoning_span, user_message
from ragen2.agent.parsing import ParsedTurn, parse_response
from ragen2.agent.rollout import RolloutConfig, RolloutStats, group_seeds, rollout, summarize
from ragen2.agent.types import GenerationOutput, Trajectory, Turn

__all__ = [
    "Conversation",
    "GenerationBackend",
    "GenerationOutput",
    "HFBackend",
    "ParsedTurn",
    "RolloutConfig",
    "RolloutStats",
    "Trajectory",
    "Turn",
    "group_seeds",
    "parse_response",
    "reasoning_span",
    "rollout",
    "summarize",
    "user_message",
]
