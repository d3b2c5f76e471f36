"""Several environments in one run: a tagged mixture to train on and a list of environments to evaluate on.

`env.mixture` lists the training environments (name, kwargs, tag, groups or weight); each step's
`rollout.num_groups` groups are split among them in that order, in contiguous blocks. `env.eval`
lists the evaluation environments: a training tag, or an environment of its own, such as an
out-of-distribution variant. The single-environment form (`env.name`, `env.kwargs`) is the
one-element mixture, and its metrics are exactly those it always logged; a mixture also logs
`<namespace>/<tag>/<metric>` (docs/mixtures.md). RAGEN's es_manager has the same shape: tags
with `n_groups` for training, and validation on other environments and variants.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from ragen2.errors import ConfigError, did_you_mean

if TYPE_CHECKING:
    from ragen2.config import Config

T = TypeVar("T")


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


def label(config: Config) -> str:
    """What a run trains on, in a header or a run directory's name: env.name, or the mixture's tags joined by `+`."""
    return "+".join(t.tag for t in training_envs(config)) if config.env.mixture is not None else config.env.name


def per_group(envs: Sequence[TaggedEnv]) -> list[TaggedEnv]:
    """One entry per group, each environment's `count` groups in a contiguous block, in the mixture's order."""
    return [t for t in envs for _ in range(t.count)]


def apportion(total: int, weights: Sequence[float]) -> list[int]:
    """`total` split into whole shares proportional to `weights` by largest remainders (ties: the earlier entry)."""
    s = sum(weights)
    exact = [total * w / s for w in weights]
    shares = [int(x) for x in exact]
    by_remainder = sorted(range(len(weights)), key=lambda i: (-(exact[i] - shares[i]), i))
    for i in by_remainder[: total - sum(shares)]:
        shares[i] += 1
    return shares


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


def check_mixture(config: Config) -> None:
    """Refuse a mixture or evaluation list that cannot work, naming the key and what is allowed."""
    from ragen2 import envs
    from ragen2.config import check_env_kwargs

    def check_env(key: str, name: str, kwargs: dict[str, Any]) -> None:
        if not envs.exists(name):
            raise ConfigError(f"{key}.name={name!r} is not a registered environment; valid: {', '.join(envs.names())}."
                              + did_you_mean(name, envs.names()))
        check_env_kwargs(f"{key}.kwargs", name, kwargs)

    def check_tags(key: str, tags: list[str]) -> None:
        for i, tag in enumerate(tags):
            if not tag or "/" in tag:
                raise ConfigError(f"{key}[{i}].tag={tag!r} is not allowed: use a non-empty name without `/` "
                                  "(it becomes part of metric keys)")
            if tags.index(tag) != i:
                raise ConfigError(f"{key}[{i}].tag={tag!r} repeats {key}[{tags.index(tag)}]'s tag: give each entry "
                                  "its own tag (e.g. tag: sokoban-big for a variant)")

    mixture, P = config.env.mixture, config.rollout.num_groups
    if mixture is not None:
        if not mixture:
            raise ConfigError("env.mixture is empty: list at least one environment, e.g. [{name: sokoban, groups: 8}], "
                              "or leave it null to train on env.name alone")
        for i, e in enumerate(mixture):
            if e.groups is not None and e.weight is not None:
                raise ConfigError(f"env.mixture[{i}] sets both groups and weight: use one of them")
            if e.groups is not None and e.groups < 1:
                raise ConfigError(f"env.mixture[{i}].groups={e.groups} is not allowed: use an integer >= 1")
            if e.weight is not None and not e.weight > 0:
                raise ConfigError(f"env.mixture[{i}].weight={e.weight} is not allowed: use a number > 0")
            check_env(f"env.mixture[{i}]", e.name, e.kwargs)
        check_tags("env.mixture", [e.tag or e.name for e in mixture])
        with_groups = [e.groups is not None for e in mixture]
        if any(with_groups) and not all(with_groups):
            raise ConfigError(f"env.mixture[{with_groups.index(False)}] has no groups while other entries have: set "
                              "groups on every entry (summing to rollout.num_groups), or weights on none")
        if all(with_groups) and sum(e.groups for e in mixture) != P:
            total = sum(e.groups for e in mixture)
            raise ConfigError(f"env.mixture's groups sum to {total}, but rollout.num_groups={P}: set "
                              f"rollout.num_groups={total}, or change the groups")
        empty = [t.tag for t in training_envs(config) if t.count == 0]
        if empty:
            raise ConfigError(f"env.mixture: rollout.num_groups={P} split by weight leaves no group to "
                              f"{', '.join(empty)}: raise rollout.num_groups or give groups per entry")
    train_tags = [t.tag for t in training_envs(config)]
    entries, G = config.env.eval, config.rollout.group_size
    if entries is None:
        entries_ok = config.trainer.eval_episodes % G == 0 or config.trainer.eval_every == 0
        if not entries_ok:
            raise ConfigError(f"trainer.eval_episodes={config.trainer.eval_episodes} must be a multiple of "
                              f"rollout.group_size={G} with env.mixture: a mixture's evaluation plays groups of "
                              "G episodes per seed (for eval/<tag>/pass@G)")
        return
    if not entries:
        raise ConfigError("env.eval is empty: list at least one environment, e.g. [{tag: sokoban}], or leave it null "
                          "to evaluate on every training tag")
    for i, e in enumerate(entries):
        if e.name is None and e.tag not in train_tags:
            raise ConfigError(f"env.eval[{i}].tag={e.tag!r} is not a training tag; training tags: "
                              f"{', '.join(train_tags)}. Give env.eval[{i}].name for an environment of its own."
                              + did_you_mean(str(e.tag), train_tags))
        if e.name is None and e.kwargs:
            raise ConfigError(f"env.eval[{i}] sets kwargs but no name: a training tag's environment is used as "
                              f"trained; give a name and a new tag for a variant")
        if e.name is not None:
            check_env(f"env.eval[{i}]", e.name, e.kwargs)
        episodes = config.trainer.eval_episodes if e.episodes is None else e.episodes
        if episodes < 1 or episodes % G:
            key = "trainer.eval_episodes" if e.episodes is None else f"env.eval[{i}].episodes"
            raise ConfigError(f"{key}={episodes} is not allowed for env.eval[{i}]: use a positive multiple of "
                              f"rollout.group_size={G} (an evaluation plays groups of G episodes per seed, for pass@G)")
    check_tags("env.eval", [t.tag for t in eval_envs(config)])
