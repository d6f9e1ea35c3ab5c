"""Readers for meta-evaluation benchmarks, in the layouts their authors publish.

Each reader returns `Judgments` (the shapes in `caprecon.judgments`), so every benchmark
runs through the same statistics. Where a layout's field names vary between copies, the
accepted alternatives are listed in the reader's docstring; anything else is a
`JudgmentFormatError` naming the file and the row.
"""

from __future__ import annotations

import json
import math
import random
from collections import defaultdict
from pathlib import Path
from typing import Any, Sequence

from caprecon.data.judgments import (FLICKR8K_EXPERT, PAIRS, SCORES, Judgment, JudgmentFormatError, Judgments, PairJudgment, load_judgments)
from caprecon.core.records import RECORD_SUFFIXES, read_records


def _norm(text: Any) -> str:
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


def _float(value: Any, where: str, what: str) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        raise JudgmentFormatError(f"{where}: {what} {value!r} is not a number") from None


def _str_list(value: Any, where: str, what: str) -> list[str]:
    if isinstance(value, str):
        text = value.strip()
        value = json.loads(text) if text.startswith("[") else [p for p in text.split("|") if p.strip()]
    if not isinstance(value, (list, tuple)):
        raise JudgmentFormatError(f"{where}: {what} must be a list of captions, got {value!r}")
    return [_norm(v) for v in value]


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
    """
    path = Path(path)
    if path.suffix.lower() != ".json" or not isinstance(data := _load_json(path), dict):
        return _own_caption_protocol(load_judgments(path, format), format)
    gathered: dict[tuple[str, str], Judgment] = {}
    for key, entry in data.items():
        where = f"{path} [{key!r}]"
        if not isinstance(entry, dict) or "human_judgement" not in entry:
            raise JudgmentFormatError(f"{where}: expected an object with `ground_truth` and `human_judgement`")
        refs = [_norm(r) for r in entry.get("ground_truth") or []]
        image = str(entry.get("image_path") or key)
        for k, judged in enumerate(entry["human_judgement"]):
            spot = f"{where} human_judgement[{k}]"
            caption = _norm(_first(judged, ("caption",)) or "")
            if not caption:
                raise JudgmentFormatError(f"{spot}: no caption")
            rating = _float(judged.get("rating"), spot, "rating")
            if math.isnan(rating):
                continue
            ident = (str(key), caption)
            if ident not in gathered:
                gathered[ident] = Judgment(
                    id=f"{key}:{len(gathered)}",
                    image=str(judged.get("image_path") or image),
                    caption=caption,
                    ratings=(),
                    refs=refs,
                    image_id=str(key),
                    row=len(gathered) + 1,
                )
            gathered[ident].ratings += (rating,)
    if not gathered:
        raise JudgmentFormatError(f"{path}: no judgments in the file")
    return _own_caption_protocol(Judgments(format, list(gathered.values()), path), format)


def _own_caption_protocol(judgments: Judgments, format: str) -> Judgments:
    items = []
    for item in judgments.items:
        refs = [_norm(r) for r in item.refs]
        own = _norm(item.caption) in refs
        if own and format == FLICKR8K_EXPERT:
            continue
        if own:
            refs = [r for r in refs if r != _norm(item.caption)]
        item.refs = refs
        items.append(item)
    judgments.items = items
    return judgments


# ----------------------------------------------------------------------------- Composite

COMPOSITE_SUBSETS = ("flickr8k", "flickr30k", "coco")


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


def load_composite(path: str | Path, subsets: Sequence[str] = COMPOSITE_SUBSETS) -> Judgments:
    """Composite (Aditya et al. 2015): 1-5 correctness ratings of captions of Flickr8k,
    Flickr30k and COCO images.

    Read from a folder of record files (CSV/TSV/JSON/JSONL), one per subset, named after it
    (`flickr8k*`, `*8k*`, `flickr30k*`, `*30k*`, `coco*`), or from one file with a
    `subset` (or `dataset`) column. Each row: the image (`image`, `image_path`,
    `file_name` or `imgid`), the candidate (`caption`, `candidate`), the references
    (`refs`/`references`: a JSON list or `|`-separated) and the rating (`rating`,
    `score`, `correctness`, `human`: one number, or a list when several people rated).
    This is a documented normalised layout, not a byte copy of the release, whose column
    names we could not check here.
    """
    path = Path(path)
    files = sorted(p for p in path.iterdir() if p.suffix.lower() in RECORD_SUFFIXES) if path.is_dir() else [path]
    if not files:
        raise JudgmentFormatError(f"{path}: no Composite files (.csv, .tsv, .json, .jsonl) in the folder")
    items: list[Judgment] = []
    for file in files:
        from_name = composite_subset(file.stem)
        for where, raw in read_records(file, JudgmentFormatError):
            record = {str(k).strip().lower(): v for k, v in raw.items()}
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
            ratings = tuple(_float(v, where, "rating") for v in values)
            if any(not 1 <= r <= 5 for r in ratings):
                raise JudgmentFormatError(f"{where}: Composite ratings are 1-5, got {ratings}")
            refs = _first(record, ("refs", "references"))
            items.append(
                Judgment(
                    id=str(len(items) + 1),
                    image=str(image),
                    caption=_norm(caption),
                    ratings=ratings,
                    refs=_str_list(refs, where, "refs") if refs is not None else [],
                    image_id=f"{subset}/{Path(str(image)).stem}",
                    row=len(items) + 1,
                )
            )
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
                    caption_a=_norm(captions[0]),
                    caption_b=_norm(captions[1]),
                    preference=_pascal_preference(entry, where),
                    refs=_str_list(_first(entry, ("references", "refs")) or [], where, "references"),
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
        value = _float(entry["preference"], where, "preference")
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


def load_foil(path: str | Path, *, n_refs: int = 4) -> Judgments:
    """FOIL-COCO (`foilv1.0_test_2017.json`): COCO-style `images` and `annotations`, each
    annotation `{"image_id", "caption", "foil": bool, ...}`.

    Each foil caption is paired with a correct caption of its image (the one that differs
    from it in the fewest words, i.e. the caption it was made from); people prefer the
    correct one. The references are the image's other correct captions, the first `n_refs`
    of them (1 and 4 are the settings papers report). Images left with no reference are
    skipped.
    """
    path = Path(path)
    data = _load_json(path)
    if not isinstance(data, dict) or "annotations" not in data:
        raise JudgmentFormatError(f"{path}: not a FOIL file (expected COCO-style `annotations`)")
    files = {img.get("id"): img.get("file_name", "") for img in data.get("images", [])}
    correct: dict[Any, list[str]] = defaultdict(list)
    foils: dict[Any, list[str]] = defaultdict(list)
    for k, ann in enumerate(data["annotations"]):
        if "image_id" not in ann or "caption" not in ann:
            raise JudgmentFormatError(f"{path} annotations[{k}]: needs `image_id` and `caption`")
        foil = ann.get("foil")
        if foil is None:
            raise JudgmentFormatError(f"{path} annotations[{k}]: no `foil` flag")
        bucket = foils if (foil is True or str(foil).lower() in ("true", "1")) else correct
        caption = _norm(ann["caption"])
        if caption not in bucket[ann["image_id"]]:
            bucket[ann["image_id"]].append(caption)
    items: list[PairJudgment] = []
    for image_id, foiled in foils.items():
        good = correct.get(image_id, [])
        for foil in foiled:
            if len(good) < 2:
                continue
            source = min(good, key=lambda c: _word_distance(c, foil))
            refs = [c for c in good if c != source][:n_refs]
            image = files.get(image_id) or str(image_id)
            items.append(PairJudgment(
                id=f"{image_id}-{len(items)}", image=str(image), caption_a=source, caption_b=foil,
                preference=1.0, refs=refs, image_id=str(image_id), category=f"{n_refs}-ref", row=len(items) + 1,
            ))  # fmt: skip
    if not items:
        raise JudgmentFormatError(f"{path}: no foil caption has a correct caption and a reference of its image")
    return Judgments(PAIRS, items, path)


def _word_distance(a: str, b: str) -> int:
    wa, wb = a.lower().split(), b.lower().split()
    return sum(x != y for x, y in zip(wa, wb)) + abs(len(wa) - len(wb))


# ----------------------------------------------------------------------------- THumB


def load_thumb(path: str | Path, target: str = "total") -> Judgments:
    """THumB 1.0 (Kasai et al. 2022): JSONL, one row per (image, system caption), with
    precision, recall and total human scores.

    Accepted fields: caption `hyp`/`caption`/`candidate`; image `image`/`image_id`;
    system `model`/`system`; scores `P`/`precision`, `R`/`recall`, `Total`/`total`;
    references `refs`/`references` when the copy carries them. `target` picks which
    human score is correlated (total, precision or recall). The system is kept in
    `Judgment.id`'s prefix (`<system>:<row>`) for system-level correlation.
    """
    names = {"total": ("total",), "precision": ("p", "precision"), "recall": ("r", "recall")}
    if target not in names:
        raise JudgmentFormatError(f"THumB target must be one of {', '.join(names)}, not {target!r}")
    path = Path(path)
    if not path.is_file():
        raise JudgmentFormatError(f"benchmark file not found: {path}")
    items: list[Judgment] = []
    for row, (where, raw) in enumerate(read_records(path, JudgmentFormatError), 1):
        record = {str(k).strip().lower(): v for k, v in raw.items()}
        caption = _first(record, ("hyp", "caption", "candidate"))
        image = _first(record, ("image", "image_id"))
        system = _first(record, ("model", "system"))
        score = _first(record, names[target])
        if caption is None or image is None or system is None or score is None:
            raise JudgmentFormatError(
                f"{where}: a THumB row needs hyp, image, model and {'/'.join(names[target])} (fields: {sorted(record)})"
            )
        refs = _first(record, ("refs", "references"))
        items.append(Judgment(
            id=f"{system}:{row}", image=str(image), caption=_norm(caption),
            ratings=(_float(score, where, target),), refs=_str_list(refs, where, "refs") if refs is not None else [],
            image_id=Path(str(image)).stem, row=row,
        ))  # fmt: skip
    if not items:
        raise JudgmentFormatError(f"{path}: no THumB rows")
    return Judgments(SCORES, items, path)


def thumb_system(judgment: Judgment) -> str:
    return judgment.id.rsplit(":", 1)[0]


# ------------------------------------------------------------------- Polaris and Nebula


def load_hf_judgments(path: str | Path, split: str = "test") -> Judgments:
    """Polaris / Nebula: a Hugging Face `datasets` folder on this machine (`save_to_disk`,
    or a folder of its parquet/CSV/JSON files); never a hub download.

    Fields: candidate `mt` (also `cand`, `caption`, `candidate`), references `refs`,
    human score `score` (also `human_score`), image `img` (a file path, or a stored image,
    which is then referred to by its row) or `image`.
    """
    path = Path(path)
    if not path.is_dir():
        raise JudgmentFormatError(f"{path}: expected a local datasets folder (save_to_disk or data files)")
    try:
        import datasets
    except ImportError:
        raise JudgmentFormatError("reading Polaris/Nebula needs `datasets`: pip install 'caprecon[data]'") from None
    if any((path / n).exists() for n in ("dataset_info.json", "state.json", "dataset_dict.json")):
        ds = datasets.load_from_disk(str(path))
    else:
        ds = datasets.load_dataset(str(path))  # a local folder of data files: nothing is fetched
    if isinstance(ds, datasets.DatasetDict):
        if split not in ds:
            raise JudgmentFormatError(f"{path}: no split {split!r} (has {', '.join(ds)})")
        ds = ds[split]
    items: list[Judgment] = []
    for row, record in enumerate(ds, 1):
        where = f"{path} row {row}"
        caption = _first(record, ("mt", "cand", "caption", "candidate"))
        score = _first(record, ("score", "human_score"))
        if caption is None or score is None:
            raise JudgmentFormatError(f"{where}: needs `mt` and `score` (fields: {sorted(record)})")
        image = _first(record, ("img", "image", "image_path"))
        name = image if isinstance(image, str) else (getattr(image, "filename", "") or f"row-{row}")
        items.append(Judgment(
            id=str(row), image=str(name), caption=_norm(caption), ratings=(_float(score, where, "score"),),
            refs=_str_list(record.get("refs") or [], where, "refs"), image_id=Path(str(name)).stem or str(row), row=row,
        ))  # fmt: skip
    if not items:
        raise JudgmentFormatError(f"{path}: no rows in split {split!r}")
    return Judgments(SCORES, items, path)
