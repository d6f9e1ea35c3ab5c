"""The ReconScore paper's probes as statistics: how a metric behaves on the probe captions
(written by `caprecon.apps.metabench.probe_captions`), each value with its bootstrap interval over images.

Δ probe: `paraphrase_delta` is the mean score of the paraphrases minus that of the
perturbations: positive when the metric follows meaning rather than word overlap.
Length probe: `length_robustness` is the spread of a metric's mean over the three lengths.
Inserted-object probe: `insertion_probe`, how precision and coverage move when a caption
claims one absent object more.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Sequence

import numpy as np

from caprecon.stats.bootstrap import bootstrap_ci

# ----------------------------------------------------------------------------- a metric on the probes

PROBE_COLUMNS = (
    ("metric", "metric"),
    ("probe", "probe"),
    ("value", "value"),
    ("ci", "95% CI"),
    ("n", "n"),
    ("detail", "detail"),
)


@dataclass
class ProbeRow:
    """One metric under one probe."""

    metric: str
    probe: str  # paraphrase_delta or length_std
    value: float
    ci_low: float
    ci_high: float
    n: int
    detail: str = ""

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def table_columns(cls, rows: Sequence[ProbeRow]) -> list[tuple[str, str]]:
        return list(PROBE_COLUMNS)


def paraphrase_delta(
    metric: str,
    paraphrase_scores: Sequence[float],
    perturbed_scores: Sequence[float],
    groups: Sequence,
    *,
    n_bootstrap: int = 1000,
    seed: int = 0,
    level: float = 0.95,
) -> ProbeRow:
    """Δ = mean score(paraphrase) − mean score(perturbed), over triples both scored.

    Positive Δ means the metric notices the perturbation. The detail gives both means and
    the win rate (share of triples whose paraphrase outscored its perturbation; ties half).
    """
    para, pert = np.asarray(paraphrase_scores, float), np.asarray(perturbed_scores, float)
    value, low, high, ok = _mean_difference(para, pert, groups, n_bootstrap, seed, level)
    n = int(ok.sum())
    wins = float(np.mean((para[ok] > pert[ok]) + 0.5 * (para[ok] == pert[ok]))) if n else math.nan
    detail = (
        f"paraphrase {para[ok].mean():.4g}, perturbed {pert[ok].mean():.4g}, win rate {wins:.3f}"
        if n
        else "no triple scored"
    )
    return ProbeRow(metric, "paraphrase_delta", value, low, high, n, detail)


def _mean_difference(first: np.ndarray, second: np.ndarray, groups: Sequence, n_bootstrap: int, seed: int,
                     level: float) -> tuple[float, float, float, np.ndarray]:
    """Mean of `first` minus mean of `second` over the rows both scored, its bootstrap CI over
    `groups`, and which rows those are."""
    ok = np.isfinite(first) & np.isfinite(second)

    def difference(idx: np.ndarray) -> float:
        idx = idx[ok[idx]]
        return float(first[idx].mean() - second[idx].mean()) if len(idx) else math.nan

    low, high = bootstrap_ci(difference, groups, n_resamples=n_bootstrap, seed=seed, level=level)
    return difference(np.arange(len(first))), low, high, ok


def length_robustness(
    metric: str,
    lengths: Sequence[str],
    scores: Sequence[float],
    groups: Sequence,
    *,
    order: Sequence[str] = ("short", "medium", "long"),
    n_bootstrap: int = 1000,
    seed: int = 0,
    level: float = 0.95,
) -> ProbeRow:
    """Standard deviation (over lengths, ddof 0) of the metric's mean score per caption length.

    `lengths[i]` names the length category of caption i (one of `order`) and `groups[i]` its
    image; each image has one caption per length, all stating the same facts. Only images
    whose captions of every length were scored count, so every length's mean is over the
    same images. 0 means the metric is indifferent to length. The value is on the metric's
    own scale (the paper reports scores ×100); the detail gives each length's mean and the
    spread relative to the standard deviation of all these captions' scores, which compares
    across metrics of different scales.
    """
    s = np.asarray(scores, float)
    label = np.asarray(lengths, dtype=object)
    g = np.asarray(groups, dtype=object).astype(str)
    unknown = sorted(set(label) - set(order))
    if unknown:
        raise ValueError(f"length labels {unknown} are not among {list(order)}")
    scored = np.isfinite(s)
    complete = {image for image in set(g) if set(label[(g == image) & scored]) >= set(order)}
    counted = scored & np.isin(g, list(complete))

    def means(idx: np.ndarray) -> list[float]:
        idx = idx[counted[idx]]
        return [float(s[idx][label[idx] == name].mean()) for name in order] if len(idx) else []

    def spread(idx: np.ndarray) -> float:
        m = means(idx)
        return float(np.std(m)) if len(m) == len(order) else math.nan

    everything = np.arange(len(s))
    value = spread(everything)
    low, high = bootstrap_ci(spread, g, n_resamples=n_bootstrap, seed=seed, level=level)
    overall = float(np.std(s[counted])) if counted.any() else math.nan
    relative = value / overall if overall > 0 else math.nan
    parts = ", ".join(f"{name} {m:.4g}" for name, m in zip(order, means(everything)))
    detail = f"means {parts or 'none'} over {len(complete)} images; std / overall std {relative:.3f}"
    return ProbeRow(metric, "length_std", value, low, high, int(counted.sum()), detail)


def insertion_probe(
    metric: str,
    precision_before: Sequence[float],
    precision_after: Sequence[float],
    coverage_before: Sequence[float],
    coverage_after: Sequence[float],
    groups: Sequence,
    *,
    n_bootstrap: int = 1000,
    seed: int = 0,
    level: float = 0.95,
) -> list[ProbeRow]:
    """Two rows: `insert_precision_drop` = mean precision before − after (positive: the
    inserted object was noticed) and `insert_coverage_change` = mean coverage after − before
    (0: coverage ignores what was added), each over the captions scored both ways."""
    rows = []
    for probe, before, after, drop in (("insert_precision_drop", precision_before, precision_after, True),
                                       ("insert_coverage_change", coverage_before, coverage_after, False)):
        b, a = np.asarray(before, float), np.asarray(after, float)
        value, low, high, ok = _mean_difference(*((b, a) if drop else (a, b)), groups, n_bootstrap, seed, level)
        n = int(ok.sum())
        detail = f"before {b[ok].mean():.4g}, after {a[ok].mean():.4g}" if n else "no caption scored"
        rows.append(ProbeRow(metric, probe, value, low, high, n, detail))
    return rows
