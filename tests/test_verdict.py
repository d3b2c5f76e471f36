"""The start → end verdict that the summary table, the report and `ragen2 eval` print, on hand-computed numbers."""

from __future__ import annotations

import math

from ragen2.verdict import ROSE, VS_RANDOM, binomial_se, verdict


def test_binomial_standard_error_by_hand():
    assert binomial_se(0.25, 8) == math.sqrt(0.25 * 0.75 / 8)  # 0.153
    assert binomial_se(0.5, None) is None and binomial_se(0.5, 0) is None  # no count, no SE


def test_a_rise_beyond_three_standard_errors_is_learned():
    """0.25 and 0.46 over 100 episodes each: SE 0.0433 and 0.0498, SE(d) = √(0.001875 + 0.002484) = 0.0660,
    d = 0.21, z = 0.21 / 0.0660 = 3.18."""
    assert (verdict(0.25, binomial_se(0.25, 100), 0.46, binomial_se(0.46, 100))
            == "0.250 → 0.460: learned: +0.210 ± 0.066 (3.2 SE)")


def test_within_three_standard_errors_is_no_clear_change():
    # SE(d) = √(0.05² + 0.05²) = 0.0707, z = 0.1 / 0.0707 = 1.41
    assert verdict(0.5, 0.05, 0.6, 0.05) == "0.500 → 0.600: no clear change: +0.100 ± 0.071 (1.4 SE)"
    # Exactly 3 SE is not beyond it: d = 0.1875 = 3 x 0.0625 (all exact in binary).
    assert verdict(0.25, 0.0, 0.4375, 0.0625) == "0.250 → 0.438: no clear change: +0.188 ± 0.062 (3.0 SE)"


def test_a_fall_beyond_three_standard_errors_got_worse():
    # SE(d) = √(0.03² + 0.04²) = 0.05, z = -0.2 / 0.05 = -4
    assert verdict(0.8, 0.03, 0.6, 0.04) == "0.800 → 0.600: got worse: -0.200 ± 0.050 (-4.0 SE)"


def test_other_words_for_other_comparisons():
    # SE(d) = √(0.02² + 0.03²) = 0.0361, z = 0.3 / 0.0361 = 8.3
    assert verdict(0.1, 0.02, 0.4, 0.03, words=VS_RANDOM) == (
        "0.100 → 0.400: better than random: +0.300 ± 0.036 (8.3 SE)")
    assert verdict(0.6, 0.03, 0.4, 0.04, words=ROSE) == "0.600 → 0.400: fell: -0.200 ± 0.050 (-4.0 SE)"


def test_no_verdict_without_standard_errors_or_values():
    """MI-ZScore-EMA logs no spread: the change is shown, with no verdict rather than a made-up SE."""
    assert verdict(0.4, None, 0.1, None) == "0.400 → 0.100: changed by -0.300 ± n/a (no standard error, no verdict)"
    assert verdict(0.4, 0.1, 0.1, None) == "0.400 → 0.100: changed by -0.300 ± n/a (no standard error, no verdict)"
    assert verdict(0.625, 0.171, None, None) == "0.625 → n/a: no verdict without both values"
    assert verdict(math.nan, 0.1, 0.5, 0.1) == "n/a → 0.500: no verdict without both values"


def test_rates_of_zero_and_one_have_no_spread():
    """Binomial SEs are 0 at rates 0 and 1: any change is then infinitely many SE, no change is 0 SE."""
    assert verdict(0.0, 0.0, 1.0, 0.0) == "0.000 → 1.000: learned: +1.000 ± 0.000 (inf SE)"
    assert verdict(0.0, 0.0, 0.0, 0.0) == "0.000 → 0.000: no clear change: +0.000 ± 0.000 (0.0 SE)"
