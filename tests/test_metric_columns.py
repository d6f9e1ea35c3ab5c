"""Each metric writes only its own columns: asked together, metrics that share a model give
each the value it has alone (a metric that wrote another's column would change it)."""

from itertools import combinations

import numpy as np
import pytest

import caprecon
from caprecon.metrics.base import Metric
from caprecon.models.matcher import ClipMatcher
from caprecon.run.failures import RunError
from halluc_fakes import ClaimLLM, PixelJudge
from oracle import OracleGenerator, render

CAPTIONS = ["a red circle and a blue square", "a green triangle", "a blue square"]


def _samples(tmp_path):
    out = []
    for i, caption in enumerate(CAPTIONS):
        path = tmp_path / f"{i}.png"
        render(CAPTIONS[(i + 1) % len(CAPTIONS)] if i == 2 else caption, 96, 96).save(path)
        out.append(caprecon.Sample(id=str(i), image=path, caption=caption, refs=[caption, "a picture of shapes"]))
    return out


def _own(records, columns):
    return [{c: r.get(c) for c in columns} for r in records]


def test_refclipscore_leaves_clipscore_as_it_is_alone(tiny_clip, tmp_path):
    """The issue's case: CLIPScore at w = 100 with no prefix is 0.0 where the cosine is negative,
    and refclipscore asked beside it must not replace it by its own (w = 2.5, prefixed) value."""
    samples = _samples(tmp_path)
    settings = {"clip": str(tiny_clip), "clipscore_weight": 100.0, "clipscore_prefix": "", "no_cache": True}
    together = caprecon.score(samples, ["clipscore", "refclipscore"], **settings)
    clip = ClipMatcher(tiny_clip)
    from PIL import Image

    image_vecs = clip.embed_images([Image.open(s.image).convert("RGB") for s in samples])
    bare = clip.embed_texts([s.caption for s in samples])
    expected = 100.0 * np.maximum(np.sum(image_vecs * bare, axis=1), 0.0)
    np.testing.assert_allclose([r["clipscore"] for r in together.records], expected, atol=1e-4)
    prefixed = clip.embed_texts(["A photo depicts " + s.caption for s in samples])
    np.testing.assert_allclose([r["refclipscore_clip"] for r in together.records],
                               2.5 * np.maximum(np.sum(image_vecs * prefixed, axis=1), 0.0), atol=1e-6)


CLIP_METRICS = ["clipscore", "clip-s", "refclipscore", "clip-image"]
JUDGE_METRICS = ["vqascore", "halluc", "halluc-coverage"]


@pytest.mark.parametrize("pair", [*combinations(CLIP_METRICS, 2), *combinations(JUDGE_METRICS, 2)],
                         ids=lambda pair: "+".join(pair))
def test_metrics_sharing_a_model_keep_their_own_values(pair, tiny_clip, tmp_path):
    samples = _samples(tmp_path)
    settings = {"clip": str(tiny_clip), "generator": OracleGenerator(), "judge": PixelJudge(), "llm": ClaimLLM(),
                "max_side": 96, "clipscore_weight": 100.0, "clipscore_prefix": "", "no_cache": True}
    alone = {name: caprecon.score(samples, [name], **settings) for name in pair}
    together = caprecon.score(samples, list(pair), **settings)
    for name in pair:
        own = set().union(*(r.keys() for r in alone[name].records)) - {"id", "caption", "image", "refs", "image_id"}
        for got, want in zip(_own(together.records, own), _own(alone[name].records, own)):
            for column, value in want.items():
                if isinstance(value, str) and column != "error":
                    continue  # a reconstruction's path names each run's own temporary store
                assert got[column] == (pytest.approx(value, abs=1e-9) if isinstance(value, float) else value), \
                    f"{name}'s {column} changed when asked beside {pair}"


class _Writes(Metric):
    needs_source_image = False

    def __init__(self, name, value):
        self.name, self.value = name, value

    def score(self, items, ctx):
        return [{"shared": self.value, self.name: 1.0} for _ in items]


def test_two_metrics_writing_one_column_stop_the_run(tmp_path):
    samples = [caprecon.Sample(id=str(i), image=None, caption=f"caption {i}") for i in range(3)]
    with pytest.raises(RunError, match="'shared'.*two metrics cannot share a column"):
        caprecon.score(samples, [_Writes("a", 1.0), _Writes("b", 2.0)], no_cache=True)
    # the same value in a shared field (a reconstruction's key, its seed) is no clash
    result = caprecon.score(samples, [_Writes("a", 1.0), _Writes("b", 1.0)], no_cache=True)
    assert [r["shared"] for r in result.records] == [1.0, 1.0, 1.0]
