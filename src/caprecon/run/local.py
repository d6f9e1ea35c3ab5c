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
import json
import logging
import math
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Sequence

from tqdm.auto import tqdm

from caprecon.core.errors import ConfigError, MetricContractError, ServerError
from caprecon.metrics.base import Context, Metric, checked_rows
from caprecon.models.common import ModelNotFoundError, release_memory
from caprecon.core.records import append_jsonl, open_for_append, write_jsonl_atomically
from caprecon.core.redaction import redact_text
from caprecon.data.images import Folders, LoadedSample, read_image
from caprecon.data.samples import Sample, SampleError
from caprecon.store.index import StoreError, content_key

log = logging.getLogger(__name__)

# errors that mean the configuration or the environment is wrong, not the row
FATAL = (ModelNotFoundError, ImportError, MemoryError, NotImplementedError, StoreError)
# a metric failing the same way on this many rows before it has scored any is broken, not its rows
SAME_FAILURE_LIMIT = 3


# caprecon's own errors: their messages are written for the user and say what to do
_OWN_ERRORS = (SampleError, ConfigError, StoreError, ModelNotFoundError)
# what to do once a model server failed; the row, or the run, is done again by the same command
RESUME_AFTER_SERVER = "once the server answers, run the same command again (what finished is kept)"


def explain_failure(exc: BaseException) -> str:
    """An exception as a message for the user: what happened and what to do, never a bare class
    name before its text. caprecon's own errors say both; a model server's failure gets the way to
    resume; a missing library, an unsupported operation and an out-of-memory say what they are; any
    other (a library's own error, a bug) keeps its type, as a detail at the end, and how to see more."""
    text = str(exc).strip()
    if isinstance(exc, _OWN_ERRORS):
        return text or type(exc).__name__
    if isinstance(exc, ServerError):
        return f"the model server failed: {text}; {RESUME_AFTER_SERVER}"
    if isinstance(exc, ImportError):
        return f"a library it needs cannot be imported ({text}): install it, or choose another model or metric"
    if isinstance(exc, NotImplementedError):
        return (f"the model does not support this{': ' + text if text else ''}; choose a backend that does "
                "(`caprecon models` lists them)")
    if isinstance(exc, MemoryError) or is_out_of_memory(exc):
        return f"out of memory{': ' + text if text else ''}; use a smaller model, dtype, --batch-size or --max-side"
    return (f"{text or 'an error without a message'} (an unexpected {type(exc).__name__} inside the model or metric: "
            "run again with --verbose for where it came from, and report it if the input is right)")


class RunError(RuntimeError):
    """A failure that is not about one row: the run stops with this message. `records` are
    the rows finished before it, in input order (set by `run_local`)."""

    records: list[dict[str, Any]] | None = None


class RunInterrupted(KeyboardInterrupt):
    """The run was interrupted (Ctrl-C); `records` are the rows finished so far, in input order.
    A KeyboardInterrupt, so code around `score()` that handles Ctrl-C still sees one."""

    def __init__(self, records: list[dict[str, Any]], total: int):
        super().__init__(f"interrupted after {len(records)} of {total} rows")
        self.records, self.total = records, total


def base_record(sample: Sample) -> dict[str, Any]:
    record: dict[str, Any] = {"id": sample.id, "image_id": sample.image_id, "candidate": sample.candidate,
                              "caption": sample.caption}
    if isinstance(sample.image, (str, Path)):
        record["image"] = str(sample.image)
    for key, value in _plain(sample.meta).items():
        if key not in record:  # a missing value in a table column is null in JSON, not NaN
            record[key] = None if isinstance(value, float) and not math.isfinite(value) else value
    return record


def is_out_of_memory(exc: BaseException) -> bool:
    """CUDA/MPS/XPU out-of-memory, by name and message: this module never imports torch."""
    return type(exc).__name__ == "OutOfMemoryError" or (
        isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower())


def out_of_memory_on_one_row(name: str, exc: BaseException) -> RunError:
    """What stops a run whose model cannot take even one row at a time."""
    return RunError(f"{name}: out of memory on a single row ({exc}); use a smaller model, dtype or --max-side, "
                    "or a larger accelerator")


def in_halving_runs(run: Callable[[list], list], items: list, watch: "FailureWatch") -> list:
    """`run` over `items` in runs of at most `watch.batch_limit` rows (all of them while it is
    None). A run out of memory halves the limit for the rest of the metric or stage and is
    tried again in the smaller runs; a single row out of memory stops the run with advice."""
    results: list = []
    while len(results) < len(items):
        part = items[len(results) : len(results) + (watch.batch_limit or len(items))]
        try:
            done = run(part)
            if len(done) != len(part):  # else the loop would ask again for ever for the rows it did not get
                raise RunError(f"{watch.name} returned {len(done)} results for {len(part)} rows; it must return "
                               f"one per row, in order")
            results += done
        except RunError:
            raise  # already the run's end (its message may quote an out-of-memory error)
        except Exception as exc:
            if not is_out_of_memory(exc):
                raise
            if len(part) == 1:
                raise out_of_memory_on_one_row(watch.name, exc) from exc
            watch.batch_limit = max(1, len(part) // 2)
            log.warning("%s: out of memory on a batch of %d; retrying with batches of %d",
                        watch.name, len(part), watch.batch_limit)
            release_memory()
    return results


def isolated(fn: Callable[[list], Sequence[Any]], items: list, watch: "FailureWatch", *,
             not_the_model: type[Exception] | tuple[type[Exception], ...] = ()) -> list[Any]:
    """`fn(items)`'s results, one per item, with each failed row's exception in its place: the
    one way a stage's model (a metric, the generator of a stage or a suite, a judge) meets
    failure. Runs are as long as the model takes (`in_halving_runs`: halved on out of memory);
    a run that fails otherwise is tried row by row, so one bad row costs only itself, and a
    single row out of memory stops the run with advice. What cannot be the rows' stops the run:
    a fatal error, or what `watch` judges (the same error on every row of a run). Failures of
    the `not_the_model` types are the rows' alone: `watch` does not count them."""
    def attempt(part: list) -> tuple[list[Any], Exception | None]:
        try:
            return list(fn(part)), None
        except MetricContractError:
            raise  # the metric's code is wrong: no row, alone or in a batch, can fix it
        except FATAL as exc:
            raise RunError(f"{watch.name}: {explain_failure(exc)}") from exc
        except Exception as exc:
            if is_out_of_memory(exc):
                raise  # in_halving_runs halves the run, or stops on a single row
            return [], exc

    def alone(item: Any) -> Any:
        try:
            results, failed = attempt([item])
        except RunError:
            raise
        except Exception as exc:  # out of memory on one row: halving the run again cannot help
            raise out_of_memory_on_one_row(watch.name, exc) from exc
        return failed if failed is not None else results[0]

    def run(part: list) -> list[Any]:
        results, failed = attempt(part)
        if failed is not None and len(part) == 1:
            results = [failed]
        elif failed is not None:
            log.warning("%s failed on a batch (%s); retrying row by row", watch.name, failed)
            results = [alone(item) for item in part]
        watch.batch([r for r in results if not isinstance(r, not_the_model)], failed)  # () matches nothing
        return results

    return in_halving_runs(run, items, watch)


def _signature(exc: Exception) -> tuple[str, str]:
    return type(exc).__name__, str(exc)


def stop_on_same_failure(name: str, results: Sequence[Any], cause: BaseException | None = None) -> None:
    """Stop the run when every row of a batch (more than one) failed with the same error."""
    failures = [r for r in results if isinstance(r, Exception)]
    if len(results) > 1 and len(failures) == len(results) and len({_signature(f) for f in failures}) == 1 \
            and not isinstance(failures[0], SampleError):
        raise RunError(f"{name} failed on every row of a batch with the same error, so the problem is "
                       f"not the rows: {explain_failure(failures[0])}") from (cause or failures[0])


class FailureWatch:
    """How one stage (a metric, the generator, a judge) has failed so far. It stops the run
    with the reason when a failure cannot be the rows' — the same error on every row of a
    batch, or on each of the first rows before any succeeded — and counts the others by
    reason, for the summary line every command ends with."""

    def __init__(self, name: str):
        self.name = name
        #: the most rows one call may take after running out of memory (None: the whole batch)
        self.batch_limit: int | None = None
        self.succeeded = 0
        self.early_failures: list[tuple[str, str]] = []
        self.by_reason: dict[str, int] = {}
        self.first_errors: dict[str, str] = {}  # reason -> the first message of it
        self.first_explained = ""  # the first early failure, as the user reads it

    def batch(self, results: Sequence[Any], cause: BaseException | None = None) -> None:
        """A batch's outcomes, row by row (an exception for a failed row); `cause` is what
        failed the batch as a whole, before its rows were tried one by one."""
        stop_on_same_failure(self.name, results, cause)
        self.observe(results)

    def observe(self, results: Sequence[Any]) -> None:
        for result in results:
            if not isinstance(result, Exception):
                self.succeeded += 1
                continue
            reason = failure_reason(self.name, result)
            self.by_reason[reason] = self.by_reason.get(reason, 0) + 1
            self.first_errors.setdefault(reason, redact_text(str(result))[:300])
            if not self.succeeded and not isinstance(result, SampleError):
                if not self.early_failures:
                    self.first_explained = explain_failure(result)
                self.early_failures.append(_signature(result))
        if not self.succeeded and len(self.early_failures) >= SAME_FAILURE_LIMIT \
                and len(set(self.early_failures)) == 1:
            raise RunError(f"{self.name} failed on each of the first {len(self.early_failures)} rows with "
                           f"the same error, so the problem is not the rows: {self.first_explained}")


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

        return isolated(rows, items, self.watch)

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
    plain = _plain(row)
    for key, value in plain.items():
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"{key} came out as {value}")
    return plain


def _plain(value: Any) -> Any:
    """numpy scalars and arrays to Python numbers and lists, so every value is written as JSON."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if hasattr(value, "tolist") and type(value).__module__ == "numpy":
        return value.tolist()
    return value


def failure_reason(metric: str | None, exc: Exception) -> str:
    """The short kind of a row failure that summaries count rows by."""
    if isinstance(exc, SampleError):
        return f"{metric}: {exc.reason}" if metric else exc.reason
    if isinstance(exc, ServerError):  # the server's failure, whichever client class said it
        return f"{metric}: model server failed"
    return f"{metric}: {type(exc).__name__}"


def fail_row(row: dict[str, Any], message: str, reason: str) -> None:
    row["error"] = "; ".join(filter(None, [row.get("error"), message]))
    row.setdefault("error_reasons", []).append(reason)


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
    behind = store.write_behind
    # reconstructions are written while the next model (the embedder, a judge) works; each
    # batch's images are written before its rows are, so a row never names a missing file (its
    # vectors and answers may still be queued: nothing waits on them until the run ends)
    store.write_behind = not store.read_only
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
        store.write_behind = behind
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
        return self._ahead.submit(self.read, batch) if self._ahead else self.read(batch)

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
        for i, result in zip(todo, (self.pool.map if self.pool else map)(work, [opened[i] for i in todo])):
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


def read_scores(path: Path) -> list[dict[str, Any]]:
    """The complete rows of a `scores.jsonl` a killed run left behind (its last line may be cut)."""
    rows = []
    if not path.exists():
        return rows
    for line in path.read_text(encoding="utf-8").split("\n"):
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue  # blank, or the line being written when the process died
        if isinstance(row, dict) and "id" in row:
            rows.append(row)
    return rows
