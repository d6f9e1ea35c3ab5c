"""Per-caption scores as metric authors release them, joined to a benchmark's captions.

A paper's table can be checked without its model when the authors publish every
caption's score. Read here:

- FLEUR's `results/*.txt` (`Yebin46/FLEUR`): blocks of `image file : <path>`,
  `caption : <text>`, `model score : <the rating the model wrote>`, `our score : <the
  smoothed FLEUR score>`, separated by blank lines, with `<subset> dataset` lines between
  Composite's subsets; the Pascal-50S files instead open each pair with `image : <url>`
  and `label : <0|1>` followed by the two caption blocks, and end with `true count` /
  `tie count` lines. A caption whose reply FLEUR could not parse has no score lines and
  is left unscored here (FLEUR's own script reuses the previous caption's score).

Each score is joined to the benchmark's captions by (image file stem, whitespace-normalised
caption): file layouts and image folders differ between releases, the pair does not. The
metric is named after the file (`fleur_composite.txt` gives `fleur`, and `fleur-raw` for
the written rating; `reffleur_*` gives `reffleur`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

from caprecon.core.records import read_text

_FIELDS = {"image file": "image", "image": "image", "caption": "caption", "model score": "raw", "our score": "score"}


class ReleasedScoresError(ValueError):
    """A released score file cannot be read or matched to the benchmark."""


@dataclass
class ReleasedScore:
    image: str
    caption: str
    scores: dict[str, float] = field(default_factory=dict)


def is_released_scores(path: str | Path) -> bool:
    """Whether `path` looks like a released result file this module reads (not a CSV/JSONL of ids)."""
    path = Path(path)
    if path.suffix.lower() != ".txt" or not path.is_file():
        return False
    head = read_text(path, ReleasedScoresError)[:4000]
    return any(line.split(":")[0].strip() in ("image file", "image") for line in head.splitlines() if ":" in line)


def released_metric_name(path: str | Path) -> str:
    return Path(path).stem.split("_")[0].lower() or "released"


def read_released_scores(path: str | Path) -> list[ReleasedScore]:
    """Every scored (or unscored) caption of a FLEUR-style result file, in file order."""
    path = Path(path)
    name = released_metric_name(path)
    out: list[ReleasedScore] = []
    image = ""
    current: ReleasedScore | None = None
    for lineno, line in enumerate(read_text(path, ReleasedScoresError).split("\n"), 1):
        if ":" not in line:
            continue  # blank lines and `flickr8k dataset` headers
        key, _, value = line.partition(":")
        kind = _FIELDS.get(key.strip().lower())
        value = value.strip()
        if kind == "image":
            image = value
        elif kind == "caption":
            current = ReleasedScore(image, value)
            out.append(current)
        elif kind in ("raw", "score"):
            if current is None:
                raise ReleasedScoresError(f"{path}:{lineno}: a score before any caption")
            try:
                number = float(value.removeprefix("tensor(").split(",")[0].rstrip(")"))
            except ValueError:
                raise ReleasedScoresError(f"{path}:{lineno}: score {value!r} is not a number") from None
            current.scores[name if kind == "score" else f"{name}-raw"] = number
    if not out:
        raise ReleasedScoresError(f"{path}: no `caption :` lines; not a released result file this reader knows")
    return out


def join_released(released: Sequence[ReleasedScore], images: Sequence[str], captions: Sequence[str],
                  ) -> tuple[dict[str, np.ndarray], int]:
    """Scores aligned with the benchmark's (image, caption) list, NaN where none was released,
    and how many benchmark captions had none."""
    by_key: dict[tuple[str, str], dict[str, float]] = {}
    names: dict[str, None] = {}
    for item in released:
        by_key.setdefault(_key(item.image, item.caption), item.scores)
        names.update(dict.fromkeys(item.scores))
    columns = {name: np.full(len(captions), math.nan) for name in names}
    missing = 0
    for k, (image, caption) in enumerate(zip(images, captions)):
        scores = by_key.get(_key(image, caption))
        if not scores:
            missing += 1
            continue
        for name, value in scores.items():
            columns[name][k] = value
    return columns, missing


def _key(image: str, caption: str) -> tuple[str, str]:
    return Path(str(image).rsplit("/", 1)[-1]).stem, " ".join(str(caption).split())
