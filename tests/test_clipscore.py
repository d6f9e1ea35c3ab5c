"""CLIPScore and RefCLIPScore against the paper's definitions, recomputed by hand."""

import numpy as np
import pytest
from PIL import Image

import caprecon
from caprecon.metrics.clipscore import ClipScore, RefClipScore
from caprecon.models.matcher import ClipMatcher


@pytest.fixture(scope="module")
def pictures():
    rng = np.random.default_rng(3)
    return [Image.fromarray(rng.integers(0, 255, (40, 40, 3), dtype=np.uint8)) for _ in range(3)]


def test_clipscore_matches_definition(tiny_clip, pictures):
    clip = ClipMatcher(tiny_clip)
    captions = ["a red kite over a beach", "two dogs", "an old tram in the rain"]
    scores = ClipScore(clip)(pictures, captions)
    image_vecs = clip.embed_images(pictures)
    text_vecs = clip.embed_texts(["A photo depicts " + c for c in captions])
    expected = [2.5 * max(float(i @ t), 0.0) for i, t in zip(image_vecs, text_vecs)]
    np.testing.assert_allclose(scores, expected, atol=1e-6)
    assert all(0 <= s <= 2.5 for s in scores)


def test_refclipscore_is_harmonic_mean_with_best_reference(tiny_clip, pictures):
    clip = ClipMatcher(tiny_clip)
    refs = [["a kite on the sand", "a beach with a kite"], ["dogs playing"], ["a tram", "rain on a street"]]
    samples = [caprecon.Sample(id=str(i), image=im, caption=c, refs=r)
               for i, (im, c, r) in enumerate(zip(pictures, ["a red kite", "two dogs", "a tram"], refs))]
    res = caprecon.score(samples, [RefClipScore(clip)], no_cache=True)
    for record, sample in zip(res.records, samples):
        # the reference implementation embeds candidate and references with the same prefix
        cand = clip.embed_texts(["A photo depicts " + sample.caption])[0]
        best = max(max(float(cand @ r) for r in clip.embed_texts(["A photo depicts " + r for r in sample.refs])), 0.0)
        clip_s = record["clipscore"]
        expected = 2 * clip_s * best / (clip_s + best) if clip_s + best else 0.0
        assert record["refclipscore"] == pytest.approx(expected, abs=1e-6)


def test_long_caption_is_flagged(tiny_clip, pictures, caplog):
    clip = ClipMatcher(tiny_clip)
    res = caprecon.score([caprecon.Sample(id="long", image=pictures[0], caption="word " * 30)], [ClipScore(clip)],
                         no_cache=True)
    # "A photo depicts " + 30 words: 1+5+7 letters + 120 letters + start/end tokens = 135; limit 77
    assert res.records[0]["clip_tokens_cut"] == 135 - 77
    assert "cut by 58 tokens" in caplog.text


def test_clip_image_and_clipscore_share_one_clip(tiny_clip, tmp_path):
    from oracle import OracleGenerator, render

    paths = []
    for i, caption in enumerate(["a red circle", "a blue square"]):
        paths.append(tmp_path / f"{i}.png")
        render(caption, 64, 64).save(paths[-1])
    samples = [caprecon.Sample(id=str(i), image=p, caption=c)
               for i, (p, c) in enumerate(zip(paths, ["a red circle", "a blue square"]))]
    res = caprecon.score(samples, ["clip-image", "clipscore"], generator=OracleGenerator(), clip=str(tiny_clip),
                         max_side=64, no_cache=True)
    # sources and reconstructions once each: clipscore reuses clip-image's source embeddings
    assert res.manifest["cache"]["embedded"] == 2 * len(samples)
    assert res.manifest["models"]["clip_matcher"]["fingerprint"] == res.manifest["models"]["clip"]["fingerprint"]
    assert all(0 <= r["clipscore"] <= 2.5 for r in res.records)
