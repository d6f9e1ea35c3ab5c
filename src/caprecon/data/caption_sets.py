"""Caption test sets as they ship: captions without images, for evaluating generators.

A caption set is a JSONL, JSON, CSV, TSV or parquet file with one caption per row.
The caption column is `caption_column` when given; otherwise the first of
`CAPTION_COLUMNS` that the file has. Structured-caption names come first, so a file
that holds both a web alt text and a recaption (the Re-LAION-Caption 19M layout: an
image URL, the original alt text, the structured caption) is read for the recaption.

The exact column names of the Re-LAION-Caption 19M parquet files could not be checked
here (the dataset card was not reachable); the names below are the likely ones, and
`caption_column` reads any other. Row ids come from the first of `ID_COLUMNS` present,
else the row number; every other column (the image URL, sizes, scores) is kept in the
sample's metadata and so in each output record. Images are never read: the set's
images, if any, are not part of a generator evaluation.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Sequence

from caprecon.core.records import RECORD_SUFFIXES, read_records
from caprecon.data.samples import Sample, SampleFormatError

log = logging.getLogger(__name__)

CAPTION_COLUMNS = ("re_caption", "recaption", "structured_caption", "llava_caption", "caption_llava", "long_caption",
                   "caption", "text", "prompt", "TEXT")
ID_COLUMNS = ("id", "key", "uid", "sample_id", "image_id")
# image columns of a set are dropped: the generated image is what gets judged
_IMAGE_COLUMNS = ("image", "image_path", "file_name", "jpg", "png")


def read_rows(path: Path) -> list[dict[str, Any]]:
    suffix = path.suffix.lower()
    if suffix in RECORD_SUFFIXES:
        # half a surrogate pair in a caption is that row's error when it is scored, as in `load_samples`
        return [record for _, record in read_records(path, SampleFormatError, keep_surrogates=True)]
    if suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise SampleFormatError("reading parquet needs pyarrow: pip install 'caprecon[data]'") from None
        table = pq.read_table(path)
        return table.drop_columns([c for c in _IMAGE_COLUMNS if c in table.column_names]).to_pylist()
    raise SampleFormatError(f"{path}: unknown caption-set format {suffix!r} "
                            f"(use {', '.join(RECORD_SUFFIXES)} or .parquet)")


def caption_text(value: Any) -> str:
    """A caption cell as text. A structured caption stored as a mapping or a list becomes
    one line per part ("key: value"), which the caption normaliser turns into sentences."""
    if value is None:
        return ""
    if isinstance(value, dict):
        return "\n".join(f"{k}: {v}" for k, v in value.items() if v not in (None, ""))
    if isinstance(value, (list, tuple)):
        return "\n".join(str(v) for v in value if v not in (None, ""))
    return str(value)


def pick_column(columns: Sequence[str], wanted: str | None, path: Path) -> str:
    if wanted:
        if wanted not in columns:
            raise SampleFormatError(f"{path}: no column {wanted!r} (--caption-column); columns: {', '.join(columns)}")
        return wanted
    for name in CAPTION_COLUMNS:
        if name in columns:
            return name
    raise SampleFormatError(f"{path}: no caption column among {', '.join(columns) or '(none)'}; name it with "
                            f"--caption-column (looked for {', '.join(CAPTION_COLUMNS)})")


def load_caption_set(path: str | Path, *, caption_column: str | None = None,
                     limit: int | None = None) -> tuple[list[Sample], str]:
    """(caption-only samples, the caption column read) from a caption-set file."""
    path = Path(path)
    if not path.exists():
        raise SampleFormatError(f"input not found: {path}")
    rows = read_rows(path)
    if limit is not None:
        rows = rows[: max(0, limit)]
    columns = list(dict.fromkeys(k for r in rows for k in r))
    column = pick_column(columns, caption_column, path)
    others = [c for c in CAPTION_COLUMNS if c in columns and c != column]
    if others and not caption_column:
        log.warning("%s: reading captions from %r; it also has %s (choose with --caption-column)", path, column,
                    ", ".join(map(repr, others)))
    id_column = next((c for c in ID_COLUMNS if c in columns), None)
    samples = []
    for i, row in enumerate(rows):
        sample_id = row.get(id_column) if id_column else None
        samples.append(Sample(
            id=str(i if sample_id is None else sample_id), image=None, caption=caption_text(row.get(column)),
            meta={k: v for k, v in row.items() if k not in (column, id_column) and k not in _IMAGE_COLUMNS}))
    return samples, column
