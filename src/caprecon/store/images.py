"""The store's picture files: how a reconstruction is encoded (`PNG_SAVE`), where its file lies
(`images/ab/abcd....png`, each folder made by the first picture filed in it), reading one back only when its
bytes match the recorded checksum (`read_verified`), and the part of `Store` that writes and finds
images with their records (`ImageFiles`), keeping only the records under `keep="vectors"`."""

from __future__ import annotations

import io
import json
import logging
import os
import re
import zlib
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from PIL import Image

from caprecon.core.paths import write_file
from caprecon.core.records import json_text
from caprecon.data.images import file_head
from caprecon.store.sql import sha256

log = logging.getLogger(__name__)

#: the kind of an image's index row when its picture was not kept (`keep="vectors"`): "reconstruction-record"
RECORD_ONLY = "-record"

#: how the store encodes a reconstruction (`PIL.Image.save` options; benchmarks/encoding.py and
#: throughput.py save with the same). zlib level 1 with the run-length strategy (Z_RLE) on PNG's
#: filtered rows: on photos at 512-1024 px, a fifth of the default level's encode time for as
#: many bytes, and a fifth faster than level 1's default strategy with a tenth fewer bytes.
#: Lossless WebP measured faster still, but PNG keeps the store's files what every reader of it
#: (cache verify, merge, HTML report) already expects
PNG_SAVE: dict[str, Any] = {"format": "PNG", "compress_level": 1, "compress_type": zlib.Z_RLE}

#: a key that can name a picture file: one file name, not hidden (the store's own keys are sha256 hex digests)
FILE_KEY = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")

#: what `Store.thumbnails` is handed: {file path: (pixels, (file length, first 8 bytes) or None)}
Pictures = dict[str, tuple[Image.Image, tuple[int, bytes] | None]]


def _png_bytes(image: Image.Image) -> bytes:
    buf = io.BytesIO()
    image.save(buf, **PNG_SAVE)
    return buf.getvalue()


def key_problem(key: Any) -> str | None:
    """Why `key` cannot name a picture file under images/ (None when it can): it must be one file
    name of letters, digits, `_`, `-` and `.`, not starting with a dot. A key read from an index
    written elsewhere (a shard's store being merged, a cache shared with others) must not lead
    verify, prune or merge to read, copy or delete a file outside the cache ("../../x")."""
    if isinstance(key, str) and FILE_KEY.fullmatch(key):
        return None
    return f"the key {key!r} cannot name a picture file (one name of letters, digits, _, - and ., not starting with .)"


def read_verified(path: Path, checksum: str | None) -> Image.Image | None:
    """The image at `path` if its bytes match `checksum` (or, for entries stored before
    checksums, if it decodes completely); None when it is missing or damaged."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    if checksum is not None and sha256(data) != checksum:
        return None
    try:
        with Image.open(io.BytesIO(data)) as im:
            return im.convert("RGB")
    except (OSError, SyntaxError, ValueError):
        return None


class ImageFiles:
    """The part of `caprecon.store.index.Store` that writes pictures with their records and finds
    them again. It works through the front's index (`_put`, `_rows`, `_guard`, `_register_model`),
    its writer (`_behind`, `flush_images`) and its claims (`release`)."""

    def __init__(self) -> None:
        super().__init__()
        #: while a run makes a report: handed {file path: (pixels, (file length, first 8 bytes))} of
        #: each picture whose pixels are in memory (the images written here, the sources
        #: `put_thumbnails` is given), to make its thumbnail from them without reading the file
        #: again (`caprecon.store.thumbs.ThumbnailWriter`)
        self.thumbnails: Callable[[Pictures], None] | None = None

    def image_path(self, key: str) -> Path:
        """The picture file of `key`; a `ValueError` for a key that could lead out of images/ (`key_problem`)."""
        problem = key_problem(key)
        if problem:
            raise ValueError(f"{self.root}: {problem}")
        return self.root / "images" / key[:2] / f"{key}.png"

    def put_images(self, kind: str, items: dict[str, tuple[Image.Image, dict[str, Any]]],
                   model: Any = None, *, release: Iterable[str] = ()) -> dict[str, tuple[dict[str, Any], Path, str | None]]:
        """Images with their JSON records; each file's checksum and size go into the index, and
        the claims on `release` are dropped once they are written. Returns what `get_images`
        would: (record, path, file checksum) by key — with `write_behind`, the write is queued
        and the checksum is None (the caller keeps the pixels it gave)."""
        self._require_writable()
        release = list(release)
        if self.keep != "images":
            return self._put_records(kind, items, model, release)
        if not self.write_behind:
            return self._guard(self._write_images, kind, items, model, release)
        fingerprint = self._register_model(model)
        self._behind(self._write_images, kind, items, fingerprint, release, images=items)
        return {key: (record, self.image_path(key), None) for key, (_, record) in items.items()}

    def _write_images(self, kind: str, items: dict[str, tuple[Image.Image, dict[str, Any]]], model: Any,
                      release: list[str]) -> dict[str, tuple[dict[str, Any], Path, str]]:
        try:
            rows, stored, written = [], {}, {}
            for key, (image, record) in items.items():
                data = _png_bytes(image)
                path = self.image_path(key)
                partial = path.with_suffix(f".{os.getpid()}.part")
                # its folder is made when the open finds it missing: the first picture filed there. A fresh
                # cache that made all 256 when it opened made ~100 more than 256 pictures need, at
                # 0.07-0.35 ms of kernel CPU each here (ext4 without a journal), where a failed open costs µs
                write_file(partial, data)
                os.replace(partial, path)  # a crash never leaves a half-written image under the key
                written[str(path)] = (image, file_head(data))
                digest = sha256(data)
                rows.append((key, kind, json_text(record).encode("utf-8"),
                             {"file_checksum": digest, "file_size": len(data)}))
                stored[key] = (record, path, digest)
            # the claims go in the rows' transaction: whoever waits on them finds the images there
            self._put(rows, model, on_writer=self.write_behind, release=release)
        except BaseException:
            if release:  # not written: the claims go all the same, so others may generate them
                self.release(release)
            raise
        self.put_thumbnails(written)
        return stored

    def _put_records(self, kind: str, items: dict[str, tuple[Image.Image, dict[str, Any]]], model: Any,
                     release: list[str]) -> dict[str, tuple[dict[str, Any], None, None]]:
        """Under `keep="vectors"`, each image's record without its picture (kind + `RECORD_ONLY`);
        under `keep="none"`, nothing. Either way no file: the path and checksum returned are None.
        As with pictures, the claims on `release` go in the transaction that writes the records, except
        inside `keeping_claims`, where they stay held until what is computed from the pictures is written."""
        rows = [(key, kind + RECORD_ONLY, json_text(record).encode("utf-8"), {})
                for key, (_, record) in items.items()]
        with_rows = [] if self.keep == "vectors" and self._keep_past_write(release) else release

        def write(fingerprint: Any) -> None:
            try:
                self._put(rows, fingerprint, on_writer=self.write_behind, release=with_rows)
            except BaseException:
                if release:  # not written: the claims go all the same, so others may generate them
                    self.release(release)
                raise

        if self.write_behind:
            self._behind(write, self._register_model(model), images=items)
        else:
            self._guard(write, model)
        return {key: (record, None, None) for key, (_, record) in items.items()}

    def put_thumbnails(self, images: Mapping[str, tuple[Image.Image, tuple[int, bytes] | None]]) -> None:
        """Hand pictures whose pixels are in memory, by their file's path, to `thumbnails`: each
        with the length and first 8 bytes of the file it came from or went to, when known."""
        sink = self.thumbnails
        if sink is not None and images:
            sink(dict(images))

    def get_images(self, keys: list[str], *, verify: bool = False,
                   records: bool = False) -> dict[str, tuple[dict[str, Any], Path | None, str | None]]:
        """(record, path, file checksum) of each stored image whose file is present at its
        recorded size, and with `verify` also matches its checksum. Without `verify` the
        full check waits until the file is read (`read_verified`), so a run that needs no
        pixels reads none. Images this store is still writing (`write_behind`) are waited for.
        With `records`, an image whose picture was not kept (`keep="vectors"`) is found too, as
        (record, None, None): what was computed from it may be in the store, the picture is not. Not
        while another process still claims it (`keeping_claims`): what it computes from the picture
        may not be written yet, and whoever finds the record alone would make the picture again."""
        if self._images_pending:  # only the writes of the images asked for are waited for
            self.flush_images(keys)
        found: dict[str, tuple[dict[str, Any], Path | None, str | None]] = {}
        records_only = []
        for key, kind, value, checksum, file_checksum, file_size in self._rows(
                keys, "key, kind, value, checksum, file_checksum, file_size"):
            if kind.endswith(RECORD_ONLY):
                if records and (checksum is None or sha256(value) == checksum):
                    found[key] = (json.loads(value), None, None)
                    records_only.append(key)
                continue
            path = self.image_path(key)
            try:
                size = path.stat().st_size
            except FileNotFoundError:
                size = None
            bad_value = checksum is not None and sha256(value) != checksum
            bad_file = size is not None and ((file_size is not None and size != file_size)
                                             or (verify and read_verified(path, file_checksum) is None))
            if size is None or bad_value or bad_file:
                log.warning("cached image %s is %s; it will be generated again", path,
                            "missing" if size is None else "damaged")
                self.damaged += 1
                continue
            found[key] = (json.loads(value), path, file_checksum)
        for key in self.claimed_elsewhere(records_only):
            del found[key]
        if self.below is not None:
            rest = [k for k in keys if k not in found]
            if rest:
                found.update(self.below.get_images(rest, verify=verify, records=records))
        return found
