"""CLIPScore and RefCLIPScore (Hessel et al., 2021), and the Caption Turing Test paper's CLIP-S.

    clipscore    = w · max(cos(E_img(I), E_txt("A photo depicts " + c)), 0),   w = 2.5
    refclipscore = harmonic mean of clipscore and
                   max(max_r cos(E_txt("A photo depicts " + c), E_txt("A photo depicts " + r)), 0)
                   (its clipscore part, always at w = 2.5 and the prefix, beside it as refclipscore_clip)
    clip-s       = 100 · max(cos(E_img(I), E_txt(c)), 0)

clipscore and refclipscore follow Hessel's definitions and reference implementation
(jmhessel/clipscore, which embeds references and candidates through the same prefixed text
path; w = 2.5, and a reference part without w). clip-s is the baseline of the Caption
Turing Test paper (its appendix: max(0, cos(E(I), E(C))), reported ×100 in its Table 2;
torchmetrics' CLIPScore): no prefix, w = 100. `clipscore`'s w and prefix are options, so
either reading can be had under either name. CLIP's text encoder reads 77 tokens: longer
captions are cut, which a warning reports and the row records as `clip_tokens_cut`.
"""

from __future__ import annotations

import logging
from typing import Any, Sequence

import numpy as np

from caprecon.models.embedder import ImageEmbedder
from caprecon.models.generator import CaptionImageMatcher
from caprecon.core.describe import describe_model
from caprecon.data.images import LoadedSample
from caprecon.data.samples import SampleError
from caprecon.store.index import content_key
from caprecon.metrics.base import Column, Context, Metric
from caprecon.models.build import model_of

log = logging.getLogger(__name__)

PREFIX = "A photo depicts "
WEIGHT = 2.5
CLIP_S_WEIGHT = 100.0  # the Caption Turing Test paper's CLIP-S: a percentage, no prefix


def text_embeddings(ctx: Context, matcher: CaptionImageMatcher, texts: Sequence[str]) -> np.ndarray:
    keys = [content_key("text-embedding", model=matcher.fingerprint, text=t) for t in texts]

    def compute(order: list[int]) -> np.ndarray:
        with ctx.model_call():
            return matcher.embed_texts([texts[i] for i in order])

    return ctx.cached_arrays("text-embedding", keys, compute, model=matcher)


class _MatcherAsEmbedder:
    """Lets `Context.embed` cache the image side of a matcher that has no embedder of its own."""

    def __init__(self, matcher: CaptionImageMatcher):
        self.matcher = matcher

    @property
    def fingerprint(self) -> str:
        return "matcher-image:" + self.matcher.fingerprint

    def embed(self, images):
        return self.matcher.embed_images(images)


def image_side(matcher: CaptionImageMatcher) -> ImageEmbedder:
    # a matcher built on an image embedder (ClipMatcher) shares that embedder's cache entries
    return getattr(matcher, "image_embedder", None) or _MatcherAsEmbedder(matcher)


class ClipScore(Metric):

    def __init__(self, clip: CaptionImageMatcher, *, prefix: str = PREFIX, weight: float = WEIGHT):
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not weight > 0:
            raise ValueError(f"{self.name} weight must be a positive number, not {weight!r}")
        if not isinstance(prefix, str):
            raise ValueError(f"{self.name} prefix must be text, not {prefix!r}")
        self.clip, self.prefix, self.weight = model_of("matcher", clip), prefix, float(weight)
        self.columns = (Column(self.name, low=0.0, high=self.weight, needs_source_image=True),)

    @classmethod
    def from_roles(cls, roles: Any, config: Any) -> ClipScore:
        options = {"weight": config.clipscore_weight, "prefix": config.clipscore_prefix}
        return cls(roles.clip_matcher, **{k: v for k, v in options.items() if v is not None})

    def describe(self) -> dict[str, Any]:
        return {"metric": self.name, "clip": describe_model(self.clip), "prefix": self.prefix, "w": self.weight}

    def _clip_s(self, items: Sequence[LoadedSample],
                ctx: Context) -> tuple[np.ndarray, np.ndarray, list[dict[str, Any]]]:
        """(clipscore per item, the prefixed captions' text embeddings, rows with notes)."""
        texts = [self.prefix + it.caption.strip() for it in items]
        image_vecs = ctx.embed(image_side(self.clip), [it.image_key for it in items], lambda i: items[i].image)
        text_vecs = text_embeddings(ctx, self.clip, texts)
        cos = np.sum(image_vecs * text_vecs, axis=1)
        rows: list[dict[str, Any]] = [{} for _ in items]
        count_cut = getattr(self.clip, "tokens_cut", None)
        if callable(count_cut):
            for row, text, cut in zip(rows, texts, count_cut(texts)):
                if cut:
                    row["clip_tokens_cut"] = cut
                    log.warning("caption cut by %d tokens at CLIP's text limit: %.60s...", cut, text)
        return self.weight * np.maximum(cos, 0.0), text_vecs, rows

    def score(self, items: Sequence[LoadedSample], ctx: Context) -> list[dict[str, Any]]:
        values, _, rows = self._clip_s(items, ctx)
        for row, v in zip(rows, values):
            row[self.name] = float(v)
        return rows


class ClipS(ClipScore):
    """CLIP-S of the Caption Turing Test paper: 100 · max(cos, 0) on the bare caption."""

    def __init__(self, clip: CaptionImageMatcher, *, prefix: str = "", weight: float = CLIP_S_WEIGHT):
        super().__init__(clip, prefix=prefix, weight=weight)

    @classmethod
    def from_roles(cls, roles: Any, config: Any) -> ClipS:
        return cls(roles.clip_matcher)  # the paper's weight and bare caption: --clipscore-* set clipscore's


class RefClipScore(ClipScore):
    """Writes its own CLIPScore part as `refclipscore_clip`, never as `clipscore`: asked beside
    `clipscore`, whose weight and prefix may be set apart, it must not overwrite that column."""

    companions = ("refclipscore_clip",)

    def __init__(self, clip: CaptionImageMatcher, *, prefix: str = PREFIX, weight: float = WEIGHT):
        super().__init__(clip, prefix=prefix, weight=weight)
        # a harmonic mean of two numbers in [0, w] (the reference part is a cosine, at most 1 <= w)
        self.columns = (Column("refclipscore", low=0.0, high=self.weight, needs_source_image=True,
                               needs_references=True),
                        Column("refclipscore_clip", low=0.0, high=self.weight, needs_source_image=True))

    @classmethod
    def from_roles(cls, roles: Any, config: Any) -> RefClipScore:
        return cls(roles.clip_matcher)

    def score(self, items: Sequence[LoadedSample], ctx: Context) -> list[dict[str, Any]]:
        for item in items:
            if not item.sample.refs:
                raise SampleError("refclipscore needs reference captions (`refs`)", "no references")
        values, captions, rows = self._clip_s(items, ctx)
        for row, item, cand, clip_s in zip(rows, items, captions, values):
            refs = text_embeddings(ctx, self.clip, [self.prefix + r.strip() for r in item.sample.refs])
            ref_part = max(float(np.max(refs @ cand)), 0.0)
            row["refclipscore_clip"] = float(clip_s)
            row["refclipscore"] = float(2 * clip_s * ref_part / (clip_s + ref_part)) if clip_s + ref_part > 0 else 0.0
        return rows
