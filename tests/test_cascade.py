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
from caprecon.apps.cascade import Decision, calibrate, cascade, margins
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


def test_margins_by_hand():
    sd = np.array([0.1, 0.1, 0.0, 0.1])
    value = np.array([0.45, 0.9, 0.5, 0.3])
    th = margins(Decision.parse("threshold:0.5"), value, sd, ["a"] * 4)
    assert th[0] == pytest.approx(0.5) and th[1] == pytest.approx(4.0) and math.isinf(th[2])
    assert th[3] == pytest.approx(2.0)
    # best-of-n: image a = rows 0, 1 (leader 1: margin 0.45 / (0.1 * sqrt 2)); image b = rows 2, 3
    best = margins(Decision.parse("best-of-n"), value, sd, ["a", "a", "b", "b"])
    assert best[0] == pytest.approx(0.45 / math.hypot(0.1, 0.1)) == best[1]
    assert math.isinf(best[2])  # known exactly: nothing to learn
    assert best[3] == pytest.approx(0.2 / 0.1)
    # rank of systems x = rows 0, 3 (mean 0.375, sd sqrt(0.02) / 2) and y = rows 1, 2 (0.7, sd 0.05)
    rank = margins(Decision.parse("rank"), value, sd, ["a"] * 4, systems=["x", "y", "y", "x"])
    expected = (0.7 - 0.375) / math.hypot(math.sqrt(0.02) / 2, 0.05)
    assert rank[0] == pytest.approx(expected) == rank[3] == rank[1]
    # three captions, sd 1: a and b level (swap chance 1/2), c 10 above (chance ~0): a's mean chance is 1/4
    three = margins(Decision.parse("rank"), np.array([0.0, 0.0, 10.0]), np.ones(3), ["a", "b", "c"])
    assert three[0] == pytest.approx(0.67449, abs=1e-4) == three[1]  # Phi(-0.67449) = 0.25
    assert three[2] == pytest.approx(10 / math.sqrt(2), abs=0.02)  # its two chances alike: Phi(-10/sqrt 2)


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
    assert main(["score", "-i", str(demo), "--decision", "rank", "--out", str(tmp_path / "other")]) == 2
    assert "--cascade CHEAP and --decision go together" in capsys.readouterr().err
