"""The vLLM tests run in their own environment (`make test-vllm`): vLLM pins a transformers
older than ragen2's. Where vllm is not installed (the `make test` environment) the tests that
start an engine skip; the config checks run everywhere."""

import copy
import os
from collections.abc import Callable

import pytest
import torch
from transformers import TopPLogitsWarper

from ragen2.rl.losses import token_logprobs

# A small fixed KV cache: by default vLLM on CPU takes a share of the machine's RAM.
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")


@pytest.fixture(scope="session")
def teacher_forced() -> Callable:
    """`teacher_forced(model, prompt, response, temperature=1.0, top_p=1.0)`: log p(response | prompt) per
    token under softmax(logits / temperature) restricted to top_p, in float32, by one forward pass."""

    def logprobs(model, prompt: list[int], response: list[int], temperature: float = 1.0, top_p: float = 1.0):
        ids = torch.tensor([prompt + response])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[:, len(prompt) - 1 : -1].float() / temperature  # [1, R, V]
        if top_p < 1:
            logits = TopPLogitsWarper(top_p)(ids, logits[0])[None]
        return token_logprobs(logits, torch.tensor([response]))[0]  # [R]

    return logprobs


@pytest.fixture(scope="session")
def fit() -> Callable:
    """`fit(model, prompts, answer)`: a copy of `model` after 100 Adam steps (lr 1e-2) on every
    prompt followed by the `answer` token ids, enough for a tiny model to answer it greedily."""

    def fitted(model, prompts: list[list[int]], answer: list[int]):
        model = copy.deepcopy(model).train()
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
        for _ in range(100):
            loss = sum(model(input_ids=torch.tensor([p + answer]), labels=torch.tensor([p + answer])).loss for p in prompts)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        return model.eval()

    return fitted
