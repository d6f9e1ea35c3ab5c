"""`caprecon.report`: a run's `report.html`, and the per-category table and radar chart of its
question-bank metric.

    rep = caprecon.report("runs/ctt")                 # report.html, categories.md/.csv, radar.png
    print(rep.html, rep.table.to_text() if rep.table else rep.note)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from caprecon.core.errors import ConfigError
from caprecon.reports.categories import CategoryTable, category_table, load_records, write_report
from caprecon.run.folder import run_folder, scores_path

CATEGORY_METRICS = ("turing", "captionqa", "halluc")
"""The question-bank metrics with a per-category table (halluc: precision by claim type)."""


@dataclass
class RunReport:
    """What `report` wrote: `report.html`, and the per-category table with its files when the run has it."""

    html: Path
    table: CategoryTable | None = None
    files: dict[str, Path] = field(default_factory=dict)  # categories.md, categories.csv, radar.png
    note: str | None = None  # why there is no per-category table


def report(run: str | Path, *, metric: str | None = None, out: str | Path | None = None) -> RunReport:
    """Write a run's `report.html` (of a `score`, `caption`, `meta`, `cttd build` ... folder) and,
    when it has `metric`'s scores (default: turing), that metric's per-category table
    (`categories.md`/`.csv`) and radar chart (`radar.png`). `metric` named and missing from the run
    is an error; `out`: where to write (default: the run folder)."""
    from caprecon.reports.html import write_html_report  # jinja and the templates: only once there is a report

    if not Path(run).exists():
        raise ConfigError(f"{run}: no such run folder")
    if metric is not None and metric not in CATEGORY_METRICS:
        raise ConfigError(f"--metric {metric}: choose from {', '.join(CATEGORY_METRICS)}")
    scores = scores_path(run)
    folder = Path(out) if out is not None else (Path(run) if Path(run).is_dir() else Path(run).parent)
    wanted = metric or "turing"
    with run_folder(folder, inputs=[run] if out is not None else [],
                    option="--out" if out is not None else "the run folder"):
        result = RunReport(folder / "report.html")
        if scores.is_file() and any(wanted in record for record in load_records(scores)):
            result.table = category_table(scores, metric=wanted)
            result.files = write_report(result.table, folder)
        elif metric:  # asked for by name: a run without it is a mistake, not a page without a table
            raise ConfigError(f"{run}: no scored row has {metric}; the per-category table needs a run "
                              f"scored with -m {metric}")
        elif scores.is_file():
            result.note = f"no {wanted} scores in {scores}: no per-category table"
        result.html = write_html_report(run, out)
    return result
