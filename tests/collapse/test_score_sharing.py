"""score_matrix's shared work (prompt prefixes encoded once, repeated prompts and reasonings scored
once, blocks scored together, length-aware micro-batches, the prefix cache repeated as views, or
on CPU a micro-batch fed as the tree of its reasonings' prefixes against one prompt cache)
changes no score: every case here is checked against `score_matrix_naive`, one unpadded
[prompt | reasoning] pass per pair, and the online proxies against the same proxies computed from
naive scores."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

import ragen2.collapse.online as online
import ragen2.collapse.scoring as scoring
from ragen2.collapse import OnlineDiagnostics, score_matrix, score_matrix_naive
from ragen2.collapse.scoring import FORWARD_COST, _prefix_tree, _repeated, _runs, score_matrices
from ragen2.config import CollapseConfig
from scoring_models import VOCAB, tiny_llama, tiny_qwen2

pytestmark = pytest.mark.usefixtures("one_thread")
THINK, ANSWER = 1, 2


def ids(rng: np.random.Generator, n: int) -> list[int]:
    return rng.integers(3, VOCAB, size=n).tolist()


def dialogue_inputs() -> tuple[list[list[int]], list[list[int]]]:
    """Prompts and reasonings shaped like a rollout's: one system prompt, three groups' first
    observations, second turns that continue the first (so a first-turn prompt is a strict prefix
    of its episode's later prompts), a repeated prompt, a prompt that ends inside the shared system
    prompt, one that shares nothing; reasonings with repeats, one a prefix of another, one long."""
    rng = np.random.default_rng(7)
    system = ids(rng, 12)
    first = [system + ids(rng, 5) + [THINK] for _ in range(3)]
    z = [ids(rng, n) for n in (4, 6, 3, 5)]
    second = [first[g] + z[g] + [ANSWER] + ids(rng, 4) + [THINK] for g in range(3)]
    second.append(first[0] + z[1] + [ANSWER] + ids(rng, 4) + [THINK])  # another episode of group 0
    prompts = [first[0], second[0], first[1], first[0], second[3], system[:7], [VOCAB - 1, *ids(rng, 6)],
               first[2], second[1], second[2]]
    reasonings = [z[0], z[1], z[0], z[2], z[1][:4], z[3], ids(rng, 30), z[3], z[1]]
    return prompts, reasonings


PROMPTS, REASONINGS = dialogue_inputs()


def lora_qwen2() -> torch.nn.Module:
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    return get_peft_model(tiny_qwen2(), lora)


MODELS = {
    "qwen2-sdpa": tiny_qwen2,
    "qwen2-eager": lambda: tiny_qwen2("eager"),
    # layer 1 attends to the last 8 tokens only: its cache is a sliding-window layer
    "qwen2-sliding": lambda: tiny_qwen2(use_sliding_window=True, sliding_window=8, max_window_layers=1),
    "llama": tiny_llama,
    "qwen2-lora": lora_qwen2,
}


@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.parametrize("micro_batch_size", [1, 3, 32])
def test_shared_prefixes_and_repeats_score_as_naive(name, micro_batch_size):
    model = MODELS[name]()
    expected = score_matrix_naive(model, None, PROMPTS, REASONINGS)
    got = score_matrix(model, None, PROMPTS, REASONINGS, micro_batch_size=micro_batch_size)
    np.testing.assert_allclose(got, expected, atol=1e-4, rtol=0)
    np.testing.assert_array_equal(got[:, 0], got[:, 3])  # a repeated prompt: one column, copied
    np.testing.assert_array_equal(got[0], got[2])  # a repeated reasoning: one row, copied


def count_repeated_caches(monkeypatch) -> list[int]:
    """The batch sizes `_repeated` was called with: empty when every micro-batch took the prefix tree."""
    calls: list[int] = []
    real = scoring._repeated
    monkeypatch.setattr(scoring, "_repeated", lambda cache, b: calls.append(b) or real(cache, b))
    return calls


@pytest.mark.parametrize("name, tree", [("qwen2-sdpa", True), ("qwen2-eager", True), ("llama", True),
                                        ("qwen2-lora", True), ("qwen2-sliding", False)])
def test_standard_attention_takes_the_prefix_tree_and_a_sliding_window_does_not(name, tree, monkeypatch):
    """On CPU, plain softmax attention scores against one prompt cache; a sliding-window layer is
    refused by the shared-prompt attention, and the scorer falls back to repeated caches. Either
    way the attention implementation is restored and the scores are the naive ones."""
    model = MODELS[name]()
    calls = count_repeated_caches(monkeypatch)
    got = score_matrix(model, None, PROMPTS, REASONINGS, micro_batch_size=4)
    assert (not calls) == tree
    assert model.config._attn_implementation in ("sdpa", "eager")
    np.testing.assert_allclose(got, score_matrix_naive(model, None, PROMPTS, REASONINGS), atol=1e-4, rtol=0)


def test_prefix_tree_of_hand_made_rows():
    """Rows 5 6 7 | 5 6 8 | 5 9 (padded): the shared 5 and 5 6 become one node each."""
    tree = _prefix_tree(torch.tensor([[5, 6, 7], [5, 6, 8], [5, 9, 0]]), [3, 3, 2])
    assert tree.tokens.tolist() == [5, 6, 7, 8, 9]
    assert tree.depths.tolist() == [0, 1, 2, 2, 1]
    assert tree.node_at.tolist() == [[0, 1, 2], [0, 1, 3], [0, 4, 0]]  # padding reads node 0
    assert tree.first_at.tolist() == [0, 1, 2, 5, 7]  # flat row * 3 + t of each node's first position


@pytest.mark.parametrize("micro_batch_size", [2, 32])
def test_reasonings_sharing_their_start_score_as_naive(micro_batch_size):
    """Prompts of 1, 4, 9 and 23 tokens; reasonings of 1 to 9 tokens that share a start, split, and
    are prefixes of one another. The 41 tokens fed (the prompt's last token, then each reasoning
    but its last token) are 17 nodes: the prompt's last token, 10 11 12 20 21 40 41 42, then
    30 31 50 51 (after 10 11 12) and 60 61 62 63."""
    rng = np.random.default_rng(3)
    prompts = [ids(rng, n) for n in (1, 4, 9, 23)]
    reasonings = [[10, 11, 12, 20, 21, 40, 41, 42, 43], [10, 11, 12, 20, 21, 44], [10, 11, 12, 30, 31],
                  [10, 11, 12, 30, 31, 50, 51, 52], [10], [10, 11], [60, 61, 62, 63, 3], [10, 11, 12, 20, 21]]
    model = tiny_qwen2()
    got = score_matrix(model, None, prompts, reasonings, micro_batch_size=micro_batch_size)
    np.testing.assert_allclose(got, score_matrix_naive(model, None, prompts, reasonings), atol=1e-4, rtol=0)
    batch = scoring._Batch(np.arange(len(reasonings)), *padded(reasonings), with_tree=True)
    assert (len(batch.tree.tokens), int(batch.mask.sum())) == (17, 41)
    assert batch.fed(99)[:, 0].tolist() == [99] * len(reasonings) and batch.tree.node_at[:, 0].tolist() == [0] * 8


def padded(reasonings: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(map(len, reasonings))
    tokens = torch.tensor([z + [0] * (width - len(z)) for z in reasonings])
    return tokens, torch.tensor([[1] * len(z) + [0] * (width - len(z)) for z in reasonings])


def test_every_prompt_order_gives_the_same_matrix():
    """The trie walk visits prompts in sorted order; the caller's order only permutes columns."""
    model = tiny_qwen2()
    logp = score_matrix(model, None, PROMPTS, REASONINGS)
    order = np.random.default_rng(0).permutation(len(PROMPTS))
    shuffled = score_matrix(model, None, [PROMPTS[j] for j in order], REASONINGS)
    np.testing.assert_allclose(shuffled, logp[:, order], atol=1e-5, rtol=0)


def naive_matrices(model, tokenizer, blocks, **_) -> list[np.ndarray]:
    return [score_matrix_naive(model, tokenizer, prompts, reasonings) for prompts, reasonings in blocks]


def test_blocks_sharing_prompts_and_reasonings_score_as_naive():
    """The online schemes' case: blocks with columns and rows in common, each scored as on its own."""
    model = tiny_qwen2()
    blocks = [(PROMPTS[:4], REASONINGS[:5]), (PROMPTS[2:], REASONINGS[3:]), ([PROMPTS[5]], [REASONINGS[6]])]
    got = score_matrices(model, None, blocks, micro_batch_size=4)
    for logp, expected in zip(got, naive_matrices(model, None, blocks), strict=True):
        assert logp.shape == expected.shape
        np.testing.assert_allclose(logp, expected, atol=1e-4, rtol=0)
    with pytest.raises(ValueError, match="blocks is empty"):
        score_matrices(model, None, [])


def test_runs_split_only_where_padding_costs_more_than_a_forward():
    assert _runs([40] * 27 + [71], 32) == [(0, 27), (27, 28)]  # 27 x 31 pads > FORWARD_COST
    assert _runs([40] * 30 + [42], 32) == [(0, 31)]  # 30 x 2 pads < FORWARD_COST
    assert _runs([40] * 64, 32) == [(0, 32), (32, 64)]  # micro_batch_size still bounds a run
    assert _runs([5], 4) == [(0, 1)]
    lengths = [3, 3, 4, 9, 9, 30, 31]
    runs = _runs(lengths, 3)
    assert runs[0][0] == 0 and runs[-1][1] == len(lengths)
    assert all(a[1] == b[0] for a, b in zip(runs, runs[1:])) and all(0 < b - a <= 3 for a, b in runs)
    padded = sum((b - a) * lengths[b - 1] for a, b in runs) + FORWARD_COST * len(runs)
    assert padded <= sum(lengths) + FORWARD_COST * len(lengths)  # never worse than one row per forward


def prompt_cache(model: torch.nn.Module, n: int = 10) -> DynamicCache:
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model(input_ids=torch.tensor([PROMPTS[1][:n]]), use_cache=True, cache=cache)
    return cache


@pytest.mark.parametrize("other_layer_type", [False, True])
def test_repeated_cache_leaves_the_prefix_intact(other_layer_type):
    """Views for plain dynamic layers, a full copy for any other layer type; either way the
    prefix cache is unchanged after a forward on the repeated one, and that forward scores as naive."""
    model = tiny_qwen2().eval()
    prefix = prompt_cache(model)
    if other_layer_type:
        class OtherLayer(DynamicLayer):
            pass

        for layer in prefix.layers:
            layer.__class__ = OtherLayer
    before = [(layer.keys.clone(), layer.values.clone()) for layer in prefix.layers]
    repeated = _repeated(prefix, 3)
    assert [layer.keys.shape[0] for layer in repeated.layers] == [3] * len(prefix.layers)
    tokens = torch.tensor([REASONINGS[0], REASONINGS[1][:4], REASONINGS[5][:4]])
    with torch.no_grad():
        logits = model(input_ids=tokens, position_ids=10 + torch.arange(4).expand(3, 4), cache=repeated).logits
        full = model(input_ids=torch.cat([torch.tensor([PROMPTS[1][:10]] * 3), tokens], dim=1)).logits[:, 10:]
    torch.testing.assert_close(logits, full, atol=1e-4, rtol=0)
    for layer, (keys, values) in zip(prefix.layers, before):
        assert torch.equal(layer.keys, keys) and torch.equal(layer.values, values)
    assert prefix.get_seq_length() == 10 and repeated.get_seq_length() == 14


def test_online_proxies_equal_those_of_naive_scores(tiny_tokenizer, tiny_model, make_trajectory, monkeypatch):
    """Every number the diagnostics log, at two checks (the EMA carried), within 1e-4 of the same
    diagnostics scoring each pair naively: multi-turn episodes whose later prompts continue the first."""
    reasonings = ["Go left then up.", "The box is right of me.", "I push it down onto the target.", "Dragon."]
    observations = ["Turn 1: player at (row 1, col 2), box right.", "Turn 1: player at (row 3, col 2), box left.",
                    "Turn 1: arms Dragon, Turtle."]

    def batch(shift: int) -> list:
        trajectories = []
        for g, first in enumerate(observations):
            for k in range(4):
                z1, z2 = reasonings[(g + k + shift) % 4], reasonings[(g + 2 * k + 1) % 4]
                second = f"{first}<think>{z1}</think><answer>Up</answer> Turn 2 of {k % 2}."
                trajectories.append(make_trajectory(g, [(first, z1), (second, z2)]))
        return trajectories

    config = CollapseConfig(num_samples=16, micro_batch_size=4)
    fast = OnlineDiagnostics(config, seed=3)
    got = [fast.run(tiny_model, tiny_tokenizer, batch(shift), step) for shift, step in ((0, 1), (1, 5))]
    monkeypatch.setattr(online, "score_matrices", naive_matrices)
    naive = OnlineDiagnostics(config, seed=3)
    expected = [naive.run(tiny_model, tiny_tokenizer, batch(shift), step) for shift, step in ((0, 1), (1, 5))]
    for out, ref in zip(got, expected):
        assert out.keys() == ref.keys()
        assert "collapse_trajectory/mi_zscore_ema" in out and "collapse_first_turn/mi_zscore_ema" in out
        for key in ref:
            assert out[key] == pytest.approx(ref[key], abs=1e-4), key


def test_prompts_scored_from_a_rollouts_keys_and_values_score_as_encoded(tiny_tokenizer, tiny_model, monkeypatch):
    """The trainer's diagnosed step: a multi-turn rollout keeps its keys/values, and every turn's prompt
    is scored from them (none is encoded again), within 1e-4 of encoding each prompt afresh."""
    from ragen2.agent import HFBackend, group_seeds, rollout
    from ragen2.config import RolloutConfig

    cfg = RolloutConfig(max_turns=3, max_tokens_per_turn=10, temperature=1.0)
    seeds, gids = group_seeds(0, 3, 2)
    backend = HFBackend(tiny_model, tiny_tokenizer)
    cut = []
    real = scoring._cache_of_prefix
    monkeypatch.setattr(scoring, "_cache_of_prefix", lambda entry, n: cut.append(n) or real(entry, n))
    with backend.reuse_prefixes(keep_finished=True) as store:
        trajectories = rollout(backend, tiny_tokenizer, "sokoban", {}, seeds, gids, cfg, sample_seeds=list(range(6)))
        turns = [turn for t in trajectories for turn in t.turns]
        prompts, reasonings = [t.prompt_ids for t in turns], [t.response_ids for t in turns]
        assert len(turns) > len(trajectories)  # later turns, whose prompts hold earlier ones
        reused = score_matrix(tiny_model, tiny_tokenizer, prompts, reasonings, micro_batch_size=4, prefixes=store)
    assert len(cut) == len({tuple(p) for p in prompts})  # every distinct prompt came from the store
    encoded = score_matrix(tiny_model, tiny_tokenizer, prompts, reasonings, micro_batch_size=4)
    np.testing.assert_allclose(reused, encoded, atol=1e-4, rtol=0)
