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
store holds: past it, the oldest entries are deleted (`caprecon.store.maintenance.enforce_cap`).

Nothing is trusted blindly: values and files carry a sha256 checked when read, and an
entry that fails the check counts as missing, so it is computed again, never scored.
Processes sharing a cache claim the items they generate (a lease that the holder renews
and that expires when it dies), so one item is generated once. A cache that cannot be
written (a shared, pre-filled one) is read as it is, with new results going to a
writable overlay store laid over it.
"""

from __future__ import annotations

import errno
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
import weakref
import zlib
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence
from urllib.parse import quote

import numpy as np
from PIL import Image

from caprecon.core.checks import check_count
from caprecon.core.errors import ConfigError
from caprecon.core.paths import create_file
from caprecon.data.images import file_head


log = logging.getLogger(__name__)

INDEX = "index.sqlite"
LEASE_SECONDS = 120.0  # a claim's lifetime; its holder renews it every third of that while it works

#: what a store keeps (see the module's docstring)
KEEP_POLICIES = ("images", "vectors", "none")
#: where the size cap prunes down to, as a share of the cap: room for a twentieth's writes, and more,
#: before the next prune (pruning to the cap itself would prune again at the next write)
CAP_LOW_WATER = 0.9
#: the kind of an image's index row when its picture was not kept (`keep="vectors"`): "reconstruction-record"
RECORD_ONLY = "-record"

_COLUMNS = {  # added to indexes written before checksums, sizes and models were recorded
    "checksum": "TEXT", "file_checksum": "TEXT", "file_size": "INTEGER", "model": "TEXT",
}


def _use_wal(db: sqlite3.Connection) -> None:
    """Switch the index to write-ahead logging. Two processes opening a new cache at once can
    both ask; SQLite answers the loser "database is locked" at once, without waiting out the
    busy timeout, so it is asked again until the winner's switch is done."""
    for pause in (0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 3.2):
        try:
            db.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc):
                raise
            time.sleep(pause)
    db.execute("PRAGMA journal_mode=WAL")


class StoreError(RuntimeError):
    """The cache cannot be used as it is; the message names the file and the way out."""


class StoreCorruptError(StoreError):
    pass


class StoreReadOnlyError(StoreError):
    pass


class StoreFullError(StoreError):
    """The disk (or quota) under the cache is full: the run stops; the rows it finished are kept."""


# what a full disk or quota looks like, as an OSError and as SQLite says it
FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


def full_disk(exc: BaseException) -> bool:
    return (isinstance(exc, OSError) and exc.errno in FULL_ERRNOS) or \
        (isinstance(exc, sqlite3.OperationalError) and "disk is full" in str(exc))


_RESULT_COLUMNS = "key, kind, value, created, checksum, file_checksum, file_size, model"
_MAX_PARAMS = 999  # what every SQLite build takes in one statement


def _chunks(items: Sequence[Any], size: int) -> Iterator[Sequence[Any]]:
    """`items` in runs of at most `size`: as many as one SQL statement takes."""
    for start in range(0, len(items), size):
        yield items[start : start + size]


def _marks(n: int) -> str:
    return ",".join("?" * n)


def _insert_rows(db: sqlite3.Connection, table: str, columns: str, rows: list[tuple]) -> None:
    """`INSERT OR REPLACE` of `rows`, many to a statement: `executemany` steps once per row, and
    each step lets another thread take the interpreter from the one running the models."""
    if not rows:
        return
    width = len(rows[0])
    for chunk in _chunks(rows, max(1, _MAX_PARAMS // width)):
        db.execute(f"INSERT OR REPLACE INTO {table} ({columns}) VALUES {','.join([f'({_marks(width)})'] * len(chunk))}",
                   [value for row in chunk for value in row])


def _delete_claims(db: sqlite3.Connection, keys: Sequence[str], owner: str) -> None:
    """Drop `owner`'s claims on `keys`, many to a statement."""
    for chunk in _chunks(keys, _MAX_PARAMS - 1):
        db.execute(f"DELETE FROM claims WHERE owner = ? AND key IN ({_marks(len(chunk))})", [owner, *chunk])


def fan_out(folder: str | Path) -> None:
    """Make the 256 folders `00`..`ff` that a cache files its entries in (by the first two hex
    digits of their names) all at once, unless the last is there: made one by one as entries
    came, each cost a failed write or link, a look and a `mkdir` on a run's writing threads."""
    if os.path.isdir(os.path.join(folder, "ff")):
        return
    for i in range(256):
        os.makedirs(os.path.join(folder, f"{i:02x}"), exist_ok=True)


def check_policy(keep: str, max_size: int | None) -> None:
    """A keep policy and size cap a store takes, else a `ConfigError` naming the option."""
    if keep not in KEEP_POLICIES:
        raise ConfigError(f"--keep must be one of {', '.join(KEEP_POLICIES)}, not {keep!r}")
    if max_size is not None:
        check_count("--cache-max-size", max_size, 1, 10**18)


def content_key(kind: str, **parts: Any) -> str:
    """Stable hash of a result's kind and every input that determines it."""
    blob = json.dumps({"kind": kind, **parts}, sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def sha256(data: bytes | str) -> str:
    # indexes written by hand or by old versions may hold a value as TEXT
    return hashlib.sha256(data.encode("utf-8") if isinstance(data, str) else data).hexdigest()


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


def corrupt_message(index: Path, exc: BaseException) -> str:
    return (f"cache index {index} is damaged ({exc}). Run `caprecon cache verify --repair --cache-dir "
            f"{index.parent}` to rebuild it (readable entries are kept), or use another --cache-dir.")


class Store:
    """Content-addressed results on disk. `Store.temporary()` gives one that vanishes.

    `read_only`: None detects it (see `is_writable`); True never writes (a write raises
    `StoreReadOnlyError`). `below`: a read-only store consulted for what this one lacks,
    so `Store(overlay_dir, below=Store(shared_dir, read_only=True))` reads the shared
    cache and writes only to the overlay.
    """

    def __init__(self, root: str | Path, *, read_only: bool | None = None, below: "Store | None" = None,
                 lease_seconds: float = LEASE_SECONDS, keep: str = "images", max_size: int | None = None):
        check_policy(keep, max_size)
        self.root = Path(root)
        self.keep = keep
        self.max_size = max_size
        self._unchecked_bytes = 0  # written since the size cap was last enforced
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
        #: queue every write on a background thread (`put_*` return at once; `flush()` waits for them,
        #: image reads wait, other reads see what is queued). The local executor turns it on and
        #: flushes before it writes rows. Index rows queued together are written in one transaction.
        self.write_behind = False
        #: while a run makes a report: handed {file path: (pixels, (file length, first 8 bytes))} of
        #: each picture whose pixels are in memory (the images written here, the sources
        #: `put_thumbnails` is given), to make its thumbnail from them without reading the file
        #: again (`caprecon.store.thumbs.ThumbnailWriter`)
        self.thumbnails: Callable[[dict[str, tuple[Image.Image, tuple[int, bytes] | None]]], None] | None = None
        self._queued: list[tuple] = []  # index rows waiting for the writing thread
        self._unwritten: dict[str, tuple[bytes, str]] = {}  # their (value, checksum) by key, until written
        self._drain_due = False
        self._held: set[str] = set()  # keys whose leases the heartbeat renews
        self._beat: threading.Thread | None = None
        self._writer: ThreadPoolExecutor | None = None
        self._pending: list[Future] = []
        self._images_pending: dict[str, Future] = {}  # the write of each image key queued, until waited for
        self._empty = self.read_only and not self.index.exists()  # a read-only folder without an index holds nothing
        if not self.read_only:
            self.root.mkdir(parents=True, exist_ok=True)
            if keep == "images":  # the other policies write no picture: their 256 folders cost 256 `mkdir`s for nothing
                fan_out(self.root / "images")
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
            self._columns = {row[1] for row in db.execute("PRAGMA table_info(results)")}
            if not self._columns:
                raise sqlite3.DatabaseError("no results table")
            return
        _use_wal(db)
        # one writer at a time: processes opening a new or old cache together must not both add a column
        db.execute("BEGIN IMMEDIATE")
        try:
            db.execute("CREATE TABLE IF NOT EXISTS results (key TEXT PRIMARY KEY, kind TEXT NOT NULL, value BLOB, "
                       "created REAL NOT NULL)")
            have = {row[1] for row in db.execute("PRAGMA table_info(results)")}
            for name, sql_type in _COLUMNS.items():
                if name not in have:
                    db.execute(f"ALTER TABLE results ADD COLUMN {name} {sql_type}")
            db.execute("CREATE INDEX IF NOT EXISTS results_model ON results(model)")
            db.execute("CREATE TABLE IF NOT EXISTS models (fingerprint TEXT PRIMARY KEY, description TEXT)")
            db.execute("CREATE TABLE IF NOT EXISTS claims (key TEXT PRIMARY KEY, owner TEXT NOT NULL, "
                       "expires REAL NOT NULL)")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")

    def connect(self) -> sqlite3.Connection:
        """This thread's connection to the index (read-only for a read-only store): for the
        cache commands' queries; the store's own reads and writes go through its methods."""
        db = getattr(self._local, "db", None)
        if db is None:
            if self.read_only:
                db = self._connect_read_only()
            else:
                db = sqlite3.connect(self.index, timeout=60, isolation_level=None, check_same_thread=False)
                db.execute("PRAGMA synchronous=NORMAL")
            self._local.db = db
        return db

    def _connect_read_only(self) -> sqlite3.Connection:
        uri = f"file:{quote(str(self.index.resolve()))}?mode=ro"
        immutable = uri + "&immutable=1"
        wal = self.index.with_name(INDEX + "-wal")
        if self._frozen and not (wal.exists() and wal.stat().st_size):  # everything is in the main file
            return sqlite3.connect(immutable, uri=True, isolation_level=None, check_same_thread=False)
        db = sqlite3.connect(uri, uri=True, timeout=60, isolation_level=None, check_same_thread=False)
        try:
            db.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchone()
            return db
        except sqlite3.OperationalError:
            # a WAL index whose -shm file cannot be made here: read the main file as it is
            db.close()
            return sqlite3.connect(immutable, uri=True, isolation_level=None, check_same_thread=False)

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """This thread's connection inside one write transaction (taken at once: `BEGIN IMMEDIATE`),
        apart from this process's other writes; committed when the block ends, else rolled back."""
        self._require_writable()
        with self._writing:
            db = self.connect()
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")

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
        for chunk in _chunks(keys, _MAX_PARAMS):
            out.extend(self._guard(lambda: db.execute(f"SELECT {columns} FROM results WHERE key IN "
                                                      f"({_marks(len(chunk))})", chunk).fetchall()))
        return out

    def _get(self, keys: list[str]) -> dict[str, bytes]:
        found: dict[str, bytes] = {}
        if self._unwritten:
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
        if not self.write_behind:
            self._write_rows(records, release)
            return
        if on_writer:
            with self._lock:
                self._queued += records
            self._drain(release)
            return
        with self._lock:
            self._queued += records
            self._unwritten.update((r[0], (r[2], r[4])) for r in records)
            due, self._drain_due = self._drain_due, True
        if not due:  # one drain at a time takes everything queued by then: one transaction
            self._behind(self._drain)

    def _behind(self, work, *args) -> Future:
        """Run `work` on the writing thread (in order with every other write)."""
        if self._writer is None:
            self._writer = ThreadPoolExecutor(1, thread_name_prefix="caprecon-write")
        future = self._writer.submit(work, *args)
        # those done well need no waiting for: a long run that waits for images alone keeps few
        self._pending = [f for f in self._pending if not f.done() or f.exception() is not None]
        self._pending.append(future)
        return future

    def _drain(self, release: Sequence[str] = ()) -> None:
        with self._lock:
            records, self._queued, self._drain_due = self._queued, [], False
        if not records and not release:
            return
        try:
            self._write_rows(records, release)
        finally:
            with self._lock:
                for record in records:
                    if self._unwritten.get(record[0], (None, None))[1] == record[4]:
                        del self._unwritten[record[0]]

    def _write_rows(self, records: list[tuple], release: Sequence[str] = ()) -> None:
        """`records` in one transaction, which also drops this store's claims on `release`."""
        def write():
            with self._writing:
                db = self.connect()
                db.execute("BEGIN")
                try:
                    _insert_rows(db, "results", _RESULT_COLUMNS, records)
                    _delete_claims(db, release, self.owner)
                except BaseException:
                    db.execute("ROLLBACK")
                    raise
                db.execute("COMMIT")

        self._guard(write)
        if self.max_size is not None and records:
            self._mind_cap(sum(len(r[2]) + (r[6] or 0) for r in records))

    def _mind_cap(self, written: int) -> None:
        """Enforce the size cap once a twentieth of it has been written since the last time (the
        count of the store's bytes is one query; each write paying for it would slow every batch)."""
        with self._lock:
            self._unchecked_bytes += written
            due = self._unchecked_bytes * 20 >= self.max_size
            if due:
                self._unchecked_bytes = 0
        if due:
            self.enforce_cap()

    def enforce_cap(self) -> int:
        """Keep the store within `max_size`: when its entries (values and picture files) hold more
        bytes, delete the oldest until they hold at most `CAP_LOW_WATER` of it. Returns the entries
        deleted. A store given a cap runs this itself as it writes (`--cache-max-size`); `cache prune
        --max-size` deletes the oldest entries once, by hand, down to the size given."""
        if self.max_size is None or self.read_only:
            return 0
        with self.transaction() as db:
            # an image entry stored before sizes were recorded counts its record alone
            entries = [(key, (value_bytes or 0) + (file_size or 0)) for key, value_bytes, file_size in db.execute(
                "SELECT key, length(value), file_size FROM results ORDER BY created")]
            total = sum(size for _, size in entries)
            doomed = []
            if total > self.max_size:
                goal = self.max_size * CAP_LOW_WATER
                for key, size in entries:  # oldest first
                    if total <= goal:
                        break
                    doomed.append(key)
                    total -= size
                for chunk in _chunks(doomed, _MAX_PARAMS):
                    db.execute(f"DELETE FROM results WHERE key IN ({_marks(len(chunk))})", list(chunk))
        for key in doomed:
            self.image_path(key).unlink(missing_ok=True)
        if doomed:
            log.info("cache %s over its cap of %d bytes: %d oldest entries deleted", self.root, self.max_size,
                     len(doomed))
        return len(doomed)

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
        self._put(((k, kind, json.dumps(v, ensure_ascii=False).encode("utf-8"), {}) for k, v in items.items()), model)

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

    # -- images -----------------------------------------------------------------------

    def image_path(self, key: str) -> Path:
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
        future = self._behind(self._write_images, kind, items, fingerprint, release)
        self._images_pending.update(dict.fromkeys(items, future))
        return {key: (record, self.image_path(key), None) for key, (_, record) in items.items()}

    def _write_images(self, kind: str, items: dict[str, tuple[Image.Image, dict[str, Any]]], model: Any,
                      release: list[str]) -> dict[str, tuple[dict[str, Any], Path, str]]:
        try:
            rows, stored, written = [], {}, {}
            for key, (image, record) in items.items():
                data = _png_bytes(image)
                path = self.image_path(key)
                partial = path.with_suffix(f".{os.getpid()}.part")
                with create_file(partial) as fh:  # its folder was made when the store opened (fan_out)
                    fh.write(data)
                os.replace(partial, path)  # a crash never leaves a half-written image under the key
                written[str(path)] = (image, file_head(data))
                digest = sha256(data)
                rows.append((key, kind, json.dumps(record, ensure_ascii=False).encode("utf-8"),
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
        As with pictures, the claims on `release` go in the transaction that writes the records."""
        rows = [(key, kind + RECORD_ONLY, json.dumps(record, ensure_ascii=False).encode("utf-8"), {})
                for key, (_, record) in items.items()]

        def write(fingerprint: Any) -> None:
            try:
                self._put(rows, fingerprint, on_writer=self.write_behind, release=release)
            except BaseException:
                if release:  # not written: the claims go all the same, so others may generate them
                    self.release(release)
                raise

        if self.write_behind:
            future = self._behind(write, self._register_model(model))
            self._images_pending.update(dict.fromkeys(items, future))
        else:
            self._guard(write, model)
        return {key: (record, None, None) for key, (_, record) in items.items()}

    def put_thumbnails(self, images: Mapping[str, tuple[Image.Image, tuple[int, bytes] | None]]) -> None:
        """Hand pictures whose pixels are in memory, by their file's path, to `thumbnails`: each
        with the length and first 8 bytes of the file it came from or went to, when known."""
        sink = self.thumbnails
        if sink is not None and images:
            sink(dict(images))

    def flush(self) -> None:
        """Wait for the queued writes; the first that failed raises here."""
        pending, self._pending = self._pending, []
        self._images_pending = {}
        self._raise_failed(pending)

    def flush_images(self, keys: Iterable[str] | None = None) -> None:
        """Wait for the queued writes of images (of `keys`, or all): their files and index rows.
        Other queued writes (vectors, answers) go on; the first failure raises here."""
        if keys is None:
            waited, self._images_pending = set(self._images_pending.values()), {}
        else:
            waited = {f for k in keys if (f := self._images_pending.pop(k, None)) is not None}
        for future in waited:
            future.exception()  # waits for it
        # with those, any other write that has failed by now: a full disk stops the run at once
        done = [f for f in self._pending if f.done()]
        if done:
            self._pending = [f for f in self._pending if not f.done()]  # a failure raises once
            self._raise_failed(done)

    def _raise_failed(self, pending: Iterable[Future]) -> None:
        failed = next(filter(None, (f.exception() for f in pending)), None)
        if isinstance(failed, StoreError):
            raise failed
        if failed is not None and full_disk(failed):
            raise self._full(failed) from failed
        if failed is not None:  # a full disk, a lost file system: the run cannot keep what it computes
            raise StoreError(f"writing to the cache {self.root} failed: {type(failed).__name__}: {failed}") from failed

    def get_images(self, keys: list[str], *, verify: bool = False,
                   records: bool = False) -> dict[str, tuple[dict[str, Any], Path | None, str | None]]:
        """(record, path, file checksum) of each stored image whose file is present at its
        recorded size, and with `verify` also matches its checksum. Without `verify` the
        full check waits until the file is read (`read_verified`), so a run that needs no
        pixels reads none. Images this store is still writing (`write_behind`) are waited for.
        With `records`, an image whose picture was not kept (`keep="vectors"`) is found too, as
        (record, None, None): what was computed from it may be in the store, the picture is not."""
        if self._images_pending:  # only the writes of the images asked for are waited for
            self.flush_images(keys)
        found: dict[str, tuple[dict[str, Any], Path | None, str | None]] = {}
        for key, kind, value, checksum, file_checksum, file_size in self._rows(
                keys, "key, kind, value, checksum, file_checksum, file_size"):
            if kind.endswith(RECORD_ONLY):
                if records and (checksum is None or sha256(value) == checksum):
                    found[key] = (json.loads(value), None, None)
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
        if self.below is not None:
            rest = [k for k in keys if k not in found]
            if rest:
                found.update(self.below.get_images(rest, verify=verify, records=records))
        return found

    # -- claims: one process generates an item, the others wait for it ---------------

    def claim(self, keys: list[str]) -> set[str]:
        """Take a lease on each key nobody else holds (or whose holder's lease lapsed or
        whose holder died); returns the keys this store now holds."""
        # imported with the claims, not the module: reading a config loads no lease code (test_startup)
        from caprecon.store.leases import holder_alive

        self._require_writable()
        now = time.time()

        def take() -> set[str]:
            with self._writing:
                db = self.connect()
                db.execute("BEGIN IMMEDIATE")
                try:
                    held: dict[str, tuple[str, float]] = {}
                    for chunk in _chunks(keys, _MAX_PARAMS):
                        for key, owner, expires in db.execute(
                                f"SELECT key, owner, expires FROM claims WHERE key IN ({_marks(len(chunk))})", chunk):
                            held[key] = (owner, expires)
                    mine = set()
                    for key in keys:
                        owner, expires = held.get(key, (self.owner, 0.0))
                        if owner != self.owner and expires > now and holder_alive(owner):
                            continue  # someone alive is generating it
                        mine.add(key)
                    _insert_rows(db, "claims", "key, owner, expires",
                                 [(k, self.owner, now + self.lease_seconds) for k in mine])
                    db.execute("COMMIT")
                except BaseException:
                    db.execute("ROLLBACK")
                    raise
                return mine

        return self._guard(take)

    def release(self, keys: Iterable[str]) -> None:
        keys = list(keys)

        def drop():
            with self._writing:
                _delete_claims(self.connect(), keys, self.owner)

        if keys:
            self._guard(drop)

    def renew(self, keys: Iterable[str]) -> None:
        expires = time.time() + self.lease_seconds
        rows = [(expires, k, self.owner) for k in keys]

        def extend():
            with self._writing:
                self.connect().executemany("UPDATE claims SET expires = ? WHERE key = ? AND owner = ?", rows)

        self._guard(extend)

    @contextmanager
    def holding(self, keys: Iterable[str]) -> Iterator[set[str]]:
        """Keep the leases on `keys` alive while the block runs, and release them after —
        except those the block adds to the set it is given (handed to `put_images(release=...)`,
        which releases them once their images are written). One heartbeat thread per store
        renews every held lease, so a batch costs no thread of its own."""
        from caprecon.store.leases import heartbeat  # as in claim()

        keys = list(keys)
        handed: set[str] = set()
        with self._lock:
            self._held.update(keys)
            if self._beat is None:
                gone = threading.Event()
                # the store collected, its heartbeat ends at once, not after its next sleep: a loop of
                # runs (the API, a notebook) would otherwise keep one sleeping thread per store it made
                weakref.finalize(self, gone.set)
                self._beat = threading.Thread(target=heartbeat, args=(weakref.ref(self), self.lease_seconds / 3, gone),
                                              name="caprecon-claims", daemon=True)
                self._beat.start()
        try:
            yield handed
        finally:
            with self._lock:
                self._held.difference_update(keys)
            self.release([k for k in keys if k not in handed])


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


#: how the store encodes a reconstruction (`PIL.Image.save` options; benchmarks/encoding.py and
#: throughput.py save with the same). zlib level 1 with the run-length strategy (Z_RLE) on PNG's
#: filtered rows: on photos at 512-1024 px, a fifth of the default level's encode time for as
#: many bytes, and a fifth faster than level 1's default strategy with a tenth fewer bytes.
#: Lossless WebP measured faster still, but PNG keeps the store's files what every reader of it
#: (cache verify, merge, HTML report) already expects
PNG_SAVE: dict[str, Any] = {"format": "PNG", "compress_level": 1, "compress_type": zlib.Z_RLE}


def _png_bytes(image: Image.Image) -> bytes:
    buf = io.BytesIO()
    image.save(buf, **PNG_SAVE)
    return buf.getvalue()


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
