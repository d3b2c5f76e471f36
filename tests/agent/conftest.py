"""Shared fixtures: a tiny tokenizer trained on env-like text and a tiny random Qwen2 model."""

from __future__ import annotations

import pytest
import torch

from ragen2.models.tiny import build_model, build_tokenizer

CORPUS = [
    "Turn 1:\nState:\n######\n#_PX_#\n#__O_#\n######\nPlayer at (row 1, col 2).\nYou have 10 actions left.",
    "<think>The box is right of me, so I push it down onto the target.</think><answer>Right || Down</answer>",
    "<think>Go left then up.</think><answer>Left || Up</answer>",
    "You are solving Sokoban. Push every box onto a target. Actions: Up, Down, Left, Right.",
    "Arms: Dragon, Turtle. Which arm do you pull? The goal is at (row 3, col 2).",
] * 10


@pytest.fixture(scope="session")
def tokenizer():
    return build_tokenizer(CORPUS, vocab_size=400)


@pytest.fixture(scope="module")
def model(tokenizer):
    # One thread: a model this small runs faster without thread hand-offs, and the
    # tests do not fight other processes for the machine's few cores.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield build_model(tokenizer, hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=64)
    torch.set_num_threads(threads)
