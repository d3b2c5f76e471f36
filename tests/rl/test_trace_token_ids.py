"""The rollout records a training run writes carry every turn's token ids and sampling log-probs, and
`ragen2 diagnose` scores a run's file on those ids."""

from __future__ import annotations

import json

import numpy as np
import pytest
from transformers import AutoTokenizer

from helpers import tiny_run_config
from ragen2.collapse import score_matrix_naive
from ragen2.collapse.offline import diagnose_cli, load_scoring_model
from ragen2.collapse.rollout_files import read_rollouts
from ragen2.evaluate import tokenizer_fingerprint
from ragen2.rl import rollout_stage, trainer

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def run(small_bandit_policy, tmp_path_factory):
    """2 steps of the Bandit warm start writing train_step_1/2.jsonl and the evaluations' step_0/2.jsonl, and the
    trajectories each file was written from."""
    written = {}
    writers = {module: module.write_rollout_records for module in (rollout_stage, trainer)}

    def spy(module):
        def write(path, trajectories, tokenizer):
            written[path.name] = trajectories
            writers[module](path, trajectories, tokenizer)
        return write

    run_dir = tmp_path_factory.mktemp("run")
    with pytest.MonkeyPatch.context() as patch:
        for module in writers:
            patch.setattr(module, "write_rollout_records", spy(module))
        trainer.train(tiny_run_config(small_bandit_policy, run_dir, "rollout.max_tokens_per_turn=48",
                                      "logging.sample_every=1", "trainer.eval_every=2", "trainer.eval_episodes=2"))
    return run_dir, written


def test_every_turn_keeps_its_token_ids_and_log_probs(run, small_bandit_policy):
    run_dir, written = run
    assert sorted(written) == ["step_0.jsonl", "step_2.jsonl", "train_step_1.jsonl", "train_step_2.jsonl"]
    tokenizer = AutoTokenizer.from_pretrained(small_bandit_policy)
    for name, trajectories in written.items():
        records = [json.loads(line) for line in (run_dir / "rollouts" / name).read_text().splitlines()]
        turns = [turn for traj in trajectories for turn in traj.turns]
        assert len(records) == len(turns) > 0
        for r, turn in zip(records, turns):
            assert (r["prompt_ids"], r["response_ids"], r["reasoning_span"]) == (
                turn.prompt_ids, turn.response_ids, list(turn.reasoning_span))
            assert tokenizer.decode(r["prompt_ids"], skip_special_tokens=False) == r["prompt"]
            assert len(r["logprobs"]) == len(r["response_ids"])
            np.testing.assert_allclose(r["logprobs"], turn.logprobs, atol=5e-7)
            assert (r["role"], r["tokenizer"]) == (None, tokenizer_fingerprint(tokenizer))
            assert {"group", "reasoning", "response", "reward", "episode", "turn"} < set(r)  # text readers still work


def test_diagnose_scores_a_runs_file_on_its_token_ids(run, small_bandit_policy, tmp_path):
    run_dir, _ = run
    path = run_dir / "rollouts" / "train_step_2.jsonl"
    report = diagnose_cli(str(path), str(small_bandit_policy), out=tmp_path, scheme="pairs", device="cpu",
                          max_reasoning_tokens=0)
    records = read_rollouts(path).records
    used = [records[line - 1] for line in report["pair_lines"]]
    assert report["scored_on_token_ids"] == len(used) > 1 and report["notes"] == []
    assert "records used on their recorded token ids" in report["table"]
    model, _ = load_scoring_model(str(small_bandit_policy), "cpu")
    expected = score_matrix_naive(model, None, [r.tokens.prompt_ids for r in used],
                                  [r.tokens.reasoning_ids for r in used])
    np.testing.assert_allclose(report["logp"], expected, atol=1e-3)
