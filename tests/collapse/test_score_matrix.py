"""score_matrix (prefix-cached) against the naive reference, one [prompt | reasoning] pass per pair."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from peft import LoraConfig, get_peft_model

from ragen2.collapse import mi_metrics, score_matrix, score_matrix_naive
from scoring_models import VOCAB, tiny_llama, tiny_qwen2

PROMPT_LENGTHS = (9, 3, 14, 1, 9)
REASONING_LENGTHS = (4, 1, 11, 6, 2, 8, 5)  # M = 7: micro-batches of 3 leave a remainder


def token_ids(lengths, seed):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, VOCAB, size=n).tolist() for n in lengths]


PROMPTS = token_ids(PROMPT_LENGTHS, seed=1)
REASONINGS = token_ids(REASONING_LENGTHS, seed=2)


@pytest.fixture(scope="module")
def naive_qwen2():
    return score_matrix_naive(tiny_qwen2(), None, PROMPTS, REASONINGS)


def test_naive_reference_is_the_definition():
    """One pair by hand: sum of log-softmax of the concatenation at the reasoning positions."""
    model = tiny_qwen2().eval()
    prompt, reasoning = PROMPTS[0], REASONINGS[2]
    ids = torch.tensor([prompt + reasoning])
    with torch.no_grad():
        logprobs = torch.log_softmax(model(input_ids=ids).logits[0].double(), dim=-1)
    expected = sum(logprobs[len(prompt) - 1 + t, tok].item() for t, tok in enumerate(reasoning))
    got = score_matrix_naive(model, None, [prompt], [reasoning])
    assert got.shape == (1, 1)
    assert got[0, 0] == pytest.approx(expected, abs=1e-4)


@pytest.mark.parametrize("micro_batch_size", [1, 3, 64])
def test_cached_equals_naive(naive_qwen2, micro_batch_size):
    logp = score_matrix(tiny_qwen2(), None, PROMPTS, REASONINGS, micro_batch_size=micro_batch_size)
    assert logp.shape == (len(REASONINGS), len(PROMPTS))
    assert logp.dtype == np.float64
    np.testing.assert_allclose(logp, naive_qwen2, atol=1e-4, rtol=0)


@pytest.mark.parametrize("micro_batch_size", [4, len(REASONINGS)])
def test_batched_naive_equals_unbatched(naive_qwen2, micro_batch_size):
    """So other tests may use the faster, batched naive scores as their reference."""
    logp = score_matrix_naive(tiny_qwen2(), None, PROMPTS, REASONINGS, micro_batch_size=micro_batch_size)
    np.testing.assert_allclose(logp, naive_qwen2, atol=1e-4, rtol=0)


def test_eager_attention_and_llama():
    for model in (tiny_qwen2("eager"), tiny_llama()):
        expected = score_matrix_naive(model, None, PROMPTS, REASONINGS, micro_batch_size=len(REASONINGS))
        got = score_matrix(model, None, PROMPTS, REASONINGS, micro_batch_size=2)
        np.testing.assert_allclose(got, expected, atol=1e-4, rtol=0)


def test_lora_wrapped_model():
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    model = get_peft_model(tiny_qwen2(), lora)
    expected = score_matrix_naive(model, None, PROMPTS, REASONINGS, micro_batch_size=len(REASONINGS))
    got = score_matrix(model, None, PROMPTS, REASONINGS, micro_batch_size=3)
    np.testing.assert_allclose(got, expected, atol=1e-4, rtol=0)
    # The adapter is active: scores differ from the base model's.
    with model.disable_adapter():
        base = score_matrix(model, None, PROMPTS, REASONINGS, micro_batch_size=3)
    assert np.abs(base - got).max() > 1e-3


def test_scores_in_eval_mode_and_restores_training_mode(naive_qwen2):
    model = tiny_qwen2(attention_dropout=0.5).train()
    got = score_matrix(model, None, PROMPTS, REASONINGS, micro_batch_size=3)
    assert model.training
    np.testing.assert_allclose(got, naive_qwen2, atol=1e-4, rtol=0)  # dropout was off
    model.eval()
    score_matrix(model, None, PROMPTS, REASONINGS)
    assert not model.training


def test_accepts_tensors_arrays_and_a_tokenizer_pad_id(naive_qwen2):
    class Tok:
        pad_token_id = VOCAB - 1

    prompts = [torch.tensor(p) for p in PROMPTS]
    reasonings = [np.array(z) for z in REASONINGS]
    got = score_matrix(tiny_qwen2(), Tok(), prompts, reasonings, micro_batch_size=4, device="cpu")
    np.testing.assert_allclose(got, naive_qwen2, atol=1e-4, rtol=0)


def test_identical_prompts_give_identical_columns_and_one_class(naive_qwen2):
    """A repeated prompt is scored once and its column copied, in the caller's column order."""
    prompts = [PROMPTS[0], PROMPTS[1], PROMPTS[0]]
    logp = score_matrix(tiny_qwen2(), None, prompts, REASONINGS, micro_batch_size=3)
    np.testing.assert_array_equal(logp[:, 0], logp[:, 2])
    np.testing.assert_allclose(logp, naive_qwen2[:, [0, 1, 0]], atol=1e-4, rtol=0)
    out = mi_metrics(logp, np.array([0, 1, 2, 0, 1, 2, 0]), np.array(REASONING_LENGTHS), input_ids=prompts)
    assert out["num_distinct_inputs"] == 2


@pytest.mark.parametrize(
    "prompts, reasonings, kwargs, message",
    [
        ([], [[1]], {}, "prompts is empty"),
        ([[1]], [[1], []], {}, r"reasonings\[1\] is empty"),
        ([[1]], [[1]], {"micro_batch_size": 0}, "micro_batch_size must be a positive int, got 0"),
    ],
)
def test_bad_input_names_the_argument(prompts, reasonings, kwargs, message):
    model = tiny_qwen2()
    for fn in (score_matrix, score_matrix_naive):
        with pytest.raises(ValueError, match=message):
            fn(model, None, prompts, reasonings, **kwargs)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu(naive_qwen2):
    model = tiny_qwen2().cuda()
    got = score_matrix(model, None, PROMPTS, REASONINGS, micro_batch_size=3)
    np.testing.assert_allclose(got, naive_qwen2, atol=1e-4, rtol=0)
