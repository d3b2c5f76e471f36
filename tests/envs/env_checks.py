"""Checks several environment tests make (tests/envs is on sys.path for them: `from env_checks import ...`): an
env's docstring layout, its episode on docs/environments.md, and the error a mistyped environment name gives.

The adapters' tests that run in .venv-envs (`make test-envs`) import it too: only pytest and ragen2 here."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

import pytest

from ragen2.errors import UnknownNameError

# The sections of every environment's docstring, in order.
SECTIONS = ["Description", "Actions", "Observation", "Rewards", "Episode end", "Info"]
DOCS = Path(__file__).resolve().parents[2] / "docs" / "environments.md"


def check_docstring(doc: str, info_keys: Sequence[str]) -> None:
    """`doc` has every section of SECTIONS, in order, and its Info section lists exactly `info_keys`."""
    positions = [doc.find(f"## {s}\n") for s in SECTIONS]
    assert -1 not in positions and positions == sorted(positions), positions
    assert set(re.findall(r"^\s*- `(\w+)`", doc.split("## Info")[1], flags=re.M)) == set(info_keys)


def check_docs_episode(env, seed: int) -> Sequence[str]:
    """docs/environments.md shows `env`'s instruction, its first observation on `seed`, and each action of its
    solver with the reward and the observation it gives. Returns the solver's actions."""
    docs = DOCS.read_text(encoding="utf-8")
    assert env.instruction in docs
    obs, _ = env.reset(seed=seed)
    assert f"```text\n{obs}\n```" in docs
    actions = env.solve()
    for action in actions:
        obs, reward, *_ = env.step(action)
        assert f"`step({action!r})` gives reward {reward}:\n\n```text\n{obs}\n```" in docs
    return actions


def bad_env_name(name: str) -> str:
    """The message of the UnknownNameError that the config `env.name=<name>` raises."""
    from ragen2.config import load_config

    with pytest.raises(UnknownNameError) as e:
        load_config(None, [f"env.name={name}"])
    return str(e.value)
