"""benchmarks/run_phases.py: per-phase means over the steps of several runs, read from their metrics.jsonl."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from ragen2.tracking import Tracker

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "run_phases.py"


def test_phases_are_averaged_over_every_step_of_every_run(tmp_path):
    spec = importlib.util.spec_from_file_location("run_phases", SCRIPT)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    for name, steps in {"a": [(10.0, 2.0, 1000.0), (14.0, None, 1200.0)], "b": [(30.0, 4.0, 900.0)]}.items():
        tracker = Tracker(tmp_path / name, {}, tensorboard=False)
        tracker.log(0, {"timing_s/evaluate": 7.0})
        for step, (total, collapse, memory) in enumerate(steps, start=1):
            phases = {"timing_s/step": total, "system/peak_memory_mb": memory}
            tracker.log(step, phases | ({"timing_s/collapse": collapse} if collapse else {}))
    table = bench.phase_table([tmp_path / "a", tmp_path / "b"])
    assert "2 runs, 3 training steps" in table
    # steps 10, 14, 30: mean 18, SE = std(ddof=1) / sqrt(3) = 10.583 / 1.732 = 6.1
    assert "| step | 3 | 18.0 | 6.1 |" in table
    assert "| collapse | 2 | 3.0 | 1.0 |" in table  # only the steps that ran a check
    assert "| evaluation | 2 | 7.0 | 0.0 |" in table
    assert "peak memory (largest over the steps of every run): 1200 MB" in table
