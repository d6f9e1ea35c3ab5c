"""Nebula (`Ka2ukiMatsuda/Nebula`), test split, a rated-caption table (`caprecon.data.loaders.common`):

    {"file_name": "000123.jpg", "image": <image>, "refs": ["..."], "mt": "a red bus", "human_score": 0.6}

with its test labels corrected from the Spica release (`hiranohachiman/Spica`), CSVs

    imgid,mt,score
    000123.jpg,a red bus,0.55
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Sequence

from caprecon.data.judgments import Judgments, JudgmentFormatError
from caprecon.data.loaders import hub
from caprecon.data.loaders.common import as_number, file_records, load_hf_judgments, norm_text


SPICA_REPO = "hiranohachiman/Spica"
SPICA_FILES = ("spica_train.csv", "spica_val.csv", "spica_test.csv")


def load_nebula(path: str | Path, *, corrected: bool = True, spica: str | Path | None = None) -> Judgments:
    """Nebula (Matsuda et al. 2024, `Ka2ukiMatsuda/Nebula`), test split: columns
    `file_name`, `image`, `refs`, `mt`, `human_score`.

    With `corrected` the test labels are replaced as CaptionEvalKit does after the
    correction noted in arXiv:2512.21582: a row whose (image file stem, whitespace-normalised
    `mt`) appears in the Spica release (`hiranohachiman/Spica`: `spica_train.csv`,
    `spica_val.csv`, `spica_test.csv`, columns `imgid`, `mt`, `score`) takes the mean
    Spica score of that key; other rows keep theirs. The Spica files are looked for in
    `spica`, in the Nebula folder, in a `Spica` folder beside it, then in the local Hub
    cache; without them the corrected benchmark refuses to run (use `nebula-raw`).
    """
    judgments = load_hf_judgments(path, "test")
    return spica_corrected(judgments, path, spica) if corrected else judgments


def spica_corrected(judgments: Judgments, nebula: str | Path, spica: str | Path | None = None) -> Judgments:
    """Nebula's test labels replaced by the mean Spica scores (`load_nebula`), whatever copy
    of Nebula `judgments` was read from; the files are looked for as `load_nebula` says."""
    lookup = _spica_scores(_spica_files(nebula, spica))
    for item in judgments.items:
        score = lookup.get((Path(item.image).stem, item.caption))
        if score is not None:
            item.ratings = (score,)
    return judgments


def _spica_files(nebula: str | Path, spica: str | Path | None) -> list[Path]:
    places: list[Path] = []
    if spica is not None:
        places.append(hub.resolve(spica))
    if not hub.looks_like_repo_id(nebula):
        folder = Path(nebula) if Path(nebula).is_dir() else Path(nebula).parent
        places += [folder, folder.parent / "Spica", folder.parent / "spica"]
    for place in places:
        found = [place / name for name in SPICA_FILES if (place / name).is_file()]
        if found:
            return found
    try:
        cached = hub.resolve(SPICA_REPO)
    except JudgmentFormatError:
        cached = None
    found = [cached / name for name in SPICA_FILES if cached is not None and (cached / name).is_file()]
    if not found:
        raise JudgmentFormatError(
            f"the Spica correction of Nebula's test labels ({', '.join(SPICA_FILES)} from {SPICA_REPO}) was not found in "
            f"{', '.join(str(p) for p in places) or 'the Nebula folder'} nor in the Hugging Face cache; "
            "put them beside the Nebula data, or run --benchmark nebula-raw for the labels as released"
        )
    return found


def _spica_scores(files: Sequence[Path]) -> dict[tuple[str, str], float]:
    totals: dict[tuple[str, str], list[float]] = defaultdict(list)
    for file in files:
        for where, record in file_records(file):
            if record.get("imgid") is None or record.get("mt") is None or record.get("score") is None:
                raise JudgmentFormatError(f"{where}: a Spica row needs imgid, mt and score")
            totals[(Path(str(record["imgid"])).stem, norm_text(record["mt"]))].append(as_number(record["score"], where, "score"))
    return {key: sum(v) / len(v) for key, v in totals.items()}
