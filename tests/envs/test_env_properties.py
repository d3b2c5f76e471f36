"""Properties every registered env keeps: arbitrary text never breaks it, docs match the code, seeds replay."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from env_checks import SECTIONS
from ragen2.envs import ENVS, make, names

SEEDS = st.integers(min_value=0, max_value=2**31 - 1)
# Arbitrary text, mixed with action words in odd case and spacing so valid steps happen too.
ACTION_WORDS = [" up", "DOWN ", "Left", "right\n", "dragon", " TEACHER ", "phoenix"]
TEXTS = st.lists(st.one_of(st.text(max_size=30), st.sampled_from(ACTION_WORDS)), max_size=8)


def docstring_section(cls: type, title: str) -> str:
    match = re.search(rf"## {title}\n(.*?)(?=\n\s*## |\Z)", cls.__doc__, flags=re.S)
    assert match, f"{cls.__name__} docstring has no '## {title}' section"
    return match.group(1)


@pytest.mark.parametrize("name", names())
def test_docstring_has_every_section_in_order(name):
    doc = ENVS.get(name).__doc__
    positions = [doc.find(f"## {title}\n") for title in SECTIONS]
    assert -1 not in positions and positions == sorted(positions), positions


@pytest.mark.parametrize("name", names())
def test_documented_info_keys_equal_returned_ones(name):
    cls = ENVS.get(name)
    documented = set(re.findall(r"^\s*- `(\w+)`", docstring_section(cls, "Info"), flags=re.M))
    assert documented == set(cls.info_keys)
    env = make(name)
    env.reset(seed=0)
    for info in [env.step("not an action")[4], env.step(env.valid_actions()[0])[4]]:
        assert set(info) == documented
        assert all(type(value) is bool for value in info.values()), info  # not numpy bools


@pytest.mark.parametrize("name", names())
def test_instruction_names_the_actions_and_the_answer_format(name):
    env = make(name)
    env.reset(seed=0)
    assert "<think>...</think><answer>" in env.instruction and "</answer>" in env.instruction
    if name not in ("bandit", "webshop"):  # their actions are shown in each observation
        assert "||" in env.instruction
        assert all(action in env.instruction for action in env.valid_actions())


# A small model reads the observation every turn: grid and puzzle states stay tiny; pages of
# search results or a shop carry more text but stay bounded.
OBS_LIMITS = {"searchqa": 600, "webshop": 1500, "code": 2000, "math": 600}


@pytest.mark.parametrize("name", names())
def test_observations_stay_short(name):
    env = make(name)
    limit = OBS_LIMITS.get(name, 200)
    for seed in range(50):
        obs, _ = env.reset(seed=seed)
        assert len(obs) < limit, obs
        for action in env.solve():
            assert len(env.step(action)[0]) < limit


@pytest.mark.parametrize("name", names())
@settings(max_examples=60, deadline=None)
@given(seed=SEEDS, texts=TEXTS)
def test_arbitrary_text_never_raises_and_invalid_text_changes_nothing(name, seed, texts):
    env = make(name)
    obs, _ = env.reset(seed=seed)
    for text in texts:
        new_obs, reward, terminated, truncated, info = env.step(text)
        assert set(info) == set(env.info_keys)
        if not info["action_is_valid"]:
            assert (new_obs, reward, terminated, truncated) == (obs, 0.0, False, False)
        if terminated or truncated:
            break
        obs = new_obs


@pytest.mark.parametrize("name", names())
@settings(max_examples=30, deadline=None)
@given(seed=SEEDS, picks=st.lists(st.integers(min_value=0, max_value=3), max_size=10))
def test_same_seed_and_actions_give_the_same_episode(name, seed, picks):
    def play() -> list:
        env = make(name)
        history = [env.reset(seed=seed)]
        for pick in picks:
            actions = env.valid_actions()
            history.append(env.step(actions[pick % len(actions)]))
            if history[-1][2] or history[-1][3]:
                break
        return history

    assert play() == play()


DOCS = Path(__file__).resolve().parents[2] / "docs" / "environments.md"


@pytest.mark.parametrize(
    "name, cfg, seed",
    [
        ("sokoban", {}, 1),
        ("sokoban", {}, 2),
        ("sokoban", {"dim_room": (7, 7), "num_boxes": 2, "search_depth": 40, "max_actions": 20}, 0),
        ("frozenlake", {}, 0),
        ("frozenlake", {"random_start_goal": False}, 0),
        ("bandit", {}, 0),
        ("bandit", {"split": "test"}, 0),
    ],
)
def test_docs_show_the_real_observations_and_instructions(name, cfg, seed):
    docs = DOCS.read_text(encoding="utf-8")
    env = make(name, **cfg)
    assert env.reset(seed=seed)[0] in docs
    assert env.instruction in docs
