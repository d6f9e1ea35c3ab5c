"""FLEUR (Lee et al., ACL 2024): an LVLM rates how well the caption describes the image.

As FLEUR's reference code (`fleur.py` in its repository) does: the judge answers FLEUR's
instruction greedily; the rating is read by keeping the reply's digits and dots, dropping
dots at either end and parsing the rest with `float()`; and the rating is smoothed with
the judge's full-vocabulary probabilities P(d) of the ten digit tokens "0".."9" at the
positions where it wrote the digits of `str(float(rating))`. The probabilities are the
softmax over the whole vocabulary, not rescaled to sum to 1 over the digits:

    rating < 1:  fleur = Σ_d d·P₁(d) / 10  (+ Σ_d d·P₂(d) / 100 when str(rating) has a second decimal)
    rating = 1:  fleur = 0.9·P("0") + P("1"), both at the written "1"

P₁ is read at the first decimal, P₂ at the second. So "0.50" (str: "0.5") is smoothed at
its first decimal only, and a bare "0" (str: "0.0") at that "0" as if it were the first
decimal. Where the digit occurs more than once among the generated tokens the reference
picks an occurrence: for the first decimal the second occurrence when the digit is 0 (the
first is the leading "0"), else the first; for the second decimal the second occurrence.

A reply whose digits and dots do not parse (none, or several numbers such as "0.8/1.0"),
or parse to a rating outside [0, 1] ("8/10" reads 810), is not parseable: the row keeps
`fleur` None and the reply in `fleur_unparsed`. A rating whose digit is not a token of its
own (tokenisers that merge digits, unlike LLaVA's and Qwen's) cannot be smoothed and keeps
the reply in `fleur_unsmoothed`. `fleur_greedy` is the rating as written. Over an
OpenAI-compatible server the digit probabilities come from the `top_logprobs` of the
generated tokens (a digit outside the top k counts as 0).
"""

from __future__ import annotations

import re
from typing import Any, Sequence

from caprecon.core.describe import describe_model
from caprecon.models.vlm import VisionLanguageModel
from caprecon.data.images import LoadedSample
from caprecon.metrics.base import Column, Context, Metric
from caprecon.metrics.judging import LazyImages, generations_with_token_probs, require_capability
from caprecon.models.build import model_of

DIGITS = [str(d) for d in range(10)]

# FLEUR's instruction (the paper's prompt, used by its reference implementation with LLaVA-1.5)
PROMPT = (
    "Your task is to evaluate and rate the caption on a scale of 0.0 to 1.0 based on the given Grading Criteria. "
    "(Print Real Number Score ONLY)\n\n"
    "Grading Criteria:\n\n"
    "0.0: The caption does not describe the image at all.\n"
    "1.0: The caption accurately and clearly describes the image.\n\n"
    "Caption: {caption}\n\n"
    "Score(Choose a rating from 0.0 to 1.0):"
)

_KEPT = re.compile(r"[\d.]")  # what the reference keeps of the reply before float()


def fleur_score(tokens: Sequence[str], probs: Sequence[Sequence[float]]) -> tuple[float | None, float | None]:
    """(smoothed score, written rating) from a greedy reply: its generated tokens' texts and,
    per token, the full-vocabulary probabilities of the digits 0..9 there. (None, None) when
    the reply gives no rating in [0, 1], (None, rating) when it cannot be smoothed."""
    try:
        rating = float("".join(_KEPT.findall("".join(tokens))).strip("."))
    except ValueError:
        return None, None
    if not 0 <= rating <= 1:
        return None, None

    def probs_at(digit: str, nth_if_repeated: int) -> list[float] | None:
        """The digit probabilities where `digit` was generated as a token of its own."""
        at = [k for k, token in enumerate(tokens) if token.strip() == digit]
        if not at:
            return None
        return [float(v) for v in probs[at[nth_if_repeated] if len(at) > 1 else at[0]]]

    if rating == 1:
        p = probs_at("1", 0)
        return (None if p is None else 0.9 * p[0] + p[1]), rating
    written = str(rating)
    if "." not in written:  # str() writes tiny ratings in exponent form, which the reference cannot smooth
        return None, rating
    point = written.index(".")
    first = written[point + 1]
    p = probs_at(first, 1 if first == "0" else 0)
    if p is None:
        return None, rating
    score = sum(d * v for d, v in enumerate(p)) / 10
    if len(written) > point + 2:
        p = probs_at(written[point + 2], 1)
        if p is None:
            return None, rating
        score += sum(d * v for d, v in enumerate(p)) / 100
    return score, rating


class Fleur(Metric):
    name = "fleur"
    columns = (Column("fleur", low=0.0, high=1.0, needs_source_image=True, needs_judge=True),)

    def __init__(self, vlm: VisionLanguageModel, *, prompt: str = PROMPT, max_new_tokens: int = 16):
        if "{caption}" not in prompt:
            raise ValueError("FLEUR prompt must contain {caption}")
        vlm = model_of("judge", vlm)
        require_capability(vlm, "generate_with_token_probs", self.name)
        self.vlm, self.prompt, self.max_new_tokens = vlm, prompt, max_new_tokens

    def describe(self) -> dict[str, Any]:
        return {"metric": self.name, "vlm": describe_model(self.vlm),
                "prompt": "FLEUR's instruction" if self.prompt == PROMPT else self.prompt,
                "max_new_tokens": self.max_new_tokens,
                "smoothing": "FLEUR's reference code: full-vocabulary digit probabilities at the digits of "
                             "str(float(rating)) (1.0: 0.9 P('0') + P('1') at the '1')"}

    def score(self, items: Sequence[LoadedSample], ctx: Context) -> list[dict[str, Any]]:
        images = LazyImages()
        asks = [(images.add(it.image_key, lambda it=it: it.image), self.prompt.replace("{caption}", it.caption.strip()))
                for it in items]
        rows = []
        for reply in generations_with_token_probs(ctx, self.vlm, asks, images, DIGITS, self.max_new_tokens):
            score, written = fleur_score(reply["tokens"], reply["probs"])
            row: dict[str, Any] = {"fleur": score, "fleur_greedy": written}
            if score is None:
                # no rating in [0, 1]; or one whose digits share tokens (tokenisers that merge digits)
                row["fleur_unparsed" if written is None else "fleur_unsmoothed"] = reply["text"]
            rows.append(row)
        return rows
