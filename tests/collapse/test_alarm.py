"""CollapseAlarm on synthetic metric sequences: each rule, patience, the entropy band, re-arming,
checkpoint state and config validation; the advice of its message for a run's config."""

from __future__ import annotations

import pytest

from ragen2.collapse import CollapseAlarm
from ragen2.collapse.alarm import next_levers
from ragen2.config import CollapseConfig, Config, load_config
from ragen2.errors import ConfigError

CHANCE = 0.125  # P = 8 groups


def check(acc: float, z: float = 1.0, entropy: float = 2.0, scheme: str = "first_turn") -> dict[str, float]:
    p = f"collapse_{scheme}/"
    return {p + "retrieval_acc": acc, p + "chance_level": CHANCE, p + "mi_zscore_ema": z, p + "cond_entropy": entropy}


def fired_at(alarm: CollapseAlarm, checks: list[dict[str, float]], every: int = 5) -> list[int]:
    """Steps (1, 5, 10, ...) at which the alarm fired over the sequence of checks."""
    steps = [1] + [every * k for k in range(1, len(checks))]
    return [step for step, metrics in zip(steps, checks) if alarm.update(step, metrics) is not None]


def alarm(**kw) -> CollapseAlarm:
    return CollapseAlarm(CollapseConfig(**kw))


def test_fires_after_patience_checks_at_chance_with_steady_entropy():
    healthy, collapsed = check(0.9), check(CHANCE + 0.03, entropy=2.1)
    a = alarm(alarm_patience=3)
    assert fired_at(a, [healthy, healthy, collapsed, collapsed, collapsed, collapsed]) == [20]
    decision = alarm(alarm_patience=2).update  # the decision itself, on a fresh alarm
    assert decision(1, collapsed) is None
    d = decision(5, collapsed)
    assert d is not None and d.step == 5 and d.action == "warn" and not d.stop
    assert d.data["retrieval_acc"] == pytest.approx(0.155) and d.data["chance_level"] == CHANCE
    assert d.data["cond_entropy_first_check"] == 2.1 and d.data["checks"] == 2
    assert "step 5" in d.message and "Retrieval-Acc 0.155 within 0.05 of chance 0.125" in d.message
    assert "filter.value=0.7" in d.message  # no run config: advice for the defaults (top_p 0.9)


def test_stop_mode_asks_to_stop():
    d = alarm(alarm="stop", alarm_patience=1).update(1, check(CHANCE))
    assert d is not None and d.stop and d.action == "stop"


def test_healthy_or_just_above_the_margin_never_fires():
    a = alarm(alarm_patience=1, alarm_margin=0.05)
    assert fired_at(a, [check(0.9), check(0.5), check(CHANCE + 0.051)]) == []


def test_a_healthy_check_resets_the_streak():
    at, ok = check(CHANCE), check(0.8)
    assert fired_at(alarm(alarm_patience=3), [at, at, ok, at, at, ok, at]) == []


def test_fires_once_per_streak_and_rearms_after_recovery():
    at, ok = check(CHANCE), check(0.8)
    assert fired_at(alarm(alarm_patience=2), [at, at, at, at, ok, at, at]) == [5, 30]


def test_entropy_collapsing_too_is_not_template_collapse():
    """Retrieval at chance while H(Z|X) falls from 2.0 to 0.6 (out of the +-50% band): ordinary
    entropy collapse, visible on any dashboard; the template alarm stays quiet."""
    seq = [check(0.9, entropy=2.0)] + [check(CHANCE, entropy=0.6)] * 5
    assert fired_at(alarm(alarm_patience=2, alarm_entropy_band=0.5), seq) == []
    # Rising out of the band (noise, not a template) is left alone as well.
    noisy = [check(0.9)] + [check(CHANCE, entropy=3.5)] * 3
    assert fired_at(alarm(alarm_patience=2, alarm_entropy_band=0.5), noisy) == []
    # Within the band, or with the band switched off, the same MI fall fires.
    assert fired_at(alarm(alarm_patience=2, alarm_entropy_band=0.8), seq) == [10]
    assert fired_at(alarm(alarm_patience=2, alarm_entropy_band=None), seq) == [10]


def test_zscore_drop_from_running_maximum():
    a = alarm(alarm_rule="zscore_drop", alarm_drop=0.5, alarm_patience=2)
    # Rises to 4, then 2.5 (not yet half), then 2.0 and 1.0 (half or less of 4): fires at the second.
    seq = [check(0.9, z=1.0), check(0.9, z=4.0), check(0.9, z=2.5), check(0.9, z=2.0), check(0.9, z=1.0)]
    assert fired_at(a, seq) == [20]
    never_positive = [check(CHANCE, z=-0.1), check(CHANCE, z=-0.3), check(CHANCE, z=-0.5)]
    assert fired_at(alarm(alarm_rule="zscore_drop", alarm_patience=1), never_positive) == []


def test_both_needs_both_conditions():
    a = alarm(alarm_rule="both", alarm_patience=1)
    seq = [check(0.9, z=4.0), check(CHANCE, z=3.9), check(0.9, z=0.5), check(CHANCE, z=0.5)]
    assert fired_at(a, seq) == [15]
    d = alarm(alarm_rule="both", alarm_patience=1)
    d.update(1, check(0.9, z=4.0))
    message = d.update(5, check(CHANCE, z=1.0)).message
    assert "Retrieval-Acc" in message and "MI-ZScore-EMA 1 down more than 50% from its maximum 4" in message


def test_watches_the_configured_scheme_and_ignores_steps_without_it():
    a = alarm(alarm_scheme="trajectory", alarm_patience=1)
    assert a.update(1, check(CHANCE, scheme="first_turn")) is None  # not the watched scheme: not a check
    assert a.streak == 0 and a.reference_entropy is None
    assert a.update(2, {"rollout/return_mean": 1.0}) is None
    assert a.update(5, check(CHANCE, scheme="trajectory")) is not None


def test_a_check_without_the_proxies_is_no_evidence():
    """One pair, or one distinct input: the online diagnostics log no retrieval_acc / mi_zscore_ema
    (or a caller passes NaN). Such a check neither advances the patience nor resets the streak."""
    p = "collapse_first_turn/"
    absent = {p + "num_pairs": 1.0, p + "chance_level": CHANCE, p + "cond_entropy": 2.0}  # what online logs
    nan = {**check(float("nan"), z=float("nan")), p + "num_pairs": 1.0}
    at = check(CHANCE)
    a = alarm(alarm_patience=3)
    assert a.update(1, absent) is None and a.update(2, nan) is None
    assert a.state_dict() == {"reference_entropy": None, "max_zscore": None, "streak": 0, "fired": False}
    a.update(5, at)
    a.update(10, at)
    before = a.state_dict()
    assert before["streak"] == 2
    assert a.update(15, absent) is None and a.update(20, nan) is None
    assert a.state_dict() == before  # not reset, not advanced
    assert a.update(25, at) is not None  # the third collapsed check fires
    # zscore_drop reads MI-ZScore-EMA only: a check with Retrieval-Acc but no z-score is no evidence.
    z = alarm(alarm_rule="zscore_drop", alarm_patience=1)
    z.update(1, check(0.9, z=4.0))
    no_z = check(CHANCE)
    del no_z[p + "mi_zscore_ema"]
    assert z.update(5, no_z) is None and z.state_dict()["max_zscore"] == 4.0 and z.streak == 0
    assert z.update(10, check(0.9, z=1.0)) is not None


def test_off_never_fires():
    assert fired_at(alarm(alarm="off", alarm_patience=1), [check(CHANCE)] * 4) == []


def test_state_dict_resumes_mid_streak():
    at = check(CHANCE)
    a = alarm(alarm_patience=3)
    a.update(1, check(0.9, z=3.0, entropy=2.0))
    a.update(5, at)
    b = alarm(alarm_patience=3)
    b.load_state_dict(a.state_dict())
    assert b.state_dict() == {"reference_entropy": 2.0, "max_zscore": 3.0, "streak": 1, "fired": False}
    assert b.update(10, at) is None and b.update(15, at) is not None


@pytest.mark.parametrize(
    "kw, message",
    [
        ({"alarm_drop": 0.0}, "collapse.alarm_drop=0.0 is not allowed: use a fraction in (0, 1]"),
        ({"alarm_margin": 1.0}, "collapse.alarm_margin=1.0 is not allowed"),
        ({"alarm_entropy_band": 0.0}, "or null to ignore entropy"),
        ({"alarm_patience": 0}, "collapse.alarm_patience=0 is not allowed: use an integer >= 1"),
        ({"compute_freq": 0}, "collapse.compute_freq=0 is not allowed"),
    ],
)
def test_bad_alarm_settings_name_key_and_fix(kw, message):
    with pytest.raises(ConfigError) as err:
        CollapseConfig(**kw)
    assert message in str(err.value)


def test_alarm_keys_from_the_command_line():
    c = load_config(None, ["collapse.alarm=stop", "collapse.alarm_rule=both", "collapse.alarm_entropy_band=null"])
    assert (c.collapse.alarm, c.collapse.alarm_rule, c.collapse.alarm_entropy_band) == ("stop", "both", None)
    with pytest.raises(ConfigError, match="allowed values: 'retrieval_near_chance', 'zscore_drop', 'both'"):
        load_config(None, ["collapse.alarm_rule=zscore"])


def overrides(levers: list[str], section: str = "") -> list[str]:
    """The `key=value` words of the levers, those under `section.` when given."""
    return [word for lever in levers for word in lever.split() if "=" in word and word.startswith(section)]


def bandit(*extra: str) -> Config:
    return load_config("bandit", list(extra))


def test_advice_for_the_paper_filter_names_the_next_lever_not_the_current_one():
    """The Bandit preset runs the paper's filter (top_p 0.9, include_zero=false): the message
    must not advise it again, but a lower top_p and the other levers at this run's values."""
    run = bandit()
    message = CollapseAlarm(CollapseConfig(alarm_patience=1), run).update(1, check(CHANCE)).message
    assert "filter.value=0.9" not in message and "include_zero=false" not in message
    assert "filter.strategy" not in message and "filter.value=0.7" in message
    assert overrides(next_levers(run)) == [
        "filter.value=0.7", "algo.entropy_coef=0.0005", "rollout.group_size=16", "optim.lr=5e-05",
    ]


def test_filter_off_is_told_to_turn_it_on():
    assert overrides(next_levers(load_config("bandit-grpo-nofilter")), "filter.") == [
        "filter.strategy=top_p", "filter.include_zero=false",  # filter.value is 0.9 already
    ]
    assert overrides(next_levers(bandit("filter.strategy=none", "filter.value=0.5")), "filter.") == [
        "filter.strategy=top_p", "filter.value=0.9",
    ]


def test_regularisers_halved_and_left_out_at_zero():
    assert overrides(next_levers(bandit("algo.kl_coef=0.002", "algo.entropy_coef=0.01")), "algo.") == [
        "algo.kl_coef=0.001", "algo.entropy_coef=0.005",
    ]
    assert not any("kl_coef" in lever for lever in next_levers(bandit("algo.kl_coef=0")))
    assert overrides(next_levers(bandit("algo.kl_coef=0", "algo.entropy_coef=0")), "algo.") == []


def test_group_doubled_and_learning_rate_halved():
    levers = next_levers(bandit("rollout.group_size=5", "optim.lr=3e-6"))
    assert "rollout.group_size=10" in overrides(levers) and "optim.lr=1.5e-06" in overrides(levers)
    assert overrides(next_levers(bandit("optim.lr=0")), "optim.") == []  # frozen weights: nothing to halve


@pytest.mark.parametrize(
    "settings, advised",
    [
        (["filter.value=0.7"], ["filter.value=0.5"]),
        (["filter.value=0.6"], ["filter.value=0.5"]),  # floored at 0.5
        (["filter.value=0.5"], []),
        (["filter.value=0.3"], []),  # stricter than the floor already: never loosened
        (["filter.value=1.0"], ["filter.value=0.8"]),
        (["filter.value=0.5", "filter.include_zero=true"], ["filter.include_zero=false"]),
        (["filter.strategy=top_p_softmax", "filter.value=0.8"], ["filter.value=0.6"]),
        (["filter.strategy=top_k", "filter.value=0.5", "filter.include_zero=true"], ["filter.include_zero=false"]),
        (["filter.strategy=min_p", "filter.value=0.2"], ["filter.value=0.4"]),
        (["filter.strategy=min_p", "filter.value=0.4"], ["filter.value=0.5"]),  # capped at 0.5
        (["filter.strategy=min_p", "filter.value=0.8"], []),
        (["filter.strategy=quartile", "filter.value=3"], ["filter.value=2"]),
        (["filter.strategy=quartile", "filter.value=1"], []),
        (["filter.order=smallest"], ["filter.order=largest"]),
        (["filter.strategy=top_k", "filter.metric=mean_reward"], ["filter.metric=reward_variance"]),
    ],
)
def test_filter_lever_is_the_next_stricter_setting(settings, advised):
    run = bandit(*settings)
    assert overrides(next_levers(run), "filter.") == advised
    for item in overrides(next_levers(run)):  # every override loads and changes the run
        key, _, _ = item.partition("=")
        section, name = key.split(".")
        assert getattr(getattr(bandit(*settings, item), section), name) != getattr(getattr(run, section), name)


def test_a_batch_wide_baseline_is_told_to_use_the_prompts_own():
    """REINFORCE++ whitens returns over the batch: groups that all succeed or all fail get full-size advantages
    that only say how hard their prompt was. The advice names its per-prompt form; GRPO's baseline is per-prompt."""
    assert "algo.name=reinforce_pp_baseline" in overrides(next_levers(load_config("frozenlake-reinforce_pp")), "algo.")
    assert not any(lever.startswith("algo.name") for lever in overrides(next_levers(bandit())))
