"""THumB 1.0 (`jungokasai/THumB`): `mscoco/mscoco_THumB-1.0.jsonl`, one system caption a line,

    {"seg_id": "0", "image": "COCO_val2014_000000000042.jpg", "hyp": "a dog on a sofa",
     "SYS": "up-down", "P": 4.5, "R": 4.0, "human_score": 4.25}

and `mscoco/mscoco_references.json` beside it, JSON lines despite the suffix:

    {"seg_id": "0", "refs": ["a brown dog lies on a couch", "..."]}
"""

from __future__ import annotations

from pathlib import Path

from caprecon.core.records import read_jsonl
from caprecon.data.judgments import SCORES, Judgment, JudgmentFormatError, Judgments
from caprecon.data.loaders.common import as_number, caption_list, file_records, first_field, norm_text


THUMB_FILE = "mscoco_THumB-1.0.jsonl"
THUMB_REFERENCES = "mscoco_references.json"


def load_thumb(path: str | Path, target: str = "total") -> Judgments:
    """THumB 1.0 (Kasai et al. 2022) as `jungokasai/THumB` ships it: `mscoco/mscoco_THumB-1.0.jsonl`,
    one row per (image, system caption) with `seg_id`, `image`, `hyp`, `SYS`, `P`
    (precision), `R` (recall), the penalties and `human_score` (the total), and
    `mscoco/mscoco_references.json` beside it (JSON lines `{"seg_id", "refs"}`).

    `path` is the JSONL file or the folder holding both. `target` picks which human score
    is correlated (total, precision or recall). References come from the references file
    by `seg_id` (or a row's own `refs`, caprecon's layout). Also accepted, for copies that
    renamed fields: `caption`/`candidate`, `image_id`, `model`/`system`, `Total`/`total`,
    `precision`, `recall`. The system is `Judgment.system` (and `Judgment.id`'s prefix,
    `<system>:<row>`), for system-level correlation.
    """
    names = {"total": ("human_score", "total"), "precision": ("p", "precision"), "recall": ("r", "recall")}
    if target not in names:
        raise JudgmentFormatError(f"THumB target must be one of {', '.join(names)}, not {target!r}")
    path = Path(path)
    file = path / THUMB_FILE if path.is_dir() else path
    if not file.is_file():
        raise JudgmentFormatError(f"benchmark file not found: {file}")
    references = _thumb_references(file.parent / THUMB_REFERENCES)
    items: list[Judgment] = []
    for row, (where, record) in enumerate(file_records(file), 1):
        caption = first_field(record, ("hyp", "caption", "candidate"))
        image = first_field(record, ("image", "image_id"))
        system = first_field(record, ("sys", "model", "system"))
        score = first_field(record, names[target])
        if caption is None or image is None or system is None or score is None:
            raise JudgmentFormatError(
                f"{where}: a THumB row needs hyp, image, SYS and {'/'.join(names[target])} (fields: {sorted(record)})"
            )
        refs = first_field(record, ("refs", "references"))
        refs = caption_list(refs, where, "refs") if refs is not None else references.get(str(record.get("seg_id")), [])
        items.append(Judgment(
            id=f"{system}:{row}", image=str(image), caption=norm_text(caption),
            ratings=(as_number(score, where, target),), refs=refs, image_id=Path(str(image)).stem, row=row,
            system=str(system),
        ))  # fmt: skip
    if not items:
        raise JudgmentFormatError(f"{file}: no THumB rows")
    return Judgments(SCORES, items, file)


def _thumb_references(path: Path) -> dict[str, list[str]]:
    # JSON lines despite the .json suffix, as the THumB repository ships it
    if not path.is_file():
        return {}
    return {str(record.get("seg_id")): caption_list(record.get("refs") or [], where, "refs")
            for where, record in read_jsonl(path, JudgmentFormatError)}  # fmt: skip
