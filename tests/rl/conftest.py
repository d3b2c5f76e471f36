"""Fixtures shared by the trainer tests."""

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def small_bandit_policy(tmp_path_factory) -> Path:
    """A small Bandit warm start that answers in format (10 to 13 s, built once per session): for tests
    that need valid reasoning, such as the MI proxies, or a policy RL can improve quickly."""
    from learning_helpers import SMALL_BANDIT_WARMSTART

    from ragen2.models.warmstart import warmstart

    return warmstart(tmp_path_factory.mktemp("small-bandit"), **SMALL_BANDIT_WARMSTART)
