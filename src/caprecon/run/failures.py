"""Row failures: what a failed row is, what stops a run, and how each stage's model meets failure.

`isolated` runs a stage's model (a metric, a generator, a judge) so that one bad row costs only
itself, halving the batch on out of memory; `FailureWatch` stops the run when a failure cannot
be the rows' and counts the others by reason; `explain_failure` says an exception to the user.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Sequence

from caprecon.core.errors import ConfigError, MetricContractError, ServerError
from caprecon.models.common import ModelNotFoundError, release_memory
from caprecon.core.redaction import redact_text
from caprecon.data.samples import SampleError
from caprecon.store.errors import StoreError

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
