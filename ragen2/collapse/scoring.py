"""Cross-scoring: the log-likelihood of every reasoning under every input, L[m, j] = log p(Z_m | X_j).

This is the M x P matrix the MI proxies are computed from (SPEC §4). Done naively it is M*P
teacher-forced passes over [X_j | Z_m]; prompts are long (the whole dialogue so far) and
reasonings short, so almost all of that work re-encodes the same P prompts. `score_matrix` runs
each prompt once, keeps its key/value cache, and scores all M reasonings against copies of it in
micro-batches; it also encodes a prefix that prompts share (the system prompt, an episode's
earlier turns) once, takes the keys/values of a prompt a rollout kept (`prefixes`) instead of
encoding it, and scores identical prompts or reasonings once; `score_matrices` does the
same for several matrices at once, scoring what they share once. `score_matrix_naive` is the
slow reference they are tested against.

Works with any Hugging Face decoder-only causal LM, including PEFT-wrapped ones. The cache goes
in under the forward's own name for it (`cache` in recent transformers, `past_key_values` before):
an unknown keyword would be swallowed by `**kwargs` and silently score without the prompt.
On CPU, models with standard attention score a micro-batch as the tree of its reasonings'
distinct prefixes against the one prompt cache (`_logp_after_shared_prompt`); other models, and
other devices, repeat the cache along the batch.
Scores are float32 log-softmax values summed in float64.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from transformers import AttentionInterface, DynamicCache
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

from ragen2.agent.backends import cache_keyword
from ragen2.agent.prefix_cache import CachedPrefix, PrefixStore, common_prefix_length

TokenIds = Sequence[int] | np.ndarray | torch.Tensor

# What one more forward pass costs, in padded reasoning tokens: a micro-batch is split where that
# saves more padding than this (on CPU a forward's fixed cost is that of some 40-70 tokens of the
# tiny policy; on a GPU more, so the figure errs towards fewer, wider batches).
FORWARD_COST = 256


def score_matrix(
    model: torch.nn.Module,
    tokenizer_or_none: object | None,
    prompts: Sequence[TokenIds],
    reasonings: Sequence[TokenIds],
    *,
    micro_batch_size: int = 32,
    device: torch.device | str | None = None,
    prefixes: PrefixStore | None = None,
) -> np.ndarray:
    """Sequence log-probs of every reasoning under every prompt, reusing each prompt's KV cache.

    Args:
        model: a causal LM (`AutoModelForCausalLM`, possibly PEFT-wrapped), already on its device.
        tokenizer_or_none: only its `pad_token_id` is used, to fill padding; may be None.
        prompts: P token-id sequences X_j (each ends where the reasoning starts, e.g. after `<think>`).
        reasonings: M token-id sequences Z_m (reasoning tokens only, non-empty).
        micro_batch_size: reasonings scored per forward pass; bounds memory at about
            micro_batch_size x (prompt + reasoning) cached tokens and micro_batch_size x len x vocab logits.
        device: where the inputs go; defaults to the device of the model's parameters.
        prefixes: keys/values a rollout of this same model (same weights) computed
            (`HFBackend.reuse_prefixes(keep_finished=True)`): a prompt it holds is not encoded again.

    Returns:
        logp: float64 [M, P], logp[m, j] = sum_t log p(Z_m[t] | X_j, Z_m[:t]).

    Identical prompts (the first turns of one group) and identical reasonings (a templated policy
    writes many) are scored once and their column or row copied. Prompts are encoded along the
    trie of their token sequences (`_context_caches`), so a prefix they share (the system prompt,
    the earlier turns of one episode) runs once; a prompt that `prefixes` holds takes its keys
    and values from there. That cache holds all of X_j but its last token, which is fed with the
    reasonings: for each micro-batch the cache is repeated along the batch dimension, and one
    forward over [X_j[-1] | Z_m without its last token], right-padded, at positions len(X_j) - 1 + t,
    predicts every token of every Z_m. Right padding is safe under causal attention:
    a real token never attends to a pad that comes after it. On CPU, with standard attention, the
    micro-batch goes in instead as the tree of its distinct prefixes against the one prompt cache
    (`_logp_after_shared_prompt`): no copies of the cache, and a start that reasonings share is
    computed once.
    """
    return score_matrices(
        model, tokenizer_or_none, [(prompts, reasonings)], micro_batch_size=micro_batch_size, device=device,
        prefixes=prefixes,
    )[0]


def score_matrices(
    model: torch.nn.Module,
    tokenizer_or_none: object | None,
    blocks: Sequence[tuple[Sequence[TokenIds], Sequence[TokenIds]]],
    *,
    micro_batch_size: int = 32,
    device: torch.device | str | None = None,
    prefixes: PrefixStore | None = None,
) -> list[np.ndarray]:
    """`score_matrix` of several (prompts, reasonings) blocks in one pass: one matrix [M_k, P_k] per block.

    A prompt or a (prompt, reasoning) pair that blocks share is scored once: the online
    diagnostics' two sampling schemes share the groups' first prompts as columns and often
    draw the same first-turn reasonings. Each distinct prompt is scored against the distinct
    reasonings of every block it is a column of.
    """
    if not blocks:
        raise ValueError("blocks is empty: pass at least one (prompts, reasonings) pair of sequences")
    tensors = [_as_token_tensors(prompts, reasonings, micro_batch_size) for prompts, reasonings in blocks]
    prompt_index: dict[tuple[int, ...], int] = {}
    reasoning_index: dict[tuple[int, ...], int] = {}
    columns = [_indices(prompt_ts, prompt_index) for prompt_ts, _ in tensors]  # per block: [P_k] -> distinct prompt
    rows = [_indices(reasoning_ts, reasoning_index) for _, reasoning_ts in tensors]  # [M_k] -> distinct reasoning
    prompt_keys = list(prompt_index)
    reasonings = [torch.tensor(z, dtype=torch.long) for z in reasoning_index]
    needed: list[set[int]] = [set() for _ in prompt_keys]  # distinct reasonings to score under each prompt
    for block_columns, block_rows in zip(columns, rows):
        for j in set(block_columns.tolist()):
            needed[j].update(block_rows.tolist())
    device = _resolve_device(model, device)
    batches: dict[tuple[int, ...], list[_Batch]] = {}  # per reasoning set
    logp = np.full((len(reasonings), len(prompt_keys)), np.nan)
    cache_arg = cache_keyword(model)
    shared_prompt = _prompt_attention_applies(model, device)  # cleared if the model turns out not to use it
    contexts = [prompt[:-1] for prompt in prompt_keys]
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():  # no autograd bookkeeping on any of the ~40k ops of a check
            for j, context in _context_caches(model, contexts, cache_arg, device, prefixes):
                wanted = tuple(sorted(needed[j]))
                if wanted not in batches:
                    subset = [reasonings[i] for i in wanted]
                    batches[wanted] = [_Batch(np.array(wanted)[local], tokens, mask, shared_prompt)
                                       for local, tokens, mask in
                                       _micro_batches(subset, micro_batch_size, _pad_id(tokenizer_or_none), device)]
                last, context_len = prompt_keys[j][-1], len(contexts[j])
                for batch in batches[wanted]:
                    token_logp = None  # [b, T]: log p(tokens[:, t] | prompt, tokens[:, :t])
                    if shared_prompt:
                        token_logp = _logp_after_shared_prompt(model, batch, last, context, context_len)
                        shared_prompt = token_logp is not None
                    if token_logp is None:
                        logits = _logits_after_repeated_prompt(model, batch, last, context, context_len, cache_arg)
                        token_logp = _target_logp(logits, batch.tokens)
                    logp[batch.rows, j] = _masked_sum(token_logp, batch.mask)
    finally:
        model.train(was_training)
    return [logp[np.ix_(block_rows, block_columns)] for block_rows, block_columns in zip(rows, columns)]


def score_matrix_naive(
    model: torch.nn.Module,
    tokenizer_or_none: object | None,
    prompts: Sequence[TokenIds],
    reasonings: Sequence[TokenIds],
    *,
    micro_batch_size: int = 1,
    device: torch.device | str | None = None,
) -> np.ndarray:
    """The slow reference for `score_matrix`: one forward over each concatenation [X_j | Z_m].

    Same arguments and return value as `score_matrix`. With `micro_batch_size=1` (default) every
    pair is its own unpadded forward pass, which is the definition of L[m, j]; larger values batch
    the concatenations of one prompt (right-padded), the fair baseline for benchmarks.
    """
    prompt_ts, reasoning_ts = _as_token_tensors(prompts, reasonings, micro_batch_size)
    device = _resolve_device(model, device)
    batches = list(_micro_batches(reasoning_ts, micro_batch_size, _pad_id(tokenizer_or_none), device))
    logp = np.empty((len(reasoning_ts), len(prompt_ts)), dtype=np.float64)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for j, prompt in enumerate(prompt_ts):
                prompt = prompt.to(device)
                lp = prompt.shape[0]
                for rows, tokens, mask in batches:
                    b = tokens.shape[0]
                    input_ids = torch.cat([prompt.expand(b, lp), tokens], dim=1)  # [b, Lp+T]
                    attention_mask = torch.cat([mask.new_ones(b, lp), mask], dim=1)
                    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits  # [b, Lp+T, V]
                    token_logp = _target_logp(logits[:, lp - 1 : -1], tokens)  # [b, T]
                    logp[rows, j] = _masked_sum(token_logp, mask)
    finally:
        model.train(was_training)
    return logp


def _context_caches(
    model: torch.nn.Module, contexts: list[tuple[int, ...]], cache_arg: str, device: torch.device,
    prefixes: PrefixStore | None,
) -> Iterator[tuple[int, DynamicCache]]:
    """Yield (j, KV cache of contexts[j]) for every context: a prompt without its last token.

    A context that `prefixes` holds whole is cut from there (views, nothing is computed). The
    others are sorted, so those sharing a prefix are adjacent; the shared part is encoded once
    and its cache copied where they part. The yielded cache is only valid until the next item
    (a context that continues it, such as an episode's earlier turn and its later turns, extends
    it in place): the caller must not extend it itself, nor keep it.
    """
    encode = []
    for j, context in enumerate(contexts):
        entry, n = prefixes.match(context) if prefixes is not None and context else (None, 0)
        if entry is not None and n == len(context):
            yield j, _cache_of_prefix(entry, n)
        else:
            encode.append(j)
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    last_only = {"logits_to_keep": 1} if "logits_to_keep" in inspect.signature(base.forward).parameters else {}

    def extend(cache: DynamicCache, tokens: tuple[int, ...]) -> None:
        """Feed `tokens` after what `cache` holds (for their keys and values: the logits are not used)."""
        model(input_ids=torch.tensor([tokens], dtype=torch.long, device=device), use_cache=True,
              **{cache_arg: cache}, **last_only)

    def walk(group: list[int], depth: int, cache: DynamicCache) -> Iterator[tuple[int, DynamicCache]]:
        """`group`: sorted contexts sharing their first `depth` tokens, which `cache` holds."""
        first = contexts[group[0]]
        shared = common_prefix_length([first, contexts[group[-1]]])  # sorted: the first and last share the least
        if shared > depth:
            extend(cache, first[depth:shared])
        while group and len(contexts[group[0]]) == shared:  # contexts that end here (sorted first; maybe equal)
            yield group[0], cache
            group = group[1:]
        children: list[list[int]] = []  # runs of the group with the same next token
        for j in group:
            if children and contexts[children[-1][0]][shared] == contexts[j][shared]:
                children[-1].append(j)
            else:
                children.append([j])
        for i, child in enumerate(children):
            last = i == len(children) - 1
            yield from walk(child, shared, cache if last else copy.deepcopy(cache))

    if encode:
        yield from walk(sorted(encode, key=contexts.__getitem__), 0, DynamicCache(config=model.config))


def _cache_of_prefix(entry: CachedPrefix, n: int) -> DynamicCache:
    """A batch-1 cache of the first `n` tokens a rollout cached in `entry` (views of its tensors)."""
    return DynamicCache(ddp_cache_data=[(k[None, :, :n], v[None, :, :n]) for k, v in zip(entry.keys, entry.values)])


class _Batch:
    """A micro-batch of reasonings, scored under one prompt after another: its rows, tokens and their tree."""

    def __init__(self, rows: np.ndarray, tokens: torch.Tensor, mask: torch.Tensor, with_tree: bool) -> None:
        self.rows = rows  # [b] the reasonings' indices
        self.tokens = tokens  # [b, T] right-padded reasonings
        self.mask = mask  # [b, T] 1 at their tokens
        # What is fed (`fed`) is the same tree under every prompt, its root (node 0) the prompt's
        # last token, here a placeholder; built once.
        self.tree = _prefix_tree(self.fed(0), mask.sum(dim=1).tolist()) if with_tree else None

    def fed(self, last: int) -> torch.Tensor:
        """[b, T]: `last`, then each reasoning but its last token (right-padded as `tokens`)."""
        return torch.cat([self.tokens.new_full((len(self.tokens), 1), last), self.tokens[:, :-1]], dim=1)


def _logits_after_repeated_prompt(
    model: torch.nn.Module, batch: _Batch, last: int, context: DynamicCache, context_len: int, cache_arg: str
) -> torch.Tensor:
    """Logits [b, T, V] of `batch.fed(last)` after `context`'s cache, repeated b times (any model)."""
    tokens = batch.fed(last)
    b, t = tokens.shape
    attention_mask = torch.cat([batch.mask.new_ones(b, context_len), batch.mask], dim=1)  # [b, Lc+T]
    positions = context_len + torch.arange(t, device=tokens.device).expand(b, t)
    return model(
        input_ids=tokens, attention_mask=attention_mask, position_ids=positions, **{cache_arg: _repeated(context, b)}
    ).logits


# ----------------------------------------------------------------------------- shared-prompt attention
#
# With the cache repeated b times, every layer copies the prompt's keys and values b times (the
# cache's concatenation, then grouped heads repeated to all query heads) and attends each row to
# its own copy: at the defaults that copying was a sixth of a diagnostics check on CPU. And rows
# that start alike (a policy's reasonings do: "Player at (row ...") compute their shared start
# once per row, a fifth of the tokens fed at the defaults. Both go: the batch is fed as the tree
# of its distinct prefixes, one node per distinct (prefix, token), and `_prompt_attention`
# splits each node's softmax over [prompt | its ancestors] in two, which is exact: the two
# partial attentions weighted by their normalisers exp(log-sum-exp). All nodes attend to the one
# prompt cache as one sequence; the rows, gathered from the nodes, attend causally to
# themselves. PyTorch's CPU flash-attention kernel returns the log-sum-exp the merge needs.

PROMPT_ATTENTION = "ragen2_shared_prompt"
# A private op (it returns the log-sum-exp that the public one does not); without it, the repeated cache.
_flash_attention_cpu = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
# Attention arguments that change what softmax attention computes (windows, soft-capping, sinks, biases).
_UNSUPPORTED = ("sliding_window", "softcap", "s_aux", "sinks", "position_bias")


@dataclass
class _PrefixTree:
    """Right-padded rows [b, T] as the tree of their distinct prefixes: node n is one token at one depth."""

    tokens: torch.Tensor  # [N] each node's token
    depths: torch.Tensor  # [N] its position in the rows that hold it
    node_at: torch.Tensor  # [b, T] the node at each row position (node 0 at padding, whose results are discarded)
    first_at: torch.Tensor  # [N] one flat position row * T + t of each node


def _prefix_tree(tokens: torch.Tensor, lengths: Sequence[int]) -> _PrefixTree:
    """The tree of the first `lengths[r]` tokens of each row r of `tokens` [b, T]."""
    b, t = tokens.shape
    index: dict[tuple[int, int], int] = {}  # (parent node, token) -> node; the root is -1
    node_at = [[0] * t for _ in range(b)]
    first_at: list[int] = []
    for r, (row, n) in enumerate(zip(tokens.tolist(), lengths)):
        parent = -1
        for i in range(n):
            node = index.setdefault((parent, row[i]), len(index))
            if node == len(first_at):
                first_at.append(r * t + i)
            node_at[r][i] = parent = node
    keys = list(index)
    first = torch.tensor(first_at)
    return _PrefixTree(
        tokens=torch.tensor([token for _, token in keys]), depths=first % t, node_at=torch.tensor(node_at),
        first_at=first,
    )


@dataclass
class _SharedPrompt:
    """What the forward's attention layers read: the prompt's cache, the fed tree, and which layers used them."""

    cache: DynamicCache
    tree: _PrefixTree
    layers_done: set[int] = field(default_factory=set)


class _Unsupported(Exception):
    """A layer's attention is not plain softmax attention over all earlier tokens."""


def _prompt_attention_applies(model: torch.nn.Module, device: torch.device) -> bool:
    """Only CPU has the kernel; only standard attention (sdpa, eager) computes what it does."""
    return (_flash_attention_cpu is not None and device.type == "cpu"
            and getattr(model.config, "_attn_implementation", None) in ("sdpa", "eager"))


@contextmanager
def _attention_implementation(model: torch.nn.Module, name: str) -> Iterator[None]:
    config = model.config
    saved = config._attn_implementation
    config._attn_implementation = name
    try:
        yield
    finally:
        config._attn_implementation = saved


def _logp_after_shared_prompt(
    model: torch.nn.Module, batch: _Batch, last: int, context: DynamicCache, context_len: int
) -> torch.Tensor | None:
    """[b, T]: log p(batch.tokens[:, t] | prompt, batch.tokens[:, :t]), the prompt being `context` then `last`.

    The rows' fed tokens go in as their prefix tree (its root `last`), after `context` (batch 1,
    never repeated). None when the model did not route every layer's attention through
    `_prompt_attention` (a model with its own attention code, a sliding window, soft-capping):
    the caller falls back to the repeated cache.
    """
    tree = batch.tree
    shared = _SharedPrompt(context, tree)
    tokens = tree.tokens.clone()
    tokens[0] = last
    try:
        with _attention_implementation(model, PROMPT_ATTENTION):
            logits = model(
                input_ids=tokens[None], position_ids=(context_len + tree.depths)[None], use_cache=False,
                ragen2_prompt=shared,
            ).logits[0].float()  # [N, V]: node n predicts the token after it
    except _Unsupported:
        return None
    if shared.layers_done != set(range(len(context.layers))):
        return None
    # log-softmax at the targets only: the full [N, V] of it is never needed
    return logits[tree.node_at, batch.tokens] - torch.logsumexp(logits, dim=-1)[tree.node_at]


def _prompt_attention(
    module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
    attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
    ragen2_prompt: _SharedPrompt | None = None, **kwargs,
) -> tuple[torch.Tensor, None]:
    """Attention of a prefix tree's nodes to the prompt they all continue and to their ancestors.

    query [1, H, N, d], key and value [1, H_kv, N, d] (the tree's nodes); returns [1, N, H, d] as
    the transformers attention functions do. The tree, not `attention_mask`, says who sees whom;
    the prompt's keys and values are read from `ragen2_prompt.cache` at this layer.
    """
    if (ragen2_prompt is None or dropout or kwargs.get("is_causal") is False
            or any(kwargs.get(name) is not None for name in _UNSUPPORTED)):
        raise _Unsupported
    layer, tree = ragen2_prompt.cache.layers[module.layer_idx], ragen2_prompt.tree
    heads, group = query.shape[1], query.shape[1] // key.shape[1]  # group: query heads per key/value head
    keys, values = key.repeat_interleave(group, dim=1), value.repeat_interleave(group, dim=1)
    b, t = tree.node_at.shape
    rows = [x[0].transpose(0, 1)[tree.node_at.view(-1)].view(b, t, heads, -1).transpose(1, 2)
            for x in (query, keys, values)]  # [b, H, T, d]
    out_own, lse_own = _flash_attention_cpu(*rows, is_causal=True, scale=scaling)  # [b, H, T, d], [b, H, T]
    # to [1, N, H, d]: a node's own part is that of any row position holding it
    out = out_own.transpose(1, 2).reshape(b * t, heads, -1)[tree.first_at][None]
    if layer.is_initialized and layer.keys.shape[-2]:  # else a one-token prompt: no context to attend to
        prompt_keys, prompt_values = (x.repeat_interleave(group, dim=1) for x in (layer.keys, layer.values))
        out_prompt, lse_prompt = _flash_attention_cpu(query, prompt_keys, prompt_values, scale=scaling)
        out_prompt, lse_prompt = out_prompt.transpose(1, 2), lse_prompt.transpose(1, 2)[..., None]
        lse_own = lse_own.transpose(1, 2).reshape(b * t, heads)[tree.first_at][None, ..., None]
        top = torch.maximum(lse_prompt, lse_own)
        w_prompt, w_own = (lse_prompt - top).exp_(), (lse_own - top).exp_()
        out = (out_prompt * w_prompt + out * w_own) / (w_prompt + w_own)
    ragen2_prompt.layers_done.add(module.layer_idx)
    return out.to(query.dtype), None


# Registered without a mask function, so transformers builds no mask for it: the tree says who sees whom.
AttentionInterface.register(PROMPT_ATTENTION, _prompt_attention)


def _repeated(cache: DynamicCache, b: int) -> DynamicCache:
    """`cache` repeated b times along the batch, leaving `cache` as it was.

    Plain dynamic layers (full or sliding attention) grow by `torch.cat` and never write into
    their tensors, so the copy holds expanded views of the prefix and the forward's concatenation
    makes the one copy it needs; a cache with any other kind of layer is copied in full.
    """
    if not all(type(layer) in (DynamicLayer, DynamicSlidingWindowLayer) for layer in cache.layers):
        repeated = copy.deepcopy(cache)
        repeated.batch_repeat_interleave(b)
        return repeated
    repeated = copy.copy(cache)
    repeated.layers = [copy.copy(layer) for layer in cache.layers]
    for layer in repeated.layers:
        if layer.is_initialized:
            layer.keys = layer.keys.expand(b, -1, -1, -1)
            layer.values = layer.values.expand(b, -1, -1, -1)
    return repeated


def _indices(seqs: list[torch.Tensor], index: dict[tuple[int, ...], int]) -> np.ndarray:
    """Each sequence's number among the distinct ones, numbered by first appearance in `index` (updated)."""
    return np.array([index.setdefault(tuple(s.tolist()), len(index)) for s in seqs])


def _target_logp(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log softmax(logits)[target] in float32 without materialising the full log-softmax.

    logits [B, T, V], targets [B, T] -> [B, T]. Cross-entropy is that quantity, negated, in one
    fused pass (about twice as fast on CPU as a gather and a logsumexp).
    """
    b, t, v = logits.shape
    return -F.cross_entropy(logits.float().reshape(b * t, v), targets.reshape(b * t), reduction="none").view(b, t)


def _masked_sum(token_logp: torch.Tensor, mask: torch.Tensor) -> np.ndarray:
    """Sum per-token log-probs [B, T] over real tokens (mask 1) in float64 -> [B]."""
    return (token_logp.double() * mask).sum(dim=1).cpu().numpy()


def _micro_batches(
    reasonings: list[torch.Tensor], size: int, pad_id: int, device: torch.device
) -> Iterator[tuple[np.ndarray, torch.Tensor, torch.Tensor]]:
    """Yield (row indices [b], right-padded tokens [b, T], mask [b, T]) over the reasonings.

    Rows are taken in order of length, in runs chosen by `_runs` so that one long reasoning does
    not pad a whole batch to its length; the indices say where each result goes.
    """
    order = np.argsort([len(z) for z in reasonings], kind="stable")
    for start, stop in _runs([len(reasonings[i]) for i in order], size):
        rows = order[start:stop]
        batch = [reasonings[i] for i in rows]
        width = max(len(z) for z in batch)
        tokens = torch.full((len(batch), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for r, z in enumerate(batch):
            tokens[r, : len(z)] = z
            mask[r, : len(z)] = 1
        yield rows, tokens.to(device), mask.to(device)


def _runs(lengths: list[int], size: int) -> list[tuple[int, int]]:
    """Split sorted `lengths` into runs of at most `size`, minimising padded tokens + FORWARD_COST per run.

    Dynamic programming over the cut points: best[i] is the cheapest split of the first i rows,
    and a run's padded tokens are its row count times its last (longest) length.
    """
    best = [0.0] + [float("inf")] * len(lengths)
    start_of = [0] * (len(lengths) + 1)
    for stop in range(1, len(lengths) + 1):
        for start in range(max(0, stop - size), stop):
            cost = best[start] + (stop - start) * lengths[stop - 1] + FORWARD_COST
            if cost < best[stop]:
                best[stop], start_of[stop] = cost, start
    runs, stop = [], len(lengths)
    while stop > 0:
        runs.append((start_of[stop], stop))
        stop = start_of[stop]
    return runs[::-1]


def _as_token_tensors(
    prompts: Sequence[TokenIds], reasonings: Sequence[TokenIds], micro_batch_size: int
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Validate the inputs and turn every sequence into a 1-D long tensor."""
    if isinstance(micro_batch_size, bool) or not isinstance(micro_batch_size, int) or micro_batch_size < 1:
        raise ValueError(f"micro_batch_size must be a positive int, got {micro_batch_size!r}")
    out = []
    for name, seqs in (("prompts", prompts), ("reasonings", reasonings)):
        if len(seqs) == 0:
            raise ValueError(f"{name} is empty: pass at least one token-id sequence")
        tensors = [_to_long_tensor(s) for s in seqs]
        for i, t in enumerate(tensors):
            if t.numel() == 0:
                raise ValueError(f"{name}[{i}] is empty: every sequence needs a token (drop empty reasonings)")
        out.append(tensors)
    return out[0], out[1]


def _to_long_tensor(seq: TokenIds) -> torch.Tensor:
    if isinstance(seq, torch.Tensor):
        return seq.detach().to("cpu", torch.long).reshape(-1)
    return torch.as_tensor(np.asarray(seq, dtype=np.int64)).reshape(-1)


def _resolve_device(model: torch.nn.Module, device: torch.device | str | None) -> torch.device:
    return torch.device(device) if device is not None else next(model.parameters()).device


def _pad_id(tokenizer_or_none: object | None) -> int:
    """Any valid id will do (padded positions are masked and never scored); prefer the tokenizer's."""
    pad = getattr(tokenizer_or_none, "pad_token_id", None)
    return int(pad) if pad is not None else 0
