"""CapArena's protocol (Cheng et al. 2025, `caparena_metrics.py`), and model-level agreement
for any benchmark that names the model behind each caption.

Caption level: for every battle not involving the human caption, the metric's verdict
(caption 1 better, caption 2 better, or a tie) against the annotators' three-way label, ties
included (`cal_agreement(include_tie=True)`), overall and per difficulty level. A numeric
metric rarely ties, so the tie band is an option: `exact` calls a tie only on equal scores;
`matched` widens the band |a − b| ≤ w until the metric predicts as many ties as the
annotators gave on the scored battles (more where |a − b| values coincide at w).

Model level: the metric's verdicts are battles, rated by Elo (`caprecon.stats.elo`: K 4,
scale 400, base 10, start 1000, median of 1,000 bootstrap rounds); so are the annotators'
labels (`skip` and `bad` left out). Spearman and Kendall τ_b between the two ratings, over the
models other than `human`. CapArena correlates against a fixed human ranking printed in its
code; ours is recomputed from the file by the same Elo.
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np

from caprecon.data.judgments import Judgments, PairJudgment
from caprecon.data.loaders.caparena import HUMAN_SOURCE
from caprecon.stats.agreement import MetaRow
from caprecon.stats.bootstrap import bootstrap_ci
from caprecon.stats.elo import ELO_ROUNDS, ELO_SEED, Battle, bootstrap_elo, mean_rank_agreement, rank_agreement

TIE_BANDS = ("exact", "matched")


def three_way(a: np.ndarray, b: np.ndarray, tie_band: str, human_ties: int) -> np.ndarray:
    """1 where caption 1 is better, -1 where caption 2 is, 0 for a tie (see the module's tie bands)."""
    if tie_band not in TIE_BANDS:
        raise ValueError(f"tie band must be one of {', '.join(TIE_BANDS)}, not {tie_band!r}")
    diff = a - b
    width = 0.0
    if tie_band == "matched" and human_ties > 0:
        width = float(np.sort(np.abs(diff))[min(human_ties, len(diff)) - 1])
    return np.where(np.abs(diff) <= width, 0, np.sign(diff)).astype(int)


def human_three_way(items: Sequence[PairJudgment]) -> np.ndarray:
    return np.array([1 if it.preference > 0.5 else -1 if it.preference < 0.5 else 0 for it in items], int)


def _battles(items: Sequence[PairJudgment], labels: np.ndarray) -> list[Battle]:
    return [(it.systems[0], it.systems[1], (1.0 + label) / 2) for it, label in zip(items, labels)]


def human_elo(items: Sequence[PairJudgment], *, rounds: int = ELO_ROUNDS, seed: int = ELO_SEED) -> dict[str, float]:
    kept = [it for it in items if it.verdict in (*it.systems, "equal", "")]
    return bootstrap_elo(_battles(kept, human_three_way(kept)), rounds=rounds, seed=seed)


def caparena_rows(name: str, judgments: Judgments, scores: Mapping[str, Sequence[float]], *, tie_band: str = "exact",
                  n_bootstrap: int = 1000, seed: int = 0, level: float = 0.95,
                  elo_rounds: int = ELO_ROUNDS) -> list[MetaRow]:
    """One row per metric: caption-level agreement (with a per-level breakdown and the model-level
    Spearman/Kendall in `extra`). Battles the metric could not score are left out and counted."""
    keep = [k for k, it in enumerate(judgments.items) if HUMAN_SOURCE not in it.systems]
    items = [judgments.items[k] for k in keep]
    human = human_three_way(items)
    levels = np.array([it.category for it in items], dtype=object)
    images = np.array([it.image_id for it in items], dtype=object)
    reference = human_elo(items, rounds=elo_rounds)
    rows = []
    for metric, raw in scores.items():
        values = np.asarray(raw, float)
        a, b = values[[2 * k for k in keep]], values[[2 * k + 1 for k in keep]]
        ok = np.isfinite(a) & np.isfinite(b)
        index = np.flatnonzero(ok)
        predicted = np.zeros(len(items), int)
        predicted[ok] = three_way(a[ok], b[ok], tie_band, int((human[ok] == 0).sum()))
        hits = (predicted == human).astype(float)

        def agreement(idx: np.ndarray) -> float:
            idx = idx[ok[idx]]
            return float(hits[idx].mean()) if len(idx) else math.nan

        low, high = bootstrap_ci(agreement, images, n_resamples=n_bootstrap, seed=seed, level=level)
        extra = {f"agreement_{lv}": float(hits[ok & (levels == lv)].mean())
                 for lv in sorted(set(levels)) if (ok & (levels == lv)).any()}  # fmt: skip
        extra["ties_predicted"] = float((predicted[ok] == 0).sum())
        extra["ties_human"] = float((human[ok] == 0).sum())
        model = rank_agreement(bootstrap_elo(_battles([items[i] for i in index], predicted[ok]), rounds=elo_rounds),
                               {m: r for m, r in reference.items() if m != HUMAN_SOURCE})  # fmt: skip
        extra.update(spearman_model=model.spearman, kendall_model=model.kendall, n_models=float(model.n_models))
        rows.append(MetaRow(judgments=name, metric=metric, statistic="agreement", value=agreement(np.arange(len(items))),
                            ci_low=low, ci_high=high, n=int(ok.sum()), n_images=len(set(images[ok])),
                            n_failed=int((~ok).sum()), extra=extra))  # fmt: skip
    return rows


def has_systems(judgments: Judgments) -> bool:
    items = judgments.items
    return bool(items) and all(all(it.systems) if isinstance(it, PairJudgment) else it.system for it in items)


def model_level_rows(name: str, judgments: Judgments, scores: Mapping[str, Sequence[float]], *,
                     n_bootstrap: int = 1000, seed: int = 0, level: float = 0.95,
                     elo_rounds: int = ELO_ROUNDS) -> list[MetaRow]:
    """Two rows per metric (`spearman_model`, `kendall_model`): systems ranked by the metric
    against systems ranked by people. Rated captions: mean score per system against mean human
    score, intervals by resampling images. Pairs: Elo of the metric's verdicts (exact ties)
    against Elo of people's, over the systems other than `human`; no interval (the Elo is already
    a bootstrap median)."""
    if not has_systems(judgments):
        raise ValueError(f"{name} does not name the model behind every caption")
    rows = []
    pairwise = isinstance(judgments.items[0], PairJudgment)
    images = np.array([it.image_id for it in judgments.items], dtype=object)
    if pairwise:
        keep = [k for k, it in enumerate(judgments.items) if HUMAN_SOURCE not in it.systems]
        items = [judgments.items[k] for k in keep]
        reference = {m: r for m, r in human_elo(items, rounds=elo_rounds).items() if m != HUMAN_SOURCE}
    else:
        human = np.array([float(np.mean(it.ratings)) for it in judgments.items])
        systems = np.array([it.system for it in judgments.items], dtype=object)
    for metric, raw in scores.items():
        values = np.asarray(raw, float)
        if pairwise:
            a, b = values[[2 * k for k in keep]], values[[2 * k + 1 for k in keep]]
            ok = np.isfinite(a) & np.isfinite(b)
            labels = three_way(a[ok], b[ok], "exact", 0)
            result = rank_agreement(bootstrap_elo(_battles([it for it, good in zip(items, ok) if good], labels),
                                                  rounds=elo_rounds), reference)  # fmt: skip
            n_failed = int((~ok).sum())
        else:
            result = mean_rank_agreement(values, human, systems, images, n_bootstrap=n_bootstrap, seed=seed, level=level)
            n_failed = int((~np.isfinite(values)).sum())
        common = dict(judgments=name, metric=metric, n=result.n_models, n_images=len(set(images)), n_failed=n_failed)
        rows.append(MetaRow(statistic="spearman_model", value=result.spearman, ci_low=result.spearman_ci[0],
                            ci_high=result.spearman_ci[1], **common))  # fmt: skip
        rows.append(MetaRow(statistic="kendall_model", value=result.kendall, ci_low=result.kendall_ci[0],
                            ci_high=result.kendall_ci[1], **common))  # fmt: skip
    return rows
