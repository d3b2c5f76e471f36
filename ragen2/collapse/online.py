"""The MI proxies during training: sample (input, reasoning) pairs from a batch, score, measure.

The trainer makes one call per step, before filtering (SPEC §4: the proxies describe the policy
that produced the batch, not the subset it trains on):

    result = diagnostics.step(policy, tokenizer, trajectories, step)
    metrics |= result.metrics                       # {} on steps off the schedule
    if result.alarm is not None: ...                # warn, log the event, maybe stop

Two sampling schemes, logged under separate prefixes (RAGEN-2, Sec. 4):

- `collapse_first_turn/`: first turns only. Every group's episodes share an environment seed,
  so their first prompts are identical; the columns are the groups' first prompts (P of them)
  and up to `num_samples` first-turn reasonings are scored under all of them.
- `collapse_trajectory/`: `num_samples` times, a trajectory uniformly, then one of its turns
  uniformly. Later turns carry the whole dialogue, so every pair's prompt is its own column
  (P ~ num_samples); identical prompts still form one class through `input_ids`.
- `collapse_turn_K/` (K = 2 .. `collapse.per_turn`, off by default): turn K alone, drawn as the
  first turns are. Does turn K's reasoning still depend on what turn K shows?
- `collapse_role/<role>/`: the trajectory scheme's pairs of each agent role (`Turn.role`, set by agent
  loops behind the endpoint) scored against that role's inputs only, from the same scores.
- `collapse_memory/`: memory notes (`rollout.memory=summary`; `Turn.memory`) against the prompts they were
  written from, the history they summarise: up to `num_samples` notes, each prompt its own column. Does the
  note still depend on what it summarises? Drawn only from a batch that has notes. The reasoning schemes
  above draw from the acting turns only.

The reasoning Z is `turn.response_ids[start:end]` for the turn's `reasoning_span`; the input X
is `turn.prompt_ids` (it ends with `<think>`). Turns with empty reasoning are dropped and
counted as `valid_thinking_rate`. Sampling is drawn from (seed, step) alone, so a resumed run
samples exactly as the uninterrupted one; the EMA scales of MI-ZScore-EMA and the alarm's
state are carried across steps and saved with checkpoints through `state_dict`.

Asynchronous training passes each group's staleness (updates between the policy that sampled it and
the one being trained): every scheme's pairs are then also split by the staleness of their groups,
`async/staleness_<k>/collapse_<scheme>/<metric>` (`staleness_metrics`), from the same scores.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ragen2.agent.prefix_cache import PrefixStore
from ragen2.agent.types import Trajectory, Turn
from ragen2.collapse.alarm import AlarmDecision, CollapseAlarm
from ragen2.collapse.metrics import EmaState, mi_metrics
from ragen2.collapse.scoring import score_matrices
from ragen2.config import CollapseConfig, Config

SCHEMES = ("first_turn", "trajectory")
MEMORY_SCHEME = "memory"  # notes against the histories they summarise, where a batch has notes
RECALL_KS = (2, 4, 8)  # recall@1 is retrieval_acc, logged once
EMA_KEYS = ("mi_zscore_ema", "marginal_std_ema")  # left out where no EMA is carried from check to check


@dataclass
class Pairs:
    """What one sampling scheme hands to the scorer: P inputs, M reasonings, and who came from where."""

    prompts: list[list[int]]  # P token-id sequences X_j (the columns)
    reasonings: list[list[int]]  # M non-empty token-id sequences Z_m
    source: list[int]  # M column indices i(m)
    valid_thinking_rate: float  # share of the turns considered whose reasoning was non-empty
    column_tags: list[str] = field(default_factory=list)  # P: the mixture tag of each input (ragen2.mixture)
    column_groups: list[int] = field(default_factory=list)  # P: the group (shared env seed) of each input
    column_roles: list[str | None] = field(default_factory=list)  # P: the agent role of each input's call (Turn.role)


@dataclass
class StepResult:
    """What `OnlineDiagnostics.step` returns: the metrics to log and the alarm, if it fired."""

    metrics: dict[str, float] = field(default_factory=dict)
    alarm: AlarmDecision | None = None


class OnlineDiagnostics:
    """MI proxies on the training batch at step 1 and every `compute_freq` steps, plus the alarm."""

    def __init__(self, config: CollapseConfig, seed: int, run: Config | None = None, per_tag: bool = False) -> None:
        """`run`: the whole run's config, for the advice of the alarm's message (None: the defaults').
        `per_tag`: also the proxies within each mixture tag (`collapse_<scheme>/<tag>/<metric>`, `split_metrics`)."""
        self.config = config
        self.seed = seed
        self.per_tag = per_tag
        # The paper's two schemes, then one per later turn index when collapse.per_turn asks for it.
        self.schemes = SCHEMES + tuple(f"turn_{k}" for k in range(2, config.per_turn + 1))
        self.ema: dict[str, EmaState | None] = {scheme: None for scheme in self.schemes}
        self.alarm = CollapseAlarm(config, run)

    def should_run(self, step: int) -> bool:
        """Step 1, then every `compute_freq` steps (1, 5, 10, ... with the reference's 5)."""
        return self.config.enable and (step == 1 or step % self.config.compute_freq == 0)

    def step(
        self, model: torch.nn.Module, tokenizer: Any, trajectories: Sequence[Trajectory], step: int,
        prefixes: PrefixStore | None = None, staleness: Mapping[int, int] | None = None,
    ) -> StepResult:
        """The trainer's one call per step: metrics when scheduled, then the alarm on them."""
        if not self.should_run(step):
            return StepResult()
        metrics = self.run(model, tokenizer, trajectories, step, prefixes, staleness)
        return StepResult(metrics, self.alarm.update(step, metrics))

    def run(
        self, model: torch.nn.Module, tokenizer: Any, trajectories: Sequence[Trajectory], step: int,
        prefixes: PrefixStore | None = None, staleness: Mapping[int, int] | None = None,
    ) -> dict[str, float]:
        """Both schemes' proxies on `trajectories` (the unfiltered batch), scored by `model`.

        `prefixes`: the keys/values the rollout of `trajectories` computed with `model`'s
        current weights, if it kept them (see `score_matrices`); prompts found there are not
        encoded again.

        Returns `collapse_<scheme>/<metric>` for every number `mi_metrics` returns, plus
        `collapse_<scheme>/valid_thinking_rate`. A scheme with no non-empty reasoning reports
        only `valid_thinking_rate` and `num_pairs` (0), and its EMA state is left as it was.
        A proxy the batch cannot support (NaN from `mi_metrics`: fewer than 2 pairs, one distinct
        input, zero spread) is left out of the dict, not logged as NaN or as a made-up number;
        `num_pairs` and `num_distinct_inputs` are always there to say why.

        `staleness`: each group's staleness (group id -> updates), to add `staleness_metrics`.
        """
        out: dict[str, float] = {}
        drawn: dict[str, Pairs] = {}
        notes = any(turn.memory for t in trajectories for turn in t.turns)
        schemes = self.schemes + ((MEMORY_SCHEME,) if notes else ())
        for stream, scheme in enumerate(schemes):
            rng = np.random.default_rng([self.seed % 2**63, step, stream])
            if scheme == "trajectory":
                drawn[scheme] = trajectory_pairs(trajectories, self.config.num_samples, rng)
            elif scheme == MEMORY_SCHEME:
                drawn[scheme] = memory_pairs(trajectories, self.config.num_samples, rng)
            else:  # first_turn, turn_K
                turn = 0 if scheme == "first_turn" else int(scheme.removeprefix("turn_")) - 1
                drawn[scheme] = turn_pairs(trajectories, turn, self.config.num_samples, rng)
            out[f"collapse_{scheme}/valid_thinking_rate"] = drawn[scheme].valid_thinking_rate
            if not drawn[scheme].reasonings:
                out[f"collapse_{scheme}/num_pairs"] = 0.0
        scored = [scheme for scheme in schemes if drawn[scheme].reasonings]
        if not scored:
            return out
        matrices = score_matrices(  # together: the schemes share first prompts and first-turn reasonings
            model, tokenizer, [(drawn[s].prompts, drawn[s].reasonings) for s in scored],
            micro_batch_size=self.config.micro_batch_size, prefixes=prefixes,
        )
        for scheme, logp in zip(scored, matrices):  # logp [M, P]
            pairs = drawn[scheme]
            result, self.ema[scheme] = proxies(logp, pairs, range(len(pairs.reasonings)), range(len(pairs.prompts)),
                                               self.config.marginal, self.ema.get(scheme))
            out.update({f"collapse_{scheme}/{key}": value for key, value in result.items()})
            if self.per_tag:
                out.update(self.split_metrics(logp, pairs, pairs.column_tags, lambda tag: f"{scheme}/{tag}"))
            if scheme == "trajectory":  # the scheme that draws calls of every role
                out.update(self.split_metrics(logp, pairs, pairs.column_roles, lambda role: f"role/{role}"))
            if staleness is not None:
                out.update(self.staleness_metrics(scheme, logp, pairs, staleness))
        return out

    def split_metrics(
        self, logp: np.ndarray, pairs: Pairs, labels: Sequence[str | None], name: Callable[[str], str]
    ) -> dict[str, float]:
        """The proxies of each label alone (a mixture's tag, an agent's role), `collapse_<name(label)>/<metric>`: its
        reasonings scored against its inputs only (logp [M, P] restricted to the label's rows and columns), so the
        marginal is over that label's inputs and chance is one in its input count. Each label keeps its own
        MI-ZScore-EMA. Inputs labelled None (no role outside agent loops) are left out."""
        out = {}
        for label in dict.fromkeys(label for label in labels if label is not None):
            cols = [j for j, other in enumerate(labels) if other == label]
            rows = [m for m, j in enumerate(pairs.source) if labels[j] == label]
            if not rows:
                continue
            key = name(label)
            result, self.ema[key] = proxies(logp, pairs, rows, cols, self.config.marginal, self.ema.get(key))
            out.update({f"collapse_{key}/{k}": v for k, v in result.items()})
        return out

    def staleness_metrics(
        self, scheme: str, logp: np.ndarray, pairs: Pairs, staleness: Mapping[int, int]
    ) -> dict[str, float]:
        """The proxies of the reasonings of each staleness alone, `async/staleness_<k>/collapse_<scheme>/<metric>`:
        does the current policy still tell a stale sample's input from the others as well as a fresh one's?

        Rows are split by their group's staleness; the columns stay all of the batch's inputs, so every
        staleness shares the marginal and the chance level, and the per-pair means (retrieval_acc, recall@k,
        mi_est, mi_seq_est, cond_entropy, reasoning_entropy) average, weighted by num_pairs, to the whole
        batch's. A staleness of the batch none of whose reasonings was drawn logs `num_pairs` 0 only. The EMA
        keys are left out: which staleness a step holds varies with the worker's timing.
        """
        lag = [staleness[pairs.column_groups[j]] for j in pairs.source]  # [M], each reasoning's staleness
        columns = range(len(pairs.prompts))
        out = {}
        for k in sorted(set(staleness.values())):
            rows = [m for m, s in enumerate(lag) if s == k]
            result = proxies(logp, pairs, rows, columns, self.config.marginal)[0] if rows else {"num_pairs": 0.0}
            out.update({f"async/staleness_{k}/collapse_{scheme}/{key}": v for key, v in result.items()
                        if key not in EMA_KEYS})
        return out

    def state_dict(self) -> dict[str, Any]:
        """Plain data for a checkpoint: the EMA scales of both schemes and the alarm's state."""
        return {
            "ema": {scheme: dataclasses.asdict(s) if s is not None else None for scheme, s in self.ema.items()},
            "alarm": self.alarm.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.ema = {scheme: EmaState(**s) if s is not None else None for scheme, s in state["ema"].items()}
        self.alarm.load_state_dict(state["alarm"])


def held_out_proxies(
    model: torch.nn.Module, tokenizer: Any, trajectories: Sequence[Trajectory], config: CollapseConfig, seed: int
) -> dict[str, float]:
    """The first-turn proxies of each tag's held-out episodes, `collapse_eval/<tag>/<metric>`: does the reasoning
    still depend on its input where the policy was never trained, such as an out-of-distribution variant?

    Per tag, up to `config.num_samples` first-turn reasonings scored against that tag's held-out first prompts
    (one per seed), all tags in one scoring pass. An evaluation replays the same seeds, so there is no EMA:
    the z-score's scale is each evaluation's own.
    """
    parts = {}
    for traj in trajectories:
        parts.setdefault(traj.tag, []).append(traj)
    drawn = {tag: turn_pairs(part, 0, config.num_samples, np.random.default_rng([seed % 2**63, i]))
             for i, (tag, part) in enumerate(parts.items())}
    out = {f"collapse_eval/{tag}/valid_thinking_rate": pairs.valid_thinking_rate for tag, pairs in drawn.items()}
    scored = [tag for tag, pairs in drawn.items() if pairs.reasonings]
    out |= {f"collapse_eval/{tag}/num_pairs": 0.0 for tag in drawn if tag not in scored}
    if not scored:
        return out
    matrices = score_matrices(model, tokenizer, [(drawn[t].prompts, drawn[t].reasonings) for t in scored],
                              micro_batch_size=config.micro_batch_size)
    for tag, logp in zip(scored, matrices):  # logp [M, P]
        pairs = drawn[tag]
        result, _ = proxies(logp, pairs, range(len(pairs.reasonings)), range(len(pairs.prompts)), config.marginal)
        out |= {f"collapse_eval/{tag}/{key}": value for key, value in result.items() if key not in EMA_KEYS}
    return out


def proxies(
    logp: np.ndarray, pairs: Pairs, rows: Sequence[int], cols: Sequence[int], marginal: str,
    ema_state: EmaState | None = None,
) -> tuple[dict[str, float], EmaState | None]:
    """`mi_metrics` of the reasonings `rows` scored against the inputs `cols` (logp [M, P] restricted to both;
    every row's own input must be among `cols`), its finite values only, and the EMA state it returns."""
    where = {j: k for k, j in enumerate(cols)}
    result = mi_metrics(
        logp[np.ix_(rows, cols)],
        np.array([where[pairs.source[m]] for m in rows]),
        lengths=np.array([len(pairs.reasonings[m]) for m in rows]),
        input_ids=[pairs.prompts[j] for j in cols],
        ks=RECALL_KS,
        ema_state=ema_state,
        marginal=marginal,
    )
    state = result.pop("ema_state")
    return {key: float(value) for key, value in result.items() if math.isfinite(value)}, state


def summary_rows(records: Sequence[dict[str, Any]]) -> list[tuple[str, str]]:
    """(name, text) rows on the last check of each scheme, for the end-of-run table.

    `records` are the step records of metrics.jsonl (`ragen2.tracking.read_metrics`). A check is
    a record with `collapse_<scheme>/num_pairs`; a proxy it could not support (absent or null)
    shows as "n/a", and the pair and distinct-input counts are always given, so "n/a" reads with
    its reason next to it.
    """
    rows = []
    for scheme in (*SCHEMES, MEMORY_SCHEME):
        prefix = f"collapse_{scheme}/"
        check = next((r for r in reversed(records) if r.get(prefix + "num_pairs") is not None), None)
        if check is None:
            continue

        def shown(key: str, spec: str) -> str:
            value = check.get(prefix + key)
            return format(value, spec) if value is not None and math.isfinite(value) else "n/a"

        m, distinct = check[prefix + "num_pairs"], check.get(prefix + "num_distinct_inputs")
        counts = f"{m:.0f} pair{'' if m == 1 else 's'}" + (f", {distinct:.0f} distinct inputs" if distinct else "")
        rows.append((
            f"MI proxies ({'memory notes' if scheme == MEMORY_SCHEME else scheme.replace('_', ' ')})",
            f"Retrieval-Acc {shown('retrieval_acc', '.3f')} (chance {shown('chance_level', '.3f')}), "
            f"MI-ZScore-EMA {shown('mi_zscore_ema', '.3g')}; {counts} (step {check['step']})",
        ))
    return rows


def reasoning_ids(turn: Turn) -> list[int]:
    """Z: the turn's reasoning tokens, strictly between `<think>` and `</think>` (may be empty)."""
    start, end = turn.reasoning_span
    return list(turn.response_ids[start:end])


def acting(trajectory: Trajectory) -> list[Turn]:
    """The turns that acted: all but memory notes, which `memory_pairs` scores apart."""
    return [turn for turn in trajectory.turns if not turn.memory]


def first_turn_pairs(trajectories: Sequence[Trajectory], num_samples: int, rng: np.random.Generator) -> Pairs:
    """`turn_pairs` of the first turns. Within a group the first prompts are identical (shared
    seed), so their columns are one per group."""
    return turn_pairs(trajectories, 0, num_samples, rng)


def turn_pairs(trajectories: Sequence[Trajectory], turn: int, num_samples: int, rng: np.random.Generator) -> Pairs:
    """Up to `num_samples` pairs of turn `turn` (0-based), drawn without replacement among those with reasoning.

    `valid_thinking_rate` is over every episode that reached that turn, before the draw.

    Columns are the distinct (group, prompt) of that turn in the batch, all of them whether or not
    one of their reasonings was drawn: the marginal is over the batch's inputs.
    """
    columns: dict[tuple[int, tuple[int, ...]], int] = {}  # (group, prompt) -> column
    tags: list[str] = []  # each column's tag
    roles: list[str | None] = []  # each column's role
    candidates: list[tuple[int, list[int]]] = []  # (column, Z) of every such turn with reasoning
    reached = [t for t in trajectories if len(acting(t)) > turn]
    for traj in reached:
        this = acting(traj)[turn]
        column = columns.setdefault((traj.group_id, tuple(this.prompt_ids)), len(columns))
        tags += [traj.tag] * (len(columns) - len(tags))
        roles += [this.role] * (len(columns) - len(roles))
        z = reasoning_ids(this)
        if z:
            candidates.append((column, z))
    picked = rng.permutation(len(candidates))[:num_samples]
    return Pairs(
        prompts=[list(prompt) for _, prompt in columns],
        reasonings=[candidates[i][1] for i in picked],
        source=[candidates[i][0] for i in picked],
        valid_thinking_rate=len(candidates) / len(reached) if reached else 0.0,
        column_tags=tags,
        column_groups=[group for group, _ in columns],
        column_roles=roles,
    )


def trajectory_pairs(trajectories: Sequence[Trajectory], num_samples: int, rng: np.random.Generator) -> Pairs:
    """`num_samples` draws of (trajectory uniformly, then a turn of it uniformly); each pair is a column.

    Draws are with replacement, as the scheme is defined; a draw whose reasoning is empty is
    dropped after drawing, and `valid_thinking_rate` is the share of draws that were kept.
    """
    with_turns = [t for t in trajectories if acting(t)]
    prompts, reasonings, tags, groups, roles = [], [], [], [], []
    drawn = num_samples if with_turns else 0
    for _ in range(drawn):
        traj = with_turns[rng.integers(len(with_turns))]
        turns = acting(traj)
        turn = turns[rng.integers(len(turns))]
        z = reasoning_ids(turn)
        if z:
            prompts.append(list(turn.prompt_ids))
            reasonings.append(z)
            tags.append(traj.tag)
            groups.append(traj.group_id)
            roles.append(turn.role)
    return Pairs(
        prompts=prompts,
        reasonings=reasonings,
        source=list(range(len(reasonings))),
        valid_thinking_rate=len(reasonings) / drawn if drawn else 0.0,
        column_tags=tags,
        column_groups=groups,
        column_roles=roles,
    )


def memory_pairs(trajectories: Sequence[Trajectory], num_samples: int, rng: np.random.Generator) -> Pairs:
    """Up to `num_samples` memory notes, drawn without replacement among the non-empty ones, each scored against
    the prompts of the drawn notes: the histories they were written from, one column each (identical prompts
    still form one class). `valid_thinking_rate` is the share of the batch's notes that are non-empty."""
    notes = [(traj, turn) for traj in trajectories for turn in traj.turns if turn.memory]
    candidates = [(traj, turn) for traj, turn in notes if reasoning_ids(turn)]
    picked = [candidates[i] for i in rng.permutation(len(candidates))[:num_samples]]
    return Pairs(
        prompts=[list(turn.prompt_ids) for _, turn in picked],
        reasonings=[reasoning_ids(turn) for _, turn in picked],
        source=list(range(len(picked))),
        valid_thinking_rate=len(candidates) / len(notes) if notes else 0.0,
        column_tags=[traj.tag for traj, _ in picked],
        column_groups=[traj.group_id for traj, _ in picked],
        column_roles=[turn.role for _, turn in picked],
    )
