"""The template-collapse alarm: MI proxies falling while token entropy looks fine.

A token-entropy dashboard cannot see template collapse (SPEC §1): the reasoning stops depending
on the input while its diversity stays where it was. The alarm watches the primary proxies of
one sampling scheme at every diagnostics check and fires when, for `alarm_patience` consecutive
checks,

- the rule holds: `retrieval_near_chance` (Retrieval-Acc <= chance_level + alarm_margin),
  `zscore_drop` (MI-ZScore-EMA <= (1 - alarm_drop) x its running maximum, which must be > 0:
  the MI has to have been there to fall), or `both` at once;
- and H(Z|X) (`cond_entropy`, the policy's token entropy on the sampled reasoning) is within
  +-alarm_entropy_band (relative) of its value at the first check.

The entropy condition is what makes it a *template*-collapse alarm: when entropy falls out of
the band as well, the policy is collapsing in the ordinary, visible way (it stopped exploring,
or it degenerated into noise), and the alarm stays quiet. It fires once per run of collapsed
checks; a healthy check re-arms it. `CollapseAlarm.update` is pure bookkeeping over the metric
dict, so the trainer decides what firing means (`collapse.alarm`: warn, or warn and stop).

The message ends with advice that reads the run (`next_levers`): the next `key=value` overrides
against template collapse for the run's own filter, baseline, regularisers, group size and learning rate,
never a setting the run already has.

A check whose batch could not support the values the rule reads (absent or NaN: fewer than 2
pairs, one distinct input, no MI-ZScore-EMA scale yet; see `mi_metrics`) is no evidence either
way: it neither counts towards the patience nor resets the streak, and it sets no reference
entropy or maximum. The alarm carries on at the next usable check as if it had not happened.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

from ragen2.config import CollapseConfig, Config, FilterConfig

RV_METRICS = ("reward_variance", "reward_std")  # the filter metrics that rank groups by their signal
FILTER_STEP = 0.2  # how far one piece of advice moves a filter's value
KEEP_FLOOR = 0.5  # top_p, top_p_softmax, top_k: not advised below it, where a step keeps only a few groups
MIN_P_CEILING = 0.5  # min_p: not advised above it (groups with at least half the best group's variance)
# Algorithms whose baseline is the whole batch's, and their per-prompt counterpart: the batch baseline gives the
# groups that all succeed or all fail full-size advantages that only say how hard their prompt was.
BATCH_BASELINE = {"reinforce_pp": "reinforce_pp_baseline"}


@dataclass(frozen=True)
class AlarmDecision:
    """The alarm fired at `step`: what to do, why in words, and the numbers behind it."""

    step: int
    action: Literal["warn", "stop"]
    message: str
    data: dict[str, float]  # the proxies and thresholds of the firing check, for the event record

    @property
    def stop(self) -> bool:
        return self.action == "stop"


class CollapseAlarm:
    """Consecutive-check bookkeeping for `collapse.alarm*`; `state_dict` goes into checkpoints."""

    def __init__(self, config: CollapseConfig, run: Config | None = None) -> None:
        """`run`: the whole run's config, which the advice in the message reads; None: the defaults'."""
        self.config = config
        self.levers = next_levers(run if run is not None else Config())
        self.reference_entropy: float | None = None  # cond_entropy at the first check
        self.max_zscore: float | None = None  # running maximum of MI-ZScore-EMA
        self.streak = 0  # consecutive collapsed checks, up to and including the last one
        self.fired = False  # already fired during the current streak

    def update(self, step: int, metrics: dict[str, float]) -> AlarmDecision | None:
        """Fold in one check's metrics (`collapse_<alarm_scheme>/...`); the decision when it fires.

        Metrics without a finite value of each watched proxy the rule reads (steps off the
        schedule, a batch with no reasoning to score, or too few pairs or distinct inputs for the
        proxies to exist) are not a check: nothing changes, the streak neither grows nor resets.
        """
        cfg = self.config
        prefix = f"collapse_{cfg.alarm_scheme}/"
        if cfg.alarm == "off":
            return None
        value = {key: _finite(metrics.get(prefix + key))
                 for key in ("retrieval_acc", "chance_level", "mi_zscore_ema", "cond_entropy")}
        needed = {"retrieval_near_chance": ("retrieval_acc", "chance_level"), "zscore_drop": ("mi_zscore_ema",),
                  "both": ("retrieval_acc", "chance_level", "mi_zscore_ema")}[cfg.alarm_rule]
        needed += ("cond_entropy",) if cfg.alarm_entropy_band is not None else ()
        if any(value[key] is None for key in needed):
            return None  # no evidence: neither collapsed nor healthy
        nan = float("nan")
        acc, chance = value["retrieval_acc"], value["chance_level"]
        zscore, entropy = value["mi_zscore_ema"], value["cond_entropy"]

        if self.reference_entropy is None and entropy is not None:
            self.reference_entropy = entropy
        if zscore is not None:
            self.max_zscore = zscore if self.max_zscore is None else max(self.max_zscore, zscore)
        near_chance = acc is not None and chance is not None and acc <= chance + cfg.alarm_margin
        dropped = (zscore is not None and self.max_zscore is not None and self.max_zscore > 0
                   and zscore <= (1 - cfg.alarm_drop) * self.max_zscore)
        collapsed = {"retrieval_near_chance": near_chance, "zscore_drop": dropped, "both": near_chance and dropped}
        band = cfg.alarm_entropy_band
        entropy_steady = band is None or abs(entropy - self.reference_entropy) <= band * abs(self.reference_entropy)

        if collapsed[cfg.alarm_rule] and entropy_steady:
            self.streak += 1
        else:
            self.streak, self.fired = 0, False
        if self.streak < cfg.alarm_patience or self.fired:
            return None
        self.fired = True
        data = {  # NaN: a value the rule did not need and this check could not support
            "retrieval_acc": nan if acc is None else acc,
            "chance_level": nan if chance is None else chance,
            "mi_zscore_ema": nan if zscore is None else zscore,
            "mi_zscore_ema_max": nan if self.max_zscore is None else self.max_zscore,
            "cond_entropy": nan if entropy is None else entropy,
            "cond_entropy_first_check": nan if self.reference_entropy is None else self.reference_entropy,
            "checks": float(self.streak),
        }
        return AlarmDecision(step, cfg.alarm, self._message(step, data), data)

    def _message(self, step: int, d: dict[str, float]) -> str:
        cfg = self.config
        why = {
            "retrieval_near_chance": f"Retrieval-Acc {d['retrieval_acc']:.3f} within {cfg.alarm_margin} of chance "
            f"{d['chance_level']:.3f}",
            "zscore_drop": f"MI-ZScore-EMA {d['mi_zscore_ema']:.3g} down more than {cfg.alarm_drop:.0%} from its "
            f"maximum {d['mi_zscore_ema_max']:.3g}",
        }
        rules = list(why) if cfg.alarm_rule == "both" else [cfg.alarm_rule]
        entropy = (
            f" while reasoning entropy H(Z|X) {d['cond_entropy']:.3f} stays within ±{cfg.alarm_entropy_band:.0%} of "
            f"{d['cond_entropy_first_check']:.3f}"
            if cfg.alarm_entropy_band is not None
            else ""
        )
        return (
            f"template collapse suspected at step {step} ({cfg.alarm_scheme} pairs): "
            f"{' and '.join(why[r] for r in rules)} for {int(d['checks'])} consecutive checks{entropy}. The reasoning "
            f"no longer depends on the input. Next levers for this run: {'; '.join(self.levers)}. "
            "docs/diagnostics.md explains the signal."
        )

    def state_dict(self) -> dict[str, Any]:
        return {
            "reference_entropy": self.reference_entropy,
            "max_zscore": self.max_zscore,
            "streak": self.streak,
            "fired": self.fired,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.reference_entropy = state["reference_entropy"]
        self.max_zscore = state["max_zscore"]
        self.streak = int(state["streak"])
        self.fired = bool(state["fired"])


def next_levers(run: Config) -> list[str]:
    """The next settings to try against template collapse in `run`, as `key=value` overrides with why.

    The alarm must not advise what the run already does (a run at filter.value=0.9 told to use 0.9
    learns nothing from the message), so every lever is a step from the run's own values: the filter
    one step stricter toward high reward-variance groups, a batch-wide baseline made per-prompt
    (reinforce_pp), the KL and entropy coefficients halved, the group doubled, the learning rate
    halved. A setting already at its limit (a coefficient or learning rate of 0, a filter at its
    strictest advised value) is left out.
    """
    a = run.algo
    levers = [
        _filter_lever(run.filter),
        (_overrides("algo", a, name=BATCH_BASELINE.get(a.name, a.name)),
         "a per-prompt baseline: each group's mean return, so a prompt's difficulty is not credited to its reasoning"),
        (_overrides("algo", a, kl_coef=a.kl_coef / 2, entropy_coef=a.entropy_coef / 2),
         "weaker input-agnostic regularisers"),
        (_overrides("rollout", run.rollout, group_size=2 * run.rollout.group_size),
         "larger groups estimate reward variance better"),
        (_overrides("optim", run.optim, lr=run.optim.lr / 2), "smaller updates"),
    ]
    return [f"{overrides} ({why})" for overrides, why in levers if overrides]


def _filter_lever(f: FilterConfig) -> tuple[str, str]:
    """The filter's overrides toward training on high reward-variance groups only (docs/filtering.md).

    Off: the paper's setting. Ranked by another metric or from the bottom (ablations): rank by reward
    variance, from the top. Otherwise the strategy's next-stricter value, never a looser one:
    top_p, top_p_softmax and top_k keep less (lower value), min_p a higher share of the best
    group's variance (higher value), quartile the next higher-variance quarter (lower value), top_k_abs
    one group fewer.
    """
    if f.strategy == "none":
        return _overrides("filter", f, strategy="top_p", value=0.9, include_zero=False), "turn the SNR-aware filter on: the paper's top_p 0.9"
    if f.metric not in RV_METRICS or f.order == "smallest":
        return (_overrides("filter", f, metric="reward_variance", order="largest", include_zero=False),
                "rank the groups by reward variance, highest first")
    lower = min(f.value, max(round(min(f.value, 1) - FILTER_STEP, 2), KEEP_FLOOR))
    stricter = {
        "top_p": lower, "top_p_softmax": lower, "top_k": lower,
        "min_p": max(f.value, min(round(f.value + FILTER_STEP, 2), MIN_P_CEILING)),
        "quartile": max(f.value - 1, 1), "top_k_abs": max(f.value - 1, 1),
    }[f.strategy]
    return (_overrides("filter", f, value=stricter, include_zero=False),
            f"a stricter {f.strategy}: train on higher reward-variance groups")


def _overrides(section: str, current: Any, **wanted: Any) -> str:
    """`section.key=value` for each wanted value that differs from the run's, space-separated."""
    changed = {key: value for key, value in wanted.items() if getattr(current, key) != value}
    return " ".join(f"{section}.{key}={_yaml(value)}" for key, value in changed.items())


def _yaml(value: Any) -> str:
    """A value as a command-line override spells it (true/false, floats without float noise)."""
    if isinstance(value, bool):
        return str(value).lower()
    return f"{value:g}" if isinstance(value, float) else str(value)


def _finite(value: Any) -> float | None:
    """The value as a float when it is a finite number, else None (absent, None or NaN: missing)."""
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None
