"""Benchmark files as questions: one reader for the row formats, one parser per question type.

VLMEvalKit's TSV layout is the common ground: `index`, `image` (base64; a short value
naming another row's `index` reuses that row's image, as VLMEvalKit writes repeated
images), `question`, option columns `A`, `B`, ... (empty cells end the list), `answer`,
`category`, and where present `hint`, `l2-category`, `image_path`. JSONL/JSON/CSV files
hold the same fields; their `image` may be a path (relative to the file) instead.
Other fields by question type:

- math: `choices`/`options` (a list, or a Python/JSON list literal) when the answer is
  an option; `precision` (decimals to round to before comparing).
- ocr: `answer` may be a list (or a list literal) of accepted answers.
- box: the expression in `question` (or `expression`, `sentence`, `ref`), the box in
  `bbox` (or `answer`), in pixels of the image, as the entry's `box_format` says.

Each image is identified by the hash of its bytes, so an image shared by rows, datasets
or runs is captioned, reconstructed and answered on once.
"""

from __future__ import annotations

import ast
import base64
import binascii
import csv
import hashlib
import json
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from caprecon.core.errors import ConfigError
from caprecon.data.images import decode_bytes, read_image_file
from caprecon.data.qa import LETTERS, QABankError, QAItem, parse_item
from caprecon.data.samples import SampleError
from caprecon.core.records import read_delimited, read_records
from caprecon.apps.suites.entries import SuiteEntry

_EXPRESSION_FIELDS = ("question", "expression", "sentence", "ref", "referring_expression")


class SuiteFormatError(ConfigError):
    """A benchmark file row that cannot be read: the message names the file, row and problem."""


@dataclass(frozen=True)
class BenchQuestion:
    """One benchmark question about one image.

    `answer`: mc: the option letter; yesno: "yes"/"no"; math: the gold text (or letter
    with `item`); ocr: the accepted answers; box: (x1, y1, x2, y2) in pixels of the image.
    `item` is the `QAItem` of mc, yesno and box questions (and math with options), which
    builds their prompt and grades them as the QA bank does.
    """

    dataset: str
    id: str
    image_id: str
    type: str
    question: str
    answer: Any
    category: str = ""
    group: str = ""  # rows scored together by accuracy+
    item: QAItem | None = None
    meta: dict[str, Any] = field(default_factory=dict, compare=False)


@dataclass
class Benchmark:
    entry: SuiteEntry
    questions: list[BenchQuestion]


def image_id_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:20]


def _rows(entry: SuiteEntry) -> Iterator[tuple[str, dict[str, Any]]]:
    path = entry.data
    fmt = entry.file_format
    if fmt == "tsv":  # base64 images overflow the csv module's default field limit
        csv.field_size_limit(sys.maxsize)
        with path.open(newline="", encoding="utf-8") as fh:
            yield from read_delimited(fh, path, "\t", SuiteFormatError)
    else:
        suffixed = {"jsonl": ".jsonl", "json": ".json", "csv": ".csv"}[fmt]
        if path.suffix.lower() != suffixed:
            raise SuiteFormatError(f"{path}: format {fmt} needs a {suffixed} file")
        yield from read_records(path, SuiteFormatError)


def _text(value: Any) -> str:
    return "" if value is None or (isinstance(value, float) and value != value) else str(value).strip()


def _list(value: Any, where: str, what: str) -> list[str] | None:
    """A list given as a list or as a JSON/Python list literal; None when the value is no list."""
    if isinstance(value, (list, tuple)):
        return [str(v) for v in value]
    text = _text(value)
    if not text.startswith("["):
        return None
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError:
        try:
            parsed = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            raise SuiteFormatError(f"{where}: {what} {text[:60]!r} looks like a list but cannot be read") from None
    if not isinstance(parsed, (list, tuple)):
        raise SuiteFormatError(f"{where}: {what} must be a list")
    return [str(v) for v in parsed]


class _Images:
    """Image bytes of a file's rows, and the rows' image ids (content hashes)."""

    def __init__(self, entry: SuiteEntry, records: list[tuple[str, dict[str, Any]]], store: dict[str, bytes | Path]):
        self.base = entry.data.parent
        self.store = store  # image_id -> bytes or path, shared by every dataset of a run
        # VLMEvalKit writes a repeated image once and names its row's index in the others, before or after
        self.by_index = {_text(r.get("index")): _text(r.get("image")) for _, r in records
                         if _text(r.get("index")) and len(_text(r.get("image"))) > 64}
        self._ids: dict[str, str] = {}

    def resolve(self, record: dict[str, Any], where: str) -> str:
        value = _text(record.get("image")) or _text(record.get("image_path"))
        if not value:
            raise SuiteFormatError(f"{where}: no image (an `image` or `image_path` field)")
        if len(value) <= 64 and value in self.by_index:
            value = self.by_index[value]
        if value not in self._ids:
            self._ids[value] = self._load(value, where)
        return self._ids[value]

    def _load(self, value: str, where: str) -> str:
        path = Path(value) if len(value) < 1024 else None
        if path is not None and not path.is_absolute():
            path = self.base / path
        if path is not None and path.is_file():
            try:
                image_id = image_id_of(read_image_file(path))
            except SampleError as exc:
                raise SuiteFormatError(f"{where}: {exc}") from None
            self.store.setdefault(image_id, path)
            return image_id
        try:
            data = base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            raise SuiteFormatError(f"{where}: image is neither a file nor base64 (nor the index of another "
                                   f"row): {value[:40]!r}") from None
        try:  # else it would fail every judge call on it, after the models have loaded
            decode_bytes(data, "its base64 image")
        except SampleError:
            raise SuiteFormatError(f"{where}: the base64 `image` is not a picture PIL can decode: "
                                   f"{value[:40]!r}") from None
        image_id = image_id_of(data)
        self.store.setdefault(image_id, data)
        return image_id


def _options(record: dict[str, Any]) -> list[str]:
    """VLMEvalKit's option columns A, B, C...: up to the first missing or empty one."""
    options = []
    for letter in LETTERS:
        value = _text(record.get(letter))
        if not value:
            break
        options.append(value)
    return options


def _qa_item(fields_: dict[str, Any], where: str) -> QAItem:
    try:
        return parse_item(fields_, where)
    except QABankError as exc:
        raise SuiteFormatError(str(exc)) from None


def _box(value: Any, entry: SuiteEntry, where: str) -> tuple[float, float, float, float]:
    numbers = _list(value, where, "bbox") if not isinstance(value, (list, tuple)) else list(value)
    try:
        x, y, a, b = (float(v) for v in (numbers or []))
    except (TypeError, ValueError):
        raise SuiteFormatError(f"{where}: bbox must be four numbers, got {value!r}") from None
    return (x, y, x + a, y + b) if entry.box_format == "xywh" else (x, y, a, b)


def parse_question(entry: SuiteEntry, record: dict[str, Any], where: str, image_id: str, row: int) -> BenchQuestion:
    qid = _text(record.get("index")) or _text(record.get("id")) or str(row)
    category = _text(record.get("category"))
    meta = {k: record[k] for k in ("l2-category", "split", "question_type", "answer_type", "unit")
            if _text(record.get(k))}
    hint = _text(record.get("hint"))
    question = _text(record.get("question"))
    common = dict(dataset=entry.name, id=qid, image_id=image_id, category=category, meta=meta)
    answer = record.get("answer")
    if entry.question == "box":
        question = next((_text(record.get(k)) for k in _EXPRESSION_FIELDS if _text(record.get(k))), "")
        if not question:
            raise SuiteFormatError(f"{where}: no referring expression (one of {', '.join(_EXPRESSION_FIELDS)})")
        box = _box(record.get("bbox", answer), entry, where)
        if not (box[2] > box[0] >= 0 and box[3] > box[1] >= 0):
            raise SuiteFormatError(f"{where}: bbox {list(box)} is not a box (x1 < x2, y1 < y2, non-negative)")
        prompt = f"Find the region this phrase describes: {question}"
        item = _qa_item({"image_id": image_id, "question": prompt, "type": "box", "answer": list(box),
                         "coords": "pixel"}, where)
        return BenchQuestion(type="box", question=question, answer=box, item=item, **common)
    if not question:
        raise SuiteFormatError(f"{where}: empty question")
    if answer is None or not _text(answer):
        raise SuiteFormatError(f"{where}: no answer")
    text = f"Hint: {hint}\n{question}" if hint else question
    group = image_id if entry.pair_by == "image" else _text(record.get(entry.pair_by))
    options = _options(record)
    if entry.question == "math" and not options:
        options = _list(record.get("choices"), where, "choices") or _list(record.get("options"), where,
                                                                            "options") or []
    if entry.question in ("mc", "math") and (options or entry.question == "mc"):
        if not options:
            raise SuiteFormatError(f"{where}: a multiple-choice row needs option columns A, B, ...")
        item = _qa_item({"image_id": image_id, "question": text, "type": "mc", "choices": options,
                         "answer": _text(answer)}, where)
        return BenchQuestion(type="mc", question=text, answer=item.answer, item=item, group=group, **common)
    if entry.question == "yesno":
        item = _qa_item({"image_id": image_id, "question": text, "type": "yesno", "answer": _text(answer)}, where)
        return BenchQuestion(type="yesno", question=text, answer=item.answer, item=item, group=group, **common)
    if entry.question == "math":
        precision = _text(record.get("precision"))
        if precision:
            try:
                meta["precision"] = int(float(precision))
            except ValueError:
                raise SuiteFormatError(f"{where}: precision must be a number of decimals, got {precision!r}") from None
        return BenchQuestion(type="math", question=text, answer=_text(answer), group=group, **common)
    accepted = _list(answer, where, "answer") or [_text(answer)]
    accepted = [a for a in (x.strip() for x in accepted) if a]
    if not accepted:
        raise SuiteFormatError(f"{where}: no accepted answer")
    return BenchQuestion(type="ocr", question=text, answer=tuple(accepted), group=group, **common)


def load_benchmark(entry: SuiteEntry, images: dict[str, bytes | Path]) -> Benchmark:
    """The entry's questions; their images go into `images` (image_id -> bytes or path)."""
    records = list(_rows(entry))
    resolver = _Images(entry, records, images)
    questions = []
    for row, (where, record) in enumerate(records):
        image_id = resolver.resolve(record, where)
        questions.append(parse_question(entry, record, where, image_id, row))
    if not questions:
        raise SuiteFormatError(f"suite {entry.name!r}: {entry.data} holds no rows")
    repeated = sorted(i for i, n in Counter(q.id for q in questions).items() if n > 1)[:5]
    if repeated:
        raise SuiteFormatError(f"suite {entry.name!r}: index {repeated} used by more than one row of {entry.data}")
    return Benchmark(entry, questions)
