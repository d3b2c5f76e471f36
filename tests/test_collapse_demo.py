"""The collapse demo's figure and summary (`python -m ragen2.report.collapse_demo`), on a sweep directory written
the way `ragen2 sweep` writes one: grid, run status files, metrics.jsonl and events.jsonl."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from PIL import Image

from ragen2.report.collapse_demo import MI_KEY, SUCCESS_KEY, change, draw, load_arms, main, summary
from ragen2.sweep import GRID_FILE, STATUS_FILE

STEPS = list(range(1, 9))


def write_run(out: Path, name: str, mi: list[float], success: dict[int, float], alarms: list[int], done: bool) -> None:
    run = out / name
    run.mkdir(parents=True)
    records = []
    for step, value in zip(STEPS, mi):
        records.append({"step": step, MI_KEY: value, "collapse_first_turn/retrieval_acc": 1.0, "train/entropy": 0.2})
    records += [{"step": step, SUCCESS_KEY: value} for step, value in success.items()]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (run / "events.jsonl").write_text("".join(
        json.dumps({"step": s, "kind": "collapse_alarm", "message": "MI fell"}) + "\n" for s in alarms))
    (run / "config.yaml").write_text(yaml.safe_dump({"trainer": {"eval_episodes": 128}}))
    if done:
        (run / STATUS_FILE).write_text(json.dumps({"returncode": 0, "seconds": 1.0}))


@pytest.fixture
def sweep(tmp_path: Path) -> Path:
    """Two arms x two seeds: without the filter MI falls and an alarm fires; with it MI holds. A third seed of the
    filter arm never finished."""
    out = tmp_path / "collapse_demo"
    names = []
    falling = [1.0, 1.0, 0.9, 0.8, 0.6, 0.5, 0.4, 0.4]  # early quarter 1.0, late quarter 0.4
    flat = [1.0, 1.0, 1.0, 1.1, 1.0, 1.0, 1.2, 1.0]  # early 1.0, late 1.1
    for seed in (0, 1):
        write_run(out, f"filter=none__seed={seed}", falling, {0: 0.3, 8: 0.2}, [6 + seed], True)
        write_run(out, f"filter=paper__seed={seed}", flat, {0: 0.3, 8: 0.5}, [], True)
        names += [(f"filter=none__seed={seed}", "none", seed), (f"filter=paper__seed={seed}", "paper", seed)]
    write_run(out, "filter=paper__seed=2", falling, {0: 0.3}, [3], False)
    names.append(("filter=paper__seed=2", "paper", 2))
    grid = {"spec": "collapse_demo", "description": "test", "axes": ["filter"],
            "runs": [{"name": n, "labels": {"filter": label}, "seed": s, "command": ""} for n, label, s in names]}
    (out / GRID_FILE).write_text(json.dumps(grid))
    return out


def test_arms_hold_the_finished_runs_of_each_label(sweep: Path) -> None:
    arms = load_arms(sweep)
    assert [a.name for a in arms] == ["none", "paper"]
    assert [len(a.runs) for a in arms] == [2, 2]  # the unfinished seed 2 is left out
    assert [a.color for a in arms] == ["C3", "C0"]


def test_summary_reports_late_minus_early_and_each_runs_alarms(sweep: Path) -> None:
    none, paper = load_arms(sweep)
    assert change(none.runs[0], MI_KEY) == pytest.approx(0.4 - 1.0)
    assert change(paper.runs[0], MI_KEY) == pytest.approx(0.1)
    assert change(paper.runs[0], SUCCESS_KEY) == pytest.approx(0.2)
    lines = summary([none, paper])
    assert "Δ MI-ZScore-EMA -0.600 ± 0.000" in lines[0] and "alarms at step 6, 7" in lines[0]
    assert "Δ held-out success -0.100 ± 0.000" in lines[0]
    assert "Δ MI-ZScore-EMA +0.100 ± 0.000" in lines[1] and "alarms at step none, none" in lines[1]


def test_figure_has_four_panels_with_a_line_per_arm_and_the_alarms(sweep: Path, tmp_path: Path) -> None:
    out = draw(load_arms(sweep), tmp_path / "demo.png")
    width, height = Image.open(out).size
    assert width > 3 * height  # one row of four panels


def test_command_line_draws_and_prints(sweep: Path, capsys: pytest.CaptureFixture[str]) -> None:
    main([str(sweep)])
    printed = capsys.readouterr().out
    assert (sweep / "collapse_demo.png").is_file()
    assert printed.count("runs): Δ MI-ZScore-EMA") == 2 and f"figure: {sweep / 'collapse_demo.png'}" in printed


def test_command_line_refuses_a_sweep_without_finished_runs(tmp_path: Path) -> None:
    out = tmp_path / "empty"
    out.mkdir()
    (out / GRID_FILE).write_text(json.dumps({"spec": "x", "description": "", "axes": ["filter"], "runs": []}))
    with pytest.raises(SystemExit):
        main([str(out)])
