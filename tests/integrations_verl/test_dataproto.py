"""The pure functions over verl's DataProto: `filter_batch` for the older trainer (the batch it
returns goes through verl's GRPO advantage and data-parallel chunking) and the MI metrics."""

import numpy as np
import pytest
import torch

pytest.importorskip("verl", reason="needs the verl extra: make test-verl")

from verl.protocol import DataProto  # noqa: E402
from verl.trainer.ppo.core_algos import AdvantageEstimator  # noqa: E402
from verl.trainer.ppo.ray_trainer import compute_advantage  # noqa: E402

from ragen2.collapse.metrics import EmaState, mi_metrics  # noqa: E402
from ragen2.collapse.scoring import score_matrix_naive  # noqa: E402
from ragen2.errors import ConfigError  # noqa: E402
from ragen2.integrations.verl import collapse_metrics, cross_log_probs, filter_batch  # noqa: E402

# Returns of 5 groups of 4 (see test_sampler.py): with top_p rho=0.8 and zero-RV groups dropped,
# g2 and g4 are kept.
REWARDS = {"g0": [1, 1, 1, 1], "g1": [1, 0, 0, 0], "g2": [1, 1, 0, 0], "g3": [0, 0, 0, 0], "g4": [2, 0, 0, 0]}
PROMPT_LEN, RESPONSE_LEN = 4, 5


def make_batch(rewards: dict[str, list[float]], seed: int = 0) -> DataProto:
    """A batch as the older trainer holds it after the reward phase, rows shuffled as verl's
    sequence-length balancing leaves them (groups are found by uid, not by position)."""
    rows = [(uid, r) for uid, returns in rewards.items() for r in returns]
    order = np.random.default_rng(seed).permutation(len(rows))
    rows = [rows[i] for i in order]
    n = len(rows)
    lengths = torch.tensor([2 + i % 4 for i in range(n)])  # valid response tokens per row
    response_mask = (torch.arange(RESPONSE_LEN)[None, :] < lengths[:, None]).long()  # [B, R]
    scores = torch.zeros(n, RESPONSE_LEN)
    scores[torch.arange(n), lengths - 1] = torch.tensor([float(r) for _, r in rows])  # reward on the last token
    group_index = {uid: j for j, uid in enumerate(rewards)}
    prompts = torch.tensor([[0, 10 + group_index[uid], 20, 30] for uid, _ in rows])  # one padding token on the left
    prompt_mask = torch.tensor([[0, 1, 1, 1]] * n)
    attention_mask = torch.cat([prompt_mask, response_mask], dim=1)
    return DataProto.from_dict(
        tensors={"prompts": prompts, "responses": torch.randint(40, 60, (n, RESPONSE_LEN)),
                 "attention_mask": attention_mask, "response_mask": response_mask, "token_level_scores": scores,
                 "token_level_rewards": scores.clone()},
        non_tensors={"uid": np.array([uid for uid, _ in rows], dtype=object)},
        meta_info={"temperature": 0.7, "global_token_num": attention_mask.sum(-1).tolist()},
    )


def grpo(data: DataProto) -> torch.Tensor:
    """verl's GRPO advantages [B, R], as the older trainer's advantage phase computes them."""
    return compute_advantage(data, AdvantageEstimator.GRPO, num_repeat=4).batch["advantages"]


def test_filter_batch_keeps_whole_groups_and_their_advantages():
    data = make_batch(REWARDS)
    unfiltered = grpo(make_batch(REWARDS))
    uids = list(data.non_tensor_batch["uid"])

    out, metrics = filter_batch(data, value=0.8)

    kept_rows = [i for i, uid in enumerate(uids) if uid in ("g2", "g4")]
    assert list(out.non_tensor_batch["uid"]) == [uids[i] for i in kept_rows]  # rows in their order
    assert torch.equal(out.batch["token_level_scores"], data.batch["token_level_scores"][kept_rows])
    assert metrics["filter/kept_groups"] == 2 and metrics["filter/filler_rows"] == 0
    assert metrics["rollout/rv_mean"] == pytest.approx((0 + 0.25 + 1 / 3 + 0 + 1) / 5)
    assert torch.allclose(grpo(out), unfiltered[kept_rows], atol=1e-6)  # group baselines intact
    assert out.meta_info["temperature"] == 0.7
    assert out.meta_info["global_token_num"] == out.batch["attention_mask"].sum(-1).tolist()


def test_size_divisor_tops_up_with_masked_rows_that_change_nothing():
    data = make_batch(REWARDS)
    unfiltered = grpo(make_batch(REWARDS))
    uids = list(data.non_tensor_batch["uid"])

    out, metrics = filter_batch(data, size_divisor=3, value=0.8)  # 8 kept rows -> 9

    assert len(out) == 9 and metrics["filter/filler_rows"] == 1
    kept_rows = [i for i, uid in enumerate(uids) if uid in ("g2", "g4")]
    filler = out.non_tensor_batch["uid"][8]
    assert filler not in ("g2", "g4")
    assert out.batch["response_mask"][8].sum() == 0 and out.batch["response_mask"][:8].sum() > 0
    advantages = grpo(out)
    assert torch.allclose(advantages[:8], unfiltered[kept_rows], atol=1e-6)
    assert advantages[8].abs().sum() == 0  # no loss term from the filler row
    assert [len(chunk) for chunk in out.chunk(3)] == [3, 3, 3]  # verl's data-parallel dispatch
    assert len(out.meta_info["global_token_num"]) == 9


def test_nothing_kept_gives_an_empty_batch():
    out, metrics = filter_batch(make_batch({"a": [1, 1, 1, 1], "b": [0, 0, 0, 0]}), size_divisor=4)
    assert len(out) == 0 and metrics["filter/kept_groups"] == 0


def test_include_zero_keeps_zero_variance_groups():
    out, _ = filter_batch(make_batch({"a": [1, 1, 1, 1], "b": [0, 0, 0, 0]}), include_zero=True, strategy="none")
    assert len(out) == 8


def test_filter_batch_errors_name_the_fix():
    data = make_batch(REWARDS)
    with pytest.raises(ConfigError, match=r"batch\['rm_scores'\], the token-level rewards"):
        filter_batch(data, reward_key="rm_scores")
    with pytest.raises(ConfigError, match="unknown key filter.valeu.*Did you mean: value"):
        filter_batch(data, valeu=0.5)
    with pytest.raises(ConfigError, match="size_divisor=0"):
        filter_batch(data, size_divisor=0)
    data.batch.pop("response_mask")
    with pytest.raises(ConfigError, match="response_mask"):
        filter_batch(data, size_divisor=3, value=0.8)


def test_collapse_metrics_are_mi_metrics_of_the_cross_scores():
    data = make_batch({"g0": [1, 0], "g1": [0, 1], "g2": [1, 1]}, seed=1)
    uids = list(data.non_tensor_batch["uid"])
    columns = list(dict.fromkeys(uids))
    source = np.array([columns.index(u) for u in uids])
    rng = np.random.default_rng(0)
    logp = rng.normal(-20.0, 1.0, size=(6, 3))
    logp[np.arange(6), source] += 3.0  # every response is likeliest under its own prompt
    logp[0] = np.nan  # a row that was not scored
    data.batch["cross_log_probs"] = torch.tensor(logp)

    result = collapse_metrics(data)

    lengths = data.batch["response_mask"].sum(-1).numpy()
    expected = mi_metrics(logp[1:], source[1:], lengths=lengths[1:])
    assert result["retrieval_acc"] == 1.0 and result["num_pairs"] == 5 and result["num_distinct_inputs"] == 3
    for key in ("mi_est", "mi_seq_est", "mi_zscore", "cond_entropy", "reasoning_entropy"):
        assert result[key] == pytest.approx(expected[key])
    again = collapse_metrics(data, ema_state=result["ema_state"])
    assert isinstance(again["ema_state"], EmaState) and again["ema_state"].steps == 2


def test_identical_prompts_form_one_input_class():
    data = make_batch({"g0": [1, 0], "g1": [0, 1]})
    data.batch["prompts"][:] = torch.tensor([0, 10, 20, 30])  # both groups were asked the same question
    data.batch["cross_log_probs"] = torch.zeros(4, 2)
    result = collapse_metrics(data)
    assert result["num_distinct_inputs"] == 1 and result["chance_level"] == 1.0


def test_cross_log_probs_scores_responses_under_each_group_prompt(save_random_policy, tmp_path):
    model, _ = save_random_policy(tmp_path / "policy")
    data = make_batch({"g0": [1, 0], "g1": [0, 1], "g2": [1, 1]})
    data.batch["responses"] = torch.randint(5, 200, data.batch["responses"].shape)
    data.batch["prompts"] = torch.randint(5, 200, data.batch["prompts"].shape)
    for i, uid in enumerate(data.non_tensor_batch["uid"]):  # rows of one group share their prompt
        first = list(data.non_tensor_batch["uid"]).index(uid)
        data.batch["prompts"][i] = data.batch["prompts"][first]

    logp = cross_log_probs(data, model.eval(), rows=[0, 2, 3])

    assert torch.isnan(logp[[1, 4, 5]]).all() and not torch.isnan(logp[[0, 2, 3]]).any()
    uids = list(data.non_tensor_batch["uid"])
    columns = list(dict.fromkeys(uids))
    prompts = [data.batch["prompts"][uids.index(u)][1:].tolist() for u in columns]  # without the left padding
    responses = [data.batch["responses"][m][data.batch["response_mask"][m].bool()].tolist() for m in (0, 2, 3)]
    expected = score_matrix_naive(model, None, prompts, responses)  # one forward per pair: the definition
    assert np.allclose(logp[[0, 2, 3]].numpy(), expected, atol=1e-4)
