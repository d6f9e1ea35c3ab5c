"""A run's records: the row a sample starts as, and the rows a `scores.jsonl` holds."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from caprecon.data.samples import Sample


def base_record(sample: Sample) -> dict[str, Any]:
    record: dict[str, Any] = {"id": sample.id, "image_id": sample.image_id, "candidate": sample.candidate,
                              "caption": sample.caption}
    if isinstance(sample.image, (str, Path)):
        record["image"] = str(sample.image)
    for key, value in plain_json(sample.meta).items():
        if key not in record:  # a missing value in a table column is null in JSON, not NaN
            record[key] = None if isinstance(value, float) and not math.isfinite(value) else value
    return record


def plain_json(value: Any) -> Any:
    """numpy scalars and arrays to Python numbers and lists, so every value is written as JSON."""
    if isinstance(value, dict):
        return {k: plain_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain_json(v) for v in value]
    if hasattr(value, "tolist") and type(value).__module__ == "numpy":
        return value.tolist()
    return value


def read_scores(path: Path) -> list[dict[str, Any]]:
    """The complete rows of a `scores.jsonl` a killed run left behind (its last line may be cut)."""
    rows = []
    if not path.exists():
        return rows
    for line in path.read_text(encoding="utf-8").split("\n"):
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue  # blank, or the line being written when the process died
        if isinstance(row, dict) and "id" in row:
            rows.append(row)
    return rows
