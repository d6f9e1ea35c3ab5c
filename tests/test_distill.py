"""caprecon distill: a head over frozen encoders learns a metric from run folders' rows, split by
image; the folder it writes loads as an nn.Module, as a metric and as a Reward part."""

from __future__ import annotations

import hashlib
import math
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from oracle import OracleGenerator, PixelEmbedder, render

import caprecon
from caprecon.apps.distill import distill
from caprecon.apps.distill.heldout import split_images
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


# words whose hashes (WordEncoder's) fall on no colour's or shape's dimension: wording, not signal
OPENINGS = ["a", "one", "there is a", "a simple", "a drawing of one", "a single"]
ENDINGS = ["", "on white", "in the middle", "plainly", "alone", "at the centre", "on a page", "here"]


def _shape_captions(root, seed, per_image=10):
    """24 one-shape images drawn into `root`, each with `per_image` captions naming a colour and a shape
    drawn at random, in words drawn at random around them (so that few captions of one image are
    word for word another image's: distill leaves those out of training): (row id, image path, its
    colour, its shape, caption, said colour, said shape)."""
    rng, wording = np.random.default_rng(seed), np.random.default_rng(seed + 100)
    out = []
    for k in range(24):
        colour, shape = COLOURS[k % 6], SHAPES[(k // 6) % 3]
        path = root / f"img{k}.png"
        # the last 6 repeat a colour and shape of the first 18 on a shorter canvas: a new photo of a kind seen
        # before, not the same photo under another path (which distill takes for one image)
        render(f"{colour} {shape}", 96, 96 if k < 18 else 84).save(path)
        for c in range(per_image):
            said_colour, said_shape = COLOURS[rng.integers(6)], SHAPES[rng.integers(3)]
            caption = " ".join(w for w in (OPENINGS[wording.integers(len(OPENINGS))], said_colour, said_shape,
                                           ENDINGS[wording.integers(len(ENDINGS))]) if w)
            out.append((f"{k}-{c}", path, colour, shape, caption, said_colour, said_shape))
    return out


@pytest.fixture(scope="module")
def run_folder(tmp_path_factory):
    """A scored run: 24 one-shape images, each with 10 captions naming some colour and shape; the
    'metric' is 1 for the right colour and shape, 0.5 for one of the two, 0 for neither."""
    root = tmp_path_factory.mktemp("distill")
    rows = [{"id": row_id, "image": str(path), "caption": caption,
             "recon": 0.5 * (said_colour == colour) + 0.5 * (said_shape == shape)}
            for row_id, path, colour, shape, caption, said_colour, said_shape in _shape_captions(root, seed=0)]
    run = root / "run"
    run.mkdir()
    (run / "scores.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    (run / "manifest.json").write_text(json.dumps({"samples": len(rows), "cache": {"model_seconds": 24.0},
                                                   "store": {"root": "somewhere"}}))
    return run


def test_distilled_reward_learns_the_metric_and_loads_three_ways(tmp_path, run_folder):
    out = tmp_path / "reward"
    result = distill([run_folder], "recon", out, image_encoder=PixelEmbedder(), text_encoder=WordEncoder(),
                     hidden=32, epochs=150, lr=3e-3, holdout=0.25, store=caprecon.Store.temporary())
    held = result.report["held_out"]
    assert held["images"] == 6 and result.report["train_images"] == 18  # split by image
    # chance: 0 and 0.5. On captions and photos it never read (0.44 and 0.79 here); when every held-out caption
    # was also a training caption (18 distinct ones) and 6 images were 6 others' photos, this asked for > 0.5
    assert held["spearman"] > 0.3 and held["pairwise_accuracy"] > 0.7
    assert result.report["train_rows_left_out_sharing_a_held_out_caption"] > 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["metric"] == "recon" and manifest["rows"] == 240 and manifest["runs"][0]["rows"] == 240
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
    rows = [{"id": row_id, "image": str(path), "caption": caption}
            for row_id, path, _, _, caption, _, _ in _shape_captions(root, seed=1, per_image=6)]
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
    # on these rows, captions and photos it never read: 0.870 against the value head's 0.499 (0.909 and 0.819
    # when every held-out caption was also a training caption, and a quarter of the held-out photos training ones)
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
    from caprecon.apps.distill.encode import reconstruction_targets
    from caprecon.apps.distill.rows import Row, stored_reconstructions
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
    with pytest.raises(ConfigError,
                       match="scores.jsonl:4: its reconstruction .*gone.png is not in the run's store.*--objective value"):
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
    from caprecon.apps.distill.train import onto_metric

    image, text = np.eye(4)[:3], np.ones((3, 2))

    def head(image_features, text_features):  # the cosines 0.1, 0.4 and 0.7
        return torch.tensor([0.1, 0.4, 0.7]) + 0 * image_features.sum(-1)

    # the metric 2 * cos + 0.3, the middle one 0.01 below the line: by hand, the slope stays
    # (0.3 * 0.6 + 0.3 * 0.6) / (2 * 0.09) = 2 and the intercept drops by a third of 0.01
    mean, scale = onto_metric(head, image, text, np.array([0.5, 1.09, 1.7]))
    assert (mean, scale) == pytest.approx((0.3 - 0.01 / 3, 2.0), abs=1e-6)  # the head works in float32


def test_the_reconstruction_head_compares_in_the_runs_embedder():
    from caprecon.apps.distill.train import runs_embedder

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


# -- bad inputs (issue 51): reconstructions by key, damaged folders, non-finite values, locks ----------


def _strict_json(path):
    """The file parsed as strict JSON: NaN and Infinity are not JSON."""
    def refuse(token):
        raise ValueError(f"{path}: {token} is not JSON")
    return json.loads(path.read_text(), parse_constant=refuse)


def _copy_run(run, folder, change=lambda records: records, manifest=None):
    folder.mkdir()
    records = change([json.loads(line) for line in (run / "scores.jsonl").read_text().splitlines()])
    (folder / "scores.jsonl").write_text("\n".join(json.dumps(r) for r in records))
    (folder / "manifest.json").write_text(json.dumps(manifest if manifest is not None else
                                                     json.loads((run / "manifest.json").read_text())))
    return folder


def test_reconstructions_are_read_from_the_store_by_key_only(tmp_path, recon_run):
    from caprecon.apps.distill.encode import reconstruction_targets
    from caprecon.apps.distill.rows import Row, stored_reconstructions
    from caprecon.metrics.base import Context

    run, cache = recon_run
    settings = dict(image_encoder=PixelEmbedder(), text_encoder=WordEncoder(), hidden=8, epochs=1,
                    store=caprecon.Store.temporary(), progress=False)
    # a row naming a file outside the store (it gave no error before): nothing is read, the row is named
    secret = _copy_run(run, tmp_path / "secret", lambda rs: [{**r, "reconstruction": "/etc/passwd"} if k == 2 else r
                                                              for k, r in enumerate(rs)])
    with pytest.raises(ConfigError, match=r"scores.jsonl:3: its reconstruction /etc/passwd is not in the run's st"):
        distill([secret], "recon", None, objective="reconstruction", **settings)
    assert distill([secret], "recon", None, **settings).report["objective"] == "value"  # auto reads nothing

    # a path elsewhere whose name is a stored key reads the store's picture under that key, not the file named
    records = [json.loads(line) for line in (run / "scores.jsonl").read_text().splitlines()]
    stored = records[0]["reconstruction"]
    decoy = tmp_path / "elsewhere" / Path(stored).name
    decoy.parent.mkdir()
    render("purple triangle").save(decoy)
    store = caprecon.Store.open(cache, read_only=True)
    row = Row("x.png", "a", 0.5, stored_reconstructions({"reconstruction": str(decoy)}, [store]))
    got = reconstruction_targets([row], PixelEmbedder(), Context(caprecon.Store.temporary()))
    unit = PixelEmbedder().embed([Image.open(stored).convert("RGB")])[0]
    assert got[0] == pytest.approx(unit / np.linalg.norm(unit), abs=1e-6)
    # a stored file altered after the run fails its checksum: refused, naming the row
    damaged_store = tmp_path / "store"
    written = caprecon.Store(damaged_store).put_images("reconstruction", {"ab" * 32: (render("red circle"), {})})
    path = written["ab" * 32][1]
    size = path.stat().st_size
    other = __import__("io").BytesIO()
    Image.new("RGB", (8, 8), "blue").save(other, format="PNG")  # another picture, padded to the same size:
    path.write_bytes(other.getvalue().ljust(size, b"\0"))  # it decodes, only its checksum tells
    assert path.stat().st_size == size and Image.open(path).getpixel((0, 0)) == (0, 0, 255)
    store = caprecon.Store.open(damaged_store, read_only=True)
    with pytest.raises(ConfigError, match="row 1 .*fails its checksum"):
        reconstruction_targets([Row("x.png", "a", 0.5, stored_reconstructions({"reconstruction": str(path)}, [store]))],
                               PixelEmbedder(), Context(caprecon.Store.temporary()))


def test_a_distilled_folder_names_no_encoder_outside_itself(tmp_path, run_folder):
    from caprecon.models.distilled import encoder_source

    out = tmp_path / "reward"
    distill([run_folder], "recon", out, hidden=8, epochs=1, store=caprecon.Store.temporary(), progress=False)
    config = json.loads((out / "config.json").read_text())
    (out / "encoders" / "text").mkdir(parents=True)
    (tmp_path / "outside").mkdir()
    for spec in ("/etc", "../outside", str(tmp_path / "outside"), "encoders/../../outside", "no-such-model"):
        (out / "config.json").write_text(json.dumps({**config, "text_encoder": spec}))
        with pytest.raises(ConfigError, match="neither a registered model .* nor a folder inside"):
            DistilledReward.from_pretrained(out)
    assert encoder_source(out, "text_encoder", "encoders/text", False) == str((out / "encoders" / "text").resolve())
    assert encoder_source(out, "image_encoder", "efficientnet-lite0", False) == "efficientnet-lite0"
    (out / "config.json").write_text(json.dumps({**config, "text_encoder": "os:system"}))
    with pytest.raises(ConfigError, match="plug-in 'os:system'.*--allow-plugins"):
        DistilledReward.from_pretrained(out)


def test_allow_plugins_reaches_a_distilled_metric_on_the_command_line(tmp_path, run_folder, capsys):
    from caprecon.cli.commands import main

    out = tmp_path / "reward"
    distill([run_folder], "recon", out, image_encoder=PixelEmbedder(), text_encoder=WordEncoder(), hidden=8,
            epochs=1, store=caprecon.Store.temporary(), progress=False)
    render("red circle").save(tmp_path / "img.png")
    samples = tmp_path / "captions.jsonl"
    samples.write_text(json.dumps({"id": "1", "image": str(tmp_path / "img.png"), "caption": "a red circle"}))
    command = ["score", "-i", str(samples), "-m", f"distilled:{out}", "--cache-dir", str(tmp_path / "cache"), "-q"]
    assert main([*command, "-o", str(tmp_path / "refused")]) == 2
    assert "--allow-plugins" in capsys.readouterr().err
    assert main([*command, "-o", str(tmp_path / "run"), "--allow-plugins"]) == 0
    row = json.loads((tmp_path / "run" / "scores.jsonl").read_text().splitlines()[0])
    expected = DistilledReward.from_pretrained(out, allow_plugins=True).score([render("red circle")], ["a red circle"])
    assert row["distilled"] == pytest.approx(expected[0], abs=1e-5)


def _damage(folder, way):
    """The 20 ways of issue 51 item 5 (and a few more) a distilled folder can be damaged."""
    from safetensors.torch import load, save_file

    config_path, weights_path = folder / "config.json", folder / "model.safetensors"
    config = json.loads(config_path.read_text())
    weights = load(weights_path.read_bytes())  # not mapped: the file is written over below

    def with_config(**changed):
        config_path.write_text(json.dumps({**config, **changed}))

    if way == "weights garbage":
        weights_path.write_bytes(b"\x00\x01not safetensors at all" * 10)
    elif way == "weights empty":
        weights_path.write_bytes(b"")
    elif way == "weights pickled":
        torch.save(weights, str(weights_path))
    elif way == "weights cut short":
        weights_path.write_bytes(weights_path.read_bytes()[:-40])
    elif way == "weights lack a tensor":
        save_file({k: v for k, v in list(weights.items())[1:]}, str(weights_path))
    elif way == "weights have an extra tensor":
        save_file({**weights, "backdoor": torch.zeros(2)}, str(weights_path))
    elif way == "weights are integers":
        save_file({k: v.to(torch.int32) for k, v in weights.items()}, str(weights_path))
    elif way == "weights are NaN":  # one weight of the first tensor
        first = next(iter(weights))
        save_file({**weights, first: weights[first].flatten().index_fill(0, torch.tensor([0]), float("nan"))
                   .reshape(weights[first].shape)}, str(weights_path))
    elif way == "weights padded past their size":  # 8 MB, where the head needs a few hundred kB
        save_file({**weights, "padding": torch.zeros(2_000_000, dtype=torch.float32)}, str(weights_path))
    elif way == "config not JSON":
        config_path.write_text("{'image_dim': 3,")
    elif way == "config empty":
        config_path.write_text("")
    elif way == "config not UTF-8":
        config_path.write_bytes(b"\xff\xfe{}")
    elif way == "config a list":
        config_path.write_text("[1, 2]")
    elif way == "config lacks keys":
        config_path.write_text(json.dumps({k: v for k, v in config.items() if k not in ("hidden", "target_scale")}))
    elif way == "dimension as text":
        with_config(image_dim=str(config["image_dim"]))
    elif way == "dimension fractional":
        with_config(hidden=2.5)
    elif way == "dimension zero":
        with_config(text_dim=0)
    elif way == "dimension a boolean":
        with_config(hidden=True)
    elif way == "scale as text":
        with_config(target_scale="wide")
    elif way == "mean infinite":
        config_path.write_text(json.dumps({**config, "target_mean": float("inf")}))  # json writes Infinity
    elif way == "encoder a number":
        with_config(image_encoder=7)
    elif way == "head unknown":
        with_config(head=["value"])
    elif way == "sizes mismatch the weights":
        with_config(hidden=config["hidden"] + 1)
    elif way == "asks for 40 TB":
        with_config(image_dim=10**7, hidden=10**6)
    elif way == "within bounds but not the weights' sizes":
        with_config(image_dim=65_536, hidden=65_536)
    else:
        raise AssertionError(way)


DAMAGES = {
    "weights garbage": "not a safetensors file", "weights empty": "not a safetensors file",
    "weights pickled": "not a safetensors file", "weights cut short": "not a safetensors file",
    "weights lack a tensor": "lacks", "weights have an extra tensor": "has unknown backdoor",
    "weights are integers": "not floating-point", "weights are NaN": "not finite",
    "weights padded past their size": "more than the .* that the head config.json describes can take",
    "config not JSON": "not valid JSON", "config empty": "not valid JSON", "config not UTF-8": "not valid JSON",
    "config a list": "must be a JSON object", "config lacks keys": "lacks hidden, target_scale",
    "dimension as text": "image_dim must be a whole number", "dimension fractional": "hidden must be a whole number",
    "dimension zero": "text_dim must be a whole number", "dimension a boolean": "hidden must be a whole number",
    "scale as text": "target_scale must be a finite number", "mean infinite": "target_mean must be a finite number",
    "encoder a number": "image_encoder must name a model", "head unknown": "unknown head",
    "sizes mismatch the weights": "do not belong together", "asks for 40 TB": "image_dim must be a whole number from 1",
    "within bounds but not the weights' sizes": "do not belong together",
}


@pytest.fixture(scope="module")
def distilled_folder(tmp_path_factory, run_folder):
    out = tmp_path_factory.mktemp("distilled") / "reward"
    distill([run_folder], "recon", out, image_encoder=PixelEmbedder(), text_encoder=WordEncoder(), hidden=8,
            epochs=1, store=caprecon.Store.temporary(), progress=False)
    return out


@pytest.mark.parametrize("way", list(DAMAGES))
def test_a_damaged_distilled_folder_says_what_is_wrong(tmp_path, distilled_folder, way):
    import shutil

    folder = tmp_path / "reward"
    shutil.copytree(distilled_folder, folder)
    _damage(folder, way)
    with pytest.raises(ConfigError, match=DAMAGES[way]):
        DistilledReward.from_pretrained(folder, allow_plugins=True)  # its encoders are the tests' plug-ins


def test_a_damaged_folder_is_one_line_on_the_command_line(tmp_path, distilled_folder, capsys):
    import shutil

    from caprecon.cli.commands import main

    folder = tmp_path / "reward"
    shutil.copytree(distilled_folder, folder)
    _damage(folder, "weights pickled")
    render("red circle").save(tmp_path / "img.png")
    samples = tmp_path / "captions.jsonl"
    samples.write_text(json.dumps({"id": "1", "image": str(tmp_path / "img.png"), "caption": "a red circle"}))
    assert main(["score", "-i", str(samples), "-m", f"distilled:{folder}", "-o", str(tmp_path / "run"), "-q",
                 "--cache-dir", str(tmp_path / "cache"), "--allow-plugins"]) == 2
    err = capsys.readouterr().err
    assert "not a safetensors file" in err and "Traceback" not in err


def test_non_finite_values_are_refused_naming_their_rows_and_json_is_strict(tmp_path, run_folder):
    settings = dict(image_encoder=PixelEmbedder(), text_encoder=WordEncoder(), hidden=8, epochs=1,
                    store=caprecon.Store.temporary(), progress=False)

    def set_values(values):
        return lambda rs: [{**r, "recon": values.get(k, r["recon"])} for k, r in enumerate(rs)]

    bad = _copy_run(run_folder, tmp_path / "nan", set_values({2: float("nan"), 6: float("inf")}))
    with pytest.raises(ConfigError, match=r"not a finite number .* 2 row\(s\): .*scores.jsonl:3, .*scores.jsonl:7"):
        distill([bad], "recon", None, **settings)
    # finite, their mean too, but their spread overflows (squares of 1e160 are beyond the largest float)
    huge = _copy_run(run_folder, tmp_path / "huge", set_values({k: (-1) ** k * 1e160 for k in range(240)}))
    with pytest.raises(ConfigError, match="too large to learn"):
        distill([huge], "recon", None, **settings)
    # every value equal: the held-out correlations are undefined, written as null in strict JSON
    flat = _copy_run(run_folder, tmp_path / "flat", set_values({k: 0.25 for k in range(240)}))
    result = distill([flat], "recon", tmp_path / "out", **{**settings, "store": caprecon.Store.temporary()})
    assert result.report["held_out"]["spearman"] is None
    assert _strict_json(tmp_path / "out" / "manifest.json")["report"]["held_out"]["spearman"] is None
    assert _strict_json(tmp_path / "out" / "config.json")["target_scale"] == 1.0


def test_distill_holds_its_out_folder_and_redacts_its_manifest(tmp_path, run_folder):
    from caprecon.run.folder import LOCK_FILE, run_folder as lock

    secret = "sk-distill-0123456789abcdef"
    manifest = {"samples": 144, "config": {"embedder": "x", "embedder_options": {"api_key": secret}}}
    run = _copy_run(run_folder, tmp_path / "run", manifest=manifest)
    out = tmp_path / "reward"
    settings = dict(image_encoder=PixelEmbedder(), text_encoder=WordEncoder(), hidden=8, epochs=1,
                    store=caprecon.Store.temporary(), progress=False)
    done = []

    def other_thread():
        try:
            distill([run], "recon", out, **settings)
        except ConfigError as exc:
            done.append(str(exc))

    import threading

    with lock(out):  # another run holds it: in this process, on another thread
        worker = threading.Thread(target=other_thread)
        worker.start()
        worker.join()
    assert done and "in use by another run" in done[0]
    assert not (out / "config.json").exists()
    distill([run], "recon", out, **settings)
    assert sorted(p.name for p in out.iterdir()) == sorted([LOCK_FILE, "config.json", "manifest.json",
                                                            "model.safetensors"])
    assert secret not in (out / "manifest.json").read_text()
    with pytest.raises(ConfigError, match="not empty"):
        distill([run], "recon", out, **settings)


def test_two_threads_of_one_process_never_hold_one_run_folder(tmp_path):
    import threading

    from caprecon.run.folder import run_folder as lock

    out, ready, release = tmp_path / "run", threading.Event(), threading.Event()
    outcome = {}

    def first():
        with lock(out):
            ready.set()
            release.wait(10)
        outcome["first"] = "held"

    def second():
        ready.wait(10)
        try:
            with lock(out):
                outcome["second"] = "held"
        except ConfigError as exc:
            outcome["second"] = str(exc)
        release.set()

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert outcome["first"] == "held" and "in use by another run in this process" in outcome["second"]
    with lock(out):  # released: the next run takes it; and a call nested on one thread is the same run
        with lock(out):
            pass


def test_distill_warns_when_its_text_encoder_chose_the_reconstructions(tmp_path, run_folder, caplog):
    settings = dict(image_encoder=PixelEmbedder(), text_encoder=WordEncoder(), hidden=8, epochs=1,
                    store=caprecon.Store.temporary(), progress=False)
    chose = {"models": {"generator": {"backend": "retrieval", "matcher": {"fingerprint": WordEncoder.fingerprint}}}}
    shared = _copy_run(run_folder, tmp_path / "shared", manifest=chose)
    apart = _copy_run(run_folder, tmp_path / "apart", manifest={"models": {"generator": {
        "matcher": {"fingerprint": "label-words-0"}}}})
    with caplog.at_level("WARNING"):
        assert distill([apart], "recon", None, **settings).report["text_encoder_chose_reconstructions"] is False
        assert "chose its reconstructions" not in caplog.text
        assert distill([shared], "recon", None, **settings).report["text_encoder_chose_reconstructions"] is True
    assert "the one the runs' generator chose its reconstructions with" in caplog.text


def test_distill_shows_its_stages(tmp_path, run_folder, capsys):
    from caprecon.cli.commands import main

    assert main(["distill", str(run_folder), "-m", "recon", "-o", str(tmp_path / "reward"), "--epochs", "2",
                 "--hidden", "8", "--cache-dir", str(tmp_path / "cache")]) == 0
    captured = capsys.readouterr()
    for stage in ("distill: caption features", "distill: image features", "distill: training (value)"):
        assert stage in captured.err
    assert f"outputs: {tmp_path / 'reward'}" in captured.out


def test_label_word_stand_in_matches_by_label_words_alone():
    from label_words import LabelWordMatcher, words

    matcher = LabelWordMatcher()
    assert words("Dogs and a Tabby cat, grass") == ["dog", "tabby", "cat", "grass"]
    got = matcher.embed_texts(["Dogs and a tabby cat", "zzz qqq"])
    expected = np.zeros(len(matcher.vocabulary))
    for word in ("dog", "tabby", "cat"):  # "hot dog", "tabby cat"
        expected[matcher.column[word]] = 1 / math.sqrt(3)
    assert got[0] == pytest.approx(expected, abs=1e-6) and not got[1].any()


def test_config_and_manifest_are_strict_json(tmp_path):
    from caprecon.run.folder import write_manifest

    config = {"image_encoder": "efficientnet-lite0", "text_encoder": "imagenet-labels", "image_dim": 4, "text_dim": 3,
              "hidden": 2, "target_mean": float("inf"), "target_scale": 1.0}
    with pytest.raises(ValueError, match="not JSON compliant"):
        DistilledReward(config).save_pretrained(tmp_path / "reward")
    write_manifest(tmp_path, {"figures": {"spearman": float("nan"), "speedup": [float("-inf"), 2.0]}})
    assert _strict_json(tmp_path / "manifest.json") == {"figures": {"spearman": None, "speedup": [None, 2.0]}}
