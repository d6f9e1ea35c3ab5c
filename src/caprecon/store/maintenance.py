"""Looking after a store: what it holds (`cache_info`), whether every entry reads back as written
(`cache_verify`, which can repair), deleting entries (`cache_prune`), and copying the verified results
of several stores into one (`merge_stores`): `caprecon cache info|verify|prune` and `caprecon store
merge`, each returning the dict the command prints with `--json`. With the other modules of `store/`
(the tables are made in `sql`), the only ones that know the store's schema and SQL. Each operation
changes the index in one transaction (`Store.transaction`; a merge, one per source), and deletes files
only once it is committed: one that fails or is interrupted changes nothing in the index (a merge keeps
the sources before the one that failed) and leaves no transaction open.

    caprecon.cache_info()                                   # the default cache ($CAPRECON_CACHE, ...)
    caprecon.cache_prune("/shared/cache", max_size=10**10, dry_run=True)["removed"]
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import time
from pathlib import Path
from typing import Any, Collection, Sequence

from caprecon.core.checks import number_problem
from caprecon.core.errors import ConfigError
from caprecon.core.paths import default_cache_dir, path_problem
from caprecon.core.transactions import transaction
from caprecon.store import sql
from caprecon.store.errors import StoreError, StoreReadOnlyError
from caprecon.store.images import key_problem, read_verified
from caprecon.store.index import INDEX, Store, is_writable
from caprecon.store.sql import sha256

# the largest size and age prune takes: far beyond any disk or any cache's life, and finite (1e400GB is
# inf as a float, which no byte count is)
MAX_SIZE, MAX_AGE = 10**18, 1000 * 365.25 * 86400
ORPHAN_GRACE_SECONDS = 600  # a newer file without an index row may belong to a run writing it right now


def _open(root: Path, *, write: bool) -> Store:
    if not (root / INDEX).exists():
        raise StoreError(f"no cache at {root} (no {INDEX} there)")
    store = Store(root)
    if write and store.read_only:
        raise StoreReadOnlyError(f"cache {root} is read-only here; changing it needs write access to the folder")
    return store


def _select(store: Store, columns: list[str]) -> str:
    """The columns, with NULL for those an old, read-only index lacks."""
    have = store.columns
    named = {c: c[c.find("(") + 1 : c.rfind(")")] if "(" in c else c for c in columns}  # length(value) -> value
    return ", ".join(c if have is None or named[c] in have else f"NULL AS {named[c]}" for c in columns)


def _entry_size(store: Store, key: str, value_len: int, file_size: int | None, has_file: bool) -> int:
    if file_size is None and has_file and key_problem(key) is None:  # an entry stored before sizes were recorded
        path = store.image_path(key)
        file_size = path.stat().st_size if path.exists() else 0
    return value_len + (file_size or 0)


def cache_root(cache_dir: str | Path | None = None) -> Path:
    """The cache a command looks after: `cache_dir`, or the default ($CAPRECON_CACHE, else
    ~/.cache/caprecon); one that is not a folder is named as a missing input is (`--cache-dir: not
    found: x`)."""
    if cache_dir is None:
        return default_cache_dir()
    problem = path_problem(cache_dir)
    if problem is None and not Path(cache_dir).is_dir():
        problem = f"not a folder: {cache_dir} is a file"
    if problem:
        raise ConfigError(f"--cache-dir: {problem}")
    return Path(cache_dir)


# -- info ---------------------------------------------------------------------------


def cache_info(root: str | Path | None = None) -> dict[str, Any]:
    """`caprecon cache info`: entries and bytes by kind (`kinds`) and by model (`models`: fingerprint,
    name, entries, bytes), and the report thumbnails (`thumbnails`: files, bytes), of the cache at
    `root` (default: the default cache)."""
    store = _open(cache_root(root), write=False)
    db = store.connect()
    model, file_size = _select(store, ["model", "file_size"]).split(", ")
    kinds = [{"kind": k, "entries": n, "bytes": (v or 0) + (f or 0)} for k, n, v, f in db.execute(
        f"SELECT kind, count(*), sum(length(value)), sum({file_size}) FROM results GROUP BY kind ORDER BY kind")]
    described = _descriptions(db)
    models = []
    for fingerprint, n, v, f in db.execute(f"SELECT {model}, count(*), sum(length(value)), sum({file_size}) "
                                           f"FROM results GROUP BY 1 ORDER BY 2 DESC"):
        about = json.loads(described[fingerprint]) if fingerprint in described else {}
        models.append({"fingerprint": fingerprint, "model": _model_name(about), "entries": n,
                       "bytes": (v or 0) + (f or 0)})
    thumbs = _thumbnails(store.root)
    return {"root": str(store.root), "kinds": kinds, "models": models,
            "thumbnails": {"files": len(thumbs), "bytes": sum(size for _, size in thumbs)}}


def _thumbnails(root: Path) -> list[tuple[Path, int]]:
    """The report thumbnails cached under the store (`thumbs/`): a disposable cache, made again when missing."""
    folder = root / "thumbs"
    out = []
    for path in folder.rglob("*.jpg") if folder.is_dir() else []:
        try:
            out.append((path, path.stat().st_size))
        except OSError:
            continue
    return out


def _descriptions(db: sqlite3.Connection) -> dict[str, str]:
    try:
        return dict(db.execute("SELECT fingerprint, description FROM models"))
    except sqlite3.OperationalError:  # an old, read-only index without the models table
        return {}


def _model_name(about: dict[str, Any]) -> str | None:
    for field in ("model", "name", "weights", "weights_dir", "backend", "class"):
        if isinstance(about.get(field), str) and about[field]:
            name = about[field]
            return name if len(name) <= 60 else "…" + name[-59:]
    return None


# -- verify -------------------------------------------------------------------------


def cache_verify(root: str | Path | None = None, *, repair: bool = False) -> dict[str, Any]:
    """`caprecon cache verify`: check every entry of the cache at `root` (default: the default cache): value checksums, image files present and matching their checksum,
    files under images/ that no index row names (orphans), keys that cannot name a picture file
    (`unsafe_keys`: written by another program, they could lead out of the cache), lapsed claims. A
    damaged index (`index_file`) is reported as `index: "damaged: WHAT"`, with nothing else checked.
    With `repair`, bad entries and orphans are deleted (they are recomputed when next needed; of an
    unsafe key, its row alone, never a file), entries stored before checksums get theirs, and a
    damaged index is rebuilt from whatever rows can still be read and moved aside."""
    root = cache_root(root)
    index = root / INDEX
    report: dict[str, Any] = {"root": str(root), "index_file": str(index), "index": "ok", "entries": 0,
                              "bad_values": [], "unsafe_keys": [], "missing_files": [], "damaged_files": [],
                              "orphans": [],
                              "expired_claims": 0, "checksums_added": 0, "repaired": repair}
    if not index.exists():
        raise StoreError(f"no cache at {root} (no {INDEX} there)")
    writable = is_writable(root)
    if repair and not writable:
        raise StoreReadOnlyError(f"cache {root} is read-only here; --repair needs write access to the folder "
                                 "(without --repair, verify only reads)")
    problem = _index_problem(index, read_only=not writable)
    if problem:
        # SQLite's integrity check answers one line per damaged page: one line here, the first few
        lines = [line.strip() for line in problem.splitlines() if line.strip() and not line.startswith("***")]
        report["index"] = "damaged: " + "; ".join(lines[:4])
        if not repair:
            report["ok"] = False
            return report
        report["salvaged"], report["moved_aside"] = _rebuild_index(index)
    store = _open(root, write=repair)
    db = store.connect()
    bad_keys, backfill = [], []
    file_keys: set[str] = set()
    for key, kind, value, checksum, file_checksum, file_size in db.execute(
            f"SELECT {_select(store, ['key', 'kind', 'value', 'checksum', 'file_checksum', 'file_size'])} FROM results"):
        report["entries"] += 1
        if checksum is not None and sha256(value) != checksum:
            report["bad_values"].append(key)
            bad_keys.append(key)
            continue
        has_file = file_checksum is not None or kind == "reconstruction"
        new_checksums = {"checksum": checksum or sha256(value)}
        if has_file:
            if key_problem(key):
                report["unsafe_keys"].append(key)
                bad_keys.append(key)
                continue
            file_keys.add(key)
            path = store.image_path(key)
            if not path.exists():
                report["missing_files"].append(key)
                bad_keys.append(key)
                continue
            if read_verified(path, file_checksum) is None:
                report["damaged_files"].append(key)
                bad_keys.append(key)
                continue
            if file_checksum is None:
                data = path.read_bytes()
                new_checksums.update(file_checksum=sha256(data), file_size=len(data))
        if checksum is None or (has_file and file_checksum is None):
            backfill.append((new_checksums["checksum"], new_checksums.get("file_checksum", file_checksum),
                             new_checksums.get("file_size", file_size), key))
    now = time.time()
    images = root / "images"
    for path in sorted(images.rglob("*")) if images.exists() else []:
        if not path.is_file() or now - path.stat().st_mtime < ORPHAN_GRACE_SECONDS:
            continue
        if path.suffix != ".png" or path.stem not in file_keys:
            report["orphans"].append(str(path.relative_to(root)))
    try:
        report["expired_claims"] = db.execute("SELECT count(*) FROM claims WHERE expires < ?", (now,)).fetchone()[0]
    except sqlite3.OperationalError:  # an old, read-only index without claims
        report["expired_claims"] = 0
    if repair:
        with store.transaction() as db:
            sql.delete_results(db, bad_keys)
            db.executemany("UPDATE results SET checksum = ?, file_checksum = ?, file_size = ? WHERE key = ?", backfill)
            db.execute("DELETE FROM claims WHERE expires < ?", (now,))
        report["checksums_added"] = len(backfill)
        for key in bad_keys:
            if key_problem(key) is None:
                store.image_path(key).unlink(missing_ok=True)
        for rel in report["orphans"]:
            (root / rel).unlink(missing_ok=True)
    problems = [report[k] for k in ("bad_values", "unsafe_keys", "missing_files", "damaged_files", "orphans")]
    report["ok"] = repair or not any(problems)
    return report


def _index_problem(index: Path, *, read_only: bool) -> str | None:
    if not index.is_file():  # SQLite would say only that it is "unable to open database file"
        return f"not a file ({'a folder' if index.is_dir() else 'not a regular file'}), where SQLite's index should be"
    try:
        # read-only, SQLite cannot make the reader files of a WAL index: read it as the store does
        db = Store(index.parent).connect() if read_only else sqlite3.connect(index, timeout=60)
        try:
            result = db.execute("PRAGMA integrity_check").fetchall()
            db.execute("SELECT count(*) FROM results").fetchone()
        finally:
            db.close()
    except StoreError as exc:  # the read-only store found the damage first
        return str(exc)
    except sqlite3.DatabaseError as exc:
        return str(exc)
    return None if result == [("ok",)] else "; ".join(r[0] for r in result[:5])


def _rebuild_index(index: Path) -> tuple[int, str]:
    """Copy every row of the damaged index that still reads into a new index beside it, then move
    the damaged one aside and the new one into its place. Until the new one is whole the damaged
    one stays where it is: a rebuild that fails (a full disk, an interrupt) changes nothing."""
    rows = _readable_rows(index)
    fresh = index.with_name(INDEX + ".rebuilding")
    _remove_with_logs(fresh)  # left by a rebuild that died
    db = sql.connect(fresh)
    try:
        sql.create_tables(db)
        with transaction(db, "BEGIN IMMEDIATE"):
            sql.insert_rows(db, "results", sql.RESULT_COLUMNS, rows)
    except BaseException:
        db.close()
        _remove_with_logs(fresh)
        raise
    db.close()  # the last connection: SQLite moves the log into the file
    aside = index.with_name(f"{INDEX}.damaged-{time.strftime('%Y%m%d-%H%M%S')}")
    _move_with_logs(index, aside)
    _move_with_logs(fresh, index)
    return len(rows), str(aside)


def _move_with_logs(index: Path, to: Path) -> None:
    """Move an SQLite file with its write-ahead log and shared-memory file, where it has them."""
    shutil.move(index, to)
    for suffix in ("-wal", "-shm"):
        extra = index.with_name(index.name + suffix)
        if extra.exists():
            shutil.move(extra, to.with_name(to.name + suffix))


def _remove_with_logs(index: Path) -> None:
    for suffix in ("", "-wal", "-shm"):
        index.with_name(index.name + suffix).unlink(missing_ok=True)


def _readable_rows(damaged: Path) -> list[tuple]:
    try:
        db = sqlite3.connect(f"file:{damaged}?mode=ro", uri=True)
        columns = sql.result_columns(db)
        last = db.execute("SELECT max(rowid) FROM results").fetchone()[0] or 0
    except sqlite3.DatabaseError:
        return []  # nothing in it can be read: every entry is recomputed when next needed
    # the new index's columns, in its order; NULL for those an old index lacks
    select = ", ".join(c if c in columns else f"NULL AS {c}" for c in sql.RESULT_COLUMNS.split(", "))
    rows: list[tuple] = []
    for start in range(0, last + 1, 256):
        try:
            rows.extend(db.execute(f"SELECT {select} FROM results WHERE rowid BETWEEN ? AND ?",
                                   (start, start + 255)).fetchall())
        except sqlite3.DatabaseError:
            for rowid in range(start, start + 256):  # a damaged page: keep the rows around it
                try:
                    rows.extend(db.execute(f"SELECT {select} FROM results WHERE rowid = ?", (rowid,)).fetchall())
                except sqlite3.DatabaseError:
                    continue
    db.close()
    return rows


# -- prune --------------------------------------------------------------------------


def cache_prune(root: str | Path | None = None, *, older_than: float | None = None, model: str | None = None,
                aliases: Collection[str] = (), max_size: int | None = None, dry_run: bool = False) -> dict[str, Any]:
    """`caprecon cache prune`: in the cache at `root` (default: the default cache), delete entries older than `older_than` seconds and/or computed by `model` (a
    fingerprint or its prefix, or the model's name as `cache info` shows it, or one of `aliases`: the
    hub ids or folders its registry name stands for); then, with `max_size`, the oldest entries until
    the rest fit in that many bytes. A registry name (z-image) is matched by the hub ids it stands for:
    `caprecon.models.registry.registered_as(name)`, which the command passes as `aliases`."""
    if older_than is None and model is None and max_size is None:
        raise StoreError("say what to prune: --older-than AGE, --model NAME and/or --max-size SIZE")
    for name, value, bound in (("--older-than", older_than, MAX_AGE), ("--max-size", max_size, MAX_SIZE)):
        problem = None if value is None else number_problem(value, low=0, high=bound)
        if problem:
            raise ConfigError(f"{name} {problem}")
    root = cache_root(root)
    store = _open(root, write=not dry_run)
    db = store.connect()
    columns = _select(store, ["key", "kind", "created", "model", "length(value)", "file_size", "file_checksum"])
    entries = [(key, created, fp, _entry_size(store, key, n, fsize, fchk is not None or kind == "reconstruction"))
               for key, kind, created, fp, n, fsize, fchk in db.execute(
                   f"SELECT {columns} FROM results ORDER BY created")]
    fingerprints = _matching_models(db, model, aliases) if model is not None else None
    if model is not None and not fingerprints:
        raise StoreError(f"no model in {root} matches {model!r}; `caprecon cache info --cache-dir {root}` lists them")
    now = time.time()
    doomed = set()
    if older_than is not None or fingerprints is not None:
        for key, created, fp, _ in entries:
            if (older_than is None or now - created > older_than) and (fingerprints is None or fp in fingerprints):
                doomed.add(key)
    total = sum(size for *_, size in entries)
    kept = total - sum(size for key, *_, size in entries if key in doomed)
    if max_size is not None:
        for key, _, _, size in entries:  # oldest first
            if kept <= max_size:
                break
            if key not in doomed:
                doomed.add(key)
                kept -= size
    thumbs = _thumbnails(root)
    report = {"root": str(root), "entries": len(entries), "removed": len(doomed), "bytes_before": total,
              "bytes_after": kept, "dry_run": dry_run, "thumbnails_removed": len(thumbs) if doomed else 0}
    if dry_run or not doomed:
        return report
    with store.transaction() as db:
        sql.delete_results(db, sorted(doomed))
    for key in doomed:
        if key_problem(key) is None:  # a key no picture file can have, written by another program, has none
            store.image_path(key).unlink(missing_ok=True)
    for path, _ in thumbs:  # report thumbnails are not tied to entries: they go, and are made again when needed
        path.unlink(missing_ok=True)
    try:
        db.execute("VACUUM")  # give the space back to the file system
    except sqlite3.OperationalError as exc:  # another process has the index open in a transaction
        report["note"] = f"index not compacted ({exc}); run prune again when the cache is idle"
    return report


def _matching_models(db: sqlite3.Connection, wanted: str, aliases: Collection[str]) -> set[str]:
    described = _descriptions(db)
    used = {fp for (fp,) in db.execute("SELECT DISTINCT model FROM results WHERE model IS NOT NULL")}
    names = {wanted, *aliases}
    out = set()
    for fp in used | set(described):
        about = json.loads(described.get(fp) or "{}")
        if fp.startswith(wanted) or names & {str(about.get(f)) for f in ("model", "name", "weights", "weights_dir")}:
            out.add(fp)
    return out


def merge_stores(sources: Sequence[str | Path], into: str | Path) -> dict[str, Any]:
    """Copy every verified result of `sources` into the store `into` (created if absent).
    An entry whose value or file fails its checksum is skipped and counted, never copied.
    Each source goes in one transaction, its picture files first: a merge that fails part way
    keeps the sources before the one that failed, removes the files it copied for that one, and
    copies the rest when run again (what is there already is counted as present)."""
    roots = [Path(source) for source in sources]
    if Path(into).exists() and not Path(into).is_dir():
        raise StoreError(f"the store merged into, {into}, is a file, not a folder")
    for root in roots:  # every source and the target checked before anything is copied
        if not (root / INDEX).exists():
            raise StoreError(f"no store at {root} (no {INDEX} there)")
        if root.resolve() == Path(into).resolve():
            raise StoreError(f"{root} is the store merged into; give the per-shard stores as sources")
    target = Store(into, read_only=False)
    counts = {"copied": 0, "present": 0, "damaged": 0}
    for root in roots:
        src = Store(root, read_only=True)
        db, out = src.connect(), target.connect()
        have = {row[0] for row in out.execute("SELECT key FROM results")}
        rows = db.execute(f"SELECT {sql.RESULT_COLUMNS} FROM results")
        batch, copied_files, source_counts = [], [], {"copied": 0, "present": 0, "damaged": 0}
        try:
            for key, kind, value, created, checksum, file_checksum, file_size, model in rows:
                if key in have:
                    source_counts["present"] += 1
                    continue
                if checksum is not None and sha256(value) != checksum:
                    source_counts["damaged"] += 1
                    continue
                if file_checksum is not None:
                    if key_problem(key):  # it could name a file outside either store
                        source_counts["damaged"] += 1
                        continue
                    path = src.image_path(key)
                    if not path.is_file() or sha256(path.read_bytes()) != file_checksum:
                        source_counts["damaged"] += 1
                        continue
                    destination = target.image_path(key)
                    if not destination.exists():  # one there already, without its row, is an orphan: replaced
                        destination.parent.mkdir(parents=True, exist_ok=True)
                        copied_files.append(destination)
                    shutil.copyfile(path, destination)
                batch.append((key, kind, value, created, checksum, file_checksum, file_size, model))
                source_counts["copied"] += 1
            with target.transaction() as out:
                sql.insert_rows(out, "models", "fingerprint, description",
                                db.execute("SELECT fingerprint, description FROM models").fetchall(),
                                on_conflict="IGNORE")
                sql.insert_rows(out, "results", sql.RESULT_COLUMNS, batch, on_conflict="IGNORE")
        except BaseException:
            for destination in copied_files:  # no index row names them: they would be orphans
                destination.unlink(missing_ok=True)
            raise
        for name, n in source_counts.items():
            counts[name] += n
    return counts
