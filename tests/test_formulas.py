"""Every headline formula, pinned by a value worked out by hand from inputs the test chooses.

The models here are stubs whose outputs are set by the test (unit vectors per colour or
text, answers per question, probabilities per option), so each expected value is a
formula of the paper applied to numbers written below, never a second call to the code
under test. `scripts/mutants.py` (`make mutants`) changes these formulas one token at a
time and checks that a test here (or in the file it names) fails.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from PIL import Image
from scipy import stats

from caprecon.data.images import open_image
from caprecon.data.qa import QAItem
from caprecon.data.samples import Sample, SampleError
from caprecon.metrics.base import Context
from caprecon.models.generator import Generated

# ----------------------------------------------------------------------------- stub models

COLOURS = {"red": (255, 0, 0), "blue": (0, 0, 255), "green": (0, 255, 0), "grey": (128, 128, 128)}


class ColourGenerator:
    """Paints the whole picture in the first colour its prompt names."""

    fingerprint = "colour-generator-v1"

    def generate(self, requests):
        out = []
        for r in requests:
            colour = next(c for c in COLOURS if c in r.prompt)
            out.append(Generated(Image.new("RGB", (r.width, r.height), COLOURS[colour])))
        return out


class ColourEmbedder:
    """A chosen unit vector per colour, read off the picture's corner pixel."""

    def __init__(self, vectors, fingerprint="colour-embedder"):
        self.vectors = {COLOURS[name]: np.asarray(v, np.float32) for name, v in vectors.items()}
        self.fingerprint = fingerprint

    def embed(self, images):
        return np.stack([self.vectors[im.convert("RGB").getpixel((0, 0))] for im in images])


class TableMatcher:
    """A CLIP stand-in: chosen unit vectors per picture colour and per exact text."""

    fingerprint = "table-matcher"

    def __init__(self, images, texts):
        self.images = ColourEmbedder(images, "table-matcher-images")
        self.texts = {t: np.asarray(v, np.float32) for t, v in texts.items()}

    def embed_images(self, images):
        return self.images.embed(images)

    def embed_texts(self, texts):
        return np.stack([self.texts[t] for t in texts])


def picture(colour, size=(32, 24)):
    return Image.new("RGB", size, COLOURS[colour])


def loaded(colour, caption, image_id="img", refs=(), size=(32, 24), sample_id=None):
    return open_image(Sample(id=sample_id or caption, image=picture(colour, size), caption=caption, refs=list(refs),
                             image_id=image_id))


# ----------------------------------------------------------------------------- ReconScore, CLIP-Image

# unit vectors: cos(red, blue) = -0.6, cos(red, green) = 0.8
VECTORS = {"red": (1.0, 0.0, 0.0), "blue": (-0.6, 0.8, 0.0), "green": (0.8, 0.0, 0.6)}


def test_reconscore_is_one_plus_cos_over_two():
    from caprecon.metrics.recon import ReconScore

    metric = ReconScore(ColourGenerator(), ColourEmbedder(VECTORS), max_side=32)
    scores = metric([picture("red"), picture("red")], ["blue", "green"])
    # (1 + cos) / 2 with cos = -0.6 and 0.8
    assert scores == pytest.approx([0.2, 0.9], abs=1e-6)


def test_clip_image_is_the_raw_cosine_of_source_and_reconstruction():
    from caprecon.metrics.recon import ClipImageScore

    metric = ClipImageScore(ColourGenerator(), ColourEmbedder(VECTORS), max_side=32)
    assert metric([picture("red"), picture("red")], ["blue", "green"]) == pytest.approx([-0.6, 0.8], abs=1e-6)


# ----------------------------------------------------------------------------- CLIPScore, CLIP-S, RefCLIPScore

# the picture is red = (1, 0, 0); each text's vector is chosen so its cosine with it is its first entry
TEXTS = {
    "A photo depicts two dogs": (0.6, 0.8, 0.0),
    "two dogs": (0.8, 0.6, 0.0),
    "A photo depicts a cat": (-0.28, 0.96, 0.0),
    "a cat": (-0.6, 0.8, 0.0),
    # references: cos with "A photo depicts two dogs" (0.6, 0.8, 0) is 0.8 and -0.28 with the prefix,
    # 0.6 and 0.28 without it
    "A photo depicts dogs": (0.0, 1.0, 0.0),
    "dogs": (0.6, 0.0, 0.8),
    "A photo depicts a kite": (0.6, -0.8, 0.0),
    "a kite": (0.28, 0.96, 0.0),
    "A photo depicts a boat": (0.28, -0.96, 0.0),
    "a boat": (1.0, 0.0, 0.0),
}


def matcher():
    return TableMatcher({"red": (1.0, 0.0, 0.0)}, TEXTS)


def test_clipscore_is_two_and_a_half_times_the_clamped_cosine_with_the_prefix():
    from caprecon.metrics.clipscore import ClipScore

    # 2.5 max(cos, 0): cos("A photo depicts two dogs") = 0.6, cos("A photo depicts a cat") = -0.28
    assert ClipScore(matcher())([picture("red")] * 2, ["two dogs", "a cat"]) == pytest.approx([1.5, 0.0], abs=1e-6)


def test_clip_s_is_a_hundred_times_the_clamped_cosine_without_prefix():
    from caprecon.metrics.clipscore import ClipS

    # 100 max(cos, 0): cos("two dogs") = 0.8, cos("a cat") = -0.6
    assert ClipS(matcher())([picture("red")] * 2, ["two dogs", "a cat"]) == pytest.approx([80.0, 0.0], abs=1e-4)


def test_refclipscore_is_the_harmonic_mean_with_the_best_clamped_reference():
    from caprecon.metrics.clipscore import RefClipScore

    items = [loaded("red", "two dogs", refs=["a kite", "dogs"], sample_id="both"),
             loaded("red", "two dogs", refs=["a kite", "a boat"], sample_id="none")]
    rows = RefClipScore(matcher()).score(items, Context())
    # clipscore 2.5 * 0.6 = 1.5 for both. Reference part: the best cos of the prefixed candidate with
    # a prefixed reference, clamped at 0: max(-0.28, 0.8) = 0.8, then max(-0.28, -0.6, 0) = 0 (the boat:
    # 0.168 - 0.768)
    assert rows[0]["refclipscore_clip"] == pytest.approx(1.5, abs=1e-6)
    assert rows[0]["refclipscore"] == pytest.approx(2 * 1.5 * 0.8 / (1.5 + 0.8), abs=1e-6)
    assert rows[1]["refclipscore"] == pytest.approx(0.0, abs=1e-6)


# ----------------------------------------------------------------------------- VQAScore


def test_the_answer_distribution_is_a_softmax_over_the_whole_vocabulary():
    import torch

    from caprecon.models.llm import answer_rows, probs_of

    # one reply position over a vocabulary of 5; "Yes" is token 1 and "No" token 3
    logits = torch.tensor([[[0.0, 2.0, 1.0, 0.5, -1.0], [9.0, 9.0, 9.0, 9.0, 9.0]]])
    rows = answer_rows(logits, [0], [1])
    total = sum(math.exp(v) for v in (0.0, 2.0, 1.0, 0.5, -1.0))
    assert probs_of(rows[0], [1, 3]) == pytest.approx([math.exp(2.0) / total, math.exp(0.5) / total], rel=1e-6)


class OptionJudge:
    """A judge whose next-token probabilities are set per option."""

    fingerprint = "option-judge"

    def __init__(self, probs):
        self.probs = probs
        self.prompts = []

    def option_probs(self, requests, options):
        self.prompts += [r.prompt for r in requests]
        return [[self.probs[o] for o in opts] for opts in options]


def test_vqascore_is_p_yes_and_its_normalised_form():
    from caprecon.metrics.vqascore import VQAScore

    judge = OptionJudge({"Yes": 0.5, "yes": 0.1, "No": 0.2, "no": 0.05})
    items = [loaded("red", "two dogs")]
    assert VQAScore(judge).score(items, Context())[0]["vqascore"] == pytest.approx(0.5)
    assert judge.prompts == ["Is the figure showing: two dogs?"]
    # (0.5 + 0.1) / (0.5 + 0.1 + 0.2 + 0.05)
    normalised = VQAScore(judge, normalise=True).score(items, Context())[0]["vqascore"]
    assert normalised == pytest.approx(0.6 / 0.85)


def test_vqascore_without_a_known_answer_is_the_rows_error_never_one_half():
    """The normalised form with no mass on yes or no, and P('Yes') unknown (NaN: outside a
    server's top-k), are errors of their rows; a default of 0.5 would read as 'supported'."""
    from caprecon.metrics.vqascore import VQAScore

    items = [loaded("red", "two dogs")]
    nothing = OptionJudge({"Yes": 0.0, "yes": 0.0, "No": 0.0, "no": 0.0})
    with pytest.raises(SampleError, match="no probability on Yes/yes or No/no"):
        VQAScore(nothing, normalise=True).score(items, Context())
    unknown = OptionJudge({"Yes": math.nan, "yes": 0.2, "No": math.nan, "no": 0.05})
    with pytest.raises(SampleError, match="'Yes' is not among the top-k"):
        VQAScore(unknown).score(items, Context())
    # normalised, the variants in the top-k decide: 0.2 / (0.2 + 0.05)
    assert VQAScore(unknown, normalise=True).score(items, Context())[0]["vqascore"] == pytest.approx(0.8)


# ----------------------------------------------------------------------------- the Caption Turing Test

# box answers in fractions of the image, written with binary fractions so the IoUs are exact
BANK = {"img": [
    QAItem("img", "What colour is the car?", "mc", "B", category="perception", choices=("red", "blue", "green"),
           id="q-mc"),
    QAItem("img", "Is there a dog?", "yesno", "yes", category="perception", id="q-yes"),
    QAItem("img", "Where is the car?", "box", (0.25, 0.25, 0.75, 0.75), category="grounding", id="q-car",
           coords="normalized"),
    QAItem("img", "Where is the dog?", "box", (0.0, 0.0, 0.5, 0.5), category="grounding", id="q-dog",
           coords="normalized"),
]}
# what the judge answers looking at the reconstruction (blue) and at the source (red)
ON_RECONSTRUCTION = {"What colour": "B", "Is there": "no", "Where is the car": "[0.25, 0.25, 0.75, 0.5]",
                     "Where is the dog": "[0.25, 0.0, 0.75, 0.5]"}
ON_SOURCE = {"What colour": "blue", "Is there": "yes", "Where is the car": "[0.25, 0.25, 0.75, 0.75]",
             "Where is the dog": "[0, 0, 0.5, 0.5]"}


class ScriptedJudge:
    box_coords = "normalized"
    fingerprint = "scripted-judge"

    def generate(self, requests, max_new_tokens=32):
        out = []
        for r in requests:
            script = ON_RECONSTRUCTION if r.image.getpixel((0, 0)) == COLOURS["blue"] else ON_SOURCE
            [key] = [k for k in script if k in r.prompt]
            out.append(script[key])
        return out


def test_caption_turing_test_accuracy_and_mean_iou():
    from caprecon.metrics.turing import CaptionTuringTest

    metric = CaptionTuringTest(ColourGenerator(), ScriptedJudge(), BANK, max_side=32)
    [row] = metric.score([loaded("red", "a blue car and a dog")], Context())
    # On Î: mc right, yes/no wrong, car box IoU = 0.125 / 0.25 = 0.5 (right at the threshold 0.5),
    # dog box IoU = 0.125 / (0.25 + 0.25 - 0.125) = 1/3 (wrong): 2 of 4 questions.
    assert row["turing"] == pytest.approx(2 / 4)
    assert row["turing_n"] == 4
    assert row["turing/perception"] == pytest.approx(1 / 2) and row["turing/grounding"] == pytest.approx(1 / 2)
    assert row["turing_iou"] == pytest.approx((0.5 + 1 / 3) / 2)
    # On I every answer is right and both boxes are exact
    assert row["turing_upper"] == pytest.approx(1.0) and row["turing_upper_iou"] == pytest.approx(1.0)
    assert row["turing_gap"] == pytest.approx(0.5)
    assert {f["question"] for f in row["turing_flipped"]} == {"Is there a dog?", "Where is the dog?"}


def test_a_stricter_iou_threshold_fails_the_box_at_exactly_one_half():
    from caprecon.metrics.turing import CaptionTuringTest

    metric = CaptionTuringTest(ColourGenerator(), ScriptedJudge(), BANK, max_side=32, iou_threshold=0.51)
    [row] = metric.score([loaded("red", "a blue car and a dog")], Context())
    assert row["turing"] == pytest.approx(1 / 4) and row["turing_iou"] == pytest.approx((0.5 + 1 / 3) / 2)


# ----------------------------------------------------------------------------- CaptionQA

CAPTIONQA_BANK = {"img": [
    QAItem("img", "What colour is the car?", "mc", "B", category="perception", choices=("red", "blue", "green"),
           id="c-mc"),
    QAItem("img", "Is there a cat?", "yesno", "no", category="perception", id="c-cat"),
    QAItem("img", "How many dogs are there?", "short", "2", category="counting", id="c-count"),
]}


class CaptionReader:
    """A text-only LLM that knows only what the description in its prompt states."""

    fingerprint = "caption-reader"

    def generate(self, prompts, max_new_tokens=32):
        out = []
        for p in prompts:
            description = p.split('"')[1] if p.count('"') >= 2 else ""
            if "colour" in p:
                out.append("blue" if "blue car" in description else "cannot answer")
            elif "dogs" in p:
                out.append("two" if "two dogs" in description else "cannot answer")
            else:  # the description says nothing of cats
                out.append("cannot answer")
        return out


def test_captionqa_is_the_share_of_questions_answered_from_the_caption():
    from caprecon.metrics.captionqa import CaptionQA

    [row] = CaptionQA(CaptionReader(), CAPTIONQA_BANK).score([loaded("red", "a blue car next to two dogs")], Context())
    # "blue" picks option B; "cannot answer" is wrong; "two" is "2" after VQA normalisation: 2 of 3
    assert row["captionqa"] == pytest.approx(2 / 3)
    assert row["captionqa/perception"] == pytest.approx(1 / 2) and row["captionqa/counting"] == pytest.approx(1.0)
    [row] = CaptionQA(CaptionReader(), CAPTIONQA_BANK).score([loaded("red", "a street")], Context())
    assert row["captionqa"] == pytest.approx(0.0)


# ----------------------------------------------------------------------------- Eq. 4 and Eq. 5 (Table 1)


def test_suite_average_and_equivalence_criterion():
    from caprecon.apps.suites.entries import SuiteEntry
    from caprecon.apps.suites.table import UPPER, SuiteTable

    datasets = [SuiteEntry(name="d1", question="mc"), SuiteEntry(name="d2", question="mc"),
                SuiteEntry(name="d3", question="mc")]
    scores = {UPPER: {"d1": {"score": 60.0}, "d2": {"score": 65.0}, "d3": {"score": 80.0}},
              "A": {"d1": {"score": 50.0}, "d2": {"score": 70.0}, "d3": {"score": 75.0}},
              "B": {"d1": {"score": 58.0}, "d2": {"score": 63.0}, "d3": {"score": 74.0}}}
    table = SuiteTable(datasets, scores, ["A", "B"], sigma=10 / 3)
    # Eq. 5 over datasets: A (50 + 70 + 75) / 3 = 65, the upper bound 205 / 3
    assert table.average("A") == pytest.approx(65.0)
    assert table.gap("A") == pytest.approx(205 / 3 - 65)
    # Eq. 4: (|60 - 50| + |65 - 70| + |80 - 75|) / 3 = 20 / 3; B: (2 + 2 + 6) / 3 = 10 / 3, exactly sigma
    assert table.mean_abs_gap("A") == pytest.approx(20 / 3)
    assert table.mean_abs_gap("B") == pytest.approx(10 / 3)
    assert table.equivalent("A") is False and table.equivalent("B") is True


def test_suite_dataset_scores_accuracy_accuracy_plus_and_mean_iou():
    from caprecon.apps.suites.entries import SuiteEntry
    from caprecon.apps.suites.loaders import BenchQuestion
    from caprecon.apps.suites.scoring import Graded, dataset_scores

    def questions(kind, n):
        return [BenchQuestion("d", f"q{k}", f"i{k // 2}", kind, "?", "yes", group=f"i{k // 2}") for k in range(n)]

    # grounding: the headline is the mean IoU, an unreadable box (None) counting 0:
    # 100 (1 + 0.5 + 0.25 + 0) / 4 = 43.75; accuracy at IoU >= 0.5 is 2 of 4
    graded = [Graded(True, 1.0), Graded(True, 0.5), Graded(False, 0.25), Graded(False, None)]
    scores = dataset_scores(SuiteEntry(name="g", question="box", metric="grounding"), questions("box", 4), graded)
    assert scores["score"] == pytest.approx(43.75) and scores["miou"] == pytest.approx(43.75)
    assert scores["accuracy"] == pytest.approx(50.0)
    # MME's accuracy+: an image counts when both its questions are right; images i0 (right, right),
    # i1 (right, wrong), i2 (wrong, wrong): 1 of 3. Accuracy: 3 of 6.
    graded = [Graded(c) for c in (True, True, True, False, False, False)]
    scores = dataset_scores(SuiteEntry(name="mme", question="yesno", metric="accuracy+"), questions("yesno", 6),
                            graded)
    assert scores["accuracy_plus"] == pytest.approx(100 / 3) and scores["score"] == pytest.approx(50.0)


# ----------------------------------------------------------------------------- Eq. 7 (CTTD ranking)


def test_relevance_minus_redundancy():
    from caprecon.apps.cttd.rank import relevance_diversity

    # rows are scaled on purpose: Eq. 7 uses cosines. Unit directions q1 = (1, 0), q2 = (0, 1),
    # q3 = (0.6, 0.8); e = (0.8, 0.6).
    qa = np.array([[2.0, 0.0], [0.0, 3.0], [0.3, 0.4]])
    e = np.array([1.6, 1.2])
    relevance = [0.8, 0.6, 0.96]
    # mean cosine of each q_i with all n = 3 (itself included):
    # (1 + 0 + 0.6) / 3, (0 + 1 + 0.8) / 3, (0.6 + 0.8 + 1) / 3
    redundancy = [1.6 / 3, 1.8 / 3, 2.4 / 3]
    expected = [r - 0.5 * d for r, d in zip(relevance, redundancy)]
    np.testing.assert_allclose(relevance_diversity(qa, e, 0.5), expected, atol=1e-12)
    np.testing.assert_allclose(relevance_diversity(qa, e, 0.0), relevance, atol=1e-12)


# ----------------------------------------------------------------------------- the best-of-N curve


def test_expected_best_of_n_by_hand():
    from caprecon.apps.selection import expected_best, selection_curve

    scores = [0.2, 0.9, 0.5]
    # n = 1: the mean; n = 2: subsets {.2, .9} {.2, .5} {.9, .5} keep .9, .5, .9; n = 3: the best
    assert expected_best(scores, 1) == pytest.approx(1.6 / 3)
    assert expected_best(scores, 2) == pytest.approx(2.3 / 3)
    assert expected_best(scores, 3) == pytest.approx(0.9)
    # the value carried along is the selected candidate's: (10 + 20 + 20) / 3 for n = 2
    assert expected_best(scores, 2, [30.0, 20.0, 10.0]) == pytest.approx(50 / 3)
    rows = selection_curve([scores, [0.4]])
    # n = 1 averages both images; n >= 2 only the image with enough candidates
    assert [r["images"] for r in rows] == [2, 1, 1]
    assert [r["score"] for r in rows] == pytest.approx([(1.6 / 3 + 0.4) / 2, 2.3 / 3, 0.9])


# ----------------------------------------------------------------------------- Kendall τ_b and τ_c


def _pairs(x, y):
    """Concordant and discordant pairs, and pairs untied in x and in y, counted one pair at a time."""
    concordant = discordant = untied_x = untied_y = 0
    for i, j in itertools.combinations(range(len(x)), 2):
        dx, dy = np.sign(x[i] - x[j]), np.sign(y[i] - y[j])
        concordant += dx * dy > 0
        discordant += dx * dy < 0
        untied_x += dx != 0
        untied_y += dy != 0
    return concordant, discordant, untied_x, untied_y


def test_kendall_tau_b_and_tau_c():
    from caprecon.stats.correlation import kendall_tau

    # six scores against ratings on three levels (the Flickr8k-Expert shape: many score values,
    # few rating levels), so τ_b and τ_c differ
    x = [0.1, 0.4, 0.35, 0.8, 0.6, 0.9]
    y = [1, 2, 1, 3, 3, 2]
    p, q, untied_x, untied_y = _pairs(x, y)
    n, m = len(x), 3
    tau_b = (p - q) / math.sqrt(untied_x * untied_y)
    tau_c = 2 * (p - q) / (n**2 * (m - 1) / m)
    assert (p, q, untied_x, untied_y) == (10, 2, 15, 12)
    assert kendall_tau(x, y, "b") == pytest.approx(tau_b)
    assert kendall_tau(x, y, "c") == pytest.approx(tau_c)
    assert tau_c == pytest.approx(stats.kendalltau(x, y, variant="c")[0])
    assert tau_b != pytest.approx(tau_c)


def test_correlations_match_scipy_on_tied_data_of_many_sizes():
    """τ_b, τ_c, Spearman and Pearson are computed without scipy.stats (a second of import);
    scipy's own values on the same data are the reference, ties and a constant variable included."""
    import warnings

    from caprecon.stats.correlation import kendall_tau, pearson, spearman

    rng = np.random.default_rng(3)
    cases = [(rng.integers(0, 5, n) * 0.1, rng.integers(1, 5, n).astype(float)) for n in (2, 3, 17, 400, 2500)]
    cases += [(rng.normal(size=50), rng.normal(size=50)), ([1.0, 1.0, 1.0], [1.0, 2.0, 3.0])]
    for x, y in cases:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            expected = [stats.kendalltau(x, y, variant="b")[0], stats.kendalltau(x, y, variant="c")[0],
                        stats.spearmanr(x, y)[0], stats.pearsonr(x, y)[0]]
        got = [kendall_tau(x, y, "b"), kendall_tau(x, y, "c"), spearman(x, y), pearson(x, y)]
        assert got == pytest.approx(expected, nan_ok=True), len(x)


# ----------------------------------------------------------------------------- the paired bootstrap


def test_paired_bootstrap_resamples_both_statistics_together():
    from caprecon.stats.bootstrap import paired_bootstrap

    # groups a (rows 0, 1), b (row 2), c (row 3); default_rng(1) draws b b c, c a a, c c a, a c b
    groups = ["a", "a", "b", "c"]
    a_values = np.array([1.0, 3.0, 5.0, 9.0])
    b_values = np.array([0.0, 4.0, 2.0, 8.0])
    # per resample, both means on the same rows:
    #   b b c  -> A 19/3,  B (2 + 2 + 8)/3 = 4      -> 7/3
    #   c a a  -> A 3.4,   B (8 + 0 + 4 + 0 + 4)/5   -> 0.2
    #   c c a  -> A 5.5,   B (8 + 8 + 0 + 4)/4 = 5   -> 0.5
    #   a c b  -> A 4.5,   B (0 + 4 + 8 + 2)/4 = 3.5 -> 1.0
    # sorted 0.2, 0.5, 1.0, 7/3; the 50% interval at positions 0.75 and 2.25; none at or below 0: p = 0
    d = paired_bootstrap(lambda idx: float(a_values[idx].mean()), lambda idx: float(b_values[idx].mean()), groups,
                         n_resamples=4, seed=1, level=0.5)
    assert (d.value_a, d.value_b, d.difference) == pytest.approx((4.5, 3.5, 1.0))
    assert (d.ci_low, d.ci_high) == pytest.approx((0.2 + 0.75 * 0.3, 1.0 + 0.25 * (7 / 3 - 1)), rel=1e-12)
    assert d.p_value == 0.0 and d.n_resamples == 4


def test_bootstrapped_tau_of_one_resample_counted_by_hand():
    """`bootstrap_tau` forms τ's pair counts from draw counts; one resample of one-row groups,
    expanded by hand and counted pair by pair, checks both variants' formulas (x and y have
    different ties and numbers of levels, so swapping them or the variants shows)."""
    from caprecon.stats.bootstrap import bootstrap_tau

    x = np.array([0.1, 0.4, 0.35, 0.8, 0.6, 0.9, 0.4, 0.2])
    y = np.array([1.0, 2.0, 1.0, 3.0, 3.0, 2.0, 1.0, 1.0])
    groups = [f"g{k}" for k in range(len(x))]  # names sort in row order
    # the documented draws: resample r takes groups default_rng(seed).integers(0, n, (resamples, n))[r]
    rows = np.random.default_rng(5).integers(0, len(x), (1, len(x)))[0]
    p, q, untied_x, untied_y = _pairs(x[rows], y[rows])
    n, m = len(rows), min(len(set(x[rows])), len(set(y[rows])))
    assert untied_x != untied_y and m >= 2
    by_hand = {"b": (p - q) / math.sqrt(untied_x * untied_y), "c": 2 * (p - q) / (n**2 * (m - 1) / m)}
    for variant, tau in by_hand.items():
        low, high = bootstrap_tau(x, y, groups, variant=variant, n_resamples=1, seed=5)
        assert low == pytest.approx(tau, rel=1e-12) and high == pytest.approx(tau, rel=1e-12)


@pytest.mark.parametrize("n", [300, 20_000])
def test_kendall_both_ways_of_counting_equal_scipy(n):
    """Below the threshold the pairs are counted here, above it through scipy's sort; both give
    scipy's τ_b and τ_c to 1e-12 on ratings with many ties (as human ratings have)."""
    from caprecon.stats.correlation import QUADRATIC_UP_TO, kendall_taus

    rng = np.random.default_rng(n)
    human = rng.integers(1, 5, n).astype(float)
    metric = np.round(human + rng.normal(0, 1.5, n), 1)
    got = kendall_taus(metric, human)
    assert (n > QUADRATIC_UP_TO) == (n == 20_000)
    assert got["b"] == pytest.approx(stats.kendalltau(metric, human, variant="b")[0], abs=1e-12)
    assert got["c"] == pytest.approx(stats.kendalltau(metric, human, variant="c")[0], abs=1e-12)
