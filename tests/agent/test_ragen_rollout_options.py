"""RAGEN's turn-format and sampling options: rollout.enable_think, action_sep, top_k, max_model_len.

Hand-computed cases, plus re-statements of RAGEN's code (commit 20daedc) compared with ragen2 on
random cases.
"""

from __future__ import annotations

import logging
import math
import random
import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ragen2.agent import Conversation, HFBackend, ParsedTurn, parse_response, rollout, summarize
from ragen2.agent.backends import check_generate_args, draw
from ragen2.agent.parsing import ResponseFormat
from ragen2.agent.rollout import conversation
from ragen2.agent.types import GenerationOutput
from ragen2.agent.vllm_backend import sampling_kwargs
from ragen2.collapse.online import OnlineDiagnostics
from ragen2.config import CollapseConfig, RolloutConfig, load_config
from ragen2.envs.sokoban import SokobanEnv
from ragen2.errors import ConfigError

NO_THINK = ResponseFormat(think=False)
SEMI = ResponseFormat(action_sep=";")

# ---- RAGEN's code, re-stated --------------------------------------------------------------

# ragen/llm_agent/ctx_manager.py line 98
SPECIAL_TOKENS = ["<think>", "</think>", "<answer>", "</answer>", "<|im_start|>", "<|im_end|>"]


def ragen_parse_response(response: str, enable_think: bool, action_sep: str, max_actions: int) -> tuple[str, list[str]]:
    """ragen/llm_agent/ctx_manager.py lines 196-221 (ContextManager._parse_response), with the config's
    enable_think, action_sep and max_actions_per_turn as arguments; returns (think_content, actions)
    instead of (llm_response, actions). `response` is the generation prefix plus the generated text
    (line 1406: "<think>" or "<answer>" put back in front)."""
    pattern = r'<think>(.*?)</think>\s*<answer>(.*?)</answer>' if enable_think else r'<answer>(.*?)</answer>'
    match = re.search(pattern, response, re.DOTALL)
    if not match:
        return "", []
    if enable_think:
        think_content, action_content = match.group(1), match.group(2)
    else:
        think_content, action_content = "", match.group(1)
    for special_token in SPECIAL_TOKENS:
        action_content = action_content.replace(special_token, "").strip()
        think_content = think_content.replace(special_token, "").strip()
    actions = [action.strip() for action in action_content.split(action_sep) if action.strip()]
    if len(actions) > max_actions:
        actions = actions[:max_actions]
    return think_content, actions


def ragen_apply_max_length(tokenizer, messages: list[dict], max_length: int | None,
                           add_generation_prompt: bool = False) -> list[dict]:
    """ragen/llm_agent/ctx_manager.py lines 456-527 (ContextManager._apply_max_length), with
    actor_rollout_ref.rollout.max_model_len as `max_length`; its final logging.warning left out."""
    if max_length is None:
        return messages
    full_text = tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=False)
    token_len = len(tokenizer(full_text, add_special_tokens=False)["input_ids"])
    if token_len <= max_length:
        return messages
    system_msg = messages[0]
    conversation = messages[1:]
    while token_len > max_length and len(conversation) > 2:
        if len(conversation) >= 3:
            if (conversation[0]["role"] == "user" and
                    conversation[1]["role"] == "assistant" and
                    len(conversation) > 2 and
                    conversation[2]["role"] == "user" and
                    "Reward" in conversation[2].get("content", "")):
                conversation = conversation[3:]
            elif (conversation[0]["role"] == "user" and
                  conversation[1]["role"] == "assistant"):
                conversation = conversation[2:]
            else:
                conversation = conversation[1:]
        else:
            break
        truncated = [system_msg] + conversation
        full_text = tokenizer.apply_chat_template(truncated, add_generation_prompt=add_generation_prompt, tokenize=False)
        token_len = len(tokenizer(full_text, add_special_tokens=False)["input_ids"])
    return [system_msg] + conversation


# ---- enable_think=false and action_sep: parsing ----------------------------------------------

KNOWN = [
    # (text, fmt, reasoning, actions, valid)
    ("Up || Left</answer>", NO_THINK, "", ["Up", "Left"], True),
    ("<answer> Up </answer><|im_end|>", NO_THINK, "", ["Up"], True),  # the prompt's <answer> repeated
    ("  Up||Left||Down </answer>\n", NO_THINK, "", ["Up", "Left"], True),  # max_actions 2
    ("r</think><answer>Up</answer>", NO_THINK, "", [], False),  # a think block is malformed without thinking
    ("<think>r</think><answer>Up</answer>", NO_THINK, "", [], False),
    ("Up", NO_THINK, "", [], False),  # cut by the token cap
    (" || </answer>", NO_THINK, "", [], False),  # no action
    ("Up</answer> and more", NO_THINK, "", [], False),
    ("Up</answer><answer>Down</answer>", NO_THINK, "", [], False),
    ("r</think><answer>Up ; Left</answer>", SEMI, "r", ["Up", "Left"], True),
    ("r</think><answer>Up || Left</answer>", SEMI, "r", ["Up || Left"], True),  # || is plain text now
    ("r</think><answer> ; </answer>", SEMI, "r", [], False),
    ("r</think><answer>Up ; Left</answer>", ResponseFormat(), "r", ["Up ; Left"], True),
]


@pytest.mark.parametrize("text,fmt,reasoning,actions,valid", KNOWN)
def test_known_cases(text, fmt, reasoning, actions, valid):
    assert parse_response(text, 2, fmt) == ParsedTurn(reasoning=reasoning, actions=actions, valid=valid)


@pytest.mark.parametrize("sep", ["", "a</answer>", "<think>"])
def test_bad_separators_are_refused(sep):
    with pytest.raises(ValueError, match="action_sep"):
        ResponseFormat(action_sep=sep)
    with pytest.raises(ConfigError, match="rollout.action_sep"):
        RolloutConfig(action_sep=sep)


SEPARATORS = ["||", ";", ",", " then ", "|"]
WORD = st.text("abcdeUpLft ", min_size=1, max_size=8)


@settings(max_examples=300, deadline=None)
@given(think=st.booleans(), sep=st.sampled_from(SEPARATORS), reasoning=st.text("abc .,\n", max_size=12),
       actions=st.lists(WORD, min_size=1, max_size=4), lead=st.booleans(), end=st.sampled_from(["", "<|im_end|>", "\n"]),
       max_actions=st.integers(1, 3))
def test_well_formed_turns_agree_with_ragen(think, sep, reasoning, actions, lead, end, max_actions):
    actions = [a.strip() for a in actions if a.strip() and sep not in a and sep.strip() not in a]
    if not actions:
        return
    fmt = ResponseFormat(think=think, action_sep=sep)
    answer = f" {sep} ".join(actions) + "</answer>" + end
    text = (fmt.prefix if lead else "") + (f"{reasoning}</think><answer>{answer}" if think else answer)
    ours = parse_response(text, max_actions, fmt)
    theirs = ragen_parse_response(fmt.prefix + text.removeprefix(fmt.prefix), think, sep, max_actions)
    assert ours.valid and (ours.reasoning, ours.actions) == theirs


PIECES = ["<think>", "</think>", "<answer>", "</answer>", "||", ";", " ", "\n", "Up", "Left", "x", "|", "<"]


@settings(max_examples=500, deadline=None)
@given(think=st.booleans(), sep=st.sampled_from(["||", ";"]),
       body=st.lists(st.sampled_from(PIECES), max_size=12).map("".join), end=st.sampled_from(["", "<|im_end|>"]))
def test_a_valid_turn_reads_as_ragen_reads_it(think, sep, body, end):
    """ragen2 is stricter (one block of each, nothing around them); whatever it accepts, RAGEN
    reads the same way. `<|im_start|>`/`<|im_end|>` inside an answer are left out: generation
    stops at the end-of-turn token."""
    fmt = ResponseFormat(think=think, action_sep=sep)
    ours = parse_response(body + end, 2, fmt)
    if ours.valid:
        assert (ours.reasoning, ours.actions) == ragen_parse_response(fmt.prefix + body + end, think, sep, 2)
    if not think:
        assert ours.reasoning == ""


def test_instruction_follows_the_format():
    text = SokobanEnv.instruction
    assert ResponseFormat().instruction(text) == text
    no_think = NO_THINK.instruction(text)
    assert "Answer as <answer>Action1 || Action2</answer>: one or more actions separated by ||." in no_think
    assert "<think>" not in no_think and "</think>" not in no_think
    assert SEMI.instruction(text).endswith("Answer as <think>...</think><answer>Action1 ; Action2</answer>: "
                                           "one or more actions separated by ;.")


# ---- enable_think=false and action_sep: prompts ----------------------------------------------


def test_no_think_prompts_end_with_answer(tokenizer):
    conv = Conversation(tokenizer, SokobanEnv.instruction, fmt=ResponseFormat(think=False, action_sep=";"))
    assert "<think>" not in conv.system_prompt and "Action1 ; Action2" in conv.system_prompt
    prompts = []
    for k, response in enumerate(["Right ; Down</answer>", "Left</answer>"]):
        conv.add_observation(f"#_PX_# {k}", 10 - k)
        prompts.append(conv.prompt_ids())
        assert tokenizer.decode(prompts[-1], skip_special_tokens=False).endswith("assistant\n<answer>")
        conv.add_response_text(response, add_eos=False)
    (ids, mask), = conv.samples()
    assert ids[: len(prompts[1])] == prompts[1]
    text = tokenizer.apply_chat_template(conv.messages(), tokenize=False)
    assert tokenizer.decode(ids, skip_special_tokens=False) == text
    assert conv.messages()[2] == {"role": "assistant", "content": "<answer>Right ; Down</answer>"}


# ---- top_k -------------------------------------------------------------------------------------


def test_draw_top_k_hand_computed():
    logits = torch.tensor([[0.0, 1.0, 2.0, 3.0]] * 3)
    token, logp = draw(logits, 1.0, 1.0, torch.tensor([0.1, 0.5, 0.99]), top_k=2)
    p2 = math.exp(2) / (math.exp(2) + math.exp(3))  # 0.269: the top 2 renormalised
    assert token.tolist() == [2, 3, 3]
    assert logp.tolist() == pytest.approx([math.log(p2), math.log(1 - p2), math.log(1 - p2)], rel=1e-5)
    token, _ = draw(logits, 1.0, 1.0, torch.tensor([0.0, 0.5, 0.999]), top_k=1)
    assert token.tolist() == [3, 3, 3]


def test_draw_top_k_matches_a_direct_statement():
    """top-k then top-p over softmax(logits / T): keep scores >= the k-th largest, renormalise."""
    gen = torch.Generator().manual_seed(0)
    for _ in range(200):
        v, k = int(torch.randint(2, 30, (1,), generator=gen)), int(torch.randint(1, 35, (1,), generator=gen))
        temperature = float(torch.rand(1, generator=gen)) * 2 + 0.1
        logits = torch.randn(4, v, generator=gen) * 3
        u = torch.rand(4, generator=gen, dtype=torch.float64)
        token, logp = draw(logits, temperature, 1.0, u, top_k=k)
        scores = logits / temperature
        kth = scores.topk(min(k, v), dim=-1).values[:, -1:]
        expected = torch.where(scores >= kth, scores, -math.inf).log_softmax(-1)
        assert torch.allclose(logp, expected.gather(1, token[:, None])[:, 0], atol=1e-5)
        assert (scores.gather(1, token[:, None]) >= kth).all()


def test_top_k_one_is_greedy(model, tokenizer):
    backend = HFBackend(model, tokenizer)
    prompts = [tokenizer.encode("Turn 1:\nState:\n#_PX_#"), tokenizer.encode("Go left then up.")]
    greedy = backend.generate(prompts, max_new_tokens=6, temperature=0.0, top_p=1.0)
    top1 = backend.generate(prompts, max_new_tokens=6, temperature=1.0, top_p=1.0, top_k=1, seeds=[1, 2])
    assert [o.token_ids for o in top1] == [o.token_ids for o in greedy]
    assert all(lp == pytest.approx(0.0, abs=1e-6) for o in top1 for lp in o.logprobs)  # one token left: p = 1


@pytest.mark.parametrize("top_k", [0, -2])
def test_bad_top_k_is_refused(top_k):
    with pytest.raises(ValueError, match=f"top_k={top_k}"):
        check_generate_args([[1]], 4, 1.0, 1.0, None, top_k)
    with pytest.raises(ConfigError, match=f"rollout.top_k={top_k}"):
        RolloutConfig(top_k=top_k)


def test_vllm_sampling_kwargs():
    base = dict(max_new_tokens=8, top_p=0.9, seed=3, stop_token_ids=[5], stop_texts=[])
    assert sampling_kwargs(temperature=1.0, top_k=-1, **base)["top_k"] == 0  # vLLM's off
    assert sampling_kwargs(temperature=1.0, top_k=5, **base) == {
        "max_tokens": 8, "temperature": 1.0, "top_p": 0.9, "top_k": 5, "min_p": 0.0, "seed": 3,
        "stop_token_ids": [5], "stop": None, "include_stop_str_in_output": True, "detokenize": False, "logprobs": 0,
    }
    greedy = sampling_kwargs(temperature=0.0, top_k=5, **base)
    assert (greedy["top_k"], greedy["top_p"]) == (0, 1.0)


class RecordingBackend:
    """Answers `Up</answer>` and records the keywords of every call (no top_k parameter unless passed)."""

    def __init__(self, tokenizer):
        self.tokenizer, self.kwargs = tokenizer, []

    def generate(self, prompts, **kwargs):
        self.kwargs.append(kwargs)
        ids = self.tokenizer.encode("Up</answer>", add_special_tokens=False)
        return [GenerationOutput(token_ids=ids, text="Up</answer>", finish_reason="stop") for _ in prompts]


@pytest.mark.parametrize("top_k", [-1, 5])
def test_rollout_passes_top_k(tokenizer, top_k):
    backend = RecordingBackend(tokenizer)
    cfg = RolloutConfig(max_turns=2, top_k=top_k, enable_think=False)
    trajs = rollout(backend, tokenizer, "sokoban", {}, [0], [0], cfg)
    assert all(("top_k" in kw) == (top_k != -1) and kw.get("top_k", -1) == top_k for kw in backend.kwargs)
    assert all(t.format_valid and t.actions == ["Up"] and t.reasoning_span == (0, 0) for t in trajs[0].turns)


# ---- max_model_len ----------------------------------------------------------------------------

RESPONSES = ["The box is right.</think><answer>Right || Down</answer>", "Go left then up.</think><answer>Left</answer>",
             "x</think><answer>Up</answer>", "I push it down onto the target and then go left again."]


def play(tokenizer, max_len=None, context_turns=None, turns=4, seed=None):
    """A scripted episode, every turn alike or (with a seed) random; returns the conversation and
    the prompt shown at each turn."""
    rng = random.Random(seed)
    conv = Conversation(tokenizer, "You are solving Sokoban.", context_turns, max_len=max_len)
    prompts = []
    for k in range(turns):
        conv.add_observation("#_PX_#\n" * (rng.randint(1, 4) if seed is not None else 2) + f"turn {k}", 9 - k)
        prompts.append(conv.prompt_ids())
        if seed is None:
            conv.add_response_text(RESPONSES[0], add_eos=False)
        else:
            conv.add_response_text(rng.choice(RESPONSES), add_eos=rng.random() < 0.5)
    return conv, prompts


def test_max_len_drops_the_oldest_turns(tokenizer):
    _, full = play(tokenizer)
    _, window1 = play(tokenizer, context_turns=1)
    cap = len(full[1])  # every turn alike: room for one earlier turn
    assert len(window1[2]) == len(window1[3]) == cap < len(full[2])
    conv, prompts = play(tokenizer, max_len=cap)
    assert prompts[:2] == full[:2] and prompts[2:] == window1[2:]
    assert [t.dropped for t in conv._turns] == [0, 0, 1, 2] and conv.dropped_turns == 2


def test_truncated_episode_trains_what_the_model_saw(tokenizer):
    conv, prompts = play(tokenizer, max_len=len(play(tokenizer, context_turns=1)[1][3]), seed=1)
    samples = conv.samples()
    assert len(samples) == 4  # one per turn, as with context_turns
    for prompt, (ids, mask), turn in zip(prompts, samples, conv._turns):
        assert ids[: len(prompt)] == prompt and ids[len(prompt):] == turn.response_ids
        assert mask == [0] * len(prompt) + [1] * len(turn.response_ids)


def test_a_cap_that_is_never_reached_changes_nothing(tokenizer):
    full, full_prompts = play(tokenizer, seed=2)
    capped, capped_prompts = play(tokenizer, max_len=len(full_prompts[-1]), seed=2)
    assert capped_prompts == full_prompts and capped.samples() == full.samples() and capped.dropped_turns == 0


def test_a_turn_longer_than_the_cap_alone_is_kept_and_warned(tokenizer, caplog):
    with caplog.at_level(logging.WARNING, logger="ragen2.agent.conversation"):
        conv, prompts = play(tokenizer, max_len=5, turns=2)
    assert prompts[1] == play(tokenizer, context_turns=0, turns=2)[1][1]
    assert conv.dropped_turns == 1 and "over max_len=5" in caplog.text


@pytest.mark.parametrize("seed", range(120))
def test_max_len_keeps_the_turns_ragen_keeps(tokenizer, seed):
    """Turn k's prompt is RAGEN's truncated message list rendered, plus `<think>` (one token, so
    ragen2's cap is RAGEN's + 1: RAGEN measures the prompt before it)."""
    rng = random.Random(seed)
    turns = rng.randint(1, 5)
    _, full = play(tokenizer, turns=turns, seed=seed)
    max_length = rng.randint(len(full[0]) - 5, len(full[-1]) + 5)
    conv, prompts = play(tokenizer, max_len=max_length + 1, turns=turns, seed=seed)
    assert len(tokenizer.encode("<think>", add_special_tokens=False)) == 1
    messages = conv.messages()
    for k in range(turns):
        shown = messages[: 2 + 2 * k]  # system, then turn k's user message and everything before it
        kept = ragen_apply_max_length(tokenizer, shown, max_length, add_generation_prompt=True)
        text = tokenizer.apply_chat_template(kept, add_generation_prompt=True, tokenize=False) + "<think>"
        assert prompts[k] == tokenizer(text, add_special_tokens=False)["input_ids"]
        assert conv._turns[k].dropped == (len(shown) - len(kept)) // 2


def test_rollout_with_every_option(model, tokenizer):
    """The tiny random model, no thinking, a separator, top-k and a cap that cuts: every episode's
    samples are its prompts and responses, and the metric counts what was cut."""
    backend = HFBackend(model, tokenizer)
    cfg = RolloutConfig(max_turns=3, max_tokens_per_turn=12, enable_think=False, action_sep=";", top_k=20)

    def first_prompt_length(seed):
        env = SokobanEnv()
        conv = conversation(tokenizer, env.instruction, cfg)
        conv.add_observation(env.reset(seed=seed)[0], env.max_actions)
        return len(conv.prompt_ids())

    first = max(first_prompt_length(seed) for seed in (0, 1))
    cfg = RolloutConfig(**{**cfg.__dict__, "max_model_len": first + 20})  # room for a turn alone, not two
    trajs = rollout(backend, tokenizer, "sokoban", {}, [0, 0, 1, 1], [0, 0, 1, 1], cfg, sample_seeds=[1, 2, 3, 4])
    turns = [t for traj in trajs for t in traj.turns]
    assert all(tokenizer.decode(t.prompt_ids[-1:], skip_special_tokens=False) == "<answer>" for t in turns)
    assert all(t.reasoning == "" and t.reasoning_span == (0, 0) and len(t.prompt_ids) <= first + 20 for t in turns)
    dropped = sum(t.dropped_turns for t in turns)
    assert dropped > 0 and summarize(trajs)["rollout/truncated_turns"] == dropped
    for traj in trajs:
        if any(t.dropped_turns for t in traj.turns):
            assert len(traj.samples) == len(traj.turns)
            for t, (ids, mask) in zip(traj.turns, traj.samples):
                assert ids == t.prompt_ids + t.response_ids and sum(mask) == len(t.response_ids)
    # The collapse proxies: no reasoning to score, nothing made up.
    metrics = OnlineDiagnostics(CollapseConfig(), seed=0).run(model, tokenizer, trajs, step=1)
    assert metrics == {f"collapse_{s}/{k}": 0.0 for s in ("first_turn", "trajectory")
                       for k in ("valid_thinking_rate", "num_pairs")}


def test_conversation_from_config(tokenizer):
    cfg = RolloutConfig(memory="window", context_turns=2, enable_think=False, action_sep=";", max_model_len=300)
    conv = conversation(tokenizer, "Answer as <think>...</think><answer>A || B</answer>", cfg)
    assert (conv.context_turns, conv.fmt, conv.max_len) == (2, ResponseFormat(False, ";"), 300)
    assert conv.system_prompt == "Answer as <answer>A ; B</answer>"


# ---- configuration ---------------------------------------------------------------------------


def test_keys_from_the_command_line(caplog):
    with caplog.at_level(logging.WARNING, logger="ragen2"):
        c = load_config(None, ["rollout.enable_think=false", "rollout.action_sep=;", "rollout.top_k=5",
                               "rollout.max_model_len=3600"])
    r = c.rollout
    assert (r.enable_think, r.action_sep, r.top_k, r.max_model_len) == (False, ";", 5, 3600)
    assert "rollout.enable_think=false" in caplog.text  # collapse.enable is on by default
    d = RolloutConfig()
    assert (d.enable_think, d.action_sep, d.top_k, d.max_model_len) == (True, "||", -1, None)
    with pytest.raises(ConfigError, match="rollout.max_model_len=0"):
        RolloutConfig(max_model_len=0)
