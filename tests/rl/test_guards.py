"""Early-stop guards on synthetic metric sequences: the exact step each one fires."""

from __future__ import annotations

import pytest

from ragen2.config import EarlyStopConfig, load_config
from ragen2.errors import ConfigError
from ragen2.rl.guards import EarlyStopGuards, RewardVarianceGuard, ValidationFloorGuard


def _first_firing(guard, series: dict[int, dict[str, float]]) -> tuple[int, str] | None:
    for step, metrics in series.items():
        if reason := guard.update(step, metrics):
            return step, reason
    return None


def _rv(values: list[float]) -> dict[int, dict[str, float]]:
    return {step: {"rollout/rv_mean": v} for step, v in enumerate(values, start=1)}


def test_rv_guard_fires_after_warmup_plus_patience_low_steps():
    # Warm-up mean 1.0 over steps 1..10 -> threshold 0.1; steps 11.. stay at 0.05.
    fired = _first_firing(RewardVarianceGuard(0.1, 10, 5), _rv([0.5, 1.5] * 5 + [0.05] * 10))
    assert fired is not None and fired[0] == 15
    assert "rollout/rv_mean = 0.05 at step 15" in fired[1] and "threshold 0.1" in fired[1]
    assert "early_stop.rv_collapse=false" in fired[1]


def test_rv_guard_streak_resets_and_threshold_is_strict():
    values = [1.0] * 10 + [0.05] * 4 + [0.1] + [0.09] * 5  # 0.1 is not below 0.1 x 1.0: the count restarts
    assert _first_firing(RewardVarianceGuard(0.1, 10, 5), _rv(values))[0] == 20
    assert _first_firing(RewardVarianceGuard(0.1, 10, 5), _rv(values[:19])) is None


def test_rv_guard_low_values_during_warmup_do_not_count():
    # Low from the start: the baseline is the low level itself, nothing falls below a tenth of it.
    assert _first_firing(RewardVarianceGuard(0.1, 3, 2), _rv([0.01] * 20)) is None
    assert _first_firing(RewardVarianceGuard(0.1, 3, 2), _rv([0.0] * 20)) is None  # no baseline to fall from
    assert _first_firing(RewardVarianceGuard(0.5, 3, 2), _rv([1.0, 1.0, 1.0, 0.4, 0.4]))[0] == 5


def test_rv_guard_skips_missing_nonfinite_and_repeated_steps():
    guard = RewardVarianceGuard(0.1, 2, 3)
    sequence = [(1, 1.0), (2, 1.0), (3, None), (3, 0.0), (4, float("nan")), (4, 0.0), (5, 0.0)]
    fired = [step for step, v in sequence if guard.update(step, {} if v is None else {"rollout/rv_mean": v})]
    assert fired == [5]  # step 3 counted once (the first call had no value), step 4 once (NaN skipped)
    assert guard.update(5, {"rollout/rv_mean": 0.0}) is None  # the same step fed again does not count twice


def test_eval_floor_fires_on_the_fifth_failing_evaluation():
    series = {step: {"rollout/rv_mean": 0.3} for step in range(1, 61)}
    for step in range(10, 61, 10):
        series[step]["eval/success_rate"] = 0.0
    fired = _first_firing(ValidationFloorGuard(0.01, 5), series)
    assert fired is not None and fired[0] == 50
    assert "below 0.01 for 5 consecutive evaluations (since step 10)" in fired[1]


def test_eval_floor_resets_at_the_floor():
    rates = {0: 0.0, 10: 0.005, 20: 0.01, 30: 0.0, 40: 0.0, 50: 0.0, 60: 0.0, 70: 0.009}  # 0.01 is not below
    series = {step: {"eval/success_rate": r} for step, r in rates.items()}
    assert _first_firing(ValidationFloorGuard(0.01, 5), series)[0] == 70


def test_guards_from_config_first_reason_wins_and_off_means_off():
    series = _rv([1.0] * 10 + [0.0] * 10)
    for step in range(2, 21, 2):
        series[step]["eval/success_rate"] = 0.0
    both = EarlyStopGuards(EarlyStopConfig())
    fired = _first_firing(both, series)
    assert fired[0] == 10 and fired[1].startswith("validation floor")  # evals at 2, 4, ..., 10
    rv_only = EarlyStopGuards(EarlyStopConfig(eval_floor=False))
    assert _first_firing(rv_only, series)[0] == 15
    assert _first_firing(EarlyStopGuards(EarlyStopConfig(rv_collapse=False, eval_floor=False)), series) is None


def test_state_dict_resumes_to_the_same_firing_step():
    series = _rv([1.0] * 10 + [0.0] * 10)
    for step in range(5, 21, 5):
        series[step]["eval/success_rate"] = 0.5
    config = EarlyStopConfig(eval_patience=2)
    whole = EarlyStopGuards(config)
    assert _first_firing(whole, series)[0] == 15
    first = EarlyStopGuards(config)
    assert _first_firing(first, {s: m for s, m in series.items() if s <= 12}) is None
    resumed = EarlyStopGuards(config)
    resumed.load_state_dict(first.state_dict())
    assert _first_firing(resumed, series)[0] == 15  # steps 1..12 are replayed and ignored
    partial = EarlyStopGuards(config)
    partial.load_state_dict({})  # a checkpoint from before the guards: they start afresh
    assert partial.state_dict() == EarlyStopGuards(config).state_dict()


def test_config_keys_switch_and_validate():
    config = load_config(None, ["early_stop.rv_collapse=false", "early_stop.eval_success_floor=0"])
    assert config.early_stop.rv_collapse is False and config.early_stop.eval_success_floor == 0.0
    assert EarlyStopGuards(config.early_stop).rv is None
    with pytest.raises(ConfigError, match=r"early_stop.rv_fraction=0.0 is not allowed"):
        load_config(None, ["early_stop.rv_fraction=0"])
    with pytest.raises(ConfigError, match=r"early_stop.eval_patience=0 is not allowed"):
        load_config(None, ["early_stop.eval_patience=0"])
