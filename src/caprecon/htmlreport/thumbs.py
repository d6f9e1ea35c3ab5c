"""Thumbnails written beside the report, so the page stays small and opens from file://.

A thumbnail's name is a hash of its source's path, size and modification time: the same
picture shown by many rows (one original, several captioners) is written once, and a
report rendered again reuses what is already there.
"""

from __future__ import annotations

import hashlib
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterable

from PIL import Image
from tqdm.auto import tqdm

THUMB_SIDE = 256  # shown at half that size, so they stay sharp on high-density screens
QUALITY = 82


def _name(source: str) -> str | None:
    try:
        st = os.stat(source)
    except OSError:
        return None
    digest = hashlib.sha1(f"{os.path.abspath(source)}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[:24]
    return digest + ".jpg"


def _write(source: str, target: Path, side: int) -> bool:
    if target.exists():
        return True
    try:
        with Image.open(source) as im:
            im.draft("RGB", (side, side))  # JPEG sources decode at a reduced scale: much faster
            im = im.convert("RGB")
            im.thumbnail((side, side), Image.Resampling.BILINEAR, reducing_gap=2.0)
            partial = target.with_suffix(".part")
            im.save(partial, "JPEG", quality=QUALITY, optimize=False)
            os.replace(partial, target)  # never leave a half-written thumbnail under its final name
        return True
    except (OSError, ValueError, Image.DecompressionBombError):
        return False


def make_thumbnails(sources: Iterable[str], folder: Path, *, side: int = THUMB_SIDE,
                    progress: bool = False) -> dict[str, str | None]:
    """{source path: thumbnail file name in `folder`, or None when the source is missing or unreadable}."""
    folder.mkdir(parents=True, exist_ok=True)
    unique = list(dict.fromkeys(sources))
    targets = {src: _name(src) for src in unique}
    jobs = [(src, folder / name) for src, name in targets.items() if name]
    workers = min(8, (os.cpu_count() or 1) + 1)
    with ThreadPoolExecutor(workers) as pool:  # decoding and resizing release the GIL
        done = list(tqdm(pool.map(lambda job: _write(*job, side), jobs), total=len(jobs), desc="thumbnails",
                         unit="image", disable=not progress or len(jobs) < 50, dynamic_ncols=True))
    written = {src: target.name for (src, target), ok in zip(jobs, done) if ok}
    return {src: written.get(src) for src in unique}
