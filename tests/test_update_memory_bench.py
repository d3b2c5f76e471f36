"""benchmarks/update_memory.py: the two sides of the loss pass agree on the loss and the gradient."""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "update_memory.py"


@pytest.mark.usefixtures("one_thread")
def test_both_sides_give_the_same_loss_and_gradient_on_the_tiny_policy():
    spec = importlib.util.spec_from_file_location("update_memory", SCRIPT)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    settings = dict(model=None, lora_rank=4, batch=2, tokens=64, response=20, repeats=1, threads=1, device="cpu",
                    gradient_checkpointing=False)
    separate, fused = (bench.one_side(argparse.Namespace(side=side, **settings)) for side in bench.SIDES)
    assert (separate["side"], fused["side"]) == ("separate", "fused")
    assert fused["loss"] == pytest.approx(separate["loss"], rel=1e-6)
    assert fused["grad_norm"] == pytest.approx(separate["grad_norm"], rel=1e-5)
    assert separate["grad_norm"] > 0
    assert separate["logits_mb"] == pytest.approx(2 * 20 * separate["vocab"] * 4 / 2**20)
