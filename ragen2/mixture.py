"""Playing and logging a mixture: one environment per group, metrics per tag, and the run's name.

A run with `env.mixture` trains on several environments at once, and one with `env.eval` evaluates on
several; `ragen2.config.tagged_envs` resolves both into tagged environments with their groups or
episodes (validation needs them, so they live in the config package and are re-exported here). This
module turns them into what the trainer uses: each environment's groups in a contiguous block, in the
mixture's order, and `<namespace>/<tag>/<metric>` metrics beside the pooled ones. The single-environment
form is the one-element mixture, and its metrics are exactly those it always logged (docs/mixtures.md).
RAGEN's es_manager has the same shape: tags with `n_groups` for training, and validation on other
environments and variants.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

from ragen2.config import Config
from ragen2.config.tagged_envs import TaggedEnv, apportion, eval_envs, is_mixture, training_envs

__all__ = ["TaggedEnv", "apportion", "by_tag", "eval_envs", "is_mixture", "label", "per_group", "tagged_metrics",
           "training_envs"]

T = TypeVar("T")


def label(config: Config) -> str:
    """What a run trains on, in a header or a run directory's name: env.name, or the mixture's tags joined by `+`."""
    return "+".join(t.tag for t in training_envs(config)) if config.env.mixture is not None else config.env.name


def per_group(envs: Sequence[TaggedEnv]) -> list[TaggedEnv]:
    """One entry per group, each environment's `count` groups in a contiguous block, in the mixture's order."""
    return [t for t in envs for _ in range(t.count)]


def by_tag(items: Sequence[T], tags: Sequence[str]) -> dict[str, list[T]]:
    """`items` split by their tags, in the order tags first appear."""
    out: dict[str, list[T]] = {}
    for item, tag in zip(items, tags):
        out.setdefault(tag, []).append(item)
    return out


def tagged_metrics(
    metrics_of: Callable[[list[T]], dict[str, float]], items: Sequence[T], tags: Sequence[str]
) -> dict[str, float]:
    """`metrics_of` on each tag's items, `<namespace>/<metric>` renamed `<namespace>/<tag>/<metric>`."""
    out = {}
    for tag, part in by_tag(items, tags).items():
        for key, value in metrics_of(part).items():
            namespace, _, name = key.partition("/")
            out[f"{namespace}/{tag}/{name}"] = value
    return out
