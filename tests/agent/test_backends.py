from __future__ import annotations

import math

import pytest
import torch

from ragen2.agent import GenerationBackend, HFBackend

N = 12  # new tokens per test generation


@pytest.fixture(scope="module")
def prompts(tokenizer):
    texts = ["Turn 1:\nState:\n#_PX_#\nYou have 10 actions left.", "Arms: Dragon, Turtle.", "Go"]
    return [tokenizer.encode(t) for t in texts]


def greedy(backend, prompts, n=N):
    return backend.generate(prompts, max_new_tokens=n, temperature=0.0, top_p=1.0)


def sample(backend, prompts, seed, n=N, top_p=1.0):
    torch.manual_seed(seed)
    return backend.generate(prompts, max_new_tokens=n, temperature=1.0, top_p=top_p)


@pytest.fixture(scope="module")
def reference(model, tokenizer, prompts):
    """A sampled continuation without stop strings: the run the stop tests cut short."""
    out = sample(HFBackend(model, tokenizer, stop_strings=()), prompts[:1], seed=3)[0]
    assert out.finish_reason == "length" and len(out.token_ids) == N  # the token cap
    return out.token_ids


def test_is_a_generation_backend(model, tokenizer):
    assert isinstance(HFBackend(model, tokenizer), GenerationBackend)


def test_batched_greedy_equals_one_at_a_time_in_input_order(model, tokenizer, prompts):
    backend = HFBackend(model, tokenizer)
    batched = greedy(backend, prompts)
    single = [greedy(backend, [p])[0] for p in prompts]
    assert [o.token_ids for o in batched] == [o.token_ids for o in single]
    assert [o.finish_reason for o in batched] == [o.finish_reason for o in single]
    chunked = greedy(HFBackend(model, tokenizer, batch_size=2), prompts)
    assert [o.token_ids for o in chunked] == [o.token_ids for o in single]
    capped = greedy(HFBackend(model, tokenizer, max_batch_tokens=2 * max(map(len, prompts))), prompts)
    assert [o.token_ids for o in capped] == [o.token_ids for o in single]


def test_calls_respect_the_row_and_padded_token_caps(model, tokenizer):
    prompts = [[5] * n for n in (3, 9, 4, 9, 1, 7)]
    chunks = HFBackend(model, tokenizer, batch_size=3, max_batch_tokens=20)._chunks(prompts)
    assert sorted(i for chunk in chunks for i in chunk) == list(range(6))
    assert all(len(c) <= 3 and len(c) * max(len(prompts[i]) for i in c) <= 20 for c in chunks)
    assert chunks[0] == [1, 3]  # longest first: two 9-token prompts fill 18 of 20
    assert HFBackend(model, tokenizer, max_batch_tokens=5)._chunks([[5] * 9]) == [[0]]  # one row always fits


def test_greedy_is_deterministic_and_outputs_are_consistent(model, tokenizer, prompts):
    backend = HFBackend(model, tokenizer)
    first, second = greedy(backend, prompts), greedy(backend, prompts)
    assert [o.token_ids for o in first] == [o.token_ids for o in second]
    for o in first:
        assert 1 <= len(o.token_ids) <= N
        assert o.text == tokenizer.decode(o.token_ids, skip_special_tokens=True)
        assert (o.finish_reason == "length") == (len(o.token_ids) == N and o.token_ids[-1] != tokenizer.eos_token_id)


def test_sampling_follows_torch_seed(model, tokenizer, prompts):
    backend = HFBackend(model, tokenizer, stop_strings=())
    a, b = sample(backend, prompts, seed=1), sample(backend, prompts, seed=1)
    assert [o.token_ids for o in a] == [o.token_ids for o in b]
    c = sample(backend, prompts, seed=2)
    assert [o.token_ids for o in a] != [o.token_ids for o in c]


def test_tiny_top_p_is_greedy(model, tokenizer, prompts):
    """top_p keeps only the most likely token; no checkpoint default (top_k=50) interferes."""
    backend = HFBackend(model, tokenizer, stop_strings=())
    tiny_p = sample(backend, prompts, seed=0, top_p=1e-6)
    assert [o.token_ids for o in tiny_p] == [o.token_ids for o in greedy(backend, prompts)]


def _clean_single_token(tokenizer, ids, min_pos=2):
    """First position >= min_pos whose token is the whole encoding of its own text, first occurrence."""
    for j in range(min_pos, len(ids)):
        text = tokenizer.decode(ids[j : j + 1])
        if ids[j] not in ids[:j] and "\ufffd" not in text and tokenizer.encode(text) == ids[j : j + 1]:
            return j
    pytest.skip("no clean token in the reference continuation")


def test_single_token_stop_string_cuts_after_it(model, tokenizer, prompts, reference):
    j = _clean_single_token(tokenizer, reference)
    stop = tokenizer.decode(reference[j : j + 1])
    out = sample(HFBackend(model, tokenizer, stop_strings=(stop,)), prompts[:1], seed=3)[0]
    assert out.token_ids == reference[: j + 1]
    assert out.finish_reason == "stop"


def test_multi_token_stop_string_cuts_where_text_first_contains_it(model, tokenizer, prompts, reference):
    for j in range(2, N - 1):
        stop = tokenizer.decode(reference[j : j + 2])
        if "\ufffd" not in stop and len(tokenizer.encode(stop)) > 1:
            break
    else:
        pytest.skip("no clean two-token string in the reference continuation")
    # Slow reference: the shortest prefix whose text contains the stop string.
    cut = next(n for n in range(1, N + 1) if stop in tokenizer.decode(reference[:n]))
    out = sample(HFBackend(model, tokenizer, stop_strings=(stop,)), prompts[:1], seed=3)[0]
    assert out.token_ids == reference[:cut]
    assert out.finish_reason == "stop"


def test_eos_is_kept_and_ends_the_row(model, tokenizer, prompts, reference, monkeypatch):
    j = _clean_single_token(tokenizer, reference)
    monkeypatch.setattr(model.generation_config, "eos_token_id", reference[j])
    out = sample(HFBackend(model, tokenizer, stop_strings=()), prompts[:1], seed=3)[0]
    assert out.token_ids == reference[: j + 1]
    assert out.finish_reason == "stop"


def test_rows_that_stop_early_carry_no_padding(model, tokenizer, prompts, reference):
    """In a batch, a stopped row is padded by generate; the backend returns it unpadded."""
    j = _clean_single_token(tokenizer, reference)
    backend = HFBackend(model, tokenizer, stop_strings=(tokenizer.decode(reference[j : j + 1]),))
    single = [greedy(backend, [p])[0] for p in prompts]
    assert [o.token_ids for o in greedy(backend, prompts)] == [o.token_ids for o in single]


def test_restores_training_mode_and_validates(model, tokenizer, prompts):
    model.train()
    greedy(HFBackend(model, tokenizer), prompts[:1], n=2)
    assert model.training
    model.eval()
    with pytest.raises(ValueError, match="max_new_tokens=0"):
        greedy(HFBackend(model, tokenizer), prompts, n=0)
    with pytest.raises(ValueError, match="batch_size=0"):
        HFBackend(model, tokenizer, batch_size=0)
    with pytest.raises(ValueError, match="max_batch_tokens=0"):
        HFBackend(model, tokenizer, max_batch_tokens=0)


def test_checkpoint_generation_defaults_do_not_leak(model, tokenizer, prompts, monkeypatch):
    """Qwen2.5-Instruct ships temperature 0.7, top_p 0.8, top_k 20, repetition_penalty 1.05; none may apply."""
    backend = HFBackend(model, tokenizer, stop_strings=())
    plain_greedy, plain_sample = greedy(backend, prompts), sample(backend, prompts, seed=5)
    qwen_defaults = {"temperature": 0.7, "top_p": 0.8, "top_k": 20, "repetition_penalty": 1.05, "do_sample": True}
    for name, value in qwen_defaults.items():
        monkeypatch.setattr(model.generation_config, name, value)
    assert [o.token_ids for o in greedy(backend, prompts)] == [o.token_ids for o in plain_greedy]
    assert [o.token_ids for o in sample(backend, prompts, seed=5)] == [o.token_ids for o in plain_sample]


def seeded(backend, prompts, seeds, n=N, temperature=1.0, top_p=1.0):
    return backend.generate(prompts, max_new_tokens=n, temperature=temperature, top_p=top_p, seeds=seeds)


def test_seeded_sample_of_a_prompt_does_not_depend_on_the_batch(model, tokenizer, prompts):
    """What data parallelism needs: a prompt's sample is a function of (prompt, seed), whatever else is in the call."""
    backend = HFBackend(model, tokenizer, stop_strings=())
    seeds = [11, 12, 13]
    batched = [o.token_ids for o in seeded(backend, prompts, seeds)]
    assert batched == [seeded(backend, [p], [s])[0].token_ids for p, s in zip(prompts, seeds)]
    assert batched[::-1] == [o.token_ids for o in seeded(HFBackend(model, tokenizer, batch_size=2), prompts[::-1], seeds[::-1])]
    torch.manual_seed(0)  # the global RNG plays no part
    assert batched == [o.token_ids for o in seeded(backend, prompts, seeds)]
    assert batched != [o.token_ids for o in seeded(backend, prompts, [21, 22, 23])]
    assert seeded(backend, prompts, seeds, temperature=0.0)[0].token_ids == greedy(backend, prompts)[0].token_ids
    with pytest.raises(ValueError, match="2 seeds for 3 prompts"):
        seeded(backend, prompts, seeds[:2])


@pytest.mark.parametrize("temperature, top_p", [(1.0, 1.0), (0.7, 0.9)])
def test_seeded_sampling_draws_from_the_tempered_nucleus(model, tokenizer, prompts, temperature, top_p):
    """First tokens over 3000 seeds follow softmax(logits / temperature) cut to top_p (within sampling error)."""
    n = 3000
    backend = HFBackend(model, tokenizer, stop_strings=())
    tokens = [o.token_ids[0] for o in seeded(backend, [prompts[1]] * n, list(range(n)), n=1,
                                             temperature=temperature, top_p=top_p)]
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompts[1]])).logits[0, -1].double() / temperature  # [V]
    probs = logits.softmax(-1)
    order = probs.argsort(descending=True)
    inside = (probs[order].cumsum(0) - probs[order]) < top_p  # the nucleus: tokens before the mass reaches top_p
    expected = torch.zeros_like(probs)
    expected[order[inside]] = probs[order[inside]] / probs[order[inside]].sum()
    observed = torch.bincount(torch.tensor(tokens), minlength=len(probs)).double() / n
    assert set(tokens) <= set(order[inside].tolist())
    assert (observed - expected).abs().max() < 4 * math.sqrt(0.25 / n)  # 4 standard errors at worst (p = 1/2)
