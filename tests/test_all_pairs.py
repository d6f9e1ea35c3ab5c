"""The all-pairs call, as t2v_metrics users write it: `metric(images, texts, all_pairs=True)` is the
m x n matrix of every image with every text, each image read and embedded once, each distinct
reconstruction (ReconScore) or text embedding (CLIPScore, through the generic form) made once.

The oracle draws the shapes a caption names and the pixel embedder compares ink, so each expected
ReconScore is worked out from the two pictures directly (`oracle.expected_recon`)."""

from __future__ import annotations


import numpy as np
import pytest
from PIL import Image

from oracle import CountingEmbedder, CountingOracle, PixelEmbedder, expected_recon, render

from caprecon.data.samples import SampleError
from caprecon.metrics.base import Column, Metric
from caprecon.metrics.recon import ClipImageScore, ReconScore


SCENES = ["red circle blue square", "green triangle", "yellow square purple circle"]


@pytest.fixture
def photos():
    # 96 x 80 photos: their reconstructions (96 x 96, the oracle's size here) are told apart by size
    return [render(scene, 96, 80) for scene in SCENES]


def test_recon_matrix_is_every_image_with_every_text_each_image_embedded_once(photos):
    generator, embedder = CountingOracle(), CountingEmbedder()
    recon = ReconScore(generator=generator, embedder=embedder, seed_policy="fixed", size=(96, 96))
    texts = ["green triangle", "red circle blue square", "green triangle", "blue square"]  # one twice
    scores = recon(photos, texts, all_pairs=True)
    assert isinstance(scores, np.ndarray) and scores.shape == (3, 4)
    # by hand: (1 + cos) / 2 of the photo's ink and that of the oracle's 96 x 96 drawing of the text
    want = [[(1 + float(np.clip(np.dot(*PixelEmbedder().embed([photo, render(text, 96, 96)])), -1, 1))) / 2
             for text in texts] for photo in photos]
    assert scores == pytest.approx(np.array(want), abs=1e-6)
    assert scores[0, 1] > scores[0, 0] and scores[1, 0] > scores[1, 1]  # each photo's own scene wins
    # one noise for every caption (seed policy fixed) and one size: one reconstruction per distinct text
    assert sorted(generator.prompts) == ["blue square", "green triangle", "red circle blue square"]
    # each photo embedded once (96 x 80), each distinct reconstruction once (96 x 96)
    assert sorted(embedder.seen) == [(96, 80)] * 3 + [(96, 96)] * 3
    # column j is the paired call's image i under text j, to the bit
    for j, text in enumerate(texts):
        assert list(scores[:, j]) == recon(photos, [text] * 3)


def test_under_the_default_seed_policy_each_image_has_its_own_noise(photos):
    generator, embedder = CountingOracle(), CountingEmbedder()
    recon = ReconScore(generator=generator, embedder=embedder, max_side=96)
    texts = ["green triangle", "green triangle", "red circle"]
    scores = recon(photos[:2], texts, all_pairs=True)
    assert scores.shape == (2, 3)
    # per-sample noise derives from the image: each (image, distinct text) reconstructed once, 2 x 2
    assert sorted(generator.prompts) == ["green triangle"] * 2 + ["red circle"] * 2
    assert sorted(embedder.seen) == [(96, 80)] * 2 + [(96, 80)] * 4  # 2 photos, 4 reconstructions at their size
    assert scores == pytest.approx(np.array([[expected_recon(p, t) for t in texts] for p in photos[:2]]), abs=1e-6)


def test_clip_image_matrix_is_the_raw_cosine(photos):
    metric = ClipImageScore(generator=CountingOracle(), embedder=PixelEmbedder(), max_side=96)
    scores = metric(photos[:2], ["green triangle", "red circle blue square"], all_pairs=True)
    want = [[2 * expected_recon(p, t) - 1 for t in ["green triangle", "red circle blue square"]] for p in photos[:2]]
    assert scores == pytest.approx(np.array(want), abs=1e-6)


class InkAndWords(Metric):
    """A metric with no all-pairs form of its own: the photo's mean ink plus a tenth of the caption's
    word count, so each pair's value is known by hand. Records each batch it is given."""

    name = "ink-words"
    columns = (Column("ink-words", low=0.0),)

    def __init__(self):
        self.batches: list[list[tuple[float, str]]] = []

    def score(self, items, ctx):
        values = [(float(np.asarray(it.image, dtype=np.float64).mean()), it.caption) for it in items]
        self.batches.append(values)
        return [{self.name: 1 - ink / 255 + len(caption.split()) / 10} for ink, caption in values]


def test_the_generic_form_builds_the_rows_once_in_image_major_order():
    grey = [Image.new("RGB", (8, 8), (v, v, v)) for v in (0, 51, 255)]  # ink 1, 0.8, 0
    texts = ["a dog", "a dog on grass", "cat"]
    metric = InkAndWords()
    scores = metric(grey, texts, all_pairs=True)
    assert scores == pytest.approx(np.array([[1.2, 1.4, 1.1], [1.0, 1.2, 0.9], [0.2, 0.4, 0.1]]))
    assert len(metric.batches) == 1 and [c for _, c in metric.batches[0]] == texts * 3  # m x n rows, one call


def test_a_metric_without_a_number_leaves_nan():
    class Unknown(InkAndWords):
        def score(self, items, ctx):
            return [{self.name: None if it.caption == "?" else 0.5} for it in items]

    scores = Unknown()([Image.new("RGB", (4, 4))], ["a cat", "?"], all_pairs=True)
    assert scores[0, 0] == 0.5 and np.isnan(scores[0, 1])


def test_bad_input_is_refused_before_any_work(photos, tmp_path):
    generator = CountingOracle()
    recon = ReconScore(generator=generator, embedder=PixelEmbedder(), max_side=96)
    with pytest.raises(ValueError, match="at least one image and one caption, not 0 images and 1 captions"):
        recon([], ["a cat"], all_pairs=True)
    with pytest.raises(ValueError, match="not 1 images and 0 captions"):
        recon(photos[:1], [], all_pairs=True)
    with pytest.raises(SampleError, match="caption 1 is a int, not text"):
        recon(photos, ["a cat", 7], all_pairs=True)
    with pytest.raises(SampleError, match="caption 0 is empty"):
        recon(photos, ["  ", "a cat"], all_pairs=True)
    with pytest.raises(TypeError, match="captions must be a list .* not a single str: wrap it in a list"):
        recon(photos, "a cat", all_pairs=True)
    with pytest.raises(TypeError, match="images must be a list .* not a single Image"):
        recon(photos[0], ["a cat"], all_pairs=True)
    broken = tmp_path / "broken.png"
    broken.write_bytes(b"not a picture")
    with pytest.raises(SampleError, match="image 1: .*cannot decode"):
        recon([photos[0], broken], ["a cat"], all_pairs=True)
    with pytest.raises(TypeError, match="captions must be a list"):
        recon(photos[:1], "a cat")  # the paired call too: a text is not a list of captions
    assert generator.prompts == []


class ColourMatcher:
    """A caption-image matcher worked out by hand: a picture is its mean colour, a text the colour
    words it names, each as a unit vector in (red, green, blue); records what it embeds."""

    fingerprint = "colour-matcher-v1"
    WORDS = {"red": 0, "green": 1, "blue": 2}

    def __init__(self):
        self.images: list[tuple[int, int]] = []
        self.texts: list[str] = []

    def embed_images(self, images):
        self.images += [im.size for im in images]
        x = np.stack([np.asarray(im.convert("RGB"), dtype=np.float64).mean(axis=(0, 1)) for im in images])
        return x / np.linalg.norm(x, axis=1, keepdims=True)

    def embed_texts(self, texts):
        self.texts += list(texts)
        x = np.zeros((len(texts), 3))
        for row, text in enumerate(texts):
            for word in text.lower().split():
                if word in self.WORDS:
                    x[row, self.WORDS[word]] += 1
        return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def test_clipscore_matrix_embeds_each_image_and_each_text_once():
    from caprecon.metrics.clipscore import ClipScore

    matcher = ColourMatcher()
    metric = ClipScore(matcher)
    pictures = [Image.new("RGB", (8, 8), colour) for colour in ((255, 0, 0), (0, 0, 255), (255, 255, 0))]
    texts = ["a red car", "a blue and red sign", "a green field", "a red car"]
    scores = metric(pictures, texts, all_pairs=True)
    half = 2.5 / np.sqrt(2)  # 2.5 cos 45 degrees
    assert scores == pytest.approx(np.array([[2.5, half, 0.0, 2.5], [0.0, half, 0.0, 0.0],
                                             [half, 1.25, half, half]]), abs=1e-9)
    assert len(matcher.images) == 3  # each picture once, not once per text
    assert sorted(matcher.texts) == sorted("A photo depicts " + t for t in set(texts))  # each distinct text once
