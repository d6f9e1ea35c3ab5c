#!/usr/bin/env python
"""Compare two golden runs (run_golden.py --out A, --out B): every file, after normalising what
legitimately changes from run to run.

    python tests/golden/compare_golden.py A B [--show N] [--ignore GLOB ...]

Normalised away, and only these:
- the run's own folders (out, inputs, models, tests helpers, caprecon's source folder, Flickr8k,
  the interpreter), replaced by placeholders; loopback ports;
- timestamps, durations, dates, throughput figures, progress bars (stderr), hosts and pids;
- in JSON: keys that hold wall-clock facts or the environment (started, seconds, model_seconds,
  python, platform, libraries, ...; see VOLATILE_KEYS), wherever they occur;
- in SQLite stores: the `created` / `expires` / `mtime_ns` columns (the rows, keys, kinds,
  checksums, sizes and model descriptions are compared, in key order).
Everything else is compared as is: scores, tables, banks, summaries, exit statuses, PNG/JPEG bytes.
Exit status 0 when the trees match, 1 when any file differs or exists on one side only.
"""

from __future__ import annotations

import argparse
import difflib
import fnmatch
import hashlib
import html
import json
import re
import socket
import sqlite3
import sys
from pathlib import Path

# files of the runner itself, not of caprecon
SKIP = ["_golden.json", "_timings.json", "_mplconfig/*", "_server/*", "*.sqlite-wal", "*.sqlite-shm", "*.lock",
        "*/__pycache__/*", "*.pyc"]

# JSON keys whose values are wall-clock facts or describe the environment, not the results
VOLATILE_KEYS = {
    "started", "finished", "ended", "created", "timestamp", "expires",
    "seconds", "model_seconds", "elapsed", "duration", "wall_seconds",
    "python", "platform", "libraries", "versions", "host", "hostname", "pid",
    "samples_per_second", "throughput", "mtime", "mtime_ns",
}
VOLATILE_KEY_PATTERNS = [re.compile(p) for p in (r".*_seconds$", r"^seconds_.*", r".*_per_s(econd)?$", r".*_at$")]

# text patterns: (regex, replacement)
TEXT_RULES = [
    (re.compile(r"\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:?\d\d)?"), "<TIME>"),
    (re.compile(r"\b\d{4}-\d\d-\d\d\b"), "<DATE>"),
    (re.compile(r"\b\d+:\d\d:\d\d(\.\d+)?\b"), "<CLOCK>"),
    (re.compile(r"\b(127\.0\.0\.1|localhost):\d+"), r"\1:<PORT>"),
    (re.compile(r"\b\d+(\.\d+)?\s?(s|sec|seconds|ms|min)\b(?!\w)"), "<DURATION>"),
    (re.compile(r"\b\d+(\.\d+)?\s?(it|samples?|images?|rows?|captions?)/s\b"), "<RATE>"),
    (re.compile(r"\b\d+(\.\d+)?\s?s/(it|samples?|images?|rows?|captions?)\b"), "<RATE>"),
    (re.compile(r"\b\d+(\.\d+)? tokens per second\b"), "<RATE>"),
    (re.compile(r"\bpid[ =:]+\d+\b", re.I), "pid <PID>"),
]
THUMB_NAME = re.compile(r"\b[0-9a-f]{24}\.jpg\b")
# a tqdm progress bar (stderr): "name:  50%|#####     | 2/4 [00:01<00:01,  1.2it/s]"
TQDM = re.compile(r"[^\r\n|]*?\d+%\|[^|\r\n]*\|\s*\d+/\d+\s*\[[^\]\r\n]*\]")


def load_paths(root: Path) -> list[tuple[str, str]]:
    meta = json.loads((root / "_golden.json").read_text())
    pairs = [(meta["inputs"], "<INPUTS>"), (meta["out"], "<OUT>"), (meta["models"], "<MODELS>"),
             (str(Path(meta["models"]).parent), "<MODELS_ROOT>"), (meta["tests"], "<TESTS>"), (meta["src"], "<SRC>"),
             (meta["flickr"], "<FLICKR>"), (meta["python"], "<PYTHON>"), (str(Path(meta["python"]).parent.parent), "<VENV>")]
    pairs.append((str(root.resolve()), "<OUT>"))
    pairs = [(p, name) for p, name in pairs if p and p != "/"]
    return sorted(set(pairs), key=lambda pair: -len(pair[0]))  # the longest (innermost) folders first


class Normaliser:
    def __init__(self, root: Path):
        self.paths = load_paths(root)
        host = socket.gethostname()
        self.host = host if len(host) >= 4 else None
        # A report thumbnail's name hashes its source's path, size and modification time, and
        # reconstructions are written anew by every run: a thumbnail is named by its content instead.
        self.thumbs: dict[str, str] = {}
        for path in sorted(root.rglob("*.jpg")):
            if thumbs_folder(path, root):
                self.thumbs[path.name] = "thumb-" + hashlib.sha256(path.read_bytes()).hexdigest()[:24] + ".jpg"

    def text(self, s: str, *, stderr: bool = False) -> str:
        for path, name in self.paths:
            s = s.replace(path, name)
        if self.host:
            s = s.replace(self.host, "<HOST>")
        if self.thumbs:
            s = THUMB_NAME.sub(lambda m: self.thumbs.get(m.group(0), m.group(0)), s)
        if stderr:  # progress bars redraw with \r as often as time allows: keep no bar, no blank line
            s = TQDM.sub("", s)
            s = "\n".join(part.strip() for line in s.split("\n") for part in line.split("\r") if part.strip())
        for rule, repl in TEXT_RULES:
            s = rule.sub(repl, s)
        return s

    def json(self, value):
        if isinstance(value, dict):
            return {k: self.json(v) for k, v in value.items() if not volatile_key(k)}
        if isinstance(value, list):
            return [self.json(v) for v in value]
        if isinstance(value, str):
            return self.text(value)
        return value


def volatile_key(key) -> bool:
    return isinstance(key, str) and (key in VOLATILE_KEYS or any(p.match(key) for p in VOLATILE_KEY_PATTERNS))


def _json_lines(text: str, norm: Normaliser) -> list[str] | None:
    out = []
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            out.append(json.dumps(norm.json(json.loads(line)), sort_keys=True, ensure_ascii=False))
        except ValueError:
            return None
    return out


def _html(text: str, norm: Normaliser) -> list[str]:
    # JSON blobs inside <script type="application/json"> tags are normalised as JSON
    def blob(match):
        try:
            data = norm.json(json.loads(match.group(2)))
        except ValueError:
            return match.group(1) + norm.text(match.group(2)) + match.group(3)
        return match.group(1) + json.dumps(data, sort_keys=True, ensure_ascii=False) + match.group(3)

    text = re.sub(r'(<script[^>]*type="application/json"[^>]*>)(.*?)(</script>)', blob, text, flags=re.S)

    def pre(match):  # an embedded JSON document (the manifest), HTML-escaped
        try:
            data = norm.json(json.loads(html.unescape(match.group(2))))
        except ValueError:
            return match.group(0)
        return match.group(1) + html.escape(json.dumps(data, indent=1, sort_keys=True, ensure_ascii=False)) + \
            match.group(3)

    text = re.sub(r"(<pre[^>]*>)(.*?)(</pre>)", pre, text, flags=re.S)
    # a run's facts (<dt>seconds</dt><dd>12.3</dd>) and table columns headed by a volatile name
    text = re.sub(r"(<dt>([^<]*)</dt>\s*<dd[^>]*>)(.*?)(</dd>)",
                  lambda m: m.group(1) + ("<VOLATILE>" if volatile_key(m.group(2).strip()) else m.group(3)) + m.group(4),
                  text, flags=re.S)
    text = re.sub(r"<table.*?</table>", _html_table, text, flags=re.S)
    return norm.text(text).splitlines()


CELL = re.compile(r"(<t([dh])[^>]*>)(.*?)(</t\2>)", re.S)


def _html_table(match) -> str:
    table = match.group(0)
    head = re.search(r"<tr>.*?</tr>", table, re.S)
    if not head or "<th" not in head.group(0):
        return table
    names = [re.sub(r"<[^>]+>", "", cell.group(3)).strip() for cell in CELL.finditer(head.group(0))]
    drop = {i for i, name in enumerate(names) if volatile_key(name)}
    if not drop:
        return table

    def row(r):
        cells = list(CELL.finditer(r.group(0)))
        if not cells or cells[0].group(2) == "h":
            return r.group(0)
        out, last = [], 0
        for i, cell in enumerate(cells):
            out.append(r.group(0)[last:cell.start()])
            out.append(cell.group(1) + "<VOLATILE>" + cell.group(4) if i in drop else cell.group(0))
            last = cell.end()
        out.append(r.group(0)[last:])
        return "".join(out)

    return re.sub(r"<tr>.*?</tr>", row, table, flags=re.S)


def _sqlite(path: Path, norm: Normaliser) -> list[str]:
    # a copy, with its write-ahead log (rows not yet checkpointed live there), opened normally
    import shutil
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "db.sqlite"
        shutil.copyfile(path, copy)
        for extra in ("-wal",):
            if Path(f"{path}{extra}").exists():
                shutil.copyfile(f"{path}{extra}", f"{copy}{extra}")
        return _sqlite_rows(copy, norm)


def _sqlite_rows(path: Path, norm: Normaliser) -> list[str]:
    db = sqlite3.connect(path)
    try:
        lines = []
        for (table,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name"):
            columns = [row[1] for row in db.execute(f"PRAGMA table_info({table})")]
            keep = [c for c in columns if c not in ("created", "expires", "mtime_ns", "mtime")]
            lines.append(f"table {table} ({', '.join(columns)})")
            rows = db.execute(f"SELECT {', '.join(keep)} FROM {table}").fetchall()
            rendered = []
            for row in rows:
                cells = []
                for column, cell in zip(keep, row):
                    if isinstance(cell, bytes):
                        cell = _blob(cell, norm)
                    elif isinstance(cell, str):
                        cell = norm.text(cell)
                    cells.append(f"{column}={cell}")
                rendered.append("  " + " | ".join(map(str, cells)))
            lines += sorted(rendered)
        return lines
    finally:
        db.close()


def _blob(cell: bytes, norm: Normaliser) -> str:
    try:
        text = cell.decode("utf-8")
    except UnicodeDecodeError:
        return f"<{len(cell)} bytes sha256:{hashlib.sha256(cell).hexdigest()[:16]}>"
    try:
        return json.dumps(norm.json(json.loads(text)), sort_keys=True, ensure_ascii=False)
    except ValueError:
        return norm.text(text)


def _parquet(path: Path, norm: Normaliser) -> list[str]:
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    lines = [f"schema {table.schema.to_string(show_schema_metadata=False)}"]
    lines += [json.dumps(norm.json(row), sort_keys=True, ensure_ascii=False, default=str) for row in table.to_pylist()]
    return lines


def normalised(path: Path, rel: str, norm: Normaliser) -> list[str] | bytes:
    """The comparable content of a file: a list of lines, or raw bytes for binary files."""
    suffix = path.suffix.lower()
    if suffix in (".png", ".jpg", ".jpeg", ".gif", ".webp", ".npy", ".npz", ".safetensors", ".pt", ".bin"):
        return path.read_bytes()
    if suffix == ".sqlite" or path.name.endswith(".sqlite") or ".sqlite.damaged-" in path.name:
        try:
            return _sqlite(path, norm)
        except sqlite3.DatabaseError:
            return path.read_bytes()
    if suffix == ".parquet":
        return _parquet(path, norm)
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return data
    if suffix == ".json":
        try:
            return json.dumps(norm.json(json.loads(text)), indent=1, sort_keys=True, ensure_ascii=False).splitlines()
        except ValueError:
            pass
    if suffix == ".jsonl":
        lines = _json_lines(text, norm)
        if lines is not None:
            return lines
    if suffix in (".html", ".htm"):
        return _html(text, norm)
    if path.name == "stdout.txt" and text.lstrip().startswith(("{", "[")):  # a command printing JSON
        try:
            return json.dumps(norm.json(json.loads(text)), indent=1, sort_keys=True, ensure_ascii=False).splitlines()
        except ValueError:
            lines = _json_lines(text, norm)
            if lines is not None:
                return lines
    return norm.text(text, stderr=path.name == "stderr.txt" or path.name.endswith(".log")).splitlines()


def thumbs_folder(path: Path, root: Path) -> str | None:
    """The `thumbs` folder (a report's report_files/thumbs, a cache's thumbs/xx) a JPEG lies in, if any."""
    if path.suffix != ".jpg" or not THUMB_NAME.fullmatch(path.name):
        return None
    parts = path.relative_to(root).parts
    if "thumbs" not in parts[:-1]:
        return None
    return "/".join(parts[: len(parts) - 1 - parts[::-1][1:].index("thumbs")])


def files(root: Path, ignore: list[str]) -> dict[str, Path]:
    found = {}
    for path in root.rglob("*"):
        if not path.is_file():
            continue
        rel = path.relative_to(root).as_posix()
        if any(fnmatch.fnmatch(rel, pattern) for pattern in SKIP + ignore):
            continue
        folder = thumbs_folder(path, root)
        if folder:  # named by content (see Normaliser)
            rel = f"{folder}/thumb-{hashlib.sha256(path.read_bytes()).hexdigest()[:24]}.jpg"
            while rel in found:
                rel += "+"
        found[rel] = path
    return found


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("a", type=Path)
    parser.add_argument("b", type=Path)
    parser.add_argument("--show", type=int, default=12, help="diff lines shown per differing file (default 12)")
    parser.add_argument("--ignore", nargs="+", default=[], metavar="GLOB", help="more relative paths to leave out")
    args = parser.parse_args(argv)
    na, nb = Normaliser(args.a), Normaliser(args.b)
    fa, fb = files(args.a, args.ignore), files(args.b, args.ignore)
    only_a, only_b = sorted(set(fa) - set(fb)), sorted(set(fb) - set(fa))
    differ = []
    for rel in sorted(set(fa) & set(fb)):
        ca, cb = normalised(fa[rel], rel, na), normalised(fb[rel], rel, nb)
        if ca == cb:
            continue
        differ.append(rel)
        if isinstance(ca, bytes) or isinstance(cb, bytes):
            print(f"DIFFERS {rel} (binary: {len(ca)} vs {len(cb)} bytes)")
            continue
        print(f"DIFFERS {rel}")
        diff = list(difflib.unified_diff(ca, cb, "a", "b", n=0, lineterm=""))[2:]
        for line in diff[: args.show]:
            print("    " + (line if len(line) < 300 else line[:300] + " …"))
        if len(diff) > args.show:
            print(f"    … {len(diff) - args.show} more diff lines")
    for rel in only_a:
        print(f"ONLY IN A {rel}")
    for rel in only_b:
        print(f"ONLY IN B {rel}")
    total = len(set(fa) | set(fb))
    bad = len(differ) + len(only_a) + len(only_b)
    print(f"{total} files: {total - bad} identical after normalisation, {len(differ)} differ, "
          f"{len(only_a)} only in A, {len(only_b)} only in B")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
