"""The cascade (`caprecon.apps.cascade`): cheap scores first, the full metric only where the decision
is open. The full metric is the seeded stand-in with no seed noise, so each caption's full score is
known and its generator counts every image; the cheap metric reads a number fixed per caption. The
residuals full - cheap alternate +-0.01, so the calibration's sd is about 0.01 and which rows are
open is decided by hand below."""

import math
from pathlib import Path

import numpy as np
import pytest
from noisy_standin import NoisyGenerator, NoisyScore

import caprecon
from caprecon.apps.cascade import cascade
from caprecon.apps.cascade.estimates import (Decision, SystemMeans, allocation, calibrate, image_effects, margins,
                                              system_margins, system_means)
from caprecon.core.errors import ConfigError
from caprecon.metrics.base import Metric

RESIDUAL = 0.01


class Fixed(Metric):
    """A cheap signal: the number the test set for each caption; counts the rows it scored."""

    name = primary = "cheap"
    needs_source_image = False

    def __init__(self, values):
        self.values, self.rows = values, 0

    def score(self, items, ctx):
        self.rows += len(items)
        return [{"cheap": self.values[item.caption]} for item in items]


def _setup(cheap_values):
    """(rows, cheap metric, full metric, generator): full = cheap + (+-RESIDUAL by row parity)."""
    captions = list(cheap_values)
    full = {c: cheap_values[c] + (RESIDUAL if k % 2 == 0 else -RESIDUAL) for k, c in enumerate(captions)}
    generator = NoisyGenerator({c: (v, 0.0) for c, v in full.items()})
    rows = [{"id": f"r{k}", "caption": c, "image_id": c.split("/")[0]} for k, c in enumerate(captions)]
    return rows, Fixed(cheap_values), NoisyScore(generator), generator, full


def test_calibration_by_hand():
    # full = 1 + 2 * cheap + r, r = (0.1, -0.1, -0.1, 0.1) orthogonal to 1 and cheap: the fit is exact
    c = calibrate(np.array([0.0, 1.0, 2.0, 3.0]), np.array([1.1, 2.9, 4.9, 7.1]))
    assert (c.intercept, c.slope) == pytest.approx((1.0, 2.0))
    assert c.sigma == pytest.approx(math.sqrt(4 * 0.01 / 2))  # n - 2 = 2 degrees of freedom
    assert math.isinf(calibrate(np.array([0.5, 0.5, 0.5]), np.array([0.1, 0.2, 0.3])).sigma)  # cheap says nothing
    assert calibrate(np.array([0.0, 1.0, 2.0]), np.array([0.0, 1.0, 2.1])).coverage is None  # under 4 rows
    # the row at cheap 1 is alone there: left out, no slope is left, so it is not tested. Row 0 left out:
    # the line through (0, 0) and (1, 1) predicts it exactly (sd sqrt(0.02 / 1)): covered; row 1 left out:
    # the line through (0, -0.05) misses 0.1 by 0.15, beyond 1.96 sqrt(0.005 / 1) = 0.139; row 2 alike
    with np.errstate(all="raise"):
        alone = calibrate(np.array([0.0, 0.0, 0.0, 1.0]), np.array([0.0, 0.1, -0.1, 1.0]))
    assert alone.coverage == pytest.approx(1 / 3)


def test_calibration_coverage_leaves_each_row_out():
    """The coverage against a reference that refits the line without each row: ten rows on
    full = 2 * cheap +- 0.01, one of them 1.0 off. Left out, the outlier lies far outside the
    others' interval; each other row, left out, is judged with the outlier's sd in the fit and
    lies inside: 9 of 10 covered."""
    cheap = np.arange(10, dtype=float)
    full = 2 * cheap + np.where(np.arange(10) % 2 == 0, 0.01, -0.01)
    full[6] += 1.0
    covered = []
    for i in range(10):
        keep = np.arange(10) != i
        slope, intercept = np.polyfit(cheap[keep], full[keep], 1)
        rest = full[keep] - (intercept + slope * cheap[keep])
        sd = math.sqrt(np.sum(rest ** 2) / (9 - 2))
        covered.append(abs(full[i] - (intercept + slope * cheap[i])) <= 1.96 * sd)
    assert covered == [True] * 6 + [False] + [True] * 3
    assert calibrate(cheap, full).coverage == pytest.approx(0.9)
    # z narrows the interval: at z = 0.5 some rows near the line fall out too, as the refits say
    expected = []
    for i in range(10):
        keep = np.arange(10) != i
        slope, intercept = np.polyfit(cheap[keep], full[keep], 1)
        sd = math.sqrt(np.sum((full[keep] - (intercept + slope * cheap[keep])) ** 2) / 7)
        expected.append(abs(full[i] - (intercept + slope * cheap[i])) <= 0.5 * sd)
    assert calibrate(cheap, full, z=0.5).coverage == pytest.approx(np.mean(expected))
    assert 0 < np.mean(expected) < 0.9
    # each row's |left-out residual| / left-out sd by the refits: a z just above the k-th smallest covers k + 1 rows
    ratios = []
    for i in range(10):
        keep = np.arange(10) != i
        slope, intercept = np.polyfit(cheap[keep], full[keep], 1)
        sd = math.sqrt(np.sum((full[keep] - (intercept + slope * cheap[keep])) ** 2) / 7)
        ratios.append(abs(full[i] - (intercept + slope * cheap[i])) / sd)
    for k, ratio in enumerate(sorted(ratios)):
        assert calibrate(cheap, full, z=ratio * 1.001).coverage == pytest.approx((k + 1) / 10)


def test_margins_by_hand():
    sd = np.array([0.1, 0.1, 0.0, 0.1])
    value = np.array([0.45, 0.9, 0.5, 0.3])
    th = margins(Decision.parse("threshold:0.5"), value, sd, ["a"] * 4)
    assert th[0] == pytest.approx(0.5) and th[1] == pytest.approx(4.0) and math.isinf(th[2])
    assert th[3] == pytest.approx(2.0)
    # best-of-n reads the difference of a challenger and its leader: image a = rows 0, 1 (leader 1), each
    # sd 0.1, independent: the difference 0.45 has sd sqrt(0.01 + 0.01); image b = rows 2, 3 (leader 2,
    # known exactly): the difference 0.2 has row 3's sd 0.1
    best = margins(Decision.parse("best-of-n"), value, sd, ["a", "a", "b", "b"])
    assert best[0] == pytest.approx(0.45 / math.sqrt(0.02)) == best[1]
    assert math.isinf(best[2])  # known exactly: nothing to learn
    assert best[3] == pytest.approx(0.2 / 0.1)
    # rows 0 and 1 share an image offset of variance 0.006: it cancels in their difference, whose variance is
    # 0.01 + 0.01 - 2 * 0.006; row 3 shares nothing with its known leader (a reconstructed row shares 0)
    shared = margins(Decision.parse("best-of-n"), value, sd, ["a", "a", "b", "b"], np.array([0.006, 0.006, 0, 0.006]))
    assert shared[0] == pytest.approx(0.45 / math.sqrt(0.008)) == shared[1]
    assert shared[3] == pytest.approx(0.2 / 0.1)
    # three captions of one image: the leader takes the smallest of its challengers' margins
    trio = margins(Decision.parse("best-of-n"), np.array([0.5, 0.4, 0.1]), np.array([0.1, 0.05, 0.1]), ["x"] * 3)
    assert trio[1] == pytest.approx(0.1 / math.sqrt(0.0125)) == trio[0]
    assert trio[2] == pytest.approx(0.4 / math.sqrt(0.02))
    # rank of the rows: three captions, sd 1: a and b level (swap chance 1/2), c 10 above (chance ~0):
    # a's mean chance is 1/4
    three = margins(Decision.parse("rank"), np.array([0.0, 0.0, 10.0]), np.ones(3), ["a", "b", "c"])
    assert three[0] == pytest.approx(0.67449, abs=1e-4) == three[1]  # Phi(-0.67449) = 0.25
    assert three[2] == pytest.approx(10 / math.sqrt(2), abs=0.02)  # its two chances alike: Phi(-10/sqrt 2)


def test_image_effects_by_hand():
    """Residuals of reconstructed rows in images a (rows 0-3: 0.01, 0.03, 0.02, 0.04, mean 0.025), b (rows 4-6:
    -0.02, 0.0, -0.01, mean -0.01) and c (row 7: 0.05, alone); row 8 of image d has none. Within: squares
    about each image's mean, (0.015^2 + 0.005^2) * 2 + 0.01^2 * 2 = 0.0007, over (4 - 1) + (3 - 1) = 5
    degrees of freedom; between: sigma^2 - within."""
    groups = ["a"] * 4 + ["b"] * 3 + ["c", "d"]
    residuals = {0: 0.01, 1: 0.03, 2: 0.02, 3: 0.04, 4: -0.02, 5: 0.0, 6: -0.01, 7: 0.05}
    sigma = 0.02
    e = image_effects(groups, residuals, sigma)
    within = 0.0007 / 5
    between = sigma ** 2 - within
    assert e.within == pytest.approx(within) and e.between == pytest.approx(between)
    for image, n, mean in (("a", 4, 0.025), ("b", 3, -0.01), ("c", 1, 0.05)):
        weight = n * between + within
        assert e.shift(image) == pytest.approx(mean * n * between / weight)
        assert e.shared(image) == pytest.approx(between * within / weight)
    assert e.shift("d") == 0.0 and e.shared("d") == pytest.approx(between)  # nothing known of d: as wide as any
    # under MIN_WITHIN_FREEDOM (5) degrees of freedom: rows taken as independent, nothing shared
    fewer = image_effects(groups, {k: v for k, v in residuals.items() if k != 6}, sigma)
    assert fewer.within == pytest.approx(sigma ** 2) and fewer.between == 0.0 and fewer.shift("a") == 0.0
    assert fewer.shared("d") == 0.0
    # residuals spread more within images than sigma says: no image effect (between clipped at 0)
    assert image_effects(groups, residuals, 0.005).between == 0.0
    assert math.isinf(image_effects(groups, residuals, math.inf).within)


def test_best_of_n_shifts_siblings_by_their_image_offset(tmp_path):
    """Each image's captions share one residual (full = cheap + image offset +- 0.002): once a caption of an
    image is reconstructed, its unreconstructed siblings' decision scores carry the offset (shrunk by
    between / (between + within / n)), and their sd is the small within-image one, not sigma."""
    values = {}
    offsets = [0.05, -0.04, 0.01]
    for k in range(3):  # 36 rows: the calibration sample's 8 fall on at most 3 images, 5+ degrees of freedom
        values.update({f"img{k}/{c:02d}": 0.2 + 0.03 * c + 0.01 * k for c in range(12)})
    captions = list(values)
    full = {c: values[c] + offsets[int(c[3])] + (0.002 if n % 2 == 0 else -0.002) for n, c in enumerate(captions)}
    generator = NoisyGenerator({c: (v, 0.0) for c, v in full.items()})
    rows = [{"id": c, "caption": c, "image_id": c.split("/")[0]} for c in captions]
    result = cascade(rows, cheap=Fixed(values), metric=NoisyScore(generator), decision="best-of-n", budget=0.25,
                     rounds=1, cache_dir=str(tmp_path / "cache"))
    recon = {r["id"]: r for r in result.records if r["reconstructed"]}
    assert generator.calls == len(recon) == 8  # the calibration sample alone (one round)
    cheap = np.array([values[c] for c in recon])
    truth = np.array([full[c] for c in recon])
    slope, intercept = np.polyfit(cheap, truth, 1)
    residual = {c: full[c] - (intercept + slope * values[c]) for c in recon}
    sigma = math.sqrt(sum(e ** 2 for e in residual.values()) / (len(recon) - 2))
    by_image: dict[str, list[float]] = {}
    for c, e in residual.items():
        by_image.setdefault(c.split("/")[0], []).append(e)
    freedom = sum(len(v) - 1 for v in by_image.values())
    assert freedom >= 5  # enough siblings for a within-image variance
    within = sum(sum((x - np.mean(v)) ** 2 for x in v) for v in by_image.values()) / freedom
    between = max(sigma ** 2 - within, 0.0)
    assert between > 3 * within  # the images' offsets are most of the residual
    for r in result.records:
        if r["reconstructed"]:
            continue
        image = r["id"].split("/")[0]
        known = by_image.get(image, [])
        weight = len(known) * between + within
        offset = np.mean(known) * len(known) * between / weight if known else 0.0
        assert r["decision_score"] == pytest.approx(intercept + slope * values[r["id"]] + offset)
        assert r["decision_sd"] == pytest.approx(math.sqrt(within + between * within / weight))


def test_system_means_by_hand():
    """Difference estimator: system x = rows 0-3 (predictions 0.5, 0.6, 0.7, 0.8; rows 0, 1 reconstructed
    at 0.6, 0.8: residuals 0.1, 0.2), system y = rows 4-6 (predictions 0.2, 0.2, 0.2; row 4 at 0.1:
    residual -0.1), system z = rows 7, 8 (nothing reconstructed), system w = row 9 (reconstructed: 0.3)."""
    predicted = np.array([0.5, 0.6, 0.7, 0.8, 0.2, 0.2, 0.2, 0.9, 0.9, 0.4])
    full = {0: 0.6, 1: 0.8, 4: 0.1, 9: 0.3}
    m = system_means(["x"] * 4 + ["y"] * 3 + ["z"] * 2 + ["w"], predicted, full)
    assert m.names == ["w", "x", "y", "z"]
    # x: mean prediction 0.65 + mean residual 0.15; y: 0.2 - 0.1; w: its one row, known
    assert m.mean == pytest.approx([0.3, 0.8, 0.1, 0.9])
    # pooled within systems: x's residuals 0.1, 0.2 about 0.15 (1 degree of freedom), y and w none
    sigma = math.sqrt(0.05 ** 2 * 2 / 1)
    assert m.sigma == pytest.approx(sigma)
    assert m.se[0] == 0.0 and math.isinf(m.se[3])  # w wholly known; z has no residual yet
    assert m.se[1] == pytest.approx(sigma * math.sqrt((1 - 2 / 4) / 2))
    assert m.se[2] == pytest.approx(sigma * math.sqrt((1 - 1 / 3) / 1))
    assert list(m.ranks()) == [3, 2, 4, 1]
    assert list(system_margins(m)) == [0.0] * 4  # z's interval is the whole line: it overlaps every other
    m = system_means(["x"] * 4 + ["y"] * 3 + ["w"], predicted[[0, 1, 2, 3, 4, 5, 6, 9]], {0: 0.6, 1: 0.8, 4: 0.1, 7: 0.3})
    se_x, se_y = m.se[1], m.se[2]
    # w (0.3, se 0) against y (0.1): 0.2 / se_y, against x (0.8): 0.5 / se_x; x against y: 0.7 / (se_x + se_y)
    assert system_margins(m) == pytest.approx([min(0.2 / se_y, 0.5 / se_x), min(0.5 / se_x, 0.7 / (se_x + se_y)),
                                               min(0.2 / se_y, 0.7 / (se_x + se_y))])
    assert list(system_margins(system_means(["x", "x"], np.zeros(2), {0: 1.0, 1: 2.0}))) == [math.inf]  # alone
    # one row a system, each reconstructed: no pooled sd (0 degrees of freedom), yet each mean is known exactly
    known = system_means(["x", "y"], np.zeros(2), {0: 0.4, 1: 0.6})
    assert math.isinf(known.sigma) and list(known.se) == [0.0, 0.0] and list(known.mean) == [0.4, 0.6]


def _reference_allocation(mean, sizes, taken, sigma, open_systems, rows):
    """The greedy allocation written out plainly: at each step every move (one row of an open system,
    or all its rows left) is tried, the expected pairs in the wrong order summed over every pair with
    scipy's normal cdf, and the largest drop per row taken."""
    from scipy.stats import norm

    def se(n, size):
        return 0.0 if n == size else sigma * math.sqrt((1 - n / size) / n)

    def wrong(counts):
        total = 0.0
        for a in range(len(mean)):
            for b in range(a + 1, len(mean)):
                spread = math.hypot(se(counts[a], sizes[a]), se(counts[b], sizes[b]))
                total += norm.cdf(-abs(mean[a] - mean[b]) / spread) if spread else 0.0
        return total

    taken, picked = list(taken), []
    while len(picked) < rows:
        moves = [(s, extra) for s in open_systems for extra in sorted({1, sizes[s] - taken[s]})
                 if 0 < extra <= rows - len(picked) and taken[s] + extra <= sizes[s]]
        gains = [(wrong(taken) - wrong([n + extra * (k == s) for k, n in enumerate(taken)])) / extra
                 for s, extra in moves]
        s, extra = moves[int(np.argmax(gains))]
        picked += [s] * extra
        taken[s] += extra
    return picked


def test_allocation_by_the_gaps():
    """Systems a, b, d overlap (means 0.50, 0.52, 0.535), c lies far above (0.90: 7 sds of a difference away):
    the allocation follows the greedy rule written out plainly, and gives c nothing."""
    mean = np.array([0.50, 0.52, 0.90, 0.535])
    sizes, taken, sigma = [20, 17, 20, 6], [2, 2, 2, 2], 0.05
    means = SystemMeans(["a", "b", "c", "d"], mean, np.zeros(4), np.array(sizes), np.array(taken), np.zeros(4), sigma)
    picked = allocation(means, [0, 1, 2, 3], 30)
    assert picked == _reference_allocation(mean, sizes, taken, sigma, [0, 1, 2, 3], 30)
    assert len(picked) == 30 and 2 not in picked and {0, 1, 3} <= set(picked)
    assert picked.count(3) <= 4  # d has 4 rows left
    # a near-tie of two small systems gains only from both being whole: the whole-system move takes them
    tie = SystemMeans(["x", "y"], np.array([0.5, 0.5001]), np.zeros(2), np.array([6, 6]), np.array([2, 2]),
                      np.zeros(2), 0.05)
    assert allocation(tie, [0, 1], 8) == _reference_allocation([0.5, 0.5001], [6, 6], [2, 2], 0.05, [0, 1], 8)
    assert sorted(allocation(tie, [0, 1], 8)) == [0] * 4 + [1] * 4
    # no sigma yet: no move lowers anything, the open systems take rows in turn (in the order given)
    blind = SystemMeans(["a", "b", "c", "d"], mean, np.zeros(4), np.array(sizes), np.array(taken), np.zeros(4),
                        math.inf)
    assert allocation(blind, [3, 0], 11) == [3, 0, 3, 0, 3, 0, 3, 0, 0, 0, 0]  # d has 4 rows left


def test_threshold_reconstructs_only_rows_near_it(tmp_path):
    cheap_values = {f"img{k}/caption {k}": k / 40 for k in range(40)}  # 0.000, 0.025, ..., 0.975
    rows, cheap, full_metric, generator, full = _setup(cheap_values)
    result = cascade(rows, cheap=cheap, metric=full_metric, decision="threshold:0.5", budget=1.0,
                     cache_dir=str(tmp_path / "cache"))
    assert cheap.rows == 40  # the cheap signal scores every row
    recon = [r for r in result.records if r["reconstructed"]]
    assert generator.calls == len(recon) == result.generations == result.reconstructed  # one seed a row
    assert result.full_generations == 40
    first = [r for r in recon if r["cascade_round"] == 1]
    assert len(first) == 8  # the calibration sample: max(8, 40 // 20)
    # sigma ~ 0.0103 (residuals +-0.01 about the fitted line): open within 1.96 sd ~ 0.02 of 0.5
    later = [r for r in recon if r["cascade_round"] > 1]
    assert all(abs(r["cheap"] - 0.5) < 0.03 for r in later)
    near = {c for c, v in cheap_values.items() if abs(v - 0.5) < 0.01}  # cheap 0.5 exactly
    assert near <= {r["caption"] for r in recon}
    # every keep/drop equals the full metric's (full = cheap +- 0.01: only 0.5's row is near enough to flip)
    assert all(r["keep"] == (full[r["caption"]] >= 0.5) for r in result.records)
    assert len(recon) <= 8 + 3


def test_best_of_n_settles_wide_margins_without_generation(tmp_path):
    values = {}
    for k in range(8):  # wide: 0.9 beats 0.5 by 40 sds
        values.update({f"wide{k}/a": 0.9, f"wide{k}/b": 0.5, f"wide{k}/c": 0.1 + 0.001 * k})
    for k in range(2):  # close: 0.600 and 0.595 differ by less than their residuals
        values.update({f"close{k}/a": 0.600, f"close{k}/b": 0.595, f"close{k}/c": 0.1})
    rows, cheap, full_metric, generator, full = _setup(values)
    # parity: close/a gets -0.01 and close/b +0.01 where their row numbers are odd and even
    result = cascade(rows, cheap=cheap, metric=full_metric, decision="best-of-n", budget=1.0,
                     cache_dir=str(tmp_path / "cache"))
    recon = [r for r in result.records if r["reconstructed"]]
    assert generator.calls == len(recon)
    after_calibration = {r["caption"] for r in recon if r["cascade_round"] > 1}
    assert after_calibration and all(c.startswith("close") for c in after_calibration)
    assert {c for c in values if c.startswith("close") and not c.endswith("/c")} <= {r["caption"] for r in recon}
    for image in {c.split("/")[0] for c in values}:
        members = [r for r in result.records if r["caption"].startswith(image + "/")]
        truth = max(members, key=lambda r: full[r["caption"]])["caption"]
        assert [r["caption"] for r in members if r["best"]] == [truth]


def _systems(offsets: dict[str, tuple[float, float, int]]):
    """Rows of systems, 20 each: system s's k-th caption has cheap `base + 0.001 k` and full
    `cheap + offset + sign * 0.01 * (-1)^k`; (rows, cheap metric, full metric, generator, true means)."""
    cheap_values, truth, rows, means = {}, {}, [], {}
    for name, (base, offset, sign) in offsets.items():
        values = []
        for k in range(20):
            caption = f"{name}{k}"
            cheap_values[caption] = base + 0.001 * k
            truth[caption] = (cheap_values[caption] + offset + sign * (0.01 if k % 2 == 0 else -0.01), 0.0)
            values.append(truth[caption][0])
            rows.append({"id": caption, "caption": caption, "image_id": caption, "system": name})
        means[name] = sum(values) / 20
    generator = NoisyGenerator(truth)
    return rows, Fixed(cheap_values), NoisyScore(generator), generator, means


def _first_round(rows, limit=None):
    """The calibration sample by its rule: each system's first 2 rows in the shuffled order, then the
    first max(8, n // 20) of the shuffled rows, the first `limit` of those."""
    import random

    order = list(range(len(rows)))
    random.Random(0).shuffle(order)
    per_system = [i for i in order if [rows[j]["system"] for j in order[: order.index(i) + 1]].count(
        rows[i]["system"]) <= 2]
    sample = per_system + [i for i in order[: max(8, len(rows) // 20)] if i not in per_system]
    return {rows[i]["id"] for i in sample[:limit]}


def test_rank_systems_settles_separated_systems_in_the_calibration_round(tmp_path):
    # the cheap signal orders a > b > c by 0.1 each; the full metric the other way round (offsets -0.2, 0, +0.2)
    rows, cheap, full_metric, generator, means = _systems({"a": (0.6, -0.2, 1), "b": (0.5, 0.0, 1),
                                                           "c": (0.4, 0.2, 1)})
    result = cascade(rows, cheap=cheap, metric=full_metric, decision="rank", by="system", budget=1.0,
                     cache_dir=str(tmp_path / "cache"))
    recon = {r["id"] for r in result.records if r["reconstructed"]}
    assert recon == _first_round(rows) and len(result.rounds) == 1  # no interval overlaps another after it
    assert result.rounds[0]["open"] == 0
    assert generator.calls == len(recon) == result.generations == result.reconstructed
    assert result.full_generations == 60 and cheap.rows == 60
    m = result.systems
    assert m.names == ["a", "b", "c"] and list(m.ranks()) == [3, 2, 1]
    for s, name in enumerate(m.names):  # unbiased: within 3 standard errors of the true mean
        assert 0 < m.se[s] < 0.02 and abs(m.mean[s] - means[name]) < 3 * m.se[s]
        members = [r for r in result.records if r["system"] == name]
        assert np.mean([r["decision_score"] for r in members]) == pytest.approx(m.mean[s])
        assert {r["system_rank"] for r in members} == {int(m.ranks()[s])}
    assert any(line.startswith("  rank 1: c") for line in result.closing_lines())
    assert result.summary["cascade"]["systems"]["c"]["rank"] == 1


def test_rank_systems_reconstructs_only_overlapping_systems(tmp_path):
    # d sits 0.004 above b on the same cheap scores (residuals of the other sign): only b and d stay open
    rows, cheap, full_metric, generator, means = _systems({"a": (0.6, -0.2, 1), "b": (0.5, 0.0, 1),
                                                           "c": (0.4, 0.2, 1), "d": (0.5, 0.004, -1)})
    assert means["d"] - means["b"] == pytest.approx(0.004)
    result = cascade(rows, cheap=cheap, metric=full_metric, decision="rank", by="system", budget=1.0, rounds=12,
                     cache_dir=str(tmp_path / "cache"))
    first = _first_round(rows)
    later = {r["id"] for r in result.records if r["reconstructed"]} - first
    # after the calibration round b and d overlap: at least their rows not yet reconstructed are open
    waiting = sum(r["system"] in ("b", "d") and r["id"] not in first for r in rows)
    assert waiting <= result.rounds[0]["open"] <= 80 - len(first)
    assert later and {r["system"] for r in result.records if r["id"] in later} == {"b", "d"}
    assert generator.calls == len(first) + len(later) == result.generations
    assert dict(zip(result.systems.names, result.systems.ranks())) == {"c": 1, "d": 2, "b": 3, "a": 4}
    # a budget of 6 rows: the calibration sample is each system's first 2, however the global order runs
    tight = cascade(rows[:60], cheap=cheap, metric=full_metric, decision="rank", by="system", budget=0.1,
                    cache_dir=str(tmp_path / "cache"))
    assert {r["id"] for r in tight.records if r["reconstructed"]} == _first_round(rows[:60], limit=6)
    assert list(tight.systems.reconstructed) == [2, 2, 2]
    with pytest.raises(ConfigError, match="--by system ranks systems"):
        cascade(rows, cheap=cheap, metric=full_metric, decision="best-of-n", by="system")


def test_budget_caps_generations(tmp_path):
    cheap_values = {f"img{k}/caption {k}": 0.5 + (k - 20) * 1e-4 for k in range(40)}  # every row near 0.5
    rows, cheap, full_metric, generator, _ = _setup(cheap_values)
    result = cascade(rows, cheap=cheap, metric=full_metric, decision="threshold:0.5", budget=0.25,
                     out=tmp_path / "run", cache_dir=str(tmp_path / "cache"))
    assert generator.calls == result.generations == 10  # 0.25 of 40, every row open
    assert result.full_generations == 40
    summary = (tmp_path / "run" / "summary.json").read_text()
    assert '"generations": 10' in summary and '"full_generations": 40' in summary
    assert len((tmp_path / "run" / "scores.jsonl").read_text().splitlines()) == 40
    # again in the same store: the generator makes nothing, the reconstructions needed are counted all the same
    again = cascade(rows, cheap=cheap, metric=full_metric, decision="threshold:0.5", budget=0.25,
                    cache_dir=str(tmp_path / "cache"))
    assert generator.calls == 10 and again.generations == 10 and again.model_calls["reused"] == 10


def test_bad_settings_refused_before_work():
    rows, cheap, full_metric, generator, _ = _setup({"a/x": 0.1, "b/y": 0.2})
    for decision in ("threshold:high", "top-3"):
        with pytest.raises(ConfigError, match="--decision"):
            cascade(rows, cheap=cheap, metric=full_metric, decision=decision)
    with pytest.raises(ConfigError, match="--budget"):
        cascade(rows, cheap=cheap, metric=full_metric, decision="rank", budget=1.5)
    assert cheap.rows == 0 and generator.calls == 0
    assert caprecon.cascade is cascade


def test_score_cascade_cli(tmp_path, tiny_clip, capsys):
    """`score --cascade`: the demo's 12 captions, clipscore (tiny CLIP) first, recon of the offline stand-in on at
    most a quarter of them; the closing lines and summary.json say what was used and what all rows would use."""
    import json

    from caprecon.cli import main

    demo = Path(caprecon.__file__).parent / "data" / "demo" / "captions.jsonl"
    code = main(["score", "-i", str(demo), "--preset", "offline", "--clip", str(tiny_clip), "-q",
                 "--cascade", "clipscore", "--decision", "threshold:0.6", "--budget", "0.25",
                 "--cache-dir", str(tmp_path / "cache"), "--out", str(tmp_path / "run")])
    printed = capsys.readouterr().out
    assert code == 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())["cascade"]
    assert summary["reconstructed"] == 3 == summary["generations"]  # int(0.25 * 12), one seed each
    assert summary["full_generations"] == 12 and summary["decision"] == "threshold:0.6"
    records = [json.loads(x) for x in (tmp_path / "run" / "scores.jsonl").read_text().splitlines()]
    assert sum(r["reconstructed"] for r in records) == 3
    assert all(r["keep"] == (r["decision_score"] >= 0.6) for r in records)
    assert all(r["decision_score"] == r["recon"] for r in records if r["reconstructed"])
    assert "rows decided: 12 of 12" in printed
    # the demo's `quality` field as systems: half the rows, each system's first 2 in the shuffle
    code = main(["score", "-i", str(demo), "--preset", "offline", "--clip", str(tiny_clip),
                 "--cascade", "clipscore", "--decision", "rank", "--by", "quality", "--budget", "0.5",
                 "--cache-dir", str(tmp_path / "cache"), "--out", str(tmp_path / "systems")])
    printed = capsys.readouterr().out
    assert code == 0
    systems = json.loads((tmp_path / "systems" / "summary.json").read_text())["cascade"]["systems"]
    assert sorted(systems) == ["faithful", "vague", "wrong"]
    assert [systems[q]["reconstructed"] for q in sorted(systems)] == [2, 2, 2]
    assert sorted(v["rank"] for v in systems.values()) == [1, 2, 3]
    records = [json.loads(x) for x in (tmp_path / "systems" / "scores.jsonl").read_text().splitlines()]
    for quality, v in systems.items():  # a system's mean is the mean of its rows' decision scores
        assert np.mean([r["decision_score"] for r in records if r["quality"] == quality]) == pytest.approx(v["mean"])
    assert "rank 1: " in printed and "decision rank --by quality" in printed
    assert main(["score", "-i", str(demo), "--decision", "rank", "--out", str(tmp_path / "other")]) == 2
    assert "--cascade CHEAP and --decision go together" in capsys.readouterr().err
