"""Fixtures shared by every test directory."""

import os
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import settings

from ragen2.models.tiny import build_model, build_tokenizer

# Bandit's instruction, prompt and a well-formed answer: enough text for a tokenizer whose
# random policy can be rolled out on Bandit.
BANDIT_CORPUS = [
    "You are playing a two-armed bandit. Pull one arm to get a reward. Arms: Dragon, Turtle.",
    "Turn 1:\nState:\nArms: Dragon, Turtle. Which arm do you pull?\nYou have 1 actions left.",
    "<think>The arms are Dragon and Turtle. I try Dragon.</think><answer>Dragon</answer>",
] * 10

# Property tests draw the same cases on every run, so a CI run passes or fails on the code, not
# on the draw. HYPOTHESIS_PROFILE=explore draws new cases each run (to look for bugs).
settings.register_profile("repeatable", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "repeatable"))


@pytest.fixture(scope="session")
def save_random_policy() -> Callable:
    """`save(path, corpus=BANDIT_CORPUS) -> (model, tokenizer)`: a tiny random Qwen2 policy, tokenizer trained on `corpus`, saved at `path`.

    Random weights generate well-formed text only by chance: tests that need a policy's
    *behaviour* use a warm start instead.
    """

    def save(path: Path, corpus: list[str] = BANDIT_CORPUS):
        tokenizer = build_tokenizer(corpus, vocab_size=300)
        model = build_model(tokenizer, hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=64)
        model.save_pretrained(path)
        tokenizer.save_pretrained(path)
        return model, tokenizer

    return save


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
