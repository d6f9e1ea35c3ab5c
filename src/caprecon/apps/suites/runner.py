"""The whole evaluation: benchmark images -> captions -> reconstructions -> the judge's answers.

For every caption source (a captioner run here, or a file of captions written
elsewhere) each benchmark image is captioned, its caption normalised (the raw text
kept) and reconstructed, and the judge answers the benchmark's questions on the
reconstruction. The same questions on the original images give the upper bound. The
result is the Caption Turing Test paper's Table 1 (`table`).

Work runs in three phases, so that one kind of model is in memory at a time: every
source's captions (captioners one after another), every reconstruction, then every
answer. All of it is cached in the store by content: the upper bound is asked once per
benchmark question whatever the number of sources, a reconstruction once per
(caption, generator, seed, size), and a rerun makes no model call.

A dataset may have a judge of its own (`judge_for`: dataset name -> model, as `score`'s
per-category judges; the paper judged grounding with Qwen2.5-VL-72B and the rest with
Qwen3-VL-8B). It answers that dataset's questions on the originals and on every
reconstruction, in its own box convention; judges answer one after another.
"""

from __future__ import annotations

import hashlib
import time
from io import BytesIO
from pathlib import Path
from typing import Any, Mapping, Sequence

from PIL import Image
from tqdm.auto import tqdm

from caprecon.run.config import RunConfig
from caprecon.run.folder import holds_run_folder, write_manifest, write_summary
from caprecon.run.frame import RunFrame
from caprecon.core.checks import MAX_LIMIT, check_count, check_number
from caprecon.core.digests import keep_memo_in, memo_scoped
from caprecon.core.errors import ConfigError
from caprecon.metrics.base import Context
from caprecon.metrics.grading import BoxReading
from caprecon.metrics.judging import LazyImages, answers
from caprecon.models.build import build_model
from caprecon.models.common import release_memory
from caprecon.models.captioner import Sampling, resolve_prompt
from caprecon.core.describe import describe_model
from caprecon.data.normalise import normalise_caption
from caprecon.data.qa import COORDS, build_prompt
from caprecon.core.records import write_jsonl_atomically
from caprecon.reconstruct.reconstructor import Reconstruction, Reconstructor
from caprecon.run.failures import FATAL, FailureWatch, RunError, explain_failure, isolated
from caprecon.run.roles import Roles
from caprecon.data.images import LoadedSample, read_image_file
from caprecon.data.samples import Sample, SampleError
from caprecon.apps.suites.entries import SuiteEntry
from caprecon.apps.suites.loaders import BenchQuestion, Benchmark, load_benchmark
from caprecon.apps.suites.scoring import Graded, dataset_scores, grade
from caprecon.apps.suites.sources import CaptionSource, read_caption_file
from caprecon.apps.suites.table import DEFAULT_SIGMA, UPPER, SuiteResults, SuiteTable

_FREE_FORM = {"math": "Answer with the final answer only: a number, a word or a short phrase.",
              "ocr": "Answer the question using a single word or phrase."}


def judge_prompt(question: BenchQuestion, box_coords: str | None = None) -> str:
    if question.item is not None:
        return build_prompt(question.item, box_coords=box_coords)
    return f"{question.question}\n{_FREE_FORM[question.type]}"


class _Images:
    """The benchmarks' images as files named by their id (what captioners and the run read)."""

    def __init__(self, sources: Mapping[str, bytes | Path], folder: Path):
        self.folder = folder
        self.paths: dict[str, Path] = {}
        folder.mkdir(parents=True, exist_ok=True)
        for image_id, source in sources.items():
            if isinstance(source, Path):
                self.paths[image_id] = source
                continue
            try:
                with Image.open(BytesIO(source)) as im:
                    suffix = "." + (im.format or "png").lower().replace("jpeg", "jpg")
            except Exception:  # undecodable: kept as bytes, so the row that opens it reports the error
                suffix = ".bin"
            path = folder / f"{image_id}{suffix}"
            if not path.exists():
                path.write_bytes(source)
            self.paths[image_id] = path
        self._info: dict[str, tuple[str, tuple[int, int]] | SampleError] = {}

    def info(self, image_id: str) -> tuple[str, tuple[int, int]]:
        """(content key, (width, height)) of an original, from its bytes and header only:
        decoded pixels are never kept, so a benchmark of any size fits in memory."""
        if image_id not in self._info:
            path = self.paths[image_id]
            try:
                data = read_image_file(path)
                with Image.open(BytesIO(data)) as im:
                    self._info[image_id] = (hashlib.sha256(data).hexdigest(), im.size)
            except SampleError as exc:  # not a regular file, or too large
                self._info[image_id] = exc
            except Exception as exc:  # PIL raises several types for corrupt files
                self._info[image_id] = SampleError(f"cannot read image {path}: {exc}")
        found = self._info[image_id]
        if isinstance(found, SampleError):
            raise found
        return found

    def load(self, image_id: str) -> Image.Image:
        self.info(image_id)
        try:
            with Image.open(BytesIO(read_image_file(self.paths[image_id]))) as im:
                return im.convert("RGB")
        except Exception as exc:
            raise SampleError(f"cannot decode image {self.paths[image_id]}: {exc}") from None


@holds_run_folder("out")
@memo_scoped
def suite(
    suites: Sequence[SuiteEntry],
    sources: Sequence[CaptionSource],
    *,
    config: RunConfig | None = None,
    out: str | Path | None = None,
    captioner_options: Mapping[str, Any] | None = None,
    prompt: str | None = None,
    max_words: int | None = None,
    caption_max_new_tokens: int = 256,
    judge_max_new_tokens: int = 32,
    judge_box_coords: str | None = None,
    normalise: bool = True,
    sigma: float = DEFAULT_SIGMA,
    limit: int | None = None,
    progress: bool = False,
    **settings: Any,
) -> SuiteResults:
    """Table 1 for `sources` on `suites`; the generator and judge come from the run settings
    (`config`, or `settings`: generator, judge, their options, size, seed, cache_dir ...).

    Captioners caption greedily (temperature 0, one caption per image) with `prompt` (a
    preset of `caprecon.models.captioner.PROMPTS` or the text; default `detailed`)."""
    started = time.time()
    if config is not None and settings:
        raise TypeError(f"give either `config` or settings, not both (got {sorted(settings)})")
    cfg = config or RunConfig.build(**settings)
    keep_memo_in(cfg.memo_folder)  # this run's memo of file digests, for this call alone (`memo_scoped`)
    if cfg.generator is None:
        raise ConfigError("no generator: give --generator (a registry name, hub id or folder)")
    if not suites:
        raise ConfigError("no benchmark: give --suite")
    names = [s.name for s in suites]
    unknown = sorted(set(cfg.judge_for) - set(names))
    if unknown:
        raise ConfigError(f"--judge-for {unknown[0]}: no such dataset in this suite (datasets: {', '.join(names)})")
    if cfg.judge is None and set(names) - set(cfg.judge_for):
        raise ConfigError("no judge: give --judge (a registry name, hub id or folder)")
    if judge_box_coords is not None and judge_box_coords not in COORDS:
        raise ConfigError(f"judge box coords must be one of {', '.join(COORDS)}, not {judge_box_coords!r}")
    check_number("--sigma", sigma, 0, low_open=True)
    if limit is not None:
        check_count("--limit", limit, 1, MAX_LIMIT)
    caption_prompt = resolve_prompt(prompt, max_words) if any(s.captioner for s in sources) else None

    # every model resolved (not loaded) and every file read before any model runs
    judge = build_model("judge", cfg.judge, cfg.judge_options) if cfg.judge is not None else None
    judges_for = Roles(cfg).judges_for
    generator = build_model("generator", cfg.generator, cfg.generator_options)
    captioners = {s.label: build_model("captioner", s.captioner.spec,
                                       {**(captioner_options or {}), **s.captioner.options})
                  for s in sources if s.captioner}
    image_sources: dict[str, bytes | Path] = {}
    benchmarks = []
    for entry in suites:
        bench = load_benchmark(entry, image_sources)
        if limit:
            bench.questions = bench.questions[:limit]
        benchmarks.append(bench)
    files = {s.label: read_caption_file(s.captions_file, benchmarks) for s in sources if s.captions_file}

    frame = RunFrame.open(cfg, out, started=started)
    out_dir, store, ctx = frame.out_dir, frame.store, frame.ctx
    used = {q.image_id for b in benchmarks for q in b.questions}
    images = _Images({k: v for k, v in image_sources.items() if k in used}, store.root / "benchmark-images")
    image_ids = sorted(used)
    described = {"judge": describe_model(judge) if judge is not None else None,
                 "judges_for": {name: describe_model(j) for name, j in judges_for.items()},
                 "generator": describe_model(generator), "captioners": {}}
    cache: dict[str, Any] = {}

    labels = [UPPER, *(s.label for s in sources)]
    caption_rows = _caption_phase(sources, captioners, files, images, image_ids, store, cfg, cache, described,
                                  prompt=caption_prompt, max_new_tokens=caption_max_new_tokens, normalise=normalise,
                                  progress=progress)
    recons = _reconstruction_phase(caption_rows, generator, images, store, cfg, cache, progress)
    del generator
    release_memory()
    # each judge answers its datasets, then is let go before the next is loaded; its boxes are
    # read in its own convention (`judge_box_coords` overrides the default judge's only)
    groups: list[tuple[BoxReading, list[Benchmark]]] = []
    for bench in benchmarks:
        own = judges_for.get(bench.entry.name)
        asker = judge if own is None else own
        group = next((g for g in groups if g[0].judge is asker), None)
        if group is None:
            groups.append((BoxReading.of(asker, judge_box_coords if own is None else None), [bench]))
        else:
            group[1].append(bench)
    default_coords = BoxReading.of(judge, judge_box_coords).coords if judge is not None else None
    own_coords = {b.entry.name: reading.coords for reading, group in groups for b in group
                  if b.entry.name in judges_for}
    del judge, judges_for
    answered: dict[tuple[str, str], list[dict[str, Any]]] = {}
    graded: dict[tuple[str, str], list[tuple[BenchQuestion, Graded]]] = {}
    while groups:
        reading, group = groups.pop(0)
        group_rows, group_graded = _answer_phase(labels, group, recons, images, reading.judge, ctx, cfg,
                                                 max_new_tokens=judge_max_new_tokens, reading=reading,
                                                 progress=progress)
        for row in group_rows:
            answered.setdefault((row["captioner"], row["dataset"]), []).append(row)
        graded.update(group_graded)
        del reading
        release_memory()
    rows = [row for label in labels for bench in benchmarks for row in answered.get((label, bench.entry.name), [])]

    scores: dict[str, dict[str, dict[str, Any]]] = {}
    for label in labels:
        for bench in benchmarks:
            done = graded.get((label, bench.entry.name), [])
            scores.setdefault(label, {})[bench.entry.name] = dataset_scores(
                bench.entry, [q for q, _ in done], [g for _, g in done])
    table = SuiteTable(list(suites), scores, [s.label for s in sources], sigma)
    for label in labels:
        missing = sum(1 for r in rows if r["captioner"] == label and r.get("error"))
        if missing:
            table.notes.append(f"{label}: {missing} question(s) without an answer (no caption, unreadable image or "
                               f"failed reconstruction; see records.jsonl) are left out of its scores")
    cache["judge_answers_computed"] = ctx.computed.get("judge-answer", 0)
    cache["judge_seconds"] = round(ctx.model_seconds, 4)
    manifest = {
        "command": "suite",
        "started": frame.started_at,
        "seconds": frame.seconds(),
        "datasets": [{"name": b.entry.name, "file": str(b.entry.data), "question": b.entry.question,
                      "metric": b.entry.metric, "questions": len(b.questions)} for b in benchmarks],
        "images": len(image_ids),
        "sources": [{"label": s.label, "captioner": str(s.captioner.spec) if s.captioner else None,
                     "captions_file": str(s.captions_file) if s.captions_file else None} for s in sources],
        "caption_prompt": caption_prompt,
        "captions_normalised": normalise,
        "judge": {"max_new_tokens": judge_max_new_tokens, "box_coords": default_coords,
                  "judge_for": {name: {"box_coords": coords} for name, coords in own_coords.items()}},
        "reconstruction": {"template": cfg.spec.template, "seed": cfg.spec.seed, "seed_policy": cfg.spec.seed_policy,
                           "size": list(cfg.spec.size) if cfg.spec.size else f"source aspect, long side "
                                                                               f"{cfg.spec.max_side}"},
        "sigma": sigma,
        "models": described,
        "cache": cache,
        "store": str(store.root),
        "config": cfg.to_dict(),
    }
    if out_dir:
        _write(out_dir, table, rows, caption_rows, manifest, images, benchmarks)
    return SuiteResults(table, rows, caption_rows, manifest, out_dir)


def _caption_phase(sources: Sequence[CaptionSource], captioners: dict[str, Any], files: Mapping[str, dict[str, str]],
                   images: _Images, image_ids: Sequence[str], store, cfg: RunConfig, cache: dict[str, Any],
                   described: dict[str, Any], *, prompt: str | None, max_new_tokens: int, normalise: bool,
                   progress: bool) -> list[dict[str, Any]]:
    """One row per source and image: the caption given to the generator and the raw text.
    Captioners run one at a time, each released before the next is loaded."""
    from caprecon.run.captioning import generate_candidates

    rows: list[dict[str, Any]] = []
    for source in sources:
        errors: dict[str, str] = {}
        if source.captions_file:
            captions = files[source.label]
        else:
            captioner = captioners.pop(source.label)
            sampling = Sampling(temperature=0.0, top_p=1.0, max_new_tokens=max_new_tokens)
            pools, counts = generate_candidates(captioner, [images.paths[i] for i in image_ids], prompt=prompt, n=1,
                                                sampling=sampling, seed=cfg.seed, store=store,
                                                images_per_call=cfg.batch_size, progress=progress)
            captions = {i: p.captions[0] for i, p in zip(image_ids, pools) if p.captions}
            errors = {i: p.error for i, p in zip(image_ids, pools) if p.error}
            cache[f"captions/{source.label}"] = counts
            described["captioners"][source.label] = describe_model(captioner)
            del captioner
            release_memory()
        for image_id in image_ids:
            raw = captions.get(image_id)
            row = {"captioner": source.label, "image_id": image_id,
                   "caption": None if raw is None else (normalise_caption(raw) if normalise else raw),
                   "caption_raw": raw}
            if image_id in errors:
                row["error"] = errors[image_id]
            rows.append(row)
    return rows


def _reconstruction_phase(caption_rows: Sequence[dict[str, Any]], generator, images: _Images, store, cfg: RunConfig,
                          cache: dict[str, Any], progress: bool) -> dict[tuple[str, str], Reconstruction | str]:
    """(source, image_id) -> its reconstruction, or why there is none."""
    recons: dict[tuple[str, str], Reconstruction | str] = {}
    reconstructor = Reconstructor(generator, store, cfg.spec)
    watch = FailureWatch("reconstruct")
    todo = []
    for row in caption_rows:
        key = (row["captioner"], row["image_id"])
        if not row["caption"] or not row["caption"].strip():
            recons[key] = row.get("error") or ("no caption for this image" if row["caption_raw"] is None
                                               else "empty caption")
        else:
            todo.append((key, row["caption"]))
    bar = tqdm(total=len(todo), desc="reconstructing", unit="image", disable=not progress or not todo,
               dynamic_ncols=True)
    for lo in range(0, len(todo), max(1, cfg.batch_size)):
        chunk, items = [], []
        for (label, image_id), caption in todo[lo: lo + cfg.batch_size]:
            try:  # the original's size decides the reconstruction's; its pixels are let go after the batch
                image = images.load(image_id)
            except SampleError as exc:
                recons[label, image_id] = str(exc)
                continue
            sample = Sample(id=f"{label}:{image_id}", image=images.paths[image_id], caption=caption,
                            image_id=image_id)
            chunk.append((label, image_id))
            items.append(LoadedSample(sample, image, images.info(image_id)[0]))
        # as a scoring run: halved on out of memory, row by row after another failure, and a
        # generator failing every row alike stops the run with the reason
        results = isolated(reconstructor.reconstruct, items, watch)
        for key, result in zip(chunk, results):
            recons[key] = result if isinstance(result, Reconstruction) else \
                f"reconstruction failed: {explain_failure(result)}"
        bar.update(len(todo[lo: lo + cfg.batch_size]))
    bar.close()
    cache["reconstructions"] = {"generated": reconstructor.generated, "reused": reconstructor.reused}
    return recons


def _answer_phase(labels: Sequence[str], benchmarks: Sequence[Benchmark],
                  recons: Mapping[tuple[str, str], Reconstruction | str], images: _Images, judge, ctx: Context,
                  cfg: RunConfig, *, max_new_tokens: int, reading: BoxReading, progress: bool
                  ) -> tuple[list[dict[str, Any]], dict[tuple[str, str], list[tuple[BenchQuestion, Graded]]]]:
    """The judge on the originals (the upper bound, once per question) and on every
    reconstruction: one record per question and row, and the graded questions by (row, dataset)."""
    asks, rows, pending, loaders = [], [], [], []
    for label in labels:
        for bench in benchmarks:
            for q in bench.questions:
                record = {"captioner": label, "dataset": bench.entry.name, "index": q.id, "image_id": q.image_id,
                          "category": q.category}
                rows.append(record)
                try:
                    original_key, original_size = images.info(q.image_id)
                except SampleError as exc:
                    record["error"] = str(exc)
                    continue
                if label == UPPER:
                    key, seen, load = original_key, original_size, lambda i=q.image_id: images.load(i)
                else:
                    recon = recons[label, q.image_id]
                    if isinstance(recon, str):
                        record["error"] = recon
                        continue
                    key, seen, load = recon.key, (recon.width, recon.height), recon.image
                    record["reconstruction"] = recon.location
                asks.append((key, judge_prompt(q, reading.coords)))
                loaders.append(load)
                pending.append((len(rows) - 1, q, bench.entry, original_size, seen))
    replies: list[str] = []
    step = max(1, cfg.batch_size) * 8
    bar = tqdm(total=len(asks), desc="answering", unit="question", disable=not progress or not asks,
               dynamic_ncols=True)
    for lo in range(0, len(asks), step):
        lazy = LazyImages()  # a chunk's images, opened only where an answer is missing, dropped after it
        for (key, _), load in zip(asks[lo: lo + step], loaders[lo: lo + step]):
            lazy.add(key, load)
        try:
            replies += answers(ctx, judge, asks[lo: lo + step], lazy, max_new_tokens)
        except FATAL:
            raise
        except Exception as exc:  # a judge's calls serve many rows at once: its failure is the run's
            raise RunError(f"judge: {explain_failure(exc)}") from exc
        bar.update(len(asks[lo: lo + step]))
    bar.close()
    graded: dict[tuple[str, str], list[tuple[BenchQuestion, Graded]]] = {}
    for (row, q, entry, source_size, seen), reply in zip(pending, replies):
        result = grade(q, reply, entry, source_size=source_size, seen_size=seen, reading=reading)
        rows[row].update(reply=reply, correct=result.correct, **({"iou": result.iou} if result.iou is not None else {}))
        graded.setdefault((rows[row]["captioner"], entry.name), []).append((q, result))
    return rows, graded


def _write(out_dir: Path, table: SuiteTable, rows, caption_rows, manifest, images: _Images,
           benchmarks: Sequence[Benchmark]) -> None:
    import csv

    write_jsonl_atomically(out_dir / "records.jsonl", rows, allow_nan=True)
    write_jsonl_atomically(out_dir / "captions.jsonl", caption_rows, allow_nan=True)
    listed: dict[str, dict[str, Any]] = {}
    for bench in benchmarks:
        for q in bench.questions:
            entry = listed.setdefault(q.image_id, {"image_id": q.image_id, "path": str(images.paths[q.image_id]),
                                                   "questions": []})
            entry["questions"].append({"dataset": bench.entry.name, "index": q.id})
    write_jsonl_atomically(out_dir / "images.jsonl", listed.values(), allow_nan=True)
    (out_dir / "table.md").write_text(table.to_markdown(), encoding="utf-8")
    long_rows = table.rows()
    with (out_dir / "table.csv").open("w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(long_rows[0]))
        writer.writeheader()
        writer.writerows(long_rows)
    write_summary(out_dir, table.summary())
    write_manifest(out_dir, manifest)
