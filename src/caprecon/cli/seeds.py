"""`caprecon compare` (two systems, seed-aware) and `caprecon seeds` (how many seeds a ranking needs)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from caprecon.core.checks import MAX_RESAMPLES
from caprecon.core.errors import ConfigError
from caprecon.core.records import is_number, read_records, write_jsonl_atomically
from caprecon.core.tables import format_table, number
from caprecon.cli.common import Writes, real_number, whole_number
from caprecon.metrics import declared_column
from caprecon.metrics.base import Column, read_columns


def load_run(run: str) -> tuple[list[dict[str, Any]], list[str], dict[str, Column]]:
    """A run folder's (or scores file's) rows, the metric names its manifest lists and the
    columns its metrics declared there."""
    path = Path(run)
    scores = path if path.is_file() else path / "scores.jsonl"
    if not scores.is_file():
        raise ConfigError(f"{run}: no scores.jsonl (give a run folder or its scores.jsonl)")
    manifest = scores.parent / "manifest.json"
    names, columns = [], {}
    if manifest.is_file():
        try:
            found = json.loads(manifest.read_text(encoding="utf-8"))
            names, columns = list(found.get("metric_names") or []), read_columns(found)
        except (ValueError, AttributeError):
            names = []
    return [record for _, record in read_records(scores, ConfigError)], names, columns


def direction(metric: str, columns: dict[str, Column]) -> tuple[bool | None, str]:
    """The metric's declared direction and a line saying how it is read: from the run's manifest,
    else from the registry; a column nothing declares is read higher-is-better, as assumed."""
    column, where = columns.get(metric), "the run's manifest"
    if column is None:
        column, where = declared_column(metric), "the metric registry"
    if column is None:
        return True, f"{metric}: higher is better (assumed: neither the run's manifest nor the registry declares it)"
    if column.higher_is_better is None:
        return None, f"{metric}: neither higher nor lower is better (declared in {where})"
    return column.higher_is_better, f"{metric}: {'higher' if column.higher_is_better else 'lower'} is better " \
                                    f"(declared in {where})"


def _metric(args: argparse.Namespace, run: str, names: list[str], records: list[dict[str, Any]]) -> str:
    metric = args.metric or (names[0] if names else "recon")
    if not any(metric in r or f"{metric}_seeds" in r for r in records):
        scored = names or sorted({k for r in records for k, v in r.items()
                                  if is_number(v) and k not in ("seed", "index") and not k.endswith("_n")})
        raise ConfigError(f"--metric {metric}: no row of {run} has "
                          f"this score; it has: {', '.join(scored) or 'none'}")
    return metric


def _same_file(a: str, b: str) -> bool:
    def scores(run: str) -> Path:
        return Path(run) if Path(run).is_file() else Path(run) / "scores.jsonl"
    return scores(a).resolve() == scores(b).resolve()


def cmd_compare(args: argparse.Namespace) -> int:
    from caprecon.stats.seeds import compare, compare_within

    records, names, columns = load_run(args.runs[0])
    metric = _metric(args, args.runs[0], names, records)
    higher_is_better, read_as = direction(metric, columns)
    options = {"n_resamples": args.resamples, "seed": args.bootstrap_seed, "higher_is_better": higher_is_better}
    if len(args.runs) == 2 and _same_file(*args.runs):
        raise ConfigError(f"{args.runs[0]} and {args.runs[1]} are the same run: a run compared with itself differs "
                          "by exactly 0; give two runs, or one run and --by FIELD to compare its systems")
    if len(args.runs) == 2:
        comparisons = [compare(records, load_run(args.runs[1])[0], metric, names=tuple(args.runs), **options)]
    elif len(args.runs) == 1:
        comparisons = compare_within(records, metric, by=args.by, **options)
    else:
        raise ConfigError(f"compare takes one run (systems by --by) or two, not {len(args.runs)}")
    header = ["A", "B", "images", "seeds", "mean A", "mean B", "A - B", "95% interval", "p", "P(flip)", "better"]
    table = [header] + [[c.a, c.b, c.images, c.seeds, number(c.mean_a), number(c.mean_b),
                         number(c.difference), f"[{number(c.ci_low)}, {number(c.ci_high)}]", number(c.p_value),
                         number(c.flip), c.better or "-"]
                        for c in comparisons]
    print(f"{metric}: paired difference on the same images and seeds, bootstrap over both ({args.resamples} "
          "resamples)")
    print(read_as)
    print(format_table(table))
    for note in (n for c in comparisons for n in c.notes()):
        print(note)
    if len(args.runs) == 1 and len({c.a for c in comparisons} | {c.b for c in comparisons}) > 2:
        _print_elo(records, metric, args.by, args.bootstrap_seed, higher_is_better)
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        write_jsonl_atomically(out, [c.row() for c in comparisons], allow_nan=True)
    return 0


def _print_elo(records: list[dict[str, Any]], metric: str, by: str, seed: int, higher_is_better: bool | None) -> None:
    """Several systems: the metric's preferences on each image as battles, rated as CapArena rates
    its models (`caprecon.stats.elo`), so the ranking reads like an arena's. A lower-is-better
    metric's battles are won by the lower score; one with no better direction has no battles."""
    from caprecon.stats.elo import ELO_ROUNDS, battles_from_scores, bootstrap_elo
    from caprecon.stats.seeds import image_of

    if higher_is_better is None:
        return
    sign = 1.0 if higher_is_better else -1.0
    rows = [(image_of(r), str(r[by]), sign * float(r[metric])) for r in records
            if r.get(by) is not None and is_number(r.get(metric))]  # fmt: skip
    battles = battles_from_scores(rows)
    ratings = bootstrap_elo(battles, rounds=ELO_ROUNDS, seed=seed)
    print(f"{metric}: Elo from {len(battles)} pairwise preferences on shared images (K 4, start 1000, median of "
          f"{ELO_ROUNDS} bootstrap rounds)")
    ranked = sorted(ratings.items(), key=lambda kv: -kv[1])
    print(format_table([["rank", by, "Elo"]] + [[k, name, f"{r:.1f}"] for k, (name, r) in enumerate(ranked, 1)]))


def cmd_seeds(args: argparse.Namespace) -> int:
    from caprecon.stats.seeds import best_system, seeds_needed, stability, unscored, write_stability

    records, names, columns = load_run(args.run)
    metric = _metric(args, args.run, names, records)
    higher_is_better, read_as = direction(metric, columns)
    curve = stability(records, metric, by=args.by, n_resamples=args.resamples, seed=args.bootstrap_seed)
    left_out = unscored(records, metric)
    units = f"systems by {args.by}" if args.by else "captions"
    print(f"{metric}: Kendall tau between the ranking of {curve[0].units} {units} at k seeds and at "
          f"{curve[-1].k}, with a 95% bootstrap interval over images")
    print(format_table([["k", "tau", "95% interval"]] +
                       [[p.k, number(p.tau), f"[{number(p.ci_low)}, {number(p.ci_high)}]"] for p in curve]))
    needed = seeds_needed(curve, args.threshold)
    print(f"seeds needed for tau >= {args.threshold}: {needed if needed is not None else 'more than ' + str(curve[-1].k)}")
    print(f"{read_as}; tau is the same read either way")
    if args.by and higher_is_better is not None and (best := best_system(records, metric, args.by, higher_is_better)):
        print(f"best {args.by} at {curve[-1].k} seed(s), by its mean {metric}: {best}")
    if left_out:
        print(f"left out {left_out} of {len(records)} row(s) without a finite {metric} score (failed rows, NaN or inf)")
    out = Path(args.out) if args.out else (Path(args.run) if Path(args.run).is_dir() else Path(args.run).parent)
    write_stability(curve, out / "seeds.csv", metric=metric, threshold=args.threshold)
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
