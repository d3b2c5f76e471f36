"""Cross-field validation: refuse settings that cannot work together, with the reason, before any work starts.

A section checks its own values when it is built (`sections`); what this module checks needs several
sections at once (the algorithm and the filter, the backend and LoRA, the mixture's groups and
rollout.num_groups), the machine (sizes that cannot fit in memory) or the registries (an environment
name and its constructor's arguments, an agent entrypoint). `validate` runs on every config that
`load` makes, and the trainer runs it again on a `Config` built in code.
"""

from __future__ import annotations

import importlib.util
import logging
import math
import os
from typing import Any

from ragen2.config.sections import Config
from ragen2.config.tagged_envs import eval_envs, is_mixture, training_envs
from ragen2.errors import ConfigError, did_you_mean


# Largest learning rate `validate` accepts. Adam moves each weight by about lr per step, so above 1 one
# update overwrites the weights; optim.lr=1e30 made the policy's logits non-finite after one step.
MAX_LR = 1.0

# The algorithms whose advantage is GRPO's group-normalised return (RAGEN's adv_estimator=grpo), the only
# ones RAGEN's soft advantage reweighting and length weighting apply to.
GROUP_NORMALISED = ("grpo", "drgrpo", "dapo")
REWARD_METRICS = ("reward_variance", "reward_std", "mean_reward")  # filter metrics computed from returns alone


# A step holds every episode's response tokens at once; 8 bytes a token (one int64 id) is a floor, as
# the Python lists and tensors that hold them take several times that. Sizes whose floor exceeds the
# machine's memory cannot fit, and were met as a silent hang (rollout.group_size=1000000000).
TOKEN_BYTES_FLOOR = 8
# More steps than any run takes (10^7 steps of 1 s is four months): a larger count is a typo, and it
# would stretch a decaying learning-rate schedule to nothing.
MAX_TOTAL_STEPS = 10**7


def check_sizes(config: Config, memory_bytes: int | None = None) -> None:
    """Refuse a step or evaluation whose episodes cannot fit in memory, and absurd step counts."""
    r, t = config.rollout, config.trainer
    if t.total_steps > MAX_TOTAL_STEPS:
        raise ConfigError(f"trainer.total_steps={t.total_steps:,} is more than any run takes; use at most "
                          f"{MAX_TOTAL_STEPS:,} (10^7 steps of one second each run for four months)")
    memory = memory_bytes or os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    sizes = [("rollout.num_groups x rollout.group_size", r.num_groups * r.group_size, "episodes a step")]
    if t.eval_every > 0:
        sizes.append(("trainer.eval_episodes", t.eval_episodes, "episodes an evaluation"))
    for keys, episodes, what in sizes:
        floor = episodes * r.max_turns * r.max_tokens_per_turn * TOKEN_BYTES_FLOOR
        if floor > memory:
            raise ConfigError(
                f"{keys} = {episodes:,} {what}, each up to rollout.max_turns x rollout.max_tokens_per_turn = "
                f"{r.max_turns} x {r.max_tokens_per_turn} tokens: their token ids alone need at least "
                f"{floor / 2**30:,.0f} GiB, more than this machine's {memory / 2**30:,.0f} GiB. Use fewer "
                f"(the reference uses 128 x 16 = 2,048 episodes a step and 512 held-out ones)"
            )


def check_env_kwargs(key: str, name: str, kwargs: dict[str, Any]) -> None:
    """Building one instance checks `kwargs` against the constructor, with its own message prefixed by `key`."""
    from ragen2 import envs

    try:
        envs.make(name, **kwargs)
    except (TypeError, ConfigError) as e:
        raise ConfigError(f"{key} for {name!r}: {e}") from e


def validate(config: Config) -> None:
    """Refuse settings that cannot work, with the reason, before any work starts."""
    if config.agent.entrypoint is not None:
        _validate_agent(config)
    elif config.agent.train_roles:
        raise ConfigError(f"agent.train_roles={config.agent.train_roles} chooses which calls of an agent loop train: "
                          "set agent.entrypoint, or leave it null")
    else:
        _validate_env(config)
    _validate_async(config)
    r, a = config.rollout, config.algo
    for key, value in [
        ("algo.ppo_epochs", a.ppo_epochs),
        ("algo.mini_batch_size", a.mini_batch_size),
        ("algo.micro_batch_size", a.micro_batch_size),
        ("trainer.total_steps", config.trainer.total_steps),
        ("trainer.max_skipped_steps", config.trainer.max_skipped_steps),
    ]:
        if value < 1:
            raise ConfigError(f"{key}={value} must be at least 1")
    for key, value in [
        ("trainer.eval_every", config.trainer.eval_every),
        ("trainer.save_every", config.trainer.save_every),
        ("optim.warmup_steps", config.optim.warmup_steps),
        ("logging.sample_every", config.logging.sample_every),
        ("logging.sample_trajectories", config.logging.sample_trajectories),
    ]:
        if value < 0:
            raise ConfigError(f"{key}={value} must be 0 or more (0 turns it off)")
    for key, value in [("optim.lr", config.optim.lr), ("algo.critic_lr", a.critic_lr)]:
        if not (math.isfinite(value) and 0 <= value <= MAX_LR):
            raise ConfigError(
                f"{key}={value!r} is not allowed: use a finite learning rate in [0, {MAX_LR:g}] (0 freezes the "
                "weights); fine-tuning uses about 1e-6 to 1e-3, the tiny policy 1e-4 to 1e-3"
            )
    t = config.trainer
    check_sizes(config)
    if not config.logging.progress_interval_s > 0:
        raise ConfigError(f"logging.progress_interval_s={config.logging.progress_interval_s} is not allowed: "
                          "use a number of seconds > 0 (default 60)")
    if t.eval_every > 0 and t.eval_episodes < 1:
        raise ConfigError(
            f"trainer.eval_episodes={t.eval_episodes} is not allowed while evaluation is on "
            f"(trainer.eval_every={t.eval_every}): use an integer >= 1 (reference: 512), or trainer.eval_every=0 "
            "to turn evaluation off"
        )
    if a.name == "dapo" and a.kl_coef > 0:
        raise ConfigError(
            f"algo.name=dapo has no KL penalty, but algo.kl_coef={a.kl_coef}; set algo.kl_coef=0, "
            "or use algo.name=grpo for clip-higher with a KL penalty."
        )
    if a.bi_level_gae and a.name != "ppo":
        raise ConfigError(f"algo.bi_level_gae=true needs the critic of algo.name=ppo, not algo.name={a.name}")
    if a.turn_rewards and a.name not in ("ppo", "reinforce_pp"):
        raise ConfigError(f"algo.turn_rewards=true places rewards on tokens, which only algo.name=ppo and "
                          f"reinforce_pp read; algo.name={a.name} uses the episode return (gigpo: the turns' "
                          "rewards already)")
    if a.reward_norm_method != "identity" and (a.turn_rewards or a.name == "gigpo"):
        raise ConfigError(f"algo.reward_norm_method={a.reward_norm_method} normalises episode returns, but "
                          + ("algo.turn_rewards=true" if a.turn_rewards else "algo.name=gigpo")
                          + " trains on each turn's reward (RAGEN refuses it with use_turn_scores too); set "
                          "algo.reward_norm_method=identity")
    if a.kl_in_reward and a.name not in ("ppo", "reinforce_pp"):
        raise ConfigError(f"algo.kl_in_reward=true puts the KL penalty on token rewards, which only algo.name=ppo and "
                          f"reinforce_pp read, not algo.name={a.name}; use algo.kl_coef for a KL loss term")
    adaptive_ok = a.kl_ctrl == "fixed" or (a.kl_target > 0 and a.kl_horizon > 0)
    if a.kl_in_reward and not (a.kl_reward_coef >= 0 and adaptive_ok):
        raise ConfigError(f"algo.kl_reward_coef={a.kl_reward_coef}, algo.kl_target={a.kl_target} and "
                          f"algo.kl_horizon={a.kl_horizon} are not allowed: use a coefficient >= 0 and a target and "
                          "horizon > 0 (verl: 0.001, 0.1, 10000)")
    f = config.filter
    if f.level == "anchor":
        needs = [(a.name == "gigpo", f"algo.name=gigpo (not {a.name})"),
                 (f.trajectory_keep == 1, f"filter.trajectory_keep=1 (not {f.trajectory_keep})"),
                 (f.metric in REWARD_METRICS, f"filter.metric {'/'.join(REWARD_METRICS)} (not {f.metric})")]
        missing = [what for ok, what in needs if not ok]
        if missing:
            raise ConfigError("filter.level=anchor ranks GiGPO's anchor-state groups by their step returns and needs "
                              + ", ".join(missing) + "; filter.level=prompt ranks prompt groups")
    if f.scope == "tag" and f.level == "anchor":
        raise ConfigError("filter.scope=tag ranks prompt groups within each tag; it does not work with "
                          "filter.level=anchor: use filter.scope=batch or filter.level=prompt")
    for key, on in (("soft_advantage_reweight", a.soft_advantage_reweight),
                    ("grpo_advantage_length_weight", a.grpo_advantage_length_weight)):
        if on and a.name not in GROUP_NORMALISED:
            raise ConfigError(f"algo.{key}=true applies to GRPO's advantages (algo.name={', '.join(GROUP_NORMALISED)}), "
                              f"as in RAGEN, not to algo.name={a.name}")
    if a.name in ("grpo", "drgrpo", "dapo", "rloo", "reinforce_pp_baseline", "gigpo") and r.group_size < 2:
        raise ConfigError(
            f"algo.name={a.name} needs rollout.group_size >= 2 (its baseline is the group mean); "
            f"got {r.group_size}. Use algo.name=ppo or reinforce_pp for single rollouts."
        )
    spread_metrics = ("reward_variance", "reward_std", "entropy_variance", "entropy_std")
    if config.filter.strategy != "none" and config.filter.metric in spread_metrics and r.group_size < 2:
        raise ConfigError(
            f"filter.metric={config.filter.metric} needs rollout.group_size >= 2; "
            "set filter.strategy=none or a larger group."
        )
    if r.tool_calls and config.agent.entrypoint is None:
        from ragen2 import envs

        if not envs.make(config.env.name, **config.env.kwargs).tools:
            raise ConfigError(f"rollout.tool_calls=true needs an environment that declares tools; "
                              f"env.name={config.env.name} has none (searchqa, code, webshop and mcp:NAME do)")
        if r.memory != "full" or r.max_model_len is not None:
            raise ConfigError(f"rollout.tool_calls=true shows the whole history (tool results answer earlier "
                              f"calls): set rollout.memory=full and rollout.max_model_len=null (now "
                              f"{r.memory} and {r.max_model_len})")
    if not r.enable_think and config.collapse.enable:
        logging.getLogger("ragen2").warning(
            "rollout.enable_think=false: turns have no reasoning, so the collapse proxies have nothing to score "
            "(collapse_*/num_pairs 0, valid_thinking_rate 0, the proxies n/a); collapse.enable=false skips them"
        )
    if r.backend == "vllm" and config.model.lora_rank > 0:
        raise ConfigError(
            f"rollout.backend=vllm pushes full weights to vLLM, but model.lora_rank={config.model.lora_rank}; "
            "set model.lora_rank=0 or rollout.backend=hf."
        )
    if config.model.fsdp:
        unsupported = [(config.model.lora_rank > 0, f"model.lora_rank={config.model.lora_rank} (LoRA)"),
                       (config.grad_snr.enable, "grad_snr.enable=true (the probe needs full gradients)")]
        for refused, what in unsupported:
            if refused:
                raise ConfigError(f"model.fsdp=true does not work with {what}; turn one of them off (docs/scaling.md)")
    if config.trainer.eval_temperature < 0:
        raise ConfigError(f"trainer.eval_temperature={config.trainer.eval_temperature} must be >= 0")
    if a.clip_low < 0 or a.clip_high < 0:
        raise ConfigError("algo.clip_low and algo.clip_high must be >= 0")


def _validate_async(config: Config) -> None:
    """What asynchronous training runs today (docs/scaling.md): trainer and rollout processes on the HF backend,
    with the environment loop or an agent loop; the filter ranks extra candidates at prompt level. The ranks
    are checked against the launcher's world when the run starts (ragen2.rl.async_rollout.launched_roles)."""
    c = config.async_
    if not c.enable:
        return
    if c.rollout_ranks:
        if c.max_staleness == 0:
            raise ConfigError(f"async.rollout_ranks={c.rollout_ranks} needs async.max_staleness > 0: at 0 the run "
                              "is the synchronous one, without rollout ranks; leave it [] or raise the staleness")
        if min(c.rollout_ranks) < 0 or len(set(c.rollout_ranks)) < len(c.rollout_ranks):
            raise ConfigError(f"async.rollout_ranks={c.rollout_ranks}: give distinct global ranks, 0 or more")
        if c.local_workers != 1:
            raise ConfigError(f"async.local_workers={c.local_workers} is for a run without a launcher; under one, "
                              f"async.rollout_ranks={c.rollout_ranks} names the ranks that generate: leave it at 1")
    if c.partial_rollouts and c.max_staleness == 0:
        raise ConfigError("async.partial_rollouts=true needs async.max_staleness > 0: at 0 the run is the "
                          "synchronous one, whose episodes never span an update")
    if c.partial_rollouts and config.agent.entrypoint:
        raise ConfigError("async.partial_rollouts=true switches weights between the turns of the environment loop; "
                          "an agent loop (agent.entrypoint) plays its episodes with one version: leave it false")
    if c.max_staleness > 0:
        if config.rollout.backend != "hf":
            raise ConfigError(f"rollout.backend={config.rollout.backend} does not work with async.max_staleness="
                              f"{c.max_staleness} yet (the rollout worker runs rollout.backend=hf only); use "
                              "async.max_staleness=0")
        if config.agent.entrypoint and config.agent.port != 0:
            raise ConfigError(f"agent.port={config.agent.port} with async.max_staleness={c.max_staleness}: every rollout "
                              "worker and the trainer (for evaluation) start an endpoint, and they cannot share a "
                              "port: use agent.port=0 (each takes a free one)")
    if c.oversample != 1:
        if config.env.mixture is not None or config.filter.level != "prompt":
            raise ConfigError(f"async.oversample={c.oversample} needs one environment and filter.level=prompt "
                              "(extra candidates of a mixture or of anchor groups are not supported): leave it at 1")


def _validate_env(config: Config) -> None:
    """env.name is registered and env.kwargs fit its constructor, or the mixture's entries do (`check_mixture`)."""
    from ragen2 import envs
    from ragen2.envs.external import SUITES

    if config.env.mixture is None:  # with a mixture env.name is unused, and check_mixture checks the entries
        if not envs.exists(config.env.name):
            raise ConfigError(
                f"env.name={config.env.name!r} is not a registered environment; valid: {', '.join(envs.names())}, "
                f"or a suite's game ({', '.join(f'{s}:GAME' for s in SUITES)}, e.g. textarena:TowerOfHanoi-v0)."
                + did_you_mean(config.env.name, envs.names())
            )
        check_env_kwargs("env.kwargs", config.env.name, config.env.kwargs)
    if is_mixture(config):
        check_mixture(config)


def check_mixture(config: Config) -> None:
    """Refuse a mixture or evaluation list that cannot work, naming the key and what is allowed."""
    from ragen2 import envs

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


def _validate_agent(config: Config) -> None:
    """agent.entrypoint names a function of two arguments, and the settings it needs hold."""
    from ragen2.entrypoint import load_entrypoint

    missing = [name for name in ("openai", "fastapi", "uvicorn") if importlib.util.find_spec(name) is None]
    if missing:
        raise ConfigError(f"agent.entrypoint needs {', '.join(missing)}, which are not installed: "
                          "pip install 'ragen2[agents]'")
    load_entrypoint(config.agent.entrypoint)
    g = config.agent
    if not (g.batch_wait_s >= 0 and g.request_timeout_s > 0 and 0 <= g.port <= 65535):
        raise ConfigError(f"agent.batch_wait_s={g.batch_wait_s}, agent.request_timeout_s={g.request_timeout_s}, "
                          f"agent.port={g.port}: need a wait >= 0 s, a timeout > 0 s and a port in 0..65535")
    if any(not r.strip() for r in g.train_roles or []):
        raise ConfigError(f"agent.train_roles={g.train_roles}: list role names, non-empty strings "
                          "(the X-Ragen2-Role header or model field of the calls to train)")
    if is_mixture(config):
        raise ConfigError("agent.entrypoint runs the agent's own loop, not ragen2's environments: "
                          "leave env.mixture and env.eval unset")
    if config.rollout.backend != "hf":
        raise ConfigError(f"agent.entrypoint serves the policy with rollout.backend=hf; "
                          f"rollout.backend={config.rollout.backend} is not supported there")
