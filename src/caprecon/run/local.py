"""The local executor: stream samples through the metrics in batches.

It owns the batch loop, the progress bar, row-level errors and incremental output:
each finished batch is appended to `scores.jsonl` at once, and every model result is
already in the store, so a crash loses at most the batch in flight and a re-run picks
everything else up from the cache. Rows already in `scores.jsonl` from an earlier,
interrupted run of the same settings are kept (`done`) and not scored again; the file
ends with each sample exactly once, in input order.

What is a row error and what stops the run:
- a `SampleError` (unreadable image, empty caption, ...) or an exception that one row's
  input causes is that row's error, for that metric only; the other metrics still score it;
- out of memory on an accelerator halves the batch and retries (and later batches of
  that metric stay at the smaller size); on a single row it stops the run;
- a failure that is not about one row — a missing model or library, an unsupported
  operation, the same error on every row of a batch, or on each of the first rows a
  metric sees — stops the run with one `RunError` naming the metric and the cause;
- a metric that breaks its contract (`metrics.base.checked_rows`: fewer or more rows than
  items, a row without its headline, text or an out-of-range value in a declared column)
  stops the run once its batch is finished: the batch's other metrics keep their values,
  its rows carry that metric's error, and every earlier batch is written.
"""

from __future__ import annotations

import errno
import logging
import math
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Sequence

from tqdm.auto import tqdm

from caprecon.core.errors import MetricContractError
from caprecon.metrics.base import Context, Metric, checked_rows
from caprecon.core.digests import handing_memo, write_remembered
from caprecon.core.records import append_jsonl, open_for_append, write_jsonl_atomically
from caprecon.core.redaction import redact_text
from caprecon.data.images import Folders, LoadedSample, read_image
from caprecon.data.samples import Sample, SampleError
from caprecon.run.failures import (FailureWatch, RunError, RunInterrupted, explain_failure, fail_row, failure_reason,
                                   isolated)
from caprecon.run.records import base_record, plain_json
from caprecon.store.errors import StoreError
from caprecon.store.index import content_key

log = logging.getLogger(__name__)


class MetricRunner:
    """One metric's scoring across the run: its batch size after OOM, and how it has failed so far."""

    def __init__(self, metric: Metric, ctx: Context, batch_size: int):
        self.metric, self.ctx = metric, ctx
        self.watch = FailureWatch(metric.name)
        self.watch.batch_limit = batch_size

    def score(self, items: list) -> list[dict[str, Any] | Exception]:
        """Each item's fields, or its row's exception; a metric that breaks its contract (`checked_rows`:
        a row per item, its declared columns numbers in their range) raises `MetricContractError`."""
        def rows(part: list) -> list[dict[str, Any]]:
            return [_checked(row) for row in checked_rows(self.metric, len(part), self.metric.score(part, self.ctx))]

        # a picture the store does not keep stays claimed until what the metric computed from it is written:
        # another process waiting for it finds that, not the record alone (`Store.keeping_claims`)
        with self.ctx.store.keeping_claims():
            return isolated(rows, items, self.watch)

    def score_pairs(self, images: Sequence[LoadedSample], texts: Sequence[str],
                    pairs: Sequence[tuple[int, int]]) -> list[dict[str, Any] | Exception]:
        """`score` of the (image, text) pairs `pairs` names (`Metric.score_pairs`): each pair's fields, or
        its exception; a run of pairs that fails is tried pair by pair, as a run of rows is."""
        def rows(part: list) -> list[dict[str, Any]]:
            return [_checked(row) for row in checked_rows(self.metric, len(part),
                                                          self.metric.score_pairs(images, texts, self.ctx, part))]

        with self.ctx.store.keeping_claims():  # as in `score`
            return isolated(rows, list(pairs), self.watch)

    def score_into(self, items: list, rows: list[dict[str, Any]]) -> None:
        """Score `items` and put each outcome in its row: the scores, or the row's error."""
        name = self.metric.name
        for row, result in zip(rows, self.score(items)):
            if isinstance(result, Exception):
                fail_row(row, redact_text(f"{name}: {explain_failure(result)}"), failure_reason(name, result))
            else:
                _check_own_columns(name, row, result)
                row.update(result)


def _check_own_columns(name: str, row: dict[str, Any], result: dict[str, Any]) -> None:
    """Each metric writes only its own columns: one that would overwrite another metric's value
    in this row is a bug of the metrics' definitions, not of the row, so the run stops. Fields
    that several metrics share with one value (the reconstruction's key, seed, ...) pass."""
    for key, value in result.items():
        if key in row and row[key] != value:
            raise RunError(f"{name} writes the column {key!r}, which another metric of this run already wrote with "
                           f"a different value ({row[key]!r}, now {value!r}): two metrics cannot share a column")


def _checked(row: dict[str, Any]) -> dict[str, Any]:
    """A metric's output as plain JSON values; a NaN or infinite score is that row's error."""
    plain = plain_json(row)
    for key, value in plain.items():
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"{key} came out as {value}")
    return plain


def run_local(samples: Sequence[Sample], metrics: Sequence[Metric], ctx: Context, *, batch_size: int = 16,
              scores_path: Path | None = None, progress: bool = True,
              done: dict[str, dict[str, Any]] | None = None, fields: dict[str, Any] | None = None,
              append: bool = False, desc: str = "scoring", workers: int = 4,
              row_numbers: Sequence[int] | None = None,
              on_rows: Callable[[list[dict[str, Any]]], None] | None = None) -> list[dict[str, Any]]:
    """Score `samples` in batches. `done` maps ids to rows a killed run already wrote (kept, not
    scored again); `fields` are added to every record; `append` adds this call's rows to
    `scores_path` after those of an earlier call (several generators in one file) instead of
    replacing it; `row_numbers` are the samples' rows in the input, for messages (a shard's
    samples are a slice of it); `on_rows` gets each finished batch's rows (the HTML report's
    thumbnails are made from them in the background). `workers` threads read, hash and decode the next batch's images
    while the models work on this one (one batch ahead, so memory stays bounded; 0: in line)."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, not {batch_size}")
    if workers < 0:
        raise ValueError(f"workers must be 0 or more, not {workers}")
    out = RunRows(samples, done, scores_path, append=append, on_rows=on_rows, progress=progress, desc=desc)
    todo = out.todo
    runners = [MetricRunner(m, ctx, batch_size) for m in metrics]
    caption_only = not any(m.needs_source_image for m in metrics)
    pool = ThreadPoolExecutor(workers, thread_name_prefix="caprecon-read") if workers else None
    batches = [todo[start : start + batch_size] for start in range(0, len(todo), batch_size)]
    reader = _BatchReader(ctx, caption_only, pool)
    store = ctx.store
    # reconstructions are written while the next model (the embedder, a judge) works; each
    # batch's images are written before its rows are, so a row never names a missing file (its
    # vectors and answers may still be queued: nothing waits on them until the run ends). A batch's
    # other rows are gathered: they go in its pictures' transaction, the rest in one at its end
    behind, gather = store.write_behind, store.gather_rows
    store.write_behind = store.gather_rows = not store.read_only
    try:
        upcoming = reader.submit(batches[0]) if batches else None
        for number, batch in enumerate(batches):
            opened = upcoming.result() if pool else upcoming
            if number + 1 < len(batches):  # the next batch is read while the models work on this one
                upcoming = reader.submit(batches[number + 1])
            rows = [{**base_record(s), **(fields or {})} for _, s in batch]
            items, positions = [], []
            for i, ((index, sample), got) in enumerate(zip(batch, opened)):
                if isinstance(got, SampleError):
                    row = row_numbers[index] if row_numbers else index
                    fail_row(rows[i], f"row {row} (id {sample.id}): {got}", got.reason)
                else:
                    items.append(got)
                    positions.append(i)
            reader.remember(items)
            broken = None
            for runner in runners:
                if not items:
                    break
                try:
                    runner.score_into(items, [rows[pos] for pos in positions])
                except MetricContractError as exc:  # the batch's other metrics are scored and kept, then it stops
                    broken = broken or exc
                    for pos in positions:
                        fail_row(rows[pos], str(exc), f"{runner.metric.name}: broken contract")
            store.write_gathered()  # the batch's vectors and answers, in one transaction (not waited for)
            _flush(store, images=True)  # the rows name the batch's reconstructions: their files first
            out.finish([index for index, _ in batch], rows)
            if broken is not None:
                raise RunError(f"{broken}; the run stops here") from broken
        _flush(store)  # and every other write (vectors, answers) before the run counts as done
    except KeyboardInterrupt:
        raise out.interrupted() from None
    except RunError as stop:
        raise out.stopped(stop)
    finally:
        try:
            store.flush()  # what was generated before a stop is kept
        except Exception as exc:  # the error that stopped the run is the one to report
            log.warning("a cache write failed: %s", exc)
        store.write_behind, store.gather_rows = behind, gather
        if pool:
            reader.close()
            pool.shutdown(cancel_futures=True)
        out.close()
    return out.records(rewrite=not append)


class RunRows:
    """A run's rows, kept by input position: those an earlier, killed run left (`done`, by id)
    and each finished batch, appended to `scores_path` as it comes and handed to `on_rows`.
    Both executors collect their rows here, so an interrupted or stopped run hands back what
    finished, and a finished one rewrites its file once, in input order."""

    def __init__(self, samples: Sequence[Sample], done: dict[str, dict[str, Any]] | None, scores_path: Path | None,
                 *, append: bool = False, on_rows: Callable[[list[dict[str, Any]]], None] | None = None,
                 progress: bool = True, desc: str = "scoring") -> None:
        done = dict(done or {})
        self.total = len(samples)
        self.todo = [(i, s) for i, s in enumerate(samples) if s.id not in done]
        self.by_position: dict[int, dict[str, Any]] = {i: done[s.id] for i, s in enumerate(samples) if s.id in done}
        self.scores_path, self.on_rows = scores_path, on_rows
        self.sink = None
        if scores_path:
            self.sink = (scores_path.open("a", encoding="utf-8") if append  # after an earlier call's rows
                         else open_for_append(scores_path, self.so_far()))
        self.bar = tqdm(total=self.total, initial=len(self.by_position), desc=desc, unit="sample",
                        disable=not progress, dynamic_ncols=True)

    def so_far(self) -> list[dict[str, Any]]:
        return [self.by_position[i] for i in sorted(self.by_position)]

    def finish(self, positions: Sequence[int], rows: list[dict[str, Any]]) -> None:
        for position, row in zip(positions, rows):
            self.by_position[int(position)] = row
        if self.sink:
            self._append(rows)
        if self.on_rows:
            self.on_rows(rows)
        self.bar.update(len(rows))

    def _append(self, rows: list[dict[str, Any]]) -> None:
        """Rows onto the scores file; when the disk refuses them, the file is cut back to the
        rows before, so it stays whole lines that a re-run resumes from, and the run stops."""
        start = self.sink.tell()
        try:
            append_jsonl(self.sink, rows)
        except OSError as exc:
            sink, self.sink = self.sink, None
            try:
                sink.close()  # flushing what is left in its buffer fails the same way
            except OSError:
                pass
            os.truncate(self.scores_path, start)
            full = exc.errno in (errno.ENOSPC, errno.EDQUOT)
            raise RunError(f"{self.scores_path.parent} is full ({exc.strerror}): free space there" if full
                           else f"cannot write {self.scores_path}: {exc.strerror or exc}") from exc

    def interrupted(self) -> RunInterrupted:
        return RunInterrupted(self.so_far(), self.total)

    def stopped(self, stop: RunError) -> RunError:
        stop.records = self.so_far()
        return stop

    def close(self) -> None:
        self.bar.close()
        if self.sink:
            self.sink.close()

    def records(self, *, rewrite: bool = True) -> list[dict[str, Any]]:
        """Every row in input order; with `rewrite`, the finished file: every row once, in that order."""
        records = [self.by_position[i] for i in range(self.total)]
        if self.scores_path and rewrite:
            write_jsonl_atomically(self.scores_path, records)
        return records


def _flush(store, *, images: bool = False) -> None:
    """Wait for the store's queued writes (`images`: those of images alone); a failed one stops the run."""
    try:
        store.flush_images() if images else store.flush()
    except StoreError as exc:
        raise RunError(str(exc)) from exc


class _BatchReader:
    """Opens a batch's samples: reads and hashes each file and decodes it, except bytes the
    store has seen decode before (their size is recorded), which stay undecoded until a
    metric needs the pixels — a fully cached run decodes nothing. With a thread pool the
    files are read in parallel and a batch can be read while the previous one is scored; a
    file whose digest is remembered is answered in line from a stat, and only reading,
    hashing and decoding go to the pool."""

    KIND = "source-size"

    def __init__(self, ctx: Context, caption_only: bool, pool: ThreadPoolExecutor | None):
        self.ctx, self.caption_only, self.pool = ctx, caption_only, pool
        # the batch ahead is gathered on a thread of its own, which hands the files to `pool`:
        # run inside `pool`, it would wait on its own files, for ever with one worker
        self._ahead = ThreadPoolExecutor(1, thread_name_prefix="caprecon-ahead") if pool else None

    def submit(self, batch: list[tuple[int, Sample]]):
        # the thread ahead, and the pool's, hash files into the run's memo (a thread starts with none)
        return self._ahead.submit(handing_memo(self.read), batch) if self._ahead else self.read(batch)

    def close(self) -> None:
        if self._ahead:
            self._ahead.shutdown(cancel_futures=True)

    def read(self, batch: list[tuple[int, Sample]]) -> list[LoadedSample | SampleError]:
        # a file whose digest is remembered needs a stat, made here: handing it to a pool thread
        # cost more than the stat (a cached 512-row run took twice as long); files to read and
        # hash, and pictures to decode, go to the pool
        folders = Folders()  # a batch's files mostly share their folder: it is resolved once
        opened: list[Any] = [self._read_one(s, folders) for _, s in batch]
        self._fill(opened, self._finish, callable)
        write_remembered()  # the digests of the files just hashed, in one transaction
        files = [o for o in opened if isinstance(o, LoadedSample) and not o.decoded]
        # rows of one picture (several captions of it) share a key, and each takes the size
        known = self.ctx.store.get_json(list({self._key(o.image_key) for o in files})) if files else {}
        for item in files:
            size = known.get(self._key(item.image_key))
            if size is not None:
                item.assume_size(tuple(size))
        self._fill(opened, self._decode_unseen, self._unseen)
        return opened

    def _fill(self, opened: list[Any], work: Callable[[Any], Any], due: Callable[[Any], bool]) -> None:
        """opened[i] = work(opened[i]) for each i where due(opened[i]), on the pool's threads."""
        todo = [i for i, o in enumerate(opened) if due(o)]
        results = (self.pool.map if self.pool else map)(handing_memo(work), [opened[i] for i in todo])
        for i, result in zip(todo, results):
            opened[i] = result

    def _read_one(self, sample: Sample, folders: Folders) -> LoadedSample | SampleError | Callable[[], LoadedSample]:
        """The sample opened as far as a stat goes; what is left (reading, hashing) as a call."""
        try:
            return read_image(sample, caption_only=self.caption_only, later=True, folders=folders)
        except SampleError as exc:
            return exc

    @staticmethod
    def _finish(rest: Callable[[], LoadedSample]) -> LoadedSample | SampleError:
        try:
            return rest()
        except SampleError as exc:
            return exc

    @staticmethod
    def _unseen(item: LoadedSample | SampleError) -> bool:
        return isinstance(item, LoadedSample) and not item.decoded and not item.size_known

    @classmethod
    def _decode_unseen(cls, item: LoadedSample | SampleError) -> LoadedSample | SampleError:
        if cls._unseen(item):
            try:
                item.image  # noqa: B018 -- a file that does not decode is this row's error, now
            except SampleError as exc:
                return exc
        return item

    def remember(self, items: list[LoadedSample]) -> None:
        """Record the sizes of files decoded for the first time, so later runs skip decoding them,
        and make the report's thumbnails of those pictures from the pixels now in memory."""
        fresh = [it for it in items if it.from_bytes and not it.size_known]
        if fresh and not self.ctx.store.read_only:
            self.ctx.store.put_json(self.KIND, {self._key(it.image_key): list(it.size) for it in fresh})
            self.ctx.store.put_thumbnails({str(it.sample.image): (it.image, it.bytes_head) for it in fresh
                                           if isinstance(it.sample.image, (str, Path))})

    def _key(self, image_key: str) -> str:
        return content_key(self.KIND, image=image_key)
