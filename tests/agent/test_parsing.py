from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ragen2.agent import ParsedTurn, parse_response

KNOWN = [
    # (text, max_actions, reasoning, actions, valid)
    ("I go up.</think><answer>Up</answer>", None, "I go up.", ["Up"], True),
    ("<think>I go up.</think><answer>Up</answer>", None, "I go up.", ["Up"], True),
    ("  \n<think> r </think>\n <answer> Up || Left </answer>\n", None, "r", ["Up", "Left"], True),
    ("r</think><answer>Up||Left||Down</answer>", 2, "r", ["Up", "Left"], True),
    ("r</think><answer>Up||Left||Down</answer>", None, "r", ["Up", "Left", "Down"], True),
    ("r</think><answer>Up || || Left ||</answer>", None, "r", ["Up", "Left"], True),
    ("r</think><answer>Up</answer><|im_end|>", None, "r", ["Up"], True),
    ("r</think><answer>Up</answer> <|eot_id|>\n</s>", None, "r", ["Up"], True),
    ("</think><answer>Up</answer>", None, "", ["Up"], True),  # empty reasoning is valid format
    # malformed
    ("", None, "", [], False),
    ("Up", None, "", [], False),
    ("r</think><answer>Up", None, "r", [], False),  # cut by the token cap
    ("r</think><answer></answer>", None, "r", [], False),  # empty answer
    ("r</think><answer> || </answer>", None, "r", [], False),  # no action in the answer
    ("r</think>so<answer>Up</answer>", None, "r", [], False),  # text between the blocks
    ("r</think><answer>Up</answer>and more", None, "r", [], False),  # text after the answer
    ("r</think><answer>Up</answer><answer>Down</answer>", None, "r", [], False),
    ("r</think>x</think><answer>Up</answer>", None, "r", [], False),
    ("a<think>b</think><answer>Up</answer>", None, "a<think>b", [], False),  # tag inside the reasoning
    ("<think><think>r</think><answer>Up</answer>", None, "<think>r", [], False),
    ("r</think><answer>Up <think></answer>", None, "r", [], False),
    ("<answer>Up</answer>r</think>", None, "<answer>Up</answer>r", [], False),  # blocks out of order
    ("<answer>Up</answer>", None, "", [], False),
]


@pytest.mark.parametrize("text,max_actions,reasoning,actions,valid", KNOWN)
def test_known_cases(text, max_actions, reasoning, actions, valid):
    assert parse_response(text, max_actions) == ParsedTurn(reasoning=reasoning, actions=actions, valid=valid)


def test_bad_max_actions_raises():
    with pytest.raises(ValueError, match="max_actions=0"):
        parse_response("r</think><answer>Up</answer>", 0)


PIECES = ["<think>", "</think>", "<answer>", "</answer>", "||", " ", "\n", "Up", "Left", "x", "|", "<|im_end|>", "<"]


@settings(max_examples=300, deadline=None)
@given(text=st.one_of(st.text(), st.lists(st.sampled_from(PIECES), max_size=14).map("".join)),
       max_actions=st.one_of(st.none(), st.integers(1, 3)))
def test_never_raises_and_invariants_hold(text, max_actions):
    p = parse_response(text, max_actions)
    assert isinstance(p, ParsedTurn)
    if max_actions is not None:
        assert len(p.actions) <= max_actions
    if not p.valid:
        assert p.actions == []
    else:
        assert p.actions and all(a == a.strip() and a and "||" not in a for a in p.actions)
        for tag in ("</think>", "<answer>", "</answer>"):
            assert text.count(tag) == 1
        assert text.index("</think>") < text.index("<answer>") < text.index("</answer>")
    assert "</think>" not in p.reasoning


TAG_FREE = st.text(st.characters(blacklist_characters="<>|"), max_size=20)
ACTION = st.text(st.characters(blacklist_characters="<>|", blacklist_categories=["Z", "C"]), min_size=1, max_size=8)


@settings(max_examples=200, deadline=None)
@given(reasoning=TAG_FREE, actions=st.lists(ACTION, min_size=1, max_size=4), lead=st.booleans())
def test_well_formed_round_trips(reasoning, actions, lead):
    text = ("<think>" if lead else "") + reasoning + "</think><answer>" + " || ".join(actions) + "</answer>"
    p = parse_response(text, max_actions=2)
    assert p == ParsedTurn(reasoning=reasoning.strip(), actions=actions[:2], valid=True)


@settings(max_examples=200, deadline=None)
@given(reasoning=TAG_FREE, actions=st.lists(ACTION, min_size=1, max_size=3),
       drop=st.sampled_from(["</think>", "<answer>", "</answer>"]))
def test_missing_tag_is_malformed(reasoning, actions, drop):
    text = reasoning + "</think><answer>" + "||".join(actions) + "</answer>"
    p = parse_response(text.replace(drop, "", 1))
    assert not p.valid and p.actions == []
