"""The cache commands' writes (`cache verify --repair`, its rebuild of a damaged index, `cache prune`,
`store merge`) stopped part way: by SQLite refusing the COMMIT (a deferred foreign key left dangling),
by an interrupt after the operation's first write statement, or by one in place of its COMMIT. Each
must leave no transaction open on any connection it made, nothing changed in the index or among the
files, and the index writable at once by another connection; run again, it does its whole job,
whose result is counted here by hand from the entries the test made. And keys read from an index
written elsewhere never lead those commands (nor the size cap) to a file outside the cache."""

from __future__ import annotations

import gc
import hashlib
import os
import sqlite3
import time
from pathlib import Path

import pytest
from PIL import Image

from caprecon.core.transactions import transaction
from caprecon.store import sql
from caprecon.store.errors import StoreError
from caprecon.store.images import key_problem
from caprecon.store.index import Store, content_key
from caprecon.store.maintenance import cache_prune, cache_verify, merge_stores

PICTURES = [content_key("picture", n=n) for n in range(4)]
ANSWERS = [content_key("answer", n=n) for n in range(3)]
FAILURES = ["refused at commit", "interrupt after a write", "interrupt at commit"]


class Interrupting:
    """A connection that, once a statement starting with `at` has run on it, raises `exc`: right
    after that statement (`when="after"`) or in place of the COMMIT that follows (`when="commit"`)."""

    def __init__(self, db: sqlite3.Connection, plan: dict):
        self._db, self._plan, self._wrote = db, plan, False

    def _before(self, statement: str) -> None:
        if self._wrote and self._plan["when"] == "commit" and statement.strip() == "COMMIT" and self._plan["armed"]:
            self._plan["armed"] = False
            raise self._plan["exc"]

    def _after(self, statement: str) -> None:
        if statement.lstrip().startswith(self._plan["at"]):
            self._wrote = True
            if self._plan["when"] == "after" and self._plan["armed"]:
                self._plan["armed"] = False
                raise self._plan["exc"]

    def execute(self, statement, *args):
        self._before(statement)
        cursor = self._db.execute(statement, *args)
        self._after(statement)
        return cursor

    def executemany(self, statement, *args):
        self._before(statement)
        cursor = self._db.executemany(statement, *args)
        self._after(statement)
        return cursor

    def __getattr__(self, name):
        return getattr(self._db, name)


def _inject(monkeypatch, failure: str, at: str) -> list[sqlite3.Connection]:
    """Every connection the store opens from now on, wrapped to fail as `failure` says; returned
    (and so kept open, as a long-lived process keeps its store's) to be checked afterwards."""
    opened: list[sqlite3.Connection] = []
    plan = {"at": at, "armed": True, "exc": KeyboardInterrupt(),
            "when": {"interrupt after a write": "after", "interrupt at commit": "commit"}.get(failure, "none")}
    connect = sql.connect

    def wrapped(index):
        db = connect(index)
        if failure == "refused at commit":
            db.execute("PRAGMA foreign_keys = ON")  # off by default: the trap's deferred key is then checked
        opened.append(db)
        return Interrupting(db, plan)

    monkeypatch.setattr(sql, "connect", wrapped)
    return opened


def _set_trap(index: Path, on: str) -> None:
    """A trigger that, on each `on` (DELETE, INSERT) of a result, adds a row whose deferred foreign
    key names no parent: SQLite refuses the COMMIT of that transaction, with foreign keys on."""
    with sqlite3.connect(index, isolation_level=None) as db:
        db.execute("CREATE TABLE trap_parent (id INTEGER PRIMARY KEY)")
        db.execute("CREATE TABLE trap_child (parent INTEGER REFERENCES trap_parent(id) DEFERRABLE INITIALLY DEFERRED)")
        db.execute(f"CREATE TRIGGER trap AFTER {on} ON results BEGIN INSERT INTO trap_child VALUES (7); END")
    db.close()


def _lift_trap(index: Path) -> None:
    db = sqlite3.connect(index, isolation_level=None)
    db.execute("DROP TRIGGER trap")
    db.close()


def _rows(index: Path) -> dict[str, list[tuple]]:
    db = sqlite3.connect(f"file:{index}?mode=ro", uri=True)
    try:
        return {table: db.execute(f"SELECT * FROM {table} ORDER BY 1").fetchall()
                for table in ("results", "claims", "models")}
    finally:
        db.close()


def _files(folder: Path) -> dict[str, str]:
    """Every file under `folder` but SQLite's own (compared by their rows instead), by its content."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and not p.name.startswith("index.sqlite")}


def _writable_at_once(index: Path) -> None:
    """Another connection takes the write lock without waiting: none was left holding it."""
    db = sqlite3.connect(index, timeout=0.2, isolation_level=None)
    try:
        with transaction(db, "BEGIN IMMEDIATE"):
            db.execute("INSERT INTO claims (key, owner, expires) VALUES ('probe', 'test', 0)")
        db.execute("DELETE FROM claims WHERE key = 'probe'")
    finally:
        db.close()


class Judge:
    """A model as the store sees one: its fingerprint, described in the models table."""

    def __init__(self, fingerprint: str):
        self.fingerprint = fingerprint


def _filled(root: Path, *, model: str = "fp-judge") -> Store:
    """A store of 4 pictures (records and files), 3 answers of the model `model` (described in the
    models table), one lapsed and one live claim."""
    store = Store(root, read_only=False)
    store.put_images("reconstruction", {k: (Image.new("RGB", (4, 4), (40 * n, 0, 0)), {"n": n})
                                        for n, k in enumerate(PICTURES)})
    store.put_json("judge-answer", {k: f"answer {n}" for n, k in enumerate(ANSWERS)}, model=Judge(model))
    with transaction(store.connect()) as db:
        db.execute("INSERT INTO claims VALUES ('lapsed', 'someone', ?), ('live', 'someone', ?)",
                   (time.time() - 60, time.time() + 600))
    return store


def _thumbnail(root: Path) -> Path:
    thumb = root / "thumbs" / "ab" / "abc.jpg"
    thumb.parent.mkdir(parents=True)
    thumb.write_bytes(b"a report's thumbnail")
    return thumb


def _left_open(db: sqlite3.Connection) -> bool:
    try:
        return db.in_transaction
    except sqlite3.ProgrammingError:  # closed: SQLite rolled back whatever was open
        return False


def _check_nothing_changed(opened, index: Path, rows_before, files_before, folder: Path) -> None:
    assert opened, "the operation opened no connection through the store"
    assert not any(_left_open(db) for db in opened), "a transaction was left open"
    assert _rows(index) == rows_before
    assert _files(folder) == files_before
    _writable_at_once(index)


def _stop_part_way(monkeypatch, failure: str, index: Path, folder: Path, trap_on: str, at: str, operation) -> None:
    """Run `operation` under `failure` (the COMMIT refused by a trap on `trap_on`, or an interrupt
    at the statement starting `at`), check it raised and changed nothing, and lift the trap."""
    if failure == "refused at commit":
        _set_trap(index, trap_on)
    rows_before, files_before = _rows(index), _files(folder)
    with monkeypatch.context() as patch:
        opened = _inject(patch, failure, at)
        with pytest.raises(sqlite3.IntegrityError if failure == "refused at commit" else KeyboardInterrupt):
            operation()
    _check_nothing_changed(opened, index, rows_before, files_before, folder)
    if failure == "refused at commit":
        _lift_trap(index)


@pytest.mark.parametrize("failure", FAILURES)
def test_verify_repair_stopped_part_way_changes_nothing_and_runs_again(tmp_path, monkeypatch, failure):
    root = tmp_path / "cache"
    store = _filled(root)
    index = root / "index.sqlite"
    missing, damaged = store.image_path(PICTURES[0]), store.image_path(PICTURES[1])
    missing.unlink()
    damaged.write_bytes(b"not the png")
    with transaction(store.connect()) as db:  # a value failing its checksum
        db.execute("UPDATE results SET checksum = 'bad' WHERE key = ?", (ANSWERS[0],))
    orphan = store.image_path("ab" * 32)
    orphan.parent.mkdir(exist_ok=True)  # a picture's folder is made by its first picture, and none went under ab/
    orphan.write_bytes(b"left by nobody")
    os.utime(orphan, (time.time() - 3600,) * 2)
    del store
    gc.collect()
    _stop_part_way(monkeypatch, failure, index, root, "DELETE", "DELETE FROM results",
                   lambda: cache_verify(root, repair=True))
    report = cache_verify(root, repair=True)
    assert (len(report["missing_files"]), len(report["damaged_files"]), len(report["bad_values"])) == (1, 1, 1)
    assert report["expired_claims"] == 1
    left = _rows(index)
    assert sorted(k for k, *_ in left["results"]) == sorted([*PICTURES[2:], *ANSWERS[1:]])
    assert [k for k, *_ in left["claims"]] == ["live"]
    assert not orphan.exists() and not damaged.exists()
    assert cache_verify(root)["ok"]


@pytest.mark.parametrize("failure", FAILURES)
def test_prune_stopped_part_way_changes_nothing_and_runs_again(tmp_path, monkeypatch, failure):
    root = tmp_path / "cache"
    store = _filled(root)
    index = root / "index.sqlite"
    thumb = _thumbnail(root)
    pictures = [store.image_path(k) for k in PICTURES]
    del store
    gc.collect()
    _stop_part_way(monkeypatch, failure, index, root, "DELETE", "DELETE FROM results",
                   lambda: cache_prune(root, max_size=0))
    assert thumb.exists() and all(p.exists() for p in pictures)
    report = cache_prune(root, model="fp-judge")
    assert report["removed"] == len(ANSWERS) and report["thumbnails_removed"] == 1
    assert sorted(k for k, *_ in _rows(index)["results"]) == sorted(PICTURES)
    assert not thumb.exists() and all(p.exists() for p in pictures)


@pytest.mark.parametrize("failure", FAILURES)
def test_merge_stopped_part_way_changes_nothing_and_runs_again(tmp_path, monkeypatch, failure):
    source = tmp_path / "shard"
    _filled(source, model="fp-shard")
    into = tmp_path / "merged"
    present = Store(into, read_only=False)
    present.put_json("judge-answer", {ANSWERS[0]: "answer 0"}, model="fp-shard")  # already there, its model undescribed
    index = into / "index.sqlite"
    gc.collect()
    del present
    assert not _rows(index)["models"]  # a model named by a string is not described; the shard's is
    _stop_part_way(monkeypatch, failure, index, into, "INSERT", "INSERT OR IGNORE INTO results",
                   lambda: merge_stores([source], into))
    assert merge_stores([source], into) == {"copied": len(PICTURES) + len(ANSWERS) - 1, "present": 1, "damaged": 0}
    merged = Store(into)
    assert sorted(merged.get_images(PICTURES, verify=True)) == sorted(PICTURES)
    assert merged.get_json(ANSWERS) == {k: f"answer {n}" for n, k in enumerate(ANSWERS)}
    assert [fp for fp, _ in _rows(index)["models"]] == ["fp-shard"]


def test_merge_keeps_the_targets_description_of_a_model_and_adds_the_sources_others(tmp_path):
    """A model both stores describe keeps the description the target had; one only the source
    describes is added with its words."""
    _filled(tmp_path / "shard")
    _filled(tmp_path / "merged")
    gc.collect()
    for root, words, extra in ((tmp_path / "shard", "the shard's words", [("fp-new", "a model the shard adds")]),
                               (tmp_path / "merged", "the target's words", [])):
        db = sqlite3.connect(root / "index.sqlite", isolation_level=None)
        db.execute("UPDATE models SET description = ? WHERE fingerprint = 'fp-judge'", (words,))
        db.executemany("INSERT INTO models VALUES (?, ?)", extra)
        db.close()
    assert merge_stores([tmp_path / "shard"], tmp_path / "merged")["present"] == len(PICTURES) + len(ANSWERS)
    assert _rows(tmp_path / "merged" / "index.sqlite")["models"] == [("fp-judge", "the target's words"),
                                                                    ("fp-new", "a model the shard adds")]


def test_insert_rows_replaces_the_row_there_or_keeps_it(tmp_path):
    """The store's one insert: by default the row given replaces the one with its key; with
    on_conflict="IGNORE" the one there stays; anything else is refused before any SQL runs.
    Enough rows to take several statements (999 values each: 333 rows of three)."""
    db = sqlite3.connect(tmp_path / "t.sqlite", isolation_level=None)
    db.execute("CREATE TABLE t (k INTEGER PRIMARY KEY, a TEXT, b TEXT)")
    sql.insert_rows(db, "t", "k, a, b", [(k, "first", str(k)) for k in range(700)])
    sql.insert_rows(db, "t", "k, a, b", [(k, "kept?", "no") for k in range(0, 700, 2)], on_conflict="IGNORE")
    sql.insert_rows(db, "t", "k, a, b", [(k, "second", "x") for k in range(1, 700, 2)])
    sql.insert_rows(db, "t", "k, a, b", [(700, "new", "y")], on_conflict="IGNORE")
    got = db.execute("SELECT k, a, b FROM t ORDER BY k").fetchall()
    assert got == [(k, "first", str(k)) if k % 2 == 0 else (k, "second", "x") for k in range(700)] + [(700, "new", "y")]
    with pytest.raises(ValueError, match="on_conflict must be one of REPLACE, IGNORE, not 'ABORT; DROP TABLE t'"):
        sql.insert_rows(db, "t", "k, a, b", [(1, "z", "z")], on_conflict="ABORT; DROP TABLE t")
    assert db.execute("SELECT count(*) FROM t").fetchone() == (701,)
    db.close()


def test_merge_checks_every_source_before_copying_anything(tmp_path):
    source = tmp_path / "shard"
    _filled(source)
    into = tmp_path / "merged"
    with pytest.raises(StoreError, match=f"no store at {tmp_path / 'nowhere'}"):
        merge_stores([source, tmp_path / "nowhere"], into)
    assert not into.exists()
    with pytest.raises(StoreError, match="is the store merged into"):
        merge_stores([tmp_path / "shard", source], source)
    (tmp_path / "a-file").write_text("not a store")
    with pytest.raises(StoreError, match=f"the store merged into, {tmp_path / 'a-file'}, is a file, not a folder"):
        merge_stores([source], tmp_path / "a-file")
    assert sorted(k for k, *_ in _rows(source / "index.sqlite")["results"]) == sorted([*PICTURES, *ANSWERS])


def _damaged_index(root: Path) -> bytes:
    """A store of 40 answers whose index fails SQLite's integrity check (its model index's page
    overwritten) while every row of the results table still reads; the damaged file's bytes."""
    store = Store(root, read_only=False)
    store.put_json("judge-answer", {content_key("long answer", n=n): "x" * 300 for n in range(40)}, model="fp")
    del store
    gc.collect()
    index = root / "index.sqlite"
    db = sqlite3.connect(index)
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    page = db.execute("SELECT rootpage FROM sqlite_master WHERE name = 'results_model'").fetchone()[0]
    size = db.execute("PRAGMA page_size").fetchone()[0]
    db.close()
    data = bytearray(index.read_bytes())
    data[(page - 1) * size : page * size] = b"\xff" * size
    index.write_bytes(bytes(data))
    return bytes(data)


@pytest.mark.parametrize("failure", FAILURES[1:])
def test_a_rebuild_stopped_part_way_leaves_the_damaged_index_in_place(tmp_path, monkeypatch, failure):
    root = tmp_path / "cache"
    damaged = _damaged_index(root)
    index = root / "index.sqlite"
    assert cache_verify(root)["index"].startswith("damaged: ")
    with monkeypatch.context() as patch:
        opened = _inject(patch, failure, "INSERT OR REPLACE INTO results")
        with pytest.raises(KeyboardInterrupt):
            cache_verify(root, repair=True)
    assert opened and not any(_left_open(db) for db in opened)
    assert index.read_bytes() == damaged and cache_verify(root)["index"].startswith("damaged: ")
    assert not list(root.glob("index.sqlite.*"))  # neither a half-built index nor one moved aside
    report = cache_verify(root, repair=True)
    assert report["salvaged"] == 40 and report["entries"] == 40
    assert Path(report["moved_aside"]).read_bytes() == damaged
    assert cache_verify(root)["ok"] and len(Store(root).get_json(
        [content_key("long answer", n=n) for n in range(40)])) == 40


# -- keys that cannot name a file --------------------------------------------------------


def test_keys_that_could_leave_the_images_folder_name_no_file():
    assert key_problem("ab" * 32) is None and key_problem("k") is None and key_problem("a.b-c_d") is None
    for key in ["../../victim", "ab/../../x", "..", ".hidden", "", "a\\b", "C:x", "a\x00b", 7]:
        assert key_problem(key), key
    with pytest.raises(ValueError, match="cannot name a picture file"):
        Store.temporary().image_path("../../victim")


def _crafted_row(index: Path, key: str, file: Path) -> None:
    """A reconstruction's row, as another program might write it, whose key climbs to `file`."""
    data = file.read_bytes()
    db = sqlite3.connect(index, isolation_level=None)
    db.execute("INSERT INTO results (key, kind, value, created, checksum, file_checksum, file_size) "
               "VALUES (?, 'reconstruction', '{}', 0, ?, ?, ?)", (key, sql.sha256("{}"), sql.sha256(data), len(data)))
    db.close()


def test_verify_prune_merge_and_the_cap_never_touch_a_file_outside_the_cache(tmp_path):
    root = tmp_path / "a" / "cache"
    _filled(root)
    victim = tmp_path / "victim.png"  # root/images/../../../victim.png, from the key "../../victim"
    victim.write_bytes(b"someone's picture")
    key = "../../victim"
    assert (root / "images" / key[:2] / f"{key}.png").resolve() == victim.resolve()
    _crafted_row(root / "index.sqlite", key, victim)
    victim.write_bytes(b"someone's picture, changed since")  # its checksum fails now: verify would delete it
    report = cache_verify(root)
    assert report["unsafe_keys"] == [key] and not report["damaged_files"] and report["ok"] is False
    assert cache_verify(root, repair=True)["unsafe_keys"] == [key]
    assert victim.exists() and key not in {k for k, *_ in _rows(root / "index.sqlite")["results"]}
    assert cache_verify(root)["ok"]

    _crafted_row(root / "index.sqlite", key, victim)
    assert cache_prune(root, max_size=0)["removed"] == len(PICTURES) + len(ANSWERS) + 1
    assert victim.exists()

    shard = tmp_path / "b" / "shard"
    _filled(shard)
    _crafted_row(shard / "index.sqlite", key, victim)  # its checksum matches: merge would copy it
    into = tmp_path / "c" / "d" / "merged"  # the key's file would be c/victim.png
    assert merge_stores([shard], into) == {"copied": len(PICTURES) + len(ANSWERS), "present": 0, "damaged": 1}
    assert [p.name for p in (tmp_path / "c").iterdir()] == ["d"]

    capped = tmp_path / "a" / "capped"
    _filled(capped)
    _crafted_row(capped / "index.sqlite", key, victim)
    store = Store(capped, read_only=False, max_size=1)
    assert store.enforce_cap() == len(PICTURES) + len(ANSWERS) + 1
    assert victim.exists()
