"""Content hashes remembered by (path, size, modification time), in this process and across
runs in `digests.sqlite` of the run's cache folder: hashing many GB of weights, or every photo
of a data set, takes seconds to minutes; looking the answer up takes nothing. A file rewritten
in place gets a new size or modification time, so a new hash. Each run says where its memo is
(`keep_memo_in`, from its settings, before anything is hashed): its --cache-dir, else the default
cache folder; under --no-cache or --cache-read-only, this process alone, so nothing is written
where the run was not told to write. The memo only spares work: a digest it lacks is computed."""

from __future__ import annotations

import atexit
import sqlite3
import threading
from functools import lru_cache
from pathlib import Path

from caprecon.core.paths import default_cache_dir

Identity = tuple[str, int, int]  # resolved path, size in bytes, st_mtime_ns

_known: dict[Identity, str] = {}
_DEFAULT_FOLDER = "default"
#: the folder whose memo is read and written: the default cache folder until a run names its own; None: none
_memo_folder: Path | str | None = _DEFAULT_FOLDER
_unwritten: list[tuple[Identity, str]] = []  # remembered `later`: known here, not yet in the memo file
_unwritten_lock = threading.Lock()
_writing = threading.Lock()  # the memo's writes, one at a time (its connection is shared by threads)


def keep_memo_in(folder: str | Path | None) -> None:
    """Read and write the memo in `folder` (a run's cache folder) from now on; None: remember
    digests in this process alone (`--no-cache` promises that nothing is read from, or written to,
    the cache folder; `--cache-read-only` that nothing is written there)."""
    global _memo_folder
    _memo_folder = None if folder is None else Path(folder)


def memo_folder() -> Path | None:
    """The folder whose memo this process uses (`keep_memo_in`), for a worker process to use the same."""
    return default_cache_dir() if _memo_folder is _DEFAULT_FOLDER else _memo_folder


def known_digest(ident: Identity) -> str | None:
    if ident in _known:
        return _known[ident]
    memo = _memo()
    if memo is None:
        return None
    try:
        row = memo.execute("SELECT digest FROM digests WHERE path = ? AND size = ? AND mtime_ns = ?", ident).fetchone()
    except (sqlite3.Error, UnicodeEncodeError):  # a path decoded with surrogateescape is no SQLite text
        return None
    if row:
        _known[ident] = row[0]
        return row[0]
    return None


def remember_digest(ident: Identity, digest: str, *, later: bool = False) -> None:
    """Remember `digest` for the file `ident`: in this process at once, and in the memo file now or,
    with `later`, at the next `write_remembered` (or when the process ends). A run's reading threads
    remember a batch's photos later, and the batch's reader writes them in one transaction: one
    transaction a photo cost each about 0.013 ms and a handful of system calls (locks, a log write),
    each of which let another thread take the interpreter from the one running the models."""
    _known[ident] = digest
    if later:
        with _unwritten_lock:
            _unwritten.append((ident, digest))
        return
    _write([(ident, digest)])


def write_remembered() -> None:
    """Write the digests remembered `later` into the memo file, in one transaction."""
    with _unwritten_lock:
        rows, _unwritten[:] = list(_unwritten), []
    _write(rows)


atexit.register(write_remembered)


def _write(rows: list[tuple[Identity, str]]) -> None:
    # a path that is not text (a lone surrogate) is remembered for this process only
    rows = [(ident, digest) for ident, digest in rows if _is_text(ident[0])]
    memo = _memo(writing=True) if rows else None
    if memo is None:
        return
    with _writing:
        try:
            memo.execute("BEGIN")
            try:
                memo.executemany("INSERT OR REPLACE INTO digests (path, size, mtime_ns, digest) VALUES (?, ?, ?, ?)",
                                 [(*ident, digest) for ident, digest in rows])
                memo.execute("COMMIT")
            except BaseException:
                if memo.in_transaction:
                    memo.execute("ROLLBACK")
                raise
        except sqlite3.Error:
            pass  # a read-only cache folder: remembered for this process only


def _is_text(path: str) -> bool:
    try:
        path.encode("utf-8")
        return True
    except UnicodeEncodeError:
        return False


def _memo(*, writing: bool = False) -> sqlite3.Connection | None:
    folder = memo_folder()
    if folder is None or writing and _meant_read_only(folder):  # made read-only since the memo was opened
        return None
    return _opened_memo(folder)


def _meant_read_only(folder: Path) -> bool:
    """A cache folder without a write bit is meant read-only, even for root (as the store reads it)."""
    return folder.exists() and not folder.stat().st_mode & 0o222


@lru_cache(maxsize=4)  # a connection per folder, for a process that runs several (tests, notebooks)
def _opened_memo(folder: Path) -> sqlite3.Connection | None:
    try:
        if _meant_read_only(folder):
            return None
        folder.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(folder / "digests.sqlite", timeout=30, isolation_level=None, check_same_thread=False)
        # a memo, not a record: losing its last writes in a crash costs a re-hash, so no fsync per file
        db.execute("PRAGMA synchronous=OFF")
        try:  # each file remembered is then one append to the log, where the default journal made and
            # removed a file per insert (0.13 -> 0.02 ms of CPU each: a first run remembers every photo)
            db.execute("PRAGMA journal_mode=WAL")
        except sqlite3.Error:
            pass  # a folder where the log cannot be made: the memo works as before
        db.execute("CREATE TABLE IF NOT EXISTS digests (path TEXT PRIMARY KEY, size INTEGER, mtime_ns INTEGER, "
                   "digest TEXT)")
        return db
    except (OSError, sqlite3.Error):
        return None
