"""The configuration tree, declared once: `Config` and its sections, every key a dataclass field with a help text.

This module is the single place a key is added or documented: the builder (`build`), `--help` and
docs/config.md (`reference`) all read these fields. A section checks its own values in `__post_init__`,
because the trainer, the tests and library users also build sections directly; checks that relate
several sections live in `validate`. It is one file of some 600 lines on purpose: the sections in the
order docs/config.md lists them, so reading it top to bottom is reading every key.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

from ragen2.errors import ConfigError
from ragen2.tags import valid_action_sep


def _f(default: Any, help: str, **kw: Any) -> Any:
    """A dataclass field with a help string (shown by `--help` and docs/config.md)."""
    if isinstance(default, (dict, list)):
        return field(default_factory=lambda: type(default)(default), metadata={"help": help}, **kw)
    return field(default=default, metadata={"help": help}, **kw)


def _at_least_one(section: str, values: Any, names: tuple[str, ...]) -> None:
    """Refuse any of the integer keys `names` of `values` below 1, naming the key as `section.name`."""
    for name in names:
        if getattr(values, name) < 1:
            raise ConfigError(f"{section}.{name}={getattr(values, name)} is not allowed: use an integer >= 1")


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
    memory: Literal["full", "window", "summary"] = _f(
        "full",
        "What a prompt keeps of the episode (docs/memory.md). full: the whole history (one training sequence per "
        "episode). window: the last rollout.context_turns earlier turns (one sequence per turn). summary: the whole "
        "history until the next prompt would leave no room under rollout.memory_budget; then the policy writes a "
        "<memory>note</memory> (a sampled, trained turn) and later prompts hold the system prompt, the "
        "rollout.context_turns turns before the note, the note and the turns since (one sequence per segment).",
    )
    context_turns: int | None = _f(
        None,
        "Earlier turns shown: with rollout.memory=window the last k, with summary the k before a note; null = 1. "
        "Must be null with rollout.memory=full.",
    )
    memory_budget: int | None = _f(
        None,
        "rollout.memory=summary (needed there; read by no other mode): the most tokens a prompt may hold. A note "
        "is asked for while the prompt, a whole response (rollout.max_tokens_per_turn) and the request still fit.",
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
        _at_least_one("rollout", self, ("num_groups", "group_size", "max_turns", "max_actions_per_turn",
                                        "max_tokens_per_turn"))
        if self.context_turns is not None and self.context_turns < 0:
            raise ConfigError(
                f"rollout.context_turns={self.context_turns} is not allowed: use null (full history) or an integer >= 0"
            )
        if self.memory not in ("full", "window", "summary"):
            raise ConfigError(f"rollout.memory={self.memory!r} is not allowed: use full, window or summary")
        if self.memory == "full" and self.context_turns is not None:
            raise ConfigError(f"rollout.context_turns={self.context_turns} cuts the history, which rollout.memory=full "
                              "keeps whole: set rollout.memory=window (or summary), or rollout.context_turns=null")
        if self.memory == "summary":
            if self.memory_budget is None or self.memory_budget < 1:
                raise ConfigError(f"rollout.memory=summary needs rollout.memory_budget, the most tokens a prompt may "
                                  f"hold: an integer >= 1 (now {self.memory_budget})")
            if self.max_model_len is not None:
                raise ConfigError(f"rollout.memory=summary bounds prompts by rollout.memory_budget: set "
                                  f"rollout.max_model_len=null (now {self.max_model_len})")
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
        _at_least_one("collapse", self, ("compute_freq", "num_samples", "micro_batch_size", "alarm_patience"))
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
        _at_least_one("grad_snr", self, ("freq", "num_buckets"))


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
        _at_least_one("early_stop", self, ("rv_warmup", "rv_patience", "eval_patience"))
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
    train_roles: list[str] | None = _f(
        None, "The roles whose calls train (docs/agents.md, \"Roles\"): a call's role is its X-Ragen2-Role header, "
        "else the request's model field. Calls of other roles are served, recorded and count toward "
        "rollout.max_turns, with zero loss weight. null or [] = every call trains.",
    )


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


def config_key(f: dataclasses.Field) -> str:
    """A field's config key: its name, unless its metadata names another (`async` for `async_`)."""
    return f.metadata.get("key", f.name)
