"""`ragen2 diagnose` in a subprocess: a rollout file with a bad line, a tiny saved model, the JSON and PNG."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import ragen2
from ragen2.cli import main

REPO = Path(ragen2.__file__).resolve().parents[1]
CORPUS = [
    "Turn 1:\nState:\n#_PX_#\nPlayer at (row 1, col 2).",
    "<think>The box is right of me, so I push it.</think><answer>Right</answer>",
] * 10


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, save_random_policy) -> Path:
    path = tmp_path_factory.mktemp("model")
    save_random_policy(path, CORPUS)
    return path


def diagnose(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "ragen2", "diagnose", *args], env=env, capture_output=True,
                          text=True, timeout=120)


def test_diagnose_writes_json_and_heatmap(tmp_path, model_dir):
    rows = [
        json.dumps({"group": g, "prompt": f"Room {g}: player at (row {g}, col 2).<think>", "episode": 3 * g + k,
                    "turn": 0, "reasoning": f"I push the box {'right' if k % 2 else 'down'} {g}."})
        for g in range(3)
        for k in range(3)
    ]
    rows.insert(4, '{"group": 1, "prompt": "Room 1"}')
    rollouts = tmp_path / "step_5.jsonl"
    rollouts.write_text("\n".join(rows) + "\n")
    out = tmp_path / "diag"

    proc = diagnose(str(rollouts), "--model", str(model_dir), "--out", str(out), "--device", "cpu")
    assert proc.returncode == 0, proc.stderr
    assert "skipped 1 malformed line (line 5); first: line 5: missing 'reasoning'" in proc.stdout
    assert "Retrieval-Acc" in proc.stdout and "MI-ZScore" in proc.stdout
    report = json.loads((out / "diagnose.json").read_text())
    assert report["records"] == 9 and report["skipped"] == 1 and report["skipped_lines"][0]["line"] == 5
    assert report["metrics"]["num_inputs"] == 3 and report["metrics"]["num_pairs"] == 9
    assert 0.0 <= report["metrics"]["retrieval_acc"] <= 1.0
    assert report["metrics"]["chance_level"] == pytest.approx(1 / 3)
    assert len(report["logp"]) == 9 and len(report["logp"][0]) == 3
    assert sorted(report["pair_lines"]) == [1, 2, 3, 4, 6, 7, 8, 9, 10] and report["input_groups"] == ["0", "1", "2"]
    assert (out / "heatmap.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_diagnose_reports_an_unusable_file(tmp_path, model_dir, capsys):
    """In-process (the subprocess path is covered above): exit code 2 and the bad lines by number."""
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"group": 0}\nnot json\n')
    assert main(["diagnose", str(bad), "--model", str(model_dir), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "line 1: missing 'prompt', 'reasoning'" in err
    assert "line 2: not valid JSON" in err
    assert not (tmp_path / "o").exists()
    good = tmp_path / "good.jsonl"
    good.write_text('{"group": 0, "prompt": "A<think>", "reasoning": "go"}\n')
    assert main(["diagnose", str(good), "--model", str(tmp_path / "no-model")]) == 2
    assert "no-model does not exist; pass a model directory" in capsys.readouterr().err


def test_diagnose_on_two_records_says_the_proxies_cannot_be_computed(tmp_path, model_dir, capsys):
    """Issue 15: two pairs printed Retrieval-Acc 1.0 "within sampling noise of chance". Two records of
    one input: retrieval and MI do not exist; two records of two inputs: too few to tell from chance."""
    same = tmp_path / "same.jsonl"
    same.write_text("".join(json.dumps({"group": 0, "prompt": "Room 0: player at (row 1, col 2).<think>",
                                        "reasoning": f"I push the box {d}."}) + "\n" for d in ("right", "down")))
    assert main(["diagnose", str(same), "--model", str(model_dir), "--out", str(tmp_path / "a"),
                 "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "the proxies cannot be computed from 2 pairs" in out and "at least 2 distinct inputs" in out
    assert "within sampling noise" not in out
    assert re.search(r"^Retrieval-Acc +n/a$", out, flags=re.MULTILINE)
    assert re.search(r"^MI-ZScore +n/a$", out, flags=re.MULTILINE)
    assert "pairs x inputs             2 x 1 (1 distinct)" in out
    report = json.loads((tmp_path / "a" / "diagnose.json").read_text())
    assert report["metrics"]["num_pairs"] == 2 and "retrieval_acc" not in report["metrics"]
    assert "mi_zscore" not in report["metrics"] and report["reading"].startswith("the proxies cannot be computed")

    two = tmp_path / "two.jsonl"
    two.write_text("".join(json.dumps({"group": g, "prompt": f"Room {g}: player at (row {g}, col 2).<think>",
                                       "reasoning": f"I push the box {d}."}) + "\n"
                           for g, d in ((0, "right"), (1, "down"))))
    assert main(["diagnose", str(two), "--model", str(model_dir), "--out", str(tmp_path / "b"),
                 "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "2 pairs over 2 distinct inputs are too few to tell" in out and "at least 5 pairs" in out
    assert "within sampling noise of chance" not in out
