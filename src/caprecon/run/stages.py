"""Stages that run apart: fill the store now, score later, elsewhere.

`reconstruct` runs only the generator: every reconstruction the metrics will ask for goes
into the store, keyed exactly as the metrics key them. `embed` runs only the embedder of
recon/clip-image over the sources and the reconstructions already stored; it never calls the
generator and counts rows whose reconstruction is not there yet. A `score` with the same
settings and store then finds everything cached: its generator is never even loaded (backends
load weights on first use), so GPU-heavy stages can run on one cluster and scoring anywhere.

`judge` runs only the judges (and VLMs, LLMs) of turing, vqascore, fleur and captionqa over
the sources and the stored reconstructions, never the generator, and stores their answers.

(`caprecon.store.maintenance.merge_stores` copies the results of per-shard stores into one.)
"""

from __future__ import annotations

from typing import Any, Sequence

from tqdm.auto import tqdm

from caprecon.metrics.base import Context, Metric
from caprecon.data.images import open_image
from caprecon.data.samples import Sample, SampleError
from caprecon.store.index import StoreError
from caprecon.run.local import FailureWatch, RunError, isolated
from caprecon.run.ray import reconstruction_plan


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
    """`fn` (which stores what it makes) over `items` as a scoring run scores: `run.local.isolated`.
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
            keys = [reconstructor.request_for(item)[0] for item in items]
            stored = ctx.store.get_images(keys)
            counts["missing_reconstruction"] += sum(1 for k in keys if k not in stored)
            _isolated(lambda some, metric=metric: ctx.embed(metric.embedder, [it.image_key for it in some],
                                                             lambda i: some[i].image), items, watch)
            present = [k for k in keys if k in stored]

            def embed_stored(some: list[str], metric=metric, stored=stored) -> None:
                from caprecon.store.index import read_verified

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
