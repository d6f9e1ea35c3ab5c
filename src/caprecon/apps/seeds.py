"""`compare` (two systems, seed-aware) and `seeds` (how many seeds a ranking needs), on runs already scored.

    cmp = caprecon.compare(["runs/a8", "runs/b8"])            # two runs on the same images
    cmp = caprecon.compare(["runs/all"], by="captioner")      # the systems of one run
    cmp.comparisons[0].difference, cmp.comparisons[0].flip

    st = caprecon.seeds("runs/a8", threshold=0.9)             # writes runs/a8/seeds.csv
    st.needed, [(p.k, p.tau) for p in st.curve]

Both read a run folder (or its scores.jsonl) and the direction each metric declared in the run's
manifest, else in the metric registry; the statistics are `caprecon.stats.seeds`'.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from caprecon.core.checks import MAX_RESAMPLES, check_count, check_number
from caprecon.core.errors import ConfigError
from caprecon.core.records import is_number, read_records, write_jsonl_atomically
from caprecon.metrics import declared_column
from caprecon.metrics.base import Column, read_columns
from caprecon.run.folder import check_out, run_folder, scores_path
from caprecon.stats.seeds import STABILITY_THRESHOLD, Comparison, Stability


def load_run(run: str | Path) -> tuple[list[dict[str, Any]], list[str], dict[str, Column]]:
    """A run folder's (or scores file's) rows, the metric names its manifest lists and the
    columns its metrics declared there."""
    scores = scores_path(run)
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
    return [record for _, record in read_records(scores, ConfigError, keep_surrogates=True)], names, columns


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


def run_metric(metric: str | None, run: str | Path, names: list[str], records: list[dict[str, Any]]) -> str:
    """The score to read: `metric`, else the run's first metric (else recon), refused when no row has it."""
    metric = metric or (names[0] if names else "recon")
    if not any(metric in r or f"{metric}_seeds" in r for r in records):
        scored = names or sorted({k for r in records for k, v in r.items()
                                  if is_number(v) and k not in ("seed", "index") and not k.endswith("_n")})
        raise ConfigError(f"--metric {metric}: no row of {run} has "
                          f"this score; it has: {', '.join(scored) or 'none'}")
    return metric




def _check_resampling(resamples: int, bootstrap_seed: int) -> None:
    check_count("--resamples", resamples, 1, MAX_RESAMPLES)
    check_count("--bootstrap-seed", bootstrap_seed, 0)


# ----------------------------------------------------------------------------- compare


@dataclass
class CompareResults:
    """What `compare` found: one paired comparison per two systems, and, with three systems or
    more in one run, their Elo ratings."""

    metric: str
    read_as: str  # how the metric's direction was read, in words
    comparisons: list[Comparison]
    resamples: int
    by: str | None = None  # one run: the field naming its systems
    elo: list[tuple[str, float]] = field(default_factory=list)  # (system, rating), best first
    battles: int = 0  # the pairwise preferences the Elo ratings come from
    out: Path | None = None  # the JSONL file of the comparisons

    def notes(self) -> list[str]:
        """What could not be paired, in words (each comparison's `notes`)."""
        return [note for c in self.comparisons for note in c.notes()]


def compare(runs: str | Path | Sequence[str | Path], *, metric: str | None = None, by: str = "captioner",
            resamples: int = 1000, bootstrap_seed: int = 0, out: str | Path | None = None) -> CompareResults:
    """Two runs on the images both scored (`runs=[a, b]`), or the systems of one run (`runs=[run]`,
    systems by the field `by`): the paired difference of `metric` (default: the run's first), a
    bootstrap over images and, within each, seeds, and the probability the ranking flips. With
    three systems or more in one run, also their Elo ratings from the metric's preferences on each
    image. `out`: a JSONL file the comparisons are written to (`Comparison.row()` each)."""
    from caprecon.stats.seeds import compare as compare_two, compare_within

    runs = [runs] if isinstance(runs, (str, Path)) else list(runs)
    if len(runs) not in (1, 2):
        raise ConfigError(f"compare takes one run (systems by --by) or two, not {len(runs)}")
    _check_resampling(resamples, bootstrap_seed)
    if out is not None:  # refused before any run is read (the CLI's prologue does the same)
        check_out(out, inputs=runs, option="--out", file=True)
    if len(runs) == 2 and scores_path(runs[0]).resolve() == scores_path(runs[1]).resolve():
        raise ConfigError(f"{runs[0]} and {runs[1]} are the same run: a run compared with itself differs "
                          "by exactly 0; give two runs, or one run and --by FIELD to compare its systems")
    records, names, columns = load_run(runs[0])
    metric = run_metric(metric, runs[0], names, records)
    higher_is_better, read_as = direction(metric, columns)
    options = {"n_resamples": resamples, "seed": bootstrap_seed, "higher_is_better": higher_is_better}
    if len(runs) == 2:
        comparisons = [compare_two(records, load_run(runs[1])[0], metric,
                                   names=(str(runs[0]), str(runs[1])), **options)]
    else:
        comparisons = compare_within(records, metric, by=by, **options)
    results = CompareResults(metric, read_as, comparisons, resamples, by=by if len(runs) == 1 else None)
    if len(runs) == 1 and len({c.a for c in comparisons} | {c.b for c in comparisons}) > 2:
        results.elo, results.battles = _elo(records, metric, by, bootstrap_seed, higher_is_better)
    if out is not None:
        results.out = Path(out)
        results.out.parent.mkdir(parents=True, exist_ok=True)
        write_jsonl_atomically(results.out, [c.row() for c in comparisons], allow_nan=True)
    return results


def _elo(records: list[dict[str, Any]], metric: str, by: str, seed: int,
         higher_is_better: bool | None) -> tuple[list[tuple[str, float]], int]:
    """Several systems: the metric's preferences on each image as battles, rated as CapArena rates
    its models (`caprecon.stats.elo`), so the ranking reads like an arena's. A lower-is-better
    metric's battles are won by the lower score; one with no better direction has no battles."""
    from caprecon.stats.elo import ELO_ROUNDS, battles_from_scores, bootstrap_elo
    from caprecon.stats.seeds import image_of

    if higher_is_better is None:
        return [], 0
    sign = 1.0 if higher_is_better else -1.0
    rows = [(image_of(r), str(r[by]), sign * float(r[metric])) for r in records
            if r.get(by) is not None and is_number(r.get(metric))]  # fmt: skip
    battles = battles_from_scores(rows)
    ratings = bootstrap_elo(battles, rounds=ELO_ROUNDS, seed=seed)
    return sorted(ratings.items(), key=lambda kv: -kv[1]), len(battles)


# ----------------------------------------------------------------------------- seeds


@dataclass
class SeedsResults:
    """How stable a ranking is over seeds: τ at k of K seeds (`curve`), and the k it needs."""

    metric: str
    read_as: str  # how the metric's direction was read, in words
    curve: list[Stability]
    threshold: float
    needed: int | None  # the smallest k whose τ reaches `threshold` and stays there (None: more than K)
    by: str | None = None
    best: str | None = None  # with `by`: the system with the best mean at all K seeds
    left_out: int = 0  # rows without a finite score
    rows: int = 0
    out: Path | None = None  # seeds.csv


def seeds(run: str | Path, *, metric: str | None = None, by: str | None = None,
          threshold: float = STABILITY_THRESHOLD, resamples: int = 1000, bootstrap_seed: int = 0,
          out: str | Path | None = None) -> SeedsResults:
    """From a run scored with K seeds: Kendall τ between the ranking at the first k seeds and at
    all K, for k = 1..K, with a bootstrap interval over images, and the smallest k whose τ
    reaches `threshold`. Ranks captions, or with `by` the systems (values of that field).
    Writes `seeds.csv` to `out` (default: the run's folder)."""
    from caprecon.stats.seeds import best_system, seeds_needed, stability, unscored, write_stability

    _check_resampling(resamples, bootstrap_seed)
    check_number("--threshold", threshold, 0, 1, low_open=True)
    folder = Path(out) if out is not None else (Path(run) if Path(run).is_dir() else Path(run).parent)
    with run_folder(folder, option="--out" if out is not None else "the run folder"):  # seeds.csv's folder, locked
        records, names, columns = load_run(run)
        metric = run_metric(metric, run, names, records)
        higher_is_better, read_as = direction(metric, columns)
        curve = stability(records, metric, by=by, n_resamples=resamples, seed=bootstrap_seed)
        best = best_system(records, metric, by, higher_is_better) if by and higher_is_better is not None else None
        path = write_stability(curve, folder / "seeds.csv", metric=metric, threshold=threshold)
    return SeedsResults(metric, read_as, curve, threshold, seeds_needed(curve, threshold), by=by, best=best,
                        left_out=unscored(records, metric), rows=len(records), out=path)
