"""The datasheet of a QA bank: what it holds, what each stage dropped and why, and the
models and prompts that made it. Written as `datasheet.json` and `datasheet.md`.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any, Sequence

from caprecon.apps.cttd.stage import read_records, write_json


def bank_counts(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Questions per category, answer type and source, and per image."""
    per_image = Counter(r["image_id"] for r in records)
    sizes = list(per_image.values())
    return {
        "questions": len(records), "images": len(per_image),
        "per_image": {"mean": round(sum(sizes) / len(sizes), 2) if sizes else 0, "min": min(sizes, default=0),
                      "max": max(sizes, default=0)},
        "by_category": dict(Counter(r.get("category") or "" for r in records).most_common()),
        "by_type": dict(Counter(r["type"] for r in records).most_common()),
        "by_source": dict(Counter(str(r.get("source") or "") for r in records).most_common()),
        "with_parents": sum(bool(r.get("parents")) for r in records),
        "blind_flagged": sum(r.get("blind") is True for r in records),
    }


def write_datasheet(build: Path, config: Any, stages: Sequence[Any]) -> dict[str, Any]:
    bank = read_records(build / "bank.jsonl")
    sheet: dict[str, Any] = {"bank": "bank.jsonl", **bank_counts(bank), "stages": [], "models": {}, "prompts": {},
                             "settings": config.to_dict()}
    for stage in stages:
        manifest = json.loads((build / stage.folder / "manifest.json").read_text(encoding="utf-8"))
        entry = {"stage": stage.name, "counts": manifest.get("counts", {}), "dropped": manifest.get("dropped", {}),
                 "model_calls": manifest.get("computed", {}), "seconds": manifest.get("seconds")}
        for key in ("skipped", "replies", "taxonomy"):
            if manifest.get(key) is not None:
                entry[key] = manifest[key]
        sheet["stages"].append(entry)
        if stage.name == "curate" and "blind" in entry["counts"]:  # the blind control: found, dropped or kept
            sheet["blind_answerable"] = {"found": entry["counts"]["blind"],
                                         "dropped": entry["dropped"].get("answerable without the image", 0),
                                         "kept_flagged": sheet["blind_flagged"]}
        for role, description in manifest.get("models", {}).items():
            sheet["models"][role] = description
        for key in ("prompt", "type_help", "blind_prompt"):
            if manifest.get(key):
                sheet["prompts"][stage.name if key == "prompt" else f"{stage.name} ({key.replace('_', ' ')})"] = \
                    manifest[key]
    write_json(build / "datasheet.json", sheet)
    (build / "datasheet.md").write_text(datasheet_markdown(sheet), encoding="utf-8")
    return sheet


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
            *("| " + " | ".join(str(c) for c in row) + " |" for row in rows)]


def datasheet_markdown(sheet: dict[str, Any]) -> str:
    n = sheet["questions"] or 1
    lines = ["# QA bank datasheet", "",
             f"{sheet['questions']} questions about {sheet['images']} images "
             f"({sheet['per_image']['mean']} per image, {sheet['per_image']['min']}–{sheet['per_image']['max']}).", ""]
    if sheet.get("with_parents"):
        lines += [f"{sheet['with_parents']} questions presuppose others (`parents`): the Caption Turing Test scores "
                  "them wrong where a parent was answered wrong.", ""]
    if blind := sheet.get("blind_answerable"):
        lines += [f"Blind control: a text-only LLM, without the image, answered {blind['found']} candidate questions "
                  f"right; {blind['dropped']} left out, {blind['kept_flagged']} kept flagged (`blind`).", ""]
    for title, key in (("Category", "by_category"), ("Answer type", "by_type"), ("Source", "by_source")):
        lines += _table([title, "questions", "share"],
                        [[k or "(none)", v, f"{100 * v / n:.1f}%"] for k, v in sheet[key].items()]) + [""]
    if sheet.get("imported_from"):
        lines += [f"Imported from `{sheet['imported_from']}` ({sheet['format']} layout).", ""]
    if not sheet["stages"]:
        return "\n".join(lines)
    lines += ["## Stages", ""]
    rows = []
    for s in sheet["stages"]:
        counts = ", ".join(f"{k} {v}" for k, v in s["counts"].items()) or s.get("skipped", "")
        dropped = "; ".join(f"{reason}: {k}" for reason, k in s["dropped"].items()) or "—"
        replies = s.get("replies")
        read = (f"{replies['strict']} strict, {replies['repaired']} repaired, {replies['retried']} after retry, "
                f"{replies['dropped']} dropped") if replies else "—"
        calls = ", ".join(f"{k} {v}" for k, v in s["model_calls"].items()) or "—"
        rows.append([s["stage"], counts, dropped, read, calls])
    lines += _table(["stage", "counts", "dropped (why: how many)", "replies read", "model results computed"], rows)
    lines += ["", "## Models", ""]
    lines += _table(["role", "model"], [[role, d.get("model") or d.get("backend") or d.get("class") or "",
                                         ] for role, d in sheet["models"].items()])
    lines += ["", "## Prompts", ""]
    for name, text in sheet["prompts"].items():
        lines += [f"**{name}**", "", "```", text, "```", ""]
    lines += ["## Settings", "", "```json", json.dumps(sheet["settings"], indent=2), "```", ""]
    return "\n".join(lines)
