"""SNR-aware filtering and collapse diagnostics inside verl's trainers, without forking verl.

    pip install 'ragen2[verl]'       # in its own environment: see docs/integrations.md

verl's current trainer (`trainer.use_v1=true`, the default in 0.9) takes its training batch
from a replay buffer, and lets the config swap in any subclass:

    trainer.v1.sampler.custom_sampler.path=pkg://ragen2.integrations.verl
    trainer.v1.sampler.custom_sampler.name=SNRReplayBuffer          # SNRReplayBufferAsync for the async modes
    +trainer.v1.sampler.sampler_kwargs.value=0.9                    # any `select_groups` option

`SNRReplayBuffer` lets verl's own buffer pick `batch_size` finished prompt groups, then reads
each trajectory's reward (`rm_scores`) from the transfer queue, builds the [P groups, G]
reward matrix by uid and keeps the groups `ragen2.filtering.select_groups` keeps: the same
call, and so the same groups, as `ragen2 train`. Dropped groups are cleared from the queue;
the kept ones go on to verl's next phases, which pad the batch to the sizes they need.

The older trainer (`trainer.use_v1=false`, `RayPPOTrainer`) passes a `DataProto` from phase
to phase; `filter_batch` is the same filter as a pure function over it. `collapse_metrics`
computes the MI proxies (`ragen2.collapse.metrics.mi_metrics`) from a `DataProto` that
carries cross log-probs, which `cross_log_probs` computes with a Hugging Face copy of the
policy. docs/integrations.md has copy-paste examples and says what is and is not supported.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

try:
    import torch
    import transfer_queue as tq
    from transfer_queue import KVBatchMeta
    from verl.protocol import DataProto
    from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer, ReplayBufferAsync
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "ragen2.integrations.verl needs verl 0.9 with its core runtime: pip install 'ragen2[verl]' "
        "(in an environment of its own, see docs/integrations.md)"
    ) from e

from ragen2.collapse.metrics import EmaState, mi_metrics
from ragen2.collapse.scoring import score_matrix
from ragen2.config import FilterConfig
from ragen2.errors import ConfigError, UnknownNameError, did_you_mean
from ragen2.filtering import REWARD_METRICS, FilterRule, group_stats, select_groups

# The settings of the filter rule that a verl config can set; their defaults are those of
# ragen2's `filter` section (the paper's main setting: top_p, rho = 0.9, zero-RV groups dropped).
FILTER_KEYS = tuple(f.name for f in dataclasses.fields(FilterRule))
SAMPLER_KWARGS = "trainer.v1.sampler.sampler_kwargs"
DEFAULT_MAX_RESAMPLES = 4


def filter_rule(options: Mapping[str, Any] | None = None, where: str = "filter") -> FilterRule:
    """The filter rule: ragen2's `filter` defaults updated by `options`.

    Checked here, at start, rather than at the first step after a rollout: an unknown key or
    a bad value raises ConfigError naming `where.<key>` and the allowed values.
    """
    options = dict(options or {})
    for key in options:
        if key not in FILTER_KEYS:
            raise ConfigError(
                f"unknown key {where}.{key}; valid: {', '.join(FILTER_KEYS)}." + did_you_mean(key, FILTER_KEYS)
            )
    rule = dataclasses.replace(FilterRule.of(FilterConfig()), **options)
    if rule.metric not in REWARD_METRICS:
        raise ConfigError(
            f"{where}.metric={rule.metric!r} is not supported in verl: the filter sees only rewards; "
            f"allowed values: {', '.join(REWARD_METRICS)}."
        )
    try:  # select_groups checks every setting; a dry run on one group of two episodes runs those checks
        select_groups(np.zeros((1, 2)), rule)
    except (ConfigError, UnknownNameError) as e:
        raise ConfigError(f"{where}: {e.args[0]}") from None
    return rule


def choose_groups(
    groups: Sequence[str], returns: np.ndarray, rule: FilterRule
) -> tuple[set[str], dict[str, float]]:
    """The groups to train on, and the filter's metrics, from each episode's group and return.

    groups: [N] group id (verl's uid) of each episode; returns: float [N] episode returns.
    Episodes form the reward matrix [P, G] in order of first appearance. A group with fewer
    episodes than the largest (some rollouts failed) has no row in it: it is kept unranked and
    counted as filter/incomplete_groups.
    """
    members: dict[str, list[int]] = {}
    for i, group in enumerate(groups):
        members.setdefault(group, []).append(i)
    size = max(len(m) for m in members.values())
    complete = [g for g, m in members.items() if len(m) == size]
    incomplete = [g for g, m in members.items() if len(m) < size]
    rewards = np.asarray(returns, dtype=np.float64)[np.array([members[g] for g in complete])]  # [P, G]
    kept = select_groups(rewards, rule)
    metrics = {f"rollout/{k}": v for k, v in group_stats(rewards, rule.ddof, rule.zero_tol).items()}
    metrics |= {
        "filter/kept_groups": float(len(kept)),
        "filter/kept_ratio": len(kept) / len(complete),
        "filter/incomplete_groups": float(len(incomplete)),
    }
    return {complete[i] for i in kept} | set(incomplete), metrics


# ----------------------------------------------------------------------------- the current trainer


def split_key(key: str) -> tuple[str, str, int]:
    """(uid, session, output index) of a transfer-queue trajectory key `{uid}_{session_id}_{index}`."""
    parts = key.rsplit("_", 2)
    if len(parts) != 3 or not parts[2].isdigit():
        raise ValueError(f"trajectory key {key!r} is not verl's '{{uid}}_{{session_id}}_{{index}}'")
    return parts[0], parts[1], int(parts[2])


class _SNRFilter:
    """Filtering on top of a verl replay buffer's `sample`; mixed into both of verl's buffers."""

    def __init__(self, *args: Any, sampler_kwargs: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, sampler_kwargs=sampler_kwargs, **kwargs)
        options = dict(sampler_kwargs or {})
        self.max_resamples = options.pop("max_resamples", DEFAULT_MAX_RESAMPLES)
        if type(self.max_resamples) is not int or self.max_resamples < 0:  # type(): True is no count
            raise ConfigError(f"{SAMPLER_KWARGS}.max_resamples={self.max_resamples!r} must be an integer >= 0")
        self.filter_rule = filter_rule(options, where=SAMPLER_KWARGS)

    def sample(self, global_steps: int, partition_id: str, batch_size: int) -> tuple[KVBatchMeta, dict]:
        """verl's batch of `batch_size` groups, less the groups the filter drops.

        When no group is kept (every group has zero reward variance and include_zero is false)
        the batch holds no training signal: it is dropped and a fresh one is generated, at most
        `max_resamples` times, as verl's own group filter (DAPO) refills.
        """
        batch, metrics = super().sample(global_steps=global_steps, partition_id=partition_id, batch_size=batch_size)
        if partition_id == "val":
            return batch, metrics
        for resamples in range(self.max_resamples + 1):
            keep, filter_metrics = self._choose(batch)
            kept = [key for key in batch.keys if split_key(key)[0] in keep]
            dropped = [key for key in batch.keys if split_key(key)[0] not in keep]
            if dropped:  # nothing else will read them: free the queue
                tq.kv_clear(keys=dropped, partition_id=batch.partition_id)
            if kept:
                return batch.select_keys(kept), metrics | filter_metrics | {"filter/resamples": float(resamples)}
            if resamples == self.max_resamples or self.refill_fn is None:
                break
            self.refill_fn(batch_size)
            batch, more = super().sample(global_steps=global_steps, partition_id=partition_id, batch_size=batch_size)
            metrics |= more
        raise RuntimeError(
            f"SNR filter: no group kept in {self.max_resamples + 1} batches of {batch_size} prompts: every group's "
            f"rewards are equal (reward std <= zero_tol={self.filter_rule.zero_tol}) or top_p kept none of them, "
            f"so the policy gets no task signal. Set {SAMPLER_KWARGS}.include_zero=true to train on them anyway, "
            "or raise max_resamples."
        )

    def _choose(self, batch: KVBatchMeta) -> tuple[set[str], dict[str, float]]:
        """Episode = session {uid}_{session_id}; its return is the reward of its final output, as in
        verl's GRPO over multi-trajectory sessions (`compute_advantage_for_multi_trajectories`)."""
        try:
            data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=["rm_scores"])
        except (KeyError, ValueError) as e:
            raise RuntimeError(
                "SNR filter: the sampled trajectories carry no rm_scores; the filter needs rewards when the replay "
                "buffer samples, as algorithm.filter_groups does: use a rule-based reward, or "
                "reward.reward_model.enable_resource_pool=True"
            ) from e
        final: dict[tuple[str, str], tuple[int, float]] = {}  # (uid, session) -> (index, reward) of its last output
        for key, scores in zip(batch.keys, data["rm_scores"].unbind(0), strict=True):
            uid, session, index = split_key(key)
            if (uid, session) not in final or final[uid, session][0] < index:
                final[uid, session] = (index, float(scores.sum()))
        groups = [uid for uid, _ in final]
        returns = np.array([reward for _, reward in final.values()])
        return choose_groups(groups, returns, self.filter_rule)


class SNRReplayBuffer(_SNRFilter, ReplayBuffer):
    """verl's sync replay buffer with SNR-aware filtering (trainer.v1.trainer_mode=sync)."""


class SNRReplayBufferAsync(_SNRFilter, ReplayBufferAsync):
    """verl's async replay buffer with SNR-aware filtering (colocate_async, separate_async)."""


# ----------------------------------------------------------------------------- the older trainer


def filter_batch(
    data: DataProto,
    size_divisor: int = 1,
    reward_key: str = "token_level_scores",
    **options: Any,
) -> tuple[DataProto, dict[str, float]]:
    """The rows of the groups `select_groups` keeps, as a DataProto that verl's next phases accept.

    data:         a batch with `non_tensor_batch["uid"]` [B] (the group of each row, verl's GRPO
                  index) and `batch[reward_key]` [B, response_length], token-level rewards whose
                  row sum is the episode's return (verl's own convention for `score`).
    size_divisor: verl chunks the batch evenly over data-parallel ranks (and mini-batches); the
                  kept rows are topped up to a multiple of it with rows of dropped groups whose
                  `response_mask` is zeroed. Those rows add nothing to the advantages' groups or
                  to the loss: verl's loss aggregation leaves out fully masked rows.
    options:      the filter rule's settings (FILTER_KEYS); defaults as ragen2's `filter` section.

    Kept rows keep their order; fillers come last. `meta_info` is copied, with the per-row
    `global_token_num` cut to the rows returned. When nothing is kept the result has no rows and
    metrics["filter/kept_groups"] is 0: skip the update, as `ragen2 train` does.
    """
    if isinstance(size_divisor, bool) or not (isinstance(size_divisor, int) and size_divisor >= 1):
        raise ConfigError(f"size_divisor={size_divisor!r} must be an integer >= 1")
    if reward_key not in data.batch.keys():
        raise ConfigError(
            f"filter_batch needs batch[{reward_key!r}], the token-level rewards; the batch has "
            f"{sorted(data.batch.keys())}. Call it after the reward phase."
        )
    uids, _ = _groups(data)
    returns = data.batch[reward_key].sum(-1).double().cpu().numpy()  # [B]
    keep, metrics = choose_groups(uids, returns, filter_rule(options))
    kept = [i for i, uid in enumerate(uids) if uid in keep]
    dropped = [i for i, uid in enumerate(uids) if uid not in keep]
    fill = (-len(kept)) % size_divisor if kept else 0
    if fill > len(dropped):
        raise ConfigError(f"the batch has {len(uids)} rows, not a multiple of size_divisor={size_divisor}")
    if fill and "response_mask" not in data.batch.keys():
        raise ConfigError("topping the batch up to size_divisor masks rows: add batch['response_mask'] first")
    rows = kept + dropped[:fill]
    out = data.select_idxs(np.array(rows, dtype=np.int64))
    if fill:
        out.batch["response_mask"][len(kept) :] = 0
    out.meta_info = dict(data.meta_info)
    if "global_token_num" in out.meta_info:  # per-row token counts, for verl's throughput metrics
        out.meta_info["global_token_num"] = [data.meta_info["global_token_num"][i] for i in rows]
    return out, metrics | {"filter/filler_rows": float(fill)}


def cross_log_probs(
    data: DataProto, model: torch.nn.Module, rows: Sequence[int] | None = None, micro_batch_size: int = 32
) -> torch.Tensor:
    """log p(response_m | prompt_j) [B, P] under a Hugging Face causal LM: the input of `collapse_metrics`.

    Scores the responses of `rows` (default: every row) under the prompt of each of the batch's
    P groups with `ragen2.collapse.score_matrix`: each prompt runs once and its key/value cache is
    reused for `micro_batch_size` responses at a time.
    A response is the `responses` tokens where `response_mask` is 1; rows not scored, or with no
    such token, hold NaN. The model is any copy of the policy on this process, e.g. the actor's
    Hugging Face checkpoint.
    """
    uids, columns = _groups(data)
    responses, mask = data.batch["responses"], data.batch["response_mask"].bool()  # [B, R]
    rows = [m for m in (range(len(uids)) if rows is None else rows) if mask[m].any()]
    out = torch.full((len(uids), len(columns)), float("nan"), dtype=torch.float64)
    if rows:
        reasonings = [responses[m][mask[m]].tolist() for m in rows]
        prompts = _prompt_ids(data, uids, columns)
        scores = score_matrix(model, None, prompts, reasonings, micro_batch_size=micro_batch_size)  # [rows, P]
        out[rows] = torch.from_numpy(scores)
    return out


def collapse_metrics(
    data: DataProto,
    cross_logp_key: str = "cross_log_probs",
    ema_state: EmaState | None = None,
    marginal: str = "mixture",
) -> dict[str, Any]:
    """`mi_metrics` (Retrieval-Acc, MI-Est, MI-ZScore, ...) of a batch whose rows are cross-scored.

    data.batch[cross_logp_key]: float [B, P], row m's response scored under the prompt of each of
        the batch's P groups, log p(response_m | prompt_j) summed over the response tokens
        (`cross_log_probs` computes it). Columns follow the groups (non_tensor_batch["uid"]) in
        order of first appearance. Rows that were not scored hold NaN in every column and are left out.
    data.batch["response_mask"]: [B, response_length]; its row sums are the token counts the
        per-token metrics divide by.
    data.batch["prompts"] with "attention_mask" (optional): groups whose prompts are the same
        tokens form one input class, as in `ragen2 diagnose`.

    Returns mi_metrics' dict, "ema_state" included: pass it back in at the next step.
    """
    for key in (cross_logp_key, "response_mask"):
        if key not in data.batch.keys():
            raise ConfigError(f"collapse_metrics needs batch[{key!r}]; the batch has {sorted(data.batch.keys())}")
    uids, columns = _groups(data)
    logp = data.batch[cross_logp_key].double().cpu().numpy()  # [B, P]
    if logp.shape != (len(uids), len(columns)):
        raise ConfigError(
            f"batch[{cross_logp_key!r}] has shape {tuple(logp.shape)}; expected [rows, groups] = "
            f"({len(uids)}, {len(columns)})"
        )
    scored = ~np.isnan(logp).all(axis=1)  # [B]
    lengths = data.batch["response_mask"].sum(-1).cpu().numpy()  # [B]
    column_of = {uid: j for j, uid in enumerate(columns)}
    source = np.array([column_of[uid] for uid in uids])  # [B]
    has_prompts = "prompts" in data.batch.keys() and "attention_mask" in data.batch.keys()
    input_ids = _prompt_ids(data, uids, columns) if has_prompts else None
    return mi_metrics(logp[scored], source[scored], lengths=lengths[scored], input_ids=input_ids,
                      ema_state=ema_state, marginal=marginal)


def _groups(data: DataProto) -> tuple[list[str], list[str]]:
    """The uid of every row [B], and the distinct uids in order of first appearance [P]."""
    if "uid" not in data.non_tensor_batch:
        raise ConfigError("the batch has no non_tensor_batch['uid']: verl's trainer adds it before generation")
    uids = [str(u) for u in data.non_tensor_batch["uid"]]
    return uids, list(dict.fromkeys(uids))


def _prompt_ids(data: DataProto, uids: list[str], columns: list[str]) -> list[list[int]]:
    """Each group's prompt tokens [P]: `prompts` of its first row, without the left padding."""
    prompts = data.batch["prompts"]  # [B, prompt_length], left-padded
    prompt_mask = data.batch["attention_mask"][:, : prompts.shape[1]].bool()
    first_row = [uids.index(uid) for uid in columns]
    return [prompts[i][prompt_mask[i]].tolist() for i in first_row]
