"""Whether a rate moved: start → end with the standard error of the difference, and a one-line verdict.

A curve that ends higher may be noise. The end-of-run summary (`ragen2.rl.summary`), the report's first
figure (`ragen2.report`) and `ragen2 eval` (`ragen2.evaluate`) all say whether it is, the same way:
d = end − start, SE(d) = √(SE_start² + SE_end²) (the two measurements taken as independent), and the
change counts only beyond `THRESHOLD_SE` standard errors either way (docs/metrics.md).
"""

from __future__ import annotations

import math

# |d| / SE(d) above this is a change; 3 SE is also the bar of the learning tests (tests/rl/test_learning.py).
THRESHOLD_SE = 3.0

# (rose, within the threshold, fell): the words of a verdict.
Words = tuple[str, str, str]
LEARNED: Words = ("learned", "no clear change", "got worse")
ROSE: Words = ("rose", "no clear change", "fell")
VS_RANDOM: Words = ("better than random", "no clear difference from random", "worse than random")


def binomial_se(p: float, n: float | None) -> float | None:
    """√(p (1 − p) / n), the standard error of a rate over n independent trials; None without n."""
    return math.sqrt(p * (1 - p) / n) if n else None


def verdict(start: float | None, start_se: float | None, end: float | None, end_se: float | None,
            words: Words = LEARNED) -> str:
    """"0.250 → 0.460: learned: +0.210 ± 0.050 (4.2 SE)": both values, the difference ± its SE, z = d / SE.

    A value that is missing (None or not finite) reads "n/a" and gets no verdict; neither does a change
    whose standard errors are not both known (MI-ZScore-EMA logs no spread), rather than a made-up one.
    With both SEs 0 (a rate of 0 or 1 twice) any change is infinitely many SE.
    """
    def finite(value: float | None) -> bool:
        return value is not None and math.isfinite(value)

    values = " → ".join(f"{v:.3f}" if finite(v) else "n/a" for v in (start, end))
    if not (finite(start) and finite(end)):
        return f"{values}: no verdict without both values"
    d = end - start
    if start_se is None or end_se is None:
        return f"{values}: changed by {d:+.3f} ± n/a (no standard error, no verdict)"
    se = math.hypot(start_se, end_se)
    z = d / se if se > 0 else math.copysign(math.inf, d) if d else 0.0
    word = words[0] if z > THRESHOLD_SE else words[2] if z < -THRESHOLD_SE else words[1]
    return f"{values}: {word}: {d:+.3f} ± {se:.3f} ({z:.1f} SE)"
