"""The tiny built-in policy: its tokenizer, its Qwen2-architecture model and its warm start."""
