"""Does the cheap surrogate rank captioners as the full task suite does?

The suite's ranking is by each captioner's average over datasets (Eq. 5); the
surrogate's by its Caption Turing Test accuracy on CTTD (`turing`). Agreement is
Kendall's τ_b between the two scores over the captioners both name (ties count as
τ_b counts them).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from caprecon.core.errors import ConfigError
from caprecon.core.tables import format_table
from caprecon.stats.correlation import kendall_tau


def suite_averages(path: str | Path) -> dict[str, float]:
    """Captioner -> average (percent) from a `caprecon suite` run folder or its summary.json."""
    path = Path(path)
    summary = path / "summary.json" if path.is_dir() else path
    if not summary.is_file():
        raise ConfigError(f"no suite results at {path} (a `caprecon suite --out` folder or its summary.json)")
    data = json.loads(summary.read_text(encoding="utf-8"))
    if not isinstance(data, dict) or "captioners" not in data:
        raise ConfigError(f"{summary} is not a `caprecon suite` summary (no `captioners`)")
    return {label: row["average"] for label, row in data["captioners"].items() if row.get("average") is not None}


def turing_score(value: str | Path, metric: str = "turing") -> float:
    """A captioner's Caption Turing Test score: a number, or a `caprecon score` run folder or
    summary.json holding `metrics.<metric>.mean`."""
    try:
        return float(value)
    except (TypeError, ValueError):
        pass
    path = Path(value)
    summary = path / "summary.json" if path.is_dir() else path
    if not summary.is_file():
        raise ConfigError(f"{value}: neither a number nor a run folder / summary.json")
    data = json.loads(summary.read_text(encoding="utf-8"))
    mean = ((data.get("metrics") or {}).get(metric) or {}).get("mean") if isinstance(data, dict) else None
    if not isinstance(mean, (int, float)):
        raise ConfigError(f"{summary} has no mean for metric {metric!r} (metrics.{metric}.mean)")
    return float(mean)


@dataclass
class Agreement:
    suite: dict[str, float]
    surrogate: dict[str, float]
    tau: float
    only_suite: list[str]
    only_surrogate: list[str]

    @property
    def shared(self) -> list[str]:
        return [label for label in self.suite if label in self.surrogate]

    def ranking(self, scores: Mapping[str, float]) -> list[str]:
        return sorted(self.shared, key=lambda label: (-scores[label], label))

    def to_text(self) -> str:
        suite, surrogate = self.ranking(self.suite), self.ranking(self.surrogate)
        rows = [["rank", "task suite", "Avg.", "CTTD", "turing"]]
        for i, (a, b) in enumerate(zip(suite, surrogate), 1):
            rows.append([str(i), a, f"{self.suite[a]:.2f}", b, f"{self.surrogate[b]:.4f}"])
        lines = [format_table(rows, rule=True)]
        tau = f"n/a ({self._why_no_tau()})" if math.isnan(self.tau) else f"{self.tau:+.3f}"
        lines += ["", f"Kendall tau_b over {len(self.shared)} captioners: {tau}"]
        for side, labels in (("only in the suite results", self.only_suite),
                             ("only in the turing results", self.only_surrogate)):
            if labels:
                lines.append(f"note: {side} (left out): {', '.join(labels)}")
        return "\n".join(lines)

    def _why_no_tau(self) -> str:
        shared = self.shared
        if len(shared) < 2:
            return "fewer than two captioners in both"
        for name, scores in (("task-suite averages", self.suite), ("turing scores", self.surrogate)):
            if len({scores[label] for label in shared}) == 1:
                return f"the {name} are all tied, so they rank nothing and tau_b is undefined"
        return "tau_b is undefined for these scores"

    def to_dict(self) -> dict:
        return {"tau_b": None if math.isnan(self.tau) else self.tau, "captioners": self.shared,
                "suite_ranking": self.ranking(self.suite), "turing_ranking": self.ranking(self.surrogate),
                "suite": self.suite, "turing": self.surrogate, "only_suite": self.only_suite,
                "only_turing": self.only_surrogate}


def surrogate_agreement(suite: Mapping[str, float], surrogate: Mapping[str, float]) -> Agreement:
    suite, surrogate = dict(suite), dict(surrogate)
    shared = [label for label in suite if label in surrogate]
    tau = kendall_tau([suite[k] for k in shared], [surrogate[k] for k in shared], variant="b")
    return Agreement(suite, surrogate, tau, [k for k in suite if k not in surrogate],
                     [k for k in surrogate if k not in suite])
