"""CaptionEvalKit's local Nebula layout: `nebula/nebula_test.csv` (columns `imgid`, `mt`,
`refs` as a Python-literal list, `score`) and the images in `nebula/images/<imgid>.<ext>`.

The image's extension is not in the CSV; it is found beside the others (the first of
`.jpg`, `.jpeg`, `.png`, `.webp` present). A row whose image is in no such file keeps its
place with no image: image metrics give it a row error, text metrics still score it.
"""

from __future__ import annotations

from pathlib import Path

from caprecon.data.judgments import Judgments, JudgmentFormatError
from caprecon.data.loaders.common import file_records, scored_rows

NEBULA_CSV = "nebula_test.csv"
_IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp")


def captionevalkit_nebula_csv(path: str | Path) -> Path | None:
    """The `nebula_test.csv` that `path` is or holds (`nebula/` or its parent), else None."""
    path = Path(path)
    for candidate in (path, path / NEBULA_CSV, path / "nebula" / NEBULA_CSV):
        if candidate.is_file() and candidate.name.lower() == NEBULA_CSV:
            return candidate
    return None


def load_captionevalkit_nebula(csv: Path) -> Judgments:
    images = csv.parent / "images"
    by_stem: dict[str, str] = {}
    if images.is_dir():
        for file in sorted(images.iterdir(), key=lambda p: (_IMAGE_SUFFIXES.index(p.suffix.lower())
                                                              if p.suffix.lower() in _IMAGE_SUFFIXES else 99)):
            if file.suffix.lower() in _IMAGE_SUFFIXES:
                by_stem.setdefault(file.stem, f"images/{file.name}")

    def records():
        for where, record in file_records(csv):
            imgid = record.get("imgid")
            if imgid is None:
                raise JudgmentFormatError(f"{where}: CaptionEvalKit's Nebula CSV needs an `imgid` column")
            record = dict(record)
            record["imgid"] = by_stem.get(Path(str(imgid)).stem, "")
            yield where, record

    return scored_rows(records(), csv, "no rows")
