"""Resuming `caprecon refine`: the finished rounds an earlier run of the same settings left in
`rounds.jsonl`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from caprecon.core.errors import ConfigError
from caprecon.core.records import read_jsonl


def read_rounds(out_dir: Path, run_key: str) -> dict[str, list[dict[str, Any]]]:
    """The finished rounds of an earlier run of the same settings in `out_dir`. A line cut by a
    kill is dropped; an earlier run of other settings is refused rather than mixed in."""
    path = out_dir / "rounds.jsonl"
    if not path.is_file():
        return {}
    try:
        before = json.loads((out_dir / "manifest.json").read_text(encoding="utf-8")).get("refine", {}).get("key")
    except (OSError, ValueError, AttributeError):
        before = None
    if before != run_key:
        raise ConfigError(f"--out {out_dir} holds a refinement of other captions or settings; give another --out, "
                          f"or delete {path} to start this folder over")
    text = path.read_text(encoding="utf-8")
    whole = text[: text.rfind("\n") + 1]  # a kill mid-write leaves a last line without its newline
    if whole != text:
        path.write_text(whole, encoding="utf-8")
    history: dict[str, list[dict[str, Any]]] = {}
    for _, row in read_jsonl(path, ConfigError, keep_surrogates=True):
        history.setdefault(row["id"], []).append(row)
    # a round is complete for a caption only with its row; rows are appended round by round
    return history
