"""How closely two sets of scores agree: Kendall τ_b / τ_c, Spearman, Pearson, and the
pairwise accuracy of a metric's order of two captions against people's.

A statistic that is undefined (fewer than two observations, a constant variable, no pair
with a human winner) is NaN, never an exception: a resample or a failed metric may well
produce such inputs.
"""

from __future__ import annotations

import math
import warnings
from collections import defaultdict
from dataclasses import dataclass
from typing import Sequence

import numpy as np


def _stats():
    from scipy import stats  # a second or more to import: only commands that correlate pay for it

    return stats


def _quiet(fn, *args, **kwargs) -> float:
    # Constant inputs make scipy warn and return NaN; NaN is the answer we want, silently.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with np.errstate(all="ignore"):
            value = fn(*args, **kwargs)[0]
    return float(value)


def kendall_tau(x: Sequence[float], y: Sequence[float], variant: str = "b") -> float:
    """Kendall's τ_b (ties corrected in both variables) or τ_c (Stuart's, for tables
    whose two variables have different numbers of levels). NaN when undefined."""
    if variant not in ("b", "c"):
        raise ValueError(f"Kendall variant must be 'b' or 'c', not {variant!r}")
    if len(x) < 2:
        return math.nan
    return _quiet(_stats().kendalltau, np.asarray(x, float), np.asarray(y, float), variant=variant)


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    return math.nan if len(x) < 2 else _quiet(_stats().spearmanr, np.asarray(x, float), np.asarray(y, float))


def pearson(x: Sequence[float], y: Sequence[float]) -> float:
    return math.nan if len(x) < 2 else _quiet(_stats().pearsonr, np.asarray(x, float), np.asarray(y, float))


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
