"""Memory notes (`rollout.memory=summary`): a note is a sampled turn trained as sampled, each segment is trained in
exactly the context it was generated in, prompts stay under the budget, and the corridor needs the note."""

from __future__ import annotations

import re

import numpy as np
import pytest

from ragen2.agent import GenerationOutput, RolloutConfig, rollout, summarize
from ragen2.agent.conversation import MEMORY_REQUEST, MemorySettings
from ragen2.agent.parsing import parse_note
from ragen2.config import load_config
from ragen2.errors import ConfigError
from ragen2.models.demos import play_demo
from ragen2.models.warmstart import demo_tokenizer
from ragen2.rl.advantages import turn_values_to_tokens
from ragen2.rl.batch import build_batch

SIGN = re.compile(r"the exit is the (\w+) door", re.IGNORECASE)


def exit_color(trajectory) -> str:
    return SIGN.search(trajectory.turns[0].observation).group(1)


@pytest.fixture(scope="module")
def tokenizer():
    """The corridor's demonstration tokenizer (memory tags as single tokens, as tiny:corridor has them)."""
    rng = np.random.default_rng(0)
    return demo_tokenizer([play_demo("corridor", {}, s, 7, 1, rng) for s in range(50)], 1024)


class ReaderBackend:
    """A policy that reads its context: it notes the exit's colour when asked, and opens the door its context names
    (red when it names none). `pad` fills every response up to the token cap, the longest a response can be."""

    def __init__(self, tokenizer, pad: bool = False):
        self.tokenizer, self.pad = tokenizer, pad
        self.sent: dict[tuple[int, ...], list[int]] = {}

    def generate(self, prompts, *, max_new_tokens, temperature, top_p, **_):
        outs = []
        for prompt in prompts:
            text = self.tokenizer.decode(prompt, skip_special_tokens=False)
            seen = SIGN.findall(text)
            color = seen[-1] if seen else "red"
            if text.endswith("<memory>"):
                response = f"The exit is the {color} door.</memory>"
            elif "Doors:" in text.rsplit("Turn ", 1)[-1]:
                response = f"Go.</think><answer>Open {color}</answer>"
            else:
                response = "Go.</think><answer>Forward</answer>"
            ids = self.tokenizer.encode(response, add_special_tokens=False)
            if self.pad:
                filler = self.tokenizer.encode(" x", add_special_tokens=False)
                ids = filler * (max_new_tokens - len(ids) - 1) + ids
            ids = ids[: max_new_tokens - 1] + [self.tokenizer.eos_token_id]
            self.sent[tuple(prompt)] = ids
            outs.append(GenerationOutput(ids, self.tokenizer.decode(ids, skip_special_tokens=True), "stop"))
        return outs


def play(tokenizer, memory="summary", budget=400, seeds=range(8), pad=False):
    backend = ReaderBackend(tokenizer, pad)
    cfg = RolloutConfig(max_turns=7, max_actions_per_turn=1, max_tokens_per_turn=32, memory=memory,
                        memory_budget=budget)
    seeds = list(seeds)
    return rollout(backend, tokenizer, "corridor", {}, seeds, list(range(len(seeds))), cfg), backend


def test_each_turn_note_included_is_trained_as_sampled_in_the_context_it_was_sampled_in(tokenizer):
    trajectories, backend = play(tokenizer)
    for t in trajectories:
        notes = [turn for turn in t.turns if turn.memory]
        assert notes and len(t.turns) == 6 + len(notes)
        assert len(t.samples) == len(notes) + 1  # one sequence per segment
        # Every trained token is a response token, each turn's once, in the order of the turns.
        trained = [i for ids, mask in t.samples for i, m in zip(ids, mask) if m]
        assert trained == [i for turn in t.turns for i in turn.response_ids]
        for turn in t.turns:
            assert turn.response_ids == backend.sent[tuple(turn.prompt_ids)]  # the tokens as sampled
            n, r = len(turn.prompt_ids), len(turn.response_ids)
            homes = [(ids, mask) for ids, mask in t.samples if ids[:n] == turn.prompt_ids and ids[n : n + r] ==
                     turn.response_ids and mask[n : n + r] == [1] * r]
            assert len(homes) == 1  # trained after exactly the prompt it was generated from
        for note in notes:
            text = tokenizer.decode(note.prompt_ids, skip_special_tokens=False)
            assert text.endswith(MEMORY_REQUEST + "<|im_end|>\n<|im_start|>assistant\n<memory>")
            assert note.reasoning == f"The exit is the {exit_color(t)} door."
            start, end = note.reasoning_span
            assert tokenizer.decode(note.response_ids[start:end]) == note.reasoning
            assert note.actions == [] and note.format_valid and note.reward == 0.0
        # After the first note, the sign's room is gone from the prompt; the note stands for it.
        later = tokenizer.decode(t.turns[-1].prompt_ids, skip_special_tokens=False)
        assert "A sign here reads" not in later and notes[-1].reasoning in later
        assert t.success


@pytest.mark.parametrize("budget", [400, 440, 480])
def test_no_prompt_exceeds_the_budget(tokenizer, budget, caplog):
    """Responses of the full token cap, the worst case: every prompt, the notes' included, fits."""
    trajectories, _ = play(tokenizer, budget=budget, pad=True)
    prompts = [len(turn.prompt_ids) for t in trajectories for turn in t.turns]
    assert max(prompts) <= budget and any(turn.memory for t in trajectories for turn in t.turns)
    full, _ = play(tokenizer, memory="full", pad=True)
    assert max(len(turn.prompt_ids) for t in full for turn in t.turns) > budget  # the budget binds
    assert "no room" not in caplog.text


def test_a_budget_too_small_for_a_segment_warns(tokenizer, caplog):
    """Below the size of a segment's first prompt plus a response and the request nothing can be guaranteed: the
    prompt is kept whole, with a warning naming its length."""
    play(tokenizer, budget=300, pad=True, seeds=[0])
    assert re.search(r"prompt is \d+ tokens, leaving no room for a note under memory budget 300", caplog.text)


def test_a_last_turn_window_loses_the_sign_and_a_note_keeps_it(tokenizer):
    seeds = range(40)
    full, _ = play(tokenizer, memory="full", seeds=seeds)
    window, _ = play(tokenizer, memory="window", seeds=seeds)
    summary, _ = play(tokenizer, seeds=seeds)
    colors = [exit_color(t) for t in full]
    assert [t.success for t in full] == [t.success for t in summary] == [True] * 40
    assert [t.success for t in window] == [c == "red" for c in colors]  # it can only guess
    assert 0 < sum(c == "red" for c in colors) < 40
    m = summarize(summary)
    notes = sum(turn.memory for t in summary for turn in t.turns)
    assert m["rollout/memory_turns_mean"] == notes / 40 >= 1 and m["rollout/memory_valid_rate"] == 1
    assert m["rollout/turns_mean"] == 6 and m["rollout/valid_format_rate"] == 1
    assert m["rollout/prompt_tokens_mean"] < summarize(full)["rollout/prompt_tokens_mean"]
    assert "rollout/memory_turns_mean" not in summarize(full)


def test_turn_credit_finds_each_turn_note_included(tokenizer):
    """GiGPO, bi-level GAE and turn rewards give each turn's tokens that turn's value: with notes, a trajectory's
    runs of trained tokens across its segments are its turns in order."""
    trajectories, _ = play(tokenizer, seeds=range(3))
    batch = build_batch(trajectories, tokenizer.pad_token_id)
    values = turn_values_to_tokens([[100 * e + k for k in range(len(t.turns))] for e, t in enumerate(trajectories)],
                                   batch.traj_index, batch.mask)
    for e, t in enumerate(trajectories):
        rows = (batch.traj_index == e).nonzero().squeeze(1).tolist()
        got = [int(v) for r in rows for v, m in zip(values[r].tolist(), batch.mask[r].tolist()) if m]
        assert got == [100 * e + k for k, turn in enumerate(t.turns) for _ in turn.response_ids]


def test_demonstrations_lay_out_notes_as_the_rollout_does(tokenizer):
    """The oracle's episode laid out with the preset's memory settings equals a rollout that samples the oracle's
    responses and notes: the warm start trains on the rollout's layout."""
    rng = np.random.default_rng(1)
    for seed in range(3):
        episode = play_demo("corridor", {}, seed, 7, 1, rng)
        script = iter([x for turn in episode.turns for x in ([turn.note + "</memory>"] if turn.note else []) +
                       [turn.response]])
        conv = episode.conversation(tokenizer, memory=MemorySettings(400, 32, 1))

        class Replay(ReaderBackend):
            def generate(self, prompts, **kw):
                outs = []
                for prompt in prompts:
                    text = next(script)
                    if not self.tokenizer.decode(prompt, skip_special_tokens=False).endswith("<memory>"):
                        text = next(script) if text.endswith("</memory>") else text  # no note asked here
                    ids = self.tokenizer.encode(text, add_special_tokens=False) + [self.tokenizer.eos_token_id]
                    outs.append(GenerationOutput(ids, text, "stop"))
                return outs

        cfg = RolloutConfig(max_turns=7, max_actions_per_turn=1, max_tokens_per_turn=32, memory="summary",
                            memory_budget=400)
        (traj,) = rollout(Replay(tokenizer), tokenizer, "corridor", {}, [seed], [0], cfg)
        assert traj.success and traj.samples == conv.samples()


def test_parse_note():
    assert parse_note("The exit is red.</memory>") == ("The exit is red.", True)
    assert parse_note("<memory> keep </memory><|im_end|>") == ("keep", True)
    assert parse_note("no close") == ("", False)
    assert parse_note("  </memory>")[1] is False  # empty
    assert parse_note("a</memory> and more")[1] is False
    assert parse_note("a<answer>Forward</answer></memory>")[1] is False


def test_memory_keys_are_checked():
    assert load_config("corridor").rollout.memory == "summary"
    with pytest.raises(ConfigError, match="rollout.memory=summary needs rollout.memory_budget"):
        load_config("corridor", ["rollout.memory_budget=null"])
    with pytest.raises(ConfigError, match="set rollout.memory=window"):
        load_config("frozenlake", ["rollout.context_turns=1"])
    with pytest.raises(ConfigError, match="set rollout.max_model_len=null"):
        load_config("corridor", ["rollout.max_model_len=500"])
    with pytest.raises(ConfigError, match="allowed values: 'full', 'window', 'summary'"):
        load_config("corridor", ["rollout.memory=notes"])
    assert load_config("corridor", ["rollout.memory=window"]).rollout.memory == "window"
    with pytest.raises(ConfigError, match="use full, window or summary"):
        RolloutConfig(memory="notes")  # built directly, as library users do
