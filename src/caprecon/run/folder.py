"""The run folder: what a run writes, how it resumes, and the store it opens.

A run folder holds `scores.jsonl` (one record per sample: every score, the
reconstruction's path, any row error), `summary.json` and `summary.csv` (per metric:
mean, std, n, and a corpus-level metric's pooled value; rows failed by reason) and `manifest.json` (versions, models and their
fingerprints, seeds, the full configuration, cache statistics, timings, and `status`:
running, interrupted, stopped (by a run-level error) or complete). Every command that
writes a run folder writes it through here; manifests are always redacted.

The lifecycle every such command goes through:

- prologue (`run_folder`, before any model loads or any work is done): `--out` is refused, in one
  line, when it is a file, when it lies inside an input folder, or when another run holds it; then
  the folder is created and its lock (`.caprecon.lock`, an flock the kernel drops when the holder
  dies) is taken for the whole run, so two runs never write one folder at once;
- the run writes its manifest with `write_manifest` and its `summary.json` with `write_summary`;
- epilogue: `closing_lines`, the same last lines for every command (where the outputs and the report
  are), and the lock is released.
"""

from __future__ import annotations

import contextlib
import csv
import fcntl
import functools
import inspect
import json
import logging
import math
import os
import platform
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

from caprecon.core.errors import ConfigError
from caprecon.core.paths import default_cache_dir
from caprecon.core.records import is_number, json_text
from caprecon.core.scaling import rescale, unit_scale
from caprecon.core.redaction import redact, redact_text
from caprecon.data.samples import Sample
from caprecon.metrics.base import CORPUS
from caprecon.run.config import RunConfig
from caprecon.run.records import base_record, read_scores
from caprecon.store.index import Store


LOCK_FILE = ".caprecon.lock"
_log = logging.getLogger("caprecon")
# folders this process holds: [lock file, how deep, whether the run made the folder, the holding thread].
# A command's own calls into the API on its thread (caption's scoring, score's report) are the same run;
# another thread of this process is another run, refused as one in another process is
_held: dict[Path, list] = {}
_held_guard = threading.Lock()


def _paths(values: Iterable[Any]) -> list[Path]:
    """The paths among a command's inputs (an input may also be rows, or a list of files)."""
    found = []
    for value in values:
        if isinstance(value, (str, os.PathLike)):
            found.append(Path(value))
        elif isinstance(value, (list, tuple)):
            found += _paths(value)
    return found


def check_out(path: str | Path, *, inputs: Iterable[Any] = (), trees: Iterable[Any] = (), option: str = "--out",
              file: bool = False) -> Path:
    """What a command is asked to write, refused in one line before it does anything: a file where a
    folder is expected (or the reverse), an input itself, or a place inside a folder the command
    searches to its depth (`trees`), where its outputs would be read as inputs when it runs again."""
    if not str(path).strip():  # an unset shell variable: Path('') is the working folder, written into unasked
        raise ConfigError(f"{option} is empty ({str(path)!r}); give a {'file name' if file else 'folder'}")
    out = Path(path)
    if file and out.is_dir():
        raise ConfigError(f"{option} {out} is a folder; give a file name")
    if not file and out.exists() and not out.is_dir():
        raise ConfigError(f"{option} {out} is a file; give a folder for the run's outputs")
    where = out.resolve()
    for given, searched in [*((p, False) for p in _paths(inputs)), *((p, True) for p in _paths(trees))]:
        source = given.resolve()
        if where == source or (searched and where.is_relative_to(source)):
            raise ConfigError(f"{option} {out} lies inside the input {given}; give a place outside what the "
                              "command reads")
    return out


def _holder(text: str) -> str:
    try:
        info = json.loads(text)
        return f"pid {info['pid']} on {info['host']}, started {info['started']}: {info['command']}"
    except (ValueError, KeyError, TypeError):
        return "a run that left no details"


@contextlib.contextmanager
def run_folder(path: str | Path, *, inputs: Iterable[Any] = (), trees: Iterable[Any] = (),
               option: str = "--out") -> Iterator[Path]:
    """The prologue and the lock: `path` checked (`check_out`), created, writable, and held by this
    process until the block ends. A second run into a held folder is refused with a message naming the
    first; a lock left by a process that is gone (killed) is taken over with a warning. A folder this
    made for a run that then stopped before writing anything is removed again."""
    out = check_out(path, inputs=inputs, trees=trees, option=option)
    key = out.resolve()
    with _held_guard:
        if key in _held and _held[key][3] != threading.get_ident():
            raise ConfigError(f"{option} {out} is in use by another run in this process (thread "
                              f"{_held[key][3]}); wait for it to end or give another {option}")
        if key in _held:
            _held[key][1] += 1
        else:
            made = not out.exists()
            _held[key] = [_lock(out, option), 1, made, threading.get_ident()]
    failed = True
    try:
        yield out
        failed = False
    finally:
        with _held_guard:
            _held[key][1] -= 1
            if _held[key][1] == 0:
                handle, _, made, _ = _held.pop(key)
                handle.truncate(0)  # an empty lock file: its run ended as it should
                if failed and made and [p.name for p in out.iterdir()] == [LOCK_FILE]:
                    (out / LOCK_FILE).unlink()
                    out.rmdir()
                handle.close()  # drops the flock; the file stays, so no other run locks a vanished inode


def _lock(out: Path, option: str):
    try:
        out.mkdir(parents=True, exist_ok=True)
        handle = (out / LOCK_FILE).open("a+", encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{option} {out} is not writable ({exc.strerror or exc}); choose another folder") from None
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        first = _holder(handle.read())
        handle.close()
        raise ConfigError(f"{option} {out} is in use by another run ({first}); wait for it to end or give "
                          f"another {option}") from None
    handle.seek(0)
    left = handle.read()
    if left.strip():
        _log.warning("%s %s: the run that held it (%s) is gone without finishing; this run takes the folder over",
                     option, out, _holder(left))
    handle.truncate(0)
    handle.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                             "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
                             "command": redact_text(" ".join(sys.argv))}))
    handle.flush()
    return handle


def holds_run_folder(out: str = "out", inputs: Sequence[str] = ()) -> Callable:
    """For a Python API function that writes a run folder (its parameter `out`): the prologue,
    `run_folder`, runs before its body, with the parameters named in `inputs` as what it reads."""

    def decorate(function: Callable) -> Callable:
        signature = inspect.signature(function)

        @functools.wraps(function)
        def run(*args: Any, **kwargs: Any) -> Any:
            given = signature.bind_partial(*args, **kwargs).arguments
            if given.get(out) is None:
                return function(*args, **kwargs)
            with run_folder(given[out], inputs=[given.get(name) for name in inputs]):
                return function(*args, **kwargs)

        return run

    return decorate


def closing_lines(out_dir: str | Path | None, outputs: str | None = None) -> list[str]:
    """The last lines of every command that writes a run folder: where its outputs are (`outputs`,
    the main file in it, when there is one) and where its report is."""
    if out_dir is None:
        return ["outputs: not saved (no --out)"]
    out_dir = Path(out_dir)
    lines = [f"outputs: {out_dir / outputs if outputs else out_dir}"]
    if (out_dir / "report.html").is_file():
        lines.append(f"report: {out_dir / 'report.html'}")
    return lines


_SAMPLE_FIELDS = ("caption", "image", "image_id", "candidate")
# settings that do not change any score: a run may resume with other values of them
_RESUME_FREE = {"batch_size", "workers", "cache_dir", "allow_plugins"}


def resumable_rows(out_dir: Path, cfg: RunConfig, metric_names: list[str], rows: list[Sample]) -> dict[str, dict]:
    """Rows of an unfinished earlier run in this folder that need no work: same settings, no
    error, every metric. A finished run's folder is simply written over."""
    previous = read_scores(out_dir / "scores.jsonl")
    try:
        before = json.loads((out_dir / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        before = {}
    if not previous or before.get("status") not in ("running", "interrupted", "stopped"):
        return {}
    now = {k: v for k, v in cfg.to_dict().items() if k not in _RESUME_FREE}
    then = {k: v for k, v in (before.get("config") or {}).items() if k not in _RESUME_FREE}
    changed = sorted(k for k in now.keys() | then.keys() if now.get(k) != then.get(k))
    if changed or before.get("metric_names") != metric_names:
        what = ", ".join(changed) if changed else "the metrics"
        raise ConfigError(f"--out {out_dir} holds a run with other settings ({what} differ); give another --out, "
                          f"or delete {out_dir / 'scores.jsonl'} to start this folder over")
    # a row is kept only if its sample is unchanged: same caption, image, image id and candidate
    wanted = {s.id: {k: v for k, v in base_record(s).items() if k in _SAMPLE_FIELDS} for s in rows}

    def unchanged(row: dict[str, Any]) -> bool:
        sample = wanted.get(row["id"])
        return sample is not None and sample == {k: row.get(k) for k in sample}

    return {r["id"]: r for r in previous
            if unchanged(r) and not r.get("error") and all(name in r for name in metric_names)}


def open_store(cfg: RunConfig, out_dir: Path | None) -> Store:
    policy = {"keep": cfg.keep, "max_size": cfg.cache_max_size}
    if cfg.no_cache:
        # nothing from earlier runs is read; the run's own results live in its folder
        return Store.fresh(out_dir / "store", **policy) if out_dir else Store.temporary(**policy)
    # a read-only (shared) cache is read as it is; new results go to an overlay, by default in the run folder
    overlay = cfg.cache_overlay or (out_dir / "cache-overlay" if out_dir else None)
    return Store.open(cfg.cache_dir or default_cache_dir(), overlay=overlay, read_only=cfg.cache_read_only,
                      **policy)


def scores_path(run: str | Path) -> Path:
    """A run's scores file: `run` itself when it is a file, else the run folder's scores.jsonl."""
    return Path(run) if Path(run).is_file() else Path(run) / "scores.jsonl"


def corpus_values(summary: dict[str, Any], metrics: Sequence[Any], records: Sequence[dict[str, Any]],
                  rows: Sequence[Sample]) -> dict[str, Any]:
    """A corpus-level column's summary (BLEU, METEOR, CIDEr: `Column.aggregate == "corpus"`) is the
    metric's corpus value over the rows that have a value in that column (`corpus`, beside the rows'
    mean). The rows are the run's: one shard's in a shard, every shard's in their merge. Returns the
    statistics those values pool, by column (`write_corpus_statistics` keeps them for a merge)."""
    by_id = {s.id: s for s in rows}
    statistics: dict[str, Any] = {}
    for metric in metrics:
        for column in metric.columns:
            entry = summary["metrics"].get(column.name)
            if column.aggregate != CORPUS or not entry or not entry["n"]:
                continue
            scored = [by_id[r["id"]] for r in records if is_number(r.get(column.name)) and r.get("id") in by_id]
            values, parts = metric.corpus_statistics(scored)
            entry["corpus"] = values.get(column.name)
            entry["aggregate"] = CORPUS
            if column.name in parts:
                statistics[column.name] = parts[column.name]
    return statistics


CORPUS_STATISTICS_FILE = "corpus-statistics.json"


def write_corpus_statistics(out_dir: Path, parts: dict[str, Any]) -> None:
    """The run folder's `corpus-statistics.json`: the row-by-row statistics behind its corpus values
    (`metrics/reference_statistics.py`), strict JSON, from which `merge` computes the corpus value of
    all shards without their input. A run with none removes an earlier run's file."""
    path = Path(out_dir) / CORPUS_STATISTICS_FILE
    if not parts:
        path.unlink(missing_ok=True)
        return
    from caprecon.metrics.reference_statistics import statistics_document

    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(json_text(statistics_document(parts), allow_nan=False), encoding="utf-8")
    temporary.replace(path)


def read_corpus_statistics(folder: Path) -> dict[str, Any] | None:
    """The statistics a run folder keeps (`write_corpus_statistics`), by column; None when it has
    none. A damaged or foreign file is a ConfigError naming it."""
    from caprecon.metrics.reference_statistics import CorpusStatisticsError, parts_from_document

    path = Path(folder) / CORPUS_STATISTICS_FILE
    try:
        document = json.loads(path.read_text(encoding="utf-8"), parse_constant=_refuse_constant)
    except FileNotFoundError:
        return None
    except (ValueError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path} is not valid JSON ({exc}); score that run again") from None
    try:
        return parts_from_document(document, str(path))
    except CorpusStatisticsError as exc:
        raise ConfigError(str(exc)) from None


def _refuse_constant(name: str) -> None:  # NaN and Infinity: Python's json reads them, strict JSON has none
    raise ValueError(f"{name} is no JSON number")


def summarise(records: list[dict[str, Any]], metric_names: Sequence[str]) -> dict[str, Any]:
    """Per metric, mean/std/n over exactly the rows where that metric produced a number (a row
    that failed another metric still counts here); rows that failed anything, by reason."""
    metrics = {}
    for name in metric_names:
        values = [r[name] for r in records if is_number(r.get(name))]
        # at unit scale: scores near 1e308 summed to inf, and summary.json could not be written
        scaled, exponent = unit_scale(values)
        mean = sum(scaled) / len(scaled) if values else None
        std = math.sqrt(sum((v - mean) ** 2 for v in scaled) / len(scaled)) if values else None
        metrics[name] = {"mean": None if mean is None else rescale(mean, exponent),
                         "std": None if std is None else rescale(std, exponent), "n": len(values)}
    failed = [r for r in records if r.get("error")]
    reasons: dict[str, int] = {}
    for r in failed:
        for reason in dict.fromkeys(r.get("error_reasons") or ["error"]):  # a reason counts a row once
            reasons[reason] = reasons.get(reason, 0) + 1
    return {"samples": len(records), "errors": len(failed), "failed_by_reason": dict(sorted(reasons.items())),
            "metrics": metrics}


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def write_summary(out_dir: Path, summary: dict[str, Any]) -> Path:
    """The run folder's `summary.json`, whichever command wrote it: strict JSON (a number that is
    not finite is null), so any JSON reader can open it."""
    path = Path(out_dir) / "summary.json"
    path.write_text(json_text(_finite(summary), indent=2, allow_nan=False), encoding="utf-8")
    return path


def write_run(out_dir: Path, summary: dict[str, Any], manifest: dict[str, Any]) -> None:
    write_summary(out_dir, summary)
    with (out_dir / "summary.csv").open("w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(["metric", "mean", "std", "n", "corpus"])  # corpus: BLEU's, METEOR's pooled value
        for name, s in summary["metrics"].items():
            corpus = s.get("corpus")
            writer.writerow([name, s["mean"], s["std"], s["n"], "" if corpus is None else corpus])
    write_manifest(out_dir, manifest)


def write_reports(out_dir: Path, records: Sequence[dict[str, Any]], summary: dict[str, Any],
                  metric_names: Sequence[str], *, progress: bool = False,
                  thumbnails: Mapping[str, str] | None = None) -> None:
    """What a scored run folder shows beside its scores, whichever command made it (`score`, `merge`):
    the per-category table and radar of its question-bank metric (turing, else halluc) when that
    metric scored a row, and `report.html` when the run has rows (an input with none says so itself).
    `thumbnails`: those the run made as it worked (`ThumbnailWriter.made`), which the page takes as made."""
    for metric in ("turing", "halluc"):
        if metric in metric_names and (summary["metrics"].get(metric) or {}).get("n"):
            from caprecon.reports.categories import write_report

            write_report(records, out_dir, metric=metric)
            break
    if records:
        from caprecon.reports.html import write_html_report

        write_html_report(out_dir, progress=progress, thumbnails=thumbnails)


def write_manifest(out_dir: Path, manifest: dict[str, Any]) -> Path:
    """The run folder's `manifest.json`, redacted: every command writes its manifest here, so
    no option's key, token or URL password reaches disk whatever the command put in it. Strict JSON,
    as `summary.json`: a number that is not finite is null."""
    path = Path(out_dir) / "manifest.json"
    # objects made text first, so their text is redacted too (a backend's repr may show its key)
    plain = json.loads(json.dumps(manifest, default=str))
    path.write_text(json.dumps(_finite(redact(plain)), indent=2, allow_nan=False))
    return path


@functools.lru_cache(maxsize=None)
def platform_name() -> str:
    return platform.platform()  # reads the interpreter's binary for its libc version: once a process
