"""caprecon distill: a head over frozen encoders learns a metric from run folders' rows, split by
image; the folder it writes loads as an nn.Module, as a metric and as a Reward part."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
import torch

from oracle import PixelEmbedder, render

import caprecon
from caprecon.apps.distill import distill, split_images
from caprecon.core.errors import ConfigError
from caprecon.models.distilled import DistilledReward

COLOURS = ["red", "green", "blue", "yellow", "black", "purple"]
SHAPES = ["circle", "square", "triangle"]


class WordEncoder:
    """Bag of words hashed into 64 dimensions: enough for a head to read colours and shapes."""

    fingerprint = "word-encoder-v1"

    def embed_texts(self, texts):
        out = np.zeros((len(texts), 64), dtype=np.float32)
        for row, text in enumerate(texts):
            for word in text.lower().split():
                out[row, int(hashlib.sha256(word.encode()).hexdigest(), 16) % 64] += 1.0
        return out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-12)


@pytest.fixture(scope="module")
def run_folder(tmp_path_factory):
    """A scored run: 24 one-shape images, each with 6 captions naming some colour and shape; the
    'metric' is 1 for the right colour and shape, 0.5 for one of the two, 0 for neither."""
    root = tmp_path_factory.mktemp("distill")
    rng = np.random.default_rng(0)
    rows = []
    for k in range(24):
        colour, shape = COLOURS[k % 6], SHAPES[(k // 6) % 3]
        path = root / f"img{k}.png"
        render(f"{colour} {shape}").save(path)
        for c in range(6):
            said_colour, said_shape = COLOURS[rng.integers(6)], SHAPES[rng.integers(3)]
            value = 0.5 * (said_colour == colour) + 0.5 * (said_shape == shape)
            rows.append({"id": f"{k}-{c}", "image": str(path), "caption": f"a {said_colour} {said_shape}",
                         "recon": value})
    run = root / "run"
    run.mkdir()
    (run / "scores.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    (run / "manifest.json").write_text(json.dumps({"samples": len(rows), "cache": {"model_seconds": 14.4},
                                                   "store": {"root": "somewhere"}}))
    return run


def test_distilled_reward_learns_the_metric_and_loads_three_ways(tmp_path, run_folder):
    out = tmp_path / "reward"
    result = distill([run_folder], "recon", out, image_encoder=PixelEmbedder(), text_encoder=WordEncoder(),
                     hidden=32, epochs=150, lr=3e-3, holdout=0.25, store=caprecon.Store.temporary())
    held = result.report["held_out"]
    assert held["images"] == 6 and result.report["train_images"] == 18  # split by image
    assert held["spearman"] > 0.5 and held["pairwise_accuracy"] > 0.7  # chance: 0 and 0.5
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["metric"] == "recon" and manifest["rows"] == 144 and manifest["runs"][0]["rows"] == 144
    assert result.report["metric_seconds_per_row"] == pytest.approx(0.1)

    model = DistilledReward.from_pretrained(out, allow_plugins=True)
    assert isinstance(model, torch.nn.Module)
    image = render("red circle")
    right, wrong = model.score([image, image], ["a red circle", "a blue triangle"])
    assert right > wrong + 0.3

    # the folder names its encoders as module:Class plug-ins: code loading it would import
    with pytest.raises(ConfigError, match="plug-in"):
        caprecon.Reward([f"distilled:{out}"], guards=None, cache_dir=str(tmp_path / "cache"))([image], ["a"])
    from caprecon.metrics.distilled import DistilledMetric

    metric = DistilledMetric(model)
    reward = caprecon.Reward([metric], guards=None, cache_dir=str(tmp_path / "cache"))
    assert reward([image, image], ["a red circle", "a blue triangle"]) == pytest.approx([right, wrong], abs=1e-5)
    assert reward.context.stats()["generated"] == 0


def test_default_encoders_are_named_so_the_folder_loads_as_a_reward(tmp_path, run_folder):
    # they were written as module:Class plug-ins, which `distilled:FOLDER` refused to load
    out = tmp_path / "reward"
    distill([run_folder], "recon", out, hidden=8, epochs=1, store=caprecon.Store.temporary())
    config = json.loads((out / "config.json").read_text())
    assert (config["image_encoder"], config["text_encoder"]) == ("efficientnet-lite0", "imagenet-labels")
    got = caprecon.Reward([f"distilled:{out}"], guards=None, cache_dir=str(tmp_path / "cache"))(
        [render("red circle")], ["a red circle"])
    assert len(got) == 1 and isinstance(got[0], float)


def test_pairs_objective_orders_captions_of_one_image(tmp_path, run_folder):
    result = distill([run_folder], "recon", None, image_encoder=PixelEmbedder(), text_encoder=WordEncoder(),
                     objective="pairs", hidden=32, epochs=100, lr=3e-3, holdout=0.25,
                     store=caprecon.Store.temporary())
    assert result.report["held_out"]["pairwise_accuracy"] > 0.7


def test_split_is_by_image_and_bad_settings_are_refused(tmp_path, run_folder):
    held = split_images(["a", "a", "b", "c", "d"], 0.5, 0)
    assert len(held) == 2 and held <= {"a", "b", "c", "d"}
    # the same photos held out wherever they lie (it followed the temporary folder's name before)
    names = [f"img{k}.png" for k in range(20)]
    here, there = (split_images([f"{root}/{n}" for n in names], 0.25, 0) for root in ("/tmp/a", "/data/run7"))
    assert {p.rsplit("/", 1)[1] for p in here} == {p.rsplit("/", 1)[1] for p in there} and len(here) == 5
    with pytest.raises(ConfigError, match="objective"):
        distill([run_folder], "recon", None, objective="ranks")
    with pytest.raises(ConfigError, match="clipscore"):
        distill([run_folder], "clipscore", None, image_encoder=PixelEmbedder(), text_encoder=WordEncoder())
