"""Hallucination and coverage: what a caption claims that the image lacks, and what of the
image the caption carries.

Precision. The `--llm` splits the caption into atomic claims (`caprecon.metrics.claims`);
the judge checks each on the ORIGINAL image I, softly (P(yes), as VQAScore), with DSG's
gating (a claim whose parent is false is unsupported without being asked). Per row:

    halluc                 soft precision: mean P(yes) over the caption's claims (gated: 0)
    halluc/<type>, halluc_n, halluc_n/<type>   the same per claim type, and the claim counts
    halluc_rate            share of claims unsupported (P(yes) < 0.5, gated included)
    halluc_unsupported     those claims: text, type, question, span in the caption, P(yes), gated
    halluc_asked, halluc_skipped   claims put to the judge, claims gated (no judge call)
    halluc_dropped         entries of the LLM's claim list that could not be used

Coverage, the other direction. With a QA bank it is the Caption Turing Test's value (the
bank's questions about I answered on the reconstruction Î); without one, the claims of the
row's reference captions checked on Î the same way as above. Per row `halluc_coverage`,
per category or claim type `halluc_coverage/<c>` with counts, and `halluc_coverage_source`
(turing or references). A row with neither a bank entry nor references has no coverage.

    halluc_f               F_beta of precision and coverage: (1 + b²) P C / (b² P + C);
                           beta > 1 weighs coverage more, beta < 1 precision

A row whose claim list (its caption's, or for coverage a reference's) could not be read, even
after the retry, is that row's error (reason "claims unreadable"), never a blank score that
the summary's mean and n would silently leave out.
"""

from __future__ import annotations

from typing import Any, Sequence

from caprecon.core.describe import describe_model
from caprecon.core.replies import ParseTally
from caprecon.data.images import LoadedSample
from caprecon.data.qa import QAItem
from caprecon.data.samples import SampleError
from caprecon.metrics.base import Column, Context, Metric
from caprecon.metrics.catalogue import name_of, target_of
from caprecon.metrics.categories import CategoryTally
from caprecon.metrics.claims import Checked, ClaimSet, check_claims, extract_claims
from caprecon.metrics.judging import LazyImages, require_capability
from caprecon.models.generator import TextToImage
from caprecon.models.llm import TextLLM
from caprecon.models.vlm import VisionLanguageModel
from caprecon.reconstruct.reconstructor import ReconstructionSpec
from caprecon.models.build import model_of

HEADLINES = {"precision": "halluc", "coverage": "halluc_coverage", "f": "halluc_f"}


def f_beta(precision: float | None, coverage: float | None, beta: float = 1.0) -> float | None:
    if precision is None or coverage is None:
        return None
    b2 = beta * beta
    denominator = b2 * precision + coverage
    return (1 + b2) * precision * coverage / denominator if denominator > 0 else 0.0


class Hallucination(Metric):
    """Each instance is named as the catalogue names its `report` (`caprecon.metrics.catalogue`)."""

    def __init__(self, judge: VisionLanguageModel, llm: TextLLM, *, generator: TextToImage | None = None,
                 bank: dict[str, list[QAItem]] | None = None, spec: ReconstructionSpec | None = None,
                 beta: float = 1.0, normalise: bool = False, iou_threshold: float = 0.5,
                 judges_for: dict[str, VisionLanguageModel] | None = None, report: str = "precision"):
        """`generator` makes Î for coverage (none: precision only); `bank` makes coverage the
        Caption Turing Test's; `report` picks the headline: precision, coverage or f."""
        if isinstance(beta, bool) or not isinstance(beta, (int, float)) or not beta > 0 or beta == float("inf"):
            raise ValueError(f"beta must be a positive number, not {beta!r}")
        if report not in HEADLINES:
            raise ValueError(f"report must be one of {', '.join(HEADLINES)}, not {report!r}")
        if report != "precision" and generator is None:
            raise ValueError(f"halluc's {report} needs a generator (coverage is checked on the reconstruction)")
        # before any error, which names the metric as the user asked for it
        self.name = name_of(target_of(Hallucination), report=report)
        judge, llm, generator = model_of("judge", judge), model_of("llm", llm), model_of("generator", generator)
        require_capability(judge, "option_probs", self.name)
        self.judge, self.llm, self.generator, self.bank = judge, llm, generator, bank
        self.spec = spec or ReconstructionSpec()
        self.beta, self.normalise, self.report = float(beta), normalise, report
        self.turing = None
        if generator is not None and bank is not None:
            from caprecon.metrics.turing import CaptionTuringTest

            self.turing = CaptionTuringTest(generator, judge, bank, self.spec, upper=False,
                                            iou_threshold=iou_threshold, judges_for=judges_for)
        self.parsing = ParseTally()  # how this run's claim lists were read (the manifest shows it)
        shown = ["halluc", "halluc_coverage", "halluc_f"] if generator is not None else ["halluc"]
        self.companions = tuple(c for c in [*shown, "halluc_rate"] if c != self.headline)
        # coverage without a bank checks the references' claims
        refs = generator is not None and bank is None
        declared = {"halluc": Column("halluc", low=0.0, high=1.0, needs_source_image=True, needs_judge=True),
                    "halluc_coverage": Column("halluc_coverage", low=0.0, high=1.0, needs_judge=True,
                                              needs_source_image=bank is not None, needs_references=refs),
                    "halluc_f": Column("halluc_f", low=0.0, high=1.0, needs_source_image=True, needs_judge=True,
                                       needs_references=refs),
                    # the share of the caption's claims the image does not support: smaller is better
                    "halluc_rate": Column("halluc_rate", higher_is_better=False, low=0.0, high=1.0,
                                          needs_source_image=True, needs_judge=True)}
        self.columns = tuple(declared[c] for c in [self.headline, *self.companions])

    @classmethod
    def from_roles(cls, roles: Any, config: Any, *, report: str) -> Hallucination:
        bank = roles.qa_bank if config.qa_bank else None
        # precision alone needs no generator; coverage (and F) is checked on the reconstruction
        generator = roles.generator if config.generator is not None or report != "precision" else None
        return cls(roles.judge, roles.llm, generator=generator, bank=bank, spec=config.spec, beta=config.beta,
                   normalise=config.vqa_normalise, iou_threshold=config.iou_threshold,
                   judges_for=roles.judges_for if bank else None, report=report)

    @property
    def headline(self) -> str:
        return HEADLINES[self.report]

    def describe(self) -> dict[str, Any]:
        return {"metric": self.name, "column": self.headline, "judge": describe_model(self.judge),
                "llm": describe_model(self.llm),
                "generator": describe_model(self.generator) if self.generator else None,
                "coverage": "turing" if self.turing else "references" if self.generator else None,
                "beta": self.beta, "probability": "P(yes)/(P(yes)+P(no))" if self.normalise else "P('Yes')",
                "claim_parsing": self.parsing.to_dict()}

    def score(self, items: Sequence[LoadedSample], ctx: Context) -> list[dict[str, Any]]:
        images = LazyImages()
        claim_sets = extract_claims(ctx, self.llm, [it.caption for it in items], tally=self.parsing)
        _require_readable(claim_sets, "caption")
        keys = [images.add(it.image_key, lambda it=it: it.image) for it in items]
        checked = check_claims(ctx, self.judge, images, [(k, s.claims) for k, s in zip(keys, claim_sets)],
                               normalise=self.normalise)
        rows = [_precision(s, c) for s, c in zip(claim_sets, checked)]
        if self.generator is not None:
            for row, coverage in zip(rows, self._coverage(items, ctx, images)):
                row.update(coverage)
                if "halluc_coverage" in coverage:
                    row["halluc_f"] = f_beta(row["halluc"], coverage["halluc_coverage"], self.beta)
        return rows

    def _coverage(self, items: Sequence[LoadedSample], ctx: Context, images: LazyImages) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = [{} for _ in items]
        if self.turing is not None:
            banked = [i for i, it in enumerate(items) if self.bank.get(it.sample.image_id)]
            for i, row in zip(banked, self.turing.score([items[i] for i in banked], ctx) if banked else []):
                out[i] = {_renamed(k): v for k, v in row.items() if k != "turing_flipped"}
                out[i]["halluc_coverage_source"] = "turing"
        with_refs = [i for i, it in enumerate(items) if not out[i] and it.sample.refs]
        if not with_refs:
            return out
        recons = ctx.reconstructor(self.generator, self.spec).reconstruct([items[i] for i in with_refs])
        refs = [[r for r in items[i].sample.refs if r.strip()] for i in with_refs]
        ref_claims = extract_claims(ctx, self.llm, [r for rs in refs for r in rs], tally=self.parsing)
        _require_readable(ref_claims, "reference")
        ref_sets = iter(ref_claims)
        # one set per reference (its dependency indices are its own), all checked on the row's Î
        owners, sets = [], []
        for row, (recon, rs) in enumerate(zip(recons, refs)):
            key = images.add(recon.key, recon.image)
            for _ in rs:
                owners.append(row)
                sets.append((key, next(ref_sets).claims))
        tallies = [CategoryTally() for _ in with_refs]
        for row, found in zip(owners, check_claims(ctx, self.judge, images, sets, normalise=self.normalise)):
            for c in found:
                tallies[row].add(c.claim.type, c.p_yes)
        for i, recon, tally in zip(with_refs, recons, tallies):
            out[i] = {**recon.record(), **tally.fields("halluc_coverage"), "halluc_coverage_source": "references"}
        return out


def _require_readable(claim_sets: Sequence[ClaimSet], of: str) -> None:
    """Raise for the batch when a claim list could not be read: the executor then tries its rows
    alone (the claims are cached, so the retry asks the LLM nothing) and each such row fails."""
    if any(s.unreadable for s in claim_sets):
        raise SampleError(f"the LLM's claim list of the {of} could not be read, even after one retry",
                          "claims unreadable")


def _renamed(key: str) -> str:
    """The Caption Turing Test's fields under coverage's names (reconstruction fields kept)."""
    return "halluc_coverage" + key[len("turing"):] if key.startswith("turing") else key


def _precision(claim_set, checked: Sequence[Checked]) -> dict[str, Any]:
    tally = CategoryTally()
    for c in checked:
        tally.add(c.claim.type, c.p_yes)
    unsupported = [c for c in checked if not c.supported]
    row = {**tally.fields("halluc"),
           "halluc_rate": len(unsupported) / len(checked) if checked else None,
           "halluc_unsupported": [{"claim": c.claim.text, "type": c.claim.type, "question": c.claim.question,
                                   "span": c.claim.span, "p_yes": round(c.p_yes, 4), "gated": c.gated}
                                  for c in unsupported],
           "halluc_asked": sum(not c.gated for c in checked), "halluc_skipped": sum(c.gated for c in checked),
           "halluc_dropped": claim_set.dropped}
    return row
