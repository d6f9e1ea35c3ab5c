"""The part of `Store` that writes behind: with `write_behind` on, every write is queued on one
background thread, in order, so the models' thread never waits for a file or a transaction. Index
rows queued together are written in one transaction; with `gather_rows` (a run's batches), the rows
queued on the models' thread wait for the writer's next transaction (a picture write's) or the batch's
end (`write_gathered`), so a batch commits once or twice instead of once for every model's rows; image
reads wait for the writes of the images they ask for (`flush_images`); a run waits for everything
before it writes its rows (`flush`); the first write that failed raises there, a full disk as
`StoreFullError`."""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import Iterable, Sequence

from caprecon.store.errors import StoreError, full_disk


class WriteBehind:
    """Queued writes of `caprecon.store.index.Store`. It writes through the front's `_write_rows`
    (one transaction, claims released in it) and shares the front's `_lock` with the reads that look
    at what is queued (`_unwritten`)."""

    def __init__(self) -> None:
        super().__init__()
        #: queue every write on a background thread (`put_*` return at once; `flush()` waits for them,
        #: image reads wait, other reads see what is queued). The local executor turns it on and
        #: flushes before it writes rows. Index rows queued together are written in one transaction.
        self.write_behind = False
        #: with `write_behind`: rows queued on the caller's thread start no write of their own; they go in
        #: the writer's next transaction (a picture write's, a claim release's) or at `write_gathered`
        #: (the local executor calls it at each batch's end), `flush` at the latest. Each transaction
        #: cost the writing thread 0.1-0.2 ms and a dozen system calls (locks, log writes), and a batch
        #: made four: the source sizes, the pictures, two models' vectors
        self.gather_rows = False
        self._queued: list[tuple] = []  # index rows waiting for the writing thread
        self._unwritten: dict[str, tuple[bytes, str]] = {}  # their (value, checksum) by key, until written
        self._drain_due = False
        self._writer: ThreadPoolExecutor | None = None
        self._pending: list[Future] = []
        self._images_pending: dict[str, Future] = {}  # the write of each image key queued, until waited for

    def _queue_rows(self, records: list[tuple], release: Sequence[str], *, on_writer: bool) -> None:
        """Queue index `records` (and the claims on `release`, dropped in their transaction).
        `on_writer`: called on the writing thread, which writes them at once with what is queued."""
        if on_writer:
            with self._lock:
                self._queued += records
            self._drain(release)
            return
        with self._lock:
            self._queued += records
            self._unwritten.update((r[0], (r[2], r[4])) for r in records)
            if self.gather_rows:  # written with the writer's next transaction, or at `write_gathered`
                return
        self._drain_behind()

    def write_gathered(self) -> None:
        """Start writing the rows queued (`gather_rows`) in one transaction, unless a write queued
        already will take them; returns at once."""
        if self._queued:
            self._drain_behind()

    def _drain_behind(self, release: Sequence[str] = ()) -> None:
        """Queue a transaction of every row queued by the time it runs (and of the claims on `release`),
        unless one queued already will take them: one drain at a time, one transaction."""
        with self._lock:
            due, self._drain_due = self._drain_due, True
        if release or not due:
            self._behind(self._drain, release)

    def _behind(self, work, *args, images: Iterable[str] = ()) -> Future:
        """Run `work` on the writing thread (in order with every other write); `images`: the keys
        of the images it writes, whose reads wait for it."""
        if self._writer is None:
            self._writer = ThreadPoolExecutor(1, thread_name_prefix="caprecon-write")
        future = self._writer.submit(work, *args)
        # those done well need no waiting for: a long run that waits for images alone keeps few
        self._pending = [f for f in self._pending if not f.done() or f.exception() is not None]
        self._pending.append(future)
        self._images_pending.update(dict.fromkeys(images, future))
        return future

    def _drain(self, release: Sequence[str] = ()) -> None:
        with self._lock:
            records, self._queued, self._drain_due = self._queued, [], False
        if not records and not release:
            return
        try:
            self._write_rows(records, release)
        finally:
            with self._lock:
                for record in records:
                    if self._unwritten.get(record[0], (None, None))[1] == record[4]:
                        del self._unwritten[record[0]]

    def flush(self) -> None:
        """Wait for the queued writes (gathered rows too); the first that failed raises here."""
        self.write_gathered()
        pending, self._pending = self._pending, []
        self._images_pending = {}
        self._raise_failed(pending)

    def flush_images(self, keys: Iterable[str] | None = None) -> None:
        """Wait for the queued writes of images (of `keys`, or all): their files and index rows.
        Other queued writes (vectors, answers) go on; the first failure raises here."""
        if keys is None:
            waited, self._images_pending = set(self._images_pending.values()), {}
        else:
            waited = {f for k in keys if (f := self._images_pending.pop(k, None)) is not None}
        for future in waited:
            future.exception()  # waits for it
        # with those, any other write that has failed by now: a full disk stops the run at once
        done = [f for f in self._pending if f.done()]
        if done:
            self._pending = [f for f in self._pending if not f.done()]  # a failure raises once
            self._raise_failed(done)

    def _raise_failed(self, pending: Iterable[Future]) -> None:
        failed = next(filter(None, (f.exception() for f in pending)), None)
        if isinstance(failed, StoreError):
            raise failed
        if failed is not None and full_disk(failed):
            raise self._full(failed) from failed
        if failed is not None:  # a full disk, a lost file system: the run cannot keep what it computes
            raise StoreError(f"writing to the cache {self.root} failed: {type(failed).__name__}: {failed}") from failed
