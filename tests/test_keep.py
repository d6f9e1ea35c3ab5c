"""The store for training: what a run keeps (`--keep images|vectors|none`) and the size cap.

The oracle draws the shapes a caption names and the pixel embedder compares ink, so each
expected ReconScore is worked out here from the two pictures directly."""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
import time

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
def test_picture_folders_are_made_by_the_pictures_filed_in_them(tmp_path, keep):
    """A store makes no picture folder when it opens: the first picture filed under `images/ab/` makes
    that folder, and only that one (a fresh cache that made all 256 at once made about 100 more than
    256 pictures fill). Under `vectors` or `none` no picture is written, so no folder is made even
    as images are put: the root and its index alone."""
    store = Store(tmp_path / "pictures", keep="images")
    assert not (tmp_path / "pictures" / "images").exists()
    picture = Image.new("RGB", (8, 6), (200, 30, 10))
    keys = ["ab" + "0" * 62, "ab" + "1" * 62, "c7" + "2" * 62]
    store.put_images("reconstruction", {k: (picture, {"seed": i}) for i, k in enumerate(keys)})
    assert sorted(p.name for p in (tmp_path / "pictures" / "images").iterdir()) == ["ab", "c7"]
    found = store.get_images(keys, verify=True)
    assert sorted(found) == sorted(keys) and [found[k][0]["seed"] for k in keys] == [0, 1, 2]
    with Image.open(found[keys[2]][1]) as back:
        assert back.convert("RGB").getpixel((3, 2)) == (200, 30, 10)
    other = Store(tmp_path / keep, keep=keep, read_only=False)  # asked for writable: no probe has made the folder
    other.put_images("reconstruction", {keys[0]: (picture, {"seed": 0})})
    assert (tmp_path / keep / "index.sqlite").is_file()
    assert sorted(p.name for p in (tmp_path / keep).iterdir() if p.is_dir()) == []


# -- claims on pictures not kept: a waiter finds what was computed from the picture, not the record alone


class _Signal(logging.Handler):
    """Sets `event` when the reconstructor says it waits for another process's claims."""

    def __init__(self, event: threading.Event):
        super().__init__(logging.INFO)
        self.event = event

    def emit(self, record: logging.LogRecord) -> None:
        if "another process is generating" in record.getMessage():
            self.event.set()


@pytest.fixture
def waiting(caplog):
    """An event set when a reconstructor starts to wait on a claim another store holds."""
    event = threading.Event()
    name = "caprecon.reconstruct.reconstructor"
    caplog.set_level(logging.INFO, logger=name)
    handler = _Signal(event)
    logging.getLogger(name).addHandler(handler)
    yield event
    logging.getLogger(name).removeHandler(handler)


def test_a_replica_waiting_on_a_claim_under_vectors_scores_from_the_embedding_not_a_second_picture(tmp_path, waiting):
    """Two replicas (two rewards, each with its own store, on one cache) get the same completion. A
    makes the picture, and its embedder is held back before A writes the reconstruction's embedding; B
    asks meanwhile. Under `vectors`, A's claim lasts until that embedding is written: B waits for it,
    then scores from A's embedding and generates nothing. When the claim went with the record, B found
    the record alone, missed the embedding and drew the picture a second time."""
    photo, caption = render("red circle"), "a blue square"
    gate, held = threading.Event(), threading.Event()

    class HeldEmbedder(PixelEmbedder):
        calls = 0

        def embed(self, images):
            self.calls += 1
            if self.calls == 2:  # the reconstruction's, after the photo's
                held.set()
                gate.wait(60)
            return super().embed(images)

    class SignallingOracle(CountingOracle):
        def generate(self, requests):
            waiting.set()  # B moved: it draws the picture itself
            return super().generate(requests)

    def reward(generator, embedder):
        return Reward(["recon"], generator=generator, embedder=embedder, max_side=96, guards=None,
                      cache_dir=str(tmp_path / "cache"), keep="vectors", progress=False)

    maker, waiter = CountingOracle(), SignallingOracle()
    first, second = reward(maker, HeldEmbedder()), reward(waiter, PixelEmbedder())
    got: dict[str, list] = {}
    a = threading.Thread(target=lambda: got.update(a=first([photo], [caption])), daemon=True)
    b = threading.Thread(target=lambda: got.update(b=second([photo], [caption])), daemon=True)
    try:
        a.start()
        assert held.wait(60)  # A wrote the record; the embedding waits for the gate
        b.start()
        assert waiting.wait(60)  # B waits on A's claim (or draws the picture itself)
    finally:
        gate.set()
        a.join(60)
        b.join(60)
    assert not a.is_alive() and not b.is_alive()
    assert got["a"] == pytest.approx([expected_recon(photo, caption)], abs=1e-6) and got["b"] == got["a"]
    assert len(maker.prompts) == 1 and waiter.prompts == []  # one picture across both
    assert pictures(tmp_path / "cache") == []


def test_claims_on_pictures_not_kept_last_until_the_block_that_made_them_ends(tmp_path):
    """Inside `keeping_claims`, a claim on a picture the store does not keep outlives the record's
    write (renewed past its lease) and goes when the block ends; until then another store does not
    count the record as there. Outside a block the claim goes with the record, as for a picture."""
    mine, other = Store(tmp_path, keep="vectors", lease_seconds=0.6), Store(tmp_path, keep="vectors")
    picture = (Image.new("RGB", (4, 4), "red"), {"n": 1})
    assert mine.claim(["k"]) == {"k"}
    with mine.keeping_claims():
        with mine.holding(["k"]) as handed:
            mine.put_images("reconstruction", {"k": picture}, release=["k"])
            handed.add("k")
        time.sleep(1.0)  # past the lease: the heartbeat renews a kept claim
        assert other.claim(["k"]) == set()
        assert other.get_images(["k"], records=True) == {}  # recorded, not done
        assert mine.get_images(["k"], records=True) == {"k": ({"n": 1}, None, None)}  # its maker sees it
    assert other.get_images(["k"], records=True) == {"k": ({"n": 1}, None, None)}
    assert other.claim(["k"]) == {"k"}
    assert mine.claim(["j"]) == {"j"}
    mine.put_images("reconstruction", {"j": picture}, release=["j"])
    assert other.claim(["j"]) == {"j"}  # no block: the claim went with the record
    # with write_behind, the release is queued behind the block's writes
    mine.write_behind = True
    assert mine.claim(["w"]) == {"w"}
    with mine.keeping_claims():
        mine.put_images("reconstruction", {"w": picture}, release=["w"])
        mine.put_arrays("embedding", {"e": np.ones(3, dtype=np.float32)})
    mine.flush()
    assert other.get_arrays(["e"])["e"].tolist() == [1.0, 1.0, 1.0] and other.claim(["w"]) == {"w"}


def test_a_store_waiting_on_another_claim_keeps_none_of_its_own(tmp_path, waiting):
    """A process that keeps a claim (its picture's embedding not written yet) and then waits for
    another's lets its own go first: two processes each keeping what the other waits for would
    wait for ever."""
    from caprecon.data.images import read_image
    from caprecon.data.samples import Sample
    from caprecon.reconstruct.reconstructor import Reconstructor, ReconstructionSpec

    render("red circle").save(tmp_path / "photo.png")
    first, second = (read_image(Sample(id=str(i), image=tmp_path / "photo.png", caption=c))
                     for i, c in enumerate(["a red circle", "a green triangle"]))
    mine, other = Store(tmp_path / "cache", keep="vectors"), Store(tmp_path / "cache", keep="vectors")
    generator = CountingOracle()
    reconstructor = Reconstructor(generator, mine, ReconstructionSpec(max_side=96), poll_seconds=0.05)
    (kept, _), (wanted, _) = reconstructor.requests_for([first, second])
    assert other.claim([wanted]) == {wanted}  # another process is making the second

    def work():
        with mine.keeping_claims():
            reconstructor.reconstruct([first])  # made; its claim kept
            reconstructor.reconstruct([second])  # waits on the other's claim

    worker = threading.Thread(target=work, daemon=True)
    worker.start()
    try:
        assert waiting.wait(30)
        deadline = time.monotonic() + 10
        while other.claimed_elsewhere([kept]) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert other.claimed_elsewhere([kept]) == set()  # let go before waiting
    finally:
        other.release([wanted])  # the other gave up: this process makes it itself
        worker.join(30)
    assert not worker.is_alive() and len(generator.prompts) == 2


def test_a_short_wait_on_another_claim_keeps_its_own(tmp_path, waiting):
    """Waiting on another's claim, a process keeps its own kept claims for `KEPT_PATIENCE_S` (the other
    may only be ending its batch; let go at once, a third could take the record before its embedding)."""
    from caprecon.data.images import read_image
    from caprecon.data.samples import Sample
    from caprecon.reconstruct.reconstructor import Reconstructor, ReconstructionSpec

    render("red circle").save(tmp_path / "photo.png")
    first, second = (read_image(Sample(id=str(i), image=tmp_path / "photo.png", caption=c))
                     for i, c in enumerate(["a red circle", "a green triangle"]))
    mine, other = Store(tmp_path / "cache", keep="vectors"), Store(tmp_path / "cache", keep="vectors")
    reconstructor = Reconstructor(CountingOracle(), mine, ReconstructionSpec(max_side=96), poll_seconds=0.05)
    reconstructor.KEPT_PATIENCE_S = 30.0  # longer than this test waits: the claim must still be held
    (kept, _), (wanted, _) = reconstructor.requests_for([first, second])
    assert other.claim([wanted]) == {wanted}

    def work():
        with mine.keeping_claims():
            reconstructor.reconstruct([first])
            reconstructor.reconstruct([second])

    worker = threading.Thread(target=work, daemon=True)
    worker.start()
    try:
        assert waiting.wait(30)
        time.sleep(0.3)  # several polls of the wait
        assert other.claimed_elsewhere([kept]) == {kept}
    finally:
        other.release([wanted])
        worker.join(30)
    assert not worker.is_alive()


@pytest.mark.parametrize("form", ["score", "score_pairs"])
def test_a_metric_batch_keeps_its_pictures_claimed_until_it_ends(tmp_path, form):
    """Both forms of a metric's batch (`MetricRunner.score`, run by `score`'s executors; `score_pairs`,
    run by the reward) keep the claim on a picture the store does not keep while the metric works
    (its embedding is written then), and let it go when the batch ends."""
    from caprecon.data.images import read_image
    from caprecon.data.samples import Sample
    from caprecon.run.local import MetricRunner

    render("red circle").save(tmp_path / "photo.png")
    item = read_image(Sample(id="0", image=tmp_path / "photo.png", caption="a blue square"))
    mine, other = Store(tmp_path / "cache", keep="vectors"), Store(tmp_path / "cache", keep="vectors")
    seen: dict[str, set] = {}

    class Probe(caprecon.metrics.ReconScore):
        def score(self, items, ctx):
            keys = {key for key, _ in ctx.reconstructor(self.generator, self.spec).requests_for(items)}
            rows = super().score(items, ctx)
            seen.update(keys=keys, during=other.claimed_elsewhere(sorted(keys)))
            return rows

    generator = CountingOracle()
    runner = MetricRunner(Probe(generator, PixelEmbedder(), max_side=96), caprecon.metrics.Context(mine), 4)
    if form == "score":
        [row] = runner.score([item])
    else:
        [row] = runner.score_pairs([item], ["a blue square"], [(0, 0)])
    assert row["recon"] == pytest.approx(expected_recon(render("red circle"), "a blue square"), abs=1e-6)
    assert len(generator.prompts) == 1 and len(seen["keys"]) == 1
    assert seen["during"] == seen["keys"]  # held while the metric worked, though its record was written
    assert other.claimed_elsewhere(sorted(seen["keys"])) == set()  # and let go at the batch's end
