"""rollout.backend settings are checked before any work starts; these tests need no vLLM and run everywhere."""

from __future__ import annotations

import importlib.util

import pytest

from ragen2.agent.vllm_backend import VLLMBackend
from ragen2.config import load_config
from ragen2.errors import ConfigError
from ragen2.models.tiny import build_model, build_tokenizer


@pytest.mark.parametrize(
    "overrides,message",
    [
        (["rollout.backend=vlm"], "rollout.backend='vlm' is not allowed; allowed values: 'hf', 'vllm'"),
        (["rollout.vllm_gpu_memory_utilization=0"], r"vllm_gpu_memory_utilization=0.0 is not allowed: .* \(0, 1\]"),
        (["rollout.backend=vllm", "model.lora_rank=8"], "pushes full weights to vLLM, but model.lora_rank=8"),
    ],
)
def test_bad_backend_settings_name_the_key(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config("bandit", overrides)
    assert load_config("bandit", ["rollout.backend=vllm"]).rollout.backend == "vllm"


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_without_vllm_the_backend_says_where_to_get_it():
    tokenizer = build_tokenizer(["Arms: Dragon, Turtle."] * 10, vocab_size=280)
    with pytest.raises(ConfigError, match="needs vLLM, in an environment of its own.*make test-vllm"):
        VLLMBackend(build_model(tokenizer, hidden_size=64, num_heads=2, num_kv_heads=1), tokenizer)
