"""OpenEnv environments through `make("openenv:MODULE:CLASS")`: environments written with openenv-core's own
classes (tests/envs/openenv_guess.py), run in the process, checked, and played by the rollout loop."""

from __future__ import annotations

import pytest

pytest.importorskip("openenv")

from env_checks import check_docstring  # noqa: E402
from helpers import AnsweringBackend  # noqa: E402
from ragen2 import envs  # noqa: E402
from ragen2.agent import RolloutConfig, rollout  # noqa: E402
from ragen2.envs.check import check_env  # noqa: E402
from ragen2.errors import ConfigError  # noqa: E402
from ragen2.models.tiny import build_tokenizer  # noqa: E402

GUESS = "openenv:openenv_guess:GuessEnvironment"


def play(env, seed: int, high: int = 9) -> tuple[int, list[str]]:
    """Binary search with the hints: the number and the observations seen."""
    seen = [env.reset(seed=seed)[0]]
    low = 1
    while True:
        guess = (low + high) // 2
        obs, reward, terminated, truncated, info = env.step(f'{{"guess": {guess}}}')
        seen.append(obs)
        if terminated:
            assert reward == 1.0 and info == {"action_is_valid": True, "success": True}
            return guess, seen
        low, high = (guess + 1, high) if obs == "Higher." else (low, guess - 1)


def test_a_json_action_plays_the_environment_and_its_hints_lead_to_the_number():
    env = envs.make(GUESS, max_actions=5)
    number, seen = play(env, seed=3)
    assert seen[0] == "Guess a number from 1 to 9." and seen[-1] == "Right."
    assert play(envs.make(GUESS, max_actions=5), seed=3)[0] == number  # the seed decides the number
    assert len({play(env, seed=s)[0] for s in range(20)}) > 3
    assert '{"guess": {"title": "Guess", "type": "integer"}}' in env.instruction and "Guess the hidden number" in env.instruction


def test_refused_actions_are_invalid_and_the_budget_truncates():
    env = envs.make(GUESS, max_actions=2, init_kwargs={"high": 100})
    obs, _ = env.reset(seed=0)
    for bad in ["5", '{"guess": "five"}', '{"gues": 5}', "not json"]:
        assert env.step(bad) == (obs, 0.0, False, False, {"action_is_valid": False, "success": False})
    number = play(envs.make(GUESS, max_actions=10, init_kwargs={"high": 100}), seed=0, high=100)[0]
    wrong = 1 if number != 1 else 2
    assert env.step(f'{{"guess": {wrong}}}')[2:4] == (False, False)
    assert env.step(f'{{"guess": {wrong}}}')[2:4] == (False, True)  # two actions: truncated


def test_a_single_text_field_is_written_as_plain_text_and_other_fields_become_json():
    env = envs.make("openenv:openenv_guess:EchoEnvironment")
    assert env.reset(seed=0)[0] == '{"echoed": "ready", "length": 0}'
    obs, reward, terminated, _, info = env.step("hello")
    assert obs == '{"echoed": "hello", "length": 5}' and reward == pytest.approx(0.5) and not terminated
    assert info == {"action_is_valid": True, "success": False} and "plain text" in env.instruction


def test_an_openenv_environment_passes_the_env_checker_and_documents_its_info_keys():
    env = envs.make(GUESS, max_actions=4)
    check_env(env)  # the echo environment takes any text, so it has no invalid action to check
    check_docstring(type(env).__doc__, env.info_keys)


def test_bad_targets_name_the_fix():
    with pytest.raises(ConfigError, match="use MODULE:CLASS"):
        envs.make("openenv:GuessEnvironment")
    with pytest.raises(ConfigError, match="cannot import it"):
        envs.make("openenv:openenv_guess:Nope")
    with pytest.raises(ConfigError, match="is not an openenv Environment class"):
        envs.make("openenv:openenv_guess:GuessAction")


class Guesser(AnsweringBackend):
    """Plays the binary search (one episode): it reads the hint at the end of each prompt."""

    low, high, guess = 1, 9, None

    def answer(self, prompt: str) -> str:
        hint = prompt.rsplit("State:\n", 1)[1]
        if self.guess is not None:
            self.low, self.high = (self.guess + 1, self.high) if hint.startswith("Higher") else (self.low, self.guess - 1)
        self.guess = (self.low + self.high) // 2
        return f'I guess {self.guess}.</think><answer>{{"guess": {self.guess}}}</answer>'


def test_the_rollout_loop_plays_an_openenv_environment_to_success():
    tokenizer = build_tokenizer(["guess higher lower right"], vocab_size=300)
    for seed in range(3):
        backend = Guesser(tokenizer)
        (traj,) = rollout(backend, tokenizer, GUESS, {"max_actions": 5}, [seed], [0],
                          RolloutConfig(max_turns=5, max_actions_per_turn=1))
        assert traj.success and traj.terminated and traj.episode_return == 1.0
        assert all(turn.format_valid and turn.actions_valid for turn in traj.turns)
