"""`caprecon meta`: the command line of `caprecon.meta` (`caprecon.apps.metabench.meta`): its options,
and what it prints.

    caprecon meta --judgments expert.jsonl crowdflower.jsonl --images DIR \\
        --metric bleu-4 cider meteor --out runs/meta [--bootstrap 1000] [--seed 0]

`caprecon meta --benchmark NAME --data PATH` and `caprecon meta verify` run a benchmark's
pinned protocol (`caprecon.apps.metabench`) on its own files, and `verify` sets the result
beside the published values. `run_meta_command` runs parsed options with a scorer of your own
(`score_metric(name, samples)`), as the tests do; `caprecon meta` plugs in caprecon's metrics.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, Sequence

from caprecon.apps.metabench import LAYOUTS
from caprecon.apps.metabench.caparena import HUMAN_RANKINGS, TIE_BANDS
from caprecon.apps.metabench.verify import format_verify
from caprecon.apps.metabench.meta import MetaResults, meta
from caprecon.apps.metabench.request import ScoreMetric
from caprecon.cli.common import Parser, Writes, path_value, real_number, run_command, whole_number
from caprecon.core.checks import MAX_RESAMPLES
from caprecon.core.errors import ConfigError
from caprecon.core.redaction import redact_text
from caprecon.data.judgments import FORMATS, JudgmentFormatError
from caprecon.metrics.reference import REFERENCE_METRICS, ReferenceMetricError
from caprecon.stats.agreement import HUMAN_ORDERS, format_comparison, format_table


def add_meta_arguments(parser: argparse.ArgumentParser) -> None:
    parser.set_defaults(writes=Writes(inputs=("judgments", "scores", "images", "data", "triples", "expected",
                                              "questions", "answers"),
                                      trees=("data_root",), files=("save",)))
    parser.add_argument(
        "action", nargs="?", choices=("verify",),
        help="verify: our values beside the published ones for --benchmark (see caprecon.apps.metabench.verify)",
    )  # fmt: skip
    parser.add_argument(
        "--judgments", nargs="+", type=path_value, metavar="FILE",
        help="human judgments: Flickr8k-Expert / -CrowdFlower JSONL, pairwise preferences, "
        "or a generic CSV/JSONL of (image, caption, human score); several files are scored separately",
    )  # fmt: skip
    parser.add_argument(
        "--format", default="auto", choices=("auto", *FORMATS, *LAYOUTS),
        help="judgments format (default: recognised from the fields); with --benchmark, which copy of its data "
        f"--data holds ({', '.join(LAYOUTS)}; default: recognised from the file)",
    )  # fmt: skip
    parser.add_argument(
        "--captions", type=path_value, metavar="FILE",
        help="Flickr8k.token.txt, needed to read the original ExpertAnnotations.txt / CrowdFlowerAnnotations.txt",
    )  # fmt: skip
    parser.add_argument(
        "--images", type=path_value, metavar="DIR",
        help="folder the judgments' image names are relative to (default: the judgments file's folder), and "
        "that every image a row names must lie inside (a benchmark's: always, inside the default too); the "
        "reference metrics do not open images",
    )  # fmt: skip
    parser.add_argument(
        "--metric", nargs="+", action="extend", metavar="NAME",
        help=f"metrics to evaluate (default: the reference metrics {', '.join(REFERENCE_METRICS)}); "
        "commas also separate names",
    )  # fmt: skip
    parser.add_argument(
        "--out", type=path_value, metavar="DIR", help="folder for the CSV and markdown results (optional for verify)"
    )
    parser.add_argument(
        "--scores", nargs="+", type=path_value, metavar="FILE",
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
        "--triples", type=path_value, metavar="FILE",
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
    parser.add_argument("--data", type=path_value, metavar="PATH", help="the --benchmark's file or folder, as published")
    parser.add_argument(
        "--compare", nargs=2, metavar=("A", "B"),
        help="paired bootstrap over images: does metric A agree with people better than B? (difference, CI, p)",
    )  # fmt: skip
    parser.add_argument(
        "--model-level", action="store_true",
        help="also rank the benchmark's models by each metric (mean score per model, or Elo of its pairwise "
        "verdicts) and correlate with people's ranking (Spearman, Kendall; bootstrap CIs over images for rated "
        "captions, none for pairwise battles, whose Elo is already a bootstrap median)",
    )  # fmt: skip
    parser.add_argument(
        "--human-ranking", choices=HUMAN_RANKINGS, default="published",
        help="caparena's model level: people's ranking of the models as CapArena publishes it (published, the "
        "paper's protocol; every model must be one of its 15) or recomputed by Elo from the file's battles "
        "without the human caption (recomputed)",
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
        "--expected", type=path_value, metavar="FILE",
        help="verify: CSV (benchmark, metric, key, value[, source]) replacing the built-in published values",
    )  # fmt: skip
    parser.add_argument(
        "--all", action="store_true",
        help="verify: every benchmark found under --data-root, one table (verify.csv/.md, meta.csv, report) in --out",
    )  # fmt: skip
    parser.add_argument("--data-root", type=path_value, metavar="DIR",
                        help="verify --all: the folder the benchmarks' files (or the Hugging Face cache) are under")
    parser.add_argument(
        "--questions", type=path_value, metavar="FILE",
        help="tifa160: the question bank with dependencies, DSG's proposition file (dsg-1k-anns.csv)",
    )  # fmt: skip
    parser.add_argument(
        "--answers", type=path_value, metavar="FILE",
        help="tifa160: recorded VQA answers to those questions, DSG's layout (e.g. pali17b_dsg.csv); replayed, "
        "no model runs",
    )  # fmt: skip
    parser.add_argument("--json", action="store_true", help="print the agreement rows and notes as JSON")



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
        "--save", type=path_value, metavar="FILE",
        help="with --fit: write the model fitted on all rows of the --fit-on file (default: the first) as JSON, "
        "for `caprecon score -m fused:FILE`",
    )  # fmt: skip
    parser.add_argument("--fit-on", metavar="FILE", help="with --fit: the --judgments file the transferred and "
                        "saved model is fitted on (its name or stem; default: the first)")
    parser.add_argument("--evaluate-on", metavar="FILE",
                        help="with --fit: another --judgments file the --fit-on file's model is evaluated on")



def meta_options(args: argparse.Namespace) -> dict[str, Any]:
    """The parsed options as `caprecon.meta`'s keyword arguments."""
    return dict(judgments=args.judgments, metrics=args.metric, out=args.out, scores=args.scores, images=args.images,
                format=args.format, captions=args.captions, bootstrap=args.bootstrap, seed=args.seed, tau=args.tau,
                human_order=args.human_order, probes=args.probes, triples=args.triples, benchmark=args.benchmark,
                data=args.data, compare=args.compare, model_level=args.model_level, tie_band=args.tie_band,
                human_ranking=args.human_ranking, verify=args.action == "verify", tolerance=args.tolerance, expected=args.expected,
                every_benchmark=args.all, data_root=args.data_root, fit=args.fit, fit_model=args.fit_model,
                folds=args.folds, save=args.save, fit_on=args.fit_on, evaluate_on=args.evaluate_on,
                questions=args.questions, answers=args.answers, progress=not getattr(args, "quiet", False))


def run_meta_command(args: argparse.Namespace, score_metric: ScoreMetric | str | None = None, **given: Any) -> int:
    """`caprecon meta` with parsed `args`: `caprecon.meta` with `score_metric` (None: only the reference
    metrics and --scores files; "caprecon": caprecon's own metrics, with the run settings in `given`)
    and `given` (llm, store, scorable, columns, config, progress, run settings), then what it found
    printed; returns the exit status (1: verify found a value off its published one)."""
    options = {**meta_options(args), **given}
    try:
        results = meta(**options, score_metric=score_metric)
    except (ConfigError, JudgmentFormatError, ReferenceMetricError) as exc:
        print(f"caprecon: error: {redact_text(str(exc))}", file=sys.stderr)
        return 2
    if getattr(args, "json", False):
        from caprecon.apps.metabench.tifa160 import rows_json

        print(rows_json(results.rows, results.notes))
    else:
        print_results(results)
    return 1 if results.failed else 0


def print_results(results: MetaResults) -> None:
    if results.verify is not None:
        print(format_verify(results.verify))
    else:
        print(format_table(results.rows))
        for fit in results.fits:  # its own row is in the table above: here, the components on the same rows
            from caprecon.reports.fit import result_notes

            print()
            print(f"{fit.name} on {fit.judgments} (its row is above), beside its components on the same rows:")
            print(format_table(fit.rows[1:]))
            for note in result_notes(fit):
                print(f"  {note}")
        if results.probes:
            print()
            print(format_table(results.probes))
        if results.benchmark:  # a judgments file's comparison is among the notes
            for comparison in results.comparisons:
                print(format_comparison(comparison))
    for note in results.notes:
        print(f"note: {note}")


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
