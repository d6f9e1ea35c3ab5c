"""Composite (Aditya et al. 2015) as FLEUR, PAC-S and Polos use it, `composite.json`:

    {"flickr8k": [{"image": "1000268201_693b08cb0e.jpg", "caption": "a child in a pink dress",
                   "human": 4, "refs": ["..."]}],
     "flickr30k": [...], "coco": [{"image": "COCO_val2014_000000000042.jpg", ...}]}

Also read: the Polos CSV (`en_test_composite_da.csv`, the table of `caprecon.data.loaders.common`),
the Hugging Face copy `yuwd/Composite`, and caprecon's own layout (`load_composite`).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Sequence

from caprecon.core.records import RECORD_SUFFIXES, read_records
from caprecon.data.judgments import SCORES, Judgment, JudgmentFormatError, Judgments
from caprecon.data.loaders import hub
from caprecon.data.loaders.common import (as_number, caption_list, caption_text, file_records, first_field, load_json,
                                          lowered, norm_text, row_records, table_fields)


COMPOSITE_SUBSETS = ("flickr8k", "flickr30k", "coco")
# The image folders FLEUR's fleur_com.py joins a Composite JSON's `image` to, per subset.
COMPOSITE_IMAGE_FOLDERS = {"flickr8k": "flickr8k", "flickr30k": "flickr30k", "coco": "coco2014"}


def _without_candidate(refs: Sequence[str], caption: str) -> list[str]:
    """A rated caption that is also one of its image's references leaves the references."""
    return [r for r in refs if r != caption]


def composite_subset(name: str) -> str | None:
    """flickr8k / flickr30k / coco from a file name such as `8k_correctness.csv`."""
    low = name.lower()
    if "30k" in low:
        return "flickr30k"
    if "8k" in low:
        return "flickr8k"
    if "coco" in low:
        return "coco"
    return None


def composite_subset_of_image(name: str) -> str | None:
    """The subset an image belongs to, from its file name alone.

    COCO names start `COCO_`; Flickr8k names are `<digits>_<hex>` (`1000268201_693b08cb0e`);
    Flickr30k names are digits only (`1000092795`). Used where a copy of Composite keeps no
    subset column (the Polos CSV, the Hugging Face dataset).
    """
    stem = Path(str(name)).stem
    if stem.upper().startswith("COCO_"):
        return "coco"
    if re.fullmatch(r"\d+_[0-9a-f]+", stem):
        return "flickr8k"
    if re.fullmatch(r"\d+", stem):
        return "flickr30k"
    return None


def load_composite(path: str | Path, subsets: Sequence[str] = COMPOSITE_SUBSETS) -> Judgments:
    """Composite (Aditya et al. 2015): 1-5 correctness ratings of captions of Flickr8k,
    Flickr30k and COCO images. Whatever the copy, a candidate that is one of its image's
    references is taken out of that image's references before scoring.

    Copies read, by what `path` is:

    - `composite.json` as FLEUR / PAC-S / Polos use it (FLEUR's `fleur_com.py` reads it):
      `{"flickr8k": [{"image", "caption", "human", ...}], "flickr30k": [...], "coco": [...]}`;
      `human` is the correctness rating. References, where the copy has them, are read from
      `refs`, `references` or `ground_truth` (assumption: FLEUR's reader does not read
      references, so their field name is not pinned by it). Images resolve as FLEUR's do:
      `flickr8k/`, `flickr30k/`, `coco2014/` joined to `image` under `--images`.
    - The Polos CSV `en_test_composite_da.csv` (or `..._da2.csv`; columns `mt`, `refs` as
      a Python list, `score`, `imgid`), as CaptionEvalKit reads it from a data folder.
    - A Hugging Face dataset (`yuwd/Composite` in the local cache, or its folder): split
      `test`, columns `img`/`imgid`, `cand`/`mt`, `refs`, `human_score`/`score`.
    - caprecon's own normalised layout: a folder of record files, one per subset, named
      after it (`flickr8k*`, `*8k*`, `flickr30k*`, `*30k*`, `coco*`), or one file with a
      `subset` column; rows with `image`, `caption`, `refs` and `rating` (1-5 or a list).

    Where a copy carries no subset, it is told from the image's file name
    (`composite_subset_of_image`), which `subsets` then filters on.
    """
    if hub.looks_like_repo_id(path):
        return _composite_hub(path, subsets)
    path = Path(path)
    if path.is_dir():
        if (path / "composite.json").is_file():
            return _composite_json(path / "composite.json", subsets)
        for name in ("en_test_composite_da2.csv", "en_test_composite_da.csv"):
            if (path / name).is_file():
                return _composite_polos_csv(path / name, subsets)
        if (path / "dataset_dict.json").is_file() or any(path.rglob("*.parquet")) or any(path.rglob("*.arrow")):
            return _composite_hub(path, subsets)
        return _composite_own(path, subsets)
    if path.suffix.lower() == ".json" and path.is_file():
        data = load_json(path)
        if isinstance(data, dict) and set(data) & set(COMPOSITE_SUBSETS):
            return _composite_json(path, subsets, data)
    if path.suffix.lower() == ".csv" and path.is_file() and "mt" in _csv_columns(path):
        return _composite_polos_csv(path, subsets)
    return _composite_own(path, subsets)


def _csv_columns(path: Path) -> set[str]:
    for _, record in read_records(path, JudgmentFormatError):
        return {str(k).strip().lower() for k in record}
    return set()


def _composite_item(items: list[Judgment], subset: str | None, image: str, caption: str,
                    ratings: tuple[float, ...], refs: list[str]) -> None:
    stem = Path(image).stem
    items.append(Judgment(
        id=str(len(items) + 1), image=image, caption=caption, ratings=ratings,
        refs=_without_candidate(refs, caption), image_id=f"{subset}/{stem}" if subset else stem, row=len(items) + 1,
    ))  # fmt: skip


def _composite_json(path: Path, subsets: Sequence[str], data: dict | None = None) -> Judgments:
    data = load_json(path) if data is None else data
    items: list[Judgment] = []
    for subset in COMPOSITE_SUBSETS:
        if subset not in subsets or subset not in data:
            continue
        rows = data[subset]
        if not isinstance(rows, list):
            raise JudgmentFormatError(f"{path} [{subset!r}]: expected a list of rated captions")
        for k, raw in enumerate(rows):
            where = f"{path} {subset}[{k}]"
            record = lowered(raw) if isinstance(raw, dict) else {}
            image = first_field(record, ("image", "image_path", "file_name"))
            caption = first_field(record, ("caption", "candidate", "cand", "mt"))
            rating = first_field(record, ("human", "rating", "correctness", "score"))
            if image is None or caption is None or rating is None:
                raise JudgmentFormatError(f"{where}: a Composite entry needs `image`, `caption` and `human`")
            refs = first_field(record, ("refs", "references", "ground_truth"))
            folder = COMPOSITE_IMAGE_FOLDERS[subset]
            _composite_item(items, subset, f"{folder}/{image}", caption_text(caption, where, "caption"),
                            (as_number(rating, where, "human"),),
                            caption_list(refs, where, "refs", written=False) if refs is not None else [])  # fmt: skip
    if not items:
        raise JudgmentFormatError(f"{path}: no Composite judgments for subsets {', '.join(subsets)}")
    return Judgments(SCORES, items, path)


def _composite_polos_csv(path: Path, subsets: Sequence[str]) -> Judgments:
    return _composite_rows(file_records(path), subsets, path)


def _composite_hub(source: str | Path, subsets: Sequence[str]) -> Judgments:
    folder, rows = hub.read_rows(source, "test")
    return _composite_rows(row_records(rows, str(folder)), subsets, folder)


def _composite_rows(records, subsets: Sequence[str], source: Path) -> Judgments:
    """Composite rows that name their image, caption, rating and references (the Polos CSV, the hub copy)."""
    items: list[Judgment] = []
    for where, record in records:
        image, caption, rating, refs = table_fields(record, where)
        subset = composite_subset_of_image(image)
        if subset is not None and subset not in subsets:
            continue
        _composite_item(items, subset, image, caption, (rating,), refs)
    if not items:
        raise JudgmentFormatError(f"{source}: no Composite judgments for subsets {', '.join(subsets)}")
    return Judgments(SCORES, items, source)


def _composite_own(path: Path, subsets: Sequence[str]) -> Judgments:
    files = sorted(p for p in path.iterdir() if p.suffix.lower() in RECORD_SUFFIXES) if path.is_dir() else [path]
    if not files:
        raise JudgmentFormatError(f"{path}: no Composite files (.csv, .tsv, .json, .jsonl) in the folder")
    items: list[Judgment] = []
    for file in files:
        from_name = composite_subset(file.stem)
        for where, record in file_records(file):
            subset = first_field(record, ("subset", "dataset")) or from_name
            subset = composite_subset(str(subset)) if subset else None
            if subset is None:
                raise JudgmentFormatError(f"{where}: cannot tell the Composite subset (name the file after it or add `subset`)")
            if subset not in subsets:
                continue
            image = first_field(record, ("image", "image_path", "file_name", "imgid"))
            caption = first_field(record, ("caption", "candidate"))
            rating = first_field(record, ("rating", "score", "correctness", "human"))
            if image is None or caption is None or rating is None:
                raise JudgmentFormatError(f"{where}: a Composite row needs an image, a caption and a rating")
            values = rating if isinstance(rating, list) else (
                json.loads(rating) if isinstance(rating, str) and rating.strip().startswith("[") else [rating]
            )
            ratings = tuple(as_number(v, where, "rating") for v in values)
            if any(not 1 <= r <= 5 for r in ratings):
                raise JudgmentFormatError(f"{where}: Composite ratings are 1-5, got {ratings}")
            refs = first_field(record, ("refs", "references"))
            _composite_item(items, subset, str(image), norm_text(caption), ratings,
                            caption_list(refs, where, "refs") if refs is not None else [])  # fmt: skip
    if not items:
        raise JudgmentFormatError(f"{path}: no Composite judgments for subsets {', '.join(subsets)}")
    return Judgments(SCORES, items, path if path.is_file() else path / files[0].name)
