"""Build the tiny default policy: a byte-level BPE tokenizer with a chat template, and a small Qwen2 model.

Both are ordinary Hugging Face objects, so every code path that runs on them (generation,
scoring, training, saving) is the one a user runs with Qwen2.5 or Llama on a GPU.
"""

from __future__ import annotations

from collections.abc import Iterable

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

# Qwen-style turn markers; the reasoning tags are single tokens so reasoning spans are exact.
PAD, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = [PAD, IM_START, IM_END]
TAG_TOKENS = ["<think>", "</think>", "<answer>", "</answer>"]

# transformers' Qwen2Tokenizer.PRETOKENIZE_REGEX (GPT-4-style splitting; every digit on its own).
QWEN2_PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

# ChatML, as used by Qwen2/2.5: the same layout a user's real model sees.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# The same ChatML with tools laid out as Qwen2.5's template lays them out: the schemas in a `# Tools` block of
# the system message, each tool result in a user turn as `<tool_response>`. The warm start on tool-call
# demonstrations (`tiny:ENV+tools`) uses it, so the tiny policy sees tools where a Qwen model sees them.
TOOLS_PREAMBLE = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
TOOLS_POSTAMBLE = (
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}'
    "\n</tool_call>"
)
TOOL_TAG_TOKENS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]
TOOLS_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'system' and tools %}"
    "{{ '<|im_start|>system\n' + message['content'] + '\n\n" + TOOLS_PREAMBLE + "' }}"
    "{% for tool in tools %}{{ '\n' + (tool | tojson) }}{% endfor %}"
    "{{ '" + TOOLS_POSTAMBLE + "<|im_end|>\n' }}"
    "{% elif message['role'] == 'tool' %}"
    "{{ '<|im_start|>user\n<tool_response>\n' + message['content'] + '\n</tool_response><|im_end|>\n' }}"
    "{% else %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def build_tokenizer(
    corpus: Iterable[str], vocab_size: int = 1024, phrases: Iterable[str] = (), chat_template: str = CHAT_TEMPLATE
) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer on `corpus` and give it a ChatML chat template (`chat_template`).

    Byte-level means any text (a user's typo, a unicode box symbol) still encodes.
    `phrases` become single tokens wherever they occur (the warm start passes the grid
    cells, `(row 2, col 3)`, so that a small model copies and compares a position as one
    token instead of nine).
    """
    tok = Tokenizer(models.BPE())
    # Qwen2's pre-tokeniser, exactly: `AutoTokenizer` loads a directory whose model is Qwen2 as
    # `Qwen2Tokenizer`, which rebuilds this pipeline around the saved vocabulary and merges. With any
    # other pipeline the reloaded tokenizer would split text (digits above all) differently from the
    # one the warm start trained with. Qwen2Tokenizer also applies NFC; it is left out here so that
    # any text round-trips byte for byte, and it changes nothing on NFC text (all environment text).
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    # Ordinary (non-special) tokens: decoding keeps them, so parsed text round-trips.
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in [*TAG_TOKENS, *phrases]])
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=IM_END,
        pad_token=PAD,
        additional_special_tokens=[IM_START],
    )
    hf.chat_template = chat_template
    return hf


def build_model(
    tokenizer: PreTrainedTokenizerFast,
    hidden_size: int = 128,
    num_layers: int = 4,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 384,
    max_position_embeddings: int = 4096,
    seed: int = 0,
) -> Qwen2ForCausalLM:
    """A randomly initialised Qwen2 model sized for a 2-core CPU (a few million parameters)."""
    import torch

    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(config)
