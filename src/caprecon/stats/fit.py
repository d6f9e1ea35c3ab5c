"""Fitted combinations of metrics (`caprecon meta --fit`): which mix of per-caption scores
agrees best with people, measured so that the fit cannot flatter itself.

Features are the per-caption scores of the chosen metrics; the target is the human side of
the judgments. Every learner is scikit-learn's:

linear
    `LinearRegression(positive=True)` on standardised scores (`StandardScaler`, one
    `Pipeline`): a monotone combination, no component can count against a caption. Rating
    judgments: fitted to each caption's mean rating, weighted by its number of ratings. Pair
    judgments: fitted, without intercept, to ±1 (which caption people preferred) from the
    difference of the two captions' standardised scores.
logistic
    `LogisticRegression(fit_intercept=False)` on the difference of two captions' standardised
    scores, predicting which one people preferred: rank-based, it learns only an order. Pairs
    come from the pair judgments, or, for ratings, from every two captions of one image whose
    mean ratings differ. Each pair is also given reversed, so both classes are present.
gbt
    `HistGradientBoostingRegressor`, monotone increasing in every component (all caprecon
    metrics are higher-is-better), on the mean rating; rating judgments only.

Honest evaluation: `GroupKFold` by image, so no image has captions in both the training
and the test fold; every caption's out-of-fold prediction comes from the model fitted
without its image. The out-of-fold predictions are then treated as one more metric by
`run_meta` (the benchmark's statistic: τ_c / τ_b for ratings, accuracy for pairs, with THE
bootstrap's interval by image) beside each component on exactly the same rows — captions
where some component failed are left out of all of them — and `compare_metrics` tests the
fused metric against the best single component with a paired bootstrap over images.

The model saved with `--save` is a final one fitted on all usable rows (see
`caprecon.metrics.fused`); its in-sample predictions are what `caprecon score -m fused:FILE`
reproduces. They are not the out-of-fold predictions, which come from one model per fold.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np

from caprecon.core.describe import installed_version
from caprecon.data.judgments import Judgments
from caprecon.metrics.fused import FusedModel
from caprecon.stats.agreement import Comparison, MetaRow, compare_metrics, human_ratings, run_meta
from caprecon.stats.correlation import within_image_pairs

MODELS = ("linear", "logistic", "gbt")
DEFAULT_FOLDS = 5


class FitError(ValueError):
    """The fit cannot be done as asked (too few images, a model that does not suit the judgments)."""


@dataclass
class Training:
    """The features and the human side of one judgments file, aligned with `judgments.samples()`."""

    judgments: Judgments
    features: list[str]
    x: np.ndarray  # samples x features, each oriented so that larger is better (`signs`)
    usable: np.ndarray  # every feature finite (for pairs: in both captions of the pair)
    groups: np.ndarray  # image of each sample
    human_order: str = "descending"  # ascending: ratings are ranks (1 = best), learnt turned around
    # -1 for a feature declared lower-is-better: the models' weights (linear) and trees (gbt) are held
    # monotone increasing in every feature, so a lower-is-better score is learnt negated
    signs: list[float] = field(default_factory=list)

    @property
    def target(self) -> np.ndarray:
        """Mean human rating per sample, larger is better (ratings); the preference for the sample (pairs)."""
        if self.judgments.pairwise:
            return np.array([v for it in self.judgments.items for v in (it.preference, 1.0 - it.preference)])
        ratings = human_ratings(self.judgments, self.human_order)
        item_of = np.repeat(np.arange(len(self.judgments.items)), [len(it.ratings) for it in self.judgments.items])
        return np.bincount(item_of, weights=ratings) / np.bincount(item_of)

    @property
    def weight(self) -> np.ndarray:
        if self.judgments.pairwise:
            return np.ones(len(self.x))
        return np.array([float(len(it.ratings)) for it in self.judgments.items])

    def fingerprint(self) -> str:
        """sha256 of what the model saw: which captions, their features and the human side."""
        rows = np.flatnonzero(self.usable)
        samples = self.judgments.samples()
        data = {"features": self.features, "ids": [samples[i].id for i in rows],
                "captions": [samples[i].caption for i in rows], "x": self.x[rows].tolist(),
                "human": self.target[rows].tolist()}
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode("utf-8")).hexdigest()


def training_set(judgments: Judgments, scores: Mapping[str, Sequence[float]], features: Sequence[str],
                 human_order: str = "descending",
                 higher_is_better: Mapping[str, bool | None] | None = None) -> Training:
    """The features of `scores` oriented by their declared direction (`higher_is_better`, as in
    `run_meta`: a feature declared lower-is-better is negated, any other read as it is)."""
    if missing := [f for f in features if f not in scores]:
        raise FitError(f"--fit: no scores for {', '.join(missing)} on {judgments.name}")
    if not features:
        raise FitError("--fit needs at least one metric to combine")
    signs = [-1.0 if (higher_is_better or {}).get(f) is False else 1.0 for f in features]
    x = np.column_stack([sign * np.asarray(scores[f], float) for f, sign in zip(features, signs)])
    usable = np.isfinite(x).all(axis=1)
    if judgments.pairwise:
        both = usable[0::2] & usable[1::2]
        usable = np.repeat(both, 2)
        groups = np.array([it.image_id for it in judgments.items for _ in range(2)], dtype=object)
    else:
        groups = np.array([it.image_id for it in judgments.items], dtype=object)
    return Training(judgments, list(features), x, usable, groups, human_order, signs)


def grouped_folds(groups: Sequence, rows: np.ndarray, n_folds: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """(train, test) sample indices among `rows`, no image on both sides (`GroupKFold`)."""
    from sklearn.model_selection import GroupKFold

    groups = np.asarray(groups, dtype=object)[rows].astype(str)
    n_images = len(set(groups))
    if n_images < 2:
        raise FitError(f"cross-validation by image needs at least 2 images with every metric scored, found {n_images}")
    splitter = GroupKFold(n_splits=min(n_folds, n_images))
    return [(rows[train], rows[test]) for train, test in splitter.split(np.zeros(len(rows)), groups=groups)]


@dataclass
class Fitted:
    """One fitted learner and how to get a score per caption from it."""

    kind: str
    features: list[str]
    estimator: object
    scaler: object = None  # the standardisation of pair models (the linear rating model keeps its own in its Pipeline)
    signs: list[float] = field(default_factory=list)  # the training's orientation of each feature (`Training.signs`)

    def predict(self, x: np.ndarray) -> np.ndarray:
        """Scores of oriented features (`Training.x`)."""
        x = np.asarray(x, float)
        if self.scaler is None:
            return self.estimator.predict(x)
        z = self.scaler.transform(x)
        return self.estimator.decision_function(z) if self.kind == "logistic" else self.estimator.predict(z)

    def _linear_parts(self):
        """(scaler, weights on standardised scores, intercept), or None for trees."""
        if self.kind == "gbt":
            return None
        if self.scaler is None:  # the rating Pipeline
            scaler, regression = self.estimator["scale"], self.estimator["fit"]
            return scaler, np.ravel(regression.coef_), float(regression.intercept_)
        return self.scaler, np.ravel(self.estimator.coef_), 0.0

    def weights(self) -> dict[str, float] | None:
        parts = self._linear_parts()
        return None if parts is None else dict(zip(self.features, (float(w) for w in parts[1])))

    def fused_model(self, info: dict) -> FusedModel:
        parts = self._linear_parts()
        if parts is None:
            raise FitError("--save writes linear and logistic models only: gradient-boosted trees have no plain-JSON "
                           "form in scikit-learn, and caprecon does not write pickles (opening one runs code)")
        scaler, weights, intercept = parts
        # the saved model reads the scores as `score` writes them: w (-x + m) / s = -w (x - (-m)) / s
        signs = self.signs or [1.0] * len(self.features)
        return FusedModel(self.kind, list(self.features), [float(s * v) for s, v in zip(signs, scaler.mean_)],
                          [float(v) for v in scaler.scale_], [float(s * w) for s, w in zip(signs, weights)], intercept,
                          info)


def fit_model(kind: str, training: Training, rows: np.ndarray, *, seed: int = 0) -> Fitted:
    """Fit `kind` on the samples `rows` (all usable)."""
    from sklearn.linear_model import LinearRegression, LogisticRegression
    from sklearn.pipeline import Pipeline
    from sklearn.preprocessing import StandardScaler

    if kind not in MODELS:
        raise FitError(f"--fit-model must be one of {', '.join(MODELS)}, not {kind!r}")
    x, y, w = training.x, training.target, training.weight
    pairwise = training.judgments.pairwise
    if kind == "gbt":
        if pairwise:
            raise FitError("--fit-model gbt needs rating judgments; for pair judgments use logistic or linear")
        from sklearn.ensemble import HistGradientBoostingRegressor

        model = HistGradientBoostingRegressor(monotonic_cst=[1] * x.shape[1], random_state=seed)
        return Fitted(kind, training.features, model.fit(x[rows], y[rows], sample_weight=w[rows]),
                      signs=training.signs)
    if kind == "linear" and not pairwise:
        model = Pipeline([("scale", StandardScaler()), ("fit", LinearRegression(positive=True))])
        return Fitted(kind, training.features, model.fit(x[rows], y[rows], fit__sample_weight=w[rows]),
                      signs=training.signs)
    first, second, preference = _training_pairs(training, rows)
    if not len(first):
        raise FitError(f"--fit-model {kind}: no pair of captions with a human preference among the training rows")
    scaler = StandardScaler().fit(x[rows])
    z = scaler.transform(x)
    d = z[first] - z[second]
    won = (preference > 0.5).astype(float)
    d, won = np.vstack([d, -d]), np.concatenate([won, 1.0 - won])  # each pair both ways round
    if kind == "logistic":
        model = LogisticRegression(fit_intercept=False).fit(d, won.astype(int))
    else:
        model = LinearRegression(positive=True, fit_intercept=False).fit(d, 2.0 * won - 1.0)
    return Fitted(kind, training.features, model, scaler, training.signs)


def _training_pairs(training: Training, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Sample indices (first, second) of the pairs people decided among `rows`, and the
    preference for the first."""
    if training.judgments.pairwise:
        inside = np.zeros(len(training.x), bool)
        inside[rows] = True
        pairs = np.flatnonzero(inside[0::2] & inside[1::2])
        preference = np.array([training.judgments.items[k].preference for k in pairs], float)
        first, second = 2 * pairs, 2 * pairs + 1
    else:
        i, j, preference = within_image_pairs(list(training.groups[rows]), training.target[rows])
        first, second = rows[i], rows[j]
    decided = preference != 0.5
    return first[decided], second[decided], preference[decided]


@dataclass
class FitResult:
    """A fused metric evaluated on one judgments file, beside its components on the same rows."""

    judgments: str
    kind: str
    name: str  # the fused metric's row name
    rows: list[MetaRow]  # the fused metric first, then each component
    comparison: Comparison | None  # fused against the best single component
    importance: dict[str, float]  # standardised weights (linear, logistic) or permutation importances (gbt)
    importance_kind: str
    predictions: np.ndarray  # per sample: out-of-fold (cross-validation) or the transferred model's
    in_sample: np.ndarray  # per sample: the final model's prediction (NaN for unusable rows)
    fold: np.ndarray  # per sample: its test fold (-1: not used, or not cross-validated)
    final: Fitted
    training: Training
    notes: list[str] = field(default_factory=list)


def cross_validate(
    kind: str,
    judgments: Judgments,
    scores: Mapping[str, Sequence[float]],
    features: Sequence[str],
    *,
    n_folds: int = DEFAULT_FOLDS,
    tau_variant: str | None = None,
    human_order: str = "descending",
    n_bootstrap: int = 1000,
    seed: int = 0,
    higher_is_better: Mapping[str, bool | None] | None = None,
) -> FitResult:
    """Out-of-fold predictions by image-grouped folds, their agreement beside the components',
    and the final model on all usable rows. `higher_is_better`: each feature's declared
    direction (see `training_set`)."""
    training = training_set(judgments, scores, features, human_order, higher_is_better)
    rows = np.flatnonzero(training.usable)
    if len(rows) and not judgments.pairwise and np.ptp(training.target[rows]) == 0:
        # a regression would fit the constant and be saved and recommended, agreeing with nobody
        raise FitError(f"every caption scored by all of {', '.join(features)} has the same human rating "
                       f"({training.target[rows][0]:g}): there is nothing to fit")
    folds = grouped_folds(training.groups, rows, n_folds)
    oof = np.full(len(training.x), math.nan)
    fold_of = np.full(len(training.x), -1)
    for k, (train, test) in enumerate(folds):
        oof[test] = fit_model(kind, training, train, seed=seed).predict(training.x[test])
        fold_of[test] = k
    final = fit_model(kind, training, rows, seed=seed)
    name = f"fused-{kind} (out-of-fold)"
    result = _evaluate(name, kind, judgments, scores, training, oof, final, tau_variant, n_bootstrap, seed,
                       higher_is_better)
    result.fold = fold_of
    result.notes.append(f"{judgments.name}: {name}: {len(folds)} folds grouped by image over {len(rows)} "
                        f"captions of {len(set(training.groups[rows]))} images; every caption predicted by the "
                        "model fitted without its image")
    return result


def transfer(
    final: Fitted,
    trained_on: str,
    judgments: Judgments,
    scores: Mapping[str, Sequence[float]],
    *,
    tau_variant: str | None = None,
    human_order: str = "descending",
    n_bootstrap: int = 1000,
    seed: int = 0,
    higher_is_better: Mapping[str, bool | None] | None = None,
) -> FitResult:
    """A model fitted on one judgments file, evaluated on another (its features oriented as in training)."""
    training = training_set(judgments, scores, final.features, human_order, higher_is_better)
    if training.signs != final.signs:
        raise FitError(f"the features' directions on {judgments.name} differ from those the model was fitted with")
    predictions = np.full(len(training.x), math.nan)
    predictions[training.usable] = final.predict(training.x[training.usable])
    name = f"fused-{final.kind} (fit on {trained_on})"
    return _evaluate(name, final.kind, judgments, scores, training, predictions, final, tau_variant, n_bootstrap, seed,
                     higher_is_better)


def _evaluate(name, kind, judgments, scores, training, predictions, final, tau_variant, n_bootstrap, seed,
              higher_is_better) -> FitResult:
    usable = training.usable
    same_rows = {f: np.where(usable, np.asarray(scores[f], float), math.nan) for f in training.features}
    # the fused score is fitted to people, larger better; each component is read by its own direction
    directions = {**(higher_is_better or {}), name: True}
    rows = run_meta(judgments, {name: predictions, **same_rows}, tau_variant=tau_variant,
                    human_order=training.human_order, n_bootstrap=n_bootstrap, seed=seed, higher_is_better=directions)
    components = [r for r in rows[1:] if math.isfinite(r.value)]
    comparison = None
    if components:
        best = max(components, key=lambda r: r.value)
        comparison = compare_metrics(judgments, name, predictions, best.metric, same_rows[best.metric],
                                     tau_variant=tau_variant, human_order=training.human_order,
                                     n_resamples=n_bootstrap, seed=seed, higher_is_better=directions)
    in_sample = np.full(len(training.x), math.nan)
    in_sample[usable] = final.predict(training.x[usable])
    importance, importance_kind = final.weights(), "weight on the standardised score"
    if importance is None:
        importance, importance_kind = _permutation_importance(final, training, seed), "permutation importance (R²)"
    return FitResult(judgments.name, kind, name, rows, comparison, importance, importance_kind, predictions,
                     in_sample, np.full(len(training.x), -1), final, training)


def _permutation_importance(final: Fitted, training: Training, seed: int) -> dict[str, float]:
    from sklearn.inspection import permutation_importance

    rows = np.flatnonzero(training.usable)
    found = permutation_importance(final.estimator, training.x[rows], training.target[rows], n_repeats=10,
                                   random_state=seed, sample_weight=training.weight[rows])
    return dict(zip(training.features, (float(v) for v in found.importances_mean)))


def fused_model(result: FitResult) -> FusedModel:
    """The final model of a cross-validation, with what it was trained on and how it fared."""
    training = result.training
    rows = np.flatnonzero(training.usable)
    fused = result.rows[0]
    info = {
        "trained_on": {"judgments": [result.judgments], "rows": len(rows),
                       "images": len(set(training.groups[rows])), "human_order": training.human_order,
                       "sha256": training.fingerprint()},
        "evaluation": {"statistic": fused.statistic, "out_of_fold": _json_number(fused.value),
                       "ci": [_json_number(fused.ci_low), _json_number(fused.ci_high)],
                       "folds": int(result.fold.max() + 1)},
        "versions": {lib: installed_version(lib) for lib in ("caprecon", "scikit-learn", "numpy")},
    }
    return result.final.fused_model(info)


def _json_number(value: float) -> float | None:
    return value if math.isfinite(value) else None  # JSON has no NaN
