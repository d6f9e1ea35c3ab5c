"""Asking a judge, with every answer cached by (judge, image content, prompt).

Metrics describe what they ask as `(image_key, prompt)` pairs and register how to open
each image; an image is opened only when the judge must actually look at it, so a run
whose answers are all cached reads no reconstruction from disk.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from PIL import Image

from caprecon.models.vlm import VisionLanguageModel, VLMRequest
from caprecon.store.index import content_key
from caprecon.metrics.base import Context

Ask = tuple[str, str]  # (image_key, prompt)


class LazyImages:
    """Images by content key, opened on first use and kept for the batch."""

    def __init__(self) -> None:
        self._loaders: dict[str, Callable[[], Image.Image]] = {}
        self._open: dict[str, Image.Image] = {}

    def add(self, key: str, load: Callable[[], Image.Image]) -> str:
        self._loaders.setdefault(key, load)
        return key

    def __getitem__(self, key: str) -> Image.Image:
        if key not in self._open:
            self._open[key] = self._loaders[key]()
        return self._open[key]


def _ask(ctx: Context, kind: str, vlm: VisionLanguageModel, asks: Sequence[Ask], images: LazyImages,
         call: Callable[[list[VLMRequest], list[int]], Sequence[Any]], settings: Sequence[dict[str, Any]]) -> list[Any]:
    """`settings[i]`: what besides the image and prompt decides ask i's result (its cache key)."""
    keys = [content_key(kind, model=vlm.fingerprint, image=image_key, prompt=prompt, **extra)
            for (image_key, prompt), extra in zip(asks, settings)]

    def compute(order: list[int]) -> Sequence[Any]:
        requests = [VLMRequest(image=images[asks[i][0]], prompt=asks[i][1], image_key=asks[i][0]) for i in order]
        with ctx.model_call():
            return call(requests, order)

    return ctx.cached(kind, keys, compute, model=vlm)


def answers(ctx: Context, vlm: VisionLanguageModel, asks: Sequence[Ask], images: LazyImages,
            max_new_tokens: int) -> list[str]:
    """Greedy answers."""
    return _ask(ctx, "judge-answer", vlm, asks, images,
                lambda requests, _: vlm.generate(requests, max_new_tokens=max_new_tokens),
                [{"max_new_tokens": max_new_tokens}] * len(asks))


def option_probs(ctx: Context, vlm: VisionLanguageModel, asks: Sequence[Ask], images: LazyImages,
                 options: Sequence[str]) -> list[list[float]]:
    """Next-token probabilities of the same options for every ask."""
    return _ask(ctx, "option-probs", vlm, asks, images,
                lambda requests, _: vlm.option_probs(requests, [list(options)] * len(requests)),
                [{"options": list(options)}] * len(asks))


def generations_with_token_probs(ctx: Context, vlm: VisionLanguageModel, asks: Sequence[Ask], images: LazyImages,
                                 tokens: Sequence[str], max_new_tokens: int) -> list[dict[str, Any]]:
    """Greedy answers with the probabilities of `tokens` at every generated position
    (`generate_with_token_probs`)."""
    return _ask(ctx, "judge-token-probs", vlm, asks, images,
                lambda requests, _: vlm.generate_with_token_probs(requests, list(tokens), max_new_tokens),
                [{"tokens": list(tokens), "max_new_tokens": max_new_tokens}] * len(asks))


def require_capability(model: Any, method: str, metric: str) -> None:
    """Stop before the run when a backend cannot compute a metric at all."""
    if not callable(getattr(model, method, None)):
        from caprecon.core.errors import ConfigError

        raise ConfigError(f"metric {metric} needs a judge that can `{method}`; {type(model).__name__} cannot. "
                          f"Use a transformers judge or an OpenAI-compatible server (base_url=...)")
