"""What `caprecon meta --fit` writes beside `meta.csv`, one set of files per fitted result:

- `fit-<file>-<model>.md`: the fused metric and every component on the same rows (the
  benchmark's statistic with its bootstrap CI, as in `meta.md`), the paired bootstrap
  against the best single component, and each component's weight (linear, logistic: on the
  standardised score) or permutation importance (gbt);
- `fit-<file>-<model>.svg`: the out-of-fold (or transferred) prediction of each caption
  against its mean human score;
- `fit-predictions-<file>-<model>.csv`: per caption, its test fold, the prediction scored,
  and the final model's in-sample prediction (what `score -m fused:FILE` reproduces);
- `fit.csv` (every result's rows) and `fit-weights.csv` (every result's weights).

The `meta` HTML report shows the fused rows and their scatter through `meta.csv` and the
`scores-*.csv` columns, which the command adds, and `fit-weights.csv` as a table of its own.
"""

from __future__ import annotations

import csv
import math
import re
from pathlib import Path
from typing import Sequence

from caprecon.stats.agreement import format_comparison, write_csv, write_markdown
from caprecon.stats.fit import FitResult


def slug(result: FitResult) -> str:
    """The result's part of its file names: judgments file stem and fused metric name."""
    words = re.sub(r"[^A-Za-z0-9]+", "-", f"{Path(result.judgments).stem} {result.name}").strip("-")
    return words.replace("-out-of-fold", "")


def result_notes(result: FitResult) -> list[str]:
    notes = list(result.notes)
    if result.comparison is not None:
        notes.append(f"against the best single component: {format_comparison(result.comparison)}")
    notes.append(f"{result.importance_kind}: " + ", ".join(f"{name} {value:+.4f}"
                                                          for name, value in result.importance.items()))
    notes.append("rows: captions every component scored; the components' values here are on exactly these rows")
    return notes


def write_fit_report(results: Sequence[FitResult], out: Path) -> list[Path]:
    """Writes every result's files and the two summaries; returns the markdown files."""
    from caprecon.reports.html import svg

    written = []
    for result in results:
        name = slug(result)
        human = result.training.target
        chart = svg.scatter(list(result.predictions), list(human), xlabel=result.name, ylabel="human (mean)",
                            title=f"{result.judgments}: {result.name}")
        (out / f"fit-{name}.svg").write_text(str(chart), encoding="utf-8")
        markdown = out / f"fit-{name}.md"
        write_markdown(result.rows, markdown, title=f"Fitted combination: {result.name} on {result.judgments}",
                       notes=[*result_notes(result), f"scatter: fit-{name}.svg"])
        _write_predictions(result, out / f"fit-predictions-{name}.csv")
        written.append(markdown)
    write_csv([row for result in results for row in result.rows], out / "fit.csv")
    with (out / "fit-weights.csv").open("w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(["judgments", "fused", "component", "kind", "value"])
        for result in results:
            for component, value in result.importance.items():
                writer.writerow([result.judgments, result.name, component, result.importance_kind, repr(value)])
    return written


def _write_predictions(result: FitResult, path: Path) -> None:
    samples = result.training.judgments.samples()
    human = result.training.target
    with path.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(["id", "image_id", "caption", "human", "fold", "prediction", "final_in_sample"])
        for k, s in enumerate(samples):
            writer.writerow([s.id, s.image_id, s.caption, repr(float(human[k])), int(result.fold[k]),
                             _number(result.predictions[k]), _number(result.in_sample[k])])


def _number(value: float) -> str:
    return "" if math.isnan(value) else repr(float(value))
