"""The trainer's phases on a tiny random policy: batches, the update, skips, a whole short run."""

from __future__ import annotations

import json
import logging
import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from helpers import tiny_run_config
from ragen2.agent.types import Trajectory
from ragen2.config import AlgoConfig, Config
from ragen2.errors import ConfigError
from ragen2.rl import advantage_stage, forward, rollout_stage, trainer, update_stage
from ragen2.rl.run import setup
from ragen2.rl.batch import build_batch, response_logits
from ragen2.tracking import read_events, read_metrics

METRICS_DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"


@pytest.fixture(autouse=True)
def _single_thread(one_thread):
    """Every test here runs on one thread (see tests/conftest.py, one_thread)."""


def tiny_config(policy_dir: Path, run_dir: Path, *overrides: str) -> Config:
    """Bandit, 2 groups x 4 episodes of at most 8 tokens (`tiny_run_config`): a step takes well under a second."""
    return tiny_run_config(policy_dir, run_dir, "trainer.eval_episodes=4", "algo.mini_batch_size=4",
                           "algo.micro_batch_size=2", "optim.lr=1e-3", *overrides)


def _trajectory(seed: int, group: int, ret: float, samples: list[tuple[list[int], list[int]]]) -> Trajectory:
    return Trajectory(env_name="bandit", seed=seed, group_id=group, samples=samples, episode_return=ret)


def _with_varied_returns(run: trainer.Run, step: int = 1) -> list[Trajectory]:
    """A real rollout batch whose returns are overwritten so every group has signal."""
    trajectories, _ = rollout_stage.rollout_phase(run, step)
    for i, traj in enumerate(trajectories):
        traj.episode_return = float(i % 3)
    return trajectories


def _parameters(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in model.named_parameters() if p.requires_grad}


# ----------------------------------------------------------------------------- batch


def test_build_batch_pads_shifts_and_keeps_trajectory_labels():
    trajectories = [
        _trajectory(10, 0, 1.5, [([1, 2, 3, 4], [0, 0, 1, 1])]),
        _trajectory(11, 1, -0.5, [([5, 6], [0, 1]), ([5, 6, 7], [0, 0, 1])]),  # one sample per turn
        _trajectory(12, 1, 9.0, []),  # the env failed at reset: no rows
    ]
    batch = build_batch(trajectories, pad_id=0)
    assert batch.input_ids.tolist() == [[1, 2, 3, 4], [5, 6, 0, 0], [5, 6, 7, 0]]
    assert batch.attention_mask.tolist() == [[1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 1, 0]]
    assert batch.targets.tolist() == [[2, 3, 4], [6, 0, 0], [6, 7, 0]]
    assert batch.mask.tolist() == [[0, 1, 1], [1, 0, 0], [0, 1, 0]]
    assert batch.returns.tolist() == [1.5, -0.5, -0.5]
    assert batch.group_ids.tolist() == [0, 1, 1]
    assert batch.traj_index.tolist() == [0, 1, 1]

    sub = batch.select(torch.tensor([1]))  # trimmed to its own length
    assert sub.input_ids.tolist() == [[5, 6]]
    assert sub.targets.tolist() == [[6]] and sub.mask.tolist() == [[1]]
    with pytest.raises(ValueError, match="no training samples"):
        build_batch([trajectories[2]], pad_id=0)


def test_grpo_advantages_are_per_trajectory_and_on_model_tokens_only(policy_dir, tmp_path):
    run = setup(tiny_config(policy_dir, tmp_path / "run"))
    kept = [
        _trajectory(1, 0, 1.0, [([1, 2, 3], [0, 1, 1])]),
        _trajectory(1, 0, 0.0, [([1, 2], [0, 1]), ([1, 2, 4], [0, 0, 1])]),  # two turns, one trajectory
    ]
    batch = advantage_stage.advantage_phase(run, kept)
    # Group of two returns {1, 0}: mean 0.5, std (ddof=1) 0.7071 -> advantages +-0.7071.
    expected = torch.tensor([[0.7071, 0.7071], [-0.7071, 0.0], [0.0, -0.7071]])
    torch.testing.assert_close(batch.advantages, expected, atol=1e-4, rtol=0)
    run.tracker.close()


# ----------------------------------------------------------------------------- update


@pytest.mark.parametrize("algo", ["grpo", "ppo"])
def test_one_step_changes_every_trainable_parameter(policy_dir, tmp_path, algo):
    run = setup(tiny_config(policy_dir, tmp_path / "run", f"algo.name={algo}", "algo.kl_coef=0.01"))
    before = _parameters(run.policy)
    critic_before = _parameters(run.critic) if run.critic is not None else {}
    batch = advantage_stage.advantage_phase(run, _with_varied_returns(run))
    metrics = update_stage.update_phase(run, batch, step=1, scale=1.0)
    unchanged = [n for n, p in _parameters(run.policy).items() if torch.equal(p, before[n])]
    assert not unchanged, f"policy parameters not updated: {unchanged}"
    if algo == "ppo":
        unchanged = [n for n, p in _parameters(run.critic).items() if torch.equal(p, critic_before[n])]
        assert not unchanged, f"critic parameters not updated: {unchanged}"
        assert np.isfinite(metrics["train/value_loss"])
    for key in ("train/policy_loss", "train/entropy", "train/kl", "train/clipfrac", "train/approx_kl", "train/grad_norm"):
        assert np.isfinite(metrics[key]), key
    assert metrics["train/skipped_nonfinite"] == 0
    assert metrics["train/lr"] == pytest.approx(1e-3)
    run.tracker.close()


def test_kl_reference_is_built_only_when_used(policy_dir, tmp_path):
    run = setup(tiny_config(policy_dir, tmp_path / "a"))
    assert run.reference is None and run.critic is None
    run.tracker.close()
    run = setup(tiny_config(policy_dir, tmp_path / "b", "algo.kl_coef=0.1"))
    assert run.reference is not None
    assert not any(p.requires_grad for p in run.reference.parameters())
    run.tracker.close()


def test_nonfinite_loss_skips_the_optimizer_step(policy_dir, tmp_path):
    run = setup(tiny_config(policy_dir, tmp_path / "run"))
    batch = advantage_stage.advantage_phase(run, _with_varied_returns(run))
    batch.advantages = torch.where(batch.mask > 0, torch.nan, 0.0)
    before = _parameters(run.policy)
    metrics = update_stage.update_phase(run, batch, step=1, scale=1.0)
    assert metrics["train/skipped_nonfinite"] == 2  # 8 sequences / mini-batches of 4
    for name, p in _parameters(run.policy).items():
        assert torch.equal(p, before[name]), name
    assert not run.optimizer.state, "Adam moments must not see the bad step"
    assert all(p.grad is None for p in run.policy.parameters())
    run.tracker.close()
    events = read_events(run.run_dir)
    assert [e["kind"] for e in events] == ["skipped_nonfinite"]


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_gradient_accumulation_matches_one_big_micro_batch(policy_dir, tmp_path, agg):
    """1 micro-batch of 8 and 8 micro-batches of 1 give the same mini-batch gradient."""
    grads = []
    for micro in (8, 1):
        run = setup(tiny_config(
            policy_dir, tmp_path / f"run{micro}", f"algo.loss_agg={agg}", "algo.mini_batch_size=8",
            f"algo.micro_batch_size={micro}", "optim.lr=0", "optim.grad_clip=0", "algo.kl_coef=0.05",
        ))
        batch = advantage_stage.advantage_phase(run, _with_varied_returns(run))
        update_stage.update_phase(run, batch, step=1, scale=1.0)  # lr 0: gradients stay in .grad, weights do not move
        grads.append({n: p.grad.clone() for n, p in run.policy.named_parameters()})
        run.tracker.close()
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], atol=1e-6, rtol=1e-4, msg=name)


def test_gradient_checkpointing_gives_the_same_gradient(policy_dir, tmp_path):
    grads = []
    for checkpointing in ("false", "true"):
        run = setup(tiny_config(policy_dir, tmp_path / checkpointing, f"model.gradient_checkpointing={checkpointing}",
                                        "optim.lr=0"))
        batch = advantage_stage.advantage_phase(run, _with_varied_returns(run))
        update_stage.update_phase(run, batch, step=1, scale=1.0)
        grads.append({n: p.grad.clone() for n, p in run.policy.named_parameters()})
        run.tracker.close()
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], atol=1e-6, rtol=1e-5, msg=name)


def test_lr_schedule():
    assert [update_stage.lr_factor(s, 2, "constant", 10) for s in (1, 2, 3, 10)] == [0.5, 1.0, 1.0, 1.0]
    assert [update_stage.lr_factor(s, 0, "linear", 4) for s in (1, 2, 3, 4)] == [1.0, 0.75, 0.5, 0.25]
    cosine = [update_stage.lr_factor(s, 0, "cosine", 4) for s in (1, 3)]
    assert cosine == pytest.approx([1.0, 0.5])


def test_derived_seed_depends_on_seed_step_and_purpose_only():
    assert rollout_stage.derived_seed(0, 3, "rollout") == rollout_stage.derived_seed(0, 3, "rollout")
    seeds = {rollout_stage.derived_seed(s, t, p) for s in (0, 1) for t in (1, 2) for p in ("rollout", "env")}
    assert len(seeds) == 8
    assert all(0 <= s < 2**63 for s in seeds)


def test_grpo_with_group_size_one_is_refused(policy_dir, tmp_path):
    with pytest.raises(ConfigError, match="group_size >= 2"):
        tiny_config(policy_dir, tmp_path, "rollout.group_size=1")


def test_dual_clip_defaults_to_the_reference_and_bad_values_are_refused(policy_dir, tmp_path):
    assert AlgoConfig().clip_ratio_c == 3.0  # RAGEN/verl actor.clip_ratio_c
    assert tiny_config(policy_dir, tmp_path).algo.clip_ratio_c == 3.0
    assert tiny_config(policy_dir, tmp_path, "algo.clip_ratio_c=null").algo.clip_ratio_c is None
    for bad in ("1", "0.5"):
        with pytest.raises(ConfigError, match=rf"algo\.clip_ratio_c={bad}.* > 1"):
            tiny_config(policy_dir, tmp_path, f"algo.clip_ratio_c={bad}")


@pytest.mark.parametrize("clip_ratio_c, expected", [("3.0", 3.0), ("null", 5.0)])
def test_policy_step_caps_negative_advantage_tokens_at_clip_ratio_c(policy_dir, tmp_path, clip_ratio_c, expected):
    """Ratio 5 on every token, A = -1: the loss is -A c = 3 with no gradient (5 without the dual clip)."""
    run = setup(tiny_config(
        policy_dir, tmp_path / "run", f"algo.clip_ratio_c={clip_ratio_c}", "algo.loss_agg=token-mean",
        "algo.entropy_coef=0", "optim.lr=0", "optim.grad_clip=0",
    ))
    batch = advantage_stage.advantage_phase(run, _with_varied_returns(run))
    batch.advantages = torch.where(batch.mask > 0, -1.0, 0.0)
    with torch.no_grad():
        batch.old_logp = forward.in_micro_batches(lambda mb: forward.logprobs(run.policy, mb), batch, 2) - math.log(5)
    metrics = update_stage.policy_step(run, batch, scale=1.0)
    assert metrics["policy_loss"] == pytest.approx(expected, rel=1e-4)
    grads = [p.grad for p in run.policy.parameters() if p.grad is not None]
    if clip_ratio_c == "null":
        assert any(torch.any(g != 0) for g in grads)
    else:
        assert all(torch.all(g == 0) for g in grads)
    run.tracker.close()


def test_existing_run_directory_is_refused(policy_dir, tmp_path):
    (tmp_path / "metrics.jsonl").write_text("")
    with pytest.raises(ConfigError, match="--resume"):
        setup(tiny_config(policy_dir, tmp_path))


# ----------------------------------------------------------------------------- whole runs


def test_short_run_writes_the_run_directory(policy_dir, tmp_path):
    run_dir = tmp_path / "run"
    config = tiny_config(
        policy_dir, run_dir, "trainer.eval_every=2", "trainer.save_every=1", "filter.include_zero=true",
        "filter.strategy=none", "logging.sample_trajectories=2",
    )
    summary = trainer.train(config)
    assert (run_dir / "config.yaml").is_file()
    assert (run_dir / "checkpoints" / "latest").read_text().strip() == "step_2"
    records = read_metrics(run_dir)
    assert [r["step"] for r in records] == [0, 1, 2]
    assert set(records[0]) == {"step", "timing_s/evaluate"} | {k for k in records[2] if k.startswith("eval/")}
    step2 = records[2]
    for key in (
        "rollout/success_rate", "rollout/return_mean", "rollout/return_std", "rollout/error_rate",
        "rollout/rv_mean", "rollout/rv_std_over_mean", "rollout/frac_zero_variance",
        "filter/kept_ratio", "filter/kept_groups", "filter/skipped",
        "train/policy_loss", "train/entropy", "train/grad_norm", "train/lr", "train/skipped_nonfinite",
        "eval/success_rate", "timing_s/rollout", "timing_s/generate", "timing_s/filter", "timing_s/advantage",
        "timing_s/update", "timing_s/evaluate", "timing_s/checkpoint", "timing_s/step", "system/peak_memory_mb",
    ):
        assert step2.get(key) is not None, key
    lines = [json.loads(line) for line in (run_dir / "rollouts" / "step_2.jsonl").read_text().splitlines()]
    assert {r["episode"] for r in lines} == {0, 1}
    assert set(lines[0]) == {"group", "prompt", "reasoning", "response", "reward", "episode", "turn", "role",
                             "prompt_ids", "response_ids", "reasoning_span", "logprobs", "tokenizer"}
    assert lines[0]["prompt"].endswith("<think>")
    assert "run dir" in summary and str(run_dir) in summary and "2 / 2" in summary


def test_a_diagnosed_step_hands_the_rollouts_keys_and_values_to_the_diagnostics(policy_dir, tmp_path, monkeypatch):
    """Steps 1 and 2 of `collapse.compute_freq=2` get the rollout's prefix store, holding every
    episode's prompts whole; a store left open would be read after the update, so none outlives
    its step: the next step's rollout starts from an empty one."""
    seen = []

    def diagnose(run, trajectories, step, prefixes=None):
        assert prefixes is not None and run.backend._store is prefixes
        for trajectory in trajectories:
            for turn in trajectory.turns:
                assert prefixes.match(turn.prompt_ids)[1] == len(turn.prompt_ids)
        seen.append((step, prefixes, len(prefixes.entries)))
        return {}

    monkeypatch.setattr(trainer, "diagnose_phase", diagnose)
    trainer.train(tiny_config(policy_dir, tmp_path / "run", "collapse.compute_freq=2", "trainer.total_steps=3"))
    assert [step for step, _, _ in seen] == [1, 2]
    assert seen[0][1] is not seen[1][1]
    assert [entries for _, _, entries in seen] == [8, 8]  # one per episode of 2 x 4


def test_collapse_rollout_cache_false_encodes_the_prompts_again(policy_dir, tmp_path, monkeypatch):
    seen = []
    monkeypatch.setattr(trainer, "diagnose_phase", lambda run, trajectories, step, prefixes=None: seen.append(prefixes) or {})
    trainer.train(tiny_config(policy_dir, tmp_path / "run", "collapse.rollout_cache=false", "trainer.total_steps=1"))
    assert seen == [None]


def test_every_emitted_metric_is_documented(policy_dir, tmp_path):
    """Each key a PPO run with KL writes has a row in docs/metrics.md (STYLE 7)."""
    run_dir = tmp_path / "run"
    config = tiny_config(policy_dir, run_dir, "algo.name=ppo", "algo.kl_coef=0.01", "trainer.total_steps=1",
                         "trainer.eval_every=1", "filter.include_zero=true", "filter.strategy=none",
                         "collapse.per_turn=2", "algo.rollout_is=token", "algo.rollout_rs=token",
                         "algo.rollout_rs_threshold=2.0")
    trainer.train(config)
    documented = set(re.findall(r"^\| `([^`]+)` \|", METRICS_DOC.read_text(), flags=re.MULTILINE))
    emitted = {key for record in read_metrics(run_dir) for key in record} - {"step"}
    assert {"train/value_loss", "train/kl", "eval/success_rate", "turns/reward_var_1", "rollout_corr/kl"} <= emitted
    # turns/reward_var_1 and collapse_turn_2/... are documented as turns/reward_var_K and collapse_turn_K/...
    per_turn = {re.sub(r"_(\d+\+?)$", "_K", re.sub(r"^collapse_turn_\d+/", "collapse_turn_K/", key)) for key in emitted}
    assert per_turn - documented == set()


def test_empty_steps_are_skipped_then_the_run_stops(policy_dir, tmp_path):
    """A random policy never answers in format: every return is -0.1, no group has variance."""
    run_dir = tmp_path / "run"
    config = tiny_config(policy_dir, run_dir, "trainer.total_steps=5", "trainer.max_skipped_steps=2")
    summary = trainer.train(config)
    records = read_metrics(run_dir)
    assert [r["step"] for r in records] == [1, 2]
    assert all(r["filter/skipped"] == 1 and "train/policy_loss" not in r for r in records)
    kinds = [e["kind"] for e in read_events(run_dir)]
    assert kinds == ["skipped_step", "skipped_step", "early_stop"]
    assert (run_dir / "checkpoints" / "latest").read_text().strip() == "step_2"
    assert "stopped early" in summary and "filter.include_zero" in summary


def test_lora_trains_only_the_adapters_and_round_trips(policy_dir, tmp_path):
    run_dir = tmp_path / "run"
    config = tiny_config(policy_dir, run_dir, "model.lora_rank=2", "model.lora_target_modules=[q_proj,v_proj]",
                         "algo.kl_coef=0.1", "algo.kl_estimator=low_var_kl",  # >= 0 per token, unlike k1
                         "trainer.total_steps=1", "filter.include_zero=true")
    run = setup(config)
    trainable = _parameters(run.policy)
    assert trainable and all("lora_" in name for name in trainable)
    batch = advantage_stage.advantage_phase(run, _with_varied_returns(run))
    metrics = update_stage.update_phase(run, batch, step=1, scale=1.0)
    assert metrics["train/kl"] >= 0
    changed = [n for n, p in _parameters(run.policy).items() if not torch.equal(p, trainable[n])]
    assert len(changed) == len(trainable)
    trainer.checkpoint_phase(run, 1)
    trainer.mark_latest(run_dir, 1)
    run.tracker.log(1, {"rollout/return_mean": 0.0})
    run.tracker.close()
    run.lock.release()  # as `train` does on exit: the resume below takes the run directory over
    assert (run_dir / "checkpoints" / "step_1" / "adapter_model.safetensors").is_file()
    resumed = setup(config, resume_dir=run_dir)
    for name, p in _parameters(resumed.policy).items():
        torch.testing.assert_close(p, _parameters(run.policy)[name])
    resumed.tracker.close()


def test_grad_snr_probe_runs_in_training_without_changing_the_update(policy_dir, tmp_path):
    """With the probe on, step 2 logs per-bucket norms (KL against the loaded reference), and the
    weights after training equal those of the same run without the probe."""
    common = ("trainer.total_steps=2", "filter.include_zero=true", "filter.strategy=none", "rollout.num_groups=3")
    probed = tmp_path / "probed"
    trainer.train(tiny_config(policy_dir, probed, *common, "grad_snr.enable=true", "grad_snr.freq=1",
                              "grad_snr.num_buckets=3"))
    records = read_metrics(probed)
    assert not any(k.startswith("grad_snr/") for k in records[0])  # step 1: the policy is its reference
    step2 = records[1]
    assert step2["timing_s/grad_snr"] > 0
    assert sum(step2[f"grad_snr/bucket{i}/num_groups"] for i in range(3)) == 3
    rv = [step2[f"grad_snr/bucket{i}/rv_mean"] for i in range(3)]
    assert rv == sorted(rv)
    for i in range(3):
        for term in ("task", "kl", "entropy"):
            assert math.isfinite(step2[f"grad_snr/bucket{i}/{term}_norm"]), (i, term)
        assert step2[f"grad_snr/bucket{i}/entropy_norm"] > 0
        if rv[i] == 0:  # GRPO: equal returns give zero advantage, so no task gradient
            assert step2[f"grad_snr/bucket{i}/task_norm"] == 0
    plain = tmp_path / "plain"
    trainer.train(tiny_config(policy_dir, plain, *common))
    weights = [AutoModelForCausalLM.from_pretrained(d / "checkpoints" / "step_2").state_dict() for d in (probed, plain)]
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])


def test_validation_floor_guard_stops_the_run_with_a_checkpoint(policy_dir, tmp_path):
    """The untrained policy never succeeds: with a floor of 1.0 and patience 2, the second evaluation stops the run."""
    run_dir = tmp_path / "run"
    config = tiny_config(policy_dir, run_dir, "trainer.total_steps=6", "trainer.eval_every=2",
                         "filter.include_zero=true", "filter.strategy=none",
                         "early_stop.eval_success_floor=1.0", "early_stop.eval_patience=2")
    summary = trainer.train(config)
    assert [r["step"] for r in read_metrics(run_dir)] == [0, 1, 2]  # evaluations at steps 0 and 2
    events = [e for e in read_events(run_dir) if e["kind"] == "early_stop"]
    assert len(events) == 1 and "validation floor" in events[0]["message"] and events[0]["step"] == 2
    assert "early_stop.eval_floor=false" in events[0]["message"]
    assert (run_dir / "checkpoints" / "latest").read_text().strip() == "step_2"
    assert "stopped early" in summary


def test_guard_state_survives_a_resume(policy_dir, tmp_path):
    run_dir = tmp_path / "run"
    overrides = ("trainer.eval_every=1", "trainer.save_every=1", "filter.include_zero=true", "filter.strategy=none",
                 "early_stop.eval_success_floor=1.0", "early_stop.eval_patience=4")
    trainer.train(tiny_config(policy_dir, run_dir, *overrides, "trainer.total_steps=2"))
    assert not [e for e in read_events(run_dir) if e["kind"] == "early_stop"]
    # Evaluations at steps 0, 1, 2 are below the floor; the fourth (step 3) fires only if the count was restored.
    trainer.train(tiny_config(policy_dir, run_dir, *overrides, "trainer.total_steps=6"), resume_dir=run_dir)
    assert [r["step"] for r in read_metrics(run_dir)][-1] == 3
    assert [e["step"] for e in read_events(run_dir) if e["kind"] == "early_stop"] == [3]


def test_response_logits_equal_the_full_forward_on_response_tokens(policy_dir, tmp_path):
    run = setup(tiny_config(policy_dir, tmp_path / "run"))
    batch = build_batch(_with_varied_returns(run), run.tokenizer.pad_token_id)
    logits, start = response_logits(run.policy, batch)
    assert start > 0 and batch.mask[:, :start].sum() == 0  # the columns left out hold no response token
    full = run.policy(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits[:, :-1]
    # Without a padding mask the real tokens' logits are the masked forward's; only the pads' differ.
    real = batch.attention_mask[:, :-1].bool()[:, start:]
    assert (~real).any() and torch.allclose(logits[real], full[:, start:][real], atol=1e-5)
    run.tracker.close()


def test_on_policy_step_without_old_logprobs_matches_one_with_them(policy_dir, tmp_path):
    """One epoch of one mini-batch skips the old-log-prob pass; the update must not change."""
    weights = []
    for name, precompute in (("a", True), ("b", False)):
        run = setup(tiny_config(policy_dir, tmp_path / name, "algo.mini_batch_size=64"))
        batch = advantage_stage.advantage_phase(run, _with_varied_returns(run))
        if precompute:
            with torch.no_grad():
                batch.old_logp = forward.in_micro_batches(lambda mb: forward.logprobs(run.policy, mb), batch, 2)
        update_stage.policy_step(run, batch, scale=1.0)
        weights.append(_parameters(run.policy))
        run.tracker.close()
    assert all(torch.allclose(weights[0][n], weights[1][n], atol=1e-6) for n in weights[0])


# ----------------------------------------------------------------------------- off-policy correction


def test_rollouts_record_the_behaviour_logprobs_of_every_trained_token(policy_dir, tmp_path):
    """At temperature 1 and top-p 1 the recorded log-probs are the policy's own, token for token."""
    run = setup(tiny_config(policy_dir, tmp_path / "run", "rollout.max_turns=2"))
    trajectories, _ = rollout_stage.rollout_phase(run, 1)
    batch = build_batch(trajectories, run.tokenizer.pad_token_id)
    assert batch.rollout_logp is not None and batch.mask.sum() > 0
    with torch.no_grad():
        logp = forward.in_micro_batches(lambda mb: forward.logprobs(run.policy, mb), batch, 2)
    torch.testing.assert_close(batch.rollout_logp * batch.mask, logp * batch.mask, atol=1e-4, rtol=0)
    assert torch.all(batch.rollout_logp[batch.mask == 0] == 0)
    run.tracker.close()


def _corrected_update(policy_dir: Path, run_dir: Path, shift: float, *overrides: str, old_logp: bool = False):
    """One update whose batch's behaviour log-probs are the policy's own plus `shift` on every other row;
    with `old_logp`, the policy's log-probs before the update are given, as a separate pass makes them."""
    run = setup(tiny_config(policy_dir, run_dir, "algo.mini_batch_size=64", *overrides))
    batch = advantage_stage.advantage_phase(run, _with_varied_returns(run))
    with torch.no_grad():
        own = forward.in_micro_batches(lambda mb: forward.logprobs(run.policy, mb), batch, 2)
    rows = torch.arange(len(batch)) % 2 == 1
    batch.rollout_logp = (own + shift * rows[:, None]) * batch.mask
    if old_logp:
        batch.old_logp = own
    mask = batch.mask.clone()
    metrics = update_stage.update_phase(run, batch, step=1, scale=1.0)
    run.tracker.close()
    return _parameters(run.policy), metrics, mask, rows


def test_on_policy_correction_changes_nothing_and_stale_rows_are_weighted_or_rejected(policy_dir, tmp_path):
    plain, _, _, _ = _corrected_update(policy_dir, tmp_path / "plain", 0.0)
    same, metrics, _, _ = _corrected_update(policy_dir, tmp_path / "same", 0.0, "algo.rollout_is=token")
    assert all(torch.allclose(plain[n], same[n], atol=1e-6) for n in plain)  # weights of 1
    assert metrics["rollout_corr/is_weight_mean"] == pytest.approx(1.0, abs=1e-5)
    assert metrics["rollout_corr/is_truncated_frac"] == 0.0

    # Behaviour log-probs 1 nat above the policy's on odd rows: their weights are e^-1, the others 1.
    weighted, metrics, mask, rows = _corrected_update(policy_dir, tmp_path / "w", 1.0, "algo.rollout_is=token")
    odd = float(mask[rows].sum() / mask.sum())
    assert metrics["rollout_corr/is_weight_mean"] == pytest.approx(1 - odd + odd * math.exp(-1), abs=1e-4)
    assert metrics["rollout_corr/kl"] == pytest.approx(odd, abs=1e-4)
    assert not all(torch.allclose(plain[n], weighted[n], atol=1e-6) for n in plain)

    # Rejection at [1/2, 2] drops exactly the odd rows' tokens (ratio e^-1 < 1/2).
    _, metrics, _, _ = _corrected_update(policy_dir, tmp_path / "r", 1.0, "algo.rollout_rs=token",
                                         "algo.rollout_rs_threshold=2.0")
    assert metrics["rollout_corr/rejected_frac"] == pytest.approx(odd, abs=1e-6)
    assert "rollout_corr/is_weight_mean" not in metrics


@pytest.mark.parametrize("layout", [(), ("algo.mini_batch_size=6", "algo.ppo_epochs=2")])
def test_first_mini_batch_log_probs_match_those_of_a_separate_pass(policy_dir, tmp_path, layout):
    """The first mini-batch's own forward pass gives its rows' old log-probs and importance weights (all
    rows with one epoch of one mini-batch): the update and the `rollout_corr/` metrics are those of a run
    that computes every row's old log-probs first."""
    separate, expected, _, _ = _corrected_update(policy_dir, tmp_path / "a", 1.0, "algo.rollout_is=token", *layout,
                                                 old_logp=True)
    one_pass, metrics, _, _ = _corrected_update(policy_dir, tmp_path / "b", 1.0, "algo.rollout_is=token", *layout)
    assert all(torch.allclose(separate[n], one_pass[n], atol=1e-6) for n in separate)
    corr = sorted(key for key in expected if key.startswith("rollout_corr/"))
    assert corr == sorted(key for key in metrics if key.startswith("rollout_corr/")) and len(corr) == 5
    assert [metrics[key] for key in corr] == pytest.approx([expected[key] for key in corr], abs=1e-5)
    assert expected["rollout_corr/is_weight_mean"] < 0.9  # the odd rows' weights of e^-1 are in both


def test_correction_keys_are_checked(policy_dir, tmp_path):
    with pytest.raises(ConfigError, match="algo.rollout_rs=geometric needs algo.rollout_rs_threshold"):
        tiny_config(policy_dir, tmp_path / "run", "algo.rollout_rs=geometric")
    with pytest.raises(ConfigError, match="algo.rollout_is"):
        tiny_config(policy_dir, tmp_path / "run", "algo.rollout_is=seq")


def test_a_run_computes_on_the_threads_it_chose_and_gives_the_callers_back(policy_dir, tmp_path, monkeypatch, caplog):
    """A tiny policy trains on one thread whatever the caller had; model.cpu_threads overrides the choice."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    seen = []
    step = trainer.training_step
    monkeypatch.setattr(trainer, "training_step", lambda *a: seen.append(torch.get_num_threads()) or step(*a))
    torch.set_num_threads(2)
    with caplog.at_level(logging.INFO, logger="ragen2"):
        trainer.train(tiny_config(policy_dir, tmp_path / "a"))
        trainer.train(tiny_config(policy_dir, tmp_path / "b", "model.cpu_threads=3"))
    assert seen == [1, 1, 3, 3]
    assert torch.get_num_threads() == 2
    assert "torch on 1 CPU thread per process (a policy of" in caplog.text
    assert "torch on 3 CPU threads per process (model.cpu_threads)" in caplog.text


def test_kl_in_reward_takes_beta_times_the_kl_off_the_token_rewards_before_the_advantages(policy_dir, tmp_path):
    """REINFORCE++'s advantages equal those of the token rewards less beta x KL (k1) on every model token,
    recomputed here from the batch's own log-probs; without the penalty they would not (the policy is moved
    off its reference first, so the KL is not 0)."""
    from ragen2.rl.advantages import place_terminal_reward, reinforce_pp_advantages

    config = tiny_config(policy_dir, tmp_path / "run", "algo.name=reinforce_pp", "algo.kl_in_reward=true",
                         "algo.kl_reward_coef=0.5", "algo.kl_estimator=k1", "algo.gamma=1.0",
                         "algo.reward_norm_method=identity")
    run = setup(config)
    torch.manual_seed(0)
    with torch.no_grad():
        for p in run.policy.parameters():
            p.add_(0.05 * torch.randn_like(p))
    batch = advantage_stage.advantage_phase(run, [t for t in _with_varied_returns(run) if t.samples])
    kl = (batch.old_logp - batch.ref_logp) * batch.mask
    assert kl.abs().sum() > 0.01
    task_rewards = place_terminal_reward(batch.returns, batch.mask)
    expected = reinforce_pp_advantages(task_rewards - 0.5 * kl, batch.mask, 1.0)
    assert torch.allclose(batch.advantages, expected, atol=1e-5)
    assert not torch.allclose(batch.advantages, reinforce_pp_advantages(task_rewards, batch.mask, 1.0), atol=1e-3)
