"""`score()`: samples and metrics in, a scored run folder out (the public `caprecon.score`).

    results = caprecon.score("captions.jsonl", metrics=["recon"], preset="fast", out="runs/a")
    results.summary["metrics"]["recon"]["mean"]

What the run folder holds is said in `caprecon.run.folder`.

Running again into the folder of an interrupted run resumes it: rows already scored
without error are kept, the rest are scored (their model results mostly come from the
cache). A folder that holds a run of other settings is refused rather than mixed.
"""

from __future__ import annotations

import platform
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

from caprecon.core.describe import installed_version
from caprecon.core.digests import keep_memo_in, memo_scoped
from caprecon.core.errors import ConfigError
from caprecon.core.records import is_number
from caprecon.core.redaction import redact
from caprecon.core.tables import format_table, number
from caprecon.data.normalise import normalised_samples
from caprecon.data.loaders import load_samples
from caprecon.data.samples import Sample, check_images, check_unique_ids, confining_root
from caprecon.metrics import Context, Metric, build_metric
from caprecon.metrics.base import CORPUS, check_columns, declared_columns
from caprecon.metrics.adaptive import AdaptiveSeeds, StageDraws, adaptive_parts
from caprecon.metrics.seeds import GeneratorEnsemble, HumanCeiling, SeedAveraged, uses_reconstruction
from caprecon.run.config import RunConfig
from caprecon.run.roles import Roles
from caprecon.store.index import Store
from caprecon.run.folder import (corpus_values, holds_run_folder, open_store, platform_name, resumable_rows,
                                 summarise, write_corpus_statistics, write_manifest, write_reports, write_run)
from caprecon.run.failures import RunError, RunInterrupted
from caprecon.run.local import run_local


@dataclass
class Results:
    """What `score` returns: one record per sample (as `scores.jsonl` holds them), the summary
    and manifest of the run, its folder (`out`, None without one) and the metrics' names."""

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
            values = [number(r.get(m)) for m in self.metric_names]
            note = r.get("error") or (f"{r['tokens_cut']} tokens cut" if r.get("tokens_cut") else "")
            lines.append([str(r.get("id", "")), caption, *values, note])
        return format_table([headers, *lines])

    def summary_table(self) -> str:
        """Mean, std and n per metric; a corpus-level metric (BLEU, CIDEr) shows its corpus value too."""
        corpus = any("corpus" in s for s in self.summary["metrics"].values())
        rows = [["metric", "mean", "std", "n", *(["corpus"] if corpus else [])]]
        for name, s in self.summary["metrics"].items():
            rows.append([name, number(s["mean"]), number(s["std"]), str(s["n"]),
                         *([number(s.get("corpus")) if "corpus" in s else ""] if corpus else [])])
        return format_table(rows)


@holds_run_folder("out", inputs=("samples",))
@memo_scoped
def score(
    samples: str | Path | Iterable[Sample | dict],
    metrics: Sequence[str | Metric] | str | None = None,
    *,
    preset: str | None = None,
    config: str | Path | None = None,
    out: str | Path | None = None,
    progress: bool = False,
    images_root: str | Path | None = None,
    max_image_bytes: int | None = None,
    annotations: str | Path | None = None,
    captions: str | Path | None = None,
    shard: str | tuple[int, int] | None = None,
    executor: str = "local",
    ray: dict[str, Any] | None = None,
    store: Store | None = None,
    **settings: Any,
) -> Results:
    """Score samples with metrics (names or `Metric` objects; default: the config's, else recon).

    `settings` are `RunConfig` fields (generator, embedder, clip, template, seed,
    seed_policy, max_side, batch_size, cache_dir, no_cache, ...); models may be given as
    registry names, hub ids, local folders or already-built objects. `shard="i/n"` scores
    one slice of the input (`caprecon merge` joins the slices); `executor="ray"` runs the
    plan on Ray Data, with `ray` the options of `caprecon.run.ray.run_ray`. `store`, an open
    store, replaces the one the cache settings name (best-of-N scores in the store its
    candidates went to). `images_root` confines every image to a folder and `max_image_bytes`
    caps an image file's size (see `load_samples`).
    """
    started = time.time()
    metrics = [metrics] if isinstance(metrics, (str, Metric)) else list(metrics or [])
    names = [m for m in metrics if isinstance(m, str)]
    cfg = RunConfig.build(preset=preset, file=config, **({"metrics": names} if names else {}), **settings)
    keep_memo_in(cfg.memo_folder)  # this run's memo of file digests, for this call alone (`memo_scoped`)
    metrics = metrics or list(cfg.metrics)  # none given: the config's (default: recon)
    rows = load_samples(samples, images_root=images_root, annotations=annotations, captions=captions,
                        max_image_bytes=max_image_bytes)
    check_unique_ids(rows)
    if cfg.normalise_captions:
        rows = normalised_samples(rows)
    whole = rows  # what the metrics' corpus statistics come from, in every shard
    shard_info = row_numbers = None
    if shard is not None:
        from caprecon.run.shards import parse_shard, select_shard

        rows, shard_info = select_shard(rows, parse_shard(shard))
        row_numbers = shard_info["positions"]

    # everything that can be wrong with the configuration fails here, before any work
    roles = Roles(cfg)
    for metric in metrics:
        check_own_spec(metric, settings)
    built = [build_metrics(m, roles, cfg) for m in metrics]
    check_images(rows, [m.name for m in built if m.needs_source_image])
    image_root = confining_root(rows)
    for metric in built:
        metric.prepare(whole)
    metric_names = [m.headline for m in built]
    # fields a metric reports beside its headline (halluc: coverage and F) are summarised with it
    summarised = list(dict.fromkeys([*metric_names, *(c for m in built for c in m.companions)]))
    out_dir = Path(out) if out else None
    done: dict[str, dict[str, Any]] = {}
    if out_dir:
        done = {} if cfg.no_cache else resumable_rows(out_dir, cfg, metric_names, rows)
        write_manifest(out_dir, {"status": "running", "config": cfg.to_dict(), "metric_names": metric_names,
                                 "columns": declared_columns(built), "samples": len(rows), "image_root": image_root})
    store = store if store is not None else open_store(cfg, out_dir)
    ctx = Context(store)
    moderated = [part for metric in built for part in adaptive_parts(metric) if part.rule != "stein"]
    if moderated:
        fit_seed_variances(rows, moderated, ctx, cfg, progress=progress, row_numbers=row_numbers)
    thumbnails = _thumbnail_writer(out_dir, store, image_root)

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
            summary = {**summarise(stop.records, summarised), "complete": False, "total": len(rows)}
            status = "interrupted" if isinstance(stop, RunInterrupted) else "stopped"
            write_run(out_dir, summary, {
                "status": status, "command": sys.argv if Path(sys.argv[0]).name == "caprecon" else None,
                "config": cfg.to_dict(), "metric_names": metric_names, "samples": len(rows), "image_root": image_root,
                "rows_written": len(stop.records), "cache": ctx.stats(),
                **({"error": str(stop)} if status == "stopped" else {})})
        raise
    except BaseException:
        if thumbnails:
            thumbnails.close(wait=False)
        raise
    summary = summarise(records, summarised)
    # the corpus step (BLEU, METEOR, CIDEr) goes over the rows again: only for metrics with a corpus column
    pooled = [m for m in built if any(c.aggregate == CORPUS for c in m.columns)]
    statistics = corpus_values(summary, pooled, records, rows) if pooled else {}
    manifest = {
        "status": "complete",
        "resumed_rows": len(done),
        "caprecon": installed_version("caprecon"),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(started)),
        "seconds": round(time.time() - started, 3),
        "command": sys.argv if Path(sys.argv[0]).name == "caprecon" else None,
        "python": platform.python_version(),
        "platform": platform_name(),
        "libraries": {lib: installed_version(lib) for lib in ("torch", "diffusers", "transformers", "numpy", "pillow")},
        "config": cfg.to_dict(),
        "reconstruction": {"template": cfg.spec.template, "seed": cfg.seed, "seed_policy": cfg.seed_policy,
                           "seeds": cfg.seeds, "max_seeds": cfg.max_seeds, "target_width": cfg.target_width,
                           "max_side": cfg.max_side, "upscale": cfg.upscale, "size": cfg.size},
        "captions_normalised": cfg.normalise_captions,
        "models": roles.describe(),
        "metrics": [m.describe() for m in built],
        "store": store.describe(),
        "cache": ctx.stats(),
        "samples": len(rows),
        "image_root": image_root,
        "metric_names": metric_names,
        "columns": declared_columns(built),
        "executor": executor,
        **({"shard": shard_info} if shard_info else {}),
    }
    manifest = redact(manifest)  # what Results hold is what manifest.json holds
    if out_dir:
        write_corpus_statistics(out_dir, statistics)
        write_run(out_dir, summary, manifest)
        if thumbnails:
            thumbnails.close()  # the report finds the thumbnails made while the run worked
        write_reports(out_dir, records, summary, metric_names, progress=progress,
                      thumbnails=thumbnails.made if thumbnails else None)
    return Results(records, summary, manifest, out_dir, metric_names)


# run settings that a metric object's own `spec` (a ReconstructionSpec) decides instead
SPEC_SETTINGS = ("template", "seed", "seed_policy", "max_side", "size")


def check_own_spec(metric: str | Metric, settings: dict[str, Any]) -> None:
    """A metric object rebuilds images by its own spec: a run setting that would change the
    images (say `seed=1` for another replicate) does not reach it, so one that disagrees with
    the spec is refused rather than silently scored with the spec's value."""
    spec = getattr(metric, "spec", None)
    if isinstance(metric, str) or not uses_reconstruction(metric):
        return
    for name in SPEC_SETTINGS:
        if name not in settings or settings[name] is None:
            continue
        given, own = settings[name], getattr(spec, name, None)
        if name == "size":
            from caprecon.reconstruct.reconstructor import parse_size

            given = parse_size(given, spec.multiple)
        elif name == "template":
            from caprecon.reconstruct.templates import resolve_template

            given = resolve_template(given)
        if given != own:
            raise ConfigError(f"{name}={settings[name]!r} does not reach the metric object {type(metric).__name__}: "
                              f"it rebuilds images with its own spec ({name}={own!r}); build it with "
                              f"ReconstructionSpec({name}=...) or name the metric instead")


def build_metrics(metric: str | Metric, roles: Roles, cfg: RunConfig) -> Metric:
    """The metric as the run scores it: from K seeds (`--seeds`) when it rebuilds the image,
    under every generator as an ensemble when the run names several, and beside its rows'
    references rebuilt the same way with `--ceiling`. A fused metric's components are built so too:
    it combines what a run of them alone would report."""
    if isinstance(metric, Metric):
        return as_the_run_scores(None, metric, roles, cfg)
    return build_metric(metric, roles, cfg, lambda name, built: as_the_run_scores(name, built, roles, cfg))


def as_the_run_scores(name: str | None, built: Metric, roles: Roles, cfg: RunConfig) -> Metric:
    """`built` (the metric `name` names; None for a metric object, which is built under one generator
    only) as the run scores it: see `build_metrics`."""
    check_columns(built)  # declarations a reader cannot use are refused before any work
    if not uses_reconstruction(built):
        return built
    members = [built]
    if name is not None and len(roles.generators) > 1:
        members += [build_metric(name, roles.with_generator(g), cfg) for g in roles.generators[1:]]
    if cfg.max_seeds is not None:
        members = [AdaptiveSeeds(m, cfg.seeds, cfg.max_seeds, cfg.target_width, cfg.adaptive_rule,
                                 cfg.adaptive_stages) for m in members]
    elif cfg.seeds > 1:
        members = [SeedAveraged(m, cfg.seeds) for m in members]
    if len(members) == 1:
        built = members[0]
    else:
        labels = [g if isinstance(g, str) else f"{type(g).__name__}-{i}" for i, g in enumerate(cfg.generator)]
        built = GeneratorEnsemble(members, labels)
    return HumanCeiling(built) if cfg.ceiling else built


def fit_seed_variances(rows: Sequence[Sample], parts: Sequence[AdaptiveSeeds], ctx: Context, cfg: RunConfig, *,
                       progress: bool, row_numbers: Sequence[int] | None) -> None:
    """Adaptive seeds' stages before the last over every row before the run's first batch, so
    that the variance each caption's decisions borrow from the others (`AdaptiveSeeds.fit`) comes
    from the whole input, not from a caption's batch: for the adaptive parts whose rule borrows
    (Stein's rule borrows nothing). One pass per decision: the first stage's draws, fit, the
    second stage's draws, fit, and so on, until a part's most stages or until a pass finds none of
    its captions open (every one has stopped: no later decision is made). Every draw is stored:
    each pass, and the run, reuse the draws of the passes before."""
    fitting = list(parts)
    for decision in range(max(part.stages for part in parts) - 1):
        fitting = [part for part in fitting if part.stages - 1 > decision]
        probes = [StageDraws(part, f"stage {decision + 1} draws {i}", decision) for i, part in enumerate(fitting)]
        records = run_local(rows, probes, ctx, batch_size=cfg.batch_size, workers=cfg.workers, progress=progress,
                            row_numbers=row_numbers, desc=f"adaptive seeds: stage {decision + 1} draws")
        for part, probe in zip(fitting, probes):
            part.fit([r[probe.key] for r in records if isinstance(r.get(probe.key), dict)])
        fitting = [part for part in fitting if part.deciding]
        if not fitting:
            break


def _thumbnail_writer(out_dir: Path | None, store: Any, image_root: str | None):
    """Makes the report's thumbnails while the run works (into the store's thumbnail cache,
    linked into the run folder), so the report at the end has little left to do."""
    if out_dir is None:
        return None
    from caprecon.reports.html.page import FILES
    from caprecon.store.thumbs import ThumbnailWriter, cache_folder

    return ThumbnailWriter(out_dir, out_dir / FILES / "thumbs", image_root=image_root,
                           cache=None if store.read_only else cache_folder(store.root), store=store)


