"""Scores of judged captions, for `meta`: which metrics, their directions, read from `--scores` files
or computed (reference metrics here, caprecon's own through `score`), and `scores-<file>.csv`."""

from __future__ import annotations

import csv
import logging
import json
import math
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from caprecon.apps.metabench.request import MetaError, ScoreMetric
from caprecon.core.digests import keep_memo_in
from caprecon.core.errors import ConfigError
from caprecon.core.records import read_records
from caprecon.data.images import path_refusal
from caprecon.data.judgments import Judgments
from caprecon.data.loaders.released import ReleasedScoresError, is_released_scores, join_released, read_released_scores
from caprecon.data.samples import Sample
from caprecon.metrics import declared_column
from caprecon.metrics.base import Column, read_columns
from caprecon.metrics.reference import REFERENCE_METRICS, ReferenceMetrics, reference_metric_name
from caprecon.stats.agreement import ASSUMED, LOWER, MetaRow, scores_from_records
from caprecon.stats.seeds import unique_ids

log = logging.getLogger(__name__)

# Columns of scores-<file>.csv that describe the caption rather than score it.
SCORES_INFO_COLUMNS = ("image_id", "caption", "human")

ScoresFile = tuple[Path, bool, list]  # a --scores file: its path, whether a released result file, its rows


class OwnScorer:
    """caprecon's own metrics as `meta` scores them: `caprecon.score` on the judged captions with the
    run settings (a `--config` file and `settings`, RunConfig fields), one metric at a time.
    `columns[name]`: what the metric asked for as `name` declared of the column it scored (its run's
    manifest holds it), filled as it scores."""

    def __init__(self, settings: Mapping[str, Any], config: str | Path | None = None, progress: bool = False):
        self.settings, self.config, self.progress = dict(settings), config, progress
        self.columns: dict[str, Column] = {}

    def __call__(self, name: str, samples: list[Sample]) -> Sequence[float]:
        from caprecon.run.score import score

        results = score(samples, metrics=[name], config=self.config, progress=self.progress, **self.settings)
        column = results.metric_names[0]
        if column in (found := read_columns(results.manifest)):
            self.columns[name] = found[column]
        return scores_from_records(results.records, column, [s.id for s in samples])

    def scorable(self, asked: Iterable[str]) -> set[str]:
        """The names it can score among caprecon's metrics and `asked` (a metric written outside
        caprecon, `module:Class` or an installed entry point, is scorable too)."""
        from caprecon.metrics import METRICS, is_metric

        return {*METRICS, *filter(is_metric, asked)}

    def probe_llm_and_store(self) -> tuple[Any, Any]:
        """The run settings' LLM and the store its probe replies are cached in (the run's cache, or a
        temporary one under --no-cache); both None when no LLM is set. From here on the caller's
        context keeps its memo of file digests where the settings say (`caprecon.meta` runs in its own)."""
        from caprecon.run.config import RunConfig
        from caprecon.run.folder import open_store
        from caprecon.run.roles import Roles

        config = RunConfig.build(file=self.config, **self.settings)
        keep_memo_in(config.memo_folder)
        if config.llm is None:
            return None, None
        return Roles(config).llm, open_store(config, None)


def metric_directions(names: Iterable[str], *declared: Mapping[str, Column]) -> dict[str, bool | None]:
    """Each metric's declared direction (`Column.higher_is_better`), from the first of `declared`
    that holds it (the runs that scored it here, a --scores file's run manifest), else from the
    registry (`declared_column`). A metric nothing declares is left out: `run_meta` reads it
    higher-is-better, as assumed."""
    out = {}
    for name in names:
        column = next((d[name] for d in declared if name in d), None) or declared_column(name)
        if column is not None:
            out[name] = column.higher_is_better
    return out


def direction_notes(rows: Sequence[MetaRow]) -> list[str]:
    """What the table's `better` column means, once per metric read other than as declared higher-is-better."""
    lower = list(dict.fromkeys(r.metric for r in rows if r.direction == LOWER))
    assumed = list(dict.fromkeys(r.metric for r in rows if r.direction == ASSUMED))
    notes = []
    if lower:
        notes.append(f"{', '.join(lower)}: declared lower-is-better, so read negated: a positive tau or an accuracy "
                     "over 0.5 means the metric agrees with people")
    if assumed:
        notes.append(f"{', '.join(assumed)}: no declared direction (not in the registry, nor in a run manifest "
                     "beside the --scores file), assumed higher-is-better")
    return notes


def scores_file_columns(path: Path) -> dict[str, Column]:
    """The column declarations of the run a scores file belongs to: its folder's manifest.json
    (none for a file that is no run's, or a run written before metrics declared their columns)."""
    manifest = Path(path).parent / "manifest.json"
    if not manifest.is_file():
        return {}
    try:
        found = read_columns(json.loads(manifest.read_text(encoding="utf-8")))
    except ValueError as exc:
        raise MetaError(f"{manifest}: not a JSON run manifest ({exc})") from None
    return {reference_metric_name(name) or name: column for name, column in found.items()}


def metric_names(given: Sequence[str] | None) -> list[str]:
    if not given:
        return list(REFERENCE_METRICS)
    names: list[str] = []
    for part in given:
        for name in part.split(","):
            name = name.strip()
            name = reference_metric_name(name) or name
            if name and name not in names:
                names.append(name)
    return names


def score_judgments(
    metrics: Sequence[str],
    samples: list[Sample],
    reference: ReferenceMetrics,
    score_metric: ScoreMetric | None,
    given: dict[str, np.ndarray],
    notes: list[str] | None = None,
) -> dict[str, np.ndarray]:
    """Scores per metric, aligned with `samples`, in the order metrics were asked for.

    A sample whose row names no image is scored by the reference metrics (text only) and left
    out of the others as a row error (NaN, counted as failed), each such row named in `notes`."""
    ids = [s.id for s in samples]
    refused = {i: why for i, s in enumerate(samples) if (why := path_refusal(s))}
    with_image = [i for i, s in enumerate(samples) if s.image is not None and i not in refused]
    if score_metric is None and (missing := [m for m in metrics if m not in given and m not in reference.names
                                             and m not in reference.skipped]):
        raise MetaError(f"metric {missing[0]!r} is neither a reference metric nor in the --scores file")
    wanted_reference = [m for m in metrics if m in reference.names and m not in given]
    records = reference.score(samples) if wanted_reference else []
    scores: dict[str, np.ndarray] = {}
    for name in metrics:
        if name in given:
            scores[name] = given[name]
        elif name in reference.names:
            scores[name] = scores_from_records(records, name, ids)
        elif name in reference.skipped:
            continue
        elif score_metric is not None:
            scored = [samples[i] for i in with_image]
            values = score_metric(name, scored) if scored else []
            if len(values) != len(scored):
                raise MetaError(f"metric {name!r} returned {len(values)} scores for {len(scored)} samples")
            scores[name] = np.full(len(samples), math.nan)
            scores[name][with_image] = [math.nan if v is None else float(v) for v in values]
            rows = [str(s.meta.get("judgment_row", s.id)) for s in samples if s.image is None]
            if rows and notes is not None:
                notes.append(f"{name}: {len(rows)} row(s) name no image, left out as row errors "
                             f"(row {', '.join(rows[:5])}{', ...' if len(rows) > 5 else ''})")
            if refused:  # never opened: their files are not the benchmark's to read
                first, why = next(iter(refused.items()))
                said = (f"{name}: {len(refused)} row(s) refused, left out as row errors (row "
                        f"{samples[first].meta.get('judgment_row', samples[first].id)}: {why})")
                log.warning("%s", said)  # at once, on stderr: a file that reaches outside its folder is news
                if notes is not None:
                    notes.append(said)
        else:
            raise MetaError(f"metric {name!r} is neither a reference metric nor in the --scores file")
    return scores


def read_scores(path: Path, samples: Sequence[Sample], records: list[dict] | None = None) -> dict[str, np.ndarray]:
    """Every numeric column of a scores file, aligned with `samples` by `id` (`records`: the
    file's rows, when already read)."""
    records = score_records(path) if records is None else records
    if not records or "id" not in records[0]:
        raise MetaError(f"{path}: a scores file needs an `id` column matching the judgments' sample ids")
    try:  # a caption scored twice would be read as one of its rows, silently
        unique_ids(records, f"--scores {path}")
    except ConfigError as exc:
        raise MetaError(str(exc)) from None
    ids = [s.id for s in samples]
    missing = set(ids) - {str(r["id"]) for r in records}
    if missing:
        raise MetaError(f"{path}: no scores for {len(missing)} samples (e.g. id {sorted(missing)[0]!r})")
    # caprecon run folders' scores.jsonl omit metric fields on failed rows: take every key seen
    keys = dict.fromkeys(k for r in records for k in r)
    columns = [c for c in keys if c not in ("id", "error", *SCORES_INFO_COLUMNS)]
    found = {}
    for column in columns:
        values = scores_from_records(records, column, ids)
        if np.isfinite(values).any():
            found[reference_metric_name(column) or column] = values
    return found


def score_records(path: Path) -> list[dict]:
    if not path.is_file():
        raise MetaError(f"scores file not found: {path}")
    return [record for _, record in read_records(path, MetaError)]


def write_scores(judgments: Judgments, samples: Sequence[Sample], scores: dict[str, np.ndarray], path: Path) -> None:
    human = []
    for item in judgments.items:
        if judgments.pairwise:
            human += [item.preference, 1.0 - item.preference]
        else:
            human.append(float(np.mean(item.ratings)))
    with path.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(["id", *SCORES_INFO_COLUMNS, *scores])
        for k, s in enumerate(samples):
            values = ["" if math.isnan(v[k]) else repr(float(v[k])) for v in scores.values()]
            writer.writerow([s.id, s.image_id, s.caption, human[k], *values])


def benchmark_scores(files: Sequence[ScoresFile], samples: Sequence[Sample], notes: list[str]) -> dict[str, np.ndarray]:
    """Per-caption scores from `--scores` files (read by `scores_file`), aligned with `samples`:
    caprecon's CSV/JSONL by `id`, or result files as metric authors release them
    (`caprecon.data.loaders.released`), joined by image and caption; several files add up (FLEUR
    releases Pascal-50S as one file per category). A benchmark with reference draws aligns the
    same files with each draw's samples."""
    found: dict[str, np.ndarray] = {}
    released = []
    for path, is_released, rows in files:
        if is_released:
            released += rows
        else:
            found.update(read_scores(path, samples, rows))
    if released:
        joined, missing = join_released(released, [str(s.image) for s in samples], [s.caption for s in samples])
        if missing == len(samples):
            raise MetaError(f"--scores {', '.join(str(path) for path, _, _ in files)}: no caption of the benchmark is in the released "
                            "file(s) (joined by image file name and caption)")
        if missing:
            notes.append(f"--scores: {missing} of {len(samples)} captions have no released score and are left out")
        found.update(joined)
    return found


def scores_file(path: Path) -> ScoresFile:
    """A released file's scores, else the records of caprecon's own scores file."""
    try:  # telling a released file apart reads it too, so a file that is not UTF-8 fails there
        if is_released_scores(path):
            return path, True, read_released_scores(path)
    except ReleasedScoresError as exc:
        raise MetaError(str(exc)) from None
    return path, False, score_records(path)


