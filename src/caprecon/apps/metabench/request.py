"""What a `meta` run is asked to do (`MetaRequest`, the command's options by their names), and its error."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from caprecon.core.checks import MAX_RESAMPLES, check_count, check_number
from caprecon.core.errors import ConfigError
from caprecon.data.samples import Sample
from caprecon.stats.fit import DEFAULT_FOLDS

ScoreMetric = Callable[[str, list[Sample]], Sequence[float]]
"""score_metric(name, samples) -> one score per sample (NaN or None where it failed)."""


class MetaError(ConfigError):
    """A problem with the request as a whole; reported as one line (exit status 2 on the command line)."""


def _paths(value: Any) -> list[Path] | None:
    if value is None:
        return None
    return [Path(value)] if isinstance(value, (str, Path)) else [Path(v) for v in value]


def _path(value: Any) -> Path | None:
    return None if value is None else Path(value)


def _names(value: Any) -> list[str] | None:
    if value is None:
        return None
    return [value] if isinstance(value, str) else list(value)


def _choice(option: str, value: Any, allowed: Sequence[Any]) -> None:
    if value not in allowed:
        raise MetaError(f"{option} {value!r}: choose from {', '.join(map(str, allowed))}")


@dataclass
class MetaRequest:
    """The options of `caprecon meta`, by their names (`caprecon.meta` documents each); built by
    `caprecon.meta`, which checks them as the command's parser does."""

    judgments: list[Path] | None = None
    metrics: list[str] | None = None
    out: Path | None = None
    scores: list[Path] | None = None
    images: Path | None = None
    format: str = "auto"
    captions: Path | None = None
    bootstrap: int = 1000
    seed: int = 0
    tau: str | None = None
    human_order: str = "descending"
    probes: bool = False
    triples: Path | None = None
    benchmark: str | None = None
    data: Path | None = None
    compare: tuple[str, str] | None = None
    model_level: bool = False
    tie_band: str = "exact"
    verify: bool = False
    tolerance: float = 1.0
    expected: Path | None = None
    every_benchmark: bool = False
    data_root: Path | None = None
    fit: bool = False
    fit_model: str = "linear"
    folds: int = DEFAULT_FOLDS
    save: Path | None = None
    fit_on: str | None = None
    evaluate_on: str | None = None
    progress: bool = False
    human_ranking: str = "published"
    questions: Path | None = None  # tifa160: the question bank (DSG's proposition file)
    answers: Path | None = None  # tifa160: the recorded answers

    def __post_init__(self) -> None:
        from caprecon.apps.metabench import BENCHMARKS, LAYOUTS
        from caprecon.apps.metabench.caparena import HUMAN_RANKINGS, TIE_BANDS
        from caprecon.data.judgments import FORMATS
        from caprecon.stats.agreement import HUMAN_ORDERS
        from caprecon.stats.fit import MODELS

        self.judgments, self.scores = _paths(self.judgments), _paths(self.scores)
        for name in ("out", "images", "captions", "triples", "data", "expected", "data_root", "save", "questions",
                     "answers"):
            setattr(self, name, _path(getattr(self, name)))
        self.metrics = _names(self.metrics)
        if self.compare is not None:
            if isinstance(self.compare, str) or len(self.compare) != 2:
                raise MetaError(f"--compare takes two metrics (A, B), not {self.compare!r}")
            self.compare = (str(self.compare[0]), str(self.compare[1]))
        check_count("--bootstrap", self.bootstrap, 0, MAX_RESAMPLES)
        check_count("--seed", self.seed, 0)
        check_count("--folds", self.folds, 2)
        check_number("--tolerance", self.tolerance, 0)
        _choice("--format", self.format, ("auto", *FORMATS, *LAYOUTS))
        _choice("--human-order", self.human_order, HUMAN_ORDERS)
        _choice("--tie-band", self.tie_band, TIE_BANDS)
        _choice("--human-ranking", self.human_ranking, HUMAN_RANKINGS)
        _choice("--fit-model", self.fit_model, MODELS)
        if self.tau is not None:
            _choice("--tau", self.tau, ("b", "c"))
        if self.benchmark is not None:
            _choice("--benchmark", self.benchmark, tuple(BENCHMARKS))

    def inputs(self) -> list[Any]:
        """What the run reads, which none of its outputs may be."""
        return [self.judgments, self.scores, self.images, self.data, self.triples, self.expected, self.questions,
                self.answers]
