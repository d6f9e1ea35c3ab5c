"""Readers for meta-evaluation benchmarks, in the layouts their authors publish.

Each reader returns `Judgments` (the shapes in `caprecon.judgments`), so every benchmark
runs through the same statistics. Where a layout's field names vary between copies, the
accepted alternatives are listed in the reader's docstring; anything else is a
`JudgmentFormatError` naming the file and the row.
"""

from __future__ import annotations

import ast
import json
import math
import random
import re
from collections import defaultdict
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

from caprecon.data.judgments import (FLICKR8K_EXPERT, PAIRS, SCORES, Judgment, JudgmentFormatError, Judgments, PairJudgment, load_judgments)
from caprecon.core.records import RECORD_SUFFIXES, read_jsonl, read_records
from caprecon.data.loaders import hub


def norm_text(text: Any) -> str:
    # CLIPScore's protocol whitespace-normalises captions and references before comparing them.
    return " ".join(str(text).split())


def _load_json(path: Path) -> Any:
    if not path.is_file():
        raise JudgmentFormatError(f"benchmark file not found: {path}")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise JudgmentFormatError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno})") from None


def _first(record: dict, names: Sequence[str]) -> Any:
    for name in names:
        if record.get(name) is not None:
            return record[name]
    return None


def as_number(value: Any, where: str, what: str) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        raise JudgmentFormatError(f"{where}: {what} {value!r} is not a number") from None


def caption_list(value: Any, where: str, what: str) -> list[str]:
    if isinstance(value, str):
        text = value.strip()
        value = _literal_list(text, where, what) if text.startswith("[") else [p for p in text.split("|") if p.strip()]
    if not isinstance(value, (list, tuple)):
        raise JudgmentFormatError(f"{where}: {what} must be a list of captions, got {value!r}")
    return [norm_text(v) for v in value]


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


def _without_candidate(refs: Sequence[str], caption: str) -> list[str]:
    """A rated caption that is also one of its image's references leaves the references."""
    return [r for r in refs if r != caption]


def _lowered(record: dict) -> dict:
    return {str(key).strip().lower(): v for key, v in record.items()}


def _records(rows: Sequence[dict], where: str) -> list[tuple[str, dict]]:
    return [(f"{where} row {k}", _lowered(row)) for k, row in enumerate(rows, 1)]


def file_records(path: Path) -> Iterator[tuple[str, dict]]:
    """`read_records` with the keys lower-cased, as every reader here matches them."""
    for where, raw in read_records(path, JudgmentFormatError):
        yield where, _lowered(raw)


# ------------------------------------------------------------------- Flickr8k (CLIPScore JSON)


def load_flickr8k(path: str | Path, format: str) -> Judgments:
    """Flickr8k-Expert or -CrowdFlower: the CLIPScore JSON, or caprecon's JSONL / the original files.

    The CLIPScore JSON (`flickr8k.json`, `crowdflower_flickr8k.json`) maps an image id to
    `{"image_path", "ground_truth": [refs], "human_judgement": [{"caption", "rating"}...]}`.
    Each Expert entry is one expert's rating; entries of one caption are gathered into one
    `Judgment` with all its ratings (each still counts as its own observation). A NaN
    rating is skipped. The pinned reference handling: an Expert candidate that is one of
    its image's own references is skipped (SPICE's protocol); a CrowdFlower candidate is
    kept and removed from that image's references. Other files go to `load_judgments`.

    A folder (or the repo id `yuwd/Flickr8k-HumanEval` in the local Hugging Face cache) is
    read as CaptionEvalKit reads that dataset: config `expert` or `crowdflower`, split
    `test`, columns `img`/`imgid`/`file_name`, `cand`/`mt`, `refs`, `human_score`/`score`.
    Assumption: one row per rating, as in the JSON; rows of one (image, caption) are
    gathered the same way.
    """
    if hub.looks_like_repo_id(path) or Path(path).is_dir():
        return _own_caption_protocol(_flickr8k_hub(path, format), format)
    path = Path(path)
    if path.suffix.lower() != ".json" or not isinstance(data := _load_json(path), dict):
        return _own_caption_protocol(load_judgments(path, format), format)
    gathered: dict[tuple[str, str], Judgment] = {}
    for key, entry in data.items():
        where = f"{path} [{key!r}]"
        if not isinstance(entry, dict) or "human_judgement" not in entry:
            raise JudgmentFormatError(f"{where}: expected an object with `ground_truth` and `human_judgement`")
        refs = [norm_text(r) for r in entry.get("ground_truth") or []]
        image = str(entry.get("image_path") or key)
        for k, judged in enumerate(entry["human_judgement"]):
            spot = f"{where} human_judgement[{k}]"
            caption = norm_text(_first(judged, ("caption",)) or "")
            if not caption:
                raise JudgmentFormatError(f"{spot}: no caption")
            rating = as_number(judged.get("rating"), spot, "rating")
            if math.isnan(rating):
                continue
            _gather(gathered, str(key), str(judged.get("image_path") or image), caption, refs, rating)
    if not gathered:
        raise JudgmentFormatError(f"{path}: no judgments in the file")
    return _own_caption_protocol(Judgments(format, list(gathered.values()), path), format)


def _flickr8k_hub(source: str | Path, format: str) -> Judgments:
    config = "expert" if format == FLICKR8K_EXPERT else "crowdflower"
    folder, rows = hub.read_rows(source, "test", config=config)
    gathered: dict[tuple[str, str], Judgment] = {}
    for where, record in _records(rows, str(folder)):
        image, caption, rating, refs = _hub_fields(record, where)
        if math.isnan(rating):
            continue
        _gather(gathered, Path(image).stem, image, caption, refs, rating)
    if not gathered:
        raise JudgmentFormatError(f"{folder}: no Flickr8k judgments in split 'test' of config {config!r}")
    return Judgments(format, list(gathered.values()), folder)


def _gather(gathered: dict[tuple[str, str], Judgment], image_id: str, image: str, caption: str, refs: list[str],
            rating: float) -> None:
    """One more rating of (image, caption): a caption rated by several people is one judgment."""
    key = (image_id, caption)
    if key not in gathered:
        gathered[key] = Judgment(id=f"{image_id}:{len(gathered)}", image=image, caption=caption, ratings=(), refs=refs,
                                 image_id=image_id, row=len(gathered) + 1)  # fmt: skip
    gathered[key].ratings += (rating,)


_HUB_IMAGE = ("file_name", "imgid", "img", "image", "image_path", "img_path")
_HUB_CAPTION = ("cand", "mt", "caption", "candidate")
_HUB_SCORE = ("human_score", "score", "rating", "human")


def _hub_fields(record: dict, where: str) -> tuple[str, str, float, list[str]]:
    """(image name, candidate, human score, references) of one row of a Hugging Face benchmark table."""
    caption = _first(record, _HUB_CAPTION)
    score = _first(record, _HUB_SCORE)
    if caption is None or score is None:
        raise JudgmentFormatError(f"{where}: needs a candidate ({'/'.join(_HUB_CAPTION)}) and a human score "
                                  f"({'/'.join(_HUB_SCORE)}); fields: {sorted(record)}")  # fmt: skip
    image = _first(record, _HUB_IMAGE)
    refs = _first(record, ("refs", "references"))
    # A row without an image path keeps its place: text-only metrics still score it, and an
    # image metric gives it a row error instead of reading some other file.
    return (str(image) if image is not None else "", norm_text(caption), as_number(score, where, "score"),
            caption_list(refs, where, "refs") if refs is not None else [])  # fmt: skip


def _own_caption_protocol(judgments: Judgments, format: str) -> Judgments:
    items = []
    for item in judgments.items:
        refs = [norm_text(r) for r in item.refs]
        own = norm_text(item.caption) in refs
        if own and format == FLICKR8K_EXPERT:
            continue
        if own:
            refs = [r for r in refs if r != norm_text(item.caption)]
        item.refs = refs
        items.append(item)
    judgments.items = items
    return judgments


# ----------------------------------------------------------------------------- Composite

COMPOSITE_SUBSETS = ("flickr8k", "flickr30k", "coco")
# The image folders FLEUR's fleur_com.py joins a Composite JSON's `image` to, per subset.
COMPOSITE_IMAGE_FOLDERS = {"flickr8k": "flickr8k", "flickr30k": "flickr30k", "coco": "coco2014"}


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
        data = _load_json(path)
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
    data = _load_json(path) if data is None else data
    items: list[Judgment] = []
    for subset in COMPOSITE_SUBSETS:
        if subset not in subsets or subset not in data:
            continue
        rows = data[subset]
        if not isinstance(rows, list):
            raise JudgmentFormatError(f"{path} [{subset!r}]: expected a list of rated captions")
        for k, raw in enumerate(rows):
            where = f"{path} {subset}[{k}]"
            record = _lowered(raw) if isinstance(raw, dict) else {}
            image = _first(record, ("image", "image_path", "file_name"))
            caption = _first(record, ("caption", "candidate", "cand", "mt"))
            rating = _first(record, ("human", "rating", "correctness", "score"))
            if image is None or caption is None or rating is None:
                raise JudgmentFormatError(f"{where}: a Composite entry needs `image`, `caption` and `human`")
            refs = _first(record, ("refs", "references", "ground_truth"))
            folder = COMPOSITE_IMAGE_FOLDERS[subset]
            _composite_item(items, subset, f"{folder}/{image}", norm_text(caption), (as_number(rating, where, "human"),),
                            caption_list(refs, where, "refs") if refs is not None else [])  # fmt: skip
    if not items:
        raise JudgmentFormatError(f"{path}: no Composite judgments for subsets {', '.join(subsets)}")
    return Judgments(SCORES, items, path)


def _composite_polos_csv(path: Path, subsets: Sequence[str]) -> Judgments:
    return _composite_rows(file_records(path), subsets, path)


def _composite_hub(source: str | Path, subsets: Sequence[str]) -> Judgments:
    folder, rows = hub.read_rows(source, "test")
    return _composite_rows(_records(rows, str(folder)), subsets, folder)


def _composite_rows(records, subsets: Sequence[str], source: Path) -> Judgments:
    """Composite rows that name their image, caption, rating and references (the Polos CSV, the hub copy)."""
    items: list[Judgment] = []
    for where, record in records:
        image, caption, rating, refs = _hub_fields(record, where)
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
            subset = _first(record, ("subset", "dataset")) or from_name
            subset = composite_subset(str(subset)) if subset else None
            if subset is None:
                raise JudgmentFormatError(f"{where}: cannot tell the Composite subset (name the file after it or add `subset`)")
            if subset not in subsets:
                continue
            image = _first(record, ("image", "image_path", "file_name", "imgid"))
            caption = _first(record, ("caption", "candidate"))
            rating = _first(record, ("rating", "score", "correctness", "human"))
            if image is None or caption is None or rating is None:
                raise JudgmentFormatError(f"{where}: a Composite row needs an image, a caption and a rating")
            values = rating if isinstance(rating, list) else (
                json.loads(rating) if isinstance(rating, str) and rating.strip().startswith("[") else [rating]
            )
            ratings = tuple(as_number(v, where, "rating") for v in values)
            if any(not 1 <= r <= 5 for r in ratings):
                raise JudgmentFormatError(f"{where}: Composite ratings are 1-5, got {ratings}")
            refs = _first(record, ("refs", "references"))
            _composite_item(items, subset, str(image), norm_text(caption), ratings,
                            caption_list(refs, where, "refs") if refs is not None else [])  # fmt: skip
    if not items:
        raise JudgmentFormatError(f"{path}: no Composite judgments for subsets {', '.join(subsets)}")
    return Judgments(SCORES, items, path if path.is_file() else path / files[0].name)


# ----------------------------------------------------------------------------- Pascal-50S

PASCAL_CATEGORIES = ("HC", "HI", "HM", "MM")


def load_pascal50s(path: str | Path) -> Judgments:
    """Pascal-50S as `{"HC": [...], "HI": [...], "HM": [...], "MM": [...]}`, each entry
    `{"image", "captions": [a, b], "label", "references": [...]}`.

    `label` is the index (0 or 1) of the caption people preferred; a fraction of judges
    preferring the first caption is accepted as `preference`. The references are kept as
    given: 5 in the JSON copies papers distribute, 48 in the original release, where
    `pascal_reference_draws` applies the 5-of-48 protocol.
    """
    path = Path(path)
    data = _load_json(path)
    if not isinstance(data, dict) or not set(data) & set(PASCAL_CATEGORIES):
        raise JudgmentFormatError(f"{path}: expected an object with lists under {', '.join(PASCAL_CATEGORIES)}")
    items: list[PairJudgment] = []
    for category in PASCAL_CATEGORIES:
        for k, entry in enumerate(data.get(category, [])):
            where = f"{path} {category}[{k}]"
            captions = entry.get("captions")
            if not isinstance(captions, list) or len(captions) != 2:
                raise JudgmentFormatError(f"{where}: `captions` must hold the two candidates")
            image = _first(entry, ("image", "image_path", "img"))
            if image is None:
                raise JudgmentFormatError(f"{where}: no `image`")
            items.append(
                PairJudgment(
                    id=f"{category}-{k}",
                    image=str(image),
                    caption_a=norm_text(captions[0]),
                    caption_b=norm_text(captions[1]),
                    preference=_pascal_preference(entry, where),
                    refs=caption_list(_first(entry, ("references", "refs")) or [], where, "references"),
                    image_id=Path(str(image)).stem,
                    category=category,
                    row=len(items) + 1,
                )
            )
    if not items:
        raise JudgmentFormatError(f"{path}: no Pascal-50S pairs")
    return Judgments(PAIRS, items, path)


def _pascal_preference(entry: dict, where: str) -> float:
    if entry.get("preference") is not None:
        value = as_number(entry["preference"], where, "preference")
    else:
        label = entry.get("label")
        if label not in (0, 1, "0", "1"):
            raise JudgmentFormatError(f"{where}: `label` must be 0 or 1 (the preferred caption), got {label!r}")
        value = 1.0 - float(label)
    if not 0.0 <= value <= 1.0:
        raise JudgmentFormatError(f"{where}: preference {value} is outside [0, 1]")
    return value


def pascal_reference_draws(judgments: Judgments, *, n_refs: int = 5, n_draws: int = 5, seed: int = 0) -> list[Judgments]:
    """The 5-of-48 protocol: `n_draws` copies of the pairs, each pair with `n_refs`
    references sampled without replacement from its own.

    Draw d of pair `id` uses `random.Random(f"{seed}:{d}:{id}").sample(refs, n_refs)`, so a
    pair's references depend only on the seed, the draw and the pair, never on file order.
    Pairs with `n_refs` references or fewer keep them all. Accuracy is averaged over draws.
    """
    draws = []
    for d in range(n_draws):
        items = []
        for item in judgments.items:
            refs = item.refs if len(item.refs) <= n_refs else random.Random(f"{seed}:{d}:{item.id}").sample(item.refs, n_refs)
            items.append(PairJudgment(**{**item.__dict__, "refs": list(refs)}))
        draws.append(Judgments(judgments.format, items, judgments.path))
    return draws


# ----------------------------------------------------------------------------- FOIL

FOIL_FILE = "foilv1.0_test_2017.json"
COCO_CAPTIONS_FILE = "captions_val2014.json"


FOIL_PAIRS = ("all", "per-image")


def load_foil(path: str | Path, *, n_refs: int | None = 4, pairs: str = "all",
              coco_captions: str | Path | None = None) -> Judgments:
    """FOIL-COCO as its authors ship it (`foilv1.0_test_2017.json`): COCO-style `images`
    and `annotations`, each annotation `{"id", "image_id", "caption", "foil": bool, ...}`.

    `path` is that file or a folder holding it. Pairing follows the Polos validation code
    (`validate/compute_foil.py`): an original caption and the foils made from it share the
    annotation `id`, and each foil is paired with its original (people prefer the
    original). References, as there, are the image's COCO captions from
    `captions_val2014.json` (beside the FOIL file, or `coco_captions`) less the original
    caption: the first `n_refs` of them, or all of them with `n_refs=None`.

    Papers use two protocols. `pairs="all"` keeps every foil (Polos: 1 reference, or all
    but the original). `pairs="per-image"` keeps one pair per image, as CLIPScore (Table 5,
    1 or 4 references) samples one for each test image; its draw is not published, so the
    image's first foil in file order is taken.

    Without the COCO captions file the references are the image's other correct captions
    in the FOIL file itself; without shared ids (a copy that dropped them) each foil is
    paired with the correct caption it differs from in the fewest words. Pairs left with
    no reference are skipped.
    """
    if pairs not in FOIL_PAIRS:
        raise ValueError(f"pairs must be one of {', '.join(FOIL_PAIRS)}, not {pairs!r}")
    path = Path(path)
    file = path / FOIL_FILE if path.is_dir() else path
    data = _load_json(file)
    if not isinstance(data, dict) or "annotations" not in data:
        raise JudgmentFormatError(f"{file}: not a FOIL file (expected COCO-style `annotations`)")
    coco = Path(coco_captions) if coco_captions else file.parent / COCO_CAPTIONS_FILE
    coco_refs = _coco_captions(coco) if coco.is_file() else None
    files = {img.get("id"): img.get("file_name", "") for img in data.get("images", [])}
    groups: dict[Any, dict[str, list[str]]] = defaultdict(lambda: {"orig": [], "foil": []})
    correct: dict[Any, list[str]] = defaultdict(list)
    foils: list[tuple[Any, Any, str]] = []  # (image id, annotation id, foil caption)
    for k, ann in enumerate(data["annotations"]):
        if "image_id" not in ann or "caption" not in ann:
            raise JudgmentFormatError(f"{file} annotations[{k}]: needs `image_id` and `caption`")
        if ann.get("foil") is None:
            raise JudgmentFormatError(f"{file} annotations[{k}]: no `foil` flag")
        is_foil = ann["foil"] is True or str(ann["foil"]).lower() in ("true", "1")
        caption = norm_text(ann["caption"])
        if is_foil:
            foils.append((ann["image_id"], ann.get("id"), caption))
        elif caption not in correct[ann["image_id"]]:
            correct[ann["image_id"]].append(caption)
        if ann.get("id") is not None:
            groups[(ann["image_id"], ann["id"])]["foil" if is_foil else "orig"].append(caption)
    by_id = bool(groups) and all(len(g["orig"]) == 1 for g in groups.values() if g["foil"])
    items: list[PairJudgment] = []
    paired_images: set[Any] = set()
    for image_id, ann_id, foil in foils:
        if pairs == "per-image" and image_id in paired_images:
            continue
        good = correct.get(image_id, [])
        if by_id:
            source = groups[(image_id, ann_id)]["orig"][0]
        elif good:
            source = min(good, key=lambda c: _word_distance(c, foil))
        else:
            continue
        pool = coco_refs.get(image_id, []) if coco_refs is not None else good
        refs = [c for c in pool if c != source][:n_refs]
        if not refs:
            continue
        paired_images.add(image_id)
        items.append(PairJudgment(
            id=f"{image_id}-{len(items)}", image=str(files.get(image_id) or image_id), caption_a=source, caption_b=foil,
            preference=1.0, refs=refs, image_id=str(image_id), category=f"{n_refs or 'all'}-ref", row=len(items) + 1,
        ))  # fmt: skip
    if not items:
        raise JudgmentFormatError(f"{file}: no foil caption has an original caption and a reference of its image")
    return Judgments(PAIRS, items, file)


def _coco_captions(path: Path) -> dict[Any, list[str]]:
    data = _load_json(path)
    refs: dict[Any, list[str]] = defaultdict(list)
    for ann in data.get("annotations", []) if isinstance(data, dict) else []:
        if "image_id" in ann and "caption" in ann:
            refs[ann["image_id"]].append(norm_text(ann["caption"]))
    return refs


def _word_distance(a: str, b: str) -> int:
    wa, wb = a.lower().split(), b.lower().split()
    return sum(x != y for x, y in zip(wa, wb)) + abs(len(wa) - len(wb))


# ----------------------------------------------------------------------------- THumB

THUMB_FILE = "mscoco_THumB-1.0.jsonl"
THUMB_REFERENCES = "mscoco_references.json"


def load_thumb(path: str | Path, target: str = "total") -> Judgments:
    """THumB 1.0 (Kasai et al. 2022) as `jungokasai/THumB` ships it: `mscoco/mscoco_THumB-1.0.jsonl`,
    one row per (image, system caption) with `seg_id`, `image`, `hyp`, `SYS`, `P`
    (precision), `R` (recall), the penalties and `human_score` (the total), and
    `mscoco/mscoco_references.json` beside it (JSON lines `{"seg_id", "refs"}`).

    `path` is the JSONL file or the folder holding both. `target` picks which human score
    is correlated (total, precision or recall). References come from the references file
    by `seg_id` (or a row's own `refs`, caprecon's layout). Also accepted, for copies that
    renamed fields: `caption`/`candidate`, `image_id`, `model`/`system`, `Total`/`total`,
    `precision`, `recall`. The system is `Judgment.system` (and `Judgment.id`'s prefix,
    `<system>:<row>`), for system-level correlation.
    """
    names = {"total": ("human_score", "total"), "precision": ("p", "precision"), "recall": ("r", "recall")}
    if target not in names:
        raise JudgmentFormatError(f"THumB target must be one of {', '.join(names)}, not {target!r}")
    path = Path(path)
    file = path / THUMB_FILE if path.is_dir() else path
    if not file.is_file():
        raise JudgmentFormatError(f"benchmark file not found: {file}")
    references = _thumb_references(file.parent / THUMB_REFERENCES)
    items: list[Judgment] = []
    for row, (where, record) in enumerate(file_records(file), 1):
        caption = _first(record, ("hyp", "caption", "candidate"))
        image = _first(record, ("image", "image_id"))
        system = _first(record, ("sys", "model", "system"))
        score = _first(record, names[target])
        if caption is None or image is None or system is None or score is None:
            raise JudgmentFormatError(
                f"{where}: a THumB row needs hyp, image, SYS and {'/'.join(names[target])} (fields: {sorted(record)})"
            )
        refs = _first(record, ("refs", "references"))
        refs = caption_list(refs, where, "refs") if refs is not None else references.get(str(record.get("seg_id")), [])
        items.append(Judgment(
            id=f"{system}:{row}", image=str(image), caption=norm_text(caption),
            ratings=(as_number(score, where, target),), refs=refs, image_id=Path(str(image)).stem, row=row,
            system=str(system),
        ))  # fmt: skip
    if not items:
        raise JudgmentFormatError(f"{file}: no THumB rows")
    return Judgments(SCORES, items, file)


def _thumb_references(path: Path) -> dict[str, list[str]]:
    # JSON lines despite the .json suffix, as the THumB repository ships it
    if not path.is_file():
        return {}
    return {str(record.get("seg_id")): caption_list(record.get("refs") or [], where, "refs")
            for where, record in read_jsonl(path, JudgmentFormatError)}  # fmt: skip


# ------------------------------------------------- Polaris, Nebula, LongCap-Arena (Hugging Face)


def load_hf_judgments(path: str | Path, split: str = "test") -> Judgments:
    """A Hugging Face benchmark table on this machine (`caprecon.data.loaders.hub`): a
    `save_to_disk` folder, a dataset snapshot folder, the `datasets` cache, or a repo id in
    the local Hub cache; never a download.

    Fields: candidate `cand`/`mt` (also `caption`, `candidate`), references `refs`, human
    score `human_score`/`score`, image `file_name`/`imgid` or a stored image (`img`,
    `image`), referred to by the name it was stored under.
    """
    folder, rows = hub.read_rows(path, split)
    return scored_rows(_records(rows, str(folder)), folder, f"no rows in split {split!r}")


def scored_rows(records: Iterable[tuple[str, dict]], source: Path, empty: str) -> Judgments:
    """One rated judgment per row of a benchmark table (`_hub_fields`'s columns)."""
    items: list[Judgment] = []
    for row, (where, record) in enumerate(records, 1):
        image, caption, score, refs = _hub_fields(record, where)
        items.append(Judgment(id=str(row), image=image, caption=caption, ratings=(score,), refs=refs,
                              image_id=Path(image).stem or str(row), row=row))  # fmt: skip
    if not items:
        raise JudgmentFormatError(f"{source}: {empty}")
    return Judgments(SCORES, items, source)


POLARIS_CSV = "polaris_test.csv"


def load_polaris(path: str | Path) -> Judgments:
    """Polaris (Wada et al. 2024), test split: the Hugging Face dataset `yuwd/Polaris`
    (columns `refs`, `cand`, `img`, `human_score`; a local folder or the Hub cache), or the
    Polos release's `polaris_test.csv` (columns `mt`, `refs` as a Python list, `score`,
    `imgid`; the file or its folder), the two ways CaptionEvalKit reads it.
    """
    if not hub.looks_like_repo_id(path):
        path = Path(path)
        csv = path / POLARIS_CSV if path.is_dir() else path
        if csv.suffix.lower() == ".csv" and csv.is_file():
            return _scores_from_csv(csv)
    return load_hf_judgments(path, "test")


def _scores_from_csv(path: Path) -> Judgments:
    return scored_rows(file_records(path), path, "no rows")


SPICA_REPO = "hiranohachiman/Spica"
SPICA_FILES = ("spica_train.csv", "spica_val.csv", "spica_test.csv")


def load_nebula(path: str | Path, *, corrected: bool = True, spica: str | Path | None = None) -> Judgments:
    """Nebula (Matsuda et al. 2024, `Ka2ukiMatsuda/Nebula`), test split: columns
    `file_name`, `image`, `refs`, `mt`, `human_score`.

    With `corrected` the test labels are replaced as CaptionEvalKit does after the
    correction noted in arXiv:2512.21582: a row whose (image file stem, whitespace-normalised
    `mt`) appears in the Spica release (`hiranohachiman/Spica`: `spica_train.csv`,
    `spica_val.csv`, `spica_test.csv`, columns `imgid`, `mt`, `score`) takes the mean
    Spica score of that key; other rows keep theirs. The Spica files are looked for in
    `spica`, in the Nebula folder, in a `Spica` folder beside it, then in the local Hub
    cache; without them the corrected benchmark refuses to run (use `nebula-raw`).
    """
    judgments = load_hf_judgments(path, "test")
    return spica_corrected(judgments, path, spica) if corrected else judgments


def spica_corrected(judgments: Judgments, nebula: str | Path, spica: str | Path | None = None) -> Judgments:
    """Nebula's test labels replaced by the mean Spica scores (`load_nebula`), whatever copy
    of Nebula `judgments` was read from; the files are looked for as `load_nebula` says."""
    lookup = _spica_scores(_spica_files(nebula, spica))
    for item in judgments.items:
        score = lookup.get((Path(item.image).stem, item.caption))
        if score is not None:
            item.ratings = (score,)
    return judgments


def _spica_files(nebula: str | Path, spica: str | Path | None) -> list[Path]:
    places: list[Path] = []
    if spica is not None:
        places.append(hub.resolve(spica))
    if not hub.looks_like_repo_id(nebula):
        folder = Path(nebula) if Path(nebula).is_dir() else Path(nebula).parent
        places += [folder, folder.parent / "Spica", folder.parent / "spica"]
    for place in places:
        found = [place / name for name in SPICA_FILES if (place / name).is_file()]
        if found:
            return found
    try:
        cached = hub.resolve(SPICA_REPO)
    except JudgmentFormatError:
        cached = None
    found = [cached / name for name in SPICA_FILES if cached is not None and (cached / name).is_file()]
    if not found:
        raise JudgmentFormatError(
            f"the Spica correction of Nebula's test labels ({', '.join(SPICA_FILES)} from {SPICA_REPO}) was not found in "
            f"{', '.join(str(p) for p in places) or 'the Nebula folder'} nor in the Hugging Face cache; "
            "put them beside the Nebula data, or run --benchmark nebula-raw for the labels as released"
        )
    return found


def _spica_scores(files: Sequence[Path]) -> dict[tuple[str, str], float]:
    totals: dict[tuple[str, str], list[float]] = defaultdict(list)
    for file in files:
        for where, record in file_records(file):
            if record.get("imgid") is None or record.get("mt") is None or record.get("score") is None:
                raise JudgmentFormatError(f"{where}: a Spica row needs imgid, mt and score")
            totals[(Path(str(record["imgid"])).stem, norm_text(record["mt"]))].append(as_number(record["score"], where, "score"))
    return {key: sum(v) / len(v) for key, v in totals.items()}


LONGCAP_PERSPECTIVES = {"desc": "Descriptiveness", "rel": "Relevance", "flu": "Fluency"}
LONGCAP_SPLITS = {"testa": "dci_val", "testb": "dci_test"}


def load_longcap(path: str | Path, *, split: str, perspective: str) -> Judgments:
    """LongCap-Arena (Matsuda et al. 2025, `Ka2ukiMatsuda/LongCap-Arena`): one benchmark per
    test set and perspective, as CaptionEvalKit names them: TestA is split `dci_val`,
    TestB `dci_test`, the perspective `desc`, `rel` or `flu` (Hub split `dci_test.desc`,
    ...; columns `file_name`, `image`, `refs`, `cand`, `score`).

    Also read: the VELA release's CSVs (`desc_dci_test.csv`, ...; columns `mt`/`cand`,
    `refs`, `score`, `image`/`imgid`) in `path` or `path/test`.
    """
    if not hub.looks_like_repo_id(path):
        folder = Path(path)
        for csv in (folder / f"{perspective}_{split}.csv", folder / "test" / f"{perspective}_{split}.csv"):
            if csv.is_file():
                return _scores_from_csv(csv)
    return load_hf_judgments(path, f"{split}.{perspective}")
