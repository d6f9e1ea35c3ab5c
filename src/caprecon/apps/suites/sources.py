"""Where a suite's captions come from: captioners run here, or files of captions written elsewhere."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from caprecon.apps.suites.loaders import Benchmark
from caprecon.apps.suites.table import UPPER
from caprecon.core.errors import ConfigError
from caprecon.core.records import read_records
from caprecon.run.entrants import Entrant, entrants
from caprecon.core.paths import file_problem


@dataclass(frozen=True)
class CaptionSource:
    """A row of the table: a captioner to run, or a file of captions (`image_id` or `dataset` + `index`)."""

    label: str
    captioner: Entrant | None = None
    captions_file: Path | None = None


def caption_sources(captioners: Iterable[Any] | Mapping[str, Any] = (),
                    caption_files: Iterable[str] | Mapping[str, str | Path] = ()) -> list[CaptionSource]:
    """Sources from `[LABEL=]SPEC` captioners and `[LABEL=]FILE` caption files (or mappings)."""
    sources = [CaptionSource(e.label, captioner=e) for e in entrants(captioners, "captioner")]
    files = caption_files.items() if isinstance(caption_files, Mapping) else [
        f.partition("=")[::2] if "=" in str(f) else (Path(str(f)).stem, f) for f in caption_files]
    for label, path in files:
        if not str(label).strip() or not str(path).strip():  # "pub=" or "=file": Path('') is the working folder
            raise ConfigError(f"--captions {f'{label}={path}'!r} must look like [LABEL=]FILE, with both parts")
        path = Path(path)
        if problem := file_problem(path):
            raise ConfigError(f"--captions: {problem}")
        sources.append(CaptionSource(str(label).strip(), captions_file=path))
    labels = [s.label for s in sources]
    repeated = sorted({label for label in labels if labels.count(label) > 1})
    if repeated:
        raise ConfigError(f"caption source label(s) {repeated} given twice; name them apart with LABEL=...")
    if not sources:
        raise ConfigError("nothing to evaluate: give a --captioner or a --captions file")
    if UPPER in labels:
        raise ConfigError(f"{UPPER!r} is the upper bound's row; label the source otherwise")
    return sources


def read_caption_file(path: Path, benchmarks: Sequence[Benchmark]) -> dict[str, str]:
    """image_id -> caption. Rows name the image by `image_id` (as OUT/images.jsonl lists
    them) or by `dataset` and `index`; other images of the benchmarks have no caption."""
    by_index = {(b.entry.name, q.id): q.image_id for b in benchmarks for q in b.questions}
    known = {q.image_id for b in benchmarks for q in b.questions}
    captions: dict[str, str] = {}
    for where, record in read_records(path, ConfigError):
        caption = record.get("caption")
        if not isinstance(caption, str):
            raise ConfigError(f"{where}: no `caption` text")
        if record.get("image_id"):
            image_id = str(record["image_id"])
        elif record.get("dataset") is not None and record.get("index") is not None:
            image_id = by_index.get((str(record["dataset"]), str(record["index"])), "")
            if not image_id:
                continue  # a row of a dataset or question this run does not include
        else:
            raise ConfigError(f"{where}: name the image by `image_id` or by `dataset` and `index`")
        if image_id in known:
            captions[image_id] = caption
    return captions
