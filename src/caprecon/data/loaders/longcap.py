"""LongCap-Arena (`Ka2ukiMatsuda/LongCap-Arena`): one rated-caption table
(`caprecon.data.loaders.common`) per test set and perspective, Hub split `dci_test.desc`, ...:

    {"file_name": "sa_1234.jpg", "image": <image>, "refs": ["a paragraph ..."],
     "cand": "a long description ...", "score": 3.5}

or the VELA release's CSVs (`desc_dci_test.csv`, ...: `mt`/`cand`, `refs`, `score`, `imgid`).
"""

from __future__ import annotations

from pathlib import Path

from caprecon.data.judgments import Judgments
from caprecon.data.loaders import hub
from caprecon.data.loaders.common import load_hf_judgments, scores_from_csv


LONGCAP_PERSPECTIVES = {"desc": "Descriptiveness", "rel": "Relevance", "flu": "Fluency"}
LONGCAP_SPLITS = {"testa": "dci_val", "testb": "dci_test"}


def load_longcap(path: str | Path, *, split: str, perspective: str) -> Judgments:
    """LongCap-Arena (Matsuda et al. 2025, `Ka2ukiMatsuda/LongCap-Arena`): one benchmark per
    test set and perspective, as CaptionEvalKit names them: TestA is split `dci_val`,
    TestB `dci_test`, the perspective `desc`, `rel` or `flu` (Hub split `dci_test.desc`,
    ...; columns `file_name`, `image`, `refs`, `cand`, `score`).

    Also read: the VELA release's CSVs (`desc_dci_test.csv`, ...; columns `mt`/`cand`,
    `refs`, `score`, `image`/`imgid`) in `path` or `path/test`.
    """
    if not hub.looks_like_repo_id(path):
        folder = Path(path)
        for csv in (folder / f"{perspective}_{split}.csv", folder / "test" / f"{perspective}_{split}.csv"):
            if csv.is_file():
                return scores_from_csv(csv)
    return load_hf_judgments(path, f"{split}.{perspective}")
