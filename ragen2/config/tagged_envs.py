"""What `env.name`, `env.mixture` and `env.eval` resolve to: tagged environments, each with its share of the work.

`env.mixture` lists the training environments (name, kwargs, tag, groups or weight); each step's
`rollout.num_groups` groups are split among them in that order. `env.eval` lists the evaluation
environments: a training tag, or an environment of its own, such as an out-of-distribution variant.
The single-environment form (`env.name`, `env.kwargs`) is the one-element mixture (docs/mixtures.md).

This reading of the config sits in the config package because `validate` checks a mixture by it (its
tags, and the groups a weight split leaves to each entry); `ragen2.mixture` plays and logs a mixture
with the same entries.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ragen2.config.sections import Config


@dataclass(frozen=True)
class TaggedEnv:
    """One environment of a mixture: what to build, the tag its metrics go under, and how much of it to play."""

    name: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    tag: str = ""
    count: int = 0  # training: groups per step; evaluation: episodes per evaluation


def training_envs(config: Config, num_groups: int | None = None) -> list[TaggedEnv]:
    """The training environments with their groups per step (the single-environment form: one, with all groups);
    `num_groups` in place of rollout.num_groups (async.oversample's candidates, single environment only)."""
    P = num_groups or config.rollout.num_groups
    if config.env.mixture is None:
        return [TaggedEnv(config.env.name, config.env.kwargs, config.env.name, P)]
    entries = config.env.mixture
    if all(e.groups is not None for e in entries):
        counts = [e.groups for e in entries]
    else:
        counts = apportion(P, [1.0 if e.weight is None else e.weight for e in entries])
    return [TaggedEnv(e.name, e.kwargs, e.tag or e.name, n) for e, n in zip(entries, counts)]


def eval_envs(config: Config) -> list[TaggedEnv]:
    """The evaluation environments with their episodes per evaluation (null `env.eval`: every training tag)."""
    default = config.trainer.eval_episodes
    train = {t.tag: t for t in training_envs(config)}
    if config.env.eval is None:
        return [TaggedEnv(t.name, t.kwargs, t.tag, default) for t in train.values()]
    out = []
    for e in config.env.eval:
        source = train[e.tag] if e.name is None else TaggedEnv(e.name, e.kwargs, e.tag or e.name)
        out.append(TaggedEnv(source.name, source.kwargs, source.tag, default if e.episodes is None else e.episodes))
    return out


def is_mixture(config: Config) -> bool:
    """Whether the run logs per-tag metrics: `env.mixture` or `env.eval` is set."""
    return config.env.mixture is not None or config.env.eval is not None


def apportion(total: int, weights: Sequence[float]) -> list[int]:
    """`total` split into whole shares proportional to `weights` by largest remainders (ties: the earlier entry)."""
    s = sum(weights)
    exact = [total * w / s for w in weights]
    shares = [int(x) for x in exact]
    by_remainder = sorted(range(len(weights)), key=lambda i: (-(exact[i] - shares[i]), i))
    for i in by_remainder[: total - sum(shares)]:
        shares[i] += 1
    return shares
