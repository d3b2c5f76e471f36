"""WebShop: the generated catalogue, goals, BM25 search, WebShop's reward, page navigation, the oracle."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from ragen2.envs import make
from ragen2.envs.check import check_env
from ragen2.envs.webshop import WebShopEnv, parse_action
from ragen2.envs.webshop_catalog import (
    PRODUCT_TYPES,
    Goal,
    Product,
    build_catalog,
    make_goal,
    purchase_reward,
    tokenize,
    type_reward,
)
from ragen2.errors import ConfigError

DOCS = Path(__file__).resolve().parents[2] / "docs" / "environments.md"
PRESET = Path(__file__).resolve().parents[2] / "ragen2" / "configs" / "envs" / "webshop.yaml"
NAVIGATION = {"back to search", "next >", "< prev", "description", "buy now"}


def test_catalog_is_seeded_and_well_formed():
    catalog = build_catalog(500, seed=0)
    assert catalog is build_catalog(500, seed=0)  # cached: every env shares it
    other = build_catalog(500, seed=1)
    assert [p.title for p in catalog.products] != [p.title for p in other.products]
    assert len(catalog.products) == 500 and len(catalog.by_asin) == 500
    assert {p.type for p in catalog.products} == set(PRODUCT_TYPES)
    for p in catalog.products:
        assert re.fullmatch(r"B0[A-Z0-9]{8}", p.asin)
        lo, hi = p.type.price_range
        assert lo - 1 <= p.price <= hi and 2 <= len(p.attributes) <= 4
        assert set(p.attributes) <= set(p.type.attributes)
        values = [v for _, vs in p.options for v in vs]
        assert len(values) == len(set(values)) and not set(values) & NAVIGATION


def test_goals_come_from_a_product_that_satisfies_them():
    catalog = build_catalog()
    rng = np.random.default_rng(0)
    for _ in range(300):
        goal = make_goal(catalog, rng)
        product = catalog.by_asin[goal.asin]
        assert purchase_reward(goal, product, dict(goal.options)) == 1.0
        assert goal.instruction.startswith("i need") and goal.instruction.endswith(f"{goal.price_upper:.2f} dollars")
        assert goal.type.name in goal.instruction and all(a in goal.instruction for a in goal.attributes)
        assert product.price <= goal.price_upper


def _product(ptype_name: str, attributes, options, price: float, title: str = "") -> Product:
    ptype = next(t for t in PRODUCT_TYPES if t.name == ptype_name)
    return Product("B0TEST0000", ptype, "Brand", title or f"Brand {ptype.title_noun}", tuple(attributes),
                   tuple((d, tuple(v)) for d, v in options), price, "")  # fmt: skip


def test_reward_follows_the_webshop_formula():
    tshirt = next(t for t in PRODUCT_TYPES if t.name == "t-shirt")
    goal = Goal("B0GOAL0000", tshirt, ("cotton", "slim fit"), (("color", "red"), ("size", "m")), 30.0, "")
    product = _product("t-shirt", ["cotton", "v-neck"], [("color", ["red", "blue"]), ("size", ["s", "m"])], 25.0)
    # 1 of 2 attributes, 1 of 2 options (red chosen, size s chosen), price ok: (1 + 1 + 1) / (2 + 2 + 1)
    assert purchase_reward(goal, product, {"color": "red", "size": "s"}) == pytest.approx(0.6)
    assert purchase_reward(goal, product, {}) == pytest.approx(0.4)  # no options chosen
    expensive = _product("t-shirt", ["cotton", "slim fit"], [("color", ["red"]), ("size", ["m"])], 35.0)
    assert purchase_reward(goal, expensive, {"color": "red", "size": "m"}) == pytest.approx(0.8)
    # Another type scores r_type = 0 when its title shares no word with the goal's type (WebShop's rule) ...
    hoodie = _product("hoodie", ["cotton blend"], [("color", ["red"]), ("size", ["m"])], 20.0)
    assert type_reward(goal, hoodie) == 0.0 and purchase_reward(goal, hoodie, {"color": "red", "size": "m"}) == 0.0
    # ... 1 when it does share the category path, and a title with half the type's words is enough.
    assert type_reward(goal, _product("hoodie", [], [], 1.0, title="Brand Shirt Hoodie")) == 1.0
    assert type_reward(goal, _product("headphones", [], [], 1.0, title="Shirt Headphones")) == 1.0
    assert type_reward(goal, product) == 1.0


def test_search_ranks_matching_products_first():
    catalog = build_catalog()
    results = catalog.search("noise cancelling headphones")
    assert 0 < len(results) <= 50
    assert all(p.type.name == "headphones" for p in results[:10])
    assert "noise cancelling" in results[0].attributes
    assert catalog.search("") == [] and catalog.search("!!!") == [] and catalog.search("zzzqqq") == []
    assert tokenize("T-Shirt, 12 oz!") == ["t", "shirt", "12", "oz"]


@pytest.mark.parametrize(
    "text, parsed",
    [
        ("search[red t-shirt]", ("search", "red t-shirt")),
        ("  Click [ Buy  Now ] ", ("click", "Buy Now")),
        ("click[]", None),
        ("buy now", None),
        ("search[a] || click[b]", None),
    ],
)
def test_parse_action(text, parsed):
    assert parse_action(text) == parsed


def test_oracle_buys_the_right_product_within_the_action_budget():
    env = make("webshop")
    lengths = []
    for seed in range(300):
        env.reset(seed=seed)
        plan = env.solve()
        lengths.append(len(plan))
        for action in plan:
            obs, reward, terminated, truncated, info = env.step(action)
        assert (reward, terminated, truncated, info["success"]) == (1.0, True, False, True), seed
        assert obs.startswith("You bought") and obs.endswith("Reward: 1.00.")
    assert max(lengths) <= env.max_actions


def test_navigation_pages_options_and_description():
    env = make("webshop")
    env.reset(seed=0)
    env.step("search[black]")  # a colour: many products, every page full
    obs = env.step("click[next >]")[0]
    assert "(page 2 of 5, 50 results)" in obs and "click[< prev]" in obs
    for _ in range(3):
        obs = env.step("click[next >]")[0]
    assert "(page 5 of 5" in obs and "click[next >]" not in obs
    first_id = re.search(r"\[(B0\w+)\]", obs).group(1)
    obs = env.step(f"click[{first_id.lower()}]")[0]  # ids match ignoring case
    values = re.findall(r"^(\w+): (.*) \(chosen: none\)$", obs, flags=re.M)
    first_value = re.search(r"\[([^\]]+)\]", values[0][1]).group(1)
    obs = env.step(f"click[{first_value}]")[0]
    assert f"(chosen: {first_value})" in obs
    assert env.step("click[description]")[0].split("\n")[2].startswith("Description: The ")
    back = env.step("click[< prev]")[0]
    assert f"(chosen: {first_value})" in back  # choices survive the description page
    assert "(page 5 of 5" in env.step("click[< prev]")[0]
    assert env.step("click[back to search]")[0].endswith("Available actions: search[<keywords>]")


def test_every_page_lists_exactly_its_valid_actions():
    env = make("webshop")
    rng = np.random.default_rng(0)
    for seed in range(30):
        obs, _ = env.reset(seed=seed)
        for _ in range(env.max_actions):
            listed = obs.rpartition("Available actions: ")[2]
            actions = env.valid_actions()
            if listed == "search[<keywords>]":
                assert all(a.startswith("search[") for a in actions)
            else:
                assert listed == ", ".join(actions)
            obs, _, terminated, truncated, _ = env.step(actions[rng.integers(len(actions))])
            if terminated or truncated:
                break


@pytest.mark.parametrize("action", ["click[buy now]", "search[again]", "click[B0NOTHERE1]", "go home", "click[]"])
def test_invalid_actions_change_nothing_and_do_not_count(action):
    env = make("webshop", max_actions=2)
    env.reset(seed=0)
    obs = env.step("search[tea]")[0]
    assert env.step(action) == (obs, 0.0, False, False, {"action_is_valid": False, "success": False})
    obs, reward, terminated, truncated, _ = env.step("click[back to search]")
    assert (reward, terminated, truncated) == (0.0, False, True)  # the second valid action


def test_buying_something_else_earns_partial_credit():
    env = make("webshop")
    env.reset(seed=0)
    goal = env.goal
    env.step(f"search[{goal.type.name}]")
    obs = env.step(f"click[{next(a for a in env.valid_actions() if goal.asin not in a and 'B0' in a)[6:-1]}]")[0]
    obs, reward, terminated, _, info = env.step("click[buy now]")  # no options chosen
    assert terminated and not info["success"] and 0 < reward < 1
    assert f"Reward: {reward:.2f}." in obs and "(no options chosen)" in obs


def test_random_agent_rarely_succeeds():
    env = make("webshop")
    rng = np.random.default_rng(0)
    successes, rewards = 0, []
    for seed in range(200):
        env.reset(seed=seed)
        total = 0.0
        while True:
            actions = env.valid_actions()
            _, reward, terminated, truncated, info = env.step(actions[rng.integers(len(actions))])
            total += reward
            if terminated or truncated:
                break
        successes += info["success"]
        rewards.append(total)
    assert successes <= 2 and np.mean(rewards) < 0.1


@settings(max_examples=100, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), texts=st.lists(st.one_of(st.text(max_size=30), st.sampled_from(
    ["search[red]", "click[next >]", "click[buy now]", "click[< prev]", "CLICK[back to search]"])), max_size=10))
def test_arbitrary_text_never_raises(seed, texts):  # fmt: skip
    env = make("webshop")
    obs, _ = env.reset(seed=seed)
    for text in texts:
        new_obs, reward, terminated, truncated, info = env.step(text)
        if not info["action_is_valid"]:
            assert (new_obs, reward, terminated, truncated) == (obs, 0.0, False, False)
        if terminated or truncated:
            break
        obs = new_obs


def test_checker_and_seeds():
    env = make("webshop", num_products=100, catalog_seed=3)
    check_env(env, seeds=range(10))
    assert [env.reset(seed=s)[0] for s in range(20)] == [env.reset(seed=s)[0] for s in range(20)]
    assert len({env.reset(seed=s)[0] for s in range(20)}) == 20


@pytest.mark.parametrize(
    "cfg, match",
    [
        ({"num_products": 3}, "num_products=3"),
        ({"max_actions": 0}, "max_actions=0"),
        ({"backend": "amazon"}, "backend='amazon'"),
        ({"backend": "original"}, "needs WebShop installed"),
    ],
)
def test_bad_config_names_the_parameter(cfg, match):
    with pytest.raises(ConfigError, match=match):
        WebShopEnv(**cfg)


def test_preset_builds_the_env():
    preset = yaml.safe_load(PRESET.read_text())
    env = make(preset["env"]["name"], **preset["env"]["kwargs"])
    assert isinstance(env, WebShopEnv) and preset["rollout"]["max_turns"] >= env.max_actions


def test_docs_show_real_pages():
    docs = DOCS.read_text(encoding="utf-8")
    env = make("webshop")
    assert env.instruction in docs
    pages = [env.reset(seed=0)[0]] + [env.step(a)[0] for a in env.solve()]
    for page in (pages[0], pages[1], pages[2], pages[-1]):  # search, results, item, bought
        assert f"```text\n{page}\n```" in docs
