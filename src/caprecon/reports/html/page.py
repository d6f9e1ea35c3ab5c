"""Render a run folder's `report.html`."""

from __future__ import annotations

import base64
import collections
import difflib
import functools
import hashlib
import json
import logging
import math
import os
from importlib import resources
from pathlib import Path
from typing import Any, Mapping, Sequence

from jinja2 import Environment, FileSystemLoader, StrictUndefined, select_autoescape
from markupsafe import Markup

from caprecon.core.errors import ConfigError
from caprecon.core.records import is_number, read_jsonl
from caprecon.core.tables import number
from caprecon.metrics.base import read_columns
from caprecon.reports.categories import UPPER, category_table, radar_chart
from caprecon.reports.html import collect, svg
from caprecon.reports.html.seeds import seeds_section
from caprecon.store.thumbs import cache_folder, make_thumbnails, record_images, resolve

log = logging.getLogger(__name__)

PAGE_SIZE = 24  # gallery cards per page: one screenful or two, drawn in a few milliseconds
MAX_ERRORS_LISTED = 1000
FILES = "report_files"  # thumbnails and charts, beside report.html
MAX_REFINED_SHOWN = 200  # before/after cards of a refine run: the largest gains
CATEGORY_METRICS = ("turing", "captionqa")
META_TEXT_COLUMNS = ("judgments", "metric", "statistic")


def _package_dir(name: str) -> Path:
    return Path(str(resources.files("caprecon.reports.html") / name))


def _num(value: Any) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "–"
    if isinstance(value, bool):
        return str(value).lower()
    return number(value)  # as the terminal's tables: 1e308 in powers of ten, not 309 digits


def _pct(value: float | None) -> str:
    return "" if value is None else f"{100 * value:.2f}"


@functools.cache  # one per process: compiling the page's template takes ~60 ms, more than rendering it
def _environment() -> Environment:
    env = Environment(loader=FileSystemLoader(str(_package_dir("templates"))), undefined=StrictUndefined,
                      autoescape=select_autoescape(default=True, default_for_string=True), trim_blocks=True,
                      lstrip_blocks=True)
    env.filters["num"] = _num
    env.filters["pct"] = _pct
    return env


def json_for_script(value: Any) -> Markup:
    """JSON that is safe inside a <script> element: no "</script>", "<!--" or "]]>" can form,
    because every <, > and & is written as a JSON \\u escape."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return Markup(text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026"))


def _rounded(value: Any) -> float | None:
    # six decimals: the page shows four, and ten thousand rows of full floats would double the page's size
    return round(float(value), 6) if is_number(value) else None


# the fields of a flipped question (`collect.flips`), in the order the page's arrays hold them
FLIP_FIELDS = ("question", "category", "answer", "on_original", "on_reconstruction")


def _thumbnails(originals: Sequence[str], reconstructions: Sequence[str], out: Path, *, cache: Path | None,
                progress: bool, image_root: str | None,
                known: Mapping[str, str] | None = None) -> dict[str, str | None]:
    """{picture path: its thumbnail's name}: the originals confined to the run's --image-root, as
    scoring confined them; the reconstructions are the store's own files. `known`: see `make_thumbnails`."""
    folder = out / FILES / "thumbs"
    thumbs = make_thumbnails(originals, folder, cache=cache, progress=progress, image_root=image_root, known=known)
    thumbs.update(make_thumbnails(reconstructions, folder, cache=cache, progress=progress, known=known))
    return thumbs


def _gallery(records: Sequence[Mapping[str, Any]], metrics: Sequence[str], run: Path, out: Path, *,
             best_of_n: bool, selection_metric: str | None, group_by: Sequence[str],
             progress: bool, cache: Path | None, image_root: str | None, lower_better: Sequence[str],
             thumbnails: Mapping[str, str] | None = None) -> dict[str, Any]:
    originals, recons = [], []
    for record in records:
        original, reconstructions = record_images(record, run)
        originals.append(original)
        recons.append(reconstructions)
    thumbs = _thumbnails([p for p in originals if p], [p for ps in recons for p in ps], out, cache=cache,
                         progress=progress, image_root=image_root, known=thumbnails)
    # per-row values as arrays aligned to name lists shared by all rows: 10,000 rows repeating
    # "turing/…" keys made half the page
    others = [collect.other_scores(record) for record in records]
    other = sorted({name for more in others for name in more})
    column = {name: k for k, name in enumerate(other)}
    items = []
    for record, original, reconstructions, more in zip(records, originals, recons, others):
        item: dict[str, Any] = {
            "i": str(record.get("id", "")), "im": str(record.get("image_id", "")),
            "g": collect.group_of(record, group_by),
            "c": str(record.get("caption") or ""), "s": [_rounded(record.get(m)) for m in metrics],
            "o": thumbs.get(original) if original else None, "r": [thumbs[p] for p in reconstructions if thumbs[p]],
        }
        if original:
            item["src"] = os.path.basename(original)
        if is_number(record.get("tokens_cut")) and record["tokens_cut"] > 0:
            item["cut"] = int(record["tokens_cut"])
        if record.get("error"):
            item["e"] = str(record["error"])
        if best_of_n and is_number(record.get("candidate")):
            item["k"] = int(record["candidate"])
            item["sel"] = record.get("selected") is True
        if flipped := collect.flips(record):
            item["f"] = [[f[name] for name in FLIP_FIELDS] for f in flipped]
        if claims := collect.unsupported(record):
            item["h"] = claims
        if evidence := collect.claim_evidence(record):
            item["cl"] = evidence
            item["why"] = collect.claim_rationale(evidence, item["c"])
        if more:
            item["x"] = [None] * len(other)
            for name, value in more.items():
                item["x"][column[name]] = value
        if any(isinstance(record.get(f"{m}_ci"), list) for m in metrics):  # the seed interval of each score
            item["ci"] = [[_rounded(v) for v in record[f"{m}_ci"]] if isinstance(record.get(f"{m}_ci"), list)
                          else None for m in metrics]
        items.append(item)
    return {"metrics": list(metrics), "lower_is_better": list(lower_better),
            "groups": sorted({item["g"] for item in items}), "page_size": PAGE_SIZE, "thumbs": f"{FILES}/thumbs/",
            "selection_metric": selection_metric, "other": other, "flip_fields": list(FLIP_FIELDS), "items": items}


def _categories(records: Sequence[Mapping[str, Any]], out: Path) -> list[dict[str, Any]]:
    blocks = []
    for metric in CATEGORY_METRICS:
        if not any(metric in r and not r.get("error") for r in records):
            continue
        table = category_table(records, metric=metric)
        radar = None
        if table.categories:
            try:
                radar_chart(table, out / FILES / f"radar-{metric}.png", title=f"{metric}: accuracy per category")
                radar = f"{FILES}/radar-{metric}.png"
            except ImportError as exc:  # the table alone still says everything
                log.warning("%s", exc)
        blocks.append({"metric": metric, "table": table, "radar": radar})
    return blocks


def _curve(run: Path) -> dict[str, Any] | None:
    rows = collect.selection_curve(run)
    if not rows:
        return None
    columns = list(rows[0])
    x_column, series_columns = columns[0], collect.numeric_columns(rows, skip=[columns[0]])
    xs = [r.get(x_column) for r in rows]
    chart = svg.lines([float(x) for x in xs if is_number(x)],
                      {c: [collect.finite_or_none(r.get(c)) for r in rows if is_number(r.get(x_column))]
                       for c in series_columns},
                      xlabel=x_column, ylabel="expected score of the selected caption", title="selection curve")
    return {"columns": columns, "rows": rows, "svg": chart}


def _refinement(run: Path, out: Path, *, progress: bool, cache: Path | None,
                image_root: str | None) -> dict[str, Any] | None:
    """A `refine` run's before/after view: the rounds' mean score (with a split QA bank, beside the
    mean accuracy on its guiding and its held-out questions), and per caption the word diff of the
    original and the final caption, the image with both reconstructions, and the Caption Turing
    Test questions that no longer flip. Captions with the largest gain first."""
    path = run / "refined.jsonl"
    if not path.is_file():
        return None
    captions = [row for _, row in read_jsonl(path, keep_surrogates=True)]
    rounds = collect.read_table(run / "rounds.csv") if (run / "rounds.csv").is_file() else []
    xs = [float(r["round"]) for r in rounds if is_number(r.get("round"))]
    series = {"mean score": "mean_score", "guiding questions": "guiding", "held-out questions": "held_out"}
    chart = svg.lines(xs, {label: [collect.finite_or_none(r.get(column)) for r in rounds if is_number(r.get("round"))]
                           for label, column in series.items() if rounds and column in rounds[0]},
                      xlabel="round", ylabel="mean score of the captions", title="refinement rounds")

    def gain(row: Mapping[str, Any]) -> float:
        before, after = row.get("score_before"), row.get("score")
        return after - before if is_number(before) and is_number(after) else -math.inf

    shown = sorted(captions, key=gain, reverse=True)[:MAX_REFINED_SHOWN]
    images = [(r.get("image"), r.get("reconstruction_before"), r.get("reconstruction")) for r in shown]
    thumbs = _thumbnails([trio[0] for trio in images if isinstance(trio[0], str)],
                         [p for trio in images for p in trio[1:] if isinstance(p, str)], out, cache=cache,
                         progress=progress, image_root=image_root)
    items = []
    for row, trio in zip(shown, images):
        items.append({"id": str(row.get("id", "")), "before": row.get("score_before"), "after": row.get("score"),
                      "improved": row.get("improved") is True, "stopped": row.get("stopped"),
                      "diff": word_diff(str(row.get("original") or ""), str(row.get("caption") or "")),
                      "thumbs": [(label, f"{FILES}/thumbs/{thumbs[p]}" if isinstance(p, str) and thumbs.get(p) else None)
                                 for label, p in zip(("image", "reconstruction before", "reconstruction after"), trio)],
                      "halves": [(label, row.get(f"{half}_before"), row.get(half))
                                 for label, half in (("guiding", "guiding"), ("held-out", "held_out")) if half in row],
                      "fixed": _questions(row.get("fixed")), "fixed_guiding": _questions(row.get("fixed_guiding"))})
    return {"svg": chart, "rounds": rounds, "cards": items, "total": len(captions),
            "improved": sum(1 for r in captions if r.get("improved") is True)}


def _questions(flips: Any) -> list[str]:
    return [str(f.get("question", "")) for f in flips or [] if isinstance(f, Mapping)]


def word_diff(before: str, after: str) -> list[tuple[str, str]]:
    """(kind, text) segments turning `before` into `after` word by word: kind is "same", "del" or "ins"."""
    a, b = before.split(), after.split()
    segments: list[tuple[str, str]] = []
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes():
        if op == "equal":
            segments.append(("same", " ".join(a[i1:i2])))
            continue
        if i2 > i1:
            segments.append(("del", " ".join(a[i1:i2])))
        if j2 > j1:
            segments.append(("ins", " ".join(b[j1:j2])))
    return segments


def _meta(run: Path) -> dict[str, Any] | None:
    tables = collect.meta_tables(run)
    if not any(tables.get(k) for k in ("agreement", "probes", "verify", "scores")):
        return None
    agreement = [dict(row) for row in tables.get("agreement", [])]
    best: dict[str, float] = {}
    for row in agreement:
        if is_number(row.get("value")):
            key = str(row.get("judgments"))
            best[key] = max(best.get(key, -math.inf), row["value"])
    for row in agreement:
        row["best"] = is_number(row.get("value")) and row["value"] == best.get(str(row.get("judgments")))
    columns = [c for c in (agreement[0] if agreement else {}) if c not in ("ci_low", "ci_high", "best")]
    scatters = []
    for file, rows in tables["scores"].items():
        metrics = collect.numeric_columns(rows, skip=("id", "image_id", "caption", "human"))
        statistic = {str(r.get("metric")): r for r in agreement if str(r.get("judgments", "")).startswith(file)}
        charts = []
        for metric in metrics:
            row = statistic.get(metric)
            label = f"{metric} ({row['statistic']} {_num(row.get('value'))})" if row else metric
            charts.append(svg.scatter([r.get(metric) for r in rows], [r.get("human") for r in rows],
                                      xlabel=label, ylabel="human score", title=f"{file}: {metric} vs human score"))
        scatters.append((file, [c for c in charts if c]))
    probes = tables.get("probes", [])
    verify = tables.get("verify", [])
    weights = tables.get("fit_weights", [])
    return {"agreement": agreement, "columns": columns, "text_columns": META_TEXT_COLUMNS, "scatters": scatters,
            "probes": probes, "probe_columns": list(probes[0]) if probes else [],
            "verify": verify, "verify_columns": list(verify[0]) if verify else [],
            "fit_weights": weights, "fit_weight_columns": list(weights[0]) if weights else []}


def _bank(run: Path, out: Path, *, progress: bool) -> dict[str, Any] | None:
    """A CTTD build folder's bank: the datasheet's counts and stages, and its questions per image."""
    found = collect.read_bank(run)
    if found is None:
        return None
    records, sheet = found
    images: dict[str, dict[str, Any]] = {}  # image id -> card, in bank order
    paths: dict[str, str] = {}
    for record in records:
        image_id = str(record.get("image_id", ""))
        card = images.setdefault(image_id, {"im": image_id, "q": []})
        card["q"].append(collect.bank_question(record))
        if record.get("source") and "source" not in card:
            card["source"] = str(record["source"])
        if isinstance(record.get("image"), str) and record["image"] and image_id not in paths:
            paths[image_id] = resolve(record["image"], run)  # an import writes images/ relative to the folder
    thumbs = make_thumbnails(list(paths.values()), out / FILES / "thumbs", progress=progress)
    for image_id, card in images.items():
        if image_id in paths:
            card["o"] = thumbs.get(paths[image_id])
            card["src"] = os.path.basename(paths[image_id])
    questions = [q for card in images.values() for q in card["q"]]
    total = len(questions) or 1
    counts = []
    for title, key, field in (("Category", "by_category", "category"), ("Answer type", "by_type", "type"),
                              ("Source", "by_source", "source")):
        table = sheet.get(key) if isinstance(sheet.get(key), Mapping) else None
        if table is None:  # an unreadable or hand-written datasheet: count the bank itself
            table = collections.Counter(str(r.get(field) or "") for r in records)
        counts.append((title, [(str(name) or "(none)", n, 100 * n / total) for name, n in table.items()
                               if is_number(n)]))
    models = sheet.get("models") if isinstance(sheet.get("models"), Mapping) else {}
    data = {"categories": sorted({q["c"] for q in questions}), "types": sorted({q["t"] for q in questions}),
            "page_size": PAGE_SIZE, "thumbs": f"{FILES}/thumbs/", "images": list(images.values())}
    return {
        "questions": len(questions), "images": len(images), "counts": counts,
        "stages": collect.stage_rows(sheet), "imported_from": str(sheet.get("imported_from") or ""),
        "models": [(str(role), str(d.get("model") or d.get("backend") or d.get("class") or "")
                    if isinstance(d, Mapping) else str(d)) for role, d in models.items()],
        "settings": json.dumps(sheet.get("settings"), indent=2, ensure_ascii=False, default=str)
        if sheet.get("settings") else "",
        "data": json_for_script(data),
    }


def _check_inside(folder: Path, *paths: Path) -> None:
    """A run folder can come from anyone: a link in it (`report_files` -> ~/.ssh) would have the
    report write, and overwrite, files elsewhere. Refused before anything is written."""
    root = folder.resolve()
    for path in paths:
        if path.is_symlink() and not path.resolve().is_relative_to(root):
            raise ConfigError(f"{path} is a link to {path.resolve()}, outside {folder}: the report writes only "
                              f"inside its folder; remove the link (or give --out another folder)")


def write_html_report(run_dir: str | Path, out: str | Path | None = None, *, title: str | None = None,
                      group_by: Sequence[str] = collect.GROUP_BY, progress: bool = False,
                      thumbnails: Mapping[str, str] | None = None) -> Path:
    """Write `report.html` (and `report_files/`) for a run folder and return its path.

    Reads whatever the folder holds: `scores.jsonl`, `summary.json` and `manifest.json` of a
    `score` or `caption` run (best-of-N candidates are recognised by their `selected`
    field; a `curve.csv` beside them is drawn), `meta.csv`, `probes.csv` and
    `scores-*.csv` of a `meta` run, and `bank.jsonl` with `datasheet.json` of a `cttd
    build` (its counts, stage drops and questions per image). `out` is the folder to write
    into (default: the run's).
    Rows are grouped into summary rows by the first non-empty field of `group_by`.
    `thumbnails`: {picture: name} of the gallery's thumbnails the run that wrote the folder has
    put in `report_files/thumbs/` (`ThumbnailWriter.made`), when `out` is the run folder.
    """
    run = Path(run_dir)
    if run.is_file():  # a scores.jsonl given directly
        run = run.parent
    if not run.is_dir():
        raise FileNotFoundError(f"run folder not found: {run}")
    out = Path(out) if out else run
    _check_inside(out, out / "report.html", out / FILES, out / FILES / "thumbs")
    made = not (out / FILES).exists()
    (out / FILES).mkdir(parents=True, exist_ok=True)

    records = collect.read_records(run)
    manifest = collect.read_manifest(run)
    if manifest.get("unreadable"):  # the page is still made from the scores; the run's settings are not shown
        log.warning("%s: the report shows none of the run's settings", manifest["unreadable"])
    metrics = collect.score_fields(records, collect.headline_metrics(run, manifest)) if records else []
    best_of_n = any("selected" in r for r in records)
    selection = manifest.get("selection") if isinstance(manifest.get("selection"), Mapping) else {}
    selection_metric = selection.get("metric") if selection.get("metric") in metrics else next(iter(metrics), None)
    columns = read_columns(manifest)  # what the run's metrics declared: direction, range, aggregation
    lower_better = [m for m in metrics if m in columns and columns[m].higher_is_better is False]
    summary = collect.summary_table(records, metrics, columns, group_by) if records and metrics else None
    categories = _categories(records, out) if records else []
    curve = _curve(run)
    seeds = seeds_section(records, metrics, group_by[0] if group_by else "captioner") if records else None
    meta = _meta(run)
    errors = [{"id": str(r.get("id", "")), "group": collect.group_of(r, group_by), "error": str(r["error"])}
              for r in records if r.get("error")]
    bank = _bank(run, out, progress=progress)
    store = manifest.get("store") if isinstance(manifest.get("store"), Mapping) else {}
    cache = cache_folder(store.get("root"))
    image_root = manifest.get("image_root") if isinstance(manifest.get("image_root"), str) else None
    refinement = _refinement(run, out, progress=progress, cache=cache, image_root=image_root)
    gallery = (_gallery(records, metrics, run, out, best_of_n=best_of_n, selection_metric=selection_metric,
                        group_by=group_by, progress=progress, cache=cache, image_root=image_root,
                        lower_better=lower_better, thumbnails=thumbnails if out == run else None)
               if records else None)

    sections = [("summary", "Summary")] if summary else []
    sections += [("selection", "Selection curve")] if curve else []
    sections += [("seeds", "Seeds")] if seeds else []
    sections += [(f"categories-{b['metric']}", "Caption Turing Test" if b["metric"] == "turing" else b["metric"])
                 for b in categories]
    sections += [("agreement", "Agreement"), *([("probes", "Probes")] if meta["probes"] else []),
                 *([("verify", "Published values")] if meta["verify"] else []),
                 *([("fit", "Fitted combinations")] if meta["fit_weights"] else [])] if meta else []
    sections += [("bank", "Question bank"), ("bank-gallery", "Questions per image")] if bank else []
    sections += [("candidates", "Candidates")] if best_of_n else []
    sections += [("refinement", "Refinement")] if refinement else []
    sections += [("gallery", "Gallery")] if gallery else []
    sections += [("errors", f"Errors ({len(errors)})")] if errors else []
    if not sections:  # an empty page would read as a run that scored nothing
        if made:
            (out / FILES).rmdir()
        raise ConfigError(f"{run}: nothing to report: no scores ({' or '.join(collect.RECORD_FILES)}), meta tables, "
                          "question bank or refinement in this folder; give the folder a caprecon command wrote")
    sections += [("run", "Run")] if manifest else []

    script = (_package_dir("static") / "report.js").read_text(encoding="utf-8")
    script_hash = "sha256-" + base64.b64encode(hashlib.sha256(script.encode("utf-8")).digest()).decode()
    counts = (f"{len(records)} samples, {len(errors)} with errors" if records
              else f"{bank['questions']} questions about {bank['images']} images" if bank else "")
    html = _environment().get_template("report.html").render(
        title=title or f"caprecon report: {run.resolve().name}", run=str(run), counts=counts, sections=sections,
        group_label="captioner" if tuple(group_by) == collect.GROUP_BY else " / ".join(group_by),
        summary=summary, lower_better=lower_better, curve=curve, seeds=seeds,
        categories=categories, upper=UPPER, meta=meta, bank=bank, best_of_n=best_of_n, refinement=refinement,
        selection_metric=selection_metric,
        hallucinations=bool(gallery) and any("h" in item or any(c["st"] == "hallucinated" for c in item.get("cl", ()))
                                             for item in gallery["items"]),
        gallery=json_for_script(gallery) if gallery else None, errors=errors[:MAX_ERRORS_LISTED],
        error_count=len(errors), highlights=collect.manifest_highlights(manifest),
        manifest=json.dumps(manifest, indent=2, ensure_ascii=False, default=str) if manifest else "",
        css=Markup((_package_dir("static") / "report.css").read_text(encoding="utf-8")), script=Markup(script),
        script_hash=script_hash,
    )
    path = out / "report.html"
    partial = path.with_suffix(".html.part")
    # a lone surrogate (in a caption, an id, a file name) is no character an HTML file can hold: it is
    # written as its escape, "\\ud800", which reads as such in the page and as the same string in its JSON
    partial.write_text(html, encoding="utf-8", errors="backslashreplace")
    os.replace(partial, path)
    return path
