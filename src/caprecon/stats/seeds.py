"""What the noise seed does to a run's conclusions: system comparisons that respect it, and
how many seeds a ranking needs.

Rows come from a run's `scores.jsonl`. A row scored from K seeds carries its per-seed
values as `<metric>_seeds` (`caprecon.metrics.seeds`); a one-seed row is its one value.

- `compare`: two systems (two runs, or two values of a field such as `captioner` in one
  run) on paired draws: the images both scored, and on each the same seeds (the k-th seed of
  A's rows with the k-th of B's: the same noise when both were rebuilt from the same seeds)
  and the same questions. The paired difference of their means with a bootstrap over images
  and seeds that draws both systems' values together (`bootstrap.paired_bootstrap_seeds`),
  and the probability that the ranking of the two flips. What cannot be paired is counted
  and said (`Comparison.notes`): images one system did not score, or was asked a different
  number of questions about (`<metric>_n`), are left out; seeds beyond the fewer system's
  count are left out; images whose rows were rebuilt from other seeds for A than for B are
  paired by seed position, which cancels no noise, and counted. Rows without a finite score
  are counted too; an id twice in one system's rows is refused, never averaged.
- `stability`: from a K-seed run, Kendall's τ between the ranking of captions (or of
  systems) at k < K seeds (the first k, what a k-seed run would have scored) and at K,
  with a bootstrap interval over images, and the smallest k whose τ reaches a threshold.
"""

from __future__ import annotations

import csv
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from caprecon.core.errors import ConfigError
from caprecon.core.records import is_number
from caprecon.core.scaling import binary_exponent, rescale
from caprecon.stats.bootstrap import bootstrap_ci, bootstrap_tau, paired_bootstrap_seeds
from caprecon.stats.correlation import kendall_tau

STABILITY_THRESHOLD = 0.9


def seed_values(record: Mapping[str, Any], metric: str, exponent: int = 0) -> list[float] | None:
    """The row's per-seed values of `metric` (one value for a one-seed row), divided by
    2**exponent (`magnitude`); None without a finite score."""
    values = record.get(f"{metric}_seeds")
    if values is None:
        value = record.get(metric)
        values = [value] if value is not None else None
    if not values or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                             for v in values):
        return None
    return [math.ldexp(float(v), -exponent) for v in values]


def magnitude(metric: str, *record_sets: Sequence[Mapping[str, Any]]) -> int:
    """The binary exponent of the largest |score| in the rows (`caprecon.core.scaling`): scores
    of 1e308 gave inf and NaN; divided by 2**it, every mean, difference and tau is the same
    once multiplied back."""
    return binary_exponent(v for records in record_sets for r in records for v in seed_values(r, metric) or ())


def unique_ids(records: Sequence[Mapping[str, Any]], name: str) -> None:
    """Refuse rows that share an id: averaging them would count one caption twice."""
    seen: dict[str, int] = {}
    for i, r in enumerate(records, 1):
        if r.get("id") is None:
            continue
        key = str(r["id"])
        if key in seen:
            raise ConfigError(f"{name}: id {key!r} is on rows {seen[key]} and {i}; each row of a run has its own id "
                              "(join shards with `caprecon merge`, not by concatenating them)")
        seen[key] = i


def numbers_only(records: Sequence[Mapping[str, Any]], metric: str, name: str) -> None:
    """Refuse a score that is no number at all (text, true, a list of text): a file edited by hand or
    written by something else, not a missing score to leave out. A missing score (null, NaN, inf, a
    failed row) is left out and counted (`unscored`)."""
    for i, r in enumerate(records, 1):
        where = f"{name}: row {str(r['id'])!r}" if r.get("id") is not None else f"{name}: row {i}"
        value = r.get(metric)
        if value is not None and not _numeric(value):
            raise ConfigError(f"{where}: {metric} is {_kind(value)}, not a number")
        draws = r.get(f"{metric}_seeds")
        if draws is not None and (not isinstance(draws, list) or not all(v is None or _numeric(v) for v in draws)):
            raise ConfigError(f"{where}: {metric}_seeds is {_kind(draws)}, not a list of numbers")


def _numeric(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _kind(value: Any) -> str:
    if isinstance(value, str):
        return f"the text {value[:40]!r}"
    if isinstance(value, list):
        odd = next((v for v in value if v is not None and not _numeric(v)), None)
        return f"a list holding {_kind(odd)}" if odd is not None else "a list"
    return f"{type(value).__name__} {value!r}"[:60]


def unscored(records: Sequence[Mapping[str, Any]], metric: str) -> int:
    """Rows without a finite `metric` score (a failed row, NaN, inf): left out, and counted."""
    return sum(1 for r in records if seed_values(r, metric) is None)


def image_of(record: Mapping[str, Any]) -> str:
    """The image a row scored (its id where it names none): the unit the bootstraps resample."""
    return str(record.get("image_id", record.get("id")))


def seeds_of(record: Mapping[str, Any]) -> tuple[Any, ...] | None:
    """The seeds a row's per-seed values were rebuilt from, in their order; None when it names none."""
    seeds = record.get("seeds")
    if seeds is None and record.get("seed") is not None:
        seeds = [record["seed"]]
    return tuple(seeds) if isinstance(seeds, list) else None


@dataclass
class ImageDraws:
    """One system's draws on one image: per seed, the mean over its captions of the image, and
    what they were drawn with: each caption's seeds (None when a row names none) and the
    questions asked (the rows' `<metric>_n`, where the metric counts them)."""

    values: np.ndarray
    seeds: list[tuple[Any, ...] | None]
    questions: frozenset

    def seeds_up_to(self, k: int) -> tuple | None:
        """Each caption's first k seeds, in a canonical order; None when a row names none."""
        if any(s is None for s in self.seeds):
            return None
        return tuple(sorted(tuple(map(str, s[:k])) for s in self.seeds))


def by_image(records: Iterable[Mapping[str, Any]], metric: str, exponent: int = 0) -> dict[str, ImageDraws]:
    """Per image, a system's draws (seeds as columns; several captions of one image averaged seed by
    seed), divided by 2**exponent."""
    kept: dict[str, list[tuple[Mapping[str, Any], list[float]]]] = defaultdict(list)
    for r in records:
        values = seed_values(r, metric, exponent)
        if values is not None:
            kept[image_of(r)].append((r, values))
    out = {}
    for image, pairs in kept.items():
        k = min(len(v) for _, v in pairs)
        out[image] = ImageDraws(np.mean([v[:k] for _, v in pairs], axis=0), [seeds_of(r) for r, _ in pairs],
                                frozenset(r[f"{metric}_n"] for r, _ in pairs if r.get(f"{metric}_n") is not None))
    return out


@dataclass(frozen=True)
class Comparison:
    a: str
    b: str
    metric: str
    images: int  # images paired: both systems scored them, with the same questions
    seeds: int  # seeds paired per image: the first `seeds` of each system's
    seeds_a: int  # the seeds A has on every paired image (more than `seeds`: the rest left out)
    seeds_b: int
    shared_noise: int | None  # paired images whose A and B rows name the same seeds (None: a row names none)
    only_a: int  # images only A scored, left out
    only_b: int
    other_questions: int  # images A and B were asked different numbers of questions about, left out
    unscored_a: int  # A's rows without a finite score, left out
    unscored_b: int
    mean_a: float
    mean_b: float
    difference: float
    ci_low: float
    ci_high: float
    p_value: float
    flip: float  # probability that the ranking of a and b is not the observed one
    higher_is_better: bool | None = True  # the metric's direction, as declared (None: neither is better)

    @property
    def better(self) -> str | None:
        """The system whose mean is better by the metric's direction; None on a tie or with no direction."""
        if self.higher_is_better is None or not self.difference:
            return None
        return self.a if (self.difference > 0) == self.higher_is_better else self.b

    def row(self) -> dict[str, Any]:
        return {**asdict(self), "better": self.better}

    def notes(self) -> list[str]:
        """What could not be paired, in words, for the lines under the table."""
        a, b = self.a, self.b
        out = []
        if self.unscored_a or self.unscored_b:
            out.append(f"{a} vs {b}: left out {self.unscored_a} row(s) of {a} and {self.unscored_b} of {b} without a "
                       f"finite {self.metric} score (failed rows, NaN or inf)")
        if self.only_a or self.only_b:
            out.append(f"{a} vs {b}: left out {self.only_a} image(s) only {a} scored and {self.only_b} only {b} "
                       "scored")
        if self.other_questions:
            out.append(f"{a} vs {b}: left out {self.other_questions} image(s) they were asked different numbers "
                       f"of questions about ({self.metric}_n)")
        if max(self.seeds_a, self.seeds_b) > self.seeds:
            out.append(f"{a} vs {b}: {a} has {self.seeds_a} seed(s) per image, {b} {self.seeds_b}: the first "
                       f"{self.seeds} of each are paired, the rest left out")
        if self.shared_noise is not None and self.shared_noise < self.images:
            out.append(f"{a} vs {b}: on {self.images - self.shared_noise} of {self.images} images their rows were "
                       "rebuilt from other seeds (--seed-policy per-sample gives each caption of an image its own), "
                       "so those draws share no noise; --seed-policy per-image rebuilds every caption of an "
                       "image from the same seeds")
        return out


def compare(records_a: Iterable[Mapping[str, Any]], records_b: Iterable[Mapping[str, Any]], metric: str, *,
            names: tuple[str, str] = ("A", "B"), n_resamples: int = 1000, seed: int = 0,
            level: float = 0.95, higher_is_better: bool | None = True) -> Comparison:
    """System A against system B on paired draws; see the module doc. `higher_is_better`, the
    metric's declared direction, says which of them is `better`."""
    records_a, records_b = list(records_a), list(records_b)
    unique_ids(records_a, names[0])
    unique_ids(records_b, names[1])
    numbers_only(records_a, metric, names[0])
    numbers_only(records_b, metric, names[1])
    exponent = magnitude(metric, records_a, records_b)
    a, b = by_image(records_a, metric, exponent), by_image(records_b, metric, exponent)
    both = sorted(set(a) & set(b))
    other_questions = [i for i in both if a[i].questions and b[i].questions and a[i].questions != b[i].questions]
    paired = [i for i in both if i not in set(other_questions)]
    if not paired:
        unnamed = not any(r.get("image_id") is not None for r in (*records_a, *records_b))
        raise ConfigError(f"{names[0]} and {names[1]} have no image with a {metric} score in common"
                          + (f" that they were asked the same questions about ({len(other_questions)} image(s) "
                             f"with other numbers of questions, {metric}_n)" if other_questions else "")
                          + (": their rows have no image_id, so each row's id stands for its image, and no id "
                             "is in both" if unnamed else ""))
    seeds_a, seeds_b = min(len(a[i].values) for i in paired), min(len(b[i].values) for i in paired)
    k = min(seeds_a, seeds_b)
    named = [(a[i].seeds_up_to(k), b[i].seeds_up_to(k)) for i in paired]
    shared_noise = None if any(x is None or y is None for x, y in named) else sum(x == y for x, y in named)
    result = paired_bootstrap_seeds(np.stack([a[i].values[:k] for i in paired]),
                                    np.stack([b[i].values[:k] for i in paired]),
                                    n_resamples=n_resamples, seed=seed, level=level)
    back = [rescale(v, exponent) for v in (result.value_a, result.value_b, result.difference, result.ci_low,
                                              result.ci_high)]
    return Comparison(names[0], names[1], metric, len(paired), k, seeds_a, seeds_b, shared_noise,
                      len(set(a) - set(b)), len(set(b) - set(a)), len(other_questions), unscored(records_a, metric),
                      unscored(records_b, metric), *back, result.p_value, result.flip, higher_is_better)


def compare_within(records: Sequence[Mapping[str, Any]], metric: str, by: str = "captioner",
                   **options: Any) -> list[Comparison]:
    """Every two values of the field `by` (the systems of one run), ordered by their names."""
    systems: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for r in records:
        if r.get(by) is not None:
            systems[str(r[by])].append(r)
    if len(systems) < 2:
        raise ConfigError(f"comparing within a run needs two values of {by!r} in its rows, found "
                          f"{len(systems)}{': ' + ', '.join(systems) if systems else ''}")
    names = sorted(systems)
    return [compare(systems[x], systems[y], metric, names=(x, y), **options)
            for i, x in enumerate(names) for y in names[i + 1:]]


def best_system(records: Iterable[Mapping[str, Any]], metric: str, by: str, higher_is_better: bool) -> str | None:
    """The value of `by` whose rows' mean `metric` is best by its direction (None: no row scored)."""
    values: dict[str, list[float]] = defaultdict(list)
    for r in records:
        if r.get(by) is not None and is_number(r.get(metric)) and math.isfinite(float(r[metric])):
            values[str(r[by])].append(float(r[metric]))
    means = {name: float(np.mean(v)) for name, v in values.items()}
    return (max if higher_is_better else min)(means, key=means.__getitem__) if means else None


@dataclass(frozen=True)
class Stability:
    k: int
    tau: float
    ci_low: float
    ci_high: float
    units: int  # captions (or systems) ranked


def stability(records: Sequence[Mapping[str, Any]], metric: str, *, by: str | None = None,
              n_resamples: int = 1000, seed: int = 0, level: float = 0.95) -> list[Stability]:
    """τ between the ranking at the first k seeds and at all K, for k = 1..K; see the module doc.
    Without `by`, the units are the rows (captions); with it, the systems (values of `by`),
    each scored by its mean over its rows. Rows without a finite score are left out (`unscored`
    counts them); an id on two rows is refused."""
    unique_ids(records, "the run")
    numbers_only(records, metric, "the run")
    exponent = magnitude(metric, records)  # tau does not depend on the scale: no need to multiply back
    rows = [(r, seed_values(r, metric, exponent)) for r in records]
    rows = [(r, v) for r, v in rows if v is not None]
    if not rows:
        raise ConfigError(f"no row has a {metric} score")
    K = min(len(v) for _, v in rows)
    if K < 2:
        raise ConfigError(f"the rows hold {metric} from one seed: run with --seeds K (K >= 2) first")
    if by is None and len(rows) < 2:
        raise ConfigError(f"ranking captions needs at least two rows with a {metric} score, found one: Kendall's tau "
                          f"of one caption is undefined (score more captions, or rank systems with --by)")
    values = np.array([v[:K] for _, v in rows])
    at = np.cumsum(values, axis=1) / np.arange(1, K + 1)  # rows x k: the mean of the first k seeds
    images = [image_of(r) for r, _ in rows]
    out = []
    if by is None:
        for k in range(1, K + 1):
            low, high = bootstrap_tau(at[:, k - 1], at[:, K - 1], images, n_resamples=n_resamples, seed=seed,
                                      level=level)
            out.append(Stability(k, kendall_tau(at[:, k - 1], at[:, K - 1]), low, high, len(rows)))
        return out
    system = np.array([str(r.get(by)) for r, _ in rows])
    names = sorted(set(system))
    if len(names) < 2:
        raise ConfigError(f"ranking systems needs two values of {by!r} in the rows, found {len(names)}")
    members = [system == n for n in names]

    def tau_at(k: int):
        def statistic(idx: np.ndarray) -> float:
            drawn = [idx[m[idx]] for m in members]  # each system's rows in this resample
            means = [at[d, k - 1].mean() if len(d) else math.nan for d in drawn]
            final = [at[d, K - 1].mean() if len(d) else math.nan for d in drawn]
            return kendall_tau(means, final)
        return statistic

    for k in range(1, K + 1):
        low, high = bootstrap_ci(tau_at(k), images, n_resamples=n_resamples, seed=seed, level=level)
        out.append(Stability(k, tau_at(k)(np.arange(len(rows))), low, high, len(names)))
    return out


def seeds_needed(curve: Sequence[Stability], threshold: float = STABILITY_THRESHOLD) -> int | None:
    """The smallest k whose τ and every larger k's reach `threshold`; None when even K falls short
    (it cannot: τ at K is 1, unless the ranking is undefined)."""
    needed = None
    for point in reversed(curve):
        if not point.tau >= threshold:
            break
        needed = point.k
    return needed


def write_stability(curve: Sequence[Stability], path: Path, *, metric: str,
                    threshold: float = STABILITY_THRESHOLD) -> Path:
    """`seeds.csv`: one line per k, with the metric, the threshold and the k it asks for."""
    needed = seeds_needed(curve, threshold)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="", encoding="utf-8") as fh:
        out = csv.writer(fh)
        out.writerow(["metric", "k", "tau", "ci_low", "ci_high", "units", "threshold", "seeds_needed"])
        for p in curve:
            out.writerow([metric, p.k, p.tau, p.ci_low, p.ci_high, p.units, threshold,
                          "" if needed is None else needed])
    return path
