"""The run report: figures for the metrics a run logged, none for those it did not, and an HTML
page that references them; plus the metric glossary in docs/metrics.md that the keys follow."""

from __future__ import annotations

import fnmatch
import math
import re
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure
from matplotlib.image import imread

from ragen2.report import FIGURES, SUMMARY_KEYS, Metrics, write_report
from ragen2.tracking import Tracker, read_metrics

METRICS_DOC = Path(__file__).resolve().parents[1] / "docs" / "metrics.md"
ALL_FIGURES = {"reward", "success", "collapse", "entropy", "kl", "response_length", "filter", "grad_snr", "timing"}


def documented_metric_keys(path: Path = METRICS_DOC) -> set[str]:
    """Keys of docs/metrics.md: the backticked first cell of every table row (`{i}` kept as is)."""
    return set(re.findall(r"^\|\s*`([^`]+)`\s*\|", path.read_text(encoding="utf-8"), flags=re.MULTILINE))


def is_documented(key: str, documented: set[str]) -> bool:
    """Whether `key` is a documented key, reading `{i}` in a documented key as any bucket index."""
    return any(re.fullmatch(re.escape(doc).replace(r"\{i\}", r"\d+"), key) for doc in documented)


def _write_run(run_dir: Path, steps: int = 40, grad_snr: bool = True) -> None:
    """A run shaped like a real one: collapse proxies every 5 steps, evaluation every 10,
    a gradient-SNR probe at 10 and 20, an alarm and an early stop."""
    rng = np.random.default_rng(0)
    (run_dir / "config.yaml").parent.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text("algo:\n  name: grpo\nfilter:\n  value: 0.9\n")
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
                "timing_s/rollout": 3.0,
                "timing_s/generate": 2.2,
                "timing_s/update": 1.5,
                "timing_s/step": 5.0 + rng.uniform(0, 0.5),
            }
            if step == 1 or step % 5 == 0:
                for prefix, scale in (("collapse_first_turn", 1.0), ("collapse_trajectory", 0.7)):
                    m[f"{prefix}/retrieval_acc"] = scale * (1 - 0.8 * t)
                    m[f"{prefix}/mi_zscore_ema"] = scale * 3 * (1 - t)
                    m[f"{prefix}/chance_level"] = 0.125
            if step % 10 == 0:
                m["eval/success_rate"] = 0.7 * t
                m["eval/return_mean"] = 1.8 * t
            if grad_snr and step in (10, 20):
                for b in range(6):
                    m[f"grad_snr/bucket{b}/rv_mean"] = 0.05 * b
                    m[f"grad_snr/bucket{b}/task_norm"] = step / 10 * b
                    m[f"grad_snr/bucket{b}/kl_norm"] = 0.3
                    m[f"grad_snr/bucket{b}/entropy_norm"] = 0.2
            tracker.log(step, m)
        tracker.log_event("alarm", "MI-ZScore-EMA fell below 1", step=25)
        tracker.log_event("early_stop", "reward variance collapsed", step=steps)


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
    assert "<td>eval/success_rate</td><td class=n>0.7</td><td class=n>40</td>" in html
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
    spec = next(s for s in FIGURES if s.name == "grad_snr")
    fig = Figure()
    spec.draw(fig, Metrics(read_metrics(tmp_path)), [])
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
    assert (f"<td>{p}/retrieval_acc</td><td class=n>n/a (1 pair)</td><td class=n>10</td>"
            "<td class=n>0.75</td><td class=n>5</td>") in html
    assert f"<td>{p}/mi_zscore_ema</td><td class=n>n/a (1 pair)</td><td class=n>10</td>" in html
    fig = Figure()
    next(s for s in FIGURES if s.name == "collapse").draw(fig, Metrics(read_metrics(tmp_path)), [])
    lines = {line.get_label(): line for line in fig.axes[0].get_lines()}
    assert list(lines["first turn"].get_xdata()) == [5] and list(lines["first turn"].get_ydata()) == [0.75]
