"""Model-level agreement: Elo ratings from pairwise outcomes, and rank correlations of
systems ordered by a metric against systems ordered by people.

The Elo follows CapArena's `cal_ranking.py` (itself Chatbot Arena's online Elo): every model
starts at 1000; a battle of A against B with outcome s (1: A won, 0: B won, 0.5: a tie)
moves A by K·(s − E_A) and B by K·(1 − s − E_B), E_A = 1 / (1 + base^((R_B − R_A)/scale)),
with K = 4, scale 400, base 10. Battles are replayed in the order given; the reported
rating is the median over 1,000 bootstrap resamples of the battles (drawn with replacement,
a fixed seed), which makes it nearly independent of that order. CapArena draws its resamples
with pandas under `np.random.seed(42)`; ours come from `numpy.random.default_rng(seed)`, so
medians agree with theirs to the bootstrap's noise, not to the last digit.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from caprecon.stats.bootstrap import bootstrap_ci
from caprecon.stats.correlation import kendall_tau, spearman

ELO_K = 4.0
ELO_SCALE = 400.0
ELO_BASE = 10.0
ELO_START = 1000.0
ELO_ROUNDS = 1000
ELO_SEED = 42

Battle = tuple[str, str, float]  # (model A, model B, outcome for A: 1 won, 0 lost, 0.5 tie)


def elo_ratings(battles: Sequence[Battle], *, k: float = ELO_K, scale: float = ELO_SCALE, base: float = ELO_BASE,
                start: float = ELO_START) -> dict[str, float]:
    """Online Elo over `battles` in their order."""
    rating: dict[str, float] = {}
    for a, b, outcome in battles:
        if outcome not in (0.0, 0.5, 1.0):
            raise ValueError(f"a battle's outcome is 1, 0 or 0.5, not {outcome!r}")
        ra, rb = rating.setdefault(a, start), rating.setdefault(b, start)
        expected_a = 1.0 / (1.0 + base ** ((rb - ra) / scale))
        expected_b = 1.0 / (1.0 + base ** ((ra - rb) / scale))
        rating[a] = ra + k * (outcome - expected_a)
        rating[b] = rb + k * (1.0 - outcome - expected_b)
    return rating


def bootstrap_elo(battles: Sequence[Battle], *, rounds: int = ELO_ROUNDS, seed: int = ELO_SEED,
                  **elo: float) -> dict[str, float]:
    """Median Elo per model over `rounds` resamples of the battles (with replacement); a model
    absent from a resample is left out of that round's median, as pandas' median skips NaN."""
    if rounds <= 0:
        return elo_ratings(battles, **elo)
    rng = np.random.default_rng(seed)
    per_model: dict[str, list[float]] = defaultdict(list)
    n = len(battles)
    for _ in range(rounds):
        for model, value in elo_ratings([battles[i] for i in rng.integers(0, n, n)], **elo).items():
            per_model[model].append(value)
    return {model: float(np.median(values)) for model, values in per_model.items()}


@dataclass
class ModelAgreement:
    """A metric's ranking of systems against people's: Spearman ρ and Kendall τ_b over the
    systems both rank, with bootstrap intervals where they were computed."""

    spearman: float
    kendall: float
    n_models: int
    spearman_ci: tuple[float, float] = (math.nan, math.nan)
    kendall_ci: tuple[float, float] = (math.nan, math.nan)


def rank_agreement(metric: Mapping[str, float], human: Mapping[str, float]) -> ModelAgreement:
    """Spearman and Kendall τ_b between two ratings of the same systems (higher = better)."""
    models = sorted(m for m in set(metric) & set(human) if math.isfinite(metric[m]) and math.isfinite(human[m]))
    x, y = [metric[m] for m in models], [human[m] for m in models]
    return ModelAgreement(spearman(x, y), kendall_tau(x, y, "b"), len(models))


def system_means(values: np.ndarray, systems: np.ndarray, index: np.ndarray | None = None) -> dict[str, float]:
    """Mean of the finite `values` per system (over the rows in `index`, repeats counted)."""
    index = np.arange(len(values)) if index is None else index
    index = index[np.isfinite(values[index])]
    out: dict[str, list[float]] = defaultdict(list)
    for i in index:
        out[systems[i]].append(values[i])
    return {s: float(np.mean(v)) for s, v in out.items()}


def mean_rank_agreement(scores: Sequence[float], human: Sequence[float], systems: Sequence[str], images: Sequence,
                        *, n_bootstrap: int = 1000, seed: int = 0, level: float = 0.95) -> ModelAgreement:
    """Systems ranked by their mean metric score and by their mean human score, correlated;
    the intervals resample images (every caption of a drawn image comes along)."""
    x, h, s = np.asarray(scores, float), np.asarray(human, float), np.asarray(systems, dtype=object)

    def agreement(index: np.ndarray) -> ModelAgreement:
        return rank_agreement(system_means(x, s, index), system_means(h, s, index))

    result = agreement(np.arange(len(x)))
    result.spearman_ci = bootstrap_ci(lambda i: agreement(i).spearman, images, n_resamples=n_bootstrap, seed=seed,
                                      level=level)  # fmt: skip
    result.kendall_ci = bootstrap_ci(lambda i: agreement(i).kendall, images, n_resamples=n_bootstrap, seed=seed,
                                     level=level)  # fmt: skip
    return result


def battles_from_scores(rows: Sequence[tuple[str, str, float]]) -> list[Battle]:
    """A metric's pairwise preferences as battles: on every image, each two systems that both
    have a finite score there (their mean, if several captions) meet once, the higher score
    winning and equal scores tying. Images and systems are taken in sorted order, so the
    battles do not depend on the order of the rows."""
    per_image: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for image, system, score in rows:
        if math.isfinite(score):
            per_image[image][system].append(score)
    battles: list[Battle] = []
    for image in sorted(per_image):
        means = {s: float(np.mean(v)) for s, v in per_image[image].items()}
        names = sorted(means)
        for i, a in enumerate(names):
            for b in names[i + 1:]:
                battles.append((a, b, 1.0 if means[a] > means[b] else 0.0 if means[a] < means[b] else 0.5))
    return battles
