"""`score()`: the one-call Python API, and the run folder it writes.

    results = caprecon.score("captions.jsonl", metrics=["recon"], preset="fast", out="runs/a")
    results.summary["metrics"]["recon"]["mean"]

A run folder holds `scores.jsonl` (one record per sample: every score, the
reconstruction's path, any row error), `summary.json` and `summary.csv` (per metric:
mean, std, n) and `manifest.json` (versions, models and their fingerprints, seeds, the
full configuration, cache statistics, timings).
"""

from __future__ import annotations

import csv
import json
import math
import platform
import sys
import time
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, Iterable, Sequence

from .config import ConfigError, Roles, RunConfig
from .metrics import Context, Metric, build_metric
from .redaction import redact
from .run.local import run_local
from .normalise import normalised_samples
from .samples import Sample, has_image, load_samples
from .store import Store, default_cache_dir
from .tables import format_table


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
            caption = r.get("caption", "")
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
    **settings: Any,
) -> Results:
    """Score samples with metrics (names or `Metric` objects; default: the config's, else recon).

    `settings` are `RunConfig` fields (generator, embedder, clip, template, seed,
    seed_policy, max_side, batch_size, cache_dir, no_cache, ...); models may be given as
    registry names, hub ids, local folders or already-built objects.
    """
    started = time.time()
    metrics = [metrics] if isinstance(metrics, (str, Metric)) else list(metrics or [])
    names = [m for m in metrics if isinstance(m, str)]
    cfg = RunConfig.build(preset=preset, file=config, **({"metrics": names} if names else {}), **settings)
    metrics = metrics or list(cfg.metrics)  # none given: the config's (default: recon)
    rows = load_samples(samples, images_root=images_root, annotations=annotations)
    _check_unique_ids(rows)
    if cfg.normalise_captions:
        rows = normalised_samples(rows)

    # everything that can be wrong with the configuration fails here, before any work
    roles = Roles(cfg)
    built = [m if isinstance(m, Metric) else build_metric(m, roles, cfg) for m in metrics]
    check_images(rows, built)
    out_dir = Path(out) if out else None
    if out_dir:
        out_dir.mkdir(parents=True, exist_ok=True)
    store = _open_store(cfg, out_dir)
    ctx = Context(store)

    records = run_local(rows, built, ctx, batch_size=cfg.batch_size,
                        scores_path=out_dir / "scores.jsonl" if out_dir else None, progress=progress)
    metric_names = [m.headline for m in built]
    summary = summarise(records, metric_names)
    manifest = {
        "caprecon": _version("caprecon"),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(started)),
        "seconds": round(time.time() - started, 3),
        "command": sys.argv if Path(sys.argv[0]).name == "caprecon" else None,
        "python": platform.python_version(),
        "platform": platform.platform(),
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
    }
    manifest = redact(manifest)  # API keys and tokens among the options never reach disk
    if out_dir:
        write_run(out_dir, summary, manifest)
        if "turing" in metric_names and summary["metrics"]["turing"]["n"]:
            from .report import write_report

            write_report(records, out_dir, metric="turing")
        from .htmlreport import write_html_report

        write_html_report(out_dir, progress=progress)
    return Results(records, summary, manifest, out_dir, metric_names)


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


def _open_store(cfg: RunConfig, out_dir: Path | None) -> Store:
    if cfg.no_cache:
        # nothing from earlier runs is read; the run's own results live in its folder
        return Store.fresh(out_dir / "store") if out_dir else Store.temporary()
    # a read-only (shared) cache is read as it is; new results go to an overlay, by default in the run folder
    overlay = cfg.cache_overlay or (out_dir / "cache-overlay" if out_dir else None)
    return Store.open(cfg.cache_dir or default_cache_dir(), overlay=overlay, read_only=cfg.cache_read_only)


def summarise(records: list[dict[str, Any]], metric_names: Sequence[str]) -> dict[str, Any]:
    metrics = {}
    for name in metric_names:
        values = [r[name] for r in records if isinstance(r.get(name), (int, float)) and not r.get("error")]
        mean = sum(values) / len(values) if values else None
        std = math.sqrt(sum((v - mean) ** 2 for v in values) / len(values)) if values else None
        metrics[name] = {"mean": mean, "std": std, "n": len(values)}
    return {"samples": len(records), "errors": sum(1 for r in records if r.get("error")), "metrics": metrics}


def write_run(out_dir: Path, summary: dict[str, Any], manifest: dict[str, Any]) -> None:
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    with (out_dir / "summary.csv").open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["metric", "mean", "std", "n"])
        for name, s in summary["metrics"].items():
            writer.writerow([name, s["mean"], s["std"], s["n"]])
    (out_dir / "manifest.json").write_text(json.dumps(manifest, indent=2, default=str))


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None
