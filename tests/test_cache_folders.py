"""A run writes only where it was told to. The memo of file digests (`digests.sqlite`) lives in the
run's --cache-dir, not in the default cache folder under $HOME; under --no-cache or --cache-read-only
it is kept in the process alone. Each run is a fresh process whose HOME and XDG_CACHE_HOME point at an
empty folder, walked afterwards; the memo's reuse is seen in a second process, whose answer for the
image must be the file's sha256 computed here."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

import numpy as np
from PIL import Image

# a run of `caprecon` that reports every digest the image reader found remembered (None: it hashed)
_SPY = """
import json, sys
import caprecon.data.images as images
asked = []
remembered = images.known_digest
def spy(ident):
    found = remembered(ident)
    asked.append([ident[0], found])
    return found
images.known_digest = spy
from caprecon.cli import main
code = main(sys.argv[1:])
print("ASKED " + json.dumps(asked))
sys.exit(code)
"""


def _run(tmp_path, tiny_clip, *flags, out):
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    env = {key: value for key, value in os.environ.items() if key not in ("CAPRECON_CACHE", "XDG_CACHE_HOME")}
    env.update(HOME=str(home), XDG_CACHE_HOME=str(home / ".cache"), HF_HUB_OFFLINE="1",
               PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    done = subprocess.run([sys.executable, "-c", _SPY, "score", "-i", str(tmp_path / "rows.jsonl"), "-m",
                           "clipscore", "--clip", str(tiny_clip), *flags, "--out", str(tmp_path / out), "-q"],
                          capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    asked = json.loads(next(line for line in done.stdout.splitlines() if line.startswith("ASKED "))[6:])
    written_home = sorted(str(p.relative_to(home)) for p in home.rglob("*"))
    return dict(asked), written_home


def _inputs(tmp_path):
    picture = tmp_path / "pic.png"
    Image.fromarray(np.random.default_rng(3).integers(0, 255, (24, 32, 3), dtype=np.uint8)).save(picture)
    (tmp_path / "rows.jsonl").write_text(json.dumps({"id": "r", "image": "pic.png", "caption": "noise"}) + "\n")
    return str(picture.resolve()), hashlib.sha256(picture.read_bytes()).hexdigest()


def test_the_digest_memo_follows_cache_dir_and_nothing_is_written_under_home(tmp_path, tiny_clip):
    picture, digest = _inputs(tmp_path)
    cache = tmp_path / "elsewhere"
    asked, home = _run(tmp_path, tiny_clip, "--cache-dir", str(cache), out="first")
    assert asked == {picture: None} and home == []  # hashed, and nothing under HOME
    assert (cache / "digests.sqlite").is_file()
    asked, home = _run(tmp_path, tiny_clip, "--cache-dir", str(cache), out="second")
    assert asked == {picture: digest} and home == []  # a new process found it in --cache-dir's memo


def test_no_cache_and_a_read_only_cache_keep_the_memo_in_the_process(tmp_path, tiny_clip):
    picture, _ = _inputs(tmp_path)
    cache = tmp_path / "shared"
    _run(tmp_path, tiny_clip, "--cache-dir", str(cache), out="fill")
    (cache / "digests.sqlite").unlink()
    for name in ("digests.sqlite-wal", "digests.sqlite-shm"):
        (cache / name).unlink(missing_ok=True)
    for flags in (["--cache-dir", str(cache), "--cache-read-only"], ["--no-cache"]):
        asked, home = _run(tmp_path, tiny_clip, *flags, out=f"run{len(flags)}")
        assert asked == {picture: None} and home == [], flags
        assert sorted(p.name for p in cache.glob("digests*")) == [], flags  # no memo made in the shared cache


def _python(tmp_path, code):
    """`code` run by a fresh interpreter whose HOME and XDG_CACHE_HOME are an empty folder; what
    it wrote there, walked afterwards."""
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    env = {key: value for key, value in os.environ.items() if key not in ("CAPRECON_CACHE", "XDG_CACHE_HOME")}
    env.update(HOME=str(home), XDG_CACHE_HOME=str(home / ".cache"), HF_HUB_OFFLINE="1",
               PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    return sorted(str(p.relative_to(home)) for p in home.rglob("*"))


def test_distill_and_the_reward_keep_the_memo_in_their_cache_folder(tmp_path):
    """The training path: `distill` hashes its packaged encoders' files, and the reward built on the
    distilled folder hashes them again, each into its cache_dir's memo, nothing under HOME."""
    from oracle import render

    pictures = [tmp_path / f"pic{i}.png" for i in range(4)]
    for i, picture in enumerate(pictures):
        render("red circle" if i % 2 else "blue square", 48, 48).save(picture)
    picture = pictures[0]
    run = tmp_path / "run"
    run.mkdir()
    rows = [{"id": f"r{i}-{caption}", "image": str(path), "caption": caption, "recon": value}
            for i, path in enumerate(pictures) for caption, value in (("a red circle", 1.0), ("a blue square", 0.0))]
    (run / "scores.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    (run / "manifest.json").write_text(json.dumps({"samples": len(rows)}))
    cache = tmp_path / "cache"
    home = _python(tmp_path, f"import caprecon; caprecon.distill([{str(run)!r}], 'recon', {str(tmp_path / 'reward')!r}, "
                             f"hidden=4, epochs=1, cache_dir={str(cache)!r})")
    assert home == [] and (cache / "digests.sqlite").is_file()
    reward_cache = tmp_path / "reward-cache"
    home = _python(tmp_path, "import caprecon; from PIL import Image; "
                             f"r = caprecon.Reward(['distilled:{tmp_path / 'reward'}'], guards=None, "
                             f"cache_dir={str(reward_cache)!r}); print(r([Image.open({str(picture)!r})], ['a red circle']))")
    assert home == [] and (reward_cache / "digests.sqlite").is_file()
