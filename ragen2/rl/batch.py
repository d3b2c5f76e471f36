"""Turn trajectories into the padded tensors the update trains on.

A causal LM's logits at position t predict token t + 1, so every per-token tensor of the
update (log-probs, advantages, values, the loss mask) is *shifted*: it has T - 1 columns and
column t belongs to token t + 1 of `input_ids`. Building the shift once, here, keeps the
trainer free of off-by-one arithmetic:

    input_ids  [B, T]      x0 x1 x2 x3 ... (right-padded with the pad id)
    targets    [B, T - 1]  x1 x2 x3 ...    = input_ids[:, 1:]
    mask       [B, T - 1]  m1 m2 m3 ...    = loss_mask[:, 1:] (1 on tokens the model sampled)

A sequence is a whole episode in full-history mode and one turn otherwise
(`rollout.context_turns`); either way it carries its trajectory's episode return and group.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ragen2.agent.types import Trajectory


@dataclass
class Batch:
    """B training sequences padded to T tokens, with their trajectory-level labels.

    input_ids:      long  [B, T]      token ids, right-padded with the pad id
    attention_mask: long  [B, T]      1 on real tokens, 0 on padding
    targets:        long  [B, T - 1]  input_ids[:, 1:], the token each logit column predicts
    mask:           float [B, T - 1]  1 where the target is a token the policy generated (with
                                      filter.level=anchor, of a turn the filter kept)
    returns:        float [B]         episode return of the sequence's trajectory
    group_ids:      long  [B]         group (shared env seed) of the sequence's trajectory
    traj_index:     long  [B]         index of the sequence's trajectory in the input list

    Filled in by the trainer before the update, all float [B, T - 1] aligned with `targets`:

    advantages:     the advantage of every trained token (0 elsewhere)
    old_logp:       log-probs under the policy that sampled the batch
    ref_logp:       log-probs under the frozen reference (KL penalty only)
    old_values:     the critic's values at rollout time (PPO only)
    value_targets:  the critic's regression targets, the GAE returns (PPO only)
    is_weights:     off-policy importance weights (algo.rollout_is; ragen2.rl.losses.rollout_correction)

    rollout_logp:   float [B, T - 1], filled by `build_batch` when every turn recorded them: the
                    behaviour log-probs of the generated tokens at sampling time (0 elsewhere)
    """

    input_ids: Tensor
    attention_mask: Tensor
    targets: Tensor
    mask: Tensor
    returns: Tensor
    group_ids: Tensor
    traj_index: Tensor
    advantages: Tensor | None = None
    old_logp: Tensor | None = None
    ref_logp: Tensor | None = None
    old_values: Tensor | None = None
    value_targets: Tensor | None = None
    is_weights: Tensor | None = None
    rollout_logp: Tensor | None = None

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def select(self, rows: Tensor) -> Batch:
        """The sequences `rows` ([b] long), trimmed to their own longest sequence.

        Padding is on the right and attention is causal, so cutting trailing columns
        changes no logit of a real token: micro-batches only pay for their own length.
        """
        width = int(self.attention_mask[rows].sum(dim=1).max())
        columns = {"input_ids": width, "attention_mask": width}
        return Batch(
            **{
                name: None if value is None
                else value[rows] if value.ndim == 1
                else value[rows, : columns.get(name, width - 1)]
                for name, value in vars(self).items()
            }
        )

    def to(self, device: torch.device | str) -> Batch:
        return Batch(**{name: None if value is None else value.to(device) for name, value in vars(self).items()})


def build_batch(trajectories: list[Trajectory], pad_id: int) -> Batch:
    """Pad every training sample of `trajectories` into one `Batch`.

    Trajectories without samples (an environment that failed at reset) contribute no rows.
    Raises ValueError when no trajectory has a sample, since there is nothing to train on.
    """
    rows = [
        (ids, mask, i, traj)
        for i, traj in enumerate(trajectories)
        for ids, mask in traj.samples
    ]
    if not rows:
        raise ValueError("build_batch() got no training samples: every trajectory is empty")
    width = max(len(ids) for ids, *_ in rows)
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)  # [B, T]
    attention = torch.zeros((len(rows), width), dtype=torch.long)  # [B, T]
    loss_mask = torch.zeros((len(rows), width), dtype=torch.float32)  # [B, T]
    for r, (ids, mask, _, _) in enumerate(rows):
        if len(ids) != len(mask):
            raise ValueError(f"sample {r} has {len(ids)} token ids but a loss mask of {len(mask)}")
        input_ids[r, : len(ids)] = torch.tensor(ids)
        attention[r, : len(ids)] = 1
        loss_mask[r, : len(ids)] = torch.tensor(mask, dtype=torch.float32)
    return Batch(
        input_ids=input_ids,
        attention_mask=attention,
        targets=input_ids[:, 1:],
        mask=loss_mask[:, 1:],  # the first token is never predicted, so it is never trained
        returns=torch.tensor([traj.episode_return for *_, traj in rows], dtype=torch.float32),
        group_ids=torch.tensor([traj.group_id for *_, traj in rows], dtype=torch.long),
        traj_index=torch.tensor([i for _, _, i, _ in rows], dtype=torch.long),
        rollout_logp=_rollout_logprobs(trajectories, loss_mask[:, 1:]),
    )


def _rollout_logprobs(trajectories: list[Trajectory], mask: Tensor) -> Tensor | None:
    """[B, T-1] behaviour log-probs on the mask's tokens, or None when a turn did not record them.

    A trajectory's trained tokens, read row by row and left to right over its samples, are its turns'
    responses in order (one sample per episode, or one per turn), so its turns' log-probs fill them in turn.
    """
    with_samples = [traj for traj in trajectories if traj.samples]
    if not all(traj.turns and all(turn.logprobs is not None for turn in traj.turns) for traj in with_samples):
        return None
    out = torch.zeros_like(mask)
    row = 0
    for traj in trajectories:
        values = torch.tensor([lp for turn in traj.turns for lp in turn.logprobs], dtype=torch.float32)
        rows = slice(row, row + len(traj.samples))
        positions = mask[rows].bool()
        if int(positions.sum()) != len(values):
            raise ValueError(f"trajectory {traj.seed}/{traj.group_id}: {len(values)} recorded log-probs for "
                             f"{int(positions.sum())} trained tokens")
        out[rows][positions] = values
        row = rows.stop
    return out


def response_logits(model: torch.nn.Module, batch: Batch) -> tuple[Tensor, int]:
    """Logits that predict `batch.targets[:, start:]`, [B, T-1-start, V], and `start`.

    `start` is the first column any row's loss mask covers: the columns before it predict
    prompt tokens only. Prompts are most of a multi-turn sequence, so leaving those columns
    out of the output layer (Hugging Face's `logits_to_keep`) and out of the full-vocabulary
    softmaxes after it saves most of that work. Callers pad per-token results back to T-1
    columns with `F.pad(x, (start, 0))`.

    No attention mask goes to the model: padding is on the right and attention is causal, so no real
    token attends to a pad and every real token's logits are the same without it. Without a mask the
    attention kernels skip the blocks above the diagonal, half their work, which a padding mask stops.
    """
    covered = batch.mask.any(dim=0).nonzero()
    start = int(covered[0]) if len(covered) else 0
    keep = batch.input_ids.shape[1] - start
    logits = model(input_ids=batch.input_ids, logits_to_keep=keep).logits
    return logits[:, :-1], start
