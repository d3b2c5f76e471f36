"""Hand-made trajectories over tests/conftest.py's tiny tokenizer (`tiny_tokenizer`, with `tiny_model`)."""

from __future__ import annotations

import pytest

from ragen2.agent.types import Trajectory, Turn


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
