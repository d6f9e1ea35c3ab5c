"""Flickr8k-Expert and Flickr8k-CrowdFlower as the CLIPScore repository ships them
(`flickr8k.json`, `crowdflower_flickr8k.json`), one entry per image:

    {"1056338697_4f7d7ce270.jpg": {
        "image_path": "Flickr8k_Dataset/1056338697_4f7d7ce270.jpg",
        "ground_truth": ["a woman sits on a bench", "..."],
        "human_judgement": [{"caption": "a man on a bench", "rating": 2.0, "image_path": "..."}]}}

Also read: the Hugging Face copy `yuwd/Flickr8k-HumanEval` (a table, `caprecon.data.loaders.common`)
and caprecon's own judgment files (`caprecon.data.judgments.load_judgments`).
"""

from __future__ import annotations

import math
from pathlib import Path

from caprecon.data.judgments import FLICKR8K_EXPERT, Judgment, JudgmentFormatError, Judgments, load_judgments
from caprecon.data.loaders import hub
from caprecon.data.loaders.common import (as_number, caption_list, caption_text, first_field, load_json, norm_text,
                                          row_records, table_fields)


def load_flickr8k(path: str | Path, format: str) -> Judgments:
    """Flickr8k-Expert or -CrowdFlower: the CLIPScore JSON, or caprecon's JSONL / the original files.

    The CLIPScore JSON (`flickr8k.json`, `crowdflower_flickr8k.json`) maps an image id to
    `{"image_path", "ground_truth": [refs], "human_judgement": [{"caption", "rating"}...]}`.
    Each Expert entry is one expert's rating; entries of one caption are gathered into one
    `Judgment` with all its ratings (each still counts as its own observation). A NaN
    rating is skipped. The pinned reference handling: an Expert candidate that is one of
    its image's own references is skipped (SPICE's protocol); a CrowdFlower candidate is
    kept and removed from that image's references. Other files go to `load_judgments`.

    A folder (or the repo id `yuwd/Flickr8k-HumanEval` in the local Hugging Face cache) is
    read as CaptionEvalKit reads that dataset: config `expert` or `crowdflower`, split
    `test`, columns `img`/`imgid`/`file_name`, `cand`/`mt`, `refs`, `human_score`/`score`.
    Assumption: one row per rating, as in the JSON; rows of one (image, caption) are
    gathered the same way.
    """
    if hub.looks_like_repo_id(path) or Path(path).is_dir():
        return _own_caption_protocol(_flickr8k_hub(path, format), format)
    path = Path(path)
    if path.suffix.lower() != ".json" or not isinstance(data := load_json(path), dict):
        judgments = load_judgments(path, format)
        judgments.confined = True  # a benchmark's file: its images stay inside its folder (or --images)
        return _own_caption_protocol(judgments, format)
    gathered: dict[tuple[str, str], Judgment] = {}
    for key, entry in data.items():
        where = f"{path} [{key!r}]"
        if not isinstance(entry, dict) or "human_judgement" not in entry:
            raise JudgmentFormatError(f"{where}: expected an object with `ground_truth` and `human_judgement`")
        refs = caption_list(entry.get("ground_truth") or [], where, "ground_truth", written=False)
        image = str(entry.get("image_path") or key)
        for k, judged in enumerate(entry["human_judgement"]):
            spot = f"{where} human_judgement[{k}]"
            caption = caption_text(first_field(judged, ("caption",)) or "", spot, "caption")
            if not caption:
                raise JudgmentFormatError(f"{spot}: no caption")
            rating = as_number(judged.get("rating"), spot, "rating", finite=False)
            if math.isnan(rating):
                continue
            _gather(gathered, str(key), str(judged.get("image_path") or image), caption, refs, rating)
    if not gathered:
        raise JudgmentFormatError(f"{path}: no judgments in the file")
    return _own_caption_protocol(Judgments(format, list(gathered.values()), path), format)


def _flickr8k_hub(source: str | Path, format: str) -> Judgments:
    config = "expert" if format == FLICKR8K_EXPERT else "crowdflower"
    folder, rows = hub.read_rows(source, "test", config=config)
    gathered: dict[tuple[str, str], Judgment] = {}
    for where, record in row_records(rows, str(folder)):
        image, caption, rating, refs = table_fields(record, where, finite=False)  # NaN ratings dropped below
        if math.isnan(rating):
            continue
        _gather(gathered, Path(image).stem, image, caption, refs, rating)
    if not gathered:
        raise JudgmentFormatError(f"{folder}: no Flickr8k judgments in split 'test' of config {config!r}")
    return Judgments(format, list(gathered.values()), folder)


def _gather(gathered: dict[tuple[str, str], Judgment], image_id: str, image: str, caption: str, refs: list[str],
            rating: float) -> None:
    """One more rating of (image, caption): a caption rated by several people is one judgment."""
    key = (image_id, caption)
    if key not in gathered:
        gathered[key] = Judgment(id=f"{image_id}:{len(gathered)}", image=image, caption=caption, ratings=(), refs=refs,
                                 image_id=image_id, row=len(gathered) + 1)  # fmt: skip
    gathered[key].ratings += (rating,)


def _own_caption_protocol(judgments: Judgments, format: str) -> Judgments:
    items = []
    for item in judgments.items:
        refs = [norm_text(r) for r in item.refs]
        own = norm_text(item.caption) in refs
        if own and format == FLICKR8K_EXPERT:
            continue
        if own:
            refs = [r for r in refs if r != norm_text(item.caption)]
        item.refs = refs
        items.append(item)
    judgments.items = items
    return judgments
