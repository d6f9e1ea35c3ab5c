"""DreamSimEmbedder end to end on DreamSim's real architecture with random weights.

Needs the `dreamsim` extra, which needs a torch build with a working torchvision: run with
`make test-extras` (its own virtualenv). The default suite skips this file.
"""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

pytest.importorskip("dreamsim", reason="the dreamsim extra is not installed (make test-extras)")

import torch  # noqa: E402
from tiny_dreamsim import build_tiny_dreamsim  # noqa: E402

from caprecon.models.embedder import DreamSimEmbedder  # noqa: E402


@pytest.fixture(scope="module")
def dreamsim_dir(tmp_path_factory):
    return build_tiny_dreamsim(tmp_path_factory.mktemp("dreamsim"))


def _images():
    rng = np.random.default_rng(0)
    shapes = [(60, 80), (224, 224), (100, 50)]
    return [Image.fromarray(rng.integers(0, 255, (*hw, 3), dtype=np.uint8)) for hw in shapes]


@pytest.mark.slow  # three ViT-B/16 backbones on CPU
def test_embed_matches_dreamsims_own_distance(dreamsim_dir):
    from dreamsim import dreamsim

    embedder = DreamSimEmbedder("ensemble", weights_dir=dreamsim_dir, device="cpu", batch_size=2)
    images = _images()
    vectors = embedder.embed(images)
    # the ensemble concatenates DINO's CLS (768) and the CLIP and OpenCLIP embeddings (512 each)
    assert vectors.shape == (3, 1792) and vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    # one image alone embeds as it did inside a batch
    np.testing.assert_allclose(embedder.embed(images[2:]), vectors[2:], atol=1e-5)

    # DreamSim's own forward gives the perceptual distance 1 - cos; ours must agree
    model, preprocess = dreamsim(pretrained=True, device="cpu", cache_dir=str(dreamsim_dir), dreamsim_type="ensemble")
    with torch.inference_mode():
        for i, j in [(0, 1), (0, 2), (1, 2)]:
            distance = float(model(preprocess(images[i]), preprocess(images[j])))
            assert 1.0 - float(vectors[i] @ vectors[j]) == pytest.approx(distance, abs=1e-5)

        # the folder's LoRA adapter is in use: with it switched off, the embeddings change
        with embedder._model.disable_adapter():
            plain = embedder._model.embed(preprocess(images[0])).numpy()
    plain /= np.linalg.norm(plain, axis=1, keepdims=True)
    assert np.abs(plain[0] - vectors[0]).max() > 1e-3
