"""Atomic claims of a caption, and checking them one by one on an image with a judge.

Extraction. A text LLM splits a caption into atomic claims (DCScore's primitive information
units, DSG's propositions): each states one thing, typed as DSG types its tuples (entity,
attribute, relation, count, written text, spatial, global, each with DSG's detailed kind: an
entity whole or part, an attribute's colour, material, state..., a relation's action), names
the claims it depends on by their index ("the dog is brown" depends on "there is a dog"),
turns itself into a yes/no question, and quotes the words of the caption it comes from.
`to_propositions` and `from_propositions` carry claims to and from DSG's own rows (ids from 1,
parents by id, 0 for none; `caprecon.data.loaders.dsg`), so a DSG question bank is checked
the same way and caprecon's claims are written in DSG's file. The reply must be JSON (`CLAIM_SHAPE`); it is read
by `caprecon.core.replies` (strict, repaired, or after one retry that shows the LLM its
error). Entries that cannot be used (no claim text, an unknown type) are dropped and
counted; a dependency on a claim that is not an earlier one is ignored. The result is cached
per (LLM, caption, prompt).

Checking. Each claim's question is put to the judge on an image and read softly, as
VQAScore reads its one question (`yes_probabilities`). Claims are asked level by level of
their dependencies, all claims of a level of every image in one judge batch (the judge's
backend shares each image's prefix among its questions); a claim with a parent judged
false (P(yes) < 0.5) is not asked and counts as unsupported with P(yes) = 0 (DSG's gating).

Scoring answers already given (`gate`, `item_score`): a question scores 1 when answered yes and
0 otherwise (`answer_score`: an empty answer, or one neither yes nor no, is 0); DSG's gate sets
a question to 0 when any of its parents scored below `SUPPORTED` (on yes/no scores: 0), a parent
with no score of its own counting as 0; an item's score is the mean over all its questions,
reported gated and ungated.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from caprecon.core.replies import ParseTally, ReplyShapeError, read_replies
from caprecon.data.loaders.dsg import Proposition
from caprecon.metrics.base import Context
from caprecon.metrics.judging import LazyImages
from caprecon.metrics.vqascore import DEFAULT_TEMPLATE, yes_probabilities
from caprecon.models.llm import TextLLM
from caprecon.models.vlm import VisionLanguageModel
from caprecon.store.index import content_key

CLAIM_TYPES = ("entity", "attribute", "relation", "count", "text", "spatial", "global")
# names LLMs write for the same types
_TYPE_NAMES = {"object": "entity", "existence": "entity", "colour": "attribute", "color": "attribute",
               "material": "attribute", "action": "relation", "relationship": "relation", "number": "count",
               "quantity": "count", "ocr": "text", "text rendering": "text", "position": "spatial",
               "location": "spatial", "scene": "global", "style": "global"}
#: DSG's broad category and default detailed kind of each claim type (DSG files count and text
#: rendering under "other", spatial relations under "relation")
DSG_CATEGORIES = {"entity": ("entity", "whole"), "attribute": ("attribute", "state"), "relation": ("relation", "action"),
                  "count": ("other", "count"), "text": ("other", "text rendering"), "spatial": ("relation", "spatial"),
                  "global": ("global", "-")}
#: bump when a change to the claim prompt's reading (`shape_claims`, the repairs of
#: `read_replies`) changes the claims read from the same reply: the parsed claims are what the
#: store keeps, so the key must name the parser that made them
CLAIMS_PARSER_REVISION = 2
SUPPORTED = 0.5  # a claim is supported when the judge's P(yes) is at least this

CLAIM_SHAPE = (
    '{"claims": [{"claim": "there is a dog", "type": "entity", "kind": "whole", "question": "Is there a dog?", '
    '"span": "a brown dog", "depends_on": []}, {"claim": "the dog is brown", "type": "attribute", "kind": "color", '
    '"question": "Is the dog brown?", "span": "brown", "depends_on": [0]}]}'
)
CLAIM_PROMPT = (
    "Split this image caption into atomic claims: each claim states exactly one thing the caption says "
    "about the image. Types: entity (something is there), attribute (a property of one thing), relation "
    "(what one thing does to or with another), count (how many), text (words written in the image), "
    "spatial (where things are relative to each other or the frame), global (the whole image: its style, "
    "lighting, setting). Kinds refine the type: an entity is whole or part; an attribute is color, material, "
    "shape, size, texture, state or type; a relation is an action. For each claim give its type and kind, a "
    "yes/no question about the image that is true exactly when the claim is, the words of the caption "
    "it comes from (span, copied exactly), and the indices (from 0) of the earlier claims it depends on "
    "(an attribute of the dog depends on the claim that there is a dog). State nothing the caption does "
    "not say.\n\nCaption: \"{caption}\"\n\nReply with JSON only, of this shape:\n{shape}"
)


@dataclass(frozen=True)
class Claim:
    text: str
    type: str
    question: str
    span: str = ""
    depends_on: tuple[int, ...] = ()
    kind: str = ""  # DSG's detailed category (whole, part, color, action, ...); "" when not given

    def as_dict(self) -> dict[str, Any]:
        return {"claim": self.text, "type": self.type, "kind": self.kind, "question": self.question,
                "span": self.span, "depends_on": list(self.depends_on)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Claim":
        return cls(d["claim"], d["type"], d["question"], d.get("span", ""), tuple(d.get("depends_on", ())),
                   d.get("kind", ""))


@dataclass(frozen=True)
class ClaimSet:
    """A caption's claims, the entries of the reply that were dropped, and whether the reply
    could be read at all (`unreadable`: not even after the retry)."""

    claims: tuple[Claim, ...]
    dropped: int = 0
    unreadable: bool = False


def claim_prompt(caption: str) -> str:
    # str.replace, not str.format: the shape holds braces
    return CLAIM_PROMPT.replace("{shape}", CLAIM_SHAPE).replace("{caption}", caption.strip())


def shape_claims(value: Any) -> tuple[dict[str, Any], bool]:
    """The parsed reply as {"claims": [...], "dropped": n}, and whether it had to be adjusted
    (a bare list, other key names, dependencies on no earlier claim). `ReplyShapeError` when
    it holds no list of claims at all."""
    adjusted = False
    if isinstance(value, dict):
        entries = value.get("claims")
        if not isinstance(entries, list):
            lists = [v for v in value.values() if isinstance(v, list)]
            if len(lists) != 1:
                raise ReplyShapeError('expected {"claims": [...]}')
            entries, adjusted = lists[0], True
    else:
        entries, adjusted = value, True
    kept: list[dict[str, Any]] = []
    new_index: dict[int, int] = {}  # the reply's index of each kept claim -> its index among the kept
    dropped = 0
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict):
            dropped += 1
            continue
        text = entry.get("claim", entry.get("text", entry.get("statement")))
        kind = str(entry.get("type", "")).strip().lower()
        kind = _TYPE_NAMES.get(kind, kind)
        if not isinstance(text, str) or not text.strip() or kind not in CLAIM_TYPES:
            dropped += 1
            continue
        adjusted |= "claim" not in entry or entry.get("type") != kind
        question = entry.get("question")
        if not isinstance(question, str) or not question.strip().endswith("?"):
            question = DEFAULT_TEMPLATE.replace("{caption}", text.strip())
            adjusted = True
        parents = entry.get("depends_on", [])
        parents = parents if isinstance(parents, list) else [parents]
        known = sorted({new_index[p] for p in parents if isinstance(p, int) and not isinstance(p, bool)
                        and p in new_index})
        adjusted |= len(known) != len(parents)
        span, detail = entry.get("span"), entry.get("kind")
        new_index[i] = len(kept)
        kept.append({"claim": text.strip(), "type": kind, "question": question.strip(),
                     "kind": detail.strip().lower() if isinstance(detail, str) else "",
                     "span": span.strip() if isinstance(span, str) else "", "depends_on": known})
    return {"claims": kept, "dropped": dropped}, adjusted or bool(dropped)


def extract_claims(ctx: Context, llm: TextLLM, captions: Sequence[str], *, max_new_tokens: int = 768,
                   tally: ParseTally | None = None) -> list[ClaimSet]:
    """Each caption's claims, cached per (LLM, caption, prompt); `tally` counts how the
    replies computed now were read."""
    tally = tally if tally is not None else ParseTally()
    prompts = [claim_prompt(c) for c in captions]
    keys = [content_key("caption-claims", model=llm.fingerprint, prompt=p, max_new_tokens=max_new_tokens,
                        parser=CLAIMS_PARSER_REVISION) for p in prompts]

    def generate(texts: list[str]) -> list[str]:
        with ctx.model_call():
            return list(llm.generate(texts, max_new_tokens=max_new_tokens))

    def compute(order: list[int]) -> list[dict[str, Any]]:
        replies = generate([prompts[i] for i in order])
        rejects: list[dict[str, Any]] = []
        read = read_replies(replies, shape_claims, CLAIM_SHAPE, generate, tally, rejects,
                            [{"caption": captions[i]} for i in order])
        return [value if value is not None else {"claims": [], "dropped": 0, "unreadable": True} for value in read]

    found = ctx.cached("caption-claims", keys, compute, model=llm) if prompts else []
    return [ClaimSet(tuple(Claim.from_dict(c) for c in f["claims"]), int(f.get("dropped", 0)),
                     bool(f.get("unreadable", False))) for f in found]


@dataclass(frozen=True)
class Checked:
    """A claim as the judge saw it: P(yes), or gated (not asked: a parent was judged false)."""

    claim: Claim
    p_yes: float
    gated: bool = False

    @property
    def supported(self) -> bool:
        return self.p_yes >= SUPPORTED


def levels(claims: Sequence[Claim]) -> list[int]:
    """Each claim's depth in its dependencies (0: depends on nothing); parents come first."""
    depth: list[int] = []
    for claim in claims:
        depth.append(1 + max((depth[p] for p in claim.depends_on), default=-1))
    return depth


def check_claims(ctx: Context, judge: VisionLanguageModel, images: LazyImages,
                 sets: Sequence[tuple[str, Sequence[Claim]]], *, normalise: bool = False) -> list[list[Checked]]:
    """Each (image key, claims) set's claims checked on its image: one judge batch per level
    of dependency, holding that level's claims of every set, except those gated."""
    depths = [levels(claims) for _, claims in sets]
    results: list[list[Checked | None]] = [[None] * len(claims) for _, claims in sets]
    for level in range(1 + max((max(d, default=-1) for d in depths), default=-1)):
        asks, owners = [], []
        for s, ((key, claims), depth) in enumerate(zip(sets, depths)):
            for c, claim in enumerate(claims):
                if depth[c] != level:
                    continue
                if any(not results[s][p].supported for p in claim.depends_on):
                    results[s][c] = Checked(claim, 0.0, gated=True)
                else:
                    asks.append((key, claim.question))
                    owners.append((s, c))
        if asks:
            for (s, c), p in zip(owners, yes_probabilities(ctx, judge, asks, images, normalise=normalise)):
                results[s][c] = Checked(sets[s][1][c], float(p))
    return [list(r) for r in results]  # every claim is filled: each level is at least its parents' + 1


def answer_score(answer: str | None) -> float:
    """1.0 for a yes (case and surrounding punctuation aside), else 0.0: no, empty, missing, other."""
    return 1.0 if answer is not None and answer.strip().strip(".,!?").strip().lower() == "yes" else 0.0


def gate(scores: Mapping[int, float], parents: Mapping[int, Sequence[int]]) -> dict[int, float]:
    """Each question's score after DSG's gate: 0 when any of its parents (ids, `parents[q]`)
    scored below `SUPPORTED` by its own answer, or has no score; else its own score."""
    return {q: 0.0 if any(scores.get(p, 0.0) < SUPPORTED for p in parents.get(q, ())) else s
            for q, s in scores.items()}


@dataclass(frozen=True)
class ItemScore:
    """An item's score: the mean over all its questions, with and without the gate."""

    gated: float
    ungated: float
    n: int  # questions


def item_score(scores: Mapping[int, float], parents: Mapping[int, Sequence[int]]) -> ItemScore:
    """The mean of `scores` over all questions, gated (`gate`) and not; an item with no
    question scores 0 both ways (nothing it asked for was seen)."""
    if not scores:
        return ItemScore(0.0, 0.0, 0)
    gated = gate(scores, parents)
    return ItemScore(sum(gated.values()) / len(gated), sum(scores.values()) / len(scores), len(scores))


def to_propositions(item_id: str, caption: str, claims: Sequence[Claim]) -> list[Proposition]:
    """`claims` as DSG's rows: ids from 1, parents by id ("0": none), DSG's categories, the span as keywords."""
    rows = []
    for i, claim in enumerate(claims):
        broad, default_kind = DSG_CATEGORIES[claim.type]
        kind = claim.kind or default_kind
        keywords = claim.span or claim.text
        dependency = ",".join(str(p + 1) for p in claim.depends_on) or "0"
        rows.append(Proposition(item_id, caption, keywords, i + 1, dependency, broad, kind,
                                f"{broad} - {kind} ({keywords})", claim.question))
    return rows


def from_propositions(propositions: Sequence[Proposition]) -> list[Claim]:
    """One item's DSG rows as claims (in file order; a parent id that is not an earlier row's is
    left out, as `shape_claims` leaves out a dependency on no earlier claim). The keywords stand
    in for the span: DSG's rows quote no words of the prompt."""
    index = {p.proposition_id: i for i, p in enumerate(propositions)}
    return [Claim(p.tuple, p.claim_type, p.question, p.keywords,
                  tuple(sorted(index[q] for q in p.parents if index.get(q, len(propositions)) < i)), p.category_detailed)
            for i, p in enumerate(propositions)]
