from __future__ import annotations

import re
from typing import ClassVar

import pytest

import ragen2.envs
from ragen2.agent import (
    GenerationOutput,
    HFBackend,
    RolloutConfig,
    RolloutStats,
    group_seeds,
    rollout,
    summarize,
)
from ragen2.envs.base import TextEnv
from ragen2.errors import ConfigError

GOOD = "Walk.</think><answer>{}</answer>"


class LineEnv(TextEnv):
    """Walk right along a line to a goal at 1 + seed % 3: reward 1 on arrival, terminated there.

    `Right` moves, `Wait` does nothing (valid), anything else is invalid. Seed 13 raises
    on reset and seed 14 raises on its second step: the error-handling cases.
    """

    instruction: ClassVar[str] = "Walk right to the goal. Actions: Right, Wait."
    resets: ClassVar[list[int]] = []

    def __init__(self, max_actions: int = 4):
        self.max_actions = max_actions

    def reset(self, *, seed=None, options=None):
        LineEnv.resets.append(seed)
        if seed == 13:
            raise RuntimeError("cannot build room 13")
        self.seed, self.pos, self.goal, self.steps = seed, 0, 1 + seed % 3, 0
        return self._obs(), {}

    def step(self, action):
        if self.seed == 14 and self.steps == 1:
            raise ValueError("broken step")
        if action not in ("Right", "Wait"):
            return self._obs(), 0.0, False, False, {"action_is_valid": False, "success": False}
        self.steps += 1
        self.pos += action == "Right"
        done = self.pos == self.goal
        truncated = not done and self.steps >= self.max_actions
        return self._obs(), float(done), done, truncated, {"action_is_valid": True, "success": done}

    def valid_actions(self):
        return ["Right", "Wait"]

    def _obs(self):
        return f"pos {self.pos} goal {self.goal}"


class ScriptedBackend:
    """Answers each prompt with `policy(prompt_text, turn)`, encoded (+ EOS); records every call."""

    def __init__(self, tokenizer, policy, eos=True):
        self.tokenizer, self.policy, self.eos = tokenizer, policy, eos
        self.calls: list[list[list[int]]] = []
        self.outputs: list[list[GenerationOutput]] = []

    def generate(self, prompts, *, max_new_tokens, temperature, top_p):
        self.calls.append(prompts)
        outs = []
        for p in prompts:
            text = self.tokenizer.decode(p, skip_special_tokens=False)
            turn = int(re.findall(r"Turn (\d+):", text)[-1])
            response = self.policy(text, turn)
            ids = self.tokenizer.encode(response)[:max_new_tokens] + ([self.tokenizer.eos_token_id] if self.eos else [])
            text = self.tokenizer.decode(ids, skip_special_tokens=True)
            outs.append(GenerationOutput(token_ids=ids, text=text, finish_reason="stop"))
        self.outputs.append(outs)
        return outs


@pytest.fixture(autouse=True)
def line_env(monkeypatch):
    real_make = ragen2.envs.make
    def make(name, **cfg):
        return LineEnv(**cfg) if name == "line" else real_make(name, **cfg)

    monkeypatch.setattr(ragen2.envs, "make", make)
    LineEnv.resets.clear()


def play(tokenizer, policy, seeds, cfg=None, eos=True, **env_kwargs):
    backend = ScriptedBackend(tokenizer, policy, eos)
    stats = RolloutStats()
    group_ids = list(range(len(seeds)))
    trajs = rollout(backend, tokenizer, "line", env_kwargs, seeds, group_ids, cfg or RolloutConfig(), stats)
    return trajs, backend, stats


def test_group_seeds():
    assert group_seeds(10, 3, 2) == ([10, 10, 11, 11, 12, 12], [0, 0, 1, 1, 2, 2])
    with pytest.raises(ConfigError, match="group_size=0"):
        group_seeds(0, 2, 0)


def test_groups_share_their_seed_and_start(tokenizer):
    seeds, gids = group_seeds(0, 3, 2)
    backend = ScriptedBackend(tokenizer, lambda text, turn: GOOD.format("Right"))
    trajs = rollout(backend, tokenizer, "line", {}, seeds, gids, RolloutConfig())
    assert [t.error for t in trajs] == [None] * 6
    assert LineEnv.resets == seeds
    assert [(t.seed, t.group_id) for t in trajs] == list(zip(seeds, gids))
    for a, b in zip(trajs[::2], trajs[1::2]):
        assert a.turns[0].observation == b.turns[0].observation
        assert a.turns[0].prompt_ids == b.turns[0].prompt_ids


def test_rewards_success_and_lockstep_batches(tokenizer):
    trajs, backend, stats = play(tokenizer, lambda text, turn: GOOD.format("Right"), seeds=[0, 1, 2],
                                 cfg=RolloutConfig(max_actions_per_turn=1))
    # goals at 1, 2, 3: one Right per turn, so the episodes take 1, 2 and 3 turns
    assert [len(t.turns) for t in trajs] == [1, 2, 3]
    assert [len(c) for c in backend.calls] == [3, 2, 1]  # one generate call per turn for all active episodes
    for t in trajs:
        assert t.success and t.terminated and not t.truncated and t.error is None
        assert t.episode_return == pytest.approx(1.0)
        assert [turn.reward for turn in t.turns] == [0.0] * (len(t.turns) - 1) + [1.0]
        assert all(turn.format_valid and turn.actions_valid and turn.actions == ["Right"] for turn in t.turns)
    assert stats.generate_calls == 3 and stats.turns == 6
    assert 0 < stats.generate_s <= stats.total_s and 0 <= stats.overhead_fraction < 1


def test_actions_stop_at_termination_and_actions_left_counts_down(tokenizer):
    trajs, _, _ = play(tokenizer, lambda text, turn: GOOD.format("Wait || Right || Right"), seeds=[1])
    [t] = trajs  # goal 2: Wait, Right (turn 1; the third action is over the per-turn cap), Wait, Right (turn 2)
    assert [turn.actions for turn in t.turns] == [["Wait", "Right"], ["Wait", "Right"]]
    assert t.success and t.episode_return == pytest.approx(1.0)
    text = trajs[0].turns[1].prompt_ids
    assert "You have 2 actions left." in tokenizer.decode(text)


def test_malformed_turn_is_penalised_and_the_episode_goes_on(tokenizer):
    policy = lambda text, turn: "no tags at all" if turn == 1 else GOOD.format("Right")  # noqa: E731
    [t], _, _ = play(tokenizer, policy, seeds=[0])
    first, second = t.turns
    assert (first.format_valid, first.actions_valid, first.actions, first.reward) == (False, False, [], -0.1)
    assert second.format_valid and second.reward == 1.0
    assert t.episode_return == pytest.approx(0.9) and t.success


def test_invalid_action_is_penalised_and_later_actions_are_skipped(tokenizer):
    [t], _, _ = play(tokenizer, lambda text, turn: GOOD.format("Jump || Right"), seeds=[0],
                     cfg=RolloutConfig(max_turns=2))
    assert all(turn.format_valid and not turn.actions_valid for turn in t.turns)
    assert [turn.reward for turn in t.turns] == [-0.1, -0.1]
    assert not t.success and t.truncated and not t.terminated  # out of turns: truncation
    assert "pos 0" in t.turns[1].observation  # Right was never applied


def test_end_on_invalid_ends_the_episode_at_a_malformed_turn(tokenizer):
    cfg = RolloutConfig(end_on_invalid=True)
    [t], _, _ = play(tokenizer, lambda text, turn: "oops", seeds=[0], cfg=cfg)
    assert len(t.turns) == 1 and t.truncated and t.episode_return == pytest.approx(-0.1)
    # A well-formed answer with an invalid action is penalised but does not end the episode.
    [t], _, _ = play(tokenizer, lambda text, turn: GOOD.format("Jump"), seeds=[0], cfg=cfg)
    assert len(t.turns) == cfg.max_turns and t.episode_return == pytest.approx(-0.1 * cfg.max_turns)


def test_env_truncation_ends_the_episode(tokenizer):
    [t], _, _ = play(tokenizer, lambda text, turn: GOOD.format("Wait || Wait"), seeds=[0], max_actions=3)
    assert len(t.turns) == 2 and t.truncated and not t.terminated
    assert t.turns[1].actions == ["Wait", "Wait"]


def test_a_raising_env_ends_only_its_episode(tokenizer):
    trajs, _, _ = play(tokenizer, lambda text, turn: GOOD.format("Wait"), seeds=[13, 14, 2],
                       cfg=RolloutConfig(max_turns=3))
    broken_reset, broken_step, fine = trajs
    assert broken_reset.error == "RuntimeError: cannot build room 13" and broken_reset.turns == []
    assert broken_reset.samples == []
    assert broken_step.error == "ValueError: broken step" and len(broken_step.turns) == 2
    assert fine.error is None and len(fine.turns) == 3
    assert summarize(trajs)["rollout/error_rate"] == pytest.approx(2 / 3)


@pytest.mark.parametrize("context_turns", [None, 1])
@pytest.mark.parametrize("eos", [True, False])
def test_loss_mask_covers_exactly_the_generated_tokens(tokenizer, context_turns, eos):
    trajs, backend, _ = play(tokenizer, lambda text, turn: GOOD.format("Right"), seeds=[2, 1],
                             cfg=RolloutConfig(max_actions_per_turn=1, context_turns=context_turns,
                                               memory="full" if context_turns is None else "window"), eos=eos)
    sent = {tuple(p): o.token_ids for ps, outs in zip(backend.calls, backend.outputs) for p, o in zip(ps, outs)}
    for t in trajs:
        assert all(turn.response_ids == sent[tuple(turn.prompt_ids)] for turn in t.turns)  # kept as generated
        if context_turns is None:
            [(ids, mask)] = t.samples
            assert [i for i, m in zip(ids, mask) if m] == [i for turn in t.turns for i in turn.response_ids]
            for turn in t.turns:
                assert ids[: len(turn.prompt_ids)] == turn.prompt_ids
        else:
            assert t.samples == [
                (turn.prompt_ids + turn.response_ids, [0] * len(turn.prompt_ids) + [1] * len(turn.response_ids))
                for turn in t.turns
            ]


def test_turn_records_reasoning_and_its_span(tokenizer):
    [t], _, _ = play(tokenizer, lambda text, turn: "I walk right.</think><answer>Right</answer>", seeds=[0])
    turn = t.turns[0]
    assert turn.reasoning == "I walk right."
    start, end = turn.reasoning_span
    assert tokenizer.decode(turn.response_ids[start:end]) == "I walk right."


def test_summarize_known_values(tokenizer):
    policy = lambda text, turn: "bad" if turn == 1 else GOOD.format("Right")  # noqa: E731
    trajs, _, _ = play(tokenizer, policy, seeds=[0, 1], cfg=RolloutConfig(max_actions_per_turn=1, max_turns=2))
    # seed 0 (goal 1): bad, Right -> success, return 0.9; seed 1 (goal 2): bad, Right -> truncated, return -0.1
    m = summarize(trajs)
    assert m["rollout/success_rate"] == 0.5
    assert m["rollout/return_mean"] == pytest.approx(0.4)
    assert m["rollout/turns_mean"] == 2.0
    assert m["rollout/valid_format_rate"] == 0.5
    assert m["rollout/valid_action_rate"] == 0.5
    assert m["rollout/error_rate"] == 0.0
    lengths = [len(turn.response_ids) for tr in trajs for turn in tr.turns]
    assert m["rollout/response_tokens_mean"] == pytest.approx(sum(lengths) / 4)


def test_config_is_validated():
    with pytest.raises(ConfigError, match="max_turns=0"):
        RolloutConfig(max_turns=0)
    with pytest.raises(ConfigError, match="top_p=0"):
        RolloutConfig(top_p=0)


@pytest.mark.parametrize("env_name", ["sokoban", "frozenlake", "bandit"])
def test_tiny_random_model_on_real_envs(tokenizer, model, env_name):
    """Random text is mostly malformed: nothing raises, and each malformed turn costs exactly the penalty."""
    seeds, gids = group_seeds(0, 2, 2)
    cfg = RolloutConfig(max_turns=2, max_tokens_per_turn=8)
    trajs = rollout(HFBackend(model, tokenizer), tokenizer, env_name, {}, seeds, gids, cfg)
    assert [t.error for t in trajs] == [None] * 4
    for t in trajs:
        assert 1 <= len(t.turns) <= 2 and t.samples
        assert t.episode_return == pytest.approx(sum(turn.reward for turn in t.turns))
        for turn in t.turns:
            assert len(turn.response_ids) <= 8
            if not turn.format_valid:
                assert turn.reward == pytest.approx(cfg.format_penalty)
    assert set(summarize(trajs)) >= {"rollout/success_rate", "rollout/valid_format_rate"}


def _state(prompt_text: str) -> str:
    return prompt_text.rsplit("State:\n", 1)[1].split("\nYou have", 1)[0]


def test_solver_policy_solves_real_sokoban(tokenizer):
    """A scripted policy that reads the state and answers a solver's next two moves wins every episode."""
    from ragen2.envs.sokoban import SokobanEnv

    def policy(text, turn):
        moves = SokobanEnv.from_text(_state(text)).solve()
        return f"The box needs {len(moves)} moves.</think><answer>{' || '.join(moves[:2])}</answer>"

    seeds, gids = group_seeds(100, 4, 1)
    trajs = rollout(ScriptedBackend(tokenizer, policy), tokenizer, "sokoban", {}, seeds, gids, RolloutConfig())
    for t in trajs:
        actions = [a for turn in t.turns for a in turn.actions]
        assert t.success and t.terminated and t.error is None
        assert len(t.turns) == (len(actions) + 1) // 2
        assert t.episode_return == pytest.approx(-0.1 * len(actions) + 1.0 + 10.0)
        assert all(turn.format_valid and turn.actions_valid for turn in t.turns)
    assert summarize(trajs)["rollout/success_rate"] == 1.0


def test_bandit_policy_that_reads_arm_names(tokenizer):
    from ragen2.envs.bandit import ARM_NAMES

    def policy(text, turn):
        arms = _state(text).removeprefix("Arms: ").split(".")[0].split(", ")
        return "Bold names are risky.</think><answer>{}</answer>".format(
            next(a for a in arms if a in ARM_NAMES["train"]["high"]))

    seeds, gids = group_seeds(0, 3, 2)
    trajs = rollout(ScriptedBackend(tokenizer, policy), tokenizer, "bandit", {}, seeds, gids, RolloutConfig())
    assert all(t.success and t.terminated and len(t.turns) == 1 for t in trajs)
    assert all(t.episode_return in (0.0, 1.0) for t in trajs)
