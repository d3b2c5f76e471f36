"""Keys and values a rollout already computed, kept so that the next turn prefills only what is new.

In a multi-turn episode the prompt of turn k+1 is the prompt of turn k, its response and the
environment's reply: without reuse every turn prefills the whole history again, and every
episode the shared system prompt. `PrefixStore` keeps, per row of the last generate call, the
token ids whose keys/values were computed and those keys/values; a new prompt takes the entry
with which it shares the longest prefix. Causal attention makes a prefix's keys/values depend
on the prefix alone, so any common prefix can be reused, not only an exact previous prompt.

The store is only valid for the weights that filled it: `HFBackend.reuse_prefixes()` opens it
for one rollout and drops it after, so an update between two rollouts can never be read
through a stale cache.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class CachedPrefix:
    """Token ids and, per layer, their keys and values ([heads, len(ids), head_dim] each)."""

    ids: list[int]
    keys: list[torch.Tensor]
    values: list[torch.Tensor]


class PrefixStore:
    """The cached prefixes of one rollout: `match` finds the longest reusable one for a prompt.

    With `keep_finished`, the entries of episodes that ended stay until the store is dropped, so
    that after the rollout every episode's keys/values are there (the collapse diagnostics
    score the rollout's prompts from them); without it a finished episode's entry goes with the
    next call, which bounds memory by the episodes still running.
    """

    def __init__(self, keep_finished: bool = False) -> None:
        self.keep_finished = keep_finished
        self.clear()

    def clear(self) -> None:
        """Forget every entry (at the start, or when the weights that computed them have been replaced)."""
        self.entries: list[CachedPrefix] = []
        self._ids = np.zeros((0, 0), dtype=np.int64)  # [entries, longest] ids, padded with -1
        self._lens = np.zeros(0, dtype=np.int64)
        self._continued: set[int] = set()  # id() of the entries a prompt of the current call holds whole

    def mark_continued(self, entry: CachedPrefix) -> None:
        """A prompt of the current call holds all of `entry`: its row's next entry will hold it too."""
        self._continued.add(id(entry))

    def replace(self, entries: list[CachedPrefix]) -> None:
        """Keep `entries` (the rows of the latest call) instead of the previous ones: an episode's
        newest entry extends its older ones. Finished episodes do not come back, so their entries
        go, unless `keep_finished`: then every older entry that no prompt continued stays."""
        if self.keep_finished:
            entries = [e for e in self.entries if id(e) not in self._continued] + entries
        self._continued = set()
        self.entries = entries
        width = max((len(e.ids) for e in entries), default=0)
        self._ids = np.full((len(entries), width), -1, dtype=np.int64)
        for i, e in enumerate(entries):
            self._ids[i, : len(e.ids)] = e.ids
        self._lens = np.array([len(e.ids) for e in entries], dtype=np.int64)

    def match(self, prompt: list[int]) -> tuple[CachedPrefix | None, int]:
        """The entry sharing the longest prefix with `prompt`, and that length (0 and None if none)."""
        if not self.entries:
            return None, 0
        return _longest_common_prefix(self._ids, self._lens, prompt, self.entries)


def common_prefix_length(prompts: list[list[int]]) -> int:
    """Length of the longest prefix all `prompts` share."""
    width = min(len(p) for p in prompts)
    ids = np.array([p[:width] for p in prompts], dtype=np.int64)  # [n, width]
    differs = np.flatnonzero((ids != ids[:1]).any(axis=0))
    return int(differs[0]) if differs.size else width


def _longest_common_prefix(
    ids: np.ndarray, lens: np.ndarray, prompt: list[int], entries: list[CachedPrefix]
) -> tuple[CachedPrefix | None, int]:
    width = min(ids.shape[1], len(prompt))
    if width == 0:
        return None, 0
    same = ids[:, :width] == np.asarray(prompt[:width], dtype=np.int64)  # [entries, width]
    # Length of each entry's run of matches from the start (argmin finds the first mismatch).
    shared = np.where(same.all(axis=1), width, same.argmin(axis=1))
    shared = np.minimum(shared, lens)
    best = int(shared.argmax())
    return (entries[best], int(shared[best])) if shared[best] > 0 else (None, 0)
