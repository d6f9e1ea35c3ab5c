"""`caprecon compare` (two systems, seed-aware) and `caprecon seeds` (how many seeds a ranking needs)."""

from __future__ import annotations

import argparse

from caprecon.core.checks import MAX_RESAMPLES
from caprecon.core.tables import format_table, number
from caprecon.cli.common import Writes, real_number, whole_number


def cmd_compare(args: argparse.Namespace) -> int:
    from caprecon.apps.seeds import compare

    results = compare(args.runs, metric=args.metric, by=args.by, resamples=args.resamples,
                      bootstrap_seed=args.bootstrap_seed, out=args.out)
    header = ["A", "B", "images", "seeds", "mean A", "mean B", "A - B", "95% interval", "p", "P(flip)", "better"]
    table = [header] + [[c.a, c.b, c.images, c.seeds, number(c.mean_a), number(c.mean_b),
                         number(c.difference), f"[{number(c.ci_low)}, {number(c.ci_high)}]", number(c.p_value),
                         number(c.flip), c.better or "-"]
                        for c in results.comparisons]
    print(f"{results.metric}: paired difference on the same images and seeds, bootstrap over both "
          f"({results.resamples} resamples)")
    print(results.read_as)
    print(format_table(table))
    for note in results.notes():
        print(note)
    if results.elo:
        from caprecon.stats.elo import ELO_ROUNDS

        print(f"{results.metric}: Elo from {results.battles} pairwise preferences on shared images (K 4, start 1000, "
              f"median of {ELO_ROUNDS} bootstrap rounds)")
        print(format_table([["rank", results.by, "Elo"]] +
                           [[k, name, f"{r:.1f}"] for k, (name, r) in enumerate(results.elo, 1)]))
    return 0


def cmd_seeds(args: argparse.Namespace) -> int:
    from caprecon.apps.seeds import seeds

    results = seeds(args.run, metric=args.metric, by=args.by, threshold=args.threshold, resamples=args.resamples,
                    bootstrap_seed=args.bootstrap_seed, out=args.out)
    curve, metric = results.curve, results.metric
    units = f"systems by {args.by}" if args.by else "captions"
    print(f"{metric}: Kendall tau between the ranking of {curve[0].units} {units} at k seeds and at "
          f"{curve[-1].k}, with a 95% bootstrap interval over images")
    print(format_table([["k", "tau", "95% interval"]] +
                       [[p.k, number(p.tau), f"[{number(p.ci_low)}, {number(p.ci_high)}]"] for p in curve]))
    needed = results.needed
    print(f"seeds needed for tau >= {args.threshold}: {needed if needed is not None else 'more than ' + str(curve[-1].k)}")
    print(f"{results.read_as}; tau is the same read either way")
    if results.best:
        print(f"best {args.by} at {curve[-1].k} seed(s), by its mean {metric}: {results.best}")
    if results.left_out:
        print(f"left out {results.left_out} of {results.rows} row(s) without a finite {metric} score (failed rows, "
              "NaN or inf)")
    return 0


def _shared(p: argparse.ArgumentParser) -> None:
    p.add_argument("--metric", "-m", help="the score to compare (default: the run's first metric)")
    p.add_argument("--resamples", type=whole_number(1, MAX_RESAMPLES), default=1000, help="bootstrap resamples (default 1000)")
    p.add_argument("--bootstrap-seed", type=whole_number(0), default=0, help="seed of the bootstrap (default 0)")


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "compare", help="two captioners on the same images: paired difference, bootstrap over images and seeds, "
                        "probability the ranking flips",
        description="Compare two runs (RUN_A RUN_B) on the images both scored, or the systems of one run "
                    "(RUN --by captioner). Rows scored with --seeds K carry their per-seed values; the bootstrap "
                    "resamples images and, within each, seeds, the same seeds for both systems, so a difference "
                    "one seed made is not mistaken for one between the captioners, and noise both share cancels. "
                    "What cannot be paired (an image one system did not score, seeds only one has) is left out "
                    "and said under the table.")
    p.add_argument("runs", nargs="+", metavar="RUN", help="one or two run folders (or scores.jsonl files)")
    p.add_argument("--by", default="captioner", help="with one run: the field naming the system (default captioner)")
    p.add_argument("--out", help="also write the comparisons as JSONL here")
    _shared(p)
    p.set_defaults(func=cmd_compare, writes=Writes(folder=None, files=("out",), inputs=("runs",)))

    p = subparsers.add_parser(
        "seeds", help="how many seeds are enough: ranking stability at k of K seeds (writes seeds.csv)",
        description="From a run scored with --seeds K: Kendall tau between the ranking at the first k seeds and "
                    "at all K, for k = 1..K, with a bootstrap interval over images, and the smallest k whose tau "
                    "reaches --threshold (and stays there).")
    p.add_argument("run", help="run folder (or its scores.jsonl) scored with --seeds K")
    p.add_argument("--by", help="rank systems (values of this field, e.g. captioner) instead of captions")
    p.add_argument("--threshold", type=real_number(0, 1, low_open=True), default=0.9, help="tau a ranking must reach (default 0.9)")
    p.add_argument("--out", help="folder for seeds.csv (default: the run folder)")
    _shared(p)
    p.set_defaults(func=cmd_seeds, writes=Writes(default="run", outputs="seeds.csv"))
