"""FOIL-COCO (`foilv1.0_test_2017.json`): COCO-style images and annotations, each caption
flagged as an original or a foil made from it (they share the annotation `id`):

    {"images": [{"id": 42, "file_name": "COCO_val2014_000000000042.jpg"}],
     "annotations": [{"id": 7, "image_id": 42, "caption": "a dog on a sofa", "foil": false},
                     {"id": 7, "image_id": 42, "caption": "a cat on a sofa", "foil": true}]}

References come from COCO's `captions_val2014.json` beside it, same `annotations` shape.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

from caprecon.data.judgments import PAIRS, JudgmentFormatError, Judgments, PairJudgment
from caprecon.data.loaders.common import load_json, norm_text


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
    data = load_json(file)
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
    data = load_json(path)
    refs: dict[Any, list[str]] = defaultdict(list)
    for ann in data.get("annotations", []) if isinstance(data, dict) else []:
        if "image_id" in ann and "caption" in ann:
            refs[ann["image_id"]].append(norm_text(ann["caption"]))
    return refs


def _word_distance(a: str, b: str) -> int:
    wa, wb = a.lower().split(), b.lower().split()
    return sum(x != y for x, y in zip(wa, wb)) + abs(len(wa) - len(wb))
