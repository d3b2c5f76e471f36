"""Mixtures: resolving `env.mixture` / `env.eval`, their errors, and the per-tag filter and pass@k."""

from __future__ import annotations

import numpy as np
import pytest

from ragen2.config import load_config
from ragen2.errors import ConfigError
from ragen2.evaluate import pass_at_k
from ragen2.filtering import FilterRule, select_groups, select_groups_by_tag
from ragen2.mixture import TaggedEnv, apportion, eval_envs, label, per_group, tagged_metrics, training_envs

MIX = "env.mixture=[{name: sokoban, groups: 2}, {name: bandit, kwargs: {split: test}, tag: bandit-test, groups: 6}]"


def test_single_environment_form_is_a_one_element_mixture():
    config = load_config("frozenlake", ["rollout.num_groups=5", "trainer.eval_episodes=7"])
    assert training_envs(config) == [TaggedEnv("frozenlake", config.env.kwargs, "frozenlake", 5)]
    assert eval_envs(config) == [TaggedEnv("frozenlake", config.env.kwargs, "frozenlake", 7)]
    assert label(config) == "frozenlake"


def test_groups_tags_and_evaluation_entries_resolve():
    config = load_config(None, [MIX, "env.eval=[{tag: sokoban}, {name: sokoban, kwargs: {dim_room: [8, 8]}, "
                                     "tag: sokoban-big, episodes: 16}]"])
    train = training_envs(config)
    assert [(t.tag, t.count) for t in train] == [("sokoban", 2), ("bandit-test", 6)]
    assert [t.tag for t in per_group(train)] == ["sokoban"] * 2 + ["bandit-test"] * 6
    assert [(t.tag, t.name, t.kwargs, t.count) for t in eval_envs(config)] == [
        ("sokoban", "sokoban", {}, 64), ("sokoban-big", "sokoban", {"dim_room": [8, 8]}, 16)]
    assert label(config) == "sokoban+bandit-test"


def test_weights_split_the_groups_by_largest_remainder():
    assert apportion(8, [1, 1, 1]) == [3, 3, 2]  # 2.67 each: the earlier entries get the two left over
    assert apportion(10, [3, 1]) == [8, 2]  # 7.5 and 2.5: tie on .5, the earlier entry wins
    assert apportion(8, [0.2, 0.5, 0.3]) == [2, 4, 2]  # 1.6, 4.0, 2.4
    config = load_config(None, ["env.mixture=[{name: sokoban, weight: 3}, {name: frozenlake}]",
                                "rollout.num_groups=10"])
    assert [t.count for t in training_envs(config)] == [8, 2]  # frozenlake's weight defaults to 1


@pytest.mark.parametrize("overrides, message", [
    (["env.mixture=[]"], "env.mixture is empty: list at least one environment"),
    (["env.mixture=[{name: sokoban, groups: 2.5}, {name: bandit, groups: 6}]"],
     r"env.mixture\[0\].groups=2.5 must be an integer"),
    (["env.mixture=[{name: sokoban, groups: 3}, {name: bandit, groups: 3}]"],
     "env.mixture's groups sum to 6, but rollout.num_groups=8: set rollout.num_groups=6"),
    (["env.mixture=[{name: sokoban, groups: 8}, {name: bandit}]"], r"env.mixture\[1\] has no groups while other"),
    (["env.mixture=[{name: sokoban, groups: 8, weight: 1}]"], r"env.mixture\[0\] sets both groups and weight"),
    (["env.mixture=[{name: sokoban, groups: 4}, {name: sokoban, groups: 4}]"],
     r"env.mixture\[1\].tag='sokoban' repeats env.mixture\[0\]'s tag"),
    (["env.mixture=[{name: sokobn, groups: 8}]"], r"env.mixture\[0\].name='sokobn' is not a registered.*sokoban"),
    (["env.mixture=[{name: sokoban, groups: 8, kwargs: {num_boxes: 0}}]"],
     r"env.mixture\[0\].kwargs for 'sokoban': num_boxes=0 is not allowed"),
    (["env.mixture=[{name: sokoban, groups: 8, tag: a/b}]"], r"tag='a/b' is not allowed: use a non-empty name"),
    (["env.mixture=[{name: sokoban, groups: 8, nme: x}]"], r"unknown config key 'env.mixture\[0\].nme'"),
    (["env.mixture=[{name: sokoban, weight: 1}, {name: bandit, weight: 30}]"],
     "rollout.num_groups=8 split by weight leaves no group to sokoban"),
    ([MIX, "env.eval=[{tag: sokobn}]"], r"env.eval\[0\].tag='sokobn' is not a training tag; training tags: "
                                        r"sokoban, bandit-test.*Did you mean: sokoban"),
    ([MIX, "env.eval=[]"], "env.eval is empty"),
    ([MIX, "env.eval=[{tag: sokoban, episodes: 12}]"],
     r"env.eval\[0\].episodes=12 is not allowed.*multiple of rollout.group_size=8"),
    ([MIX, "trainer.eval_episodes=12"], "trainer.eval_episodes=12 must be a multiple of rollout.group_size=8"),
    ([MIX, "env.eval=[{tag: sokoban}, {name: bandit, tag: sokoban}]"], r"env.eval\[1\].tag='sokoban' repeats"),
    ([MIX, "filter.scope=tag", "filter.level=anchor", "algo.name=gigpo"], "filter.scope=tag ranks prompt groups"),
])
def test_bad_mixtures_are_refused_naming_the_key(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, overrides)


def test_per_tag_filter_keeps_the_same_fraction_of_each_tag():
    # Tag a's returns are on Sokoban's scale (+10), tag b's on Bandit's (0/1): ranked together, a wins every slot.
    rewards = np.array([[10, 0], [10, -1], [0, 3], [1, 0], [0, 0], [1, 1]], float)  # [P=6, G=2]
    tags = ["a", "a", "a", "b", "b", "b"]
    rule = FilterRule(strategy="top_k", value=0.5, include_zero=True)
    assert select_groups(rewards, rule).tolist() == [0, 1, 2]
    assert select_groups_by_tag(rewards, tags, rule).tolist() == [1, 3]  # int(0.5 * 3) = 1 of each
    # Interleaved tags map back to the batch's indices; measured scores are split with the rewards.
    scores = np.arange(12, dtype=float).reshape(6, 2)
    kept = select_groups_by_tag(rewards, ["b", "a"] * 3, FilterRule(strategy="top_k", value=0.4, metric="length"), scores)
    assert kept.tolist() == [4, 5]  # the longest group of each tag


def test_pass_at_k_counts_groups_with_a_success():
    assert pass_at_k(np.array([[0, 0, 1], [0, 0, 0], [1, 1, 0], [0, 0, 0]], bool)) == 0.5
    assert pass_at_k(np.zeros((0, 3), bool)) == 0.0


def test_tagged_metrics_rename_under_the_namespace():
    out = tagged_metrics(lambda xs: {"rollout/n": float(len(xs)), "eval/sum": float(sum(xs))}, [1, 2, 3], "aba")
    assert out == {"rollout/a/n": 2.0, "eval/a/sum": 4.0, "rollout/b/n": 1.0, "eval/b/sum": 2.0}


def test_the_presets_train_on_their_mixtures_and_evaluate_out_of_distribution():
    planning, tools = load_config("planning-mix"), load_config("tools-mix")
    assert [(t.tag, t.count) for t in training_envs(planning)] == [("sokoban", 3), ("frozenlake", 3), ("bandit", 2)]
    assert [t.tag for t in training_envs(tools)] == ["countdown", "math", "searchqa", "code", "webshop"]
    held_out = [t.tag for t in eval_envs(planning) if t.tag not in label(planning).split("+")]
    assert held_out == ["sokoban-8x8", "sokoban-symbols", "frozenlake-5x5", "frozenlake-slippery", "bandit-test"]
    assert [t.kwargs for t in eval_envs(tools) if t.tag == "countdown-6"] == [
        {"min_numbers": 5, "max_numbers": 6, "max_value": 20, "min_target": 10, "max_target": 100}]


def test_evaluation_environments_without_a_mixture_tag_the_single_environment_by_its_name():
    big = "{name: sokoban, kwargs: {dim_room: [8, 8]}, tag: big}"
    config = load_config("sokoban", [f"env.eval=[{{tag: sokoban}}, {big}]"])
    assert [(t.tag, t.kwargs, t.count) for t in eval_envs(config)] == [
        ("sokoban", config.env.kwargs, 64), ("big", {"dim_room": [8, 8]}, 64)]
    assert training_envs(config) == [TaggedEnv("sokoban", config.env.kwargs, "sokoban", 8)]
    assert label(config) == "sokoban"
    with pytest.raises(ConfigError, match=r"env.eval\[0\].tag='bandit' is not a training tag; training tags: sokoban"):
        load_config("sokoban", ["env.eval=[{tag: bandit}]"])
