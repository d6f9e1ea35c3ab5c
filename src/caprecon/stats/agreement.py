"""Meta-evaluation: how well a caption metric agrees with people.

Everything here works on per-sample scores that were computed elsewhere (any caprecon
metric, the reference metrics, or numbers from a file), aligned with
`Judgments.samples()`. A score that is NaN marks a caption the metric could not score;
that caption is left out of the statistics and counted in `n_failed`.

Rating judgments
    Kendall τ (τ_c for Flickr8k-Expert, τ_b otherwise, with its CI), Spearman and Pearson
    between metric scores and human scores, and τ_b and τ_c side by side (the ReconScore
    paper reports both). Each human judgment is its own observation: a Flickr8k-Expert
    caption rated by three experts contributes three (score, rating) pairs, all sharing
    the caption's score. Pairwise accuracy over the captions of one image comes beside
    them. Ratings where smaller is better (ranks, 1 = best) are declared with
    `human_order="ascending"` and turned around, and so is a metric whose column is declared
    lower-is-better (`higher_is_better`), so a positive τ always means agreement.
Pair judgments
    How often the metric orders the two captions of a pair the way people did.
Confidence intervals
    The percentile bootstrap of `caprecon.stats.bootstrap`, resampling whole images (all
    judgments of an image stay together, since they are not independent of one another).
Comparing two metrics
    `compare_metrics`: the paired bootstrap of the two metrics' agreement on the same
    resampled images, its interval and p-value.
"""

from __future__ import annotations

import csv
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Protocol, Sequence

import numpy as np

from caprecon.core.errors import ConfigError
from caprecon.data.judgments import Judgment, Judgments, PairJudgment
from caprecon.stats.bootstrap import bootstrap_ratio, bootstrap_tau, paired_bootstrap
from caprecon.stats.correlation import kendall_tau, kendall_taus, pairwise_accuracy, pearson, spearman, within_image_pairs


HIGHER, LOWER = "higher", "lower"
ASSUMED = "higher (assumed)"  # nothing declared the column's direction: read as today, higher is better


def direction_of(name: str, higher_is_better: Mapping[str, bool | None]) -> str:
    """How `run_meta` reads metric `name`'s scores: as declared (`higher_is_better[name]`), else
    assumed higher-is-better; a column declared with no better direction is read as assumed too."""
    declared = higher_is_better.get(name)
    return ASSUMED if declared is None else HIGHER if declared else LOWER


def oriented(scores: Sequence[float], direction: str) -> np.ndarray:
    """Scores turned so that larger is better: a lower-is-better metric's are negated."""
    s = np.asarray(scores, float)
    return -s if direction == LOWER else s


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
    tau_b: float = math.nan  # rating judgments: both variants, whichever `statistic` is
    tau_c: float = math.nan
    direction: str = HIGHER  # how run_meta read the metric's scores: HIGHER, LOWER or ASSUMED (higher)
    extra: dict[str, float] = field(default_factory=dict)  # e.g. accuracy per Pascal-50S category

    def as_dict(self) -> dict:
        row = asdict(self)
        row.update(row.pop("extra"))
        return row

    @classmethod
    def table_columns(cls, rows: Sequence[MetaRow]) -> list[tuple[str, str]]:
        extra = sorted({k for r in rows for k in r.extra})
        columns = list(META_COLUMNS)
        if any(not math.isnan(r.tau_b) for r in rows):
            at = columns.index(("ci", "95% CI")) + 1
            columns[at:at] = [("tau_b", "tau_b"), ("tau_c", "tau_c")]
        if any(r.direction != HIGHER for r in rows):  # a table of higher-is-better metrics only has no need of it
            columns.insert(columns.index(("metric", "metric")) + 1, ("direction", "better"))
        return columns + [(k, k.replace("_", " ")) for k in extra]


def scores_from_records(records: Sequence[Mapping], field_name: str, ids: Sequence[str]) -> np.ndarray:
    """One metric field of per-sample records, aligned with `ids` (NaN where missing or failed).

    Records are matched on `id`; a record carrying `error`, or lacking the field, gives NaN.
    """
    by_id = {str(r.get("id")): r for r in records}
    out = np.full(len(ids), math.nan)
    odd: list = []  # values that are no number ("high"): in a column of numbers, refused, not read as missing
    native = parsed = 0
    for k, sample_id in enumerate(ids):
        record = by_id.get(str(sample_id))
        if record is None or record.get("error"):
            continue
        value = record.get(field_name)
        try:
            out[k] = float(value)
        except (TypeError, ValueError):
            if value is not None and not (isinstance(value, str) and not value.strip()):
                odd.append((sample_id, value))
            continue
        parsed += 1
        native += isinstance(value, (int, float))
    # a column of numbers: JSON numbers, or text that mostly reads as numbers (a CSV's); a text column
    # (captioner, ...) is no score at all and stays NaN
    if odd and (native or parsed > len(odd)):
        sample_id, value = odd[0]
        raise ConfigError(f"row {str(sample_id)!r}: {field_name} is {str(value)[:40]!r}, not a number (the other "
                          "rows' are numbers; leave it empty or null where there is no score)")
    return out


HUMAN_ORDERS = ("descending", "ascending")


def check_human_order(judgments: Judgments, human_order: str) -> None:
    if human_order not in HUMAN_ORDERS:
        raise ValueError(f"human order must be one of {', '.join(HUMAN_ORDERS)}, not {human_order!r}")
    if judgments.pairwise and human_order != "descending":
        raise ValueError(f"{judgments.name} holds pair preferences, which say which caption won: "
                         f"a human order applies to ratings and ranks only")


def human_ratings(judgments: Judgments, human_order: str = "descending") -> np.ndarray:
    """Every human rating of rating judgments, one per judgment in item order, oriented so
    that larger is better: `human_order="ascending"` declares ratings where smaller is better
    (ranks, 1 = best), which are negated."""
    check_human_order(judgments, human_order)
    sign = -1.0 if human_order == "ascending" else 1.0
    return sign * np.array([r for it in judgments.items for r in it.ratings], float)


def run_meta(
    judgments: Judgments,
    scores_by_metric: Mapping[str, Sequence[float]],
    *,
    tau_variant: str | None = None,
    human_order: str = "descending",
    n_bootstrap: int = 1000,
    seed: int = 0,
    level: float = 0.95,
    tie_credit: float = 0.5,
    higher_is_better: Mapping[str, bool | None] | None = None,
) -> list[MetaRow]:
    """One `MetaRow` per metric: its agreement with `judgments`, with a bootstrap CI.

    `scores_by_metric[name]` holds one score per sample of `judgments.samples()`, in that
    order (NaN for a caption the metric failed on). Rating judgments are summarised by
    Kendall τ (`tau_variant`, default: the file's protocol, τ_c for Flickr8k-Expert and
    τ_b otherwise), oriented by `human_order`; pair judgments by pairwise accuracy.
    `higher_is_better[name]` is the metric's declared direction (its `Column`'s): a lower-is-better
    metric's scores are negated first, so its τ is positive when it agrees with people; a metric
    not in it is assumed higher-is-better, and its row says so (`direction`).
    """
    check_human_order(judgments, human_order)
    expected = len(judgments.items) * (2 if judgments.pairwise else 1)
    rows = []
    for name, raw in scores_by_metric.items():
        direction = direction_of(name, higher_is_better or {})
        scores = oriented(raw, direction)
        if scores.shape != (expected,):
            raise ValueError(f"metric {name!r}: {scores.size} scores for {expected} samples of {judgments.name}")
        if judgments.pairwise:
            row = _pairs_row(judgments, name, scores, n_bootstrap, seed, level, tie_credit)
        else:
            row = _ratings_row(judgments, name, scores, tau_variant, human_order, n_bootstrap, seed, level, tie_credit)
        row.direction = direction
        rows.append(row)
    return rows


def _ratings_row(judgments, name, scores, tau_variant, human_order, n_bootstrap, seed, level, tie_credit) -> MetaRow:
    variant = tau_variant or judgments.tau_variant
    items: list[Judgment] = judgments.items
    # One row per human judgment, all pointing at their caption's score.
    item_of = np.array([k for k, it in enumerate(items) for _ in it.ratings])
    human = human_ratings(judgments, human_order)
    groups = np.array([it.image_id for it in items for _ in it.ratings], dtype=object)
    x = scores[item_of]
    ok = np.isfinite(x)

    low, high = bootstrap_tau(x, human, groups, variant=variant, n_resamples=n_bootstrap, seed=seed, level=level)
    scored = np.isfinite(scores)
    item_groups = [it.image_id for k, it in enumerate(items) if scored[k]]
    ends = np.cumsum([len(it.ratings) for it in items])  # item k's ratings are human[ends[k] - n_k : ends[k]]
    item_human = [float(np.mean(human[end - len(it.ratings) : end]))
                  for it, end, counted in zip(items, ends, scored) if counted]
    i, j, pref = within_image_pairs(item_groups, item_human)
    kept = scores[scored]
    taus = kendall_taus(x[ok], human[ok])
    return MetaRow(
        judgments=judgments.name,
        metric=name,
        statistic=f"tau_{variant}",
        value=taus[variant],
        ci_low=low,
        ci_high=high,
        n=int(ok.sum()),
        n_images=len(set(groups[ok])),
        n_failed=int((~scored).sum()),
        spearman=spearman(x[ok], human[ok]),
        pearson=pearson(x[ok], human[ok]),
        pair_accuracy=pairwise_accuracy(kept[i], kept[j], pref, tie_credit=tie_credit).accuracy,
        tau_b=taus["b"],
        tau_c=taus["c"],
    )


def _pairs_row(judgments, name, scores, n_bootstrap, seed, level, tie_credit) -> MetaRow:
    items: list[PairJudgment] = judgments.items
    _, accuracy, groups = agreement_statistic(judgments, scores, tie_credit=tie_credit)
    a, b = scores[0::2], scores[1::2]
    pref = np.array([it.preference for it in items], float)
    ok = np.isfinite(a) & np.isfinite(b)
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


# ----------------------------------------------------------------------------- two metrics compared


@dataclass
class Comparison:
    metric_a: str
    metric_b: str
    statistic: str
    value_a: float
    value_b: float
    difference: float  # a - b
    ci_low: float
    ci_high: float
    p_value: float
    n_resamples: int
    level: float = 0.95

    def as_dict(self) -> dict:
        return asdict(self)


def agreement_statistic(
    judgments: Judgments, scores: Sequence[float], *, tau_variant: str | None = None, tie_credit: float = 0.5,
    human_order: str = "descending",
) -> tuple[str, Callable[[np.ndarray], float], np.ndarray]:
    """(statistic name, statistic of observation indices, image of each observation).

    Observations are human judgments for ratings (a caption rated three times is three)
    and pairs for pair judgments, as in `run_meta`.
    """
    check_human_order(judgments, human_order)
    s = np.asarray(scores, float)
    if judgments.pairwise:
        a, b = s[0::2], s[1::2]
        pref = np.array([it.preference for it in judgments.items], float)
        ok = np.isfinite(a) & np.isfinite(b)

        def accuracy(idx: np.ndarray) -> float:
            idx = idx[ok[idx]]
            return pairwise_accuracy(a[idx], b[idx], pref[idx], tie_credit=tie_credit).accuracy

        return "accuracy", accuracy, np.array([it.image_id for it in judgments.items], dtype=object)
    variant = tau_variant or judgments.tau_variant
    item_of = np.array([k for k, it in enumerate(judgments.items) for _ in it.ratings])
    human = human_ratings(judgments, human_order)
    x = s[item_of]
    ok = np.isfinite(x)

    def tau(idx: np.ndarray) -> float:
        idx = idx[ok[idx]]
        return kendall_tau(x[idx], human[idx], variant)

    groups = np.array([it.image_id for it in judgments.items for _ in it.ratings], dtype=object)
    return f"tau_{variant}", tau, groups


def compare_metrics(
    judgments: Judgments,
    name_a: str,
    scores_a: Sequence[float],
    name_b: str,
    scores_b: Sequence[float],
    *,
    tau_variant: str | None = None,
    n_resamples: int = 1000,
    seed: int = 0,
    level: float = 0.95,
    tie_credit: float = 0.5,
    human_order: str = "descending",
    higher_is_better: Mapping[str, bool | None] | None = None,
) -> Comparison:
    """Is metric A's agreement with people better than metric B's? A paired bootstrap over
    images: both metrics' statistics on the same resampled judgments, each metric's scores
    oriented by its declared direction as in `run_meta`."""
    declared = higher_is_better or {}
    statistic, stat_a, groups = agreement_statistic(judgments, oriented(scores_a, direction_of(name_a, declared)),
                                                    tau_variant=tau_variant, tie_credit=tie_credit,
                                                    human_order=human_order)
    _, stat_b, _ = agreement_statistic(judgments, oriented(scores_b, direction_of(name_b, declared)),
                                       tau_variant=tau_variant, tie_credit=tie_credit, human_order=human_order)
    d = paired_bootstrap(stat_a, stat_b, groups, n_resamples=n_resamples, seed=seed, level=level)
    return Comparison(name_a, name_b, statistic, d.value_a, d.value_b, d.difference, d.ci_low, d.ci_high, d.p_value,
                      d.n_resamples, level)


def format_comparison(c: Comparison) -> str:
    head = f"{c.metric_a} vs {c.metric_b} ({c.statistic}): {c.value_a:.4f} - {c.value_b:.4f} = {c.difference:+.4f}"
    if not c.n_resamples:
        return (f"{head}; {100 * c.level:g}% CI and p-value not computed (no bootstrap resample with a defined "
                "difference: --bootstrap 0 draws none)")
    # No resample crossing zero bounds p by the resolution of the bootstrap, not by 0.
    p = f"p < {1 / c.n_resamples:.2g}" if c.p_value == 0 else f"p = {c.p_value:.4g}"
    return (f"{head}, {100 * c.level:g}% CI [{c.ci_low:.4f}, {c.ci_high:.4f}], {p} "
            f"(paired bootstrap over images, {c.n_resamples} resamples)")


# ----------------------------------------------------------------------------- output

META_COLUMNS = (
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


class TableRow(Protocol):
    """A row the writers below can write: `MetaRow` here, `ProbeRow` of the probes."""

    ci_low: float
    ci_high: float

    def as_dict(self) -> dict: ...

    @classmethod
    def table_columns(cls, rows: Sequence) -> list[tuple[str, str]]:
        """(field, title) of each column, for these rows of this class."""
        ...


def _cell(row: dict, key: str) -> str:
    if key == "ci":
        low, high = row["ci_low"], row["ci_high"]
        return "" if math.isnan(low) else f"[{low:.3f}, {high:.3f}]"
    value = row.get(key, "")
    if isinstance(value, float):
        return "" if math.isnan(value) else f"{value:.3f}"
    return str(value)


def _columns(rows: Sequence[TableRow]) -> list[tuple[str, str]]:
    return type(rows[0]).table_columns(rows) if rows else []


def format_table(rows: Sequence[TableRow]) -> str:
    """A plain-text table for the terminal (the CI level is whatever the rows were run with)."""
    if not rows:
        return "(no results)"
    from caprecon.core.tables import format_table

    columns = _columns(rows)
    cells = [[_cell(r.as_dict(), key) for key, _ in columns] for r in rows]
    return format_table([[title for _, title in columns], *cells], rule=True)


def write_markdown(
    rows: Sequence[TableRow], path: str | Path, *, title: str = "", notes: Sequence[str] = ()
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


def write_csv(rows: Sequence[TableRow], path: str | Path) -> None:
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

