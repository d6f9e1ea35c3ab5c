"""Question sets from elsewhere, as a QA bank (`caprecon cttd import`).

Two layouts:

- **generic**: JSONL, JSON (a list), CSV or TSV, one question per row. Each bank field
  (`image_id`, `question`, `answer`, `type`, `category`, `choices`, `coords`, `id`,
  `image`, `source`) is read from the column of the same name unless `columns` maps it
  to another; `option_columns` (e.g. A, B, C, D) builds `choices` from one column per
  option, skipping empty ones. `choices` in a CSV cell is a JSON list or `|`-separated.
  Without a type: mc when there are choices, yesno for a yes/no answer, box for four
  numbers, short otherwise. Without an image id: the image file's name without suffix.
- **vlmevalkit**: the TSV layout of VLMEvalKit benchmarks (MMBench, MMStar, SEED, ...):
  `index`, `image` (base64; a short value instead refers to the row of that index, and one
  that names no row holding an image drops the question, as an image that is not base64 does),
  `question`, optional `hint` (put before the question), options in columns `A`, `B`, ...,
  `answer`, `category`. Rows without options become yes/no (answer Yes/No) or short.

Images given inline (base64) or as paths are written to the output's `images/` folder
as `<image_id>.<format>`, so a captions file can name them and `turing` find them. Each is
decoded first and only the bytes that decoded are written: a question whose image is not
base64, not an image, missing, not a regular file or outside `image_root` is dropped,
counted and named (`ImageWriter.dropped`), and the import goes on. Without a folder to write to
(`--no-images`) inline images are still decoded and dropped alike; image paths are left unread.
Any row that is not a valid bank item stops the import with the file, line and problem.
"""

from __future__ import annotations

import base64
import binascii
import csv
import io
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

from PIL import Image

from caprecon.data.images import decode_bytes, read_image_file
from caprecon.data.qa import QABankError, parse_item
from caprecon.data.samples import SampleError
from caprecon.core.records import read_records
from caprecon.apps.cttd.curate import bank_record
from caprecon.run.folder import holds_run_folder

FORMATS = ("auto", "generic", "vlmevalkit")
FIELDS = ("image_id", "question", "answer", "type", "category", "choices", "coords", "id", "image", "source")
_YES_NO = {"yes", "no"}


class QuestionImportError(QABankError):
    """A question file that cannot be imported: the message names the file, row and problem."""


def allow_long_csv_fields() -> None:
    # base64 images are far longer than the csv module's default field limit (128 KiB)
    csv.field_size_limit(min(sys.maxsize, 2**31 - 1))


def _blank(value: Any) -> bool:
    return value is None or (isinstance(value, str) and value.strip().lower() in {"", "nan", "none"})


def _choices(value: Any) -> list[str] | None:
    if _blank(value):
        return None
    if isinstance(value, list):
        return [str(v) for v in value]
    text = str(value).strip()
    if text.startswith("["):
        return [str(v) for v in json.loads(text)]
    return [part.strip() for part in text.split("|") if part.strip()]


def _answer(value: Any) -> Any:
    """A box written as text in a CSV cell ("[1, 2, 3, 4]") as a list."""
    if isinstance(value, str) and re.fullmatch(r"\s*\[[\d.,\s]+\]\s*", value):
        return json.loads(value)
    return value


def infer_type(record: dict[str, Any]) -> str:
    if record.get("choices"):
        return "mc"
    answer = record.get("answer")
    if isinstance(answer, str) and answer.strip().lower() in _YES_NO:
        return "yesno"
    if isinstance(answer, (list, tuple)) and len(answer) == 4:
        return "box"
    return "short"


@dataclass
class Dropped:
    """A question left out because its image could not be used."""

    where: str  # file:line
    image_id: str
    reason: str  # the kind of problem, for counts
    error: str  # the problem, naming the image


class ImageDropped(Exception):
    """This row's image cannot be used: the row is left out (`ImageWriter.dropped` says why)."""


class ImageWriter:
    """Writes each image once, as images/<image_id>.<format>, after decoding it; remembers what
    it wrote and which questions it dropped; with `folder` None it writes nothing and only checks
    inline images. Image paths are read through
    `caprecon.data.images.read_image_file`: relative ones resolve against `image_root` when it
    is given (else the question file's folder), and every one must then lie inside it."""

    def __init__(self, folder: Path | None, relative_to: Path, *, image_root: Path | None = None):
        self.folder = folder
        self.relative_to = relative_to
        self.image_root = image_root
        self.written: dict[str, Path] = {}
        self.dropped: list[Dropped] = []
        self._refused: dict[str, SampleError] = {}  # image id -> why, so its other questions are dropped alike

    def locate(self, text: str, file_folder: Path) -> Path:
        """Where an image column's path points: absolute as given, else under `image_root` or the file's folder."""
        path = Path(text)
        return path if path.is_absolute() else (self.image_root or file_folder) / path

    def from_base64(self, image_id: str, text: str, where: str) -> str | None:
        if image_id not in self.written and image_id not in self._refused:
            try:
                data = base64.b64decode("".join(text.split()), validate=True)
            except (binascii.Error, ValueError) as exc:
                self._refused[image_id] = SampleError(f"the image is not valid base64 ({exc})", "image not base64")
            else:
                return self.from_bytes(image_id, data, where)
        return self._result(image_id, where)

    def from_bytes(self, image_id: str, data: bytes, where: str) -> str | None:
        if image_id not in self.written and image_id not in self._refused:
            self._write(image_id, data, f"the image of {where}")
        return self._result(image_id, where)

    def from_path(self, image_id: str, path: Path, where: str) -> str | None:
        if self.folder is None:  # nothing is copied, so the image stays where the path says, unread
            return None
        if image_id not in self.written and image_id not in self._refused:
            try:
                data = read_image_file(path, self.image_root)
            except SampleError as exc:
                self._refused[image_id] = exc
            else:
                self._write(image_id, data, f"image {path}")
        return self._result(image_id, where)

    def refuse(self, image_id: str, error: SampleError, where: str) -> None:
        """Drop the question at `where`, and every other of its image, for `error` (raises `ImageDropped`)."""
        self._refused.setdefault(image_id, error)
        self._result(image_id, where)

    def _write(self, image_id: str, data: bytes, what: str) -> None:
        try:
            decode_bytes(data, what)  # every pixel, so a truncated file is refused too
            with Image.open(io.BytesIO(data)) as im:
                fmt = (im.format or "png").lower()
        except SampleError as exc:
            self._refused[image_id] = exc
            return
        if self.folder is None:
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.folder / f"{_safe(image_id)}.{'jpg' if fmt == 'jpeg' else fmt}"
        path.write_bytes(data)  # the bytes that decoded, read once: nothing else reaches the folder
        self.written[image_id] = path

    def _result(self, image_id: str, where: str) -> str | None:
        refused = self._refused.get(image_id)
        if refused is not None:
            self.dropped.append(Dropped(where, image_id, refused.reason, str(refused)))
            raise ImageDropped(image_id)
        return str(self.written[image_id].relative_to(self.relative_to)) if image_id in self.written else None


def _safe(name: str) -> str:
    return re.sub(r"[^\w.-]", "_", name)


def _checked(record: dict[str, Any], where: str) -> dict[str, Any]:
    try:
        item = parse_item(record, where)
    except QABankError as exc:
        raise QuestionImportError(str(exc)) from None
    return bank_record(item)


def import_generic(path: str | Path, *, columns: dict[str, str] | None = None,
                   option_columns: Iterable[str] = (), default_type: str | None = None,
                   default_category: str = "", source: str | None = None,
                   images: ImageWriter | None = None) -> list[dict[str, Any]]:
    """Bank records from a generic question file (see the module doc)."""
    path = Path(path)
    columns = dict(columns or {})
    unknown = sorted(set(columns) - set(FIELDS))
    if unknown:
        raise QuestionImportError(f"unknown bank field(s) {unknown} in the column mapping; fields: {', '.join(FIELDS)}")
    option_columns = list(option_columns)
    allow_long_csv_fields()
    out, counters = [], {}
    for where, row in read_records(path, QuestionImportError):
        value = {f: row.get(columns.get(f, f)) for f in FIELDS}
        if _blank(value["question"]):
            raise QuestionImportError(f"{where}: no question (column {columns.get('question', 'question')!r})")
        choices = [str(row[c]) for c in option_columns if not _blank(row.get(c))] if option_columns \
            else _choices(value["choices"])
        image = value["image"]
        image_id = None if _blank(value["image_id"]) else str(value["image_id"])
        if image_id is None:
            if _blank(image) or len(str(image)) > 512:
                raise QuestionImportError(f"{where}: no image id (column {columns.get('image_id', 'image_id')!r}) and no "
                                   f"image path to take it from")
            image_id = Path(str(image)).stem
        record: dict[str, Any] = {"image_id": image_id, "question": str(value["question"]),
                                  "answer": _answer(value["answer"]),
                                  "category": "" if _blank(value["category"]) else str(value["category"]),
                                  "source": source or ("" if _blank(value["source"]) else str(value["source"]))
                                  or path.stem}
        record["category"] = record["category"] or default_category
        if choices:
            record["choices"] = choices
        if not _blank(value["coords"]):
            record["coords"] = str(value["coords"])
        record["type"] = str(value["type"]) if not _blank(value["type"]) else default_type or infer_type(record)
        n = counters.get(image_id, 0)
        counters[image_id] = n + 1
        record["id"] = str(value["id"]) if not _blank(value["id"]) else f"{image_id}#{n}"
        if images is not None and not _blank(image):
            text = str(image)
            try:
                written = images.from_base64(image_id, text, where) if len(text) > 512 \
                    else images.from_path(image_id, images.locate(text, path.parent), where)
            except ImageDropped:
                continue
            if written is not None:
                record["image"] = written
        out.append(_checked(record, where))
    return out


def import_vlmevalkit(path: str | Path, *, images: ImageWriter | None = None, source: str | None = None,
                      id_prefix: str = "") -> list[dict[str, Any]]:
    """Bank records from a VLMEvalKit benchmark TSV (see the module doc)."""
    path = Path(path)
    allow_long_csv_fields()
    rows = list(read_records(path, QuestionImportError))
    if not rows:
        raise QuestionImportError(f"{path}: no rows")
    header = set(rows[0][1])
    missing = [c for c in ("index", "question", "answer") if c not in header]
    if missing:
        raise QuestionImportError(f"{path}: not a VLMEvalKit TSV: no column {', '.join(missing)}")
    letters = [c for c in "ABCDEFGHIJKLMNOPQRSTUVWXYZ" if c in header]
    inline = {str(row["index"]): row.get("image") for _, row in rows if not _blank(row.get("image"))
              and len(str(row["image"])) > 64}
    out = []
    for where, row in rows:
        index = str(row["index"]).strip()
        image_id = f"{id_prefix}{index}"
        question = str(row["question"]).strip()
        if not _blank(row.get("hint")):
            question = f"{str(row['hint']).strip()}\n{question}"
        record: dict[str, Any] = {"id": image_id, "image_id": image_id, "question": question,
                                  "category": "" if _blank(row.get("category")) else str(row["category"]),
                                  "source": source or path.stem}
        choices = [str(row[c]) for c in letters if not _blank(row.get(c))]
        answer = str(row["answer"]).strip()
        if choices:
            record.update(type="mc", choices=choices, answer=answer)
        else:
            record.update(type="yesno" if answer.lower() in _YES_NO else "short", answer=answer)
        if images is not None:
            raw = row.get("image")
            written = None
            try:
                if not _blank(raw) and len(str(raw)) <= 64:  # a reference to the row holding the image
                    given, raw = str(raw).strip(), inline.get(str(raw).strip())
                    if raw is None:  # kept before, without its image and without a word
                        images.refuse(image_id, SampleError(
                            f"the image {given!r:.64} is neither base64 nor the index of a row holding an image",
                            "image not base64"), where)  # fmt: skip
                if not _blank(raw):
                    written = images.from_base64(image_id, str(raw), where)
                elif not _blank(row.get("image_path")):
                    written = images.from_path(image_id, images.locate(str(row["image_path"]), path.parent), where)
            except ImageDropped:
                continue
            if written is not None:
                record["image"] = written
        out.append(_checked(record, where))
    return out


@dataclass
class Imported:
    """What `cttd_import` returns: the bank written, its questions, the layout read, the questions
    dropped because their image could not be used (each named), and the images written."""

    bank: Path
    records: list[dict[str, Any]]
    format: str  # generic or vlmevalkit
    datasheet: dict[str, Any]
    dropped: list[Dropped] = field(default_factory=list)
    images: dict[str, Path] = field(default_factory=dict)  # image id -> the file written under OUT/images


@holds_run_folder("out", inputs=("file",))
def cttd_import(file: str | Path, out: str | Path, *, format: str = "auto", columns: dict[str, str] | None = None,
                option_columns: Sequence[str] = (), default_type: str | None = None, default_category: str = "",
                source: str | None = None, id_prefix: str = "", write_images: bool = True,
                image_root: str | Path | None = None) -> Imported:
    """`caprecon cttd import`: the question file `file` as a QA bank in `out` (bank.jsonl, images/,
    datasheet.md/.json). `format` is auto (vlmevalkit for a .tsv with index, question, answer and
    option columns), generic or vlmevalkit; `columns`, `option_columns`, `default_type`,
    `default_category` are the generic layout's (`import_generic`), `id_prefix` the vlmevalkit one's;
    `write_images=False` is `--no-images`. A row that is not a bank item stops the import
    (ConfigError naming the file and line); a question whose image cannot be used is dropped and named
    in `Imported.dropped` and the datasheet.

        imported = caprecon.cttd_import("MMBench_DEV_EN.tsv", "banks/mmbench", id_prefix="mmb-")
    """
    from collections import Counter

    from caprecon.apps.cttd.datasheet import bank_counts, datasheet_markdown
    from caprecon.apps.cttd.stage import write_json, write_jsonl
    from caprecon.core.errors import ConfigError

    if format not in FORMATS:
        raise ConfigError(f"--format {format!r}: choose from {', '.join(FORMATS)}")
    path = Path(file)
    if not path.is_file():
        raise ConfigError(f"question file not found: {path}")
    out = Path(out)
    # without images written an inline image is still decoded, so a question whose image is broken is
    # dropped and named as when images are written; only nothing reaches OUT/images
    images = ImageWriter(out / "images" if write_images else None, out,
                         image_root=Path(image_root) if image_root else None)
    chosen = format
    try:
        if chosen == "auto":
            chosen = "generic"
            if path.suffix.lower() == ".tsv":
                allow_long_csv_fields()
                first = next((row for _, row in read_records(path, QuestionImportError)), {})
                if {"index", "question", "answer", "A"} <= set(first):
                    chosen = "vlmevalkit"
        if chosen == "vlmevalkit":
            records = import_vlmevalkit(path, images=images, source=source, id_prefix=id_prefix)
        else:
            records = import_generic(path, columns=dict(columns or {}), default_type=default_type,
                                     default_category=default_category, option_columns=list(option_columns),
                                     source=source, images=images)
    except QuestionImportError as exc:
        raise ConfigError(str(exc)) from None
    write_jsonl(out / "bank.jsonl", records)
    dropped = images.dropped
    sheet = {"bank": "bank.jsonl", "imported_from": str(path), "format": chosen, **bank_counts(records),
             "stages": [], "models": {}, "prompts": {},
             "settings": {"format": chosen, "columns": [f"{k}={v}" for k, v in (columns or {}).items()]}}
    if dropped:  # the report's stage table shows the counts; the list names every question
        sheet["stages"] = [{"stage": "import", "counts": {"questions": len(records) + len(dropped),
                                                         "kept": len(records)},
                            "dropped": dict(Counter(d.reason for d in dropped)), "model_calls": {}}]
        sheet["dropped_questions"] = [vars(d) for d in dropped]
    write_json(out / "datasheet.json", sheet)
    (out / "datasheet.md").write_text(datasheet_markdown(sheet), encoding="utf-8")
    return Imported(out / "bank.jsonl", records, chosen, sheet, list(dropped), dict(images.written))
