"""The Captioning Turing Test Dataset (CTTD) builder: a QA bank for `turing` from any
image folder (`pipeline.build_bank`, `caprecon cttd build`), or from question sets that
exist elsewhere (`importers`, `caprecon cttd import`). One module per stage: `select`,
`propose`, `categorise`, `generate`, `curate`, `rank`.
"""

from caprecon.apps.cttd.categorise import PAPER_TAXONOMY, Category
from caprecon.apps.cttd.pipeline import BuildConfig, BuildResult, build_bank

__all__ = ["PAPER_TAXONOMY", "BuildConfig", "BuildResult", "Category", "build_bank"]
