"""Built-in data files of the text environments, and the reader for users' data files."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ragen2.errors import ConfigError

DATA_DIR = Path(__file__).resolve().parent
SUFFIXES = (".jsonl", ".json", ".parquet")


def read_records(path: str | Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """Yield `(where, record)` for every record of a JSONL, JSON (a list) or Parquet file.

    `where` names the record for error messages: `line 7` (JSONL, blank lines
    skipped but counted), `item 7` (JSON) or `row 7` (Parquet), all 1-based.
    Parquet needs pyarrow, imported only when such a file is read.

    Raises:
        ConfigError: the file is missing, has another suffix, is not valid
            JSON, or holds something other than objects.
    """
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{str(path)!r} is not a file: pass the path of a {'/'.join(SUFFIXES)} file")
    if path.suffix == ".jsonl":
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            if line.strip():
                yield _record(path, f"line {n}", _parse_json(path, f"line {n}", line))
    elif path.suffix == ".json":
        items = _parse_json(path, "the file", path.read_text(encoding="utf-8"))
        if not isinstance(items, list):
            raise ConfigError(f"{path}: a .json file must hold a list of objects; got {type(items).__name__}")
        for n, item in enumerate(items, start=1):
            yield _record(path, f"item {n}", item)
    elif path.suffix == ".parquet":
        try:
            import pyarrow.parquet
        except ImportError as e:
            raise ConfigError(f"{path}: reading .parquet files needs pyarrow: pip install pyarrow") from e
        for n, row in enumerate(pyarrow.parquet.read_table(path).to_pylist(), start=1):
            yield _record(path, f"row {n}", row)
    else:
        raise ConfigError(f"{path}: unsupported file type {path.suffix!r}; use one of {', '.join(SUFFIXES)}")


def _parse_json(path: Path, where: str, text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path}, {where}: not valid JSON ({e})") from e


def _record(path: Path, where: str, value: Any) -> tuple[str, dict[str, Any]]:
    if not isinstance(value, dict):
        raise ConfigError(f"{path}, {where}: expected a JSON object; got {type(value).__name__}")
    return where, value


def require_fields(path: str | Path, where: str, record: dict[str, Any], fields: tuple[str, ...], kind: str) -> None:
    """Raise ConfigError naming the file, the record and the first missing or non-string field."""
    for name in fields:
        if not isinstance(record.get(name), str) or not record[name].strip():
            problem = "missing field" if name not in record else "empty or non-string field"
            raise ConfigError(
                f"{path}, {where}: {problem} {name!r} (a {kind} record needs {', '.join(map(repr, fields))})"
            )
