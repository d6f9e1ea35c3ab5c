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
        clip_s = 2.5 * max(float(clip.embed_images([sample.image])[0] @ cand), 0.0)
        assert record["refclipscore_clip"] == pytest.approx(clip_s, abs=1e-6)
        assert "clipscore" not in record  # only a metric asked for writes its column
        expected = 2 * clip_s * best / (clip_s + best) if clip_s + best else 0.0
        assert record["refclipscore"] == pytest.approx(expected, abs=1e-6)


def test_long_caption_is_flagged(tiny_clip, pictures, caplog):
    clip = ClipMatcher(tiny_clip)
    res = caprecon.score([caprecon.Sample(id="long", image=pictures[0], caption="word " * 30)], [ClipScore(clip)],
                         no_cache=True)
    # "A photo depicts " + 30 words: 1+5+7 letters + 120 letters + start/end tokens = 135; limit 77
    assert res.records[0]["clip_tokens_cut"] == 135 - 77
    assert res.manifest["metrics"][0]["clip"]["text_budget"] == 77  # the manifest names the budget cut against
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


# ------------------------------------------------------------------ CLIP-S and the reference implementation


class _FeaturesAsTensors:
    """torchmetrics 1.9 reads `get_text_features`/`get_image_features` as tensors, while
    transformers 5 returns an output object whose `pooler_output` is that tensor; the model
    is otherwise the tiny CLIP itself, unchanged."""

    @staticmethod
    def load(folder):
        from transformers import CLIPModel, CLIPProcessor

        class Model(CLIPModel):
            def get_text_features(self, *args, **kwargs):
                return super().get_text_features(*args, **kwargs).pooler_output

            def get_image_features(self, *args, **kwargs):
                return super().get_image_features(*args, **kwargs).pooler_output

        return Model.from_pretrained(folder).eval(), CLIPProcessor.from_pretrained(folder)


def _plain_clip_cosines(folder, pictures, texts):
    """cos(E(I), E(text)) straight from transformers' CLIPModel, without caprecon."""
    import torch
    from transformers import CLIPModel, CLIPProcessor

    model, processor = CLIPModel.from_pretrained(folder).eval(), CLIPProcessor.from_pretrained(folder)
    with torch.no_grad():
        image = model.get_image_features(**processor(images=pictures, return_tensors="pt")).pooler_output
        tokens = processor(text=texts, return_tensors="pt", padding=True)
        text = model.get_text_features(input_ids=tokens["input_ids"],
                                       attention_mask=tokens["attention_mask"]).pooler_output
    image = image / image.norm(dim=-1, keepdim=True)
    text = text / text.norm(dim=-1, keepdim=True)
    return (image * text).sum(-1).double().numpy()


CAPTIONS = ["a red kite over a beach", "two dogs", "an old tram in the rain", "snow", "a cat"]


@pytest.fixture(scope="module")
def more_pictures():
    """Noise, and a green square: with the tiny CLIP, the last pair's cosine is negative with
    and without the prefix, so both readings' clamps are exercised."""
    rng = np.random.default_rng(11)
    noise = [Image.fromarray(rng.integers(0, 255, (48, 40, 3), dtype=np.uint8)) for _ in CAPTIONS[1:]]
    return [*noise, Image.new("RGB", (40, 48), (0, 255, 0))]


def test_clip_s_equals_torchmetrics_clipscore_on_the_same_weights(tiny_clip, more_pictures):
    """The Caption Turing Test paper's CLIP-S is torchmetrics' CLIPScore: 100 max(cos, 0) on
    the bare caption. torchmetrics averages a batch before clamping, so it scores one pair
    per call."""
    import torch
    from torchmetrics.multimodal.clip_score import CLIPScore

    reference = CLIPScore(model_name_or_path=lambda: _FeaturesAsTensors.load(tiny_clip))
    theirs = []
    for picture, caption in zip(more_pictures, CAPTIONS):
        tensor = torch.from_numpy(np.array(picture)).permute(2, 0, 1).contiguous()
        theirs.append(float(reference(tensor[None], [caption]).detach()))
    ours = caprecon.score([caprecon.Sample(id=str(i), image=p, caption=c)
                           for i, (p, c) in enumerate(zip(more_pictures, CAPTIONS))],
                          ["clip-s"], clip=str(tiny_clip), no_cache=True).records
    np.testing.assert_allclose([r["clip-s"] for r in ours], theirs, atol=2e-4)
    cos = _plain_clip_cosines(tiny_clip, more_pictures, CAPTIONS)
    np.testing.assert_allclose(theirs, 100 * np.maximum(cos, 0), atol=2e-4)
    # the tiny CLIP's random weights give both signs, so the clamp is exercised
    assert (cos < 0).any() and (cos > 0).any()


def test_clipscore_is_hessels_on_the_same_weights(tiny_clip, more_pictures):
    """Hessel's CLIPScore from plain transformers: 2.5 max(cos, 0) with the prefix."""
    cos = _plain_clip_cosines(tiny_clip, more_pictures, ["A photo depicts " + c for c in CAPTIONS])
    assert (cos < 0).any() and (cos > 0).any()
    ours = ClipScore(ClipMatcher(tiny_clip))(more_pictures, CAPTIONS)
    np.testing.assert_allclose(ours, 2.5 * np.maximum(cos, 0), atol=1e-5)


def test_clipscore_weight_and_prefix_from_the_cli_and_config(tiny_clip, more_pictures, tmp_path, capsys):
    import json

    from caprecon.cli import main

    rows = []
    for i, (picture, caption) in enumerate(zip(more_pictures, CAPTIONS)):
        picture.save(tmp_path / f"{i}.png")
        rows.append({"id": str(i), "image": str(tmp_path / f"{i}.png"), "caption": caption})
    data = tmp_path / "in.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in rows))
    cos = _plain_clip_cosines(tiny_clip, more_pictures, ["Look: " + c for c in CAPTIONS])
    bare = _plain_clip_cosines(tiny_clip, more_pictures, CAPTIONS)

    out = tmp_path / "cli"
    assert main(["score", "-i", str(data), "-m", "clipscore", "--clip", str(tiny_clip), "--clipscore-weight", "10",
                 "--clipscore-prefix", "Look: ", "--no-cache", "--out", str(out), "--quiet"]) == 0
    records = [json.loads(line) for line in (out / "scores.jsonl").read_text().splitlines()]
    np.testing.assert_allclose([r["clipscore"] for r in records], 10 * np.maximum(cos, 0), atol=1e-4)
    manifest = json.loads((out / "manifest.json").read_text())
    assert (manifest["metrics"][0]["w"], manifest["metrics"][0]["prefix"]) == (10.0, "Look: ")

    config = tmp_path / "run.yaml"
    config.write_text("clipscore_weight: 100\nclipscore_prefix: ''\n")
    out = tmp_path / "config"
    assert main(["score", "-i", str(data), "-m", "clipscore", "-m", "clip-s", "--clip", str(tiny_clip),
                 "--config", str(config), "--no-cache", "--out", str(out), "--quiet"]) == 0
    records = [json.loads(line) for line in (out / "scores.jsonl").read_text().splitlines()]
    # set to 100 and no prefix, clipscore is the named variant clip-s
    np.testing.assert_allclose([r["clipscore"] for r in records], 100 * np.maximum(bare, 0), atol=1e-4)
    np.testing.assert_allclose([r["clip-s"] for r in records], [r["clipscore"] for r in records], atol=1e-9)

    capsys.readouterr()
    config.write_text("clipscore_weight: -1\n")
    assert main(["score", "-i", str(data), "-m", "clipscore", "--clip", str(tiny_clip), "--config", str(config),
                 "--no-cache", "--out", str(tmp_path / "bad"), "--quiet"]) == 2
    assert "clipscore_weight must be a positive number" in capsys.readouterr().err
