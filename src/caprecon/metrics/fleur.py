"""FLEUR (Lee et al., ACL 2024): an LVLM rates how well the caption describes the image.

As the reference implementation does, the judge answers FLEUR's instruction greedily, the
rating it writes is parsed, and the score is smoothed with the judge's probabilities over
the ten digit tokens "0".."9" *at the positions where it wrote the rating's digits*
(P(d) = the softmax over the digit tokens alone, i.e. full-vocabulary probabilities
renormalised over the ten digits):

    written "0.d…"   fleur = Σ_d d·P₁(d) / 10  (+ Σ_d d·P₂(d) / 100 when a second decimal was written)
    written "1", "1.0"  fleur = 0.9·P₀("0") + 1.0·P₀("1")

with P₁, P₂ at the first and second decimal and P₀ at the leading digit. A written "0"
without decimals scores 0. A rating outside [0, 1], or a reply without one, is not
parseable: the row keeps `fleur` None and the reply in `fleur_unparsed`; a rating whose
digits share a token (tokenisers that merge digits, unlike LLaVA's and Qwen's) cannot be
smoothed and keeps the reply in `fleur_unsmoothed`. `fleur_greedy` is the rating as written. Over an OpenAI-compatible server the digit probabilities come
from the `top_logprobs` of the generated tokens (a digit outside the top k counts as 0).
"""

from __future__ import annotations

import re
from typing import Any, Sequence

from caprecon.core.describe import describe_model
from caprecon.models.vlm import VisionLanguageModel
from caprecon.data.images import LoadedSample
from caprecon.metrics.base import Context, Metric
from caprecon.metrics.judging import LazyImages, generations_with_token_probs, require_capability

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

_RATING = re.compile(r"(?<![\d.])(\d+)(?:\.(\d+))?")


def fleur_score(tokens: Sequence[str], probs: Sequence[Sequence[float]]) -> tuple[float | None, float | None]:
    """(smoothed score, written rating) from a greedy reply: its generated tokens' texts and,
    per token, the probabilities of the digits 0..9 there. (None, None) when no rating in
    [0, 1] was written, (None, rating) when its digits are not tokens of their own."""
    text, owner = "", []
    for k, token in enumerate(tokens):
        text += token
        owner += [k] * len(token)
    match = _RATING.search(text)
    if match is None:
        return None, None
    whole, decimals = match.group(1), match.group(2) or ""
    written = float(f"{whole}.{decimals}" if decimals else whole)
    if not 0 <= written <= 1:
        return None, None

    def digit_probs(char: int) -> list[float] | None:
        k = owner[char]
        if tokens[k].strip() != text[char]:  # the digit shares its token: no digit distribution there
            return None
        p = [float(v) for v in probs[k]]
        total = sum(p)
        return [v / total for v in p] if total > 0 else None

    if written == 1:
        p = digit_probs(match.start(1) + len(whole) - 1)
        return (None if p is None else 0.9 * p[0] + 1.0 * p[1]), written
    if not decimals:
        return 0.0, written
    first = digit_probs(match.start(2))
    if first is None:
        return None, written
    score = sum(d * p for d, p in enumerate(first)) / 10
    if len(decimals) > 1:
        second = digit_probs(match.start(2) + 1)
        if second is None:
            return None, written
        score += sum(d * p for d, p in enumerate(second)) / 100
    return score, written


class Fleur(Metric):
    name = "fleur"

    def __init__(self, vlm: VisionLanguageModel, *, prompt: str = PROMPT, max_new_tokens: int = 16):
        if "{caption}" not in prompt:
            raise ValueError("FLEUR prompt must contain {caption}")
        require_capability(vlm, "generate_with_token_probs", self.name)
        self.vlm, self.prompt, self.max_new_tokens = vlm, prompt, max_new_tokens

    def describe(self) -> dict[str, Any]:
        return {"metric": self.name, "vlm": describe_model(self.vlm),
                "prompt": "FLEUR's instruction" if self.prompt == PROMPT else self.prompt,
                "max_new_tokens": self.max_new_tokens,
                "smoothing": "reference rule: digit softmax at the written rating's decimal positions "
                             "(1.0: 0.9 P('0') + P('1') at the leading digit)"}

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
