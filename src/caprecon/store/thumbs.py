"""Thumbnails written beside the report, so the page stays small and opens from file://.

A thumbnail's name is a hash of its source's path, size and modification time: the same
picture shown by many rows (one original, several captioners) is written once, and a
report rendered again reuses what is already there.

Three things keep thumbnails off a run's critical path:
- a store-wide cache (`thumbs/` under the cache folder): a thumbnail made once is linked
  (or copied, across file systems) into every later run's `report_files/thumbs/`, so a
  fully cached run into a new folder decodes and encodes no picture for its report;
- while a `score` run works, `ThumbnailWriter`'s thread makes the thumbnails of the
  pictures the run holds in memory anyway (each source it decoded, each reconstruction the
  store writes: `thumbnail_of`), so nothing is decoded a second time, links them into the
  run folder as batches finish, and makes from their files the few the cache still lacks,
  so the report at the end finds them done;
- a JPEG or PNG file little larger than a thumbnail (a reconstruction, a small original)
  is its own thumbnail: linked or copied, neither resized nor encoded. The cache keeps those
  links in one folder (`thumbs/as-is/`), the thumbnails it made in folders by their names'
  first two characters (`thumbs/ab/`), where caches written before kept both.

Sources are read through `caprecon.data.images.read_image_file`, as scoring reads them: an
original outside the run's `--image-root` gets no thumbnail (not even one cached earlier),
and neither does anything that is not a regular file or is larger than images may be.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import logging
import os
import queue
import shutil
import stat
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Iterable, Mapping

from PIL import Image

from caprecon.core.paths import make_folder, write_file
from caprecon.data.images import inside, read_image_file
from caprecon.data.samples import SampleError

log = logging.getLogger(__name__)

THUMB_SIDE = 256  # shown at half that size, so they stay sharp on high-density screens
QUALITY = 82
# A JPEG or PNG file at most half as large again as a thumbnail, in pixels, and this large in
# bytes is its own thumbnail: linking or copying it costs a fraction of resizing and encoding
# it (about 1 ms for a 320x240 picture, on the writer's thread beside the models), and the
# page shows it the same at 128 pixels.
DIRECT_BYTES = 64 * 1024  # a few times a thumbnail's own size, so the gallery stays light
_DIRECT_MAGIC = (b"\xff\xd8\xff", b"\x89PNG\r\n\x1a\n")  # what every browser shows in an <img>, whatever the name
CACHE_FOLDER = "thumbs"  # under a store's root
#: the thumbnail cache's one folder of links to pictures that are their own thumbnails. Each folder
#: by a name's first two characters was a new inode for about one picture in two of a 256-sample run
#: into a fresh cache (~220 of them), up to a millisecond of kernel CPU each on the project's ext4;
#: one folder is made once. Not two hex digits, so no thumbnail's own folder has its name
AS_IS_FOLDER = "as-is"


def _name(source: str) -> str | None:
    named = _named(source)
    return named[0] if named else None


def _named(source: str) -> tuple[str, os.stat_result] | None:
    """The thumbnail's name, and the `stat` of `source` it was made from."""
    try:
        st = os.stat(source)
    except (OSError, ValueError):  # ValueError: a NUL in the path
        return None
    digest = hashlib.sha1(f"{os.path.abspath(source)}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[:24]
    return digest + ".jpg", st


def cache_folder(store_root: str | Path | None) -> Path | None:
    """The thumbnail cache of the store at `store_root`, when there is one this process may write."""
    if not store_root:
        return None
    root = Path(store_root)
    folder = root / CACHE_FOLDER
    if folder.is_dir():
        return folder if os.access(folder, os.W_OK) else None
    return folder if root.is_dir() and os.access(root, os.W_OK) else None


def _cached(cache: str | Path, name: str) -> str:
    """Where the cache keeps the thumbnail called `name` that was made (folders by the name's first two
    characters; caches written before `AS_IS_FOLDER` keep links to pictures there too). A string: on a
    run's thumbnail thread, building paths as `Path`s cost more than the links."""
    return os.path.join(cache, name[:2], name)


def _as_is(cache: str | Path, name: str) -> str:
    """Where the cache keeps the link called `name` to a picture that is its own thumbnail."""
    return os.path.join(cache, AS_IS_FOLDER, name)


def _from_cache(cache: str | Path, name: str, target: str | Path) -> bool:
    """Put the cache's thumbnail called `name` at `target` (`_link`): a picture that is its own
    thumbnail, else one made (or, in a cache written before `AS_IS_FOLDER`, either)."""
    return _link(_as_is(cache, name), target) or _link(_cached(cache, name), target)


class _Unreadable(Exception):
    """The source picture cannot be read: no other place to write its thumbnail would help."""


def allowed(source: str, image_root: str | Path | None) -> bool:
    """Whether `source` may be shown at all: inside `image_root` when there is one."""
    try:
        return image_root is None or inside(Path(source), Path(image_root))
    except (OSError, ValueError, RuntimeError):  # a NUL in the path, a symbolic-link loop
        return False


def _encode(source: str, target: str | Path, side: int, image_root: str | Path | None = None) -> bool:
    """Write the thumbnail; False when `target` cannot be written, `_Unreadable` when `source` cannot be read."""
    try:
        data = read_image_file(source, image_root)
        with Image.open(io.BytesIO(data)) as im:
            if _shown_as_is(data, len(data), im.size, side):
                return _save(data, target)
            im.draft("RGB", (side, side))  # JPEG sources decode at a reduced scale: much faster
            im = im.convert("RGB")
            im.thumbnail((side, side), Image.Resampling.BILINEAR, reducing_gap=2.0)
    except (SampleError, OSError, ValueError, Image.DecompressionBombError) as exc:
        raise _Unreadable(source) from exc
    return _save(im, target)


def thumbnail_of(image: Image.Image, source: str, cache: Path, side: int = THUMB_SIDE, *,
                 head: tuple[int, bytes] | None = None) -> str | None:
    """Put the thumbnail of the picture file `source` in the thumbnail `cache`, made from its
    pixels already in memory (`image`, as decoded for scoring or as generated) rather than
    read and decoded again. `head`: the file's length and first 8 bytes, as its reader or
    writer saw them; whether the file is its own thumbnail is then known without reading it
    (while it is still a regular file of that length). Returns the thumbnail's path in the cache,
    None when it cannot be written; the thumbnail's name is the path's last part."""
    named = _named(source)
    if named is None:
        return None
    name, st = named
    # the run read this file (inside --image-root) or wrote it moments ago: when it is its own
    # thumbnail, a link to it costs one directory entry, where writing a file costs up to a
    # millisecond here; a link already there is as good (a name is the file's path, size and time)
    known = head is not None and stat.S_ISREG(st.st_mode) and st.st_size == head[0]
    if known and _shown_as_is(head[1], head[0], image.size, side):
        return _linked(source, _as_is(cache, name))
    target = _cached(cache, name)
    if not known:  # made or linked before (reading the file to tell is not needed), in either folder
        for there in (_as_is(cache, name), target):
            if os.path.exists(there):
                return there
        if _file_shown_as_is(source, image.size, side):
            return _linked(source, _as_is(cache, name))
    elif os.path.exists(target):
        return target
    scale = min(1.0, side / max(image.size))
    size = (max(1, round(image.width * scale)), max(1, round(image.height * scale)))
    small = image.convert("RGB") if image.mode != "RGB" else image
    small = small.resize(size, Image.Resampling.BILINEAR, reducing_gap=2.0) if scale < 1 else small.copy()
    return target if _save(small, target) else None


def _linked(source: str, target: str) -> str | None:
    return target if _link(source, target) else None


def _shown_as_is(head: bytes, n_bytes: int, size: tuple[int, int], side: int) -> bool:
    """Whether a picture file of `n_bytes` starting with `head`, of `size` pixels, is its own thumbnail."""
    return _few_pixels(size, side) and 0 < n_bytes <= DIRECT_BYTES and head.startswith(_DIRECT_MAGIC)


def _few_pixels(size: tuple[int, int], side: int) -> bool:
    return max(size) <= side * 3 // 2


def _file_shown_as_is(source: str, size: tuple[int, int], side: int) -> bool:
    if not _few_pixels(size, side):  # most pictures: known from their pixels, the file is not opened
        return False
    try:
        data = read_image_file(source, max_bytes=DIRECT_BYTES)  # a larger file is refused before it is read
    except SampleError:
        return False
    return _shown_as_is(data, len(data), size, side)


def _save(content: Image.Image | bytes, target: str | Path) -> bool:
    """Write the thumbnail (pixels to encode, or a picture file's own bytes). Encoded in memory, then
    written through a descriptor (`write_file`) as the store's pictures are: a file object the encoder
    wrote into cost three system calls more a thumbnail, on the thread beside the models."""
    partial = f"{os.path.splitext(target)[0]}.{os.getpid()}.{threading.get_ident()}.part"
    try:
        if isinstance(content, bytes):
            data = content
        else:
            buffer = io.BytesIO()
            content.save(buffer, "JPEG", quality=QUALITY, optimize=False)
            data = buffer.getvalue()
        write_file(partial, data)
        os.replace(partial, target)  # never leave a half-written thumbnail under its final name
        return True
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(partial)
        if isinstance(exc, OSError):
            return False
        raise


def _link(cached: str | Path, target: str | Path) -> bool:
    """Put the file `cached` (a thumbnail, or a picture small enough to be one) at `target`: a hard
    link where the file system allows, else a copy. `target`'s folder is made when missing; a
    file already at `target` is kept."""
    try:
        try:
            os.link(cached, target)
        except FileNotFoundError:
            # the folder is made only when a link finds it missing: one system call per
            # picture, where checking for it first doubled that on a run's thumbnail thread;
            # a link that fails again found no file at `cached`
            make_folder(os.path.dirname(target))
            os.link(cached, target)
        return True
    except FileNotFoundError:
        return False
    except FileExistsError:
        return True
    except OSError:
        try:  # another file system (or one without hard links): a copy
            os.makedirs(os.path.dirname(target), exist_ok=True)
            partial = f"{target}.{os.getpid()}.part"
            shutil.copyfile(cached, partial)
            os.replace(partial, target)
            return True
        except OSError:
            return False


def _write(source: str, target: Path, side: int, cache: Path | None = None,
           image_root: str | Path | None = None) -> bool:
    if not allowed(source, image_root):
        return False
    if target.exists():
        return True
    try:
        if cache is not None:
            if _from_cache(cache, target.name, target):  # made or linked before
                return True
            cached = _cached(cache, target.name)
            if _encode(source, cached, side, image_root) and _link(cached, target):
                return True
        return _encode(source, target, side, image_root)  # no cache, or it cannot be written: the run folder still gets one
    except _Unreadable:
        return False


def make_thumbnails(sources: Iterable[str], folder: Path, *, side: int = THUMB_SIDE, cache: Path | None = None,
                    progress: bool = False, image_root: str | Path | None = None,
                    known: Mapping[str, str] | None = None) -> dict[str, str | None]:
    """{source path: thumbnail file name in `folder`, or None when the source is missing, unreadable or
    outside `image_root`}. With `cache` (a store's thumbnail folder), thumbnails made before are linked
    rather than made. `known`: {source: name} of thumbnails put in `folder` moments ago (by the run's
    `ThumbnailWriter`, which checked `image_root`), taken as they are: neither named nor looked for again."""
    from tqdm.auto import tqdm

    folder.mkdir(parents=True, exist_ok=True)
    unique = list(dict.fromkeys(sources))
    known = known or {}
    targets = {src: _name(src) for src in unique if src not in known and allowed(src, image_root)}
    # those already in the folder (a report rendered again, a run's writer) need no job at all
    written = {src: known[src] for src in unique if src in known}
    written.update({src: name for src, name in targets.items() if name and (folder / name).exists()})
    jobs = [(src, folder / name) for src, name in targets.items() if name and src not in written]
    if jobs:
        workers = min(8, (os.cpu_count() or 1) + 1)
        with ThreadPoolExecutor(workers) as pool:  # decoding and resizing release the GIL
            done = list(tqdm(pool.map(lambda job: _write(*job, side, cache, image_root), jobs), total=len(jobs),
                             desc="thumbnails", unit="image", disable=not progress or len(jobs) < 50,
                             dynamic_ncols=True))
        written.update({src: target.name for (src, target), ok in zip(jobs, done) if ok})
    return {src: written.get(src) for src in unique}


def resolve(path: str, run: Path) -> str:
    """A record's image path as the report reads it: as written when it exists (or is
    absolute), else relative to the run folder."""
    if os.path.isabs(path) or os.path.exists(path):
        return path
    return os.path.join(run, path)


def record_images(record: Mapping[str, Any], run: Path) -> tuple[str | None, list[str]]:
    """The original's path and the paths of the row's reconstructions, resolved as the report does."""
    original = record.get("image") if isinstance(record.get("image"), str) else None
    recons = [resolve(v, run) for k, v in record.items() if "reconstruction" in k and isinstance(v, str) and v]
    # a row scored from K seeds: its K reconstructions, side by side
    seeded = [resolve(p, run) for p in record.get("reconstructions") or [] if isinstance(p, str) and p]
    return (resolve(original, run) if original else None), recons + [p for p in seeded if p not in recons]


class ThumbnailWriter:
    """Makes the thumbnails of a run's rows while the run works.

    `add(rows)` only queues the rows' pictures (those already queued are skipped) and
    returns at once. With `store`, the pictures whose pixels it holds come here too
    (`from_memory`, before the rows that show them) and the same thread makes their
    thumbnails from those pixels (`thumbnail_of`) into the cache; the thread links what the
    cache holds into the run folder and makes the others from their files. Neither waits
    on the run nor holds up its batches. `close()` waits for the queue. A thumbnail that
    could not be made is left for the report, which tries again. Originals outside
    `image_root` are never shown. `made` holds, once `close()` returns, {picture: its thumbnail's name}
    for the thumbnails it put in `folder`: the report takes those names as they are."""

    def __init__(self, run: Path, folder: Path, *, cache: Path | None = None, side: int = THUMB_SIDE,
                 image_root: str | Path | None = None, store: Any = None):
        self.run, self.folder, self.cache, self.side = run, folder, cache, side
        self.image_root = str(image_root) if image_root is not None else None
        self.folder.mkdir(parents=True, exist_ok=True)
        self.store = store if cache is not None else None
        if self.store is not None:
            self.store.thumbnails = self.from_memory  # until `close`
        self._seen: set[str] = set()
        self._named: dict[str, str] = {}  # picture -> its thumbnail's path in the cache, made from memory (feed thread only)
        self.made: dict[str, str] = {}  # picture -> its thumbnail in `folder` (written by the feed thread)
        self._queue: queue.SimpleQueue[list[tuple[str, str | None]] | dict[str, tuple[Image.Image, Any]] | None] \
            = queue.SimpleQueue()
        self._stopping = False
        self._feeder = threading.Thread(target=self._feed, name="caprecon-thumbs-feed", daemon=True)
        self._feeder.start()

    def add(self, rows: Iterable[Mapping[str, Any]]) -> None:
        paths: list[tuple[str, str | None]] = []  # (source, the folder it must lie in)
        for row in rows:
            original, recons = record_images(row, self.run)
            if original and original not in self._seen and allowed(original, self.image_root):
                paths.append((original, self.image_root))
            paths += [(p, None) for p in recons if p not in self._seen]
        if paths:
            self._seen.update(p for p, _ in paths)
            self._queue.put(paths)

    def from_memory(self, images: dict[str, tuple[Image.Image, tuple[int, bytes] | None]]) -> None:
        """Queue thumbnails of picture files ({path: (pixels, (file length, first 8 bytes) or
        None)}) to make from the pixels given."""
        if not self._stopping:
            self._queue.put(images)

    def _feed(self) -> None:
        # the cache's folders (`_cached`) are made by the first thumbnail filed in each (`write_file`,
        # `_link`): all 256 at once made more than a few hundred pictures need, at up to 0.35 ms each here
        while (paths := self._queue.get()) is not None:
            if self._stopping:
                continue  # stopped: what is queued is dropped
            if isinstance(paths, dict):
                for source, (image, head) in paths.items():
                    if cached := thumbnail_of(image, source, self.cache, self.side, head=head):
                        self._named[source] = cached
                continue
            # a picture whose thumbnail was just made from memory needs only its link: its
            # name and its place in the cache are known
            misses = []
            for p, root in paths:
                cached = self._named.pop(p, None)
                if name := os.path.basename(cached) if cached else _name(p):
                    if _link(cached, os.path.join(self.folder, name)) if cached else self._linked_from_cache(name):
                        self.made[p] = name
                    else:
                        misses.append((p, name, root))
            for source, name, root in misses:
                if self._stopping:
                    break
                try:
                    if _write(source, self.folder / name, self.side, self.cache, root):
                        self.made[source] = name
                except OSError as exc:  # left for the report, which tries again
                    log.debug("thumbnail of %s: %s", source, exc)

    def _linked_from_cache(self, name: str) -> bool:
        """Put a thumbnail the cache already holds into the run folder (a link costs microseconds)."""
        if self.cache is None:
            return False
        return _from_cache(self.cache, name, os.path.join(self.folder, name))

    def close(self, *, wait: bool = True) -> None:
        """Wait for the queued thumbnails (`wait=False`: stop at once, e.g. on Ctrl-C)."""
        if self.store is not None:
            self.store.thumbnails = None
        if not wait:
            self._stopping = True
        self._queue.put(None)
        self._feeder.join(None if wait else 5)

