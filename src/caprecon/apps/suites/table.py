"""The suite's Table 1 (the Caption Turing Test paper): one row per caption source, one column
per dataset, their average (Eq. 5's S_D, in percent), the upper bound (the judge on the
original images) and the gap to it; Eq. 4's criterion (mean absolute per-dataset gap <= σ)
per source alongside."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from caprecon.apps.suites.entries import SuiteEntry
from caprecon.core.tables import format_table

UPPER = "Upper bound"
DEFAULT_SIGMA = 5.0  # percentage points; the paper leaves σ open


@dataclass
class SuiteTable:
    """Table 1: per source and dataset the headline score (percent); Eq. 4 per source."""

    datasets: list[SuiteEntry]
    scores: dict[str, dict[str, dict[str, Any]]]  # row label -> dataset name -> dataset_scores()
    sources: list[str]
    sigma: float = DEFAULT_SIGMA
    notes: list[str] = field(default_factory=list)

    def score(self, row: str, dataset: str) -> float:
        return self.scores.get(row, {}).get(dataset, {}).get("score", math.nan)

    def average(self, row: str) -> float:
        values = [self.score(row, d.name) for d in self.datasets]
        return math.nan if any(math.isnan(v) for v in values) else sum(values) / len(values)

    def gap(self, row: str) -> float:
        return self.average(UPPER) - self.average(row)

    def mean_abs_gap(self, row: str) -> float:
        """Eq. 4's left side: (1/n) Σ_i |J(I, D_i) - J(Î, D_i)|, in percentage points."""
        gaps = [abs(self.score(UPPER, d.name) - self.score(row, d.name)) for d in self.datasets]
        return math.nan if any(math.isnan(g) for g in gaps) else sum(gaps) / len(gaps)

    def equivalent(self, row: str) -> bool | None:
        value = self.mean_abs_gap(row)
        return None if math.isnan(value) else value <= self.sigma

    def grid(self) -> list[list[str]]:
        header = ["captioner", *(d.label for d in self.datasets), "Avg.", "Gap", "mean|Δ|", f"≤σ={self.sigma:g}"]
        rows = [header]
        for label in [UPPER, *self.sources]:
            cells = [label, *(_num(self.score(label, d.name)) for d in self.datasets), _num(self.average(label))]
            if label == UPPER:
                cells += ["", "", ""]
            else:
                equivalent = self.equivalent(label)
                cells += [_num(self.gap(label)), _num(self.mean_abs_gap(label)),
                          "n/a" if equivalent is None else ("yes" if equivalent else "no")]
            rows.append(cells)
        return rows

    def to_text(self) -> str:
        text = format_table(self.grid(), rule=True)
        return text + ("\n\n" + "\n".join(f"note: {n}" for n in self.notes) if self.notes else "")

    def to_markdown(self) -> str:
        rows = self.grid()
        cells = [[c.replace("|", "\\|") for c in row] for row in rows]
        out = ["| " + " | ".join(cells[0]) + " |", "|" + "---|" * len(rows[0])]
        out += ["| " + " | ".join(row) + " |" for row in cells[1:]]
        return "\n".join(out + [""] + [f"- {n}" for n in self.notes]).rstrip() + "\n"

    def rows(self) -> list[dict[str, Any]]:
        """Long form: one row per (source, dataset), full precision, plus each source's average."""
        out = []
        for label in [UPPER, *self.sources]:
            for d in self.datasets:
                s = self.scores.get(label, {}).get(d.name, {})
                out.append({"captioner": label, "dataset": d.name, "label": d.label, "score": s.get("score"),
                            "accuracy": s.get("accuracy"), "accuracy_plus": s.get("accuracy_plus"),
                            "miou": s.get("miou"), "n": s.get("n", 0),
                            "gap": self.score(UPPER, d.name) - self.score(label, d.name)})
        return [{k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in r.items()} for r in out]

    def summary(self) -> dict[str, Any]:
        def clean(v: float) -> float | None:
            return None if math.isnan(v) else v

        return {"datasets": [{"name": d.name, "label": d.label} for d in self.datasets], "sigma": self.sigma,
                "upper_bound": {"average": clean(self.average(UPPER)), "scores": self.scores.get(UPPER, {})},
                "captioners": {label: {"average": clean(self.average(label)), "gap": clean(self.gap(label)),
                                       "mean_abs_gap": clean(self.mean_abs_gap(label)),
                                       "equivalent": self.equivalent(label), "scores": self.scores.get(label, {})}
                               for label in self.sources},
                "notes": self.notes}


def _num(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{round(value, 2) or 0.0:.2f}"


@dataclass
class SuiteResults:
    table: SuiteTable
    records: list[dict[str, Any]]  # one per question x (upper bound or source)
    captions: list[dict[str, Any]]  # one per source x image
    manifest: dict[str, Any]
    out: Path | None = None
