"""A procedural 'oracle' generator and a pixel embedder, for semantic end-to-end tests.

The oracle draws exactly the coloured shapes a caption names, left to right in the order
named, so a caption that names the right things in the right colours rebuilds the
source exactly, and one with a colour or object swapped does not.
"""

from __future__ import annotations

import hashlib
import re
from typing import Sequence

import numpy as np
from PIL import Image, ImageDraw

from caprecon.models.generator import Generated, GenerationRequest

COLOURS = {"red": (220, 30, 30), "green": (30, 180, 60), "blue": (30, 60, 220), "yellow": (240, 220, 30),
           "black": (10, 10, 10), "purple": (140, 40, 170)}
SHAPES = ("circle", "square", "triangle")
_PAIR = re.compile(rf"\b({'|'.join(COLOURS)})\s+({'|'.join(SHAPES)})s?\b")


class OracleGenerator:
    calls = 0

    @property
    def fingerprint(self) -> str:
        return hashlib.sha256(b"oracle-v1").hexdigest()[:24]

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Generated]:
        OracleGenerator.calls += len(requests)
        return [Generated(render(r.prompt, r.width, r.height)) for r in requests]


def render(caption: str, width: int = 96, height: int = 96) -> Image.Image:
    image = Image.new("RGB", (width, height), (255, 255, 255))
    draw = ImageDraw.Draw(image)
    pairs = _PAIR.findall(caption.lower())
    for i, (colour, shape) in enumerate(pairs):
        cell = width / max(1, len(pairs))
        x0, x1 = i * cell + cell * 0.15, (i + 1) * cell - cell * 0.15
        y0, y1 = height * 0.3, height * 0.7
        if shape == "circle":
            draw.ellipse([x0, y0, x1, y1], fill=COLOURS[colour])
        elif shape == "square":
            draw.rectangle([x0, y0, x1, y1], fill=COLOURS[colour])
        else:
            draw.polygon([((x0 + x1) / 2, y0), (x1, y1), (x0, y1)], fill=COLOURS[colour])
    return image


class PixelEmbedder:
    """Downsampled colour 'ink' (distance from white background), as a unit vector."""

    @property
    def fingerprint(self) -> str:
        return "pixel-embedder-v1"

    def embed(self, images: Sequence[Image.Image]) -> np.ndarray:
        rows = []
        for im in images:
            arr = np.asarray(im.convert("RGB").resize((24, 24), Image.BILINEAR), dtype=np.float32) / 255.0
            rows.append((1.0 - arr).ravel())
        x = np.stack(rows)
        return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


class CountingEmbedder(PixelEmbedder):
    """The pixel embedder, recording the size of every picture it is given."""

    def __init__(self):
        self.seen: list[tuple[int, int]] = []

    def embed(self, images: Sequence[Image.Image]) -> np.ndarray:
        self.seen += [im.size for im in images]
        return super().embed(images)


class CountingOracle(OracleGenerator):
    """The oracle, counting the prompts it draws (per instance, so a pickled copy counts its own)."""

    def __init__(self):
        self.prompts: list[str] = []

    def generate(self, requests):
        self.prompts += [r.prompt for r in requests]
        return super().generate(requests)


def expected_recon(image: Image.Image, caption: str) -> float:
    """ReconScore of `caption` on `image` under the oracle and the pixel embedder, computed here
    with numpy: (1 + cos) / 2 of the photo's and the oracle's drawing's pixel vectors."""
    a, b = PixelEmbedder().embed([image, render(caption, *image.size)])
    return (1.0 + float(np.clip(a @ b, -1, 1))) / 2.0


class SteppedOracleGenerator(OracleGenerator):
    """The oracle, slowed down and started in step with other processes, for tests of
    processes sharing one cache: each process announces itself in `start_dir` and waits
    until `parties` have, so their work overlaps however long each took to start."""

    def __init__(self, start_dir: str, parties: int = 2, seconds_per_image: float = 0.05):
        import os
        import time
        from pathlib import Path

        folder = Path(start_dir)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / str(os.getpid())).touch()
        deadline = time.time() + 120
        while len(list(folder.iterdir())) < parties and time.time() < deadline:
            time.sleep(0.02)
        self.seconds_per_image = seconds_per_image

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Generated]:
        import time

        time.sleep(self.seconds_per_image * len(requests))
        return super().generate(requests)
