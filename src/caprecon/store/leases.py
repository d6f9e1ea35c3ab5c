"""Claims: processes sharing a store each generate only the items they hold a lease on, and wait
for the others. `Leases` is the part of `Store` that takes, renews and releases them; one heartbeat
thread per store renews every lease it holds, and a lease whose holder died on this host, or whose
holder stopped renewing, may be taken by another.

A claim goes, as a rule, in the transaction that writes what it was taken for, so whoever waited on
it finds the result there. A picture the store does not keep (`keep="vectors"`) is different: what
a waiter reads is not its record but what its maker computes from the pixels (an embedding, a judge's
answer), written later. Inside `keeping_claims` (a metric's batch), such claims are kept past the
record's write, until the block ends; until then `claimed_elsewhere` tells the other processes that
the record is not done."""

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
            keys = list(store._held | store._kept)
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
        self._kept: set[str] = set()  # claims kept past their records' write, renewed too (`keeping_claims`)
        self._keeping = 0  # `keeping_claims` blocks open
        self._beat: threading.Thread | None = None

    def _others(self, db: Any, keys: list[str], now: float) -> set[str]:
        """Those of `keys` that another holder, alive, claims at `now`."""
        taken = set()
        for chunk in chunks(keys):
            for key, owner, expires in db.execute(
                    f"SELECT key, owner, expires FROM claims WHERE key IN ({marks(len(chunk))})", chunk):
                if owner != self.owner and expires > now and holder_alive(owner):
                    taken.add(key)  # someone alive is generating it
        return taken

    def claim(self, keys: list[str]) -> set[str]:
        """Take a lease on each key nobody else holds (or whose holder's lease lapsed or
        whose holder died); returns the keys this store now holds."""
        self._require_writable()
        now = time.time()

        def take() -> set[str]:
            with self.transaction() as db:
                mine = set(keys) - self._others(db, keys, now)
                insert_rows(db, "claims", "key, owner, expires",
                            [(k, self.owner, now + self.lease_seconds) for k in mine])
            return mine

        return self._guard(take)

    def claimed_elsewhere(self, keys: list[str]) -> set[str]:
        """Those of `keys` another process (or another store on this folder) holds a live claim on now."""
        if self.read_only or not keys:
            return set()
        return self._guard(lambda: self._others(self.connect(), keys, time.time()))

    def release(self, keys: Iterable[str]) -> None:
        keys = list(keys)
        if self._kept:
            with self._lock:
                self._kept.difference_update(keys)

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

    @contextmanager
    def keeping_claims(self) -> Iterator[None]:
        """While the block runs (a metric's batch: `caprecon.run.local.MetricRunner`), the claims on
        pictures this store does not keep (`keep="vectors"`) stay held past their records' write, and
        go when the block ends, after what the block wrote (queued behind it with `write_behind`):
        another process waiting for such a picture then finds what was computed from it, not the
        record alone (without which it would make the picture again). Blocks may nest."""
        with self._lock:
            self._keeping += 1
        try:
            yield
        finally:
            with self._lock:
                self._keeping -= 1
                last = self._keeping == 0
            if last:
                self.release_kept()

    def _keep_past_write(self, keys: list[str]) -> bool:
        """Whether the claims on `keys`, records about to be written, stay held past that write
        (inside `keeping_claims`): then they are remembered until `release_kept`."""
        with self._lock:
            if self._keeping and keys:
                self._kept.update(keys)
                return True
        return False

    def release_kept(self) -> None:
        """Release the claims kept past their records' write (`keeping_claims`): at once, or with
        `write_behind` after every write queued so far, in the transaction of the last of them. A
        process about to wait for another's claims calls this first: two processes each keeping a
        claim the other waits for would otherwise wait for ever."""
        with self._lock:
            keys, self._kept = list(self._kept), set()
        if not keys:
            return
        if self.write_behind:  # with the rows queued by then (gathered ones too), in one transaction
            self._drain_behind(keys)
        else:
            self.release(keys)
