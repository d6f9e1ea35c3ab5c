"""`caprecon meta`: score human-judged captions with some metrics and report agreement.

    caprecon meta --judgments expert.jsonl crowdflower.jsonl --images DIR \\
        --metric bleu-4 cider meteor --out runs/meta [--bootstrap 1000] [--seed 0]

The reference metrics (bleu-1..4, meteor, rouge, cider, spice) are computed here, one
corpus per judgments file. Any other metric name goes to the `score_metric` callable
given to `run_meta_command`, which is how the main CLI plugs in caprecon's own metrics.
Scores can also come ready-made from `--scores` files.

Writes to --out: `meta.csv` and `meta.md` (one row per judgments file and metric),
`scores-<file>.csv` (every caption's score from every metric, reusable via --scores),
and with --probes or --triples `probes.csv` / `probes.md`, plus the probes' captions
(`probe-triples.jsonl`, reusable via --triples; `probe-lengths.jsonl`; `probe-rejected.jsonl`;
with a halluc metric, `probe-inserted.jsonl` for the inserted-object probe).

The probes need an LLM (`TextLLM`) to write their captions: `caprecon meta --llm ...`
passes one; on its own this module can run only the Δ probe on user --triples.

`caprecon meta --benchmark NAME --data PATH` and `caprecon meta verify` run a benchmark's
pinned protocol (`caprecon.apps.metabench`) on its own files, and `verify` sets the result
beside the published values.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
from dataclasses import replace
from pathlib import Path
from typing import Callable, Collection, Iterable, Mapping, Sequence

import numpy as np

from caprecon.core.checks import MAX_RESAMPLES
from caprecon.core.errors import ConfigError
from caprecon.core.redaction import redact_text
from caprecon.cli.common import Parser, Writes, real_number, run_command, whole_number
from caprecon.data.judgments import FORMATS, JudgmentFormatError, Judgments, ProbeTriple, load_judgments, load_triples
from caprecon.stats.agreement import (ASSUMED, HUMAN_ORDERS, LOWER, MetaRow, check_human_order, compare_metrics, format_comparison, format_table, run_meta, scores_from_records, write_csv, write_markdown)
from caprecon.apps.metabench import LAYOUTS, find_benchmarks, get_benchmark
from caprecon.apps.metabench.caparena import TIE_BANDS, has_systems
from caprecon.apps.metabench.protocol import run_benchmark
from caprecon.apps.metabench.verify import (VerifyRow, compare, format_verify, published_values, read_expected, write_verify_csv)
from caprecon.data.loaders.hub import looks_like_repo_id
from caprecon.data.loaders.released import ReleasedScoresError, is_released_scores, join_released, read_released_scores
from caprecon.metrics import declared_column
from caprecon.metrics.base import Column, Context, read_columns
from caprecon.metrics.claims import extract_claims
from caprecon.metrics.reference import (REFERENCE_METRICS, ReferenceMetricError, ReferenceMetrics, reference_metric_name)
from caprecon.models.llm import TextLLM
from caprecon.stats.seeds import unique_ids
from caprecon.stats.probes import (LENGTHS, Perturber, ProbeRow, ProbeWriter, as_records, inserted_object_captions, insertion_probe, length_robustness, length_samples, length_sets, overlap_problem, paraphrase_delta, paraphrase_triples, triple_samples)
from caprecon.core.records import read_records, write_jsonl_atomically
from caprecon.data.samples import Sample
from caprecon.store.index import Store

ScoreMetric = Callable[[str, list[Sample]], Sequence[float]]
"""score_metric(name, samples) -> one score per sample (NaN or None where it failed)."""


# Columns of scores-<file>.csv that describe the caption rather than score it.
_SCORES_INFO_COLUMNS = ("image_id", "caption", "human")


class MetaError(RuntimeError):
    """A problem with the request as a whole; reported as one line, exit status 2."""


def add_meta_arguments(parser: argparse.ArgumentParser) -> None:
    parser.set_defaults(writes=Writes(inputs=("judgments", "scores", "images", "data", "triples", "expected"),
                                      trees=("data_root",), files=("save",)))
    parser.add_argument(
        "action", nargs="?", choices=("verify",),
        help="verify: our values beside the published ones for --benchmark (see caprecon.apps.metabench.verify)",
    )  # fmt: skip
    parser.add_argument(
        "--judgments", nargs="+", type=Path, metavar="FILE",
        help="human judgments: Flickr8k-Expert / -CrowdFlower JSONL, pairwise preferences, "
        "or a generic CSV/JSONL of (image, caption, human score); several files are scored separately",
    )  # fmt: skip
    parser.add_argument(
        "--format", default="auto", choices=("auto", *FORMATS, *LAYOUTS),
        help="judgments format (default: recognised from the fields); with --benchmark, which copy of its data "
        f"--data holds ({', '.join(LAYOUTS)}; default: recognised from the file)",
    )  # fmt: skip
    parser.add_argument(
        "--captions", type=Path, metavar="FILE",
        help="Flickr8k.token.txt, needed to read the original ExpertAnnotations.txt / CrowdFlowerAnnotations.txt",
    )  # fmt: skip
    parser.add_argument(
        "--images", type=Path, metavar="DIR",
        help="folder the judgments' image names are relative to (default: the judgments file's folder); "
        "the reference metrics do not open images",
    )  # fmt: skip
    parser.add_argument(
        "--metric", nargs="+", action="extend", metavar="NAME",
        help=f"metrics to evaluate (default: the reference metrics {', '.join(REFERENCE_METRICS)}); "
        "commas also separate names",
    )  # fmt: skip
    parser.add_argument(
        "--out", type=Path, metavar="DIR", help="folder for the CSV and markdown results (optional for verify)"
    )
    parser.add_argument(
        "--scores", nargs="+", type=Path, metavar="FILE",
        help="precomputed per-caption scores (CSV/JSONL with `id` and a column per metric), one file per "
        "--judgments file in the same order; metrics found there are not recomputed",
    )  # fmt: skip
    parser.add_argument(
        "--bootstrap", type=whole_number(0, MAX_RESAMPLES), default=1000, metavar="N", help="bootstrap resamples for the CIs (0: none)"
    )
    parser.add_argument("--seed", type=whole_number(0), default=0, help="seed of the bootstrap and of the perturber")
    parser.add_argument(
        "--tau", choices=("b", "c"),
        help="Kendall variant for rating judgments (default: c for Flickr8k-Expert, b otherwise); "
        "both are reported, this one with its CI",
    )  # fmt: skip
    parser.add_argument(
        "--human-order", choices=HUMAN_ORDERS, default="descending",
        help="descending: a larger human score is better (ratings, the default); ascending: a smaller one is "
        "(ranks, 1 = best), so tau is computed against the reversed ranks and stays positive for agreement",
    )  # fmt: skip
    parser.add_argument(
        "--probes", action="store_true",
        help="also run the ReconScore paper's probes on the images of the first --judgments file; needs --llm, "
        "which paraphrases references for the Δ probe (unless --triples is given) and writes captions of three "
        "lengths from triplets it extracts for the length probe; with a halluc metric, also the inserted-object "
        "probe (its claim splitter is --llm)",
    )  # fmt: skip
    parser.add_argument(
        "--triples", type=Path, metavar="FILE",
        help="your (image, reference, paraphrase, perturbed) rows for the Δ probe; without --probes only the "
        "Δ probe runs, and it needs no LLM",
    )  # fmt: skip
    _add_benchmark_arguments(parser)
    _add_fit_arguments(parser)


def _add_benchmark_arguments(parser: argparse.ArgumentParser) -> None:
    from caprecon.apps.metabench import BENCHMARKS

    parser.add_argument(
        "--benchmark", choices=tuple(BENCHMARKS),
        help="run a benchmark's pinned protocol (statistic, references, exclusions) on the files in --data",
    )  # fmt: skip
    parser.add_argument("--data", type=Path, metavar="PATH", help="the --benchmark's file or folder, as published")
    parser.add_argument(
        "--compare", nargs=2, metavar=("A", "B"),
        help="paired bootstrap over images: does metric A agree with people better than B? (difference, CI, p)",
    )  # fmt: skip
    parser.add_argument(
        "--model-level", action="store_true",
        help="also rank the benchmark's models by each metric (mean score per model, or Elo of its pairwise "
        "verdicts) and correlate with people's ranking (Spearman, Kendall; bootstrap CIs over images)",
    )  # fmt: skip
    parser.add_argument(
        "--tie-band", choices=TIE_BANDS, default="exact",
        help="caparena: when a metric calls a battle a tie: exact (equal scores) or matched (the score gap under "
        "which it predicts as many ties as people gave)",
    )  # fmt: skip
    parser.add_argument(
        "--tolerance", type=real_number(0), default=1.0, metavar="POINTS",
        help="verify: largest |ours - published| that passes, in points (values x100)",
    )  # fmt: skip
    parser.add_argument(
        "--expected", type=Path, metavar="FILE",
        help="verify: CSV (benchmark, metric, key, value[, source]) replacing the built-in published values",
    )  # fmt: skip
    parser.add_argument(
        "--all", action="store_true",
        help="verify: every benchmark found under --data-root, one table (verify.csv/.md, meta.csv, report) in --out",
    )  # fmt: skip
    parser.add_argument("--data-root", type=Path, metavar="DIR",
                        help="verify --all: the folder the benchmarks' files (or the Hugging Face cache) are under")


def run_meta_command(
    args: argparse.Namespace,
    score_metric: ScoreMetric | None = None,
    *,
    llm: TextLLM | None = None,
    store: Store | None = None,
    scorable: Collection[str] | None = None,
    columns: Mapping[str, Column] | None = None,
) -> int:
    """Run `caprecon meta` with parsed `args`; returns the exit status.

    `score_metric(name, samples)` scores every metric that is not a reference metric and
    not in a --scores file; without it such a metric is an error. `scorable`, when given,
    names the metrics it can score, so a misspelt name stops the command before any work.
    `llm` writes the probes' captions, its replies cached in `store` (a temporary one when
    not given). `columns[name]`: what metric `name` declares of the column `score_metric` reads,
    which `score_metric` may fill as it scores (a run's manifest holds it); a metric's direction
    is read from it, a --scores file's run manifest or the registry (`metric_directions`).
    """
    try:
        return _run(args, score_metric, llm, store, scorable, columns or {})
    except (MetaError, JudgmentFormatError, ReferenceMetricError) as exc:
        print(f"caprecon: error: {redact_text(str(exc))}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace, score_metric: ScoreMetric | None, llm: TextLLM | None,
         store: Store | None, scorable: Collection[str] | None, scored_columns: Mapping[str, Column]) -> int:
    if args.action == "verify" or args.benchmark:

        return run_benchmark_command(args, score_metric, scored_columns)
    if not args.judgments or not args.out:
        raise MetaError("give --judgments FILE... and --out DIR (or --benchmark NAME --data PATH)")
    if args.model_level or args.format in LAYOUTS:
        raise MetaError(f"{'--model-level' if args.model_level else '--format ' + args.format} needs --benchmark: "
                        "only a benchmark's loader knows its models and its copies")
    metrics = metric_names(args.metric)
    if args.compare:
        metrics += [name for name in metric_names(args.compare) if name not in metrics]
    if args.scores and len(args.scores) != len(args.judgments):
        raise MetaError(f"--scores takes one file per --judgments file ({len(args.judgments)}), got {len(args.scores)}")
    unknown = [m for m in metrics if reference_metric_name(m) is None]
    if unknown and score_metric is None and not args.scores:
        raise MetaError(
            f"no scorer for {', '.join(unknown)}: this command computes only the reference metrics "
            f"({', '.join(REFERENCE_METRICS)}); give other metrics' scores with --scores"
        )
    if unknown and scorable is not None and not args.scores:
        if misspelt := [m for m in unknown if m not in scorable]:  # found now, not after the reference metrics ran
            raise MetaError(f"unknown metric {', '.join(misspelt)}; known: {', '.join([*REFERENCE_METRICS, *scorable])}")
    if args.probes and llm is None:
        raise MetaError(
            "--probes needs an LLM (--llm NAME, or --llm MODEL --llm-opt base_url=URL for a server): it writes "
            "the Δ probe's paraphrases and the length probe's captions of three lengths. Without an LLM only "
            "the Δ probe on your own triples can run: give --triples FILE without --probes"
        )
    files = [load_judgments(path, args.format, captions=args.captions) for path in args.judgments]
    for judgments in files:
        try:
            check_human_order(judgments, args.human_order)
        except ValueError as exc:
            raise MetaError(f"--human-order: {exc}") from None
    _check_fit_arguments(args, files)
    triples = load_triples(args.triples) if args.triples else None
    args.out.mkdir(parents=True, exist_ok=True)
    rows: list[MetaRow] = []
    notes: list[str] = []
    fits: list = []  # (judgments, scores, FitResult, directions) per file, with --fit
    with ReferenceMetrics([m for m in metrics if reference_metric_name(m)], skip_unavailable=True) as reference:
        notes += reference.skipped.values()
        for k, judgments in enumerate(files):
            samples = judgments.samples(args.images)
            given = read_scores(args.scores[k], samples) if args.scores else {}
            scores = score_judgments(metrics, samples, reference, score_metric, given)
            file_columns = scores_file_columns(args.scores[k]) if args.scores else {}
            directions = metric_directions(scores, scored_columns, file_columns)
            fit = _fit(args, judgments, scores, directions) if args.fit else None
            written = {**scores, fit.name: fit.predictions} if fit else scores  # the report draws its scatter
            write_scores(judgments, samples, written, args.out / f"scores-{Path(judgments.name).stem}.csv")
            rows += run_meta(judgments, scores, tau_variant=args.tau, human_order=args.human_order,
                             n_bootstrap=args.bootstrap, seed=args.seed, higher_is_better=directions)
            if fit:
                fits.append((judgments, scores, fit, directions))
                rows.append(fit.rows[0])
            if args.compare:
                notes.append(_compare(args, judgments, scores, directions))
        probe_rows = []
        if args.probes or triples is not None:
            writer = None
            if args.probes:  # an LLM is there: checked above
                context = Context(store if store is not None else Store.temporary())
                writer = ProbeWriter(llm, context, progress=not getattr(args, "quiet", False))
            probe_rows = _probes(args, files[0], triples, writer, metrics, reference, score_metric, notes)

    if fits:
        rows += _finish_fit(args, fits, notes)
    notes += direction_notes(rows)
    write_csv(rows, args.out / "meta.csv")
    write_markdown(rows, args.out / "meta.md", title="Agreement with human judgments", notes=notes)
    print(format_table(rows))
    if probe_rows:
        write_csv(probe_rows, args.out / "probes.csv")
        write_markdown(probe_rows, args.out / "probes.md", title="Probes", notes=notes)
        print()
        print(format_table(probe_rows))
    for note in notes:
        print(f"note: {note}")
    _write_report(args.out)
    return 0


# `--fit`: a combination of the metrics fitted to the judgments (caprecon.stats.fit), cross-validated by
# image on every file, optionally carried from one file to another, and saved for `score -m fused:FILE`.


def _add_fit_arguments(parser: argparse.ArgumentParser) -> None:
    from caprecon.stats.fit import DEFAULT_FOLDS, MODELS

    parser.add_argument(
        "--fit", action="store_true",
        help="also fit a combination of the metrics' scores to the human judgments and report its out-of-fold "
        "agreement (folds grouped by image) beside each metric's, with a paired test against the best one",
    )  # fmt: skip
    parser.add_argument(
        "--fit-model", choices=MODELS, default="linear",
        help="linear: non-negative weights on standardised scores; logistic: rank-based, on pairs of captions; "
        "gbt: monotone gradient-boosted trees (ratings only, not savable). Default linear",
    )  # fmt: skip
    parser.add_argument("--folds", type=whole_number(2), default=DEFAULT_FOLDS, metavar="K",
                        help=f"cross-validation folds, grouped by image (default {DEFAULT_FOLDS})")
    parser.add_argument(
        "--save", type=Path, metavar="FILE",
        help="with --fit: write the model fitted on all rows of the --fit-on file (default: the first) as JSON, "
        "for `caprecon score -m fused:FILE`",
    )  # fmt: skip
    parser.add_argument("--fit-on", metavar="FILE", help="with --fit: the --judgments file the transferred and "
                        "saved model is fitted on (its name or stem; default: the first)")
    parser.add_argument("--evaluate-on", metavar="FILE",
                        help="with --fit: another --judgments file the --fit-on file's model is evaluated on")


def _check_fit_arguments(args: argparse.Namespace, files: Sequence[Judgments]) -> None:
    """Misuse of the --fit options stops the command before any scoring."""
    given = [name for name, value in (("--save", args.save), ("--fit-on", args.fit_on),
                                      ("--evaluate-on", args.evaluate_on)) if value]
    if given and not args.fit:
        raise MetaError(f"{', '.join(given)} need(s) --fit")
    if not args.fit:
        return
    if args.save and args.fit_model == "gbt":
        raise MetaError("--save writes linear and logistic models only: gradient-boosted trees have no plain-JSON "
                        "form in scikit-learn, and caprecon does not write pickles (opening one runs code)")
    for option, name in (("--fit-on", args.fit_on), ("--evaluate-on", args.evaluate_on)):
        if name:
            _judgments_named(name, files, option)
    if args.evaluate_on and _judgments_named(args.evaluate_on, files, "") is _fit_on(args, files):
        raise MetaError("--evaluate-on names the same file the model is fitted on; its cross-validation is the "
                        "honest figure there")


def _judgments_named(name: str, files: Sequence[Judgments], option: str) -> Judgments:
    for judgments in files:
        if name in (judgments.name, Path(judgments.name).stem, str(judgments.path)):
            return judgments
    raise MetaError(f"{option} {name!r} is none of the --judgments files ({', '.join(j.name for j in files)})")


def _fit_on(args: argparse.Namespace, files: Sequence[Judgments]) -> Judgments:
    return _judgments_named(args.fit_on, files, "--fit-on") if args.fit_on else files[0]


def _fit(args: argparse.Namespace, judgments: Judgments, scores: dict[str, np.ndarray],
         directions: Mapping[str, bool | None]):
    from caprecon.stats.fit import FitError, cross_validate

    try:
        return cross_validate(args.fit_model, judgments, scores, list(scores), n_folds=args.folds,
                              tau_variant=args.tau, human_order=args.human_order, n_bootstrap=args.bootstrap,
                              seed=args.seed, higher_is_better=directions)
    except FitError as exc:
        raise MetaError(f"{judgments.name}: {exc}") from None


def _finish_fit(args: argparse.Namespace, fits: list, notes: list[str]) -> list[MetaRow]:
    """The transfer (--evaluate-on), the fit report and --save; returns the transfer's rows for meta.csv."""
    from caprecon.reports.fit import result_notes, write_fit_report
    from caprecon.stats.fit import FitError, fused_model, transfer

    source = _fit_on(args, [j for j, _, _, _ in fits])
    _, _, trained, _ = next(f for f in fits if f[0] is source)
    results = [fit for _, _, fit, _ in fits]
    rows: list[MetaRow] = []
    if args.evaluate_on:
        target = _judgments_named(args.evaluate_on, [j for j, _, _, _ in fits], "--evaluate-on")
        _, target_scores, _, target_directions = next(f for f in fits if f[0] is target)
        try:
            moved = transfer(trained.final, source.name, target, target_scores, tau_variant=args.tau,
                             human_order=args.human_order, n_bootstrap=args.bootstrap, seed=args.seed,
                             higher_is_better=target_directions)
        except FitError as exc:
            raise MetaError(f"--evaluate-on {target.name}: {exc}") from None
        results.append(moved)
        rows.append(moved.rows[0])
    write_fit_report(results, args.out)
    for result in results:
        print()
        print(format_table(result.rows))
        for note in result_notes(result):
            print(f"  {note}")
    if args.save:
        sha256 = fused_model(trained).save(args.save)
        notes.append(f"saved the {trained.kind} model fitted on all of {source.name} to {args.save} "
                     f"(sha256 {sha256[:12]}; the out-of-fold figure above estimates it on unseen images); "
                     f"use it with caprecon score -m fused:{args.save}")
    return rows


def probe_llm_and_store(settings: dict, config_file: str | None) -> dict:
    """The run settings' LLM and the store its probe replies are cached in (the run's cache, or a
    temporary one under --no-cache); both None when no LLM is set."""
    from caprecon.run.config import RunConfig
    from caprecon.run.roles import Roles
    from caprecon.run.folder import open_store

    config = RunConfig.build(file=config_file, **settings)
    if config.llm is None:
        return {"llm": None, "store": None}
    store = open_store(config, None)
    return {"llm": Roles(config).llm, "store": store}


def _compare(args: argparse.Namespace, judgments: Judgments, scores: dict[str, np.ndarray],
             directions: Mapping[str, bool | None]) -> str:
    a, b = (reference_metric_name(m) or m for m in args.compare)
    if missing := [m for m in (a, b) if m not in scores]:
        raise MetaError(f"--compare: {', '.join(missing)} not among the scored metrics ({', '.join(scores)})")
    result = compare_metrics(judgments, a, scores[a], b, scores[b], tau_variant=args.tau,
                             human_order=args.human_order, n_resamples=args.bootstrap,
                             seed=args.seed, higher_is_better=directions)  # fmt: skip
    return f"{judgments.name}: {format_comparison(result)}"


def metric_directions(names: Iterable[str], *declared: Mapping[str, Column]) -> dict[str, bool | None]:
    """Each metric's declared direction (`Column.higher_is_better`), from the first of `declared`
    that holds it (the runs that scored it here, a --scores file's run manifest), else from the
    registry (`declared_column`). A metric nothing declares is left out: `run_meta` reads it
    higher-is-better, as assumed."""
    out = {}
    for name in names:
        column = next((d[name] for d in declared if name in d), None) or declared_column(name)
        if column is not None:
            out[name] = column.higher_is_better
    return out


def direction_notes(rows: Sequence[MetaRow]) -> list[str]:
    """What the table's `better` column means, once per metric read other than as declared higher-is-better."""
    lower = list(dict.fromkeys(r.metric for r in rows if r.direction == LOWER))
    assumed = list(dict.fromkeys(r.metric for r in rows if r.direction == ASSUMED))
    notes = []
    if lower:
        notes.append(f"{', '.join(lower)}: declared lower-is-better, so read negated: a positive tau or an accuracy "
                     "over 0.5 means the metric agrees with people")
    if assumed:
        notes.append(f"{', '.join(assumed)}: no declared direction (not in the registry, nor in a run manifest "
                     "beside the --scores file), assumed higher-is-better")
    return notes


def scores_file_columns(path: Path) -> dict[str, Column]:
    """The column declarations of the run a scores file belongs to: its folder's manifest.json
    (none for a file that is no run's, or a run written before metrics declared their columns)."""
    manifest = Path(path).parent / "manifest.json"
    if not manifest.is_file():
        return {}
    try:
        found = read_columns(json.loads(manifest.read_text(encoding="utf-8")))
    except ValueError as exc:
        raise MetaError(f"{manifest}: not a JSON run manifest ({exc})") from None
    return {reference_metric_name(name) or name: column for name, column in found.items()}


def metric_names(given: Sequence[str] | None) -> list[str]:
    if not given:
        return list(REFERENCE_METRICS)
    names: list[str] = []
    for part in given:
        for name in part.split(","):
            name = name.strip()
            name = reference_metric_name(name) or name
            if name and name not in names:
                names.append(name)
    return names


def score_judgments(
    metrics: Sequence[str],
    samples: list[Sample],
    reference: ReferenceMetrics,
    score_metric: ScoreMetric | None,
    given: dict[str, np.ndarray],
    notes: list[str] | None = None,
) -> dict[str, np.ndarray]:
    """Scores per metric, aligned with `samples`, in the order metrics were asked for.

    A sample whose row names no image is scored by the reference metrics (text only) and left
    out of the others as a row error (NaN, counted as failed), each such row named in `notes`."""
    ids = [s.id for s in samples]
    with_image = [i for i, s in enumerate(samples) if s.image is not None]
    if score_metric is None and (missing := [m for m in metrics if m not in given and m not in reference.names
                                             and m not in reference.skipped]):
        raise MetaError(f"metric {missing[0]!r} is neither a reference metric nor in the --scores file")
    wanted_reference = [m for m in metrics if m in reference.names and m not in given]
    records = reference.score(samples) if wanted_reference else []
    scores: dict[str, np.ndarray] = {}
    for name in metrics:
        if name in given:
            scores[name] = given[name]
        elif name in reference.names:
            scores[name] = scores_from_records(records, name, ids)
        elif name in reference.skipped:
            continue
        elif score_metric is not None:
            scored = [samples[i] for i in with_image]
            values = score_metric(name, scored) if scored else []
            if len(values) != len(scored):
                raise MetaError(f"metric {name!r} returned {len(values)} scores for {len(scored)} samples")
            scores[name] = np.full(len(samples), math.nan)
            scores[name][with_image] = [math.nan if v is None else float(v) for v in values]
            if len(scored) < len(samples) and notes is not None:
                rows = [str(s.meta.get("judgment_row", s.id)) for s in samples if s.image is None]
                notes.append(f"{name}: {len(rows)} row(s) name no image, left out as row errors "
                             f"(row {', '.join(rows[:5])}{', ...' if len(rows) > 5 else ''})")
        else:
            raise MetaError(f"metric {name!r} is neither a reference metric nor in the --scores file")
    return scores


def read_scores(path: Path, samples: Sequence[Sample], records: list[dict] | None = None) -> dict[str, np.ndarray]:
    """Every numeric column of a scores file, aligned with `samples` by `id` (`records`: the
    file's rows, when already read)."""
    records = _score_records(path) if records is None else records
    if not records or "id" not in records[0]:
        raise MetaError(f"{path}: a scores file needs an `id` column matching the judgments' sample ids")
    try:  # a caption scored twice would be read as one of its rows, silently
        unique_ids(records, f"--scores {path}")
    except ConfigError as exc:
        raise MetaError(str(exc)) from None
    ids = [s.id for s in samples]
    missing = set(ids) - {str(r["id"]) for r in records}
    if missing:
        raise MetaError(f"{path}: no scores for {len(missing)} samples (e.g. id {sorted(missing)[0]!r})")
    # caprecon run folders' scores.jsonl omit metric fields on failed rows: take every key seen
    keys = dict.fromkeys(k for r in records for k in r)
    columns = [c for c in keys if c not in ("id", "error", *_SCORES_INFO_COLUMNS)]
    found = {}
    for column in columns:
        values = scores_from_records(records, column, ids)
        if np.isfinite(values).any():
            found[reference_metric_name(column) or column] = values
    return found


def _score_records(path: Path) -> list[dict]:
    if not path.is_file():
        raise MetaError(f"scores file not found: {path}")
    return [record for _, record in read_records(path, MetaError)]


def write_scores(judgments: Judgments, samples: Sequence[Sample], scores: dict[str, np.ndarray], path: Path) -> None:
    human = []
    for item in judgments.items:
        if judgments.pairwise:
            human += [item.preference, 1.0 - item.preference]
        else:
            human.append(float(np.mean(item.ratings)))
    with path.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(["id", *_SCORES_INFO_COLUMNS, *scores])
        for k, s in enumerate(samples):
            values = ["" if math.isnan(v[k]) else repr(float(v[k])) for v in scores.values()]
            writer.writerow([s.id, s.image_id, s.caption, human[k], *values])


def _probes(
    args: argparse.Namespace,
    judgments: Judgments,
    triples: list[ProbeTriple] | None,
    writer: ProbeWriter | None,
    metrics: Sequence[str],
    reference: ReferenceMetrics,
    score_metric: ScoreMetric | None,
    notes: list[str],
) -> list[ProbeRow]:
    """The Δ probe (on user `triples`, else on the LLM's paraphrases of the first judgments
    file's references) and, with --probes, the length probe (captions the LLM writes)."""
    rejected = []
    images_root = args.images or (judgments.path.parent if judgments.path else None)
    if triples is not None:
        triples_root = args.images or args.triples.parent
        flagged = [(row, problem) for row, t in enumerate(triples, 1) if (problem := overlap_problem(t))]
        if flagged:
            row, problem = flagged[0]
            notes.append(f"Δ probe: {len(flagged)} of {len(triples)} triples in {args.triples.name} do not contrast a "
                         f"low-overlap paraphrase with a high-overlap perturbation (e.g. row {row}: {problem})")
    else:
        assert writer is not None  # _run refuses --probes without an LLM
        triples, rejected = paraphrase_triples(judgments, writer, Perturber(seed=args.seed))
        triples_root = images_root
        notes.append(f"Δ probe: {len(triples)} triples from the references of {judgments.name} (LLM paraphrase, "
                     f"rule-based perturbation); {len(rejected)} rejected (see probe-rejected.jsonl)")
        write_jsonl_atomically(args.out / "probe-triples.jsonl", as_records(triples), allow_nan=True)
    if not triples:
        raise MetaError("the Δ probe has no triples (no reference could be perturbed, or every paraphrase was "
                        "rejected: see probe-rejected.jsonl)")
    # Probe captions are new, so --scores files cannot cover them.
    pluggable = score_metric is not None
    computable = [m for m in metrics if m in reference.names or (pluggable and reference_metric_name(m) is None)]
    if skipped := [m for m in metrics if m not in computable and m not in reference.skipped]:
        notes.append(f"probes skip {', '.join(skipped)}: only --scores were given for them")
    rows: list[ProbeRow] = []
    pair_samples = triple_samples(triples, triples_root)
    pair_scores = score_judgments(computable, pair_samples, reference, score_metric, {})
    groups = [t.image_id for t in triples]
    n = len(triples)
    for name, values in pair_scores.items():
        rows.append(paraphrase_delta(name, values[:n], values[n:], groups, n_bootstrap=args.bootstrap, seed=args.seed))
    if args.probes:
        assert writer is not None
        sets, length_rejected = length_sets(judgments, writer)
        rejected += length_rejected
        notes.append(f"length probe: {len(sets)} images with {', '.join(LENGTHS)} captions written by the LLM from "
                     f"extracted triplets; {len(length_rejected)} rejected (see probe-rejected.jsonl)")
        write_jsonl_atomically(args.out / "probe-lengths.jsonl", as_records(sets), allow_nan=True)
        if not sets:
            raise MetaError("the length probe has no image: the LLM's replies gave no usable triplets or captions "
                            "(see probe-rejected.jsonl)")
        samples = length_samples(sets, images_root)
        length_scores = score_judgments(computable, samples, reference, score_metric, {})
        for name, values in length_scores.items():
            rows.append(
                length_robustness(
                    name, [s.meta["length"] for s in samples], values, [s.image_id for s in samples],
                    n_bootstrap=args.bootstrap, seed=args.seed,
                )  # fmt: skip
            )
        if score_metric is not None and set(HALLUC_METRICS) & set(metrics):
            rows += _insertion_probe(args, judgments, writer, metrics, score_metric, notes)
    if rejected:
        write_jsonl_atomically(args.out / "probe-rejected.jsonl", as_records(rejected), allow_nan=True)
    return rows


# the halluc family as `METRICS` names it: precision, coverage (needs a generator) and their F
HALLUC_METRICS = ("halluc", "halluc-coverage", "halluc-f")


def _insertion_probe(args: argparse.Namespace, judgments: Judgments, writer: ProbeWriter, metrics: Sequence[str],
                     score_metric: ScoreMetric, notes: list[str]) -> list[ProbeRow]:
    """Issue 24's inserted-object probe on the first judgments file's captions: each gets an object
    that other images' claims name and its own do not; halluc's precision must drop, and its
    coverage, scored when a chosen metric reconstructs, must not move."""
    samples = judgments.samples(args.images)
    captions = [s.caption for s in samples]
    claims = [found.claims for found in extract_claims(writer.ctx, writer.llm, captions)]
    inserted = inserted_object_captions(captions, [s.image_id or str(s.image) for s in samples], claims,
                                        seed=args.seed)
    kept = [(s, text) for s, text in zip(samples, inserted) if text is not None]
    if not kept:
        notes.append(f"inserted-object probe: no caption of {judgments.name} lacks an object that another image's "
                     "claims name; not run")
        return []
    write_jsonl_atomically(args.out / "probe-inserted.jsonl",
                           [{"id": s.id, "caption": s.caption, "inserted": text} for s, text in kept])
    notes.append(f"inserted-object probe: {len(kept)} of {len(samples)} captions of {judgments.name} with an absent "
                 "object appended (see probe-inserted.jsonl)")
    before = [s for s, _ in kept]
    after = [replace(s, id=f"ins-{s.id}", caption=text) for s, text in kept]

    def scored(name: str, items: list[Sample]) -> np.ndarray:
        return np.array([math.nan if v is None else float(v) for v in score_metric(name, items)])

    with_coverage = bool({"halluc-coverage", "halluc-f"} & set(metrics))
    nothing = np.full(len(kept), math.nan)
    coverage = [scored("halluc-coverage", items) if with_coverage else nothing for items in (before, after)]
    drop, change = insertion_probe("halluc", scored("halluc", before), scored("halluc", after), *coverage,
                                   [s.image_id or str(s.image) for s in before], n_bootstrap=args.bootstrap,
                                   seed=args.seed)
    return [drop, change] if with_coverage else [drop]


# `caprecon meta --benchmark NAME --data PATH` and `caprecon meta verify`: both read the benchmark
# with its own loader, score every caption (reference metrics here, other metrics through the
# scorer or a `--scores` file) and run its pinned protocol; `verify` then sets the result beside
# the published values.


def run_benchmark_command(args: argparse.Namespace, score_metric: ScoreMetric | None,
                          scored_columns: Mapping[str, Column] | None = None) -> int:
    if args.all or args.data_root:
        return verify_all_command(args, score_metric)
    if not args.benchmark or not args.data:
        raise MetaError("--benchmark NAME and --data PATH are needed together")
    if args.judgments:
        raise MetaError("give either --judgments files or --benchmark with --data, not both")
    if args.human_order != "descending":
        raise MetaError("--human-order: a --benchmark's protocol fixes how its judgments are read")
    benchmark = get_benchmark(args.benchmark)
    if not Path(args.data).exists() and not looks_like_repo_id(args.data):
        raise MetaError(f"--data {args.data} does not exist")
    if args.format != "auto" and args.format not in benchmark.layouts:
        raise MetaError(f"--format {args.format}: {benchmark.name} reads "
                        + (f"{', '.join(benchmark.layouts)} (or auto)" if benchmark.layouts else "its files as recognised, give no --format"))
    judgments = benchmark.load(str(args.data), layout=args.format) if benchmark.layouts else benchmark.load(str(args.data))
    if args.model_level and (benchmark.reference_draws or not has_systems(judgments)):
        raise MetaError(f"--model-level: {benchmark.name} does not name the model behind every caption "
                        f"(benchmarks that do: thumb, caparena)")
    if args.tie_band != "exact" and benchmark.statistic != "caparena":
        raise MetaError(f"--tie-band applies to caparena's three-way agreement, not to {benchmark.name}")
    verifying = args.action == "verify"
    if not verifying and not args.out:
        raise MetaError("--out DIR is needed (where the results go)")
    expected = read_expected(args.expected, benchmark.name) if args.expected else published_values(benchmark)
    if verifying and not expected:
        raise MetaError(f"no published values for {benchmark.name}; give some with --expected")
    files = [_scores_file(path) for path in args.scores or []]  # read once, aligned with every draw's samples
    given_names = list(benchmark_scores(files, judgments.samples(args.images), [])) if files else []
    if args.metric:
        metrics = metric_names(args.metric)
    elif verifying:
        # Every published metric we can compute, and every one whose scores were given.
        metrics = [m for m in expected if reference_metric_name(m) or m in given_names]
    else:
        metrics = metric_names(None)
    if args.compare:
        args.compare = [reference_metric_name(name) or name for name in args.compare]
        metrics += [name for name in args.compare if name not in metrics]
    unknown = [m for m in metrics if reference_metric_name(m) is None and m not in given_names]
    if unknown and score_metric is None:
        raise MetaError(f"no scorer for {', '.join(unknown)}: give their per-caption scores with --scores")

    last: dict = {}
    score_notes: list[str] = []
    with ReferenceMetrics([m for m in metrics if reference_metric_name(m)], skip_unavailable=True) as reference:
        n_bootstrap = 0 if verifying else args.bootstrap
        rows = _run_protocol(benchmark, judgments, metrics, reference, score_metric, args, n_bootstrap, last, score_notes,
                             files, scored_columns or {})
        skipped = dict(reference.skipped)

    protocol = f"{benchmark.name}: {benchmark.statistic}; references: {benchmark.references}; judged: {benchmark.sampling}"
    if verifying:
        table = compare(benchmark, rows, expected, tolerance=args.tolerance, skipped=skipped)
        print(format_verify(table))
        for note in [protocol, *dict.fromkeys(score_notes)]:
            print(f"note: {note}")
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
            write_verify_csv(table, args.out / "verify.csv")
            _write_report(args.out)
        return 1 if any(r.status == "fail" for r in table) else 0

    notes = [protocol, *skipped.values(), *dict.fromkeys(score_notes), *direction_notes(rows)]
    args.out.mkdir(parents=True, exist_ok=True)
    write_scores(last["judgments"], last["samples"], last["scores"], args.out / f"scores-{benchmark.name}.csv")
    write_csv(rows, args.out / "meta.csv")
    write_markdown(rows, args.out / "meta.md", title=f"Agreement with people: {benchmark.name}", notes=notes)
    print(format_table(rows))
    if args.compare:
        if benchmark.reference_draws or benchmark.statistic == "pearson":
            raise MetaError(f"--compare supports τ and accuracy benchmarks without reference draws, not {benchmark.name}")
        a, b = args.compare
        if missing := [m for m in (a, b) if m not in last["scores"]]:
            raise MetaError(f"--compare: {', '.join(missing)} could not be scored (see the notes above)")
        result = compare_metrics(last["judgments"], a, last["scores"][a], b, last["scores"][b],
                                 tau_variant=benchmark.tau_variant, n_resamples=args.bootstrap,
                                 seed=args.seed, higher_is_better=last["directions"])  # fmt: skip
        print(format_comparison(result))
        write_csv_comparison(result, args.out / "compare.csv")
    for note in notes:
        print(f"note: {note}")
    _write_report(args.out)
    return 0


def write_csv_comparison(result, path: Path) -> None:
    with path.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(result.as_dict()))
        writer.writeheader()
        writer.writerow(result.as_dict())


ScoresFile = tuple[Path, bool, list]  # a --scores file: its path, whether a released result file, its rows


def _run_protocol(benchmark, judgments: Judgments, metrics: Sequence[str], reference: ReferenceMetrics,
                  score_metric: ScoreMetric | None, args: argparse.Namespace, n_bootstrap: int, last: dict,
                  score_notes: list[str], files: Sequence[ScoresFile] = (),
                  scored_columns: Mapping[str, Column] | None = None) -> list[MetaRow]:
    """The benchmark's protocol on `judgments`; `last` keeps the (last draw's) judgments, samples and
    scores, as scored, and the metrics' directions (`directions`)."""
    # filled as each draw is scored: `score_metric` declares a metric's column only once it has scored it
    directions: dict[str, bool | None] = {}

    def score(draw: Judgments):
        samples = draw.samples(args.images)
        given = benchmark_scores(files, samples, score_notes) if files else {}
        last.update(judgments=draw, samples=samples,
                    scores=score_judgments(metrics, samples, reference, score_metric, given, score_notes))
        directions.update(metric_directions(last["scores"], scored_columns or {}))
        last["directions"] = directions
        return last["scores"]

    return run_benchmark(benchmark, judgments, score, n_bootstrap=n_bootstrap, seed=args.seed, tie_band=args.tie_band,
                         model_level=args.model_level, higher_is_better=directions)  # fmt: skip


def benchmark_scores(files: Sequence[ScoresFile], samples: Sequence[Sample], notes: list[str]) -> dict[str, np.ndarray]:
    """Per-caption scores from `--scores` files (read by `_scores_file`), aligned with `samples`:
    caprecon's CSV/JSONL by `id`, or result files as metric authors release them
    (`caprecon.data.loaders.released`), joined by image and caption; several files add up (FLEUR
    releases Pascal-50S as one file per category). A benchmark with reference draws aligns the
    same files with each draw's samples."""
    found: dict[str, np.ndarray] = {}
    released = []
    for path, is_released, rows in files:
        if is_released:
            released += rows
        else:
            found.update(read_scores(path, samples, rows))
    if released:
        joined, missing = join_released(released, [str(s.image) for s in samples], [s.caption for s in samples])
        if missing == len(samples):
            raise MetaError(f"--scores {', '.join(str(path) for path, _, _ in files)}: no caption of the benchmark is in the released "
                            "file(s) (joined by image file name and caption)")
        if missing:
            notes.append(f"--scores: {missing} of {len(samples)} captions have no released score and are left out")
        found.update(joined)
    return found


def _scores_file(path: Path) -> ScoresFile:
    """A released file's scores, else the records of caprecon's own scores file."""
    try:  # telling a released file apart reads it too, so a file that is not UTF-8 fails there
        if is_released_scores(path):
            return path, True, read_released_scores(path)
    except ReleasedScoresError as exc:
        raise MetaError(str(exc)) from None
    return path, False, _score_records(path)


def verify_all_command(args: argparse.Namespace, score_metric: ScoreMetric | None) -> int:
    """`meta verify --all --data-root DIR --out DIR`: every benchmark found under DIR, one table."""
    if args.action != "verify" or not args.all or not args.data_root or not args.out:
        raise MetaError("give `meta verify --all --data-root DIR --out DIR` (all three go together)")
    if args.benchmark or args.data or args.scores or args.judgments:
        raise MetaError("--all finds every benchmark under --data-root: give no --benchmark, --data, --scores or --judgments")
    if not args.data_root.is_dir():
        raise MetaError(f"--data-root {args.data_root} is not a folder")
    found = find_benchmarks(args.data_root)
    if not found:
        raise MetaError(f"no benchmark data under {args.data_root} "
                        "(docs/validate.md lists the benchmarks and their files)")
    args.out.mkdir(parents=True, exist_ok=True)
    plans = []
    for benchmark, path in found:
        expected = read_expected(args.expected, benchmark.name, required=False) if args.expected else published_values(benchmark)
        metrics = metric_names(args.metric) if args.metric else [m for m in expected if reference_metric_name(m)]
        plans.append((benchmark, path, expected, metrics))
    table: list[VerifyRow] = []
    meta_rows: list[MetaRow] = []
    notes: list[str] = []
    wanted = dict.fromkeys(m for *_, metrics in plans for m in metrics if reference_metric_name(m))
    with ReferenceMetrics(list(wanted), skip_unavailable=True) as reference:
        for benchmark, path, expected, metrics in plans:
            if not expected and not args.metric:
                notes.append(f"{benchmark.name}: found at {path}; no published values to check it against")
                continue
            try:
                judgments = benchmark.load(str(path))
            except JudgmentFormatError as exc:
                reason = f"{benchmark.name}: {exc}"
                table += [VerifyRow(benchmark.name, metric, key, math.nan, published.value, math.nan, args.tolerance,
                                    "skipped", published.source, reason) for metric, keys in expected.items()
                          for key, published in keys.items()]  # fmt: skip
                notes.append(reason)
                continue
            last: dict = {}
            rows = _run_protocol(benchmark, judgments, metrics, reference, score_metric, args, 0, last, notes)
            table += compare(benchmark, rows, expected, tolerance=args.tolerance, skipped=reference.skipped)
            meta_rows += rows
            if last:
                write_scores(last["judgments"], last["samples"], last["scores"], args.out / f"scores-{benchmark.name}.csv")
            notes.append(f"{benchmark.name} ({path}): {benchmark.statistic}; references: {benchmark.references}")
        notes += reference.skipped.values()
    print(format_verify(table))
    write_verify_csv(table, args.out / "verify.csv")
    write_markdown(table, args.out / "verify.md", title="Ours beside the published values", notes=notes)
    write_csv(meta_rows, args.out / "meta.csv")
    write_markdown(meta_rows, args.out / "meta.md", title="Agreement with people, every benchmark found", notes=notes)
    for note in notes:
        print(f"note: {note}")
    _write_report(args.out)
    return 1 if any(r.status == "fail" for r in table) else 0


def _write_report(out: Path) -> None:
    """The HTML report of what `out` holds (the closing lines say where it is)."""
    from caprecon.reports.html import write_html_report  # jinja and the templates: only once there is a report

    write_html_report(out)


def main(argv: Sequence[str] | None = None) -> int:
    parser = Parser(
        prog="caprecon meta", description="Agreement of caption metrics with human judgments, and probes."
    )
    add_meta_arguments(parser)
    try:
        return run_command(parser.parse_args(argv), run_meta_command)
    except ConfigError as exc:  # the lifecycle's prologue refused --out or --save
        print(f"caprecon: error: {redact_text(str(exc))}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
