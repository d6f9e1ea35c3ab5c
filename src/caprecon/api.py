"""`score()`: the one-call Python API, and the run folder it writes.

    results = caprecon.score("captions.jsonl", metrics=["recon"], preset="fast", out="runs/a")
    results.summary["metrics"]["recon"]["mean"]

A run folder holds `scores.jsonl` (one record per sample: every score, the
reconstruction's path, any row error), `summary.json` and `summary.csv` (per metric:
mean, std, n; rows failed by reason) and `manifest.json` (versions, models and their
fingerprints, seeds, the full configuration, cache statistics, timings, and `status`:
running, interrupted, stopped (by a run-level error) or complete).

Running again into the folder of an interrupted run resumes it: rows already scored
without error are kept, the rest are scored (their model results mostly come from the
cache). A folder that holds a run of other settings is refused rather than mixed.
"""

from __future__ import annotations

import csv
import functools
import json
import math
import platform
import sys
import time
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, Iterable, Sequence

from caprecon.run.config import ConfigError, Roles, RunConfig
from caprecon.metrics import Context, Metric, build_metric
from caprecon.data.normalise import normalised_samples
from caprecon.core.redaction import redact
from caprecon.run.local import RunError, RunInterrupted, base_record, read_scores, run_local
from caprecon.data.samples import Sample, has_image, load_samples
from caprecon.store.index import Store, default_cache_dir
from caprecon.core.tables import format_table


@dataclass
class Results:
    records: list[dict[str, Any]]
    summary: dict[str, Any]
    manifest: dict[str, Any]
    out: Path | None = None
    metric_names: list[str] = field(default_factory=list)

    def scores(self, metric: str) -> list[float | None]:
        return [r.get(metric) for r in self.records]

    def table(self, max_caption: int = 48) -> str:
        """Per-sample scores as an aligned text table."""
        headers = ["id", "caption", *self.metric_names, "note"]
        lines = []
        for r in self.records:
            caption = str(r.get("caption", ""))
            caption = caption if len(caption) <= max_caption else caption[: max_caption - 1] + "…"
            values = [_fmt(r.get(m)) for m in self.metric_names]
            note = r.get("error") or (f"{r['tokens_cut']} tokens cut" if r.get("tokens_cut") else "")
            lines.append([str(r.get("id", "")), caption, *values, note])
        return format_table([headers, *lines])

    def summary_table(self) -> str:
        rows = [["metric", "mean", "std", "n"]]
        for name, s in self.summary["metrics"].items():
            rows.append([name, _fmt(s["mean"]), _fmt(s["std"]), str(s["n"])])
        return format_table(rows)


def _fmt(value: Any) -> str:
    return f"{value:.4f}" if isinstance(value, float) else ("" if value is None else str(value))


def score(
    samples: str | Path | Iterable[Sample | dict],
    metrics: Sequence[str | Metric] | str | None = None,
    *,
    preset: str | None = None,
    config: str | Path | None = None,
    out: str | Path | None = None,
    progress: bool = False,
    images_root: str | Path | None = None,
    annotations: str | Path | None = None,
    captions: str | Path | None = None,
    shard: str | tuple[int, int] | None = None,
    executor: str = "local",
    ray: dict[str, Any] | None = None,
    **settings: Any,
) -> Results:
    """Score samples with metrics (names or `Metric` objects; default: the config's, else recon).

    `settings` are `RunConfig` fields (generator, embedder, clip, template, seed,
    seed_policy, max_side, batch_size, cache_dir, no_cache, ...); models may be given as
    registry names, hub ids, local folders or already-built objects. `shard="i/n"` scores
    one slice of the input (`caprecon merge` joins the slices); `executor="ray"` runs the
    plan on Ray Data, with `ray` the options of `caprecon.run.ray.run_ray`.
    """
    started = time.time()
    metrics = [metrics] if isinstance(metrics, (str, Metric)) else list(metrics or [])
    names = [m for m in metrics if isinstance(m, str)]
    cfg = RunConfig.build(preset=preset, file=config, **({"metrics": names} if names else {}), **settings)
    metrics = metrics or list(cfg.metrics)  # none given: the config's (default: recon)
    rows = load_samples(samples, images_root=images_root, annotations=annotations, captions=captions)
    _check_unique_ids(rows)
    if cfg.normalise_captions:
        rows = normalised_samples(rows)
    shard_info = row_numbers = None
    if shard is not None:
        from caprecon.run.shards import parse_shard, select_shard

        rows, shard_info = select_shard(rows, parse_shard(shard))
        row_numbers = shard_info["positions"]

    # everything that can be wrong with the configuration fails here, before any work
    roles = Roles(cfg)
    built = [m if isinstance(m, Metric) else build_metric(m, roles, cfg) for m in metrics]
    check_images(rows, built)
    metric_names = [m.headline for m in built]
    out_dir = Path(out) if out else None
    done: dict[str, dict[str, Any]] = {}
    if out_dir:
        _prepare_out(out_dir)
        done = {} if cfg.no_cache else _resumable(out_dir, cfg, metric_names, rows)
        (out_dir / "manifest.json").write_text(json.dumps(
            redact({"status": "running", "config": cfg.to_dict(), "metric_names": metric_names, "samples": len(rows)}),
            indent=2, default=str))
    store = _open_store(cfg, out_dir)
    ctx = Context(store)
    thumbnails = _thumbnail_writer(out_dir, store)

    try:
        if executor == "ray":
            from caprecon.run.ray import run_ray

            records = run_ray(rows, built, cfg, ctx, done=done, progress=progress, row_numbers=row_numbers,
                              scores_path=out_dir / "scores.jsonl" if out_dir else None,
                              on_rows=thumbnails.add if thumbnails else None, **(ray or {}))
        elif executor == "local":
            records = run_local(rows, built, ctx, batch_size=cfg.batch_size, workers=cfg.workers, done=done,
                                row_numbers=row_numbers, scores_path=out_dir / "scores.jsonl" if out_dir else None,
                                progress=progress, on_rows=thumbnails.add if thumbnails else None)
        else:
            raise ConfigError(f"--executor must be local or ray, not {executor!r}")
    except (RunInterrupted, RunError) as stop:
        if thumbnails:
            thumbnails.close(wait=False)
        if out_dir and stop.records is not None:  # what finished is summarised; the manifest says it can resume
            summary = {**summarise(stop.records, metric_names), "complete": False, "total": len(rows)}
            status = "interrupted" if isinstance(stop, RunInterrupted) else "stopped"
            write_run(out_dir, summary, redact({
                "status": status, "command": sys.argv if Path(sys.argv[0]).name == "caprecon" else None,
                "config": cfg.to_dict(), "metric_names": metric_names, "samples": len(rows),
                "rows_written": len(stop.records), "cache": ctx.stats(),
                **({"error": str(stop)} if status == "stopped" else {})}))
        raise
    except BaseException:
        if thumbnails:
            thumbnails.close(wait=False)
        raise
    summary = summarise(records, metric_names)
    manifest = {
        "status": "complete",
        "resumed_rows": len(done),
        "caprecon": _version("caprecon"),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(started)),
        "seconds": round(time.time() - started, 3),
        "command": sys.argv if Path(sys.argv[0]).name == "caprecon" else None,
        "python": platform.python_version(),
        "platform": _platform(),
        "libraries": {lib: _version(lib) for lib in ("torch", "diffusers", "transformers", "numpy", "pillow")},
        "config": cfg.to_dict(),
        "reconstruction": {"template": cfg.spec.template, "seed": cfg.seed, "seed_policy": cfg.seed_policy,
                           "max_side": cfg.max_side, "upscale": cfg.upscale, "size": cfg.size},
        "captions_normalised": cfg.normalise_captions,
        "models": roles.describe(),
        "metrics": [m.describe() for m in built],
        "store": store.describe(),
        "cache": ctx.stats(),
        "samples": len(rows),
        "metric_names": metric_names,
        "executor": executor,
        **({"shard": shard_info} if shard_info else {}),
    }
    manifest = redact(manifest)  # API keys and tokens among the options never reach disk
    if out_dir:
        write_run(out_dir, summary, manifest)
        if "turing" in metric_names and summary["metrics"]["turing"]["n"]:
            from caprecon.reports.categories import write_report

            write_report(records, out_dir, metric="turing")
        from caprecon.reports.html import write_html_report

        if thumbnails:
            thumbnails.close()  # the report finds the thumbnails made while the run worked
        write_html_report(out_dir, progress=progress)
    return Results(records, summary, manifest, out_dir, metric_names)


def _thumbnail_writer(out_dir: Path | None, store: Any):
    """Makes the report's thumbnails while the run works (into the store's thumbnail cache,
    linked into the run folder), so the report at the end has little left to do."""
    if out_dir is None:
        return None
    from caprecon.reports.html.page import FILES
    from caprecon.store.thumbs import ThumbnailWriter, cache_folder

    return ThumbnailWriter(out_dir, out_dir / FILES / "thumbs",
                           cache=None if store.read_only else cache_folder(store.root))


def check_images(rows: Sequence[Sample], metrics: Sequence[Metric]) -> None:
    """Caption-only rows are valid only when no metric compares with the source image."""
    needing = [m.name for m in metrics if m.needs_source_image]
    missing = [i for i, s in enumerate(rows) if not has_image(s)]
    if needing and missing:
        first = missing[0]
        raise ConfigError(
            f"{len(missing)} row(s) have no image (first: row {first}, id {rows[first].id!r}), but "
            f"{', '.join(needing)} compare(s) the caption with its source image. Give every row an image, or "
            f"score caption-only rows with metrics that need none (vqascore --vqa-on reconstruction; "
            f"`caprecon t2i` for generators)")


def _check_unique_ids(rows: list[Sample]) -> None:
    seen: dict[str, int] = {}
    for i, s in enumerate(rows):
        if s.id in seen:
            raise ConfigError(f"sample id {s.id!r} appears in rows {seen[s.id]} and {i}; ids must be unique")
        seen[s.id] = i


def _prepare_out(out_dir: Path) -> None:
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


def _resumable(out_dir: Path, cfg: RunConfig, metric_names: list[str], rows: list[Sample]) -> dict[str, dict]:
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


def _open_store(cfg: RunConfig, out_dir: Path | None) -> Store:
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
        values = [r[name] for r in records if _is_number(r.get(name))]
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


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def write_run(out_dir: Path, summary: dict[str, Any], manifest: dict[str, Any]) -> None:
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2, allow_nan=False))
    with (out_dir / "summary.csv").open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["metric", "mean", "std", "n"])
        for name, s in summary["metrics"].items():
            writer.writerow([name, s["mean"], s["std"], s["n"]])
    (out_dir / "manifest.json").write_text(json.dumps(manifest, indent=2, default=str))


@functools.lru_cache(maxsize=None)
def _platform() -> str:
    return platform.platform()  # reads the interpreter's binary for its libc version: once a process


@functools.lru_cache(maxsize=None)
def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None
