"""Shared fixtures of the RL tests."""

import pytest
import torch


@pytest.fixture
def one_thread():
    """The tiny models here run fastest on one thread, and runs are then reproducible across machines."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
