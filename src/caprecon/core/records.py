"""Record files (JSONL, a JSON list, CSV, TSV): read with errors that name the line, and JSONL
written so that a crash never leaves half a file.

Samples, judgments, QA banks, score files and run folders all come as such files; each
reader passes its own error class so the message says what kind of file was wrong.
"""

from __future__ import annotations

import codecs
import csv
import io
import json
import math
import os
import re
from pathlib import Path
from typing import Any, Iterable, Iterator

RECORD_SUFFIXES = (".jsonl", ".json", ".csv", ".tsv")

# a byte-order mark says how a file is encoded: trust it (UTF-32 first: its LE mark starts like UTF-16's)
_BOMS = ((codecs.BOM_UTF32_LE, "utf-32"), (codecs.BOM_UTF32_BE, "utf-32"), (codecs.BOM_UTF8, "utf-8-sig"),
         (codecs.BOM_UTF16_LE, "utf-16"), (codecs.BOM_UTF16_BE, "utf-16"))


def is_number(value: Any) -> bool:
    """Whether a record's value is a finite number (a bool is not one)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def read_text(path: str | Path, error: type[Exception] = ValueError) -> str:
    """A text file's contents: UTF-8, or whatever encoding its byte-order mark names.

    Without a mark the file must be UTF-8; anything else is refused with the place of
    the first bad byte, rather than read as mojibake (or a UTF-8 mark kept in the first
    column's name).
    """
    path = Path(path)
    data = path.read_bytes()
    encoding = next((name for bom, name in _BOMS if data.startswith(bom)), "utf-8")
    try:
        return data.decode(encoding)
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise error(f"{path}: not {encoding.upper()} text (byte 0x{data[exc.start]:02x} on line {line}); "
                    "save it as UTF-8") from None


def read_jsonl(path: str | Path, error: type[Exception] = ValueError, *,
               keep_surrogates: bool = False) -> Iterator[tuple[str, dict[str, Any]]]:
    """(`file:line`, record) for each non-blank line, whatever the file's suffix. A line holding half
    a surrogate pair is refused, unless `keep_surrogates`: samples, whose rows are refused one by one
    when scored (`caprecon.data.images.read_image`), and the files our writers wrote (`json_text`)."""
    path = Path(path)
    # split on newlines only: JSON strings may hold U+2028 and other characters splitlines() breaks at
    for lineno, line in enumerate(read_text(path, error).split("\n"), 1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise error(f"{where}: not valid JSON ({exc.msg} at column {exc.colno})") from None
        except RecursionError:
            raise error(f"{where}: nested too deeply to read") from None
        if not keep_surrogates and _LONE_SURROGATE.search(line):
            _refuse_lone_surrogates(record, where, error)
        yield where, _mapping(record, where, error)


# an escaped UTF-16 surrogate (\ud800-\udfff): only a pair of them makes a character
_LONE_SURROGATE = re.compile(r"\\u[dD][89a-fA-F]")


def _refuse_lone_surrogates(record: Any, where: str, error: type[Exception]) -> None:
    """JSON lets a string hold half of a surrogate pair, which no UTF-8 file (scores.jsonl
    included) can store: refused here, where the line is known, not when the row is written."""
    try:
        json.dumps(record, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as exc:
        raise error(f"{where}: holds half a UTF-16 surrogate pair ({exc.object[exc.start]!r}), which is not "
                    "text; write the character itself or both halves of its pair") from None


def read_records(path: str | Path, error: type[Exception] = ValueError, *,
                 keep_surrogates: bool = False) -> Iterator[tuple[str, dict[str, Any]]]:
    """(location, record) for each row of a .jsonl, .json (a list), .csv or .tsv file;
    `keep_surrogates` as in `read_jsonl`."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        yield from read_jsonl(path, error, keep_surrogates=keep_surrogates)
    elif suffix == ".json":
        text = read_text(path, error)
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise error(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
        except RecursionError:
            raise error(f"{path}: nested too deeply to read") from None
        if not isinstance(data, list):
            raise error(f"{path}: a .json file of records must hold a list")
        # else no record can hold half a pair
        escaped_surrogate = not keep_surrogates and _LONE_SURROGATE.search(text) is not None
        for i, record in enumerate(data, 1):
            if escaped_surrogate:
                _refuse_lone_surrogates(record, f"{path} item {i}", error)
            yield f"{path} item {i}", _mapping(record, f"{path} item {i}", error)
    elif suffix in (".csv", ".tsv"):
        yield from read_delimited(io.StringIO(read_text(path, error), newline=""), path,
                                  "\t" if suffix == ".tsv" else ",", error)
    else:
        raise error(f"{path}: unknown record file type {suffix!r} (use {', '.join(RECORD_SUFFIXES)})")


def read_delimited(fh, path: str | Path, delimiter: str,
                   error: type[Exception] = ValueError) -> Iterator[tuple[str, dict[str, Any]]]:
    """CSV/TSV rows from an open text stream, each with the line it came from; a row with more
    fields than the header, or a quote never closed, is an error naming that line."""
    lines = _RecordLines(fh)
    reader = csv.DictReader(lines, delimiter=delimiter)
    if reader.fieldnames is None:  # an empty file
        return
    lines.take()  # the header's lines are no row's
    held = None  # each row waits for the next: only the last can hold a quote that runs to the end
    for record in reader:
        where = f"{path}:{reader.line_num}"
        if None in record:
            raise error(f"{where}: more fields than the header has")
        if held:
            yield held
        held, first_line, text = (where, record), reader.line_num - len(lines.taken) + 1, lines.take()
    if held:
        try:
            list(csv.reader(io.StringIO(text, newline=""), delimiter=delimiter, strict=True))
        except csv.Error as exc:
            if "end of data" in str(exc):
                raise error(f"{path}:{first_line}: a quote opened on this row is never closed, so every line "
                            "after it would be read into one field; close or remove the quote") from None
        yield held


class _RecordLines:
    """The lines of a delimited file, keeping those of the row being read."""

    def __init__(self, fh):
        self.fh, self.taken = fh, []

    def __iter__(self):
        for line in self.fh:
            self.taken.append(line)
            yield line

    def take(self) -> str:
        text, self.taken = "".join(self.taken), []
        return text


def _mapping(record: Any, where: str, error: type[Exception]) -> dict[str, Any]:
    if not isinstance(record, dict):
        raise error(f"{where}: expected a record (object), got {type(record).__name__}")
    return record


def write_jsonl_atomically(path: Path, rows: Iterable[dict[str, Any]], *, allow_nan: bool = False) -> int:
    """The whole file at once: written beside it, then renamed over it, so a crash leaves the
    old file or the new one, never half of one. Returns the number of rows."""
    partial = path.with_name(path.name + ".part")
    with partial.open("w", encoding="utf-8") as fh:
        count = append_jsonl(fh, rows, allow_nan=allow_nan)
        os.fsync(fh.fileno())
    os.replace(partial, path)
    return count


def open_for_append(path: Path, kept: list[dict[str, Any]]):
    """`path` holding exactly the kept rows, open for appending new ones."""
    write_jsonl_atomically(path, kept)
    return path.open("a", encoding="utf-8")


def append_jsonl(sink, rows: Iterable[dict[str, Any]], *, allow_nan: bool = False) -> int:
    """Rows as JSON lines (`json_text`: non-ASCII kept, a lone surrogate escaped; values JSON cannot
    hold as `str`, NaN refused unless `allow_nan`), flushed so a reader sees whole lines. Returns the
    number of rows."""
    count = 0
    for row in rows:
        sink.write(json_text(row, allow_nan=allow_nan, default=str) + "\n")
        count += 1
    sink.flush()
    return count


def unicode_problem(text: str) -> str | None:
    """What keeps `text` from being written as UTF-8, as every output file, cache key and request
    is, or None: a lone surrogate, which a JSON escape ("\\ud800") or a decoder's
    `surrogateescape` lets into a Python string though it is no character."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return (f"holds a lone surrogate ({text[exc.start]!r}) at character {exc.start}, which is not text: "
                "the input's encoding is broken")
    return None


# a UTF-16 surrogate on its own in a Python string: no UTF-8 file can hold it as a character
_SURROGATE = re.compile("[\ud800-\udfff]")


def json_text(value: Any, **options: Any) -> str:
    """`json.dumps(value, ensure_ascii=False, **options)` that every UTF-8 file can hold: a lone
    surrogate in a string (a JSON escape such as "\\ud800" in the input, a file name decoded with
    `surrogateescape`) is written as its JSON escape, which reads back as the same string. Outside
    strings JSON is ASCII, so the escape lands inside the string that held the surrogate."""
    text = json.dumps(value, ensure_ascii=False, **options)
    return text if text.isascii() else _SURROGATE.sub(lambda found: f"\\u{ord(found.group()):04x}", text)
