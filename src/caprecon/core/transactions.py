"""One SQLite transaction, committed or rolled back whole: what the store's index and the digest
memo write through, so that no write is left half done or holding the write lock."""

from __future__ import annotations

import sqlite3
from contextlib import contextmanager
from typing import Iterator


@contextmanager
def transaction(db: sqlite3.Connection, begin: str = "BEGIN") -> Iterator[sqlite3.Connection]:
    """`db` inside one transaction opened by `begin` ("BEGIN IMMEDIATE" takes the write lock at
    once): committed when the block ends, rolled back when it raises. The rollback is made only
    while a transaction is open: a Ctrl-C that lands just after COMMIT, or before BEGIN took
    effect, must reach the caller as itself, not as "cannot rollback - no transaction is active"
    (a row error, where the run should stop)."""
    db.execute(begin)
    try:
        yield db
        db.execute("COMMIT")  # inside: a COMMIT that fails (a deferred constraint, a busy database) is rolled back
    except BaseException:
        if db.in_transaction:
            db.execute("ROLLBACK")
        raise
