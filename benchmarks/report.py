"""How long the HTML report takes for a big run, and how fast its page paints.

A synthetic run of 10,000 scored samples (2,000 small originals, each described by five
captioners, every caption with its own small reconstruction; recon, turing with its
categories and flipped questions) is written to a temporary folder. Prints, from this
one process:

- report generation, cold (12,000 thumbnails to write) and warm (thumbnails reused)
- the page's size, without its thumbnails
- first contentful paint of report.html opened from file:// in headless Chromium  (goal <= 1 s)
- time until the first gallery page is drawn                                        (goal <= 1 s)

Usage: python benchmarks/report.py [--samples 10000] [--captioners 5] [--side 64]
Needs Debian's chromium (apt-get install chromium) and `pip install playwright` for the browser lines.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

from caprecon.reports.html import write_html_report

CATEGORIES = ("perception", "scene", "spatial", "counting")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def synthetic_run(folder: Path, samples: int, captioners: int, side: int) -> None:
    rng = np.random.default_rng(0)
    pick = random.Random(0)
    images = folder / "images"
    images.mkdir(parents=True)
    records = []
    for i in range(samples):
        image_id = f"img{i // captioners:05d}"
        original = images / f"{image_id}.png"
        if i % captioners == 0:
            Image.fromarray(rng.integers(0, 255, (side, side, 3), dtype=np.uint8)).save(original)
        reconstruction = images / f"recon{i:05d}.png"
        Image.fromarray(rng.integers(0, 255, (side, side, 3), dtype=np.uint8)).save(reconstruction)
        record = {"id": f"s{i:05d}", "image_id": image_id, "candidate": 0, "captioner": f"model-{i % captioners}",
                  "caption": " ".join(pick.choice(("a", "red", "dog", "on", "the", "grass", "near", "two", "trees"))
                                      for _ in range(pick.randint(6, 40))),
                  "image": str(original), "reconstruction": str(reconstruction), "seed": i, "tokens_cut": 0,
                  "recon": pick.random(), "turing": pick.random(), "turing_upper": 0.9, "turing_n": 8}
        record["turing_gap"] = record["turing_upper"] - record["turing"]
        for category in CATEGORIES:
            record[f"turing/{category}"] = pick.random()
            record[f"turing_upper/{category}"] = 0.9
            record[f"turing_n/{category}"] = 2
        record["turing_flipped"] = [{"question": "What colour is the dog?", "category": "perception", "answer": "red",
                                     "on_original": "red", "on_reconstruction": "brown"}][: pick.randint(0, 1)]
        if i % 500 == 7:
            record = {k: record[k] for k in ("id", "image_id", "captioner", "caption", "image")}
            record["error"] = f"row {i}: cannot decode image"
        records.append(record)
    (folder / "scores.jsonl").write_text("\n".join(json.dumps(r) for r in records))
    (folder / "summary.json").write_text(json.dumps({"metrics": {"recon": {}, "turing": {}}}))


def first_paint(report: Path) -> tuple[float, float] | None:
    executable = shutil.which("chromium") or shutil.which("chromium-browser")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        return None
    if executable is None:
        return None
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.goto(report.resolve().as_uri())
        page.wait_for_selector("#gallery-items .card")
        page.wait_for_timeout(300)  # paint entries are recorded once the frame is presented
        paint, drawn = page.evaluate("""[performance.getEntriesByName('first-contentful-paint')[0].startTime,
                                         performance.getEntriesByName('gallery-drawn')[0].startTime]""")
        browser.close()
    return paint / 1000, drawn / 1000


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=10_000)
    parser.add_argument("--captioners", type=int, default=5)
    parser.add_argument("--side", type=int, default=64)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "run"
        synthetic_run(run, args.samples, args.captioners, args.side)
        started = time.perf_counter()
        report = write_html_report(run)
        cold = time.perf_counter() - started
        started = time.perf_counter()
        write_html_report(run)
        warm = time.perf_counter() - started
        thumbs = len(list((run / "report_files" / "thumbs").glob("*.jpg")))
        print(f"samples                          {args.samples}")
        print(f"report, cold ({thumbs} thumbnails) {cold:8.2f} s")
        print(f"report, warm (thumbnails reused) {warm:8.2f} s")
        print(f"report.html size                 {report.stat().st_size / 1e6:8.2f} MB")
        painted = first_paint(report)
        if painted is None:
            print("first paint                      skipped: needs chromium and playwright", file=sys.stderr)
            return
        paint, drawn = painted
        print(f"first contentful paint           {paint:8.3f} s  goal <= 1")
        print(f"first gallery page drawn by      {drawn:8.3f} s  goal <= 1")


if __name__ == "__main__":
    main()
