"""One generation and one embedding per distinct request across the whole input: n rows asking k
distinct reconstructions (same caption after the template, same seed and settings) make exactly
k generator calls, whether the copies share a batch, fall in later batches, or in other shards."""

from __future__ import annotations

import json

import pytest
from oracle import OracleGenerator, PixelEmbedder, render
from scale_models import Counting

import caprecon

CAPTIONS = ["a red circle", "a green triangle", "a blue square"]


class CountingEmbedder(PixelEmbedder):
    def __init__(self):
        super().__init__()
        self.calls = 0

    def embed(self, images):
        self.calls += len(images)
        return super().embed(images)


def _rows(folder, n):
    """n rows over the three captions, each of its own image, copies interleaved."""
    for i, caption in enumerate(CAPTIONS):
        render(caption, 48, 48).save(folder / f"img{i}.png")
    rows = [{"id": f"r{i}", "image": f"img{i % 3}.png", "caption": CAPTIONS[i % 3]} for i in range(n)]
    path = folder / "rows.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    return path


@pytest.mark.parametrize("batch_size", [12, 2])  # every copy in one batch; copies in later batches
def test_n_rows_with_k_distinct_requests_make_k_generations_and_embeddings(tmp_path, batch_size):
    generator, embedder = Counting(OracleGenerator()), CountingEmbedder()
    result = caprecon.score(_rows(tmp_path, 12), ["recon"], generator=generator, embedder=embedder,
                            batch_size=batch_size, max_side=48, cache_dir=str(tmp_path / "cache"))
    assert generator.calls == 3
    assert embedder.calls == 6  # three sources, three reconstructions
    assert [r["recon"] for r in result.records] == [1.0] * 12  # the oracle rebuilds each source exactly
    assert len({r["reconstruction"] for r in result.records}) == 3


def test_a_request_asked_again_in_a_later_batch_is_not_looked_up_again(tmp_path, monkeypatch):
    # the copies' generation and embedding were already once each; their look-ups in the store
    # (an SQLite query and a file check each) cost a duplicate row more than its own work
    asked: dict[str, list[str]] = {"images": [], "arrays": []}
    get_images, get_arrays = caprecon.Store.get_images, caprecon.Store.get_arrays
    monkeypatch.setattr(caprecon.Store, "get_images",
                        lambda self, keys, **kw: asked["images"].extend(keys) or get_images(self, keys, **kw))
    monkeypatch.setattr(caprecon.Store, "get_arrays",
                        lambda self, keys: asked["arrays"].extend(keys) or get_arrays(self, keys))
    caprecon.score(_rows(tmp_path, 12), ["recon"], generator=OracleGenerator(), embedder=PixelEmbedder(),
                   batch_size=2, max_side=48, cache_dir=str(tmp_path / "cache"))
    # an image: looked for, and looked for again once claimed (another process may have made it
    # meanwhile), then never again; before, once more for every batch a copy fell in (15 looks in all)
    assert len(set(asked["images"])) == 3 and len(asked["images"]) == 6
    assert len(asked["arrays"]) == len(set(asked["arrays"])) == 6  # three sources, three reconstructions


def test_adaptive_seeds_draw_each_seed_of_a_repeated_caption_once(tmp_path):
    generator = Counting(OracleGenerator())
    result = caprecon.score(_rows(tmp_path, 12), ["recon"], generator=generator, embedder=PixelEmbedder(),
                            seeds="3..5", target_width=0.5, batch_size=12, max_side=48,
                            cache_dir=str(tmp_path / "cache"))
    assert generator.calls == sum(r["seeds_drawn"] for r in result.records[:3])


def test_one_request_from_rows_of_other_images_in_other_shards_generates_once(tmp_path):
    # under the fixed seed policy one caption on two images of one size is one request; shards keep
    # images whole, so its copies land in both shards, which share the store
    for i in range(4):
        render(CAPTIONS[i % 3], 48, 48).save(tmp_path / f"img{i}.png")
    rows = [{"id": f"r{i}", "image": f"img{i % 4}.png", "caption": CAPTIONS[i % 3]} for i in range(12)]
    samples = tmp_path / "rows.jsonl"
    samples.write_text("\n".join(json.dumps(r) for r in rows))
    generator = Counting(OracleGenerator())
    for shard in ("0/2", "1/2"):
        caprecon.score(samples, ["recon"], generator=generator, embedder=PixelEmbedder(), shard=shard,
                       seed_policy="fixed", max_side=48, cache_dir=str(tmp_path / "cache"))
    assert generator.calls == 3


def test_what_a_run_remembers_is_bounded_and_handed_out_as_copies(tmp_path, monkeypatch):
    import numpy as np

    from caprecon.data.images import read_image
    from caprecon.data.samples import Sample
    from caprecon.metrics import base
    from caprecon.reconstruct import reconstructor

    monkeypatch.setattr(base, "KNOWN_ARRAYS", 2)
    ctx = base.Context(caprecon.Store.temporary())
    first = ctx.cached_arrays("embedding", ["a", "b", "c"], lambda order: [np.full(2, float(i)) for i in order])
    assert list(ctx._arrays) == ["b", "c"]  # the oldest forgotten
    first[2] += 5  # the caller's copy: what the context remembers stays as computed
    assert ctx.cached_arrays("embedding", ["c"], lambda order: pytest.fail("c is known"))[0] == pytest.approx([2, 2])

    monkeypatch.setattr(reconstructor, "KNOWN_IMAGES", 2)
    _rows(tmp_path, 3)  # the three pictures
    items = [read_image(Sample(id=str(i), image=str(tmp_path / f"img{i}.png"), caption=c))
             for i, c in enumerate(CAPTIONS)]
    rebuild = ctx.reconstructor(OracleGenerator(), reconstructor.ReconstructionSpec(max_side=48))
    rebuild.reconstruct(items)
    assert len(rebuild._known) == 2
