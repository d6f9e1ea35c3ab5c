"""FLEUR: an LVLM rates how well the caption describes the image, from 0.0 to 1.0.

Rather than trusting the one rating the model would write, FLEUR smooths it with the
model's probabilities for the digits it could have written. Here the judge's probability
of each of the eleven one-decimal ratings "0.0" ... "1.0" is read teacher-forced
(`answer_prob`), normalised over the eleven, and the score is their expectation:

    fleur = Σ_r r · P(r) / Σ_r P(r),   r ∈ {0.0, 0.1, ..., 1.0}

For ratings "0.d" this is FLEUR's smoothing over the digit token after "0." (P("0.d") =
P("0.") · P(d | "0.")); the rating "1.0" keeps its own mass. FLEUR's second-decimal
refinement is not applied. `fleur_greedy` is the rating the model writes greedily.
"""

from __future__ import annotations

import re
from typing import Any, Sequence

from ..models.vlm import VisionLanguageModel
from ..models.common import describe_model
from ..samples import LoadedSample
from .base import Context, Metric
from .judging import LazyImages, answer_probs, answers

RATINGS = [f"{i / 10:.1f}" for i in range(11)]

PROMPT = (
    "Rate how well the caption describes the image, on a scale from 0.0 to 1.0.\n"
    "Criteria: 0.0 means the caption has nothing to do with the image; 1.0 means it describes the image "
    "accurately and completely, with no wrong details. Reply with the number only, one decimal place.\n"
    "Caption: \"{caption}\"\n"
    "Rating (0.0 to 1.0):"
)


class Fleur(Metric):
    name = "fleur"

    def __init__(self, vlm: VisionLanguageModel, *, prompt: str = PROMPT):
        if "{caption}" not in prompt:
            raise ValueError("FLEUR prompt must contain {caption}")
        self.vlm, self.prompt = vlm, prompt

    def describe(self) -> dict[str, Any]:
        return {"metric": self.name, "vlm": describe_model(self.vlm),
                "smoothing": "expectation over the 11 one-decimal ratings, teacher-forced probabilities"}

    def score(self, items: Sequence[LoadedSample], ctx: Context) -> list[dict[str, Any]]:
        images = LazyImages()
        asks = [(images.add(it.image_key, lambda it=it: it.image), self.prompt.replace("{caption}", it.caption.strip()))
                for it in items]
        probs = answer_probs(ctx, self.vlm, [a for a in asks for _ in RATINGS], images, RATINGS * len(asks))
        greedy = answers(ctx, self.vlm, asks, images, max_new_tokens=4)
        rows = []
        for i, text in enumerate(greedy):
            p = probs[i * len(RATINGS) : (i + 1) * len(RATINGS)]
            total = sum(p)
            smoothed = sum(float(r) * q for r, q in zip(RATINGS, p)) / total if total > 0 else None
            match = re.search(r"[01](?:\.\d+)?", text)
            rows.append({"fleur": smoothed, "fleur_greedy": float(match.group()) if match else None,
                         "fleur_mass": total})
        return rows
