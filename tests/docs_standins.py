"""Scripted stand-ins for the documentation's runnable examples, in the world of oracle.py.

Random tiny models write noise, so an example run on them shows that a command works, not
what it is for. On images of coloured shapes these stand-ins do the job with a known right
answer: `ShapeCaptioner` writes one faithful caption and wrong ones (best-of-N must keep
the faithful one), `ShapeJudge` answers VQAScore's "is the figure showing ...?" from the
pixels (a generator that draws what it is told scores 1), and `SloppyGenerator` draws only
the first thing a prompt names (so a text-to-image comparison has a loser).
"""

from __future__ import annotations

import random
import re
from typing import Sequence

import numpy as np
from PIL import Image

from cttd_fakes import ScriptedVLM, shapes
from caprecon.models.generator import Generated
from oracle import COLOURS, OracleGenerator, render


def _kind(image: Image.Image, colour: str, box: tuple[float, float, float, float]) -> str:
    """circle, square or triangle, from how much of its bounding box the shape fills."""
    arr = np.asarray(image.convert("RGB"), dtype=np.int16)
    h, w, _ = arr.shape
    x0, y0, x1, y1 = int(box[0] * w), int(box[1] * h), int(round(box[2] * w)), int(round(box[3] * h))
    inside = np.abs(arr[y0:y1, x0:x1] - np.array(COLOURS[colour])).sum(axis=2) < 40
    filled = inside.mean() if inside.size else 0.0
    return "square" if filled > 0.9 else "circle" if filled > 0.65 else "triangle"


def describe_shapes(image: Image.Image) -> list[tuple[str, str]]:
    """(colour, kind) of each shape, left to right."""
    return [(colour, _kind(image, colour, box)) for colour, box in shapes(image)]


def _sentence(pairs: Sequence[tuple[str, str]]) -> str:
    return " and ".join(f"a {colour} {kind}" for colour, kind in pairs) or "an empty white picture"


class ShapeCaptioner:
    """Candidate 0 names every shape right; each later one has one shape's colour wrong."""

    fingerprint = "shape-captioner-v1"

    def describe(self) -> dict:
        return {"backend": "scripted", "model": "tests/docs_standins.py:ShapeCaptioner"}

    def caption(self, requests, sampling) -> list[list[str]]:
        out = []
        for request in requests:
            pairs = describe_shapes(request.image)
            rng = random.Random(request.seed)
            candidates = [_sentence(pairs)]
            while len(candidates) < request.n and pairs:
                wrong = list(pairs)
                i = rng.randrange(len(wrong))
                wrong[i] = (rng.choice([c for c in COLOURS if c != wrong[i][0]]), wrong[i][1])
                candidates.append(_sentence(wrong))
            out.append((candidates * request.n)[:request.n])
        return out


class ShapeJudge(ScriptedVLM):
    """The shapes judge of cttd_fakes, which also says whether a picture shows a caption."""

    fingerprint = "shape-judge-v1"

    def _reply(self, request) -> str:
        asked = re.search(r"showing: (.*)\?", request.prompt)
        if asked:  # what the caption says, drawn by the oracle, against what the picture shows
            wanted = describe_shapes(render(asked.group(1)))
            return "Yes" if wanted and wanted == describe_shapes(request.image) else "No"
        return super()._reply(request)


class SloppyGenerator(OracleGenerator):
    """The oracle, drawing only what the prompt names before its first "and"."""

    @property
    def fingerprint(self) -> str:
        return "sloppy-oracle-v1"

    def generate(self, requests) -> list[Generated]:
        return [Generated(render(r.prompt.split(" and ")[0], r.width, r.height)) for r in requests]
