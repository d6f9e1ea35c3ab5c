"""Samples: one record per (image, caption) pair.

A `Sample` names its image (a path, or a PIL image already in memory) and carries the
caption, optional references and free metadata. Loading (`caprecon.data.loaders`) never
opens images: that happens row by row at scoring time (`caprecon.data.images`), so one
unreadable file becomes that row's error instead of stopping the run. Problems with the
*file as a whole* (missing, unknown format, no caption column) raise `SampleFormatError`
before any work starts.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

from PIL import Image

from caprecon.core.errors import ConfigError
from caprecon.core.records import unicode_problem

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
    #: the option that set `image_root`, as a refusal names it (`meta` confines to its `--images`)
    image_root_option: str = "--image-root"
    #: the most bytes the image file may hold (None: `caprecon.data.images.MAX_IMAGE_BYTES`)
    max_image_bytes: int | None = None

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


def confine_images(samples: Iterable[Sample], root: str | Path, option: str = "--image-root") -> None:
    """Every sample's image must lie inside `root` when it is opened: a row naming one outside
    (by `..`, an absolute path or a symbolic link) becomes that row's error, naming `option`
    (`caprecon.data.images` checks it when it opens the file). The one way a loader confines
    the images its rows name: `load_samples` under --image-root, and every benchmark's
    judgments (`Judgments.samples`) under `meta --images` or the benchmark's own folder."""
    for sample in samples:
        sample.image_root, sample.image_root_option = Path(root), option


def has_image(sample: Sample) -> bool:
    return sample.image is not None and not (isinstance(sample.image, str) and not sample.image.strip())


def text_problem(sample: Sample) -> str | None:
    """Which of the sample's texts that reach a model or a key (the caption, each reference, the
    image id its seed derives from) is not valid Unicode, and why (`unicode_problem`), or None."""
    texts = [("caption", sample.caption), *((f"reference {i}", ref) for i, ref in enumerate(sample.refs)),
             ("image_id", sample.image_id)]
    return next((f"{name} {problem}" for name, text in texts
                 if isinstance(text, str) and (problem := unicode_problem(text))), None)


def check_images(rows: Sequence[Sample], needing: Sequence[str]) -> None:
    """Caption-only rows are valid only when no metric compares with the source image;
    `needing` names the metrics that do."""
    if not needing:
        return
    missing = [i for i, s in enumerate(rows) if not has_image(s)]
    if missing:
        first = missing[0]
        raise ConfigError(
            f"{len(missing)} row(s) have no image (first: row {first}, id {rows[first].id!r}), but "
            f"{', '.join(needing)} compare(s) the caption with its source image. Give every row an image, or "
            f"score caption-only rows with metrics that need none (vqascore --vqa-on reconstruction; "
            f"`caprecon t2i` for generators)")


def confining_root(rows: Sequence[Sample]) -> str | None:
    """The folder (absolute) every row's image must lie in, which the report's thumbnails keep
    to as well; None when the rows are not confined. Rows confined to different folders (built
    in Python) share no folder: the null device then stands for one that holds no original."""
    roots = {str(Path(s.image_root).resolve()) if s.image_root is not None else None for s in rows}
    if not roots or roots == {None}:
        return None
    return roots.pop() if len(roots) == 1 else os.devnull


def check_unique_ids(rows: list[Sample]) -> None:
    seen: dict[str, int] = {}
    for i, s in enumerate(rows):
        if s.id in seen:
            raise ConfigError(f"sample id {s.id!r} appears in rows {seen[s.id]} and {i}; ids must be unique")
        seen[s.id] = i
