"""`ragen2 diagnose` on verl rollout dumps (`trainer.rollout_data_dir`), written here as verl 0.9's
trainers write them; verl itself is not needed to read them."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from ragen2.cli import main
from ragen2.collapse.rollout_files import read_rollouts

# Two prompts, decoded as verl decodes them (skip_special_tokens=True: no chat-template tokens).
PROMPTS = ["user\nRoom 1: player at (row 1, col 2).\nassistant\n", "user\nRoom 2: box at (row 3, col 1).\nassistant\n"]


def write_verl_dump(path: Path, rows: list[dict], step: int, extra: dict[str, list] | None = None) -> Path:
    """What verl's `_write_generations` writes: one JSON object per sample, `input`, `output`, `gts`,
    `score` and `step`, then the extra per-sample columns (the current trainer adds `uid`)."""
    n = len(rows)
    base = {"input": [r["input"] for r in rows], "output": [r["output"] for r in rows], "gts": [None] * n,
            "score": [r["score"] for r in rows], "step": [step] * n}
    base |= {k: v for k, v in (extra or {}).items() if len(v) == n}

    def default(obj):  # verl's json_encode_default: numpy scalars and arrays
        if isinstance(obj, np.integer):
            return int(obj)
        if isinstance(obj, np.floating):
            return float(obj)
        return obj.tolist()

    with open(path, "w") as f:
        for i in range(n):
            f.write(json.dumps({k: v[i] for k, v in base.items()}, ensure_ascii=False, default=default) + "\n")
    return path


def v1_dump(path: Path) -> Path:
    """The current trainer's dump, sorted by trajectory key `{uid}_{session}_{output}`. Session 1 of
    the first prompt ran two outputs (a multi-trajectory agent loop)."""
    keys = ["a1f0-9_0_0", "a1f0-9_1_0", "a1f0-9_1_1", "b7c2-4_0_0", "b7c2-4_1_0"]
    prompt_of = {"a1f0-9": PROMPTS[0], "b7c2-4": PROMPTS[1]}
    rows = [{"input": prompt_of[k.split("_")[0]], "score": np.float32(i % 2),
             "output": f"<think>Step {i}: I push the box right.</think><answer>Right</answer>"}
            for i, k in enumerate(keys)]
    return write_verl_dump(path, rows, step=7, extra={"uid": keys})


def test_current_trainer_dump_groups_by_uid(tmp_path):
    rollouts = read_rollouts(v1_dump(tmp_path / "7.jsonl"))

    assert rollouts.format == "verl" and not rollouts.skipped
    groups = [(r.group, r.episode, r.turn) for r in rollouts.records]
    assert groups == [("a1f0-9", "a1f0-9_0", 0), ("a1f0-9", "a1f0-9_1", 0), ("a1f0-9", "a1f0-9_1", 1),
                      ("b7c2-4", "b7c2-4_0", 0), ("b7c2-4", "b7c2-4_1", 0)]
    first = rollouts.records[0]
    assert first.prompt == PROMPTS[0] and first.prefix == "<think>"
    assert first.reasoning == "Step 0: I push the box right." and first.reward == 0.0
    assert rollouts.records[1].reward == 1.0


def test_older_trainer_dump_groups_by_input(tmp_path):
    rows = [{"input": PROMPTS[i % 2], "output": f"{i} apples.</think>Two.", "score": 1.0} for i in range(4)]
    path = write_verl_dump(tmp_path / "3.jsonl", rows, step=3, extra={"request_id": ["r"] * 4})
    lines = path.read_text().splitlines()
    lines.insert(2, json.dumps({"input": PROMPTS[0], "score": 0.0}))  # a row without output: skipped, said why
    path.write_text("\n".join(lines) + "\n")

    rollouts = read_rollouts(path)

    assert rollouts.format == "verl"
    assert rollouts.skipped == [(3, "a verl rollout row needs 'input' and 'output'")]
    assert [r.group for r in rollouts.records] == [0, 1, 0, 1]  # identical inputs, numbered by appearance
    assert [r.reasoning for r in rollouts.records] == ["0 apples.", "1 apples.", "2 apples.", "3 apples."]
    assert rollouts.records[0].prefix == ""  # the template opened <think>: the input already ends where it starts


def test_format_verl_is_explicit_too(tmp_path):
    assert read_rollouts(v1_dump(tmp_path / "7.jsonl"), format="verl").format == "verl"


def test_diagnose_reads_a_verl_dump(tmp_path, save_random_policy, one_thread):
    save_random_policy(tmp_path / "model")
    out = tmp_path / "diag"

    assert main(["diagnose", str(v1_dump(tmp_path / "7.jsonl")), "--model", str(tmp_path / "model"),
                 "--out", str(out), "--device", "cpu"]) == 0

    report = json.loads((out / "diagnose.json").read_text())
    assert report["format"] == "verl" and report["records"] == 5
    # first_turn: the first output of each of the 4 sessions, against the 2 prompts
    assert report["metrics"]["num_pairs"] == 4 and report["metrics"]["num_inputs"] == 2
    assert sorted(report["pair_lines"]) == [1, 2, 4, 5] and report["input_groups"] == ["a1f0-9", "b7c2-4"]
    assert report["metrics"]["chance_level"] == pytest.approx(0.5)
