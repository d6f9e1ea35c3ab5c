"""Reading record files (JSONL, a JSON list, CSV, TSV) with errors that name the line.

Samples, judgments, QA banks, score files and run folders all come as such files; each
reader passes its own error class so the message says what kind of file was wrong.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any, Iterator

RECORD_SUFFIXES = (".jsonl", ".json", ".csv", ".tsv")


def read_jsonl(path: str | Path, error: type[Exception] = ValueError) -> Iterator[tuple[str, dict[str, Any]]]:
    """(`file:line`, record) for each non-blank line, whatever the file's suffix."""
    path = Path(path)
    with path.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise error(f"{where}: not valid JSON ({exc.msg} at column {exc.colno})") from None
            yield where, _mapping(record, where, error)


def read_records(path: str | Path, error: type[Exception] = ValueError) -> Iterator[tuple[str, dict[str, Any]]]:
    """(location, record) for each row of a .jsonl, .json (a list), .csv or .tsv file."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        yield from read_jsonl(path, error)
    elif suffix == ".json":
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise error(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
        if not isinstance(data, list):
            raise error(f"{path}: a .json file of records must hold a list")
        for i, record in enumerate(data, 1):
            yield f"{path} item {i}", _mapping(record, f"{path} item {i}", error)
    elif suffix in (".csv", ".tsv"):
        with path.open(newline="", encoding="utf-8") as fh:
            reader = csv.DictReader(fh, delimiter="\t" if suffix == ".tsv" else ",")
            for record in reader:
                where = f"{path}:{reader.line_num}"
                if None in record:
                    raise error(f"{where}: more fields than the header has")
                yield where, record
    else:
        raise error(f"{path}: unknown record file type {suffix!r} (use {', '.join(RECORD_SUFFIXES)})")


def _mapping(record: Any, where: str, error: type[Exception]) -> dict[str, Any]:
    if not isinstance(record, dict):
        raise error(f"{where}: expected a record (object), got {type(record).__name__}")
    return record
