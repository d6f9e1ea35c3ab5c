"""Meta-evaluation: how well a caption metric agrees with people, and how it behaves
under controlled probes.

Everything here works on per-sample scores that were computed elsewhere (any caprecon
metric, the reference metrics, or numbers from a file), aligned with
`Judgments.samples()`. A score that is NaN marks a caption the metric could not score;
that caption is left out of the statistics and counted in `n_failed`.

Agreement statistics
    Kendall τ_b / τ_c, Spearman and Pearson between metric scores and human scores.
    Each human judgment is its own observation: a Flickr8k-Expert caption rated by three
    experts contributes three (score, rating) pairs, all sharing the caption's score.
Pairwise accuracy
    How often the metric orders two captions of one image the way people did. A pair
    that people rated equally has no right answer and is left out; a pair the metric
    scores equally earns `tie_credit` (0.5 by default, what a coin flip would earn on
    average), so a metric cannot gain by collapsing scores into ties.
Confidence intervals
    Percentile bootstrap resampling whole images (all judgments of an image stay
    together, since they are not independent of one another). The generator is seeded,
    and every metric sees the same resampled image sets, so intervals are reproducible
    and comparable across metrics.
Probes (the ReconScore paper's; their captions are written in `probes.py`)
    `paraphrase_delta`: the mean score of low-overlap paraphrases of reference captions
    minus that of high-overlap perturbations of the same references (one fact changed):
    positive when the metric follows meaning rather than word overlap. `Perturber` makes
    the perturbations by swapping colours, object nouns, counts or spatial relations.
    `length_robustness`: the spread of a metric's mean over captions of three lengths that
    state the same extracted facts.
"""

from __future__ import annotations

import csv
import math
import random
import re
import warnings
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Sequence

import numpy as np

from caprecon.data.judgments import Judgment, Judgments, PairJudgment, ProbeTriple
from caprecon.data.samples import Sample

# ----------------------------------------------------------------------------- statistics


def _stats():
    from scipy import stats  # a second or more to import: only commands that correlate pay for it

    return stats


def _quiet(fn, *args, **kwargs) -> float:
    # Constant inputs make scipy warn and return NaN; NaN is the answer we want, silently.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with np.errstate(all="ignore"):
            value = fn(*args, **kwargs)[0]
    return float(value)


def kendall_tau(x: Sequence[float], y: Sequence[float], variant: str = "b") -> float:
    """Kendall's τ_b (ties corrected in both variables) or τ_c (Stuart's, for tables
    whose two variables have different numbers of levels). NaN when undefined."""
    if variant not in ("b", "c"):
        raise ValueError(f"Kendall variant must be 'b' or 'c', not {variant!r}")
    if len(x) < 2:
        return math.nan
    return _quiet(_stats().kendalltau, np.asarray(x, float), np.asarray(y, float), variant=variant)


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    return math.nan if len(x) < 2 else _quiet(_stats().spearmanr, np.asarray(x, float), np.asarray(y, float))


def pearson(x: Sequence[float], y: Sequence[float]) -> float:
    return math.nan if len(x) < 2 else _quiet(_stats().pearsonr, np.asarray(x, float), np.asarray(y, float))


@dataclass
class PairAccuracy:
    accuracy: float  # NaN when no pair had a human winner
    n: int  # pairs with a human winner: the denominator
    metric_ties: int  # of those, pairs the metric scored equally
    human_ties: int  # pairs left out because people had no preference


def pairwise_accuracy(
    score_a: Sequence[float],
    score_b: Sequence[float],
    preference: Sequence[float],
    *,
    tie_credit: float = 0.5,
) -> PairAccuracy:
    """Agreement of the metric's order of (A, B) with people's.

    `preference` is the fraction of people preferring A: above 0.5 A wins, below B wins,
    exactly 0.5 is a human tie and the pair is left out. A metric tie on a decided pair
    counts `tie_credit` of a correct answer.
    """
    a, b, p = (np.asarray(v, float) for v in (score_a, score_b, preference))
    decided = p != 0.5
    human = np.sign(p[decided] - 0.5)
    metric = np.sign(a[decided] - b[decided])
    n = int(decided.sum())
    ties = int((metric == 0).sum())
    correct = float((metric == human).sum()) + tie_credit * ties
    return PairAccuracy(correct / n if n else math.nan, n, ties, int((~decided).sum()))


def within_image_pairs(groups: Sequence, human: Sequence[float]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """All pairs (i, j), i < j, of captions of the same image, with people's preference
    for i (1, 0, or 0.5 when their human scores are equal)."""
    by_group: dict = defaultdict(list)
    for index, g in enumerate(groups):
        by_group[g].append(index)
    first, second = [], []
    for members in by_group.values():
        m = np.asarray(members)
        i, j = np.triu_indices(len(m), k=1)
        first.append(m[i])
        second.append(m[j])
    if not first:
        return np.empty(0, int), np.empty(0, int), np.empty(0)
    i, j = np.concatenate(first), np.concatenate(second)
    h = np.asarray(human, float)
    return i, j, (np.sign(h[i] - h[j]) + 1) / 2


def _group_members(groups: Sequence) -> tuple[np.ndarray, list[np.ndarray]]:
    """Each row's group number (groups in sorted order of their names) and each group's rows."""
    _, inverse = np.unique(np.asarray(groups, dtype=object).astype(str), return_inverse=True)
    inverse = inverse.reshape(-1)
    order = np.argsort(inverse, kind="stable")
    return inverse, np.split(order, np.cumsum(np.bincount(inverse))[:-1])


def _draws(n_groups: int, n_resamples: int, seed: int) -> np.ndarray:
    """The groups each resample draws (one row per resample): the same draws for every
    statistic and metric with the same seed."""
    return np.random.default_rng(seed).integers(0, n_groups, (n_resamples, n_groups))


def _interval(values: np.ndarray, level: float) -> tuple[float, float]:
    values = values[np.isfinite(values)]
    if not len(values):
        return math.nan, math.nan
    tail = (1.0 - level) / 2.0
    low, high = np.quantile(values, [tail, 1.0 - tail])
    return float(low), float(high)


def bootstrap_ci(
    statistic: Callable[[np.ndarray], float],
    groups: Sequence,
    *,
    n_resamples: int = 1000,
    seed: int = 0,
    level: float = 0.95,
) -> tuple[float, float]:
    """Percentile bootstrap interval of `statistic(indices)`, resampling groups.

    Each resample draws as many groups as there are, with replacement, and passes the
    row indices of every drawn group (repeated as often as it was drawn). Resamples on
    which the statistic is undefined (NaN) are left out. (NaN, NaN) when n_resamples is 0.
    """
    if n_resamples <= 0:
        return math.nan, math.nan
    _, members = _group_members(groups)
    draws = _draws(len(members), n_resamples, seed)
    values = np.array([statistic(np.concatenate([members[k] for k in picks])) for picks in draws])
    return _interval(values, level)


def _draw_counts(groups: Sequence, n_resamples: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(each row's group number, how often each resample draws each group: resamples x groups),
    from the same draws as `bootstrap_ci`."""
    inverse, members = _group_members(groups)
    n = len(members)
    draws = _draws(n, n_resamples, seed)
    offsets = (np.arange(n_resamples)[:, None] * n + draws).ravel()
    return inverse, np.bincount(offsets, minlength=n_resamples * n).reshape(n_resamples, n).astype(float)


def _untied_between(values: np.ndarray, group_of: np.ndarray, n_groups: int) -> np.ndarray:
    """Pairs (i in g, j in h) whose values differ, for every two groups: all pairs minus the
    tied ones, from each group's count of each value (a value shared by m groups adds m²
    tied products)."""
    sizes = np.bincount(group_of, minlength=n_groups).astype(float)
    tied = np.zeros((n_groups, n_groups))
    if len(values):
        _, code = np.unique(values, return_inverse=True)
        cells, count = np.unique(np.stack([code.reshape(-1), group_of]), axis=1, return_counts=True)
        value, group = cells
        shared = np.flatnonzero(np.bincount(value) > 1)
        alone = ~np.isin(value, shared)
        np.add.at(tied, (group[alone], group[alone]), count[alone].astype(float) ** 2)  # a group has many such values
        for v in shared:
            at = value == v
            tied[np.ix_(group[at], group[at])] += np.outer(count[at], count[at])
    return np.outer(sizes, sizes) - tied


def _concordance_between(x: np.ndarray, y: np.ndarray, group_of: np.ndarray, n_groups: int) -> np.ndarray:
    """Concordant minus discordant pairs (i in g, j in h) for every two groups, without
    visiting pairs: for each row i and each (group h, level b of y) cell, the sum of
    sgn(x_i - x_j) over the cell's rows comes from cumulative cell counts along sorted x,
    and is weighted by sgn(y_i - b). O(rows x groups x levels of y)."""
    out = np.zeros((n_groups, n_groups))
    if not len(x):
        return out
    levels, level_of = np.unique(y, return_inverse=True)
    level_of = level_of.reshape(-1)
    n_levels = len(levels)
    weight = np.sign(level_of[:, None] - np.arange(n_levels)[None, :])  # rows x levels: sgn(y_i - b)
    by_x = np.argsort(x, kind="stable")
    sorted_x = x[by_x]
    below = np.searchsorted(sorted_x, x, "left")  # rows with a smaller x
    up_to = np.searchsorted(sorted_x, x, "right")  # rows with a smaller or equal x
    by_group = np.argsort(group_of, kind="stable")
    present = np.unique(group_of)
    starts = np.searchsorted(group_of[by_group], present)
    chunk = max(1, 4_000_000 // (len(x) * n_levels))  # groups per pass, to bound memory
    for lo in range(0, n_groups, chunk):
        cols = np.arange(lo, min(lo + chunk, n_groups))
        member = np.zeros((len(x) + 1, len(cols), n_levels), dtype=np.int32)  # cumulative counts along sorted x
        inside = (group_of >= cols[0]) & (group_of <= cols[-1])
        rows = np.flatnonzero(inside[by_x])
        member[rows + 1, group_of[by_x][rows] - cols[0], level_of[by_x][rows]] = 1
        np.cumsum(member, axis=0, out=member)
        size = member[-1]
        # sum over cell rows j of sgn(x_i - x_j) = (#smaller) - (#larger) = below + up_to - size
        signed = member[below] + member[up_to] - size[None]  # rows x groups x levels
        per_row = np.einsum("ihb,ib->ih", signed, weight)
        out[np.ix_(present, cols)] += np.add.reduceat(per_row[by_group], starts, axis=0)
    return out


def bootstrap_tau(
    x: np.ndarray,
    y: np.ndarray,
    groups: Sequence,
    *,
    variant: str = "b",
    n_resamples: int = 1000,
    seed: int = 0,
    level: float = 0.95,
) -> tuple[float, float]:
    """`bootstrap_ci` of Kendall's τ between `x` and `y` (rows with a non-finite x left
    out), for all resamples at once.

    A resample repeats each drawn group's rows as often as the group is drawn, so each of
    τ's pair counts — concordant minus discordant pairs, pairs untied in x, pairs untied
    in y — is a quadratic form cᵀBc of the resample's draw counts c, with B the counts
    between the rows of each two groups. B is built once (O(rows²)), then every resample
    costs O(groups²) instead of a τ over its expanded rows. τ_c's number of classes comes
    from which values each resample contains.
    """
    if variant not in ("b", "c"):
        raise ValueError(f"Kendall variant must be 'b' or 'c', not {variant!r}")
    if n_resamples <= 0:
        return math.nan, math.nan
    group_of, counts = _draw_counts(groups, n_resamples, seed)
    x, y = np.asarray(x, float), np.asarray(y, float)
    ok = np.isfinite(x)
    x, y, group_of = x[ok], y[ok], group_of[ok]
    n_groups = counts.shape[1]
    if len(np.unique(x)) < len(np.unique(y)):
        x, y = y, x  # τ is symmetric: count against the variable with fewer levels
    concordant = _concordance_between(x, y, group_of, n_groups)
    forms = (concordant, _untied_between(x, group_of, n_groups), _untied_between(y, group_of, n_groups))
    # each form summed over the resample's ordered pairs of rows: cᵀ B c
    concordance, untied_x, untied_y = (np.einsum("rg,rg->r", counts @ form, counts) for form in forms)
    with np.errstate(all="ignore"):
        if variant == "b":
            tau = concordance / np.sqrt(untied_x * untied_y)
        else:
            size = counts @ np.bincount(group_of, minlength=n_groups)
            classes = np.minimum(_classes(x, group_of, counts), _classes(y, group_of, counts))
            tau = concordance / (size**2 * (classes - 1) / classes)
    tau[(untied_x == 0) | (untied_y == 0)] = math.nan  # a constant variable: τ undefined
    return _interval(tau, level)


def _classes(values: np.ndarray, group_of: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """How many distinct values each resample holds."""
    _, code = np.unique(values, return_inverse=True)
    cells = np.unique(np.stack([code.reshape(-1), group_of]), axis=1)  # (value, group) pairs present
    drawn = counts[:, cells[1]] > 0  # resamples x cells, cells sorted by value
    starts = np.flatnonzero(np.r_[True, cells[0][1:] != cells[0][:-1]])
    return np.logical_or.reduceat(drawn, starts, axis=1).sum(axis=1)


def bootstrap_ratio(
    numerator: np.ndarray,
    denominator: np.ndarray,
    groups: Sequence,
    *,
    n_resamples: int = 1000,
    seed: int = 0,
    level: float = 0.95,
) -> tuple[float, float]:
    """`bootstrap_ci` of sum(numerator) / sum(denominator) over a resample's rows, for all
    resamples at once (a ratio of sums is linear in the draw counts)."""
    if n_resamples <= 0:
        return math.nan, math.nan
    group_of, counts = _draw_counts(groups, n_resamples, seed)
    n_groups = counts.shape[1]
    num = np.bincount(group_of, weights=np.asarray(numerator, float), minlength=n_groups)
    den = np.bincount(group_of, weights=np.asarray(denominator, float), minlength=n_groups)
    with np.errstate(all="ignore"):
        return _interval((counts @ num) / (counts @ den), level)


# ----------------------------------------------------------------------------- agreement


@dataclass
class MetaRow:
    """Agreement of one metric with one judgments file."""

    judgments: str
    metric: str
    statistic: str  # tau_b, tau_c or accuracy
    value: float
    ci_low: float
    ci_high: float
    n: int  # human judgments (or decided pairs) behind `value`
    n_images: int
    n_failed: int  # captions (pairs, for pair judgments) the metric could not score, left out
    spearman: float = math.nan
    pearson: float = math.nan
    pair_accuracy: float = math.nan  # captions of one image ordered as by their mean human score
    extra: dict[str, float] = field(default_factory=dict)  # e.g. accuracy per Pascal-50S category

    def as_dict(self) -> dict:
        row = asdict(self)
        row.update(row.pop("extra"))
        return row


def scores_from_records(records: Sequence[Mapping], field_name: str, ids: Sequence[str]) -> np.ndarray:
    """One metric field of per-sample records, aligned with `ids` (NaN where missing or failed).

    Records are matched on `id`; a record carrying `error`, or lacking the field, gives NaN.
    """
    by_id = {str(r.get("id")): r for r in records}
    out = np.full(len(ids), math.nan)
    for k, sample_id in enumerate(ids):
        record = by_id.get(str(sample_id))
        if record is None or record.get("error"):
            continue
        value = record.get(field_name)
        try:
            out[k] = float(value)
        except (TypeError, ValueError):
            continue
    return out


def run_meta(
    judgments: Judgments,
    scores_by_metric: Mapping[str, Sequence[float]],
    *,
    tau_variant: str | None = None,
    n_bootstrap: int = 1000,
    seed: int = 0,
    level: float = 0.95,
    tie_credit: float = 0.5,
) -> list[MetaRow]:
    """One `MetaRow` per metric: its agreement with `judgments`, with a bootstrap CI.

    `scores_by_metric[name]` holds one score per sample of `judgments.samples()`, in that
    order (NaN for a caption the metric failed on). Rating judgments are summarised by
    Kendall τ (`tau_variant`, default: the file's protocol, τ_c for Flickr8k-Expert and
    τ_b otherwise); pair judgments by pairwise accuracy.
    """
    expected = len(judgments.items) * (2 if judgments.pairwise else 1)
    rows = []
    for name, raw in scores_by_metric.items():
        scores = np.asarray(raw, float)
        if scores.shape != (expected,):
            raise ValueError(f"metric {name!r}: {scores.size} scores for {expected} samples of {judgments.name}")
        if judgments.pairwise:
            rows.append(_pairs_row(judgments, name, scores, n_bootstrap, seed, level, tie_credit))
        else:
            rows.append(_ratings_row(judgments, name, scores, tau_variant, n_bootstrap, seed, level, tie_credit))
    return rows


def _ratings_row(judgments, name, scores, tau_variant, n_bootstrap, seed, level, tie_credit) -> MetaRow:
    variant = tau_variant or judgments.tau_variant
    items: list[Judgment] = judgments.items
    # One row per human judgment, all pointing at their caption's score.
    item_of = np.array([k for k, it in enumerate(items) for _ in it.ratings])
    human = np.array([r for it in items for r in it.ratings], float)
    groups = np.array([it.image_id for it in items for _ in it.ratings], dtype=object)
    x = scores[item_of]
    ok = np.isfinite(x)

    low, high = bootstrap_tau(x, human, groups, variant=variant, n_resamples=n_bootstrap, seed=seed, level=level)
    scored = np.isfinite(scores)
    item_groups = [it.image_id for k, it in enumerate(items) if scored[k]]
    item_human = [float(np.mean(it.ratings)) for k, it in enumerate(items) if scored[k]]
    i, j, pref = within_image_pairs(item_groups, item_human)
    kept = scores[scored]
    return MetaRow(
        judgments=judgments.name,
        metric=name,
        statistic=f"tau_{variant}",
        value=kendall_tau(x[ok], human[ok], variant),
        ci_low=low,
        ci_high=high,
        n=int(ok.sum()),
        n_images=len(set(groups[ok])),
        n_failed=int((~scored).sum()),
        spearman=spearman(x[ok], human[ok]),
        pearson=pearson(x[ok], human[ok]),
        pair_accuracy=pairwise_accuracy(kept[i], kept[j], pref, tie_credit=tie_credit).accuracy,
    )


def _pairs_row(judgments, name, scores, n_bootstrap, seed, level, tie_credit) -> MetaRow:
    items: list[PairJudgment] = judgments.items
    a, b = scores[0::2], scores[1::2]
    pref = np.array([it.preference for it in items], float)
    groups = np.array([it.image_id for it in items], dtype=object)
    ok = np.isfinite(a) & np.isfinite(b)

    def accuracy(idx: np.ndarray) -> float:
        idx = idx[ok[idx]]
        return pairwise_accuracy(a[idx], b[idx], pref[idx], tie_credit=tie_credit).accuracy

    overall = pairwise_accuracy(a[ok], b[ok], pref[ok], tie_credit=tie_credit)
    decided = ok & (pref != 0.5)
    metric = np.sign(np.where(ok, a - b, 0.0))
    credit = np.where(metric == 0, tie_credit, (metric == np.sign(pref - 0.5)).astype(float))
    low, high = bootstrap_ratio(np.where(decided, credit, 0.0), decided.astype(float), groups,
                                n_resamples=n_bootstrap, seed=seed, level=level)
    categories = np.array([it.category for it in items], dtype=object)
    extra = {
        f"accuracy_{c}": accuracy(np.flatnonzero(categories == c))
        for c in sorted({it.category for it in items if it.category})
    }
    return MetaRow(
        judgments=judgments.name,
        metric=name,
        statistic="accuracy",
        value=overall.accuracy,
        ci_low=low,
        ci_high=high,
        n=overall.n,
        n_images=len(set(groups[ok])),
        n_failed=int((~ok).sum()),
        extra=extra,
    )


# ----------------------------------------------------------------------------- probes

COLOURS = (
    "red", "blue", "green", "yellow", "black", "white", "brown", "orange",
    "pink", "purple", "gray", "grey",
)  # fmt: skip
COUNTS = ("two", "three", "four", "five", "six")
_OBJECT_PAIRS = (
    ("man", "woman"), ("men", "women"), ("boy", "girl"), ("boys", "girls"),
    ("dog", "cat"), ("dogs", "cats"), ("horse", "cow"), ("horses", "cows"),
    ("car", "truck"), ("cars", "trucks"), ("bicycle", "motorcycle"), ("bike", "skateboard"),
    ("ball", "frisbee"), ("beach", "field"), ("snow", "sand"), ("water", "grass"),
    ("street", "river"), ("shirt", "jacket"), ("hat", "helmet"), ("bird", "fish"),
)  # fmt: skip
_SPATIAL_PAIRS = (
    ("in front of", "behind"), ("on top of", "underneath"), ("above", "below"),
    ("left", "right"), ("inside", "outside"), ("under", "over"), ("up", "down"),
    ("on", "under"), ("into", "out of"),
)  # fmt: skip


def _symmetric(pairs) -> dict[str, str]:
    table = {}
    for a, b in pairs:
        table.setdefault(a, b)
        table.setdefault(b, a)
    return table


OBJECT_SWAPS = _symmetric(_OBJECT_PAIRS)
SPATIAL_SWAPS = _symmetric(_SPATIAL_PAIRS)
PERTURBATION_KINDS = ("colour", "object", "count", "spatial")


@dataclass
class Perturbation:
    text: str
    kind: str
    original: str
    replacement: str


def _alternation(words) -> re.Pattern:
    # Longest first, so "on top of" wins over "on".
    ordered = sorted(words, key=len, reverse=True)
    return re.compile(r"\b(" + "|".join(re.escape(w).replace(r"\ ", r"\s+") for w in ordered) + r")\b", re.I)


class Perturber:
    """Rule-based minimal perturbations that make a correct caption wrong.

    One word or phrase is replaced: a colour by another colour, an object noun by a
    different object of the same kind (man/woman, dog/cat, ...), a count word by another
    count, a spatial relation by its opposite. The choice depends only on `seed` and the
    caption, so results do not depend on call order.
    """

    def __init__(self, kinds: Sequence[str] = PERTURBATION_KINDS, seed: int = 0) -> None:
        unknown = set(kinds) - set(PERTURBATION_KINDS)
        if unknown:
            raise ValueError(f"unknown perturbation kinds {sorted(unknown)} (known: {', '.join(PERTURBATION_KINDS)})")
        self.kinds = tuple(kinds)
        self.seed = seed
        self._patterns = {
            "colour": _alternation(COLOURS),
            "object": _alternation(OBJECT_SWAPS),
            "count": _alternation(COUNTS),
            "spatial": _alternation(SPATIAL_SWAPS),
        }

    def candidates(self, caption: str) -> list[tuple[str, re.Match]]:
        """Every place in `caption` one of the enabled perturbations could change."""
        return [(kind, m) for kind in self.kinds for m in self._patterns[kind].finditer(caption)]

    def perturb(self, caption: str) -> Perturbation | None:
        """One perturbed version of `caption`, or None if nothing in it can be swapped."""
        found = self.candidates(caption)
        if not found:
            return None
        rng = random.Random(f"{self.seed}\x00{caption}")
        kind, match = rng.choice(found)
        original = match.group(0)
        key = " ".join(original.lower().split())
        if kind == "colour":
            same = {"gray", "grey"} if key in ("gray", "grey") else {key}
            replacement = rng.choice([c for c in COLOURS if c not in same])
        elif kind == "count":
            replacement = rng.choice([c for c in COUNTS if c != key])
        elif kind == "object":
            replacement = OBJECT_SWAPS[key]
        else:
            replacement = SPATIAL_SWAPS[key]
        if original[:1].isupper():
            replacement = replacement[:1].upper() + replacement[1:]
        text = caption[: match.start()] + replacement + caption[match.end():]
        return Perturbation(text, kind, original, replacement)


def triple_samples(triples: Sequence[ProbeTriple], images_root: str | Path | None = None) -> list[Sample]:
    """Samples for the Δ probe: every paraphrase, then every perturbed caption."""
    def image(t: ProbeTriple):
        p = Path(t.image)
        return p if images_root is None or p.is_absolute() else Path(images_root) / p

    paraphrases = [Sample(f"para-{k}", image(t), t.paraphrase, t.refs, t.image_id) for k, t in enumerate(triples)]
    perturbed = [Sample(f"pert-{k}", image(t), t.perturbed, t.refs, t.image_id) for k, t in enumerate(triples)]
    return paraphrases + perturbed


@dataclass
class ProbeRow:
    """One metric under one probe."""

    metric: str
    probe: str  # paraphrase_delta or length_std
    value: float
    ci_low: float
    ci_high: float
    n: int
    detail: str = ""

    def as_dict(self) -> dict:
        return asdict(self)


def paraphrase_delta(
    metric: str,
    paraphrase_scores: Sequence[float],
    perturbed_scores: Sequence[float],
    groups: Sequence,
    *,
    n_bootstrap: int = 1000,
    seed: int = 0,
    level: float = 0.95,
) -> ProbeRow:
    """Δ = mean score(paraphrase) − mean score(perturbed), over triples both scored.

    Positive Δ means the metric notices the perturbation. The detail gives both means and
    the win rate (share of triples whose paraphrase outscored its perturbation; ties half).
    """
    para, pert = np.asarray(paraphrase_scores, float), np.asarray(perturbed_scores, float)
    ok = np.isfinite(para) & np.isfinite(pert)

    def delta(idx: np.ndarray) -> float:
        idx = idx[ok[idx]]
        return float(para[idx].mean() - pert[idx].mean()) if len(idx) else math.nan

    low, high = bootstrap_ci(delta, groups, n_resamples=n_bootstrap, seed=seed, level=level)
    n = int(ok.sum())
    wins = float(np.mean((para[ok] > pert[ok]) + 0.5 * (para[ok] == pert[ok]))) if n else math.nan
    detail = (
        f"paraphrase {para[ok].mean():.4g}, perturbed {pert[ok].mean():.4g}, win rate {wins:.3f}"
        if n
        else "no triple scored"
    )
    return ProbeRow(metric, "paraphrase_delta", delta(np.arange(len(para))), low, high, n, detail)


def length_robustness(
    metric: str,
    lengths: Sequence[str],
    scores: Sequence[float],
    groups: Sequence,
    *,
    order: Sequence[str] = ("short", "medium", "long"),
    n_bootstrap: int = 1000,
    seed: int = 0,
    level: float = 0.95,
) -> ProbeRow:
    """Standard deviation (over lengths, ddof 0) of the metric's mean score per caption length.

    `lengths[i]` names the length category of caption i (one of `order`) and `groups[i]` its
    image; each image has one caption per length, all stating the same facts. Only images
    whose captions of every length were scored count, so every length's mean is over the
    same images. 0 means the metric is indifferent to length. The value is on the metric's
    own scale (the paper reports scores ×100); the detail gives each length's mean and the
    spread relative to the standard deviation of all these captions' scores, which compares
    across metrics of different scales.
    """
    s = np.asarray(scores, float)
    label = np.asarray(lengths, dtype=object)
    g = np.asarray(groups, dtype=object).astype(str)
    unknown = sorted(set(label) - set(order))
    if unknown:
        raise ValueError(f"length labels {unknown} are not among {list(order)}")
    scored = np.isfinite(s)
    complete = {image for image in set(g) if set(label[(g == image) & scored]) >= set(order)}
    counted = scored & np.isin(g, list(complete))

    def means(idx: np.ndarray) -> list[float]:
        idx = idx[counted[idx]]
        return [float(s[idx][label[idx] == name].mean()) for name in order] if len(idx) else []

    def spread(idx: np.ndarray) -> float:
        m = means(idx)
        return float(np.std(m)) if len(m) == len(order) else math.nan

    everything = np.arange(len(s))
    value = spread(everything)
    low, high = bootstrap_ci(spread, g, n_resamples=n_bootstrap, seed=seed, level=level)
    overall = float(np.std(s[counted])) if counted.any() else math.nan
    relative = value / overall if overall > 0 else math.nan
    parts = ", ".join(f"{name} {m:.4g}" for name, m in zip(order, means(everything)))
    detail = f"means {parts or 'none'} over {len(complete)} images; std / overall std {relative:.3f}"
    return ProbeRow(metric, "length_std", value, low, high, int(counted.sum()), detail)


# ----------------------------------------------------------------------------- output

_META_COLUMNS = (
    ("judgments", "judgments"),
    ("metric", "metric"),
    ("statistic", "stat"),
    ("value", "value"),
    ("ci", "95% CI"),
    ("spearman", "spearman"),
    ("pearson", "pearson"),
    ("pair_accuracy", "pair acc"),
    ("n", "n"),
    ("n_images", "images"),
    ("n_failed", "failed"),
)
_PROBE_COLUMNS = (
    ("metric", "metric"),
    ("probe", "probe"),
    ("value", "value"),
    ("ci", "95% CI"),
    ("n", "n"),
    ("detail", "detail"),
)


def _cell(row: dict, key: str) -> str:
    if key == "ci":
        low, high = row["ci_low"], row["ci_high"]
        return "" if math.isnan(low) else f"[{low:.3f}, {high:.3f}]"
    value = row.get(key, "")
    if isinstance(value, float):
        return "" if math.isnan(value) else f"{value:.3f}"
    return str(value)


def _columns(rows: Sequence[MetaRow | ProbeRow]) -> list[tuple[str, str]]:
    if rows and isinstance(rows[0], ProbeRow):
        return list(_PROBE_COLUMNS)
    extra = sorted({k for r in rows for k in r.extra})
    return list(_META_COLUMNS) + [(k, k.replace("_", " ")) for k in extra]


def format_table(rows: Sequence[MetaRow | ProbeRow]) -> str:
    """A plain-text table for the terminal (the CI level is whatever the rows were run with)."""
    if not rows:
        return "(no results)"
    from caprecon.core.tables import format_table

    columns = _columns(rows)
    cells = [[_cell(r.as_dict(), key) for key, _ in columns] for r in rows]
    return format_table([[title for _, title in columns], *cells], rule=True)


def write_markdown(
    rows: Sequence[MetaRow | ProbeRow], path: str | Path, *, title: str = "", notes: Sequence[str] = ()
) -> None:
    """A markdown table, preceded by an optional title and followed by notes."""
    columns = _columns(rows)
    out = [f"# {title}", ""] if title else []
    if rows:
        out.append("| " + " | ".join(t for _, t in columns) + " |")
        out.append("|" + "|".join("---" for _ in columns) + "|")
        for r in rows:
            d = r.as_dict()
            out.append("| " + " | ".join(_cell(d, k).replace("|", "\\|") for k, _ in columns) + " |")
    if notes:
        out += [""] + [f"- {note}" for note in notes]
    Path(path).write_text("\n".join(out) + "\n", encoding="utf-8")


def write_csv(rows: Sequence[MetaRow | ProbeRow], path: str | Path) -> None:
    """Raw values, full precision, one column per field (NaN as an empty cell)."""
    dicts = [r.as_dict() for r in rows]
    fields: list[str] = []
    for d in dicts:
        fields += [k for k in d if k not in fields]
    with Path(path).open("w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=fields)
        writer.writeheader()
        for d in dicts:
            writer.writerow({k: "" if isinstance(v, float) and math.isnan(v) else v for k, v in d.items()})

