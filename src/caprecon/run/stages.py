"""Stages that run apart: fill the store now, score later, elsewhere.

`reconstruct` runs only the generator: every reconstruction the metrics will ask for goes
into the store, keyed exactly as the metrics key them. `embed` runs only the embedder of
recon/clip-image over the sources and the reconstructions already stored; it never calls the
generator and counts rows whose reconstruction is not there yet. A `score` with the same
settings and store then finds everything cached: its generator is never even loaded (backends
load weights on first use), so GPU-heavy stages can run on one cluster and scoring anywhere.

`judge` runs only the judges (and VLMs, LLMs) of turing, vqascore, fleur and captionqa over
the sources and the stored reconstructions, never the generator, and stores their answers.

`stage` is the three commands from Python: the input read as `score` reads it, the metrics
built as `score` builds them, and the one stage run over them.

(`caprecon.store.maintenance.merge_stores` copies the results of per-shard stores into one.)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

from tqdm.auto import tqdm

from caprecon.core.digests import keep_memo_in, memo_scoped
from caprecon.metrics.base import Context, Metric
from caprecon.data.images import open_image
from caprecon.data.samples import Sample, SampleError
from caprecon.store.errors import StoreError
from caprecon.run.failures import FailureWatch, RunError, isolated
from caprecon.run.ray import reconstruction_plan
from caprecon.core.errors import ConfigError
from caprecon.run.folder import holds_run_folder


def reconstruct_all(samples: Sequence[Sample], metrics: Sequence[Metric], ctx: Context, *, batch_size: int,
                    progress: bool = True) -> dict[str, int]:
    """Store every reconstruction `metrics` will need for `samples`; counts by outcome."""
    plan = reconstruction_plan(metrics)
    if not plan:
        raise RunError(f"none of the metrics ({', '.join(m.name for m in metrics)}) rebuilds the image; "
                       "nothing to reconstruct")
    counts = {"rows": len(samples), "unreadable": 0, "failed": 0}
    watch = FailureWatch("reconstruct")
    caption_only = not any(m.needs_source_image for m in metrics)
    for batch, items in _batches(samples, batch_size, caption_only, counts, progress, "reconstructing"):
        for generator, spec, seeds in plan:  # every seed of a metric scored over seeds (--seeds)
            _isolated(lambda some, g=generator, s=spec, k=seeds: ctx.reconstruct_seeds(g, s, some, k), items, watch)
    stats = ctx.stats()
    return {**counts, **_failures(watch), "generated": stats["generated"], "reused": stats["reused"]}


def _isolated(fn, items: list, watch: FailureWatch) -> list[Exception | None]:
    """`fn` (which stores what it makes) over `items` as a scoring run scores: `run.failures.isolated`.
    A reconstruction missing from the store is the row's, not the model's failure."""
    def done(part: list) -> list[None]:
        fn(part)
        return [None] * len(part)

    return isolated(done, items, watch, not_the_model=MissingReconstruction)


def _failures(*watches: FailureWatch) -> dict[str, Any]:
    """The rows a stage could not do (over its watches: one per judge), by reason, with the first
    message of each."""
    by_reason = {reason: n for watch in watches for reason, n in watch.by_reason.items()}
    first_errors = {reason: text for watch in watches for reason, text in watch.first_errors.items()}
    failed = sum(by_reason.values())
    return {"failed": failed, "failed_by_reason": by_reason, "first_errors": first_errors} if failed else {}


def embed_all(samples: Sequence[Sample], metrics: Sequence[Metric], ctx: Context, *, batch_size: int,
              progress: bool = True) -> dict[str, int]:
    """Store the embeddings of sources and stored reconstructions for metrics that embed
    images (recon, clip-image). The generator is never called: a reconstruction not yet in
    the store is counted as missing."""
    embedding = [m for m in metrics if hasattr(m, "embedder") and hasattr(m, "spec")]
    if not embedding:
        raise RunError("none of the metrics embeds images (recon, clip-image do); nothing to embed")
    counts = {"rows": len(samples), "unreadable": 0, "missing_reconstruction": 0}
    watch = FailureWatch("embed")
    for batch, items in _batches(samples, batch_size, False, counts, progress, "embedding"):
        for metric in embedding:
            reconstructor = ctx.reconstructor(metric.generator, metric.spec)
            keys = [key for key, _ in reconstructor.requests_for(items)]
            stored = ctx.store.get_images(keys)
            counts["missing_reconstruction"] += sum(1 for k in keys if k not in stored)
            _isolated(lambda some, metric=metric: ctx.embed(metric.embedder, [it.image_key for it in some],
                                                             lambda i: some[i].image), items, watch)
            present = [k for k in keys if k in stored]

            def embed_stored(some: list[str], metric=metric, stored=stored) -> None:
                from caprecon.store.images import read_verified

                def load(i: int):
                    image = read_verified(stored[some[i]][1], stored[some[i]][2])
                    if image is None:
                        raise StoreError(f"stored reconstruction {stored[some[i]][1]} is damaged; "
                                         "run `caprecon reconstruct` again")
                    return image

                ctx.embed(metric.embedder, some, load)

            if present:
                _isolated(embed_stored, present, watch)
    return {**counts, **_failures(watch), "embedded": ctx.stats()["embedded"]}


class MissingReconstruction(RuntimeError):
    """A stage that must not generate was asked for a reconstruction the store lacks."""


class StoredOnly:
    """Stands in for a generator where nothing may be generated: it has the generator's
    fingerprint, so every stored reconstruction is found as `score` would find it, and it
    refuses (`MissingReconstruction`) to make one that is not stored."""

    def __init__(self, inner: Any):
        self.inner = inner

    @property
    def fingerprint(self) -> str:
        return self.inner.fingerprint

    def __getattr__(self, name: str) -> Any:  # depends_on_image_id, native_size, describe, ...
        return getattr(self.inner, name)

    def generate(self, requests):
        raise MissingReconstruction(f"{len(requests)} reconstruction(s) not in the store; "
                                    "run `caprecon reconstruct` with the same settings first")


JUDGE_ROLES = ("judge", "vlm", "llm")  # the attributes metrics keep their judge, VLM or LLM in


def judge_all(samples: Sequence[Sample], metrics: Sequence[Metric], ctx: Context, *, batch_size: int,
              progress: bool = True) -> dict[str, int]:
    """Store the answers of the metrics that ask a judge, VLM or LLM (turing, vqascore,
    fleur, captionqa) about sources and stored reconstructions. The generator is never
    called: a row whose reconstruction is not in the store is counted as missing. A later
    `score` with the same settings finds every answer cached."""
    judging = [m for m in metrics if any(getattr(m, role, None) is not None for role in JUDGE_ROLES)]
    if not judging:
        raise RunError(f"none of the metrics ({', '.join(m.name for m in metrics)}) asks a judge "
                       "(turing, vqascore, fleur and captionqa do); nothing to answer")
    counts = {"rows": len(samples), "unreadable": 0, "missing_reconstruction": 0, "failed": 0}
    watches = {id(m): FailureWatch(m.name) for m in judging}
    caption_only = not any(m.needs_source_image for m in judging)
    before = dict(ctx.computed)
    originals = {id(m): m.generator for m in judging if getattr(m, "generator", None) is not None}
    try:
        for metric in judging:
            if id(metric) in originals:
                metric.generator = StoredOnly(originals[id(metric)])
        for _, items in _batches(samples, batch_size, caption_only, counts, progress, "judging"):
            for metric in judging:  # scored for the side effect: the answers stored
                results = _isolated(lambda some, metric=metric: metric.score(some, ctx), items, watches[id(metric)])
                counts["missing_reconstruction"] += sum(isinstance(r, MissingReconstruction) for r in results)
    finally:
        for metric in judging:
            if id(metric) in originals:
                metric.generator = originals[id(metric)]
    answered = {kind: n - before.get(kind, 0) for kind, n in ctx.computed.items() if n != before.get(kind, 0)}
    return {**counts, **_failures(*watches.values()), "computed": answered, "generated": ctx.stats()["generated"]}


def _batches(samples, batch_size, caption_only, counts, progress, desc):
    with tqdm(total=len(samples), desc=desc, unit="sample", disable=not progress, dynamic_ncols=True) as bar:
        for start in range(0, len(samples), batch_size):
            batch = samples[start : start + batch_size]
            items = []
            for sample in batch:
                try:
                    items.append(open_image(sample, caption_only=caption_only))
                except SampleError:
                    counts["unreadable"] += 1
            if items:
                yield batch, items
            bar.update(len(batch))


STAGES = ("reconstruct", "embed", "judge")


@dataclass
class StageResults:
    """What `stage` returns: the stage's counts (rows, unreadable, failed and by reason, generated,
    reused, missing_reconstruction, computed: what it adds to the store), the store it filled, and
    the problems that make the command exit 1 (rows failed, unreadable or lacking a reconstruction)."""

    stage: str
    counts: dict[str, Any]
    store: Path
    problems: list[str] = field(default_factory=list)

    def row(self) -> dict[str, Any]:
        """The counts and the store, as the command prints them (one JSON line)."""
        return {**self.counts, "store": str(self.store)}


@holds_run_folder("out", inputs=("samples",))
@memo_scoped
def stage(name: str, samples: str | Path | Iterable[Sample | dict], metrics: Sequence[str] | str | None = None, *,
          preset: str | None = None, config: str | Path | None = None, out: str | Path | None = None,
          progress: bool = False, images_root: str | Path | None = None, max_image_bytes: int | None = None,
          annotations: str | Path | None = None, captions: str | Path | None = None,
          shard: str | tuple[int, int] | None = None, **settings: Any) -> StageResults:
    """`caprecon reconstruct`, `caprecon embed` and `caprecon judge` (`name`): fill the store with
    what `metrics` will ask for on `samples`, read and configured as `caprecon.score` reads and
    configures them (`settings` are `RunConfig` fields). A `score` with the same settings and
    store then finds it all cached.

        caprecon.stage("reconstruct", "captions.jsonl", ["recon"], generator="sd3.5-medium", cache_dir="/shared")
        caprecon.stage("embed", "captions.jsonl", ["recon"], generator="sd3.5-medium", embedder="dreamsim",
                       cache_dir="/shared")
    """
    from caprecon.data.loaders import load_samples
    from caprecon.data.normalise import normalised_samples
    from caprecon.data.samples import check_unique_ids
    from caprecon.metrics import build_metric
    from caprecon.metrics.fused import FusedMetric
    from caprecon.run.config import RunConfig
    from caprecon.run.folder import open_store
    from caprecon.run.roles import Roles
    from caprecon.data.samples import check_images
    from caprecon.run.score import build_metrics
    from caprecon.run.shards import parse_shard, select_shard

    if name not in STAGES:
        raise ConfigError(f"stage {name!r}: choose from {', '.join(STAGES)}")
    names = [metrics] if isinstance(metrics, str) else list(metrics or [])
    cfg = RunConfig.build(preset=preset, file=config, **({"metrics": names} if names else {}), **settings)
    keep_memo_in(cfg.memo_folder)  # this run's memo of file digests, for this call alone (`memo_scoped`)
    rows = load_samples(samples, images_root=images_root, max_image_bytes=max_image_bytes, annotations=annotations,
                        captions=captions)
    check_unique_ids(rows)
    if cfg.normalise_captions:
        rows = normalised_samples(rows)
    if shard is not None:
        rows, _ = select_shard(rows, parse_shard(shard))
    roles = Roles(cfg)
    # reconstruct makes every seed (--seeds) of every generator the run will score; embed and judge
    # fill what their metrics read themselves, the first seed of the first generator
    build = build_metrics if name == "reconstruct" else build_metric
    built = [build(metric, roles, cfg) for metric in cfg.metrics]
    # a fused metric reads nothing itself: its components are what the stage fills
    built = [part for m in built for part in (m.components.values() if isinstance(m, FusedMetric) else (m,))]
    check_images(rows, [m.name for m in built if m.needs_source_image])
    ctx = Context(open_store(cfg, Path(out) if out else None))
    fill = {"reconstruct": reconstruct_all, "embed": embed_all, "judge": judge_all}[name]
    counts = fill(rows, built, ctx, batch_size=cfg.batch_size, progress=progress)
    problems = [f"{reason}: {n} (first: {counts['first_errors'][reason]})"
                for reason, n in counts.get("failed_by_reason", {}).items()]
    if counts.get("missing_reconstruction"):
        problems.append(f"no stored reconstruction: {counts['missing_reconstruction']} (run `caprecon reconstruct` "
                        "with the same settings first)")
    if counts.get("unreadable"):
        problems.append(f"image unreadable: {counts['unreadable']}")
    return StageResults(name, counts, Path(ctx.store.root), problems)
