"""The HTML report: what it computes, what it refuses to leak, and how it behaves in a real browser."""

import json
import math
import re

import numpy as np
import pytest
from PIL import Image
from scipy import stats

import caprecon
from caprecon.cli import main
from caprecon.core.redaction import redact
from caprecon.reports.html import write_html_report
from caprecon.metrics.recon import ReconScore
from caprecon.metrics.turing import CaptionTuringTest
from caprecon.reports.html.collect import summary_table

# the directions recon and turing declare, as a run's manifest holds them
COLUMNS = {c.name: c for c in (*ReconScore.columns, *CaptionTuringTest.columns)}

PAYLOADS = ['</script><script>document.title="owned";alert(1)</script>', '<img src=x onerror="alert(2)">',
            "<!-- <script>alert(3)</script>", '"><svg onload=alert(4)>']


def _image(path, colour, size=(40, 30)):
    Image.new("RGB", size, colour).save(path)
    return str(path)


def _run(tmp_path, records, **files):
    run = tmp_path / "run"
    run.mkdir(exist_ok=True)
    (run / "scores.jsonl").write_text("\n".join(json.dumps(r) for r in records), encoding="utf-8")
    for name, text in files.items():
        (run / name.replace("__", ".")).write_text(text, encoding="utf-8")
    return run


def _blob(html):
    """The gallery's JSON, read back the way the page's script reads it."""
    text = re.search(r'<script type="application/json" id="gallery-data">(.*?)</script>', html, re.S).group(1)
    return json.loads(text)


def test_summary_is_mean_and_student_t_interval_per_captioner():
    a, b = [0.2, 0.4, 0.9, 0.5], [0.7, 0.8, 0.75]
    records = ([{"id": f"a{i}", "captioner": "A", "recon": v, "turing_gap": 0.1 * i} for i, v in enumerate(a)]
               + [{"id": f"b{i}", "model": "B", "recon": v, "turing_gap": 0.3} for i, v in enumerate(b)]
               + [{"id": "broken", "captioner": "A", "recon": 0.0, "error": "row 9: cannot read image"}])
    table = summary_table(records, ["recon", "turing_gap"], COLUMNS)
    rows = dict(table.rows)
    assert set(rows) == {"A", "B"}  # the `model` column names a captioner too; the failed row is left out
    for name, values in (("A", a), ("B", b)):
        cell = rows[name][0]
        low, high = stats.t.interval(0.95, len(values) - 1, loc=np.mean(values), scale=stats.sem(values))
        assert (cell.mean, cell.n) == (pytest.approx(np.mean(values)), len(values))
        assert (cell.low, cell.high) == (pytest.approx(low), pytest.approx(high))
    # the larger recon wins, and the smaller gap
    assert table.best == {"recon": "B", "turing_gap": "A"}


def test_summary_of_one_row_has_no_interval_and_one_captioner_no_best():
    table = summary_table([{"id": "x", "recon": 0.5}], ["recon"], COLUMNS)
    (name, [cell]), = table.rows
    assert (name, cell.mean, cell.low, cell.high, table.best) == ("all", 0.5, None, None, {})


def test_secrets_never_reach_the_page(tmp_path):
    manifest = {"caprecon": "0.1.0",
                "config": {"judge_options": {"base_url": "https://user:hunter2@example.org/v1", "api_key": "sk-live-1",
                                             "max_new_tokens": 32, "headers": {"X-Custom": "opaque-2"}},
                           "hf_token": "hf_secret3"},
                "command": ["caprecon", "score", "--judge-opt", "api_key=sk-live-4", "--api-key", "sk-live-5",
                            "--judge-opt", "max_new_tokens=32"],
                "models": {"judge": {"model": "qwen", "authorization": "Bearer tok6"}}}
    run = _run(tmp_path, [{"id": "a", "caption": "x", "recon": 0.5}], manifest__json=json.dumps(manifest))
    write_html_report(run)
    written = "".join(p.read_text(errors="ignore") for p in run.rglob("*") if p.is_file() and p.name != "manifest.json")
    for secret in ("hunter2", "sk-live-1", "opaque-2", "hf_secret3", "sk-live-4", "sk-live-5", "tok6"):
        assert secret not in written, secret
    assert "max_new_tokens=32" in written and "example.org/v1" in written  # what is not secret stays
    assert redact({"max_new_tokens": 3, "tokens_cut": 2}) == {"max_new_tokens": 3, "tokens_cut": 2}


def test_captions_ids_and_errors_are_data_not_markup(tmp_path):
    records = [{"id": f"<b>{i}</b>", "caption": text, "captioner": "<i>cap</i>", "recon": 0.1 * i,
                "image": _image(tmp_path / f"{i}.png", (10 * i, 0, 0))} for i, text in enumerate(PAYLOADS)]
    records.append({"id": "bad<script>alert(5)</script>", "caption": "c",
                    "error": "row 4: <img src=x onerror=alert(6)>"})
    html = write_html_report(_run(tmp_path, records)).read_text()
    # the only script elements are the page's own two; nothing a record holds opens a tag
    assert html.count("<script") == 2 and "<img src=x" not in html and "<svg onload" not in html
    assert "<b>" not in html and "<i>cap" not in html and "<!-- <script" not in html
    # and what the page's script reads back is exactly the data
    items = _blob(html)["items"]
    assert [item["c"] for item in items] == [*PAYLOADS, "c"]
    assert items[-1]["e"] == "row 4: <img src=x onerror=alert(6)>"
    assert "row 4: &lt;img src=x onerror=alert(6)&gt;" in html  # the errors table, escaped


def test_thumbnails_are_small_shared_and_reused(tmp_path):
    shared = _image(tmp_path / "source.png", (200, 10, 10), size=(900, 600))
    recon = _image(tmp_path / "recon.png", (10, 200, 10), size=(600, 600))
    records = [{"id": "a", "caption": "one", "captioner": "A", "image": shared, "reconstruction": recon, "recon": 0.4},
               {"id": "b", "caption": "two", "captioner": "B", "image": shared, "recon": 0.6},
               {"id": "c", "caption": "three", "image": str(tmp_path / "missing.png"), "recon": 0.5}]
    run = _run(tmp_path, records)
    html = write_html_report(run).read_text()
    thumbs = sorted((run / "report_files" / "thumbs").glob("*.jpg"))
    assert len(thumbs) == 2  # one per distinct existing picture
    assert all(max(Image.open(t).size) <= 256 for t in thumbs)
    assert Image.open(thumbs[0]).size in {(256, 171), (256, 256)}  # the aspect ratio is kept
    data = _blob(html)
    items = {item["i"]: item for item in data["items"]}
    assert items["a"]["o"] == items["b"]["o"] and (run / data["thumbs"] / items["a"]["o"]).is_file()
    assert items["c"]["o"] is None and items["b"]["r"] == []
    stamp = [t.stat().st_mtime_ns for t in thumbs]
    write_html_report(run)
    assert [t.stat().st_mtime_ns for t in thumbs] == stamp


def test_best_of_n_candidates_and_selection_curve(tmp_path):
    records = []
    for image in ("p", "q"):
        scores = [0.3, 0.8, 0.5]
        for k, value in enumerate(scores):
            records.append({"id": f"{image}{k}", "image_id": image, "candidate": k, "caption": f"{image} caption {k}",
                            "captioner": "qwen", "recon": value, "selected": value == max(scores),
                            "reconstruction": _image(tmp_path / f"{image}{k}.png", (0, 80 * k, 0))})
    curve = "n,recon\n1,0.5333\n2,0.7\n3,0.8\n"
    run = _run(tmp_path, records, selection_curve__csv=curve,
               manifest__json=json.dumps({"selection": {"metric": "recon"}}))
    html = write_html_report(run).read_text()
    data = _blob(html)
    assert data["selection_metric"] == "recon"
    assert [(i["i"], i["k"], i["sel"]) for i in data["items"] if i["sel"]] == [("p1", 1, True), ("q1", 1, True)]
    assert 'id="pools"' in html and 'id="gallery-selected"' in html
    rows = dict(summary_table(records, ["recon"], COLUMNS).rows)
    assert rows["qwen (selected)"][0].mean == pytest.approx(0.8) and rows["qwen (all candidates)"][0].n == 6
    points = re.search(r'<polyline points="([^"]+)"', html).group(1).split()
    assert len(points) == 3  # one vertex per n
    ys = [float(p.split(",")[1]) for p in points]
    assert ys[0] > ys[1] > ys[2]  # a rising curve climbs up the page


def test_meta_folder_gets_agreement_scatter_and_probes(tmp_path):
    run = tmp_path / "meta"
    run.mkdir()
    (run / "meta.csv").write_text(
        "judgments,metric,statistic,value,ci_low,ci_high,n,n_images,n_failed\n"
        "expert.jsonl,bleu-4,tau_c,0.21,0.15,0.27,30,10,0\n"
        "expert.jsonl,recon,tau_c,0.35,0.30,0.41,30,10,1\n")
    (run / "probes.csv").write_text("metric,probe,value,ci_low,ci_high,n,detail\n"
                                    "recon,paraphrase_delta,0.04,0.01,0.07,12,<b>means</b> 0.6 vs 0.56\n")
    lines = ["id,image_id,caption,human,bleu-4,recon"]
    for i in range(10):
        lines.append(f"{i},img{i // 2},a caption,{1 + i % 4},{0.1 * i},{'' if i == 3 else 0.5 + 0.01 * i}")
    (run / "scores-expert.csv").write_text("\n".join(lines) + "\n")
    html = write_html_report(run).read_text()
    assert re.findall(r'data-points="(\d+)"', html) == ["10", "9"]  # the caption recon failed on is not drawn
    best = re.findall(r'<td data-v="([0-9.]+)" class="best">', html)
    assert best == ["0.35"]
    assert "paraphrase_delta" in html and "&lt;b&gt;means&lt;/b&gt;" in html
    assert 'id="gallery-data"' not in html  # a meta folder has no scored samples of its own


def test_report_command_on_runs_without_question_bank_metrics(tmp_path, capsys):
    run = _run(tmp_path, [{"id": "a", "caption": "x", "recon": 0.5}])
    assert main(["report", str(run)]) == 0
    out = capsys.readouterr().out
    assert "no turing scores" in out and (run / "report.html").is_file() and not (run / "categories.md").exists()
    assert main(["report", str(tmp_path / "nowhere")]) == 2


# ----------------------------------------------------------------------------- in a real browser

# the `browser` fixture (headless Debian Chromium through Playwright) is in conftest.py


def _open(browser, path):
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    problems = []
    page.on("console", lambda m: m.type in ("error", "warning") and problems.append(f"console {m.type}: {m.text}"))
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    page.on("dialog", lambda d: (problems.append(f"dialog: {d.message}"), d.dismiss()))
    page.goto(path.resolve().as_uri())
    page.wait_for_load_state("load")
    return page, problems


def test_tiny_model_run_in_chromium(tmp_path, tiny_sd, tiny_dinov2, browser):
    rng = np.random.default_rng(3)
    rows = []
    for i in range(6):
        Image.fromarray(rng.integers(0, 255, (24, 32, 3), dtype=np.uint8)).save(tmp_path / f"p{i}.png")
        caption = PAYLOADS[i % len(PAYLOADS)] if i < 4 else f"a picture of noise number {i}"
        rows.append({"id": f"r{i}", "image": str(tmp_path / f"p{i}.png"), "caption": caption,
                     "captioner": "alpha" if i % 2 else "beta"})
    rows.append({"id": "r-missing", "image": str(tmp_path / "nope.png"), "caption": "lost", "captioner": "beta"})
    results = caprecon.score(rows, ["recon"], generator=str(tiny_sd), generator_options={"steps": 1},
                             embedder=str(tiny_dinov2), max_side=32, no_cache=True, out=tmp_path / "run")
    report = tmp_path / "run" / "report.html"
    page, problems = _open(browser, report)
    shot = page.screenshot(path=str(tmp_path / "report.png"), full_page=True)
    assert len(shot) > 10_000 and problems == []
    assert page.title() == "caprecon report: run"  # no payload rewrote it
    assert page.locator("#gallery-items .card").count() == 7
    assert page.locator("script").count() == 2 and page.locator("img[src='x'], svg[onload]").count() == 0
    shown = page.locator("#gallery-items .card .caption").all_text_contents()
    assert set(shown) == {r["caption"] for r in rows}  # the payloads are on the page, as text

    # worst first: ascending recon, the failed row last; then best first
    recon = {r["id"]: r["recon"] for r in results.records if "recon" in r}
    def ids():
        return page.locator("#gallery-items .card").evaluate_all("cards => cards.map(c => c.dataset.id)")

    ascending = sorted(recon, key=recon.get)
    assert ids() == [*ascending, "r-missing"]
    page.click("#gallery-dir")
    assert ids() == [*ascending[::-1], "r-missing"]
    page.select_option("#gallery-sort", label="id")
    assert ids() == sorted(ids(), reverse=True) and ids() != [*ascending[::-1], "r-missing"]
    page.fill("#gallery-filter", "noise number 5")
    assert ids() == ["r5"]
    page.fill("#gallery-filter", "")
    page.check("#gallery-errors")
    assert ids() == ["r-missing"]
    # the summary table sorts by a click on its header
    page.click("#summary-table thead th:nth-child(3)")
    means = page.locator("#summary-table tbody td:nth-child(3)").evaluate_all("tds => tds.map(t => +t.dataset.v)")
    assert means == sorted(means) and len(means) == 2
    assert page.title() == "caprecon report: run" and problems == []
    page.close()


def test_ten_pages_of_samples_paginate(tmp_path, browser):
    records = [{"id": f"s{i:03d}", "caption": f"caption {i}", "recon": math.sin(i) / 2 + 0.5} for i in range(240)]
    page, problems = _open(browser, write_html_report(_run(tmp_path, records)))
    assert page.locator("#gallery-items .card").count() == 24
    assert page.locator(".gallery-pager .page").first.text_content() == "page 1 of 10"
    page.locator(".gallery-pager button", has_text="»").first.click()
    last = page.locator("#gallery-items .card").evaluate_all("cards => cards.map(c => c.dataset.id)")
    worst_last = sorted(records, key=lambda r: r["recon"])[-24:]
    assert last == [r["id"] for r in worst_last] and problems == []
    page.close()


def test_candidate_pools_in_chromium(tmp_path, browser):
    records = [{"id": f"{image}{k}", "image_id": image, "candidate": k, "caption": f"<b>{image} {k}</b>",
                "captioner": "qwen", "recon": 0.1 * k, "selected": k == 2,
                "reconstruction": _image(tmp_path / f"{image}{k}.png", (0, 60 * k, 0))}
               for image in ("p", "q", "r") for k in range(3)]
    page, problems = _open(browser, write_html_report(_run(tmp_path, records)))
    assert page.locator("#pools .pool").count() == 3
    selected = page.locator("#pools .candidate.selected .caption").all_text_contents()
    assert selected == ["<b>p 2</b>", "<b>q 2</b>", "<b>r 2</b>"]
    page.check("#gallery-selected")
    assert page.locator("#gallery-items .card").count() == 3 and problems == []
    page.close()


# ----------------------------------------------------------------------------- a CTTD build folder


def _bank_blob(html):
    text = re.search(r'<script type="application/json" id="bank-data">(.*?)</script>', html, re.S).group(1)
    return json.loads(text)


def _build_folder(tmp_path, questions, *, stages=()):
    """A build folder as `cttd build` leaves it: bank.jsonl beside datasheet.json (counted by its own code)."""
    from caprecon.apps.cttd.datasheet import bank_counts

    build = tmp_path / "build"
    build.mkdir()
    (build / "bank.jsonl").write_text("\n".join(json.dumps(q) for q in questions) + "\n", encoding="utf-8")
    sheet = {"bank": "bank.jsonl", **bank_counts(questions), "stages": list(stages), "models": {}, "prompts": {},
             "settings": {"top_k": 15}}
    (build / "datasheet.json").write_text(json.dumps(sheet), encoding="utf-8")
    return build


def test_cttd_build_writes_a_bank_report(tmp_path, capsys, monkeypatch):
    from collections import Counter

    from cttd_fakes import TAXONOMY
    from oracle import render

    images = tmp_path / "photos" / "shapes"
    images.mkdir(parents=True)
    for i, scene in enumerate(["a red circle and a blue square", "a green triangle", "a blue circle",
                               "a yellow square and a red circle"]):
        render(scene, 96, 96).save(images / f"scene{i}.png")
    render("", 96, 96).save(images / "blank.png")  # near-uniform: stage 1 drops it
    (tmp_path / "taxonomy.json").write_text(json.dumps(TAXONOMY))
    monkeypatch.delenv("CTTD_FAKE_LOG", raising=False)  # the fakes log their calls only when asked
    out = tmp_path / "build"
    assert main(["cttd", "build", "--images", str(images.parent), "--out", str(out), "--vlm", "cttd_fakes:ScriptedVLM",
                 "--llm", "cttd_fakes:ScriptedLLM",
                 "--embedder", "oracle:PixelEmbedder", "--matcher", "cttd_fakes:WordMatcher", "--taxonomy",
                 str(tmp_path / "taxonomy.json"), "--density-band", "0", "1", "--top-k", "5"]) == 1  # garbage replies
    printed = capsys.readouterr()
    assert "caprecon: failed: generate: reply unreadable after retry" in printed.err
    assert f"report: {out / 'report.html'}" in printed.out
    html = (out / "report.html").read_text()
    bank = [json.loads(line) for line in (out / "bank.jsonl").read_text().splitlines()]
    data = _bank_blob(html)
    # the page holds every question of the bank, per category as many as the bank has
    shown = Counter(q["c"] for image in data["images"] for q in image["q"])
    assert shown == Counter(r["category"] for r in bank) and sum(shown.values()) == len(bank) == 4 * 5
    assert sorted(image["im"] for image in data["images"]) == [f"scene{i}" for i in range(4)]
    # each image has its thumbnail, written once
    thumbs = out / "report_files" / "thumbs"
    assert all((thumbs / image["o"]).is_file() for image in data["images"]) and len(list(thumbs.glob("*.jpg"))) == 4
    # the datasheet's tables: counts per category, and what stage 1 dropped and why
    counts = dict(re.findall(r'<tr><td class="text">([^<]+)</td><td data-v="(\d+)">', html))
    assert {name: int(counts[name]) for name in shown} == dict(shown)
    assert "<li>near-uniform: 1</li>" in html and 'id="bank-stages"' in html
    assert "20 questions about 4 images" in html and 'id="gallery-data"' not in html


def test_bank_questions_answers_and_names_are_data_not_markup(tmp_path, capsys):
    payload_image = _image(tmp_path / "p.png", (0, 0, 200))
    questions = [{"id": f"q{i}", "image_id": '<b>img</b>"', "image": payload_image, "question": text, "type": "short",
                  "answer": PAYLOADS[-1 - i], "category": "<i>cat</i>", "source": "<u>src</u>"}
                 for i, text in enumerate(PAYLOADS)]
    questions.append({"id": "mc", "image_id": "plain", "question": "Which colour?", "type": "mc", "answer": "B",
                      "choices": ["red", "<img src=x onerror=alert(7)>"], "category": "colour"})
    stages = [{"stage": "curate", "counts": {"in": 9, "out": 5},
               "dropped": {"judge disagrees: <script>alert(8)</script>": 4}, "model_calls": {}, "seconds": 0.5}]
    build = _build_folder(tmp_path, questions, stages=stages)
    assert main(["report", str(build)]) == 0  # no scores.jsonl, no turing: the bank alone
    assert f"report: {build / 'report.html'}" in capsys.readouterr().out
    html = (build / "report.html").read_text()
    assert html.count("<script") == 2 and "<img src=x" not in html and "<svg onload" not in html
    assert "<b>img" not in html and "<i>cat" not in html and "<u>src" not in html and "<!-- <script" not in html
    assert "judge disagrees: &lt;script&gt;alert(8)&lt;/script&gt;: 4" in html
    data = _bank_blob(html)
    first, second = data["images"]
    assert [q["q"] for q in first["q"]] == PAYLOADS and [q["a"] for q in first["q"]] == PAYLOADS[::-1]
    assert (first["im"], first["source"], first["q"][0]["c"]) == ('<b>img</b>"', "<u>src</u>", "<i>cat</i>")
    assert second["q"][0]["a"] == "B. <img src=x onerror=alert(7)>" and second["q"][0]["ch"][1].startswith("<img")
    assert data["categories"] == ["<i>cat</i>", "colour"] and data["types"] == ["mc", "short"]


def test_bank_gallery_in_chromium(tmp_path, browser):
    colours = [(200, 0, 0), (0, 150, 0), (0, 0, 220)]
    questions = []
    for i in range(30):  # 30 images: two pages of 24
        path = _image(tmp_path / f"im{i}.png", colours[i % 3])
        questions.append({"id": f"{i}a", "image_id": f"im{i:02d}", "image": path, "question": f"What colour is {i}?",
                          "type": "short", "answer": "red", "category": "colour"})
        if i % 3 == 0:  # every third image also has a counting question, and two carry payloads
            questions.append({"id": f"{i}b", "image_id": f"im{i:02d}", "image": path,
                              "question": PAYLOADS[i % 2] if i < 6 else "How many shapes?", "type": "mc",
                              "answer": "A", "choices": ["1", "2"], "category": "count"})
    page, problems = _open(browser, write_html_report(_build_folder(tmp_path, questions)))
    cards = page.locator("#bank-items .card")
    assert cards.count() == 24 and page.locator(".bank-pager .page").first.text_content() == "page 1 of 2"
    assert page.locator("#bank-items img").count() == 24
    page.select_option("#bank-category", "count")
    assert cards.count() == 10 and page.locator("#bank-items li").count() == 10
    assert page.locator("#bank-count").text_content() == "10 of 40 questions, 10 of 30 images"
    shown = page.locator("#bank-items .question").all_text_contents()
    assert PAYLOADS[0] in shown and PAYLOADS[1] in shown  # as text
    page.select_option("#bank-category", "")
    page.select_option("#bank-type", "short")
    assert page.locator("#bank-count").text_content() == "30 of 40 questions, 30 of 30 images"
    page.locator(".bank-pager button", has_text="»").first.click()
    assert cards.count() == 6
    assert page.locator("script").count() == 2 and page.locator("img[src='x'], svg[onload]").count() == 0
    assert page.title() == "caprecon report: build" and problems == []
    page.close()


def test_unsupported_claims_are_marked_and_filtered_in_chromium(tmp_path, browser):
    unsupported = [{"claim": "there is a green shape", "type": "entity", "span": "green triangle", "p_yes": 0.2,
                    "gated": False},
                   {"claim": "the green shape is a triangle", "type": "attribute", "span": "triangle", "p_yes": 0.0,
                    "gated": True},
                   {"claim": "the dog is purple", "type": "attribute", "span": "words nowhere", "p_yes": 0.1,
                    "gated": False}]
    records = [{"id": "h", "caption": "a red circle and a green triangle", "halluc": 0.5,
                "halluc_unsupported": unsupported},
               {"id": "ok", "caption": "a red circle", "halluc": 0.9, "halluc_unsupported": []}]
    page, problems = _open(browser, write_html_report(_run(tmp_path, records)))
    marks = page.locator("#gallery-items .card[data-id='h'] mark.halluc")
    # the entity's words are marked once; the gated attribute's lie inside them; the third is not in the caption
    assert marks.all_text_contents() == ["green triangle"]
    assert "P(yes) 0.2000" in marks.first.get_attribute("title")
    listed = page.locator("#gallery-items .card[data-id='h'] details.halluc li .question").all_text_contents()
    assert listed == [u["claim"] for u in unsupported]
    assert page.locator("#gallery-items .card[data-id='ok'] mark").count() == 0
    page.check("#gallery-halluc")
    ids = page.locator("#gallery-items .card").evaluate_all("cards => cards.map(c => c.dataset.id)")
    assert ids == ["h"] and problems == []
    page.close()


def test_per_row_sub_scores_and_flips_are_arrays_aligned_to_shared_names(tmp_path):
    flip = {"question": "How many dogs?", "category": "counting", "answer": "2", "on_original": "2",
            "on_reconstruction": "3"}
    records = [{"id": "a", "caption": "two dogs", "turing": 0.5, "turing/counting": 0.25, "turing/scene": 1.0,
                "turing_flipped": [flip]},
               {"id": "b", "caption": "a cat", "turing": 1.0, "turing/scene": 0.5}]
    data = _blob(write_html_report(_run(tmp_path, records)).read_text(encoding="utf-8"))
    assert data["other"] == ["turing/counting", "turing/scene"]
    items = {item["i"]: item for item in data["items"]}
    assert items["a"]["x"] == [0.25, 1.0] and items["b"]["x"] == [None, 0.5]
    assert data["flip_fields"] == ["question", "category", "answer", "on_original", "on_reconstruction"]
    assert items["a"]["f"] == [["How many dogs?", "counting", "2", "2", "3"]] and "f" not in items["b"]


def test_a_small_picture_file_is_its_own_thumbnail(tmp_path):
    """A JPEG or PNG at most 384 pixels (half as large again as a 256-pixel thumbnail) and 64 KiB is
    shown as its own bytes, not decoded and encoded again; a larger one, or a format a browser may
    not show, is made a JPEG of at most 256 pixels."""
    from caprecon.store.thumbs import make_thumbnails, thumbnail_of

    small_jpeg, small_png = tmp_path / "small.jpg", tmp_path / "small.png"
    Image.new("RGB", (320, 240), (200, 10, 10)).save(small_jpeg)
    Image.new("RGB", (384, 100), (10, 10, 200)).save(small_png)
    wide, bmp = _image(tmp_path / "wide.png", (10, 200, 10), size=(385, 100)), tmp_path / "small.bmp"
    Image.new("RGB", (100, 100), (9, 9, 9)).save(bmp)
    heavy = tmp_path / "noise.png"  # 320x240 pixels, but about 230 KB
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (240, 320, 3), dtype=np.uint8)).save(heavy)
    assert heavy.stat().st_size > 64 * 1024
    folder = tmp_path / "thumbs"
    names = make_thumbnails([str(small_jpeg), str(small_png), wide, str(bmp), str(heavy)], folder)
    assert (folder / names[str(small_jpeg)]).read_bytes() == small_jpeg.read_bytes()
    assert (folder / names[str(small_png)]).read_bytes() == small_png.read_bytes()
    assert Image.open(folder / names[wide]).size == (256, 66) and Image.open(folder / names[wide]).format == "JPEG"
    assert Image.open(folder / names[str(bmp)]).format == "JPEG"
    assert Image.open(folder / names[str(heavy)]).size == (256, 192)
    assert Image.open(folder / names[str(heavy)]).format == "JPEG"

    cache = tmp_path / "cache"  # from pixels in memory (as a run makes them): the file's bytes too
    with Image.open(small_jpeg) as im:
        assert thumbnail_of(im.convert("RGB"), str(small_jpeg), cache)
    assert [p.read_bytes() for p in cache.rglob("*.jpg")] == [small_jpeg.read_bytes()]


def test_thumbnails_already_made_need_no_job_and_keep_the_root_check(tmp_path, monkeypatch):
    import caprecon.store.thumbs as thumbs

    sources = []
    for i in range(3):
        Image.new("RGB", (40, 30), (80 * i, 0, 0)).save(tmp_path / f"{i}.png")
        sources.append(str(tmp_path / f"{i}.png"))
    folder = tmp_path / "thumbs"
    first = thumbs.make_thumbnails(sources, folder)
    assert all(first.values())
    jobs = []
    real = thumbs._write
    monkeypatch.setattr(thumbs, "_write", lambda *a: (jobs.append(a[0]), real(*a))[1])
    Image.new("RGB", (40, 30)).save(tmp_path / "3.png")
    again = thumbs.make_thumbnails([*sources, str(tmp_path / "3.png")], folder)
    assert jobs == [str(tmp_path / "3.png")]  # only the new picture is a job
    assert {s: again[s] for s in sources} == first and again[str(tmp_path / "3.png")]
    elsewhere = tmp_path / "root"
    elsewhere.mkdir()
    assert set(thumbs.make_thumbnails(sources, folder, image_root=elsewhere).values()) == {None}


def test_the_radar_chart_is_drawn_again_only_when_its_table_changes(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    import matplotlib.figure

    from caprecon.reports.categories import CategoryTable, OVER_QUESTIONS, radar_chart

    table = CategoryTable(metric="turing", captioners=["A"], categories=["x", "y", "z"],
                          rows={"A": {"x": 0.5, "y": 0.25, "z": 1.0, OVER_QUESTIONS: 0.5}})
    path = radar_chart(table, tmp_path / "radar.png", title="t")
    drawn = path.read_bytes()
    real = matplotlib.figure.Figure
    draws = []
    monkeypatch.setattr(matplotlib.figure, "Figure", lambda *a, **k: (draws.append(1), real(*a, **k))[1])
    radar_chart(table, path, title="t")
    assert draws == [] and path.read_bytes() == drawn
    table.rows["A"]["x"] = 0.75
    radar_chart(table, path, title="t")
    assert draws == [1] and path.read_bytes() != drawn
