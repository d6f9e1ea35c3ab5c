"""The one bootstrap (`caprecon.stats.bootstrap`), checked against values worked out by hand
from its explicit draws, and against scipy on the same draws.

The draws are the contract that keeps intervals reproducible: resample r draws the groups
`numpy.random.default_rng(seed).integers(0, n_groups, (n_resamples, n_groups))[r]`, groups
numbered in sorted order of their names.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from caprecon.stats.bootstrap import bootstrap_ci, bootstrap_tau, draws, paired_bootstrap

# Four rows in three groups: a holds rows 0 and 1, b row 2, c row 3.
GROUPS = ["a", "a", "b", "c"]
VALUES = np.array([1.0, 3.0, 5.0, 9.0])
# default_rng(1).integers(0, 3, (4, 3)), as numpy draws it
SEED_1_DRAWS = [[1, 1, 2], [2, 0, 0], [2, 2, 0], [0, 2, 1]]


def test_the_draws_are_numpys_seeded_integers():
    assert draws(3, 4, 1).tolist() == SEED_1_DRAWS


def test_percentile_interval_worked_by_hand():
    # Resample means from the draws above (a = 1, 3; b = 5; c = 9):
    #   b b c     -> 5 5 9          -> 19/3
    #   c a a     -> 9 1 3 1 3      -> 17/5 = 3.4
    #   c c a     -> 9 9 1 3        -> 22/4 = 5.5
    #   a c b     -> 1 3 9 5        -> 18/4 = 4.5
    # Sorted 3.4, 4.5, 5.5, 19/3. A 50% interval cuts at the 25th and 75th percentiles, which
    # linear interpolation puts at positions 0.75 and 2.25 of the four sorted values:
    #   low = 3.4 + 0.75 (4.5 - 3.4) = 4.225,  high = 5.5 + 0.25 (19/3 - 5.5) = 5.5 + 5/24.
    seen = []

    def mean(idx):
        seen.append(sorted(idx.tolist()))
        return float(VALUES[idx].mean())

    low, high = bootstrap_ci(mean, GROUPS, n_resamples=4, seed=1, level=0.5)
    assert (low, high) == pytest.approx((4.225, 5.5 + 5 / 24), rel=1e-12)
    # each drawn group brings all its rows, as often as it was drawn
    assert seen == [[2, 2, 3], [0, 0, 1, 1, 3], [0, 1, 3, 3], [0, 1, 2, 3]]


def test_paired_difference_and_p_value_worked_by_hand():
    # A = the mean, B = 4 on every resample: observed difference 4.5 - 4 = 0.5; resample
    # differences 19/3 - 4, -0.6, 1.5, 0.5. One of the four lies at or below zero, the far
    # side from the observed 0.5: p = 2 * 1/4. The 50% interval is the one above, shifted by -4.
    d = paired_bootstrap(lambda idx: float(VALUES[idx].mean()), lambda idx: 4.0, GROUPS, n_resamples=4, seed=1,
                         level=0.5)
    assert (d.value_a, d.value_b, d.difference) == (4.5, 4.0, 0.5)
    assert (d.ci_low, d.ci_high) == pytest.approx((0.225, 1.5 + 5 / 24), rel=1e-12)
    assert d.p_value == 0.5 and d.n_resamples == 4
    # a difference undefined on every resample has no interval and no p-value
    nothing = paired_bootstrap(lambda idx: float("nan"), lambda idx: 0.0, GROUPS, n_resamples=4, seed=1)
    assert np.isnan([nothing.ci_low, nothing.ci_high, nothing.p_value]).all() and nothing.n_resamples == 0


@pytest.mark.parametrize(("seed", "level"), [(0, 0.95), (3, 0.8)])
def test_one_row_per_group_equals_scipys_percentile_bootstrap(seed, level):
    # With every group a single row (names in row order), our resamples are scipy's: it draws
    # integers(0, n, (n_resamples, n)) from the generator it is given.
    x = np.array([0.3, 1.2, -0.7, 2.5, 0.9, 1.1, -0.2, 3.0, 0.4, 1.7, 0.0, 2.2])
    groups = [f"g{k:02d}" for k in range(len(x))]
    expected = stats.bootstrap((x,), np.mean, n_resamples=500, method="percentile", confidence_level=level,
                               rng=np.random.default_rng(seed)).confidence_interval
    ours = bootstrap_ci(lambda idx: float(x[idx].mean()), groups, n_resamples=500, seed=seed, level=level)
    assert ours == pytest.approx((expected.low, expected.high), rel=1e-12)


def test_vectorised_tau_of_one_resample_counted_by_hand():
    # Groups a: (x, y) = (1, 1), (2, 3); b: (4, 4); c: (3, 2). default_rng(2) draws c, a, a, so
    # the resample's rows are r1 (3, 2), r2 (1, 1), r3 (2, 3), r4 (1, 1), r5 (2, 3).
    # Of the 10 pairs: concordant r1r2 r1r4 r2r3 r2r5 r3r4 r4r5 (P = 6), discordant r1r3 r1r5
    # (Q = 2), tied in both x and y r2r4 r3r5 (n1 = n2 = 2).
    #   τ_b = (P - Q) / sqrt((10 - 2)(10 - 2)) = 4 / 8 = 0.5
    #   τ_c = 2 (P - Q) / (n² (m - 1) / m), n = 5, m = 3 levels of x and of y in the resample
    #       (b's level 4 was not drawn, though the full data has four): 8 / (25 · 2/3) = 0.48
    x = np.array([1.0, 2.0, 4.0, 3.0])
    y = np.array([1.0, 3.0, 4.0, 2.0])
    groups = ["a", "a", "b", "c"]
    assert draws(3, 1, 2).tolist() == [[2, 0, 0]]
    rows = [3, 0, 1, 0, 1]
    for variant, by_hand in (("b", 0.5), ("c", 0.48)):
        assert stats.kendalltau(x[rows], y[rows], variant=variant)[0] == pytest.approx(by_hand, rel=1e-12)
        low, high = bootstrap_tau(x, y, groups, variant=variant, n_resamples=1, seed=2)
        assert low == high == pytest.approx(by_hand, rel=1e-12)
