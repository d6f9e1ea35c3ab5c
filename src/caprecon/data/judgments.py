"""Human judgments of captions, read from the formats they are published in.

Two shapes of judgment exist:

- `Judgment`: one caption of one image with one or more human scores. Flickr8k-Expert
  gives three expert ratings (1-4) per caption, and each rating counts as its own
  judgment when correlating; Flickr8k-CrowdFlower gives the fraction of crowd workers who
  said the caption describes the image; a generic file gives one score per caption.
- `PairJudgment`: two captions of one image and which one people preferred
  (Pascal-50S style), stored as the fraction of judges preferring caption A.

`load_judgments` reads JSONL, JSON (a list of records), CSV or TSV and recognises the
format from the fields of the records; the original Flickr8k annotation files
(`ExpertAnnotations.txt`, `CrowdFlowerAnnotations.txt`) are read too, given the
`Flickr8k.token.txt` captions file. Any row that cannot be understood raises
`JudgmentFormatError` naming the file, the row and the problem: a meta-evaluation that
silently dropped rows would report a correlation over data nobody chose.

`load_triples` reads (reference, paraphrase, perturbed caption) triples for the
paraphrase-vs-perturbation probe.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

from caprecon.core.records import RECORD_SUFFIXES, read_records
from caprecon.data.samples import Sample, confine_images

FLICKR8K_EXPERT = "flickr8k-expert"
FLICKR8K_CROWDFLOWER = "flickr8k-crowdflower"
SCORES = "scores"
PAIRS = "pairs"
FORMATS = (FLICKR8K_EXPERT, FLICKR8K_CROWDFLOWER, SCORES, PAIRS)

_IMAGE = ("image", "image_path", "file_name", "img")
_CAPTION = ("caption", "candidate", "text")
_HUMAN = ("human", "human_score", "score", "rating")
_CAPTION_A = ("caption_a", "candidate_a", "a")
_CAPTION_B = ("caption_b", "candidate_b", "b")
_PREFERENCE = ("preference", "winner", "label")


class JudgmentFormatError(ValueError):
    """A judgments file, or one of its rows, cannot be read."""


@dataclass
class Judgment:
    """One caption of one image with the human scores it received."""

    id: str
    image: str
    caption: str
    ratings: tuple[float, ...]  # each entry is one human judgment of this caption
    refs: list[str] = field(default_factory=list)
    image_id: str = ""  # captions sharing it belong to one picture: the bootstrap unit
    row: int = 0  # where it came from in the file (line or item number), for messages
    system: str = ""  # the model or captioner that wrote the caption, where the benchmark names it


@dataclass
class PairJudgment:
    """Two captions of one image; `preference` is the fraction of judges preferring A."""

    id: str
    image: str
    caption_a: str
    caption_b: str
    preference: float  # 1: A preferred, 0: B preferred, 0.5: a tie
    refs: list[str] = field(default_factory=list)
    image_id: str = ""
    category: str = ""  # e.g. Pascal-50S's HC / HI / HM / MM
    row: int = 0
    systems: tuple[str, str] = ("", "")  # the models that wrote A and B, where the benchmark names them
    verdict: str = ""  # the human label as the file gives it, where it has more than A / B / tie


@dataclass
class ProbeTriple:
    """A correct caption, a paraphrase of it and a perturbed (now wrong) version."""

    image: str
    reference: str
    paraphrase: str
    perturbed: str
    refs: list[str] = field(default_factory=list)  # what reference metrics compare with
    image_id: str = ""
    kind: str = ""  # which perturbation produced `perturbed`, when known


@dataclass
class Judgments:
    """The contents of one judgments file."""

    format: str
    items: list[Judgment] | list[PairJudgment]
    path: Path | None = None
    #: whether the images the rows name must lie inside the root they resolve against (`samples`):
    #: a benchmark's files come from others; a judgments file of one's own is confined under --images
    confined: bool = True
    #: what the loader dropped or could not use, a sentence each (a repeated battle, say), for the run's notes
    notes: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.path.name if self.path is not None else self.format

    @property
    def pairwise(self) -> bool:
        return self.format == PAIRS

    @property
    def tau_variant(self) -> str:
        """The Kendall variant the literature reports for this data.

        Flickr8k-Expert ratings sit on a 4-point scale while metric scores are nearly all
        distinct; τ_c corrects for that unequal number of levels, so it is the one
        reported there. Everything else uses τ_b.
        """
        return "c" if self.format == FLICKR8K_EXPERT else "b"

    def samples(self, images_root: str | Path | None = None) -> list[Sample]:
        """The captions to score, in the order the meta-evaluation expects scores.

        Rating judgments give one sample per judgment. Pair judgments give two per pair,
        A then B (`<id>:a`, `<id>:b`), so pair k's scores are at 2k and 2k+1.
        Relative image paths resolve against `images_root`, else the file's folder, and the image
        of every row must lie inside that folder (`confine_images`: a row naming one outside, by
        `..`, an absolute path or a link, is a row error when its image is opened); a file read by
        `load_judgments` (`confined` False) only when `images_root` is given.
        """
        root = Path(images_root) if images_root is not None else (self.path.parent if self.path else None)
        per_image: dict[str, int] = defaultdict(int)
        out: list[Sample] = []

        def add(sample_id: str, item, caption: str) -> None:
            out.append(
                Sample(
                    id=sample_id,
                    image=_resolve(item.image, root),
                    caption=caption,
                    refs=list(item.refs),
                    image_id=item.image_id,
                    candidate=per_image[item.image_id],
                    meta={"judgment_row": item.row},
                )
            )
            per_image[item.image_id] += 1

        for item in self.items:
            if isinstance(item, PairJudgment):
                add(f"{item.id}:a", item, item.caption_a)
                add(f"{item.id}:b", item, item.caption_b)
            else:
                add(item.id, item, item.caption)
        if root is not None and (self.confined or images_root is not None):
            confine_images(out, root.absolute(), "--images" if images_root is not None else "the judgments' folder")
        return out


def _resolve(image: str, root: Path | None) -> Path | None:
    if not image:
        return None  # the row names no image: a row error for image metrics, text metrics still run
    path = Path(image)
    return path if path.is_absolute() or root is None else root / path


# ----------------------------------------------------------------------------- loading


def load_judgments(
    path: str | Path,
    format: str = "auto",
    *,
    captions: str | Path | None = None,
) -> Judgments:
    """Read a judgments file; `format` is one of `FORMATS` or "auto".

    Record files (`.jsonl`, `.json`, `.csv`, `.tsv`) are recognised by their fields:
    `ratings` (a list) means Flickr8k-Expert, `yes_frac` Flickr8k-CrowdFlower,
    `caption_a`/`caption_b` pairs, and `human`/`score`/`rating` generic scores.
    The original Flickr8k `.txt` annotation files need `captions=` (Flickr8k.token.txt).
    """
    path = Path(path)
    if format != "auto" and format not in FORMATS:
        raise JudgmentFormatError(f"unknown judgments format {format!r} (known: auto, {', '.join(FORMATS)})")
    if not path.is_file():
        raise JudgmentFormatError(f"judgments file not found: {path}")
    if path.suffix.lower() == ".txt":
        return _load_flickr8k_original(path, format, captions)
    rows = list(_read_records(path))
    if not rows:
        raise JudgmentFormatError(f"{path}: no judgments in the file")
    fmt = _detect(rows[0][1], path, rows[0][0]) if format == "auto" else format
    parse = _parse_pair if fmt == PAIRS else _parse_rated
    items = [parse(record, fmt, where, row) for row, (where, record) in enumerate(rows, 1)]
    _check_unique_ids(items, path)
    return Judgments(fmt, items, path, confined=False)


def _read_records(path: Path) -> Iterator[tuple[str, dict]]:
    """(location, record with lower-cased keys) for each row of a record file."""
    if path.suffix.lower() not in RECORD_SUFFIXES:
        raise JudgmentFormatError(
            f"{path}: unknown judgments file type {path.suffix.lower()!r} (use .jsonl, .json, .csv, .tsv, "
            "or the original Flickr8k .txt annotations)"
        )
    for where, record in read_records(path, JudgmentFormatError):
        yield where, _record(record)


def _record(record: dict) -> dict:
    return {str(k).strip().lower(): v for k, v in record.items()}


def _detect(record: dict, path: Path, where: str) -> str:
    if _get(record, ("ratings",)) is not None:
        return FLICKR8K_EXPERT
    if _get(record, ("yes_frac",)) is not None:
        return FLICKR8K_CROWDFLOWER
    if _get(record, _CAPTION_A) is not None and _get(record, _CAPTION_B) is not None:
        return PAIRS
    if _get(record, _HUMAN) is not None:
        return SCORES
    raise JudgmentFormatError(
        f"{where}: cannot tell the judgments format from fields {sorted(record)}; expected "
        "`ratings` (Flickr8k-Expert), `yes_frac` (Flickr8k-CrowdFlower), `caption_a`+`caption_b` "
        "with `preference` (pairs) or `human`/`score` (generic scores)"
    )


def _get(record: dict, names: Sequence[str]) -> Any:
    for name in names:
        value = record.get(name)
        if value is not None and not (isinstance(value, str) and not value.strip()):
            return value
    return None


def _text(record: dict, names: Sequence[str], where: str, what: str) -> str:
    value = _get(record, names)
    if value is None:
        raise JudgmentFormatError(f"{where}: no {what} (expected a field named {' or '.join(names)})")
    return str(value)


def _number(value: Any, where: str, what: str) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise JudgmentFormatError(f"{where}: {what} {value!r} is not a number") from None
    if not math.isfinite(number):
        raise JudgmentFormatError(f"{where}: {what} is {value!r}")
    return number


def _list(value: Any, where: str, what: str) -> list:
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("["):
            try:
                value = json.loads(text)
            except json.JSONDecodeError:
                raise JudgmentFormatError(f"{where}: {what} {text!r} is not a JSON list") from None
        else:
            value = [part.strip() for part in text.split("|") if part.strip()]
    if not isinstance(value, (list, tuple)):
        raise JudgmentFormatError(f"{where}: {what} must be a list, got {value!r}")
    return list(value)


def _common(record: dict, where: str, row: int) -> dict:
    image = _get(record, _IMAGE)
    image_id = _get(record, ("image_id",))
    if image is None and image_id is None:
        raise JudgmentFormatError(f"{where}: no image (expected a field named {' or '.join(_IMAGE)} or image_id)")
    refs = _get(record, ("refs", "references"))
    given_id = _get(record, ("id",))
    return {
        "id": str(row) if given_id is None else str(given_id),
        "image": "" if image is None else str(image),
        "refs": [str(r) for r in _list(refs, where, "refs")] if refs is not None else [],
        "image_id": str(image_id) if image_id is not None else Path(str(image)).stem,
        "row": row,
    }


def _parse_rated(record: dict, fmt: str, where: str, row: int) -> Judgment:
    common = _common(record, where, row)
    caption = _text(record, _CAPTION, where, "caption")
    if fmt == FLICKR8K_EXPERT:
        raw = _get(record, ("ratings",))
        if raw is None:
            raise JudgmentFormatError(f"{where}: no `ratings` field (Flickr8k-Expert rows carry a list of ratings)")
        ratings = tuple(_number(r, where, "rating") for r in _list(raw, where, "ratings"))
        if not ratings:
            raise JudgmentFormatError(f"{where}: `ratings` is empty")
    elif fmt == FLICKR8K_CROWDFLOWER:
        value = _get(record, ("yes_frac",))
        if value is None:
            raise JudgmentFormatError(f"{where}: no `yes_frac` field (Flickr8k-CrowdFlower rows carry it)")
        frac = _number(value, where, "yes_frac")
        if not 0.0 <= frac <= 1.0:
            raise JudgmentFormatError(f"{where}: yes_frac {frac} is outside [0, 1]")
        ratings = (frac,)
    else:
        value = _get(record, _HUMAN)
        if value is None:
            raise JudgmentFormatError(f"{where}: no human score (expected a field named {' or '.join(_HUMAN)})")
        ratings = (_number(value, where, "human score"),)
    return Judgment(caption=caption, ratings=ratings, **common)


def _parse_pair(record: dict, fmt: str, where: str, row: int) -> PairJudgment:
    common = _common(record, where, row)
    return PairJudgment(
        caption_a=_text(record, _CAPTION_A, where, "caption A"),
        caption_b=_text(record, _CAPTION_B, where, "caption B"),
        preference=_preference(record, where),
        category=str(_get(record, ("category",)) or ""),
        **common,
    )


def _preference(record: dict, where: str) -> float:
    votes_a, votes_b = _get(record, ("votes_a",)), _get(record, ("votes_b",))
    if votes_a is not None or votes_b is not None:
        a = _number(votes_a or 0, where, "votes_a")
        b = _number(votes_b or 0, where, "votes_b")
        if a < 0 or b < 0 or a + b == 0:
            raise JudgmentFormatError(f"{where}: votes_a={a:g}, votes_b={b:g} do not make a preference")
        return a / (a + b)
    value = _get(record, _PREFERENCE)
    if value is None:
        raise JudgmentFormatError(f"{where}: no preference (expected `preference`, or `votes_a` and `votes_b`)")
    if isinstance(value, str) and value.strip().lower() in ("a", "b", "tie", "="):
        return {"a": 1.0, "b": 0.0}.get(value.strip().lower(), 0.5)
    frac = _number(value, where, "preference")
    if not 0.0 <= frac <= 1.0:
        raise JudgmentFormatError(
            f"{where}: preference {value!r} must be 'a', 'b', 'tie' or the fraction of judges preferring A (0-1)"
        )
    return frac


def _check_unique_ids(items: Sequence[Judgment | PairJudgment], path: Path) -> None:
    seen: dict[str, int] = {}
    for item in items:
        if item.id in seen:
            raise JudgmentFormatError(f"{path}: id {item.id!r} is used by rows {seen[item.id]} and {item.row}")
        seen[item.id] = item.row


# ------------------------------------------------------------- original Flickr8k files


def _load_flickr8k_original(path: Path, format: str, captions: str | Path | None) -> Judgments:
    """ExpertAnnotations.txt / CrowdFlowerAnnotations.txt, tab-separated, no header.

    Each row names the judged image and a caption by its Flickr8k id (`<image>#<n>`);
    the texts come from Flickr8k.token.txt. Following the protocol of SPICE and CLIPScore,
    an Expert row whose candidate is one of the image's own captions is dropped, and a
    CrowdFlower row keeps it but leaves it out of the references.
    """
    if captions is None:
        raise JudgmentFormatError(
            f"{path}: the original Flickr8k annotations need the captions file (Flickr8k.token.txt)"
        )
    texts, by_image = _read_flickr8k_tokens(Path(captions))
    text = path.read_text(encoding="utf-8")
    lines = [(n, line.split("\t")) for n, line in enumerate(text.splitlines(), 1) if line.strip()]
    if not lines:
        raise JudgmentFormatError(f"{path}: no judgments in the file")
    if format == "auto":
        third = lines[0][1][2] if len(lines[0][1]) > 2 else ""
        format = FLICKR8K_CROWDFLOWER if "." in third else FLICKR8K_EXPERT
    if format not in (FLICKR8K_EXPERT, FLICKR8K_CROWDFLOWER):
        raise JudgmentFormatError(f"{path}: a .txt judgments file must be an original Flickr8k annotation file")
    items: list[Judgment] = []
    for lineno, cols in lines:
        where = f"{path}:{lineno}"
        if len(cols) != 5:
            raise JudgmentFormatError(f"{where}: expected 5 tab-separated columns, found {len(cols)}")
        image, caption_id = cols[0].strip(), cols[1].strip()
        if caption_id not in texts:
            raise JudgmentFormatError(f"{where}: caption {caption_id!r} is not in {captions}")
        if image not in by_image:
            raise JudgmentFormatError(f"{where}: image {image!r} has no captions in {captions}")
        own = caption_id.split("#")[0] == image
        if format == FLICKR8K_EXPERT:
            if own:
                continue
            ratings = tuple(_number(c, where, "rating") for c in cols[2:])
        else:
            frac = _number(cols[2], where, "yes fraction")
            if not 0.0 <= frac <= 1.0:
                raise JudgmentFormatError(f"{where}: yes fraction {frac} is outside [0, 1]")
            ratings = (frac,)
        refs = [texts[c] for c in by_image[image] if c != caption_id]
        items.append(
            Judgment(
                id=str(lineno),
                image=image,
                caption=texts[caption_id],
                ratings=ratings,
                refs=refs,
                image_id=Path(image).stem,
                row=lineno,
            )
        )
    return Judgments(format, items, path, confined=False)


def _read_flickr8k_tokens(path: Path) -> tuple[dict[str, str], dict[str, list[str]]]:
    if not path.is_file():
        raise JudgmentFormatError(f"captions file not found: {path}")
    texts: dict[str, str] = {}
    by_image: dict[str, list[str]] = defaultdict(list)
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        caption_id, sep, text = line.partition("\t")
        if not sep or "#" not in caption_id:
            raise JudgmentFormatError(f"{path}:{lineno}: expected `<image>#<n><TAB><caption>`")
        texts[caption_id] = text.strip()
        by_image[caption_id.split("#")[0]].append(caption_id)
    return texts, by_image


# ----------------------------------------------------------------------------- probes


def load_triples(path: str | Path) -> list[ProbeTriple]:
    """(image, reference, paraphrase, perturbed) rows from JSONL, JSON, CSV or TSV.

    `refs` is optional; without it reference metrics compare against `reference` alone.
    """
    path = Path(path)
    if not path.is_file():
        raise JudgmentFormatError(f"triples file not found: {path}")
    triples = []
    for row, (where, record) in enumerate(_read_records(path), 1):
        common = _common(record, where, row)
        reference = _text(record, ("reference", "ref"), where, "reference caption")
        triples.append(
            ProbeTriple(
                image=common["image"],
                reference=reference,
                paraphrase=_text(record, ("paraphrase",), where, "paraphrase"),
                perturbed=_text(record, ("perturbed", "perturbation"), where, "perturbed caption"),
                refs=common["refs"] or [reference],
                image_id=common["image_id"],
                kind=str(_get(record, ("kind", "type")) or ""),
            )
        )
    if not triples:
        raise JudgmentFormatError(f"{path}: no triples in the file")
    return triples
