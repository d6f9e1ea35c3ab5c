"""The report's seed section: how stable the ranking is over seeds, and the captioners
compared with the seed in the interval (`caprecon.stats.seeds`), for runs scored with --seeds."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from caprecon.core.errors import ConfigError
from caprecon.reports.html import svg
from caprecon.stats.seeds import STABILITY_THRESHOLD, compare_within, seeds_needed, stability

RESAMPLES = 200  # the page is a summary: `caprecon seeds` / `compare` give the full bootstrap


def seeds_section(records: Sequence[Mapping[str, Any]], metrics: Sequence[str],
                  by: str = "captioner") -> dict[str, Any] | None:
    """The stability curve of the first metric scored from several seeds, and the compare table
    of the run's systems (values of `by`) when it has two or more; None for a one-seed run."""
    scored = [r for r in records if not r.get("error")]
    metric = next((m for m in metrics if any(len(r.get(f"{m}_seeds") or []) > 1 for r in scored)), None)
    if metric is None:
        return None
    try:
        curve = stability(scored, metric, n_resamples=RESAMPLES)
    except ConfigError:  # rows of mixed K down to one seed: nothing to draw
        return None
    ks = [p.k for p in curve]
    chart = svg.lines(ks, {"tau": [p.tau for p in curve], "95% low": [p.ci_low for p in curve],
                           "95% high": [p.ci_high for p in curve]},
                      xlabel="seeds k", ylabel=f"Kendall tau with the ranking at {ks[-1]} seeds",
                      title=f"{metric}: ranking stability over seeds")
    try:
        comparisons = [c.row() for c in compare_within(scored, metric, by=by, n_resamples=RESAMPLES)]
    except ConfigError:  # one system: nothing to compare
        comparisons = []
    return {"metric": metric, "curve": curve, "svg": chart, "threshold": STABILITY_THRESHOLD,
            "needed": seeds_needed(curve), "comparisons": comparisons, "by": by}
