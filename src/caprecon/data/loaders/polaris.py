"""Polaris (Wada et al. 2024), test split: the Hugging Face dataset `yuwd/Polaris`

    {"refs": ["a man rides a horse", "..."], "cand": "a person on a horse",
     "img": <image stored as file_name 00001.jpg>, "human_score": 0.75}

or the Polos release's `polaris_test.csv` (columns `mt`, `refs`, `score`, `imgid`), both the
rated-caption table of `caprecon.data.loaders.common`.
"""

from __future__ import annotations

from pathlib import Path

from caprecon.data.judgments import Judgments
from caprecon.data.loaders import hub
from caprecon.data.loaders.common import load_hf_judgments, scores_from_csv


POLARIS_CSV = "polaris_test.csv"


def load_polaris(path: str | Path) -> Judgments:
    """Polaris (Wada et al. 2024), test split: the Hugging Face dataset `yuwd/Polaris`
    (columns `refs`, `cand`, `img`, `human_score`; a local folder or the Hub cache), or the
    Polos release's `polaris_test.csv` (columns `mt`, `refs` as a Python list, `score`,
    `imgid`; the file or its folder), the two ways CaptionEvalKit reads it.
    """
    if not hub.looks_like_repo_id(path):
        path = Path(path)
        csv = path / POLARIS_CSV if path.is_dir() else path
        if csv.suffix.lower() == ".csv" and csv.is_file():
            return scores_from_csv(csv)
    return load_hf_judgments(path, "test")
