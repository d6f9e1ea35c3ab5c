"""What `caprecon refine` hands back and writes: per caption its original, final and every
round (`refined_row`), per round the mean score and the share improved (`rounds_table`), and
the files (`write_refined`)."""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from caprecon.apps.refine.guard import current_version
from caprecon.core.records import is_number, write_jsonl_atomically
from caprecon.data.samples import Sample
from caprecon.run.captioning import Selection, export_parquet
from caprecon.run.folder import write_manifest

# a version's Caption Turing Test accuracy on each half of a split bank (`split_bank`)
HALVES = ("guiding", "held_out")


@dataclass
class Refined:
    """A refinement's results: what `refine` returns, and what `write_refined` writes."""

    captions: list[dict[str, Any]]  # one per input caption: original, final, every round
    rounds: list[dict[str, Any]]  # rounds.csv: per round, the mean score and the share improved
    selection: Selection
    manifest: dict[str, Any]
    out: Path | None = None


def rounds_table(history: Mapping[str, Sequence[Mapping[str, Any]]], ids: Sequence[str],
                 rounds: int) -> list[dict[str, Any]]:
    """Per round 0..R (R: the last round a caption reached, at most `rounds`): the mean score of the captions as they stand after it (those whose
    original has a score), the share of them above their original, and the revisions asked
    and accepted in it; with a split bank, also their mean Caption Turing Test accuracy on
    the guiding and on the held-out questions. The standing caption changes only by an
    accepted, higher revision, so the mean score cannot fall (the guiding one can)."""
    scored = [i for i in ids if history[i] and history[i][0].get("score") is not None]
    firsts = [history[i][0]["score"] for i in scored]
    halves = [h for h in HALVES if any(h in history[i][0] for i in scored)]
    reached = max((r["round"] for i in ids for r in history[i]), default=0)
    table = []
    for round_no in range(min(rounds, reached) + 1):
        versions = [current_version([r for r in history[i] if r["round"] <= round_no]) for i in scored]
        standing = [v["score"] for v in versions]
        asked = [r for i in ids for r in history[i] if r["round"] == round_no and round_no and r["caption"]]
        table.append({"round": round_no, "captions": len(scored),
                      "mean_score": sum(standing) / len(standing) if standing else None,
                      **{half: _mean([v.get(half) for v in versions]) for half in halves},
                      "improved": (sum(1 for a, b in zip(standing, firsts) if a > b) / len(scored)) if scored else None,
                      "revised": len(asked), "accepted": sum(1 for r in asked if r["accepted"])})
    return table


def _mean(values: Sequence[Any]) -> float | None:
    numbers = [v for v in values if is_number(v)]
    return math.fsum(numbers) / len(numbers) if numbers else None


def refined_row(sample: Sample, rows: Sequence[Mapping[str, Any]], selection: Selection) -> dict[str, Any]:
    """One caption's line of refined.jsonl: its original and final versions, and every round."""
    first, final = rows[0], current_version(rows)
    stop = next((r["reason"] for r in rows[1:] if not r["accepted"]), None)
    halves = [h for h in HALVES if h in first]
    return {
        "id": sample.id, "image": str(sample.image) if isinstance(sample.image, (str, Path)) else None,
        "image_id": sample.image_id, "original": sample.caption, "caption": final["caption"],
        "score_before": first.get("score"), "score": final.get("score"),
        **{f"{half}_before": first.get(half) for half in halves}, **{half: final.get(half) for half in halves},
        "improved": final is not first, "accepted_rounds": [r["round"] for r in rows[1:] if r["accepted"]],
        "stopped": stop, "scores_before": first.get("scores"), "scores": final.get("scores"),
        "reconstruction_before": first.get("reconstruction"), "reconstruction": final.get("reconstruction"),
        # with a split bank the held-out questions, the fixes that count; the guiding ones were told
        "fixed": _fixed(first, final, "turing_flipped"),
        **({"fixed_guiding": _fixed(first, final, "turing_guiding_flipped")} if halves else {}),
        # the first version's scoring error, else the error of an image that could not be read later
        "error": first.get("error") or next((r["error"] for r in rows[1:] if r["caption"] is None and r.get("error")),
                                            None),
        "rounds": [{k: r.get(k) for k in ("round", "caption", "score", *halves, "accepted", "reason", "feedback")}
                   for r in rows],
        "selection": selection.describe(),
    }


def _fixed(first: Mapping[str, Any], final: Mapping[str, Any], field: str) -> list[dict[str, Any]]:
    """The questions of `field` that flip on the first version and no longer on the final one."""
    after = {f["question"] for f in final.get(field) or []}
    return [f for f in first.get(field) or [] if f["question"] not in after]


def write_refined(run: Refined, out_dir: str | Path) -> dict[str, Path]:
    """refined.jsonl (+ .parquet with pyarrow), rounds.csv and manifest.json; rounds.jsonl is
    written as the rounds finish."""
    out_dir = Path(out_dir)
    paths = {"refined": out_dir / "refined.jsonl", "rounds": out_dir / "rounds.csv"}
    write_jsonl_atomically(paths["refined"], run.captions, allow_nan=True)
    # parquet wants one type per column: the nested rounds and feedback travel as JSON text there
    flat = [{**r, "rounds": json.dumps(r["rounds"], ensure_ascii=False), "fixed": json.dumps(r["fixed"]),
             **({"fixed_guiding": json.dumps(r["fixed_guiding"])} if "fixed_guiding" in r else {}),
             "scores_before": json.dumps(r["scores_before"]), "scores": json.dumps(r["scores"])}
            for r in run.captions]
    parquet = export_parquet(flat, out_dir / "refined.parquet")
    if parquet:
        paths["parquet"] = parquet
    with paths["rounds"].open("w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(run.rounds[0]))
        writer.writeheader()
        writer.writerows(run.rounds)
    paths["manifest"] = write_manifest(out_dir, run.manifest)
    return paths
