"""Asynchronous training: its config section, the policy version of every sample, its synchronous limit
(async.max_staleness=0, which must be the synchronous run exactly), the rollout worker process at staleness 1,
admission of oversampled candidates by the filter, and what happens when the worker or the trainer is killed."""

from __future__ import annotations

import multiprocessing
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from ragen2.config import config_from_file, load_config
from ragen2.errors import ConfigError, RolloutWorkerError
from ragen2.filtering import group_scores
from ragen2.rl import filter_stage, forward, rollout_stage, trainer
from ragen2.rl.run import setup
from ragen2.rl.async_rollout import LocalWorker, launched_roles, rollout_worker, trainable
from ragen2.rl.batch import build_batch
from ragen2.rl.checkpoint import latest_step
from ragen2.rl.losses import token_logprobs
from ragen2.tracking import read_metrics

REPO = Path(__file__).resolve().parents[2]
METRICS_DOC = REPO / "docs" / "metrics.md"

# Keys that differ between any two runs (wall-clock time, memory) or exist only in the asynchronous schedule.
UNCOMPARED = ("timing_s/", "system/", "async/")


@pytest.fixture(autouse=True)
def _single_thread(one_thread):
    """Every test here runs on one thread (see tests/conftest.py, one_thread)."""


@pytest.fixture
def worker_exit_codes(monkeypatch) -> list[int | None]:
    """The exit codes of a run's local rollout workers, each waited for (30 s at most) when the run closes them."""
    codes: list[int | None] = []
    original_close = LocalWorker.close

    def close(self, clean: bool) -> None:
        for process in self.processes:
            process.join(timeout=30)
            codes.append(process.exitcode)
        original_close(self, clean)

    monkeypatch.setattr(LocalWorker, "close", close)
    return codes


def tiny(policy_dir: Path, run_dir: Path, *overrides: str):
    """Bandit, 2 groups x 4 episodes of at most 8 tokens, 3 steps with an evaluation and the MI diagnostics."""
    return load_config("bandit", [
        f"model.path={policy_dir}", "model.device=cpu", f"trainer.run_dir={run_dir}", "rollout.num_groups=2",
        "rollout.group_size=4", "rollout.max_tokens_per_turn=8", "trainer.total_steps=3", "trainer.eval_every=2",
        "trainer.eval_episodes=4", "algo.mini_batch_size=4", "algo.micro_batch_size=2", "optim.lr=1e-3",
        "filter.include_zero=true", "logging.progress=false", "logging.tensorboard=false", *overrides,
    ])


def test_staleness_zero_is_the_synchronous_run(policy_dir, tmp_path):
    """`async.enable=true async.max_staleness=0` starts no worker: it must run the synchronous schedule, metric
    for metric, plus the async/ metrics. This checks that path only; the worker's own correctness is checked by
    test_staleness_one_trains_on_groups_from_a_rollout_worker and test_the_worker_samples_with_the_weights_it_was_sent
    (its groups' log-probs are those of the weights pushed, not the initial ones)."""
    trainer.train(tiny(policy_dir, tmp_path / "sync"))
    trainer.train(tiny(policy_dir, tmp_path / "async", "async.enable=true", "async.max_staleness=0"))
    sync, asynchronous = read_metrics(tmp_path / "sync"), read_metrics(tmp_path / "async")
    assert [r["step"] for r in sync] == [r["step"] for r in asynchronous] == [0, 1, 2, 3]
    for a, b in zip(sync, asynchronous):
        compared = {k for k in a if not k.startswith(UNCOMPARED)}
        assert compared == {k for k in b if not k.startswith(UNCOMPARED)}
        assert {k: a[k] for k in compared} == {k: b[k] for k in compared}, a["step"]
    trained = [r for r in asynchronous if r["step"] > 0]
    assert all(r["async/staleness_mean"] == r["async/staleness_max"] == 0.0 for r in trained)
    assert all(r["async/staleness_frac_0"] == 1.0 and r["async/staleness_frac_1"] == 0.0 for r in trained)
    assert not any(k.startswith("async/") for r in sync for k in r)


def test_samples_record_the_policy_version_that_drew_them(policy_dir, tmp_path):
    run = setup(tiny(policy_dir, tmp_path / "run"))
    for step in (1, 4):
        trajectories, _ = rollout_stage.rollout_phase(run, step)
        assert {t.policy_version for t in trajectories} == {step - 1}
    mixed = trajectories[:3] + [trainer.dataclasses.replace(trajectories[3], policy_version=1)]  # group 0
    metrics = rollout_stage.staleness_metrics(mixed, 4)
    assert metrics["async/staleness_mean"] == pytest.approx(0.5) and metrics["async/staleness_max"] == 2.0
    assert (metrics["async/staleness_frac_0"], metrics["async/staleness_frac_2"]) == (0.75, 0.25)
    # The MI split by staleness counts a group at its stalest episode.
    assert rollout_stage.group_staleness(mixed + trajectories[4:], 4) == {0: 2, 1: 0}
    assert rollout_stage.group_staleness(trajectories, 6) == {0: 2, 1: 2}
    run.tracker.close()


def test_the_async_section_round_trips_and_refuses_what_does_not_run(policy_dir, tmp_path):
    config = tiny(policy_dir, tmp_path / "run", "async.enable=true", "async.max_staleness=0")
    assert config.async_.enable and config.async_.max_staleness == 0 and config.algo.rollout_is is None
    setup(config).tracker.close()
    assert config_from_file(tmp_path / "run" / "config.yaml").async_ == config.async_
    assert "async:\n  enable: true" in (tmp_path / "run" / "config.yaml").read_text()
    # Above staleness 0 token-level TIS is the default, unless the user sets algo.rollout_is, null included.
    assert tiny(policy_dir, tmp_path / "x", "async.enable=true").algo.rollout_is == "token"
    assert tiny(policy_dir, tmp_path / "x", "async.enable=true", "algo.rollout_is=null").algo.rollout_is is None
    assert tiny(policy_dir, tmp_path / "x", "async.enable=true", "algo.rollout_is=sequence").algo.rollout_is == \
        "sequence"
    with pytest.raises(ConfigError, match=r"async.rollout_ranks=\[1\] needs async.max_staleness > 0"):
        tiny(policy_dir, tmp_path / "x", "async.enable=true", "async.max_staleness=0", "async.rollout_ranks=[1]")
    with pytest.raises(ConfigError, match=r"async.rollout_ranks=\[1, 1\]: give distinct global ranks"):
        tiny(policy_dir, tmp_path / "x", "async.enable=true", "async.rollout_ranks=[1,1]")
    with pytest.raises(ConfigError, match=r"async.rollout_ranks=\[1\] names ranks of a torchrun or accelerate world"):
        trainer.train(tiny(policy_dir, tmp_path / "x", "async.enable=true", "async.rollout_ranks=[1]"))
    with pytest.raises(ConfigError, match="rollout.backend=vllm does not work with async.max_staleness=1"):
        tiny(policy_dir, tmp_path / "x", "async.enable=true", "rollout.backend=vllm")
    with pytest.raises(ConfigError, match="async.oversample=2.0 needs one environment and filter.level=prompt"):
        tiny(policy_dir, tmp_path / "x", "async.enable=true", "async.oversample=2", "filter.level=anchor",
             "algo.name=gigpo")
    fsdp_on_rank_0 = tiny(policy_dir, tmp_path / "x", "async.enable=true", "async.rollout_ranks=[0]", "model.fsdp=true")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("WORLD_SIZE", "3")
        with pytest.raises(ConfigError, match=r"async.rollout_ranks=\[0\] with model.fsdp=true: rank 0 must train"):
            launched_roles(fsdp_on_rank_0)
    with pytest.raises(ConfigError, match="async.max_staleness=-1 is not allowed"):
        tiny(policy_dir, tmp_path / "x", "async.max_staleness=-1")
    with pytest.raises(ConfigError, match="unknown config key 'async.enabel'.*async.enable"):
        tiny(policy_dir, tmp_path / "x", "async.enabel=true")


def test_staleness_one_trains_on_groups_from_a_rollout_worker(policy_dir, tmp_path, worker_exit_codes):
    """A real worker process plays the groups; step 1's are the synchronous run's (same seeds and weights),
    later ones are one update old, the importance weights correct them, every MI check is also split by
    staleness, and the worker exits on its own (code 0) when the trainer says stop."""
    every_group = ("filter.strategy=none",)  # the random policy's groups all have zero variance
    trainer.train(tiny(policy_dir, tmp_path / "sync", *every_group, "trainer.total_steps=1"))
    trainer.train(tiny(policy_dir, tmp_path / "async", *every_group, "trainer.total_steps=4",
                       "async.enable=true", "async.max_staleness=1", "collapse.compute_freq=1"))
    sync, records = read_metrics(tmp_path / "sync"), read_metrics(tmp_path / "async")
    assert [r["step"] for r in records] == [0, 1, 2, 3, 4]
    trained = records[1:]
    rollout = [k for k in sync[1] if k.startswith("rollout/")]
    assert rollout and {k: trained[0][k] for k in rollout} == {k: sync[1][k] for k in rollout}
    assert all(r["async/staleness_max"] <= 1 for r in trained) and trained[0]["async/staleness_max"] == 0
    assert sum(r["async/staleness_frac_1"] for r in trained) > 0  # the worker ran ahead of the updates
    for r in trained:
        assert r["async/staleness_frac_0"] + r["async/staleness_frac_1"] == 1.0
        assert r["async/candidate_groups"] == 2 and r["filter/kept_groups"] == 2
        assert r["async/kept_groups_per_s"] == r["async/groups_per_s"] > 0
        assert 0 < r["rollout_corr/is_weight_mean"] and r["rollout_corr/is_weight_max"] <= 2.0
    stale = [r for r in trained if r["async/staleness_frac_1"] == 1]
    assert all(r["rollout_corr/is_weight_max"] != 1.0 for r in stale)  # weights of a policy that moved
    split = re.compile(r"async/staleness_(\d+)/collapse_(\w+)/.+")
    checked = [r for r in trained if r["collapse_first_turn/num_pairs"] > 0]  # the random policy rarely thinks
    assert checked[0] is trained[0]  # step 1 (staleness 0): the synchronous run's batch, with one pair
    for r in checked:  # every group is kept (strategy=none), so the check's staleness is the trained one
        found = {int(m.group(1)) for m in map(split.fullmatch, r) if m}
        assert found == {k for k in (0, 1) if r[f"async/staleness_frac_{k}"] > 0}
        for scheme in ("first_turn", "trajectory"):
            if r[f"collapse_{scheme}/num_pairs"] == 0:  # a scheme that scored nothing is not split
                continue
            by_lag = [r[f"async/staleness_{k}/collapse_{scheme}/num_pairs"] for k in found]
            assert sum(by_lag) == r[f"collapse_{scheme}/num_pairs"]
            assert r[f"async/staleness_{max(found)}/collapse_{scheme}/cond_entropy"] > 0
    assert "| `async/staleness_K/collapse_<scheme>/<metric>` |" in METRICS_DOC.read_text()
    assert config_from_file(tmp_path / "async" / "config.yaml").algo.rollout_is == "token"
    assert worker_exit_codes == [0] and not multiprocessing.active_children()


def test_local_workers_share_the_step_between_them(policy_dir, tmp_path, worker_exit_codes):
    """async.local_workers=2: two worker processes play a step's groups data-parallel, so step 1's are the
    synchronous run's; later ones are at most one update old, and both workers exit on their own."""
    overrides = ("filter.strategy=none", "trainer.eval_every=0")
    trainer.train(tiny(policy_dir, tmp_path / "sync", *overrides, "trainer.total_steps=1"))
    trainer.train(tiny(policy_dir, tmp_path / "async", *overrides, "async.enable=true", "async.local_workers=2"))
    sync, records = read_metrics(tmp_path / "sync"), read_metrics(tmp_path / "async")
    assert [r["step"] for r in records] == [1, 2, 3]
    rollout = [k for k in sync[0] if k.startswith("rollout/")]
    assert rollout and {k: records[0][k] for k in rollout} == {k: sync[0][k] for k in rollout}
    assert records[0]["async/staleness_max"] == 0 and all(r["async/staleness_max"] <= 1 for r in records)
    assert all(r["async/candidate_groups"] == 2 and r["train/grad_norm"] > 0 for r in records)
    assert worker_exit_codes == [0, 0] and not multiprocessing.active_children()
    with pytest.raises(ConfigError, match="the 2 candidate groups a step plays .* do not split over the 3 "
                                          "async.local_workers"):
        trainer.train(tiny(policy_dir, tmp_path / "x", "async.enable=true", "async.local_workers=3"))
    with pytest.raises(ConfigError, match="async.local_workers=0 is not allowed"):
        tiny(policy_dir, tmp_path / "x", "async.enable=true", "async.local_workers=0")
    with pytest.raises(ConfigError, match=r"async.local_workers=2 is for a run without a launcher"):
        tiny(policy_dir, tmp_path / "x", "async.enable=true", "async.local_workers=2", "async.rollout_ranks=[1]")


def test_the_worker_samples_with_the_weights_it_was_sent(policy_dir, tmp_path):
    """Groups of version 1 were sampled by exactly the weights pushed as version 1: their behaviour log-probs
    are the pushed policy's, teacher-forced, and not the initial policy's."""
    run = setup(tiny(policy_dir, tmp_path / "run", "async.enable=true", "async.max_staleness=1"))
    initial = [p.detach().clone() for p in trainable(run.policy)]
    with rollout_worker(run):
        run.rollouts.take(1)
        with torch.no_grad():
            for p in trainable(run.policy):
                p.add_(0.5 * torch.randn_like(p))
        run.rollouts.push(1)
        step3, _ = run.rollouts.take(3)  # needs version >= 1, and only version 1 exists
    assert {t.policy_version for t in step3} == {1}
    batch = build_batch(step3, run.tokenizer.pad_token_id)
    valid = batch.mask.bool()

    def logprobs() -> torch.Tensor:
        with torch.no_grad():
            return forward.in_micro_batches(lambda mb: forward.logprobs(run.policy, mb), batch, 2)

    assert (logprobs() - batch.rollout_logp)[valid].abs().max() < 1e-4
    with torch.no_grad():
        for p, before in zip(trainable(run.policy), initial):
            p.copy_(before)
    assert (logprobs() - batch.rollout_logp)[valid].abs().max() > 1e-2
    assert not multiprocessing.active_children()
    run.tracker.close()


def test_partial_rollouts_take_new_weights_between_turns(policy_dir, tmp_path):
    """New weights arriving before turn 1 (`newest_weights`, as a worker with async.partial_rollouts calls it):
    turn 0 records version 0 and was sampled by the old weights, later turns version 1 and exactly the new
    ones (none of the old weights' cached keys/values reused), and the episode counts as version 0."""
    run = setup(load_config("frozenlake", [
        f"model.path={policy_dir}", "model.device=cpu", f"trainer.run_dir={tmp_path}", "rollout.num_groups=2",
        "rollout.group_size=2", "rollout.max_turns=3", "rollout.max_tokens_per_turn=8", "logging.progress=false",
        "logging.tensorboard=false",
    ]))
    params = trainable(run.policy)
    weights = {0: [p.detach().clone() for p in params], 1: [p.detach() + 0.5 * torch.randn_like(p) for p in params]}

    def load(version: int) -> None:
        with torch.no_grad():
            for p, w in zip(params, weights[version]):
                p.copy_(w)

    calls = []

    def newest_weights() -> int:
        calls.append(min(len(calls), 1))
        load(calls[-1])
        return calls[-1]

    trajectories, metrics = rollout_stage.rollout_phase(run, 1, newest_weights=newest_weights)
    assert calls == [0, 1, 1] and metrics["rollout/turns_mean"] == 3  # the random policy plays every turn
    for t in trajectories:
        assert [turn.policy_version for turn in t.turns] == [0, 1, 1] and t.policy_version == 0
    for version in (0, 1):
        load(version)
        for t in trajectories:
            for turn in t.turns:
                ids = torch.tensor([turn.prompt_ids + turn.response_ids])
                with torch.no_grad():
                    logits = run.policy(input_ids=ids).logits[:, len(turn.prompt_ids) - 1: -1]
                forced = token_logprobs(logits, ids[:, len(turn.prompt_ids):])[0]
                gap = (forced - torch.tensor(turn.logprobs)).abs().max()
                assert (gap < 1e-4) == (turn.policy_version == version), (version, turn.policy_version, gap)
    assert rollout_stage.staleness_metrics(trajectories, 3)["async/mixed_version_frac"] == 1.0
    run.tracker.close()


def test_a_worker_with_partial_rollouts_stamps_every_turn(policy_dir, tmp_path):
    """async.partial_rollouts=true through a real worker: version 1 is pushed while it plays step 2 from
    version 0, so step 2's turns are of version 0 then, once it has arrived, 1 (when it arrives is up to
    the worker's timing); an episode counts as its first turn's version, and step 3's start from 1."""
    run = setup(load_config("frozenlake", [
        f"model.path={policy_dir}", "model.device=cpu", f"trainer.run_dir={tmp_path}", "rollout.num_groups=2",
        "rollout.group_size=2", "rollout.max_turns=4", "rollout.max_tokens_per_turn=8", "logging.progress=false",
        "logging.tensorboard=false", "async.enable=true", "async.partial_rollouts=true",
    ]))
    with rollout_worker(run):
        step1, _ = run.rollouts.take(1)
        run.rollouts.push(1)
        steps = [step1, run.rollouts.take(2)[0], run.rollouts.take(3)[0]]
    for step, trajectories in enumerate(steps, start=1):
        for t in trajectories:
            versions = [turn.policy_version for turn in t.turns]
            assert versions == sorted(versions) and set(versions) <= {0, 1} and t.policy_version == versions[0]
    assert {t.policy_version for t in steps[0]} == {0} and {t.policy_version for t in steps[2]} == {1}
    assert not multiprocessing.active_children()
    run.tracker.close()
    with pytest.raises(ConfigError, match="async.partial_rollouts=true needs async.max_staleness > 0"):
        tiny(policy_dir, tmp_path / "x", "async.enable=true", "async.max_staleness=0", "async.partial_rollouts=true")


def test_oversampled_candidates_are_admitted_by_the_filter(small_bandit_policy, tmp_path):
    """async.oversample=2: the filter ranks 2P candidate groups and keeps at most P, the best by reward
    variance; zero-variance groups never reach the update."""
    config = tiny(small_bandit_policy, tmp_path / "run", "async.enable=true", "async.max_staleness=0",
                  "async.oversample=2", "rollout.num_groups=3", "filter.include_zero=false",
                  "filter.strategy=top_p", "filter.value=1.0", "rollout.temperature=1.5",
                  "rollout.max_tokens_per_turn=64")
    run = setup(config)
    seen_kept = 0
    for step in (1, 2, 3):
        trajectories, _ = rollout_stage.rollout_phase(run, step, trainer.candidates(config))
        assert len(trajectories) == 6 * 4
        kept, metrics = filter_stage.filter_phase(run, trajectories)
        rewards = np.array([t.episode_return for t in trajectories]).reshape(6, 4)
        variance = group_scores(rewards, "reward_variance")
        groups = sorted({t.group_id for t in kept})
        nonzero = [g for g in range(6) if rewards[g].std() > 1e-10]
        best = sorted(sorted(nonzero, key=lambda g: (-variance[g], g))[:3])
        assert groups == best and metrics["filter/kept_groups"] == len(best) <= 3
        seen_kept = max(seen_kept, len(nonzero))
    assert seen_kept > 3  # some step had more useful candidates than it could keep
    run.tracker.close()


@pytest.mark.slow
@pytest.mark.parametrize("fsdp", [False, True])
def test_ranks_take_roles_under_torchrun(policy_dir, tmp_path, fsdp: bool):
    """torchrun with 4 processes and async.rollout_ranks=[1, 3]: ranks 0 and 2 train data-parallel (or with
    their training state sharded over the two), 1 and 3 generate data-parallel. Step 1's groups are the
    1-process synchronous run's (same seeds, weights of version 0), later ones are at most one update old,
    and every process exits on its own."""
    overrides = ("filter.strategy=none", "trainer.eval_every=0", f"model.fsdp={str(fsdp).lower()}")
    trainer.train(tiny(policy_dir, tmp_path / "sync", *overrides[:2], "trainer.total_steps=1"))
    run_dir = tmp_path / "roles"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=4", "-m", "ragen2",
               "train", "bandit", f"model.path={policy_dir}", "model.device=cpu", f"trainer.run_dir={run_dir}",
               "rollout.num_groups=2", "rollout.group_size=4", "rollout.max_tokens_per_turn=8",
               "trainer.total_steps=4", "algo.mini_batch_size=4", "algo.micro_batch_size=2", "optim.lr=1e-3",
               "filter.include_zero=true", "logging.progress=false", "logging.tensorboard=false", *overrides,
               "async.enable=true", "async.max_staleness=1", "async.rollout_ranks=[1,3]"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    records, sync = read_metrics(run_dir), read_metrics(tmp_path / "sync")
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    rollout = [k for k in sync[0] if k.startswith("rollout/")]
    assert rollout and {k: records[0][k] for k in rollout} == {k: sync[0][k] for k in rollout}
    assert records[0]["async/staleness_max"] == 0 and all(r["async/staleness_max"] <= 1 for r in records)
    assert sum(r["async/staleness_frac_1"] for r in records) > 0
    assert all(r["train/grad_norm"] > 0 and r["async/candidate_groups"] == 2 for r in records)
    assert latest_step(run_dir) == 4


def _worker_of_this_process(rank: int) -> multiprocessing.Process | None:
    return next((p for p in multiprocessing.active_children() if p.name == f"ragen2-rollout-worker-{rank}"), None)


@pytest.mark.parametrize("workers", [1, 2])
def test_a_killed_worker_stops_the_run_with_a_clear_message(policy_dir, tmp_path, workers: int):
    """The only worker, or one of two that is not the one sending the groups."""
    run_dir = tmp_path / "run"
    killed_at: list[float] = []

    def kill_the_worker_after_step_1() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            worker = _worker_of_this_process(rank=workers)
            if worker is not None and max(_logged_steps(run_dir), default=0) >= 1:
                os.kill(worker.pid, signal.SIGKILL)
                killed_at.append(time.monotonic())
                return
            time.sleep(0.02)

    threading.Thread(target=kill_the_worker_after_step_1, daemon=True).start()
    with pytest.raises(RolloutWorkerError, match=r"rollout worker \(pid \d+\) exited with code -9 .* --resume"):
        trainer.train(tiny(policy_dir, run_dir, "filter.strategy=none", "trainer.total_steps=200",
                           "trainer.eval_every=0", "async.enable=true", "async.max_staleness=1",
                           f"async.local_workers={workers}"))
    assert killed_at and time.monotonic() - killed_at[0] < 30
    assert 1 <= max(_logged_steps(run_dir)) < 200 and not multiprocessing.active_children()


def _logged_steps(run_dir: Path) -> list[int]:
    try:
        return [r["step"] for r in read_metrics(run_dir)]
    except (FileNotFoundError, ValueError):
        return []


@pytest.mark.slow
def test_resume_after_the_trainer_is_killed(policy_dir, tmp_path):
    """kill -9 of the trainer: its worker exits on its own, and --resume finishes the run from the last
    checkpoint (the groups in flight are lost and played again)."""
    import psutil

    run_dir = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-m", "ragen2", "train", "bandit", f"model.path={policy_dir}", "model.device=cpu",
               f"trainer.run_dir={run_dir}", "rollout.num_groups=2", "rollout.group_size=4",
               "rollout.max_tokens_per_turn=8", "trainer.total_steps=6", "trainer.save_every=2",
               "trainer.eval_every=0", "algo.mini_batch_size=4", "algo.micro_batch_size=2", "filter.strategy=none",
               "filter.include_zero=true", "logging.tensorboard=false", "async.enable=true", "async.max_staleness=1"]
    proc = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while (latest_step(run_dir) or 0) < 2 or max(_logged_steps(run_dir), default=0) <= 2:
        assert proc.poll() is None, proc.stderr.read()
        assert time.monotonic() < deadline, "timed out waiting for the training subprocess"
        time.sleep(0.02)
    workers = psutil.Process(proc.pid).children()
    assert len(workers) >= 1
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    _, alive = psutil.wait_procs(workers, timeout=30)
    assert not alive, "the rollout worker outlived its trainer"
    checkpoint = latest_step(run_dir)
    resumed = subprocess.run([sys.executable, "-m", "ragen2", "train", "--resume", str(run_dir)], cwd=REPO, env=env,
                             capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert [r["step"] for r in read_metrics(run_dir)] == [1, 2, 3, 4, 5, 6]
    assert 2 <= checkpoint < 6 and latest_step(run_dir) == 6
    assert all(r["async/staleness_max"] <= 1 for r in read_metrics(run_dir) if r["step"] > 0)
