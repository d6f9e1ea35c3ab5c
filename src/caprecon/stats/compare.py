"""Is metric A's agreement with people significantly better than metric B's?

Paired bootstrap over images: each resample draws images with replacement, and both
metrics' statistics (Kendall τ for ratings, pairwise accuracy for pairs) are computed on
the same resampled judgments, so what varies is only which images were judged. The
two-sided p-value is twice the share of resamples on the far side of zero from the
observed difference (capped at 1), the usual percentile-bootstrap test.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Callable, Sequence

import numpy as np

from caprecon.data.judgments import Judgments
from caprecon.stats.meta import kendall_tau, pairwise_accuracy


@dataclass
class Comparison:
    metric_a: str
    metric_b: str
    statistic: str
    value_a: float
    value_b: float
    difference: float  # a - b
    ci_low: float
    ci_high: float
    p_value: float
    n_resamples: int
    level: float = 0.95

    def as_dict(self) -> dict:
        return asdict(self)


def agreement_statistic(
    judgments: Judgments, scores: Sequence[float], *, tau_variant: str | None = None, tie_credit: float = 0.5
) -> tuple[str, Callable[[np.ndarray], float], np.ndarray]:
    """(statistic name, statistic of observation indices, image of each observation).

    Observations are human judgments for ratings (a caption rated three times is three)
    and pairs for pair judgments, as in `caprecon.meta.run_meta`.
    """
    s = np.asarray(scores, float)
    if judgments.pairwise:
        a, b = s[0::2], s[1::2]
        pref = np.array([it.preference for it in judgments.items], float)
        ok = np.isfinite(a) & np.isfinite(b)

        def accuracy(idx: np.ndarray) -> float:
            idx = idx[ok[idx]]
            return pairwise_accuracy(a[idx], b[idx], pref[idx], tie_credit=tie_credit).accuracy

        return "accuracy", accuracy, np.array([it.image_id for it in judgments.items], dtype=object)
    variant = tau_variant or judgments.tau_variant
    item_of = np.array([k for k, it in enumerate(judgments.items) for _ in it.ratings])
    human = np.array([r for it in judgments.items for r in it.ratings], float)
    x = s[item_of]
    ok = np.isfinite(x)

    def tau(idx: np.ndarray) -> float:
        idx = idx[ok[idx]]
        return kendall_tau(x[idx], human[idx], variant)

    groups = np.array([it.image_id for it in judgments.items for _ in it.ratings], dtype=object)
    return f"tau_{variant}", tau, groups


def paired_bootstrap(
    judgments: Judgments,
    name_a: str,
    scores_a: Sequence[float],
    name_b: str,
    scores_b: Sequence[float],
    *,
    tau_variant: str | None = None,
    n_resamples: int = 1000,
    seed: int = 0,
    level: float = 0.95,
    tie_credit: float = 0.5,
) -> Comparison:
    statistic, stat_a, groups = agreement_statistic(judgments, scores_a, tau_variant=tau_variant, tie_credit=tie_credit)
    _, stat_b, _ = agreement_statistic(judgments, scores_b, tau_variant=tau_variant, tie_credit=tie_credit)
    everything = np.arange(len(groups))
    value_a, value_b = stat_a(everything), stat_b(everything)
    observed = value_a - value_b
    _, inverse = np.unique(groups.astype(str), return_inverse=True)
    order = np.argsort(inverse, kind="stable")
    members = np.split(order, np.cumsum(np.bincount(inverse))[:-1])
    rng = np.random.default_rng(seed)
    diffs = np.empty(n_resamples)
    for r in range(n_resamples):
        idx = np.concatenate([members[k] for k in rng.integers(0, len(members), len(members))])
        diffs[r] = stat_a(idx) - stat_b(idx)
    diffs = diffs[np.isfinite(diffs)]
    if not len(diffs) or not math.isfinite(observed):
        return Comparison(name_a, name_b, statistic, value_a, value_b, observed, math.nan, math.nan, math.nan, 0, level)
    tail = (1.0 - level) / 2.0
    low, high = np.quantile(diffs, [tail, 1.0 - tail])
    far_side = np.mean(diffs <= 0) if observed > 0 else np.mean(diffs >= 0)
    p_value = min(1.0, 2.0 * float(far_side))
    return Comparison(
        name_a, name_b, statistic, value_a, value_b, observed, float(low), float(high), p_value, len(diffs), level
    )


def format_comparison(c: Comparison) -> str:
    # No resample crossing zero bounds p by the resolution of the bootstrap, not by 0.
    p = f"p < {1 / c.n_resamples:.2g}" if c.p_value == 0 and c.n_resamples else f"p = {c.p_value:.4g}"
    return (
        f"{c.metric_a} vs {c.metric_b} ({c.statistic}): {c.value_a:.4f} - {c.value_b:.4f} = {c.difference:+.4f}, "
        f"{100 * c.level:g}% CI [{c.ci_low:.4f}, {c.ci_high:.4f}], {p} "
        f"(paired bootstrap over images, {c.n_resamples} resamples)"
    )
