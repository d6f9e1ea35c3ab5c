"""A `caprecon score` process killed (SIGKILL) part-way, three times, then interrupted
(SIGINT) once, then finished: every row once, no stored reconstruction made again, the
scores of an uninterrupted run."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench_common import small_pictures

SRC = Path(__file__).parents[1] / "src"
ROWS = 9


def _command(data, tiny_sd, tiny_dinov2, out, cache):
    return [sys.executable, "-m", "caprecon.cli", "score", "-i", str(data), "-m", "recon",
            "--generator", str(tiny_sd), "--generator-opt", "steps=2", "--embedder", str(tiny_dinov2),
            "--max-side", "32", "--batch-size", "1", "--cache-dir", str(cache), "--out", str(out), "-q"]


def _env():
    return {**os.environ, "PYTHONPATH": f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
            "HF_HUB_OFFLINE": "1"}


def _lines(path: Path) -> int:
    return path.read_text().count("\n") if path.exists() else 0


def _stored_images(cache: Path) -> dict[str, tuple[int, int]]:
    """Each stored reconstruction by name -> (inode, mtime): a regenerated image gets a new file."""
    return {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in (cache / "images").rglob("*.png")}


@pytest.mark.slow
def test_three_sigkills_then_finish(tmp_path, tiny_sd, tiny_dinov2):
    data = small_pictures(tmp_path, ROWS, "a picture with {i} things")

    reference = subprocess.run(_command(data, tiny_sd, tiny_dinov2, tmp_path / "ref", tmp_path / "ref-cache"),
                               env=_env(), capture_output=True, text=True, timeout=600)
    assert reference.returncode == 0, reference.stderr

    out, cache = tmp_path / "run", tmp_path / "cache"
    scores = out / "scores.jsonl"
    seen: dict[str, tuple[int, int]] = {}
    for kill in range(3):
        before = _lines(scores)
        proc = subprocess.Popen(_command(data, tiny_sd, tiny_dinov2, out, cache), env=_env(),
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.time() + 300
        while _lines(scores) <= before and proc.poll() is None and time.time() < deadline:
            time.sleep(0.02)
        assert proc.poll() is None, f"run {kill} ended before it could be killed: {proc.stderr.read()}"
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        proc.stderr.close()
        stored = _stored_images(cache)
        assert all(stored[name] == seen[name] for name in seen), "a stored reconstruction was written again"
        seen = stored
    # then Ctrl-C: one line that says how to resume, no traceback
    before = _lines(scores)
    proc = subprocess.Popen(_command(data, tiny_sd, tiny_dinov2, out, cache), env=_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    while _lines(scores) <= before and proc.poll() is None:
        time.sleep(0.02)
    proc.send_signal(signal.SIGINT)
    err = proc.communicate(timeout=120)[1]
    assert proc.returncode == 130 and "Traceback" not in err, err
    assert "run the same command again to resume" in err.strip().splitlines()[-1]
    assert json.loads((out / "summary.json").read_text())["complete"] is False
    stored = _stored_images(cache)
    assert all(stored[name] == seen[name] for name in seen), "a stored reconstruction was written again"
    seen = stored
    kept = _lines(scores)
    assert 4 <= kept < ROWS

    final = subprocess.run(_command(data, tiny_sd, tiny_dinov2, out, cache), env=_env(), capture_output=True,
                           text=True, timeout=600)
    assert final.returncode == 0, final.stderr
    records = [json.loads(line) for line in scores.read_text().splitlines()]
    assert [r["id"] for r in records] == [f"r{i}" for i in range(ROWS)]  # every row exactly once, in order
    expected = {r["id"]: r["recon"] for r in map(json.loads, (tmp_path / "ref" / "scores.jsonl").open())}
    assert {r["id"]: r["recon"] for r in records} == pytest.approx(expected, abs=1e-6)

    stored = _stored_images(cache)
    assert len(stored) == ROWS and all(stored[name] == seen[name] for name in seen)
    manifest = json.loads((out / "manifest.json").read_text())
    # the final run generated exactly the reconstructions no killed run had stored, and kept the rows written
    assert manifest["cache"]["generated"] == ROWS - len(seen)
    assert manifest["cache"]["reused"] == len(seen) - manifest["resumed_rows"]
    assert manifest["resumed_rows"] == kept and manifest["status"] == "complete"
