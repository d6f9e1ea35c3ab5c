"""Models that fail, for the tests of how commands stop and count failed rows: on every
row alike (a broken model: the run stops with the reason) or on some rows (those rows fail,
counted by reason, the others are done)."""

from __future__ import annotations

import hashlib
from typing import Sequence

from oracle import OracleGenerator

from caprecon.models.generator import GenerationRequest, Generated


class BrokenGenerator:
    """Fails every request the same way, as a generator whose server is down does."""

    @property
    def fingerprint(self) -> str:
        return hashlib.sha256(b"broken-generator").hexdigest()[:24]

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Generated]:
        raise RuntimeError("the generator's server answered 503 Service Unavailable")


class PickyGenerator(OracleGenerator):
    """Draws like the oracle, but refuses any caption that mentions a triangle."""

    @property
    def fingerprint(self) -> str:
        return hashlib.sha256(b"picky-generator").hexdigest()[:24]

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Generated]:
        refused = [r.prompt for r in requests if "triangle" in r.prompt]
        if refused:
            raise ValueError(f"cannot draw a triangle: {refused[0]!r}")
        return super().generate(requests)


class BrokenJudge:
    """A judge that answers nothing: every call fails alike, as one behind a dead server does."""

    @property
    def fingerprint(self) -> str:
        return hashlib.sha256(b"broken-judge").hexdigest()[:24]

    def generate(self, requests, max_new_tokens: int = 32) -> list[str]:
        raise ConnectionError("connection refused by the judge's server")

    def option_probs(self, requests, options) -> list[list[float]]:
        raise ConnectionError("connection refused by the judge's server")


class PickyJudge(BrokenJudge):
    """Answers like a judge that likes everything, but fails on any prompt that mentions a triangle."""

    @property
    def fingerprint(self) -> str:
        return hashlib.sha256(b"picky-judge").hexdigest()[:24]

    def _check(self, requests) -> None:
        refused = [r.prompt for r in requests if "triangle" in r.prompt]
        if refused:
            raise ValueError(f"cannot judge a triangle: {refused[0]!r}")

    def generate(self, requests, max_new_tokens: int = 32) -> list[str]:
        self._check(requests)
        return ["yes"] * len(requests)

    def option_probs(self, requests, options) -> list[list[float]]:
        self._check(requests)
        return [[0.75, 0.25][: len(o)] + [0.0] * (len(o) - 2) for o in options]


class ShapeCaptioner:
    """Writes the same candidates for every image: a red circle, then a green triangle."""

    @property
    def fingerprint(self) -> str:
        return "shape-captioner-v1"

    def generation_defaults(self) -> dict:
        return {}

    def caption(self, requests, sampling) -> list[list[str]]:
        return [(["a red circle", "a green triangle"] * r.n)[: r.n] for r in requests]


class BrokenEmbedder:
    """Embeds nothing: every call fails alike."""

    @property
    def fingerprint(self) -> str:
        return "broken-embedder-v1"

    def embed(self, images):
        raise RuntimeError("the embedder's weights are corrupt")


class BrokenCaptioner(ShapeCaptioner):
    """A captioner whose server is down."""

    @property
    def fingerprint(self) -> str:
        return "broken-captioner-v1"

    def caption(self, requests, sampling) -> list[list[str]]:
        raise ConnectionError("connection refused by the captioner's server")
