"""A tiny policy that calls tools in Qwen2.5's format, fine-tuned in seconds for the endpoint tests."""

from __future__ import annotations

import json
from pathlib import Path

import lookup_agent
import pytest
import torch

from chat_templates import QWEN25_TOOLS
from ragen2.models.tiny import build_model, build_tokenizer

TOOL_CALL = '<tool_call>\n{"name": "lookup", "arguments": {"key": "a"}}\n</tool_call>'
# Half right, so rewards vary within a group; with a reasoning block for the templates that drop it from the history.
ANSWERS = ["<think>I looked a up.</think>The value is 7.", "<think>I looked a up.</think>The value is 3."]


def conversations(tokenizer) -> list[tuple[str, str]]:
    """(prompt text, completion text) pairs of the lookup agent's two calls, for a few seeds."""
    pairs = []
    for seed in range(3):
        messages = lookup_agent.first_messages(seed)
        render = lambda m: tokenizer.apply_chat_template(  # noqa: E731
            m, tools=lookup_agent.TOOLS, add_generation_prompt=True, tokenize=False)
        pairs.append((render(messages), TOOL_CALL + "<|im_end|>"))
        call = {"id": "call_0", "type": "function", "function": {"name": "lookup", "arguments": {"key": "a"}}}
        messages = messages + [{"role": "assistant", "content": "", "tool_calls": [call]},
                               {"role": "tool", "tool_call_id": "call_0", "content": "7"}]
        pairs += [(render(messages), answer + "<|im_end|>") for answer in ANSWERS]
    return pairs


@pytest.fixture(scope="session")
def tool_tokenizer():
    corpus = [TOOL_CALL, *ANSWERS, json.dumps(lookup_agent.TOOLS), "Question 0: what is the value of a?",
              "<tool_response>\n7\n</tool_response>", "# Tools You may call one or more functions"] * 10
    tokenizer = build_tokenizer(corpus, vocab_size=400)
    tokenizer.chat_template = QWEN25_TOOLS
    return tokenizer


@pytest.fixture(scope="session")
def tool_policy(tool_tokenizer, tmp_path_factory) -> Path:
    """A directory holding a tiny Qwen2 policy that calls `lookup` first, then answers."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    tokenizer = tool_tokenizer
    model = build_model(tokenizer, hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=128)
    rows = []
    for prompt, completion in conversations(tokenizer):
        p = tokenizer.encode(prompt, add_special_tokens=False)
        c = tokenizer.encode(completion, add_special_tokens=False)
        rows.append((p + c, [-100] * len(p) + c))
    width = max(len(ids) for ids, _ in rows)
    ids = torch.tensor([r + [tokenizer.pad_token_id] * (width - len(r)) for r, _ in rows])
    labels = torch.tensor([lab + [-100] * (width - len(lab)) for _, lab in rows])
    mask = (torch.arange(width)[None] < torch.tensor([len(r) for r, _ in rows])[:, None]).long()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(80):
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    torch.set_num_threads(threads)
    path = tmp_path_factory.mktemp("tool_policy")
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
