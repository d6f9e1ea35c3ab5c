"""The one bootstrap of the package: percentile intervals from resampling whole groups.

A group is the unit whose rows are not independent of one another — an image with all
the captions and judgments of it, or a caption with its scores under several generators.
Each resample draws as many groups as there are, with replacement, and keeps every row
of a drawn group as often as the group is drawn. The draws depend only on the seed and
the number of groups, so every statistic and every metric bootstrapped with the same
seed sees the same resampled group sets: intervals are reproducible and comparable, and
two statistics on the same resamples form a paired bootstrap.

`bootstrap_ci` evaluates any statistic on each resample's rows; `paired_bootstrap_seeds`
resamples seeds within each drawn image too, the same seeds for both systems. `bootstrap_tau` and
`bootstrap_ratio` give the same intervals for Kendall's τ and for a ratio of sums without
materialising the resamples, from how often each resample draws each group.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from caprecon.core.checks import MAX_RESAMPLES, check_count

Statistic = Callable[[np.ndarray], float]  # row indices of a resample -> value


def _group_members(groups: Sequence) -> tuple[np.ndarray, list[np.ndarray]]:
    """Each row's group number (groups in sorted order of their names) and each group's rows."""
    _, inverse = np.unique(np.asarray(groups, dtype=object).astype(str), return_inverse=True)
    inverse = inverse.reshape(-1)
    order = np.argsort(inverse, kind="stable")
    return inverse, np.split(order, np.cumsum(np.bincount(inverse))[:-1])


SEED_DRAW_CELLS = 2**22  # seed draws held at once by `paired_bootstrap_seeds` (32 MB of indices)


def _no_resamples(n_resamples: int) -> bool:
    """Whether `n_resamples` asks for no bootstrap (0); a count out of bounds (negative, or so
    many the draws would not fit in memory) is refused, in every statistic alike."""
    return check_count("n_resamples", n_resamples, 0, MAX_RESAMPLES) == 0


def draws(n_groups: int, n_resamples: int, seed: int) -> np.ndarray:
    """The groups each resample draws (one row per resample): the same draws for every
    statistic and metric with the same seed."""
    return np.random.default_rng(seed).integers(0, n_groups, (n_resamples, n_groups))


def _percentile_interval(values: np.ndarray, level: float) -> tuple[float, float]:
    """The central `level` interval of the finite `values` (NaN, NaN when there are none)."""
    values = values[np.isfinite(values)]
    if not len(values):
        return math.nan, math.nan
    tail = (1.0 - level) / 2.0
    low, high = np.quantile(values, [tail, 1.0 - tail])
    return float(low), float(high)


def _resample(statistic: Statistic, groups: Sequence, *, n_resamples: int = 1000, seed: int = 0) -> np.ndarray:
    """`statistic` on each resample: it receives the row indices of every drawn group,
    repeated as often as the group was drawn. Empty when n_resamples is 0."""
    if _no_resamples(n_resamples):
        return np.empty(0)
    _, members = _group_members(groups)
    picked = draws(len(members), n_resamples, seed)
    return np.array([statistic(np.concatenate([members[k] for k in picks])) for picks in picked], float)


def bootstrap_ci(
    statistic: Statistic,
    groups: Sequence,
    *,
    n_resamples: int = 1000,
    seed: int = 0,
    level: float = 0.95,
) -> tuple[float, float]:
    """Percentile bootstrap interval of `statistic(indices)`, resampling groups.

    Resamples on which the statistic is undefined (NaN) are left out. (NaN, NaN) when
    n_resamples is 0.
    """
    return _percentile_interval(_resample(statistic, groups, n_resamples=n_resamples, seed=seed), level)


@dataclass(frozen=True)
class PairedDifference:
    """Two statistics on the same resamples: their difference with its interval and p-value."""

    value_a: float
    value_b: float
    difference: float  # a - b on all rows
    ci_low: float
    ci_high: float
    p_value: float
    n_resamples: int  # resamples on which both statistics were defined


def paired_bootstrap(
    statistic_a: Statistic,
    statistic_b: Statistic,
    groups: Sequence,
    *,
    n_resamples: int = 1000,
    seed: int = 0,
    level: float = 0.95,
) -> PairedDifference:
    """Is `statistic_a` larger than `statistic_b`? Both are computed on each resample, so what
    varies is only which groups were drawn.

    The two-sided p-value is twice the share of resamples on the far side of zero from the
    observed difference (capped at 1), the usual percentile-bootstrap test. The interval and
    p-value are NaN when the observed difference or every resample's is undefined.
    """
    everything = np.arange(len(groups))
    value_a, value_b = statistic_a(everything), statistic_b(everything)
    observed = value_a - value_b
    differences = _resample(lambda idx: statistic_a(idx) - statistic_b(idx), groups, n_resamples=n_resamples,
                           seed=seed)
    differences = differences[np.isfinite(differences)]
    if not len(differences) or not math.isfinite(observed):
        return PairedDifference(value_a, value_b, observed, math.nan, math.nan, math.nan, 0)
    low, high = _percentile_interval(differences, level)
    far_side = np.mean(differences <= 0) if observed > 0 else np.mean(differences >= 0)
    return PairedDifference(value_a, value_b, observed, low, high, min(1.0, 2.0 * float(far_side)), len(differences))


@dataclass(frozen=True)
class SeededDifference(PairedDifference):
    """`PairedDifference` of two systems scored from several seeds per image, with the share of
    resamples whose ranking of the two is not the observed one."""

    flip: float = math.nan


def paired_bootstrap_seeds(
    a: np.ndarray,
    b: np.ndarray,
    *,
    n_resamples: int = 1000,
    seed: int = 0,
    level: float = 0.95,
) -> SeededDifference:
    """Mean of `a` minus mean of `b` over images, each image's score a mean over seeds:
    `a` is images x seeds of system A, and `b` of B on the same images and seeds, in the same
    order (`b[i, k]` drawn with the noise of `a[i, k]`: the same image, seed and questions).

    A two-level bootstrap on paired draws: each resample draws images with replacement (the
    same draws as every bootstrap here, images being the groups), and for each drawn image
    draws its seeds with replacement, the same seeds for A and B. So the seed's share of the
    uncertainty is in the interval (a difference that one lucky seed makes is not significant
    once the seeds are many), while noise A and B share (one seed's starting image, rebuilt for
    both captions) cancels in each draw instead of widening the interval. `flip` is the share
    of resamples where the difference is zero or has the other sign than the observed one
    (p-value = 2 flip).
    """
    a, b = np.atleast_2d(np.asarray(a, float)), np.atleast_2d(np.asarray(b, float))
    if a.shape != b.shape:
        raise ValueError(f"paired draws need A and B of one shape (images x seeds), not {a.shape} and {b.shape}")
    value_a, value_b = float(a.mean()), float(b.mean())
    observed = value_a - value_b
    if _no_resamples(n_resamples) or not len(a) or not math.isfinite(observed):
        return SeededDifference(value_a, value_b, observed, math.nan, math.nan, math.nan, 0, math.nan)
    picked = draws(len(a), n_resamples, seed)  # resamples x images
    rng = np.random.default_rng([seed, 1])  # the seed level, apart from the image draws
    paired = a - b  # a draw's difference of the means is the mean of its paired differences
    # a run of resamples at a time: the seeds drawn for all of them at once (resamples x images x
    # seeds) took 400 MB of indices, and as much again of values, for 1,000 resamples of 5,000 images
    # with 10 seeds. The generator gives the same numbers in runs as in one call.
    step = max(1, SEED_DRAW_CELLS // max(1, paired.size))
    differences = np.empty(n_resamples)
    for lo in range(0, n_resamples, step):
        hi = min(n_resamples, lo + step)
        seeds = rng.integers(0, paired.shape[1], (hi - lo, paired.shape[0], paired.shape[1]))
        differences[lo:hi] = paired[picked[lo:hi, :, None], seeds].mean(axis=(1, 2))
    low, high = _percentile_interval(differences, level)
    flip = float(np.mean(differences <= 0) if observed > 0 else np.mean(differences >= 0))
    return SeededDifference(value_a, value_b, observed, low, high, min(1.0, 2.0 * flip), n_resamples, flip)


# ----------------------------------------------------------------------------- all resamples at once


def _draw_counts(groups: Sequence, n_resamples: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(each row's group number, how often each resample draws each group: resamples x groups),
    from the same draws as `bootstrap_ci`."""
    inverse, members = _group_members(groups)
    n = len(members)
    picked = draws(n, n_resamples, seed)
    offsets = (np.arange(n_resamples)[:, None] * n + picked).ravel()
    return inverse, np.bincount(offsets, minlength=n_resamples * n).reshape(n_resamples, n).astype(float)


def _untied_between(values: np.ndarray, group_of: np.ndarray, n_groups: int) -> np.ndarray:
    """Pairs (i in g, j in h) whose values differ, for every two groups: all pairs minus the
    tied ones, from each group's count of each value (a value shared by m groups adds m²
    tied products)."""
    sizes = np.bincount(group_of, minlength=n_groups).astype(float)
    tied = np.zeros((n_groups, n_groups))
    if len(values):
        _, code = np.unique(values, return_inverse=True)
        cells, count = np.unique(np.stack([code.reshape(-1), group_of]), axis=1, return_counts=True)
        value, group = cells
        shared = np.flatnonzero(np.bincount(value) > 1)
        alone = ~np.isin(value, shared)
        np.add.at(tied, (group[alone], group[alone]), count[alone].astype(float) ** 2)  # a group has many such values
        for v in shared:
            at = value == v
            tied[np.ix_(group[at], group[at])] += np.outer(count[at], count[at])
    return np.outer(sizes, sizes) - tied


def _concordance_between(x: np.ndarray, y: np.ndarray, group_of: np.ndarray, n_groups: int) -> np.ndarray:
    """Concordant minus discordant pairs (i in g, j in h) for every two groups, without
    visiting pairs: for each row i and each (group h, level b of y) cell, the sum of
    sgn(x_i - x_j) over the cell's rows comes from cumulative cell counts along sorted x,
    and is weighted by sgn(y_i - b). O(rows x groups x levels of y)."""
    out = np.zeros((n_groups, n_groups))
    if not len(x):
        return out
    levels, level_of = np.unique(y, return_inverse=True)
    level_of = level_of.reshape(-1)
    n_levels = len(levels)
    weight = np.sign(level_of[:, None] - np.arange(n_levels)[None, :])  # rows x levels: sgn(y_i - b)
    by_x = np.argsort(x, kind="stable")
    sorted_x = x[by_x]
    below = np.searchsorted(sorted_x, x, "left")  # rows with a smaller x
    up_to = np.searchsorted(sorted_x, x, "right")  # rows with a smaller or equal x
    by_group = np.argsort(group_of, kind="stable")
    present = np.unique(group_of)
    starts = np.searchsorted(group_of[by_group], present)
    chunk = max(1, 4_000_000 // (len(x) * n_levels))  # groups per pass, to bound memory
    for lo in range(0, n_groups, chunk):
        cols = np.arange(lo, min(lo + chunk, n_groups))
        member = np.zeros((len(x) + 1, len(cols), n_levels), dtype=np.int32)  # cumulative counts along sorted x
        inside = (group_of >= cols[0]) & (group_of <= cols[-1])
        rows = np.flatnonzero(inside[by_x])
        member[rows + 1, group_of[by_x][rows] - cols[0], level_of[by_x][rows]] = 1
        np.cumsum(member, axis=0, out=member)
        size = member[-1]
        # sum over cell rows j of sgn(x_i - x_j) = (#smaller) - (#larger) = below + up_to - size
        signed = member[below] + member[up_to] - size[None]  # rows x groups x levels
        per_row = np.einsum("ihb,ib->ih", signed, weight)
        out[np.ix_(present, cols)] += np.add.reduceat(per_row[by_group], starts, axis=0)
    return out


def bootstrap_tau(
    x: np.ndarray,
    y: np.ndarray,
    groups: Sequence,
    *,
    variant: str = "b",
    n_resamples: int = 1000,
    seed: int = 0,
    level: float = 0.95,
) -> tuple[float, float]:
    """`bootstrap_ci` of Kendall's τ between `x` and `y` (rows with a non-finite x left
    out), for all resamples at once.

    A resample repeats each drawn group's rows as often as the group is drawn, so each of
    τ's pair counts — concordant minus discordant pairs, pairs untied in x, pairs untied
    in y — is a quadratic form cᵀBc of the resample's draw counts c, with B the counts
    between the rows of each two groups. B is built once (O(rows²)), then every resample
    costs O(groups²) instead of a τ over its expanded rows. τ_c's number of classes comes
    from which values each resample contains.
    """
    if variant not in ("b", "c"):
        raise ValueError(f"Kendall variant must be 'b' or 'c', not {variant!r}")
    if _no_resamples(n_resamples):
        return math.nan, math.nan
    group_of, counts = _draw_counts(groups, n_resamples, seed)
    x, y = np.asarray(x, float), np.asarray(y, float)
    ok = np.isfinite(x)
    x, y, group_of = x[ok], y[ok], group_of[ok]
    if not len(x):  # every row failed: τ is undefined on every resample
        return math.nan, math.nan
    n_groups = counts.shape[1]
    if len(np.unique(x)) < len(np.unique(y)):
        x, y = y, x  # τ is symmetric: count against the variable with fewer levels
    concordant = _concordance_between(x, y, group_of, n_groups)
    forms = (concordant, _untied_between(x, group_of, n_groups), _untied_between(y, group_of, n_groups))
    # each form summed over the resample's ordered pairs of rows: cᵀ B c
    concordance, untied_x, untied_y = (np.einsum("rg,rg->r", counts @ form, counts) for form in forms)
    with np.errstate(all="ignore"):
        if variant == "b":
            tau = concordance / np.sqrt(untied_x * untied_y)
        else:
            size = counts @ np.bincount(group_of, minlength=n_groups)
            classes = np.minimum(_classes(x, group_of, counts), _classes(y, group_of, counts))
            tau = concordance / (size**2 * (classes - 1) / classes)
    tau[(untied_x == 0) | (untied_y == 0)] = math.nan  # a constant variable: τ undefined
    return _percentile_interval(tau, level)


def _classes(values: np.ndarray, group_of: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """How many distinct values each resample holds."""
    _, code = np.unique(values, return_inverse=True)
    cells = np.unique(np.stack([code.reshape(-1), group_of]), axis=1)  # (value, group) pairs present
    drawn = counts[:, cells[1]] > 0  # resamples x cells, cells sorted by value
    starts = np.flatnonzero(np.r_[True, cells[0][1:] != cells[0][:-1]])
    return np.logical_or.reduceat(drawn, starts, axis=1).sum(axis=1)


def bootstrap_ratio(
    numerator: np.ndarray,
    denominator: np.ndarray,
    groups: Sequence,
    *,
    n_resamples: int = 1000,
    seed: int = 0,
    level: float = 0.95,
) -> tuple[float, float]:
    """`bootstrap_ci` of sum(numerator) / sum(denominator) over a resample's rows, for all
    resamples at once (a ratio of sums is linear in the draw counts)."""
    if _no_resamples(n_resamples):
        return math.nan, math.nan
    group_of, counts = _draw_counts(groups, n_resamples, seed)
    n_groups = counts.shape[1]
    num = np.bincount(group_of, weights=np.asarray(numerator, float), minlength=n_groups)
    den = np.bincount(group_of, weights=np.asarray(denominator, float), minlength=n_groups)
    with np.errstate(all="ignore"):
        return _percentile_interval((counts @ num) / (counts @ den), level)
