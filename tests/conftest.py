"""Fixtures shared by every test directory."""

import os
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import settings

from helpers import TINY_MODEL
from ragen2.models.tiny import build_model, build_tokenizer

# Bandit's instruction, prompt and a well-formed answer: enough text for a tokenizer whose
# random policy can be rolled out on Bandit.
BANDIT_CORPUS = [
    "You are playing a two-armed bandit. Pull one arm to get a reward. Arms: Dragon, Turtle.",
    "Turn 1:\nState:\nArms: Dragon, Turtle. Which arm do you pull?\nYou have 1 actions left.",
    "<think>The arms are Dragon and Turtle. I try Dragon.</think><answer>Dragon</answer>",
] * 10

# Env-like text (Sokoban, Bandit, the reasoning and answer format) for `tiny_tokenizer`.
ENV_CORPUS = [
    "Turn 1:\nState:\n######\n#_PX_#\n#__O_#\n######\nPlayer at (row 1, col 2).\nYou have 10 actions left.",
    "<think>The box is right of me, so I push it down onto the target.</think><answer>Right || Down</answer>",
    "<think>Go left then up.</think><answer>Left || Up</answer>",
    "You are solving Sokoban. Push every box onto a target. Actions: Up, Down, Left, Right.",
    "Arms: Dragon, Turtle. Which arm do you pull? The goal is at (row 3, col 2).",
] * 10

# Property tests draw the same cases on every run, so a CI run passes or fails on the code, not
# on the draw. HYPOTHESIS_PROFILE=explore draws new cases each run (to look for bugs).
settings.register_profile("repeatable", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "repeatable"))


@pytest.fixture(scope="session")
def save_random_policy() -> Callable:
    """`save(path, corpus=BANDIT_CORPUS, **size) -> (model, tokenizer)`: a tiny random Qwen2 policy, tokenizer trained on `corpus`, saved at `path`.

    `size`: build_model arguments in place of TINY_MODEL's (tests/helpers.py).

    Random weights generate well-formed text only by chance: tests that need a policy's
    *behaviour* use a warm start instead.
    """

    def save(path: Path, corpus: list[str] = BANDIT_CORPUS, **size):
        tokenizer = build_tokenizer(corpus, vocab_size=300)
        model = build_model(tokenizer, **{**TINY_MODEL, **size})
        model.save_pretrained(path)
        tokenizer.save_pretrained(path)
        return model, tokenizer

    return save


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory, save_random_policy) -> Path:
    """A tiny random policy on disk (`save_random_policy`), one per test module."""
    path = tmp_path_factory.mktemp("policy")
    save_random_policy(path)
    return path


@pytest.fixture(scope="session")
def tiny_tokenizer():
    """A tokenizer trained on ENV_CORPUS, for tests that need text tokenized but no trained policy."""
    return build_tokenizer(ENV_CORPUS, vocab_size=400)


@pytest.fixture(scope="session")
def tiny_model(tiny_tokenizer):
    """A tiny random Qwen2 (seed 0) over `tiny_tokenizer`, one for the session: shared by every test that asks for it."""
    return build_model(tiny_tokenizer, **TINY_MODEL)


@pytest.fixture(scope="session")
def learning_seed() -> int:
    """`trainer.seed` of the learning tests: $RAGEN2_LEARNING_SEED, else 0.

    One seed passing can be luck; `RAGEN2_LEARNING_SEED=3 make test-learning` reruns them on
    another without editing them (docs/testing.md).
    """
    value = os.environ.get("RAGEN2_LEARNING_SEED", "0")
    try:
        return int(value)
    except ValueError:
        raise pytest.UsageError(f"RAGEN2_LEARNING_SEED={value!r} is not an integer: use a trainer seed such as 0..4") from None


@pytest.fixture
def one_thread():
    """The tiny test models run fastest on one thread, runs are then reproducible across machines,
    and parallel tests do not fight for cores."""
    from ragen2.models.warmstart import one_thread as single_thread

    with single_thread():
        yield
