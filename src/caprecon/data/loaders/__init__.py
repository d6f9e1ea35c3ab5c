"""Samples in, from the formats people keep them in: one module per format that needs more
than a few lines (`karpathy`; the meta-evaluation benchmarks' judgments, one module each, with
what they share in `common`), the rest here.

Loading never opens images: rows name them, and `caprecon.data.images` opens them when a
metric needs the pixels.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable, Sequence

from PIL import Image

from caprecon.core.records import RECORD_SUFFIXES, read_records, read_text
from caprecon.data.samples import IMAGE_COLUMNS, IMAGE_SUFFIXES, Sample, SampleFormatError, confine_images


def load_samples(
    source: str | Path | Iterable[Sample | dict],
    *,
    images_root: str | Path | None = None,
    annotations: str | Path | None = None,
    captions: str | Path | None = None,
    split: str | None = None,
    max_image_bytes: int | None = None,
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

    - a Karpathy split JSON (`dataset_coco.json`, ...; see `caprecon.data.loaders.karpathy`), one sample
      per image of `split`; given as `annotations=`, it supplies the references instead.

    Relative image paths resolve against the input file's folder (a `datasets` folder:
    against itself). `images_root`, when given, is what they resolve against instead, and
    every image must lie inside it: a row whose image escapes it (`..`, an absolute path,
    a symbolic link) is a row error — the safe way to score files received from others.
    `max_image_bytes` caps what an image file may hold (default
    `caprecon.data.images.MAX_IMAGE_BYTES`); a larger one is a row error too.
    """
    confine = Path(images_root) if images_root else None
    if not isinstance(source, (str, Path)):
        samples = [r if isinstance(r, Sample) else _sample_from_record(r, i, confine) for i, r in enumerate(source)]
    else:
        samples = _load_path(Path(source), confine, annotations, captions, split)
    if confine is not None:
        confine_images(samples, confine)
    if max_image_bytes is not None:
        for sample in samples:
            sample.max_image_bytes = max_image_bytes
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
    # half a surrogate pair in a row is that row's error when it is scored (`read_image`), not the file's
    rows = [record for _, record in read_records(path, SampleFormatError, keep_surrogates=True)]
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
    for ref in value:  # str() would turn 3 or None into a reference no one wrote
        if not isinstance(ref, str):
            raise TypeError(f"a list holding the {type(ref).__name__} {ref!r:.40}")
    return list(value)


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
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise SampleFormatError("reading parquet needs pyarrow: pip install 'caprecon[data]'") from None
    try:
        rows = pq.read_table(path).to_pylist()
    except pa.ArrowException as exc:
        raise SampleFormatError(f"{path}: not a readable parquet file ({exc})") from None
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
