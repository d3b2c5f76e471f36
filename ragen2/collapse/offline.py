"""`ragen2 diagnose`: the MI proxies on rollouts saved by any trainer, scored by any causal LM.

The rollouts are read by `ragen2.collapse.rollout_files` (ragen2's records, TRL completion logs, verl
rollout dumps). The input X of a record is what the model saw before the reasoning:
- a string prompt is used as-is, so it must already end where the reasoning starts (with
  `<think>` for a model that opens its reasoning with it; ragen2's own records do);
- chat messages are rendered with the scoring model's chat template and its generation prompt,
  then `<think>` is appended unless the template already ends with it. Completions converted
  from TRL carry what the model generated before the reasoning instead (usually `<think>`).

A record that carries the token ids the model saw and sampled (ragen2's own, `Record.tokens`) is
scored on them, X = its prompt ids and Z = its reasoning span of the response ids, as training
scores them, when the scoring model's tokenizer has the vocabulary that made them (the record's
`tokenizer` fingerprint, `ragen2.evaluate.tokenizer_fingerprint`). Otherwise its text is
re-tokenised, and the result's notes say for how many records.

Empty reasoning is dropped and counted (`valid_thinking_rate`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from ragen2.collapse.heatmap import draw_heatmap
from ragen2.collapse.metrics import MARGINALS, MIN_PAIRS, mi_metrics, proxies_undefined
from ragen2.collapse.online import RECALL_KS
from ragen2.collapse.rollout_files import LISTED, Record, RolloutFile, Tokens, read_rollouts
from ragen2.collapse.scoring import score_matrix
from ragen2.errors import ConfigError, RolloutFormatError
from ragen2.evaluate import new_results_dir, tokenizer_fingerprint
from ragen2.models.loading import DTYPES, check_model_path, resolve_device, resolve_model_path
from ragen2.tags import MEMORY_OPEN, THINK_OPEN

SCHEMES = ("first_turn", "trajectory", "pairs", "memory")


# ----------------------------------------------------------------------------- choosing pairs


@dataclass
class Selection:
    """Which records are scored: M pairs against P columns (indices into the record list)."""

    pairs: list[int]  # [M] record of each reasoning
    columns: list[int]  # [P] record whose input is each column
    source: list[int]  # [M] column of each pair's own input
    considered: int  # turns the scheme looked at
    empty: int  # of those, dropped for empty reasoning

    @property
    def valid_thinking_rate(self) -> float:
        return 1.0 - self.empty / self.considered if self.considered else 0.0


def select_pairs(records: Sequence[Record], scheme: str, num_samples: int, rng: np.random.Generator) -> Selection:
    """The pairs of one scheme, as in training (`ragen2.collapse.online`), plus `pairs`.

    - first_turn: the first turn of every episode; up to `num_samples` with reasoning, drawn
      without replacement; the columns are the distinct (group, input) of all first turns,
      one per group when the group's first inputs agree.
    - trajectory: `num_samples` times an episode uniformly, then one of its turns uniformly;
      every pair is its own column.
    - pairs: up to `num_samples` records with reasoning, drawn without replacement, every pair
      its own column (identical inputs still form one class).
    - memory: `pairs` over the memory notes (`Record.memory`), each against the histories of the drawn
      notes, as `collapse_memory/` in training. The other schemes leave memory notes out.

    An episode is the records sharing (group, episode), ordered by `turn` then by line; records
    without `episode` are episodes of one turn.
    """
    if scheme not in SCHEMES:
        raise ConfigError(f"scheme={scheme!r} is not allowed; allowed values: {', '.join(SCHEMES)}")
    has_reasoning = [bool(r.reasoning.strip()) for r in records]
    if scheme == "memory":
        notes = [i for i, r in enumerate(records) if r.memory]
        valid = [i for i in notes if has_reasoning[i]]
        pairs = [valid[k] for k in rng.permutation(len(valid))[:num_samples]]
        return Selection(pairs, pairs, list(range(len(pairs))), len(notes), len(notes) - len(valid))
    acting = [i for i, r in enumerate(records) if not r.memory]
    if scheme == "first_turn":
        firsts = [episode[0] for episode in _episodes(records, acting)]
        keys: dict[tuple[str, str, str | None], int] = {}  # (group, input) -> column
        columns: list[int] = []
        column_of = {}
        for i in firsts:
            key = (_json_key(records[i].group), _json_key(records[i].prompt), records[i].prefix)
            if key not in keys:
                keys[key] = len(columns)
                columns.append(i)
            column_of[i] = keys[key]
        valid = [i for i in firsts if has_reasoning[i]]
        pairs = [valid[k] for k in rng.permutation(len(valid))[:num_samples]]
        return Selection(pairs, columns, [column_of[i] for i in pairs], len(firsts), len(firsts) - len(valid))
    if scheme == "trajectory":
        episodes = _episodes(records, acting)
        drawn = []
        for _ in range(num_samples):
            episode = episodes[rng.integers(len(episodes))]
            drawn.append(episode[rng.integers(len(episode))])
        pairs = [i for i in drawn if has_reasoning[i]]
        return Selection(pairs, pairs, list(range(len(pairs))), len(drawn), len(drawn) - len(pairs))
    valid = [i for i in acting if has_reasoning[i]]
    pairs = [valid[k] for k in rng.permutation(len(valid))[:num_samples]]
    return Selection(pairs, pairs, list(range(len(pairs))), len(acting), len(acting) - len(valid))


def _episodes(records: Sequence[Record], members: Sequence[int]) -> list[list[int]]:
    """Indices `members` of `records` grouped into episodes, each in turn order; episodes in order of first
    appearance."""
    episodes: dict[Any, list[int]] = {}
    for i in members:
        r = records[i]
        key = (_json_key(r.group), _json_key(r.episode)) if r.episode is not None else ("line", r.line)
        episodes.setdefault(key, []).append(i)

    def order(i: int) -> tuple[bool, int, int]:  # numbered turns first, by number; the rest by line
        return records[i].turn is None, records[i].turn or 0, records[i].line

    return [sorted(members, key=order) for members in episodes.values()]


def _json_key(value: Any) -> str:
    """Hashable and type-exact: group 1 and group "1" stay apart."""
    return json.dumps(value, sort_keys=True)


# ----------------------------------------------------------------------------- scoring


def render_prompt(record: Record, tokenizer: PreTrainedTokenizerBase, unit: str = "line") -> str:
    """The text before the reasoning: the string as-is, or the chat rendered for generation.

    Appended after it: `record.prefix` when the record carries one (converted TRL completions),
    else `<think>` (`<memory>` for a memory note) after a chat template that does not already end with
    it, else nothing.
    """
    if isinstance(record.prompt, str):
        return record.prompt + (record.prefix or "")
    if tokenizer.chat_template is None:
        raise RolloutFormatError(
            f"{unit} {record.line}: the prompt is a list of chat messages, but the scoring model's tokenizer has "
            "no chat template to render it; pass the rendered prompt as a string, or use a chat model"
        )
    try:
        text = tokenizer.apply_chat_template(record.prompt, add_generation_prompt=True, tokenize=False)
    except Exception as e:  # jinja errors from a template that rejects these messages
        raise RolloutFormatError(
            f"{unit} {record.line}: the model's chat template cannot render this prompt: {e}"
        ) from e
    if record.prefix is not None:
        return text + record.prefix
    opening = MEMORY_OPEN if record.memory else THINK_OPEN  # a note follows `<memory>`
    return text if text.rstrip().endswith(opening) else text + opening


@dataclass
class Diagnosis:
    """The scoring matrix of one file and the proxies computed from it."""

    metrics: dict[str, float]  # mi_metrics' numbers plus valid_thinking_rate
    logp: np.ndarray  # [M, P] log p(Z_m | X_j), summed over reasoning tokens
    source: np.ndarray  # [M] column of each reasoning's own input
    lengths: np.ndarray  # [M] reasoning lengths in tokens (after truncation)
    selection: Selection
    column_labels: list[str]  # [P] group of each column
    truncated: int = 0  # reasonings cut to `max_reasoning_tokens`
    on_token_ids: int = 0  # of the records scored (pairs and columns), those scored on their recorded ids
    notes: list[str] = field(default_factory=list)  # what a reader of the numbers should know


def diagnose(
    rollouts: RolloutFile,
    model: torch.nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    scheme: str = "first_turn",
    num_samples: int = 64,
    seed: int = 0,
    micro_batch_size: int = 32,
    marginal: str = "mixture",
    max_reasoning_tokens: int | None = None,
) -> Diagnosis:
    """Select pairs, take their token ids (`recorded_ids`) or tokenize them with `tokenizer`, score them
    with `model`, compute the proxies.

    Reasonings without recorded ids are tokenized on their own (no special tokens); a tokenizer
    that merges text across the `<think>` boundary may split the first reasoning token slightly
    differently from what was generated. `max_reasoning_tokens` keeps the first N tokens of each
    reasoning (None: all): scoring holds logits of [micro-batch, prompt + reasoning, vocab],
    so one reasoning of 500 KB would need tens of GB. Text is cut to `_CHARS_PER_TOKEN_CAP` x N
    characters before tokenizing, so a 10 MB reasoning is not tokenized whole either.
    """
    _check_options(scheme, num_samples, marginal, max_reasoning_tokens)
    records = rollouts.records
    selection = select_pairs(records, scheme, num_samples, np.random.default_rng(seed))
    if not selection.pairs:
        raise RolloutFormatError(
            f"{rollouts.path}: all {selection.considered} {scheme} turns have empty reasoning; nothing to score"
        )

    def encode(text: str) -> list[int]:  # templates and rendered prompts carry their own special tokens
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    vocab = tokenizer_fingerprint(tokenizer)
    ids = {i: recorded_ids(records[i], vocab) for i in {*selection.columns, *selection.pairs}}
    prompts = [ids[i].prompt_ids if ids[i] is not None else encode(render_prompt(records[i], tokenizer, rollouts.unit))
               for i in selection.columns]
    cap = max_reasoning_tokens

    def reasoning(i: int) -> list[int]:
        """The recorded span, unless it is empty: pairs are chosen on the text, and a tokenizer that merged a
        reasoning of a few characters into `</think>` left it no token of its own."""
        if ids[i] is not None and ids[i].reasoning_ids:
            return ids[i].reasoning_ids
        z = records[i].reasoning.strip()
        return encode(z if cap is None else z[: cap * _CHARS_PER_TOKEN_CAP])

    reasonings = [reasoning(i) for i in selection.pairs]
    truncated = 0 if cap is None else sum(len(z) > cap for z in reasonings)
    reasonings = reasonings if cap is None else [z[:cap] for z in reasonings]
    lengths = np.array([len(z) for z in reasonings])
    logp = score_matrix(model, tokenizer, prompts, reasonings, micro_batch_size=micro_batch_size)
    source = np.array(selection.source)
    result = mi_metrics(logp, source, lengths=lengths, input_ids=prompts, ks=RECALL_KS, marginal=marginal)
    result.pop("ema_state")
    metrics = {key: float(value) for key, value in result.items()}
    metrics["valid_thinking_rate"] = selection.valid_thinking_rate
    labels = [str(records[i].group) for i in selection.columns]
    foreign = sum(records[i].tokens is not None and tokens is None for i, tokens in ids.items())
    notes = [f"{foreign} of the {len(ids)} records scored carry token ids of another vocabulary than the scoring "
             f"model's tokenizer (fingerprint {vocab}), or name none: their text was re-tokenised"] if foreign else []
    on_ids = sum(tokens is not None for tokens in ids.values())
    return Diagnosis(metrics, logp, source, lengths, selection, labels, truncated, on_ids, notes)


def recorded_ids(record: Record, vocab: str) -> Tokens | None:
    """The record's token ids if the vocabulary with fingerprint `vocab` made them, else None (score its text).

    Equal vocabularies give every id the same token, so the ids are exactly what the scoring
    model would have seen; anything else (another vocabulary, or none recorded) could give ids
    that mean other tokens, and re-tokenising the text is the safe way.
    """
    return record.tokens if record.tokens is not None and record.tokens.tokenizer == vocab else None


# Characters kept per allowed token before tokenizing a capped reasoning: more than any BPE token
# spans, so the cut falls after the first N tokens.
_CHARS_PER_TOKEN_CAP = 64


def _check_options(scheme: str, num_samples: int, marginal: str, max_reasoning_tokens: int | None = None) -> None:
    if max_reasoning_tokens is not None and max_reasoning_tokens < 1:
        raise ConfigError(
            f"max_reasoning_tokens={max_reasoning_tokens} is not allowed: use an integer >= 1 (or no cap)"
        )
    if scheme not in SCHEMES:
        raise ConfigError(f"scheme={scheme!r} is not allowed; allowed values: {', '.join(SCHEMES)}")
    if num_samples < 1:
        raise ConfigError(f"num_samples={num_samples} is not allowed: use an integer >= 1")
    if marginal not in MARGINALS:
        raise ConfigError(f"marginal={marginal!r} is not allowed; allowed values: {', '.join(MARGINALS)}")


def load_scoring_model(
    path: str, device: str = "auto", dtype: str = "float32"
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Any causal LM and its tokenizer ('tiny' = the built-in policy); no chat template required."""
    if dtype not in DTYPES:
        raise ConfigError(f"dtype={dtype!r} is not allowed; allowed values: {', '.join(DTYPES)}")
    check_model_path(path, f"--model {path}")  # a file, an empty or truncated directory: one line naming it
    resolved = resolve_model_path(path)
    if not Path(resolved).exists() and resolved.startswith((".", "/", "~")):
        raise ConfigError(f"--model {path}: no such directory; pass a Hugging Face model directory or hub name")
    try:
        tokenizer = AutoTokenizer.from_pretrained(resolved)
        model = AutoModelForCausalLM.from_pretrained(resolved, dtype=DTYPES[dtype])
    except (OSError, ValueError) as e:
        raise ConfigError(f"--model {path}: cannot load a causal LM and its tokenizer from there ({e})") from e
    return model.to(resolve_device(device)).eval(), tokenizer


# ----------------------------------------------------------------------------- the command


TABLE_ROWS = (
    ("retrieval_acc", "Retrieval-Acc"),
    ("chance_level", "  chance level"),
    ("recall@2", "Recall@2"),
    ("recall@4", "Recall@4"),
    ("recall@8", "Recall@8"),
    ("mi_est", "MI-Est (nats/token)"),
    ("mi_seq_est", "MI-Seq-Est (nats/seq)"),
    ("mi_upper_bound", "  upper bound log P"),
    ("mi_zscore", "MI-ZScore"),
    ("cond_entropy", "H(Z|X) (nats/token)"),
    ("reasoning_entropy", "H(Z) (nats/token)"),
    ("valid_thinking_rate", "valid thinking rate"),
)


def reading(metrics: dict[str, float]) -> str:
    """One line on what the numbers say, for people who do not read MI estimates every day.

    Retrieval-Acc counts as at chance within two standard errors of a chance-level hit rate over
    M pairs: with few pairs, a few lucky hits are expected. Three cases say so instead of
    reading the numbers: the proxies do not exist (fewer than 2 pairs, or one distinct input:
    `proxies_undefined`), or M is so small that even a perfect Retrieval-Acc would be within
    the noise (then the line gives the M it would take).
    """
    m, distinct = metrics["num_pairs"], metrics["num_distinct_inputs"]
    why = proxies_undefined(m, distinct)
    if why is not None:
        hint = ("pass records from different inputs (--scheme trajectory or pairs also score later turns)"
                if m >= MIN_PAIRS else "pass more records, or raise --num-samples")
        return f"the proxies cannot be computed from {m:.0f} pair{'s' if m != 1 else ''}: {why}; {hint}"
    acc, chance = metrics["retrieval_acc"], metrics["chance_level"]
    noise = 2 * math.sqrt(chance * (1 - chance) / m)
    needed = pairs_to_tell_from_chance(chance)
    if m < needed:
        return (f"{m:.0f} pairs over {distinct:.0f} distinct inputs are too few to tell Retrieval-Acc {acc:.3f} from "
                f"chance {chance:.3f}: even a perfect score is within sampling noise (2 s.e. = {noise:.2f}); it "
                f"takes at least {needed} pairs")
    if acc <= chance + noise:
        return (f"Retrieval-Acc is within sampling noise of chance (2 s.e. = {noise:.2f} at {m:.0f} pairs): the "
                "reasoning does not identify its input (template collapse, or inputs the model cannot tell apart)")
    return f"Retrieval-Acc is {acc / chance:.1f}x chance, beyond sampling noise: the reasoning depends on its input"


def pairs_to_tell_from_chance(chance: float) -> int:
    """The fewest pairs M at which a perfect Retrieval-Acc (1.0) is beyond chance + 2 s.e.,
    2 sqrt(c (1 - c) / M): M > 4c / (1 - c), e.g. 5 at chance 1/2, 2 at chance 1/8."""
    m = max(MIN_PAIRS, int(4 * chance / (1 - chance)))
    while 1.0 <= chance + 2 * math.sqrt(chance * (1 - chance) / m):
        m += 1
    return m


def format_table(metrics: dict[str, float]) -> str:
    """Two columns: the proxy and its value ("n/a" where the pairs cannot support it)."""
    width = max(len(label) for _, label in TABLE_ROWS) + 2

    def value(key: str) -> str:
        v = metrics.get(key, math.nan)
        return f"{v:>10.4f}" if math.isfinite(v) else f"{'n/a':>10}"

    lines = [f"{label:<{width}}{value(key)}" for key, label in TABLE_ROWS]
    lines.append(f"{'pairs x inputs':<{width}}{int(metrics['num_pairs']):>5d} x {int(metrics['num_inputs'])}"
                 f" ({int(metrics['num_distinct_inputs'])} distinct)")
    return "\n".join(lines)


def diagnose_cli(
    path: str,
    model_path: str,
    format: str = "auto",
    out: Path | None = None,
    scheme: str = "first_turn",
    num_samples: int = 64,
    seed: int = 0,
    device: str = "auto",
    dtype: str = "float32",
    micro_batch_size: int = 32,
    marginal: str = "mixture",
    max_reasoning_tokens: int | None = 512,
) -> dict[str, Any]:
    """`ragen2 diagnose`: read, score, write `diagnose.json` and `heatmap.png` under `out`
    (default: a new diagnose/<file name>-<time>/, named by `new_results_dir` as eval's directories are).

    Each reasoning is cut to its first `max_reasoning_tokens` tokens (None or 0: no cap), which
    bounds the memory of scoring; the number cut is reported.
    Returns the JSON written, plus "table" (text for the terminal), "json_path" and "heatmap_path".
    """
    max_reasoning_tokens = max_reasoning_tokens or None  # 0 = no cap, as the flag's help says
    if max_reasoning_tokens is not None and max_reasoning_tokens < 0:
        raise ConfigError(
            f"--max-reasoning-tokens {max_reasoning_tokens} is not allowed: use an integer >= 1, or 0 for no cap"
        )
    _check_options(scheme, num_samples, marginal, max_reasoning_tokens)  # before the model loads, which takes a while
    rollouts = read_rollouts(path, format)
    model, tokenizer = load_scoring_model(model_path, device, dtype)
    result = diagnose(rollouts, model, tokenizer, scheme, num_samples, seed, micro_batch_size, marginal,
                      max_reasoning_tokens)
    if out is None:
        out = new_results_dir("diagnose", path)
    else:
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
    m = result.metrics
    def shown(key: str, spec: str) -> str:
        return f"{m[key]:{spec}}" if math.isfinite(m[key]) else "n/a"  # `format` is a parameter here

    title = (f"{Path(path).name}: {scheme}, Retrieval-Acc {shown('retrieval_acc', '.3f')} "
             f"(chance {m['chance_level']:.3f}), MI-ZScore {shown('mi_zscore', '.3g')}, {m['num_pairs']:.0f} pairs")
    heatmap_path = draw_heatmap(result.logp, result.source, result.lengths, out / "heatmap.png",
                                input_labels=result.column_labels, title=title)
    sel = result.selection
    report = {
        "file": str(path),
        "format": rollouts.format,
        "model": model_path,
        "scheme": scheme,
        "marginal": marginal,
        "seed": seed,
        "records": len(rollouts.records),
        "skipped": len(rollouts.skipped),
        "skipped_lines": [{rollouts.unit: n, "error": why} for n, why in rollouts.skipped[:20]],
        "empty_reasoning_dropped": sel.empty,
        "max_reasoning_tokens": max_reasoning_tokens,
        "reasoning_truncated": result.truncated,
        "scored_on_token_ids": result.on_token_ids,
        "notes": rollouts.notes + result.notes,
        "metrics": {k: v for k, v in m.items() if math.isfinite(v)},
        "reading": reading(m),
        # Row m of logp is the reasoning of pair_lines[m], from input pair_inputs[m]; column j the input of
        # input_lines[j] (group input_groups[j]).
        f"pair_{rollouts.unit}s": [rollouts.records[i].line for i in sel.pairs],
        "pair_inputs": sel.source,
        "reasoning_tokens": result.lengths.tolist(),
        f"input_{rollouts.unit}s": [rollouts.records[i].line for i in sel.columns],
        "input_groups": result.column_labels,
        "logp": result.logp.round(4).tolist(),
        "heatmap": heatmap_path.name,
    }
    json_path = out / "diagnose.json"
    json_path.write_text(json.dumps(report, indent=2))
    return {**report, "table": _terminal_text(rollouts, result, report), "json_path": json_path,
            "heatmap_path": heatmap_path}


def _terminal_text(rollouts: RolloutFile, result: Diagnosis, report: dict[str, Any]) -> str:
    sel, unit = result.selection, rollouts.unit
    lines = [f"{report['file']} ({rollouts.format}): {len(rollouts.records)} records read, scheme {report['scheme']}, "
             f"model {report['model']}"]
    if rollouts.skipped:
        n = len(rollouts.skipped)
        listed = ", ".join(str(line) for line, _ in rollouts.skipped[:LISTED]) + (", ..." if n > LISTED else "")
        units = unit if n == 1 else f"{unit}s"
        lines.append(f"skipped {n} malformed {units} ({units} {listed}); "
                     f"first: {unit} {rollouts.skipped[0][0]}: {rollouts.skipped[0][1]}")
    if sel.empty:
        lines.append(f"dropped {sel.empty} of {sel.considered} turns with empty reasoning")
    if result.truncated:
        lines.append(f"truncated {result.truncated} of {len(sel.pairs)} reasonings to their first "
                     f"{report['max_reasoning_tokens']} tokens (--max-reasoning-tokens)")
    if result.on_token_ids:
        lines.append(f"scored {result.on_token_ids} of the {len({*sel.pairs, *sel.columns})} records used on their "
                     "recorded token ids")
    lines += [f"note: {note}" for note in report["notes"]]
    lines += ["", format_table(result.metrics), "", report["reading"]]
    return "\n".join(lines)
