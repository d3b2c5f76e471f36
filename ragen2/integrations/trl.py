"""SNR-aware filtering and collapse diagnostics inside TRL's GRPOTrainer; ragen2 environments in TRL.

    pip install 'ragen2[trl]'

    from ragen2.integrations.trl import Ragen2GRPOConfig, Ragen2GRPOTrainer

    args = Ragen2GRPOConfig(output_dir="out", reward_variance_filtering="top_p", reward_variance_top_p=0.9,
                            collapse_diagnostics=True, ...)          # every GRPOConfig field still works
    trainer = Ragen2GRPOTrainer(model=..., reward_funcs=..., args=args, train_dataset=...)

What the subclass changes, once per generation batch (`_generate_and_score_completions`):

- Filtering. TRL computes its advantages as usual. The rewards of every process are gathered
  (TRL does that itself, since groups can straddle processes), reshaped to [P groups, G] in
  the global order, and `ragen2.filtering.select_groups` picks the groups to keep: the same
  call, and so the same groups, as `ragen2 train`. Each process then takes its own slice of
  the global keep mask. Dropped completions stay in the batch (rows are never deleted, so
  every process still runs the same number of micro-batches); their advantage and loss mask
  are set to 0, so they add nothing to the loss or its token count.
- Loss scale. Masked rows still count in the denominator of the loss types that average
  over rows (grpo, sapo, luspo: mean over sequences; dr_grpo: rows x max_completion_length);
  there the policy and KL terms are multiplied by total/kept, which makes the loss the mean
  over the kept groups (the paper's setting): exactly when a generation batch is one optimizer
  step (TRL's default), in expectation over TRL's shuffle when it spans several. bnpo,
  dapo, cispo and vespo divide by the active tokens, which already exclude masked rows (the
  token count of dapo/cispo/vespo is recomputed after masking). On top of that,
  `reward_variance_loss_scale` applies `ragen2.filtering.loss_scale` (none / linear / sqrt).
- Collapse diagnostics. At step 1 and every `collapse_compute_freq` steps, before the update,
  the reasoning of each sampled completion (between `<think>` and `</think>` of its first
  response, as `ragen2 diagnose` reads TRL logs) is scored under the batch's prompts with the
  trainer's own model
  (`ragen2.collapse.score_matrix`) and `mi_metrics` turns the matrix into Retrieval-Acc,
  MI-Est, MI-ZScore(-EMA), ..., logged as `collapse/<metric>`.

`EnvRollout` plays ragen2 environments multi-turn as TRL's `rollout_func`; `episode_return`
is the matching reward function. docs/integrations.md has copy-paste examples and the list
of what is and is not supported.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ragen2.errors import ConfigError

TRL_INSTALL = "pip install 'ragen2[trl]'"
# The overrides below rely on GRPOTrainer internals (_calculate_rewards, the keys of the batch
# dict, _compute_loss, the loss types' denominators), which TRL changes between minor releases.
SUPPORTED_TRL = ("1.16",)


def check_trl_version(version: str) -> None:
    """Raise ImportError unless `version` is a TRL release this module was written and tested against."""
    minor = ".".join(version.split(".")[:2])
    if minor not in SUPPORTED_TRL:
        raise ImportError(
            f"ragen2.integrations.trl supports TRL {', '.join(v + '.x' for v in SUPPORTED_TRL)}, but TRL {version} "
            f"is installed; its GRPOTrainer internals differ. Install the supported version: {TRL_INSTALL}"
        )


try:
    import trl
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise ImportError(f"ragen2.integrations.trl needs TRL and datasets: {TRL_INSTALL}") from e
check_trl_version(trl.__version__)  # before anything else of TRL is imported: other versions may not import

from accelerate.utils import gather_object  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

from ragen2.agent.backends import HFBackend  # noqa: E402
from ragen2.agent.rollout import conversation, rollout  # noqa: E402
from ragen2.collapse.metrics import MARGINALS, EmaState, mi_metrics  # noqa: E402
from ragen2.collapse.offline import select_pairs  # noqa: E402
from ragen2.collapse.rollout_files import Record, split_completion  # noqa: E402
from ragen2.collapse.online import RECALL_KS  # noqa: E402
from ragen2.collapse.scoring import score_matrix  # noqa: E402
from ragen2.config import RolloutConfig  # noqa: E402
from ragen2.filtering import LOSS_SCALE_MODES, FilterRule, group_stats, loss_scale, select_groups  # noqa: E402

FILTER_STRATEGIES = ("top_p", "top_k")
# How each TRL 1.16 loss type normalises. Row-counting ones divide by a count that includes
# masked rows, so masking shrinks them by kept/total; token-counting ones divide by active tokens.
ROW_COUNTING_LOSSES = ("grpo", "sapo", "luspo", "dr_grpo")
TOKEN_COUNTING_LOSSES = ("bnpo", "dapo", "cispo", "vespo")
_FACTOR_KEY = "reward_variance_loss_factor"  # per-row copy of the batch's factor; survives TRL's shuffle/split


# ----------------------------------------------------------------------------- config


@dataclass
class Ragen2GRPOConfig(GRPOConfig):
    """`GRPOConfig` plus reward-variance filtering and collapse diagnostics (both off by default)."""

    reward_variance_filtering: str | None = field(
        default=None,
        metadata={"help": "SNR-aware filtering (RAGEN-2): None (off), 'top_p' (keep the highest-variance groups "
                          "holding reward_variance_top_p of the total variance; the paper's rule) or 'top_k' "
                          "(keep the reward_variance_top_k highest-variance groups)."},
    )
    reward_variance_top_p: float = field(
        default=0.9, metadata={"help": "Keep rate rho of 'top_p', in [0, 1]. Paper: 0.9."}
    )
    reward_variance_top_k: int | None = field(
        default=None, metadata={"help": "Number of groups 'top_k' keeps per generation batch (>= 1)."}
    )
    reward_variance_filtering_include_zero: bool = field(
        default=False,
        metadata={"help": "Let groups whose rewards are all equal (reward std <= 1e-10, the reference's test) be "
                          "ranked and kept. Paper: False (they carry no task gradient)."},
    )
    reward_variance_filtering_selection_eps: float = field(
        default=0.01, metadata={"help": "Slack of 'top_p': keep ranked groups until their summed variance reaches "
                                        "top_p x total - this. Reference: 0.01 (RAGEN's selection_eps)."}
    )
    reward_variance_loss_scale: str = field(
        default="none",
        metadata={"help": "Scale of the loss after filtering, with r = kept/total groups: 'none' (mean over the "
                          "kept groups; the paper), 'linear' (x r) or 'sqrt' (x sqrt(r)); as filter.loss_scale."},
    )
    collapse_diagnostics: bool = field(
        default=False,
        metadata={"help": "Log the MI proxies of template collapse (collapse/retrieval_acc, collapse/mi_zscore, "
                          "...): completions' reasoning scored under the batch's prompts with the policy."},
    )
    collapse_compute_freq: int = field(
        default=5, metadata={"help": "Compute the proxies at step 1 and every N steps. Reference: 5."}
    )
    collapse_num_samples: int = field(
        default=64, metadata={"help": "Completions whose reasoning is scored (the rows of the matrix)."}
    )
    collapse_micro_batch_size: int = field(default=32, metadata={"help": "Reasonings scored per forward pass."})
    collapse_marginal: str = field(
        default="mixture",
        metadata={"help": "Per-token marginal of MI-Est: 'mixture' (the paper's) or 'token_mean'."},
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_choice("reward_variance_filtering", self.reward_variance_filtering, (None, *FILTER_STRATEGIES))
        _check_choice("reward_variance_loss_scale", self.reward_variance_loss_scale, LOSS_SCALE_MODES)
        _check_choice("collapse_marginal", self.collapse_marginal, MARGINALS)
        if not 0 <= self.reward_variance_top_p <= 1:
            raise ConfigError(
                f"reward_variance_top_p={self.reward_variance_top_p} is not allowed: use a number in [0, 1]"
            )
        if self.reward_variance_filtering == "top_k":
            k = self.reward_variance_top_k
            if isinstance(k, bool) or not isinstance(k, int) or k < 1:
                raise ConfigError(
                    f"reward_variance_filtering='top_k' needs reward_variance_top_k, the number of groups to keep, "
                    f"as an integer >= 1; got {k!r}"
                )
        if not self.reward_variance_filtering_selection_eps >= 0:
            raise ConfigError(
                f"reward_variance_filtering_selection_eps={self.reward_variance_filtering_selection_eps} is not "
                "allowed: use a number >= 0"
            )
        for name in ("collapse_compute_freq", "collapse_num_samples", "collapse_micro_batch_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name}={getattr(self, name)} is not allowed: use an integer >= 1")


def _check_choice(key: str, value: Any, allowed: Sequence[Any]) -> None:
    if value not in allowed:
        raise ConfigError(f"{key}={value!r} is not allowed; allowed values: {', '.join(map(repr, allowed))}")


# ----------------------------------------------------------------------------- filtering (pure functions)


def group_rewards(rewards_per_func: np.ndarray, weights: np.ndarray, num_generations: int) -> np.ndarray:
    """The weighted reward of every completion as [P groups, G], in the gathered (global) order.

    rewards_per_func: float [N, F], NaN where a reward function returned None. A completion
    no function scored takes its group's mean (it adds no spread); a group nobody scored is 0.
    Filtering always ranks these raw rewards, whatever TRL's `multi_objective_aggregation`.
    """
    per_func = np.asarray(rewards_per_func, dtype=np.float64)
    scored = ~np.isnan(per_func).all(axis=1)  # [N]
    rewards = np.where(scored, np.nansum(per_func * np.asarray(weights)[None, :], axis=1), np.nan)
    if rewards.size % num_generations:
        raise ValueError(f"{rewards.size} rewards do not split into groups of num_generations={num_generations}")
    grouped = rewards.reshape(-1, num_generations)  # [P, G]
    counts = (~np.isnan(grouped)).sum(axis=1, keepdims=True)
    means = np.divide(np.nansum(grouped, axis=1, keepdims=True), counts, out=np.zeros_like(counts, float),
                      where=counts > 0)
    return np.where(np.isnan(grouped), means, grouped)


def select_reward_variance_groups(
    rewards: np.ndarray,
    strategy: str,
    top_p: float = 0.9,
    top_k: int | None = None,
    include_zero: bool = False,
    selection_eps: float = 0.01,
) -> np.ndarray:
    """Indices of the groups to train on, int64 [K] ascending, from rewards [P, G]: `select_groups`' choice.

    'top_p' is `select_groups(rewards, FilterRule("top_p", top_p, ...))`. 'top_k' keeps min(top_k, C) of the C
    candidates, at least one (`select_groups`' "top_k" rule with the fraction min(top_k, P) / P).
    """
    if strategy == "top_p":
        return select_groups(rewards, FilterRule("top_p", top_p, include_zero=include_zero, selection_eps=selection_eps))
    if strategy != "top_k":
        raise ConfigError(f"strategy={strategy!r} is not allowed; allowed values: {', '.join(FILTER_STRATEGIES)}")
    if top_k is None or top_k < 1:
        raise ConfigError(f"strategy 'top_k' needs top_k >= 1 groups; got {top_k!r}")
    num_groups = len(rewards)
    return select_groups(rewards, FilterRule("top_k", min(top_k, num_groups) / num_groups, include_zero=include_zero))


def process_keep_mask(
    kept_groups: np.ndarray, num_groups: int, num_generations: int, process_index: int, num_local: int
) -> np.ndarray:
    """bool [num_local]: which of this process's rows belong to a kept group.

    TRL lays the generation batch out globally group by group (row r is in group r // G) and
    gives process i the rows [i * num_local, (i + 1) * num_local), so a group can straddle two
    processes; selecting on the gathered rewards and slicing the global mask keeps both halves
    of a group together.
    """
    keep_rows = np.zeros(num_groups, dtype=bool)
    keep_rows[np.asarray(kept_groups, dtype=np.int64)] = True
    global_mask = np.repeat(keep_rows, num_generations)  # [N]
    start = process_index * num_local
    if start + num_local > global_mask.size:
        raise ValueError(f"process {process_index} x {num_local} rows is past the {global_mask.size} gathered rows")
    return global_mask[start : start + num_local]


def loss_factor(loss_type: str, kept: int, total: int, mode: str) -> float:
    """What multiplies the policy and KL terms of the masked batch (see the module docstring)."""
    if loss_type not in ROW_COUNTING_LOSSES + TOKEN_COUNTING_LOSSES:
        raise ConfigError(
            f"loss_type={loss_type!r} is not supported with reward_variance_filtering; supported: "
            f"{', '.join(ROW_COUNTING_LOSSES + TOKEN_COUNTING_LOSSES)}"
        )
    if kept == 0:  # everything is masked: the loss is 0 whatever the factor
        return 1.0
    factor = loss_scale(kept, total, mode)
    return factor * total / kept if loss_type in ROW_COUNTING_LOSSES else factor


# ----------------------------------------------------------------------------- trainer


@dataclass
class Selection:
    """The filter's decision on the last training generation batch (all processes agree on it)."""

    rewards: np.ndarray  # [P, G] the gathered rewards it ranked
    kept_groups: np.ndarray  # [K] global group indices, ascending
    keep: np.ndarray  # bool [local rows] this process's slice of the keep mask
    factor: float  # loss_factor applied to the kept rows


class Ragen2GRPOTrainer(GRPOTrainer):
    """GRPOTrainer with reward-variance filtering and collapse diagnostics; takes a `Ragen2GRPOConfig`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        config = kwargs.get("args", args[2] if len(args) > 2 else None)
        if not isinstance(config, Ragen2GRPOConfig):
            raise ConfigError(
                f"Ragen2GRPOTrainer needs args=Ragen2GRPOConfig(...) (a GRPOConfig with the reward_variance_* and "
                f"collapse_* fields); got {type(config).__name__}"
            )
        if config.reward_variance_filtering is not None:
            loss_factor(config.loss_type, 1, 1, config.reward_variance_loss_scale)  # unsupported loss types fail here
        super().__init__(*args, **kwargs)
        self.last_selection: Selection | None = None
        self._collapse_ema: EmaState | None = None
        self._rewards_per_func: torch.Tensor | None = None
        self._completion_ids: list[list[int]] = []

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):  # noqa: ANN001, ANN202
        """TRL's rewards, gathered over processes; kept (with this process's completions) for the filter."""
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._rewards_per_func = rewards_per_func
        self._completion_ids = [list(ids) for ids in completion_ids_list]
        return rewards_per_func

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        output = super()._generate_and_score_completions(inputs)
        args: Ragen2GRPOConfig = self.args
        training = self.model.training
        if training and args.collapse_diagnostics:
            step = self.state.global_step + 1  # the step this batch trains
            if step == 1 or step % args.collapse_compute_freq == 0:
                for key, value in self._collapse_metrics(output, step).items():
                    self._metrics["train"][f"collapse/{key}"].append(value)
        if args.reward_variance_filtering is not None:
            num_rows = self._rewards_per_func.shape[0]
            global_keep = np.ones(num_rows, dtype=bool)  # evaluation batches are not filtered
            if training:
                kept = self._filter(output)
                G = self.num_generations
                global_keep = process_keep_mask(kept, num_rows // G, G, process_index=0, num_local=num_rows)
            self._log_kept(global_keep)
        return output

    def _filter(self, output: dict[str, Any]) -> np.ndarray:
        """Select on the gathered rewards, mask this process's slice of `output` in place; return the kept groups."""
        args: Ragen2GRPOConfig = self.args
        G = self.num_generations
        rewards = group_rewards(self._rewards_per_func.float().cpu().numpy(), self.reward_weights.cpu().numpy(), G)
        kept = select_reward_variance_groups(
            rewards, args.reward_variance_filtering, args.reward_variance_top_p, args.reward_variance_top_k,
            args.reward_variance_filtering_include_zero, args.reward_variance_filtering_selection_eps,
        )
        num_local = output["advantages"].shape[0]
        keep = process_keep_mask(kept, rewards.shape[0], G, self.accelerator.process_index, num_local)
        factor = loss_factor(args.loss_type, len(kept), rewards.shape[0], args.reward_variance_loss_scale)

        device = output["advantages"].device
        keep_t = torch.as_tensor(keep, device=device)
        output["advantages"] = output["advantages"] * keep_t.to(output["advantages"].dtype)
        tool_mask = output.get("tool_mask", torch.ones_like(output["completion_mask"]))
        output["tool_mask"] = tool_mask * keep_t[:, None].to(tool_mask.dtype)  # the loss-only mask: attention untouched
        loss_mask = output["completion_mask"] * output["tool_mask"]
        output["num_items_in_batch"] = self.accelerator.gather(loss_mask.sum()).sum()  # dapo/cispo/vespo's denominator
        output[_FACTOR_KEY] = torch.full((num_local,), factor, device=device)
        self.last_selection = Selection(rewards, kept, keep, factor)

        metrics = self._metrics["train"]
        for key, value in group_stats(rewards).items():
            metrics[f"reward_variance/{key}"].append(value)
        metrics["reward_variance/kept_groups"].append(float(len(kept)))
        metrics["reward_variance/kept_ratio"].append(len(kept) / rewards.shape[0])
        metrics["reward_variance/loss_factor"].append(factor)
        return kept

    def _log_kept(self, keep: np.ndarray) -> None:
        """Completion logs: a `reward_variance_kept` column, and 0 as the advantage of a dropped completion."""
        logged = self._logs["advantages"]  # TRL just appended this batch's N gathered advantages
        advantages = [a if k else 0.0 for a, k in zip(list(logged)[-len(keep):], keep)]
        for _ in keep:
            logged.pop()
        logged.extend(advantages)
        self._logs["extra"]["reward_variance_kept"].extend(bool(k) for k in keep)

    def _compute_loss(self, model, inputs):  # noqa: ANN001, ANN202
        """TRL's loss with the policy and KL terms times the batch's loss factor (both are linear in it)."""
        factor = inputs.get(_FACTOR_KEY)
        if factor is None:
            return super()._compute_loss(model, inputs)
        c = float(factor[0])
        beta = self.beta
        self.beta = beta * c
        try:
            return super()._compute_loss(model, {**inputs, "advantages": inputs["advantages"] * c})
        finally:
            self.beta = beta

    def _first_responses(self, output: dict[str, Any]) -> list[list[int]]:
        """This process's completions up to their first environment token (`tool_mask` 0), if any.

        A multi-turn completion (tools, `EnvRollout`) holds later turns after that token; the
        first-turn scheme scores the first response only.
        """
        tool_mask = output.get("tool_mask")  # [B, T], padded with 1; None for single-turn generation
        if tool_mask is None:
            return self._completion_ids
        out = []
        for ids, mask in zip(self._completion_ids, tool_mask.tolist()):
            env = mask[: len(ids)].index(0) if 0 in mask[: len(ids)] else len(ids)
            out.append(ids[:env] if env > 0 else ids)  # all 0: masked as truncated, not an env turn
        return out

    def _collapse_metrics(self, output: dict[str, Any], step: int) -> dict[str, float]:
        """MI proxies of this generation batch, scored with the current (not yet updated) policy.

        Every process gathers the whole batch and computes the same matrix, so sharded models
        (FSDP, ZeRO-3) see the same forward passes on every rank.
        """
        args: Ragen2GRPOConfig = self.args
        prompt_ids = [ids[mask.bool()].tolist() for ids, mask in zip(output["prompt_ids"], output["prompt_mask"])]
        rows = gather_object(list(zip(prompt_ids, self._first_responses(output))))  # [N] (prompt, response ids)
        tokenizer = self._tokenizer
        records = []
        for r, (prompt, completion) in enumerate(rows):
            prefix, reasoning, _ = split_completion(tokenizer.decode(completion, skip_special_tokens=True))
            records.append(Record(r, r // self.num_generations, str(prompt), reasoning, episode=r, turn=0,
                                  prefix=prefix))
        selection = select_pairs(records, "first_turn", args.collapse_num_samples,
                                 np.random.default_rng([args.seed, step]))
        out = {"valid_thinking_rate": selection.valid_thinking_rate}
        if not selection.pairs:
            return out | {"num_pairs": 0.0}

        def encode(text: str) -> list[int]:
            return tokenizer(text, add_special_tokens=False)["input_ids"]

        inputs = [rows[i][0] + encode(records[i].prefix) for i in selection.columns]  # [P] X_j
        reasonings = [encode(records[i].reasoning) for i in selection.pairs]  # [M] Z_m
        model = self.accelerator.unwrap_model(self.model)
        logp = score_matrix(model, tokenizer, inputs, reasonings, micro_batch_size=args.collapse_micro_batch_size)
        result = mi_metrics(logp, np.array(selection.source), lengths=np.array([len(z) for z in reasonings]),
                            input_ids=inputs, ks=RECALL_KS, ema_state=self._collapse_ema,
                            marginal=args.collapse_marginal)
        self._collapse_ema = result.pop("ema_state")
        # A proxy the batch cannot support is NaN (too few pairs or inputs): left out of the log, as in training.
        return out | {key: float(value) for key, value in result.items() if np.isfinite(value)}


# ----------------------------------------------------------------------------- environments as rollout_func


class EnvRollout:
    """A ragen2 environment played multi-turn, as TRL's `rollout_func` (one callable, one dataset).

        config = load_config("sokoban")
        env_rollout = EnvRollout("sokoban", tokenizer, config.rollout, env_kwargs=config.env.kwargs)
        trainer = GRPOTrainer(..., train_dataset=env_rollout.dataset(range(64)), rollout_func=env_rollout,
                              reward_funcs=[episode_return])

    Each dataset row's prompt is the environment's first-turn prompt for one seed, rendered the
    way `ragen2 train` renders it (chat template, generation prefix, `<think>`), and logged by
    TRL as such. The call plays each prompt's episode with ragen2's rollout loop (full
    history: the episode is one sequence) using the trainer's model, and returns, per
    completion, the first prompt's ids, everything after it (responses and the environment's
    turns) and `env_mask` (1 on the model's tokens, 0 on the environment's), plus
    `episode_return` and `success` for the reward functions. Sampling uses the trainer's
    `temperature` and `top_p`, since TRL scores the tokens at that temperature.
    """

    def __init__(
        self,
        env: str,
        tokenizer: Any,
        rollout_config: RolloutConfig | None = None,
        env_kwargs: dict[str, Any] | None = None,
        stop_strings: tuple[str, ...] = ("</answer>",),
    ) -> None:
        from ragen2 import envs

        self.env_name = env
        self.env_kwargs = dict(env_kwargs or {})
        self.tokenizer = tokenizer
        self.config = rollout_config or RolloutConfig()
        if self.config.memory != "full":  # a window or notes split an episode into several samples
            raise ConfigError(f"EnvRollout needs rollout memory='full' (the whole episode is one TRL completion); "
                              f"got memory={self.config.memory!r}")
        if self.config.max_model_len is not None:
            raise ConfigError(f"EnvRollout needs rollout max_model_len=None (the whole episode is one TRL "
                              f"completion); got max_model_len={self.config.max_model_len}")
        self.stop_strings = stop_strings
        self._make = lambda: envs.make(env, **self.env_kwargs)
        self._make()  # unknown names and bad kwargs fail here, not at the first step
        self.seed_of: dict[str, int] = {}

    def first_prompt(self, seed: int) -> str:
        """The text the model sees before its first response in episode `seed` (ends with `<think>`)."""
        env = self._make()
        observation, _ = env.reset(seed=seed)
        conv = conversation(self.tokenizer, env.instruction, self.config)  # the rollout's turn format
        conv.add_observation(observation, env.max_actions)
        return self.tokenizer.decode(conv.prompt_ids(), skip_special_tokens=False)

    def dataset(self, seeds: Iterable[int]) -> Any:
        """A `datasets.Dataset` with columns `prompt` (the first-turn prompt) and `seed`.

        TRL hands a rollout_func only the prompts, so the prompt must identify the episode: a
        seed whose first prompt repeats an earlier seed's is left out (in a fully observed
        environment such as Sokoban it is the same episode).
        """
        import datasets

        rows: dict[str, list[Any]] = {"prompt": [], "seed": []}
        for seed in seeds:
            prompt = self.first_prompt(int(seed))
            if prompt not in self.seed_of:
                self.seed_of[prompt] = int(seed)
                rows["prompt"].append(prompt)
                rows["seed"].append(int(seed))
        return datasets.Dataset.from_dict(rows)

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, list[Any]]:
        unknown = [p for p in prompts if not isinstance(p, str) or p not in self.seed_of]
        if unknown:
            raise ValueError(
                f"EnvRollout got a prompt it did not build ({str(unknown[0])[:80]!r}); train on "
                "EnvRollout.dataset(seeds) of this same object"
            )
        groups: dict[str, int] = {}
        group_ids = [groups.setdefault(p, len(groups)) for p in prompts]
        cfg = dataclasses.replace(self.config, temperature=trainer.args.temperature, top_p=trainer.args.top_p)
        model = trainer.accelerator.unwrap_model(trainer.model)
        backend = HFBackend(model, self.tokenizer, stop_strings=self.stop_strings)
        trajectories = rollout(backend, self.tokenizer, self.env_name, self.env_kwargs,
                               [self.seed_of[p] for p in prompts], group_ids, cfg)
        eos = self.tokenizer.eos_token_id
        out: dict[str, list[Any]] = {k: [] for k in ("prompt_ids", "completion_ids", "env_mask", "episode_return",
                                                     "success")}
        for traj in trajectories:
            if not traj.samples:
                raise RuntimeError(f"{self.env_name} seed {traj.seed}: the episode has no turn ({traj.error})")
            ids, mask = traj.samples[0]
            head, end = mask.index(1), len(mask) - mask[::-1].index(1)  # first and one past the last model token
            # The template's end-of-turn after the last response ends at EOS: cut there, so TRL
            # does not count the episode as a completion cut off by max_completion_length.
            tail = ids[end:]
            if eos in tail:
                end += tail.index(eos) + 1
            out["prompt_ids"].append(ids[:head])
            out["completion_ids"].append(ids[head:end])
            out["env_mask"].append(mask[head:end])
            out["episode_return"].append(float(traj.episode_return))
            out["success"].append(float(traj.success))
        return out | {"logprobs": None}


def episode_return(completions: list[Any], episode_return: list[float], **_: Any) -> list[float]:
    """Reward function for `EnvRollout`: the episode's return (env rewards plus format penalties)."""
    return [float(r) for r in episode_return]


__all__ = [
    "EnvRollout",
    "Ragen2GRPOConfig",
    "Ragen2GRPOTrainer",
    "Selection",
    "check_trl_version",
    "episode_return",
    "group_rewards",
    "loss_factor",
    "process_keep_mask",
    "select_reward_variance_groups",
]
