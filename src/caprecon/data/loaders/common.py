"""What several benchmark readers share: caption normalising, field look-up, numbers and
reference lists with the row named in every error, and the rated-caption table that the
Hugging Face copies and the Polos/VELA CSVs of Polaris, Nebula, LongCap-Arena and
CaptionEvalKit's Nebula hold, one rated caption a row:

    imgid,mt,refs,score
    COCO_val2014_000000000042.jpg,a dog on a sofa,"['a dog lies on a couch', 'a brown dog']",0.75

The candidate is `cand`/`mt` (also `caption`, `candidate`), the human score
`human_score`/`score` (also `rating`, `human`), the image `file_name`/`imgid`/`img`/`image`,
the references `refs` (a list, its JSON or Python repr, or `|`-separated). Every reader
returns `Judgments` (`caprecon.data.judgments`), so each benchmark runs through the same
statistics; a field it cannot read is a `JudgmentFormatError` naming the file and the row.
"""

from __future__ import annotations

import ast
import json
import math
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

from caprecon.core.records import read_records
from caprecon.data.judgments import SCORES, Judgment, JudgmentFormatError, Judgments
from caprecon.data.loaders import hub


def norm_text(text: Any) -> str:
    # CLIPScore's protocol whitespace-normalises captions and references before comparing them.
    return " ".join(str(text).split())


def load_json(path: Path) -> Any:
    if not path.is_file():
        raise JudgmentFormatError(f"benchmark file not found: {path}")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise JudgmentFormatError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno})") from None


def first_field(record: dict, names: Sequence[str]) -> Any:
    for name in names:
        if record.get(name) is not None:
            return record[name]
    return None


def as_number(value: Any, where: str, what: str, *, finite: bool = True) -> float:
    """`value` as a finite number (a number, or text a number is written in); NaN, an infinity, a
    truth value or anything else is an error naming the row: a NaN human score would drop out of
    every correlation without a word. `finite=False` lets NaN through, for a format whose protocol
    drops its NaN ratings (CLIPScore's Flickr8k JSON)."""
    try:
        number = float(value) if not isinstance(value, bool) else math.inf
    except (TypeError, ValueError):
        raise JudgmentFormatError(f"{where}: {what} {value!r} is not a number") from None
    if not math.isfinite(number) and (finite or not math.isnan(number)):
        raise JudgmentFormatError(f"{where}: {what} {value!r} is not a finite number")
    return number


def caption_text(value: Any, where: str, what: str) -> str:
    """A caption as written: text, whitespace-normalised; a number or anything else is an error
    naming the row (str() would score a caption no one wrote)."""
    if not isinstance(value, str):
        raise JudgmentFormatError(f"{where}: {what} must be text, not the {type(value).__name__} {value!r:.40}")
    return norm_text(value)


def caption_list(value: Any, where: str, what: str, *, written: bool = True) -> list[str]:
    """A list of captions: a list, or (`written`, as CSV cells hold it) its JSON or Python repr or
    `|`-separated text. A JSON file's list must be a list (`written=False`): a string there is an
    error, as is any item that is not text."""
    if isinstance(value, str) and written:
        text = value.strip()
        value = _literal_list(text, where, what) if text.startswith("[") else [p for p in text.split("|") if p.strip()]
    if not isinstance(value, (list, tuple)):
        raise JudgmentFormatError(f"{where}: {what} must be a list of captions, got {value!r:.60}")
    return [caption_text(v, where, f"each of {what}") for v in value]


def _literal_list(text: str, where: str, what: str) -> Any:
    # JSON, or the Python repr of a list (single quotes) that the Polos and VELA CSVs hold
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        pass
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        raise JudgmentFormatError(f"{where}: {what} {text[:60]!r} is neither a JSON nor a Python list") from None


def lowered(record: dict) -> dict:
    return {str(key).strip().lower(): v for key, v in record.items()}


def row_records(rows: Sequence[dict], where: str) -> list[tuple[str, dict]]:
    return [(f"{where} row {k}", lowered(row)) for k, row in enumerate(rows, 1)]


def file_records(path: Path) -> Iterator[tuple[str, dict]]:
    """`read_records` with the keys lower-cased, as every reader here matches them."""
    for where, raw in read_records(path, JudgmentFormatError):
        yield where, lowered(raw)


_HUB_IMAGE = ("file_name", "imgid", "img", "image", "image_path", "img_path")
_HUB_CAPTION = ("cand", "mt", "caption", "candidate")
_HUB_SCORE = ("human_score", "score", "rating", "human")


def table_fields(record: dict, where: str, *, finite: bool = True) -> tuple[str, str, float, list[str]]:
    """(image name, candidate, human score, references) of one row of a Hugging Face benchmark table
    (`finite`: as `as_number`'s)."""
    caption = first_field(record, _HUB_CAPTION)
    score = first_field(record, _HUB_SCORE)
    if caption is None or score is None:
        raise JudgmentFormatError(f"{where}: needs a candidate ({'/'.join(_HUB_CAPTION)}) and a human score "
                                  f"({'/'.join(_HUB_SCORE)}); fields: {sorted(record)}")  # fmt: skip
    image = first_field(record, _HUB_IMAGE)
    refs = first_field(record, ("refs", "references"))
    # A row without an image path keeps its place: text-only metrics still score it, and an
    # image metric gives it a row error instead of reading some other file.
    return (str(image) if image is not None else "", norm_text(caption), as_number(score, where, "score", finite=finite),
            caption_list(refs, where, "refs") if refs is not None else [])  # fmt: skip


def load_hf_judgments(path: str | Path, split: str = "test") -> Judgments:
    """A Hugging Face benchmark table on this machine (`caprecon.data.loaders.hub`): a
    `save_to_disk` folder, a dataset snapshot folder, the `datasets` cache, or a repo id in
    the local Hub cache; never a download.

    Fields: candidate `cand`/`mt` (also `caption`, `candidate`), references `refs`, human
    score `human_score`/`score`, image `file_name`/`imgid` or a stored image (`img`,
    `image`), referred to by the name it was stored under.
    """
    folder, rows = hub.read_rows(path, split)
    return scored_rows(row_records(rows, str(folder)), folder, f"no rows in split {split!r}")


def scored_rows(records: Iterable[tuple[str, dict]], source: Path, empty: str) -> Judgments:
    """One rated judgment per row of a benchmark table (`table_fields`'s columns)."""
    items: list[Judgment] = []
    for row, (where, record) in enumerate(records, 1):
        image, caption, score, refs = table_fields(record, where)
        items.append(Judgment(id=str(row), image=image, caption=caption, ratings=(score,), refs=refs,
                              image_id=Path(image).stem or str(row), row=row))  # fmt: skip
    if not items:
        raise JudgmentFormatError(f"{source}: {empty}")
    return Judgments(SCORES, items, source)


def scores_from_csv(path: Path) -> Judgments:
    return scored_rows(file_records(path), path, "no rows")
