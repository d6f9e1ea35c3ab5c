"""Content hashes remembered by (path, size, modification time), in this process and across
runs in `digests.sqlite` of the default cache folder: hashing many GB of weights, or every
photo of a data set, takes seconds to minutes; looking the answer up takes nothing. A file
rewritten in place gets a new size or modification time, so a new hash. A run under
--no-cache calls `in_process_only` first, and the cache folder is then neither read nor written."""

from __future__ import annotations

import atexit
import sqlite3
import threading
from functools import lru_cache

from caprecon.core.paths import default_cache_dir

Identity = tuple[str, int, int]  # resolved path, size in bytes, st_mtime_ns

_known: dict[Identity, str] = {}
_in_process_only = False
_unwritten: list[tuple[Identity, str]] = []  # remembered `later`: known here, not yet in the memo file
_unwritten_lock = threading.Lock()
_writing = threading.Lock()  # the memo's writes, one at a time (its connection is shared by threads)


def in_process_only() -> None:
    """Remember digests in this process alone from now on: `--no-cache` promises that nothing
    is read from, or written to, the cache folder."""
    global _in_process_only
    _in_process_only = True


def known_digest(ident: Identity) -> str | None:
    if ident in _known:
        return _known[ident]
    memo = _memo()
    if memo is None:
        return None
    try:
        row = memo.execute("SELECT digest FROM digests WHERE path = ? AND size = ? AND mtime_ns = ?", ident).fetchone()
    except sqlite3.Error:
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
    memo = _memo()
    if memo is None or not rows:
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
            pass  # a read-only cache folder: the digests are remembered for this process only


def _memo() -> sqlite3.Connection | None:
    return None if _in_process_only else _opened_memo()


@lru_cache(maxsize=1)
def _opened_memo() -> sqlite3.Connection | None:
    try:
        folder = default_cache_dir()
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
