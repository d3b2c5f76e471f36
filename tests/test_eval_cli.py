"""`ragen2 eval MODEL --env A --env B`: several environments and variants in one table."""

from __future__ import annotations

import json
import math

import pytest
import torch

from ragen2.cli import main
from ragen2.config import load_config
from ragen2.errors import ConfigError
from ragen2.eval_cli import evaluate_cli, parse_env
from ragen2.evaluate import evaluate, random_agent
from ragen2.mixture import TaggedEnv
from ragen2.models.loading import load_policy


@pytest.fixture(autouse=True)
def _single_thread(one_thread):
    """One thread: the tiny models run fastest so, and the episodes are reproducible."""


def test_env_values_parse_into_names_variants_and_yaml_lists(tmp_path):
    assert parse_env("bandit") == [TaggedEnv("bandit", {}, "bandit")]
    assert parse_env("sokoban:dim_room=[8, 8]:num_boxes=2") == [
        TaggedEnv("sokoban", {"dim_room": [8, 8], "num_boxes": 2}, "sokoban:dim_room=[8, 8]:num_boxes=2")]
    assert parse_env("textarena:Sudoku-v0") == [TaggedEnv("textarena:Sudoku-v0", {}, "textarena:Sudoku-v0")]
    listed = tmp_path / "ood.yaml"
    listed.write_text("- {name: bandit, kwargs: {split: test}, tag: bandit-test}\n- {name: frozenlake}\n")
    assert parse_env(str(listed)) == [TaggedEnv("bandit", {"split": "test"}, "bandit-test"),
                                      TaggedEnv("frozenlake", {}, "frozenlake")]
    with pytest.raises(ConfigError, match="'num_boxes' must look like key=value"):
        parse_env("sokoban:dim_room=[8, 8]:num_boxes")
    with pytest.raises(ConfigError, match="no such file"):
        parse_env(str(tmp_path / "missing.yaml"))


def test_eval_on_several_envs_gives_each_the_numbers_of_its_own_eval(save_random_policy, tmp_path, monkeypatch,
                                                                       capsys):
    policy_dir = tmp_path / "policy"
    save_random_policy(policy_dir)
    monkeypatch.chdir(tmp_path)
    args = ["eval", str(policy_dir), "rollout.max_tokens_per_turn=8", "--env", "bandit", "--env", "bandit:split=test",
            "--env", "frozenlake:size=5", "--episodes", "3", "--device", "cpu", "--out", "out"]
    assert main(args) == 0
    table = capsys.readouterr().out
    report = json.loads((tmp_path / "out" / "eval.json").read_text())
    tags = ["bandit", "bandit:split=test", "frozenlake:size=5"]
    assert [e["tag"] for e in report["envs"]] == tags
    assert report["envs"][2]["kwargs"] == {**load_config("frozenlake").env.kwargs, "size": 5}  # over the preset's
    assert all(t in table and f"{t}: uniform-random" in table for t in tags)
    assert len(report["verdicts"]) == 3
    # Each environment's row is what a one-environment evaluation with its preset's settings gives.
    policy, tokenizer = load_policy(str(policy_dir), "cpu")
    for tag, env in zip(tags, (TaggedEnv("bandit", {"split": "train"}), TaggedEnv("bandit", {"split": "test"}),
                                TaggedEnv("frozenlake", report["envs"][2]["kwargs"]))):
        preset = load_config(env.name, ["rollout.max_tokens_per_turn=8", "rollout.temperature=0.5"])
        torch.manual_seed(preset.trainer.seed)
        alone, _ = evaluate(policy, tokenizer, env.name, env.kwargs, preset.rollout, 3)
        assert math.isclose(report["results"][tag]["eval/return_mean"], alone["eval/return_mean"])
        baseline = random_agent(env.name, env.kwargs, 3, preset.rollout, seed=preset.trainer.seed)
        assert report["results"][f"{tag}: uniform-random"] == baseline


def test_repeated_envs_are_refused_before_the_model_loads():
    with pytest.raises(ConfigError, match="--env names bandit more than once"):
        evaluate_cli("no-such-model", [TaggedEnv("bandit", {}, "bandit")] * 2, 3, 0.5, "cpu", [], None, True)


def test_a_mixture_runs_start_is_not_compared_with_a_one_environment_eval(save_random_policy, tmp_path, monkeypatch,
                                                                           capsys):
    """Its eval/success_rate pools several environments, each seed played in a group: not this eval's numbers."""
    from ragen2.config import save_config

    run = tmp_path / "runs" / "mix"
    save_random_policy(run / "checkpoints" / "step_1")
    (run / "checkpoints" / "latest").write_text("step_1\n")
    save_config(load_config(None, ["env.mixture=[{name: bandit, groups: 8}]"]), run / "config.yaml")
    (run / "metrics.jsonl").write_text(json.dumps({"step": 0, "eval/success_rate": 0.5, "eval/episodes": 64}) + "\n")
    monkeypatch.chdir(tmp_path)
    args = ["eval", str(run), "rollout.max_tokens_per_turn=8", "--env", "bandit", "--episodes", "2", "--device", "cpu",
            "--no-random", "--samples", "0", "--out", "out"]
    assert main(args) == 0
    assert "run start → this eval: not compared, the run evaluated a mixture" in capsys.readouterr().out
