"""Content hashes remembered by (path, size, modification time), in this process and across
runs in `digests.sqlite` of the default cache folder: hashing many GB of weights, or every
photo of a data set, takes seconds to minutes; looking the answer up takes nothing. A file
rewritten in place gets a new size or modification time, so a new hash. A run under
--no-cache calls `in_process_only` first, and the cache folder is then neither read nor written."""

from __future__ import annotations

import sqlite3
from functools import lru_cache

from caprecon.core.paths import default_cache_dir

Identity = tuple[str, int, int]  # resolved path, size in bytes, st_mtime_ns

_known: dict[Identity, str] = {}
_in_process_only = False


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


def remember_digest(ident: Identity, digest: str) -> None:
    _known[ident] = digest
    memo = _memo()
    if memo is not None:
        try:
            memo.execute("INSERT OR REPLACE INTO digests (path, size, mtime_ns, digest) VALUES (?, ?, ?, ?)",
                         (*ident, digest))
        except sqlite3.Error:
            pass  # a read-only cache folder: the digest is remembered for this process only


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
