"""Content hashes remembered by (path, size, modification time), in this process and across
runs in `digests.sqlite` of the run's cache folder: hashing many GB of weights, or every photo
of a data set, takes seconds to minutes; looking the answer up takes nothing. A file rewritten
in place gets a new size or modification time, so a new hash. The memo only spares work: a digest
it lacks is computed.

Each run says where its memo is, for itself alone: its entry point runs in its own context
(`memo_scoped`) and names its folder there (`keep_memo_in`, from its settings, before anything is
hashed): its --cache-dir, else the default cache folder; under --no-cache or --cache-read-only, none.
Two runs in one process (two `Reward`s, a `Reward` and a score run, an API user scoring into two
cache folders) so each keep their memo in their own folder, and a thread a run starts learns its
folder from the run (`contextvars.copy_context`). Where no run has named a folder (a thread started
without the run's context, a bare call), digests are remembered in this process alone: nothing is
written where no run was told to write."""

from __future__ import annotations

import atexit
import contextvars
import functools
import sqlite3
import threading
from functools import lru_cache
from pathlib import Path
from typing import Callable, TypeVar

from caprecon.core.records import unicode_problem

Identity = tuple[str, int, int]  # resolved path, size in bytes, st_mtime_ns
Call = TypeVar("Call", bound=Callable)

_known: dict[Identity, str] = {}
#: the folder whose memo this context reads and writes (`keep_memo_in`); None: this process alone
_memo_folder: contextvars.ContextVar[Path | None] = contextvars.ContextVar("caprecon_memo_folder", default=None)
_unwritten: list[tuple[Path, Identity, str]] = []  # remembered `later`, with their memo's folder: not yet written
_unwritten_lock = threading.Lock()
_writing = threading.Lock()  # the memos' writes, one at a time (a memo's connection is shared by threads)


def keep_memo_in(folder: str | Path | None) -> None:
    """Read and write the memo in `folder` (a run's cache folder) for the rest of the current context:
    the call `memo_scoped` runs, or this thread; None: remember digests in this process alone
    (`--no-cache` promises that nothing is read from, or written to, the cache folder;
    `--cache-read-only` that nothing is written there)."""
    _memo_folder.set(None if folder is None else Path(folder))


def memo_scoped(call: Call) -> Call:
    """`call` run in a copy of its caller's context: the memo folder it names (`keep_memo_in`) holds
    for it and for what it hands on (threads given its context), and ends when it returns, so
    neither the caller nor another run in the process sees it."""
    @functools.wraps(call)
    def scoped(*args, **kwargs):
        return contextvars.copy_context().run(call, *args, **kwargs)

    return scoped  # type: ignore[return-value]


def handing_memo(call: Call) -> Call:
    """`call`, to be run on another thread (which starts with no memo folder): it runs with the memo
    folder of the context that wrapped it, in a context of its own each time."""
    folder = memo_folder()

    def in_folder(*args, **kwargs):
        keep_memo_in(folder)
        return call(*args, **kwargs)

    @functools.wraps(call)
    def handed(*args, **kwargs):
        return contextvars.copy_context().run(in_folder, *args, **kwargs)

    return handed  # type: ignore[return-value]


def memo_folder() -> Path | None:
    """The folder whose memo the current context uses (`keep_memo_in`), for a worker process to use the same."""
    return _memo_folder.get()


def known_digest(ident: Identity) -> str | None:
    if ident in _known:
        return _known[ident]
    memo = _memo(memo_folder())
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
    """Remember `digest` for the file `ident`: in this process at once, and in the current context's
    memo file (`memo_folder`) now or, with `later`, at the next `write_remembered` (or when the
    process ends). A run's reading threads remember a batch's photos later, and the batch's reader
    writes them in one transaction: one transaction a photo cost each about 0.013 ms and a handful of
    system calls (locks, a log write), each of which let another thread take the interpreter from the
    one running the models."""
    _known[ident] = digest
    folder = memo_folder()
    if folder is None:
        return
    if later:
        with _unwritten_lock:
            _unwritten.append((folder, ident, digest))
        return
    _write(folder, [(ident, digest)])


def write_remembered() -> None:
    """Write the digests remembered `later` into their memo files, one transaction each memo."""
    with _unwritten_lock:
        rows, _unwritten[:] = list(_unwritten), []
    by_folder: dict[Path, list[tuple[Identity, str]]] = {}
    for folder, ident, digest in rows:
        by_folder.setdefault(folder, []).append((ident, digest))
    for folder, remembered in by_folder.items():
        _write(folder, remembered)


atexit.register(write_remembered)


def _write(folder: Path, rows: list[tuple[Identity, str]]) -> None:
    # a path that is not text (a lone surrogate) is remembered for this process only
    rows = [(ident, digest) for ident, digest in rows if unicode_problem(ident[0]) is None]
    memo = _memo(folder, writing=True) if rows else None
    if memo is None:
        return
    # imported on the first write, not with this module: reading a run's settings loads this module (the
    # image reader and the model fingerprints use it) and must stay within its count of caprecon modules
    from caprecon.core.transactions import transaction

    with _writing:
        try:
            with transaction(memo):
                memo.executemany("INSERT OR REPLACE INTO digests (path, size, mtime_ns, digest) VALUES (?, ?, ?, ?)",
                                 [(*ident, digest) for ident, digest in rows])
        except sqlite3.Error:
            pass  # a read-only cache folder: remembered for this process only


def _memo(folder: Path | None, *, writing: bool = False) -> sqlite3.Connection | None:
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
