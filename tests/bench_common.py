"""Pieces the scoring benchmarks (benchmarks/overhead.py, throughput.py) share, kept beside the
tiny models they use: the synthetic samples they score and a timer for
the HTML report every `score` run ends with (timed on its own, so a ratio can be read
with and without it)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
from PIL import Image


def file_creation_ms(folder: Path, n: int = 200) -> float:
    """CPU milliseconds (user + kernel) this process spends creating one empty file in a new
    folder under `folder`, made as the store makes each reconstruction's file (`write_file`);
    what it costs by file system: docs/scale.md. The files stay: deleting them would make the
    next files the benchmark creates dearer still (ext4 without a journal)."""
    from caprecon.core.paths import write_file

    probe = folder / "file-creation-probe"
    probe.mkdir(parents=True)
    started = time.process_time()
    for i in range(n):
        write_file(probe / f"f{i}", b"")
    return (time.process_time() - started) / n * 1e3


class ReportTimer:
    """Wraps `caprecon.reports.html.write_html_report` and adds up the seconds it takes."""

    def __init__(self) -> None:
        self.seconds: list[float] = []

    def install(self) -> None:
        import caprecon.reports.html

        real = caprecon.reports.html.write_html_report

        def write(*args, **kwargs):
            started = time.perf_counter()
            try:
                return real(*args, **kwargs)
            finally:
                self.seconds.append(time.perf_counter() - started)

        caprecon.reports.html.write_html_report = write


def write_samples(folder: Path, n: int, *, seed: int = 0, tag: str = "") -> tuple[Path, list[dict]]:
    """`n` random 320x240 JPEGs with captions, as `samples.jsonl` in `folder`, and its rows.
    Another `seed` makes other pictures; `tag` ends every caption (so other reconstructions)."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        path = folder / f"img{i}.jpg"
        Image.fromarray(rng.integers(0, 255, (240, 320, 3), dtype=np.uint8)).save(path)
        rows.append({"id": str(i), "image": str(path), "caption": f"a photo of scene number {i} with a red car{tag}"})
    samples = folder / "samples.jsonl"
    samples.write_text("\n".join(json.dumps(r) for r in rows))
    return samples, rows


def small_pictures(folder: Path, n: int, caption: str = "picture number {i}") -> Path:
    """`n` random 32x24 PNGs `p{i}.png` in `folder` and `in.jsonl` naming them relative to it
    (ids `r{i}`, captions `caption` with `{i}` filled): the runs the lifecycle and resume tests stop."""
    rng = np.random.default_rng(3)
    rows = []
    for i in range(n):
        Image.fromarray(rng.integers(0, 255, (24, 32, 3), dtype=np.uint8)).save(folder / f"p{i}.png")
        rows.append({"id": f"r{i}", "image": f"p{i}.png", "caption": caption.format(i=i)})
    path = folder / "in.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path
