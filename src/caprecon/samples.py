"""Samples in: one record per (image, caption) pair, from the formats people keep them in.

A `Sample` names its image (a path, or a PIL image already in memory) and carries the
caption, optional references and free metadata. Loading never opens images: that happens
row by row at scoring time, so one unreadable file becomes that row's error instead of
stopping the run. Problems with the *file as a whole* (missing, unknown format, no caption
column) raise `SampleFormatError` before any work starts.
"""

from __future__ import annotations

import hashlib
import io
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

from PIL import Image

from .records import RECORD_SUFFIXES, read_records

IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".webp", ".bmp", ".tif", ".tiff", ".gif"}


class SampleFormatError(ValueError):
    """The input file as a whole cannot be read as samples."""


class SampleError(ValueError):
    """One row cannot be scored (unreadable image, empty caption, ...)."""


@dataclass
class Sample:
    """One caption of one image.

    `image_id` identifies the picture (several captions of one image share it; the
    reconstruction seed derives from it); `candidate` numbers captions of the same image
    (best-of-N candidates, competing captioners).
    """

    id: str
    image: str | Path | Image.Image | None
    caption: str
    refs: list[str] = field(default_factory=list)
    image_id: str = ""
    candidate: int = 0
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.id = str(self.id)
        if not self.image_id:
            self.image_id = _default_image_id(self.image, self.id)
        self.caption = "" if self.caption is None else str(self.caption)
        self.refs = [str(r) for r in (self.refs or [])]
        self.candidate = int(self.candidate or 0)


def _default_image_id(image: Any, fallback: str) -> str:
    if isinstance(image, (str, Path)):
        return Path(image).stem
    return fallback


@dataclass
class LoadedSample:
    """A sample whose image has been opened: what metrics work on."""

    sample: Sample
    image: Image.Image
    image_key: str  # content hash of the pixels' source, for embedding caches

    @property
    def id(self) -> str:
        return self.sample.id

    @property
    def caption(self) -> str:
        return self.sample.caption


def open_image(sample: Sample) -> LoadedSample:
    """Open a sample's image as RGB; raise `SampleError` naming what is wrong."""
    if not sample.caption.strip():
        raise SampleError("empty caption")
    src = sample.image
    if src is None or (isinstance(src, str) and not src.strip()):
        raise SampleError("no image given")
    if isinstance(src, Image.Image):
        image = src.convert("RGB")
        key = hashlib.sha256(image.tobytes() + repr(image.size).encode()).hexdigest()
        return LoadedSample(sample, image, key)
    path = Path(src)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise SampleError(f"image not found: {path}") from None
    except OSError as exc:
        raise SampleError(f"cannot read image {path}: {exc}") from None
    try:
        with Image.open(io.BytesIO(data)) as im:
            image = im.convert("RGB")
    except Exception as exc:  # PIL raises several types for corrupt files
        raise SampleError(f"cannot decode image {path}: {exc}") from None
    return LoadedSample(sample, image, hashlib.sha256(data).hexdigest())


# ----------------------------------------------------------------------------- loaders


def load_samples(
    source: str | Path | Iterable[Sample | dict],
    *,
    images_root: str | Path | None = None,
    annotations: str | Path | None = None,
    captions: str | Path | None = None,
    split: str | None = None,
) -> list[Sample]:
    """Read samples from any supported source.

    - an iterable of `Sample` or dicts (`id`, `image`, `caption`, optional `refs`, ...);
    - `.jsonl` / `.csv` with those columns (`refs` in CSV: a JSON list or `|`-separated);
    - a COCO results `.json` (`[{"image_id", "caption"}]`) with `annotations=` the COCO
      captions file, whose `images[].file_name` locate the pictures and whose captions
      become `refs`;
    - `.parquet` (the `image` column may hold paths or `{"bytes", "path"}` structs);
    - a folder saved by Hugging Face `datasets` (`save_to_disk`);
    - a folder of images plus a captions file (`captions=`, or `captions.jsonl` /
      `captions.csv` inside it) mapping file names to captions.

    - a Karpathy split JSON (`dataset_coco.json`, ...; see `caprecon.karpathy`), one sample
      per image of `split`; given as `annotations=`, it supplies the references instead.

    Relative image paths resolve against `images_root`, else the input file's folder.
    """
    if not isinstance(source, (str, Path)):
        return [_sample_from_record(r, i, None) if not isinstance(r, Sample) else r for i, r in enumerate(source)]
    path = Path(source)
    if not path.exists():
        raise SampleFormatError(f"input not found: {path}")
    root = Path(images_root) if images_root else (path if path.is_dir() else path.parent)
    if path.is_dir():
        if (path / "dataset_info.json").exists() or (path / "state.json").exists() or (path / "dataset_dict.json").exists():
            return _load_hf_dataset(path, root)
        return _load_image_folder(path, captions, root)
    suffix = path.suffix.lower()
    if annotations is not None and Path(annotations).suffix.lower() == ".json" and _is_karpathy_file(annotations):
        from .karpathy import attach_karpathy_refs

        return attach_karpathy_refs(load_samples(path, images_root=images_root, captions=captions), annotations, split)
    if suffix == ".json" and annotations is None and _is_karpathy_file(path):
        from .karpathy import karpathy_samples

        return karpathy_samples(path, root, split)
    if suffix == ".json" and annotations is not None:
        data = json.loads(path.read_text(encoding="utf-8"))
        return _load_coco_results(data, Path(annotations), Path(images_root) if images_root else None, path)
    if suffix in RECORD_SUFFIXES:
        rows = [record for _, record in read_records(path, SampleFormatError)]
        _require_caption_column(rows, path)
        return [_sample_from_record(r, i, root) for i, r in enumerate(rows)]
    if suffix == ".parquet":
        return _load_parquet(path, root)
    raise SampleFormatError(f"{path}: unknown input format {suffix!r} (use .jsonl, .csv, .tsv, .json, .parquet "
                            "or a folder)")


def _is_karpathy_file(path: str | Path) -> bool:
    # A peek, not a parse: these files run to hundreds of MB, and the reader validates anyway.
    try:
        with Path(path).open(encoding="utf-8") as fh:
            head = fh.read(8192)
    except (OSError, UnicodeDecodeError):
        return False
    return head.lstrip().startswith("{") and '"images"' in head and '"sentences"' in head


def _require_caption_column(rows: Sequence[dict], path: Path) -> None:
    if rows and not any(_first(r, ("caption", "candidate", "text")) is not None for r in rows):
        raise SampleFormatError(f"{path}: no 'caption' field in any row")


def _first(record: dict, names: Sequence[str]) -> Any:
    for name in names:
        if name in record and record[name] is not None:
            return record[name]
    return None


def _parse_refs(value: Any) -> list[str]:
    if value is None or value == "":
        return []
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("["):
            return [str(r) for r in json.loads(text)]
        return [part.strip() for part in text.split("|") if part.strip()]
    return [str(r) for r in value]


def _resolve_image(value: Any, root: Path | None) -> Any:
    if isinstance(value, dict):  # parquet / datasets image struct
        if value.get("bytes"):
            return Image.open(io.BytesIO(value["bytes"]))
        value = value.get("path")
    if isinstance(value, Image.Image) or value is None:
        return value
    path = Path(str(value))
    if root is not None and not path.is_absolute():
        path = root / path
    return path


_KNOWN = {"id", "image", "image_path", "file_name", "caption", "candidate", "text", "refs", "references", "image_id", "candidate_index"}


def _sample_from_record(record: dict, index: int, root: Path | None) -> Sample:
    image = _resolve_image(_first(record, ("image", "image_path", "file_name")), root)
    caption = _first(record, ("caption", "candidate", "text"))
    image_id = _first(record, ("image_id",))
    sample_id = _first(record, ("id",))
    if sample_id is None:
        sample_id = index
    return Sample(
        id=str(sample_id),
        image=image,
        caption="" if caption is None else str(caption),
        refs=_parse_refs(_first(record, ("refs", "references"))),
        image_id="" if image_id is None else str(image_id),
        candidate=int(_first(record, ("candidate_index",)) or 0),
        meta={k: v for k, v in record.items() if k not in _KNOWN},
    )


def _load_coco_results(results: Any, annotations: Path, images_root: Path | None, results_path: Path) -> list[Sample]:
    if not isinstance(results, list):
        raise SampleFormatError(f"{results_path}: COCO results must be a list of {{image_id, caption}}")
    if not annotations.exists():
        raise SampleFormatError(f"annotations not found: {annotations}")
    ann = json.loads(annotations.read_text(encoding="utf-8"))
    if "images" not in ann:
        raise SampleFormatError(f"{annotations}: not a COCO captions file (no 'images')")
    root = images_root or annotations.parent
    files = {img["id"]: img.get("file_name", "") for img in ann["images"]}
    refs: dict[Any, list[str]] = {}
    for a in ann.get("annotations", []):
        refs.setdefault(a["image_id"], []).append(a["caption"])
    seen: dict[Any, int] = {}
    samples = []
    for i, r in enumerate(results):
        image_id = r.get("image_id")
        file_name = files.get(image_id)
        candidate = seen.get(image_id, 0)
        seen[image_id] = candidate + 1
        samples.append(
            Sample(
                id=str(r.get("id", f"{image_id}" if candidate == 0 else f"{image_id}-{candidate}")),
                image=(root / file_name) if file_name else None,
                caption=str(r.get("caption") or ""),
                refs=refs.get(image_id, []),
                image_id=str(image_id),
                candidate=candidate,
            )
        )
    return samples


def _load_parquet(path: Path, root: Path) -> list[Sample]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise SampleFormatError("reading parquet needs pyarrow: pip install 'caprecon[data]'") from None
    rows = pq.read_table(path).to_pylist()
    _require_caption_column(rows, path)
    return [_sample_from_record(r, i, root) for i, r in enumerate(rows)]


def _load_hf_dataset(path: Path, root: Path) -> list[Sample]:
    try:
        import datasets
    except ImportError:
        raise SampleFormatError("reading a datasets folder needs `datasets`: pip install 'caprecon[data]'") from None
    ds = datasets.load_from_disk(str(path))
    if isinstance(ds, datasets.DatasetDict):
        split = "test" if "test" in ds else next(iter(ds))
        ds = ds[split]
    rows = list(ds)
    _require_caption_column(rows, path)
    return [_sample_from_record(r, i, root) for i, r in enumerate(rows)]


def _load_image_folder(folder: Path, captions: str | Path | None, root: Path) -> list[Sample]:
    if captions is None:
        for name in ("captions.jsonl", "captions.csv", "captions.json"):
            if (folder / name).exists():
                captions = folder / name
                break
        else:
            raise SampleFormatError(f"{folder}: an image folder needs a captions file (captions.jsonl/.csv, or --captions)")
    rows = load_samples(captions, images_root=root)
    by_name = {p.name: p for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES}
    by_stem = {p.stem: p for p in by_name.values()}
    for s in rows:
        if isinstance(s.image, Path) and not s.image.exists():
            s.image = by_name.get(s.image.name) or by_stem.get(s.image.stem) or s.image
        elif s.image is None and s.image_id in by_stem:
            s.image = by_stem[s.image_id]
    return rows

