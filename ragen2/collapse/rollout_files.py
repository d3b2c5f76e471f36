"""Rollouts saved by any trainer, read into `Record`s: the (input, reasoning) pairs `ragen2 diagnose` scores.

Input is a file of rollout records (DESIGN §4), JSONL, one object per turn:

    {"group": int|str, "prompt": str | [chat messages], "reasoning": str,
     "reward": float?, "episode": int|str?, "turn": int?,
     "prompt_ids": [int]?, "response_ids": [int]?, "reasoning_span": [start, end]?, "tokenizer": str?,
     "memory": bool?}

`memory: true` marks a memory note (a turn in which the agent summarised its history): its `reasoning` is
the note, and its prompt the history it was written from, ending where the note starts (`<memory>` in
ragen2's layout). `ragen2 diagnose --scheme memory` scores these records; the other schemes leave them out.

`ragen2 train` writes this to `rollouts/step_N.jsonl` (plus `response`, `logprobs` and `role`, not
read here). The token ids come as a set: the ids of the prompt, of the response and the [start, end)
of the reasoning inside the response; `tokenizer` is the fingerprint of the vocabulary that made them
(`ragen2.evaluate.tokenizer_fingerprint`), which says whether a scoring model may use them as they are.
TRL's GRPOTrainer completion logs (`log_completions=True`: `completions/completions_NNNNN.parquet`,
the W&B table JSON, or a JSONL of rows with `prompt` and `completion`) are converted: one record
per completion, group = identical prompt, reasoning = the text between `<think>` and `</think>`
of the completion (the whole completion when it has no tags; the count is reported).
verl's rollout dumps (`trainer.rollout_data_dir`: `N.jsonl` per step, rows with `input`, `output`,
`score`, `step`) are converted the same way; rows of verl's current trainer carry their trajectory
key `uid` = `{prompt uid}_{session}_{output}`, which gives group, episode and turn.

Lines that cannot be read are skipped and reported by number. A module apart from the diagnosis
(`ragen2.collapse.offline`): reading knows the formats and needs neither torch nor a model.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ragen2.errors import ConfigError, RolloutFormatError
from ragen2.tags import THINK_CLOSE, THINK_OPEN

FORMATS = ("auto", "records", "ragen2", "trl", "verl")
REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")  # where chat parsers put the reasoning
LISTED = 5  # bad lines named one by one in messages
TOKEN_FIELDS = ("prompt_ids", "response_ids", "reasoning_span")  # a record's token ids: all or none


@dataclass
class Tokens:
    """A record's prompt and reasoning as token ids, and the vocabulary they belong to."""

    prompt_ids: list[int]  # X, ending where the reasoning starts
    reasoning_ids: list[int]  # Z: the reasoning span of the response ids
    tokenizer: str | None  # fingerprint of the vocabulary; None when the file does not say


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
    prefix: str | None = None  # text between the rendered input and the reasoning; None: see offline.render_prompt
    tokens: Tokens | None = None  # the ids the model saw and sampled, when the file recorded them
    memory: bool = False  # a memory note: `reasoning` is the note, `prompt` the history it summarises


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
    memory = obj.get("memory") or False
    if not isinstance(memory, bool):
        raise _BadRow(f"'memory' must be true, false or null, got {memory!r}")
    return Record(n, group, _prompt(obj["prompt"]), obj["reasoning"], reward, episode, turn, tokens=_tokens(obj),
                  memory=memory)


def _tokens(obj: dict[str, Any]) -> Tokens | None:
    """The record's token ids, checked: all of TOKEN_FIELDS or none, the span inside the response."""
    present = [k for k in TOKEN_FIELDS if obj.get(k) is not None]
    if not present:
        return None
    if len(present) < len(TOKEN_FIELDS):
        missing = ", ".join(repr(k) for k in TOKEN_FIELDS if k not in present)
        raise _BadRow(f"has {', '.join(map(repr, present))} but not {missing} (token ids come as a set)")
    prompt_ids, response_ids, span = _ids(obj, "prompt_ids"), _ids(obj, "response_ids"), obj["reasoning_span"]
    if not prompt_ids:
        raise _BadRow("'prompt_ids' is empty")
    if not (isinstance(span, list) and len(span) == 2 and all(map(_is_id, span))
            and span[0] <= span[1] <= len(response_ids)):
        raise _BadRow(f"'reasoning_span' must be [start, end] within the {len(response_ids)} response ids, "
                      f"got {_short(span)}")
    tokenizer = obj.get("tokenizer")
    if tokenizer is not None and not isinstance(tokenizer, str):
        raise _BadRow(f"'tokenizer' must be a string or null, got {_short(tokenizer)}")
    return Tokens(prompt_ids, response_ids[span[0]: span[1]], tokenizer)


def _ids(obj: dict[str, Any], key: str) -> list[int]:
    ids = obj[key]
    if not (isinstance(ids, list) and all(map(_is_id, ids))):
        raise _BadRow(f"'{key}' must be a list of token ids (integers >= 0), got {_short(ids)}")
    return ids


def _is_id(value: Any) -> bool:
    """A token id or a position: an integer >= 0 (JSON's true and false are not)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


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
