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
the reply in `fleur_unsmoothed`. `fleur_greedy` is the rating as written.

Over an OpenAI-compatible server the digit probabilities come from the `top_logprobs` of the
generated tokens, each digit read as the entry spelled exactly as it ("7", as a local judge
reads the token "7"); a digit outside the top k is read as 0. All the digits so read held at
most 1 - m together, m the probability the top k covered where the rating's digits were
written (the least of those positions): the smoothed score is then low by at most 1 - m
(each digit weighs at most 1: 0.9 + 0.09 below a rating of 1, 1 for P("1") at a rating of 1).
That m is the row's `fleur_topk_mass`; under `TOPK_FLOOR` (0.99: at most 0.01 lost) the row
has no `fleur` and its error says why. A local judge reads the whole vocabulary and writes no
`fleur_topk_mass`.
"""

from __future__ import annotations

import re
from typing import Any, Sequence

from caprecon.core.describe import describe_model
from caprecon.models.vlm import VisionLanguageModel
from caprecon.data.images import LoadedSample
from caprecon.data.samples import SampleError
from caprecon.metrics.base import Column, Context, Metric
from caprecon.metrics.judging import LazyImages, generations_with_token_probs, require_capability
from caprecon.models.build import model_of

DIGITS = [str(d) for d in range(10)]

#: the least probability a server's top k must cover where the rating's digits were written: the
#: digits outside it, read as 0, then cost the smoothed score at most 1 - 0.99 = 0.01
TOPK_FLOOR = 0.99

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


def written_rating(tokens: Sequence[str]) -> float | None:
    """The rating as the reference reads the reply (its digits and dots, dots at either end
    dropped, `float()`); None when that gives no number in [0, 1]."""
    try:
        rating = float("".join(_KEPT.findall("".join(tokens))).strip("."))
    except ValueError:
        return None
    return rating if 0 <= rating <= 1 else None


def digit_positions(tokens: Sequence[str], rating: float) -> list[int] | None:
    """The generated positions whose digit probabilities smooth `rating`, as the reference picks
    them: the "1" of a rating of 1, else the first decimal of str(rating) and its second when it
    has one. None when a digit there is not a token of its own (or str() wrote an exponent)."""

    def position(digit: str, nth_if_repeated: int) -> int | None:
        at = [k for k, token in enumerate(tokens) if token.strip() == digit]
        if not at:
            return None
        return at[nth_if_repeated] if len(at) > 1 else at[0]

    if rating == 1:
        found = [position("1", 0)]
    else:
        written = str(rating)
        if "." not in written:  # str() writes tiny ratings in exponent form, which the reference cannot smooth
            return None
        point = written.index(".")
        first = written[point + 1]
        found = [position(first, 1 if first == "0" else 0)]
        if len(written) > point + 2:
            found.append(position(written[point + 2], 1))
    return None if None in found else found


def fleur_score(tokens: Sequence[str], probs: Sequence[Sequence[float]]) -> tuple[float | None, float | None]:
    """(smoothed score, written rating) from a greedy reply: its generated tokens' texts and,
    per token, the full-vocabulary probabilities of the digits 0..9 there. (None, None) when
    the reply gives no rating in [0, 1], (None, rating) when it cannot be smoothed."""
    rating = written_rating(tokens)
    if rating is None:
        return None, None
    positions = digit_positions(tokens, rating)
    if positions is None:
        return None, rating
    p = [float(v) for v in probs[positions[0]]]
    if rating == 1:
        return 0.9 * p[0] + p[1], rating
    score = sum(d * v for d, v in enumerate(p)) / 10
    if len(positions) > 1:
        p = [float(v) for v in probs[positions[1]]]
        score += sum(d * v for d, v in enumerate(p)) / 100
    return score, rating


class Fleur(Metric):
    columns = (Column("fleur", low=0.0, high=1.0, needs_source_image=True, needs_judge=True),
               # over a server: the probability its top k covered where the digits were read (a diagnostic)
               Column("fleur_topk_mass", higher_is_better=None, low=0.0, high=1.0, needs_source_image=True,
                      needs_judge=True))

    def __init__(self, vlm: VisionLanguageModel, *, prompt: str = PROMPT, max_new_tokens: int = 16,
                 topk_floor: float = TOPK_FLOOR):
        if "{caption}" not in prompt:
            raise ValueError("FLEUR prompt must contain {caption}")
        if isinstance(topk_floor, bool) or not isinstance(topk_floor, (int, float)) or not 0 <= topk_floor <= 1:
            raise ValueError(f"FLEUR topk_floor must be a number from 0 to 1, not {topk_floor!r}")
        self.topk_floor = float(topk_floor)
        vlm = model_of("judge", vlm)
        require_capability(vlm, "generate_with_token_probs", self.name)
        self.vlm, self.prompt, self.max_new_tokens = vlm, prompt, max_new_tokens

    @classmethod
    def from_roles(cls, roles: Any, config: Any) -> Fleur:
        return cls(roles.judge, **({"prompt": config.fleur_prompt} if config.fleur_prompt else {}))

    def describe(self) -> dict[str, Any]:
        return {"metric": self.name, "vlm": describe_model(self.vlm),
                "prompt": "FLEUR's instruction" if self.prompt == PROMPT else self.prompt,
                "max_new_tokens": self.max_new_tokens, "topk_floor": self.topk_floor,
                "smoothing": "FLEUR's reference code: full-vocabulary digit probabilities at the digits of "
                             "str(float(rating)) (1.0: 0.9 P('0') + P('1') at the '1')"}

    def score(self, items: Sequence[LoadedSample], ctx: Context) -> list[dict[str, Any]]:
        images = LazyImages()
        asks = [(images.add(it.image_key, lambda it=it: it.image), self.prompt.replace("{caption}", it.caption.strip()))
                for it in items]
        rows, short = [], []
        for reply in generations_with_token_probs(ctx, self.vlm, asks, images, DIGITS, self.max_new_tokens):
            score, written = fleur_score(reply["tokens"], reply["probs"])
            row: dict[str, Any] = {"fleur": score, "fleur_greedy": written}
            if score is None:
                # no rating in [0, 1]; or one whose digits share tokens (tokenisers that merge digits)
                row["fleur_unparsed" if written is None else "fleur_unsmoothed"] = reply["text"]
            elif reply.get("covered") is not None:  # a server's top k: the digits outside it were read as 0
                mass = min(reply["covered"][k] for k in digit_positions(reply["tokens"], written))
                row["fleur_topk_mass"] = mass
                if mass < self.topk_floor:
                    short.append(mass)
            rows.append(row)
        if short:  # the executor scores the batch's rows alone again: each short one is that row's error
            raise SampleError(f"the server's top-k covered {min(short):.4f} of the probability where the rating's "
                              f"digits were written, under FLEUR's floor {self.topk_floor:g}: the digits outside "
                              f"it are unknown (raise top_logprobs, or use a local judge)", "digits outside the top-k")
        return rows
