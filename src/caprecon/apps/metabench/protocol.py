"""Running a benchmark's pinned protocol on per-caption scores.

`run_benchmark` takes a `score` callable (Judgments -> metric -> scores aligned with
`Judgments.samples()`), so the same code serves reference metrics, caprecon's own metrics
and scores read from files; it calls it once per reference draw where the protocol
samples references.
"""

from __future__ import annotations

import math
from typing import Callable, Mapping, Sequence

import numpy as np

from caprecon.data.judgments import Judgments
from caprecon.stats.agreement import MetaRow, direction_of, oriented, run_meta
from caprecon.stats.bootstrap import bootstrap_ci
from caprecon.stats.correlation import pearson
from caprecon.apps.metabench import Benchmark
from caprecon.apps.metabench.caparena import caparena_rows, check_battles, check_human_ranking, has_systems, model_level_rows
from caprecon.data.loaders.pascal50s import pascal_reference_draws

Scorer = Callable[[Judgments], Mapping[str, Sequence[float]]]


def run_benchmark(
    benchmark: Benchmark,
    judgments: Judgments,
    score: Scorer,
    *,
    n_bootstrap: int = 1000,
    seed: int = 0,
    level: float = 0.95,
    tie_band: str = "exact",
    model_level: bool = False,
    higher_is_better: Mapping[str, bool | None] | None = None,
    human_ranking: str = "published",
) -> list[MetaRow]:
    """One row per metric (two for Pearson benchmarks: caption- and system-level); a metric
    tie on a pair earns what the benchmark's `ties` rule says. CapArena's agreement predicts
    ties within `tie_band` (`caparena.TIE_BANDS`). `model_level` adds each metric's ranking of
    the benchmark's models against people's (`caparena.model_level_rows`; on CapArena, people's
    ranking is `human_ranking`: `caparena.people_ranking`). Each metric's scores
    are read by its declared direction (`higher_is_better`, as `run_meta` reads them) in every
    statistic, and its rows say how (`direction`)."""
    declared = higher_is_better or {}
    rows = _run_oriented(benchmark, judgments, _oriented_scorer(score, declared), n_bootstrap=n_bootstrap, seed=seed,
                         level=level, tie_band=tie_band, model_level=model_level, human_ranking=human_ranking)
    for row in rows:
        row.direction = direction_of(row.metric, declared)
    return rows


def _oriented_scorer(score: Scorer, declared: Mapping[str, bool | None]) -> Scorer:
    return lambda draw: {name: oriented(s, direction_of(name, declared)) for name, s in score(draw).items()}


def _run_oriented(benchmark, judgments, score, *, n_bootstrap, seed, level, tie_band, model_level,
                  human_ranking) -> list[MetaRow]:
    tie_credit = benchmark.tie_credit
    if benchmark.reference_draws:
        if model_level:
            raise ValueError(f"{benchmark.name} averages reference draws; model-level agreement is not defined on it")
        return _averaged_draws(benchmark, judgments, score, seed=seed, tie_credit=tie_credit)
    if model_level and not has_systems(judgments):
        raise ValueError(f"{benchmark.name} does not name the model behind every caption; --model-level needs it")
    if benchmark.statistic == "caparena":  # before the scoring, which may take hours
        check_battles(judgments.items, model_level=model_level)
        check_human_ranking(judgments.items, human_ranking)
    scores = score(judgments)
    if benchmark.statistic == "caparena":
        rows = caparena_rows(benchmark.name, judgments, scores, tie_band=tie_band, n_bootstrap=n_bootstrap, seed=seed,
                             level=level, human_ranking=human_ranking)  # fmt: skip
    elif benchmark.statistic == "pearson":
        rows = _pearson_rows(benchmark, judgments, scores, n_bootstrap, seed, level)
    else:
        rows = run_meta(judgments, scores, tau_variant=benchmark.tau_variant, n_bootstrap=n_bootstrap, seed=seed,
                        level=level, tie_credit=tie_credit)  # fmt: skip
        for row in rows:
            row.judgments = benchmark.name
            _add_category_mean(row)
    if model_level:
        rows += model_level_rows(benchmark.name, judgments, scores, n_bootstrap=n_bootstrap, seed=seed, level=level,
                                 human_ranking=human_ranking)
    return rows


def _add_category_mean(row: MetaRow) -> None:
    # Pascal-50S papers report the unweighted mean of the four category accuracies.
    per_category = [v for k, v in row.extra.items() if k.startswith("accuracy_")]
    if len(per_category) > 1:
        row.extra["accuracy_mean"] = float(np.mean(per_category))


def _averaged_draws(benchmark, judgments, score, *, seed, tie_credit) -> list[MetaRow]:
    """Accuracy averaged over reference draws; no CI (the draws are the variation shown)."""
    per_draw: list[list[MetaRow]] = []
    for draw in pascal_reference_draws(judgments, n_draws=benchmark.reference_draws, seed=seed):
        per_draw.append(run_meta(draw, score(draw), n_bootstrap=0, seed=seed, tie_credit=tie_credit))
    rows = []
    for k, first in enumerate(per_draw[0]):
        draws = [rows_of_draw[k] for rows_of_draw in per_draw]
        for row in draws:
            _add_category_mean(row)
        extra = {key: float(np.mean([r.extra[key] for r in draws])) for key in first.extra}
        extra["draw_std"] = float(np.std([r.value for r in draws]))
        rows.append(MetaRow(
            judgments=benchmark.name, metric=first.metric, statistic="accuracy",
            value=float(np.mean([r.value for r in draws])), ci_low=math.nan, ci_high=math.nan,
            n=first.n, n_images=first.n_images, n_failed=max(r.n_failed for r in draws), extra=extra,
        ))  # fmt: skip
    return rows


def _pearson_rows(benchmark, judgments, scores, n_bootstrap, seed, level) -> list[MetaRow]:
    """THumB: Pearson with the human score per caption, and over systems' mean scores."""
    human = np.array([float(np.mean(it.ratings)) for it in judgments.items])
    groups = np.array([it.image_id for it in judgments.items], dtype=object)
    systems = np.array([it.system for it in judgments.items], dtype=object)
    rows = []
    for name, raw in scores.items():
        x = np.asarray(raw, float)
        ok = np.isfinite(x)

        def caption_level(idx: np.ndarray) -> float:
            idx = idx[ok[idx]]
            return pearson(x[idx], human[idx])

        low, high = bootstrap_ci(caption_level, groups, n_resamples=n_bootstrap, seed=seed, level=level)
        names = sorted(set(systems[ok]))
        metric_means = [x[ok & (systems == s)].mean() for s in names]
        human_means = [human[ok & (systems == s)].mean() for s in names]
        common = dict(judgments=benchmark.name, metric=name, n_images=len(set(groups[ok])), n_failed=int((~ok).sum()))
        rows.append(MetaRow(statistic="pearson", value=caption_level(np.arange(len(x))), ci_low=low, ci_high=high,
                            n=int(ok.sum()), **common))  # fmt: skip
        rows.append(MetaRow(statistic="pearson_system", value=pearson(metric_means, human_means),
                            ci_low=math.nan, ci_high=math.nan, n=len(names), **common))  # fmt: skip
    return rows
