"""ReconScore and CLIP-Image-Score: compare the image with its reconstruction.

ReconScore (ReconScore paper): (1 + cos(F(I), F(Î))) / 2, with Î = G(template(caption))
at a fixed seed and F an image embedder (DreamSim in the paper). It lies in [0, 1].
CLIP-Image-Score (the VisualFactChecker baseline): the raw cosine in CLIP image space.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from caprecon.models.embedder import ImageEmbedder
from caprecon.models.generator import TextToImage
from caprecon.reconstruct.reconstructor import ReconstructionSpec
from caprecon.core.describe import describe_model
from caprecon.data.images import LoadedSample
from caprecon.metrics.base import Column, Context, Metric
from caprecon.models.build import model_of

#: how many pairs' vectors an all-pairs call gathers at a time (of DreamSim's 1,792 floats: 29 MB a side)
PAIRS_AT_ONCE = 4_096


class ReconScore(Metric):
    """(1 + cos(F(I), F(Î))) / 2: the source image I against its reconstruction Î from the caption.

    `generator` rebuilds each caption (through `spec`: template, size, seed policy; or the
    `spec_options` that make one) and `embedder` is F. Called on images and captions, it
    returns one score per pair; inside a run, `score` reads and writes the run's cache.
    """

    columns = (Column("recon", low=0.0, high=1.0, needs_source_image=True),)

    def __init__(self, generator: TextToImage, embedder: ImageEmbedder, spec: ReconstructionSpec | None = None,
                 **spec_options: Any):
        self.generator = model_of("generator", generator)
        self.embedder = model_of("embedder", embedder)
        self.spec = spec or ReconstructionSpec(**spec_options)

    @classmethod
    def from_roles(cls, roles: Any, config: Any) -> ReconScore:
        return cls(roles.generator, roles.embedder, config.spec)

    def describe(self) -> dict[str, Any]:
        return {"metric": self.name, "embedder": describe_model(self.embedder), "generator": describe_model(self.generator),
                "reconstruction": self.spec.__dict__}

    def _transform(self, cos: np.ndarray) -> np.ndarray:
        return (1.0 + cos) / 2.0

    def score(self, items: Sequence[LoadedSample], ctx: Context) -> list[dict[str, Any]]:
        recons = ctx.reconstructor(self.generator, self.spec).reconstruct(items)
        source = ctx.embed(self.embedder, [it.image_key for it in items], lambda i: items[i].image)
        rebuilt = ctx.embed(self.embedder, [r.key for r in recons], lambda i: recons[i].image())
        return self._rows(source, rebuilt, recons)

    def _rows(self, source: np.ndarray, rebuilt: np.ndarray, recons: Sequence[Any]) -> list[dict[str, Any]]:
        """Each row's score from its source's and its reconstruction's vectors (row by row), with the
        reconstruction's record."""
        cos = np.clip(np.sum(source * rebuilt, axis=1), -1.0, 1.0)
        return [{self.name: float(v), **r.record()} for v, r in zip(self._transform(cos), recons)]

    def score_pairs(self, images: Sequence[LoadedSample], texts: Sequence[str], ctx: Context,
                    pairs: Sequence[tuple[int, int]]) -> list[dict[str, Any]]:
        """`score` of the pairs, sharing what they share: one vector per image, one reconstruction and
        one vector per distinct request (caption, noise, size), then each pair's cosine, by `score`'s own
        `_rows`, so a pair gets the same bits either way. A subclass with a `score`
        of its own is scored by it (the generic form), never around it."""
        if type(self).score is not ReconScore.score:
            return super().score_pairs(images, texts, ctx, pairs)
        recons = ctx.reconstructor(self.generator, self.spec).reconstruct(
            [images[i].with_caption(texts[j]) for i, j in pairs])
        used = sorted({i for i, _ in pairs})
        source = ctx.embed(self.embedder, [images[i].image_key for i in used], lambda k: images[used[k]].image)
        position = {}  # each distinct reconstruction's place among the vectors, and its first pair
        first = []
        for at, r in enumerate(recons):
            if r.key not in position:
                position[r.key] = len(first)
                first.append(at)
        rebuilt = ctx.embed(self.embedder, [recons[at].key for at in first], lambda k: recons[first[k]].image())
        row_of = {i: k for k, i in enumerate(used)}
        out: list[dict[str, Any]] = []
        for start in range(0, len(pairs), PAIRS_AT_ONCE):  # the gathered vectors of a chunk, not of every pair
            chunk = range(start, min(start + PAIRS_AT_ONCE, len(pairs)))
            mine = source[[row_of[pairs[at][0]] for at in chunk]]
            theirs = rebuilt[[position[recons[at].key] for at in chunk]]
            out += self._rows(mine, theirs, [recons[at] for at in chunk])
        return out


class ClipImageScore(ReconScore):
    """cos(E(I), E(Î)) with E a CLIP image encoder; pass a CLIP `HFVisionEmbedder`."""

    columns = (Column("clip-image", low=-1.0, high=1.0, needs_source_image=True),)

    @classmethod
    def from_roles(cls, roles: Any, config: Any) -> ClipImageScore:
        return cls(roles.generator, roles.clip, config.spec)

    def _transform(self, cos: np.ndarray) -> np.ndarray:
        return cos

