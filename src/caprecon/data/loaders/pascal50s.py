"""Pascal-50S: pairs of captions of one image, the one people preferred, per category:

    {"HC": [{"image": "VOC2012/JPEGImages/2008_000032.jpg",
             "captions": ["a plane on the runway", "an airplane parked"],
             "label": 0, "references": ["...", "..."]}],
     "HI": [...], "HM": [...], "MM": [...]}
"""

from __future__ import annotations

import random
from pathlib import Path

from caprecon.data.judgments import PAIRS, JudgmentFormatError, Judgments, PairJudgment
from caprecon.data.loaders.common import as_number, caption_list, caption_text, first_field, load_json


PASCAL_CATEGORIES = ("HC", "HI", "HM", "MM")


def load_pascal50s(path: str | Path) -> Judgments:
    """Pascal-50S as `{"HC": [...], "HI": [...], "HM": [...], "MM": [...]}`, each entry
    `{"image", "captions": [a, b], "label", "references": [...]}`.

    `label` is the index (0 or 1) of the caption people preferred; a fraction of judges
    preferring the first caption is accepted as `preference`. The references are kept as
    given: 5 in the JSON copies papers distribute, 48 in the original release, where
    `pascal_reference_draws` applies the 5-of-48 protocol.
    """
    path = Path(path)
    data = load_json(path)
    if not isinstance(data, dict) or not set(data) & set(PASCAL_CATEGORIES):
        raise JudgmentFormatError(f"{path}: expected an object with lists under {', '.join(PASCAL_CATEGORIES)}")
    if unknown := [str(c) for c in data if c not in PASCAL_CATEGORIES]:
        raise JudgmentFormatError(f"{path}: unknown categor{'y' if len(unknown) == 1 else 'ies'} "
                                  f"{', '.join(map(repr, unknown))}; Pascal-50S has {', '.join(PASCAL_CATEGORIES)}")
    items: list[PairJudgment] = []
    for category in PASCAL_CATEGORIES:
        entries = data.get(category, [])
        if not isinstance(entries, list):
            raise JudgmentFormatError(f"{path} {category}: must be a list of pairs, not {type(entries).__name__}")
        for k, entry in enumerate(entries):
            where = f"{path} {category}[{k}]"
            if not isinstance(entry, dict):
                raise JudgmentFormatError(f"{where}: a pair is an object with `image`, `captions`, `label`, "
                                          f"`references`, not {entry!r:.40}")
            captions = entry.get("captions")
            if not isinstance(captions, list) or len(captions) != 2:
                raise JudgmentFormatError(f"{where}: `captions` must hold the two candidates")
            image = first_field(entry, ("image", "image_path", "img"))
            if image is None:
                raise JudgmentFormatError(f"{where}: no `image`")
            if not isinstance(image, str):
                raise JudgmentFormatError(f"{where}: `image` must be a file name, not {image!r:.40}")
            items.append(
                PairJudgment(
                    id=f"{category}-{k}",
                    image=image,
                    caption_a=caption_text(captions[0], where, "the first caption"),
                    caption_b=caption_text(captions[1], where, "the second caption"),
                    preference=_pascal_preference(entry, where),
                    refs=caption_list(first_field(entry, ("references", "refs")) or [], where, "references",
                                      written=False),
                    image_id=Path(str(image)).stem,
                    category=category,
                    row=len(items) + 1,
                )
            )
    if not items:
        raise JudgmentFormatError(f"{path}: no Pascal-50S pairs")
    return Judgments(PAIRS, items, path)


def _pascal_preference(entry: dict, where: str) -> float:
    if entry.get("preference") is not None:
        value = as_number(entry["preference"], where, "preference")
    else:
        label = entry.get("label")
        if isinstance(label, bool) or label not in (0, 1, "0", "1"):
            raise JudgmentFormatError(f"{where}: `label` must be 0 or 1 (the preferred caption), got {label!r}")
        value = 1.0 - float(label)
    if not 0.0 <= value <= 1.0:
        raise JudgmentFormatError(f"{where}: preference {value} is outside [0, 1]")
    return value


def pascal_reference_draws(judgments: Judgments, *, n_refs: int = 5, n_draws: int = 5, seed: int = 0) -> list[Judgments]:
    """The 5-of-48 protocol: `n_draws` copies of the pairs, each pair with `n_refs`
    references sampled without replacement from its own.

    Draw d of pair `id` uses `random.Random(f"{seed}:{d}:{id}").sample(refs, n_refs)`, so a
    pair's references depend only on the seed, the draw and the pair, never on file order.
    Pairs with `n_refs` references or fewer keep them all. Accuracy is averaged over draws.
    """
    draws = []
    for d in range(n_draws):
        items = []
        for item in judgments.items:
            refs = item.refs if len(item.refs) <= n_refs else random.Random(f"{seed}:{d}:{item.id}").sample(item.refs, n_refs)
            items.append(PairJudgment(**{**item.__dict__, "refs": list(refs)}))
        draws.append(Judgments(judgments.format, items, judgments.path))
    return draws
