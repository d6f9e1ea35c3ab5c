"""The captions the ReconScore paper's probes need (scored and summed up by `caprecon.stats.probes`),
written by an LLM and by a rule-based perturber, for `meta --probes` (`caprecon.apps.metabench.probes`).

Δ probe (semantic fidelity over lexical overlap). Each reference caption gets two variants:
a *paraphrase* that changes vocabulary and syntax but keeps every fact (low word overlap
with the reference) and a *perturbation* that keeps almost every word but changes one fact
(high word overlap). Here the LLM writes the paraphrase and the rule-based `Perturber` makes
the perturbation, by swapping a colour, an object noun, a count or a spatial relation. A
triple is only a test of that contrast if the paraphrase overlaps the reference less than
the perturbation does: LLM paraphrases that do not are rejected, user triples that do not
are flagged.

Length probe. The LLM extracts up to ten (subject, relation, object) triplets from an
image's reference captions, then writes a short, a medium and a long caption stating
exactly those triplets: same content, three lengths. Sets whose captions do not grow in
that order are rejected.

The paper describes both procedures but prints no prompt: the prompts below are ours.
Every LLM reply is cached in the store like any other deterministic model result (greedy
decoding), so a rerun asks the LLM nothing it has answered.
"""

from __future__ import annotations

import random
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Sequence

from tqdm.auto import tqdm

from caprecon.data.judgments import Judgments, ProbeTriple
from caprecon.data.samples import Sample
from caprecon.metrics.base import Context
from caprecon.metrics.claims import Claim
from caprecon.models.llm import TextLLM
from caprecon.store.index import content_key

N_TRIPLETS = 10  # the paper extracts 10 triplets per image
LENGTHS = ("short", "medium", "long")

PARAPHRASE_PROMPT = (
    "Rewrite this image caption so that it describes exactly the same scene: the same objects, "
    "attributes, counts and spatial relations, with nothing added and nothing left out. Use different "
    "words and a different sentence structure, reusing as few of the caption's words as you can.\n\n"
    "Caption: {caption}\n\nReply with the rewritten caption only."
)
TRIPLET_PROMPT = (
    "Here are captions that people wrote for one image:\n{captions}\n\n"
    "Extract {n} distinct semantic triplets that these captions state about the image, each written as "
    "<subject, relation, object>, for example <cars, are parked at, parking lots>. Use only facts the "
    "captions state. Reply with one triplet per line and nothing else."
)
LENGTH_INSTRUCTIONS = {
    "short": "as briefly as possible, in one sentence",
    "medium": "in two or three sentences of about 50 words",
    "long": "in a detailed paragraph of about 120 words",
}
CAPTION_PROMPT = (
    "Write a caption for an image {instruction}. The caption must state exactly these facts, given as "
    "<subject, relation, object> triplets, and nothing else:\n{triplets}\n\nReply with the caption only."
)
# room for each reply: a caption, ten triplets, a caption of each length
MAX_NEW_TOKENS = {"paraphrase": 96, "triplets": 256, "short": 96, "medium": 160, "long": 320}

_THINKING = re.compile(r"<think>.*?</think>", re.S | re.I)
_LABEL = re.compile(r"^\s*(?:rewritten caption|paraphrased? caption|paraphrase|caption)\s*:\s*", re.I)
_TRIPLET = re.compile(r"[<(]\s*([^,<>()]+?)\s*,\s*([^,<>()]+?)\s*,\s*([^<>()]+?)\s*[>)]")
_WORD = re.compile(r"[a-z0-9]+(?:'[a-z]+)?")

Triplet = tuple[str, str, str]


# ----------------------------------------------------------------------------- the perturber

COLOURS = (
    "red", "blue", "green", "yellow", "black", "white", "brown", "orange",
    "pink", "purple", "gray", "grey",
)  # fmt: skip
COUNTS = ("two", "three", "four", "five", "six")
_OBJECT_PAIRS = (
    ("man", "woman"), ("men", "women"), ("boy", "girl"), ("boys", "girls"),
    ("dog", "cat"), ("dogs", "cats"), ("horse", "cow"), ("horses", "cows"),
    ("car", "truck"), ("cars", "trucks"), ("bicycle", "motorcycle"), ("bike", "skateboard"),
    ("ball", "frisbee"), ("beach", "field"), ("snow", "sand"), ("water", "grass"),
    ("street", "river"), ("shirt", "jacket"), ("hat", "helmet"), ("bird", "fish"),
)  # fmt: skip
_SPATIAL_PAIRS = (
    ("in front of", "behind"), ("on top of", "underneath"), ("above", "below"),
    ("left", "right"), ("inside", "outside"), ("under", "over"), ("up", "down"),
    ("on", "under"), ("into", "out of"),
)  # fmt: skip


def _symmetric(pairs) -> dict[str, str]:
    table = {}
    for a, b in pairs:
        table.setdefault(a, b)
        table.setdefault(b, a)
    return table


OBJECT_SWAPS = _symmetric(_OBJECT_PAIRS)
SPATIAL_SWAPS = _symmetric(_SPATIAL_PAIRS)
PERTURBATION_KINDS = ("colour", "object", "count", "spatial")


@dataclass
class Perturbation:
    text: str
    kind: str
    original: str
    replacement: str


def _alternation(words) -> re.Pattern:
    # Longest first, so "on top of" wins over "on".
    ordered = sorted(words, key=len, reverse=True)
    return re.compile(r"\b(" + "|".join(re.escape(w).replace(r"\ ", r"\s+") for w in ordered) + r")\b", re.I)


class Perturber:
    """Rule-based minimal perturbations that make a correct caption wrong.

    One word or phrase is replaced: a colour by another colour, an object noun by a
    different object of the same kind (man/woman, dog/cat, ...), a count word by another
    count, a spatial relation by its opposite. The choice depends only on `seed` and the
    caption, so results do not depend on call order.
    """

    def __init__(self, kinds: Sequence[str] = PERTURBATION_KINDS, seed: int = 0) -> None:
        unknown = set(kinds) - set(PERTURBATION_KINDS)
        if unknown:
            raise ValueError(f"unknown perturbation kinds {sorted(unknown)} (known: {', '.join(PERTURBATION_KINDS)})")
        self.kinds = tuple(kinds)
        self.seed = seed
        self._patterns = {
            "colour": _alternation(COLOURS),
            "object": _alternation(OBJECT_SWAPS),
            "count": _alternation(COUNTS),
            "spatial": _alternation(SPATIAL_SWAPS),
        }

    def candidates(self, caption: str) -> list[tuple[str, re.Match]]:
        """Every place in `caption` one of the enabled perturbations could change."""
        return [(kind, m) for kind in self.kinds for m in self._patterns[kind].finditer(caption)]

    def perturb(self, caption: str) -> Perturbation | None:
        """One perturbed version of `caption`, or None if nothing in it can be swapped."""
        found = self.candidates(caption)
        if not found:
            return None
        rng = random.Random(f"{self.seed}\x00{caption}")
        kind, match = rng.choice(found)
        original = match.group(0)
        key = " ".join(original.lower().split())
        if kind == "colour":
            same = {"gray", "grey"} if key in ("gray", "grey") else {key}
            replacement = rng.choice([c for c in COLOURS if c not in same])
        elif kind == "count":
            replacement = rng.choice([c for c in COUNTS if c != key])
        elif kind == "object":
            replacement = OBJECT_SWAPS[key]
        else:
            replacement = SPATIAL_SWAPS[key]
        if original[:1].isupper():
            replacement = replacement[:1].upper() + replacement[1:]
        text = caption[: match.start()] + replacement + caption[match.end():]
        return Perturbation(text, kind, original, replacement)


# ----------------------------------------------------------------------------- reading replies


def reply_caption(reply: str) -> str:
    """The caption in an LLM reply: reasoning blocks, a leading label ("Paraphrase:"), an
    introductory line ending in a colon and wrapping quotes removed; whitespace collapsed."""
    text = _THINKING.sub("", reply).strip()
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if len(lines) > 1 and lines[0].endswith(":"):
        lines = lines[1:]
    text = _LABEL.sub("", " ".join(lines)).strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "\"'":
        text = text[1:-1].strip()
    return " ".join(text.split())


def reply_triplets(reply: str, n: int = N_TRIPLETS) -> list[Triplet]:
    """The first `n` distinct <subject, relation, object> triplets in a reply (angle or round
    brackets); anything else in the reply is ignored."""
    found: list[Triplet] = []
    seen = set()
    for match in _TRIPLET.finditer(_THINKING.sub("", reply)):
        triplet = tuple(" ".join(part.split()) for part in match.groups())
        key = tuple(part.lower() for part in triplet)
        if all(triplet) and key not in seen:
            seen.add(key)
            found.append(triplet)  # type: ignore[arg-type]
    return found[:n]


def word_overlap(text: str, reference: str) -> float:
    """Jaccard overlap of the lower-cased word sets of two texts, |A ∩ B| / |A ∪ B| (0 when both
    are empty)."""
    a, b = set(_WORD.findall(text.lower())), set(_WORD.findall(reference.lower()))
    return len(a & b) / len(a | b) if a | b else 0.0


def overlap_problem(triple: ProbeTriple) -> str | None:
    """Why `triple` does not contrast a low-overlap paraphrase with a high-overlap
    perturbation of its reference, or None when it does."""
    if not triple.paraphrase.strip():
        return "empty paraphrase"
    if not triple.perturbed.strip():
        return "empty perturbed caption"
    para = word_overlap(triple.paraphrase, triple.reference)
    pert = word_overlap(triple.perturbed, triple.reference)
    if para >= pert:
        return f"paraphrase overlaps the reference as much as the perturbation does ({para:.2f} >= {pert:.2f})"
    return None


# ----------------------------------------------------------------------------- the LLM


class ProbeWriter:
    """Asks a `TextLLM` for the probes' texts; every reply is cached in the context's store."""

    def __init__(self, llm: TextLLM, ctx: Context, *, progress: bool = True, chunk_size: int = 32,
                 max_new_tokens: dict[str, int] | None = None):
        self.llm = llm
        self.ctx = ctx
        self.max_new_tokens = {**MAX_NEW_TOKENS, **(max_new_tokens or {})}  # per reply kind
        self.progress = progress
        self.chunk_size = max(1, int(chunk_size))

    def _generate(self, prompts: Sequence[str], max_new_tokens: int, what: str) -> list[str]:
        keys = [content_key("llm-answer", model=self.llm.fingerprint, prompt=p, max_new_tokens=max_new_tokens)
                for p in prompts]

        def compute(order: list[int]) -> list[str]:
            replies: list[str] = []
            bar = tqdm(total=len(order), desc=f"LLM: {what}", unit="reply", disable=not self.progress,
                       dynamic_ncols=True)
            with bar:
                for lo in range(0, len(order), self.chunk_size):
                    chunk = [prompts[i] for i in order[lo : lo + self.chunk_size]]
                    with self.ctx.model_call():
                        got = self.llm.generate(chunk, max_new_tokens=max_new_tokens)
                    if len(got) != len(chunk):
                        raise RuntimeError(f"the LLM returned {len(got)} replies for {len(chunk)} prompts")
                    replies += [str(r) for r in got]
                    bar.update(len(chunk))
            return replies

        return self.ctx.cached("llm-answer", keys, compute)

    def paraphrases(self, captions: Sequence[str]) -> list[str]:
        prompts = [PARAPHRASE_PROMPT.replace("{caption}", c.strip()) for c in captions]
        return [reply_caption(r) for r in self._generate(prompts, self.max_new_tokens["paraphrase"], "paraphrases")]

    def triplets(self, reference_sets: Sequence[Sequence[str]], n: int = N_TRIPLETS) -> list[list[Triplet]]:
        prompts = [TRIPLET_PROMPT.replace("{captions}", "\n".join(f"- {r.strip()}" for r in refs))
                   .replace("{n}", str(n)) for refs in reference_sets]
        return [reply_triplets(r, n) for r in self._generate(prompts, self.max_new_tokens["triplets"], "triplets")]

    def length_captions(self, triplet_sets: Sequence[Sequence[Triplet]]) -> list[dict[str, str]]:
        """A caption of each length in `LENGTHS` per triplet set."""
        out: list[dict[str, str]] = [{} for _ in triplet_sets]
        for length in LENGTHS:
            prompts = [CAPTION_PROMPT.replace("{instruction}", LENGTH_INSTRUCTIONS[length])
                       .replace("{triplets}", "\n".join(f"<{s}, {r}, {o}>" for s, r, o in triplets))
                       for triplets in triplet_sets]
            for captions, reply in zip(out, self._generate(prompts, self.max_new_tokens[length], f"{length} captions")):
                captions[length] = reply_caption(reply)
        return out


# ----------------------------------------------------------------------------- probe sets


@dataclass
class Rejected:
    """A probe item left out, and why (written to the run folder for inspection)."""

    image_id: str
    reason: str
    detail: dict = field(default_factory=dict)


def references_per_image(judgments: Judgments) -> dict[str, tuple[str, list[str]]]:
    """image_id -> (image, reference captions). Flickr8k-CrowdFlower leaves a caption out of its
    own image's references, so items of one image can differ; the longest list is the full set."""
    best: dict[str, tuple[str, list[str]]] = {}
    for item in judgments.items:
        if item.image_id not in best or len(item.refs) > len(best[item.image_id][1]):
            best[item.image_id] = (item.image, list(item.refs))
    return best


def paraphrase_triples(
    judgments: Judgments, writer: ProbeWriter, perturber: Perturber
) -> tuple[list[ProbeTriple], list[Rejected]]:
    """One Δ-probe triple per reference caption the perturber can change: the LLM's paraphrase
    and the perturber's minimal change of that reference. Reference metrics compare both with
    all the image's references (the paraphrased one included). Triples failing
    `overlap_problem` are rejected."""
    candidates = []
    for image_id, (image, refs) in references_per_image(judgments).items():
        for ref in refs:
            change = perturber.perturb(ref)
            if change is not None:
                candidates.append((image_id, image, refs, ref, change))
    paraphrases = writer.paraphrases([ref for _, _, _, ref, _ in candidates])
    triples, rejected = [], []
    for (image_id, image, refs, ref, change), paraphrase in zip(candidates, paraphrases):
        triple = ProbeTriple(image, ref, paraphrase, change.text, list(refs), image_id, change.kind)
        problem = overlap_problem(triple)
        if problem:
            rejected.append(Rejected(image_id, problem, {"reference": ref, "paraphrase": paraphrase,
                                                         "perturbed": change.text}))
        else:
            triples.append(triple)
    return triples, rejected


@dataclass
class LengthSet:
    """Captions of three lengths for one image, all stating the same extracted triplets."""

    image: str
    image_id: str
    refs: list[str]
    triplets: list[Triplet]
    captions: dict[str, str]  # length -> caption


def length_sets(
    judgments: Judgments, writer: ProbeWriter, n_triplets: int = N_TRIPLETS
) -> tuple[list[LengthSet], list[Rejected]]:
    """The length probe's captions for every judged image. An image is rejected when no triplet
    can be read from the LLM's reply, or when its captions do not grow short < medium < long
    in words."""
    per_image = references_per_image(judgments)
    ids = list(per_image)
    extracted = writer.triplets([per_image[i][1] for i in ids], n_triplets)
    rejected = [Rejected(i, "no <subject, relation, object> triplet in the LLM's reply")
                for i, t in zip(ids, extracted) if not t]
    kept = [(i, t) for i, t in zip(ids, extracted) if t]
    written = writer.length_captions([t for _, t in kept])
    sets = []
    for (image_id, triplets), captions in zip(kept, written):
        words = [len(captions[length].split()) for length in LENGTHS]
        if not all(0 < a < b for a, b in zip(words, words[1:])):
            rejected.append(Rejected(image_id, f"caption lengths in words {dict(zip(LENGTHS, words))} do not grow "
                                               "short < medium < long", {"captions": captions}))
            continue
        image, refs = per_image[image_id]
        sets.append(LengthSet(image, image_id, refs, list(triplets), captions))
    return sets, rejected


def triple_samples(triples: Sequence[ProbeTriple], images_root: str | Path | None = None) -> list[Sample]:
    """Samples for the Δ probe: every paraphrase, then every perturbed caption."""
    paraphrases = [Sample(f"para-{k}", _image_path(t.image, images_root), t.paraphrase, t.refs, t.image_id)
                   for k, t in enumerate(triples)]
    perturbed = [Sample(f"pert-{k}", _image_path(t.image, images_root), t.perturbed, t.refs, t.image_id)
                 for k, t in enumerate(triples)]
    return paraphrases + perturbed


def length_samples(sets: Sequence[LengthSet], images_root: str | Path | None = None) -> list[Sample]:
    """Samples for the length probe: each image's three captions, scored against its references;
    `meta["length"]` says which length a caption is."""
    out = []
    for s in sets:
        image = _image_path(s.image, images_root)
        for k, length in enumerate(LENGTHS):
            out.append(Sample(f"len-{s.image_id}-{length}", image, s.captions[length], list(s.refs), s.image_id, k,
                              meta={"length": length}))
    return out


def _image_path(image: str, images_root: str | Path | None) -> Path:
    path = Path(image)
    return path if images_root is None or path.is_absolute() else Path(images_root) / path


def as_records(items: Sequence[ProbeTriple | LengthSet | Rejected]) -> list[dict]:
    return [asdict(item) for item in items]


# ----------------------------------------------------------------------------- the inserted-object probe
#
# Hallucination probe. Each caption gets one object appended that its image does not show:
# an entity claimed about another image (by the `halluc` metric's claim splitter) whose
# words appear in none of this image's own claims. The caption now claims one thing more,
# and that thing is false: a precision metric must drop, while coverage (what of the image
# the caption carries) must not move, since nothing true was taken out.

_ARTICLE = re.compile(r"^(?:a|an|the|some|one|two|three|four|five|six|several|many|\d+)\b", re.I)


def _object_words(claim: Claim) -> set[str]:
    return set(_WORD.findall((claim.span or claim.text).lower()))


def inserted_object_captions(captions: Sequence[str], image_ids: Sequence[str], claims: Sequence[Sequence[Claim]],
                             *, seed: int = 0) -> list[str | None]:
    """Each caption with an absent object appended ("..., and a green triangle."), taken
    from the entity claims of other images' captions (`claims[i]`: caption i's claims);
    None where no other image offers an object this image's claims do not mention. The
    choice depends only on `seed` and the row's position."""
    own: dict[str, set[str]] = {}
    entities: list[tuple[str, str, set[str]]] = []  # (image, phrase, its words): entity claims that name something
    for image, found in zip(image_ids, claims):
        words = own.setdefault(str(image), set())
        for claim in found:
            named = _object_words(claim)
            words |= named
            if claim.type == "entity" and named:
                entities.append((str(image), (claim.span or claim.text).strip(), named))
    offered: dict[str, list[str]] = {}  # per image, once: other images' objects its own claims do not mention
    out: list[str | None] = []
    for i, (caption, image) in enumerate(zip(captions, image_ids)):
        image = str(image)
        if image not in offered:
            offered[image] = sorted({phrase for other, phrase, named in entities
                                     if other != image and not named <= own[image]})
        candidates = offered[image]
        if not candidates:
            out.append(None)
            continue
        phrase = random.Random(f"{seed}:{i}").choice(candidates)
        if not _ARTICLE.match(phrase):
            phrase = ("an " if phrase[0].lower() in "aeiou" else "a ") + phrase
        out.append(f"{caption.rstrip().rstrip('.')}, and {phrase}.")
    return out
