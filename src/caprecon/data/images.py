"""Opening a sample's image: confined to --image-root, read and hashed once, decoded only when
the pixels are needed, and turned into 8-bit RGB as a person would see it.

Every problem with one row's image is a `SampleError` naming it (missing, unreadable,
outside the root, not a regular file, too large, not decodable), so it becomes that row's
error and the run goes on.

`read_image_file` is the one way anything in caprecon reads an image file (scoring, the
report's thumbnails, CTTD, the suites, question import): whatever it refuses, nothing opens.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import io
import os
import stat
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Callable

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from caprecon.core.digests import known_digest, remember_digest
from caprecon.data.samples import Sample, SampleError, has_image, text_problem

# the most bytes an image file may hold: ten times a large camera photo, far below what
# exhausts memory (an endless device or a huge file stops here, as that row's error)
MAX_IMAGE_BYTES = 64 * 2**20


class LoadedSample:
    """A sample whose image has been read: what metrics work on.

    `image_key` is the content hash of the pixels' source (the file's bytes), for caches.
    The pixels are decoded on first use of `image`: a run whose results are all cached
    hashes the files and never decodes them. `size` is known without decoding when the
    executor has seen the same bytes decode before (`known_size`). A caption-only sample
    (no image, and no metric of the run needs one) has `image` None and an empty key."""

    def __init__(self, sample: Sample, image: Image.Image | None = None, image_key: str = "", *,
                 data: bytes | None = None, what: str = "", known_size: tuple[int, int] | None = None,
                 reader: Callable[[], bytes] | None = None):
        self.sample, self.image_key = sample, image_key
        self._image, self._data, self._what, self._size = image, data, what, known_size
        self._reader = reader  # the file's bytes, read only when the pixels are wanted (its key was remembered)
        self.from_bytes = data is not None or reader is not None  # decoded from a file's (or row's) bytes, on demand
        self.size_known = known_size is not None  # the size came from an earlier decode of the same bytes
        #: (length, first 8 bytes) of the bytes the pixels were decoded from, once decoded: a
        #: report thumbnail needs no more to know whether the file can be shown as it is
        self.bytes_head: tuple[int, bytes] | None = None

    @property
    def image(self) -> Image.Image | None:
        if self._image is None and self._data is None and self._reader is not None:
            self._data, self._reader = self._reader(), None
        if self._image is None and self._data is not None:
            self._image = decode_bytes(self._data, self._what)
            self.bytes_head = file_head(self._data)
            self._data = None  # the pixels replace the bytes
        return self._image

    @property
    def decoded(self) -> bool:
        return self._data is None and self._reader is None

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

    def with_caption(self, caption: str) -> "LoadedSample":
        """The same picture (and image id and candidate, so the same seeds) under another
        caption: how a reference is reconstructed beside the caption it is a yardstick for."""
        twin = copy.copy(self)
        twin.sample = dataclasses.replace(self.sample, caption=caption, refs=[])
        return twin

    def __repr__(self) -> str:
        return f"LoadedSample(id={self.id!r}, image_key={self.image_key[:12]!r}, decoded={self.decoded})"


def open_image(sample: Sample, *, caption_only: bool = False) -> LoadedSample:
    """Open a sample's image as RGB; raise `SampleError` naming what is wrong.

    With `caption_only`, a sample without an image is valid and comes back with none."""
    item = read_image(sample, caption_only=caption_only)
    item.image  # noqa: B018 -- decode now, so a broken file is this row's error here
    return item


def read_image(sample: Sample, *, caption_only: bool = False, later: bool = False,
               folders: Folders | None = None) -> LoadedSample | Callable[[], LoadedSample]:
    """Like `open_image`, but a file's pixels are only decoded when first used: the bytes are
    read and hashed (a missing or unreadable file is still a `SampleError` here).

    With `later`, the work beyond a stat comes back undone, as a call that does it: hashing a
    picture given in memory or as bytes, reading and hashing a file whose digest is not
    remembered. A run makes the stats in line and hands only those calls to its reading threads.
    `folders`: the real paths of folders resolved before (`Folders`), for a batch of files."""
    if not isinstance(sample.caption, str):
        raise SampleError(f"caption is a {type(sample.caption).__name__}, not text: {sample.caption!r:.60}",
                          "caption not text")
    if not sample.caption.strip():
        raise SampleError("empty caption", "empty caption")
    if problem := text_problem(sample):
        raise SampleError(problem, "text not valid Unicode")
    if not has_image(sample):
        if caption_only:
            return LoadedSample(sample, None, "")
        raise SampleError("no image given", "no image")
    src = sample.image
    if later and not isinstance(src, (str, Path)):
        return partial(read_image, sample, caption_only=caption_only)
    if isinstance(src, Image.Image):
        image = decode_image(src, "the image given")
        return LoadedSample(sample, image, pixels_key(image))
    if isinstance(src, (bytes, bytearray)):  # embedded in a parquet or datasets row
        return LoadedSample(sample, image_key=hashlib.sha256(src).hexdigest(), data=bytes(src),
                            what="the embedded image")
    path = Path(src)
    key, hash_file = file_key(path, sample.image_root, max_bytes=sample.max_image_bytes, folders=folders,
                              root_option=sample.image_root_option, memo_later=later)
    if hash_file is None:
        return _file_sample(sample, path, key, None)
    if later:
        return lambda: _file_sample(sample, path, *hash_file())
    return _file_sample(sample, path, *hash_file())


def _file_sample(sample: Sample, path: Path, key: str, data: bytes | None) -> LoadedSample:
    """The sample of an image file, its bytes in hand (read for its key) or read when needed."""
    reader = None if data is not None else \
        (lambda: read_image_file(path, sample.image_root, max_bytes=sample.max_image_bytes,
                                 root_option=sample.image_root_option))
    return LoadedSample(sample, image_key=key, data=data, reader=reader, what=f"image {path}")


def image_file_key(path: str | Path, image_root: str | Path | None = None, *, max_bytes: int | None = None,
                   root_option: str = "--image-root") -> tuple[str, bytes | None]:
    """The content key (sha256) of the image file at `path`, and its bytes when they had to be
    read for it: a file hashed before with the same size and modification time is not read
    again (`caprecon.core.digests`), nor even opened (a stat tells), so a cached run of a
    thousand photos reads none. The checks are `read_image_file`'s, made before either answer
    (a file whose stat shows anything amiss is opened, and the open names the problem)."""
    key, hash_file = file_key(path, image_root, max_bytes=max_bytes, root_option=root_option)
    return (key, None) if hash_file is None else hash_file()


class Folders:
    """The real paths of folders, each resolved once: the files of a batch mostly share one
    folder, and resolving a path costs a system call per component (`lstat`), each of which
    lets another thread take the interpreter from the one running the models. Kept for one
    batch, so a folder swapped for a link later is seen by the next."""

    def __init__(self) -> None:
        self._real: dict[str, str] = {}

    def real_file(self, path: Path) -> tuple[str, os.stat_result | None]:
        """`path` resolved as `Path.resolve` does, and the stat of the file it names (None when
        it cannot be looked at): one `lstat` for a file that is not a link, in a folder seen before."""
        name = path.name
        try:
            info = os.lstat(path)
        except OSError:
            info = None
        if info is None or stat.S_ISLNK(info.st_mode) or name in ("", ".", ".."):
            try:
                info = os.stat(path)
            except OSError:
                info = None
            return str(path.resolve()), info
        folder = os.path.dirname(path) or "."
        real = self._real.get(folder)
        if real is None:
            real = self._real[folder] = str(Path(folder).resolve())
        return os.path.join(real, name), info


def file_key(path: str | Path, image_root: str | Path | None = None, *, max_bytes: int | None = None,
             root_option: str = "--image-root", folders: Folders | None = None, memo_later: bool = False,
             ) -> tuple[str, None] | tuple[None, Callable[[], tuple[str, bytes | None]]]:
    """`image_file_key` in two steps: (the key, None) when a stat gives it (the file's digest is
    remembered for its size and time: nothing is opened); else (None, the call that opens, reads
    and hashes the file, and returns the key and bytes). The path's checks are made first.
    `folders`: folders resolved before (a batch's files share them). `memo_later`: the digest goes
    into the memo file at the next `caprecon.core.digests.write_remembered`, with the batch's others."""
    path = Path(path)
    limit = _checked(path, image_root, max_bytes, root_option)
    # missing, or cannot be looked at: info None, and the open says which
    real, info = (folders or Folders()).real_file(path)
    seen = None
    if info is not None and stat.S_ISREG(info.st_mode) and info.st_size <= limit:
        seen = (real, info.st_size, info.st_mtime_ns)
        key = known_digest(seen)
        if key is not None:
            return key, None
    return None, partial(_hash_file, path, real, seen, limit, memo_later)


def _hash_file(path: Path, real: str, seen: tuple[str, int, int] | None, limit: int,
               memo_later: bool = False) -> tuple[str, bytes | None]:
    """Open, read and hash the file `file_key` found no digest for by its stat (`seen`: the identity
    it asked for); the bytes come back with the key, or none when the opened file proves to be a
    remembered one after all (it changed since the stat)."""
    with _open_checked(path, limit) as (fd, info):
        ident = (real, info.st_size, info.st_mtime_ns)
        key = known_digest(ident) if ident != seen else None  # asked already when the file is the one stat saw
        if key is not None:
            return key, None
        data = _read_limited(fd, path, limit, info.st_size)
    key = hashlib.sha256(data).hexdigest()
    remember_digest(ident, key, later=memo_later)
    return key, data


def read_image_file(path: str | Path, image_root: str | Path | None = None, *, max_bytes: int | None = None,
                    root_option: str = "--image-root") -> bytes:
    """The bytes of the image file at `path`; a `SampleError` naming the problem when it lies
    outside `image_root` (by `..`, an absolute path or a symbolic link), its name holds a NUL or a
    lone surrogate (no file system takes either), it is missing, is not a regular file (a FIFO would
    block for ever, /dev/zero never ends) or holds more than `max_bytes` (default `MAX_IMAGE_BYTES`).
    `root_option`: the option that set `image_root`, as the message names it (`caprecon caption`
    confines reads to its `--images` folder)."""
    with _open_image_file(Path(path), image_root, max_bytes, root_option) as (fd, info, limit):
        return _read_limited(fd, path, limit, info.st_size)


@contextmanager
def _open_image_file(path: Path, image_root: str | Path | None, max_bytes: int | None,
                     root_option: str = "--image-root"):
    """The open file's descriptor (with its fstat and byte limit), once every check has passed."""
    limit = _checked(path, image_root, max_bytes, root_option)
    with _open_checked(path, limit) as (fd, info):
        yield fd, info, limit


@contextmanager
def _open_checked(path: Path, limit: int):
    """The open file's descriptor and its fstat, once the file's own checks have passed (its path's are
    `_checked`). A bare descriptor, read by `_read_limited`: a buffered file object around it cost five
    system calls more a file (another fstat, a seek, a terminal check, the bytes read in two pieces and
    a read past the end), each of which lets a reading thread take the interpreter from the models'."""
    try:
        # non-blocking, so a FIFO opens at once (and is refused below) instead of waiting for a writer
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        raise SampleError(f"image not found: {path}", "image not found") from None
    except OSError as exc:
        raise SampleError(f"cannot read image {path}: {exc}", "image unreadable") from None
    try:
        info = os.fstat(fd)  # of what was opened, so a file swapped in after a check cannot slip by
        if not stat.S_ISREG(info.st_mode):
            raise SampleError(f"cannot read image {path}: not a regular file ({_kind(info.st_mode)})",
                              "image unreadable")
        if info.st_size > limit:
            raise SampleError(f"image {path} holds {info.st_size} bytes, over the limit of {limit} "
                              f"(--max-image-bytes)", "image too large")
        yield fd, info
    finally:
        os.close(fd)


def path_refusal(sample: Sample) -> str | None:
    """Why the image file `sample` names would be refused by its path alone (outside the sample's
    `image_root`, a NUL or a lone surrogate in the name), or None: the check `read_image` makes before opening it,
    for a caller that reports refused rows before any scoring."""
    if not isinstance(sample.image, (str, Path)) or not has_image(sample):
        return None
    try:
        _checked(Path(sample.image), sample.image_root, sample.max_image_bytes, sample.image_root_option)
    except SampleError as exc:
        return str(exc)
    return None


def _checked(path: Path, image_root: str | Path | None, max_bytes: int | None, root_option: str) -> int:
    """The checks of the path itself (before any file is looked at); the byte limit."""
    if "\x00" in str(path):  # no file system takes it, and the OS calls below would raise ValueError
        raise SampleError(f"image path contains a NUL character: {str(path)!r}", "image path invalid")
    if not str(path).isascii():  # an ASCII name (most) encodes as it is: no further look
        _check_encodable(str(path))
    if image_root is not None and not inside(path, Path(image_root)):
        raise SampleError(f"image {path} lies outside {root_option} {image_root}", f"image outside {root_option}")
    return max_bytes or MAX_IMAGE_BYTES


def _check_encodable(name: str) -> None:
    """A `SampleError` for a path the file system cannot be asked about: a lone surrogate that
    `surrogateescape` does not stand for a byte (a JSON escape "\\ud800" puts one in a string), on
    which every OS call would raise `UnicodeEncodeError` instead of naming the problem."""
    try:
        os.fsencode(name)
    except UnicodeEncodeError as exc:
        raise SampleError(f"image path {name!r} holds a lone surrogate ({name[exc.start]!r}) at character "
                          f"{exc.start}, which no file name can hold: the input's encoding is broken",
                          "image path invalid") from None


def _read_limited(fd: int, path, limit: int, size: int) -> bytes:
    """The bytes of the open file `fd`, `size` long by its fstat; a `SampleError` past `limit`."""
    try:
        # one byte past the size fstat gave shows a file that grew since. A regular file answers a
        # read with all it holds up to what is asked, so one read that brings exactly `size` bytes is
        # the whole file; any other length (grown, shrunk, a short read as /proc's files give) is read
        # on to its end, up to the limit. Asking for limit + 1 bytes at once made Python allocate (and
        # the kernel map and unmap) 64 MB for every photo: 0.11 ms against 0.02 ms a 47 KB JPEG
        data = os.read(fd, min(size, limit) + 1)
        if len(data) != size:
            parts, got = [data], len(data)
            while data and got <= limit:  # a file growing while read stops at the limit too
                data = os.read(fd, limit + 1 - got)
                parts.append(data)
                got += len(data)
            data = b"".join(parts)
    except OSError as exc:
        raise SampleError(f"cannot read image {path}: {exc}", "image unreadable") from None
    if len(data) > limit:
        raise SampleError(f"image {path} holds over {limit} bytes (--max-image-bytes)", "image too large")
    return data


def _kind(mode: int) -> str:
    for test, kind in ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a named pipe"), (stat.S_ISCHR, "a device"),
                       (stat.S_ISBLK, "a device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return kind
    return "not a file"


def inside(path: Path, root: Path) -> bool:
    # resolve both, so neither `..` nor a symbolic link leads out of the folder
    return path.resolve().is_relative_to(root.resolve())


def file_head(data: bytes) -> tuple[int, bytes]:
    """(length, first 8 bytes) of a picture file's bytes: what a report thumbnail needs to know
    whether the file can be shown as it is (`caprecon.store.thumbs`), without reading it again."""
    return len(data), data[:8]


def decode_bytes(data: bytes, what: str) -> Image.Image:
    try:
        im = Image.open(io.BytesIO(data))
        try:
            im.load()  # every pixel now, so a truncated file is this call's error, not a later one's
        except Exception as exc:
            raise SampleError(f"cannot decode {what}: {exc}", "image not decodable") from None
        # the picture is this call's own: turned upright and made RGB in place, where copying
        # it twice (once upright, once as RGB) cost as much as decoding a 320x240 JPEG again
        ImageOps.exif_transpose(im, in_place=True)
        return to_rgb(im, copy=False)
    except SampleError:
        raise
    except UnidentifiedImageError:  # its message names only the in-memory buffer
        raise SampleError(f"cannot decode {what}: not in any image format PIL reads", "image not decodable") from None
    except Exception as exc:  # PIL raises several types for corrupt files
        raise SampleError(f"cannot decode {what}: {exc}", "image not decodable") from None


def pixels_key(image: Image.Image) -> str:
    """The content key of a picture given in memory (decoded, as `decode_image` leaves it): its
    pixels and size, since it has no file bytes to hash."""
    return hashlib.sha256(image.tobytes() + repr(image.size).encode()).hexdigest()


def decode_image(im: Image.Image, what: str) -> Image.Image:
    """An upright 8-bit RGB copy of `im` (the caller's picture is left as it was)."""
    try:
        return to_rgb(ImageOps.exif_transpose(im), copy=False)  # exif_transpose already made a copy
    except Exception as exc:  # truncated data shows only when the pixels are read
        raise SampleError(f"cannot decode {what}: {exc}", "image not decodable") from None


def to_rgb(im: Image.Image, *, copy: bool = True) -> Image.Image:
    """8-bit RGB, as a person would see the image (with `copy=False`, an RGB `im` itself).

    PIL's own `convert("RGB")` clips deep integer and float images (a 16-bit PNG turns
    white) and drops transparency (revealing whatever colour hides under it); here deep
    images are scaled to 0-255 and transparent pixels are laid over white.
    """
    if im.mode == "RGB":
        return im.copy() if copy else im
    if im.mode.startswith("I;16"):  # 16 bits whatever the values: 65535 -> 255
        return Image.fromarray(np.round(np.asarray(im, dtype=np.float64) / 257.0).astype(np.uint8), "L").convert("RGB")
    if im.mode in ("I", "F"):
        return Image.fromarray(to_8bit(np.asarray(im), floating=im.mode == "F"), "L").convert("RGB")
    if im.mode == "P" and "transparency" in im.info:
        im = im.convert("RGBA")
    if im.mode in ("RGBA", "LA", "PA", "RGBa", "La"):
        rgba = im.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(background, rgba).convert("RGB")
    return im.convert("RGB")


def to_8bit(values: np.ndarray, *, floating: bool) -> np.ndarray:
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
