"""SNRReplayBuffer inside verl's current trainer: loaded from verl's config, it drops the groups
`select_groups` drops, and what it returns goes through verl's padding and GRPO advantage phases."""

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

verl = pytest.importorskip("verl", reason="needs the verl extra: make test-verl")

import ray  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402
from verl.protocol import DataProto  # noqa: E402
from verl.trainer.ppo.core_algos import AdvantageEstimator  # noqa: E402
from verl.trainer.ppo.padding_utils import upsample_batch_to_divisible_size  # noqa: E402
from verl.trainer.ppo.v1.trainer_base import PPOTrainer  # noqa: E402
from verl.trainer.ppo.v1.utils import compute_advantage_for_multi_trajectories  # noqa: E402
from verl.utils.tensordict_utils import list_of_dict_to_tensordict  # noqa: E402

from ragen2.errors import ConfigError  # noqa: E402
from ragen2.filtering import FilterRule  # noqa: E402
from ragen2.integrations.verl import SNRReplayBuffer, SNRReplayBufferAsync  # noqa: E402

EOS = 2
PROMPT_LEN = 3
# Final reward of each of the 4 sessions of 5 prompt groups. Reward variances (ddof=1):
# g0 0, g1 0.25, g2 1/3, g3 0, g4 1. Zero-variance groups are dropped (include_zero=false); top_p
# with rho=0.8 keeps the smallest prefix of (g4, g2, g1) reaching 0.8 x 1.583 - 0.01: g4 + g2 = 1.333.
REWARDS = {"g0": [1, 1, 1, 1], "g1": [1, 0, 0, 0], "g2": [1, 1, 0, 0], "g3": [0, 0, 0, 0], "g4": [2, 0, 0, 0]}
KEPT = {"g2", "g4"}


def put_group(store, uid: str, rewards: list[float], step: int = 1) -> list[str]:
    """A finished prompt group as verl's agent loop leaves it in the transfer queue. Session 1 ran
    two outputs (a multi-trajectory session): its first output scores 5, but only the final
    output's reward is the session's, as in verl's GRPO."""
    store.kv_batch_put([uid], "train", tags=[{"is_prompt": True, "status": "finished", "global_steps": step}])
    keys, rows = [], []
    for session, reward in enumerate(rewards):
        outputs = [5.0, reward] if session == 1 else [reward]
        for index, final in enumerate(outputs):
            length = 2 + (session + index) % 3  # responses of different lengths: the queue holds jagged tensors
            rm_scores = torch.zeros(length)
            rm_scores[-1] = final  # verl puts the outcome reward on the last response token
            prompts = torch.arange(10, 10 + PROMPT_LEN)
            responses = torch.arange(20, 20 + length)
            keys.append(f"{uid}_{session}_{index}")
            rows.append({
                "uid": uid, "prompts": prompts, "responses": responses,
                "input_ids": torch.cat([prompts, responses]),
                "attention_mask": torch.ones(PROMPT_LEN + length, dtype=torch.int64),
                "position_ids": torch.arange(PROMPT_LEN + length),
                "response_mask": torch.ones(length, dtype=torch.int64),
                "loss_mask": torch.ones(length, dtype=torch.int64), "rm_scores": rm_scores,
                "rollout_log_probs": torch.zeros(length), "num_turns": 1,
            })
    tags = [{"global_steps": step, "prompt_len": PROMPT_LEN, "response_len": len(r["responses"]),
             "seq_len": PROMPT_LEN + len(r["responses"])} for r in rows]
    store.kv_batch_put(keys, "train", fields=list_of_dict_to_tensordict(rows), tags=tags)
    return keys


def build_buffer(refill=None, **sampler_kwargs):
    """The replay buffer verl's trainer builds from its config, with the plug-in selected there."""
    config = OmegaConf.load(Path(verl.__file__).parent / "trainer/config/_generated_ppo_trainer.yaml")
    sampler = config.trainer.v1.sampler
    sampler.custom_sampler.path = "pkg://ragen2.integrations.verl"
    sampler.custom_sampler.name = "SNRReplayBuffer"
    sampler.sampler_kwargs = sampler_kwargs
    trainer = SimpleNamespace(config=config, trainer_mode="sync", _add_prompts_to_generate=refill)
    return PPOTrainer._build_replay_buffer(trainer)


def grpo_advantages(store, keys: list[str]) -> dict[str, float]:
    """verl's GRPO over multi-trajectory sessions on `keys`: key -> advantage (first response token)."""
    data = store.kv_batch_get(keys, "train", select_fields=["uid", "rm_scores", "response_mask"])
    rewards = data["rm_scores"].to_padded_tensor(0.0)  # [N, R]
    mask = data["response_mask"].to_padded_tensor(0)  # [N, R]
    batch = DataProto.from_dict(
        tensors={"token_level_rewards": rewards, "response_mask": mask},
        non_tensors={"uid": np.array(list(data["uid"]), dtype=object)},
    )
    out = compute_advantage_for_multi_trajectories(batch, keys, AdvantageEstimator.GRPO, num_repeat=4)
    return dict(zip(keys, out.batch["advantages"][:, 0].tolist(), strict=True))


def test_config_selects_the_plugin():
    buffer = build_buffer(value=0.8)
    assert type(buffer) is SNRReplayBuffer
    assert buffer.filter_rule == FilterRule(strategy="top_p", value=0.8, metric="reward_variance", include_zero=False,
                                            ddof=1, order="largest", selection_eps=0.01, zero_tol=1e-10)


def test_sampler_drops_the_low_variance_groups_and_the_batch_stays_valid(fake_tq):
    all_keys = [key for uid, rewards in REWARDS.items() for key in put_group(fake_tq, uid, rewards)]
    unfiltered = grpo_advantages(fake_tq, all_keys)  # what verl would compute without the filter
    buffer = build_buffer(value=0.8)

    batch, metrics = buffer.sample(global_steps=1, partition_id="train", batch_size=5)

    assert {key.split("_")[0] for key in batch.keys} == KEPT
    assert batch.keys == [key for key in all_keys if key.split("_")[0] in KEPT]  # verl's order, tags alongside
    assert [tag["response_len"] for tag in batch.tags] == [
        fake_tq.tags["train"][key]["response_len"] for key in batch.keys
    ]
    assert set(fake_tq.fields["train"]) == set(batch.keys)  # dropped trajectories and prompt entries cleared
    assert metrics["filter/kept_groups"] == 2 and metrics["filter/kept_ratio"] == pytest.approx(2 / 5)
    assert metrics["rollout/rv_mean"] == pytest.approx((0 + 0.25 + 1 / 3 + 0 + 1) / 5)
    assert metrics["rollout/frac_zero_variance"] == pytest.approx(2 / 5)
    assert metrics["filter/incomplete_groups"] == 0 and metrics["filter/resamples"] == 0

    # The next phases: verl pads the batch to its data-parallel / mini-batch multiple with no-op
    # samples, then computes GRPO advantages. Kept groups are whole, so their advantages are
    # exactly those of the unfiltered batch; the padding rows get none.
    padded = upsample_batch_to_divisible_size(batch, batch_multiple=4, eos_token_id=EOS)
    assert len(batch.keys) == 10 and len(padded) == 12
    advantages = grpo_advantages(fake_tq, padded.keys)
    for key in batch.keys:
        assert advantages[key] == pytest.approx(unfiltered[key], abs=1e-6)
    assert [advantages[key] for key in padded.keys[10:]] == [0.0, 0.0]
    assert advantages["g4_0_0"] == pytest.approx(1.5 / 1.0, rel=1e-4)  # (2 - 0.5) / std (ddof=1) of [2, 0, 0, 0]
    assert not ray.is_initialized()  # verl's code ran without a cluster


def test_nothing_kept_generates_a_fresh_batch(fake_tq):
    for uid in ("a", "b"):
        put_group(fake_tq, uid, [1, 1, 1, 1])
    refills = []

    def refill(num_prompts: int) -> int:  # the trainer submits prompts; here they come back finished
        refills.append(num_prompts)
        put_group(fake_tq, "c", [1, 0, 0, 0])
        put_group(fake_tq, "d", [0, 0, 0, 0])
        return num_prompts

    batch, metrics = build_buffer(refill).sample(global_steps=1, partition_id="train", batch_size=2)

    assert refills == [2]
    assert {key.split("_")[0] for key in batch.keys} == {"c"}
    assert metrics["filter/resamples"] == 1
    assert not any(key.startswith(("a_", "b_", "d_")) for key in fake_tq.fields["train"])


def test_too_many_empty_batches_raise(fake_tq):
    put_group(fake_tq, "a", [1, 1, 1, 1])
    with pytest.raises(RuntimeError, match="no group kept in 1 batches"):
        build_buffer(max_resamples=0).sample(global_steps=1, partition_id="train", batch_size=1)


def test_failed_sessions_leave_their_group_unranked(fake_tq):
    keys = put_group(fake_tq, "a", [1, 1, 1, 1]) + put_group(fake_tq, "b", [1, 0, 0, 0])
    put_group(fake_tq, "c", [0, 0, 0])  # one session failed: 3 episodes
    batch, metrics = build_buffer().sample(global_steps=1, partition_id="train", batch_size=3)
    assert {key.split("_")[0] for key in batch.keys} == {"b", "c"}
    assert metrics["filter/incomplete_groups"] == 1 and metrics["filter/kept_groups"] == 1
    assert not any(key in fake_tq.fields["train"] for key in keys if key.startswith("a_"))


def test_validation_batches_are_not_filtered(fake_tq):
    fake_tq.kv_batch_put(["v"], "val", tags=[{"is_prompt": True, "status": "finished", "global_steps": 1}])
    fake_tq.kv_batch_put(["v_0_0"], "val", tags=[{"global_steps": 1}])
    batch, metrics = build_buffer().sample(global_steps=1, partition_id="val", batch_size=1)
    assert batch.keys == ["v_0_0"] and "filter/kept_groups" not in metrics


def test_missing_rewards_name_the_fix(fake_tq):
    put_group(fake_tq, "a", [1, 0, 0, 0])
    for row in fake_tq.fields["train"].values():
        row.pop("rm_scores", None)
    with pytest.raises(RuntimeError, match="enable_resource_pool"):
        build_buffer().sample(global_steps=1, partition_id="train", batch_size=1)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"strategie": "top_k"}, r"unknown key trainer.v1.sampler.sampler_kwargs.strategie.*Did you mean: strategy"),
    ({"strategy": "top_q"}, r"sampler_kwargs: unknown filter strategy 'top_q'"),
    ({"value": 1.5}, r"filter value 1.5 is out of range"),
    ({"metric": "length"}, r"sampler_kwargs.metric='length' is not supported in verl"),
    ({"max_resamples": -1}, r"max_resamples=-1 must be an integer >= 0"),
])
def test_bad_sampler_kwargs_fail_at_start(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        build_buffer(**kwargs)


def test_async_buffer_filters_too(fake_tq):
    for uid, rewards in REWARDS.items():
        put_group(fake_tq, uid, rewards)
    buffer = SNRReplayBufferAsync(trainer_mode="colocate_async", trainer_config={}, max_off_policy_threshold=None,
                                  max_off_policy_strategy="drop", sampler_kwargs={"value": 0.8})
    batch, _ = buffer.sample(global_steps=1, partition_id="train", batch_size=5)
    assert {key.split("_")[0] for key in batch.keys} == KEPT
