"""The store's SQLite index: its tables (made, or brought up to date, when a store opens), its
connections (read-only ones too), the statements every part of the store shares, taking as many
keys as one statement may, and the checksum each row records. With the other modules of `store/`, the
only place the store's SQL lives.

    results  key -> kind, value (JSON or .npy bytes), created, checksums of the value and of the
             file, the file's size, the model's fingerprint
    models   fingerprint -> description
    claims   key -> owner, expiry
"""

from __future__ import annotations

import hashlib
import sqlite3
import time
from pathlib import Path
from typing import Any, Iterator, Sequence
from urllib.parse import quote

from caprecon.core.transactions import transaction

#: added to indexes written before checksums, sizes and models were recorded
ADDED_COLUMNS = {"checksum": "TEXT", "file_checksum": "TEXT", "file_size": "INTEGER", "model": "TEXT"}
RESULT_COLUMNS = "key, kind, value, created, checksum, file_checksum, file_size, model"
MAX_PARAMS = 999  # what every SQLite build takes in one statement


def use_wal(db: sqlite3.Connection) -> None:
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


def create_tables(db: sqlite3.Connection) -> None:
    """The tables, made or given the columns they lack, in write-ahead logging."""
    use_wal(db)
    # one writer at a time: processes opening a new or old cache together must not both add a column
    with transaction(db, "BEGIN IMMEDIATE"):
        db.execute("CREATE TABLE IF NOT EXISTS results (key TEXT PRIMARY KEY, kind TEXT NOT NULL, value BLOB, "
                   "created REAL NOT NULL)")
        have = result_columns(db)
        for name, sql_type in ADDED_COLUMNS.items():
            if name not in have:
                db.execute(f"ALTER TABLE results ADD COLUMN {name} {sql_type}")
        db.execute("CREATE INDEX IF NOT EXISTS results_model ON results(model)")
        db.execute("CREATE TABLE IF NOT EXISTS models (fingerprint TEXT PRIMARY KEY, description TEXT)")
        db.execute("CREATE TABLE IF NOT EXISTS claims (key TEXT PRIMARY KEY, owner TEXT NOT NULL, "
                   "expires REAL NOT NULL)")


def result_columns(db: sqlite3.Connection) -> set[str]:
    """The results table's columns (none when there is no such table)."""
    return {row[1] for row in db.execute("PRAGMA table_info(results)")}


def connect(index: Path) -> sqlite3.Connection:
    db = sqlite3.connect(index, timeout=60, isolation_level=None, check_same_thread=False)
    db.execute("PRAGMA synchronous=NORMAL")
    return db


def connect_read_only(index: Path, *, frozen: bool) -> sqlite3.Connection:
    """A connection that never writes. `frozen`: nobody may write to the folder, so when everything
    is in the main file it is read as immutable, without even SQLite's reader files."""
    uri = f"file:{quote(str(index.resolve()))}?mode=ro"
    immutable = uri + "&immutable=1"
    wal = index.with_name(index.name + "-wal")
    if frozen and not (wal.exists() and wal.stat().st_size):  # everything is in the main file
        return sqlite3.connect(immutable, uri=True, isolation_level=None, check_same_thread=False)
    db = sqlite3.connect(uri, uri=True, timeout=60, isolation_level=None, check_same_thread=False)
    try:
        db.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchone()
        return db
    except sqlite3.OperationalError:
        # a WAL index whose -shm file cannot be made here: read the main file as it is
        db.close()
        return sqlite3.connect(immutable, uri=True, isolation_level=None, check_same_thread=False)


def chunks(items: Sequence[Any], size: int = MAX_PARAMS) -> Iterator[Sequence[Any]]:
    """`items` in runs of at most `size`: as many as one SQL statement takes."""
    for start in range(0, len(items), size):
        yield items[start : start + size]


def marks(n: int) -> str:
    return ",".join("?" * n)


#: what an insert does with a row whose key the table holds: overwrite it, or keep the one there
ON_CONFLICT = ("REPLACE", "IGNORE")


def insert_rows(db: sqlite3.Connection, table: str, columns: str, rows: list[tuple], *,
                on_conflict: str = "REPLACE") -> None:
    """`INSERT OR REPLACE` (or, `on_conflict="IGNORE"`, `INSERT OR IGNORE`: the row there is kept) of
    `rows`, many to a statement: `executemany` steps once per row, and each step lets another thread
    take the interpreter from the one running the models."""
    if on_conflict not in ON_CONFLICT:
        raise ValueError(f"on_conflict must be one of {', '.join(ON_CONFLICT)}, not {on_conflict!r}")
    if not rows:
        return
    width = len(rows[0])
    for chunk in chunks(rows, max(1, MAX_PARAMS // width)):
        db.execute(f"INSERT OR {on_conflict} INTO {table} ({columns}) "
                   f"VALUES {','.join([f'({marks(width)})'] * len(chunk))}",
                   [value for row in chunk for value in row])


def delete_claims(db: sqlite3.Connection, keys: Sequence[str], owner: str) -> None:
    """Drop `owner`'s claims on `keys`, many to a statement."""
    for chunk in chunks(keys, MAX_PARAMS - 1):
        db.execute(f"DELETE FROM claims WHERE owner = ? AND key IN ({marks(len(chunk))})", [owner, *chunk])


def delete_results(db: sqlite3.Connection, keys: Sequence[str]) -> None:
    """Drop the results of `keys`, many to a statement."""
    for chunk in chunks(keys):
        db.execute(f"DELETE FROM results WHERE key IN ({marks(len(chunk))})", list(chunk))


def sha256(data: bytes | str) -> str:
    """The checksum the index records of each value and each picture file, checked when either is read."""
    # indexes written by hand or by old versions may hold a value as TEXT
    return hashlib.sha256(data.encode("utf-8") if isinstance(data, str) else data).hexdigest()
