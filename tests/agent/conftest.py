"""The agent tests' names for tests/conftest.py's tiny tokenizer (env-like text) and tiny random Qwen2 model."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="session")
def tokenizer(tiny_tokenizer):
    return tiny_tokenizer


@pytest.fixture(scope="module")
def model(tiny_model):
    # One thread: a model this small runs faster without thread hand-offs, and the
    # tests do not fight other processes for the machine's few cores.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield tiny_model
    torch.set_num_threads(threads)
