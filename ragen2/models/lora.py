"""LoRA adapters on a policy, through peft, without its library warnings in the run's output."""

from __future__ import annotations

import warnings
from pathlib import Path

from transformers import PreTrainedModel


def add_lora(
    model: PreTrainedModel, rank: int, alpha: float, target_modules: list[str] | str, saved: Path | None = None
) -> PreTrainedModel:
    """`model` wrapped in trainable LoRA adapters: new ones, or those saved in `saved` (a checkpoint)."""
    from peft import LoraConfig, PeftModel, get_peft_model

    with warnings.catch_warnings():
        # peft reads transformers' deprecated `is_gradient_checkpointing`; the notice is for peft's authors.
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.* is deprecated", category=FutureWarning)
        if saved is not None:
            return PeftModel.from_pretrained(model, saved, is_trainable=True)
        lora = LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=0.0, target_modules=target_modules,
                          task_type="CAUSAL_LM")
        return get_peft_model(model, lora)
