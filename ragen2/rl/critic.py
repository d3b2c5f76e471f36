"""PPO's value model: a copy of the policy's backbone with a scalar head on every token.

The critic starts from the policy's own weights (as in the RAGEN reference, whose critic is
initialised from the actor checkpoint), so it begins with the policy's understanding of the
state. It is an ordinary Hugging Face `...ForTokenClassification` model with one label,
which gives it `save_pretrained` / `from_pretrained` for checkpoints; its head starts at 0,
so the first values are 0 and GAE starts from the plain return.
"""

from __future__ import annotations

import torch
from torch import Tensor
from transformers import AutoConfig, AutoModelForTokenClassification, PreTrainedModel

from ragen2.models.loading import DTYPES


def load_critic(path: str, device: torch.device, dtype: str, fresh_head: bool) -> PreTrainedModel:
    """The critic from `path`: a causal LM directory (new value head) or a saved critic.

    `fresh_head=True` zero-initialises the value head (a new run); False keeps the saved one
    (resuming). Dropout is off: the value targets of PPO assume a deterministic critic.
    """
    config = AutoConfig.from_pretrained(path, num_labels=1)
    config.classifier_dropout = 0.0
    critic = AutoModelForTokenClassification.from_pretrained(path, config=config, dtype=DTYPES[dtype])
    if fresh_head:
        torch.nn.init.zeros_(critic.score.weight)
        if critic.score.bias is not None:
            torch.nn.init.zeros_(critic.score.bias)
    return critic.to(device)


def critic_values(critic: PreTrainedModel, input_ids: Tensor) -> Tensor:
    """V at every position, shifted like the policy's logits: input_ids [B, T] -> values [B, T - 1] float32.

    values[:, t] is read after token t, i.e. the value of the state in which token t + 1 is
    generated (verl's convention), so it lines up with `Batch.targets` and `Batch.mask`. Rows are
    right-padded and attention is causal, so no mask is needed (ragen2.rl.batch.response_logits).
    """
    out = critic(input_ids=input_ids).logits  # [B, T, 1]
    return out[:, :-1, 0].float()
