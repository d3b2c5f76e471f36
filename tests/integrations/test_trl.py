"""ragen2.integrations.trl: the filter and diagnostics inside a real TRL GRPOTrainer run (tiny local model, CPU)."""

import hashlib
import json
import os
import re
import runpy
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

pytest.importorskip("trl", reason="needs the trl extra: pip install 'ragen2[trl]'")
datasets = pytest.importorskip("datasets")

from trl import GRPOTrainer  # noqa: E402

from ragen2.agent.types import Trajectory  # noqa: E402
from ragen2.collapse.offline import diagnose_cli  # noqa: E402
from ragen2.collapse.rollout_files import read_rollouts, split_completion  # noqa: E402
from ragen2.config import RolloutConfig, load_config  # noqa: E402
from ragen2.errors import ConfigError  # noqa: E402
from ragen2.filtering import FilterRule, select_groups  # noqa: E402
from ragen2.integrations.trl import (  # noqa: E402
    EnvRollout,
    Ragen2GRPOConfig,
    Ragen2GRPOTrainer,
    check_trl_version,
    group_rewards,
    loss_factor,
    process_keep_mask,
    select_reward_variance_groups,
)
from ragen2.rl.filter_stage import filter_phase  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
P, G = 4, 4  # prompts x generations per step
PROMPTS = [f"Prompt {c}: pull an arm.<think>" for c in "ABCD"]
os.environ["TRL_EXPERIMENTAL_SILENCE"] = "1"


def hashed_reward(prompts: list[str], completions: list[str], **_) -> list[float]:
    """A is constant (zero variance: always dropped); B spreads its rewards over [0, 3], C and D over [0, 1]."""
    out = []
    for prompt, completion in zip(prompts, completions):
        u = int(hashlib.md5(completion.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
        out.append(1.0 if "Prompt A" in prompt else 3 * u if "Prompt B" in prompt else u)
    return out


class Recording(Ragen2GRPOTrainer):
    """Keeps what each generation batch hands to the loss, and the gathered rewards it was selected on."""

    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        self.batches.append({"output": {k: v.clone() if torch.is_tensor(v) else v for k, v in output.items()},
                             "rewards_per_func": self._rewards_per_func.clone(), "selection": self.last_selection})
        return output


def grpo_config(out: Path, **overrides) -> Ragen2GRPOConfig:
    settings = dict(
        output_dir=str(out), use_cpu=True, bf16=False, seed=0, max_steps=2, learning_rate=1e-3,
        num_generations=G, per_device_train_batch_size=P * G // 2, gradient_accumulation_steps=2,
        max_completion_length=8, loss_type="grpo", beta=0.0, report_to="none", save_strategy="no",
        logging_steps=1, log_completions=True, num_completions_to_print=0, disable_tqdm=True,
        gradient_checkpointing=False, shuffle_dataset=False,
        reward_variance_filtering="top_p", reward_variance_top_p=0.9, collapse_diagnostics=True,
        collapse_compute_freq=1,
    )
    return Ragen2GRPOConfig(**(settings | overrides))


@pytest.fixture(scope="module")
def trl_run(tmp_path_factory, save_random_policy):
    """Two TRL steps of 4 prompts x 4 completions with the filter (top_p 0.9) and the diagnostics on."""
    torch.set_num_threads(1)
    tmp = tmp_path_factory.mktemp("trl")
    model, tokenizer = save_random_policy(tmp / "policy")
    trainer = Recording(model=model, reward_funcs=[hashed_reward], args=grpo_config(tmp / "out"),
                        train_dataset=datasets.Dataset.from_dict({"prompt": PROMPTS * 2}), processing_class=tokenizer)
    trainer.batches = []
    trainer.train()
    return SimpleNamespace(trainer=trainer, dir=tmp, model_dir=tmp / "policy")


# ----------------------------------------------------------------------------- a real training run


def test_exactly_the_selected_groups_keep_advantages_and_loss_mask(trl_run):
    assert len(trl_run.trainer.batches) == 2  # one generation batch per optimizer step
    for batch in trl_run.trainer.batches:
        rewards = batch["rewards_per_func"].numpy()[:, 0].reshape(P, G)  # one reward function, weight 1
        expected = select_groups(rewards, FilterRule("top_p", 0.9, include_zero=False))
        np.testing.assert_array_equal(batch["selection"].kept_groups, expected)
        assert 0 not in expected and expected.size > 0  # A has zero variance: always dropped
        kept_rows = np.repeat(np.isin(np.arange(P), expected), G)  # [16], one process holds the whole batch
        out = batch["output"]
        advantages = out["advantages"].numpy()
        loss_mask = (out["completion_mask"] * out["tool_mask"]).numpy()
        assert (advantages[kept_rows] != 0).all() and (advantages[~kept_rows] == 0).all()
        assert (loss_mask[kept_rows].sum(1) > 0).all() and (loss_mask[~kept_rows] == 0).all()
        assert out["completion_mask"].sum(1).min() > 0  # attention over dropped rows is left as it was
        assert int(out["num_items_in_batch"]) == loss_mask.sum()  # dapo's denominator counts kept tokens only
        factor = out["reward_variance_loss_factor"].numpy()
        np.testing.assert_allclose(factor, P / len(expected))  # grpo averages over all rows: total / kept


def test_same_selection_as_ragen2_trainer(trl_run):
    """ragen2's own filter phase, fed the same returns, keeps the same groups."""
    for batch in trl_run.trainer.batches:
        rewards = batch["rewards_per_func"].numpy()[:, 0].reshape(P, G)
        config = load_config(None, [f"rollout.num_groups={P}", f"rollout.group_size={G}", "filter.strategy=top_p",
                                    "filter.value=0.9", "filter.include_zero=false"])
        trajectories = [Trajectory("bandit", seed=g, group_id=g, samples=[([1], [1])], episode_return=float(r))
                        for g in range(P) for r in rewards[g]]
        kept, _ = filter_phase(SimpleNamespace(config=config), trajectories)
        assert sorted({t.group_id for t in kept}) == batch["selection"].kept_groups.tolist()


def test_masked_loss_equals_loss_on_kept_rows_only(trl_run):
    """Masking plus the loss factor gives the gradient of training on the kept groups alone."""
    trainer = trl_run.trainer
    out, selection = trainer.batches[-1]["output"], trainer.batches[-1]["selection"]
    keep = torch.as_tensor(selection.keep)
    model = trainer.model
    model.train()

    def grad(loss_fn, inputs) -> torch.Tensor:
        model.zero_grad()
        loss_fn(model, inputs).backward()
        return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])

    kept_only = {k: v[keep] if torch.is_tensor(v) and v.ndim else v for k, v in out.items()
                 if k != "reward_variance_loss_factor"}
    kept_only["num_items_in_batch"] = kept_only["completion_mask"].sum()
    for loss_type, factor in (("grpo", P / selection.kept_groups.size), ("dapo", 1.0)):
        trainer.loss_type = loss_type
        assert loss_factor(loss_type, selection.kept_groups.size, P, "none") == pytest.approx(factor)
        masked = grad(trainer._compute_loss, {**out, "reward_variance_loss_factor": torch.full((P * G,), factor)})
        reference = grad(lambda m, x: GRPOTrainer._compute_loss(trainer, m, x), kept_only)
        assert reference.abs().max() > 1e-6
        torch.testing.assert_close(masked, reference, rtol=1e-4, atol=1e-7)
    trainer.loss_type = "grpo"
    unscaled = {k: v for k, v in out.items() if k != "reward_variance_loss_factor"}
    kept_fraction = selection.kept_groups.size / P
    torch.testing.assert_close(grad(trainer._compute_loss, unscaled), kept_fraction * grad(
        lambda m, x: GRPOTrainer._compute_loss(trainer, m, x), kept_only), rtol=1e-4, atol=1e-7)


def test_metrics_and_completion_logs(trl_run):
    steps = [r for r in trl_run.trainer.state.log_history if "reward" in r]
    assert len(steps) == 2
    for record, batch in zip(steps, trl_run.trainer.batches):
        assert record["reward_variance/kept_groups"] == len(batch["selection"].kept_groups)
        assert record["reward_variance/frac_zero_variance"] >= 0.25  # A, at least
        assert 0.0 <= record["collapse/retrieval_acc"] <= 1.0
        assert record["collapse/chance_level"] == pytest.approx(1 / record["collapse/num_distinct_inputs"])
        assert record["collapse/num_pairs"] == P * G and np.isfinite(record["collapse/mi_zscore_ema"])
    import pyarrow.parquet

    table = pyarrow.parquet.read_table(trl_run.dir / "out/completions/completions_00002.parquet").to_pydict()
    kept = np.repeat(np.isin(np.arange(P), trl_run.trainer.batches[-1]["selection"].kept_groups), G)
    assert table["reward_variance_kept"] == kept.tolist()
    advantages = np.array(table["advantage"])
    assert (advantages[~kept] == 0).all() and (advantages[kept] != 0).all()


def test_every_logged_key_is_documented(trl_run):
    """Each reward_variance/ and collapse/ key of the run has a row in docs/integrations.md."""
    documented = set(re.findall(r"^\| `([^`]+)` \|", (ROOT / "docs/integrations.md").read_text(), flags=re.MULTILINE))
    emitted = {key for record in trl_run.trainer.state.log_history for key in record
               if key.startswith(("reward_variance/", "collapse/"))}
    assert {"reward_variance/kept_groups", "collapse/mi_zscore_ema"} <= emitted
    assert emitted - documented == set()


def test_ragen2_diagnose_reads_the_completion_log(trl_run, tmp_path):
    """`ragen2 diagnose` on what this run logged: a metrics table, a heatmap, and the numbers logged online.

    Step 1's batch was sampled, and scored online, by the initial weights: the ones saved in model_dir.
    """
    path = trl_run.dir / "out/completions/completions_00001.parquet"
    rollouts = read_rollouts(path)
    assert rollouts.format == "trl" and len(rollouts.records) == P * G
    assert len({r.group for r in rollouts.records}) == P  # group = identical prompt
    result = diagnose_cli(str(path), str(trl_run.model_dir), out=tmp_path / "diag", device="cpu")
    assert "Retrieval-Acc" in result["table"] and "MI-ZScore" in result["table"]
    assert result["heatmap_path"].stat().st_size > 1000
    online = trl_run.trainer.state.log_history[0]
    for key in ("retrieval_acc", "recall@2", "mi_est", "mi_seq_est", "mi_zscore", "cond_entropy", "num_pairs",
                "num_inputs", "valid_thinking_rate"):
        assert online[f"collapse/{key}"] == pytest.approx(result["metrics"][key], rel=1e-6, abs=1e-9), key


# ----------------------------------------------------------------------------- several processes (pure functions)


@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 6, 12])
def test_each_process_slices_the_global_selection(world_size):
    """Groups of 4 rows straddle processes (e.g. 3 processes x 8 rows); every rank agrees on every group."""
    rng = np.random.default_rng(world_size)
    num_groups, num_gen = 6, 4
    rewards = rng.integers(0, 3, size=(num_groups, num_gen)).astype(float)
    rewards[2] = 1.0  # a zero-variance group, never kept
    kept = select_reward_variance_groups(rewards, "top_p", 0.9)
    np.testing.assert_array_equal(kept, select_groups(rewards, FilterRule("top_p", 0.9, include_zero=False)))
    num_local = num_groups * num_gen // world_size
    masks = [process_keep_mask(kept, num_groups, num_gen, rank, num_local) for rank in range(world_size)]
    rows = np.concatenate(masks)
    np.testing.assert_array_equal(rows, np.isin(np.arange(num_groups * num_gen) // num_gen, kept))
    assert not rows[2 * num_gen : 3 * num_gen].any()
    with pytest.raises(ValueError, match="past the"):
        process_keep_mask(kept, num_groups, num_gen, world_size, num_local)


def test_top_k_keeps_a_count_and_matches_ragen2_top_k_fraction():
    rewards = np.array([[0, 1, 0, 1], [0, 0, 0, 0], [0, 2, 0, 2], [0, 0, 0, 1], [1, 1, 1, 1.0]])
    assert select_reward_variance_groups(rewards, "top_k", top_k=2).tolist() == [0, 2]
    assert select_reward_variance_groups(rewards, "top_k", top_k=10).tolist() == [0, 2, 3]  # all 3 candidates
    # ragen2's top_k with value 2/5 of the 5 groups is the same choice
    np.testing.assert_array_equal(select_reward_variance_groups(rewards, "top_k", top_k=2),
                                  select_groups(rewards, FilterRule("top_k", 2 / 5, include_zero=False)))
    assert select_reward_variance_groups(rewards, "top_k", top_k=4, include_zero=True).tolist() == [0, 1, 2, 3]
    assert select_reward_variance_groups(np.ones((3, 4)), "top_k", top_k=2).size == 0


def test_group_rewards_weights_and_unscored_completions():
    per_func = np.array([[1.0, 0.0], [0.0, np.nan], [np.nan, np.nan], [2.0, 1.0],
                         [np.nan, np.nan], [np.nan, np.nan], [np.nan, np.nan], [np.nan, np.nan]])
    rewards = group_rewards(per_func, np.array([1.0, 2.0]), num_generations=4)
    np.testing.assert_allclose(rewards, [[1.0, 0.0, 5 / 3, 4.0], [0.0, 0.0, 0.0, 0.0]])


def test_loss_factor_per_loss_type():
    assert loss_factor("grpo", 2, 8, "none") == 4.0  # mean over rows counts the masked ones
    assert loss_factor("dr_grpo", 2, 8, "linear") == 1.0  # r x total/kept
    assert loss_factor("dapo", 2, 8, "none") == 1.0  # divides by active tokens
    assert loss_factor("bnpo", 2, 8, "sqrt") == 0.5
    assert loss_factor("grpo", 0, 8, "none") == 1.0  # nothing kept: everything is masked anyway
    with pytest.raises(ConfigError, match="loss_type='ppo'"):
        loss_factor("ppo", 2, 8, "none")


# ----------------------------------------------------------------------------- configuration


@pytest.mark.parametrize("overrides, match", [
    ({"reward_variance_filtering": "top-p"}, "reward_variance_filtering='top-p'.*'top_p', 'top_k'"),
    ({"reward_variance_filtering": "top_k"}, "reward_variance_top_k"),
    ({"reward_variance_top_p": 1.5}, "reward_variance_top_p=1.5"),
    ({"reward_variance_loss_scale": "log"}, "reward_variance_loss_scale='log'.*'linear'"),
    ({"collapse_marginal": "max"}, "collapse_marginal='max'"),
    ({"collapse_compute_freq": 0}, "collapse_compute_freq=0"),
])
def test_bad_config_names_the_key_and_allowed_values(tmp_path, overrides, match):
    with pytest.raises(ConfigError, match=match):
        grpo_config(tmp_path, **overrides)


def test_trainer_rejects_plain_config_and_unsupported_trl(tmp_path):
    from trl import GRPOConfig

    with pytest.raises(ConfigError, match="Ragen2GRPOConfig"):
        plain = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False)
        Ragen2GRPOTrainer(model=None, reward_funcs=[hashed_reward], args=plain)
    with pytest.raises(ImportError, match=r"supports TRL 1\.16\.x, but TRL 1\.17\.0 is installed"):
        check_trl_version("1.17.0")
    check_trl_version("1.16.3")


# ----------------------------------------------------------------------------- environments


def test_env_rollout_returns_ragen2_episodes_as_trl_completions(tmp_path, save_random_policy, one_thread):
    model, tokenizer = save_random_policy(tmp_path / "policy")
    cfg = RolloutConfig(max_turns=2, max_tokens_per_turn=6)
    env_rollout = EnvRollout("sokoban", tokenizer, cfg)
    dataset = env_rollout.dataset([3, 4])
    assert dataset["seed"] == [3, 4]
    trainer = SimpleNamespace(args=SimpleNamespace(temperature=1.0, top_p=1.0), model=model,
                              accelerator=SimpleNamespace(unwrap_model=lambda m: m))
    prompts = [p for p in dataset["prompt"] for _ in range(2)]
    out = env_rollout(prompts, trainer)
    assert len(out["completion_ids"]) == 4 and out["logprobs"] is None
    for prompt, ids, completion, mask in zip(prompts, out["prompt_ids"], out["completion_ids"], out["env_mask"]):
        assert tokenizer.decode(ids) == prompt and prompt.endswith("<think>")
        assert len(mask) == len(completion) and mask[0] == 1
        assert completion[-1] == tokenizer.eos_token_id  # TRL does not count the episode as cut off
    assert any(0 in mask for mask in out["env_mask"])  # a second turn: the environment's tokens are masked
    with pytest.raises(ValueError, match="did not build"):
        env_rollout(["Some other prompt"], trainer)


def test_reasoning_of_a_multi_turn_completion_is_the_first_turns():
    """The prompt opened `<think>`; the later turns' `<think>` come after the first `</think>`."""
    text = "box left of target</think><answer>Left</answer><|im_end|>\n<|im_start|>user\nTurn 2<think>more</think>"
    assert split_completion(text) == ("", "box left of target", True)


@pytest.mark.slow
def test_sokoban_example_trains_one_step(tmp_path, save_random_policy, one_thread, capsys):
    save_random_policy(tmp_path / "policy")
    example = runpy.run_path(str(ROOT / "examples/trl_sokoban.py"), run_name="example")
    example["main"](["--model", str(tmp_path / "policy"), "--out", str(tmp_path / "run"), "--steps", "1",
                     "--groups", "2", "--group-size", "2", "--max-turns", "2", "--max-tokens-per-turn", "8"])
    printed = capsys.readouterr().out
    assert "step   1" in printed and "kept groups" in printed and "Retrieval-Acc" in printed
    rollouts = read_rollouts(tmp_path / "run/completions/completions_00001.parquet")
    assert len(rollouts.records) == 4 and len({r.group for r in rollouts.records}) == 2
    assert (tmp_path / "run/final/config.json").exists()
    assert "(chance 0.500)" in printed  # 2 inputs, one first prompt per group: only first responses are scored


# ----------------------------------------------------------------------------- a real two-process run


@pytest.mark.slow
def test_two_processes_select_on_gathered_rewards_and_mask_their_slice(tmp_path):
    """Two CPU processes (gloo) x 6 rows, groups of 4: group 1 straddles the ranks (about 20 s on a busy 2-core
    machine)."""
    port = _free_port()
    procs = []
    for rank in range(2):  # the variables torchrun would set, without its extra launcher process
        env = os.environ | {"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "TRL_EXPERIMENTAL_SILENCE": "1",
                            "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2",
                            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        with open(tmp_path / f"rank{rank}.log", "w") as log:
            procs.append(subprocess.Popen([sys.executable, __file__, str(tmp_path)], env=env, cwd=tmp_path,
                                          stdout=log, stderr=subprocess.STDOUT))
    deadline = time.monotonic() + 300
    try:  # a rank that fails leaves the other waiting for it: stop at the first failure
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
            if any(p.poll() not in (None, 0) for p in procs):
                break
            time.sleep(0.2)
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    for rank, proc in enumerate(procs):
        assert proc.returncode == 0, (tmp_path / f"rank{rank}.log").read_text()[-4000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    rewards = np.array(ranks[0]["rewards"])  # [3, 4], gathered over both ranks
    assert ranks[1]["rewards"] == ranks[0]["rewards"]
    expected = select_groups(rewards, FilterRule("top_p", 1.0, include_zero=False))
    assert 0 not in expected and 1 in expected  # A is constant; B, the group on both ranks, varies most
    assert all(r["kept_groups"] == expected.tolist() for r in ranks)
    keep = np.concatenate([r["keep"] for r in ranks])  # rank 0 holds rows 0-5, rank 1 rows 6-11
    np.testing.assert_array_equal(keep, np.repeat(np.isin(np.arange(3), expected), 4))
    for r in ranks:
        advantages, mask_rows = np.array(r["advantages"]), np.array(r["loss_mask_rows"])
        assert ((advantages != 0) == np.array(r["keep"])).all() and ((mask_rows > 0) == np.array(r["keep"])).all()
    assert ranks[0]["collapse"] == ranks[1]["collapse"] and ranks[0]["collapse"]["collapse/num_pairs"] == 12


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _two_process_run(out: Path) -> None:
    """One rank of the run above: 3 prompts x 4 completions, 6 rows per rank, one step."""
    from ragen2.models.tiny import build_model, build_tokenizer

    torch.set_num_threads(1)
    torch.manual_seed(0)
    tokenizer = build_tokenizer(PROMPTS * 10, vocab_size=300)
    model = build_model(tokenizer, hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=64)
    args = grpo_config(out / "trl", max_steps=1, per_device_train_batch_size=6, gradient_accumulation_steps=1,
                       log_completions=False, reward_variance_top_p=1.0)
    trainer = Recording(model=model, reward_funcs=[hashed_reward], args=args, processing_class=tokenizer,
                        train_dataset=datasets.Dataset.from_dict({"prompt": PROMPTS[:3]}))
    trainer.batches = []
    trainer.train()
    batch = trainer.batches[0]
    selection, output = batch["selection"], batch["output"]
    collapse = {k: v for r in trainer.state.log_history for k, v in r.items() if k.startswith("collapse/")}
    (out / f"rank{trainer.accelerator.process_index}.json").write_text(json.dumps({
        "rewards": selection.rewards.tolist(), "kept_groups": selection.kept_groups.tolist(),
        "keep": selection.keep.tolist(), "advantages": output["advantages"].tolist(),
        "loss_mask_rows": (output["completion_mask"] * output["tool_mask"]).sum(1).tolist(), "collapse": collapse,
    }))


if __name__ == "__main__":
    _two_process_run(Path(sys.argv[1]))
