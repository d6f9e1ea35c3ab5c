"""A seeded stand-in generator whose per-caption noise is known, and the metric that reads it:
for adaptive seeds' tests and benchmark (`benchmarks/adaptive_seeds.py`).

The generator draws a caption's score as `true + sd * z`, z standard normal from the request's
seed, and hands it over in the image's `detail` (stored with the image like any generation
detail); `NoisyScore` reports it. So every caption's true value and seed noise are known, and
an interval's coverage can be counted."""

from __future__ import annotations

import hashlib
from typing import Any, Sequence

import numpy as np
from PIL import Image

from caprecon.metrics.base import Context, Metric
from caprecon.models.generator import Generated, GenerationRequest
from caprecon.reconstruct.reconstructor import ReconstructionSpec


class NoisyGenerator:
    """`truth[caption] = (true value, seed sd)`; counts the images it is asked for."""

    def __init__(self, truth: dict[str, tuple[float, float]]):
        self.truth, self.calls = truth, 0

    @property
    def fingerprint(self) -> str:
        return hashlib.sha256(repr(sorted(self.truth.items())).encode()).hexdigest()[:24]

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Generated]:
        self.calls += len(requests)
        out = []
        for r in requests:
            true, sd = self.truth[r.prompt]
            z = float(np.random.default_rng(r.seed).standard_normal())
            out.append(Generated(Image.new("RGB", (8, 8)), detail={"value": true + sd * z}))
        return out


class NoisyScore(Metric):
    """The stand-in's score of each caption's reconstruction."""

    name = primary = "noisy"
    needs_source_image = False

    def __init__(self, generator: NoisyGenerator, spec: ReconstructionSpec | None = None):
        self.generator, self.spec = generator, spec or ReconstructionSpec(size=(16, 16))

    def score(self, items: Sequence[Any], ctx: Context) -> list[dict[str, Any]]:
        return [{"noisy": r.detail["value"]} for r in ctx.reconstructor(self.generator, self.spec).reconstruct(items)]
