"""The end-of-run summary table: first / last / peak with standard errors, first → last verdicts, MI proxies, the
filter's kept ratio."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from ragen2.config import load_config
from ragen2.rl import trainer
from ragen2.tracking import read_metrics
from ragen2.verdict import verdict


@pytest.fixture(autouse=True)
def _single_thread(one_thread):
    """Every test here runs on one thread (see tests/conftest.py, one_thread)."""


def cells(table: str, label: str) -> list[str]:
    """The cells after `label` on its row (columns are two or more spaces apart)."""
    [line] = [line for line in table.splitlines() if line.startswith(label + "  ")]
    return re.split(r" {2,}", line)[1:]


def shown(value: float | None, se: float | None, step: int) -> str:
    """A cell as the table should print it, computed here independently of the trainer."""
    if value is None:
        return f"n/a ({step})"
    return f"{value:.3f} ± {'n/a' if se is None else f'{se:.3f}'} ({step})"


def test_first_last_peak_of_a_real_run_match_metrics_jsonl(policy_dir, tmp_path):
    run_dir = tmp_path / "run"
    config = load_config("bandit", [
        f"model.path={policy_dir}", "model.device=cpu", f"trainer.run_dir={run_dir}",
        "rollout.num_groups=2", "rollout.group_size=2", "rollout.max_tokens_per_turn=8",
        "trainer.total_steps=4", "trainer.eval_every=2", "trainer.eval_episodes=3", "collapse.compute_freq=2",
        "algo.name=ppo", "filter.include_zero=true", "filter.strategy=top_k", "filter.value=0.5",
        "filter.metric=entropy", "algo.mini_batch_size=4", "algo.micro_batch_size=2", "optim.lr=1e-3",
        "logging.progress=false", "logging.tensorboard=false",
    ])
    table = trainer.train(config)
    records = read_metrics(run_dir)
    n_train = 4

    def by_hand(key: str, se, marker: str | None = None) -> list[str]:
        measured = [r for r in records if (marker or key) in r]
        finite = [r for r in measured if r.get(key) is not None]
        peak = max(finite, key=lambda r: r[key])  # the first of equal highest values
        return [shown(r.get(key), se(r) if r.get(key) is not None else None, r["step"])
                for r in (measured[0], measured[-1], peak)]

    evals = [r for r in records if "eval/success_rate" in r]
    assert [r["step"] for r in evals] == [0, 2, 4]
    assert cells(table, "eval success") == by_hand(
        "eval/success_rate", lambda r: math.sqrt(r["eval/success_rate"] * (1 - r["eval/success_rate"]) / 3))
    train_rate = "rollout/success_rate"
    assert cells(table, "train success") == by_hand(
        train_rate, lambda r: math.sqrt(r[train_rate] * (1 - r[train_rate]) / n_train))
    assert cells(table, "train return") == by_hand("rollout/return_mean", lambda r: r["rollout/return_std"] / 2)
    assert cells(table, "train entropy") == by_hand("train/entropy", lambda r: None)
    assert cells(table, "train valid format") == by_hand("rollout/valid_format_rate", lambda r: None)
    # MI checks at steps 1, 2 and 4; a proxy a check could not support is n/a at that check.
    assert [r["step"] for r in records if "collapse_first_turn/num_pairs" in r] == [1, 2, 4]
    first_turn = cells(table, "Retrieval-Acc (first turn)")
    assert [c.rsplit(" ", 1)[1] for c in first_turn[:2]] == ["(1)", "(4)"]
    assert cells(table, "MI-ZScore-EMA (trajectory)")[1].endswith("(4)")
    se = [math.sqrt(r["eval/success_rate"] * (1 - r["eval/success_rate"]) / 3) for r in (evals[0], evals[-1])]
    assert cells(table, "Δ eval success") == [
        verdict(evals[0]["eval/success_rate"], se[0], evals[-1]["eval/success_rate"], se[1])]
    kept = [r["filter/kept_ratio"] for r in records if "filter/kept_ratio" in r]
    assert len(kept) == 4
    assert ("filter kept ratio  " in table
            and f"mean {sum(kept) / 4:.3f} over 4 steps (min {min(kept):.3f}, max {max(kept):.3f})" in table)
    assert re.search(r"^MI proxies \(first turn\) +Retrieval-Acc ", table, flags=re.MULTILINE)  # summary_rows kept
    header = next(line for line in table.splitlines() if "first (step)" in line)
    assert header.split() == ["first", "(step)", "last", "(step)", "peak", "(step)"]
    # Fixed width: every cell of the block starts in its header's column.
    columns = [header.index(h) for h in ("first (step)", "last (step)", "peak (step)")]
    row = next(line for line in table.splitlines() if line.startswith("train entropy"))
    assert [row[c - 2:c] for c in columns] == ["  "] * 3 and all(row[c] != " " for c in columns)


def write_metrics(run_dir: Path, records: list[dict]) -> None:
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def test_standard_errors_and_missing_values_on_a_hand_written_log(tmp_path):
    """8 eval episodes: SE(0.25) = sqrt(0.25 x 0.75 / 8) = 0.153; 2 x 4 training episodes: SE(0.5) = sqrt(0.25 / 8)
    = 0.177 and SE(return) = 0.4 / sqrt(8) = 0.141; 8 pairs: SE(Retrieval-Acc 0.625) = 0.171."""
    fp = "collapse_first_turn/"
    write_metrics(tmp_path / "run", [
        {"step": 0, "eval/success_rate": 0.25, "eval/episodes": 8.0},
        {"step": 1, "rollout/success_rate": 0.5, "rollout/return_mean": 0.3, "rollout/return_std": 0.4,
         "train/entropy": 1.25, "filter/kept_ratio": 0.5,
         fp + "num_pairs": 8.0, fp + "retrieval_acc": 0.625, fp + "chance_level": 0.5, fp + "mi_zscore_ema": 0.4},
        {"step": 2, "rollout/success_rate": 0.75, "rollout/return_mean": 0.7, "train/entropy": None,
         "filter/kept_ratio": 1.0, "eval/success_rate": 0.75, "eval/episodes": 8.0},
        {"step": 3, "rollout/success_rate": 0.25, "rollout/return_mean": 0.2, "rollout/return_std": 0.0,
         "train/entropy": 1.0, "filter/kept_ratio": 0.0, "eval/success_rate": 0.5,
         fp + "num_pairs": 1.0, fp + "chance_level": 1.0},
    ])
    config = load_config("bandit", ["rollout.num_groups=2", "rollout.group_size=4", "trainer.total_steps=3"])
    run = SimpleNamespace(run_dir=tmp_path / "run", step=3, config=config, stop_reason=None)
    table = trainer.summary_table(run)
    assert cells(table, "eval success") == ["0.250 ± 0.153 (0)", "0.500 ± n/a (3)", "0.750 ± 0.153 (2)"]
    assert cells(table, "train success") == ["0.500 ± 0.177 (1)", "0.250 ± 0.153 (3)", "0.750 ± 0.153 (2)"]
    assert cells(table, "train return") == ["0.300 ± 0.141 (1)", "0.200 ± 0.000 (3)", "0.700 ± n/a (2)"]
    assert cells(table, "train entropy") == ["1.250 ± n/a (1)", "1.000 ± n/a (3)", "1.250 ± n/a (1)"]
    assert cells(table, "Retrieval-Acc (first turn)") == ["0.625 ± 0.171 (1)", "n/a (3)", "0.625 ± 0.171 (1)"]
    assert cells(table, "MI-ZScore-EMA (first turn)") == ["0.400 ± n/a (1)", "n/a (3)", "0.400 ± n/a (1)"]
    assert "Retrieval-Acc (trajectory)" not in table and "train valid format" not in table  # never logged
    # First → last: the last evaluation logged no episode count, the last MI check supported no proxy.
    assert cells(table, "Δ eval success") == ["0.250 → 0.500: changed by +0.250 ± n/a (no standard error, no verdict)"]
    assert cells(table, "Δ Retrieval-Acc (first turn)") == ["0.625 → n/a: no verdict without both values"]
    assert cells(table, "Δ MI-ZScore-EMA (first turn)") == ["0.400 → n/a: no verdict without both values"]
    assert "filter kept ratio             mean 0.500 over 3 steps (min 0.000, max 1.000)" in table
    assert ("MI proxies (first turn)       Retrieval-Acc n/a (chance 1.000), MI-ZScore-EMA n/a; 1 pair (step 3)"
            in table)
    assert table.splitlines()[0] == "steps                         3 / 3"


def test_verdicts_first_to_last_on_a_hand_written_log(tmp_path):
    """Held-out success 0.25 -> 0.46 over 100 episodes: SE 0.0433 and 0.0498, d = 0.21 ± √(0.001875 + 0.002484)
    = 0.066, 3.2 SE. Retrieval-Acc 0.875 -> 0.25 over 16 and 8 pairs: SE 0.0827 and 0.153, d = -0.625 ± 0.174,
    -3.6 SE. MI-ZScore-EMA has no standard error: its change is shown without a verdict. A metric measured
    once gets no verdict row."""
    ft, tj = "collapse_first_turn/", "collapse_trajectory/"
    write_metrics(tmp_path / "run", [
        {"step": 0, "eval/success_rate": 0.25, "eval/episodes": 100.0},
        {"step": 1, "rollout/success_rate": 0.5, ft + "num_pairs": 16.0, ft + "retrieval_acc": 0.875,
         ft + "mi_zscore_ema": 2.5, tj + "num_pairs": 8.0, tj + "retrieval_acc": 0.5},
        {"step": 2, "rollout/success_rate": 0.75, "eval/success_rate": 0.9, "eval/episodes": 100.0},
        {"step": 4, "rollout/success_rate": 0.75, "eval/success_rate": 0.46, "eval/episodes": 100.0,
         ft + "num_pairs": 8.0, ft + "retrieval_acc": 0.25, ft + "mi_zscore_ema": 0.5},
    ])
    config = load_config("bandit", ["trainer.total_steps=4"])
    table = trainer.summary_table(SimpleNamespace(run_dir=tmp_path / "run", step=4, config=config, stop_reason=None))
    assert cells(table, "Δ eval success") == ["0.250 → 0.460: learned: +0.210 ± 0.066 (3.2 SE)"]
    assert cells(table, "Δ Retrieval-Acc (first turn)") == ["0.875 → 0.250: fell: -0.625 ± 0.174 (-3.6 SE)"]
    assert cells(table, "Δ MI-ZScore-EMA (first turn)") == [
        "2.500 → 0.500: changed by -2.000 ± n/a (no standard error, no verdict)"]
    assert "Δ Retrieval-Acc (trajectory)" not in table and "Δ train success" not in table
    # The verdict rows follow the trend block, before the other name / value rows.
    labels = [line.split("  ")[0] for line in table.splitlines()]
    assert labels.index("MI-ZScore-EMA (first turn)") < labels.index("Δ eval success") < labels.index("run dir")


def test_a_mixtures_tags_stand_side_by_side_training_tags_first():
    from ragen2.rl.summary import tag_table

    records = [
        {"step": 0, "eval/a/success_rate": 0.25, "eval/a/episodes": 16, "eval/ood/success_rate": 0.0,
         "eval/ood/episodes": 16, "eval/a/pass@4": 0.5, "eval/ood/pass@4": 0.0},
        {"step": 1, "rollout/a/success_rate": 0.5, "rollout/b/success_rate": 0.125, "filter/a/kept_ratio": 1.0,
         "filter/b/kept_ratio": 0.5, "collapse_first_turn/a/retrieval_acc": 0.75},
        {"step": 2, "rollout/a/success_rate": 0.375, "rollout/b/success_rate": 0.25, "filter/a/kept_ratio": 0.5,
         "filter/b/kept_ratio": 0.0, "eval/a/success_rate": 0.5, "eval/a/episodes": 16, "eval/ood/success_rate": 0.25,
         "eval/ood/episodes": 16, "eval/a/pass@4": 0.75, "eval/ood/pass@4": 0.25},
    ]
    lines = tag_table(records)
    assert lines[1].split() == ["per", "tag", "a", "b", "ood"]
    row = {line[:24].strip(): re.split(r"\s{2,}", line[24:].strip()) for line in lines[2:]}
    # SEs: sqrt(.5 * .5 / 16) and sqrt(.25 * .75 / 16)
    assert row["eval success (last)"] == ["0.500 ± 0.125", "-", "0.250 ± 0.108"]
    assert row["eval pass@4 (last)"] == ["0.750", "-", "0.250"]
    assert row["train success (last)"] == ["0.375", "0.250", "-"]
    assert row["filter kept ratio (mean)"] == ["0.750", "0.250", "-"]
    assert row["Retrieval-Acc first turn"] == ["0.750", "-", "-"]
    assert row["Retrieval-Acc held out"] == ["-", "-", "-"]
    assert tag_table([{"step": 1, "rollout/success_rate": 0.5}]) == []  # one environment: no block
