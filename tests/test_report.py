"""The run report: figures and panels for the metrics a run logged, none for those it did not, and
an HTML page that references them; several runs overlaid; plus the metric glossary in
docs/metrics.md that the keys follow."""

from __future__ import annotations

import fnmatch
import importlib.util
import json
import math
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from matplotlib.container import BarContainer, ErrorbarContainer
from matplotlib.figure import Figure
from matplotlib.image import imread

from ragen2.cli import main
from ragen2.report import (
    FIGURES,
    SUMMARY_KEYS,
    Metrics,
    config_differences,
    default_out_dir,
    eval_success_stderr,
    generation_throughput,
    load_runs,
    moving_average,
    timing_stack,
    timing_top,
    write_report,
)
from ragen2.tracking import Tracker, read_metrics

ROOT = Path(__file__).resolve().parents[1]
METRICS_DOC = ROOT / "docs" / "metrics.md"
FILTER_RUNS = ROOT / "results" / "runs" / "filter_sokoban"  # committed runs of `ragen2 sweep`
ALL_FIGURES = {"reward", "success", "collapse", "entropy", "kl", "response_length", "filter", "loss", "grad_norm", "lr",
               "clipfrac", "approx_kl", "throughput", "grad_snr", "timing"}
_TRAJ = "collapse_trajectory"
CONFIG = "algo:\n  name: {algo}\nfilter:\n  value: 0.9\nrollout:\n  num_groups: 2\n  group_size: 4\n" \
         "trainer:\n  eval_episodes: 16\n"


def documented_metric_keys(path: Path = METRICS_DOC) -> set[str]:
    """Keys of docs/metrics.md: the backticked first cell of every table row (`{i}` kept as is)."""
    return set(re.findall(r"^\|\s*`([^`]+)`\s*\|", path.read_text(encoding="utf-8"), flags=re.MULTILINE))


def is_documented(key: str, documented: set[str]) -> bool:
    """Whether `key` is a documented key, reading `{i}` in a documented key as any bucket index."""
    return any(re.fullmatch(re.escape(doc).replace(r"\{i\}", r"\d+"), key) for doc in documented)


def _write_run(run_dir: Path, steps: int = 40, grad_snr: bool = True, algo: str = "grpo") -> None:
    """A run shaped like a real one: collapse proxies every 5 steps (2 distinct first prompts, 8 trajectory
    prompts), evaluation every 10 (16 episodes), a gradient-SNR probe at 10 and 20, an alarm and an early
    stop; PPO adds the value loss."""
    rng = np.random.default_rng(0)
    (run_dir / "config.yaml").parent.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(CONFIG.format(algo=algo))
    with Tracker(run_dir, {}, tensorboard=False) as tracker:
        for step in range(1, steps + 1):
            t = step / steps
            m = {
                "rollout/return_mean": 2 * t + rng.normal(0, 0.1),
                "rollout/return_std": 0.5,
                "rollout/success_rate": min(1.0, 0.8 * t + rng.uniform(0, 0.1)),
                "rollout/response_tokens_mean": 60 - 20 * t,
                "rollout/rv_mean": 0.3 * (1 - t) + 0.01,
                "rollout/frac_zero_variance": 0.5 * t,
                "filter/kept_ratio": 1 - 0.4 * t,
                "train/entropy": 1.2 + rng.normal(0, 0.02),
                "train/kl": 0.01 * step,
                "train/policy_loss": rng.normal(0, 0.1),
                "train/grad_norm": 1.0 + rng.uniform(0, 0.2),
                "train/lr": 1e-4 * min(1.0, step / 5),
                "train/clipfrac": 0.05 * t,
                "train/dual_clipfrac": 0.0,
                "train/approx_kl": 0.002 * t,
                "rollout/turns_mean": 3.0,
                "timing_s/rollout": 3.0,
                "timing_s/generate": 2.2,
                "timing_s/update": 1.5,
                "timing_s/step": 5.0 + rng.uniform(0, 0.5),
            }
            if algo == "ppo":
                m["train/value_loss"] = 2.0 - t
            if step == 1 or step % 5 == 0:
                for prefix, scale, inputs in (("collapse_first_turn", 1.0, 2), ("collapse_trajectory", 0.7, 8)):
                    m[f"{prefix}/retrieval_acc"] = scale * (1 - 0.8 * t)
                    m[f"{prefix}/mi_zscore_ema"] = scale * 3 * (1 - t)
                    m[f"{prefix}/num_distinct_inputs"] = inputs
                    m[f"{prefix}/chance_level"] = 1 / inputs
            if step % 10 == 0:
                m["eval/success_rate"] = 0.7 * t
                m["eval/return_mean"] = 1.8 * t
                m["eval/episodes"] = 16
            if grad_snr and step in (10, 20):
                for b in range(6):
                    m[f"grad_snr/bucket{b}/rv_mean"] = 0.05 * b
                    m[f"grad_snr/bucket{b}/task_norm"] = step / 10 * b
                    m[f"grad_snr/bucket{b}/kl_norm"] = 0.3
                    m[f"grad_snr/bucket{b}/entropy_norm"] = 0.2
            tracker.log(step, m)
        tracker.log_event("alarm", "MI-ZScore-EMA fell below 1", step=25)
        tracker.log_event("early_stop", "reward variance collapsed", step=steps)


def _draw(name: str, run_dirs: list[Path], smooth: int = 0) -> Figure:
    """Figure `name` of these runs, drawn the way `write_report` draws it."""
    fig = Figure(layout="constrained")
    next(s for s in FIGURES if s.name == name).draw(fig, load_runs(run_dirs), smooth)
    return fig


def _labelled(ax) -> list[str]:
    """Labels of the lines of `ax` that have a legend entry, in drawing order (event lines left out)."""
    return [label for line in ax.get_lines() if not (label := line.get_label()).startswith(("_", "event: "))]


def test_report_draws_every_figure_and_references_them(tmp_path: Path) -> None:
    _write_run(tmp_path)
    html_path = write_report(tmp_path)

    assert html_path == tmp_path / "report.html"
    html = html_path.read_text()
    assert {p.stem for p in (tmp_path / "figures").glob("*.png")} == ALL_FIGURES
    for name in ALL_FIGURES:
        assert f'src="figures/{name}.png"' in html
        height, width, _ = imread(tmp_path / "figures" / f"{name}.png").shape
        assert width >= 600 and height >= 300
    assert "Not drawn" not in html
    assert re.search(r'<figure><img src="figures/(\w+)\.png"', html).group(1) == "success"  # the first figure
    assert ("<td>eval/success_rate</td><td class=n>0.175</td><td class=n>10</td><td class=n>0.7</td>"
            "<td class=n>40</td>") in html
    assert "MI-ZScore-EMA fell below 1" in html and "early_stop" in html
    assert "name: grpo" in html


def test_figures_without_metrics_are_skipped_and_listed(tmp_path: Path) -> None:
    with Tracker(tmp_path, {}, tensorboard=False) as tracker:
        for step in range(1, 4):
            tracker.log(step, {"rollout/return_mean": step, "train/entropy": 1.0, "train/kl": math.nan})
    (tmp_path / "figures").mkdir()
    (tmp_path / "figures" / "kl.png").write_bytes(b"left over from an older report")

    html = write_report(tmp_path).read_text()

    assert {p.stem for p in (tmp_path / "figures").glob("*.png")} == {"reward", "entropy"}
    assert "Not drawn" in html
    for key in ("train/kl", "rollout/success_rate", "grad_snr/bucket*/task_norm", "timing_s/*"):
        assert f"<code>{key}</code>" in html
    assert "figures/kl.png" not in html and "figures/grad_snr.png" not in html
    assert "<h2>Config</h2>" not in html and "<h2>Events</h2>" not in html


def test_grad_snr_figure_shows_the_latest_probe(tmp_path: Path) -> None:
    _write_run(tmp_path, steps=25)
    fig = _draw("grad_snr", [tmp_path])
    (ax,) = fig.axes
    task, kl, entropy = ax.containers
    assert [bar.get_height() for bar in task] == [2.0 * b for b in range(6)]  # the step-20 probe
    assert [bar.get_height() for bar in kl] == [0.3] * 6
    assert [bar.get_height() for bar in entropy] == [0.2] * 6
    assert "step 20" in ax.get_title()


def test_every_metric_the_report_reads_is_documented() -> None:
    documented = documented_metric_keys()
    assert len(documented) > 60 and "grad_snr/bucket{i}/task_norm" in documented
    assert is_documented("grad_snr/bucket3/kl_norm", documented)
    assert not is_documented("train/not_a_metric", documented)
    read = set(SUMMARY_KEYS) | {key for spec in FIGURES for key in spec.keys}
    for key in read:
        assert any(fnmatch.fnmatchcase(doc, key) for doc in documented), f"{key} is not in docs/metrics.md"


def test_checks_without_proxies_are_skipped_and_summarised_as_na(tmp_path: Path) -> None:
    """A check with one pair logs num_pairs but no retrieval_acc / mi_zscore_ema (absent, or NaN -> null):
    the figure skips that point, the summary says n/a with the pair count at that step."""
    p = "collapse_first_turn"
    with Tracker(tmp_path, {}, tensorboard=False) as tracker:
        tracker.log(1, {f"{p}/num_pairs": 1, f"{p}/chance_level": 0.5, f"{p}/cond_entropy": 2.0})
        tracker.log(5, {f"{p}/num_pairs": 8, f"{p}/retrieval_acc": 0.75, f"{p}/mi_zscore_ema": 0.5,
                        f"{p}/chance_level": 0.5})
        tracker.log(10, {f"{p}/num_pairs": 1, f"{p}/retrieval_acc": math.nan, f"{p}/mi_zscore_ema": math.nan,
                         f"{p}/chance_level": 0.5})
    html = write_report(tmp_path).read_text()
    assert (f"<td>{p}/retrieval_acc</td><td class=n>n/a (1 pair)</td><td class=n>1</td>"
            "<td class=n>n/a (1 pair)</td><td class=n>10</td><td class=n>0.75</td><td class=n>5</td>") in html
    assert f"<td>{p}/mi_zscore_ema</td><td class=n>n/a (1 pair)</td><td class=n>1</td>" in html
    lines = {line.get_label(): line for line in _draw("collapse", [tmp_path]).axes[0].get_lines()}
    assert list(lines["first turn"].get_xdata()) == [5] and list(lines["first turn"].get_ydata()) == [0.75]


def test_panels_exist_for_the_metrics_logged(tmp_path: Path) -> None:
    """GRPO logs no value loss: the loss figure has the policy panel only; PPO adds the value panel.
    A run without the optimiser's metrics gets none of those figures."""
    _write_run(tmp_path / "grpo", steps=12, grad_snr=False)
    _write_run(tmp_path / "ppo", steps=12, grad_snr=False, algo="ppo")
    assert [ax.get_ylabel() for ax in _draw("loss", [tmp_path / "grpo"]).axes] == ["policy loss"]
    assert [ax.get_ylabel() for ax in _draw("loss", [tmp_path / "ppo"]).axes] == ["policy loss", "value loss"]
    assert [ax.get_ylabel() for ax in _draw("loss", [tmp_path / "grpo", tmp_path / "ppo"]).axes] == [
        "policy loss", "value loss"]
    (clip,) = _draw("clipfrac", [tmp_path / "grpo"]).axes
    assert _labelled(clip) == ["ratio clipped", "dual clip"]

    with Tracker(tmp_path / "bare", {}, tensorboard=False) as tracker:
        tracker.log(1, {"rollout/return_mean": 1.0, "timing_s/step": 2.0})
    html = write_report(tmp_path / "bare").read_text()
    assert {p.stem for p in (tmp_path / "bare" / "figures").glob("*.png")} == {"reward", "timing"}
    for key in ("train/policy_loss", "train/grad_norm", "train/lr", "train/clipfrac", "train/approx_kl",
                "timing_s/generate"):
        assert f"<code>{key}</code>" in html


def test_eval_error_bars_are_binomial_standard_errors(tmp_path: Path) -> None:
    """n is the step's eval/episodes, else trainer.eval_episodes from config.yaml; the figure's bars span ± SE."""
    (tmp_path / "config.yaml").write_text("trainer:\n  eval_episodes: 4\n")
    with Tracker(tmp_path, {}, tensorboard=False) as tracker:
        tracker.log(0, {"eval/success_rate": 0.25, "eval/episodes": 16})
        tracker.log(5, {"eval/success_rate": 0.5})  # no episode count: the config's 4
        tracker.log(10, {"eval/success_rate": 1.0, "eval/episodes": 16})
    (run,) = load_runs([tmp_path])
    expected = [math.sqrt(0.25 * 0.75 / 16), 0.25, 0.0]
    assert eval_success_stderr(run) == pytest.approx(expected)

    (ax,) = _draw("success", [tmp_path]).axes
    (bars,) = [c for c in ax.containers if isinstance(c, ErrorbarContainer)]
    assert bars.get_label() == "eval (held-out seeds) ± SE"
    segments = bars.lines[2][0].get_segments()
    assert [seg[1][1] - seg[0][1] for seg in segments] == pytest.approx([2 * e for e in expected])

    (tmp_path / "config.yaml").unlink()
    (run,) = load_runs([tmp_path])
    assert np.isnan(eval_success_stderr(run)[1])  # no n at step 5: no bar there, not a bar of 0


def test_first_figure_and_summary_say_whether_held_out_success_rose(tmp_path: Path) -> None:
    """0.25 -> 0.75 over 16 episodes: SE 0.108 each, d = 0.5 ± 0.153, 3.3 SE; step 5's episode count comes
    from config.yaml. The summary table has the CLI table's first column."""
    (tmp_path / "config.yaml").write_text("trainer:\n  eval_episodes: 16\n")
    with Tracker(tmp_path, {}, tensorboard=False) as tracker:
        tracker.log(0, {"eval/success_rate": 0.25, "eval/episodes": 16})
        tracker.log(5, {"eval/success_rate": 0.5, "rollout/success_rate": 0.4})
        tracker.log(10, {"eval/success_rate": 0.75})
    line = "held-out success, step 0 → 10: 0.250 → 0.750: learned: +0.500 ± 0.153 (3.3 SE)"
    assert FIGURES[0].name == "success"
    (ax,) = _draw("success", [tmp_path]).axes
    assert ax.get_title() == f"Success rate\n{line}"
    html = write_report(tmp_path).read_text()
    assert f"<h2>Summary</h2>\n<p>{line}</p>" in html
    assert "<th>metric</th><th>first</th><th>at step</th><th>last</th><th>at step</th><th>max</th>" in html
    assert ("<td>eval/success_rate</td><td class=n>0.25</td><td class=n>0</td><td class=n>0.75</td>"
            "<td class=n>10</td><td class=n>0.75</td><td class=n>10</td>") in html

    with Tracker(tmp_path / "once", {}, tensorboard=False) as tracker:
        tracker.log(0, {"eval/success_rate": 0.25, "eval/episodes": 16})
    (ax,) = _draw("success", [tmp_path / "once"]).axes
    assert ax.get_title() == "Success rate"  # one evaluation: nothing to compare
    (ax,) = _draw("success", [tmp_path, tmp_path / "once"]).axes
    heading, verdicts = ax.get_title().split("\n", 1)
    assert heading == "Success rate" and verdicts.replace("\n", " ") == f"{tmp_path.name}: {line}"  # may wrap


def test_eval_error_bars_match_what_the_trainer_logged() -> None:
    """On committed runs of the trainer, the report's SE equals the logged eval/success_stderr."""
    (run,) = load_runs([FILTER_RUNS / "algo.name=grpo__filter=none__seed=0"])
    steps, logged = run.metrics.series("eval/success_stderr")
    assert len(steps) == 5 and eval_success_stderr(run) == pytest.approx(logged)


def test_overlay_of_two_committed_runs(tmp_path: Path) -> None:
    """Filter against no filter: one report, one line per run in each line panel, labelled by run
    directory; the timing figure has a panel per run; the page names the config keys that differ."""
    runs = [FILTER_RUNS / "algo.name=ppo__filter=none__seed=0", FILTER_RUNS / "algo.name=ppo__filter=paper__seed=0"]
    names = [r.name for r in runs]
    html = write_report(runs, tmp_path / "overlay").read_text()

    drawn = {p.stem for p in (tmp_path / "overlay" / "figures").glob("*.png")}
    assert drawn == ALL_FIGURES - {"kl", "grad_snr"}  # the sweep ran without a KL term or a probe
    assert not any((r / "report.html").exists() or (r / "figures").exists() for r in runs)
    for name in ("entropy", "grad_norm", "lr", "approx_kl", "throughput", "response_length"):
        (ax,) = _draw(name, runs).axes
        assert _labelled(ax) == names, name
        assert [line.get_color() for line in ax.get_lines()] == ["C0", "C1"], name
    loss = _draw("loss", runs)
    assert [_labelled(ax) for ax in loss.axes] == [names, names]
    (success,) = _draw("success", runs).axes
    assert len([c for c in success.containers if isinstance(c, ErrorbarContainer)]) == 2
    assert _labelled(success) == [*names, "rollout (training episodes)", "eval (held-out seeds) ± SE"]
    assert [ax.get_title() for ax in _draw("timing", runs).axes] == [f"Time per phase: {n}" for n in names]

    assert config_differences(load_runs(runs)) == {"filter.include_zero": [True, False],
                                                   "filter.strategy": ["none", "top_p"]}
    assert "<h3>Config keys that differ</h3>" in html and "<code>&quot;top_p&quot;</code>" in html
    assert html.count("<th colspan=3>") == 2  # one summary table, a column triple per run
    assert html.count("<th>first (step)</th><th>last (step)</th><th>max (step)</th>") == 2
    assert "Sample trajectories" not in html  # the committed runs keep no rollouts


def test_overlaid_evaluations_are_markers_not_lines() -> None:
    """Each run's evaluations are diamonds with error bars, not joined by a line that would read as another
    curve in the run's colour; the legend's gray key for them is a marker without a line."""
    runs = [FILTER_RUNS / "algo.name=ppo__filter=none__seed=0", FILTER_RUNS / "algo.name=ppo__filter=paper__seed=0"]
    for name in ("success", "collapse"):
        ax = _draw(name, runs).axes[-1]
        bars = [c for c in ax.containers if isinstance(c, ErrorbarContainer)]
        assert [(c.lines[0].get_linestyle(), c.lines[0].get_marker()) for c in bars] == [("None", "D")] * 2, name
        (key,) = [h for h, label in zip(*ax.get_legend_handles_labels()) if label.startswith("eval")]
        assert (key.get_linestyle(), key.get_marker()) == ("None", "D"), name


def test_constant_series_show_their_value(tmp_path: Path) -> None:
    """A learning rate that holds at 1e-4 up to float rounding is drawn at 1e-4 ± 10% with no tick offset
    (not "1e−16+1e−4" over ticks −1..1), alone and overlaid; a warm-up keeps its autoscaled range."""
    for name in ("a", "b"):
        with Tracker(tmp_path / name, {}, tensorboard=False) as tracker:
            for step in range(1, 6):
                tracker.log(step, {"train/lr": 1e-4 + (1e-16 if step % 2 else -5e-17)})
    for dirs in ([tmp_path / "a"], [tmp_path / "a", tmp_path / "b"]):
        fig = _draw("lr", dirs)
        (ax,) = fig.axes
        fig.draw_without_rendering()
        assert not ax.yaxis.get_major_formatter().get_useOffset()
        assert ax.yaxis.get_offset_text().get_text() == ""
        assert ax.get_ylim() == pytest.approx((0.9e-4, 1.1e-4))
    _write_run(tmp_path / "warmup", steps=10, grad_snr=False)  # 2e-5 to 1e-4 over 5 steps
    (ax,) = _draw("lr", [tmp_path / "warmup"]).axes
    assert ax.get_ylim()[0] < 2e-5 < 1e-4 < ax.get_ylim()[1] < 1.1e-4


def test_retrieval_panel_draws_each_schemes_chance_level(tmp_path: Path) -> None:
    """Chance is 1/N over the N distinct inputs a check scored: dashed lines at 1/2 (first turn) and 1/8
    (trajectory), in the colours of their curves and labelled; overlaid runs that share a level label it
    once; an N that changes between checks is drawn as steps and labelled with its range."""
    _write_run(tmp_path / "a", steps=10, grad_snr=False)
    _write_run(tmp_path / "b", steps=10, grad_snr=False)
    (run,) = load_runs([tmp_path / "a"])
    logged = [run.metrics.series(f"{p}/num_distinct_inputs")[1][0] for p in ("collapse_first_turn", _TRAJ)]
    assert logged == [2, 8]

    def chance_lines(ax) -> list[tuple[float, str]]:
        return [(float(line.get_ydata()[0]), line.get_color()) for line in ax.get_lines()
                if line.get_linestyle() == "--" and len(set(line.get_ydata())) == 1]  # not the events' axvlines

    ax = _draw("collapse", [tmp_path / "a"]).axes[0]
    assert chance_lines(ax) == [(1 / 2, "C0"), (1 / 8, "C1")]
    assert [t.get_text() for t in ax.texts] == ["chance 1/2 (first turn)", "chance 1/8 (trajectory)"]
    ax = _draw("collapse", [tmp_path / "a", tmp_path / "b"]).axes[0]
    assert chance_lines(ax) == [(1 / 2, "C0"), (1 / 8, "C0"), (1 / 2, "C1"), (1 / 8, "C1")]
    assert [t.get_text() for t in ax.texts] == ["chance 1/2 (first turn)", "chance 1/8 (trajectory)"]

    with Tracker(tmp_path / "varying", {}, tensorboard=False) as tracker:
        for step, inputs in ((1, 6), (5, 8)):  # identical prompts among the samples merge into one input
            tracker.log(step, {f"{_TRAJ}/retrieval_acc": 0.5, f"{_TRAJ}/chance_level": 1 / inputs})
    ax = _draw("collapse", [tmp_path / "varying"]).axes[0]
    (steps,) = [line for line in ax.get_lines() if line.get_drawstyle() == "steps-post"]
    assert list(steps.get_ydata()) == [1 / 6, 1 / 8] and steps.get_linestyle() == "--"
    assert [t.get_text() for t in ax.texts] == ["chance 1/N, N = 6 to 8 (trajectory)"]


def test_a_slow_step_runs_off_the_timing_scale(tmp_path: Path) -> None:
    """A 41 s first step among 4 s steps: the scale fits the 4 s steps (10% above them); the slow bar keeps
    its height, is cut at the top with its total written on it, and the title says so. Overlaid, both
    panels share that scale and only the slow run's panel names a cut bar."""
    with Tracker(tmp_path / "slow", {}, tensorboard=False) as tracker:
        for step in range(10):
            tracker.log(step, {"timing_s/rollout": 40.0 if step == 0 else 3.0, "timing_s/update": 1.0})
    assert timing_top(np.array([41.0] + [4.0] * 9)) == pytest.approx(4.4)
    assert timing_top(np.array([4.0, 5.0, 9.0])) == pytest.approx(9.9)  # under 3 × the median: nothing cut
    (ax,) = _draw("timing", [tmp_path / "slow"]).axes
    assert ax.get_ylim() == pytest.approx((0.0, 4.4))
    rollout = next(c for c in ax.containers if c.get_label() == "rollout")
    assert rollout[0].get_height() == 40.0
    assert [t.get_text() for t in ax.texts] == ["41 s"]
    assert ax.get_title() == "Time per phase\nstep 0: 41 s, off scale"

    _write_run(tmp_path / "steady", steps=10, grad_snr=False)  # 5 to 5.5 s a step
    slow, steady = _draw("timing", [tmp_path / "slow", tmp_path / "steady"]).axes
    assert slow.get_ylim() == steady.get_ylim() and 5.5 < slow.get_ylim()[1] < 41
    assert slow.get_title().endswith("step 0: 41 s, off scale") and [t.get_text() for t in slow.texts] == ["41 s"]
    assert steady.get_title() == "Time per phase: steady" and not steady.texts


def test_moving_average_by_hand(tmp_path: Path) -> None:
    assert list(moving_average(np.array([1.0, 2, 3, 4, 5, 6]), 3)) == [1.0, 1.5, 2.0, 3.0, 4.0, 5.0]
    assert list(moving_average(np.array([4.0, 0, 8]), 1)) == [4.0, 0.0, 8.0]
    with Tracker(tmp_path, {}, tensorboard=False) as tracker:
        for step, value in enumerate([1.0, 2, 3, 4, 5, 6], start=1):
            tracker.log(step, {"train/grad_norm": value})
    (ax,) = _draw("grad_norm", [tmp_path], smooth=3).axes
    raw, smoothed = ax.get_lines()
    assert list(raw.get_ydata()) == [1, 2, 3, 4, 5, 6] and raw.get_alpha() == 0.25 and raw.get_label().startswith("_")
    assert list(smoothed.get_ydata()) == [1.0, 1.5, 2.0, 3.0, 4.0, 5.0]
    assert smoothed.get_label() == "actor, before clipping"
    assert "moving averages over the last 3 logged points" in write_report(tmp_path, smooth=3).read_text()
    with pytest.raises(ValueError, match="smooth"):
        write_report(tmp_path, smooth=-1)


def test_timing_bars_stack_the_phases(tmp_path: Path) -> None:
    """Each step's bar is its phases stacked: generate under the rest of the rollout, then the other
    phases in the order a step runs them; a phase run every few steps is a segment at those steps only."""
    with Tracker(tmp_path, {}, tensorboard=False) as tracker:
        tracker.log(0, {"timing_s/evaluate": 4.0})
        tracker.log(1, {"timing_s/rollout": 3.0, "timing_s/generate": 2.0, "timing_s/update": 1.5,
                        "timing_s/collapse": 0.5, "timing_s/step": 5.0})
        tracker.log(2, {"timing_s/rollout": 2.5, "timing_s/generate": 2.0, "timing_s/update": 1.0,
                        "timing_s/evaluate": 4.0, "timing_s/step": 9.0})  # 1.5 s no phase accounts for
    steps, stack = timing_stack(Metrics(read_metrics(tmp_path)))
    assert list(steps) == [0, 1, 2]
    assert list(stack) == ["generate", "rollout (excl. generate)", "collapse", "update", "evaluate",
                           "other (step − phases)"]
    (ax,) = _draw("timing", [tmp_path]).axes
    bars = {c.get_label(): c for c in ax.containers if isinstance(c, BarContainer)}
    assert list(bars) == list(stack)
    heights = {name: {int(b.get_x() + b.get_width() / 2 + 0.5): b.get_height() for b in c} for name, c in bars.items()}
    assert heights == {"generate": {1: 2.0, 2: 2.0}, "rollout (excl. generate)": {1: 1.0, 2: 0.5},
                       "collapse": {1: 0.5}, "update": {1: 1.5, 2: 1.0}, "evaluate": {0: 4.0, 2: 4.0},
                       "other (step − phases)": {2: 1.5}}
    tops = {}
    for container in bars.values():
        for b in container:
            step = int(b.get_x() + b.get_width() / 2 + 0.5)
            assert b.get_y() == pytest.approx(tops.get(step, 0.0))  # each segment sits on the one below
            tops[step] = b.get_y() + b.get_height()
    assert tops == pytest.approx({0: 4.0, 1: 5.0, 2: 9.0})


def test_throughput_by_hand(tmp_path: Path) -> None:
    """Tokens per turn × turns × P × G over the generation time: 10 × 3 × 2 × 4 / 2 s = 120 tokens/s."""
    (tmp_path / "config.yaml").write_text(CONFIG.format(algo="grpo"))
    with Tracker(tmp_path, {}, tensorboard=False) as tracker:
        tracker.log(1, {"rollout/response_tokens_mean": 10, "rollout/turns_mean": 3, "timing_s/generate": 2.0})
        tracker.log(2, {"rollout/response_tokens_mean": 5, "rollout/turns_mean": 2})  # no generation time
    steps, values = generation_throughput(load_runs([tmp_path])[0])
    assert list(steps) == [1] and list(values) == [120.0]
    (tmp_path / "config.yaml").unlink()  # no P and G: no throughput figure, and the page says what it needed
    html = write_report(tmp_path).read_text()
    assert not (tmp_path / "figures" / "throughput.png").exists()
    assert "rollout.num_groups and rollout.group_size in config.yaml" in html


def _write_rollouts(run_dir: Path, step: int, text: str) -> None:
    """Two turns of one episode in the trainer's rollout-record format (`write_rollout_records`)."""
    first = f"<sys>Turn 1: {text}<think>"
    records = [
        {"group": 7, "prompt": first, "reasoning": "r0", "response": "r0</think><answer>Up</answer>",
         "reward": -0.1, "episode": 0, "turn": 0},
        {"group": 7, "prompt": first + "r0</think><answer>Up</answer><end>Turn 2: box moved<think>",
         "reasoning": "r1", "response": "r1</think><answer>Left</answer>", "reward": 10.9, "episode": 0, "turn": 1},
    ]
    (run_dir / "rollouts").mkdir(parents=True, exist_ok=True)
    (run_dir / "rollouts" / f"step_{step}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def test_sample_trajectories_are_escaped_and_collapsible(tmp_path: Path) -> None:
    """The first and the last evaluation's episodes, each a <details>; a turn shows only what its
    context added since the turn before; every text is escaped."""
    with Tracker(tmp_path, {}, tensorboard=False) as tracker:
        tracker.log(1, {"train/entropy": 1.0})
    for step in (0, 10, 20):
        _write_rollouts(tmp_path, step, f"<script>alert({step})</script>")
    html = write_report(tmp_path).read_text()
    assert "<script>" not in html and "&lt;script&gt;alert(0)&lt;/script&gt;" in html
    assert "alert(20)" in html and "alert(10)" not in html
    assert html.count("<details>") == 2
    assert "<summary>step 0, episode 0 (seed 7): 2 turns, return 10.8</summary>" in html
    assert "<pre>&lt;end&gt;Turn 2: box moved&lt;think&gt;</pre>" in html  # the new part of turn 1's context
    assert "<pre class=response>r1&lt;/think&gt;&lt;answer&gt;Left&lt;/answer&gt;</pre>" in html


def test_report_cli_overlays_runs_where_asked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    """`ragen2 report A B` writes report-A-vs-B/ in the working directory; --out elsewhere; a missing
    run among several fails on that one, with the one-run message."""
    for name in ("a", "b"):  # two metrics only, so that the report draws two figures, not all of them
        with Tracker(tmp_path / "runs" / name, {}, tensorboard=False) as tracker:
            for step in range(1, 4):
                tracker.log(step, {"train/policy_loss": 0.1 * step, "train/value_loss": 1.0 / step})
    monkeypatch.chdir(tmp_path)
    assert main(["report", "runs/a", "runs/b", "--smooth", "2"]) == 0
    assert capsys.readouterr().out.strip() == "wrote report-a-vs-b/report.html"
    html = (tmp_path / "report-a-vs-b" / "report.html").read_text()
    assert "ragen2 report: a vs b" in html and (tmp_path / "report-a-vs-b" / "figures" / "loss.png").is_file()
    assert not (tmp_path / "runs" / "a" / "report.html").exists()

    assert main(["report", "runs/a", "runs/b", "--out", "cmp"]) == 0
    assert (tmp_path / "cmp" / "report.html").is_file()
    assert default_out_dir([Path("runs/a"), Path("runs/b"), Path("x/c")]) == Path("report-a-vs-b-and-1-more")
    assert default_out_dir([Path("runs/a")]) == Path("runs/a")

    assert main(["report", "runs/a", "runs/nope"]) == 2
    assert "ragen2 report runs/nope: no such directory" in capsys.readouterr().err
    assert main(["report", "runs/a", "--smooth", "-1"]) == 2
    assert "--smooth -1" in capsys.readouterr().err


def _screenshot_module():
    spec = importlib.util.spec_from_file_location("screenshot_report", ROOT / "scripts" / "screenshot_report.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _needs_chromium(shot) -> None:
    """Skip where no Chromium is installed, except under CI (env CI set), where `.ci/run` installs it:
    there a missing browser means the page went unchecked, and that fails."""
    if any(shutil.which(b) for b in shot.BROWSERS):
        return
    if os.environ.get("CI", "").lower() not in ("", "0", "false"):
        pytest.fail(f"CI={os.environ['CI']} but no Chromium on PATH (tried {', '.join(shot.BROWSERS)}): "
                    ".ci/run should have installed it")
    pytest.skip("no Chromium here: the page itself is not rendered")


def test_screenshot_crops_the_blank_rows_below_the_page(tmp_path: Path) -> None:
    shot = _screenshot_module()
    image = Image.new("RGB", (100, 300), "white")
    image.paste((0, 0, 0), (10, 10, 40, 50))
    assert shot.crop_blank_bottom(image, margin=16).size == (100, 66)
    _needs_chromium(shot)
    with Tracker(tmp_path / "run", {}, tensorboard=False) as tracker:
        tracker.log(1, {"train/grad_norm": 1.0})
    page = write_report(tmp_path / "run")
    argv = [str(page), str(tmp_path / "shot.png"), "--width", "800", "--height", "3000", "--scale", "0.5"]
    assert shot.main(argv) == 0
    rendered = Image.open(tmp_path / "shot.png")
    assert rendered.width == 400 and 100 < rendered.height < 1500  # the page's end, not the window's


def test_report_page_loads_in_chromium(tmp_path: Path) -> None:
    """The report of a real run (a committed `ragen2 sweep` run, plus sample trajectories whose text is a
    throwing script) opened in headless Chromium: every figure loads and no script fails or logs an error
    (`page_problems` of scripts/screenshot_report.py, which a probe injected into a copy of the page answers).

    The check can fail, and the test then shows it on a copy of the page: one figure pointed at a missing
    file, one figure's PNG truncated to a few bytes and a script that throws give exactly those three
    problems. Tried by breaking the code: `draw_figures` saving the loss figure under another name failed
    the first assertion with "img did not load: figures/loss.png"; a `<script>` calling an undefined
    function appended to the page failed it with "script error: Uncaught ReferenceError: ..."; sample texts
    left unescaped ran their script and failed it too; with the probe's image check removed, the broken
    copy's two figures went unreported and the last assertion failed."""
    shot = _screenshot_module()
    _needs_chromium(shot)
    run = tmp_path / "run"
    shutil.copytree(FILTER_RUNS / "algo.name=grpo__filter=none__seed=0", run)
    for step in (0, 10):
        _write_rollouts(run, step, '<script>throw new Error("a sample text ran as a script")</script>')
    page = write_report(run)
    figures = re.findall(r'<img src="figures/(\w+)\.png"', page.read_text())
    assert len(figures) >= 10 and "Sample trajectories" in page.read_text()

    problems = shot.page_problems(page)
    assert problems == [], problems

    broken = run / "broken.html"
    (run / "figures" / "truncated.png").write_bytes((run / "figures" / f"{figures[1]}.png").read_bytes()[:40])
    broken.write_text(page.read_text()
                      .replace(f"figures/{figures[0]}.png", "figures/missing.png")
                      .replace(f"figures/{figures[1]}.png", "figures/truncated.png")
                      .replace("</body>", '<script>undefined_function()</script></body>'))
    problems = shot.page_problems(broken)
    assert sorted(re.sub(r" \(line \d+\)$", "", p) for p in problems) == [
        "img did not load: figures/missing.png", "img did not load: figures/truncated.png",
        "script error: Uncaught ReferenceError: undefined_function is not defined"], problems


def _write_mixture_run(run_dir: Path, scale: float) -> None:
    """Two training tags and one evaluation-only tag (out of distribution), evaluated at steps 0 and 4."""
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text(CONFIG.format(algo="grpo"))
    with Tracker(run_dir, {}, tensorboard=False) as tracker:
        for step in range(5):
            m = {} if step == 0 else {"rollout/success_rate": 0.1 * step, "rollout/sokoban/success_rate": 0.1 * step,
                                      "rollout/bandit/success_rate": scale, "filter/sokoban/kept_ratio": 0.5,
                                      "filter/bandit/kept_ratio": 1.0, "collapse_first_turn/bandit/retrieval_acc": 0.9}
            if step in (0, 4):
                m |= {"eval/success_rate": 0.3, "eval/sokoban/success_rate": 0.2, "eval/bandit/success_rate": scale,
                      "eval/sokoban-8x8/success_rate": 0.05 * step, "collapse_eval/sokoban-8x8/retrieval_acc": 0.5}
            tracker.log(step, m)


def test_report_overlays_a_mixtures_tags_in_their_own_colours(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    _write_mixture_run(a, 0.5)
    _write_mixture_run(b, 0.75)
    write_report([a, b], tmp_path / "out")
    assert (tmp_path / "out" / "figures" / "tags.png").is_file()
    success, retrieval, kept = _draw("tags", [a, b]).axes
    lines = {(line.get_color(), line.get_linestyle(), line.get_marker()): line.get_ydata().tolist()
             for line in success.get_lines() if len(line.get_xdata())}
    # Training tags by name, bandit C0 and sokoban C1, then sokoban-8x8 C2 (held out: diamonds only); a solid, b dashed.
    assert lines[("C0", "-", "o")] == [0.5] * 4 and lines[("C0", "--", "o")] == [0.75] * 4
    assert lines[("C2", "None", "D")] == [0.0, 0.2]
    assert not any(color == "C2" and marker != "D" for color, _, marker in lines)
    assert {"sokoban", "bandit", "sokoban-8x8", "a", "b"} <= set(success.get_legend_handles_labels()[1])
    assert [line.get_ydata().tolist() for line in kept.get_lines() if line.get_color() == "C1"][0] == [0.5] * 4
    assert retrieval.get_ylabel() == "Retrieval-Acc (first turn)"
    held_out = [line.get_ydata().tolist() for line in retrieval.get_lines() if line.get_color() == "C2"]
    assert held_out == [[0.5, 0.5], [0.5, 0.5]]  # the variant's held-out Retrieval-Acc, diamonds of both runs


def test_memory_runs_get_a_panel_of_their_notes(tmp_path: Path) -> None:
    """A run under rollout.memory=summary: the notes' Retrieval-Acc and MI-ZScore-EMA beside the reasoning's, the
    notes per episode and the prompt length, at the values logged. A run without notes has no such figure and
    does not list it as missing."""
    with Tracker(tmp_path / "notes", {}, tensorboard=False) as tracker:
        for step in (1, 5, 10):
            tracker.log(step, {"collapse_memory/num_pairs": 8, "collapse_memory/retrieval_acc": 0.1 * step,
                               "collapse_memory/chance_level": 0.125, "collapse_memory/mi_zscore_ema": 2.0 - 0.1 * step,
                               f"{_TRAJ}/retrieval_acc": 0.5, f"{_TRAJ}/mi_zscore_ema": 1.0,
                               "rollout/memory_turns_mean": 1.0, "rollout/memory_valid_rate": 0.75,
                               "rollout/prompt_tokens_mean": 250.0})
    retrieval, zscore, notes, prompt = _draw("memory", [tmp_path / "notes"]).axes
    lines = {line.get_label(): line for line in retrieval.get_lines()}
    assert list(lines["memory notes"].get_ydata()) == pytest.approx([0.1, 0.5, 1.0])
    assert list(lines["reasoning (trajectory)"].get_ydata()) == [0.5] * 3
    assert list({line.get_label(): line for line in zscore.get_lines()}["memory notes"].get_ydata()) == \
        pytest.approx([1.9, 1.5, 1.0])
    assert _labelled(notes) == ["notes per episode", "share of notes that parse"]
    assert list(prompt.get_lines()[0].get_ydata()) == [250.0] * 3
    html = write_report(tmp_path / "notes").read_text()
    assert 'src="figures/memory.png"' in html
    _write_run(tmp_path / "plain", steps=12, grad_snr=False)
    html = write_report(tmp_path / "plain").read_text()
    assert "memory.png" not in html and "collapse_memory" not in html
