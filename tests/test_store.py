"""The cache heals and shares: checksums, claims between processes, read-only caches with an
overlay, a damaged index, `caprecon cache verify/prune`, content-hashed weights, no secrets on disk."""

from __future__ import annotations

import gc
import hashlib
import json
import os
import shutil
import sqlite3
import stat
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import caprecon
import caprecon.run.score
from caprecon.cli.cache import parse_age, parse_size
from caprecon.store.maintenance import cache_prune, cache_verify
from caprecon.cli import main
from caprecon.run.failures import RunError
from caprecon.store.errors import StoreCorruptError, StoreFullError, StoreReadOnlyError
from caprecon.store.index import Store, content_key
from oracle import OracleGenerator, PixelEmbedder, render

TESTS = Path(__file__).parent
SRC = TESTS.parent / "src"
CAPTIONS = ["a red circle", "a blue square and a green circle", "a yellow triangle", "a purple square",
            "a black circle and a red square", "a green triangle"]


class CoarsePixelEmbedder(PixelEmbedder):
    """Another embedder (another fingerprint): its embeddings are not in the store yet, so
    scoring with it must read the reconstructions' pixels."""

    @property
    def fingerprint(self) -> str:
        return "pixel-embedder-coarse"


def _samples(folder: Path, n: int = len(CAPTIONS)) -> Path:
    rows = []
    for i, caption in enumerate(CAPTIONS[:n]):
        render(caption, 48, 48).save(folder / f"src{i}.png")
        rows.append({"id": f"s{i}", "image": str(folder / f"src{i}.png"), "caption": caption})
    path = folder / "samples.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    return path


def _score(samples, cache, embedder=None, **settings):
    return caprecon.score(samples, ["recon"], generator=OracleGenerator(), embedder=embedder or PixelEmbedder(),
                          max_side=48, cache_dir=str(cache), **settings)


def _tree_digest(folder: Path) -> dict[str, str]:
    # index.sqlite-shm is SQLite's shared-memory lock table, which every reader of a WAL index
    # updates (where it may); it holds no results. Nor does an empty index.sqlite-wal: a reader
    # makes one where the last connection of the run before removed it (when that happens
    # depends on when the garbage collector closes it), so only a log with content is compared
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and not p.name.endswith("-shm")
            and not (p.name.endswith("-wal") and p.stat().st_size == 0)}


# -- item 7: checksums ---------------------------------------------------------------


def test_truncated_or_altered_png_is_regenerated_never_scored(tmp_path):
    samples = _samples(tmp_path, n=3)
    first = _score(samples, tmp_path / "cache")
    pngs = [Path(r["reconstruction"]) for r in first.records]
    data = pngs[0].read_bytes()
    pngs[0].write_bytes(data[: len(data) // 2])  # truncated
    altered = bytearray(pngs[1].read_bytes())
    altered[len(altered) // 2] ^= 0xFF  # same size, one byte changed
    pngs[1].write_bytes(bytes(altered))

    again = _score(samples, tmp_path / "cache", embedder=CoarsePixelEmbedder())
    fresh = _score(samples, tmp_path / "fresh-cache", embedder=CoarsePixelEmbedder())
    assert again.manifest["cache"]["generated"] == 2 and again.manifest["cache"]["damaged"] == 2
    assert again.scores("recon") == fresh.scores("recon")
    assert pngs[0].read_bytes() == data  # healed in place


def test_value_failing_its_checksum_is_computed_again(tmp_path):
    store = Store(tmp_path)
    key = content_key("judge-answer", prompt="q")
    store.put_json("judge-answer", {key: "yes"})
    assert store.get_json([key]) == {key: "yes"}
    with sqlite3.connect(tmp_path / "index.sqlite") as db:
        db.execute("UPDATE results SET value = ? WHERE key = ?", (b'"no"', key))
    assert Store(tmp_path).get_json([key]) == {}  # not trusted, so recomputed by the caller


# -- item 8: claims --------------------------------------------------------------------


def test_claims_exclude_others_until_released_or_lapsed(tmp_path):
    a, b = Store(tmp_path, lease_seconds=0.3), Store(tmp_path, lease_seconds=0.3)
    assert a.claim(["k1", "k2"]) == {"k1", "k2"}
    assert b.claim(["k1", "k2", "k3"]) == {"k3"}
    a.release(["k1"])
    assert b.claim(["k1"]) == {"k1"}
    time.sleep(0.4)  # a stopped renewing: a crashed holder
    assert b.claim(["k2"]) == {"k2"}


def test_held_claims_are_renewed_while_the_work_lasts(tmp_path):
    """The store's one heartbeat keeps every held lease alive past its lifetime (two holds at
    once), and stops renewing a key once its hold ends."""
    # a lease of 1 s renewed every third of it: a beat may come late by half a second on a busy machine
    a, b = Store(tmp_path, lease_seconds=1.0), Store(tmp_path, lease_seconds=1.0)
    assert a.claim(["k1", "k2"]) == {"k1", "k2"}
    with a.holding(["k1"]):
        with a.holding(["k2"]):
            time.sleep(2.5)  # more than twice the lease
            assert b.claim(["k1", "k2"]) == set()
        assert b.claim(["k2"]) == {"k2"}  # released at the end of its hold
        time.sleep(1.2)
        assert b.claim(["k1"]) == set()  # still renewed
    assert b.claim(["k1"]) == {"k1"}


def test_the_heartbeat_ends_with_its_store(tmp_path):
    """A store that is gone takes its heartbeat thread with it at once, not after the thread's
    next sleep (a third of the lease: minutes), so a loop of runs does not pile up threads."""
    import gc
    import threading

    store = Store(tmp_path)  # the default lease: the heartbeat sleeps far longer than this test
    assert store.claim(["k"]) == {"k"}
    before = set(threading.enumerate())
    with store.holding(["k"]):
        (beat,) = [t for t in threading.enumerate() if t not in before]
    assert beat.name == "caprecon-claims"
    del store
    gc.collect()
    beat.join(5)
    assert not beat.is_alive()


def test_claim_of_a_dead_process_is_taken_over_at_once(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    store = Store(tmp_path)
    host = store.owner.split(":")[0]
    with sqlite3.connect(tmp_path / "index.sqlite") as db:
        db.execute("INSERT INTO claims VALUES (?, ?, ?)", ("k", f"{host}:{dead.stdout.strip()}:x", time.time() + 999))
        db.execute("INSERT INTO claims VALUES (?, ?, ?)", ("live", f"{host}:{os.getppid()}:x", time.time() + 999))
    assert store.claim(["k", "live"]) == {"k"}


def test_two_processes_on_one_cache_generate_each_reconstruction_once(tmp_path):
    samples = _samples(tmp_path)
    rows = [json.loads(line) for line in samples.read_text().splitlines()]
    samples.write_text("\n".join(json.dumps({**r, "id": f"{r['id']}-{c}", "caption": f"{r['caption']} number {c}"})
                                 for r in rows for c in range(4)))  # 24 samples, 24 distinct reconstructions
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), str(TESTS)]), "HF_HUB_OFFLINE": "1"}
    command = [sys.executable, "-m", "caprecon.cli", "score", "-i", str(samples), "-m", "recon", "-q",
               "-g", "oracle:SteppedOracleGenerator", "--generator-opt", f"start_dir={tmp_path / 'start'}",
               "-e", "oracle:PixelEmbedder", "--max-side", "48", "--batch-size", "4",
               "--cache-dir", str(tmp_path / "cache")]
    procs = [subprocess.Popen([*command, "--out", str(tmp_path / f"run{i}")], env=env, stderr=subprocess.PIPE,
                              text=True) for i in range(2)]
    for p in procs:
        assert p.wait(timeout=300) == 0, p.stderr.read()
    manifests = [json.loads((tmp_path / f"run{i}" / "manifest.json").read_text()) for i in range(2)]
    assert sum(m["cache"]["generated"] for m in manifests) == 24
    assert all(m["cache"]["generated"] + m["cache"]["reused"] == 24 for m in manifests)
    scores = [(tmp_path / f"run{i}" / "scores.jsonl").read_text() for i in range(2)]
    assert scores[0] == scores[1]
    assert cache_verify(tmp_path / "cache")["ok"]


# -- item 9 (store part): a damaged index ---------------------------------------------------


def test_damaged_index_one_clear_message_then_repair(tmp_path, capsys):
    samples = _samples(tmp_path, n=2)
    cache = tmp_path / "cache"
    _score(samples, cache)
    gc.collect()  # the run's connections close (and checkpoint) now, not over the damage below
    index = cache / "index.sqlite"
    for extra in ("index.sqlite-wal", "index.sqlite-shm"):
        (cache / extra).unlink(missing_ok=True)
    index.write_bytes(b"this is not a database" * 100)
    with pytest.raises(StoreCorruptError):
        Store(cache)
    code = main(["score", "-i", str(samples), "-m", "recon", "-g", "oracle:OracleGenerator", "-e",
                 "oracle:PixelEmbedder", "--max-side", "48", "--cache-dir", str(cache), "-q"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert str(index) in err and "caprecon cache verify --repair" in err
    assert main(["cache", "verify", "--cache-dir", str(cache)]) == 1
    for png in (cache / "images").rglob("*.png"):  # left by the lost index: orphans once old enough
        os.utime(png, (time.time() - 3600,) * 2)
    assert main(["cache", "verify", "--repair", "--cache-dir", str(cache)]) == 0
    assert list(cache.glob("index.sqlite.damaged-*")) and not list((cache / "images").rglob("*.png"))
    assert _score(samples, cache).manifest["cache"]["generated"] == 2


# -- item 10: a read-only cache --------------------------------------------------------------


def _make_read_only(folder: Path) -> None:
    for p in [*folder.rglob("*"), folder]:
        p.chmod(p.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))


def _make_writable(folder: Path) -> None:
    for p in [folder, *folder.rglob("*")]:
        p.chmod(p.stat().st_mode | stat.S_IWUSR)


def test_read_only_cache_is_read_and_new_work_goes_to_an_overlay(tmp_path):
    samples = _samples(tmp_path, n=4)
    shared = tmp_path / "shared"
    two = tmp_path / "two.jsonl"
    two.write_text("\n".join(samples.read_text().splitlines()[:2]))
    filled = _score(two, shared)  # the shared cache holds two of the four
    gc.collect()  # its writer is gone, as a shared cache's would be
    _make_read_only(shared)  # no write bit anywhere: read-only even for root, who could write anyway
    before = _tree_digest(shared)
    try:
        run = _score(samples, shared, out=tmp_path / "run")
        assert run.manifest["cache"]["generated"] == 2 and run.manifest["cache"]["reused"] == 2
        assert run.scores("recon")[:2] == filled.scores("recon")
        assert run.manifest["store"]["read_only"] is False and run.manifest["store"]["below"]["read_only"]
        assert all(str(tmp_path / "run" / "cache-overlay") in r["reconstruction"] for r in run.records[2:])
        assert _tree_digest(shared) == before  # nothing written to the shared cache
        again = _score(samples, shared, out=tmp_path / "run")  # the overlay keeps the new work
        assert again.manifest["cache"]["generated"] == 0
        assert _score(two, shared).scores("recon") == filled.scores("recon")  # cached work needs no overlay
        with pytest.raises(RunError, match="--cache-overlay") as stopped:
            _score(samples, shared)  # new work, nowhere to put it: the run stops
        assert isinstance(stopped.value.__cause__, StoreReadOnlyError)
    finally:
        _make_writable(shared)


def test_read_only_flag_never_writes_even_where_writable(tmp_path):
    samples = _samples(tmp_path, n=2)
    cache = tmp_path / "cache"
    _score(samples, cache)
    before = _tree_digest(cache)
    run = _score(samples, cache, embedder=CoarsePixelEmbedder(), cache_read_only=True,
                 cache_overlay=str(tmp_path / "overlay"))
    assert run.manifest["cache"]["generated"] == 0 and run.manifest["cache"]["embedded"] == 4
    assert _tree_digest(cache) == before


# -- item 13: verify and prune ------------------------------------------------------------------


def test_verify_reports_and_repairs_orphans_missing_and_damaged_files(tmp_path):
    samples = _samples(tmp_path, n=4)
    cache = tmp_path / "cache"
    pngs = [Path(r["reconstruction"]) for r in _score(samples, cache).records]
    assert cache_verify(cache)["ok"]
    pngs[0].unlink()
    pngs[1].write_bytes(pngs[1].read_bytes()[:-10])
    orphan = cache / "images" / "zz" / ("z" * 64 + ".png")
    orphan.parent.mkdir()
    shutil.copy(pngs[2], orphan)
    os.utime(orphan, (time.time() - 3600,) * 2)
    report = cache_verify(cache)
    assert not report["ok"] and report["entries"] == 16  # 4 reconstructions, 8 embeddings (sources and reconstructions), 4 source sizes
    assert len(report["missing_files"]) == 1 and len(report["damaged_files"]) == 1
    assert report["orphans"] == [str(orphan.relative_to(cache))]
    cache_verify(cache, repair=True)
    assert cache_verify(cache)["ok"] and not orphan.exists()
    assert _score(samples, cache).manifest["cache"]["generated"] == 2


def test_old_index_is_migrated_and_pruned_by_model_age_and_size(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    with sqlite3.connect(cache / "index.sqlite") as db:  # the schema before checksums and models
        db.execute("CREATE TABLE results (key TEXT PRIMARY KEY, kind TEXT NOT NULL, value BLOB, created REAL NOT NULL)")
        db.execute("INSERT INTO results VALUES ('old', 'judge-answer', '\"yes\"', ?)", (time.time() - 40 * 86400,))
    store = Store(cache)
    assert store.get_json(["old"]) == {"old": "yes"}
    samples = _samples(tmp_path, n=3)
    _score(samples, cache)
    _score(samples, cache, embedder=CoarsePixelEmbedder())
    assert cache_verify(cache, repair=True)["checksums_added"] == 1
    assert cache_prune(cache, older_than=parse_age("30d"))["removed"] == 1
    assert Store(cache).get_json(["old"]) == {}
    coarse = cache_prune(cache, model="pixel-embedder-coarse", dry_run=True)
    assert coarse["removed"] == 6 and coarse["entries"] == 18  # 3 reconstructions, 6 + 6 embeddings, 3 source sizes
    assert cache_prune(cache, model="pixel-embedder-coarse")["removed"] == 6
    assert _score(samples, cache, embedder=CoarsePixelEmbedder()).manifest["cache"]["embedded"] == 6
    assert cache_prune(cache, max_size=parse_size("1MB"))["removed"] == 0
    total = cache_prune(cache, max_size=0, dry_run=True)["bytes_before"]
    oldest_first = [key for (key,) in sqlite3.connect(cache / "index.sqlite").execute(
        "SELECT key FROM results ORDER BY created")]
    report = cache_prune(cache, max_size=total // 2)
    assert 0 < report["removed"] < report["entries"] and report["bytes_after"] <= total // 2
    assert Store(cache).get_json(oldest_first[:1]) == {} and Store(cache).get_arrays(oldest_first[-1:])
    assert cache_verify(cache)["ok"]
    assert parse_size("10GB") == 10**10 and parse_size("2GiB") == 2 * 2**30 and parse_age("12h") == 43200


def test_cache_commands_print_and_exit(tmp_path, capsys):
    samples = _samples(tmp_path, n=2)
    cache = tmp_path / "cache"
    _score(samples, cache)
    assert main(["cache", "info", "--cache-dir", str(cache)]) == 0
    out = capsys.readouterr().out
    assert "reconstruction" in out and "pixel-embedder-v1" in out
    assert main(["cache", "prune", "--cache-dir", str(cache)]) == 2
    assert "--older-than" in capsys.readouterr().err
    assert main(["cache", "prune", "--max-size", "0B", "--cache-dir", str(cache)]) == 0
    assert "removed 8 of 8 entries" in capsys.readouterr().out  # 2 reconstructions, 4 embeddings, 2 source sizes


# -- issue 7 item 10: weights fingerprinted by content ---------------------------------------


def test_retrained_weights_of_the_same_size_are_a_new_model(tmp_path, tiny_sd):
    from safetensors import safe_open
    from safetensors.torch import save_file

    from caprecon.models.generator import DiffusersGenerator

    model = tmp_path / "sd"
    shutil.copytree(tiny_sd, model)
    samples = _samples(tmp_path, n=2)

    def run():
        return caprecon.score(samples, ["recon"], generator=str(model), embedder=PixelEmbedder(),
                              generator_options={"steps": 1}, max_side=32, cache_dir=str(tmp_path / "cache"))

    before = DiffusersGenerator(model, steps=1).fingerprint
    first = run()
    weights = next((model / "unet").glob("*.safetensors"))
    with safe_open(weights, "pt") as f:
        metadata, tensors = f.metadata(), {k: f.get_tensor(k) for k in f.keys()}
    size = weights.stat().st_size
    save_file({k: v * 1.01 for k, v in tensors.items()}, weights, metadata=metadata)  # "retrained"
    assert weights.stat().st_size == size
    assert DiffusersGenerator(model, steps=1).fingerprint != before
    second = run()
    assert first.manifest["cache"]["generated"] == 2 and second.manifest["cache"]["generated"] == 2


# -- item 15: secrets ----------------------------------------------------------------------


def test_api_key_never_reaches_disk_logs_or_messages(tmp_path, monkeypatch, capsys, caplog):
    key = "sk-test-9f8e7d6c5b4a"
    # one row: its failure stays a row error (the same error on a whole batch would stop the run)
    samples = _samples(tmp_path, n=1)
    out, cache = tmp_path / "run", tmp_path / "cache"
    argv = ["score", "-i", str(samples), "-m", "vqascore", "--judge", "tiny-judge",
            "--judge-opt", "base_url=http://127.0.0.1:9/v1", "--judge-opt", f"api_key={key}",
            "--judge-opt", "max_retries=0", "--judge-opt", "timeout=2", "--out", str(out), "--cache-dir", str(cache)]
    monkeypatch.setattr(sys, "argv", ["caprecon", *argv])
    caplog.set_level("DEBUG")
    main(["-v", *argv])
    captured = capsys.readouterr()
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["config"]["judge_options"]["api_key"] == "***" and manifest["command"]
    rows = [json.loads(line) for line in (out / "scores.jsonl").read_text().splitlines()]
    assert len(rows) == 1 and all("127.0.0.1:9" in r["error"] for r in rows)  # the error path ran, and was written
    def on_disk() -> dict:
        """Every file's bytes, read again whole when one vanishes while they are read: the index's
        write-ahead log is checkpointed and removed as its last connection closes, which may be a
        moment after the run returns, and its rows are then in the index, read again too."""
        for _ in range(20):
            try:
                return {p: p.read_bytes() for folder in (out, cache) for p in folder.rglob("*") if p.is_file()}
            except FileNotFoundError:
                time.sleep(0.05)
        raise AssertionError("the run folder and the cache never held still long enough to read")

    written = on_disk()
    assert written
    for path, content in written.items():
        assert key.encode() not in content, path
    assert key not in captured.out + captured.err + caplog.text


def test_api_key_from_named_environment_variable(monkeypatch):
    from caprecon.run.config import RunConfig
    from caprecon.run.roles import Roles
    from caprecon.core.errors import ConfigError
    from caprecon.models.openai_compat import OpenAICompatVLM

    monkeypatch.setenv("MY_JUDGE_KEY", "sk-from-env")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-default")
    assert OpenAICompatVLM("m", "http://127.0.0.1:9", api_key_env="MY_JUDGE_KEY").api_key == "sk-from-env"
    assert OpenAICompatVLM("m", "http://127.0.0.1:9").api_key == "sk-default"
    monkeypatch.delenv("MY_JUDGE_KEY")
    roles = Roles(RunConfig.build(judge="m", judge_options={"base_url": "http://127.0.0.1:9", "api_key_env": "MY_JUDGE_KEY"}))
    with pytest.raises(ConfigError, match="MY_JUDGE_KEY is not set"):
        roles.judge


def test_old_read_only_index_is_read_verified_and_listed(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    with sqlite3.connect(cache / "index.sqlite") as db:  # the schema before checksums, models and claims
        db.execute("CREATE TABLE results (key TEXT PRIMARY KEY, kind TEXT NOT NULL, value BLOB, created REAL NOT NULL)")
        db.execute("INSERT INTO results VALUES ('k', 'judge-answer', '\"yes\"', ?)", (time.time(),))
    _make_read_only(cache)
    try:
        assert Store(cache).get_json(["k"]) == {"k": "yes"}
        assert cache_verify(cache)["ok"] and cache_verify(cache)["entries"] == 1
        assert cache_prune(cache, max_size=0, dry_run=True)["removed"] == 1
        with pytest.raises(StoreReadOnlyError, match="write access"):
            cache_prune(cache, max_size=0)
        assert (cache / "index.sqlite").stat().st_mode & 0o222 == 0 and len(list(cache.iterdir())) == 1
    finally:
        _make_writable(cache)


def test_secret_looking_options_are_masked_and_others_kept():
    from caprecon.core.redaction import MASK, redact

    masked = redact({"judge_options": {"api_key": "k-123456", "x-api-key": "k-abcdef", "max_new_tokens": 8,
                                       "headers": {"Authorization": "Bearer k-zzzzzz"}, "api_key_env": "MY_KEY",
                                       "tokens_cut": 3},
                     "command": ["caprecon", "--judge-opt=token=k-qqqqqq", "--llm-opt", "password=k-pppppp"],
                     "note": "server said: bad key k-123456"})
    assert masked["judge_options"] == {"api_key": MASK, "x-api-key": MASK, "max_new_tokens": 8, "headers": MASK,
                                       "api_key_env": "MY_KEY", "tokens_cut": 3}
    assert masked["command"] == ["caprecon", f"--judge-opt=token={MASK}", "--llm-opt", f"password={MASK}"]
    assert masked["note"] == f"server said: bad key {MASK}"


# -- writes overlapping the next model -------------------------------------------------


def test_written_behind_images_keep_their_claims_until_they_are_in_the_store(tmp_path, monkeypatch):
    """With write_behind, put_images returns before the PNG is written; until it is, the
    key stays claimed (another process waits rather than generating it again), this
    process's own reads wait for it, and then the claim is released."""
    import threading

    import caprecon.store.images as images_module
    from PIL import Image

    gate, real = threading.Event(), images_module._png_bytes
    monkeypatch.setattr(images_module, "_png_bytes", lambda image: (gate.wait(10), real(image))[1])
    mine, other = Store(tmp_path), Store(tmp_path)
    key = content_key("reconstruction", caption="a red circle")
    assert mine.claim([key]) == {key}
    mine.write_behind = True
    with mine.holding([key]) as handed:
        stored = mine.put_images("reconstruction", {key: (Image.new("RGB", (8, 8), "red"), {"n": 1})}, release=[key])
        handed.add(key)
    (record, path, checksum), = stored.values()
    assert record == {"n": 1} and checksum is None and not path.exists()  # queued, not written
    assert other.claim([key]) == set() and other.get_images([key]) == {}  # still claimed, not yet there
    gate.set()
    assert key in mine.get_images([key])  # a read of this process waits for its own writes
    assert path.exists() and other.claim([key]) == {key}  # written, and the claim went with the write


def test_a_failed_cache_write_stops_the_run_and_names_the_cache(tmp_path, monkeypatch):
    import caprecon.store.images as images_module

    samples = _samples(tmp_path, n=4)

    def full(image):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(images_module, "_png_bytes", full)
    with pytest.raises(RunError, match="No space left on device") as stopped:
        _score(samples, tmp_path / "cache", batch_size=2, out=tmp_path / "out")
    assert str(tmp_path / "cache") in str(stopped.value)
    assert not (tmp_path / "out" / "scores.jsonl").read_text().strip()  # no row names an image that is not stored


def test_every_row_written_names_a_stored_reconstruction(tmp_path):
    samples = _samples(tmp_path)
    seen = []
    real = caprecon.run.score.run_local

    def watching(*args, **kwargs):
        given = kwargs.get("on_rows")

        def check(rows):  # called right after the batch's rows are written to scores.jsonl
            seen.extend(Path(r["reconstruction"]).is_file() for r in rows)
            if given:
                given(rows)

        return real(*args, **{**kwargs, "on_rows": check})

    import unittest.mock

    with unittest.mock.patch.object(caprecon.run.score, "run_local", watching):
        result = _score(samples, tmp_path / "cache", batch_size=2, out=tmp_path / "out")
    assert seen == [True] * len(CAPTIONS) and result.manifest["cache"]["generated"] == len(CAPTIONS)
    assert cache_verify(tmp_path / "cache")["ok"]


def _open_new_cache_at_once(folder, barrier, results):
    barrier.wait()  # both processes create the same new index together
    try:
        Store(folder)
        results.put("ok")
    except Exception as exc:  # noqa: BLE001 -- what the other process saw is the point
        results.put(f"{type(exc).__name__}: {exc}")


def test_two_processes_creating_one_new_cache_at_once_both_open_it(tmp_path):
    # SQLite answers the second of two simultaneous switches to WAL "database is locked" at
    # once, busy timeout or not (measured: 78 of 300 such opens failed before the retry)
    import multiprocessing

    context = multiprocessing.get_context("fork")
    seen = []
    for attempt in range(25):
        barrier, results = context.Barrier(2), context.Queue()
        procs = [context.Process(target=_open_new_cache_at_once, args=(tmp_path / f"c{attempt}", barrier, results))
                 for _ in range(2)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout=60)
        seen += [results.get(timeout=5) for _ in procs]
    assert seen == ["ok"] * 50


# -- issue 21 item 9: each computation's code revision and its numeric libraries are in the keys --


def test_bumping_a_code_revision_recomputes_what_it_computes_and_nothing_else(tmp_path, tiny_sd, tiny_clip,
                                                                              monkeypatch):
    from caprecon.models.embedder import HFVisionEmbedder
    from caprecon.models.generator import DiffusersGenerator
    from caprecon.reconstruct.reconstructor import Reconstructor

    samples = _samples(tmp_path, n=2)

    def run():
        cache = caprecon.score(samples, ["recon"], generator=str(tiny_sd), embedder=str(tiny_clip),
                               generator_options={"steps": 1}, max_side=32,
                               cache_dir=str(tmp_path / "cache")).manifest["cache"]
        return cache["generated"], cache["embedded"]

    assert run() == (2, 4)  # two reconstructions; the two sources and the two reconstructions embedded
    assert run() == (0, 0)  # unchanged revisions: everything reused
    monkeypatch.setattr(HFVisionEmbedder, "code_revision", HFVisionEmbedder.code_revision + 1)
    assert run() == (0, 4)
    monkeypatch.setattr(DiffusersGenerator, "code_revision", DiffusersGenerator.code_revision + 1)
    assert run() == (2, 2)  # new reconstructions, embedded; the sources' embeddings are still valid
    monkeypatch.setattr(Reconstructor, "code_revision", Reconstructor.code_revision + 1)
    assert run() == (2, 2)
    assert run() == (0, 0)


def test_a_judge_or_llm_revision_is_in_its_fingerprint():
    from caprecon.models.openai_compat import OpenAICompatLLM, OpenAICompatVLM

    for backend in (OpenAICompatVLM, OpenAICompatLLM):
        before = backend("judge", "http://127.0.0.1:9/v1").fingerprint
        assert backend("judge", "http://127.0.0.1:9/v1").fingerprint == before
        backend.code_revision += 1
        try:
            assert backend("judge", "http://127.0.0.1:9/v1").fingerprint != before
        finally:
            backend.code_revision -= 1


def test_an_upgrade_of_a_numeric_library_changes_the_keys(tiny_clip, monkeypatch):
    import caprecon.models.common as common
    from caprecon.models.embedder import HFVisionEmbedder

    installed = {"torch": "2.13.0+cpu", "transformers": "5.24.0", "diffusers": "0.42.1"}
    monkeypatch.setattr(common, "installed_version", lambda package: installed.get(package))

    def fingerprint(**versions):
        installed.update(versions)
        common.library_versions.cache_clear()
        return HFVisionEmbedder(tiny_clip, device="cpu").fingerprint

    try:
        before = fingerprint()
        assert fingerprint(torch="2.13.1+cu128") == before  # torch: major.minor only, build label ignored
        assert fingerprint(diffusers="0.43.0") == before  # not one this embedder computes with
        assert fingerprint(transformers="5.24.1") != before
        assert fingerprint(transformers="5.24.0", torch="2.14.0") != before
        assert fingerprint(torch="2.13.0") == before
    finally:
        common.library_versions.cache_clear()


def test_library_versions_are_read_without_importing_torch_or_transformers():
    code = ("import sys; from caprecon.models.common import library_versions; "
            "v = dict(library_versions(('torch', 'transformers', 'no-such-package'))); "
            "print(v['torch'].count('.'), v['transformers'] is not None, v['no-such-package'], "
            "'torch' in sys.modules, 'transformers' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(SRC)}).stdout.split()
    assert out == ["1", "True", "None", "False", "False"]


def test_prune_by_model_takes_the_registry_name(tmp_path, tiny_dinov2, monkeypatch, capsys):
    from caprecon.cli.commands import main
    from caprecon.models import registry

    # a registry name standing for a model folder, as `dinov2` stands for facebook/dinov2-base
    monkeypatch.setitem(registry.EMBEDDERS, "tiny-dino", registry.Entry(
        "caprecon.models.embedder:HFVisionEmbedder", {"model": str(tiny_dinov2)}, "a tiny DINOv2"))
    cache = tmp_path / "cache"
    samples = _samples(tmp_path, n=2)
    _score(samples, cache, embedder="tiny-dino")
    # the command looks the name up in the registry and gives the store what it stands for
    assert main(["cache", "prune", "--model", "tiny-dino", "--dry-run", "--json", "--cache-dir", str(cache)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["removed"] == 4  # 2 sources and 2 reconstructions embedded; the generator's entries stay
    assert report["removed"] == cache_prune(cache, model=str(tiny_dinov2), dry_run=True)["removed"]


def test_arrays_come_back_exactly_without_np_load_per_value(tmp_path, monkeypatch):
    store = Store(tmp_path / "s")
    rng = np.random.default_rng(0)
    items = {f"v{i}": rng.random(16).astype(np.float32) for i in range(20)}
    items.update({"f64": rng.random(3), "matrix": np.asfortranarray(rng.random((3, 4)).astype(np.float32)),
                  "ints": np.arange(5, dtype=np.int64)})
    store.put_arrays("embedding", items)
    store.flush()
    monkeypatch.setattr(np, "load", lambda *a, **k: (_ for _ in ()).throw(AssertionError("np.load per value")))
    got = store.get_arrays(list(items) + ["missing"])
    assert set(got) == set(items)
    for key, array in items.items():
        assert got[key].dtype == array.dtype and got[key].shape == array.shape
        np.testing.assert_array_equal(got[key], array)


def test_stored_arrays_are_the_files_np_save_writes_and_np_load_reads(tmp_path):
    """Each blob is byte for byte what `np.save` writes for the array (the header is made once
    per dtype and shape), so any .npy reader reads the store's values."""
    import io

    store = Store(tmp_path / "s")
    rng = np.random.default_rng(1)
    items = {"a": rng.random(8).astype(np.float32), "b": rng.random(8).astype(np.float32),
             "half": rng.random((2, 3)).astype(np.float16), "f": np.asfortranarray(rng.random((4, 2))),
             "scalar": np.array(2.5), "flags": np.array([True, False]), "big-endian": np.arange(3, dtype=">i4")}
    store.put_arrays("embedding", items)
    store.flush()
    blobs = store._get(list(items))
    for key, array in items.items():
        expected = io.BytesIO()
        np.save(expected, np.ascontiguousarray(array), allow_pickle=False)
        assert blobs[key] == expected.getvalue(), key
        np.testing.assert_array_equal(np.load(io.BytesIO(blobs[key]), allow_pickle=False), array)
    with pytest.raises(ValueError):
        store.put_arrays("embedding", {"objects": np.array([{"a": 1}], dtype=object)})


def test_with_write_behind_index_rows_are_written_on_the_writing_thread_and_read_back_before(tmp_path, monkeypatch):
    import threading

    store = Store(tmp_path / "s")
    store.write_behind = True
    writes = []
    real = Store._write_rows
    gate = threading.Event()

    def slow(self, records, release=()):
        gate.wait(10)  # held until the reads below are done, so they find the rows still queued
        writes.append((threading.current_thread().name, sorted(r[0] for r in records)))
        return real(self, records, release)

    monkeypatch.setattr(Store, "_write_rows", slow)
    store.put_json("judge-answer", {"a": {"answer": "yes"}})
    store.put_json("judge-answer", {"b": {"answer": "no"}})
    store.put_arrays("embedding", {"e": np.arange(3, dtype=np.float32)})
    assert store.get_json(["a", "b", "missing"]) == {"a": {"answer": "yes"}, "b": {"answer": "no"}}
    np.testing.assert_array_equal(store.get_arrays(["e"])["e"], np.arange(3, dtype=np.float32))
    assert writes == []  # nothing written on the caller's thread
    gate.set()
    store.flush()
    assert all(name.startswith("caprecon-write") for name, _ in writes)
    assert sorted(k for _, keys in writes for k in keys) == ["a", "b", "e"]
    assert len(writes) <= 2  # rows queued while the writer was busy go in one transaction
    again = Store(tmp_path / "s")
    assert again.get_json(["a", "b"]) == {"a": {"answer": "yes"}, "b": {"answer": "no"}}


def test_a_batch_waits_for_the_writes_of_its_images_not_for_queued_vectors(tmp_path, monkeypatch):
    """Rows name reconstructions, so their images are written before the rows (flush_images); the
    vectors and answers queued with them are written on, and only the run's end waits for them.
    Reading an image no queued write holds waits for nothing; a write that failed meanwhile
    still stops the next wait."""
    import threading

    from PIL import Image

    store = Store(tmp_path / "s")
    store.write_behind = True
    gate, real = threading.Event(), Store._write_rows

    def held_vectors(self, records, release=()):
        if any(r[1] == "embedding" for r in records):
            assert gate.wait(10)
        return real(self, records, release)

    monkeypatch.setattr(Store, "_write_rows", held_vectors)
    image = content_key("reconstruction", caption="a red circle")
    store.put_images("reconstruction", {image: (Image.new("RGB", (8, 8), "red"), {"n": 1})})
    store.flush_images([image])
    store.put_arrays("embedding", {"v": np.arange(3, dtype=np.float32)})  # its write is held at the gate
    store.flush_images()  # returns: no image is queued
    assert store.image_path(image).exists() and not gate.is_set()
    assert image in store.get_images([image])  # written: read without waiting for the vector
    assert image in Store(tmp_path / "s").get_images([image])  # its row is in the index already
    assert store.get_images(["not-queued"]) == {}  # no queued write holds it: nothing to wait for
    assert store.get_arrays(["v"])["v"].tolist() == [0, 1, 2]  # still queued, and read from the queue
    gate.set()
    store.flush()
    assert Store(tmp_path / "s").get_arrays(["v"])["v"].tolist() == [0, 1, 2]

    def full(self, records, release=()):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Store, "_write_rows", full)
    store.put_arrays("embedding", {"w": np.zeros(2, dtype=np.float32)})
    store._writer.submit(lambda: None).result()  # the failed write is done
    with pytest.raises(StoreFullError):
        store.flush_images()  # no image queued, but the failure is not left for the end
    store.flush()  # raised once


def test_gathered_rows_go_in_the_writers_next_transaction_or_at_the_batch_end(tmp_path, monkeypatch):
    """With `gather_rows` (a run's batches), rows queued on the models' thread start no write of their
    own: they are read from the queue, go in the transaction of the next picture write, or at
    `write_gathered` in one of their own, and at `flush` at the latest."""
    import threading

    from PIL import Image

    store = Store(tmp_path / "s")
    store.write_behind = store.gather_rows = True
    writes = []
    real = Store._write_rows
    monkeypatch.setattr(Store, "_write_rows",
                        lambda self, records, release=(): (writes.append(sorted(r[0] for r in records)),
                                                           real(self, records, release))[1])
    store.put_json("source-size", {"size": [3, 2]})
    store.put_arrays("embedding", {"e": np.arange(3, dtype=np.float32)})
    assert store._writer is None  # no write started
    assert store.get_json(["size"]) == {"size": [3, 2]}  # read from the queue
    assert Store(tmp_path / "s").get_json(["size"]) == Store(tmp_path / "s").get_arrays(["e"]) == {}  # not in the index yet
    picture = content_key("reconstruction", caption="a red circle")
    store.put_images("reconstruction", {picture: (Image.new("RGB", (8, 8), "red"), {"n": 1})})
    store.flush_images([picture])
    assert writes == [sorted(["size", "e", picture])]  # one transaction: the picture's
    assert Store(tmp_path / "s").get_json(["size"]) == {"size": [3, 2]}
    assert Store(tmp_path / "s").get_arrays(["e"])["e"].tolist() == [0, 1, 2]
    store.put_arrays("embedding", {"f": np.ones(2, dtype=np.float32)})
    store.put_json("judge-answer", {"g": {"answer": "yes"}})
    held, started = threading.Event(), []
    store._writer.submit(held.wait, 10)  # the writer busy: the rows stay queued
    real_behind = Store._behind
    monkeypatch.setattr(Store, "_behind", lambda self, work, *a, **k: (started.append(work), real_behind(self, work, *a, **k))[1])
    store.write_gathered()
    store.write_gathered()  # a write that will take them is queued already: no second
    assert len(started) == 1
    held.set()
    store.flush_images()
    store._writer.submit(lambda: None).result()  # the writer's queue done
    assert writes[1:] == [["f", "g"]]
    store.write_gathered()  # nothing queued: no empty transaction
    store.put_json("judge-answer", {"late": {"answer": "no"}})
    store.flush()
    assert writes[1:] == [["f", "g"], ["late"]]
    assert Store(tmp_path / "s").get_json(["g", "late"]) == {"g": {"answer": "yes"}, "late": {"answer": "no"}}


def test_a_run_commits_each_batch_in_at_most_two_transactions(tmp_path, monkeypatch):
    """A run's batch writes its source sizes, pictures and two models' vectors: its pictures' transaction
    takes what was queued before it, one started at the batch's end the rest (never a row's own), and
    every row is in the index."""
    import threading
    from collections import Counter

    from PIL import Image

    rng = np.random.default_rng(3)
    rows = []
    for i in range(6):
        Image.fromarray(rng.integers(0, 255, (24, 32, 3), dtype=np.uint8)).save(tmp_path / f"p{i}.png")
        rows.append({"id": f"s{i}", "image": f"p{i}.png", "caption": f"a picture, take {i}"})
    (tmp_path / "samples.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    commits = []
    real = Store._write_rows
    monkeypatch.setattr(Store, "_write_rows", lambda self, records, release=(): (
        commits.append((threading.current_thread().name, sorted({r[1] for r in records}))), real(self, records, release))[1])
    started, inside = [], []  # the writes of queued rows started on the models' thread, and from where
    real_behind, real_gathered = Store._behind, Store.write_gathered

    def behind(self, work, *args, **kwargs):
        if threading.current_thread() is threading.main_thread() and work == self._drain:
            started.append(inside[-1] if inside else "a queued row")
        return real_behind(self, work, *args, **kwargs)

    def gathered(self):
        inside.append("write_gathered")
        try:
            return real_gathered(self)
        finally:
            inside.pop()

    monkeypatch.setattr(Store, "_behind", behind)
    monkeypatch.setattr(Store, "write_gathered", gathered)
    run = caprecon.score(tmp_path / "samples.jsonl", ["recon"], generator=OracleGenerator(), embedder=PixelEmbedder(),
                         max_side=32, batch_size=2, cache_dir=str(tmp_path / "cache"), out=tmp_path / "out")
    assert all(name.startswith("caprecon-write") for name, _ in commits)
    assert 3 <= len(commits) <= 6  # three batches, at most two each: it was four each
    kinds = Counter(kind for _, ks in commits for kind in ks)
    assert kinds["reconstruction"] == 3  # each batch's pictures in one transaction
    assert ["source-size"] not in [ks for _, ks in commits]  # the sizes go with the pictures or the vectors
    # no row queued on the models' thread started a write of its own: only each batch's end did
    assert started and all(where == "write_gathered" for where in started)
    index = sqlite3.connect(tmp_path / "cache" / "index.sqlite")
    counts = dict(index.execute("SELECT kind, COUNT(*) FROM results GROUP BY kind"))
    assert counts["reconstruction"] == counts["source-size"] == 6
    assert counts["embedding"] == 12  # six sources and six reconstructions
    assert len(run.records) == 6 and all(isinstance(r.get("recon"), float) for r in run.records)


def test_claims_go_with_the_rows_of_their_images_in_one_transaction(tmp_path, monkeypatch):
    """The claims on images written are dropped in the transaction that writes their rows: no
    moment where another process finds neither the claim nor the image, and one commit, not
    two. Many keys at once span several statements (SQLite's 999 parameters)."""
    from PIL import Image

    store, other = Store(tmp_path / "s"), Store(tmp_path / "s")
    keys = [f"k{i}" for i in range(700)]  # 2,100 parameters to claim, 8 per row to write
    assert store.claim(keys) == set(keys)
    assert other.claim(keys) == set()
    released = []
    monkeypatch.setattr(Store, "release", lambda self, k: released.append(list(k)))
    items = {k: (Image.new("RGB", (2, 2), "blue"), {"n": i}) for i, k in enumerate(keys)}
    store.put_images("reconstruction", items, release=keys)
    assert released == []  # no transaction of its own
    assert other.claim(keys) == set(keys)  # every claim went with the rows
    assert len(other.get_images(keys)) == 700
    assert {k: v["n"] for k, v in store.get_json(keys[:3]).items()} == {"k0": 0, "k1": 1, "k2": 2}

    def full(self, records, release=()):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Store, "_write_rows", full)
    with pytest.raises(StoreFullError):
        store.put_images("reconstruction", {"lost": (Image.new("RGB", (2, 2)), {})}, release=["lost"])
    assert released == [["lost"]]  # a failed write still lets its claims go


def test_an_image_folder_is_made_by_the_first_write_that_files_a_picture_in_it(tmp_path, monkeypatch):
    """Images are filed by their key's first two hex digits; a new store makes none of those folders,
    the write that files the first picture in one makes it (one `mkdir` a folder, none for a folder
    already there; the first, which finds images/ missing too, one more), and a folder removed since
    is made again by the write that misses it."""
    from PIL import Image

    store = Store(tmp_path / "s")
    assert not (tmp_path / "s" / "images").exists()
    made, tried = [], []
    real_mkdir = os.mkdir

    def mkdir(p, *a, **k):
        tried.append(str(p))
        real_mkdir(p, *a, **k)
        made.append(str(p))

    monkeypatch.setattr(os, "mkdir", mkdir)
    keys = [content_key("reconstruction", caption=f"picture {i}") for i in range(64)]
    images = tmp_path / "s" / "images"
    store.put_images("reconstruction", {k: (Image.new("RGB", (2, 2)), {}) for k in keys[:32]})
    wanted = sorted({k[:2] for k in keys[:32]})
    assert sorted(made) == sorted([str(images), *(str(images / f) for f in wanted)])  # each once
    assert len(tried) == len(made) + 1  # the first picture's folder, tried before images/ was there
    assert sorted(p.name for p in images.iterdir()) == wanted
    made.clear(), tried.clear()
    shutil.rmtree(images / keys[0][:2])
    store.put_images("reconstruction", {k: (Image.new("RGB", (2, 2)), {}) for k in keys[32:] + keys[:1]})
    new = sorted({k[:2] for k in keys[32:]} - set(wanted))
    assert sorted(made) == sorted(tried) == sorted(str(images / f) for f in {*new, keys[0][:2]})
    assert len(store.get_images(keys)) == 64
    tried.clear()
    Store(tmp_path / "s")  # opened again: no image folder to make
    assert [p for p in tried if os.path.basename(os.path.dirname(p)) == "images"] == []


def test_a_fresh_reconstruction_asked_again_is_read_once_written_not_regenerated(tmp_path, monkeypatch, caplog):
    """Two metrics of one batch share a reconstructor: the first generates Î (its pixels in memory, the
    file queued for the writing thread), the second finds it among the images the reconstructor knows,
    without pixels and without a checksum yet. It read the file before the writing thread had written
    it, found nothing, logged "fails its checksum" and generated Î again (a `refine` in this process
    did so at random). Here the writing thread is held until the reader is waiting: the reader must
    wait for the write, then read the oracle's drawing, with no second generation and nothing damaged."""
    import logging
    import threading

    import caprecon.store.images as images_module
    from caprecon.data.images import open_image
    from caprecon.data.samples import Sample
    from caprecon.reconstruct.reconstructor import Reconstructor, ReconstructionSpec

    gate, real = threading.Event(), images_module._png_bytes
    monkeypatch.setattr(images_module, "_png_bytes", lambda image: (gate.wait(30), real(image))[1])
    render("a red circle", 48, 48).save(tmp_path / "src.png")
    item = open_image(Sample(id="s", image=tmp_path / "src.png", caption="a blue square"))
    store = Store(tmp_path / "cache")
    store.write_behind = True
    generator = OracleGenerator()
    reconstructor = Reconstructor(generator, store, ReconstructionSpec(max_side=48))
    before = OracleGenerator.calls
    (first,) = reconstructor.reconstruct([item])
    assert first.pixels is not None and first.checksum is None and not first.path.exists()  # queued
    (again,) = reconstructor.reconstruct([item])
    assert again.pixels is None and again.checksum is None  # known to the reconstructor, not yet written
    threading.Timer(0.5, gate.set).start()  # the writing thread goes on once the reader is on its way
    with caplog.at_level(logging.WARNING):
        image = again.image()
    expected = render("a blue square", 48, 48)  # the oracle draws exactly the caption's shapes
    assert image.tobytes() == expected.tobytes()
    assert OracleGenerator.calls - before == 1 and reconstructor.generated == 1
    assert reconstructor.damaged == 0 and store.damaged == 0
    assert not [r for r in caplog.records if "checksum" in r.getMessage()]
    store.flush()


def test_verify_of_a_damaged_index_names_the_file_and_what_is_wrong(tmp_path, capsys):
    """Issue 51 item 17: exit 1 with one line on stderr naming the index file, its damage and the repair."""
    cases = {"garbage": (lambda f: f.write_text("this is not a database\n" * 10), "file is not a database"),
             "folder": (lambda f: f.mkdir(), "not a file (a folder)")}
    for name, (damage, said) in cases.items():
        cache = tmp_path / name
        cache.mkdir()
        index = cache / "index.sqlite"
        damage(index)
        assert main(["cache", "verify", "--cache-dir", str(cache)]) == 1
        captured = capsys.readouterr()
        err = captured.err.strip().splitlines()
        assert len(err) == 1, err
        assert err[0].startswith(f"caprecon: error: the cache index {index} is damaged: {said}")
        assert f"caprecon cache verify --repair --cache-dir {cache}" in err[0]
        assert f"index: {index}: damaged: {said}" in captured.out
        assert "entries checked" not in captured.out  # nothing was checked, so no counts of zero
        report = cache_verify(cache)
        assert report["ok"] is False and report["index_file"] == str(index)
        assert report["index"] == f"damaged: {said}" + ("" if name == "garbage" else ", where SQLite's index should be")


def test_an_interrupt_just_after_the_commit_stays_an_interrupt(tmp_path):
    """A Ctrl-C that lands after COMMIT ran, before the block ended, reaches the caller as the
    KeyboardInterrupt (the run stops with 130), not as "cannot rollback - no transaction is active"
    (which a run counted as a row error, exit 1: seen once in tests/test_resume.py); a block that
    raises inside its transaction is still rolled back."""
    import sqlite3

    from caprecon.core.transactions import transaction

    db = sqlite3.connect(tmp_path / "index.sqlite", isolation_level=None)
    db.execute("CREATE TABLE t (a)")
    with pytest.raises(KeyboardInterrupt):
        with transaction(db, "BEGIN IMMEDIATE"):
            db.execute("INSERT INTO t VALUES (1)")
            db.execute("COMMIT")  # the interrupt arrives here, the commit already made
            raise KeyboardInterrupt
    with pytest.raises(ValueError):
        with transaction(db):
            db.execute("INSERT INTO t VALUES (2)")
            raise ValueError("the block fails inside its transaction")
    assert not db.in_transaction
    assert [row[0] for row in db.execute("SELECT a FROM t")] == [1]


def test_a_commit_that_fails_is_rolled_back_and_leaves_no_transaction_open(tmp_path):
    """A COMMIT refused by the database (here a deferred foreign key left dangling) raises to the
    caller and is rolled back: the connection is left with no transaction open, so the thread's next
    write does not fail on "cannot start a transaction within a transaction" nor commit the refused
    rows with it."""
    import sqlite3

    from caprecon.core.transactions import transaction

    db = sqlite3.connect(tmp_path / "index.sqlite", isolation_level=None)
    db.execute("PRAGMA foreign_keys = ON")
    db.execute("CREATE TABLE parent (id INTEGER PRIMARY KEY)")
    db.execute("CREATE TABLE child (parent INTEGER REFERENCES parent(id) DEFERRABLE INITIALLY DEFERRED)")
    with pytest.raises(sqlite3.IntegrityError):
        with transaction(db, "BEGIN IMMEDIATE"):
            db.execute("INSERT INTO child VALUES (7)")  # no parent 7: refused at COMMIT, not here
    assert not db.in_transaction
    with transaction(db):
        db.execute("INSERT INTO parent VALUES (1)")
    assert [row[0] for row in db.execute("SELECT parent FROM child")] == []
    assert [row[0] for row in db.execute("SELECT id FROM parent")] == [1]
