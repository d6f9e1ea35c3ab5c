"""`caprecon meta --benchmark NAME --data PATH` and `caprecon meta verify`.

Both read the benchmark with its own loader, score every caption (reference metrics here,
other metrics through the main CLI's scorer or a `--scores` file) and run the
benchmark's pinned protocol; `verify` then sets the result beside the published values.
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

from caprecon.data.judgments import Judgments
from caprecon.stats.agreement import compare_metrics, format_comparison, format_table, write_csv, write_markdown
from caprecon.cli.meta import MetaError, ScoreMetric, _metric_names, _read_scores, _score, _write_scores
from caprecon.apps.metabench import get_benchmark
from caprecon.apps.metabench.protocol import run_benchmark
from caprecon.apps.metabench.verify import compare, format_verify, published_values, read_expected, write_verify_csv
from caprecon.metrics.reference import ReferenceMetrics, reference_metric_name


def run_benchmark_command(args: argparse.Namespace, score_metric: ScoreMetric | None) -> int:
    if not args.benchmark or not args.data:
        raise MetaError("--benchmark NAME and --data PATH are needed together")
    if args.judgments:
        raise MetaError("give either --judgments files or --benchmark with --data, not both")
    if args.scores and len(args.scores) != 1:
        raise MetaError("with --benchmark, --scores takes one file (the benchmark's per-caption scores)")
    benchmark = get_benchmark(args.benchmark)
    if not Path(args.data).exists():
        raise MetaError(f"--data {args.data} does not exist")
    judgments = benchmark.load(str(args.data))
    verifying = args.action == "verify"
    if not verifying and not args.out:
        raise MetaError("--out DIR is needed (where the results go)")
    expected = read_expected(args.expected, benchmark.name) if args.expected else published_values(benchmark)
    if verifying and not expected:
        raise MetaError(f"no published values for {benchmark.name}; give some with --expected")
    given_names = list(_read_scores(args.scores[0], judgments.samples(args.images))) if args.scores else []
    if args.metric:
        metrics = _metric_names(args.metric)
    elif verifying:
        # Every published metric we can compute, and every one whose scores were given.
        metrics = [m for m in expected if reference_metric_name(m) or m in given_names]
    else:
        metrics = _metric_names(None)
    if args.compare:
        args.compare = [reference_metric_name(name) or name for name in args.compare]
        metrics += [name for name in args.compare if name not in metrics]
    unknown = [m for m in metrics if reference_metric_name(m) is None and m not in given_names]
    if unknown and score_metric is None:
        raise MetaError(f"no scorer for {', '.join(unknown)}: give their per-caption scores with --scores")

    last: dict = {}
    with ReferenceMetrics([m for m in metrics if reference_metric_name(m)], skip_unavailable=True) as reference:

        def score(draw: Judgments):
            samples = draw.samples(args.images)
            given = _read_scores(args.scores[0], samples) if args.scores else {}
            last.update(judgments=draw, samples=samples, scores=_score(metrics, samples, reference, score_metric, given))
            return last["scores"]

        n_bootstrap = 0 if verifying else args.bootstrap
        rows = run_benchmark(benchmark, judgments, score, n_bootstrap=n_bootstrap, seed=args.seed)
        skipped = dict(reference.skipped)

    protocol = f"{benchmark.name}: {benchmark.statistic}; references: {benchmark.references}"
    if verifying:
        table = compare(benchmark.name, rows, expected, tolerance=args.tolerance, skipped=skipped)
        print(format_verify(table))
        print(f"note: {protocol}")
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
            write_verify_csv(table, args.out / "verify.csv")
        return 1 if any(r.status == "fail" for r in table) else 0

    notes = [protocol, *skipped.values()]
    args.out.mkdir(parents=True, exist_ok=True)
    _write_scores(last["judgments"], last["samples"], last["scores"], args.out / f"scores-{benchmark.name}.csv")
    write_csv(rows, args.out / "meta.csv")
    write_markdown(rows, args.out / "meta.md", title=f"Agreement with people: {benchmark.name}", notes=notes)
    print(format_table(rows))
    if args.compare:
        if benchmark.reference_draws or benchmark.statistic == "pearson":
            raise MetaError(f"--compare supports τ and accuracy benchmarks without reference draws, not {benchmark.name}")
        a, b = args.compare
        if missing := [m for m in (a, b) if m not in last["scores"]]:
            raise MetaError(f"--compare: {', '.join(missing)} could not be scored (see the notes above)")
        variant = benchmark.statistic.removeprefix("tau_") if benchmark.statistic.startswith("tau_") else None
        result = compare_metrics(last["judgments"], a, last["scores"][a], b, last["scores"][b], tau_variant=variant,
                                 n_resamples=args.bootstrap or 1000, seed=args.seed)  # fmt: skip
        print(format_comparison(result))
        write_csv_comparison(result, args.out / "compare.csv")
    for note in notes:
        print(f"note: {note}")
    print(f"wrote {args.out}")
    return 0


def write_csv_comparison(result, path: Path) -> None:
    with path.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(result.as_dict()))
        writer.writeheader()
        writer.writerow(result.as_dict())
