"""How closely two sets of scores agree: Kendall τ_b / τ_c, Spearman, Pearson, and the
pairwise accuracy of a metric's order of two captions against people's.

A statistic that is undefined (fewer than two observations, a constant variable, no pair
with a human winner) is NaN, never an exception: a resample or a failed metric may well
produce such inputs.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from caprecon.core.scaling import binary_exponent


#: up to this many observations pairs are counted directly; beyond, in O(n log n) by scipy
QUADRATIC_UP_TO = 4000


def _concordance(x: np.ndarray, y: np.ndarray, untied_x: float, untied_y: float) -> float:
    """Concordant minus discordant pairs, the sum over i < j of sgn(x_i - x_j) sgn(y_i - y_j).

    Up to `QUADRATIC_UP_TO` observations, signs as int8 a block of rows at a time (5,910
    judgments, 35 M pairs, in a tenth of a second, bounded memory) and no scipy import (a
    second or more). Beyond, the count grows as n²: Flickr8k-Expert's 16,992 ratings are 144 M
    pairs a call, so it is read back from scipy's τ_b, which sorts (O(n log n)) and equals
    (concordant - discordant) / sqrt(untied_x · untied_y)."""
    if len(x) > QUADRATIC_UP_TO:
        from scipy.stats import kendalltau

        return float(kendalltau(x, y, variant="b").statistic) * math.sqrt(untied_x * untied_y)
    total, step = 0, max(1, 4_000_000 // len(x))
    for lo in range(0, len(x), step):
        bx, by = x[lo : lo + step, None], y[lo : lo + step, None]
        sign_x = (bx > x[None, :]).view(np.int8) - (bx < x[None, :]).view(np.int8)
        sign_y = (by > y[None, :]).view(np.int8) - (by < y[None, :]).view(np.int8)
        total += int((sign_x * sign_y).sum(dtype=np.int64))
    return total / 2  # every pair was counted from both ends


def _tied_pairs(values: np.ndarray) -> float:
    counts = np.unique(values, return_counts=True)[1].astype(float)
    return float(np.sum(counts * (counts - 1) / 2))


def _average_ranks(values: np.ndarray) -> np.ndarray:
    """Ranks from 1, tied values sharing the mean of the ranks they span."""
    _, code, counts = np.unique(values, return_inverse=True, return_counts=True)
    first = np.cumsum(counts) - counts  # rank - 1 of each value's first occurrence
    return (first + (counts + 1) / 2)[code.reshape(-1)]


def kendall_tau(x: Sequence[float], y: Sequence[float], variant: str = "b") -> float:
    """Kendall's τ_b (ties corrected in both variables) or τ_c (Stuart's, for tables
    whose two variables have different numbers of levels). NaN when undefined. Small inputs
    are counted here rather than by scipy.stats, whose import alone takes a second or more."""
    if variant not in ("b", "c"):
        raise ValueError(f"Kendall variant must be 'b' or 'c', not {variant!r}")
    return kendall_taus(x, y)[variant]


def kendall_taus(x: Sequence[float], y: Sequence[float]) -> dict[str, float]:
    """Both variants of `kendall_tau`, keyed "b" and "c", from one count of concordant pairs
    (the quadratic part): cheaper than two calls where both are reported."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    n = len(x)
    if n < 2 or np.isnan(x).any() or np.isnan(y).any():
        return {"b": math.nan, "c": math.nan}
    pairs = n * (n - 1) / 2
    untied_x, untied_y = pairs - _tied_pairs(x), pairs - _tied_pairs(y)
    if untied_x == 0 or untied_y == 0:
        return {"b": math.nan, "c": math.nan}  # a constant variable
    concordance = _concordance(x, y, untied_x, untied_y)
    classes = min(len(np.unique(x)), len(np.unique(y)))
    return {"b": concordance / math.sqrt(untied_x * untied_y), "c": 2 * concordance / (n**2 * (classes - 1) / classes)}


def pearson(x: Sequence[float], y: Sequence[float]) -> float:
    if len(x) < 2:
        return math.nan
    # at unit scale (`caprecon.core.scaling`): r does not depend on it, and scores near 1e308 overflowed
    x, y = (np.ldexp(v, -binary_exponent([np.abs(v).max()])) for v in (np.asarray(x, float), np.asarray(y, float)))
    dx, dy = x - x.mean(), y - y.mean()
    spread = math.sqrt(float(np.dot(dx, dx)) * float(np.dot(dy, dy)))
    return float(np.dot(dx, dy)) / spread if spread > 0 else math.nan


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    x, y = np.asarray(x, float), np.asarray(y, float)
    if len(x) < 2 or np.isnan(x).any() or np.isnan(y).any():
        return math.nan
    return pearson(_average_ranks(x), _average_ranks(y))


@dataclass
class PairAccuracy:
    accuracy: float  # NaN when no pair had a human winner
    n: int  # pairs with a human winner: the denominator
    metric_ties: int  # of those, pairs the metric scored equally
    human_ties: int  # pairs left out because people had no preference


def pairwise_accuracy(
    score_a: Sequence[float],
    score_b: Sequence[float],
    preference: Sequence[float],
    *,
    tie_credit: float = 0.5,
) -> PairAccuracy:
    """Agreement of the metric's order of (A, B) with people's.

    `preference` is the fraction of people preferring A: above 0.5 A wins, below B wins,
    exactly 0.5 is a human tie and the pair is left out. A metric tie on a decided pair
    counts `tie_credit` of a correct answer (0.5 by default, what a coin flip earns on
    average, so a metric cannot gain by collapsing scores into ties).
    """
    a, b, p = (np.asarray(v, float) for v in (score_a, score_b, preference))
    decided = p != 0.5
    human = np.sign(p[decided] - 0.5)
    metric = np.sign(a[decided] - b[decided])
    n = int(decided.sum())
    ties = int((metric == 0).sum())
    correct = float((metric == human).sum()) + tie_credit * ties
    return PairAccuracy(correct / n if n else math.nan, n, ties, int((~decided).sum()))


def within_image_pairs(groups: Sequence, human: Sequence[float]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """All pairs (i, j), i < j, of captions of the same image, with people's preference
    for i (1, 0, or 0.5 when their human scores are equal)."""
    by_group: dict = defaultdict(list)
    for index, g in enumerate(groups):
        by_group[g].append(index)
    first, second = [], []
    for members in by_group.values():
        m = np.asarray(members)
        i, j = np.triu_indices(len(m), k=1)
        first.append(m[i])
        second.append(m[j])
    if not first:
        return np.empty(0, int), np.empty(0, int), np.empty(0)
    i, j = np.concatenate(first), np.concatenate(second)
    h = np.asarray(human, float)
    return i, j, (np.sign(h[i] - h[j]) + 1) / 2
