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

from memo_files import memo_rows

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

    # four different photos, each with captions no other photo has (distill leaves out of training
    # the captions a held-out photo also has, and counts one photo under two names once)
    shown = ["red circle", "blue square", "green triangle", "yellow circle"]
    pictures = [tmp_path / f"pic{i}.png" for i in range(4)]
    for picture, scene in zip(pictures, shown):
        render(scene, 48, 48).save(picture)
    picture = pictures[0]
    run = tmp_path / "run"
    run.mkdir()
    rows = [{"id": f"r{i}-{said}", "image": str(path), "caption": f"a {said}, picture {i}", "recon": float(said == scene)}
            for i, (path, scene) in enumerate(zip(pictures, shown)) for said in ("red circle", "blue square")]
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


_TWO_RUNS = """
import json, sys
import caprecon
from oracle import OracleGenerator, PixelEmbedder
folders, pictures = json.loads(sys.argv[1]), json.loads(sys.argv[2])
def reward(**cache):
    return caprecon.Reward(["recon"], guards=None, generator=OracleGenerator(), embedder=PixelEmbedder(), max_side=32,
                           progress=False, **cache)
first = reward(cache_dir=folders["first"])
second = reward(cache_dir=folders["second"])  # the last reward built
uncached = reward(no_cache=True)
rows = [{"id": "s", "image": pictures["score"], "caption": "a red circle"}]
# a score run between the rewards' calls, its files read on reading threads (workers)
caprecon.score(rows, ["recon"], generator=OracleGenerator(), embedder=PixelEmbedder(), max_side=32, workers=2,
               batch_size=1, cache_dir=folders["score"])
print(uncached([pictures["uncached"]], ["a red circle"]), first([pictures["first"]], ["a red circle"]),
      second([pictures["second"]], ["a blue square"]))
from caprecon.core.digests import memo_folder
print("AFTER", memo_folder())  # each run's folder ended with its call
"""


def test_two_runs_in_one_process_keep_each_memo_in_its_own_folder(tmp_path):
    """Two rewards with their own cache folders and a score run with a third, in one process: each
    file a run hashes is remembered in that run's folder's memo and no other (the last reward built
    does not take the first's files), the score run's reading threads write into its folder too, a
    reward under no_cache writes no memo, no run's folder outlives its call, and nothing is written
    under HOME. The memo's rows are the
    files' real paths and the sha256 of their bytes, computed here."""
    import json

    from oracle import render

    pictures = {}
    for n, name in enumerate(("first", "second", "score", "uncached")):
        pictures[name] = tmp_path / f"{name}.png"
        render("red circle" if n % 2 == 0 else "blue square", 32, 32).save(pictures[name])
    folders = {name: tmp_path / f"cache-{name}" for name in ("first", "second", "score")}
    home = tmp_path / "home"
    home.mkdir()
    env = {key: value for key, value in os.environ.items() if key not in ("CAPRECON_CACHE", "XDG_CACHE_HOME")}
    env.update(HOME=str(home), XDG_CACHE_HOME=str(home / ".cache"), HF_HUB_OFFLINE="1",
               PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    done = subprocess.run([sys.executable, "-c", _TWO_RUNS, json.dumps({k: str(v) for k, v in folders.items()}),
                           json.dumps({k: str(v) for k, v in pictures.items()})],
                          capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines()[-1] == "AFTER None"
    for name, folder in folders.items():
        picture = pictures[name]
        assert memo_rows(folder) == {os.path.realpath(picture): hashlib.sha256(picture.read_bytes()).hexdigest()}, \
            name
    assert sorted(str(p.relative_to(home)) for p in home.rglob("*")) == []
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("cache")) == \
        ["cache-first", "cache-score", "cache-second"]  # the reward under no_cache made no cache folder
