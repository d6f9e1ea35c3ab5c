"""The local executor: stream samples through the metrics in batches.

It owns the batch loop, the progress bar, row-level errors and incremental output:
each finished batch is appended to `scores.jsonl` at once, and every model result is
already in the store, so a crash loses at most the batch in flight and a re-run picks
everything else up from the cache.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Iterable, Sequence

from tqdm.auto import tqdm

from ..metrics.base import Context, Metric
from ..models.common import ModelNotFoundError
from ..redaction import redact_text
from ..samples import Sample, SampleError, open_image
from ..store import StoreError

log = logging.getLogger(__name__)

# errors that mean the configuration is wrong, not the row: stop instead of marking rows
FATAL = (ModelNotFoundError, ImportError, MemoryError, KeyboardInterrupt, StoreError)


def base_record(sample: Sample) -> dict[str, Any]:
    record: dict[str, Any] = {"id": sample.id, "image_id": sample.image_id, "candidate": sample.candidate,
                              "caption": sample.caption}
    if isinstance(sample.image, (str, Path)):
        record["image"] = str(sample.image)
    record.update({k: v for k, v in sample.meta.items() if k not in record})
    return record


def _score_isolating(metric: Metric, items: list, ctx: Context) -> list[dict[str, Any] | Exception]:
    """Score a batch; if it fails, score row by row so one bad row costs only itself."""
    try:
        return list(metric.score(items, ctx))
    except FATAL:
        raise
    except Exception as exc:
        if len(items) == 1:
            return [exc]
        log.warning("metric %s failed on a batch (%s); retrying row by row", metric.name, exc)
        return [_score_isolating(metric, [item], ctx)[0] for item in items]


def run_local(samples: Sequence[Sample], metrics: Sequence[Metric], ctx: Context, *, batch_size: int = 16,
              scores_path: Path | None = None, progress: bool = True, fields: dict[str, Any] | None = None,
              append: bool = False, desc: str = "scoring") -> list[dict[str, Any]]:
    """`fields` are added to every record; `append` adds to `scores_path` instead of replacing it."""
    records: list[dict[str, Any]] = []
    sink = scores_path.open("a" if append else "w", encoding="utf-8") if scores_path else None
    caption_only = not any(m.needs_source_image for m in metrics)
    bar = tqdm(total=len(samples), desc=desc, unit="sample", disable=not progress, dynamic_ncols=True)
    try:
        for start in range(0, len(samples), max(1, batch_size)):
            batch = samples[start : start + batch_size]
            rows = [{**base_record(s), **(fields or {})} for s in batch]
            items, positions = [], []
            for i, sample in enumerate(batch):
                try:
                    items.append(open_image(sample, caption_only=caption_only))
                    positions.append(i)
                except SampleError as exc:
                    rows[i]["error"] = f"row {start + i} (id {sample.id}): {exc}"
            for metric in metrics:
                if not items:
                    break
                for pos, result in zip(positions, _score_isolating(metric, items, ctx)):
                    if isinstance(result, Exception):
                        message = redact_text(f"{metric.name}: {type(result).__name__}: {result}")
                        rows[pos]["error"] = "; ".join(filter(None, [rows[pos].get("error"), message]))
                    else:
                        rows[pos].update(result)
            records.extend(rows)
            if sink:
                _write_lines(sink, rows)
            bar.update(len(batch))
    finally:
        bar.close()
        if sink:
            sink.close()
    return records


def _write_lines(sink, rows: Iterable[dict[str, Any]]) -> None:
    for row in rows:
        sink.write(json.dumps(row, ensure_ascii=False, default=str) + "\n")
    sink.flush()
