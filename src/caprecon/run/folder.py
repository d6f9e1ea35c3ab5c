"""The run folder: what a run writes, how it resumes, and the store it opens.

A run folder holds `scores.jsonl` (one record per sample: every score, the
reconstruction's path, any row error), `summary.json` and `summary.csv` (per metric:
mean, std, n; rows failed by reason) and `manifest.json` (versions, models and their
fingerprints, seeds, the full configuration, cache statistics, timings, and `status`:
running, interrupted, stopped (by a run-level error) or complete). Every command that
writes a run folder writes it through here; manifests are always redacted.
"""

from __future__ import annotations

import csv
import functools
import json
import math
import platform
from pathlib import Path
from typing import Any, Sequence

from caprecon.core.errors import ConfigError
from caprecon.core.paths import default_cache_dir
from caprecon.core.records import is_number
from caprecon.core.redaction import redact
from caprecon.data.samples import Sample
from caprecon.run.config import RunConfig
from caprecon.run.local import base_record, read_scores
from caprecon.store.index import Store


def prepare_out(out_dir: Path) -> None:
    """The run folder exists and is writable, or the run stops before any work."""
    if out_dir.exists() and not out_dir.is_dir():
        raise ConfigError(f"--out {out_dir} is a file; give a folder for the run's outputs")
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        probe = out_dir / ".caprecon-write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise ConfigError(f"--out {out_dir} is not writable ({exc.strerror or exc}); choose another folder") from None


_SAMPLE_FIELDS = ("caption", "image", "image_id", "candidate")
# settings that do not change any score: a run may resume with other values of them
_RESUME_FREE = {"batch_size", "workers", "cache_dir"}


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
    if cfg.no_cache:
        # nothing from earlier runs is read; the run's own results live in its folder
        return Store.fresh(out_dir / "store") if out_dir else Store.temporary()
    # a read-only (shared) cache is read as it is; new results go to an overlay, by default in the run folder
    overlay = cfg.cache_overlay or (out_dir / "cache-overlay" if out_dir else None)
    return Store.open(cfg.cache_dir or default_cache_dir(), overlay=overlay, read_only=cfg.cache_read_only)


def summarise(records: list[dict[str, Any]], metric_names: Sequence[str]) -> dict[str, Any]:
    """Per metric, mean/std/n over exactly the rows where that metric produced a number (a row
    that failed another metric still counts here); rows that failed anything, by reason."""
    metrics = {}
    for name in metric_names:
        values = [r[name] for r in records if is_number(r.get(name))]
        mean = sum(values) / len(values) if values else None
        std = math.sqrt(sum((v - mean) ** 2 for v in values) / len(values)) if values else None
        metrics[name] = {"mean": mean, "std": std, "n": len(values)}
    failed = [r for r in records if r.get("error")]
    reasons: dict[str, int] = {}
    for r in failed:
        for reason in dict.fromkeys(r.get("error_reasons") or ["error"]):  # a reason counts a row once
            reasons[reason] = reasons.get(reason, 0) + 1
    return {"samples": len(records), "errors": len(failed), "failed_by_reason": dict(sorted(reasons.items())),
            "metrics": metrics}


def write_run(out_dir: Path, summary: dict[str, Any], manifest: dict[str, Any]) -> None:
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2, allow_nan=False))
    with (out_dir / "summary.csv").open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["metric", "mean", "std", "n"])
        for name, s in summary["metrics"].items():
            writer.writerow([name, s["mean"], s["std"], s["n"]])
    write_manifest(out_dir, manifest)


def write_manifest(out_dir: Path, manifest: dict[str, Any]) -> Path:
    """The run folder's `manifest.json`, redacted: every command writes its manifest here, so
    no option's key, token or URL password reaches disk whatever the command put in it."""
    path = out_dir / "manifest.json"
    path.write_text(json.dumps(redact(manifest), indent=2, default=str))
    return path


@functools.lru_cache(maxsize=None)
def platform_name() -> str:
    return platform.platform()  # reads the interpreter's binary for its libc version: once a process
