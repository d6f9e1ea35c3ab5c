"""What the noise seed does to a run's conclusions: system comparisons that respect it, and
how many seeds a ranking needs.

Rows come from a run's `scores.jsonl`. A row scored from K seeds carries its per-seed
values as `<metric>_seeds` (`caprecon.metrics.seeds`); a one-seed row is its one value.

- `compare`: two systems (two runs, or two values of a field such as `captioner` in one
  run) on the images both scored: the paired difference of their means with a bootstrap
  over images and seeds (`bootstrap.paired_bootstrap_seeds`) and the probability that the
  ranking of the two flips.
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
from caprecon.stats.bootstrap import bootstrap_ci, bootstrap_tau, paired_bootstrap_seeds
from caprecon.stats.correlation import kendall_tau

STABILITY_THRESHOLD = 0.9


def seed_values(record: Mapping[str, Any], metric: str) -> list[float] | None:
    """The row's per-seed values of `metric` (one value for a one-seed row); None without a score."""
    values = record.get(f"{metric}_seeds")
    if values is None:
        value = record.get(metric)
        values = [value] if value is not None else None
    if not values or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                             for v in values):
        return None
    return [float(v) for v in values]


def image_of(record: Mapping[str, Any]) -> str:
    """The image a row scored (its id where it names none): the unit the bootstraps resample."""
    return str(record.get("image_id", record.get("id")))


def by_image(records: Iterable[Mapping[str, Any]], metric: str) -> dict[str, np.ndarray]:
    """Per image, its per-seed values (seeds as columns; several captions of one image averaged seed by seed)."""
    rows: dict[str, list[list[float]]] = defaultdict(list)
    for r in records:
        values = seed_values(r, metric)
        if values is not None:
            rows[image_of(r)].append(values)
    out = {}
    for image, lists in rows.items():
        k = min(len(v) for v in lists)
        out[image] = np.mean([v[:k] for v in lists], axis=0)
    return out


@dataclass(frozen=True)
class Comparison:
    a: str
    b: str
    metric: str
    images: int
    seeds_a: int
    seeds_b: int
    mean_a: float
    mean_b: float
    difference: float
    ci_low: float
    ci_high: float
    p_value: float
    flip: float  # probability that the ranking of a and b is not the observed one

    def row(self) -> dict[str, Any]:
        return asdict(self)


def compare(records_a: Iterable[Mapping[str, Any]], records_b: Iterable[Mapping[str, Any]], metric: str, *,
            names: tuple[str, str] = ("A", "B"), n_resamples: int = 1000, seed: int = 0,
            level: float = 0.95) -> Comparison:
    """System A against system B on the images both scored; see the module doc."""
    a, b = by_image(records_a, metric), by_image(records_b, metric)
    shared = sorted(set(a) & set(b))
    if not shared:
        raise ConfigError(f"{names[0]} and {names[1]} have no image with a {metric} score in common")
    ka, kb = min(len(a[i]) for i in shared), min(len(b[i]) for i in shared)
    result = paired_bootstrap_seeds(np.stack([a[i][:ka] for i in shared]), np.stack([b[i][:kb] for i in shared]),
                                    n_resamples=n_resamples, seed=seed, level=level)
    return Comparison(names[0], names[1], metric, len(shared), ka, kb, result.value_a, result.value_b,
                      result.difference, result.ci_low, result.ci_high, result.p_value, result.flip)


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
    each scored by its mean over its rows."""
    rows = [(r, seed_values(r, metric)) for r in records]
    rows = [(r, v) for r, v in rows if v is not None]
    if not rows:
        raise ConfigError(f"no row has a {metric} score")
    K = min(len(v) for _, v in rows)
    if K < 2:
        raise ConfigError(f"the rows hold {metric} from one seed: run with --seeds K (K >= 2) first")
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
