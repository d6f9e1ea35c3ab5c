"""`claims`: each claim of a caption checked on the photo I and on its reconstruction Î.

The `--llm` splits the caption into claims (`caprecon.metrics.claims`: DSG-style typed claims
with their parents, a yes/no question each and the words of the caption they come from); the
judge answers every question on I and on Î, with DSG's gate on each image (a claim whose parent
is not supported on that image is not asked there and counts as unsupported). A claim is
supported when P(yes) >= 0.5. Per caption:

    claims_precision       supported on I / all claims (1 - precision: the hallucination rate)
    claims_conveyed        supported on I and on Î / supported on I: what a generator could rebuild
                           from the caption of what is true of the photo (None when nothing is supported)
    claims_lost            how many claims are supported on I but not on Î
    claims_precision/<type>, claims_conveyed/<type>   the same per claim type
    claims_n, claims_n/<type>                         claims per caption (and per type)
    claims_unlocated       claims whose span is not found in the caption (flagged in the evidence)
    claims_evidence        per claim: text, type, question, span with its character offsets in the
                           caption (start, end; None when not found), P(yes) on I and on Î, whether
                           gated on each, and its status: conveyed, hallucinated or lost

The reconstruction is the run's one (the store's, shared with every other metric); under
`--seeds` the headline, claims_conveyed, and its companions carry their seed interval
(`caprecon.metrics.seeds`). Precision does not depend on Î, so its interval is a point.
"""

from __future__ import annotations

from typing import Any, Sequence

from caprecon.core.describe import describe_model
from caprecon.core.replies import ParseTally
from caprecon.data.images import LoadedSample
from caprecon.data.samples import SampleError
from caprecon.metrics.base import Column, Context, Metric
from caprecon.data.loaders.dsg import Proposition
from caprecon.metrics.claims import CLAIM_TYPES, Checked, Claim, check_claims, extract_claims, item_score
from caprecon.metrics.judging import LazyImages, require_capability
from caprecon.models.build import model_of
from caprecon.models.generator import TextToImage
from caprecon.models.llm import TextLLM
from caprecon.models.vlm import VisionLanguageModel
from caprecon.reconstruct.reconstructor import ReconstructionSpec

CONVEYED, HALLUCINATED, LOST = "conveyed", "hallucinated", "lost"


def span_offsets(caption: str, span: str) -> tuple[int, int] | None:
    """Where `span` is in `caption` (character offsets, end exclusive): the first exact match,
    else the first match ignoring case; None when it is not there (or empty)."""
    if not span:
        return None
    start = caption.find(span)
    if start < 0:
        start = caption.lower().find(span.lower())
    return (start, start + len(span)) if start >= 0 else None


def ratio(part: int, whole: int) -> float | None:
    return part / whole if whole else None


def claim_rows(caption: str, on_image: Sequence[Checked], on_recon: Sequence[Checked]) -> dict[str, Any]:
    """One caption's fields from its claims checked on I and on Î (same claims, same order)."""
    evidence, unlocated = [], 0
    tally: dict[str, list[int]] = {}  # type -> [claims, supported on I, also on Î]
    for seen, rebuilt in zip(on_image, on_recon):
        claim: Claim = seen.claim
        status = HALLUCINATED if not seen.supported else CONVEYED if rebuilt.supported else LOST
        counts = tally.setdefault(claim.type, [0, 0, 0])
        counts[0] += 1
        counts[1] += seen.supported
        counts[2] += seen.supported and rebuilt.supported
        where = span_offsets(caption, claim.span)
        unlocated += where is None
        evidence.append({"claim": claim.text, "type": claim.type, "question": claim.question, "span": claim.span,
                         "start": where[0] if where else None, "end": where[1] if where else None,
                         "p_yes_image": round(seen.p_yes, 4), "p_yes_recon": round(rebuilt.p_yes, 4),
                         "gated_image": seen.gated, "gated_recon": rebuilt.gated, "status": status})
    n, supported, kept = (sum(c[i] for c in tally.values()) for i in range(3))
    row: dict[str, Any] = {"claims_conveyed": ratio(kept, supported), "claims_precision": ratio(supported, n),
                           "claims_lost": supported - kept, "claims_n": n, "claims_unlocated": unlocated}
    for kind in sorted(tally):
        total, on_i, both = tally[kind]
        row[f"claims_precision/{kind}"] = ratio(on_i, total)
        row[f"claims_conveyed/{kind}"] = ratio(both, on_i)
        row[f"claims_n/{kind}"] = total
    row["claims_evidence"] = evidence
    return row


class ClaimCheck(Metric):
    """`-m claims`: the caption's claims, split by `llm`, checked by `judge` on the photo and on
    the reconstruction `generator` makes of the caption (`spec`); `normalise` reads P(yes) as
    P(yes)/(P(yes)+P(no)). Per caption: claims_conveyed (the headline), claims_precision,
    claims_lost, the same per claim type, and each claim's evidence (the module doc says how).

        metric = caprecon.ClaimCheck(judge, llm, generator)
        metric(images, captions)  # claims_conveyed per pair"""

    primary = "claims_conveyed"
    companions = ("claims_precision", "claims_lost")
    columns = (Column("claims_conveyed", low=0.0, high=1.0, needs_source_image=True, needs_judge=True),
               Column("claims_precision", low=0.0, high=1.0, needs_source_image=True, needs_judge=True),
               Column("claims_lost", higher_is_better=False, low=0.0, needs_source_image=True, needs_judge=True))

    def __init__(self, judge: VisionLanguageModel, llm: TextLLM, generator: TextToImage, *,
                 spec: ReconstructionSpec | None = None, normalise: bool = False):
        judge, llm, generator = model_of("judge", judge), model_of("llm", llm), model_of("generator", generator)
        if generator is None:
            raise ValueError("the claims metric needs a generator: each claim is checked on the reconstruction too")
        require_capability(judge, "option_probs", self.name)
        self.judge, self.llm, self.generator = judge, llm, generator
        self.spec = spec or ReconstructionSpec()
        self.normalise = normalise
        self.parsing = ParseTally()

    @classmethod
    def from_roles(cls, roles: Any, config: Any) -> ClaimCheck:
        return cls(roles.judge, roles.llm, roles.generator, spec=config.spec, normalise=config.vqa_normalise)

    def describe(self) -> dict[str, Any]:
        return {"metric": self.name, "column": self.headline, "judge": describe_model(self.judge),
                "llm": describe_model(self.llm), "generator": describe_model(self.generator),
                "claim_types": list(CLAIM_TYPES), "gate": "DSG: a claim whose parent is unsupported on an image "
                "is unsupported there", "probability": "P(yes)/(P(yes)+P(no))" if self.normalise else "P('Yes')",
                "claim_parsing": self.parsing.to_dict()}

    def score(self, items: Sequence[LoadedSample], ctx: Context) -> list[dict[str, Any]]:
        claim_sets = extract_claims(ctx, self.llm, [it.caption for it in items], tally=self.parsing)
        if any(s.unreadable for s in claim_sets):
            raise SampleError("the LLM's claim list of the caption could not be read, even after one retry",
                              "claims unreadable")
        recons = ctx.reconstructor(self.generator, self.spec).reconstruct(list(items))
        images = LazyImages()
        photo_keys = [images.add(it.image_key, lambda it=it: it.image) for it in items]
        recon_keys = [images.add(r.key, r.image) for r in recons]
        sets = [(k, s.claims) for k, s in zip(photo_keys, claim_sets)]
        sets += [(k, s.claims) for k, s in zip(recon_keys, claim_sets)]
        checked = check_claims(ctx, self.judge, images, sets, normalise=self.normalise)
        on_image, on_recon = checked[: len(items)], checked[len(items):]
        return [{**recon.record(), **claim_rows(item.caption, seen, rebuilt)}
                for item, recon, seen, rebuilt in zip(items, recons, on_image, on_recon)]


class PropositionCheck(Metric):
    """DSG's own scoring, live: a prompt's DSG questions (`propositions`, by item id) asked of
    `judge` on the image `generator` makes of the prompt (`caprecon t2i --questions`).

    Every question is asked (none is skipped), read as supported at P(yes) >= 0.5 (1) or not (0);
    then DSG's gate (`gate`: a question whose parent scored 0 scores 0) and the item's mean over
    all its questions (`item_score`). A row is matched to its propositions by its id, else by its
    caption being the propositions' prompt text; a row with neither is that row's error.

        <column>            the gated item score        <column>_ungated   without the gate
        <column>_n          the questions asked
    """

    name = "dsg"

    def __init__(self, judge: VisionLanguageModel, generator: TextToImage,
                 propositions: dict[str, Sequence[Proposition]], *, spec: ReconstructionSpec | None = None,
                 normalise: bool = False, column: str = "dsg"):
        judge, generator = model_of("judge", judge), model_of("generator", generator)
        require_capability(judge, "option_probs", self.name)
        self.judge, self.generator, self.spec, self.normalise = judge, generator, spec or ReconstructionSpec(), normalise
        self.propositions = {item: list(rows) for item, rows in propositions.items()}
        self.by_text = {rows[0].text.strip(): item for item, rows in self.propositions.items() if rows}
        self.primary, self.companions = column, (f"{column}_ungated",)
        self.columns = (Column(column, low=0.0, high=1.0, needs_judge=True),
                        Column(f"{column}_ungated", low=0.0, high=1.0, needs_judge=True))
        self.needs_source_image = False

    def describe(self) -> dict[str, Any]:
        return {"metric": self.name, "column": self.headline, "judge": describe_model(self.judge),
                "generator": describe_model(self.generator), "items": len(self.propositions),
                "gate": "DSG: a question whose parent scored 0 scores 0", "supported": "P(yes) >= 0.5"}

    def _item(self, item: LoadedSample) -> list[Proposition]:
        key = item.sample.id if item.sample.id in self.propositions else self.by_text.get(item.caption.strip())
        if key is None:
            raise SampleError(f"no DSG questions for row {item.sample.id!r}: its id is no item_id of the question "
                              "file and its caption no item's text", "no questions")
        return self.propositions[key]

    def score(self, items: Sequence[LoadedSample], ctx: Context) -> list[dict[str, Any]]:
        found = [self._item(it) for it in items]
        recons = ctx.reconstructor(self.generator, self.spec).reconstruct(list(items))
        images = LazyImages()
        keys = [images.add(r.key, r.image) for r in recons]
        # every question asked: the gate is applied to the answers afterwards, as DSG scores them
        sets = [(k, [Claim(p.tuple, p.claim_type, p.question) for p in rows]) for k, rows in zip(keys, found)]
        checked = check_claims(ctx, self.judge, images, sets, normalise=self.normalise)
        out = []
        for recon, rows, answers in zip(recons, found, checked):
            scores = {p.proposition_id: 1.0 if a.supported else 0.0 for p, a in zip(rows, answers)}
            result = item_score(scores, {p.proposition_id: p.parents for p in rows})
            out.append({**recon.record(), self.headline: result.gated, f"{self.headline}_ungated": result.ungated,
                        f"{self.headline}_n": result.n})
        return out
