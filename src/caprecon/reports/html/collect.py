"""What the report shows, gathered from a run folder into plain, JSON-able values.

Nothing here writes HTML: `render.py` turns these values into the page, so every piece
of text from a dataset reaches the page through one escaping path.
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from caprecon.core.records import is_number, read_jsonl
from caprecon.core.redaction import redact, redact_text
from caprecon.metrics.base import Column
from caprecon.metrics.seeds import seed_interval

# fields of a score record that are numbers but not scores
NOT_SCORES = frozenset({"seed", "candidate", "tokens_cut", "size", "match"})
# the selection curve a best-of-N `caption` run writes beside its candidates
CURVE_FILES = ("curve.csv", "selection_curve.csv", "selection_curve.jsonl")
# per-sample records: a `score` run's, else a best-of-N `caption` run's candidates
RECORD_FILES = ("scores.jsonl", "candidates.jsonl")


def finite_or_none(value: Any) -> float | None:
    return float(value) if is_number(value) else None


@dataclass
class MeanCI:
    mean: float | None
    low: float | None
    high: float | None
    n: int


def mean_ci(values: Sequence[float], level: float = 0.95) -> MeanCI:
    """Mean and Student-t interval (the sample is the rows; no interval below two rows)."""
    if not values:
        return MeanCI(None, None, None, 0)
    mean, _, interval = seed_interval(values, level)
    low, high = interval or (None, None)
    return MeanCI(mean, low, high, len(values))


GROUP_BY = ("captioner", "model")


def group_of(record: Mapping[str, Any], keys: Sequence[str] = GROUP_BY) -> str:
    for key in keys:
        if record.get(key) not in (None, ""):
            return str(record[key])
    return "all"


def score_fields(records: Sequence[Mapping[str, Any]], headline: Sequence[str] = ()) -> list[str]:
    """The run's headline metrics first, then every other score a row carries.

    A score is a finite float at the top level of the record (per-category values, with a
    "/" in their name, are shown with the questions instead); counts and seeds are ints.
    """
    found = dict.fromkeys(headline)
    for record in records:
        for key, value in record.items():
            if (isinstance(value, float) and math.isfinite(value) and "/" not in key and key not in NOT_SCORES
                    and not key.endswith("_n")):
                found.setdefault(key)
    return [name for name in found if any(is_number(r.get(name)) for r in records)]


@dataclass
class SummaryTable:
    metrics: list[str]
    rows: list[tuple[str, list[MeanCI]]]
    best: dict[str, str] = field(default_factory=dict)  # metric -> name of the row with the best mean


def summary_table(records: Sequence[Mapping[str, Any]], metrics: Sequence[str], columns: Mapping[str, Column],
                  group_by: Sequence[str] = GROUP_BY) -> SummaryTable:
    """One row per captioner (all its rows; for best-of-N runs also the selected captions alone).
    The best row of a metric is marked by its declared direction (`columns`, the manifest's); a
    metric without a declaration has no best."""
    groups: dict[str, list[Mapping[str, Any]]] = {}
    best_of_n = any("selected" in r for r in records)
    for record in records:
        if record.get("error"):
            continue
        name = group_of(record, group_by)
        if best_of_n:
            groups.setdefault(f"{name} (all candidates)", []).append(record)
            if record.get("selected") is True:
                groups.setdefault(f"{name} (selected)", []).append(record)
        else:
            groups.setdefault(name, []).append(record)
    rows = [(name, [mean_ci([r[m] for r in rows if is_number(r.get(m))]) for m in metrics])
            for name, rows in groups.items()]
    best: dict[str, str] = {}
    if len(rows) > 1:
        for k, metric in enumerate(metrics):
            scored = [(cells[k].mean, name) for name, cells in rows if cells[k].mean is not None]
            if metric in columns and (found := columns[metric].best(scored)) is not None:
                best[metric] = found
    return SummaryTable(list(metrics), rows, best)


def read_table(path: Path) -> list[dict[str, Any]]:
    """Rows of a CSV or JSONL file, with numbers parsed (empty CSV cells: None)."""
    if path.suffix == ".jsonl":
        return [record for _, record in read_jsonl(path, keep_surrogates=True)]
    with path.open(newline="", encoding="utf-8") as fh:
        return [{k: _parse_cell(v) for k, v in row.items()} for row in csv.DictReader(fh)]


def _parse_cell(text: str | None) -> Any:
    if text is None or text == "":
        return None
    try:
        return int(text)
    except ValueError:
        pass
    try:
        number = float(text)
    except ValueError:
        return text
    return number if math.isfinite(number) else None


def read_records(run: Path) -> list[dict[str, Any]]:
    for name in RECORD_FILES:
        path = run / name
        if path.is_file():
            return [_with_error_redacted(record) for _, record in read_jsonl(path, keep_surrogates=True)]
    return []


def _with_error_redacted(record: Any) -> Any:
    """A row's error quotes an exception, which may hold a URL's password or a key; the rest is data."""
    if isinstance(record, dict) and isinstance(record.get("error"), str):
        record["error"] = redact_text(record["error"])
    return record


def read_manifest(run: Path) -> dict[str, Any]:
    path = run / "manifest.json"
    if not path.is_file():
        return {}
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        return {"unreadable": f"{path} is not valid JSON (line {exc.lineno})"}
    except UnicodeDecodeError:
        return {"unreadable": f"{path} is not UTF-8 text"}
    if not isinstance(manifest, dict):
        return {"unreadable": f"{path} holds a JSON {type(manifest).__name__}, not a run's manifest (an object)"}
    return redact(manifest)


def headline_metrics(run: Path, manifest: Mapping[str, Any]) -> list[str]:
    """The metrics the run was asked for, in its order (summary.json keeps it)."""
    path = run / "summary.json"
    if path.is_file():
        try:
            return list(json.loads(path.read_text(encoding="utf-8")).get("metrics", {}))
        except (json.JSONDecodeError, AttributeError):
            pass
    return [m["metric"] for m in manifest.get("metrics", []) if isinstance(m, Mapping) and "metric" in m]


def manifest_highlights(manifest: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The few facts a reader wants before the full manifest: versions, models, seeds, settings."""
    out: list[tuple[str, str]] = []

    def add(label: str, value: Any) -> None:
        if value not in (None, "", [], {}):
            out.append((label, value if isinstance(value, str) else json.dumps(value, default=str)))

    add("caprecon", manifest.get("caprecon"))
    add("started", manifest.get("started"))
    add("seconds", manifest.get("seconds"))
    add("samples", manifest.get("samples"))
    for role, info in (manifest.get("models") or {}).items():
        if isinstance(info, Mapping):
            add(f"{role}", info.get("model") or info.get("source") or info.get("backend") or dict(info))
        else:
            add(f"{role}", info)
    recon = manifest.get("reconstruction") or {}
    for key in ("template", "seed", "seed_policy", "max_side"):
        add(key, recon.get(key))
    keep = (manifest.get("store") or {}).get("keep")
    if keep not in (None, "images"):  # the gallery then shows no reconstructions: say why
        add("reconstructions", f"not kept as pictures (--keep {keep}): the cache holds "
            f"{'their embeddings and records' if keep == 'vectors' else 'nothing of them'}")
    add("python", manifest.get("python"))
    add("libraries", ", ".join(f"{k} {v}" for k, v in (manifest.get("libraries") or {}).items() if v))
    add("command", " ".join(map(str, manifest["command"])) if manifest.get("command") else None)
    return out


def flips(record: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The turing questions right on the original and wrong on the reconstruction."""
    return [
        {"question": str(f.get("question", "")), "category": str(f.get("category", "")),
         "answer": _answer_text(f.get("answer"), f.get("choices")),
         "on_original": str(f.get("on_original", "")), "on_reconstruction": str(f.get("on_reconstruction", ""))}
        for f in record.get("turing_flipped") or [] if isinstance(f, Mapping)
    ]


def unsupported(record: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The halluc claims the judge did not find on the original image, with P(yes); `g`: not
    asked, a claim it depends on was false."""
    return [
        {"claim": str(u.get("claim", "")), "type": str(u.get("type", "")), "span": str(u.get("span") or ""),
         "p": round(float(u["p_yes"]), 4) if is_number(u.get("p_yes")) else None, "g": u.get("gated") is True}
        for u in record.get("halluc_unsupported") or [] if isinstance(u, Mapping)
    ]


CLAIM_STATUSES = ("conveyed", "hallucinated", "lost")


def claim_evidence(record: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The `claims` metric's evidence, as the page shows it: each claim with its caption offsets
    (s, e; None when its span is not in the caption), its question, P(yes) on I (pi) and on Î (pr),
    whether it was gated on each (gi, gr) and its status (st: conveyed, hallucinated, lost)."""
    out = []
    for e in record.get("claims_evidence") or []:
        if not isinstance(e, Mapping) or e.get("status") not in CLAIM_STATUSES:
            continue
        start, end = e.get("start"), e.get("end")
        located = isinstance(start, int) and isinstance(end, int) and 0 <= start < end
        out.append({"claim": str(e.get("claim", "")), "type": str(e.get("type", "")),
                    "q": str(e.get("question", "")), "span": str(e.get("span") or ""),
                    "s": start if located else None, "e": end if located else None,
                    "pi": round(float(e["p_yes_image"]), 4) if is_number(e.get("p_yes_image")) else None,
                    "pr": round(float(e["p_yes_recon"]), 4) if is_number(e.get("p_yes_recon")) else None,
                    "gi": e.get("gated_image") is True, "gr": e.get("gated_recon") is True, "st": e["status"]})
    return out


def claim_rationale(evidence: Sequence[Mapping[str, Any]], caption: str = "") -> str:
    """One line from the evidence alone: how many claims the photo does not support and how many
    the reconstruction lost, each named by its words in the caption (else its claim)."""
    if not evidence:
        return ""

    def named(rows: list[Mapping[str, Any]]) -> str:
        words = [caption[r["s"]:r["e"]] if r.get("s") is not None and caption else (r.get("span") or r["claim"])
                 for r in rows]
        return ", ".join(f"'{w}'" for w in dict.fromkeys(words))

    wrong = [r for r in evidence if r["st"] == "hallucinated"]
    lost = [r for r in evidence if r["st"] == "lost"]
    parts = [f"{len(wrong)} of {len(evidence)} claims not on the photo" + (f": {named(wrong)}" if wrong else "")]
    supported = len(evidence) - len(wrong)
    if lost:
        parts.append(f"{len(lost)} of {supported} lost in reconstruction: {named(lost)}")
    elif supported:
        parts.append(f"all {supported} supported claims conveyed by the reconstruction")
    return "; ".join(parts)


def _answer_text(answer: Any, choices: Any) -> str:
    if isinstance(choices, list) and isinstance(answer, str) and len(answer) == 1 and answer.isalpha():
        index = ord(answer.upper()) - ord("A")
        if 0 <= index < len(choices):
            return f"{answer}. {choices[index]}"
    return answer if isinstance(answer, str) else json.dumps(answer)


def other_scores(record: Mapping[str, Any]) -> dict[str, float]:
    """Per-category and other sub-scores ("turing/spatial", ...), rounded for the page."""
    return {k: round(float(v), 6) for k, v in record.items() if "/" in k and is_number(v)}


def selection_curve(run: Path) -> list[dict[str, Any]]:
    for name in CURVE_FILES:
        if (run / name).is_file():
            return read_table(run / name)
    return []


def meta_tables(run: Path) -> dict[str, Any]:
    """A `caprecon meta` folder: agreement rows, probe rows, verify rows, and every caption's scores per
    judgments file."""
    out: dict[str, Any] = {}
    if (run / "meta.csv").is_file():
        out["agreement"] = read_table(run / "meta.csv")
    if (run / "probes.csv").is_file():
        out["probes"] = read_table(run / "probes.csv")
    if (run / "verify.csv").is_file():  # `meta verify`: ours beside the published values
        out["verify"] = read_table(run / "verify.csv")
    if (run / "fit-weights.csv").is_file():  # `meta --fit`: what each fitted combination is made of
        out["fit_weights"] = read_table(run / "fit-weights.csv")
    out["scores"] = {path.stem[len("scores-"):]: read_table(path) for path in sorted(run.glob("scores-*.csv"))}
    return out


def numeric_columns(rows: Iterable[Mapping[str, Any]], skip: Iterable[str] = ()) -> list[str]:
    skip = set(skip)
    columns: dict[str, None] = {}
    for row in rows:
        for key, value in row.items():
            if key not in skip and is_number(value):
                columns.setdefault(key)
    return list(columns)


# a `caprecon cttd build` (or `cttd import`) folder: the bank and the datasheet beside it
BANK_FILE, DATASHEET_FILE = "bank.jsonl", "datasheet.json"


def read_bank(run: Path) -> tuple[list[dict[str, Any]], dict[str, Any]] | None:
    """The QA bank's records and its datasheet, or None when the folder holds no CTTD build."""
    if not (run / BANK_FILE).is_file() or not (run / DATASHEET_FILE).is_file():
        return None
    try:
        sheet = json.loads((run / DATASHEET_FILE).read_text(encoding="utf-8"))
    except json.JSONDecodeError:
        sheet = {}
    records = [record for _, record in read_jsonl(run / BANK_FILE, keep_surrogates=True) if isinstance(record, Mapping)]
    return records, redact(sheet) if isinstance(sheet, dict) else {}


def bank_question(record: Mapping[str, Any]) -> dict[str, Any]:
    """One bank question as the page shows it (short keys: a bank holds ~15 per image)."""
    choices = record.get("choices")
    item: dict[str, Any] = {"q": str(record.get("question", "")), "c": str(record.get("category") or "(none)"),
                            "t": str(record.get("type", "")), "a": _answer_text(record.get("answer"), choices)}
    if isinstance(choices, list) and choices:
        item["ch"] = [str(c) for c in choices]
    if record.get("coords") is not None:
        item["co"] = str(record["coords"])
    return item


def stage_rows(sheet: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The datasheet's stages as table rows: counts, what was dropped and why, replies read, model calls."""
    rows = []
    for stage in sheet.get("stages") or []:
        if not isinstance(stage, Mapping):
            continue
        replies = stage.get("replies") if isinstance(stage.get("replies"), Mapping) else None
        dropped = stage.get("dropped") if isinstance(stage.get("dropped"), Mapping) else {}
        rows.append({
            "stage": str(stage.get("stage", "")),
            "counts": ", ".join(f"{k} {v}" for k, v in (stage.get("counts") or {}).items()) or
                      str(stage.get("skipped") or ""),
            "dropped": [(str(reason), n) for reason, n in dropped.items()],
            "dropped_total": sum(n for n in dropped.values() if is_number(n)),
            "replies": (f"{replies.get('strict', 0)} strict, {replies.get('repaired', 0)} repaired, "
                        f"{replies.get('retried', 0)} after retry, {replies.get('dropped', 0)} dropped")
            if replies else "",
            "calls": ", ".join(f"{k} {v}" for k, v in (stage.get("model_calls") or {}).items()),
            "seconds": stage.get("seconds") if is_number(stage.get("seconds")) else None,
        })
    return rows
