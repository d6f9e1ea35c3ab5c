"""Start-up: a command imports only what it uses. Checked in fresh interpreters, since this
test process has long imported everything."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import caprecon

HEAVY = ("scipy", "scipy.stats", "transformers", "diffusers")
SRC = str(Path(caprecon.__file__).resolve().parents[1])


def _imported_by(argv: list[str]) -> set[str]:
    """The heavy modules loaded by `caprecon ARGV` in a fresh interpreter."""
    code = ("import sys\nfrom caprecon.cli import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
            f"print('LOADED', *[m for m in {HEAVY!r} if m in sys.modules])")
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", ""), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, env=env, timeout=300)
    line = [ln for ln in done.stdout.splitlines() if ln.startswith("LOADED")]
    assert line, done.stderr[-2000:]
    return set(line[-1].split()[1:])


@pytest.mark.parametrize("argv", [["--help"], ["models"], ["score", "--help"]])
def test_help_and_models_import_neither_scipy_nor_transformers(argv):
    assert _imported_by(argv) == set()


def test_a_fully_cached_score_imports_neither_scipy_stats_nor_transformers(tmp_path, tiny_sd, tiny_dinov2):
    rng = np.random.default_rng(0)
    rows = []
    for i in range(3):
        Image.fromarray(rng.integers(0, 255, (24, 32, 3), dtype=np.uint8)).save(tmp_path / f"{i}.png")
        rows.append({"id": str(i), "image": str(tmp_path / f"{i}.png"), "caption": f"a boat on a lake {i}"})
    samples = tmp_path / "samples.jsonl"
    samples.write_text("\n".join(json.dumps(r) for r in rows))
    argv = ["score", "-i", str(samples), "-m", "recon", "--generator", str(tiny_sd), "--embedder", str(tiny_dinov2),
            "--max-side", "32", "--generator-opt", "steps=2", "--cache-dir", str(tmp_path / "cache"), "--quiet"]
    first = caprecon.score(samples, ["recon"], generator=str(tiny_sd), embedder=str(tiny_dinov2), max_side=32,
                           generator_options={"steps": 2}, cache_dir=str(tmp_path / "cache"))
    assert first.manifest["cache"]["generated"] == 3
    loaded = _imported_by([*argv, "--out", str(tmp_path / "cached")])
    scored = [json.loads(line) for line in (tmp_path / "cached" / "scores.jsonl").open()]
    assert [r["recon"] for r in scored] == pytest.approx([r["recon"] for r in first.records])
    # the HTML report's Student-t interval takes scipy.special, a small part of scipy
    assert not loaded & {"scipy.stats", "transformers", "diffusers"}, loaded
