"""scripts/make_results.py: numbers computed by hand from sweep directories, verdicts, figures, a real run, the
committed data collected from sweeps, and docs/results.md against what the committed data gives."""

from __future__ import annotations

import difflib
import filecmp
import importlib.util
import json
import math
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from scipy.stats import spearmanr

from ragen2 import sweep

REPO = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("make_results", REPO / "scripts" / "make_results.py")
make_results = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = make_results  # dataclasses look their module up while the script loads
_spec.loader.exec_module(make_results)


def write_sweep(root: Path, name: str, axes: list[str], runs: dict[str, tuple[dict, int, list[dict]]],
                env: str = "sokoban", algo: dict | None = None, unfinished: tuple[str, ...] = ()):
    """A sweep directory as `ragen2 sweep` leaves it: sweep.json, and per run metrics, config and exit status.
    `algo` maps a run name to its algo section of config.yaml; `unfinished` runs have no exit status."""
    out = root / name
    grid = {"spec": name, "description": f"{name} test", "axes": axes, "runs": []}
    for run_name, (labels, seed, records) in runs.items():
        run_dir = out / run_name
        run_dir.mkdir(parents=True)
        (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
        if run_name not in unfinished:
            (run_dir / sweep.STATUS_FILE).write_text(json.dumps({"returncode": 0, "seconds": 60.0}))
        (run_dir / "config.yaml").write_text(yaml.safe_dump({"env": {"name": env}, "algo": (algo or {}).get(run_name, {})}))
        grid["runs"].append({"name": run_name, "labels": labels, "seed": seed, "command": "ragen2 train ..."})
    (out / sweep.GRID_FILE).write_text(json.dumps(grid))


def run_records(success: list[float], mi: list[float], entropy: list[float], step_s: float = 10.0) -> list[dict]:
    """Steps 0..n-1: eval success at every step, MI and entropy from step 1 on."""
    records = [{"step": 0, "eval/success_rate": success[0]}]
    for step in range(1, len(success)):
        records.append({
            "step": step, "eval/success_rate": success[step], "collapse_trajectory/mi_zscore_ema": mi[step],
            "collapse_first_turn/retrieval_acc": mi[step] / 10, "train/entropy": entropy[step],
            "filter/kept_ratio": 0.5, "timing_s/step": step_s + 2.0, "timing_s/evaluate": 2.0,
        })
    return records


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    root = tmp_path_factory.mktemp("results")
    sweeps = root / "sweeps"
    flat = [1.0] * 9
    # levels: final MI prompt 2.0, 2.2, 2.4 vs trajectory 0.2, 0.3, 0.1; a fourth prompt run was cut off.
    write_sweep(sweeps, "levels", ["level"], {
        f"level={level}__seed={s}": ({"level": level}, s, run_records([0.5] * 9, [3.0] * 8 + [final], flat))
        for level, finals in (("prompt", (2.0, 2.2, 2.4, 50.0)), ("trajectory", (0.2, 0.3, 0.1)))
        for s, final in enumerate(finals)
    }, unfinished=("level=prompt__seed=3",))
    # filter on frozenlake: peak success 0.5, 0.6, 0.7 (filter, 6 s steps) vs 0.2, 0.3, 0.4 (none, 10 s steps).
    write_sweep(sweeps, "filter_frozenlake", ["algo.name", "filter"], {
        f"filter={f}__seed={s}": ({"algo.name": "grpo", "filter": f}, s,
                                  run_records([0.1, peak, 0.1, 0.1, 0.1], [1.0] * 5, flat[:5], step_s))
        for f, peaks, step_s in (("paper", (0.5, 0.6, 0.7), 6.0), ("none", (0.2, 0.3, 0.4), 10.0))
        for s, peak in enumerate(peaks)
    }, env="frozenlake")
    # collapse: MI falls from step 3 on, success from step 6 on, entropy flat.
    mi = [4.0, 4.0, 4.0, 3.0, 2.0, 1.0, 0.5, 0.5, 0.5]
    success = [0.6, 0.6, 0.6, 0.6, 0.6, 0.6, 0.3, 0.2, 0.1]
    probe = {f"grad_snr/bucket{b}/{t}": 0.1 * (b + 1) for b in range(3) for t in ("task_norm", "kl_norm", "entropy_norm")}
    collapse_runs = {}
    for s, offset in enumerate((0.0, 0.1, -0.1)):
        records = run_records(success, [m + offset for m in mi], flat)
        records[-1] |= probe
        collapse_runs[f"filter=none__seed={s}"] = ({"filter": "none"}, s, records)
    write_sweep(sweeps, "collapse", ["filter"], collapse_runs)
    # collapse_gpu: two runs stopped part-way (steps 4 and 5), MI falling from step 3 as above.
    write_sweep(sweeps, "collapse_gpu", ["filter"], {
        f"filter=none__seed={s}": ({"filter": "none"}, s, run_records(success[: last + 1], mi[: last + 1], flat))
        for s, last in ((0, 4), (1, 5))
    }, unfinished=("filter=none__seed=0", "filter=none__seed=1"))
    # mechanism: MI changes by delta over the run; the final MI of task-on runs falls with the coefficient.
    cells = {  # name: (task advantage scale, entropy coef, MI changes of seeds 0-2)
        "control": (0.0, 0.0, (0.0, 0.1, -0.1)),
        "entropy": (0.0, 0.1, (-1.0, -1.2, -0.8)),
        "task-low": (1.0, 0.01, (0.0, 0.0, 0.0)),
        "task-high": (1.0, 0.1, (-2.0, -2.0, -2.0)),
    }
    mechanism, algos = {}, {}
    for cell, (scale, coef, deltas) in cells.items():
        for s, delta in enumerate(deltas):
            name = f"cell={cell}__seed={s}"
            mechanism[name] = ({"cell": cell}, s, run_records([0.5] * 9, [3.0] * 7 + [3.0 + delta] * 2, flat))
            algos[name] = {"task_advantage_scale": scale, "entropy_coef": coef, "kl_coef": 0.0}
    write_sweep(sweeps, "mechanism", ["cell"], mechanism, algo=algos)
    # quartiles: started, but no run has finished yet
    cut_off = {"quartile=1__seed=0": ({"quartile": 1}, 0, run_records([0.5] * 3, [1.0] * 3, flat[:3]))}
    write_sweep(sweeps, "quartiles", ["quartile"], cut_off, unfinished=tuple(cut_off))
    # planning_mix: per run and out-of-distribution tag k, held-out success rises by 0.1 (seed + 1) + 0.05 k (+0.3 with
    # the filter) and Retrieval-Acc by half that: the two changes always move together.
    mixture_runs = {}
    for f, bonus in (("paper", 0.3), ("none", 0.0)):
        for s in range(3):
            gains = {"sokoban": 0.0, **{tag: 0.1 * (s + 1) + 0.05 * k + bonus
                                        for k, tag in enumerate(("sokoban-8x8", "bandit-test"))}}
            records = [{"step": step, "eval/success_rate": 0.5,
                        **{f"eval/{t}/success_rate": 0.25 + g * (step == 2) for t, g in gains.items()},
                        **{f"collapse_eval/{t}/retrieval_acc": 0.5 + g / 2 * (step == 2) for t, g in gains.items()}}
                       for step in (0, 2)]
            mixture_runs[f"filter={f}__seed={s}"] = ({"filter": f}, s, records)
    write_sweep(sweeps, "planning_mix", ["filter"], mixture_runs)
    out = root / "docs" / "results.md"
    make_results.write_results(sweeps, out, out.parent / "figures", model_figures=False)
    return out, out.read_text(), sweeps


def section(text: str, title_start: str) -> str:
    start = text.index(f"## {title_start}")
    end = text.find("\n## ", start + 1)
    return text[start:end if end > 0 else None]


def test_levels_numbers_and_verdict(results):
    _, text, _ = results
    part = section(text, "Prompt- vs trajectory-level")
    # 2.2 - 0.2 = 2.0; SE sqrt((0.2/sqrt(3))^2 + (0.1/sqrt(3))^2) = 0.129.
    assert "final MI-ZScore-EMA +2 ± 0.13" in part
    assert "| prompt | 2.2 ± 0.12 (n=3) |" in part and "| trajectory | 0.2 ± 0.058 (n=3) |" in part
    assert "Verdict: **reproduced**" in part
    # The cut-off run counts in the grid, not in the numbers. A run's time is the larger of its exit status's 60 s
    # and its logged steps, 8 x 12 s = 96 s (a run resumed after its sweep was cut off times only its last part).
    assert "| levels | 7 | 6 | 10 min |" in text  # 6 x 96 s


def test_filter_numbers_and_step_time_ratio(results):
    _, text, _ = results
    part = section(text, "SNR-aware filtering on frozenlake")
    # Peak success 0.6 vs 0.3: +0.3 with SE sqrt(2) x 0.1/sqrt(3) = 0.082; training step 6 s vs 10 s (evaluation taken out).
    assert "grpo: peak success +0.3 ± 0.082 (final +0 ± " in part  # every run ends at 0.1
    assert "not in the verdict), step time ×0.60" in part
    assert "Verdict: **reproduced**" in part
    assert "| grpo | paper | 0.6 ± 0.058 (n=3) |" in part


def test_collapse_order_and_entropy_band(results):
    _, text, _ = results
    part = section(text, "Template collapse")
    # MI (steps 1-8: 4, 4, 3, 2, ...; early level 4): the 3-point average centred on step 3 is 3 < 3.6.
    # Success (steps 0-8: 0.6 x 6, 0.3, ...; early 0.6): centred on step 5, (0.6 + 0.6 + 0.3) / 3 = 0.5 < 0.54.
    assert "| none | 0 ± 0 (n=3) |" in part  # token entropy flat
    assert "| 3, 3, 3 | 5, 5, 5 |" in part
    assert "in 3 of 3 runs where both fell, MI fell first" in part
    assert "Verdict: **reproduced**" in part
    assert "collapse_grad_snr.png" in part
    # The GPU attempt is reported from its unfinished runs, outside the verdict. MI over steps 1-4 and 1-5 (one
    # point per quarter): 4 -> 2 and 4 -> 1, so -2.5 ± 0.5.
    assert "2 of 2 runs stopped part-way, at steps 4–5 of ?" in part
    assert "| none | 0 ± 0 (n=2) | -0.25 ± 0.05 (n=2) | -2.5 ± 0.5 (n=2) |" in part  # Retrieval-Acc is MI / 10


def test_not_run_experiments_say_how(results):
    _, text, _ = results
    # a started sweep without a finished run is not run, and the overview says how far it got
    assert "(What changed): `ragen2 sweep experiments/quartiles.yaml --jobs 2`" in section(text, "RV quartiles")
    assert "| quartiles | 1 | 0 | 0 min |" in text
    assert "| filter_sokoban | – | – | not re-run since the reference-matching filter (What changed) |" in text


def test_mechanism_numbers_and_verdict(results):
    _, text, _ = results
    part = section(text, "Regularisers alone")
    # Regulariser-only minus control: -1 - 0 with SE sqrt((0.2/sqrt(3))^2 + (0.1/sqrt(3))^2) = 0.129.
    assert "regulariser-only minus control, Δ MI-ZScore-EMA -1 ± 0.13" in part
    assert "| 0 | 0.1 | 0 | -1 ± 0.12 (n=3) |" in part
    assert "ρ = -1.00 [" in part  # task on: the larger coefficient always ends with the lower MI
    assert "Verdict: **reproduced**" in part


def test_correlation_matches_scipy_on_the_sweep_tables(results):
    _, text, sweeps = results
    rows = [r for name in ("collapse", "filter_frozenlake", "levels", "mechanism") for r in sweep.read_sweep(sweeps / name)
            if r["status"] == "done"]
    rho = spearmanr([r["mi_zscore_ema_traj"] for r in rows], [r["final_success"] for r in rows]).statistic
    part = section(text, "MI proxies track final success")
    assert f"| MI-ZScore-EMA (traj) | {rho:+.2f} [" in part and f"(n={len(rows)})" in part


def test_planning_mix_per_tag_numbers_and_verdict(results):
    _, text, _ = results
    part = section(text, "Several environments in one run")
    # paper, sokoban-8x8: gains 0.1 (s + 1) + 0.3 = 0.4, 0.5, 0.6 over 0.25; Retrieval-Acc 0.5 + half of them.
    row = ("| paper | sokoban-8x8 (ood) | 0.25 ± 0 (n=3) | 0.75 ± 0.058 (n=3) | – | 0.5 ± 0 (n=3) | "
           "0.75 ± 0.029 (n=3) | – |")
    assert row in part  # no pass@8 or training MI logged for it here
    assert "| none | sokoban | 0.25 ± 0 (n=3) | 0.25 ± 0 (n=3) |" in part  # a training tag: no (ood) mark
    assert "ρ = +1.00 [+1.00, +1.00] (n=12)" in part and "Verdict: **reproduced**" in part
    # Final ood success per run, paper minus none: 0.3, SE sqrt(2) x 0.1 / sqrt(3) = 0.082.
    assert "paper filter minus none: +0.3 ± 0.082. 0 of the 2 out-of-distribution tags have" in part


def test_every_linked_figure_exists(results):
    out, text, _ = results
    links = [line.split("(")[1].rstrip(")") for line in text.splitlines() if line.startswith("![")]
    assert len(links) >= 5
    for link in links:
        assert (out.parent / link).is_file(), link


def test_spearman_ci_and_drop_step():
    rho, lo, hi, n = make_results.spearman_ci([1, 2, 3, 4, 5, 6], [2, 4, 5, 9, 10, 12])
    assert (rho, n) == (1.0, 6) and lo <= rho <= hi
    # The vectorised bootstrap against scipy on one resample's worth of data with ties.
    x, y = [1, 2, 2, 3, 5, 4, 7], [3, 1, 2, 2, 6, 5, 4]
    rho, lo, hi, _ = make_results.spearman_ci(x, y)
    assert rho == pytest.approx(spearmanr(x, y).statistic) and -1 <= lo < rho < hi <= 1
    assert math.isnan(make_results.spearman_ci([1, 1, 1], [1, 2, 3])[0])  # a constant has no ranking
    steps = np.arange(8)
    # Early level (first 2 values) 1.0; 3-point averages centred on steps 1, 2, 3: 1, 0.933, 0.8 < 0.9.
    assert make_results.drop_step(steps, np.array([1, 1, 1, 0.8, 0.6, 0.5, 0.5, 0.5])) == 3
    assert make_results.drop_step(steps, np.ones(8)) is None


def test_model_figures_on_a_real_run(tmp_path, save_random_policy):
    """A real 1-step Bandit run through `ragen2 sweep`, then the RV histogram from its checkpoint, and the same
    page and histogram from the data collected of it, without the checkpoint."""
    save_random_policy(tmp_path / "policy")
    spec_path = tmp_path / "collapse.yaml"
    spec_path.write_text(yaml.safe_dump({
        "preset": "bandit",
        "base": {"model.path": str(tmp_path / "policy"), "model.device": "cpu", "rollout.num_groups": 2,
                 "rollout.group_size": 4, "rollout.max_tokens_per_turn": 8, "trainer.total_steps": 1,
                 "trainer.eval_every": 1, "trainer.eval_episodes": 4, "logging.tensorboard": False},
        "axes": {"filter": {"none": {"filter.strategy": "none", "filter.include_zero": True}}},
        "seeds": [0],
    }))
    actions = sweep.run_sweep(spec_path, tmp_path / "sweeps" / "collapse", jobs=1, threads=1)
    assert actions == {"filter=none__seed=0": "done"}
    out = tmp_path / "docs" / "results.md"
    make_results.write_results(tmp_path / "sweeps", out, out.parent / "figures", model_figures=True, rv_groups=4)
    text = out.read_text()
    assert "![RV histogram](figures/collapse_rv_histogram.png)" in text
    assert "No heatmaps:" in text and "empty reasoning" in text  # the random policy writes no reasoning
    assert str(tmp_path) not in text  # the reason names the rollout file from the run directory on
    histogram = out.parent / "figures" / "collapse_rv_histogram.png"
    assert histogram.stat().st_size > 1000
    # Collected, the RV values come along and the same page and histogram come back without a checkpoint.
    make_results.collect(tmp_path / "sweeps", tmp_path / "data", rv_groups=4)
    assert (tmp_path / "data" / "collapse" / make_results.MODEL_FIGURES_FILE).is_file()
    shutil.rmtree(tmp_path / "sweeps")
    again = tmp_path / "again" / "results.md"
    make_results.write_results(tmp_path / "data", again, again.parent / "figures")
    assert again.read_text() == text
    assert filecmp.cmp(again.parent / "figures" / histogram.name, histogram, shallow=False)


def test_collect_keeps_what_the_page_needs_and_gives_the_same_page(results, tmp_path):
    """sweeps/ -> committed data (no checkpoints, rollouts or logs) -> the same page and figures, byte for byte."""
    _, _, original = results
    sweeps = shutil.copytree(original, tmp_path / "sweeps")
    run = sweeps / "levels" / "level=prompt__seed=0"
    for left_behind in ("checkpoints/step_8/model.safetensors", "rollouts/step_0.jsonl", "train.log", "events.jsonl"):
        (run / left_behind).parent.mkdir(parents=True, exist_ok=True)
        (run / left_behind).write_text("x")
    data = tmp_path / "results" / "runs"
    (data / "stale").mkdir(parents=True)  # a sweep collected before and not in sweeps/ now stays
    (data / "stale" / "old.txt").write_text("kept")
    (data / "levels" / "gone__seed=9").mkdir(parents=True)  # a sweep collected again is replaced whole
    assert make_results.collect(sweeps, data) == [data / name for name in sorted(p.name for p in original.iterdir())]
    assert (data / "stale" / "old.txt").is_file() and not (data / "levels" / "gone__seed=9").exists()
    assert sorted(p.name for p in (data / "levels" / run.name).iterdir()) == sorted(make_results.RUN_FILES)
    assert filecmp.cmp(data / "levels" / run.name / "metrics.jsonl", run / "metrics.jsonl", shallow=False)
    assert not (data / "levels" / "level=prompt__seed=3" / sweep.STATUS_FILE).exists()  # cut off: stays unfinished
    # The collapse runs have no checkpoint: their figure data says so, and the page draws none.
    figure_data = json.loads((data / "collapse" / make_results.MODEL_FIGURES_FILE).read_text())
    assert figure_data["rv_histogram"] is None and "no checkpoint" in figure_data["heatmaps"]["why_not"]
    # The command line collects again, then writes the page from the committed data; the page and figures
    # from the run directories are the same, byte for byte.
    from_data = tmp_path / "from_data" / "results.md"
    make_results.main(["--collect", str(sweeps), "--sweeps", str(data), "--out", str(from_data)])
    from_sweeps = tmp_path / "from_sweeps" / "results.md"
    make_results.write_results(sweeps, from_sweeps, from_sweeps.parent / "figures")
    text = from_data.read_text()
    assert text == from_sweeps.read_text() and str(tmp_path) not in text
    assert "No heatmaps: filter=none__seed=0 has fewer than two evaluations' sampled episodes" in text
    figures = [p.name for p in (from_sweeps.parent / "figures").iterdir()]
    match, mismatch, errors = filecmp.cmpfiles(from_sweeps.parent / "figures", from_data.parent / "figures", figures,
                                               shallow=False)
    assert (mismatch, errors) == ([], []) and len(match) >= 5
    with pytest.raises(ValueError, match="into itself"):
        make_results.collect(data, data)


def test_committed_data_gives_docs_results_md(tmp_path):
    """docs/results.md is exactly what the committed data gives, on any machine and without a checkpoint.

    After new sweeps: `python scripts/make_results.py --collect`, and commit results/runs/ and docs/."""
    data = REPO / make_results.DATA_DIR
    assert any(data.glob(f"*/{sweep.GRID_FILE}")), (
        f"no committed run data in {data}: run the sweeps, then python scripts/make_results.py --collect")
    out = tmp_path / "results.md"
    make_results.write_results(data, out, tmp_path / "figures")
    made, committed = out.read_bytes(), (REPO / "docs" / "results.md").read_bytes()
    diff = difflib.unified_diff(committed.decode().splitlines(True), made.decode().splitlines(True),
                                "docs/results.md", "from the committed data")
    assert made == committed, (f"docs/results.md is not what {make_results.DATA_DIR}/ gives; "
                               f"python scripts/make_results.py rewrites it:\n{''.join(list(diff)[:80])}")
    links = [line.split("(")[1].rstrip(")") for line in made.decode().splitlines() if line.startswith("![")]
    assert all((tmp_path / link).is_file() for link in links)
