"""The store for training: what a run keeps (`--keep images|vectors|none`) and the size cap.

The oracle draws the shapes a caption names and the pixel embedder compares ink, so each
expected ReconScore is worked out here from the two pictures directly."""

from __future__ import annotations

import json
import sqlite3

import numpy as np
import pytest
from PIL import Image

from oracle import CountingOracle, PixelEmbedder, expected_recon, render

import caprecon
from caprecon.apps.reward import Reward
from caprecon.core.errors import ConfigError
from caprecon.reports.html.collect import manifest_highlights
from caprecon.store.index import Store
from caprecon.store.maintenance import cache_verify

CAPTIONS = ["red circle blue square", "green triangle", "red circle"]



@pytest.fixture
def rows(tmp_path):
    folder = tmp_path / "photos"
    folder.mkdir()
    out = []
    for i, caption in enumerate(CAPTIONS):
        path = folder / f"{i}.png"
        render("red circle blue square" if i != 1 else "green triangle").save(path)
        out.append({"id": str(i), "image": str(path), "caption": caption})
    return out


def pictures(cache) -> list:
    return sorted(p for p in (cache / "images").rglob("*") if p.is_file())


def run(rows, cache, keep, out=None):
    generator = CountingOracle()
    results = caprecon.score(rows, ["recon"], generator=generator, embedder=PixelEmbedder(), max_side=96,
                             cache_dir=str(cache), keep=keep, out=out, workers=0)
    return [r["recon"] for r in results.records], generator, results


def test_vectors_keeps_no_picture_and_a_rerun_generates_nothing(tmp_path, rows):
    cache = tmp_path / "cache"
    want = [expected_recon(Image.open(r["image"]).convert("RGB"), r["caption"]) for r in rows]
    first, generator, results = run(rows, cache, "vectors", out=tmp_path / "run1")
    assert first == pytest.approx(want, abs=1e-6)
    assert len(generator.prompts) == 3
    assert pictures(cache) == []  # no picture file anywhere in the cache
    assert all(r["reconstruction"] is None for r in results.records)
    kinds = dict(sqlite3.connect(cache / "index.sqlite").execute(
        "SELECT kind, count(*) FROM results GROUP BY kind").fetchall())
    assert kinds["reconstruction-record"] == 3 and "reconstruction" not in kinds
    assert kinds["embedding"] == 5  # 2 distinct sources, 3 reconstructions
    again, generator, _ = run(rows, cache, "vectors", out=tmp_path / "run2")
    assert generator.prompts == []  # scored from the kept embeddings
    assert again == first
    manifest = json.loads((tmp_path / "run2" / "manifest.json").read_text())
    assert manifest["store"]["keep"] == "vectors"
    shown = dict(manifest_highlights(manifest))
    assert shown["reconstructions"].startswith("not kept as pictures (--keep vectors)")
    report = cache_verify(cache)
    assert report["ok"] and report["missing_files"] == [] and report["entries"] >= 8


def test_images_policy_over_a_vectors_store_makes_a_picture_only_when_asked(tmp_path, rows):
    cache = tmp_path / "cache"
    run(rows, cache, "vectors")
    # recon needs no pixels of a reconstruction whose embedding is kept: nothing is generated
    _, generator, _ = run(rows, cache, "images")
    assert generator.prompts == [] and pictures(cache) == []
    # a metric that asks for the pixels gets them made again, which is no damage
    store = Store(cache)
    ctx = caprecon.metrics.Context(store)
    from caprecon.data.images import read_image
    from caprecon.data.samples import Sample

    generator = CountingOracle()
    item = read_image(Sample(id="0", image=rows[0]["image"], caption=rows[0]["caption"]))
    recon = ctx.reconstructor(generator, caprecon.metrics.ReconScore(generator, PixelEmbedder(), max_side=96).spec)
    [rebuilt] = recon.reconstruct([item])
    assert rebuilt.path is None and generator.prompts == []
    assert np.array_equal(np.asarray(rebuilt.image()), np.asarray(render(rows[0]["caption"], 96, 96)))
    assert len(generator.prompts) == 1 and recon.damaged == 0
    assert len(pictures(cache)) == 1  # this store keeps images: the picture made now is kept


def test_none_keeps_nothing_and_scores_the_same(tmp_path, rows):
    cache = tmp_path / "cache"
    first, generator, _ = run(rows, cache, "none")
    assert len(generator.prompts) == 3
    assert pictures(cache) == []
    assert sqlite3.connect(cache / "index.sqlite").execute("SELECT count(*) FROM results").fetchone()[0] == 0
    assert sqlite3.connect(cache / "index.sqlite").execute("SELECT count(*) FROM claims").fetchone()[0] == 0
    again, generator, _ = run(rows, cache, "none")
    assert len(generator.prompts) == 3 and again == first  # nothing kept: made again, the same


def test_reward_keep_vectors_reuses_across_rewards(tmp_path):
    images = [render("red circle blue square"), render("green triangle")]
    captions = ["red circle", "green triangle"]

    def reward():
        generator = CountingOracle()
        return Reward(["recon"], generator=generator, embedder=PixelEmbedder(), max_side=96, guards=None,
                      cache_dir=str(tmp_path / "cache"), keep="vectors"), generator

    first, generator = reward()
    got = first(images, captions)
    assert got == pytest.approx([expected_recon(i, c) for i, c in zip(images, captions)], abs=1e-6)
    assert len(generator.prompts) == 2 and pictures(tmp_path / "cache") == []
    second, generator = reward()  # a new process over the same store: no generation
    assert second(images, captions) == got and generator.prompts == []


def test_bad_policies_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="--keep must be one of images, vectors, none, not 'pictures'"):
        Reward(["recon"], keep="pictures")
    with pytest.raises(ConfigError, match="--cache-max-size"):
        Store(tmp_path / "s", max_size=0)


def _sizes(cache) -> list[tuple[str, int]]:
    db = sqlite3.connect(cache / "index.sqlite")
    return db.execute("SELECT key, length(value) + coalesce(file_size, 0) FROM results ORDER BY created").fetchall()


def test_size_cap_deletes_the_oldest_down_to_nine_tenths(tmp_path):
    store = Store(tmp_path / "s", read_only=False)
    # ten values of 100 bytes each ("x" * 98 and its JSON quotes), written one by one: oldest first
    for i in range(10):
        store.put_json("answer", {f"k{i}": "x" * 98})
    assert [n for _, n in _sizes(tmp_path / "s")] == [100] * 10
    store.max_size = 500
    assert store.enforce_cap() == 6  # 1000 bytes down to at most 450: six oldest go, 400 remain
    assert [k for k, _ in _sizes(tmp_path / "s")] == ["k6", "k7", "k8", "k9"]
    store.max_size = 400
    assert store.enforce_cap() == 0  # at the cap is within it


def test_a_capped_store_enforces_its_cap_as_it_writes(tmp_path):
    store = Store(tmp_path / "s", read_only=False, max_size=1000)
    for i in range(30):
        store.put_json("answer", {f"k{i}": "x" * 98})
        assert sum(n for _, n in _sizes(tmp_path / "s")) <= 1000 + 100  # past the cap by one write at most
    kept = [k for k, _ in _sizes(tmp_path / "s")]
    assert kept == [f"k{i}" for i in range(30 - len(kept), 30)]  # the newest


@pytest.mark.parametrize("keep", ["vectors", "none"])
def test_a_store_that_keeps_no_picture_makes_no_picture_folders(tmp_path, keep):
    """A store that keeps pictures makes its 256 folders 00..ff when it opens; under `vectors` or
    `none` no picture is ever written, so it makes its root and index but no folder for them."""
    Store(tmp_path / "pictures", keep="images")
    assert sorted(p.name for p in (tmp_path / "pictures" / "images").iterdir()) == [f"{i:02x}" for i in range(256)]
    Store(tmp_path / keep, keep=keep, read_only=False)  # asked for writable: no probe has made the folder
    assert (tmp_path / keep / "index.sqlite").is_file()
    assert sorted(p.name for p in (tmp_path / keep).iterdir() if p.is_dir()) == []
