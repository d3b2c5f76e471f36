"""scripts/lemma_validation.py: the synthetic check of Lemma I.1 behaves as the lemma says."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "lemma_validation.py"


@pytest.fixture(scope="module")
def lemma():
    spec = importlib.util.spec_from_file_location("lemma_validation", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the script loads
    spec.loader.exec_module(module)
    return module


def test_template_mixing_lowers_mi_but_not_entropy(lemma):
    mixes = [0.0, 0.5, 1.0]
    rows = lemma.run_sweep(lemma.Setting(samples_per_input=32), mixes, seeds=[0, 1])
    none, half, full = rows
    assert none["retrieval_acc"] > 0.8 > half["retrieval_acc"] > full["retrieval_acc"]
    assert full["retrieval_acc"] == full["chance_level"] == 1 / 8  # every input scores alike: exact chance
    assert none["mi_seq_est"] > half["mi_seq_est"] > full["mi_seq_est"] == pytest.approx(0.0, abs=1e-12)
    assert half["mi_seq_est"] <= half["bound"]  # I_a <= (1 - a) I_0, with room to spare at T = 6
    # The entropy a policy reports does not fall: equal at the ends, higher in between.
    assert full["token_entropy"] == pytest.approx(none["token_entropy"])
    assert half["token_entropy"] > none["token_entropy"]
    assert half["cond_entropy"] > none["cond_entropy"] - 0.05


def test_writes_table_between_markers(lemma, tmp_path):
    doc = tmp_path / "diagnostics.md"
    doc.write_text(f"intro\n{lemma.BEGIN}\nold\n{lemma.END}\noutro\n")
    lemma.write_between_markers(str(doc), "| new |")
    assert doc.read_text() == f"intro\n{lemma.BEGIN}\n| new |\n{lemma.END}\noutro\n"
