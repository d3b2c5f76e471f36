"""The lookup agent's conversations (`lookup_agent.py`) as (prompt, completion) text, and a tiny policy fitted to
them in seconds: the policy the endpoint tests serve."""

from pathlib import Path

import lookup_agent
from helpers import fine_tune

TOOL_CALL = '<tool_call>\n{"name": "lookup", "arguments": {"key": "a"}}\n</tool_call>'
# Half right, so rewards vary within a group; with a reasoning block for the templates that drop it from the history.
ANSWERS = ["<think>I looked a up.</think>The value is 7.", "<think>I looked a up.</think>The value is 3."]


def conversations(tokenizer, tools: list[dict] = lookup_agent.TOOLS) -> list[tuple[str, str]]:
    """(prompt text, completion text) pairs of the lookup agent's two calls, for a few seeds, with `lookup` declared
    as `tools` (chat's shape)."""
    pairs = []
    for seed in range(3):
        messages = lookup_agent.first_messages(seed)
        render = lambda m: tokenizer.apply_chat_template(  # noqa: E731
            m, tools=tools, add_generation_prompt=True, tokenize=False)
        pairs.append((render(messages), TOOL_CALL + "<|im_end|>"))
        call = {"id": "call_0", "type": "function", "function": {"name": "lookup", "arguments": {"key": "a"}}}
        messages = messages + [{"role": "assistant", "content": "", "tool_calls": [call]},
                               {"role": "tool", "tool_call_id": "call_0", "content": "7"}]
        pairs += [(render(messages), answer + "<|im_end|>") for answer in ANSWERS]
    return pairs


def fit_policy(tokenizer, pairs: list[tuple[str, str]], path: Path) -> Path:
    """A tiny Qwen2 policy at `path`, fitted to write each pair's completion after its prompt."""
    rows = []
    for prompt, completion in pairs:
        p = tokenizer.encode(prompt, add_special_tokens=False)
        c = tokenizer.encode(completion, add_special_tokens=False)
        rows.append((p + c, [-100] * len(p) + c))
    fine_tune(tokenizer, rows, steps=80, lr=3e-3, path=path)
    return path
