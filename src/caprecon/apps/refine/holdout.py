"""The held-out questions of `caprecon refine`: each image's QA bank split into a guiding half
(the reviser is told its flips) and a held-out half (the guard reads only it)."""

from __future__ import annotations

import hashlib
import math
from typing import Any, Mapping, Sequence

from caprecon.core.errors import ConfigError
from caprecon.data.images import LoadedSample
from caprecon.data.qa import QAItem
from caprecon.data.samples import Sample
from caprecon.metrics.base import Context, Metric



def split_bank(bank: Mapping[str, Sequence[QAItem]], holdout: float) -> tuple[dict[str, list[QAItem]],
                                                                            dict[str, list[QAItem]]]:
    """(guiding, held_out): each image's n questions ranked by sha256 of "image id, newline,
    question" (ties by bank order), the first n * holdout (rounded half up, at least 1 and at
    most n - 1) held out; each half keeps the bank's order. The hash makes the split the same
    on every run and for every order of the bank. An image with one question has no held-out
    half (`refine` refuses such an image)."""
    guiding: dict[str, list[QAItem]] = {}
    held_out: dict[str, list[QAItem]] = {}
    for image_id, items in bank.items():
        n = len(items)
        held = min(n - 1, max(1, math.floor(n * holdout + 0.5)))
        ranked = sorted(range(n), key=lambda i: (hashlib.sha256(f"{image_id}\n{items[i].question}".encode())
                                                 .hexdigest(), i))
        chosen = set(ranked[:held])
        guiding[image_id] = [q for i, q in enumerate(items) if i not in chosen]
        if chosen:
            held_out[image_id] = [q for i, q in enumerate(items) if i in chosen]
    return guiding, held_out


class WithBank:
    """The run's models with another QA bank in place of the run's: a metric built through it
    asks only that bank's questions, and shares every model with the run."""

    def __init__(self, roles: Any, bank: Mapping[str, list[QAItem]]):
        self._roles, self.qa_bank = roles, bank

    def __getattr__(self, name: str) -> Any:
        return getattr(self._roles, name)


class GuidingQuestions(Metric):
    """The Caption Turing Test on the guiding half, under field names of its own so it runs beside
    the held-out one: `turing_guiding` (its accuracy on Î) and `turing_guiding_flipped` (its
    flips, the only questions the reviser is told)."""

    name = "turing_guiding"

    def __init__(self, test: Metric):
        self.test = test
        # a reconstruction metric: with --seeds it is averaged over the seeds like the held-out one
        self.generator, self.spec = test.generator, test.spec

    def describe(self) -> dict[str, Any]:
        return {**self.test.describe(), "metric": self.name, "questions": "the guiding half of the QA bank"}

    def score(self, items: Sequence[LoadedSample], ctx: Context) -> list[dict[str, Any]]:
        return [{"turing_guiding": row.get("turing"), "turing_guiding_n": row.get("turing_n"),
                 "turing_guiding_flipped": row.get("turing_flipped") or []} for row in self.test.score(items, ctx)]


def unsplittable(rows: Sequence[Sample], bank: Mapping[str, Sequence[QAItem]]) -> None:
    for s in rows:
        if len(bank.get(s.image_id, ())) == 1:
            raise ConfigError(f"row {s.id}: the QA bank has one question for image {s.image_id!r}; with --feedback "
                              "flipped each image's questions are split into guiding and held-out ones (--holdout), "
                              "which takes at least 2 per image: add questions, leave the row out, or use another "
                              "--feedback")
