"""The Karpathy split files (`dataset_coco.json`, `dataset_flickr8k.json`,
`dataset_flickr30k.json`, `dataset_rsicd.json`, and the UCM-, Sydney-captions and RSITMD
copies in the same layout):

    {"images": [{"filename", "filepath" (COCO only), "split": train|val|test|restval,
                 "sentences": [{"raw", "tokens"}...], "imgid", "cocoid" (COCO only)}...]}

As samples to score: one per image of the chosen split, the first sentence as the caption
and the others as its references (how human captions are scored against their peers).
As references for someone's captions: each sample whose image file name (or image id,
matched against `cocoid`/`imgid`) is in the file gets that image's sentences.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from caprecon.data.samples import Sample, SampleFormatError

SPLITS = ("train", "val", "test", "restval")


def is_karpathy(data: Any) -> bool:
    images = data.get("images") if isinstance(data, dict) else None
    return bool(images) and isinstance(images[0], dict) and "sentences" in images[0]


def read_karpathy(path: str | Path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise SampleFormatError(f"Karpathy split file not found: {path}")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise SampleFormatError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
    if not is_karpathy(data):
        raise SampleFormatError(f"{path}: not a Karpathy split file (expected images[] with sentences)")
    return data


def karpathy_images(data: dict, path: Path, split: str | None) -> list[dict]:
    if split is not None and split not in SPLITS:
        raise SampleFormatError(f"unknown split {split!r} (Karpathy splits: {', '.join(SPLITS)})")
    images = [img for img in data["images"] if split is None or img.get("split") == split]
    if not images:
        raise SampleFormatError(f"{path}: no images in split {split!r}")
    for k, img in enumerate(images):
        if "filename" not in img:
            raise SampleFormatError(f"{path}: image {k} has no `filename`")
    return images


def _relative_path(img: dict) -> Path:
    return Path(img.get("filepath") or "") / img["filename"]


def _sentences(img: dict) -> list[str]:
    return [" ".join(str(s.get("raw", "")).split()) for s in img.get("sentences", []) if str(s.get("raw", "")).strip()]


def karpathy_samples(path: str | Path, root: Path, split: str | None = None) -> list[Sample]:
    """One sample per image: its first sentence scored against the rest."""
    path = Path(path)
    out = []
    for img in karpathy_images(read_karpathy(path), path, split):
        sentences = _sentences(img)
        image_id = str(img.get("cocoid", img.get("imgid", Path(img["filename"]).stem)))
        out.append(
            Sample(
                id=image_id,
                image=root / _relative_path(img),
                caption=sentences[0] if sentences else "",
                refs=sentences[1:],
                image_id=image_id,
                meta={"split": img.get("split", "")},
            )
        )
    return out


def attach_karpathy_refs(samples: list[Sample], path: str | Path, split: str | None = None) -> list[Sample]:
    """Give each sample its image's sentences from the Karpathy file as references."""
    path = Path(path)
    images = karpathy_images(read_karpathy(path), path, split)
    by_key: dict[str, list[str]] = {}
    for img in images:
        for key in (img["filename"], Path(img["filename"]).stem, img.get("cocoid"), img.get("imgid")):
            if key is not None:
                by_key.setdefault(str(key), _sentences(img))
    for s in samples:
        name = Path(str(s.image)).name if isinstance(s.image, (str, Path)) else ""
        for key in (name, Path(name).stem, s.image_id):
            if key and key in by_key:
                s.refs = list(by_key[key])
                break
    return samples
