"""Load a policy (any Hugging Face causal LM, or the built-in tiny one) onto a device."""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from ragen2.errors import ConfigError

log = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(device: str) -> torch.device:
    """'auto' -> cuda when available, else cpu; anything else must be a valid torch device."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except RuntimeError as e:
        raise ConfigError(f"model.device={device!r} is not a device; use auto, cpu, cuda or cuda:N") from e
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"model.device={device!r} but CUDA is not available here; use model.device=cpu")
    return dev


def resolve_model_path(path: str | None) -> str:
    """None or 'tiny' -> the default tiny policy; 'tiny:ENV,ENV' -> the tiny policy warm-started on those envs.

    Either is built on first use (a few minutes on a CPU) and cached; anything else is a
    model directory or hub name, returned as is.
    """
    if path is None or path == "tiny" or path.startswith("tiny:"):
        from ragen2.envs import names
        from ragen2.models.warmstart import CORE_ENVS, ensure_tiny_policy

        envs = tuple(e.strip() for e in path.split(":", 1)[1].split(",")) if path and ":" in path else CORE_ENVS
        unknown = [e for e in envs if e not in names()]
        if unknown:
            raise ConfigError(
                f"model.path={path!r} names unknown environment(s) {unknown}; use tiny:ENV[,ENV...] with ENV in "
                f"{', '.join(names())}"
            )
        return str(ensure_tiny_policy(envs=envs))
    return path


def load_policy(
    path: str | None, device: str = "auto", dtype: str = "float32"
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load model + tokenizer; the tokenizer must have a chat template (the agent layer uses it)."""
    resolved = resolve_model_path(path)
    if dtype not in DTYPES:
        raise ConfigError(f"model.dtype={dtype!r}; allowed: {', '.join(DTYPES)}")
    local = Path(resolved)
    if not local.exists() and (resolved.startswith((".", "/")) or local.suffix):
        raise ConfigError(f"model.path={resolved!r} does not exist")
    tokenizer = AutoTokenizer.from_pretrained(resolved)
    if tokenizer.chat_template is None:
        raise ConfigError(
            f"model {resolved!r} has a tokenizer without a chat template; use an instruct/chat model "
            "or add `chat_template` to its tokenizer_config.json"
        )
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(resolved, dtype=DTYPES[dtype])
    model.to(resolve_device(device))
    log.info("loaded policy %s on %s (%d parameters)", resolved, model.device, model.num_parameters())
    return model, tokenizer
