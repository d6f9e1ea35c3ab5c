"""EXPERT's `annotations/` files (Kim et al., ACL Findings 2025, `hjkim811/EXPERT`), read unchanged.

EXPERT ships six benchmark files and reads images from `images/` joined to a path it builds:

- `nebula_test.json`, `polaris_test.json`: a list of `{"imgid", "mt", "refs", "score"}`, the
  image at `Nebula/{imgid}.jpg` or `Polaris/{imgid}.jpg` (as `expert.py`'s `preprocess_dataset`);
- `pascal_50s.json`, `flickr8k.json`, `crowdflower_flickr8k.json`, `composite.json`: the layouts
  the CLIPScore/FLEUR copies use, read by `caprecon.data.loaders.pascal50s`, `.flickr8k` and
  `.composite` (their `image`/`image_path` already hold the folder, `Flickr8k_Dataset/...`,
  `VOC2012/JPEGImages/...`).

`expert_layout` tells a file's layout from its contents, so a renamed copy is still read; the
image root is the meta command's `--images` (EXPERT's `images/` folder).
"""

from __future__ import annotations

import json
from pathlib import Path

from caprecon.data.judgments import SCORES, Judgment, JudgmentFormatError, Judgments
from caprecon.data.loaders.common import as_number, caption_list, caption_text
from caprecon.data.loaders.composite import COMPOSITE_SUBSETS
from caprecon.data.loaders.pascal50s import PASCAL_CATEGORIES

EXPERT_SCORES = "expert-scores"  # nebula_test.json / polaris_test.json
EXPERT_IMAGE_FOLDERS = {"nebula": "Nebula", "polaris": "Polaris"}


def expert_layout(path: str | Path) -> str | None:
    """Which of EXPERT's layouts `path` holds (`expert-scores`, `pascal50s`, `flickr8k`,
    `composite`), from its contents; None for anything else (a CSV, a folder, another JSON)."""
    path = Path(path)
    if path.suffix.lower() != ".json" or not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    if isinstance(data, list):
        if not data:  # read as EXPERT's, whose loader says the list is empty (not that it is no JSON)
            return EXPERT_SCORES
        first = data[0]
        return EXPERT_SCORES if isinstance(first, dict) and {"imgid", "mt", "score"} <= set(first) else None
    if not isinstance(data, dict):
        return None
    if set(data) & set(PASCAL_CATEGORIES):
        return "pascal50s"
    if set(data) & set(COMPOSITE_SUBSETS):
        return "composite"
    first = next(iter(data.values()), None)
    return "flickr8k" if isinstance(first, dict) and "human_judgement" in first else None


def load_expert_scores(path: str | Path, benchmark: str) -> Judgments:
    """`nebula_test.json` or `polaris_test.json`: one rated caption per entry; `benchmark`
    (`nebula` or `polaris`) picks the image folder EXPERT joins `{imgid}.jpg` to."""
    path = Path(path)
    folder = EXPERT_IMAGE_FOLDERS[benchmark]
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise JudgmentFormatError(f"{path}: not readable as EXPERT's JSON ({exc})") from None
    if not isinstance(data, list):
        raise JudgmentFormatError(f"{path}: EXPERT's {benchmark} file is a list of {{imgid, mt, refs, score}}")
    items: list[Judgment] = []
    for k, entry in enumerate(data):
        where = f"{path} [{k}]"
        if not isinstance(entry, dict) or entry.get("mt") is None or entry.get("score") is None:
            raise JudgmentFormatError(f"{where}: an entry needs `mt` and `score` (and `imgid`, `refs`)")
        imgid = entry.get("imgid")
        if isinstance(imgid, bool) or (imgid is not None and not isinstance(imgid, (str, int))):
            raise JudgmentFormatError(f"{where}: imgid must be an image's name, not {imgid!r:.40}")
        # no imgid: the row stays, with no image (a row error for image metrics only)
        image = f"{folder}/{imgid}.jpg" if imgid not in (None, "") else ""
        items.append(Judgment(
            id=str(k + 1), image=image, caption=caption_text(entry["mt"], where, "mt"),
            ratings=(as_number(entry["score"], where, "score"),),
            refs=caption_list(entry.get("refs") or [], where, "refs", written=False),
            image_id=str(imgid) if imgid not in (None, "") else f"row-{k + 1}", row=k + 1,
        ))  # fmt: skip
    if not items:
        raise JudgmentFormatError(f"{path}: the list is empty: no rated captions to read")
    return Judgments(SCORES, items, path)
