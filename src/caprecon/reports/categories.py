"""Per-category comparison of captioners: the table and the radar chart papers show.

The Caption Turing Test writes, on every scored row, its accuracy per question category
(`turing/<category>`), the number of questions behind it (`turing_n/<category>`) and the
same accuracy on the original image (`turing_upper/<category>`). This module pools those
rows per captioner:

    table = category_table(records)           # or a run's scores.jsonl
    print(table.to_text())
    write_report(records, "runs/a/report")    # categories.md, categories.csv, radar.png

A cell is correct answers / questions, summed over all of a captioner's rows, so an image
with many spatial questions weighs more in "spatial" than one with a single question. The
upper bound answers the bank on the original image, which does not depend on the caption:
each image enters it once, however many captioners described it.

For the `halluc` metric the cells are soft precision per claim type (mean P(yes) over the
claims), and `categories.md` adds coverage by category and, per captioner, precision and
coverage side by side with F and how many captions hallucinate.
"""

from __future__ import annotations

import collections
import csv
import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from caprecon.core.errors import ConfigError
from caprecon.core.records import read_jsonl
from caprecon.core.tables import format_table
from caprecon.metrics.categories import CategoryTally

UPPER = "upper bound"
OVER_QUESTIONS = "mean over questions"
OVER_CATEGORIES = "mean over categories"
ALL = "all"

# the paper's order, so radar charts from different runs put each category in the same place
PAPER_ORDER = ("perception", "scene", "spatial", "temporal", "comparison", "commonsense", "math", "chart", "ocr",
               "grounding", "pose", "fine-grained", "anomaly", "multimodal", "explanation")


@dataclass
class CategoryTable:
    """Accuracy per captioner and category, as fractions in [0, 1] (None: no question).

    `rows[name][column]` holds every category plus the two overall columns, for each
    captioner and, when the rows carry it, the upper bound. `questions[category]` is the
    size of the question bank per category over the distinct images.
    """

    metric: str
    captioners: list[str]
    categories: list[str]
    rows: dict[str, dict[str, float | None]]
    questions: dict[str, int] = field(default_factory=dict)
    appendix: str = ""  # more Markdown for categories.md (halluc: coverage and the per-captioner pair)

    @property
    def columns(self) -> list[str]:
        return [*self.categories, OVER_QUESTIONS, OVER_CATEGORIES]

    @property
    def row_names(self) -> list[str]:
        return [*self.captioners, *([UPPER] if UPPER in self.rows else [])]

    def _grid(self) -> list[list[str]]:
        header = ["captioner", *self.columns]
        return [header, *([name, *(_pct(self.rows[name][c]) for c in self.columns)] for name in self.row_names)]

    def to_markdown(self) -> str:
        header, *body = self._grid()
        return _markdown_table(header, body)

    def to_csv(self, path: str | Path) -> Path:
        path = Path(path)
        with path.open("w", newline="", encoding="utf-8") as f:
            csv.writer(f).writerows(self._grid())
        return path

    def to_text(self) -> str:
        """Categories down, captioners across: 15 categories do not fit across a terminal."""
        names = self.row_names
        rows = [["category", *names, "questions"]]
        for column in self.columns:
            count = self.questions.get(column, sum(self.questions.values()) if column == OVER_QUESTIONS else None)
            rows.append([column, *(_pct(self.rows[n][column]) for n in names), "" if count is None else str(count)])
        return format_table(rows, right=range(1, len(rows[0])))


def _markdown_table(header: Sequence[str], body: Iterable[Sequence[str]]) -> str:
    """The first column left-aligned (names), the others right-aligned (numbers)."""
    rule = "|" + "|".join([":---"] + ["---:"] * (len(header) - 1)) + "|"
    return "\n".join([_markdown_row(header), rule, *map(_markdown_row, body)]) + "\n"


def _markdown_row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"


def _pct(value: float | None) -> str:
    return "" if value is None else f"{100 * value:.2f}"


def _pool(tally: CategoryTally, record: Mapping[str, Any], metric: str, score_key: str) -> None:
    """Add a row's correct answers and questions: per category where the row has them,
    else only its overall accuracy."""
    categories = list(_per_category(record, score_key, metric))
    for category, accuracy, n in categories:
        tally.add(category, _share(record, f"{score_key}/{category}", accuracy) * n, n)
    if not categories:
        accuracy, n = _number(record.get(score_key)), _count(record.get(f"{metric}_n"))
        if accuracy is not None and n:
            tally.add(None, _share(record, score_key, accuracy) * n, n)


def _share(record: Mapping[str, Any], key: str, value: float) -> float:
    """A cell pools shares of questions (accuracies, P(yes); a cosine for clip-image): a value
    beyond 1 in size is no such share, and pooling it would print inf or nonsense percentages."""
    if not -1.0 <= value <= 1.0:
        raise ConfigError(f"row {record.get('id', '?')!r}: {key} is {value!r}; the per-category table pools "
                          "accuracies and probabilities (0 to 1) or cosines (-1 to 1)")
    return value


def _row(tally: CategoryTally, categories: Sequence[str]) -> dict[str, float | None]:
    cells = {c: tally.accuracy(c) for c in categories}
    cells[OVER_QUESTIONS] = tally.overall
    cells[OVER_CATEGORIES] = tally.mean_over_categories(categories)
    return cells


def _per_category(record: Mapping[str, Any], score_key: str, metric: str) -> Iterable[tuple[str, float, float]]:
    prefix = score_key + "/"
    for key, value in record.items():
        if not key.startswith(prefix):
            continue
        category = key[len(prefix):]
        accuracy, n = _number(value), _count(record.get(f"{metric}_n/{category}"))
        if accuracy is not None and n:
            yield category, accuracy, n


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        return None
    return float(value)


def _count(value: Any) -> float:
    # a row written without counts still answered at least one question per category it reports
    number = _number(value)
    return 1.0 if value is None else (number or 0.0)


def _group(record: Mapping[str, Any], group_by: Sequence[str]) -> str:
    for key in group_by:
        if record.get(key) not in (None, ""):
            return str(record[key])
    return ALL


def _image(record: Mapping[str, Any]) -> str:
    for key in ("image_id", "image", "id"):
        if record.get(key) not in (None, ""):
            return str(record[key])
    return str(id(record))  # nothing names the image: the row can only stand for itself


def _order(categories: Iterable[str]) -> list[str]:
    def key(name: str) -> tuple[int, str]:
        canonical = name.lower().replace("_", "-").replace(" ", "-")
        return (PAPER_ORDER.index(canonical) if canonical in PAPER_ORDER else len(PAPER_ORDER), name)

    return sorted(set(categories), key=key)


def load_records(source: str | Path | Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """Records as given, or read from a run's `scores.jsonl` (or the run folder holding it)."""
    if not isinstance(source, (str, Path)):
        return list(source)
    path = Path(source)
    if path.is_dir():
        path = path / "scores.jsonl"
    return [record for _, record in read_jsonl(path, ConfigError, keep_surrogates=True)]


def category_table(records: str | Path | Iterable[Mapping[str, Any]], metric: str = "turing",
                   group_by: str | Sequence[str] = ("captioner", "model")) -> CategoryTable:
    """Pool the rows per captioner into accuracy per category, plus the upper bound.

    Rows without a `<metric>` score (it failed there, or was not asked) are left out. The captioner is
    the first non-empty field of `group_by`; rows with none of them form one group, "all".
    """
    group_by = (group_by,) if isinstance(group_by, str) else tuple(group_by)
    pools: dict[str, CategoryTally] = {}
    upper = CategoryTally()
    bank: dict[str, float] = {}
    seen_images: set[str] = set()
    records = load_records(records)
    for record in records:
        if not isinstance(record.get(metric), (int, float)):  # an error in another metric does not matter here
            continue
        _pool(pools.setdefault(_group(record, group_by), CategoryTally()), record, metric, metric)
        image = _image(record)
        if image in seen_images:
            continue
        seen_images.add(image)
        _pool(upper, record, metric, f"{metric}_upper")
        for category, _, n in _per_category(record, metric, metric):
            bank[category] = bank.get(category, 0.0) + n
    if not pools:
        raise ValueError(f"no scored rows carry the {metric!r} metric")
    categories = _order(c for pool in pools.values() for c in pool.asked)
    rows = {name: _row(pool, categories) for name, pool in pools.items()}
    if upper.total_asked:
        rows[UPPER] = _row(upper, categories)
    table = CategoryTable(metric=metric, captioners=list(pools), categories=categories, rows=rows,
                          questions={c: int(round(bank[c])) for c in categories if c in bank})
    if metric == "halluc":
        table.appendix = _halluc_appendix(records, table, group_by)
    return table


def _halluc_appendix(records: Iterable[Mapping[str, Any]], precision: CategoryTable, group_by: Sequence[str]) -> str:
    """Coverage by category beside precision by claim type, and per captioner the pair: pooled
    over claims, F as the mean of the rows' F (their beta), how many captions hallucinate."""
    parts = []
    try:
        coverage = category_table(records, metric="halluc_coverage", group_by=group_by)
    except ValueError:  # no row has coverage (no generator): precision only
        coverage = None
    if coverage is not None:
        parts += ["\n## coverage by claim type or question category (halluc_coverage)\n\n", coverage.to_markdown()]
    per: dict[str, dict[str, list[float]]] = collections.defaultdict(lambda: collections.defaultdict(list))
    for record in records:
        if _number(record.get("halluc")) is None:
            continue
        cells = per[_group(record, group_by)]
        n = _count(record.get("halluc_n"))
        cells["claims"].append(n)
        cells["unsupported"].append((_number(record.get("halluc_rate")) or 0.0) * n)
        cells["flagged"].append(float(bool(record.get("halluc_unsupported"))))
        if _number(record.get("halluc_f")) is not None:
            cells["f"].append(float(record["halluc_f"]))
    header = ["captioner", "precision", "coverage", "F", "unsupported claims", "captions hallucinating"]
    body = []
    for name in precision.captioners:
        cells = per[name]  # a captioner with no halluc score: empty cells
        claims = sum(cells["claims"])
        body.append([name, _pct(precision.rows[name][OVER_QUESTIONS]),
                     _pct(coverage.rows[name][OVER_QUESTIONS]) if coverage and name in coverage.rows else "",
                     _pct(sum(cells["f"]) / len(cells["f"])) if cells["f"] else "",
                     f"{_pct(sum(cells['unsupported']) / claims) if claims else ''} of {int(claims)}",
                     f"{int(sum(cells['flagged']))} of {len(cells['flagged'])}"])
    parts += ["\n## per captioner: precision and coverage side by side\n\n", _markdown_table(header, body)]
    return "".join(parts)


def radar_chart(table: CategoryTable, path: str | Path, title: str | None = None) -> Path:
    """One polygon per captioner around the categories, the upper bound dashed, as a PNG.
    The PNG carries a hash of what it draws: a chart already drawn from the same table and
    title is kept (drawing one takes matplotlib's import and a second of rendering)."""
    path = Path(path)
    drawn = _radar_key(table, title)
    if _png_key(path) == drawn:
        return path
    try:
        from matplotlib import colormaps
        from matplotlib.figure import Figure
    except ImportError as exc:  # matplotlib is the optional `report` extra
        raise ImportError("radar charts need matplotlib: pip install 'caprecon[report]'") from exc
    if not table.categories:
        raise ValueError("the table has no categories to draw")

    categories = table.categories
    angles = np.linspace(0.0, 2 * np.pi, len(categories), endpoint=False)
    closed = np.append(angles, angles[0])

    def values(name: str) -> np.ndarray:
        cells = [table.rows[name][c] for c in categories]
        points = np.array([np.nan if v is None else 100 * v for v in cells])
        return np.append(points, points[0])

    # a Figure without pyplot renders through Agg and leaves the process's backend alone
    fig = Figure(figsize=(10, 7.5), dpi=150)
    ax = fig.add_axes((0.06, 0.08, 0.58, 0.78), projection="polar")
    ax.set_theta_offset(np.pi / 2)
    ax.set_theta_direction(-1)
    ax.set_ylim(0, 100)
    # the scale sits halfway between the first two spokes, where no polygon vertex or label is
    ax.set_rgrids([20, 40, 60, 80, 100], labels=["20", "40", "60", "80", "100%"], angle=180 / len(categories),
                  fontsize=7, color="0.45")
    ax.set_xticks(angles)
    ax.set_xticklabels(categories, fontsize=9)
    ax.tick_params(axis="x", pad=6)
    for label, angle in zip(ax.get_xticklabels(), angles):
        # anchor each label on its inner side so long names grow away from the circle, not across it
        side = np.sin(angle)
        label.set_horizontalalignment("center" if abs(side) < 0.1 else "left" if side > 0 else "right")
    ax.grid(color="0.82", linewidth=0.7)
    ax.spines["polar"].set_color("0.7")

    # tab20's strong shades first, so the first ten captioners get the same colours as with tab10
    palette = [colormaps["tab20"](i) for i in [*range(0, 20, 2), *range(1, 20, 2)]]
    fill = len(table.captioners) <= 6  # beyond that, stacked tints turn the middle grey
    markers = "osD^vP*Xph<>"
    for i, name in enumerate(table.captioners):
        color = palette[i % len(palette)]
        points = values(name)
        ax.plot(closed, points, color=color, linewidth=1.6, marker=markers[i % len(markers)], markersize=3.5,
                clip_on=False, label=_legend_label(table, name))
        if fill:
            known = ~np.isnan(points)
            ax.fill(closed[known], points[known], color=color, alpha=0.07)
    if UPPER in table.rows:
        ax.plot(closed, values(UPPER), color="black", linewidth=1.6, linestyle=(0, (5, 3)), clip_on=False,
                label=_legend_label(table, UPPER))

    fig.legend(*ax.get_legend_handles_labels(), loc="center left", bbox_to_anchor=(0.76, 0.5), frameon=False,
               fontsize=9, title=table.metric + ": mean over questions", title_fontsize=9)
    if title:
        ax.set_title(title, fontsize=13, pad=42)
    fig.savefig(path, bbox_inches="tight", facecolor="white", metadata={RADAR_KEY: drawn})
    return path


RADAR_KEY = "caprecon-radar"  # the PNG text chunk holding `_radar_key`
RADAR_REVISION = 1  # bump when the drawing changes, so charts drawn before are drawn again


def _radar_key(table: CategoryTable, title: str | None) -> str:
    what = {"revision": RADAR_REVISION, "metric": table.metric, "captioners": table.captioners,
            "categories": table.categories, "rows": table.rows, "title": title}
    return hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()


def _png_key(path: Path) -> str | None:
    """The radar key a PNG carries (read from its header chunks, the pixels left alone)."""
    try:
        from PIL import Image

        with Image.open(path) as image:
            return image.info.get(RADAR_KEY)
    except (OSError, ValueError):
        return None


def _legend_label(table: CategoryTable, name: str) -> str:
    # the overall score beside each name spares the reader averaging a polygon by eye
    overall = table.rows[name][OVER_QUESTIONS]
    return name if overall is None else f"{name}  ({_pct(overall)})"


def write_report(records: CategoryTable | str | Path | Iterable[Mapping[str, Any]], out_dir: str | Path,
                 metric: str = "turing") -> dict[str, Path]:
    """Write `categories.md`, `categories.csv` and `radar.png` into `out_dir` (from records,
    a run folder, or a table already built)."""
    table = records if isinstance(records, CategoryTable) else category_table(records, metric=metric)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    markdown = out_dir / "categories.md"
    title = "## precision by claim type (halluc)\n\n" if table.appendix else ""
    markdown.write_text(title + table.to_markdown() + table.appendix, encoding="utf-8")
    return {
        "markdown": markdown,
        "csv": table.to_csv(out_dir / "categories.csv"),
        "radar": radar_chart(table, out_dir / "radar.png", title=f"{table.metric}: " + (
            "soft precision per claim type" if table.metric == "halluc" else "accuracy per category")),
    }
