"""Claims: processes sharing a store each generate only the items they hold a lease on, and wait
for the others. `Leases` is the part of `Store` that takes, renews and releases them; one heartbeat
thread per store renews every lease it holds, and a lease whose holder died on this host, or whose
holder stopped renewing, may be taken by another."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import weakref
from contextlib import contextmanager
from typing import Any, Iterable, Iterator

from caprecon.store.sql import chunks, delete_claims, insert_rows, marks

log = logging.getLogger(__name__)

LEASE_SECONDS = 120.0  # a claim's lifetime; its holder renews it every third of that while it works


def heartbeat(store_ref: "weakref.ref[Any]", every: float, gone: threading.Event) -> None:
    """Renews the leases a store holds, until the store is gone (it holds no reference to it between beats)."""
    while not gone.wait(every):
        store = store_ref()
        if store is None:
            return
        with store._lock:
            keys = list(store._held)
        if keys:
            try:
                store.renew(keys)
            except Exception as exc:  # a missed renewal risks duplicate work, not wrong results
                log.warning("could not renew cache claims: %s", exc)
        del store


def holder_alive(owner: str) -> bool:
    """False only when the holder ran on this host and its process is gone."""
    host, _, rest = owner.partition(":")
    pid = rest.partition(":")[0]
    if host != socket.gethostname() or not pid.isdigit():
        return True
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Leases:
    """The claims of `caprecon.store.index.Store`, held as its `owner` for `lease_seconds`, written
    through the front's connection (`connect`, `_guard`) one transaction at a time (`_writing`)."""

    def __init__(self) -> None:
        super().__init__()
        self._held: set[str] = set()  # keys whose leases the heartbeat renews
        self._beat: threading.Thread | None = None

    def claim(self, keys: list[str]) -> set[str]:
        """Take a lease on each key nobody else holds (or whose holder's lease lapsed or
        whose holder died); returns the keys this store now holds."""
        self._require_writable()
        now = time.time()

        def take() -> set[str]:
            with self._writing:
                db = self.connect()
                db.execute("BEGIN IMMEDIATE")
                try:
                    held: dict[str, tuple[str, float]] = {}
                    for chunk in chunks(keys):
                        for key, owner, expires in db.execute(
                                f"SELECT key, owner, expires FROM claims WHERE key IN ({marks(len(chunk))})", chunk):
                            held[key] = (owner, expires)
                    mine = set()
                    for key in keys:
                        owner, expires = held.get(key, (self.owner, 0.0))
                        if owner != self.owner and expires > now and holder_alive(owner):
                            continue  # someone alive is generating it
                        mine.add(key)
                    insert_rows(db, "claims", "key, owner, expires",
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
                delete_claims(self.connect(), keys, self.owner)

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
