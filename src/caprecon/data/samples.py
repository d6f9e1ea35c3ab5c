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

import numpy as np
from PIL import Image, ImageOps

from caprecon.core.errors import ConfigError
from caprecon.core.records import RECORD_SUFFIXES, read_records, read_text

IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".webp", ".bmp", ".tif", ".tiff", ".gif"}


class SampleFormatError(ValueError):
    """The input file as a whole cannot be read as samples."""


class SampleError(ValueError):
    """One row cannot be scored (unreadable image, empty caption, ...).

    `reason` is the short kind of problem that run summaries count rows by.
    """

    def __init__(self, message: str, reason: str = "bad row"):
        super().__init__(message)
        self.reason = reason


# the columns an image may be named by, in the order they are looked for
IMAGE_COLUMNS = ("image", "image_path", "file_name")


@dataclass
class Sample:
    """One caption of one image.

    `image_id` identifies the picture (several captions of one image share it; the
    reconstruction seed derives from it); `candidate` numbers captions of the same image
    (best-of-N candidates, competing captioners).
    """

    id: str
    image: str | Path | bytes | Image.Image | None
    caption: str  # anything else given is kept as it came, and refused when the row is scored
    refs: list[str] = field(default_factory=list)
    image_id: str = ""
    candidate: int = 0
    meta: dict[str, Any] = field(default_factory=dict)
    #: when set, the image must lie inside this folder (for files received from others)
    image_root: Path | None = None

    def __post_init__(self) -> None:
        self.id = str(self.id)
        if not self.image_id:
            self.image_id = _default_image_id(self.image, self.id)
        self.caption = "" if self.caption is None else self.caption
        self.refs = [str(r) for r in (self.refs or [])]
        self.candidate = int(self.candidate or 0)


def _default_image_id(image: Any, fallback: str) -> str:
    if isinstance(image, (str, Path)):
        return Path(image).stem
    return fallback


class LoadedSample:
    """A sample whose image has been read: what metrics work on.

    `image_key` is the content hash of the pixels' source (the file's bytes), for caches.
    The pixels are decoded on first use of `image`: a run whose results are all cached
    hashes the files and never decodes them. `size` is known without decoding when the
    executor has seen the same bytes decode before (`known_size`). A caption-only sample
    (no image, and no metric of the run needs one) has `image` None and an empty key."""

    def __init__(self, sample: Sample, image: Image.Image | None = None, image_key: str = "", *,
                 data: bytes | None = None, what: str = "", known_size: tuple[int, int] | None = None):
        self.sample, self.image_key = sample, image_key
        self._image, self._data, self._what, self._size = image, data, what, known_size
        self.from_bytes = data is not None  # decoded from a file's (or row's) bytes, on demand
        self.size_known = known_size is not None  # the size came from an earlier decode of the same bytes

    @property
    def image(self) -> Image.Image | None:
        if self._image is None and self._data is not None:
            self._image = _decoded_bytes(self._data, self._what)
            self._data = None  # the pixels replace the bytes
        return self._image

    @property
    def decoded(self) -> bool:
        return self._data is None

    def assume_size(self, size: tuple[int, int]) -> None:
        """The size the same bytes decoded to before: `size` without decoding."""
        if self._image is None:
            self._size, self.size_known = (int(size[0]), int(size[1])), True

    @property
    def size(self) -> tuple[int, int]:
        """(width, height) as oriented for viewing."""
        if self._size is None:
            self._size = self.image.size
        return self._size

    @property
    def id(self) -> str:
        return self.sample.id

    @property
    def caption(self) -> str:
        return self.sample.caption

    def __repr__(self) -> str:
        return f"LoadedSample(id={self.id!r}, image_key={self.image_key[:12]!r}, decoded={self.decoded})"


def has_image(sample: Sample) -> bool:
    return sample.image is not None and not (isinstance(sample.image, str) and not sample.image.strip())


def open_image(sample: Sample, *, caption_only: bool = False) -> LoadedSample:
    """Open a sample's image as RGB; raise `SampleError` naming what is wrong.

    With `caption_only`, a sample without an image is valid and comes back with none."""
    item = read_image(sample, caption_only=caption_only)
    item.image  # noqa: B018 -- decode now, so a broken file is this row's error here
    return item


def read_image(sample: Sample, *, caption_only: bool = False) -> LoadedSample:
    """Like `open_image`, but a file's pixels are only decoded when first used: the bytes are
    read and hashed (a missing or unreadable file is still a `SampleError` here)."""
    if not isinstance(sample.caption, str):
        raise SampleError(f"caption is a {type(sample.caption).__name__}, not text: {sample.caption!r:.60}",
                          "caption not text")
    if not sample.caption.strip():
        raise SampleError("empty caption", "empty caption")
    if not has_image(sample):
        if caption_only:
            return LoadedSample(sample, None, "")
        raise SampleError("no image given", "no image")
    src = sample.image
    if isinstance(src, Image.Image):
        image = _decoded(src, "the image given")
        key = hashlib.sha256(image.tobytes() + repr(image.size).encode()).hexdigest()
        return LoadedSample(sample, image, key)
    if isinstance(src, (bytes, bytearray)):  # embedded in a parquet or datasets row
        return LoadedSample(sample, image_key=hashlib.sha256(src).hexdigest(), data=bytes(src),
                            what="the embedded image")
    path = Path(src)
    if "\x00" in str(path):  # no file system takes it, and the OS calls below would raise ValueError
        raise SampleError(f"image path contains a NUL character: {str(path)!r}", "image path invalid")
    if sample.image_root is not None and not _inside(path, sample.image_root):
        raise SampleError(f"image {path} lies outside --image-root {sample.image_root}", "image outside --image-root")
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise SampleError(f"image not found: {path}", "image not found") from None
    except OSError as exc:
        raise SampleError(f"cannot read image {path}: {exc}", "image unreadable") from None
    return LoadedSample(sample, image_key=hashlib.sha256(data).hexdigest(), data=data, what=f"image {path}")


def _inside(path: Path, root: Path) -> bool:
    # resolve both, so neither `..` nor a symbolic link leads out of the folder
    return path.resolve().is_relative_to(root.resolve())


def _decoded_bytes(data: bytes, what: str) -> Image.Image:
    try:
        with Image.open(io.BytesIO(data)) as im:
            return _decoded(im, what)
    except SampleError:
        raise
    except Exception as exc:  # PIL raises several types for corrupt files
        raise SampleError(f"cannot decode {what}: {exc}", "image not decodable") from None


def _decoded(im: Image.Image, what: str) -> Image.Image:
    try:
        return to_rgb(ImageOps.exif_transpose(im))
    except Exception as exc:  # truncated data shows only when the pixels are read
        raise SampleError(f"cannot decode {what}: {exc}", "image not decodable") from None


def to_rgb(im: Image.Image) -> Image.Image:
    """8-bit RGB, as a person would see the image.

    PIL's own `convert("RGB")` clips deep integer and float images (a 16-bit PNG turns
    white) and drops transparency (revealing whatever colour hides under it); here deep
    images are scaled to 0-255 and transparent pixels are laid over white.
    """
    if im.mode == "RGB":
        return im.copy()
    if im.mode.startswith("I;16"):  # 16 bits whatever the values: 65535 -> 255
        return Image.fromarray(np.round(np.asarray(im, dtype=np.float64) / 257.0).astype(np.uint8), "L").convert("RGB")
    if im.mode in ("I", "F"):
        return Image.fromarray(_to_8bit(np.asarray(im), floating=im.mode == "F"), "L").convert("RGB")
    if im.mode == "P" and "transparency" in im.info:
        im = im.convert("RGBA")
    if im.mode in ("RGBA", "LA", "PA", "RGBa", "La"):
        rgba = im.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(background, rgba).convert("RGB")
    return im.convert("RGB")


def _to_8bit(values: np.ndarray, *, floating: bool) -> np.ndarray:
    """32-bit integer or float pixels to 0-255, by the range they use: [0, 1] floats scale
    up, 8-bit values stay, 16-bit values scale down, anything else is stretched."""
    values = np.nan_to_num(values.astype(np.float64))
    low, high = (float(values.min()), float(values.max())) if values.size else (0.0, 0.0)
    if floating and low >= 0 and high <= 1.0:
        scaled = values * 255.0
    elif low >= 0 and high <= 255:
        scaled = values
    elif low >= 0 and high <= 65535:
        scaled = values / 257.0
    else:
        scaled = (values - low) / ((high - low) or 1.0) * 255.0
    return np.clip(np.round(scaled), 0, 255).astype(np.uint8)


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

    Relative image paths resolve against the input file's folder (a `datasets` folder:
    against itself). `images_root`, when given, is what they resolve against instead, and
    every image must lie inside it: a row whose image escapes it (`..`, an absolute path,
    a symbolic link) is a row error — the safe way to score files received from others.
    """
    confine = Path(images_root) if images_root else None
    if not isinstance(source, (str, Path)):
        samples = [r if isinstance(r, Sample) else _sample_from_record(r, i, confine) for i, r in enumerate(source)]
    else:
        samples = _load_path(Path(source), confine, annotations, captions, split)
    if confine is not None:
        for sample in samples:
            sample.image_root = confine
    return samples


def _load_path(path: Path, images_root: Path | None, annotations: str | Path | None,
               captions: str | Path | None, split: str | None) -> list[Sample]:
    if not path.exists():
        raise SampleFormatError(f"input not found: {path}")
    # absolute now, so a later change of working folder cannot move the images
    root = (images_root or (path if path.is_dir() else path.parent)).absolute()
    if path.is_dir():
        if (path / "dataset_info.json").exists() or (path / "state.json").exists() or (path / "dataset_dict.json").exists():
            return _load_hf_dataset(path, root)
        return _load_image_folder(path, captions, root)
    suffix = path.suffix.lower()
    if annotations is not None and Path(annotations).suffix.lower() == ".json" and _is_karpathy_file(annotations):
        from caprecon.data.loaders.karpathy import attach_karpathy_refs

        return attach_karpathy_refs(load_samples(path, images_root=images_root, captions=captions), annotations, split)
    if suffix == ".json" and annotations is None and _is_karpathy_file(path):
        from caprecon.data.loaders.karpathy import karpathy_samples

        return karpathy_samples(path, root, split)
    if suffix == ".json" and annotations is not None:
        data = _read_json(path, "COCO results (a JSON list of {image_id, caption})")
        return _load_coco_results(data, Path(annotations), images_root, path)
    if suffix in RECORD_SUFFIXES:
        return _load_records(path, root)
    if suffix == ".parquet":
        return _load_parquet(path, root)
    raise SampleFormatError(f"{path}: unknown input format {suffix!r} (use .jsonl, .csv, .tsv, .json, .parquet "
                            "or a folder)")


def _read_json(path: Path, what: str) -> Any:
    try:
        return json.loads(read_text(path, SampleFormatError))
    except json.JSONDecodeError as exc:
        raise SampleFormatError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno}); expected {what}") from None


def _load_records(path: Path, root: Path, *, need_images: bool = True) -> list[Sample]:
    rows = [record for _, record in read_records(path, SampleFormatError)]
    _require_caption_column(rows, path)
    if need_images:
        _require_image_column(rows, path)
    return [_sample_from_record(r, i, root) for i, r in enumerate(rows)]


def _require_image_column(rows: Sequence[dict], path: Path) -> None:
    if not rows or any(name in r for r in rows for name in IMAGE_COLUMNS):
        return
    if all("image_id" in r for r in rows) and path.suffix.lower() == ".json":
        raise SampleFormatError(f"{path} looks like COCO results (image_id, caption): add --annotations FILE, the "
                                "COCO captions file whose images[].file_name locate the pictures")
    found = sorted({k for r in rows for k in r})
    raise SampleFormatError(f"{path}: no image column; name it one of {', '.join(IMAGE_COLUMNS)} "
                            f"(columns found: {', '.join(found)})")


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
            value = json.loads(text)
        else:
            return [part.strip() for part in text.split("|") if part.strip()]
    if not isinstance(value, (list, tuple)):
        raise TypeError(f"a {type(value).__name__}")
    return [str(r) for r in value]


def _whole_number(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise TypeError(f"a {type(value).__name__}")
    return int(value)


def _resolve_image(value: Any, root: Path | None) -> Any:
    if isinstance(value, dict):  # parquet / datasets image struct: decoded when the row is scored
        if value.get("bytes"):
            return value["bytes"]
        value = value.get("path")
    if isinstance(value, Image.Image) or value is None:
        return value
    path = Path(str(value))
    if root is not None and not path.is_absolute():
        path = root / path
    return path


_KNOWN = {"id", "image", "image_path", "file_name", "caption", "candidate", "text", "refs", "references", "image_id", "candidate_index"}


def _sample_from_record(record: dict, index: int, root: Path | None) -> Sample:
    image = _resolve_image(_first(record, IMAGE_COLUMNS), root)
    caption = _first(record, ("caption", "candidate", "text"))
    image_id = _first(record, ("image_id",))
    sample_id = _first(record, ("id",))
    if sample_id is None:
        sample_id = index
    refs, candidate = _first(record, ("refs", "references")), _first(record, ("candidate_index",)) or 0
    try:
        refs = _parse_refs(refs)
    except (TypeError, ValueError) as exc:
        raise SampleFormatError(f"row {index + 1} (id {sample_id}): refs must be a list of captions, a JSON list "
                                f"or '|'-separated text, not {exc}") from None
    try:
        candidate = _whole_number(candidate)
    except (TypeError, ValueError):
        raise SampleFormatError(f"row {index + 1} (id {sample_id}): candidate_index must be a whole number, "
                                f"not {candidate!r:.40}") from None
    return Sample(
        id=str(sample_id),
        image=image,
        caption="" if caption is None else caption,
        refs=refs,
        image_id="" if image_id is None else str(image_id),
        candidate=candidate,
        meta={k: v for k, v in record.items() if k not in _KNOWN},
    )


def _load_coco_results(results: Any, annotations: Path, images_root: Path | None, results_path: Path) -> list[Sample]:
    if not isinstance(results, list):
        raise SampleFormatError(f"{results_path}: COCO results must be a list of {{image_id, caption}}")
    if not annotations.exists():
        raise SampleFormatError(f"annotations not found: {annotations}")
    ann = _read_json(annotations, "COCO captions annotations (an object with 'images' and 'annotations')")
    if not isinstance(ann, dict) or "images" not in ann:
        raise SampleFormatError(f"{annotations}: not a COCO captions file (no 'images')")
    root = (images_root or annotations.parent).absolute()
    files = {img["id"]: img.get("file_name", "") for img in ann["images"]}
    refs: dict[Any, list[str]] = {}
    for a in ann.get("annotations", []):
        refs.setdefault(a["image_id"], []).append(a["caption"])
    seen: dict[Any, int] = {}
    samples = []
    for i, r in enumerate(results):
        if not isinstance(r, dict):
            raise SampleFormatError(f"{results_path} item {i + 1}: expected {{image_id, caption}}, got {type(r).__name__}")
        image_id = r.get("image_id")
        file_name = files.get(image_id)
        candidate = seen.get(image_id, 0)
        seen[image_id] = candidate + 1
        samples.append(
            Sample(
                id=str(r.get("id", f"{image_id}" if candidate == 0 else f"{image_id}-{candidate}")),
                image=(root / file_name) if file_name else None,
                caption=r.get("caption") or "",
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
    for name, feature in ds.features.items():
        if isinstance(feature, datasets.Image):  # keep bytes and paths: decode row by row, paths against `root`
            ds = ds.cast_column(name, datasets.Image(decode=False))
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
    captions = Path(captions)
    if not captions.exists():
        raise SampleFormatError(f"captions file not found: {captions}")
    rows = _load_records(captions, root, need_images=False)  # rows may name images by image_id alone
    by_name = {p.name: p for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES}
    by_stem = {p.stem: p for p in by_name.values()}
    for s in rows:
        if isinstance(s.image, Path) and not s.image.exists():
            s.image = by_name.get(s.image.name) or by_stem.get(s.image.stem) or s.image
        elif s.image is None and s.image_id in by_stem:
            s.image = by_stem[s.image_id]
    return rows


def check_unique_ids(rows: list[Sample]) -> None:
    seen: dict[str, int] = {}
    for i, s in enumerate(rows):
        if s.id in seen:
            raise ConfigError(f"sample id {s.id!r} appears in rows {seen[s.id]} and {i}; ids must be unique")
        seen[s.id] = i
