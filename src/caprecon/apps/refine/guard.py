"""The guard of `caprecon refine`: what a round keeps of a scored version, which version a
caption stands at, and whether a revision is kept (`verdict`)."""

from __future__ import annotations

import math
import re
from typing import Any, Mapping, Sequence

from caprecon.core.records import is_number
from caprecon.metrics.seeds import seed_interval
from caprecon.run.captioning import Selection


def scored_version(record: Mapping[str, Any], selection: Selection, headlines: Mapping[str, str],
                   split: bool) -> dict[str, Any]:
    """What a round keeps of a scored version: its score, the metrics' values, its
    reconstruction, the feedback fields of the next round and, with a split bank, its
    Caption Turing Test accuracy on the guiding and on the held-out questions."""
    kept = {"score": selection.value(record, headlines),
            "scores": {name: record.get(field) for name, field in headlines.items()}}
    if split:
        kept.update(guiding=record.get("turing_guiding"), held_out=record.get("turing"))
    per_seed = _seed_scores(record, selection, headlines)
    if per_seed:
        kept["score_seeds"] = per_seed
    for key in ("reconstruction", "tokens_cut", "error", "turing_flipped", "turing_guiding_flipped",
                "halluc_unsupported"):
        if record.get(key) is not None:
            kept[key] = record[key]
    if kept.get("error"):
        # the scoring names a failed row by its place among the versions scored together and by the
        # version's id, which mean nothing to the user: the caption's id goes with the error here
        kept["error"] = re.sub(rf"(^|; )row \d+ \(id {re.escape(str(record.get('id')))}\): ", r"\1", kept["error"])
    return kept


def _seed_scores(record: Mapping[str, Any], selection: Selection, headlines: Mapping[str, str]) -> list[float] | None:
    """The selection score under each of the run's seeds (`--seeds K`), from the metrics'
    per-seed values (a metric that rebuilds no image counts the same under every seed);
    None without seeds or when a value is missing."""
    if record.get("error"):
        return None
    lists = {name: record.get(f"{field}_seeds") for name, field in headlines.items() if name in selection.weights}
    counts = {len(v) for v in lists.values() if isinstance(v, list)}
    if len(counts) != 1 or min(counts) < 2:
        return None
    out = []
    for k in range(counts.pop()):
        values = [lists[name][k] if isinstance(lists[name], list) else record.get(headlines[name])
                  for name in selection.weights]
        if not all(is_number(v) for v in values):
            return None
        out.append(math.fsum(w * v for w, v in zip(selection.weights.values(), values)))
    return out


def verdict(row: Mapping[str, Any], current: Mapping[str, Any], margin: float,
            refused: str | None) -> tuple[bool, str]:
    """Kept only if the revision beats the caption it revises by more than `margin`; with K
    seeds (the same K noises for both), only if the 95 % interval of the paired per-seed gain
    lies above `margin`, so a gain the noise alone could give is not taken."""
    if refused:
        return False, refused
    if row.get("error"):
        return False, f"the revision could not be scored: {row['error']}"
    if row.get("tokens_cut"):
        return False, f"the generator cut {row['tokens_cut']} token(s) of the revision"
    if row["score"] is None:
        return False, "the revision has no score"
    before, old_seeds, new_seeds = current["score"], current.get("score_seeds"), row.get("score_seeds")
    if old_seeds and new_seeds and len(old_seeds) == len(new_seeds):
        gain, _, (low, high) = seed_interval([b - a for a, b in zip(old_seeds, new_seeds)])
        told = f"gain {gain:+.4f}, 95 % interval over {len(new_seeds)} seeds [{low:.4f}, {high:.4f}]"
        if low > margin:
            return True, f"score {before:.4f} -> {row['score']:.4f}; {told}"
        return False, f"no gain beyond the seed noise: {told}" + (f", margin {margin:g}" if margin else "")
    if row["score"] > before + margin:
        return True, f"score {before:.4f} -> {row['score']:.4f}"
    return False, f"no gain: {row['score']:.4f} against {before:.4f}" + (f" + margin {margin:g}" if margin else "")


def current_version(rows: Sequence[Mapping[str, Any]]) -> Mapping[str, Any]:
    """The caption as it stands: the last accepted version."""
    return [r for r in rows if r["accepted"]][-1]
