"""`caprecon.meta`: score human-judged captions with some metrics and measure their agreement with people.

    results = caprecon.meta(["expert.jsonl", "crowdflower.jsonl"], metrics=["bleu-4", "cider", "recon"],
                            images="Flicker8k_Dataset", preset="fast", out="runs/meta")
    results = caprecon.meta(benchmark="pascal50s", data="pascal50s/", metrics=["cider"], out="runs/p50s")
    results = caprecon.meta(benchmark="flickr8k-expert", data="flickr8k/", verify=True)

The reference metrics (bleu-1..4, meteor, rouge, cider, spice) are computed here, one corpus per
judgments file; any other metric is scored by `score_metric`: by default caprecon's own scoring
(`caprecon.score` with the run settings), or a callable `score_metric(name, samples)`. Scores can
also come ready-made from `scores` files.

Writes to `out`: `meta.csv` and `meta.md` (one row per judgments file and metric), `scores-<file>.csv`
(every caption's score from every metric, reusable as `scores`), with `probes` or `triples`
`probes.csv` / `probes.md` and the probes' captions (`probe-triples.jsonl`, reusable as `triples`;
`probe-lengths.jsonl`; `probe-rejected.jsonl`; with a halluc metric, `probe-inserted.jsonl`), with
`fit` the fitted combinations' files (`caprecon.reports.fit`), and `report.html`.

`benchmark=NAME, data=PATH` runs a benchmark's pinned protocol (`caprecon.apps.metabench`) on its
own files, and `verify=True` sets the result beside the published values (`every_benchmark=True,
data_root=DIR`: every benchmark found under DIR, one table).
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Collection, Iterator, Mapping, Sequence

import numpy as np

from caprecon.apps.metabench import LAYOUTS, MODEL_LEVEL_KEYS, find_benchmarks, get_benchmark
from caprecon.apps.metabench.caparena import check_battles, check_human_ranking, has_systems
from caprecon.apps.metabench.fit import check_fit_arguments, cross_validate_file, finish_fit, refuse_unfittable_scores
from caprecon.apps.metabench.probes import run_probes
from caprecon.apps.metabench.protocol import run_benchmark
from caprecon.apps.metabench.report import write_csv_comparison, write_report
from caprecon.apps.metabench.request import MetaError, MetaRequest, ScoreMetric
from caprecon.apps.metabench.tifa160 import TIFA160, run_tifa160
from caprecon.apps.metabench.scoring import (OwnScorer, ScoresFile, benchmark_scores, direction_notes, metric_directions,
                                             metric_names, read_scores, score_judgments, scores_file,
                                             scores_file_columns, write_scores)
from caprecon.apps.metabench.verify import VerifyRow, published_values, read_expected, write_verify_csv
from caprecon.apps.metabench.verify import compare as beside_published
from caprecon.apps.metabench.probe_captions import ProbeWriter
from caprecon.core.digests import memo_scoped
from caprecon.data.judgments import JudgmentFormatError, Judgments, load_judgments, load_triples
from caprecon.data.loaders.hub import looks_like_repo_id
from caprecon.metrics.base import Column, Context
from caprecon.metrics.reference import REFERENCE_METRICS, ReferenceMetrics, reference_metric_name
from caprecon.models.llm import TextLLM
from caprecon.run.folder import check_out, run_folder
from caprecon.stats.agreement import (Comparison, MetaRow, check_human_order, compare_metrics, format_comparison,
                                      run_meta, write_csv, write_markdown)
from caprecon.stats.fit import DEFAULT_FOLDS
from caprecon.stats.probes import ProbeRow
from caprecon.store.index import Store

OWN = "caprecon"
"""`score_metric=OWN` (the default): caprecon's own metrics, scored by `caprecon.score` with the run settings."""


@dataclass
class MetaResults:
    """What a `meta` run found and wrote: the rows of `meta.csv` (one per judgments file, or
    benchmark, and metric; with `fit`, each fitted combination's and its transfer's), the probes'
    rows, `verify`'s table, and the notes under them."""

    rows: list[MetaRow]
    notes: list[str]
    out: Path | None = None
    benchmark: str | None = None  # the benchmark whose protocol ran (None: judgments files)
    probes: list[ProbeRow] = field(default_factory=list)  # probes.csv
    fits: list = field(default_factory=list)  # `FitResult`s: each file's cross-validated fit, then the transfer
    comparisons: list[Comparison] = field(default_factory=list)  # `compare`: A against B, per file
    verify: list[VerifyRow] | None = None  # verify: ours beside the published values (verify.csv)
    scores: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)  # scores-<name>.csv: metric -> scores

    @property
    def failed(self) -> bool:
        """Whether a value `verify` checked is off its published one by more than the tolerance."""
        return any(r.status == "fail" for r in self.verify or [])


@memo_scoped  # the probe LLM's files are hashed into the memo of the run settings' cache folder
def meta(
    judgments: str | Path | Sequence[str | Path] | None = None,
    *,
    metrics: str | Sequence[str] | None = None,
    out: str | Path | None = None,
    scores: str | Path | Sequence[str | Path] | None = None,
    images: str | Path | None = None,
    format: str = "auto",
    captions: str | Path | None = None,
    bootstrap: int = 1000,
    seed: int = 0,
    tau: str | None = None,
    human_order: str = "descending",
    probes: bool = False,
    triples: str | Path | None = None,
    benchmark: str | None = None,
    data: str | Path | None = None,
    compare: Sequence[str] | None = None,
    model_level: bool = False,
    tie_band: str = "exact",
    human_ranking: str = "published",
    verify: bool = False,
    tolerance: float = 1.0,
    expected: str | Path | None = None,
    every_benchmark: bool = False,
    data_root: str | Path | None = None,
    fit: bool = False,
    fit_model: str = "linear",
    folds: int = DEFAULT_FOLDS,
    save: str | Path | None = None,
    fit_on: str | None = None,
    evaluate_on: str | None = None,
    questions: str | Path | None = None,
    answers: str | Path | None = None,
    score_metric: ScoreMetric | str | None = OWN,
    llm: TextLLM | str | None = None,
    store: Store | None = None,
    scorable: Collection[str] | None = None,
    columns: Mapping[str, Column] | None = None,
    config: str | Path | None = None,
    progress: bool = False,
    **settings: Any,
) -> MetaResults:
    """Agreement of caption metrics with human judgments, and probes; `caprecon meta`'s options by
    their names (`caprecon meta --help` says what each does; `every_benchmark` is `--all`).

    `judgments`: judgments files, each scored on its own (`format`: recognised from the fields by
    default; `captions`: Flickr8k.token.txt for the original Flickr8k files; `images`: the folder
    their image names are relative to). `metrics`: names (default: the reference metrics); `scores`:
    one precomputed scores file per judgments file. `compare=(A, B)`: the paired bootstrap of A's
    agreement against B's. `fit`: a combination of the metrics fitted to the judgments
    (`fit_model`, `folds`, `fit_on`, `evaluate_on`, `save`). `probes`, `triples`: the probes.

    `score_metric` scores what is neither a reference metric nor in `scores`: `"caprecon"` (the
    default) is `caprecon.score` with the run settings (a `config` file, `llm` and `settings`,
    RunConfig fields: preset, generator, judge, ...), whose `llm` also writes the probes' captions; a
    callable `score_metric(name, samples)` returns one score per sample (NaN or None where it
    failed), with `scorable` the names it knows, `columns[name]` what each declares (its direction)
    and `llm` the probes' writer, its replies cached in `store`; None scores nothing else.

    `benchmark="tifa160"` scores no caption: `judgments` is its Likert file, `questions` DSG's
    proposition file and `answers` the recorded answers (`caprecon.apps.metabench.tifa160`).
    """
    request = MetaRequest(judgments, metrics, out, scores, images, format, captions, bootstrap, seed, tau,
                          human_order, probes, triples, benchmark, data, compare, model_level, tie_band, verify,
                          tolerance, expected, every_benchmark, data_root, fit, fit_model, folds, save, fit_on,
                          evaluate_on, progress, human_ranking, questions, answers)
    if benchmark == TIFA160:  # recorded answers: no metric runs, no model loads
        with _prologue(request):
            return _run_tifa160(request)
    if score_metric == OWN:
        if llm is not None:  # a run setting here, as in `caprecon.score`: a name, or a model
            settings["llm"] = llm
        own = OwnScorer(settings, config, progress)
        score_metric, columns = own, own.columns
        scorable = own.scorable(metric_names([*(request.metrics or []), *(request.compare or [])]))
        llm, opened = own.probe_llm_and_store()
        store = opened if store is None else store
    elif settings or config is not None:
        raise TypeError(f"run settings ({', '.join(sorted(settings)) or 'config'}) are for caprecon's own scoring "
                        "(score_metric='caprecon'), not for a scorer given as a callable")
    elif isinstance(score_metric, str):
        raise MetaError(f"score_metric: {score_metric!r} is neither 'caprecon' nor a callable")
    with _prologue(request):
        # the scorer's `columns` fill as it scores: an empty mapping is passed on as it is, never swapped
        return _run(request, score_metric, llm, store, scorable, {} if columns is None else columns)


@contextlib.contextmanager
def _prologue(req: MetaRequest) -> Iterator[None]:
    """The run lifecycle's prologue: `out` and `save` checked before any work, `out` locked."""
    trees = [req.data_root]
    if req.save is not None:
        check_out(req.save, inputs=req.inputs(), trees=trees, option="--save", file=True)
    if req.out is None:
        yield
        return
    with run_folder(req.out, inputs=req.inputs(), trees=trees):
        yield


def _run(req: MetaRequest, score_metric: ScoreMetric | None, llm: TextLLM | None,
         store: Store | None, scorable: Collection[str] | None, scored_columns: Mapping[str, Column]) -> MetaResults:
    if req.verify or req.benchmark:
        return _run_benchmark(req, score_metric, scored_columns)
    if not req.judgments or not req.out:
        raise MetaError("give --judgments FILE... and --out DIR (or --benchmark NAME --data PATH)")
    if req.model_level or req.format in LAYOUTS:
        raise MetaError(f"{'--model-level' if req.model_level else '--format ' + req.format} needs --benchmark: "
                        "only a benchmark's loader knows its models and its copies")
    metrics = metric_names(req.metrics)
    if req.compare:
        metrics += [name for name in metric_names(req.compare) if name not in metrics]
    if req.scores and len(req.scores) != len(req.judgments):
        raise MetaError(f"--scores takes one file per --judgments file ({len(req.judgments)}), got {len(req.scores)}")
    unknown = [m for m in metrics if reference_metric_name(m) is None]
    if unknown and score_metric is None and not req.scores:
        raise MetaError(
            f"no scorer for {', '.join(unknown)}: this command computes only the reference metrics "
            f"({', '.join(REFERENCE_METRICS)}); give other metrics' scores with --scores"
        )
    if unknown and scorable is not None and not req.scores:
        if misspelt := [m for m in unknown if m not in scorable]:  # found now, not after the reference metrics ran
            raise MetaError(f"unknown metric {', '.join(misspelt)}; known: {', '.join([*REFERENCE_METRICS, *scorable])}")
    if req.probes and llm is None:
        raise MetaError(
            "--probes needs an LLM (--llm NAME, or --llm MODEL --llm-opt base_url=URL for a server): it writes "
            "the Δ probe's paraphrases and the length probe's captions of three lengths. Without an LLM only "
            "the Δ probe on your own triples can run: give --triples FILE without --probes"
        )
    files = [load_judgments(path, req.format, captions=req.captions) for path in req.judgments]
    for judgments in files:
        try:
            check_human_order(judgments, req.human_order)
        except ValueError as exc:
            raise MetaError(f"--human-order: {exc}") from None
    check_fit_arguments(req, files)
    triples = load_triples(req.triples) if req.triples else None
    req.out.mkdir(parents=True, exist_ok=True)
    results = MetaResults([], [], req.out)
    rows, notes = results.rows, results.notes
    fits: list = []  # (judgments, scores, FitResult, directions) per file, with --fit
    with ReferenceMetrics([m for m in metrics if reference_metric_name(m)], skip_unavailable=True) as reference:
        notes += reference.skipped.values()
        for k, judgments in enumerate(files):
            samples = judgments.samples(req.images)
            given = read_scores(req.scores[k], samples) if req.scores else {}
            if req.fit:  # what --fit cannot take is refused before this file is scored
                refuse_unfittable_scores(judgments, given)
            scores = score_judgments(metrics, samples, reference, score_metric, given)
            file_columns = scores_file_columns(req.scores[k]) if req.scores else {}
            directions = metric_directions(scores, scored_columns, file_columns)
            if k == 0:
                probe_directions = directions  # the probes score the first file's images
            fit = cross_validate_file(req, judgments, scores, directions) if req.fit else None
            written = {**scores, fit.name: fit.predictions} if fit else scores  # the report draws its scatter
            name = Path(judgments.name).stem
            write_scores(judgments, samples, written, req.out / f"scores-{name}.csv")
            results.scores[name] = written
            rows += run_meta(judgments, scores, tau_variant=req.tau, human_order=req.human_order,
                             n_bootstrap=req.bootstrap, seed=req.seed, higher_is_better=directions)
            if fit:
                fits.append((judgments, scores, fit, directions))
                rows.append(fit.rows[0])
            if req.compare:
                comparison = _compare(req, judgments, scores, directions)
                results.comparisons.append(comparison)
                notes.append(f"{judgments.name}: {format_comparison(comparison)}")
        if req.probes or triples is not None:
            writer = None
            if req.probes:  # an LLM is there: checked above
                context = Context(store if store is not None else Store.temporary())
                writer = ProbeWriter(llm, context, progress=req.progress)
            results.probes = run_probes(req, files[0], triples, writer, metrics, reference, score_metric, notes,
                                        probe_directions)

    if fits:
        transferred, results.fits = finish_fit(req, fits, notes)
        rows += transferred
    notes += direction_notes(rows)
    write_csv(rows, req.out / "meta.csv")
    write_markdown(rows, req.out / "meta.md", title="Agreement with human judgments", notes=notes)
    if results.probes:
        write_csv(results.probes, req.out / "probes.csv")
        write_markdown(results.probes, req.out / "probes.md", title="Probes", notes=notes)
    write_report(req.out)
    return results


def _run_tifa160(req: MetaRequest) -> MetaResults:
    benchmark = get_benchmark(TIFA160)
    if req.metrics or req.scores or req.data or req.compare or req.fit or req.probes or req.model_level:
        raise MetaError("--benchmark tifa160 scores recorded answers: give --judgments, --questions and --answers, "
                        "and no --metric, --scores, --data, --compare, --fit, --probes or --model-level")
    n_bootstrap = 0 if req.verify else req.bootstrap
    rows, notes, _ = run_tifa160(req.judgments, req.questions, req.answers, n_bootstrap=n_bootstrap, seed=req.seed,
                                 out=req.out)
    protocol = f"{benchmark.name}: spearman and {benchmark.statistic}; judged: {benchmark.sampling}"
    if req.verify:
        expected = read_expected(req.expected, benchmark.name) if req.expected else published_values(benchmark)
        table = beside_published(benchmark, rows, expected, tolerance=req.tolerance, skipped={})
        if req.out:
            write_verify_csv(table, req.out / "verify.csv")
        return MetaResults(rows, [protocol, *notes], req.out, benchmark.name, verify=table)
    if req.out:  # optional here: the figures are printed (--json), and nothing else is made
        write_csv(rows, req.out / "meta.csv")
        write_markdown(rows, req.out / "meta.md", title="Agreement with people: tifa160", notes=[protocol, *notes])
    return MetaResults(rows, [protocol, *notes], req.out, benchmark.name)


def _compare(req: MetaRequest, judgments: Judgments, scores: dict[str, np.ndarray],
             directions: Mapping[str, bool | None]) -> Comparison:
    a, b = (reference_metric_name(m) or m for m in req.compare)
    if missing := [m for m in (a, b) if m not in scores]:
        raise MetaError(f"--compare: {', '.join(missing)} not among the scored metrics ({', '.join(scores)})")
    return compare_metrics(judgments, a, scores[a], b, scores[b], tau_variant=req.tau,
                           human_order=req.human_order, n_resamples=req.bootstrap,
                           seed=req.seed, higher_is_better=directions)  # fmt: skip


# `meta(benchmark=NAME, data=PATH)` and `meta(..., verify=True)`: both read the benchmark with its own
# loader, score every caption (reference metrics here, other metrics through the scorer or a `scores`
# file) and run its pinned protocol; `verify` then sets the result beside the published values.


def _run_benchmark(req: MetaRequest, score_metric: ScoreMetric | None,
                   scored_columns: Mapping[str, Column] | None = None) -> MetaResults:
    fitting = [name for name, value in (("--fit", req.fit), ("--save", req.save), ("--fit-on", req.fit_on),
                                        ("--evaluate-on", req.evaluate_on)) if value]
    if fitting:  # the benchmark path has no fit: accepted, they were silently ignored
        raise MetaError(f"{', '.join(fitting)}: {'meta verify' if req.verify else '--benchmark'} runs a benchmark's "
                        "pinned protocol and fits nothing; fit a combination on judgments files with "
                        "`caprecon meta --judgments FILE... --fit`")
    if req.every_benchmark or req.data_root:
        return _verify_all(req, score_metric)
    if not req.benchmark or not req.data:
        raise MetaError("--benchmark NAME and --data PATH are needed together")
    if req.judgments:
        raise MetaError("give either --judgments files or --benchmark with --data, not both")
    if req.human_order != "descending":
        raise MetaError("--human-order: a --benchmark's protocol fixes how its judgments are read")
    benchmark = get_benchmark(req.benchmark)
    if not Path(req.data).exists() and not looks_like_repo_id(req.data):
        raise MetaError(f"--data {req.data} does not exist")
    if req.format != "auto" and req.format not in benchmark.layouts:
        raise MetaError(f"--format {req.format}: {benchmark.name} reads "
                        + (f"{', '.join(benchmark.layouts)} (or auto)" if benchmark.layouts else "its files as recognised, give no --format"))
    verifying = req.verify
    if not verifying and not req.out:
        raise MetaError("--out DIR is needed (where the results go)")
    if req.compare and not verifying and (benchmark.reference_draws or benchmark.statistic == "pearson"):
        raise MetaError(f"--compare supports τ and accuracy benchmarks without reference draws, not {benchmark.name}")
    judgments = benchmark.load(str(req.data), layout=req.format) if benchmark.layouts else benchmark.load(str(req.data))
    if req.model_level and (benchmark.reference_draws or not has_systems(judgments)):
        raise MetaError(f"--model-level: {benchmark.name} does not name the model behind every caption "
                        f"(benchmarks that do: thumb, caparena)")
    if req.tie_band != "exact" and benchmark.statistic != "caparena":
        raise MetaError(f"--tie-band applies to caparena's three-way agreement, not to {benchmark.name}")
    if req.human_ranking != "published" and benchmark.statistic != "caparena":
        raise MetaError(f"--human-ranking applies to caparena's model-level agreement, not to {benchmark.name}")
    load_notes = list(judgments.notes)
    if benchmark.statistic == "caparena":
        try:
            load_notes += check_battles(judgments.items, model_level=req.model_level)
        except ValueError as exc:
            raise MetaError(f"{benchmark.name} ({req.data}): {exc}") from None
        try:
            check_human_ranking(judgments.items, req.human_ranking)
        except ValueError as exc:
            raise MetaError(f"--human-ranking {req.human_ranking}: {exc}") from None
    expected = read_expected(req.expected, benchmark.name) if req.expected else published_values(benchmark)
    if verifying and not expected:
        raise MetaError(f"no published values for {benchmark.name}; give some with --expected")
    files = [scores_file(path) for path in req.scores or []]  # read once, aligned with every draw's samples
    given_names = list(benchmark_scores(files, judgments.samples(req.images), [])) if files else []
    if req.metrics:
        metrics = metric_names(req.metrics)
    elif verifying:
        # Every published metric we can compute, and every one whose scores were given.
        metrics = [m for m in expected if reference_metric_name(m) or m in given_names]
    else:
        metrics = metric_names(None)
    pair = [reference_metric_name(name) or name for name in req.compare] if req.compare else []
    metrics += [name for name in pair if name not in metrics]
    unknown = [m for m in metrics if reference_metric_name(m) is None and m not in given_names]
    if unknown and score_metric is None:
        raise MetaError(f"no scorer for {', '.join(unknown)}: give their per-caption scores with --scores")

    last: dict = {}
    score_notes: list[str] = []
    with ReferenceMetrics([m for m in metrics if reference_metric_name(m)], skip_unavailable=True) as reference:
        n_bootstrap = 0 if verifying else req.bootstrap
        rows = _run_protocol(benchmark, judgments, metrics, reference, score_metric, req, n_bootstrap, last, score_notes,
                             files, {} if scored_columns is None else scored_columns)
        skipped = dict(reference.skipped)

    protocol = f"{benchmark.name}: {benchmark.statistic}; references: {benchmark.references}; judged: {benchmark.sampling}"
    if benchmark.statistic == "caparena":  # which people's ranking the model-level values are against
        protocol += f"; model level: {benchmark.protocol(MODEL_LEVEL_KEYS[0], req.human_ranking)['sampling']}"
    if verifying:
        table = beside_published(benchmark, rows, expected, tolerance=req.tolerance, skipped=skipped,
                                 human_ranking=req.human_ranking)
        results = MetaResults([], [protocol, *load_notes, *dict.fromkeys(score_notes)], req.out, benchmark.name,
                              verify=table)
        if req.out:
            req.out.mkdir(parents=True, exist_ok=True)
            write_verify_csv(table, req.out / "verify.csv")
            write_report(req.out)
        return results

    notes = [protocol, *load_notes, *skipped.values(), *dict.fromkeys(score_notes), *direction_notes(rows)]
    results = MetaResults(rows, notes, req.out, benchmark.name, scores={benchmark.name: last["scores"]})
    req.out.mkdir(parents=True, exist_ok=True)
    write_scores(last["judgments"], last["samples"], last["scores"], req.out / f"scores-{benchmark.name}.csv")
    write_csv(rows, req.out / "meta.csv")
    write_markdown(rows, req.out / "meta.md", title=f"Agreement with people: {benchmark.name}", notes=notes)
    if pair:
        a, b = pair
        if missing := [m for m in (a, b) if m not in last["scores"]]:
            raise MetaError(f"--compare: {', '.join(missing)} could not be scored (the notes in "
                            f"{req.out / 'meta.md'} say why; its table is written)")
        comparison = compare_metrics(last["judgments"], a, last["scores"][a], b, last["scores"][b],
                                     tau_variant=benchmark.tau_variant, n_resamples=req.bootstrap,
                                     seed=req.seed, higher_is_better=last["directions"])  # fmt: skip
        results.comparisons.append(comparison)
        write_csv_comparison(comparison, req.out / "compare.csv")
    write_report(req.out)
    return results


def _run_protocol(benchmark, judgments: Judgments, metrics: Sequence[str], reference: ReferenceMetrics,
                  score_metric: ScoreMetric | None, req: MetaRequest, n_bootstrap: int, last: dict,
                  score_notes: list[str], files: Sequence[ScoresFile] = (),
                  scored_columns: Mapping[str, Column] | None = None) -> list[MetaRow]:
    """The benchmark's protocol on `judgments`; `last` keeps the (last draw's) judgments, samples and
    scores, as scored, and the metrics' directions (`directions`)."""
    # filled as each draw is scored: `score_metric` declares a metric's column only once it has scored it
    directions: dict[str, bool | None] = {}
    # a --scores file written by a caprecon run declares its metrics' columns in the run's manifest
    file_columns = [scores_file_columns(path) for path, released, _ in files if not released]

    def score(draw: Judgments):
        samples = draw.samples(req.images)
        given = benchmark_scores(files, samples, score_notes) if files else {}
        last.update(judgments=draw, samples=samples,
                    scores=score_judgments(metrics, samples, reference, score_metric, given, score_notes))
        directions.update(metric_directions(last["scores"], {} if scored_columns is None else scored_columns,
                                            *file_columns))
        last["directions"] = directions
        return last["scores"]

    return run_benchmark(benchmark, judgments, score, n_bootstrap=n_bootstrap, seed=req.seed, tie_band=req.tie_band,
                         model_level=req.model_level, higher_is_better=directions,
                         human_ranking=req.human_ranking)  # fmt: skip


def _verify_all(req: MetaRequest, score_metric: ScoreMetric | None) -> MetaResults:
    """`verify=True, every_benchmark=True, data_root=DIR, out=DIR`: every benchmark found under DIR, one table."""
    if not req.verify or not req.every_benchmark or not req.data_root or not req.out:
        raise MetaError("give `meta verify --all --data-root DIR --out DIR` (all three go together)")
    if req.benchmark or req.data or req.scores or req.judgments:
        raise MetaError("--all finds every benchmark under --data-root: give no --benchmark, --data, --scores or --judgments")
    if not req.data_root.is_dir():
        raise MetaError(f"--data-root {req.data_root} is not a folder")
    found = find_benchmarks(req.data_root)
    if not found:
        raise MetaError(f"no benchmark data under {req.data_root} "
                        "(docs/validate.md lists the benchmarks and their files)")
    req.out.mkdir(parents=True, exist_ok=True)
    plans = []
    for benchmark, path in found:
        expected = read_expected(req.expected, benchmark.name, required=False) if req.expected else published_values(benchmark)
        metrics = metric_names(req.metrics) if req.metrics else [m for m in expected if reference_metric_name(m)]
        plans.append((benchmark, path, expected, metrics))
    table: list[VerifyRow] = []
    results = MetaResults([], [], req.out, verify=table)
    meta_rows, notes = results.rows, results.notes
    wanted = dict.fromkeys(m for *_, metrics in plans for m in metrics if reference_metric_name(m))
    with ReferenceMetrics(list(wanted), skip_unavailable=True) as reference:
        for benchmark, path, expected, metrics in plans:
            if not expected and not req.metrics:
                notes.append(f"{benchmark.name}: found at {path}; no published values to check it against")
                continue
            try:
                judgments = benchmark.load(str(path))
                load_notes = list(judgments.notes)
                if benchmark.statistic == "caparena":
                    load_notes += check_battles(judgments.items, model_level=req.model_level)
                    check_human_ranking(judgments.items, req.human_ranking)
            except ValueError as exc:  # a JudgmentFormatError, battles without a statistic, or unranked models
                reason = f"{benchmark.name}: {exc}"
                table += [VerifyRow(benchmark.name, metric, key, math.nan, published.value, math.nan, req.tolerance,
                                    "skipped", published.source, reason) for metric, keys in expected.items()
                          for key, published in keys.items()]  # fmt: skip
                notes.append(reason)
                continue
            notes += load_notes
            last: dict = {}
            rows = _run_protocol(benchmark, judgments, metrics, reference, score_metric, req, 0, last, notes)
            table += beside_published(benchmark, rows, expected, tolerance=req.tolerance, skipped=reference.skipped,
                                      human_ranking=req.human_ranking)
            meta_rows += rows
            if last:
                write_scores(last["judgments"], last["samples"], last["scores"], req.out / f"scores-{benchmark.name}.csv")
                results.scores[benchmark.name] = last["scores"]
            notes.append(f"{benchmark.name} ({path}): {benchmark.statistic}; references: {benchmark.references}")
        notes += reference.skipped.values()
    write_verify_csv(table, req.out / "verify.csv")
    write_markdown(table, req.out / "verify.md", title="Ours beside the published values", notes=notes)
    write_csv(meta_rows, req.out / "meta.csv")
    write_markdown(meta_rows, req.out / "meta.md", title="Agreement with people, every benchmark found", notes=notes)
    write_report(req.out)
    return results
