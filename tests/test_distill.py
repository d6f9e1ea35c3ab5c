"""caprecon distill: a head over frozen encoders learns a metric from run folders' rows, split by
image; the folder it writes loads as an nn.Module, as a metric and as a Reward part."""

from __future__ import annotations

import hashlib
import math
import json

import numpy as np
import pytest
import torch
from PIL import Image

from oracle import OracleGenerator, PixelEmbedder, render

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


def _shape_captions(root, seed):
    """24 one-shape images drawn into `root`, each with 6 captions naming a colour and a shape
    drawn at random: (row id, image path, its colour, its shape, said colour, said shape)."""
    rng = np.random.default_rng(seed)
    out = []
    for k in range(24):
        colour, shape = COLOURS[k % 6], SHAPES[(k // 6) % 3]
        path = root / f"img{k}.png"
        render(f"{colour} {shape}").save(path)
        for c in range(6):
            said_colour, said_shape = COLOURS[rng.integers(6)], SHAPES[rng.integers(3)]
            out.append((f"{k}-{c}", path, colour, shape, said_colour, said_shape))
    return out


@pytest.fixture(scope="module")
def run_folder(tmp_path_factory):
    """A scored run: 24 one-shape images, each with 6 captions naming some colour and shape; the
    'metric' is 1 for the right colour and shape, 0.5 for one of the two, 0 for neither."""
    root = tmp_path_factory.mktemp("distill")
    rows = [{"id": row_id, "image": str(path), "caption": f"a {said_colour} {said_shape}",
             "recon": 0.5 * (said_colour == colour) + 0.5 * (said_shape == shape)}
            for row_id, path, colour, shape, said_colour, said_shape in _shape_captions(root, seed=0)]
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


@pytest.fixture(scope="module")
def recon_run(tmp_path_factory):
    """A real recon run (the oracle draws each caption, PixelEmbedder compares): 24 one-shape
    images with 6 captions each, scored by `caprecon.score` into a run folder whose rows name
    their reconstructions in the store."""
    root = tmp_path_factory.mktemp("distill-recon")
    rows = [{"id": row_id, "image": str(path), "caption": f"a {said_colour} {said_shape}"}
            for row_id, path, _, _, said_colour, said_shape in _shape_captions(root, seed=1)]
    caprecon.score(rows, ["recon"], generator=OracleGenerator(), embedder=PixelEmbedder(), max_side=32,
                   out=root / "run", cache_dir=str(root / "cache"))
    return root / "run", root / "cache"


def test_reconstruction_objective_learns_the_metrics_own_form(tmp_path, recon_run):
    run, cache = recon_run
    settings = dict(image_encoder=PixelEmbedder(), text_encoder=WordEncoder(), hidden=64, epochs=150, lr=3e-3,
                    holdout=0.25, cache_dir=cache)
    result = distill([run], "recon", tmp_path / "reward", **settings)  # auto: the rows name reconstructions
    value = distill([run], "recon", None, objective="value", **settings)
    assert result.report["objective"] == "reconstruction" and value.report["objective"] == "value"
    held = result.report["held_out"]
    # on these rows: 0.909 against the value head's 0.819
    assert held["spearman"] > 0.85 and held["spearman"] > value.report["held_out"]["spearman"] + 0.05

    # the reward is the image's cosine with the caption's predicted reconstruction embedding, on the
    # metric's scale: worked out here from the saved weights with numpy
    model = DistilledReward.from_pretrained(tmp_path / "reward", allow_plugins=True)
    config = json.loads((tmp_path / "reward" / "config.json").read_text())
    assert config["head"] == "reconstruction"
    w = {k: v.numpy().astype(np.float64) for k, v in model.head.state_dict().items()}
    image, captions = render("green square"), ["a green square", "a red circle"]
    text = WordEncoder().embed_texts(captions).astype(np.float64)
    hidden = text @ w["text.0.weight"].T + w["text.0.bias"]
    hidden = 0.5 * hidden * (1 + np.vectorize(math.erf)(hidden / math.sqrt(2)))  # exact GELU
    predicted = hidden @ w["text.2.weight"].T + w["text.2.bias"]
    unit = PixelEmbedder().embed([image])[0].astype(np.float64)
    by_hand = config["target_scale"] * (predicted @ (unit / np.linalg.norm(unit))) + config["target_mean"]
    assert model.score([image, image], captions) == pytest.approx(by_hand.tolist(), abs=1e-5)
    # with the oracle's drawings learnt, the line onto the metric is ReconScore's (1 + cos) / 2
    assert config["target_scale"] == pytest.approx(0.5, abs=0.05) and config["target_mean"] == pytest.approx(0.5, abs=0.05)
    records = [json.loads(line) for line in (run / "scores.jsonl").read_text().splitlines()]
    got = model.score([Image.open(r["image"]) for r in records], [r["caption"] for r in records])
    error = np.abs(np.array(got) - [r["recon"] for r in records])
    assert error.mean() < 0.03 and error.max() < 0.2  # on the metric's own scale (0.022 and 0.126 here)


def test_reconstruction_targets_average_a_rows_seeds(tmp_path):
    from caprecon.apps.distill import Row, reconstruction_targets, stored_reconstructions
    from caprecon.metrics.base import Context

    store = caprecon.Store(tmp_path / "store")
    names = ("red circle", "blue square", "green triangle")
    keys = [hashlib.sha256(n.encode()).hexdigest() for n in names]
    written = store.put_images("reconstruction", {k: (render(n), {}) for k, n in zip(keys, names)})
    paths = [str(written[k][1]) for k in keys]
    rows = [Row("x.png", "a", 0.5, stored_reconstructions({"reconstructions": paths[:2]}, [store])),
            Row("x.png", "b", 0.5, stored_reconstructions({"reconstruction": paths[2]}, [store]))]
    got = reconstruction_targets(rows, PixelEmbedder(), Context(caprecon.Store.temporary()))
    unit = PixelEmbedder().embed([render(n) for n in names])
    assert got == pytest.approx(np.stack([(unit[0] + unit[1]) / 2, unit[2]]), abs=1e-6)


def test_reconstruction_objective_needs_reconstructions(tmp_path, run_folder, recon_run):
    # auto falls back to value on rows that name none; asked for by name, it is refused naming a row
    result = distill([run_folder], "recon", None, image_encoder=PixelEmbedder(), text_encoder=WordEncoder(),
                     hidden=8, epochs=1, store=caprecon.Store.temporary())
    assert result.report["objective"] == "value"
    with pytest.raises(ConfigError, match="row 1 .*names no reconstruction"):
        distill([run_folder], "recon", None, objective="reconstruction")
    # a reconstruction gone from the store: named, with what to do
    run, _ = recon_run
    copy = tmp_path / "run"
    copy.mkdir()
    records = [json.loads(line) for line in (run / "scores.jsonl").read_text().splitlines()]
    records[3]["reconstruction"] = str(tmp_path / "gone.png")
    (copy / "scores.jsonl").write_text("\n".join(json.dumps(r) for r in records))
    (copy / "manifest.json").write_text((run / "manifest.json").read_text())
    with pytest.raises(ConfigError, match="row 4 .*gone.png is not in the run's store.*--objective value"):
        distill([copy], "recon", None, objective="reconstruction", image_encoder=PixelEmbedder(),
                text_encoder=WordEncoder(), hidden=8, epochs=1, holdout=0.05, store=caprecon.Store.temporary())
    assert distill([copy], "recon", None, image_encoder=PixelEmbedder(), text_encoder=WordEncoder(), hidden=8,
                   epochs=1, store=caprecon.Store.temporary()).report["objective"] == "value"


def test_a_folder_naming_an_unknown_head_is_refused(tmp_path, run_folder):
    out = tmp_path / "reward"
    distill([run_folder], "recon", out, hidden=8, epochs=1, store=caprecon.Store.temporary())
    config = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**config, "head": "transformer"}))
    with pytest.raises(ConfigError, match="unknown head 'transformer'"):
        DistilledReward.from_pretrained(out)


def test_the_line_onto_the_metric_is_least_squares():
    from caprecon.apps.distill import onto_metric

    image, text = np.eye(4)[:3], np.ones((3, 2))

    def head(image_features, text_features):  # the cosines 0.1, 0.4 and 0.7
        return torch.tensor([0.1, 0.4, 0.7]) + 0 * image_features.sum(-1)

    # the metric 2 * cos + 0.3, the middle one 0.01 below the line: by hand, the slope stays
    # (0.3 * 0.6 + 0.3 * 0.6) / (2 * 0.09) = 2 and the intercept drops by a third of 0.01
    mean, scale = onto_metric(head, image, text, np.array([0.5, 1.09, 1.7]))
    assert (mean, scale) == pytest.approx((0.3 - 0.01 / 3, 2.0), abs=1e-6)  # the head works in float32


def test_the_reconstruction_head_compares_in_the_runs_embedder():
    from caprecon.apps.distill import runs_embedder

    assert runs_embedder([{"embedder": "dinov2"}, {"embedder": "dinov2", "embedder_options": {}}]) == "dinov2"
    assert runs_embedder([{"embedder": "dinov2"}, {"embedder": "dreamsim"}]) is None  # they differ
    assert runs_embedder([{"embedder": "mypkg.features:Embedder"}]) is None  # code: not loaded unasked
    assert runs_embedder([{"embedder": "dinov2", "embedder_options": {"device": "cuda"}}]) is None  # not saved
    assert runs_embedder([{"embedder": None}]) is None


def test_auto_takes_the_reconstruction_head_only_for_a_metric_comparing_embeddings(tmp_path, recon_run):
    # a VQAScore-like column of a run whose rows name reconstructions: its value is no cosine of
    # embeddings, so auto learns the value; recon in the same run still gets the reconstruction head
    run, _ = recon_run
    copy = tmp_path / "run"
    copy.mkdir()
    records = [{**json.loads(line), "judged": 0.3} for line in (run / "scores.jsonl").read_text().splitlines()]
    (copy / "scores.jsonl").write_text("\n".join(json.dumps(r) for r in records))
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["metrics"].append({"metric": "vqascore", "column": "judged", "vlm": {"class": "Judge"}})
    (copy / "manifest.json").write_text(json.dumps(manifest))
    settings = dict(image_encoder=PixelEmbedder(), text_encoder=WordEncoder(), hidden=8, epochs=1,
                    store=caprecon.Store.temporary())
    assert distill([copy], "judged", None, **settings).report["objective"] == "value"
    assert distill([copy], "recon", None, **settings).report["objective"] == "reconstruction"
