"""Generation backends: token ids in, generated token ids out. The rollout loop only sees the Protocol.

`HFBackend` runs Hugging Face `model.generate` (batched, KV cache, CPU or CUDA). A vLLM
backend plugs in by implementing the same `generate` method.

Per-prompt `seeds` make a prompt's sample a function of (prompt, seed) alone, whatever else
is in the batch: this is what lets P x G episodes split over several processes sample what
one process would (ragen2.rl.distributed).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch
from transformers import (
    LogitsProcessor,
    LogitsProcessorList,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    StoppingCriteria,
    StoppingCriteriaList,
    TemperatureLogitsWarper,
    TopPLogitsWarper,
)

from ragen2.agent.types import GenerationOutput


def stop_tokens(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, stop_strings: tuple[str, ...]
) -> tuple[list[int], list[int], list[str]]:
    """What ends a generation: the EOS ids (tokenizer's and model's), the stop strings that are one
    token (stopped on by id) and those that are several (stopped on by text)."""
    model_eos = model.generation_config.eos_token_id
    model_eos = [] if model_eos is None else [model_eos] if isinstance(model_eos, int) else list(model_eos)
    eos_ids = sorted({tokenizer.eos_token_id, *model_eos} - {None})
    stop_ids, stop_texts = [], []
    for text in stop_strings:
        ids = tokenizer.encode(text, add_special_tokens=False)
        if len(ids) == 1:
            stop_ids.append(ids[0])
        else:
            stop_texts.append(text)
    return eos_ids, stop_ids, stop_texts


@runtime_checkable
class GenerationBackend(Protocol):
    """Anything that continues token-id prompts."""

    def generate(
        self,
        prompts: list[list[int]],
        *,
        max_new_tokens: int,
        temperature: float,
        top_p: float,
        seeds: list[int] | None = None,
    ) -> list[GenerationOutput]:
        """One output per prompt, in the order of `prompts`.

        `token_ids` holds only new tokens, ending with the stop token when one was produced
        (finish_reason "stop") or after `max_new_tokens` tokens (finish_reason "length").
        `temperature == 0` means greedy decoding. `seeds` (one per prompt, optional): prompt
        i is sampled from its own random stream seeded by `seeds[i]`, independent of the
        other prompts of the call.
        """
        ...


def check_generate_args(
    prompts: list[list[int]], max_new_tokens: int, temperature: float, top_p: float, seeds: list[int] | None
) -> None:
    """The argument checks every `GenerationBackend.generate` makes, with the same messages."""
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens={max_new_tokens} is not allowed: use an integer >= 1")
    if temperature < 0 or not 0 < top_p <= 1:
        raise ValueError(f"temperature={temperature}, top_p={top_p}: need temperature >= 0 and 0 < top_p <= 1")
    if seeds is not None and len(seeds) != len(prompts):
        raise ValueError(f"{len(seeds)} seeds for {len(prompts)} prompts: pass one seed per prompt, or None")


class _StopOnTokens(StoppingCriteria):
    """Stops a row when its last token is one of `token_ids` (single-token stop strings)."""

    def __init__(self, token_ids: list[int]):
        self.token_ids = torch.tensor(token_ids)

    def __call__(self, input_ids: torch.LongTensor, scores: torch.Tensor | None, **kwargs) -> torch.BoolTensor:
        return torch.isin(input_ids[:, -1], self.token_ids.to(input_ids.device))  # [B]


class _SeededSampler(LogitsProcessor):
    """Samples each row from its own random stream and forces `generate` to pick that token.

    Applies temperature and top-p with transformers' own warpers, then draws row r's token by
    inverting the cumulative distribution at `uniforms[r, t]` (t = tokens generated so far)
    and returns scores that are -inf everywhere else. `generate` runs greedy over them, so
    none of its processors run after this one. Greedy, not sampling mode: in transformers 5
    custom processors run *before* the sampling warpers, which would see only the forced token.
    """

    def __init__(self, uniforms: torch.Tensor, prompt_width: int, temperature: float, top_p: float):
        self.uniforms = uniforms  # [B, max_new_tokens] in [0, 1)
        self.prompt_width = prompt_width
        self.warpers = [TemperatureLogitsWarper(temperature)] + ([TopPLogitsWarper(top_p)] if top_p < 1 else [])

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        for warp in self.warpers:
            scores = warp(input_ids, scores)
        probs = scores.float().softmax(dim=-1)  # [B, V]
        cdf = probs.cumsum(dim=-1)  # [B, V]
        u = self.uniforms[:, input_ids.shape[1] - self.prompt_width].to(cdf)  # [B]
        # First index whose cdf exceeds u * total: zero-probability tokens (flat cdf) are never hit,
        # except past the end, where a u that rounds to 1 in float32 lands: take the last possible token.
        token = torch.searchsorted(cdf, (u * cdf[:, -1]).unsqueeze(1), right=True)  # [B, 1]
        last = cdf.shape[1] - 1 - (probs.flip(-1) > 0).int().argmax(dim=-1, keepdim=True)  # [B, 1]
        token = torch.minimum(token, last)
        return torch.full_like(scores, -float("inf")).scatter_(1, token, 0.0)


class HFBackend:
    """Sampling with `model.generate` on the model's device.

    Args:
        model: a causal LM; it is put in eval mode during generation and restored after.
        tokenizer: its tokenizer (pad id for left padding, EOS, stop strings).
        stop_strings: generation of a row ends after any of these. A string that is one
            token (the tiny tokenizer's `</answer>`) is matched by token id; longer ones
            use transformers' `stop_strings` matching on text.
        batch_size: prompts per `model.generate` call; None = as many as `max_batch_tokens`
            allows. Prompts are sorted by length first so each batch needs little padding.
        max_batch_tokens: cap on a call's padded prompt tokens (rows x longest prompt). The
            prompt pass's attention scores grow with rows x length^2, so without a cap a
            batch of long prompts (WebShop pages, long histories) can take tens of GB.

    Without `seeds`, sampling draws from torch's global RNG: call `torch.manual_seed` before
    a rollout to repeat it (with the same batch composition). With `seeds`, each prompt has
    its own stream (`_SeededSampler`), so its sample does not depend on the batch; padding
    still changes the logits in the last float bits, which can flip a token only when its
    uniform draw falls within that distance of a boundary of the cumulative distribution.
    The distribution is exactly softmax(logits / temperature) restricted to `top_p`:
    top-k, repetition penalties and other defaults of a checkpoint's
    `generation_config.json` are switched off, so a policy-gradient update sees the
    policy that actually sampled.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        stop_strings: tuple[str, ...] = ("</answer>",),
        batch_size: int | None = None,
        max_batch_tokens: int = 65536,
    ):
        if batch_size is not None and batch_size < 1:
            raise ValueError(f"batch_size={batch_size} is not allowed: use None (one batch) or an integer >= 1")
        if max_batch_tokens < 1:
            raise ValueError(f"max_batch_tokens={max_batch_tokens} is not allowed: use an integer >= 1")
        self.max_batch_tokens = max_batch_tokens
        self.model = model
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.eos_ids, self.stop_ids, self.stop_texts = stop_tokens(model, tokenizer, stop_strings)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_ids[0]

    def generate(
        self,
        prompts: list[list[int]],
        *,
        max_new_tokens: int,
        temperature: float,
        top_p: float,
        seeds: list[int] | None = None,
    ) -> list[GenerationOutput]:
        check_generate_args(prompts, max_new_tokens, temperature, top_p, seeds)
        outputs: list[GenerationOutput | None] = [None] * len(prompts)
        was_training = self.model.training
        self.model.eval()
        try:
            for chunk in self._chunks(prompts):
                uniforms = None
                if seeds is not None and temperature > 0:
                    uniforms = torch.stack([_uniforms(seeds[i], max_new_tokens) for i in chunk])  # [b, max_new_tokens]
                batch = self._generate_batch([prompts[i] for i in chunk], max_new_tokens, temperature, top_p, uniforms)
                for i, out in zip(chunk, batch):
                    outputs[i] = out
        finally:
            self.model.train(was_training)
        return outputs

    def _chunks(self, prompts: list[list[int]]) -> list[list[int]]:
        """Prompt indices, longest first, cut into calls of at most `batch_size` rows and `max_batch_tokens` padded tokens."""
        order = sorted(range(len(prompts)), key=lambda i: -len(prompts[i]))
        size = self.batch_size or len(prompts)
        chunks: list[list[int]] = []
        for i in order:  # the first prompt of a chunk is its longest, so it sets the padded width
            if chunks and len(chunks[-1]) < size and (len(chunks[-1]) + 1) * len(prompts[chunks[-1][0]]) <= self.max_batch_tokens:
                chunks[-1].append(i)
            else:
                chunks.append([i])
        return chunks

    def _generate_batch(
        self, prompts: list[list[int]], max_new_tokens: int, temperature: float, top_p: float,
        uniforms: torch.Tensor | None = None,
    ) -> list[GenerationOutput]:
        width = max(len(p) for p in prompts)
        device = self.model.device
        # Left padding: every row's last prompt token sits at column width-1, so new tokens line up.
        input_ids = torch.tensor([[self.pad_id] * (width - len(p)) + p for p in prompts], device=device)  # [B, width]
        attention_mask = torch.tensor(
            [[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device
        )  # [B, width]
        # Every field that shapes the distribution is set, so a checkpoint's defaults cannot leak in.
        # Passed as keywords (not a GenerationConfig) so transformers knows greedy was asked for
        # and does not warn about sampling defaults it inherits from the checkpoint.
        warpers = {"temperature": temperature, "top_p": top_p, "top_k": 0, "min_p": 0.0, "typical_p": 1.0}
        criteria = StoppingCriteriaList([_StopOnTokens(self.stop_ids)] if self.stop_ids else [])
        extra = {"stop_strings": self.stop_texts, "tokenizer": self.tokenizer} if self.stop_texts else {}
        sample = temperature > 0 and uniforms is None
        if uniforms is not None:  # per-row streams: the sampler draws, generate takes its one finite score
            extra["logits_processor"] = LogitsProcessorList([_SeededSampler(uniforms, width, temperature, top_p)])
        out = self.model.generate(
            input_ids=input_ids,
            attention_mask=attention_mask,
            max_new_tokens=max_new_tokens,
            min_new_tokens=0,
            do_sample=sample,
            repetition_penalty=1.0,
            no_repeat_ngram_size=0,
            pad_token_id=self.pad_id,
            eos_token_id=self.eos_ids,
            stopping_criteria=criteria,
            **(warpers if sample else {}),
            **extra,
        )  # [B, width + new]
        return [self._finish(row) for row in out[:, width:].tolist()]

    def _finish(self, ids: list[int]) -> GenerationOutput:
        """Cut a generated row after its first stop; rows that never stopped used the full budget."""
        stops = set(self.eos_ids) | set(self.stop_ids)
        cut = next((i + 1 for i, t in enumerate(ids) if t in stops), None)
        if self.stop_texts:
            text_cut = self._first_stop_text_end(ids if cut is None else ids[:cut])
            cut = text_cut if text_cut is not None else cut
        reason = "length" if cut is None else "stop"
        ids = ids if cut is None else ids[:cut]
        return GenerationOutput(
            token_ids=ids, text=self.tokenizer.decode(ids, skip_special_tokens=True), finish_reason=reason
        )

    def _first_stop_text_end(self, ids: list[int]) -> int | None:
        """Smallest n such that ids[:n] decodes to text containing a stop string (binary search)."""

        def contains_stop(n: int) -> bool:
            text = self.tokenizer.decode(ids[:n], skip_special_tokens=False)
            return any(s in text for s in self.stop_texts)

        if not contains_stop(len(ids)):
            return None
        lo, hi = 1, len(ids)
        while lo < hi:
            mid = (lo + hi) // 2
            if contains_stop(mid):
                hi = mid
            else:
                lo = mid + 1
        return lo


def _uniforms(seed: int, n: int) -> torch.Tensor:
    """The first `n` uniforms of the stream seeded by `seed` ([n] float64, on the CPU so they
    are the same on every device)."""
    return torch.rand(n, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
