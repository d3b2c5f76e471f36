"""VLLMBackend against the Hugging Face model it mirrors: same log-probs, same greedy outputs after an update."""

from __future__ import annotations

import copy

import pytest
import torch

from ragen2.agent import GenerationBackend, HFBackend
from ragen2.agent.vllm_backend import VLLMBackend
from ragen2.models.tiny import build_model, build_tokenizer

pytest.importorskip("vllm", reason="needs the vllm extra: make test-vllm")

TURN = "Turn 1:\nState:\nArms: Dragon, Turtle. Which arm do you pull?"
# The last prompt is longer than a KV-cache block (128 tokens on CPU), so vLLM's prefix cache keeps it.
TEXTS = [TURN, "Arms: Dragon, Turtle.", "Go", "\n".join([TURN] * 15)]
ANSWER = "<think>The arms are Dragon and Turtle. I try Dragon.</think><answer>Dragon</answer>"


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer((TEXTS + [ANSWER]) * 10, vocab_size=300)


@pytest.fixture(scope="module", params=[True, False], ids=["tied", "untied"])
def policy(request, tokenizer):
    """A random tiny Qwen2 (head size 32: vLLM's CPU attention needs a multiple of 32), with and
    without an output layer tied to the embeddings."""
    model = build_model(tokenizer, hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=128)
    if not request.param:
        model.config.tie_word_embeddings = False
        model.lm_head.weight = torch.nn.Parameter(torch.randn_like(model.lm_head.weight) * 0.05)
    assert (model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()) == request.param
    return model.eval()


@pytest.fixture(scope="module")
def backend(policy, tokenizer):
    backend = VLLMBackend(policy, tokenizer, seed=0)
    yield backend
    del backend.llm


@pytest.fixture(scope="module")
def prompts(tokenizer):
    return [tokenizer.encode(t) for t in TEXTS]


def test_is_a_generation_backend(backend):
    assert isinstance(backend, GenerationBackend)


@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.7, 1.0), (1.3, 0.9)])
def test_logprobs_match_teacher_forced_hf_logprobs(backend, policy, prompts, teacher_forced, temperature, top_p):
    backend.load_weights(policy)
    seeds = list(range(2 * len(prompts)))
    outs = backend.generate(prompts * 2, max_new_tokens=16, temperature=temperature, top_p=top_p, seeds=seeds)
    assert sum(len(o.token_ids) for o in outs) > 40  # random weights rarely stop early: real sequences
    for prompt, out in zip(prompts * 2, outs):
        assert len(out.logprobs) == len(out.token_ids) <= 16
        stopped = out.token_ids[-1] in backend.stop_token_ids
        assert (out.finish_reason == "length") == (len(out.token_ids) == 16 and not stopped)
        assert out.text == backend.tokenizer.decode(out.token_ids, skip_special_tokens=True)
        hf = teacher_forced(policy, prompt, out.token_ids, temperature, top_p)
        torch.testing.assert_close(torch.tensor(out.logprobs), hf, atol=1e-4, rtol=0)


def test_seeds_make_a_prompts_sample_independent_of_the_batch(backend, policy, prompts):
    backend.load_weights(policy)
    kwargs = dict(max_new_tokens=12, temperature=1.0, top_p=1.0)
    together = backend.generate(prompts, seeds=[7, 8, 9, 10], **kwargs)
    alone = backend.generate(prompts[1:2], seeds=[8], **kwargs)
    assert together[1].token_ids == alone[0].token_ids
    other = backend.generate(prompts[1:2], seeds=[11], **kwargs)
    assert other[0].token_ids != alone[0].token_ids


@pytest.fixture(scope="module")
def updated(policy, tokenizer, prompts, fit):
    """The policy after real optimizer steps that teach it to answer ANSWER to every prompt."""
    return fit(policy, prompts, tokenizer.encode(ANSWER))


def test_greedy_outputs_equal_the_updated_hf_models_after_a_weight_push(backend, policy, updated, tokenizer, prompts):
    """Until the push vLLM still samples the old weights; after it, the updated model's greedy outputs."""
    backend.load_weights(policy)
    expected = HFBackend(updated, tokenizer).generate(prompts, max_new_tokens=40, temperature=0.0, top_p=1.0)
    assert [o.token_ids for o in expected] == [tokenizer.encode(ANSWER)] * len(prompts)  # learned, stops at </answer>
    stale = backend.generate(prompts, max_new_tokens=40, temperature=0.0, top_p=1.0)
    assert [o.token_ids for o in stale] != [o.token_ids for o in expected]

    backend.load_weights(updated)
    pushed = backend.generate(prompts, max_new_tokens=40, temperature=0.0, top_p=1.0)
    assert [o.token_ids for o in pushed] == [o.token_ids for o in expected]
    assert [o.finish_reason for o in pushed] == ["stop"] * len(prompts)
    assert [o.text for o in pushed] == [o.text for o in expected]


def test_a_push_drops_prefixes_cached_with_the_old_weights(backend, policy, prompts, teacher_forced):
    """After a generation the long prompt's first blocks sit in vLLM's prefix cache; their keys and
    values belong to the old weights and must not be reused once new weights are pushed."""
    backend.load_weights(policy)
    backend.generate(prompts, max_new_tokens=4, temperature=0.0, top_p=1.0)  # fills the prefix cache
    moved = copy.deepcopy(policy)
    noise = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in moved.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=noise))
    backend.load_weights(moved)
    outs = backend.generate(prompts, max_new_tokens=8, temperature=1.0, top_p=1.0, seeds=[1, 2, 3, 4])
    for prompt, out in zip(prompts, outs):
        hf = teacher_forced(moved, prompt, out.token_ids, 1.0, 1.0)
        torch.testing.assert_close(torch.tensor(out.logprobs), hf, atol=1e-4, rtol=0)
