"""The run lifecycle (caprecon.run.folder): every command that writes a run folder checks its
outputs before any model loads, holds the folder's lock while it runs, and ends with the same
lines; the store's SQL lives in store/ only; a full cache keeps the rows a run finished."""

from __future__ import annotations

import errno
import json
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from bench_common import small_pictures
from caprecon.cli.commands import main
from caprecon.run.folder import LOCK_FILE, run_folder

SRC = Path(__file__).resolve().parents[1] / "src" / "caprecon"
MISSING = "/nonexistent/model"  # a model path that does not exist: loading it first would be the error


def _inputs(tmp_path: Path) -> dict[str, Path]:
    Image.fromarray(np.full((24, 32, 3), 90, np.uint8)).save(tmp_path / "p0.png")
    rows = tmp_path / "in.jsonl"
    rows.write_text(json.dumps({"id": "r0", "image": "p0.png", "caption": "a grey picture"}) + "\n")
    afile = tmp_path / "afile"
    afile.write_text("keep me")
    run = tmp_path / "run"
    run.mkdir()
    (run / "scores.jsonl").write_text(json.dumps({"id": "r0", "caption": "a grey picture", "recon": 0.5}) + "\n")
    return {"rows": rows, "file": afile, "run": run, "root": tmp_path}


# each command family with --out (or --save) at an existing file, and models that do not exist
AT_A_FILE = {
    "score": lambda w: ["score", "-i", w["rows"], "-m", "recon", "-g", MISSING, "--out", w["file"]],
    "reconstruct": lambda w: ["reconstruct", "-i", w["rows"], "-m", "recon", "-g", MISSING, "--out", w["file"]],
    "embed": lambda w: ["embed", "-i", w["rows"], "-m", "recon", "-e", MISSING, "--out", w["file"]],
    "judge": lambda w: ["judge", "-i", w["rows"], "-m", "vqascore", "--judge", MISSING, "--out", w["file"]],
    "caption": lambda w: ["caption", "--images", w["root"], "--captioner", MISSING, "--out", w["file"]],
    "refine": lambda w: ["refine", "-i", w["rows"], "--llm", MISSING, "-g", MISSING, "--out", w["file"]],
    "t2i": lambda w: ["t2i", "-i", w["rows"], "--generator", MISSING, "--judge", MISSING, "--out", w["file"]],
    "suite": lambda w: ["suite", "--suite", "refcoco", "--captioner", MISSING, "--judge", MISSING,
                        "--out", w["file"]],
    "suite-agree": lambda w: ["suite-agree", "--suite-run", w["run"], "--turing", "a=0.5", "--out", w["file"]],
    "seeds": lambda w: ["seeds", w["run"], "--out", w["file"]],
    "meta": lambda w: ["meta", "--judgments", w["rows"], "--metric", "recon", "-g", MISSING, "--out", w["file"]],
    "meta --fit --save": lambda w: ["meta", "--judgments", w["rows"], "--metric", "bleu-4", "--fit", "--save",
                                    w["run"], "--out", w["root"] / "meta"],
    "meta verify --all": lambda w: ["meta", "verify", "--all", "--data-root", w["root"], "--out", w["file"]],
    "merge": lambda w: ["merge", w["run"], "--out", w["file"]],
    "report": lambda w: ["report", w["run"], "--out", w["file"]],
    "compare": lambda w: ["compare", w["run"], "--by", "caption", "--out", w["run"]],
    "cttd build": lambda w: ["cttd", "build", "--images", w["root"], "--vlm", MISSING, "--out", w["file"]],
    "cttd import": lambda w: ["cttd", "import", w["rows"], "--out", w["file"]],
    "demo": lambda w: ["demo", "--out", w["file"], "-q"],
}


@pytest.mark.parametrize("command", list(AT_A_FILE))
def test_an_output_at_the_wrong_kind_of_path_is_refused_first(command, tmp_path, capsys):
    w = _inputs(tmp_path)
    code = main([str(a) for a in AT_A_FILE[command](w)])
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "Traceback" not in captured.err, captured.err
    # the one message of the prologue, not the missing model's: it was checked before any model loaded
    assert re.search(r"--(out|save) \S+ is a (file; give a folder|folder; give a file name)", lines[0]), lines[0]
    assert MISSING not in captured.err
    assert w["file"].read_text() == "keep me"


@pytest.mark.parametrize("argv", [
    lambda w: ["score", "-i", w["root"], "-g", MISSING, "--out", w["root"]],  # an image folder scored into itself
    lambda w: ["cttd", "build", "--images", w["root"], "--vlm", MISSING, "--out", w["root"] / "bank"],  # searched
    lambda w: ["compare", w["run"] / "scores.jsonl", "--by", "caption", "--out", w["run"] / "scores.jsonl"],
])
def test_an_output_inside_the_input_is_refused_first(argv, tmp_path, capsys):
    w = _inputs(tmp_path)
    assert main([str(a) for a in argv(w)]) == 2
    err = capsys.readouterr().err
    assert "lies inside the input" in err and MISSING not in err and "Traceback" not in err
    assert (w["run"] / "scores.jsonl").read_text().startswith('{"id": "r0"')


# --------------------------------------------------------------------------- one run per folder

_FIRST = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from caprecon.metrics.clipscore import ClipScore
    from caprecon.cli.commands import main

    started, go = Path(sys.argv[1]), Path(sys.argv[2])
    real = ClipScore.score

    def held(self, items, ctx):  # the first run is mid-way when the second starts
        started.touch()
        deadline = time.time() + 120
        while not go.exists() and time.time() < deadline:
            time.sleep(0.05)
        return real(self, items, ctx)

    ClipScore.score = held
    sys.argv = ["caprecon", *sys.argv[3:]]
    sys.exit(main(sys.argv[1:]))
""")


def _wait_for(path: Path, process: subprocess.Popen) -> None:
    deadline = time.time() + 120
    while not path.exists():
        assert process.poll() is None, process.communicate()
        assert time.time() < deadline, "the first run never started scoring"
        time.sleep(0.05)


@pytest.mark.parametrize("second_settings", [[], ["--seed", "7"]], ids=["same settings", "other settings"])
def test_a_second_run_into_a_busy_folder_is_refused_and_names_the_first(second_settings, tmp_path, tiny_clip):
    rows = small_pictures(tmp_path, 3)
    script = tmp_path / "first.py"
    script.write_text(_FIRST)
    out = tmp_path / "run"
    argv = ["score", "-i", str(rows), "-m", "clipscore", "--clip", str(tiny_clip), "--cache-dir",
            str(tmp_path / "cache"), "--out", str(out), "-q", "--batch-size", "1"]
    started, go = tmp_path / "started", tmp_path / "go"
    first = subprocess.Popen([sys.executable, str(script), str(started), str(go), *argv],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(started, first)
        second = subprocess.run([sys.executable, "-m", "caprecon.cli", *argv, *second_settings],
                                capture_output=True, text=True, timeout=300)
    finally:
        go.touch()
        first_out, first_err = first.communicate(timeout=300)
    assert second.returncode == 2, second.stderr
    message = second.stderr.strip().splitlines()
    assert len(message) == 1 and f"--out {out} is in use by another run (pid {first.pid} on " in message[0]
    assert "caprecon score -i" in message[0]  # the first run's command, as its lock records it
    assert first.returncode == 0, first_err
    records = [json.loads(line) for line in (out / "scores.jsonl").read_text().splitlines()]
    assert [r["id"] for r in records] == ["r0", "r1", "r2"] and all(0 <= r["clipscore"] <= 2.5 for r in records)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "complete" and manifest["config"]["seed"] != 7
    assert (out / LOCK_FILE).read_text() == ""  # released: the next run takes the folder without a word


_HOLD = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from caprecon.run.folder import run_folder

    with run_folder(sys.argv[1]):
        Path(sys.argv[2]).touch()
        time.sleep(120)
""")


def test_refine_into_a_folder_another_process_holds_is_refused_before_its_models(tmp_path):
    rows = small_pictures(tmp_path, 1)
    out, held = tmp_path / "run", tmp_path / "held"
    script = tmp_path / "hold.py"
    script.write_text(_HOLD)
    holder = subprocess.Popen([sys.executable, str(script), str(out), str(held)])
    try:
        _wait_for(held, holder)
        refine = subprocess.run([sys.executable, "-m", "caprecon.cli", "refine", "-i", str(rows), "--llm", MISSING,
                                 "-g", MISSING, "--out", str(out)], capture_output=True, text=True, timeout=300)
    finally:
        holder.kill()  # killed, not stopped: the kernel drops its lock with it
        holder.wait()
    assert refine.returncode == 2 and f"in use by another run (pid {holder.pid} on " in refine.stderr
    assert MISSING not in refine.stderr and not (out / "rounds.jsonl").exists()
    # the killed holder left its details behind: the next run takes the folder over, with a warning
    again = subprocess.run([sys.executable, "-m", "caprecon.cli", "refine", "-i", str(rows), "--llm", MISSING,
                            "-g", MISSING, "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert f"(pid {holder.pid} on " in again.stderr and "is gone without finishing" in again.stderr
    assert "in use by another run" not in again.stderr


def test_a_folder_is_held_once_per_process_and_released_after(tmp_path):
    out = tmp_path / "run"
    with run_folder(out) as folder:
        with run_folder(out):  # a command's own call into the API (caption's scoring) is the same run
            assert json.loads((folder / LOCK_FILE).read_text())["pid"] > 0
        assert (folder / LOCK_FILE).read_text()  # still held by the outer block
    assert (out / LOCK_FILE).read_text() == ""


# --------------------------------------------------------------------------- one summary writer


def test_summary_json_has_one_writer():
    texts = {str(p.relative_to(SRC)): p.read_text(encoding="utf-8") for p in SRC.rglob("*.py")}
    direct = [name for name, text in texts.items()
              if re.search(r"summary\.json[\"']\)?\s*\.(write_text|write_bytes|open\([^)]*[\"']w)", text)]
    assert direct == []
    through = sorted(name for name, text in texts.items() if re.search(r"\bwrite_(summary|run)\(", text))
    assert through == ["apps/cascade/__init__.py", "apps/suites/runner.py", "apps/t2i.py", "run/folder.py", "run/score.py",
                       "run/shards.py"]


# --------------------------------------------------------------------------- SQL lives in store/

SQL = re.compile(r"\bimport sqlite3\b|\b(SELECT|INSERT|UPDATE|DELETE|CREATE|PRAGMA|VACUUM)\b[^\n]*\b(FROM|INTO|SET|"
                 r"TABLE|INDEX|integrity_check|table_info)\b|\.execute(many)?\(|\"VACUUM\"")


def test_the_stores_sql_lives_in_store_only():
    outside = sorted(str(p.relative_to(SRC)) for p in SRC.rglob("*.py")
                     if p.parent.name != "store" and SQL.search(p.read_text(encoding="utf-8")))
    # the file-digest memo, below the store's layer, and the one transaction helper (BEGIN, COMMIT,
    # ROLLBACK; no table) that the memo and the store both write through: core sits below both
    assert outside == ["core/digests.py", "core/transactions.py"]
    helper = (SRC / "core" / "transactions.py").read_text(encoding="utf-8")
    statements = set(re.findall(r"\b[A-Z]{4,}\b", helper)) & {"SELECT", "INSERT", "UPDATE", "DELETE", "CREATE",
                                                               "TABLE", "FROM", "INTO", "PRAGMA", "VACUUM"}
    assert statements == set(), statements  # the helper names no table and makes no query: those stay in store/


def test_the_sql_guard_sees_sql(tmp_path):
    assert SQL.search('db.execute("SELECT key FROM results")') and SQL.search("import sqlite3")
    assert not SQL.search("select the best caption from the candidates")


# --------------------------------------------------------------------------- a full cache


def test_a_full_cache_gives_one_message_and_keeps_the_finished_rows(tmp_path, tiny_clip, capsys, monkeypatch):
    from caprecon.store.index import Store

    rows = small_pictures(tmp_path, 3)
    real, scores = Store._write_rows, tmp_path / "run" / "scores.jsonl"

    def full_after_the_first_row(self, records, release=()):
        # the disk fills once the first row is in the scores file: counting writes instead would
        # depend on how many queued writes the writing thread joins into one transaction
        if scores.exists() and scores.read_text().strip():
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, records, release)

    monkeypatch.setattr(Store, "_write_rows", full_after_the_first_row)
    argv = ["score", "-i", str(rows), "-m", "clipscore", "--clip", str(tiny_clip), "--cache-dir",
            str(tmp_path / "cache"), "--out", str(tmp_path / "run"), "-q", "--batch-size", "1"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"caprecon: error: the cache {tmp_path / 'cache'} is full (No space "
                                               "left on device): free space there"), err
    assert "the 1 rows finished are in" in err[0]
    kept = [json.loads(line) for line in (tmp_path / "run" / "scores.jsonl").read_text().splitlines()]
    assert [r["id"] for r in kept] == ["r0"] and isinstance(kept[0]["clipscore"], float)
    monkeypatch.undo()
    assert main(argv) == 0  # room again: the run resumes from the row it kept
    assert [json.loads(line)["id"] for line in (tmp_path / "run" / "scores.jsonl").read_text().splitlines()] == \
        ["r0", "r1", "r2"]


def test_sqlite_saying_the_disk_is_full_reads_the_same(tmp_path):
    import sqlite3

    from caprecon.store.errors import StoreFullError
    from caprecon.store.index import Store

    class Full:
        def execute(self, *args):
            raise sqlite3.OperationalError("database or disk is full")

    store = Store(tmp_path / "cache", read_only=False)
    store.connect = lambda: Full()
    with pytest.raises(StoreFullError, match=r"the cache .* is full \(database or disk is full\): free space there"):
        store.put_json("answer", {"k": 1})


def test_a_run_refused_after_the_prologue_leaves_no_folder_behind(tmp_path):
    with pytest.raises(RuntimeError):
        with run_folder(tmp_path / "new"):
            raise RuntimeError("the shards do not fit together")
    assert not (tmp_path / "new").exists()
    (tmp_path / "old").mkdir()
    with pytest.raises(RuntimeError):
        with run_folder(tmp_path / "old"):
            raise RuntimeError("stopped")
    assert (tmp_path / "old").is_dir()  # a folder the user had is theirs
