"""verifiers tasksets through `make("verifiers:TASKSET")`: tasksets written with verifiers' own classes
(tests/envs/verifiers_arith.py), scored by their own rewards, checked, played by the rollout loop and trained on.
They run in .venv-envs (`make test-envs`), where verifiers is installed; elsewhere they skip."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

pytest.importorskip("verifiers.v1")

from env_checks import check_docstring  # noqa: E402
from helpers import AnsweringBackend  # noqa: E402
from ragen2 import envs  # noqa: E402
from ragen2.agent import RolloutConfig, rollout  # noqa: E402
from ragen2.config import load_config  # noqa: E402
from ragen2.envs.check import check_env  # noqa: E402
from ragen2.envs.external.verifiers_env import VerifiersEnv  # noqa: E402
from ragen2.errors import ConfigError, UnknownNameError  # noqa: E402
from ragen2.models import warmstart as ws  # noqa: E402
from ragen2.models.demos import play_demo  # noqa: E402
from ragen2.models.tiny import build_model, build_tokenizer  # noqa: E402
from ragen2.rl.trainer import train  # noqa: E402

SUMS = "verifiers:verifiers_arith"


def numbers(observation: str) -> tuple[int, int]:
    a, b = re.fullmatch(r"What is (\d+) \+ (\d+)\?", observation).groups()
    return int(a), int(b)


def test_the_tasks_rewards_score_the_reply_with_their_weights():
    env = envs.make(SUMS)
    obs, _ = env.reset(seed=1)
    a, b = numbers(obs)
    assert "Reply with the number only." in env.instruction and "Add the two numbers." in env.instruction
    # correct (weight 1) + is_number (weight 0.1)
    assert env.step(str(a + b)) == ("Scored: correct=1, is_number=1; reward 1.1.", pytest.approx(1.1), True, False,
                                    {"action_is_valid": True, "success": True})
    assert env.trace.metrics == {"length": len(str(a + b))}  # the task's metric, recorded as verifiers does
    for reply, reward in [(str(a + b + 1), 0.1), ("seven", 0.0), (f" {a + b}\n", 1.1)]:
        assert env.reset(seed=1)[0] == obs  # the seed decides the task
        _, r, terminated, truncated, info = env.step(reply)
        assert (r, terminated, truncated, info["success"]) == (pytest.approx(reward), True, False, reward > 1)
    assert len({env.reset(seed=s)[0] for s in range(30)}) == 6  # every task of the taskset is reached
    env.reset(seed=1)
    for invalid in ["", "  ", "4\x002"]:  # nothing to score, or not text: the episode goes on
        assert env.step(invalid) == (obs, 0.0, False, False, {"action_is_valid": False, "success": False})


def test_the_taskset_config_reaches_the_taskset_and_is_checked():
    env = envs.make(SUMS, taskset_config={"num_tasks": 40, "high": 99})
    assert len(env.tasks) == 40 and max(max(numbers(t.data.prompt)) for t in env.tasks) > 9
    assert len(envs.make(SUMS, taskset_config={"num_tasks": 40}, max_tasks=5).tasks) == 5
    plugged = envs.make(SUMS, taskset_config={"task": {"rewards": {"correct": {"fn": "verifiers_arith:half"}}}})
    a, b = numbers(plugged.reset(seed=0)[0])
    assert plugged.step(str(a + b))[:2] == ("Scored: correct=0.5, is_number=1; reward 0.6.", pytest.approx(0.6))
    with pytest.raises(ConfigError, match="taskset_config=.*num_tasks"):
        envs.make(SUMS, taskset_config={"num_tasks": "many"})
    with pytest.raises(ConfigError, match="loaded no task"):
        envs.make(SUMS, taskset_config={"num_tasks": 0})


def test_a_reward_function_that_raises_scores_the_reply_zero_as_in_verifiers(caplog):
    env = envs.make(SUMS, taskset_config={"task": {"rewards": {"is_number": {"fn": "verifiers_arith:broken"}}}})
    a, b = numbers(env.reset(seed=0)[0])
    assert env.step(str(a + b)) == ("Scored: nothing; reward 0.", 0.0, True, False,
                                    {"action_is_valid": True, "success": False})
    assert "this reward function is broken" in caplog.text


def test_a_verifiers_environment_passes_the_env_checker_and_documents_its_info_keys():
    env = envs.make(SUMS)
    check_env(env)
    check_docstring(type(env).__doc__, env.info_keys)


def test_bad_names_and_tasks_it_cannot_play_say_what_is_allowed():
    with pytest.raises(UnknownNameError, match="not a verifiers taskset.*exports a Taskset subclass in __all__.*"
                                               "ships with verifiers: .*harbor"):
        envs.make("verifiers:no_such_taskset")
    with pytest.raises(UnknownNameError, match="exports no Taskset subclass"):
        envs.make("verifiers:json")
    with pytest.raises(ConfigError, match="need a runtime for tests_pass, which only verifiers' own harness"):
        envs.make("verifiers:verifiers_sandboxed")


class Adder(AnsweringBackend):
    """Answers the sum at the end of each prompt, `wrong` more than it is."""

    def __init__(self, tokenizer, wrong: int = 0):
        super().__init__(tokenizer)
        self.wrong = wrong

    def answer(self, prompt: str) -> str:
        a, b = map(int, re.findall(r"What is (\d+) \+ (\d+)\?", prompt)[-1])
        return f"I add them.</think><answer>{a + b + self.wrong}</answer>"


@pytest.mark.parametrize(("wrong", "reward"), [(0, 1.1), (1, 0.1)])
def test_the_rollout_loop_plays_a_verifiers_task_to_its_reward(wrong, reward):
    tokenizer = build_tokenizer(["what is add them reply with the number only 0123456789"], vocab_size=300)
    for seed in range(3):
        (traj,) = rollout(Adder(tokenizer, wrong), tokenizer, SUMS, {}, [seed], [0], RolloutConfig(max_turns=2))
        assert traj.episode_return == pytest.approx(reward) and traj.terminated and len(traj.turns) == 1
        assert traj.success == (wrong == 0) and traj.turns[0].format_valid and traj.turns[0].actions_valid


def sum_oracle(env: VerifiersEnv, max_actions: int, rng: np.random.Generator) -> str:
    """The demonstration of a task: its sum (the taskset's own `answer` field)."""
    return f"I add them.</think><answer>{env.task.data.answer}</answer>"


@pytest.mark.slow
def test_a_verifiers_environment_trains_end_to_end(tmp_path, one_thread):
    """Two steps of GRPO on the taskset. The policy is warm-started in seconds on 24 demonstrations (the warm
    start's own demos, tokenizer and SFT) so that it answers in the format and the task's rewards score its
    replies; no learning of sums is asked of it."""
    rng = np.random.default_rng(0)
    demos = [play_demo(SUMS, {}, seed, 1, 1, rng, {VerifiersEnv: sum_oracle}) for seed in range(24)]
    tokenizer = ws.demo_tokenizer(demos, vocab_size=300)
    samples, env_of_sample = ws.demo_samples(demos, tokenizer, [SUMS])
    model = build_model(tokenizer, hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=64)
    settings = ws.make_config(0, {"envs": (SUMS,), "steps": 80, "warmup_steps": 5})
    ws.sft(model, tokenizer, samples, env_of_sample, settings, rng)
    model.save_pretrained(tmp_path / "policy")
    tokenizer.save_pretrained(tmp_path / "policy")
    config = load_config(SUMS, [
        f"model.path={tmp_path / 'policy'}", "model.device=cpu", "rollout.max_turns=1",
        "rollout.max_tokens_per_turn=16", "rollout.num_groups=4", "rollout.group_size=4", "trainer.total_steps=2",
        "trainer.eval_every=0",
        f"trainer.run_dir={tmp_path / 'run'}", "logging.tensorboard=false", "logging.progress=false",
        "collapse.enable=false", "filter.strategy=none",
    ])
    train(config)
    steps = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in steps] == [1, 2], steps
    # replies in the format, scored by the task's rewards (0.1 or 1.1; a malformed turn gets -0.1), and updates made
    assert all(m["rollout/valid_format_rate"] > 0.5 and m["train/grad_norm"] > 0 for m in steps), steps
    assert any(m["rollout/success_rate"] > 0 for m in steps), steps  # some sums right: reward 1.1
