"""Thumbnails written beside the report, so the page stays small and opens from file://.

A thumbnail's name is a hash of its source's path, size and modification time: the same
picture shown by many rows (one original, several captioners) is written once, and a
report rendered again reuses what is already there.

Two things keep thumbnails off a run's critical path:
- a store-wide cache (`thumbs/` under the cache folder): a thumbnail made once is linked
  (or copied, across file systems) into every later run's `report_files/thumbs/`, so a
  fully cached run into a new folder decodes and encodes no picture for its report;
- `ThumbnailWriter`: while a `score` run works, a helper process makes the thumbnails of
  each finished batch, so the report at the end finds them done.

Sources are read through `caprecon.data.images.read_image_file`, as scoring reads them: an
original outside the run's `--image-root` gets no thumbnail (not even one cached earlier),
and neither does anything that is not a regular file or is larger than images may be.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import queue
import shutil
import subprocess
import sys
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Iterable, Mapping

from PIL import Image

from caprecon.data.images import inside, read_image_file
from caprecon.data.samples import SampleError

log = logging.getLogger(__name__)

THUMB_SIDE = 256  # shown at half that size, so they stay sharp on high-density screens
QUALITY = 82
CACHE_FOLDER = "thumbs"  # under a store's root


def _name(source: str) -> str | None:
    try:
        st = os.stat(source)
    except (OSError, ValueError):  # ValueError: a NUL in the path
        return None
    digest = hashlib.sha1(f"{os.path.abspath(source)}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[:24]
    return digest + ".jpg"


def cache_folder(store_root: str | Path | None) -> Path | None:
    """The thumbnail cache of the store at `store_root`, when there is one this process may write."""
    if not store_root:
        return None
    root = Path(store_root)
    folder = root / CACHE_FOLDER
    if folder.is_dir():
        return folder if os.access(folder, os.W_OK) else None
    return folder if root.is_dir() and os.access(root, os.W_OK) else None


def _cached(cache: Path, name: str) -> Path:
    """Where the cache keeps the thumbnail called `name` (folders by the name's first two characters)."""
    return cache / name[:2] / name


class _Unreadable(Exception):
    """The source picture cannot be read: no other place to write its thumbnail would help."""


def allowed(source: str, image_root: str | Path | None) -> bool:
    """Whether `source` may be shown at all: inside `image_root` when there is one."""
    try:
        return image_root is None or inside(Path(source), Path(image_root))
    except (OSError, ValueError, RuntimeError):  # a NUL in the path, a symbolic-link loop
        return False


def _encode(source: str, target: Path, side: int, image_root: str | Path | None = None) -> bool:
    """Write the thumbnail; False when `target` cannot be written, `_Unreadable` when `source` cannot be read."""
    try:
        data = read_image_file(source, image_root)
        with Image.open(io.BytesIO(data)) as im:
            im.draft("RGB", (side, side))  # JPEG sources decode at a reduced scale: much faster
            im = im.convert("RGB")
            im.thumbnail((side, side), Image.Resampling.BILINEAR, reducing_gap=2.0)
    except (SampleError, OSError, ValueError, Image.DecompressionBombError) as exc:
        raise _Unreadable(source) from exc
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(f"{target.stem}.{os.getpid()}.{id(im)}.part")
        im.save(partial, "JPEG", quality=QUALITY, optimize=False)
        os.replace(partial, target)  # never leave a half-written thumbnail under its final name
        return True
    except OSError:
        return False


def _link(cached: Path, target: Path) -> bool:
    """Put the cached thumbnail at `target`: a hard link where the file system allows, else a copy."""
    try:
        os.link(cached, target)
        return True
    except FileExistsError:
        return True
    except OSError:
        try:
            partial = target.with_name(f"{target.name}.{os.getpid()}.part")
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
            cached = _cached(cache, target.name)
            if (cached.exists() or _encode(source, cached, side, image_root)) and _link(cached, target):
                return True
        return _encode(source, target, side, image_root)  # no cache, or it cannot be written: the run folder still gets one
    except _Unreadable:
        return False


def make_thumbnails(sources: Iterable[str], folder: Path, *, side: int = THUMB_SIDE, cache: Path | None = None,
                    progress: bool = False, image_root: str | Path | None = None) -> dict[str, str | None]:
    """{source path: thumbnail file name in `folder`, or None when the source is missing, unreadable or
    outside `image_root`}. With `cache` (a store's thumbnail folder), thumbnails made before are linked
    rather than made."""
    from tqdm.auto import tqdm

    folder.mkdir(parents=True, exist_ok=True)
    unique = list(dict.fromkeys(sources))
    targets = {src: _name(src) for src in unique if allowed(src, image_root)}
    # those already in the folder (a report rendered again, a run's writer) need no job at all
    written = {src: name for src, name in targets.items() if name and (folder / name).exists()}
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
    recons = [v for k, v in record.items() if "reconstruction" in k and isinstance(v, str) and v]
    return (resolve(original, run) if original else None), [resolve(p, run) for p in recons]


class ThumbnailWriter:
    """Makes the thumbnails of a run's rows while the run works.

    `add(rows)` only queues the rows' pictures (those already queued are skipped) and
    returns at once. A feeder thread links the thumbnails the cache already holds into the
    run folder, and hands the others to a helper process (this file run as a script, fed
    paths through a pipe, started at the first thumbnail the cache lacks), so decoding and
    encoding never compete with the run's models for the interpreter lock; where no process
    can be started, to a thread. `close()` waits for the queue. A thumbnail that could not
    be made is left for the report, which tries again. Originals outside `image_root` are
    never queued."""

    def __init__(self, run: Path, folder: Path, *, cache: Path | None = None, side: int = THUMB_SIDE,
                 image_root: str | Path | None = None):
        self.run, self.folder, self.cache, self.side = run, folder, cache, side
        self.image_root = str(image_root) if image_root is not None else None
        self.folder.mkdir(parents=True, exist_ok=True)
        self._seen: set[str] = set()
        self._queue: queue.SimpleQueue[list[tuple[str, str | None]] | None] = queue.SimpleQueue()
        self._proc: subprocess.Popen | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._pending: list[Future] = []
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

    def _feed(self) -> None:
        while (paths := self._queue.get()) is not None:
            if self._stopping:
                continue  # stopped: what is queued is dropped
            misses = [(p, name, root) for p, root in paths
                      if (name := _name(p)) and not self._linked_from_cache(name)]
            if misses:
                self._make_elsewhere(misses)
        if self._proc is not None:
            try:
                self._proc.stdin.close()
            except OSError:
                pass

    def _linked_from_cache(self, name: str) -> bool:
        """Put a thumbnail the cache already holds into the run folder (a link costs microseconds)."""
        if self.cache is None:
            return False
        target, cached = self.folder / name, _cached(self.cache, name)
        return target.exists() or (cached.exists() and _link(cached, target))

    def _make_elsewhere(self, jobs: list[tuple[str, str, str | None]]) -> None:
        """Make the thumbnails of (source, name, image root) `jobs` in the helper process (or thread)."""
        if self._proc is None and self._pool is None:
            self._proc = _start_worker()
            if self._proc is None:
                self._pool = ThreadPoolExecutor(1, thread_name_prefix="caprecon-thumbs")
        if self._pool is not None:
            self._pending = [f for f in self._pending if not f.done()]
            self._pending.append(self._pool.submit(_make, jobs, self.folder, self.side, self.cache))
            return
        cache = str(self.cache) if self.cache else None
        lines = "".join(json.dumps({"source": source, "name": name, "folder": str(self.folder), "side": self.side,
                                    "cache": cache, "root": root}) + "\n" for source, name, root in jobs)
        try:
            self._proc.stdin.write(lines)  # a full pipe blocks this thread, not the run
            self._proc.stdin.flush()
        except (BrokenPipeError, OSError, ValueError):  # the helper died: the report makes the rest
            pass

    def close(self, *, wait: bool = True) -> None:
        """Wait for the queued thumbnails (`wait=False`: stop at once, e.g. on Ctrl-C)."""
        if not wait:
            self._stopping = True
            if self._proc is not None:
                self._proc.kill()
        self._queue.put(None)
        self._feeder.join()
        if self._pool is not None:
            self._pool.shutdown(wait=wait, cancel_futures=not wait)
            for future in self._pending:
                if future.done() and not future.cancelled() and future.exception() is not None:
                    log.debug("thumbnails: %s", future.exception())
        if self._proc is not None:
            try:
                self._proc.wait(timeout=None if wait else 5)
            except subprocess.TimeoutExpired:
                self._proc.kill()


def _make(jobs: Iterable[tuple[str, str, str | None]], folder: Path, side: int, cache: Path | None) -> int:
    """Write the thumbnail of each (source, name, image root) into `folder`; how many there are now."""
    return sum(_write(source, folder / name, side, cache, root) for source, name, root in jobs)


def _start_worker() -> subprocess.Popen | None:
    """The helper process that makes thumbnails, or None where one cannot be started."""
    # this file run as a script: it imports PIL and caprecon's image reader (a fraction of a second)
    try:
        return subprocess.Popen([sys.executable, str(Path(__file__).resolve())], stdin=subprocess.PIPE,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True)
    except (OSError, ValueError) as exc:
        log.debug("no thumbnail helper process (%s); making thumbnails in a thread", exc)
        return None


def _serve(lines: Iterable[str]) -> None:
    """The helper process: one JSON job per line ({source, name, folder, side, cache, root}), until end of input."""
    for line in lines:
        try:
            job = json.loads(line)
            _make([(job["source"], job["name"], job.get("root"))], Path(job["folder"]), int(job["side"]),
                  Path(job["cache"]) if job["cache"] else None)
        except (ValueError, KeyError, TypeError, OSError):
            continue


if __name__ == "__main__":
    _serve(sys.stdin)
