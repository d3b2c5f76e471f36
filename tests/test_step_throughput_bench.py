"""benchmarks/step_throughput.py: TRL's side sees ragen2's prompts and gets ragen2's rewards; a tiny run works."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

from ragen2.agent import rollout
from ragen2.agent.types import GenerationOutput
from ragen2.config import load_config

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "step_throughput.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("step_throughput", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def tokenizer(policy_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(policy_dir)


class _ScriptedBackend:
    """Returns fixed responses, one per prompt in turn, so the rollout's rewards are known inputs."""

    def __init__(self, tokenizer, texts: list[str]):
        self.tokenizer, self.texts = tokenizer, texts

    def generate(self, prompts, *, max_new_tokens, temperature, top_p):
        return [GenerationOutput(token_ids=self.tokenizer.encode(t, add_special_tokens=False), text=t,
                                 finish_reason="stop") for t in self.texts[: len(prompts)]]


def test_reward_function_gives_the_rollouts_rewards(bench, tokenizer):
    config = load_config("bandit", ["rollout.max_turns=1"])
    seeds = list(range(40, 48)) * 2
    # Per seed: the risky arm (random payoff), the safe arm, an unknown arm, a malformed answer.
    arms = []
    from ragen2 import envs

    for s in seeds:
        env = envs.make("bandit", **config.env.kwargs)
        env.reset(seed=s)
        arms.append((env.high_arm, env.low_arm))
    texts = []
    for i, (high, low) in enumerate(arms):
        texts.append([f"<think>risky</think><answer>{high}</answer>", f"<think>safe</think><answer>{low}</answer>",
                      "<think>?</think><answer>Nobody</answer>", f"{high} no tags"][i % 4])
    trajectories = rollout(_ScriptedBackend(tokenizer, texts), tokenizer, "bandit", config.env.kwargs, seeds,
                           list(range(len(seeds))), cfg=config.rollout)
    expected = [t.episode_return for t in trajectories]
    got = [bench.ragen2_turn_reward(text, s, config) for text, s in zip(texts, seeds)]
    assert got == expected
    assert {0.1, -0.1} <= set(got)  # the safe arm and the format penalty both occur


def test_trl_prompt_is_ragen2s_prompt(bench, policy_dir):
    from ragen2.models.loading import load_policy

    config = load_config("bandit", [f"model.path={policy_dir}", "rollout.num_groups=2"])
    _, tok = load_policy(str(policy_dir), device="cpu")
    seeds = bench.bandit_seeds(config, 2)
    assert len(seeds) == 4 and seeds[1] == seeds[0] + 1
    text = bench.bandit_prompt(tok, config, seeds[0])  # raises when TRL would tokenise differently
    assert text.endswith("<think>") and "Which arm do you pull?" in text


def _run(bench, monkeypatch, argv: list[str]) -> None:
    monkeypatch.setattr(sys, "argv", ["step_throughput.py", *argv])
    threads = torch.get_num_threads()
    try:
        bench.main()
    finally:
        torch.set_num_threads(threads)


def test_without_trl_part_2_says_how_to_install_it(bench, policy_dir, monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(bench, "trl_available", lambda: False)
    out = tmp_path / "r.json"
    _run(bench, monkeypatch, ["--model", str(policy_dir), "--threads", "1", "--steps", "2", "--out", str(out),
                              "env.name=bandit", "rollout.num_groups=2", "rollout.group_size=2",
                              "rollout.max_tokens_per_turn=8", "rollout.max_turns=1", "collapse.num_samples=4"])
    printed = capsys.readouterr().out
    assert "pip install 'ragen2[trl]'" in printed
    result = json.loads(out.read_text())
    assert result["default"]["step_s"] > 0 and "rollout" in result["default"]["phases"]
    assert result["default"]["phases"]["collapse"]["from_warmup_step"]  # step 1 only, the warm-up step
    assert "skipped" in result["trl_comparison"]


@pytest.mark.slow
def test_tiny_comparison_runs_both_sides(bench, policy_dir, monkeypatch, tmp_path):
    pytest.importorskip("trl")
    out = tmp_path / "r.json"
    _run(bench, monkeypatch, ["--model", str(policy_dir), "--threads", "1", "--skip-default", "--groups", "2",
                              "--group-size", "2", "--max-new-tokens", "8", "--micro-batch-size", "2",
                              "--bandit-steps", "2", "--repeats", "1", "--out", str(out)])
    result = json.loads(out.read_text())["trl_comparison"]
    for side in ("ragen2", "trl"):
        assert result["summary"][side]["steps_measured"] == 1
        assert 0 < result["summary"][side]["tokens_per_step"] <= 2 * 2 * 8
    assert result["ratio_ragen2_over_trl"] > 0
