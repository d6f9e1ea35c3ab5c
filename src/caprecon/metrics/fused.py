"""`fused:FILE`: a combination of metrics fitted to human judgments by `caprecon meta --fit --save FILE`.

The file is plain JSON, never a pickle, so opening one received from someone else runs no code:

    {"format": "caprecon-fused", "version": 1, "model": "linear" | "logistic",
     "features": ["bleu-4", "cider", ...],            # the component metrics, in column order
     "mean": [...], "scale": [...],                     # the standardisation fitted with the model
     "weights": [...], "intercept": 0.0,                # on the standardised scores
     "trained_on": {"judgments": [...], "rows": n, "images": m, "sha256": ...},
     "versions": {"caprecon": ..., "scikit-learn": ..., "numpy": ...}, ...}

The fused score is `((x - mean) / scale) · weights + intercept`: the linear model's
prediction of the human rating, or the logistic model's log-odds that the caption is the
preferred one of a pair. Only these two linear forms can be written this way; gradient-boosted
trees are evaluated by `meta --fit` but not saved (their sklearn objects exist only as pickles).

`FusedMetric` computes every component on the same batch and applies the model. Reference
components (BLEU, METEOR, ROUGE-L, CIDEr, SPICE) are per caption, but CIDEr's IDF is a
corpus statistic: `prepare` fixes it to the references of the run's whole input (every row
with a caption and references, in every shard), so a caption's CIDEr is what pycocoevalcap
gives over the whole input, whatever the batch size or shard, and what `meta` computes over
the same file.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from caprecon.core.errors import ConfigError
from caprecon.data.images import LoadedSample
from caprecon.data.samples import Sample, SampleError
from caprecon.metrics.base import Column, Context, Metric
from caprecon.metrics.reference import ReferenceMetricError, ReferenceMetrics, reference_metric_name

FORMAT = "caprecon-fused"
VERSION = 1
LINEAR_KINDS = ("linear", "logistic")


@dataclass
class FusedModel:
    """A fitted linear combination of standardised component scores, as written to JSON."""

    model: str  # linear or logistic
    features: list[str]
    mean: list[float]
    scale: list[float]
    weights: list[float]
    intercept: float = 0.0
    info: dict[str, Any] = field(default_factory=dict)  # trained_on, versions, evaluation: kept as given

    def predict(self, x: np.ndarray) -> np.ndarray:
        """The fused score of each row of `x` (one column per feature, in `features` order)."""
        x = np.asarray(x, float)
        return ((x - np.asarray(self.mean)) / np.asarray(self.scale)) @ np.asarray(self.weights) + self.intercept

    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, "version": VERSION, "model": self.model, "features": self.features,
                "mean": self.mean, "scale": self.scale, "weights": self.weights, "intercept": self.intercept,
                **self.info}

    def save(self, path: str | Path) -> str:
        """Writes the JSON; returns its sha256."""
        text = json.dumps(self.to_json(), indent=2) + "\n"
        Path(path).write_text(text, encoding="utf-8")
        return hashlib.sha256(text.encode("utf-8")).hexdigest()

    @classmethod
    def from_json(cls, data: Any, where: str) -> FusedModel:
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ConfigError(f"{where}: not a fused metric file (no \"format\": \"{FORMAT}\")")
        if data.get("version") != VERSION:
            raise ConfigError(f"{where}: fused metric file version {data.get('version')!r}; this caprecon reads {VERSION}")
        if data.get("model") not in LINEAR_KINDS:
            raise ConfigError(f"{where}: model {data.get('model')!r} cannot be applied; expected one of {LINEAR_KINDS}")
        features = data.get("features")
        if not isinstance(features, list) or not features or not all(isinstance(f, str) and f for f in features):
            raise ConfigError(f"{where}: \"features\" must be a non-empty list of metric names")
        columns = {}
        for key in ("mean", "scale", "weights"):
            values = data.get(key)
            if not isinstance(values, list) or len(values) != len(features) or not all(_finite(v) for v in values):
                raise ConfigError(f"{where}: \"{key}\" must be {len(features)} finite numbers, one per feature")
            columns[key] = [float(v) for v in values]
        if any(s <= 0 for s in columns["scale"]):
            raise ConfigError(f"{where}: every \"scale\" must be positive")
        if not _finite(data.get("intercept", 0.0)):
            raise ConfigError(f"{where}: \"intercept\" must be a finite number")
        known = {"format", "version", "model", "features", "mean", "scale", "weights", "intercept"}
        return cls(data["model"], list(features), intercept=float(data.get("intercept", 0.0)),
                   info={k: v for k, v in data.items() if k not in known}, **columns)

    @classmethod
    def load(cls, path: str | Path) -> tuple[FusedModel, str]:
        """The model in `path` and the sha256 of the file's bytes."""
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"fused metric file not found: {path}")
        raw = path.read_bytes()
        try:
            data = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ConfigError(f"{path}: not valid JSON ({exc})") from None
        return cls.from_json(data, str(path)), hashlib.sha256(raw).hexdigest()


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


class FusedMetric(Metric):
    """Scores each batch with the component metrics and combines them with a `FusedModel`.

    Each record carries the fused score and every component's score as `fused/<component>`,
    so a run shows what the fused number was made of."""

    name = "fused"

    def __init__(self, model: FusedModel, components: Mapping[str, Metric], *, path: str = "", sha256: str = ""):
        self.model = model
        self.components = dict(components)
        self.path = path
        self.sha256 = sha256
        self.reference_names = [f for f in model.features if f not in self.components]
        try:
            self.reference = ReferenceMetrics(self.reference_names) if self.reference_names else None
        except ReferenceMetricError as exc:
            raise ConfigError(f"{path or 'fused'}: {exc}") from None
        self.needs_source_image = any(m.needs_source_image for m in self.components.values())
        # a prediction of the human rating (linear) or the log-odds of being preferred (logistic)
        self.columns = (Column(self.name, needs_source_image=self.needs_source_image,
                               needs_references=bool(self.reference_names),
                               needs_judge=any(c.needs_judge for m in self.components.values() for c in m.columns)),)

    def describe(self) -> dict[str, Any]:
        return {"metric": self.name, "file": self.path, "sha256": self.sha256, "model": self.model.model,
                "features": self.model.features, "trained_on": self.model.info.get("trained_on"),
                "components": [m.describe() for m in self.components.values()]}

    def prepare(self, samples: Sequence[Sample]) -> None:
        if self.reference is not None:
            try:
                self.reference.fix_corpus(samples)
            except ReferenceMetricError as exc:
                raise ConfigError(f"{self.path or 'fused'}: {exc}") from None
        for metric in self.components.values():
            metric.prepare(samples)

    def score(self, items: Sequence[LoadedSample], ctx: Context) -> list[dict[str, Any]]:
        columns: dict[str, list[Any]] = {}
        if self.reference is not None:
            records = self.reference.score([it.sample for it in items])
            columns.update({name: [r.get(name) for r in records] for name in self.reference_names})
        for name, metric in self.components.items():
            columns[name] = [row.get(metric.headline) for row in metric.score(items, ctx)]
        x = np.full((len(items), len(self.model.features)), math.nan)
        for j, name in enumerate(self.model.features):
            for i, value in enumerate(columns[name]):
                if not _finite(value):
                    raise SampleError(f"fused: component {name} gave no score for row {items[i].sample.id!r}",
                                      reason="component failed")
                x[i, j] = value
        fused = self.model.predict(x)
        return [{self.name: float(fused[i]), **{f"{self.name}/{n}": float(x[i, j])
                                                for j, n in enumerate(self.model.features)}}
                for i in range(len(items))]


def build_fused(path: str, build_component: Callable[[str], Metric]) -> FusedMetric:
    """`fused:PATH` of `-m`: the file's model, with its non-reference components built by
    `build_component(name)` (the METRICS registry with the run's models)."""
    if not path:
        raise ConfigError("metric fused needs its file: -m fused:PATH (written by caprecon meta --fit --save PATH)")
    model, sha256 = FusedModel.load(path)
    components = {}
    for feature in model.features:
        if reference_metric_name(feature) == feature:
            continue
        if feature.startswith("fused:"):
            raise ConfigError(f"{path}: component {feature!r} is itself a fused metric; fit on its components instead")
        components[feature] = build_component(feature)
    return FusedMetric(model, components, path=str(path), sha256=sha256)
