"""What a `meta` run writes beside its tables: `compare.csv` (metric A against B) and `report.html`."""

from __future__ import annotations

import csv
from pathlib import Path

from caprecon.stats.agreement import Comparison


def write_csv_comparison(result: Comparison, path: Path) -> None:
    with path.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(result.as_dict()))
        writer.writeheader()
        writer.writerow(result.as_dict())


def write_report(out: Path) -> None:
    """The HTML report of what `out` holds (the closing lines say where it is)."""
    from caprecon.reports.html import write_html_report  # jinja and the templates: only once there is a report

    write_html_report(out)
