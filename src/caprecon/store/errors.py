"""What goes wrong with a store, as exceptions that name the file and the way out, and what a full disk
looks like (as an OSError and as SQLite says it). Importing this loads neither NumPy nor PIL nor the
store's other parts, so a module that only catches a store's errors stays light."""

from __future__ import annotations

import errno
import sqlite3
from pathlib import Path


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


def corrupt_message(index: Path, exc: BaseException) -> str:
    return (f"cache index {index} is damaged ({exc}). Run `caprecon cache verify --repair --cache-dir "
            f"{index.parent}` to rebuild it (readable entries are kept), or use another --cache-dir.")
