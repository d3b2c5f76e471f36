"""Fixtures shared by the trainer tests."""

from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory, save_random_policy) -> Path:
    """A tiny random policy on disk, one per test module."""
    path = tmp_path_factory.mktemp("policy")
    save_random_policy(path)
    return path
