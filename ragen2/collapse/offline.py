"""`ragen2 diagnose`: the MI proxies on rollouts saved by any trainer, scored by any causal LM.

Input is a file of rollout records (DESIGN §4), JSONL, one object per turn:

    {"group": int|str, "prompt": str | [chat messages], "reasoning": str,
     "reward": float?, "episode": int|str?, "turn": int?}

`ragen2 train` writes exactly this to `rollouts/step_N.jsonl` (plus a `response` key, ignored).
TRL's GRPOTrainer completion logs (`log_completions=True`: `completions/completions_NNNNN.parquet`,
the W&B table JSON, or a JSONL of rows with `prompt` and `completion`) are converted: one record
per completion, group = identical prompt, reasoning = the text between `<think>` and `</think>`
of the completion (the whole completion when it has no tags; the count is reported).
verl's rollout dumps (`trainer.rollout_data_dir`: `N.jsonl` per step, rows with `input`, `output`,
`score`, `step`) are converted the same way; rows of verl's current trainer carry their trajectory
key `uid` = `{prompt uid}_{session}_{output}`, which gives group, episode and turn.

The input X of a record is what the model saw before the reasoning:
- a string prompt is used as-is, so it must already end where the reasoning starts (with
  `<think>` for a model that opens its reasoning with it; ragen2's own records do);
- chat messages are rendered with the scoring model's chat template and its generation prompt,
  then `<think>` is appended unless the template already ends with it. Completions converted
  from TRL carry what the model generated before the reasoning instead (usually `<think>`).

Lines that cannot be read are skipped and reported by number; empty reasoning is dropped and
counted (`valid_thinking_rate`).
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
from ragen2.collapse.scoring import score_matrix
from ragen2.errors import ConfigError, RolloutFormatError
from ragen2.evaluate import new_results_dir
from ragen2.models.loading import DTYPES, check_model_path, resolve_device, resolve_model_path
from ragen2.tags import THINK_CLOSE, THINK_OPEN

FORMATS = ("auto", "records", "ragen2", "trl", "verl")
SCHEMES = ("first_turn", "trajectory", "pairs")
REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")  # where chat parsers put the reasoning
LISTED = 5  # bad lines named one by one in messages


@dataclass
class Record:
    """One (input, reasoning) pair of a rollout file, however it was stored."""

    line: int  # 1-based line (JSONL) or row (Parquet, W&B table) it came from
    group: int | str  # records with the same group were sampled from the same input
    prompt: str | list[dict[str, Any]]  # the input: rendered text, or chat messages
    reasoning: str
    reward: float | None = None
    episode: int | str | None = None
    turn: int | None = None
    prefix: str | None = None  # text between the rendered input and the reasoning; None: see render_prompt


@dataclass
class RolloutFile:
    """The readable records of a file and an account of everything that was not read."""

    path: Path
    format: str  # "records", "trl" or "verl"
    records: list[Record]
    skipped: list[tuple[int, str]]  # (line or row, what is wrong with it)
    unit: str  # "line" or "row"
    notes: list[str] = field(default_factory=list)  # conversions a reader of the results should know about


# ----------------------------------------------------------------------------- reading


def read_rollouts(path: str | Path, format: str = "auto") -> RolloutFile:
    """Read rollout records (or TRL completion logs) from `path`, skipping malformed lines.

    Raises:
        RolloutFormatError: the file cannot be read at all, or not one of its lines is usable;
            the message names the first bad lines and what is wrong with each.
    """
    path = Path(path)
    if format not in FORMATS:
        raise ConfigError(f"format={format!r} is not allowed; allowed values: {', '.join(FORMATS)}")
    if not path.is_file():
        raise RolloutFormatError(f"{path}: no such file; pass a rollout JSONL (or a TRL completions .parquet/.json)")
    rows, unit = _rows(path)
    if not rows:
        raise RolloutFormatError(f"{path}: the file holds no records")
    if format == "auto":
        format = "verl" if _looks_like_verl(path, rows) else "trl" if _looks_like_trl(path, rows) else "records"
    format = format if format in ("trl", "verl") else "records"  # ragen2's rollout files are records
    if format == "verl":
        records, skipped, notes = _convert_verl(rows)
    else:
        records, skipped, notes = _convert_trl(rows) if format == "trl" else (*_parse_records(rows), [])
    if not records:
        problems = "; ".join(f"{unit} {n}: {why}" for n, why in skipped[:LISTED])
        raise RolloutFormatError(f"{path}: no usable record ({format} format) in {len(rows)} {unit}s. {problems}")
    return RolloutFile(path, format, records, skipped, unit, notes)


def _rows(path: Path) -> tuple[list[tuple[int, Any]], str]:
    """(number, parsed JSON or the JSON error) of every non-blank line, or every row of a table file."""
    if path.suffix == ".parquet":
        try:
            import pyarrow.parquet
        except ImportError as e:
            raise RolloutFormatError(f"{path}: reading .parquet needs pyarrow: pip install 'ragen2[parquet]'") from e
        try:
            return list(enumerate(pyarrow.parquet.read_table(path).to_pylist(), start=1)), "row"
        except pyarrow.ArrowException as e:
            raise RolloutFormatError(f"{path}: not a readable Parquet file ({e})") from e
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise RolloutFormatError(f"{path}: not UTF-8 text ({e}); rollout records are JSONL") from e
    if path.suffix == ".json":  # a W&B table: {"columns": [...], "data": [[...], ...]}
        try:
            table = json.loads(text)
        except json.JSONDecodeError as e:
            raise RolloutFormatError(f"{path}: not valid JSON ({e})") from e
        columns, data = (table.get("columns"), table.get("data")) if isinstance(table, dict) else (None, None)
        if not (isinstance(columns, list) and isinstance(data, list)):
            raise RolloutFormatError(
                f"{path}: a .json file must be a W&B table with 'columns' and 'data'; for records use JSONL"
            )
        return [(n, dict(zip(columns, row)) if isinstance(row, list) else row) for n, row in enumerate(data, 1)], "row"
    rows = []
    for n, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            try:
                rows.append((n, json.loads(line)))
            except json.JSONDecodeError as e:
                rows.append((n, e))
    return rows, "line"


def _looks_like_trl(path: Path, rows: list[tuple[int, Any]]) -> bool:
    """Table files are TRL's; a JSONL is TRL's when its first object has `completion` but no `reasoning`."""
    if path.suffix in (".parquet", ".json"):
        return True
    first = next((obj for _, obj in rows if isinstance(obj, dict)), {})
    return "completion" in first and "reasoning" not in first


def _parse_records(rows: list[tuple[int, Any]]) -> tuple[list[Record], list[tuple[int, str]]]:
    """The rows that are valid records, and (line, what is wrong) for the others."""
    records, skipped = [], []
    for n, obj in rows:
        try:
            records.append(_record(n, obj))
        except _BadRow as e:
            skipped.append((n, str(e)))
    return records, skipped


class _BadRow(Exception):
    """A row that cannot be used; the message says why."""


def _record(n: int, obj: Any) -> Record:
    _check_object(obj)
    missing = [k for k in ("group", "prompt", "reasoning") if k not in obj]
    if missing:
        raise _BadRow(f"missing {', '.join(map(repr, missing))} (a record needs group, prompt and reasoning)")
    group = obj["group"]
    if isinstance(group, bool) or not isinstance(group, (int, str)):
        raise _BadRow(f"'group' must be an int or a string, got {group!r}")
    if not isinstance(obj["reasoning"], str):
        raise _BadRow(f"'reasoning' must be a string, got {_short(obj['reasoning'])}")
    reward, episode, turn = obj.get("reward"), obj.get("episode"), obj.get("turn")
    if reward is not None and (isinstance(reward, bool) or not isinstance(reward, (int, float))):
        raise _BadRow(f"'reward' must be a number or null, got {reward!r}")
    if episode is not None and (isinstance(episode, bool) or not isinstance(episode, (int, str))):
        raise _BadRow(f"'episode' must be an int, a string or null, got {episode!r}")
    if turn is not None and (isinstance(turn, bool) or not isinstance(turn, int) or turn < 0):
        raise _BadRow(f"'turn' must be an integer >= 0 or null, got {turn!r}")
    return Record(n, group, _prompt(obj["prompt"]), obj["reasoning"], reward, episode, turn)


def _check_object(obj: Any) -> None:
    if isinstance(obj, json.JSONDecodeError):
        raise _BadRow(f"not valid JSON ({obj.msg} at column {obj.colno})")
    if not isinstance(obj, dict):
        raise _BadRow(f"expected a JSON object, got {type(obj).__name__}")


def _prompt(prompt: Any) -> str | list[dict[str, Any]]:
    """A non-empty string, or a non-empty list of chat messages with a role and a content."""
    if isinstance(prompt, str):
        if not prompt:
            raise _BadRow("'prompt' is empty")
        return prompt
    if isinstance(prompt, list) and prompt:
        for i, msg in enumerate(prompt):
            if not (isinstance(msg, dict) and isinstance(msg.get("role"), str) and "content" in msg):
                raise _BadRow(
                    f"'prompt'[{i}] must be a chat message {{'role': ..., 'content': ...}}, got {_short(msg)}"
                )
        return prompt
    raise _BadRow(f"'prompt' must be a non-empty string or list of chat messages, got {_short(prompt)}")


def _short(value: Any, width: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= width else text[: width - 3] + "..."


# ----------------------------------------------------------------------------- TRL


def _convert_trl(rows: list[tuple[int, Any]]) -> tuple[list[Record], list[tuple[int, str]], list[str]]:
    """TRL completion-log rows -> records: one per completion, group = identical (step, prompt)."""
    parsed, skipped = [], []
    for n, obj in rows:
        try:
            _check_object(obj)
            if "prompt" not in obj or "completion" not in obj:
                raise _BadRow("a TRL completion row needs 'prompt' and 'completion'")
            prompt = _prompt(obj["prompt"])
            prefix, reasoning, tagged = _completion_reasoning(obj["completion"])
            reward = obj.get("reward")
            reward = float(reward) if isinstance(reward, (int, float)) and not isinstance(reward, bool) else None
            parsed.append((n, obj.get("step"), prompt, prefix, reasoning, tagged, reward))
        except _BadRow as e:
            skipped.append((n, str(e)))
    notes = []
    steps = sorted({p[1] for p in parsed if p[1] is not None})
    if len(steps) > 1:  # each step was sampled by a different policy: diagnose one
        parsed = [p for p in parsed if p[1] == steps[-1]]
        notes.append(f"the file logs {len(steps)} training steps ({steps[0]}..{steps[-1]}); diagnosed the last, "
                     f"step {steps[-1]} ({len(parsed)} completions)")
    groups: dict[str, int] = {}
    records = []
    for n, step, prompt, prefix, reasoning, _, reward in parsed:
        group = groups.setdefault(json.dumps(prompt, sort_keys=True), len(groups))
        records.append(Record(n, group, prompt, reasoning, reward, episode=n, turn=0, prefix=prefix))
    untagged = sum(not p[5] for p in parsed)
    if untagged:
        notes.append(f"{untagged} of {len(parsed)} completions have no {THINK_OPEN}...{THINK_CLOSE}: "
                     "their whole text is used as the reasoning")
    return records, skipped, notes


def _completion_reasoning(completion: Any) -> tuple[str, str, bool]:
    """(prefix, reasoning, tagged) of a TRL completion: a string, or a list of assistant messages.

    A message that a chat parser already split carries the reasoning in a field of its own
    (`reasoning_content`, `thinking` or `reasoning`); the prefix is then `<think>`.
    """
    if isinstance(completion, str):
        return split_completion(completion)
    if isinstance(completion, list) and completion and all(isinstance(m, dict) for m in completion):
        for msg in completion:
            for key in REASONING_FIELDS:
                if isinstance(msg.get(key), str) and msg[key].strip():
                    return THINK_OPEN, msg[key].strip(), True
        return split_completion("".join(_text(m.get("content")) for m in completion))
    raise _BadRow(f"'completion' must be a string or a list of chat messages, got {_short(completion)}")


def _text(content: Any) -> str:
    """The text of a message content: a string, or the text blocks of a multimodal list."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(b.get("text", "") for b in content if isinstance(b, dict) and b.get("type") == "text")
    return ""


def split_completion(text: str) -> tuple[str, str, bool]:
    """(prefix, reasoning, tagged): the reasoning is between `<think>` and `</think>`, stripped.

    The prefix is everything the model wrote up to and including `<think>`; it goes into the
    input. Without `<think>` before the first `</think>` (templates or prompts that open the
    reasoning themselves; a multi-turn completion holds the later turns' `<think>` after it)
    the reasoning is what precedes that `</think>`; with `<think>` but no `</think>` (cut off) it
    runs to the end; with neither, the whole text is the reasoning and `tagged` is False.
    """
    start = text.find(THINK_OPEN)
    if 0 <= text.find(THINK_CLOSE) < start:  # the first turn's reasoning was opened by the prompt
        start = -1
    end = text.find(THINK_CLOSE, max(start, 0))
    if start < 0 and end < 0:
        return "", text.strip(), False
    prefix = text[: start + len(THINK_OPEN)] if start >= 0 else ""
    body = text[len(prefix) : end if end >= 0 else len(text)]
    return prefix, body.strip(), True


# ----------------------------------------------------------------------------- verl


def _looks_like_verl(path: Path, rows: list[tuple[int, Any]]) -> bool:
    """A JSONL is a verl rollout dump when its first object has verl's `input` and `output` keys."""
    first = next((obj for _, obj in rows if isinstance(obj, dict)), {})
    return path.suffix not in (".parquet", ".json") and "input" in first and "output" in first


def _convert_verl(rows: list[tuple[int, Any]]) -> tuple[list[Record], list[tuple[int, str]], list[str]]:
    """verl rollout-dump rows -> records: TRL's conversion of (input, output, score, step), then, for
    rows that carry verl's trajectory key `uid` = `{uid}_{session}_{index}` (the current trainer),
    group = uid, episode = session, turn = index. Without it (the older trainer) group = identical input.

    verl decodes `input` with skip_special_tokens=True: the chat template's special tokens are not in
    it, so every input is scored without them.
    """
    as_trl, skipped = [], []
    for n, obj in rows:
        if isinstance(obj, dict) and not ("input" in obj and "output" in obj):
            skipped.append((n, "a verl rollout row needs 'input' and 'output'"))
            continue
        if isinstance(obj, dict):
            obj = {"prompt": obj["input"], "completion": obj["output"], "reward": obj.get("score"),
                   "step": obj.get("step")}
        as_trl.append((n, obj))
    records, bad, notes = _convert_trl(as_trl)
    keys = {n: obj.get("uid") for n, obj in rows if isinstance(obj, dict)}
    for record in records:
        key = keys.get(record.line)
        uid, session, index = key.rsplit("_", 2) if isinstance(key, str) and key.count("_") >= 2 else ("", "", "")
        if index.isdigit():
            record.group, record.episode, record.turn = uid, f"{uid}_{session}", int(index)
    return records, sorted(skipped + bad), notes


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

    An episode is the records sharing (group, episode), ordered by `turn` then by line; records
    without `episode` are episodes of one turn.
    """
    if scheme not in SCHEMES:
        raise ConfigError(f"scheme={scheme!r} is not allowed; allowed values: {', '.join(SCHEMES)}")
    has_reasoning = [bool(r.reasoning.strip()) for r in records]
    if scheme == "first_turn":
        firsts = [episode[0] for episode in _episodes(records)]
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
        episodes = _episodes(records)
        drawn = []
        for _ in range(num_samples):
            episode = episodes[rng.integers(len(episodes))]
            drawn.append(episode[rng.integers(len(episode))])
        pairs = [i for i in drawn if has_reasoning[i]]
        return Selection(pairs, pairs, list(range(len(pairs))), len(drawn), len(drawn) - len(pairs))
    valid = [i for i in range(len(records)) if has_reasoning[i]]
    pairs = [valid[k] for k in rng.permutation(len(valid))[:num_samples]]
    return Selection(pairs, pairs, list(range(len(pairs))), len(records), len(records) - len(valid))


def _episodes(records: Sequence[Record]) -> list[list[int]]:
    """Record indices of each episode in turn order; episodes in order of first appearance."""
    episodes: dict[Any, list[int]] = {}
    for i, r in enumerate(records):
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
    else `<think>` after a chat template that does not already end with it, else nothing.
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
    return text if text.rstrip().endswith(THINK_OPEN) else text + THINK_OPEN


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
    """Select pairs, tokenize them with `tokenizer`, score them with `model`, compute the proxies.

    Reasonings are tokenized on their own (no special tokens); a tokenizer that merges text
    across the `<think>` boundary may split the first reasoning token slightly differently
    from what was generated. `max_reasoning_tokens` keeps the first N tokens of each
    reasoning (None: all): scoring holds logits of [micro-batch, prompt + reasoning, vocab],
    so one reasoning of 500 KB would need tens of GB. The text is cut to
    `_CHARS_PER_TOKEN_CAP` x N characters before tokenizing, so a 10 MB reasoning is not
    tokenized whole either.
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

    prompts = [encode(render_prompt(records[i], tokenizer, rollouts.unit)) for i in selection.columns]
    cap = max_reasoning_tokens
    texts = [records[i].reasoning.strip() for i in selection.pairs]
    reasonings = [encode(z if cap is None else z[: cap * _CHARS_PER_TOKEN_CAP]) for z in texts]
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
    return Diagnosis(metrics, logp, source, lengths, selection, labels, truncated)


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
        "notes": rollouts.notes,
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
    lines += [f"note: {note}" for note in rollouts.notes]
    lines += ["", format_table(result.metrics), "", report["reading"]]
    return "\n".join(lines)
