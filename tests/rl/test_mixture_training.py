"""Training and evaluating on a mixture: per-tag rollout, filter, MI and evaluation metrics, with a policy that
answers in format (the small Bandit warm start) on Bandit's training names and on its held-out ones."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from ragen2.config import load_config
from ragen2.evaluate import evaluate, evaluate_mixture
from ragen2.mixture import TaggedEnv
from ragen2.models.loading import load_policy
from ragen2.rl import trainer
from ragen2.tracking import read_metrics

METRICS_DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"
TAGS = ("train-names", "test-names")
MIX = ("env.mixture=[{name: bandit, tag: train-names, groups: 2}, "
       "{name: bandit, kwargs: {split: test}, tag: test-names, groups: 2}]")


@pytest.fixture(autouse=True)
def _single_thread(one_thread):
    """One thread: the tiny models run fastest so, and the runs are reproducible."""


def mixture_config(policy: Path, run_dir: Path, *overrides: str):
    return load_config("bandit", [
        f"model.path={policy}", "model.device=cpu", f"trainer.run_dir={run_dir}", MIX,
        "rollout.num_groups=4", "rollout.group_size=4", "trainer.total_steps=1", "trainer.eval_every=1",
        "trainer.eval_episodes=8", "collapse.num_samples=16", "logging.progress=false", "logging.tensorboard=false",
        *overrides,
    ])


def test_a_mixture_logs_every_metric_per_tag_and_the_totals_agree(small_bandit_policy, tmp_path):
    run_dir = tmp_path / "run"
    trainer.train(mixture_config(small_bandit_policy, run_dir, "filter.scope=tag", "filter.strategy=top_k",
                                 "filter.value=0.5", "filter.include_zero=true",
                                 "env.eval=[{tag: train-names}, {tag: test-names, episodes: 12}]"))
    step0, step1 = read_metrics(run_dir)
    # Rollout: each tag has 2 groups x 4 episodes, so the batch's rates are the mean of the tags'.
    for key in ("success_rate", "return_mean", "turns_mean"):
        assert math.isclose(step1[f"rollout/{key}"], np.mean([step1[f"rollout/{t}/{key}"] for t in TAGS]))
    assert step1["rollout/train-names/valid_format_rate"] > 0.5  # the warm start answers in format
    # Filter within each tag: top_k 0.5 keeps 1 of each tag's 2 groups.
    assert [step1[f"filter/{t}/kept_ratio"] for t in TAGS] == [0.5, 0.5] and step1["filter/kept_groups"] == 2
    # MI within each tag: its own 2 groups' first prompts are the columns, so chance is 1/2.
    for t in TAGS:
        assert step1[f"collapse_first_turn/{t}/num_inputs"] == 2
        assert step1[f"collapse_first_turn/{t}/chance_level"] == 0.5
    # Evaluation: 8 and 12 episodes in groups of 4; the total pools them.
    assert [step1[f"eval/{t}/episodes"] for t in TAGS] == [8, 12] and step1["eval/episodes"] == 20
    pooled = (8 * step1["eval/train-names/success_rate"] + 12 * step1["eval/test-names/success_rate"]) / 20
    assert math.isclose(step1["eval/success_rate"], pooled)
    assert all(step1[f"eval/{t}/pass@4"] >= step1[f"eval/{t}/success_rate"] for t in TAGS)
    assert step0["eval/test-names/episodes"] == 12  # the evaluation before training, too
    # MI on held-out first turns, per tag: one column per held-out seed (8 / 4 and 12 / 4 of them).
    assert [step1[f"collapse_eval/{t}/num_inputs"] for t in TAGS] == [2, 3]
    assert step0["collapse_eval/test-names/chance_level"] == 1 / 3
    # Every per-tag key is documented: a `<namespace>/<tag>/<metric>` row, and the metric without the tag.
    documented = set(re.findall(r"^\| `([^`]+)` \|", METRICS_DOC.read_text(), flags=re.MULTILINE))
    tagged = [k.split("/") for r in (step0, step1) for k in r if re.search(f"/({'|'.join(TAGS)})/", k)]

    def row(ns: str, metric: str) -> str:  # its own row, or the namespace's `<metric>` row
        own = f"{ns}/<tag>/{'pass@<k>' if metric.startswith('pass@') else metric}"
        return own if own in documented else f"{ns}/<tag>/<metric>"

    assert {row(ns, metric) for ns, _, metric in tagged} - documented == set()
    untagged = {"collapse_eval": "collapse_first_turn"}  # held-out proxies: the first-turn ones, on other episodes
    assert {f"{untagged.get(ns, ns)}/{metric}" for ns, _, metric in tagged if not metric.startswith("pass@")} \
        - documented == set()


def test_evaluating_a_mixture_of_one_equals_evaluate_and_pass_at_k_counts_its_groups(small_bandit_policy):
    policy, tokenizer = load_policy(str(small_bandit_policy), "cpu")
    cfg = load_config("bandit").rollout
    torch.manual_seed(0)
    single, _ = evaluate(policy, tokenizer, "bandit", {}, cfg, 6)
    torch.manual_seed(0)
    mixed, _ = evaluate_mixture(policy, tokenizer, [TaggedEnv("bandit", {}, "b", 6)], cfg, group_size=1)
    assert mixed["eval/b/success_rate"] == mixed["eval/success_rate"] == single["eval/success_rate"]
    assert mixed["eval/b/pass@1"] == single["eval/success_rate"]

    torch.manual_seed(1)
    metrics, episodes = evaluate_mixture(policy, tokenizer, [TaggedEnv("bandit", {}, "a", 8),
                                                             TaggedEnv("bandit", {"split": "test"}, "b", 12)], cfg, 4)
    for tag, n in (("a", 8), ("b", 12)):
        mine = [e for e in episodes if e.tag == tag]
        assert len(mine) == n and all(len({e.seed for e in mine[g:g + 4]}) == 1 for g in range(0, n, 4))
        groups = np.array([e.success for e in mine]).reshape(-1, 4)
        assert metrics[f"eval/{tag}/pass@4"] == groups.any(axis=1).mean()
        assert metrics[f"eval/{tag}/success_rate"] == groups.mean()


def test_planning_mix_trains_and_evaluates_in_and_out_of_distribution(policy_dir, tmp_path):
    run_dir = tmp_path / "run"
    trainer.train(load_config("planning-mix", [
        f"model.path={policy_dir}", "model.device=cpu", f"trainer.run_dir={run_dir}", "rollout.group_size=2",
        "rollout.max_tokens_per_turn=8", "rollout.max_turns=1", "trainer.total_steps=1", "trainer.eval_every=1",
        "trainer.eval_episodes=2", "filter.include_zero=true", "collapse.num_samples=8", "logging.progress=false",
        "logging.tensorboard=false",
    ]))
    last = read_metrics(run_dir)[-1]
    trained = ("sokoban", "frozenlake", "bandit")
    assert [last[f"rollout/{t}/turns_mean"] for t in trained] == [1.0, 1.0, 1.0]
    assert sum(last[f"filter/{t}/kept_ratio"] * n for t, n in zip(trained, (3, 3, 2))) == last["filter/kept_groups"]
    held_out = ("sokoban-8x8", "sokoban-symbols", "frozenlake-5x5", "frozenlake-slippery", "bandit-test")
    assert all(last[f"eval/{t}/episodes"] == 2 and f"eval/{t}/pass@2" in last for t in trained + held_out)
    assert run_dir.joinpath("config.yaml").read_text().count("tag: sokoban-8x8") == 1
