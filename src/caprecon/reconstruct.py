"""Reconstruction: caption -> image, cached by content, shared by every metric that needs it.

`Reconstructor` owns the policy that turns a sample into a generation request (prompt
template, seed, output size) and the cache around the generator. Two metrics asking for
the same sample's reconstruction get the same image, generated once.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Sequence

from PIL import Image

from .models.common import derive_seed
from .models.generator import GenerationRequest, TextToImage
from .prompts import render, resolve_template
from .samples import LoadedSample
from .store import Store, content_key

SEED_POLICIES = ("per-sample", "per-image", "fixed")


@dataclass(frozen=True)
class ReconstructionSpec:
    """Everything besides the caption and the source's shape that decides an image.

    seed_policy:
      - "per-sample": seed = hash(seed, image_id, candidate index): every sample gets its
        own noise, reproducible whatever the batch or order;
      - "per-image": seed = hash(seed, image_id): all captions of one image (best-of-N
        candidates) are rebuilt from the same noise, so they differ only by their text;
      - "fixed": the same seed for every caption, so the initial noise z is one constant
        across the whole evaluation (the ReconScore paper's protocol).
    Output size: `size` (width, height) when given, for every sample; otherwise the
    source's aspect ratio with the long side at `max_side` (never above it; smaller
    sources are scaled up unless `upscale=False`), both sides rounded to multiples of
    `multiple`; a caption-only sample (no source image) gets the generator's native
    resolution (`native_size`; a `max_side` square for generators that have none).
    """

    template: str = "{caption}"
    seed: int = 0
    seed_policy: str = "per-sample"
    max_side: int = 1024
    multiple: int = 16
    upscale: bool = True
    size: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "template", resolve_template(self.template))
        if self.size is not None:
            object.__setattr__(self, "size", parse_size(self.size, self.multiple))
        if self.seed_policy not in SEED_POLICIES:
            raise ValueError(f"seed_policy must be one of {SEED_POLICIES}, not {self.seed_policy!r}")
        if self.max_side < self.multiple:
            raise ValueError(f"max_side ({self.max_side}) must be at least multiple ({self.multiple})")

    def seed_for(self, image_id: str, candidate: int) -> int:
        if self.seed_policy == "fixed":
            return self.seed
        if self.seed_policy == "per-image":
            return derive_seed(self.seed, image_id)
        return derive_seed(self.seed, image_id, candidate)

    def size_for(self, width: int, height: int) -> tuple[int, int]:
        long_side = max(width, height)
        target = self.max_side if self.upscale else min(self.max_side, long_side)
        scale = target / long_side
        snap = lambda v: max(self.multiple, int(round(v * scale / self.multiple)) * self.multiple)  # noqa: E731
        return snap(width), snap(height)


def parse_size(value: str | Sequence[int], multiple: int = 16) -> tuple[int, int]:
    """`"WxH"` or (W, H) as a checked (width, height)."""
    try:
        parts = value.lower().split("x") if isinstance(value, str) else list(value)
        width, height = (int(p) for p in parts)
    except (ValueError, TypeError):
        raise ValueError(f"size must look like WIDTHxHEIGHT, e.g. 1024x1024, not {value!r}") from None
    if width <= 0 or height <= 0 or width % multiple or height % multiple:
        raise ValueError(f"size {width}x{height}: both sides must be positive multiples of {multiple}")
    return width, height


@dataclass
class Reconstruction:
    key: str
    path: Path
    prompt: str
    seed: int
    width: int
    height: int
    tokens_cut: int
    detail: dict[str, Any]

    def image(self) -> Image.Image:
        with Image.open(self.path) as im:
            return im.convert("RGB")

    def record(self) -> dict[str, Any]:
        out = {"reconstruction": str(self.path), "seed": self.seed, "size": [self.width, self.height],
               "tokens_cut": self.tokens_cut}
        out.update(self.detail)
        return out


class Reconstructor:
    """Generates (or finds in the store) the reconstruction of each sample."""

    KIND = "reconstruction"

    def __init__(self, generator: TextToImage, store: Store, spec: ReconstructionSpec | None = None):
        self.generator = generator
        self.store = store
        self.spec = spec or ReconstructionSpec()
        self.generated = 0  # images the generator actually produced (cache misses)
        self.reused = 0
        self.model_seconds = 0.0  # wall time inside the generator

    def describe(self) -> dict[str, Any]:
        return asdict(self.spec)

    def request_for(self, item: LoadedSample) -> tuple[str, GenerationRequest]:
        """The request and its cache key. A caption-only sample without a set `size` asks
        for the generator's native resolution: the key says "native" (the generator's
        fingerprint pins what that is) and the request's sides stay 0 until generation."""
        s = item.sample
        if self.spec.size:
            width, height = self.spec.size
        elif item.image is not None:
            width, height = self.spec.size_for(*item.image.size)
        else:
            width = height = 0
        request = GenerationRequest(prompt=render(self.spec.template, s.caption),
                                    seed=self.spec.seed_for(s.image_id, s.candidate),
                                    width=width, height=height, image_id=s.image_id)
        key = content_key(self.KIND, caption=s.caption, template=self.spec.template, prompt=request.prompt,
                          generator=self.generator.fingerprint, seed=request.seed,
                          size=[width, height] if width else "native",
                          image_id=s.image_id if getattr(self.generator, "depends_on_image_id", False) else None)
        return key, request

    def native_size(self) -> tuple[int, int]:
        size = getattr(self.generator, "native_size", None)
        return tuple(size) if size else (self.spec.max_side, self.spec.max_side)

    def _sized(self, request: GenerationRequest) -> GenerationRequest:
        if request.width:
            return request
        width, height = self.native_size()
        return replace(request, width=width, height=height)

    def reconstruct(self, items: Sequence[LoadedSample]) -> list[Reconstruction]:
        keyed = [self.request_for(item) for item in items]
        known = self.store.get_json(list({k for k, _ in keyed}))
        missing: dict[str, GenerationRequest] = {}
        for key, request in keyed:
            if key not in known or not self.store.image_path(key).exists():
                missing.setdefault(key, request)
        if missing:
            started = time.perf_counter()
            results = self.generator.generate([self._sized(r) for r in missing.values()])
            self.model_seconds += time.perf_counter() - started
            new = {}
            for (key, request), generated in zip(missing.items(), results):
                self.store.put_image(key, generated.image)
                new[key] = {"prompt": request.prompt, "seed": request.seed, "width": generated.image.width,
                            "height": generated.image.height, "tokens_cut": generated.tokens_cut,
                            "detail": generated.detail}
            self.store.put_json(self.KIND, new)
            known.update(new)
            self.generated += len(missing)
        self.reused += len(keyed) - len(missing)
        return [
            Reconstruction(key=key, path=self.store.image_path(key), prompt=known[key]["prompt"],
                           seed=known[key]["seed"], width=known[key]["width"], height=known[key]["height"],
                           tokens_cut=known[key]["tokens_cut"], detail=known[key]["detail"])
            for key, _ in keyed
        ]
