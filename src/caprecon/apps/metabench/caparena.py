"""CapArena's protocol (Cheng et al. 2025, `caparena_metrics.py`), and model-level agreement
for any benchmark that names the model behind each caption.

Caption level: for every battle not involving the human caption, the metric's verdict
(caption 1 better, caption 2 better, or a tie) against the annotators' three-way label, ties
included (`cal_agreement(include_tie=True)`), overall and per difficulty level. A numeric
metric rarely ties, so the tie band is an option: `exact` calls a tie only on equal scores;
`matched` widens the band |a − b| ≤ w until the metric predicts as many ties as the
annotators gave on the scored battles (more where |a − b| values coincide at w).

Model level: the metric's verdicts on the battles without the human caption are battles,
rated by Elo (`caprecon.stats.elo`: K 4, scale 400, base 10, start 1000, median of 1,000
bootstrap rounds), and the models other than `human` are ranked by it. People's ranking is,
by `human_ranking`:

- `published` (the default, the paper's protocol): the human ranking of CapArena's 15 models
  that `caparena_metrics.py` fixes in its code (`cal_model_level_agreement`), computed by its
  authors from every battle, the human caption's included; `human` itself is then dropped, as
  there. A file naming a model outside that ranking cannot be read under it;
- `recomputed`: the Elo of the annotators' labels in the file, by the same Elo, over the
  battles without the human caption (`skip` and `bad` left out: CapArena's `compute_elo`
  accepts only a source or a tie).

Spearman and Kendall τ_b between the metric's ranking and people's, over the models both rank
(CapArena: scipy's `spearmanr` and `kendalltau` of the rank positions).
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
HUMAN_RANKINGS = ("published", "recomputed")
MIN_MODELS = 3  # two models' rankings agree or disagree entirely: a correlation of ±1 says nothing
# CapArena's human ranking, best first, as `caparena_metrics.py` fixes it (`ranking_human`)
PUBLISHED_HUMAN_RANKING = (
    "GPT-4o-0806", "human", "Gemini-2.0-flash-exp", "InternVL2-26B", "Gemini-1.5-pro-002", "Claude-3.5-Sonnet-0620",
    "GPT-4o-mini-0718", "LLama-3.2-90B", "Qwen2-VL-72B-Instruct", "CogVLM2-llama3-chat-19B", "MiniCPM-V2.6-8B",
    "Qwen2-VL-7B-Instruct", "Qwen2-VL-2B-Instruct", "LLaVA-1.6-34B", "LLaVA-1.5-7B",
)


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
    """People's Elo from the battles' labels; `skip` and `bad` (neither a source nor a tie) left out."""
    kept = [it for it in items if it.verdict in (*it.systems, "equal", "")]
    return bootstrap_elo(_battles(kept, human_three_way(kept)), rounds=rounds, seed=seed)


def outside_published_ranking(items: Sequence[PairJudgment]) -> list[str]:
    """The models of the battles `items` that CapArena's published human ranking does not rank."""
    return sorted({m for it in items for m in it.systems} - set(PUBLISHED_HUMAN_RANKING))


def check_human_ranking(items: Sequence[PairJudgment], human_ranking: str) -> None:
    """A ValueError, before any scoring, where `human_ranking` cannot rank the models of `items`."""
    if human_ranking not in HUMAN_RANKINGS:
        raise ValueError(f"human ranking must be one of {', '.join(HUMAN_RANKINGS)}, not {human_ranking!r}")
    if human_ranking == "published" and (unknown := outside_published_ranking(items)):
        raise ValueError(f"{', '.join(unknown)}: not in CapArena's published human ranking of its 15 models; "
                         "rank people by this file's own battles instead (--human-ranking recomputed)")


def check_battles(items: Sequence[PairJudgment], *, model_level: bool = False) -> list[str]:
    """A ValueError, before any scoring, where the battles cannot give CapArena's statistics: none
    without the human caption, or people calling every one a tie; with `model_level`, fewer than three
    models. The notes on what they cannot give otherwise (a model-level agreement of two models)."""
    kept = [it for it in items if HUMAN_SOURCE not in it.systems]
    if not kept:
        raise ValueError("every battle involves the human caption, which CapArena's protocol leaves out: no battle "
                         "is left to compare the metric with people on")
    if all(it.preference == 0.5 for it in kept):
        raise ValueError("people called every battle without the human caption a tie (equal, skip or bad): the "
                         "agreement would count only the metric's ties, and people's Elo ranks no model")
    models = sorted({m for it in kept for m in it.systems})
    if len(models) >= MIN_MODELS:
        return []
    said = (f"only {len(models)} model(s) besides the human caption ({', '.join(models)}): a correlation of their "
            "rankings is ±1 by construction")
    if model_level:
        raise ValueError(f"{said}; --model-level needs {MIN_MODELS} or more")
    return [f"caparena: {said}, so the model-level agreement is left out"]


def people_ranking(items: Sequence[PairJudgment], human_ranking: str, *, rounds: int = ELO_ROUNDS) -> dict[str, float]:
    """People's rating of the models other than `human` (higher is better), by `human_ranking`."""
    check_human_ranking(items, human_ranking)
    if human_ranking == "recomputed":
        return {m: r for m, r in human_elo(items, rounds=rounds).items() if m != HUMAN_SOURCE}
    # rank 1 is the best: its negated position is a rating that orders the models the same way
    return {m: -float(k) for k, m in enumerate(PUBLISHED_HUMAN_RANKING, 1) if m != HUMAN_SOURCE}


def caparena_rows(name: str, judgments: Judgments, scores: Mapping[str, Sequence[float]], *, tie_band: str = "exact",
                  n_bootstrap: int = 1000, seed: int = 0, level: float = 0.95, elo_rounds: int = ELO_ROUNDS,
                  human_ranking: str = "published") -> list[MetaRow]:
    """One row per metric: caption-level agreement (with a per-level breakdown and the model-level
    Spearman/Kendall against `human_ranking` in `extra`). Battles the metric could not score are
    left out and counted."""
    keep = [k for k, it in enumerate(judgments.items) if HUMAN_SOURCE not in it.systems]
    items = [judgments.items[k] for k in keep]
    human = human_three_way(items)
    levels = np.array([it.category for it in items], dtype=object)
    images = np.array([it.image_id for it in items], dtype=object)
    reference = people_ranking(items, human_ranking, rounds=elo_rounds)
    ranked = len({m for it in items for m in it.systems}) >= MIN_MODELS  # else check_battles says why not
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
        if ranked:
            model = rank_agreement(bootstrap_elo(_battles([items[i] for i in index], predicted[ok]),
                                                 rounds=elo_rounds), reference)  # fmt: skip
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
                     elo_rounds: int = ELO_ROUNDS, human_ranking: str = "published") -> list[MetaRow]:
    """Two rows per metric (`spearman_model`, `kendall_model`): systems ranked by the metric
    against systems ranked by people. Rated captions: mean score per system against mean human
    score, intervals by resampling images. Pairs: Elo of the metric's verdicts (exact ties)
    against people's ranking (`human_ranking`: `people_ranking`), over the systems other than
    `human`; no interval (the Elo is already a bootstrap median)."""
    if not has_systems(judgments):
        raise ValueError(f"{name} does not name the model behind every caption")
    rows = []
    pairwise = isinstance(judgments.items[0], PairJudgment)
    images = np.array([it.image_id for it in judgments.items], dtype=object)
    if pairwise:
        keep = [k for k, it in enumerate(judgments.items) if HUMAN_SOURCE not in it.systems]
        items = [judgments.items[k] for k in keep]
        reference = people_ranking(items, human_ranking, rounds=elo_rounds)
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
