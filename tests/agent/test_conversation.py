from __future__ import annotations

import copy

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from ragen2.agent import Conversation, parse_response, reasoning_span, user_message

SYSTEM = "You are solving Sokoban. Actions: Up, Down, Left, Right."
OBSERVATIONS = ["#_PX_#\n#__O_#", "#__PX#\n#__O_#", "#___P#\n#__X_#"]
# Three ways a response ends: the model's EOS, the `</answer>` stop string, the token cap.
RESPONSES = [
    ("The box is right of me.</think><answer>Right || Down</answer>", True),
    ("Go up.</think><answer>Up</answer>", False),
    ("Hmm, the goal is at (row", False),
]

# Llama-3 style: headers instead of ChatML markers, a BOS text, trimmed contents, no newline after end-of-turn.
LLAMA_STYLE_TEMPLATE = (
    "{{ '<|endoftext|>' }}"
    "{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim + '<|im_end|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)


@pytest.fixture(scope="module", params=["chatml", "llama-style"])
def tok(request, tokenizer):
    if request.param == "chatml":
        return tokenizer
    t = copy.deepcopy(tokenizer)
    t.chat_template = LLAMA_STYLE_TEMPLATE
    return t


def encode_response(tok, text: str, eos: bool) -> list[int]:
    return tok.encode(text, add_special_tokens=False) + ([tok.eos_token_id] if eos else [])


def play(tok, context_turns):
    """Build a 3-turn conversation; return it and each turn's (prompt_ids, response_ids)."""
    conv = Conversation(tok, SYSTEM, context_turns)
    record = []
    for k, (obs, (text, eos)) in enumerate(zip(OBSERVATIONS, RESPONSES)):
        conv.add_observation(obs, actions_left=10 - 2 * k)
        prompt = conv.prompt_ids()
        ids = encode_response(tok, text, eos)
        conv.add_response(ids, text)
        record.append((prompt, ids))
    return conv, record


def test_user_message_format():
    assert user_message(2, "#P#", 7) == "Turn 2:\nState:\n#P#\nYou have 7 actions left."


def test_full_history_prompts_are_prefixes_and_mask_marks_responses(tok):
    conv, record = play(tok, None)
    [(ids, mask)] = conv.samples()
    assert len(ids) == len(mask)
    for prompt, response in record:
        n = len(prompt)
        assert ids[:n] == prompt
        assert ids[n : n + len(response)] == response
        assert mask[n : n + len(response)] == [1] * len(response)
    assert [t for t, m in zip(ids, mask) if m] == [t for _, r in record for t in r]


def test_full_history_decodes_to_template_rendering(tok):
    conv, _ = play(tok, None)
    [(ids, _)] = conv.samples()
    rendered = tok.apply_chat_template(conv.messages(), tokenize=False)
    assert tok.decode(ids, skip_special_tokens=False) == rendered


def test_each_prompt_decodes_to_template_rendering(tok):
    conv = Conversation(tok, SYSTEM)
    for k, (obs, (text, eos)) in enumerate(zip(OBSERVATIONS, RESPONSES)):
        conv.add_observation(obs, actions_left=10 - 2 * k)
        expected = tok.apply_chat_template(conv.messages(), tokenize=False, add_generation_prompt=True) + "<think>"
        assert tok.decode(conv.prompt_ids(), skip_special_tokens=False) == expected
        conv.add_response(encode_response(tok, text, eos), text)


@pytest.mark.parametrize("k", [0, 1, 2])
def test_last_k_one_sample_per_turn_with_windowed_prompt(tok, k):
    conv, record = play(tok, k)
    samples = conv.samples()
    assert len(samples) == len(record)
    messages = conv.messages()  # system, then (user, assistant) per turn
    for t, ((ids, mask), (prompt, response)) in enumerate(zip(samples, record)):
        assert ids == prompt + response
        assert mask == [0] * len(prompt) + [1] * len(response)
        first = max(0, t - k)
        visible = [messages[0]] + messages[1 + 2 * first : 1 + 2 * t + 1]
        expected = tok.apply_chat_template(visible, tokenize=False, add_generation_prompt=True) + "<think>"
        assert tok.decode(prompt, skip_special_tokens=False) == expected


def test_last_k_with_long_window_equals_full_history_prompts(tokenizer):
    _, full = play(tokenizer, None)
    _, windowed = play(tokenizer, 5)
    assert [p for p, _ in full] == [p for p, _ in windowed]


def test_eos_is_never_duplicated(tokenizer):
    conv, _ = play(tokenizer, None)
    [(ids, _)] = conv.samples()
    text = tokenizer.decode(ids, skip_special_tokens=False)
    assert "<|im_end|><|im_end|>" not in text
    # system + 3 user + 3 assistant messages, each closed once
    assert ids.count(tokenizer.eos_token_id) == 7


def test_demonstration_text_gives_the_rollout_layout(tokenizer):
    """The warm start's path (text) and the rollout's path (token ids) build identical samples."""
    for context_turns in (None, 1):
        demo, rolled = Conversation(tokenizer, SYSTEM, context_turns), Conversation(tokenizer, SYSTEM, context_turns)
        for obs, (text, eos) in zip(OBSERVATIONS, RESPONSES):
            for conv in (demo, rolled):
                conv.add_observation(obs, actions_left=4)
            assert demo.prompt_ids() == rolled.prompt_ids()
            demo.add_response_text(text, add_eos=eos)
            rolled.add_response(encode_response(tokenizer, text, eos), text)
        assert demo.samples() == rolled.samples()


def test_generated_ids_are_kept_as_sampled(tokenizer):
    """A response whose ids are not the canonical encoding of its text is trained on as sampled."""
    text = "Up.</think><answer>Up</answer>"
    odd = [tokenizer.convert_tokens_to_ids(c) for c in "Up."] + tokenizer.encode("</think><answer>Up</answer>")
    assert odd != tokenizer.encode(text)
    conv = Conversation(tokenizer, SYSTEM)
    conv.add_observation("#P#", 3)
    conv.add_response(odd, text)
    [(ids, mask)] = conv.samples()
    assert [t for t, m in zip(ids, mask) if m] == odd


def test_samples_ignore_an_unanswered_turn(tokenizer):
    conv, _ = play(tokenizer, None)
    before = conv.samples()
    conv.add_observation("#P#", 1)
    assert conv.samples() == before


def test_call_order_is_enforced(tokenizer):
    conv = Conversation(tokenizer, SYSTEM)
    with pytest.raises(RuntimeError):
        conv.prompt_ids()
    with pytest.raises(RuntimeError):
        conv.add_response([1], "x")
    conv.add_observation("#P#", 3)
    with pytest.raises(RuntimeError):
        conv.add_observation("#P#", 3)
    with pytest.raises(ValueError, match="context_turns=-1"):
        Conversation(tokenizer, SYSTEM, context_turns=-1)


# ---- reasoning_span -------------------------------------------------------------------


@pytest.mark.parametrize(
    "text,expected_reasoning",
    [
        ("I push right.</think><answer>Right</answer>", "I push right."),
        ("<think>I push right.</think><answer>Right</answer>", "I push right."),
        ("\n  I push right. \n</think><answer>Right</answer>", "I push right."),
        ("</think><answer>Right</answer>", ""),
        ("  \n</think><answer>Right</answer>", ""),
        ("I push right and", ""),  # no </think>: no reasoning
        ("", ""),
    ],
)
def test_reasoning_span_known_cases(tokenizer, text, expected_reasoning):
    ids = tokenizer.encode(text) + [tokenizer.eos_token_id]
    start, end = reasoning_span(tokenizer, ids)
    assert 0 <= start <= end <= len(ids)
    assert tokenizer.decode(ids[start:end]).strip() == expected_reasoning
    assert (start == end) == (expected_reasoning == "")


def test_reasoning_span_single_token_tags_are_exact(tokenizer):
    ids = tokenizer.encode("<think>go up</think><answer>Up</answer>")
    start, end = reasoning_span(tokenizer, ids)
    assert ids[start - 1] == tokenizer.convert_tokens_to_ids("<think>")
    assert ids[end] == tokenizer.convert_tokens_to_ids("</think>")


@settings(max_examples=60, deadline=None)
@given(reasoning=st.text(st.characters(blacklist_characters="<>", codec="utf-8"), max_size=30), lead=st.booleans())
def test_reasoning_span_matches_parsed_reasoning(tokenizer, reasoning, lead):
    text = ("<think>" if lead else "") + reasoning + "</think><answer>Up</answer>"
    ids = tokenizer.encode(text)
    start, end = reasoning_span(tokenizer, ids)
    assert tokenizer.decode(ids[start:end]).strip() == parse_response(text).reasoning


@pytest.fixture(scope="module")
def plain_bpe():
    """A byte-level BPE without tag tokens, so tags split into pieces that may merge with text."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=350, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tok.train_from_iterator(["<think>go.</think><answer>Up</answer> é😀 push it.</think>"] * 20, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok)


@pytest.mark.parametrize(
    "text",
    [
        "<think>go up</think><answer>Up</answer>",
        "go.</think><answer>Up</answer>",  # ".</" can be one token straddling the tag
        "<think>é🙂 push it 🙂</think><answer>Up</answer>",  # 🙂 is unseen: four byte tokens
        "🙂</think>",
    ],
)
def test_reasoning_span_multi_token_tags(plain_bpe, text):
    ids = plain_bpe.encode(text)
    assert plain_bpe.convert_tokens_to_ids("</think>") in (None, plain_bpe.unk_token_id)
    start, end = reasoning_span(plain_bpe, ids)
    reasoning = parse_response(text).reasoning
    inside = plain_bpe.decode(ids[start:end]).strip()
    assert inside and inside in reasoning  # only reasoning characters, no tag pieces
    # Maximal: the next token reaches into </think>, the previous one into <think> (if any).
    assert "<" in plain_bpe.decode(ids[end : end + 1])
    if start > 0:
        assert ">" in plain_bpe.decode(ids[start - 1 : start])
    # Tokenizers without a Rust backend take transformers' decode path; same answer.
    assert reasoning_span(_DecodeOnly(plain_bpe), ids) == (start, end)


class _DecodeOnly:
    """Exposes only `decode`, like a slow (pure Python) tokenizer."""

    def __init__(self, tokenizer):
        self.decode = tokenizer.decode
