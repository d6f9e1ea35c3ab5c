"""Downstream task suites on reconstructions: the Caption Turing Test paper's full evaluation.

`entries` (what each benchmark file holds and how it is scored), `loaders` (the files as
questions), `scoring` (graders and dataset numbers), `sources` (captioners and caption files),
`runner` (captions -> reconstructions -> answers), `table` (Table 1 with Eq. 4) and `agreement` (Kendall τ between
the suite's ranking and the CTTD surrogate's).
"""

from caprecon.apps.suites.agreement import surrogate_agreement
from caprecon.apps.suites.entries import SUITES, SuiteEntry, load_suites
from caprecon.apps.suites.runner import suite
from caprecon.apps.suites.sources import CaptionSource, caption_sources
from caprecon.apps.suites.table import SuiteResults, SuiteTable

__all__ = ["SUITES", "CaptionSource", "SuiteEntry", "SuiteResults", "SuiteTable", "caption_sources",
           "load_suites", "suite", "surrogate_agreement"]
