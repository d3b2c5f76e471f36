"""Generation backends: token ids in, generated token ids out. The rollout loop only sees the Protocol.

`HFBackend` decodes with the Hugging Face model's own forward and key/value cache (batched,
CPU or CUDA), and reuses the keys/values of a rollout's earlier turns. Anything with the same
`generate` method plugs in; the engines of ragen2 (this one and `ragen2.agent.vllm_backend`) derive
from `CheckedBackend`, which checks the arguments for both.

Per-prompt `seeds` make a prompt's sample a function of (prompt, seed) alone, whatever else
is in the batch: this is what lets P x G episodes split over several processes sample what
one process would (ragen2.rl.distributed).
"""

from __future__ import annotations

import inspect
from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Protocol, runtime_checkable

import torch
from transformers import (
    DynamicCache,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    StopStringCriteria,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from ragen2.agent.prefix_cache import CachedPrefix, PrefixStore, common_prefix_length
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
        top_k: int = -1,
        seeds: list[int] | None = None,
    ) -> list[GenerationOutput]:
        """One output per prompt, in the order of `prompts`.

        `token_ids` holds only new tokens, ending with the stop token when one was produced
        (finish_reason "stop") or after `max_new_tokens` tokens (finish_reason "length").
        `temperature == 0` means greedy decoding; `top_k` -1 means no top-k cut. `seeds` (one per prompt, optional): prompt
        i is sampled from its own random stream seeded by `seeds[i]`, independent of the
        other prompts of the call.
        """
        ...


def check_generate_args(
    prompts: list[list[int]], max_new_tokens: int, temperature: float, top_p: float, seeds: list[int] | None,
    top_k: int = -1,
) -> None:
    """The argument checks every `GenerationBackend.generate` makes, with the same messages."""
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens={max_new_tokens} is not allowed: use an integer >= 1")
    if temperature < 0 or not 0 < top_p <= 1:
        raise ValueError(f"temperature={temperature}, top_p={top_p}: need temperature >= 0 and 0 < top_p <= 1")
    if top_k != -1 and top_k < 1:
        raise ValueError(f"top_k={top_k} is not allowed: use -1 (off) or an integer >= 1")
    if seeds is not None and len(seeds) != len(prompts):
        raise ValueError(f"{len(seeds)} seeds for {len(prompts)} prompts: pass one seed per prompt, or None")


class CheckedBackend(ABC):
    """A `GenerationBackend` whose `generate` checks its arguments (`check_generate_args`) and hands them to the
    engine's `_generate`: the engines (`HFBackend`, `VLLMBackend`) share the front and refuse alike."""

    def generate(self, prompts: list[list[int]], *, max_new_tokens: int, temperature: float, top_p: float,
                 top_k: int = -1, seeds: list[int] | None = None) -> list[GenerationOutput]:
        """`GenerationBackend.generate`."""
        check_generate_args(prompts, max_new_tokens, temperature, top_p, seeds, top_k)
        return self._generate(prompts, max_new_tokens, temperature, top_p, top_k, seeds)

    @abstractmethod
    def _generate(self, prompts: list[list[int]], max_new_tokens: int, temperature: float, top_p: float, top_k: int,
                  seeds: list[int] | None) -> list[GenerationOutput]:
        """`generate`, its arguments checked."""


class HFBackend(CheckedBackend):
    """Sampling with the model's own forward and key/value cache, on the model's device.

    Args:
        model: a causal LM; it is put in eval mode during generation and restored after.
        tokenizer: its tokenizer (pad id for left padding, EOS, stop strings).
        stop_strings: generation of a row ends after any of these. A string that is one
            token (the tiny tokenizer's `</answer>`) is matched by token id; longer ones
            use transformers' `StopStringCriteria` on text.
        batch_size: prompts per batch; None = as many as `max_batch_tokens` allows. Prompts
            are sorted by length first so each batch needs little padding.
        max_batch_tokens: cap on a batch's padded prompt tokens (rows x longest prompt). The
            prompt pass's attention scores grow with rows x length^2, so without a cap a
            batch of long prompts (WebShop pages, long histories) can take tens of GB.
        prefix_reuse: reuse keys/values instead of prefilling them again: the prefix that the
            first turns of a batch share (the system prompt) is prefilled once, and inside
            `reuse_prefixes()` (a rollout) each prompt starts from the longest prefix an
            earlier call of the block computed (its episode's previous turns). False prefills
            every prompt whole, as a plain `model.generate` does.

    Decoding is a plain loop over the model's forward (what `model.generate` does, without its
    general machinery): one prefill of the uncached prompt tokens, then one token per step;
    rows that finished are dropped from the batch once they are a quarter of it.

    Without `seeds`, sampling draws from torch's global RNG: call `torch.manual_seed` before
    a rollout to repeat it (with the same batch composition). With `seeds`, each prompt has
    its own stream: its token at step t inverts the cumulative distribution at the t-th
    uniform of that stream, so its sample does not depend on the batch. Padding and reuse
    change the logits in the last float bits, which can flip a token only when its uniform
    falls within that distance of a boundary of the cumulative distribution. The distribution
    is exactly softmax(logits / temperature) restricted to `top_k`, then to `top_p`: repetition
    penalties and other defaults of a checkpoint's `generation_config.json` play no part, so
    the only cuts of the policy's distribution are the ones the configuration asks for.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        stop_strings: tuple[str, ...] = ("</answer>",),
        batch_size: int | None = None,
        max_batch_tokens: int = 65536,
        prefix_reuse: bool = True,
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
        self._stop_set = set(self.eos_ids) | set(self.stop_ids)  # every id that ends a row
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_ids[0]
        self.prefix_reuse = prefix_reuse and _full_attention(model)
        self._store: PrefixStore | None = None
        self._cache_arg = cache_keyword(model)
        # Built once: it precomputes, for every vocabulary token, where it could end a stop string.
        self._stop_text = StopStringCriteria(tokenizer, self.stop_texts) if self.stop_texts else None

    @contextmanager
    def reuse_prefixes(self, keep_finished: bool = False) -> Iterator[PrefixStore | None]:
        """Inside this block, prompts reuse the keys/values of the block's earlier calls (their
        prompts and outputs). Use it around one rollout: the weights must not change inside.

        Yields the block's `PrefixStore` (None when `prefix_reuse` is off). A block opened inside
        an open one shares its store and leaves it open, so a caller can keep a rollout's store
        past its end: with `keep_finished` it keeps every episode's keys/values, not only those
        of the episodes still running, until the outer block closes.
        """
        if not self.prefix_reuse:
            yield None
            return
        if self._store is not None:
            self._store.keep_finished |= keep_finished
            yield self._store
            return
        self._store = PrefixStore(keep_finished)
        try:
            yield self._store
        finally:
            self._store = None

    def _generate(self, prompts: list[list[int]], max_new_tokens: int, temperature: float, top_p: float, top_k: int,
                  seeds: list[int] | None) -> list[GenerationOutput]:
        outputs: list[GenerationOutput | None] = [None] * len(prompts)
        cached: list[CachedPrefix] = []
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad():
                for chunk in self._chunks(prompts):
                    uniforms = None
                    if seeds is not None and temperature > 0:
                        uniforms = torch.stack([_uniforms(seeds[i], max_new_tokens) for i in chunk])  # [b, max_new_tokens]
                    batch, entries = self._generate_batch(
                        [prompts[i] for i in chunk], max_new_tokens, temperature, top_p, top_k, uniforms
                    )
                    cached += entries
                    for i, out in zip(chunk, batch):
                        outputs[i] = out
        finally:
            self.model.train(was_training)
        if self._store is not None:
            self._store.replace(cached)
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
        self, prompts: list[list[int]], max_new_tokens: int, temperature: float, top_p: float, top_k: int,
        uniforms: torch.Tensor | None = None,
    ) -> tuple[list[GenerationOutput], list[CachedPrefix]]:
        """Decode one batch; also returns, per row, the ids whose keys/values were computed and those keys/values
        (empty outside `reuse_prefixes`)."""
        device = self.model.device
        rows = len(prompts)
        prefixes = self._reused_prefixes(prompts)
        cached = [n for _, n in prefixes]
        suffixes = [p[n:] for p, n in zip(prompts, cached)]
        width_c, width_s = max(cached), max(len(s) for s in suffixes)
        # Layout per row: [pad | cached prefix] in the cache's width_c columns, then [pad | new prompt tokens]:
        # left padding in both parts, so every row's last prompt token sits in the last column.
        input_ids = torch.tensor([[self.pad_id] * (width_s - len(s)) + s for s in suffixes], device=device)  # [B, Ls]
        mask = torch.tensor(
            [[0] * (width_c - n) + [1] * n + [0] * (width_s - len(s)) + [1] * len(s) for n, s in zip(cached, suffixes)],
            device=device,
        )  # [B, Lc + Ls]
        first_pos = torch.tensor(cached, device=device)[:, None]  # [B, 1]: the first new token's position
        positions = (first_pos + mask[:, width_c:].cumsum(-1) - 1).clamp(min=0)  # [B, Ls]; pads get any valid one
        cache = self._cache_of(prefixes, width_c)
        out = self.model(input_ids=input_ids, attention_mask=mask, position_ids=positions, use_cache=True,
                         logits_to_keep=1, **{self._cache_arg: cache})
        stop_ids = torch.tensor(sorted(self._stop_set), device=device)
        live = torch.arange(rows, device=device)  # original row of each row still in the batch
        running = torch.ones(rows, dtype=torch.bool, device=device)  # not finished (finished rows wait to be dropped)
        tokens = torch.empty(rows, 0, dtype=torch.long, device=device)  # [b, t] generated so far
        logps = torch.empty(rows, 0, device=device)
        next_pos = positions[:, -1] + 1  # [b]
        results: list[tuple[list[int], list[float]] | None] = [None] * rows
        entries: list[CachedPrefix | None] = [None] * rows
        for t in range(max_new_tokens):
            token, logp = draw(out.logits[:, -1], temperature, top_p, None if uniforms is None else uniforms[live.cpu(), t],
                               top_k)
            tokens, logps = torch.cat([tokens, token[:, None]], 1), torch.cat([logps, logp[:, None]], 1)
            stopped = torch.isin(token, stop_ids)
            if self._stop_text is not None:
                stopped |= self._stop_text(tokens, None)
            ended = running & (stopped | (t == max_new_tokens - 1))
            for i in ended.nonzero()[:, 0].tolist():
                r = int(live[i])
                results[r] = (tokens[i].tolist(), logps[i].tolist())
                if self._store is not None:  # keys/values exist for the prompt and all generated tokens but the last
                    entries[r] = _row_prefix(cache, i, mask[i].nonzero()[:, 0], prompts[r] + results[r][0][:-1])
            running &= ~ended
            if not running.any():
                break
            if (~running).sum() * 4 >= len(running):  # drop the finished rows
                keep = running.nonzero()[:, 0]
                cache.batch_select_indices(keep)
                live, running, tokens, logps, mask, next_pos = (
                    x[keep] for x in (live, running, tokens, logps, mask, next_pos)
                )
                token = token[keep]
            mask = torch.cat([mask, mask.new_ones(len(mask), 1)], 1)
            out = self.model(input_ids=token[:, None], attention_mask=mask, position_ids=next_pos[:, None],
                             use_cache=True, **{self._cache_arg: cache})
            next_pos = next_pos + 1
        outputs = [self._finish(ids, logp) for ids, logp in results]
        return outputs, [e for e in entries if e is not None]

    def _reused_prefixes(self, prompts: list[list[int]]) -> list[tuple[CachedPrefix | None, int]]:
        """Per prompt, a cached prefix and how many of its first tokens to take from it (at most all but one)."""
        found = [(None, 0)] * len(prompts)
        if not self.prefix_reuse:
            return found
        if self._store is not None:
            matches = [self._store.match(p) for p in prompts]
            for e, n in matches:
                if e is not None and n == len(e.ids):
                    self._store.mark_continued(e)
            found = [(e, min(n, len(p) - 1)) for (e, n), p in zip(matches, prompts)]
        fresh = [r for r, (_, n) in enumerate(found) if n == 0]  # first turns: they share the system prompt
        if len(fresh) > 1:
            n = min(common_prefix_length([prompts[r] for r in fresh]), min(len(prompts[r]) for r in fresh) - 1)
            if n > 0:
                shared = self._prefill(prompts[fresh[0]][:n])
                for r in fresh:
                    found[r] = (shared, n)
        return found

    def _prefill(self, ids: list[int]) -> CachedPrefix:
        """Keys/values of one token sequence."""
        cache = DynamicCache(config=self.model.config)
        self.model(input_ids=torch.tensor([ids], device=self.model.device), use_cache=True, logits_to_keep=1,
                   **{self._cache_arg: cache})
        return _row_prefix(cache, 0, None, ids)

    def _cache_of(self, prefixes: list[tuple[CachedPrefix | None, int]], width: int) -> DynamicCache:
        """A batch cache holding each row's reused prefix right-aligned in `width` columns (zeros before it, masked)."""
        if width == 0:
            return DynamicCache(config=self.model.config)
        some = next(e for e, n in prefixes if n)
        layers = []
        for layer in range(len(some.keys)):
            heads, _, dim = some.keys[layer].shape
            keys = some.keys[layer].new_zeros(len(prefixes), heads, width, dim)  # [B, H, Lc, d]
            values = torch.zeros_like(keys)
            for r, (e, n) in enumerate(prefixes):
                if n:
                    keys[r, :, width - n :] = e.keys[layer][:, :n]
                    values[r, :, width - n :] = e.values[layer][:, :n]
            layers.append((keys, values))
        return DynamicCache(ddp_cache_data=layers)

    def _finish(self, ids: list[int], logprobs: list[float]) -> GenerationOutput:
        """Cut a generated row after its first stop; rows that never stopped used the full budget."""
        cut = next((i + 1 for i, t in enumerate(ids) if t in self._stop_set), None)
        if self.stop_texts:
            text_cut = self._first_stop_text_end(ids if cut is None else ids[:cut])
            cut = text_cut if text_cut is not None else cut
        reason = "length" if cut is None else "stop"
        ids, logprobs = (ids, logprobs) if cut is None else (ids[:cut], logprobs[:cut])
        return GenerationOutput(
            token_ids=ids, text=self.tokenizer.decode(ids, skip_special_tokens=True), finish_reason=reason,
            logprobs=logprobs,
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


def draw(
    logits: torch.Tensor, temperature: float, top_p: float, uniforms: torch.Tensor | None, top_k: int = -1
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per row from logits [B, V], and its log-probability under the distribution drawn from.

    temperature 0: the argmax (log-probability under the model's softmax). Otherwise
    softmax(logits / temperature) restricted to the `top_k` most likely tokens (-1: all; ties
    at the k-th score stay), then to `top_p` (the order of vLLM and transformers); with
    `uniforms` [B] row r takes the first token whose cumulative probability exceeds
    uniforms[r], else torch's global RNG draws.
    """
    logits = logits.float()
    if temperature == 0:
        token = logits.argmax(-1)
        return token, logits.log_softmax(-1).gather(1, token[:, None])[:, 0]
    scores = logits / temperature
    if top_k != -1:
        scores = TopKLogitsWarper(top_k)(None, scores)
    if top_p < 1:
        scores = TopPLogitsWarper(top_p)(None, scores)
    probs = scores.softmax(-1)  # [B, V]
    if uniforms is None:
        token = torch.multinomial(probs, 1)[:, 0]
    else:
        cdf = probs.cumsum(-1)  # [B, V]
        u = uniforms.to(cdf)[:, None]
        token = torch.searchsorted(cdf, u * cdf[:, -1:], right=True)[:, 0]
        # Zero-probability tokens (flat cdf) are never hit, except past the end, where a u that rounds to 1 in
        # float32 lands: those rows take their last possible token.
        past = token >= cdf.shape[1]
        if past.any():
            last = cdf.shape[1] - 1 - (probs[past].flip(-1) > 0).int().argmax(-1)
            token = token.masked_scatter(past, last)
    return token, probs.gather(1, token[:, None])[:, 0].log()


def _row_prefix(cache: DynamicCache, row: int, columns: torch.Tensor | None, ids: list[int]) -> CachedPrefix:
    """Row `row` of a batch cache as a `CachedPrefix` of `ids`, keeping only `columns` (None: all)."""
    pick = (lambda x: x[row]) if columns is None else (lambda x: x[row].index_select(1, columns))
    return CachedPrefix(ids, [pick(layer.keys) for layer in cache.layers], [pick(layer.values) for layer in cache.layers])


def cache_keyword(model: torch.nn.Module) -> str:
    """The forward's keyword for a key/value cache: `cache` (recent transformers) or `past_key_values` (older).

    An unknown keyword would be swallowed by the forward's `**kwargs`, and the model would
    silently run without the cache.
    """
    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # PEFT forwards take **kwargs
    params = inspect.signature(base.forward).parameters
    return "past_key_values" if "past_key_values" in params and "cache" not in params else "cache"


def _full_attention(model: PreTrainedModel) -> bool:
    """Whether every layer attends to the whole context (no sliding window), so a plain cache can be rebuilt."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    return all(kind == "full_attention" for kind in getattr(config, "layer_types", None) or ["full_attention"])


def reuse_prefixes(backend: GenerationBackend, keep_finished: bool = False) -> AbstractContextManager:
    """`backend.reuse_prefixes(keep_finished)` where the backend has it (HFBackend), else a block that
    does nothing and yields None."""
    method = getattr(backend, "reuse_prefixes", None)
    return method(keep_finished) if method is not None else nullcontext()
