"""Stop strings longer than one token: vLLM matches them on the decoded text and cuts where HFBackend cuts."""

from __future__ import annotations

import pytest

from ragen2.agent import HFBackend
from ragen2.agent.vllm_backend import VLLMBackend
from ragen2.models.tiny import build_model, build_tokenizer

pytest.importorskip("vllm", reason="needs the vllm extra: make test-vllm")

TEXTS = ["Arms: Dragon, Turtle. Which arm do you pull?", "Go"]
ANSWER = "<think>The arms are Dragon and Turtle. I try Dragon.</think><answer>Dragon</answer>"
STOP = "Dragon and Turtle"


def test_a_stop_string_of_several_tokens_cuts_where_the_hf_backend_cuts(fit):
    tokenizer = build_tokenizer((TEXTS + [ANSWER]) * 10, vocab_size=300)
    assert len(tokenizer.encode(STOP, add_special_tokens=False)) > 1
    prompts = [tokenizer.encode(t) for t in TEXTS]
    model = build_model(tokenizer, hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=128)
    model = fit(model, prompts, tokenizer.encode(ANSWER))
    hf = HFBackend(model, tokenizer, stop_strings=(STOP,))
    expected = hf.generate(prompts, max_new_tokens=40, temperature=0.0, top_p=1.0)
    assert all(o.text.endswith(STOP) and o.finish_reason == "stop" for o in expected)

    engine = VLLMBackend(model, tokenizer, stop_strings=(STOP,))
    got = engine.generate(prompts, max_new_tokens=40, temperature=0.0, top_p=1.0)
    del engine.llm
    assert [o.token_ids for o in got] == [o.token_ids for o in expected]
    assert [(o.text, o.finish_reason) for o in got] == [(o.text, o.finish_reason) for o in expected]
