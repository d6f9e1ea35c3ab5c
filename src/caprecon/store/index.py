"""The content-addressed cache: a SQLite (WAL) index plus image files on disk.

Every deterministic model result (an image generated at a fixed seed, an embedding, a
greedy or log-probability judge answer) is stored under a key that hashes everything
that determines it. A second run, a run that adds a metric, or a run resumed after a
crash finds those results and recomputes nothing.

Layout under the root::

    index.sqlite          results: key -> kind, value (JSON or .npy bytes), created,
                          checksums of the value and of the file, the model's fingerprint;
                          models: fingerprint -> description; claims: key -> owner, expiry
    images/ab/abcd....png reconstructed images, named by their key

What is kept is the store's `keep` policy: `images` (everything, the default), `vectors` (every
value and each image's record, but no picture file nor folder: an image asked for again is made again, while
what was computed from it, an embedding or a judge's answer, is found), or `none` (nothing is
written; results live as long as the process that computed them). `max_size` caps the bytes the
store holds: past it, the oldest entries are deleted (`Store.enforce_cap`).

Nothing is trusted blindly: values and files carry a sha256 checked when read, and an
entry that fails the check counts as missing, so it is computed again, never scored.
Processes sharing a cache claim the items they generate (a lease that the holder renews
and that expires when it dies), so one item is generated once. A cache that cannot be
written (a shared, pre-filled one) is read as it is, with new results going to a
writable overlay store laid over it.

`Store` is the one front; its parts live beside it: the tables and shared SQL in `sql`, the
picture files in `images`, the queued writes in `writer`, the claims in `leases`, the size cap
in `cap`, the errors in `errors`. This module holds the store's opening, its modes (read-only,
frozen, overlay), its connections and the reading and writing of values.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import shutil
import socket
import sqlite3
import tempfile
import threading
import time
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Sequence

import numpy as np

from caprecon.core.checks import check_count
from caprecon.core.errors import ConfigError
from caprecon.core.records import json_text, unicode_problem
from caprecon.core.transactions import transaction
from caprecon.store import sql
from caprecon.store.cap import SizeCap
from caprecon.store.errors import StoreCorruptError, StoreFullError, StoreReadOnlyError, corrupt_message, full_disk
from caprecon.store.images import ImageFiles
from caprecon.store.leases import LEASE_SECONDS, Leases
from caprecon.store.sql import sha256
from caprecon.store.writer import WriteBehind

log = logging.getLogger(__name__)

INDEX = "index.sqlite"

#: what a store keeps (see the module's docstring)
KEEP_POLICIES = ("images", "vectors", "none")


def check_policy(keep: str, max_size: int | None) -> None:
    """A keep policy and size cap a store takes, else a `ConfigError` naming the option."""
    if keep not in KEEP_POLICIES:
        raise ConfigError(f"--keep must be one of {', '.join(KEEP_POLICIES)}, not {keep!r}")
    if max_size is not None:
        check_count("--cache-max-size", max_size, 1, 10**18)


#: the JSON a content key hashes (`json.dumps` with these options makes a new encoder on every call: a
#: run keys each sample three or four times, and the same text comes out either way)
_KEY_JSON = json.JSONEncoder(sort_keys=True, ensure_ascii=False, default=str)


def content_key(kind: str, **parts: Any) -> str:
    """Stable hash of a result's kind and every input that determines it. A text that is not valid
    Unicode (a lone surrogate, which a JSON escape or `surrogateescape` lets into a Python string)
    has no UTF-8 to hash: a `ValueError` names its field (`caption`, `request.messages[1]`), so a
    caller that passed one straight to a metric or the store learns which input is broken."""
    fields = {"kind": kind, **parts}
    blob = _KEY_JSON.encode(fields)
    try:
        data = blob.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"cannot key a {kind!r} result: {_broken_field(fields, '')}") from None
    return hashlib.sha256(data).hexdigest()


def _broken_field(value: Any, field: str) -> str | None:
    """The first field of `value` (named from `field` down) whose text is not valid Unicode, and
    why; None when every text is. Walks what `content_key` dumps: mappings (their names too),
    lists and tuples, and anything else as the text JSON's `default=str` makes of it."""
    if isinstance(value, Mapping):
        for name, item in value.items():
            label = f"{field}.{name}" if field else str(name)
            if isinstance(name, str) and (problem := unicode_problem(name)):
                return f"the name of a field of {field or 'the key'} {problem}"
            if found := _broken_field(item, label):
                return found
        return None
    if isinstance(value, (list, tuple)):
        return next((found for i, item in enumerate(value) if (found := _broken_field(item, f"{field}[{i}]"))), None)
    if value is None or isinstance(value, (bool, int, float)):
        return None
    problem = unicode_problem(value if isinstance(value, str) else str(value))
    return f"{field} {problem}" if problem else None


def is_writable(folder: Path) -> bool:
    """Whether results can be written under `folder`. A folder with no write permission bit
    counts as read-only even for root (who could write anyway): that is what its owner meant."""
    probe_at = folder if folder.exists() else next((p for p in folder.parents if p.exists()), None)
    if probe_at is None or not probe_at.stat().st_mode & 0o222:
        return False
    index = folder / INDEX
    if index.exists() and not index.stat().st_mode & 0o222:
        return False
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".write-probe-"):
            pass
    except OSError:
        return False
    return True


class Store(ImageFiles, WriteBehind, Leases, SizeCap):
    """Content-addressed results on disk. `Store.temporary()` gives one that vanishes.

    `read_only`: None detects it (see `is_writable`); True never writes (a write raises
    `StoreReadOnlyError`). `below`: a read-only store consulted for what this one lacks,
    so `Store(overlay_dir, below=Store(shared_dir, read_only=True))` reads the shared
    cache and writes only to the overlay.
    """

    def __init__(self, root: str | Path, *, read_only: bool | None = None, below: "Store | None" = None,
                 lease_seconds: float = LEASE_SECONDS, keep: str = "images", max_size: int | None = None):
        check_policy(keep, max_size)
        super().__init__()  # each part's own state: thumbnails, the write queue, the leases held, the cap's count
        self.root = Path(root)
        self.keep = keep
        self.max_size = max_size
        self.index = self.root / INDEX
        # a folder nobody may write to is frozen: read without even SQLite's reader files
        self._frozen = read_only is None and not is_writable(self.root)
        self.read_only = self._frozen if read_only is None else read_only
        self.below = below
        self.lease_seconds = lease_seconds
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.damaged = 0  # entries found bad on reading (missing file, checksum mismatch), over this store's life
        self._local = threading.local()
        self._lock = threading.Lock()  # the queue of index rows and the leases held: held for moments
        # one write transaction at a time in this process (SQLite would make the others wait out
        # its busy handler's sleeps); apart from `_lock`, so that queueing and reading rows on the
        # models' thread never waits for the writer's transaction
        self._writing = threading.Lock()
        self._described: set[str] = set()
        self._columns: set[str] | None = None  # the results table's columns, when it may lack newer ones
        self._tmp: tempfile.TemporaryDirectory | None = None
        self._empty = self.read_only and not self.index.exists()  # a read-only folder without an index holds nothing
        if not self.read_only:  # the pictures' folders are made as pictures come (`ImageFiles`)
            self.root.mkdir(parents=True, exist_ok=True)
        if not self._empty:
            self._guard(self._prepare)

    @classmethod
    def temporary(cls, **policy: Any) -> "Store":
        tmp = tempfile.TemporaryDirectory(prefix="caprecon-store-")
        store = cls(tmp.name, read_only=False, **policy)
        store._tmp = tmp
        return store

    @classmethod
    def fresh(cls, root: str | Path, **policy: Any) -> "Store":
        """A store at `root` emptied first: `--no-cache` runs reuse nothing from before."""
        shutil.rmtree(root, ignore_errors=True)
        return cls(root, read_only=False, **policy)

    @classmethod
    def open(cls, root: str | Path, *, overlay: str | Path | None = None, read_only: bool | None = None,
             **policy: Any) -> "Store":
        """The cache at `root`; if it cannot be written and `overlay` is given, a writable
        store at `overlay` laid over it. Without an overlay, a read-only cache is still
        usable for what it holds, and the first new result raises `StoreReadOnlyError`.
        `policy`: `keep` and `max_size`, of the store written to."""
        base = cls(root, read_only=read_only, **policy)
        if not base.read_only:
            return base
        if overlay is None:
            log.warning("cache %s is read-only: cached results are used, new ones are refused", root)
            return base
        return cls(overlay, read_only=False, below=base, **policy)

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"root": str(self.root), "read_only": self.read_only, "keep": self.keep,
                               "max_size": self.max_size}
        if self.below is not None:
            out["below"] = self.below.describe()
        return out

    # -- the index --------------------------------------------------------------------

    def _guard(self, action, *args):
        """Run `action`, turning a damaged index into one clear `StoreCorruptError`."""
        try:
            return action(*args)
        except (OSError, sqlite3.OperationalError) as exc:
            if full_disk(exc):
                raise self._full(exc) from None
            if isinstance(exc, OSError):
                raise
            if "readonly" in str(exc) or "read-only" in str(exc):
                raise StoreReadOnlyError(self._read_only_message()) from None
            raise
        except sqlite3.DatabaseError as exc:  # not a database, malformed image: damage, not contention
            raise StoreCorruptError(corrupt_message(self.index, exc)) from None

    def _full(self, exc: BaseException) -> StoreFullError:
        why = exc.strerror if isinstance(exc, OSError) else "database or disk is full"
        return StoreFullError(f"the cache {self.root} is full ({why}): free space there, or give --cache-dir "
                              "on a disk with room")

    def _read_only_message(self) -> str:
        return (f"cache {self.root} is read-only, and this run has new results to store. Pass --cache-overlay DIR "
                f"(or --out DIR, whose cache-overlay/ then holds them) to keep new results in a writable place.")

    def _prepare(self) -> None:
        db = self.connect()
        if self.read_only:
            # readable, and ours; an index from before checksums is read with those columns empty
            self._columns = sql.result_columns(db)
            if not self._columns:
                raise sqlite3.DatabaseError("no results table")
            return
        sql.create_tables(db)

    def connect(self) -> sqlite3.Connection:
        """This thread's connection to the index (read-only for a read-only store): for the
        cache commands' queries; the store's own reads and writes go through its methods."""
        db = getattr(self._local, "db", None)
        if db is None:
            db = sql.connect_read_only(self.index, frozen=self._frozen) if self.read_only else sql.connect(self.index)
            self._local.db = db
        return db

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """This thread's connection inside one write transaction (taken at once: `BEGIN IMMEDIATE`),
        apart from this process's other writes; committed when the block ends, else rolled back."""
        self._require_writable()
        with self._writing, transaction(self.connect(), "BEGIN IMMEDIATE") as db:
            yield db

    def _require_writable(self) -> None:
        if self.read_only:
            raise StoreReadOnlyError(self._read_only_message())

    @property
    def columns(self) -> set[str] | None:
        """The results table's columns when an old, read-only index may lack newer ones (else None)."""
        return self._columns

    # -- raw values -------------------------------------------------------------------

    def _rows(self, keys: list[str], columns: str) -> list[tuple]:
        if self._empty or not keys:
            return []
        if self._columns is not None:
            columns = ", ".join(c if c in self._columns else f"NULL AS {c}" for c in columns.split(", "))
        db = self.connect()
        out = []
        for chunk in sql.chunks(keys):
            out.extend(self._guard(lambda: db.execute(f"SELECT {columns} FROM results WHERE key IN "
                                                      f"({sql.marks(len(chunk))})", chunk).fetchall()))
        return out

    def _get(self, keys: list[str]) -> dict[str, bytes]:
        found: dict[str, bytes] = {}
        if self._unwritten:  # queued by the writer (`writer.WriteBehind`), not yet in the index
            with self._lock:
                found = {k: self._unwritten[k][0] for k in keys if k in self._unwritten}
            keys = [k for k in keys if k not in found]
        for key, value, checksum in self._rows(keys, "key, value, checksum"):
            if checksum is not None and sha256(value) != checksum:
                log.warning("cache entry %s in %s fails its checksum; it will be computed again", key, self.index)
                self.damaged += 1
                continue
            found[key] = value
        if self.below is not None:
            rest = [k for k in keys if k not in found]
            if rest:
                found.update(self.below._get(rest))
        return found

    def _put(self, rows: Iterable[tuple[str, str, bytes, dict[str, Any]]], model: Any = None, *,
             on_writer: bool = False, release: Sequence[str] = ()) -> None:
        """`rows`: (key, kind, value, file columns). `model`: the backend that computed them.
        `on_writer`: called on the writing thread, which writes them at once with what is queued.
        `release`: claims dropped in the same transaction (written at once, or on the writer)."""
        self._require_writable()
        if self.keep == "none":  # nothing is kept; the claims go all the same, so others may compute
            if release:
                self.release(release)
            return
        fingerprint = self._register_model(model)
        now = time.time()
        records = [(k, kind, v, now, sha256(v), extra.get("file_checksum"), extra.get("file_size"), fingerprint)
                   for k, kind, v, extra in rows]
        if self.write_behind:
            self._queue_rows(records, release, on_writer=on_writer)
        else:
            self._write_rows(records, release)

    def _write_rows(self, records: list[tuple], release: Sequence[str] = ()) -> None:
        """`records` in one transaction, which also drops this store's claims on `release`."""
        def write():
            with self._writing, transaction(self.connect()) as db:
                sql.insert_rows(db, "results", sql.RESULT_COLUMNS, records)
                sql.delete_claims(db, release, self.owner)

        self._guard(write)
        if self.max_size is not None and records:
            self._mind_cap(sum(len(r[2]) + (r[6] or 0) for r in records))

    def _register_model(self, model: Any) -> str | None:
        if model is None:
            return None
        if isinstance(model, str):
            return model
        fingerprint = getattr(model, "fingerprint", None)
        if fingerprint and fingerprint not in self._described:
            from caprecon.core.describe import describe_model

            try:
                description = json.dumps(describe_model(model), default=str)
            except Exception:  # a description is a convenience for `cache prune --model`, never a reason to fail
                description = json.dumps({"class": type(model).__name__})
            self._guard(lambda: self.connect().execute(
                "INSERT OR REPLACE INTO models (fingerprint, description) VALUES (?, ?)", (fingerprint, description)))
            self._described.add(fingerprint)
        return fingerprint

    # -- JSON records -----------------------------------------------------------------

    def get_json(self, keys: list[str]) -> dict[str, Any]:
        return {k: json.loads(v) for k, v in self._get(keys).items()}

    def put_json(self, kind: str, items: dict[str, Any], model: Any = None) -> None:
        # json_text: a value holding a lone surrogate (a captioner's broken reply) is stored as its escape
        self._put(((k, kind, json_text(v).encode("utf-8"), {}) for k, v in items.items()), model)

    # -- arrays (embeddings) ----------------------------------------------------------

    def get_arrays(self, keys: list[str]) -> dict[str, np.ndarray]:
        """One query for all `keys`; each value's .npy header is parsed once per distinct
        header (an embedder's vectors share one), the data then viewed in place."""
        headers: dict[bytes, tuple[np.dtype, tuple[int, ...], bool, int]] = {}
        out = {}
        for k, value in self._get(keys).items():
            layout = _npy_layout(value, headers)
            if layout is None:
                out[k] = np.load(io.BytesIO(value), allow_pickle=False)
                continue
            dtype, shape, fortran, offset = layout
            array = np.frombuffer(value, dtype, offset=offset)
            out[k] = array.reshape(shape, order="F" if fortran else "C")
        return out

    def put_arrays(self, kind: str, items: dict[str, np.ndarray], model: Any = None) -> None:
        """Each array as a .npy blob; its header is made once per dtype and shape (an embedder's
        vectors share one), where `np.save` formats it again for every vector."""
        headers: dict[tuple[str, tuple[int, ...]], bytes] = {}
        rows = []
        for k, arr in items.items():
            arr = np.ascontiguousarray(arr)
            if arr.dtype.hasobject:
                raise ValueError(f"cannot store an array of Python objects under {k!r}")
            layout = (arr.dtype.str, arr.shape)
            if layout not in headers:
                buf = io.BytesIO()
                np.lib.format.write_array_header_1_0(buf, np.lib.format.header_data_from_array_1_0(arr))
                headers[layout] = buf.getvalue()  # magic, version 1.0, padded header: as np.save writes
            rows.append((k, kind, headers[layout] + arr.tobytes(), {}))
        self._put(rows, model)


def _npy_layout(value: bytes, seen: dict) -> tuple[np.dtype, tuple[int, ...], bool, int] | None:
    """(dtype, shape, Fortran order, data offset) of a version-1 .npy blob, from its header
    (remembered in `seen`); None for anything else, which `np.load` reads instead."""
    if value[:8] != b"\x93NUMPY\x01\x00" or len(value) < 10:
        return None
    offset = 10 + int.from_bytes(value[8:10], "little")
    header = value[:offset]
    if header not in seen:
        fh = io.BytesIO(header)
        fh.seek(8)
        shape, fortran, dtype = np.lib.format.read_array_header_1_0(fh)
        if dtype.hasobject:
            return None
        seen[header] = (dtype, shape, fortran, offset)
    return seen[header]
