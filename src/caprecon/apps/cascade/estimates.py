"""The cascade's estimates: the decision asked, the calibration of the cheap score against the full
metric (least squares, residual sd, leave-one-out coverage), each row's margin in sds from a change
of decision, and a system's mean by the difference estimator with its standard error. Pure numbers:
`caprecon.apps.cascade` runs the rounds that feed them."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from caprecon.core.errors import ConfigError

#: normal quantile for "could change": 1.96 sds either side, a 95 % interval
DEFAULT_Z = 1.96
DECISIONS = ("best-of-n", "rank", "threshold:X")
#: degrees of freedom (reconstructed rows beyond the first of each image) the within-image variance
#: needs before it is used: fewer, and a chance agreement of two siblings would make every difference certain
MIN_WITHIN_FREEDOM = 5


@dataclass(frozen=True)
class Decision:
    """What the scores decide: `kind` is best-of-n, rank or threshold (then `threshold` holds X)."""

    kind: str
    threshold: float | None = None

    @classmethod
    def parse(cls, text: str) -> "Decision":
        if text in ("best-of-n", "rank"):
            return cls(text)
        if text.startswith("threshold:"):
            value = text.split(":", 1)[1]
            try:
                return cls("threshold", float(value))
            except ValueError:
                raise ConfigError(f"--decision {text}: X of threshold:X must be a number, not {value!r}") from None
        raise ConfigError(f"--decision {text!r}: give one of {', '.join(DECISIONS)}")

    def __str__(self) -> str:
        return f"threshold:{self.threshold:g}" if self.kind == "threshold" else self.kind


@dataclass
class Calibration:
    """full ≈ intercept + slope * cheap, with residual sd `sigma`, fitted on `rows` reconstructed rows.
    `coverage`: the share of those rows whose leave-one-out residual lies within `z` leave-one-out
    sds (None under 4 rows): near Phi's two-sided coverage at `z` (0.95 at 1.96) when sigma is honest."""

    intercept: float
    slope: float
    sigma: float
    rows: int
    coverage: float | None = None

    def predict(self, cheap: np.ndarray) -> np.ndarray:
        return self.intercept + self.slope * cheap


def calibrate(cheap: np.ndarray, full: np.ndarray, z: float = DEFAULT_Z) -> Calibration:
    """Least squares of full on cheap; sigma from the residuals with n - 2 degrees of freedom.
    Under 3 rows, or cheap scores all equal, there is nothing to fit: the cheap score says
    nothing, so sigma is infinite and every row stays open. The coverage check leaves each row
    out in turn, in closed form: its residual from the line fitted without it is e / (1 - h), h its
    leverage, and the sd without it has (n - 2) sigma^2 - e^2 / (1 - h) over n - 3 degrees of freedom."""
    n = len(cheap)
    if n < 3 or float(np.ptp(cheap)) == 0.0:
        return Calibration(float(np.mean(full)) if n else 0.0, 0.0, math.inf, n)
    slope, intercept = np.polyfit(cheap, full, 1)
    residuals = full - (intercept + slope * cheap)
    sigma = float(np.sqrt(np.sum(residuals ** 2) / (n - 2)))
    coverage = None
    leverage = 1 / n + (cheap - cheap.mean()) ** 2 / float(np.sum((cheap - cheap.mean()) ** 2))
    # a row alone at its cheap score (leverage 1) leaves a line without a slope: it has no test
    testable = leverage < 1 - 1e-9
    if n >= 4 and testable.any():
        h, e = leverage[testable], residuals[testable]
        left_out = e / (1 - h)
        sd_left_out = np.sqrt(np.maximum((n - 2) * sigma ** 2 - e * left_out, 0.0) / (n - 3))
        coverage = float(np.mean(np.abs(left_out) <= z * sd_left_out))
    return Calibration(float(intercept), float(slope), sigma, n, coverage)


@dataclass
class ImageEffects:
    """The residuals (full - prediction) split as a per-image offset plus a row's own error: one-way
    random effects, fitted on the reconstructed rows. `within`: the variance of a row's own error
    (the pooled variance of residuals about their image's mean residual); `between`: the offsets'
    variance, what is left of the calibration's sigma^2 (0 when the images share nothing);
    `offset`, `offset_var`: per image, its offset's estimate from its reconstructed rows and that
    estimate's variance (see `image_effects`)."""

    within: float
    between: float
    offset: dict[str, float]
    offset_var: dict[str, float]

    def shift(self, group: str) -> float:
        return self.offset.get(group, 0.0)

    def shared(self, group: str) -> float:
        """The variance an unreconstructed row of `group` shares with its siblings: its image's offset's."""
        return self.offset_var.get(group, self.between)


def image_effects(groups: Sequence[str], residuals: dict[int, float], sigma: float) -> ImageEffects:
    """`groups`: each row's image; `residuals`: row -> full - prediction, for the reconstructed rows;
    `sigma`: the calibration's residual sd (sigma^2 = between + within). The within variance is
    pooled over images with 2+ reconstructed rows (sum of squares about each image's mean residual
    over the sum of (n - 1)); with under `MIN_WITHIN_FREEDOM` degrees of freedom, the rows are taken as independent (within = sigma^2,
    between = 0), which is the widest a difference of two rows of one image can be. An image with n
    reconstructed rows of mean residual r has the offset's best linear predictor
    r * n * between / (n * between + within), with variance between * within / (n * between + within)
    (`between` with none: its offset unknown, as wide as any image's)."""
    if not math.isfinite(sigma):  # nothing fitted yet: every row open, nothing to share
        return ImageEffects(math.inf, 0.0, {}, {})
    members: dict[str, list[float]] = {}
    for i, e in residuals.items():
        members.setdefault(groups[i], []).append(e)
    squares = sum(float(np.sum((np.array(v) - np.mean(v)) ** 2)) for v in members.values())
    freedom = sum(len(v) - 1 for v in members.values())
    within = squares / freedom if freedom >= MIN_WITHIN_FREEDOM else sigma ** 2
    between = max(0.0, sigma ** 2 - within)
    offset, offset_var = {}, {}
    for g, v in members.items():
        weight = len(v) * between + within
        offset[g] = float(np.mean(v)) * len(v) * between / weight if weight > 0 else 0.0
        offset_var[g] = between * within / weight if weight > 0 else 0.0
    return ImageEffects(within, between, offset, offset_var)


def margins(decision: Decision, value: np.ndarray, sd: np.ndarray, groups: Sequence[str],
            shared: np.ndarray | None = None) -> np.ndarray:
    """Per row, how many sds its decision is from changing (inf: settled whatever the full score).
    `value`, `sd`: each row's decision score and its uncertainty (0 once reconstructed); `groups`:
    the image of each row (best-of-n); `shared`: per row, the variance of its error that the
    unreconstructed rows of its image share (their image's offset: `ImageEffects.shared`; 0 for a
    reconstructed row; None: nothing shared). Rank here is of the rows themselves (systems:
    `system_margins`). In best-of-n a challenger is open while its difference from its image's leader
    is within z sds *of that difference*: sqrt(sd_i^2 + sd_leader^2 - 2 cov), cov the variance both
    share, since the pick reads only the difference."""
    n = len(value)
    out = np.full(n, math.inf)
    shared = np.zeros(n) if shared is None else shared
    with np.errstate(divide="ignore", invalid="ignore"):
        if decision.kind == "threshold":
            out = np.where(sd > 0, np.abs(value - decision.threshold) / sd, math.inf)
        elif decision.kind == "best-of-n":
            by_group: dict[str, list[int]] = {}
            for i, g in enumerate(groups):
                by_group.setdefault(g, []).append(i)
            for members in by_group.values():
                if len(members) < 2:
                    continue
                leader = max(members, key=lambda i: value[i])
                for i in members:
                    if i == leader:
                        continue
                    common = math.sqrt(shared[i] * shared[leader])  # 0 when either is reconstructed
                    spread = math.sqrt(max(sd[i] ** 2 + sd[leader] ** 2 - 2 * common, 0.0))
                    m = (value[leader] - value[i]) / spread if spread > 0 else math.inf
                    out[i] = min(out[i], m)
                    out[leader] = min(out[leader], m)  # the leader is open while any challenger is
        else:  # rank of the rows
            out = _swap_margins(value, sd)
    out = np.where(sd > 0, out, math.inf)  # a reconstructed row has nothing left to learn
    return out


def _swap_margins(mean: np.ndarray, sd: np.ndarray, block: int = 1024) -> np.ndarray:
    """Per unit, the z whose normal tail Phi(-z) is its mean probability of swapping places with each
    other unit: what its share of a Kendall tau's discordant pairs is expected to be. A unit that
    could swap with many is as open as one sitting next to a single close neighbour. In blocks of
    rows, so that ten thousand units do not ask for 10^8 floats at once."""
    from scipy.special import ndtr, ndtri

    units = len(mean)
    if units < 2:
        return np.full(units, math.inf)
    swaps = np.empty(units)
    for start in range(0, units, block):
        rows = np.arange(start, min(start + block, units))
        gap = np.abs(mean[rows, None] - mean[None, :])
        spread = np.hypot(sd[rows, None], sd[None, :])
        with np.errstate(divide="ignore", invalid="ignore"):
            chance = np.where(spread > 0, ndtr(-gap / spread), 0.0)
        chance[np.arange(len(rows)), rows] = 0.0  # a unit does not swap with itself
        swaps[rows] = chance.sum(axis=1) / (units - 1)
    with np.errstate(divide="ignore"):
        return np.where(swaps > 0, -ndtri(swaps), math.inf)


@dataclass
class SystemMeans:
    """Each system's mean full score by the difference estimator, its standard error, and its counts."""

    names: list[str]
    mean: np.ndarray
    se: np.ndarray
    rows: np.ndarray
    reconstructed: np.ndarray
    residual_mean: np.ndarray  # the mean of (full - prediction) over the system's reconstructed rows
    sigma: float  # the residual sd pooled within systems

    def ranks(self) -> np.ndarray:
        """1 for the highest mean; ties by name order."""
        return np.argsort(np.argsort(-self.mean, kind="stable"), kind="stable") + 1


def system_means(systems: Sequence[str], predicted: np.ndarray, full: dict[int, float]) -> SystemMeans:
    """Per system s with N rows, n of them reconstructed (a simple random sample of its rows), the
    mean of the full score over all N: mean(predicted over N) + mean(full - predicted over n), the
    difference estimator (unbiased for any calibration, which only narrows it). Its standard error:
    sigma_w * sqrt((1 - n / N) / n), sigma_w the residuals' sd about their system's mean residual,
    pooled over systems (sum of squares over sum of (n - 1)), so that a system with two or three
    reconstructed rows does not rest on its own sd. Infinite with n = 0, or before any pooled sd;
    0 once every row of the system is reconstructed."""
    names = sorted(set(systems))
    index = {name: k for k, name in enumerate(names)}
    members: list[list[int]] = [[] for _ in names]
    for i, name in enumerate(systems):
        members[index[name]].append(i)
    k = len(names)
    mean, se = np.empty(k), np.empty(k)
    rows = np.array([len(m) for m in members])
    reconstructed = np.array([sum(i in full for i in m) for m in members])
    residual_mean = np.zeros(k)
    squares, freedom = 0.0, 0
    for s, m in enumerate(members):
        residuals = np.array([full[i] - predicted[i] for i in m if i in full])
        if len(residuals):
            residual_mean[s] = residuals.mean()
            squares += float(np.sum((residuals - residual_mean[s]) ** 2))
            freedom += len(residuals) - 1
    sigma = math.sqrt(squares / freedom) if freedom else math.inf
    for s, m in enumerate(members):
        mean[s] = float(np.mean(predicted[m])) + residual_mean[s]
        se[s] = standard_error(sigma, int(reconstructed[s]), int(rows[s]))
    return SystemMeans(names, mean, se, rows, reconstructed, residual_mean, sigma)


def standard_error(sigma: float, n: int, size: int) -> float:
    """The difference estimator's standard error of a mean over `size` rows, n of them reconstructed:
    sigma * sqrt((1 - n / size) / n); 0 once all are, infinite with none or without a sigma."""
    if n == size:
        return 0.0
    if n == 0 or math.isinf(sigma):
        return math.inf
    return sigma * math.sqrt((1 - n / size) / n)


def _swap_chance(gap: np.ndarray, se: float, others: np.ndarray) -> np.ndarray:
    """Phi(-|gap| / sd of the difference) per other system: the chance the two estimates come out in the
    wrong order; a pair both known exactly cannot swap (1/2 if their means are equal)."""
    from scipy.special import ndtr

    spread = np.hypot(se, others)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(spread > 0, ndtr(-np.abs(gap) / spread), np.where(gap == 0, 0.5, 0.0))


def allocation(means: SystemMeans, open_systems: Sequence[int], rows: int) -> list[int]:
    """Which systems the next `rows` reconstructions go to (a system index per row, in the order to
    take them): each step takes, among the open systems, the move that lowers the expected number of
    system pairs in the wrong order (`_swap_chance` summed over pairs, at the current means and the
    pooled sigma) the most per row; a move is one more row of a system, or all its rows left at once
    (two systems whose means nearly agree gain nothing from one row more, only from being whole).
    So rows go where intervals overlap, sized to the gaps and the rows each system has left. When no
    move lowers it (no sigma yet; or every open pair's gap beyond reach), the open systems take
    rows in turn."""
    taken = [int(n) for n in means.reconstructed]
    sizes = [int(n) for n in means.rows]
    se = np.array([standard_error(means.sigma, taken[s], sizes[s]) for s in range(len(taken))])
    order: list[int] = []
    while len(order) < rows:
        best, best_gain = None, 0.0
        for s in open_systems:
            others = np.arange(len(taken)) != s
            now = float(np.sum(_swap_chance(means.mean[others] - means.mean[s], se[s], se[others])))
            for extra in {1, sizes[s] - taken[s]}:
                if not 0 < extra <= min(rows - len(order), sizes[s] - taken[s]):
                    continue
                after = standard_error(means.sigma, taken[s] + extra, sizes[s])
                gain = (now - float(np.sum(_swap_chance(means.mean[others] - means.mean[s], after, se[others])))) / extra
                if gain > best_gain:
                    best, best_gain = (s, extra), gain
        if best is None:
            break
        s, extra = best
        order += [s] * extra
        taken[s] += extra
        se[s] = standard_error(means.sigma, taken[s], sizes[s])
    left = [s for s in open_systems if taken[s] < sizes[s]]
    while left and len(order) < rows:  # in turn, as far as rows are left
        for s in left[: rows - len(order)]:
            order.append(s)
            taken[s] += 1
        left = [s for s in left if taken[s] < sizes[s]]
    return order


def system_margins(means: SystemMeans) -> np.ndarray:
    """Per system, the smallest gap to another system's mean in units of the sum of their standard
    errors: its z-interval overlaps that system's when this is under z (inf: settled)."""
    k = len(means.names)
    out = np.full(k, math.inf)
    for s in range(k):
        for t in range(k):
            reach = means.se[s] + means.se[t]
            if t != s and reach > 0:
                out[s] = min(out[s], abs(means.mean[s] - means.mean[t]) / reach)
    return out
