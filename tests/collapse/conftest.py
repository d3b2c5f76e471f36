"""A tiny tokenizer and random Qwen2 model built from ragen2.models.tiny, and hand-made trajectories."""

from __future__ import annotations

import pytest

from ragen2.agent.types import Trajectory, Turn
from ragen2.models.tiny import build_model, build_tokenizer

CORPUS = [
    "Turn 1:\nState:\n######\n#_PX_#\n#__O_#\n######\nPlayer at (row 1, col 2).",
    "<think>The box is right of me, so I push it down onto the target.</think><answer>Right || Down</answer>",
    "<think>Go left then up.</think><answer>Left || Up</answer>",
    "Arms: Dragon, Turtle. Which arm do you pull? The goal is at (row 3, col 2).",
] * 10


@pytest.fixture(scope="session")
def tiny_tokenizer():
    return build_tokenizer(CORPUS, vocab_size=300)


@pytest.fixture(scope="session")
def tiny_model(tiny_tokenizer):
    return build_model(tiny_tokenizer, hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=64)


def _turn(tokenizer, prompt: str, reasoning: str) -> Turn:
    """A turn whose response is `reasoning</think><answer>Up</answer>`; the span covers the reasoning tokens."""
    prompt_ids = tokenizer(prompt + "<think>", add_special_tokens=False)["input_ids"]
    z = tokenizer(reasoning, add_special_tokens=False)["input_ids"] if reasoning else []
    tail = tokenizer("</think><answer>Up</answer>", add_special_tokens=False)["input_ids"]
    return Turn(
        prompt_ids=prompt_ids,
        response_ids=z + tail,
        response_text=reasoning + "</think><answer>Up</answer>",
        reasoning=reasoning,
        reasoning_span=(0, len(z)),
        actions=["Up"],
        format_valid=True,
        actions_valid=True,
        reward=0.0,
        observation=prompt,
    )


@pytest.fixture(scope="session")
def make_trajectory(tiny_tokenizer):
    """make_trajectory(group, [(prompt, reasoning), ...]) -> a Trajectory of group `group` (env seed 100 + group)."""

    def make(group: int, turns: list[tuple[str, str]]) -> Trajectory:
        return Trajectory(
            env_name="sokoban",
            seed=100 + group,
            group_id=group,
            turns=[_turn(tiny_tokenizer, p, r) for p, r in turns],
        )

    return make
