"""The configuration tree, declared once.

Every key is a dataclass field with a help text. YAML presets (shipped under
`ragen2/configs/`) and `a.b=c` command-line overrides feed it; `load_config`
validates everything before any work starts: an unknown key names its full
dotted path and the closest valid keys, a bad value names the allowed values.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import logging
import math
import os
import types
import typing
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import yaml
from omegaconf import OmegaConf

from ragen2.errors import ConfigError, did_you_mean
from ragen2.tags import valid_action_sep


def _f(default: Any, help: str, **kw: Any) -> Any:
    """A dataclass field with a help string (shown by `--help` and docs/config.md)."""
    if isinstance(default, (dict, list)):
        return field(default_factory=lambda: type(default)(default), metadata={"help": help}, **kw)
    return field(default=default, metadata={"help": help}, **kw)


@dataclass
class ModelConfig:
    path: str | None = _f(
        None,
        "Policy: a local Hugging Face model directory, a hub name, or a .gguf file (converted once into a cached "
        "Hugging Face directory; smollm2-135m = SmolLM2-135M-Instruct from the smollm2 extra). null = the built-in "
        "tiny policy, warm-started on first use and cached.",
    )
    device: str = _f("auto", "auto | cpu | cuda | cuda:N. auto picks cuda when available.")
    dtype: Literal["float32", "bfloat16", "float16"] = _f(
        "float32", "Weights' dtype for training and generation."
    )
    lora_rank: int = _f(0, "LoRA rank through peft; 0 trains all weights.")
    lora_alpha: int = _f(32, "LoRA alpha (scaling = alpha / rank).")
    lora_target_modules: list[str] = _f(
        ["q_proj", "k_proj", "v_proj", "o_proj"], "Module names LoRA adapts."
    )
    gradient_checkpointing: bool = _f(False, "Trade compute for activation memory (large models).")
    cpu_threads: int = _f(
        0,
        "torch's CPU threads per process. 0 chooses: the user's OMP_NUM_THREADS when set, else one thread for a "
        "policy under 20M parameters (torch's threads spin-wait on a core another process holds) and the free "
        "cores shared among the run's processes for a larger one (docs/scaling.md).",
    )
    fsdp: bool = _f(
        False,
        "Shard the training state (weights, gradients, Adam) over the processes with FSDP, for policies "
        "whose training state does not fit one device; rollouts use a full replica (docs/scaling.md). "
        "Needs several processes; on under `accelerate launch` with distributed_type: FSDP.",
    )

    def __post_init__(self) -> None:
        if self.cpu_threads < 0:
            raise ConfigError(f"model.cpu_threads={self.cpu_threads} is not allowed: use 0 (choose) or a thread count")


@dataclass
class MixtureEnvConfig:
    """One training environment of a mixture (`env.mixture`; docs/mixtures.md)."""

    name: str = _f("", "Environment name in the registry.")
    kwargs: dict[str, Any] = _f({}, "Keyword arguments for its constructor (a variant: docs/environments.md).")
    tag: str | None = _f(None, "Name its metrics are logged under, `<namespace>/<tag>/<metric>`; null = `name`.")
    groups: int | None = _f(None, "Groups of each step that play it; set on every entry or none, summing to "
                                  "rollout.num_groups.")
    weight: float | None = _f(None, "Without `groups`: its share of rollout.num_groups (null = 1, equal shares).")


@dataclass
class EvalEnvConfig:
    """One evaluation environment (`env.eval`): a training tag, or an environment of its own (out of distribution)."""

    name: str | None = _f(None, "Environment name; null = the training environment whose tag is `tag`.")
    kwargs: dict[str, Any] = _f({}, "Keyword arguments for its constructor.")
    tag: str | None = _f(None, "Name of its `eval/<tag>/` metrics; null = `name`.")
    episodes: int | None = _f(None, "Held-out episodes per evaluation, a multiple of rollout.group_size; "
                                    "null = trainer.eval_episodes.")


@dataclass
class EnvConfig:
    name: str = _f("sokoban", "Environment name in the registry (see `ragen2.envs.names()`).")
    kwargs: dict[str, Any] = _f({}, "Keyword arguments for the environment constructor.")
    mixture: list[MixtureEnvConfig] | None = _f(
        None, "Several training environments in one run: a list of {name, kwargs, tag, groups | weight}; "
        "env.name and env.kwargs are then unused, and metrics are also logged per tag (docs/mixtures.md). "
        "null = env.name alone. RAGEN: es_manager.train.env_configs (tags, n_groups).",
    )
    eval: list[EvalEnvConfig] | None = _f(
        None, "Evaluation environments, logged per tag: a list of {tag} (a training tag; env.name's is its name) or "
        "{name, kwargs, tag, episodes} (e.g. an out-of-distribution variant). null = every training tag with "
        "env.mixture, else env.name's evaluation as ever. RAGEN: es_manager.val.",
    )


@dataclass
class RolloutConfig:
    num_groups: int = _f(8, "P: distinct environment seeds (prompts) per step. Reference: 8.")
    group_size: int = _f(8, "G: rollouts per seed. Reference: 16; smaller on CPU.")
    max_turns: int = _f(5, "Turns per episode. Reference: 5.")
    max_actions_per_turn: int = _f(2, "Actions per answer, separated by rollout.action_sep. Reference: 2.")
    action_sep: str = _f(
        "||", "Separator of the actions in an answer; the environments' instructions show it. Reference: `||` "
        "(agent_proxy.action_sep).",
    )
    enable_think: bool = _f(
        True, "true: a turn is `<think>reasoning</think><answer>actions</answer>`. false (no-think RL): "
        "`<answer>actions</answer>` only, the prompt ends with `<answer>`, and the collapse proxies have no "
        "reasoning to score (docs/environments.md#turn-format-options). Reference: true (agent_proxy.enable_think).",
    )
    max_tokens_per_turn: int = _f(96, "Cap on generated tokens per turn.")
    format_penalty: float = _f(-0.1, "Reward added to a malformed turn or one with an invalid action.")
    context_turns: int | None = _f(
        None,
        "null: the prompt holds the whole history (one training sequence per episode). "
        "k: only the last k earlier turns are shown (one training sequence per turn).",
    )
    tool_calls: bool = _f(
        False,
        "Native tool calling: the environment's actions are offered as tools (JSON schema) rendered by the "
        "policy's chat template, a turn is `<think>..</think>` then `<tool_call>{json}</tool_call>` blocks, and "
        "their results come back as `tool` messages (docs/agents.md). Needs an environment with tools "
        "(searchqa, code, webshop, mcp:NAME) and the whole history (context_turns and max_model_len null).",
    )
    end_on_invalid: bool = _f(
        False, "End the episode (as truncation) at the first malformed turn; invalid actions never end it."
    )
    temperature: float = _f(1.0, "Sampling temperature during training rollouts. Reference: 1.0.")
    top_p: float = _f(1.0, "Nucleus sampling threshold.")
    top_k: int = _f(-1, "Sample among the k most likely tokens (before top_p); -1 = off. Reference: -1.")
    max_model_len: int | None = _f(
        None,
        "Cap on a prompt's tokens: while a turn's prompt is longer, its oldest earlier turns are left out (the system "
        "prompt and the current state stay); an episode where that happened trains one sequence per turn. "
        "null = off. Reference: 3600 (actor_rollout_ref.rollout.max_model_len).",
    )
    backend: Literal["hf", "vllm"] = _f(
        "hf",
        "Generation engine of training rollouts: hf (a decoding loop over the policy's own forward) or vllm (a vLLM "
        "engine in the same process, weights pushed after every update; needs vLLM in an environment of "
        "its own, docs/scaling.md). Evaluation and scoring always use the policy itself.",
    )
    prefix_reuse: bool = _f(
        True,
        "hf backend: each turn prefills only its new tokens, reusing the keys/values of the episode's earlier "
        "turns and of the system prompt the batch shares, and on diagnosed steps the collapse diagnostics score "
        "the rollout's prompts from those keys/values; false prefills every prompt whole. Same samples "
        "either way (up to float rounding). vLLM always uses its prefix cache.",
    )
    vllm_gpu_memory_utilization: float = _f(
        0.5,
        "rollout.backend=vllm: share of the GPU's memory the vLLM engine takes for weights and KV cache; "
        "the rest is left to training. On CPU a share of RAM, unless VLLM_CPU_KVCACHE_SPACE (GiB) is set.",
    )

    def __post_init__(self) -> None:
        """Checked here (not only in `validate`) because library users build this directly."""
        if not 0 < self.vllm_gpu_memory_utilization <= 1:
            raise ConfigError(
                f"rollout.vllm_gpu_memory_utilization={self.vllm_gpu_memory_utilization} is not allowed: "
                "use a fraction in (0, 1]"
            )
        for name in ("num_groups", "group_size", "max_turns", "max_actions_per_turn", "max_tokens_per_turn"):
            if getattr(self, name) < 1:
                raise ConfigError(f"rollout.{name}={getattr(self, name)} is not allowed: use an integer >= 1")
        if self.context_turns is not None and self.context_turns < 0:
            raise ConfigError(
                f"rollout.context_turns={self.context_turns} is not allowed: use null (full history) or an integer >= 0"
            )
        if self.temperature < 0:
            raise ConfigError(f"rollout.temperature={self.temperature} is not allowed: use 0 (greedy) or a positive number")
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"rollout.top_p={self.top_p} is not allowed: use a number in (0, 1]")
        if self.top_k != -1 and self.top_k < 1:
            raise ConfigError(f"rollout.top_k={self.top_k} is not allowed: use -1 (off) or an integer >= 1")
        if self.max_model_len is not None and self.max_model_len < 1:
            raise ConfigError(f"rollout.max_model_len={self.max_model_len} is not allowed: use null (off) or an integer >= 1")
        if not valid_action_sep(self.action_sep):
            raise ConfigError(f"rollout.action_sep={self.action_sep!r} is not allowed: use non-empty text without a tag")


@dataclass
class AlgoConfig:
    name: Literal["ppo", "grpo", "drgrpo", "dapo", "rloo", "reinforce_pp", "reinforce_pp_baseline", "gigpo"] = _f(
        "grpo", "Algorithm: advantage estimator and its loss defaults (docs/algorithms.md)."
    )
    clip_low: float = _f(0.2, "PPO clip epsilon below 1 (ratio >= 1 - clip_low).")
    clip_high: float = _f(0.28, "PPO clip epsilon above 1: clip-higher (DAPO). Reference: 0.28.")
    clip_ratio_c: float | None = _f(
        3.0,
        "Dual clip for negative advantages: the loss of an A < 0 token is capped at -A * c (must be > 1). "
        "Reference (RAGEN/verl clip_ratio_c): 3.0; null turns it off.",
    )
    kl_coef: float = _f(0.0, "KL penalty to the frozen reference policy; 0 turns it off (reference).")
    kl_estimator: Literal["k1", "k2", "k3", "low_var_kl"] = _f(
        "k1",
        "KL estimator: Schulman k1/k2/k3 (k3 with the log ratio clamped to +-20), or low_var_kl (k3 clamped, "
        "value <= 10). Reference RAGEN base config: k1; verl's default: low_var_kl.",
    )
    entropy_coef: float = _f(0.001, "Token-entropy bonus coefficient. Reference: 0.001.")
    loss_agg: Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"] | None = _f(
        None, "Loss aggregation; null = the algorithm's default."
    )
    gamma: float = _f(1.0, "Discount (PPO/GAE, REINFORCE++, GiGPO's step returns). Reference: 1.0; GiGPO's: 0.95.")
    lam: float = _f(1.0, "GAE lambda. Reference: 1.0.")
    ppo_epochs: int = _f(1, "Passes over each batch.")
    mini_batch_size: int = _f(32, "Sequences per optimizer step. Reference: 32.")
    micro_batch_size: int = _f(8, "Sequences per forward/backward (gradient accumulation).")
    critic_lr: float = _f(1e-4, "Critic learning rate (PPO). Reference (3B): 1e-5.")
    value_clip: float = _f(0.5, "Value-loss clip range (PPO; verl default 0.5).")
    turn_rewards: bool = _f(
        False, "Each turn's reward (environment reward plus format penalty) on that turn's last model token, "
        "for the token-reward estimators (ppo, reinforce_pp); false puts the episode return on the episode's last "
        "model token. RAGEN: agent_proxy.use_turn_scores (default false).",
    )
    bi_level_gae: bool = _f(
        False, "ppo: GAE over turns (algo.high_level_gamma, on the critic's values at turn ends), then over each "
        "turn's tokens (algo.gamma). RAGEN: algorithm.bi_level_gae (default false).",
    )
    high_level_gamma: float = _f(0.95, "Bi-level GAE's discount between turns. RAGEN: 0.95.")
    gigpo_step_weight: float = _f(1.0, "GiGPO: weight of the step-level (anchor-state) advantage. verl-agent: 1.0.")
    gigpo_mode: Literal["mean_norm", "mean_std_norm"] = _f(
        "mean_std_norm", "GiGPO: subtract the group mean (mean_norm), or also divide by the group std. verl-agent's "
        "trainer default: mean_std_norm.",
    )
    gigpo_episode_stats: Literal["steps", "episodes"] = _f(
        "steps", "GiGPO: the episode-level mean and std over a group's step rows, so a long episode counts once per "
        "turn (verl-agent's code), or over its episodes (the GiGPO paper).",
    )
    reward_norm_grouping: Literal["state", "batch", "inductive"] = _f(
        "state", "Reward normalisation's groups: the episodes of one environment seed (state), the whole batch "
        "(batch), or the episodes of one environment (inductive). RAGEN: agent_proxy.reward_normalization.grouping.",
    )
    reward_norm_method: Literal["identity", "mean", "mean_std", "asym_clip"] = _f(
        "identity", "Normalise episode returns within their group before the estimator: identity (off), mean "
        "(subtract the group mean), mean_std (also divide by the group std; a group with no spread becomes 0), "
        "asym_clip (mean_std clipped to [-1, 3]). RAGEN: agent_proxy.reward_normalization.method.",
    )
    soft_advantage_reweight: bool = _f(
        False, "grpo, drgrpo, dapo: multiply each episode's advantages by its group's return std over the batch's "
        "largest, down-weighting low-variance groups instead of dropping them. RAGEN: algorithm.soft_advantage_reweight.",
    )
    grpo_advantage_length_weight: bool = _f(
        False, "grpo, drgrpo, dapo: divide each sequence's advantages by its model-token count relative to the "
        "batch mean. RAGEN: grpo_advantage_length_weight.",
    )
    kl_in_reward: bool = _f(
        False, "ppo, reinforce_pp: subtract algo.kl_reward_coef x the per-token KL to the reference "
        "(algo.kl_estimator) from the token rewards before the estimator. RAGEN/verl: algorithm.use_kl_in_reward "
        "(default false).",
    )
    kl_reward_coef: float = _f(
        0.001, "Starting coefficient (beta) of the KL in the reward. verl: algorithm.kl_ctrl.kl_coef (0.001; "
        "RAGEN's base config: 0.0).",
    )
    kl_ctrl: Literal["fixed", "adaptive"] = _f(
        "fixed", "KL-in-reward controller: fixed keeps beta; adaptive moves it toward algo.kl_target after each "
        "step. verl: algorithm.kl_ctrl.type (fixed).",
    )
    kl_target: float = _f(0.1, "Adaptive controller's target KL. verl: algorithm.kl_ctrl.target_kl (0.1).")
    kl_horizon: int = _f(10000, "Adaptive controller's horizon, in sequences. verl: algorithm.kl_ctrl.horizon (10000).")
    task_advantage_scale: float = _f(
        1.0, "Multiplies the task advantage; 0 gives regulariser-only updates (mechanism study)."
    )
    rollout_is: Literal["token", "sequence"] | None = _f(
        None, "Off-policy correction: truncated importance weights pi_old / pi_rollout on the policy loss, per token "
        "or per sequence (the product over its tokens), against the behaviour log-probs recorded at sampling; null "
        "= off. verl 0.6.1: algorithm.rollout_correction.rollout_is (docs/algorithms.md).",
    )
    rollout_is_threshold: float = _f(2.0, "Upper truncation of the importance weights. verl: 2.0.")
    rollout_rs: Literal["token", "sequence", "geometric"] | None = _f(
        None, "Off-policy rejection: drop tokens, or whole sequences by the product or geometric mean of their "
        "ratios, whose ratio lies outside [algo.rollout_rs_threshold_lower, algo.rollout_rs_threshold]; null = off. "
        "verl 0.6.1: algorithm.rollout_correction.rollout_rs.",
    )
    rollout_rs_threshold: float | None = _f(None, "Upper bound of the kept ratios (needed with algo.rollout_rs).")
    rollout_rs_threshold_lower: float | None = _f(None, "Lower bound of the kept ratios; null = 1 / upper.")

    def __post_init__(self) -> None:
        """Checked here (not only in `validate`) because library users build this directly."""
        if self.clip_ratio_c is not None and self.clip_ratio_c <= 1:
            raise ConfigError(
                f"algo.clip_ratio_c={self.clip_ratio_c} is not allowed: use a number > 1 "
                "(RAGEN/verl use 3.0), or null to turn the dual clip off"
            )
        if self.rollout_is_threshold <= 0:
            raise ConfigError(f"algo.rollout_is_threshold={self.rollout_is_threshold} is not allowed: use a number "
                              "> 0 (verl: 2.0)")
        if self.rollout_rs is not None and (self.rollout_rs_threshold is None or self.rollout_rs_threshold <= 0):
            raise ConfigError(f"algo.rollout_rs={self.rollout_rs} needs algo.rollout_rs_threshold > 0 (got "
                              f"{self.rollout_rs_threshold}): the upper bound of the kept ratios, e.g. 2.0")


@dataclass
class OptimConfig:
    lr: float = _f(1e-4, "Actor learning rate. Reference (3B): 1e-6; the tiny policy needs more.")
    betas: list[float] = _f([0.9, 0.999], "Adam betas.")
    weight_decay: float = _f(0.0, "AdamW weight decay.")
    warmup_steps: int = _f(0, "Linear learning-rate warm-up, in RL steps (the lr is a function of the step).")
    schedule: Literal["constant", "linear", "cosine"] = _f(
        "constant", "Schedule after warm-up; linear and cosine decay toward 0 at trainer.total_steps."
    )
    grad_clip: float = _f(1.0, "Max global gradient norm; 0 disables clipping.")


@dataclass
class TrainerConfig:
    total_steps: int = _f(30, "RL iterations. Reference: up to 400.")
    seed: int = _f(0, "Seed for environments, sampling and initialisation.")
    run_dir: str | None = _f(None, "Run directory; null = runs/<env>-<algo>-<time>.")
    eval_every: int = _f(10, "Held-out evaluation every N steps (and at the end); 0 disables.")
    eval_episodes: int = _f(64, "Held-out episodes per evaluation. Reference: 512.")
    eval_temperature: float = _f(0.5, "Evaluation sampling temperature. Reference: 0.5.")
    save_every: int = _f(10, "Checkpoint every N steps (and at the end); 0 = only at the end.")
    max_skipped_steps: int = _f(
        5,
        "Stop after this many consecutive skipped steps: the filter kept nothing, or every optimizer step had a "
        "non-finite loss or gradient (events `skipped_step`, `nonfinite_step`).",
    )


@dataclass
class CollapseConfig:
    enable: bool = _f(True, "Compute the MI proxies during training.")
    compute_freq: int = _f(5, "Compute at step 1 and every N steps. Reference: 5.")
    num_samples: int = _f(64, "Pairs per sampling scheme. Reference: 64.")
    micro_batch_size: int = _f(32, "Reasonings scored per forward pass.")
    per_turn: int = _f(
        0, "Also compute the proxies on each turn index 2..N alone (collapse_turn_K/): does turn K's reasoning "
        "depend on turn K's observation? 0 turns it off; each index adds about one scheme's scoring cost.",
    )
    rollout_cache: bool = _f(
        True,
        "Score the rollout's prompts from the keys/values it computed (hf backend with rollout.prefix_reuse): "
        "on diagnosed steps every episode's cache is kept until the check. false encodes the prompts again "
        "and holds less memory on those steps.",
    )
    marginal: Literal["mixture", "token_mean"] = _f(
        "mixture",
        "Per-token marginal of MI-Est: mixture (the paper's formula) or token_mean (the reference code's variant).",
    )
    alarm: Literal["off", "warn", "stop"] = _f(
        "warn",
        "Template-collapse alarm: off; warn (log a warning and a `collapse_alarm` event); "
        "stop (also checkpoint and end the run).",
    )
    alarm_rule: Literal["retrieval_near_chance", "zscore_drop", "both"] = _f(
        "retrieval_near_chance",
        "What counts as collapsed at a check: Retrieval-Acc within `alarm_margin` of chance, MI-ZScore-EMA "
        "fallen by `alarm_drop` from its running maximum, or both at once.",
    )
    alarm_scheme: Literal["first_turn", "trajectory"] = _f(
        "first_turn", "Which sampling scheme's proxies the alarm watches."
    )
    alarm_margin: float = _f(0.05, "Retrieval-Acc <= chance_level + this counts as at chance (absolute).")
    alarm_drop: float = _f(
        0.5, "MI-ZScore-EMA <= (1 - this) x its running maximum counts as dropped (fraction in (0, 1]).",
    )
    alarm_entropy_band: float | None = _f(
        0.5,
        "The alarm only fires while `cond_entropy` (the token entropy of the reasoning) stays within +-band x "
        "its value at the first check: MI falling while entropy looks fine. null = ignore entropy.",
    )
    alarm_patience: int = _f(3, "Consecutive collapsed checks before the alarm fires.")

    def __post_init__(self) -> None:
        """Checked here (not only in `validate`) because the trainer and tests build this directly."""
        for name in ("compute_freq", "num_samples", "micro_batch_size", "alarm_patience"):
            if getattr(self, name) < 1:
                raise ConfigError(f"collapse.{name}={getattr(self, name)} is not allowed: use an integer >= 1")
        if self.per_turn < 0 or self.per_turn == 1:
            raise ConfigError(f"collapse.per_turn={self.per_turn} is not allowed: use 0 (off) or the last turn index "
                              "to check, >= 2 (turn 1 is collapse_first_turn/)")
        if not 0 <= self.alarm_margin < 1:
            raise ConfigError(f"collapse.alarm_margin={self.alarm_margin} is not allowed: use a number in [0, 1)")
        if not 0 < self.alarm_drop <= 1:
            raise ConfigError(f"collapse.alarm_drop={self.alarm_drop} is not allowed: use a fraction in (0, 1]")
        if self.alarm_entropy_band is not None and self.alarm_entropy_band <= 0:
            raise ConfigError(
                f"collapse.alarm_entropy_band={self.alarm_entropy_band} is not allowed: "
                "use a positive fraction, or null to ignore entropy"
            )


@dataclass
class FilterConfig:
    strategy: Literal["top_p", "top_p_softmax", "top_k", "top_k_abs", "min_p", "quartile", "none"] = _f(
        "top_p",
        "Group selection rule (SPEC §6). Paper main setting: top_p. quartile keeps one quarter of the "
        "RV ranking, filter.value = 1 (highest) to 4 (lowest), as the paper's quartile ablation. top_k_abs keeps "
        "filter.value groups (RAGEN's rollout_filter_strategy=top_k_abs).",
    )
    value: float = _f(
        0.9, "rho: keep rate / threshold of the strategy (the quartile, 1-4, for quartile; the number of groups for "
        "top_k_abs). Paper: 0.9.",
    )
    metric: Literal[
        "reward_variance", "reward_std", "mean_reward", "length", "entropy", "entropy_variance", "entropy_std"
    ] = _f(
        "reward_variance", "Score each group is ranked by. entropy_variance / entropy_std: the spread of the group's "
        "per-episode mean token entropies under the current policy (RAGEN's entropy_variance ranks by the std).",
    )
    include_zero: bool = _f(False, "Keep zero-variance groups. Paper main setting: false.")
    zero_tol: float = _f(
        1e-10,
        "include_zero=false drops the groups whose reward std is <= zero_tol. Reference: 1e-10 (returns all "
        "equal); a larger value, such as 0.1, also drops groups whose returns differ by step-count noise.",
    )
    selection_eps: float = _f(
        0.01,
        "Slack of top_p's threshold: keep ranked groups until their summed score reaches value x total - "
        "selection_eps. Reference: 0.01 (RAGEN's rollout_filter_selection_eps); 0 is the paper's formula.",
    )
    ddof: int = _f(1, "Delta degrees of freedom of the reward variance.")
    order: Literal["largest", "smallest"] = _f("largest", "Keep the highest (or, ablation, lowest) scores.")
    loss_scale: Literal["none", "linear", "sqrt"] = _f("none", "Scale the loss by the kept ratio.")
    trajectory_keep: float = _f(
        1.0,
        "Trajectory-level filtering: of each kept group, train on this share of its episodes, the most "
        "spread-out returns (top and bottom). 1 keeps whole groups; the paper's trajectory-level ablation "
        "is filter.strategy=none filter.trajectory_keep=0.5.",
    )
    scope: Literal["batch", "tag"] = _f(
        "batch", "With env.mixture: rank every group of the batch together (batch, the reference's way), or apply "
        "the rule within each tag's groups, keeping the same fraction of each (tag; for returns on different "
        "scales, docs/mixtures.md).",
    )
    level: Literal["prompt", "anchor"] = _f(
        "prompt", "What the filter ranks and keeps: prompt groups (the paper, RAGEN), or with algo.name=gigpo "
        "anchor-state groups, the turns of a group that saw the identical observation, by their step returns; a turn "
        "alone in its anchor group is kept unless filter.include_zero=false and its group's returns are all equal.",
    )

    def __post_init__(self) -> None:
        """Checked at start, not at the first filter step after a rollout."""
        for name in ("zero_tol", "selection_eps"):
            if isinstance(getattr(self, name), bool) or not getattr(self, name) >= 0:
                raise ConfigError(f"filter.{name}={getattr(self, name)} is not allowed: use a number >= 0")
        if isinstance(self.trajectory_keep, bool) or not 0 < self.trajectory_keep <= 1:
            raise ConfigError(
                f"filter.trajectory_keep={self.trajectory_keep} is not allowed: use a fraction in (0, 1] "
                "(1 keeps every episode of a kept group)"
            )
        if self.strategy == "top_k_abs" and not (self.value >= 1 and float(self.value).is_integer()):
            raise ConfigError(
                f"filter.value={self.value} is not allowed with filter.strategy=top_k_abs: use the number of groups "
                "kept, a whole number >= 1"
            )
        if self.strategy == "quartile" and self.value not in (1, 2, 3, 4):
            raise ConfigError(
                f"filter.value={self.value} is not allowed with filter.strategy=quartile: use 1 (highest RV), 2, 3 or 4 (lowest)"
            )


@dataclass
class GradSNRConfig:
    enable: bool = _f(
        False,
        "Measure task / KL / entropy gradient norms per RV bucket on the unfiltered batch (RAGEN-2 Fig. 3; "
        "docs/filtering.md). Separate backward passes, no optimizer step.",
    )
    freq: int = _f(10, "Probe at every step divisible by N (not step 1: the policy still equals the KL reference).")
    num_buckets: int = _f(6, "RV quantile buckets of equal group counts, bucket 0 = lowest RV. Paper: 6.")
    kl_reference: bool = _f(
        True,
        "With algo.kl_coef=0 there is no reference policy: true loads the initial policy anyway (one more copy "
        "of the weights, used only by the probe) so kl_norm is measured; false reports kl_norm as NaN.",
    )

    def __post_init__(self) -> None:
        for name in ("freq", "num_buckets"):
            if getattr(self, name) < 1:
                raise ConfigError(f"grad_snr.{name}={getattr(self, name)} is not allowed: use an integer >= 1")


@dataclass
class EarlyStopConfig:
    rv_collapse: bool = _f(
        True,
        "Stop when rollout/rv_mean stays below rv_fraction x its mean over the first rv_warmup steps for "
        "rv_patience steps in a row (a guard of the RAGEN-2 reference trainer).",
    )
    rv_fraction: float = _f(0.1, "Fraction of the warm-up mean reward variance counted as collapsed. Reference: 0.1.")
    rv_warmup: int = _f(10, "Steps whose mean rollout/rv_mean is the baseline. Reference: 10.")
    rv_patience: int = _f(5, "Consecutive collapsed steps before stopping. Reference: 5.")
    eval_floor: bool = _f(
        True,
        "Stop when eval/success_rate stays below eval_success_floor for eval_patience evaluations in a row "
        "(a guard of the RAGEN-2 reference trainer).",
    )
    eval_success_floor: float = _f(0.01, "Held-out success rate counted as failing. Reference: 0.01.")
    eval_patience: int = _f(5, "Consecutive failing evaluations before stopping. Reference: 5.")

    def __post_init__(self) -> None:
        for name in ("rv_warmup", "rv_patience", "eval_patience"):
            if getattr(self, name) < 1:
                raise ConfigError(f"early_stop.{name}={getattr(self, name)} is not allowed: use an integer >= 1")
        if not 0 < self.rv_fraction <= 1:
            raise ConfigError(f"early_stop.rv_fraction={self.rv_fraction} is not allowed: use a fraction in (0, 1]")
        if not 0 <= self.eval_success_floor <= 1:
            raise ConfigError(
                f"early_stop.eval_success_floor={self.eval_success_floor} is not allowed: use a rate in [0, 1]"
            )


@dataclass
class LoggingConfig:
    tensorboard: bool = _f(True, "Write TensorBoard event files.")
    wandb: bool = _f(False, "Log to Weights & Biases (when installed).")
    wandb_project: str = _f("ragen2", "W&B project name.")
    progress: bool = _f(
        True, "Show progress: a live bar on a terminal; off one (a log file), a line per step at the latest "
        "every 10 steps, with the time left.",
    )
    progress_interval_s: float = _f(
        60.0, "Off a terminal, the longest the log stays silent: a step (or evaluation) running longer prints "
        "a line saying what is under way and for how long.",
    )
    sample_trajectories: int = _f(
        4,
        "Episodes written to rollouts/step_N.jsonl at each evaluation (held-out) and to "
        "rollouts/train_step_N.jsonl every logging.sample_every steps (training, with their rewards).",
    )
    sample_every: int = _f(
        10,
        "Write logging.sample_trajectories of the training episodes of every step divisible by N to "
        "rollouts/train_step_N.jsonl, one per group in turn; 0 = none (evaluations still write rollouts/step_N.jsonl).",
    )


@dataclass
class AgentConfig:
    entrypoint: str | None = _f(
        None,
        "Train an agent loop ragen2 did not write (the `agent` preset; docs/agents.md): FILE.py:FUNCTION or "
        "package.module:FUNCTION. FUNCTION(client, seed) plays one episode and returns its reward; client is an "
        "openai.OpenAI (openai.AsyncOpenAI for an async def) whose base_url is ragen2's endpoint serving the current "
        "policy. Episodes with the same seed form a group; rollout.max_turns caps the calls of an episode. "
        "null = the rollout loop plays env.name.",
    )
    success_reward: float = _f(
        1.0, "An agent episode counts as a success (rollout/success_rate, eval/success_rate) when its reward is at "
        "least this.",
    )
    batch_wait_s: float = _f(
        0.05, "Longest a request waits for the other running episodes' requests to join its batch; a batch goes at "
        "once when every running episode has a request waiting.",
    )
    request_timeout_s: float = _f(600.0, "The agent's client gives up on a request after this many seconds.")
    host: str = _f("127.0.0.1", "Address the endpoint listens on.")
    port: int = _f(0, "Port the endpoint listens on; 0 takes a free one.")


@dataclass
class AsyncConfig:
    """Asynchronous training (docs/scaling.md): a rollout worker generates while the trainer updates."""

    enable: bool = _f(
        False, "Train asynchronously: above async.max_staleness=0, `ragen2 train` starts rollout worker processes "
        "(async.local_workers) that keep producing groups while the trainer updates; logs async/ metrics.",
    )
    max_staleness: int = _f(
        1, "Largest number of updates between a sample's generation and its training; 0 is the synchronous run "
        "exactly (same samples, same metrics, no worker). Above 0, algo.rollout_is=token is the default unless "
        "algo.rollout_is is set.",
    )
    oversample: float = _f(
        1.0, "Candidate groups the filter ranks per step, as a multiple of rollout.num_groups; it keeps at most "
        "rollout.num_groups of them (admission control). One environment, filter.level=prompt.",
    )
    rollout_ranks: list[int] = _f(
        [], "Under torchrun or accelerate (async.max_staleness > 0), the global ranks that generate; the others "
        "train. Leave [] without a launcher: the run starts its own rollout worker on this machine.",
    )
    partial_rollouts: bool = _f(
        False, "Above async.max_staleness=0: a rollout worker loads newer weights as soon as they arrive, between "
        "turns, so an episode that spans an update continues with them; each turn records its version and the "
        "episode counts as its first turn's. Off: a step's episodes use one version throughout.",
    )
    local_workers: int = _f(
        1, "Without a launcher (async.max_staleness > 0): the rollout worker processes the run starts on this "
        "machine; each plays an equal share of a step's candidate groups (give each its cores: OMP_NUM_THREADS).",
    )

    def __post_init__(self) -> None:
        if self.max_staleness < 0:
            raise ConfigError(f"async.max_staleness={self.max_staleness} is not allowed: use 0 (synchronous) or more")
        if self.oversample < 1:
            raise ConfigError(f"async.oversample={self.oversample} is not allowed: use a number >= 1")
        if self.local_workers < 1:
            raise ConfigError(f"async.local_workers={self.local_workers} is not allowed: use 1 or more")


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    collapse: CollapseConfig = field(default_factory=CollapseConfig)
    filter: FilterConfig = field(default_factory=FilterConfig)
    grad_snr: GradSNRConfig = field(default_factory=GradSNRConfig)
    early_stop: EarlyStopConfig = field(default_factory=EarlyStopConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    agent: AgentConfig = field(default_factory=AgentConfig)
    # `async` is a Python keyword: the section is `async` in YAML and on the command line, `async_` in code.
    async_: AsyncConfig = field(default_factory=AsyncConfig, metadata={"key": "async"})


def _key(f: dataclasses.Field) -> str:
    """A field's config key: its name, unless its metadata names another (`async` for `async_`)."""
    return f.metadata.get("key", f.name)


# ----------------------------------------------------------------------------- building


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _check_value(path: str, value: Any, tp: Any) -> Any:
    """Return `value` converted to type `tp`, or raise ConfigError naming `path`."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in (a for a in args if a is not type(None)):
            try:
                return _check_value(path, value, arg)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(errors[0] if len(errors) == 1 else f"{path}: {value!r} fits none of {tp}")
    if origin is Literal:
        if value not in args:
            raise ConfigError(
                f"{path}={value!r} is not allowed; allowed values: {', '.join(map(repr, args))}."
                + did_you_mean(str(value), [str(a) for a in args])
            )
        return value
    if origin is list:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{path}={value!r} must be a list")
        return [_check_value(f"{path}[{i}]", v, args[0]) for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{path}={value!r} must be a mapping")
        return dict(value)
    if dataclasses.is_dataclass(tp):  # an element of a list of sections, such as env.mixture[0]
        if not isinstance(value, dict):
            raise ConfigError(f"{path}={value!r} must be a mapping of keys, e.g. {{name: sokoban}}")
        return _build(tp, value, f"{path}.")
    if tp is Any:
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{path}={value!r} must be true or false")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{path}={value!r} must be an integer")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{path}={value!r} must be a number")
        return float(value)
    if tp is str:
        if value is None:
            raise ConfigError(f"{path} must be a string, got null")
        return str(value)
    raise TypeError(f"unsupported config type {tp} at {path}")


# Keys that were removed, with what replaces them: a clear message instead of "unknown key".
REMOVED_KEYS = {
    "filter.eps": (
        "it mixed two tolerances, now separate keys. filter.zero_tol is the zero-variance test of "
        "include_zero=false, on the reward std (reference 1e-10; filter.eps was a tolerance on the variance, "
        "so eps=0.01 is zero_tol=0.1); filter.selection_eps is the slack of top_p's threshold (reference 0.01)."
    ),
}


def _build(cls: type, data: dict[str, Any], prefix: str) -> Any:
    attrs = {_key(f): f.name for f in dataclasses.fields(cls)}
    hints = {key: _hints(cls)[name] for key, name in attrs.items()}
    names = list(attrs)
    kwargs = {}
    for key, value in data.items():
        path = f"{prefix}{key}"
        if path in REMOVED_KEYS:
            raise ConfigError(f"config key {path!r} no longer exists: {REMOVED_KEYS[path]}")
        if key not in hints:
            while isinstance(value, dict) and value:  # `trainr.total_steps=5` arrives as {trainr: {total_steps: 5}}
                child, value = next(iter(value.items()))
                path = f"{path}.{child}"
            valid = [f"{prefix}{n}" for n in names]
            raise ConfigError(f"unknown config key {path!r}." + did_you_mean(path, all_keys() or valid))
        tp = hints[key]
        if dataclasses.is_dataclass(tp):
            if not isinstance(value, dict):
                raise ConfigError(f"{path} is a section; set its keys, e.g. {path}.{dataclasses.fields(tp)[0].name}=...")
            kwargs[attrs[key]] = _build(tp, value, f"{path}.")
        else:
            kwargs[attrs[key]] = _check_value(path, value, tp)
    return cls(**kwargs)


def all_keys(cls: type = Config, prefix: str = "") -> list[str]:
    """Every dotted key of the tree, e.g. 'algo.clip_high'."""
    keys = []
    for f in dataclasses.fields(cls):
        tp = _hints(cls)[f.name]
        if dataclasses.is_dataclass(tp):
            keys += all_keys(tp, f"{prefix}{_key(f)}.")
        else:
            keys.append(f"{prefix}{f.name}")
    return keys


def describe(cls: type = Config, prefix: str = "") -> list[tuple[str, str, str]]:
    """(dotted key, default as YAML, help) for every key: feeds --help and docs/config.md."""
    rows = []
    default = cls()
    for f in dataclasses.fields(cls):
        tp = _hints(cls)[f.name]
        value = getattr(default, f.name)
        if dataclasses.is_dataclass(tp):
            rows += describe(tp, f"{prefix}{_key(f)}.")
        else:
            shown = yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()
            rows.append((f"{prefix}{f.name}", shown, f.metadata.get("help", "")))
    return rows


# ----------------------------------------------------------------------------- presets


def _preset_dir() -> Path:
    return Path(str(resources.files("ragen2") / "configs"))


# A preset name is ENV, ENV-ALGO or ENV-ALGO-FILTER: one file from each of these folders, in this order.
_PRESET_PARTS = ("envs", "algos", "filters")


def _preset_choices() -> dict[str, list[str]]:
    """{folder: preset file stems} for the parts of a composed preset name."""
    d = _preset_dir()
    return {part: sorted(p.stem for p in (d / part).glob("*.yaml")) for part in _PRESET_PARTS}


def preset_names() -> list[str]:
    """Presets are `ENV`, `ENV-ALGO` (e.g. `frozenlake-ppo`) or `ENV-ALGO-FILTER` (e.g.
    `sokoban-ppo-nofilter`), plus any file in configs/."""
    choices = _preset_choices()
    extra = sorted(p.stem for p in _preset_dir().glob("*.yaml"))
    pairs = [f"{e}-{a}" for e in choices["envs"] for a in choices["algos"]]
    return extra + choices["envs"] + pairs + [f"{p}-{f}" for p in pairs for f in choices["filters"]]


def preset_pattern() -> str:
    """The preset names in one line (listing all of them would take a page)."""
    parts = "; ".join(
        f"{part.removesuffix('s').upper()} one of {', '.join(f'`{c}`' for c in choices)}"
        for part, choices in _preset_choices().items()
    )
    extra = "".join(f"; also `{p.stem}`" for p in sorted(_preset_dir().glob("*.yaml")))
    names = "`ENV`, `ENV-ALGO` or `ENV-ALGO-FILTER` (e.g. `sokoban-ppo-nofilter`)"
    return f"{names}, layered in that order, with {parts}{extra}"


def _load_yaml(path: Path) -> dict[str, Any]:
    """A config file's mapping; refuses invalid YAML (with its line and column) and an empty file."""
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(
            f"{path}: invalid YAML{where}: {problem}; write one `key: value` per line, nested keys indented"
        ) from e
    if data is None:
        raise ConfigError(
            f"{path} is empty (nothing but blanks or comments): a config file must set at least one key, "
            "e.g. `trainer: {total_steps: 50}`"
        )
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a config file must be a mapping of keys, got {type(data).__name__}")
    return data


def preset_layers(name: str) -> list[dict[str, Any]]:
    """The YAML layers a preset name stands for, lowest priority first."""
    d = _preset_dir()
    if (d / f"{name}.yaml").exists():
        return [_load_yaml(d / f"{name}.yaml")]
    files = [d / part / f"{stem}.yaml" for part, stem in zip(_PRESET_PARTS, name.split("-"))]
    if len(name.split("-")) <= len(_PRESET_PARTS) and all(f.exists() for f in files):
        return [_load_yaml(f) for f in files]
    external = _external_preset(name)
    if external is not None:
        return external
    path = Path(name)
    if path.suffix in (".yaml", ".yml") and path.is_file():
        return [_load_yaml(path)]
    if path.suffix in (".yaml", ".yml"):
        raise ConfigError(f"preset file {name} does not exist; pass an existing .yaml file or a preset name "
                          f"({preset_pattern()})")
    raise ConfigError(
        f"unknown preset {name!r}; presets: {preset_pattern()} (or a path to a .yaml file)."
        + did_you_mean(name, preset_names())
    )


def _external_preset(name: str) -> list[dict[str, Any]] | None:
    """Another suite's environment as a preset: `textarena:Sudoku-v0`, optionally followed by -ALGO[-FILTER]."""
    from ragen2.envs.external import is_external

    if not is_external(name):
        return None
    choices, parts = _preset_choices(), name.split("-")
    for tail in (2, 1, 0):  # the longest -ALGO-FILTER / -ALGO suffix that names shipped files
        env, rest = "-".join(parts[: len(parts) - tail]), parts[len(parts) - tail:]
        if all(stem in choices[part] for part, stem in zip(_PRESET_PARTS[1:], rest)) and len(parts) > tail:
            return [{"env": {"name": env}}] + [_load_yaml(_preset_dir() / p / f"{s}.yaml") for p, s in zip(_PRESET_PARTS[1:], rest)]
    return None


def load_config(preset: str | None = None, overrides: list[str] | None = None) -> Config:
    """Defaults <- preset layers <- `a.b=c` overrides, validated into a `Config`."""
    layers = [OmegaConf.create(layer) for layer in (preset_layers(preset) if preset else [])]
    for item in overrides or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"override {item!r} must look like key=value, e.g. algo.name=ppo")
        if key == "env":  # `env=frozenlake` is shorthand for env.name=frozenlake
            item = f"env.name={value}"
        layers.append(OmegaConf.from_dotlist([item]))
    merged = OmegaConf.to_container(OmegaConf.merge(*layers), resolve=True) if layers else {}
    config = _build(Config, _async_defaults(merged), "")
    validate(config)
    return config


def _async_defaults(merged: dict[str, Any]) -> dict[str, Any]:
    """With async.enable and async.max_staleness above 0, algo.rollout_is=token (truncated at
    algo.rollout_is_threshold, 2.0) unless a layer sets algo.rollout_is, null included: stale samples
    are corrected by default."""
    a = merged.get("async") or {}
    staleness = a.get("max_staleness", AsyncConfig.max_staleness)
    if a.get("enable") and isinstance(staleness, int) and staleness > 0 and "rollout_is" not in (
            merged.get("algo") or {}):
        merged = {**merged, "algo": {**(merged.get("algo") or {}), "rollout_is": "token"}}
    return merged


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
        if r.context_turns is not None or r.max_model_len is not None:
            raise ConfigError(f"rollout.tool_calls=true shows the whole history (tool results answer earlier "
                              f"calls): set rollout.context_turns=null and rollout.max_model_len=null (now "
                              f"{r.context_turns} and {r.max_model_len})")
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
    if config.env.mixture is not None or config.env.eval is not None:
        from ragen2.mixture import check_mixture

        check_mixture(config)


def _validate_agent(config: Config) -> None:
    """agent.entrypoint names a function of two arguments, and the settings it needs hold."""
    from ragen2.serve.entrypoint import load_entrypoint

    missing = [name for name in ("openai", "fastapi", "uvicorn") if importlib.util.find_spec(name) is None]
    if missing:
        raise ConfigError(f"agent.entrypoint needs {', '.join(missing)}, which are not installed: "
                          "pip install 'ragen2[agents]'")
    load_entrypoint(config.agent.entrypoint)
    g = config.agent
    if not (g.batch_wait_s >= 0 and g.request_timeout_s > 0 and 0 <= g.port <= 65535):
        raise ConfigError(f"agent.batch_wait_s={g.batch_wait_s}, agent.request_timeout_s={g.request_timeout_s}, "
                          f"agent.port={g.port}: need a wait >= 0 s, a timeout > 0 s and a port in 0..65535")
    if config.env.mixture is not None or config.env.eval is not None:
        raise ConfigError("agent.entrypoint runs the agent's own loop, not ragen2's environments: "
                          "leave env.mixture and env.eval unset")
    if config.rollout.backend != "hf":
        raise ConfigError(f"agent.entrypoint serves the policy with rollout.backend=hf; "
                          f"rollout.backend={config.rollout.backend} is not supported there")


def to_dict(config: Config) -> dict[str, Any]:
    return {_key(f): dataclasses.asdict(getattr(config, f.name)) for f in dataclasses.fields(config)}


def save_config(config: Config, path: Path) -> None:
    path.write_text(yaml.safe_dump(to_dict(config), sort_keys=False))


def config_from_file(path: Path) -> Config:
    """Re-load a resolved config.yaml written by `save_config` (for --resume and eval)."""
    config = _build(Config, _load_yaml(path), "")
    validate(config)
    return config


def _cell(text: str) -> str:
    """Text for a Markdown table cell: `|` escaped (GitHub renders `\\|` as `|`, code spans included)."""
    return text.replace("|", "\\|")


def config_markdown() -> str:
    """docs/config.md, generated from the dataclasses so it never drifts from the code."""
    lines = [
        "# Configuration",
        "",
        "Generated from `ragen2/config.py` (`python -m ragen2.config > docs/config.md`); a test keeps it current.",
        "",
        "Set keys as `key=value` after the preset: `ragen2 train frozenlake-ppo algo.clip_high=0.3`.",
        f"Presets: {preset_pattern()}.",
        "`ragen2 train` with no preset runs `default` (ragen2/configs/default.yaml, FrozenLake from a part-way "
        "policy); the defaults below, with no preset at all (`load_config()`), are Sokoban's run.",
        "",
        "| key | default | meaning |",
        "|---|---|---|",
    ]
    lines += [f"| `{k}` | `{_cell(d)}` | {_cell(h)} |" for k, d, h in describe()]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(config_markdown(), end="")
