"""The content-addressed cache: a SQLite (WAL) index plus image files on disk.

Every deterministic model result (an image generated at a fixed seed, an embedding, a
greedy or log-probability judge answer) is stored under a key that hashes everything
that determines it. A second run, a run that adds a metric, or a run resumed after a
crash finds those results and recomputes nothing.

Layout under the root::

    index.sqlite          key -> kind, value (JSON or .npy bytes), created
    images/ab/abcd....png reconstructed images, named by their key
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import sqlite3
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Iterable

import numpy as np
from PIL import Image


def content_key(kind: str, **parts: Any) -> str:
    """Stable hash of a result's kind and every input that determines it."""
    blob = json.dumps({"kind": kind, **parts}, sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def default_cache_dir() -> Path:
    """`$CAPRECON_CACHE`, else `$XDG_CACHE_HOME/caprecon`, else `~/.cache/caprecon`."""
    if os.environ.get("CAPRECON_CACHE"):
        return Path(os.environ["CAPRECON_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "caprecon"


class Store:
    """Content-addressed results on disk. `Store.temporary()` gives one that vanishes."""

    def __init__(self, root: str | Path):
        self.root = Path(root)
        (self.root / "images").mkdir(parents=True, exist_ok=True)
        self._local = threading.local()
        self._lock = threading.Lock()
        with self._connect() as db:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute(
                "CREATE TABLE IF NOT EXISTS results (key TEXT PRIMARY KEY, kind TEXT NOT NULL, "
                "value BLOB, created REAL NOT NULL)"
            )
        self._tmp: tempfile.TemporaryDirectory | None = None

    @classmethod
    def temporary(cls) -> "Store":
        tmp = tempfile.TemporaryDirectory(prefix="caprecon-store-")
        store = cls(tmp.name)
        store._tmp = tmp
        return store

    @classmethod
    def fresh(cls, root: str | Path) -> "Store":
        """A store at `root` emptied first: `--no-cache` runs reuse nothing from before."""
        shutil.rmtree(root, ignore_errors=True)
        return cls(root)

    def _connect(self) -> sqlite3.Connection:
        db = getattr(self._local, "db", None)
        if db is None:
            db = sqlite3.connect(self.root / "index.sqlite", timeout=60, isolation_level=None)
            db.execute("PRAGMA synchronous=NORMAL")
            self._local.db = db
        return db

    # -- raw values -------------------------------------------------------------------

    def _get(self, keys: list[str]) -> dict[str, tuple[str, bytes]]:
        found: dict[str, tuple[str, bytes]] = {}
        db = self._connect()
        for start in range(0, len(keys), 500):
            chunk = keys[start : start + 500]
            marks = ",".join("?" * len(chunk))
            for key, kind, value in db.execute(f"SELECT key, kind, value FROM results WHERE key IN ({marks})", chunk):
                found[key] = (kind, value)
        return found

    def _put(self, rows: Iterable[tuple[str, str, bytes]]) -> None:
        now = time.time()
        with self._lock:
            db = self._connect()
            db.execute("BEGIN")
            db.executemany(
                "INSERT OR REPLACE INTO results (key, kind, value, created) VALUES (?, ?, ?, ?)",
                [(k, kind, v, now) for k, kind, v in rows],
            )
            db.execute("COMMIT")

    # -- JSON records -----------------------------------------------------------------

    def get_json(self, keys: list[str]) -> dict[str, Any]:
        return {k: json.loads(v) for k, (_, v) in self._get(keys).items()}

    def put_json(self, kind: str, items: dict[str, Any]) -> None:
        self._put((k, kind, json.dumps(v, ensure_ascii=False).encode("utf-8")) for k, v in items.items())

    # -- arrays (embeddings) ----------------------------------------------------------

    def get_arrays(self, keys: list[str]) -> dict[str, np.ndarray]:
        return {k: np.load(io.BytesIO(v), allow_pickle=False) for k, (_, v) in self._get(keys).items()}

    def put_arrays(self, kind: str, items: dict[str, np.ndarray]) -> None:
        rows = []
        for k, arr in items.items():
            buf = io.BytesIO()
            np.save(buf, np.ascontiguousarray(arr), allow_pickle=False)
            rows.append((k, kind, buf.getvalue()))
        self._put(rows)

    # -- images -----------------------------------------------------------------------

    def image_path(self, key: str) -> Path:
        return self.root / "images" / key[:2] / f"{key}.png"

    def put_image(self, key: str, image: Image.Image) -> Path:
        path = self.image_path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(".part")
        image.save(partial, format="PNG")
        os.replace(partial, path)  # a crash never leaves a half-written image under the key
        return path
