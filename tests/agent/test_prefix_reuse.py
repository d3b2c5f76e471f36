"""The HF backend's decoding loop: its draws against a from-scratch reference, and prefix reuse against none."""

from __future__ import annotations

import pytest
import torch

from ragen2.agent import HFBackend, group_seeds, rollout
from ragen2.agent.backends import _uniforms
from ragen2.agent.prefix_cache import CachedPrefix, PrefixStore, common_prefix_length
from ragen2.config import RolloutConfig

N = 10


@pytest.fixture(scope="module")
def prompts(tokenizer):
    texts = [
        "You are solving Sokoban. Turn 1:\nState:\n#_PX_#\nYou have 10 actions left.",
        "You are solving Sokoban. Arms: Dragon, Turtle.",
        "You are solving Sokoban. Go",
        "Arms: Dragon",
    ]
    return [tokenizer.encode(t) for t in texts]


def reference_sample(model, prompt: list[int], seed: int, n: int, temperature: float) -> tuple[list[int], list[float]]:
    """Definition of a seeded draw: no cache, no batch; token t inverts softmax(logits / T)'s cdf at uniform t."""
    ids, logps, u = list(prompt), [], _uniforms(seed, n)
    with torch.no_grad():
        for t in range(n):
            probs = (model(input_ids=torch.tensor([ids])).logits[0, -1].double() / temperature).softmax(-1)
            token = int(torch.searchsorted(probs.cumsum(0), u[t] * probs.sum(), right=True))
            ids.append(token)
            logps.append(float(probs[token].log()))
    return ids[len(prompt):], logps


def test_seeded_draws_equal_the_definition(model, tokenizer, prompts):
    """Batched, left-padded, cached and with the shared prefix reused, each row samples what it would alone."""
    seeds = [3, 4, 5, 6]
    for reuse in (False, True):
        out = HFBackend(model, tokenizer, stop_strings=(), prefix_reuse=reuse).generate(
            prompts, max_new_tokens=N, temperature=0.8, top_p=1.0, seeds=seeds
        )
        for o, p, s in zip(out, prompts, seeds):
            ids, logps = reference_sample(model, p, s, N, 0.8)
            assert o.token_ids == ids
            assert o.logprobs == pytest.approx(logps, abs=1e-4)


def test_greedy_logprobs_are_the_models(model, tokenizer, prompts):
    out = HFBackend(model, tokenizer, stop_strings=()).generate(prompts[:1], max_new_tokens=4, temperature=0.0, top_p=1.0)[0]
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompts[0] + out.token_ids])).logits[0].log_softmax(-1)
    start = len(prompts[0]) - 1
    expected = [float(logits[start + t, tok]) for t, tok in enumerate(out.token_ids)]
    assert out.token_ids == logits[start:-1].argmax(-1).tolist()
    assert out.logprobs == pytest.approx(expected, abs=1e-5)


class PromptTokens:
    """Counts the tokens the model is run on: what prefix reuse saves."""

    def __init__(self, model):
        self.count = 0
        self.handle = model.register_forward_pre_hook(self, with_kwargs=True)

    def __call__(self, module, args, kwargs):
        self.count += kwargs["input_ids"].numel()


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_multi_turn_rollout_with_reuse_equals_without(model, tokenizer, temperature):
    """Several Sokoban episodes of different lengths in one batch: the same tokens and log-probabilities,
    on fewer model input tokens."""
    cfg = RolloutConfig(max_turns=4, max_tokens_per_turn=12, temperature=temperature)
    seeds, gids = group_seeds(0, 3, 3)
    runs, tokens = {}, {}
    for reuse in (False, True):
        counter = PromptTokens(model)
        runs[reuse] = rollout(HFBackend(model, tokenizer, prefix_reuse=reuse), tokenizer, "sokoban", {}, seeds, gids,
                              cfg, sample_seeds=list(range(9)))
        counter.handle.remove()
        tokens[reuse] = counter.count
    without, with_reuse = runs[False], runs[True]
    assert len({len(t.turns) for t in without}) > 1 or max(len(t.turns) for t in without) > 1
    for a, b in zip(without, with_reuse):
        assert [t.response_ids for t in a.turns] == [t.response_ids for t in b.turns]
        assert a.samples == b.samples
    assert tokens[True] < 0.6 * tokens[False]


def test_reuse_of_logprobs_within_float_tolerance(model, tokenizer, prompts):
    """A second call inside the block starts from the first call's keys/values; its log-probs match a fresh prefill."""
    backend = HFBackend(model, tokenizer, stop_strings=())
    kwargs = {"max_new_tokens": N, "temperature": 1.0, "top_p": 1.0}
    with backend.reuse_prefixes():
        first = backend.generate(prompts, seeds=[1, 2, 3, 4], **kwargs)
        follow = [p + o.token_ids + p[:3] for p, o in zip(prompts, first)]  # history + new text
        reused = backend.generate(follow, seeds=[5, 6, 7, 8], **kwargs)
        assert len(backend._store.entries) == len(prompts)
    assert backend._store is None  # nothing survives the block: the next rollout may have new weights
    fresh = HFBackend(model, tokenizer, stop_strings=(), prefix_reuse=False).generate(follow, seeds=[5, 6, 7, 8], **kwargs)
    for a, b in zip(reused, fresh):
        assert a.token_ids == b.token_ids
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)


def test_prefix_store_matches_the_longest_common_prefix():
    store = PrefixStore()
    assert store.match([1, 2, 3]) == (None, 0)
    store.replace([CachedPrefix(ids, [], []) for ids in ([1, 2, 3, 4], [1, 2, 9], [7])])
    found, n = store.match([1, 2, 3, 5, 6])
    assert (found.ids, n) == ([1, 2, 3, 4], 3)
    found, n = store.match([1, 2, 9, 9])
    assert (found.ids, n) == ([1, 2, 9], 3)
    assert store.match([1, 2])[1] == 2
    assert store.match([8, 1]) == (None, 0)
    assert common_prefix_length([[1, 2, 3], [1, 2, 4], [1, 2]]) == 2
    assert common_prefix_length([[5], [6]]) == 0



def test_a_kept_store_holds_every_episode_after_the_rollout(model, tokenizer):
    """Opened around a rollout with `keep_finished`, the store outlives the rollout's own block and
    holds every turn's prompt of every episode, with one entry per episode (an entry its next turn
    continued is dropped); it closes with the outer block."""
    cfg = RolloutConfig(max_turns=4, max_tokens_per_turn=12, temperature=1.0)
    seeds, gids = group_seeds(0, 3, 3)
    backend = HFBackend(model, tokenizer)
    with backend.reuse_prefixes(keep_finished=True) as store:
        trajectories = rollout(backend, tokenizer, "sokoban", {}, seeds, gids, cfg, sample_seeds=list(range(9)))
        assert backend._store is store  # the rollout's block shared it and left it open
        for trajectory in trajectories:
            for turn in trajectory.turns:
                entry, n = store.match(turn.prompt_ids)
                assert n == len(turn.prompt_ids)
                assert entry.keys[0].shape[1] == len(entry.ids)
        assert len(store.entries) == len(trajectories)
    assert backend._store is None


@pytest.mark.parametrize("keep_finished", [False, True])
def test_an_ended_row_stays_only_with_keep_finished(model, tokenizer, prompts, keep_finished):
    """Four rows, then a second call that continues three of them: the fourth row ended. Its entry
    goes with the second call, unless `keep_finished`; the three continued entries go either way."""
    backend = HFBackend(model, tokenizer, stop_strings=())
    kwargs = {"max_new_tokens": 4, "temperature": 1.0, "top_p": 1.0}
    with backend.reuse_prefixes(keep_finished) as store:
        first = backend.generate(prompts, seeds=[1, 2, 3, 4], **kwargs)
        follow = [p + o.token_ids + p[:2] for p, o in zip(prompts[:3], first)]
        backend.generate(follow, seeds=[5, 6, 7], **kwargs)
        held = [e.ids for e in store.entries]
    ended = prompts[3] + first[3].token_ids[:-1]
    assert (ended in held) == keep_finished
    assert len(held) == 3 + keep_finished
