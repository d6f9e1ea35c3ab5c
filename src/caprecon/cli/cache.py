"""`caprecon cache`: look after the content-addressed store.

    caprecon cache info                    what the cache holds, by kind and by model
    caprecon cache verify [--repair]       checksums, files missing from the index, index rows missing their file
    caprecon cache prune --older-than 30d | --model NAME | --max-size 10GB [--dry-run]

Each command is also a function of `caprecon.store.maintenance` (`caprecon.cache_info`,
`cache_verify`, `cache_prune`) returning the dict `--json` prints; this module parses and prints.
"""

from __future__ import annotations

import argparse
import json
import re

from caprecon.store.maintenance import MAX_AGE, MAX_SIZE, cache_info, cache_prune, cache_root, cache_verify

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
_SPANS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_size(text: str) -> int:
    match = re.fullmatch(r"\s*(\d+\.?\d*|\.\d+)\s*([a-zA-Z]*)\s*", text)
    if not match or match.group(2).lower() not in _UNITS:
        raise argparse.ArgumentTypeError(f"size {text!r}: use a number with B, KB, MB, GB, TB (or KiB, MiB, GiB, TiB)")
    size = float(match.group(1)) * _UNITS[match.group(2).lower()]
    if not size <= MAX_SIZE:
        raise argparse.ArgumentTypeError(f"size {text!r}: must be at most 1000 PB")
    return int(size)


def parse_age(text: str) -> float:
    match = re.fullmatch(r"\s*(\d+\.?\d*|\.\d+)\s*([smhdw])\s*", text)
    if not match:
        raise argparse.ArgumentTypeError(f"age {text!r}: use a number with s, m, h, d or w, e.g. 30d")
    age = float(match.group(1)) * _SPANS[match.group(2)]
    if not age <= MAX_AGE:
        raise argparse.ArgumentTypeError(f"age {text!r}: must be at most 1000 years")
    return age


def _human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1000:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


# -- the command ----------------------------------------------------------------------


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("cache", help="inspect, verify, repair and prune the cache")
    sub = p.add_subparsers(dest="cache_command", required=True)

    def common(q: argparse.ArgumentParser) -> None:
        q.add_argument("--cache-dir", help="the cache (default $CAPRECON_CACHE or ~/.cache/caprecon)")
        q.add_argument("--json", action="store_true", help="print the report as JSON")

    q = sub.add_parser("info", help="entries and sizes by kind and by model (with fingerprints for prune --model)")
    common(q)
    q.set_defaults(func=_cmd_info)

    q = sub.add_parser("verify", help="check checksums, files without index rows and index rows without files")
    common(q)
    q.add_argument("--repair", action="store_true",
                   help="delete bad entries and orphan files (recomputed when next needed); rebuild a damaged index")
    q.set_defaults(func=_cmd_verify)

    q = sub.add_parser("prune", help="delete entries by age, by model, or down to a size")
    common(q)
    q.add_argument("--older-than", type=parse_age, metavar="AGE", help="entries created longer ago, e.g. 30d, 12h")
    q.add_argument("--model", help="entries of one model: fingerprint (or prefix), its name as `cache info` shows it, "
                                  "or its registry name (see `caprecon models`)")
    q.add_argument("--max-size", type=parse_size, metavar="SIZE",
                   help="delete the oldest entries until the cache fits, e.g. 10GB")
    q.add_argument("--dry-run", action="store_true", help="say what would be deleted, delete nothing")
    q.set_defaults(func=_cmd_prune)


def _cmd_info(args: argparse.Namespace) -> int:
    info = cache_info(args.cache_dir)
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    print(f"cache: {info['root']}")
    for row in info["kinds"]:
        print(f"  {row['kind']:20s} {row['entries']:8d} entries  {_human(row['bytes'])}")
    print("by model:")
    for row in info["models"]:
        print(f"  {row['fingerprint'] or '(unrecorded)':26s} {row['model'] or '':40s} {row['entries']:8d} entries  "
              f"{_human(row['bytes'])}")
    thumbs = info["thumbnails"]
    print(f"report thumbnails: {thumbs['files']} files  {_human(thumbs['bytes'])}  (made again when missing)")
    return 0


def _cmd_verify(args: argparse.Namespace) -> int:
    import sys

    root = cache_root(args.cache_dir)
    report = cache_verify(root, repair=args.repair)
    repair = f"`caprecon cache verify --repair --cache-dir {root}`"
    damaged = report["index"] != "ok" and not args.repair
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(f"cache: {root}")
        print(f"index: {report['index']}" if report["index"] == "ok" else
              f"index: {report['index_file']}: {report['index']}")
        if "salvaged" in report:
            print(f"  moved aside to {report['moved_aside']}; {report['salvaged']} readable rows kept")
    if damaged:  # nothing else could be checked: the one line says what is wrong and what to do
        print(f"caprecon: error: the cache index {report['index_file']} is {report['index']}; nothing in the cache "
              f"could be checked: run {repair} to move it aside and rebuild it from the rows still readable "
              "(the rest is recomputed when next needed)", file=sys.stderr)
        return 1
    labels = {"bad_values": "values failing their checksum", "unsafe_keys": "index rows whose key cannot name a file",
              "missing_files": "index rows whose file is missing", "damaged_files": "files failing their checksum",
              "orphans": "files no index row names"}
    if not args.json:
        print(f"entries checked: {report['entries']}")
        for key, label in labels.items():
            if key in report:
                print(f"{label}: {len(report[key])}")
        print(f"lapsed claims: {report['expired_claims']}")
        if args.repair:
            print(f"repaired: bad entries and orphans deleted (recomputed when next needed); "
                  f"{report['checksums_added']} older entries given checksums")
    if not report["ok"]:
        found = ", ".join(f"{len(report[key])} {label}" for key, label in labels.items() if report.get(key))
        print(f"caprecon: error: the cache {root} has {found}: run {repair} to delete them (recomputed when "
              "next needed)", file=sys.stderr)
        return 1
    return 0


def _cmd_prune(args: argparse.Namespace) -> int:
    from caprecon.models.registry import registered_as

    report = cache_prune(args.cache_dir, older_than=args.older_than, model=args.model,
                         aliases=registered_as(args.model) if args.model else (), max_size=args.max_size,
                         dry_run=args.dry_run)
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    verb = "would remove" if report["dry_run"] else "removed"
    print(f"{verb} {report['removed']} of {report['entries']} entries: "
          f"{_human(report['bytes_before'])} -> {_human(report['bytes_after'])}")
    if report["thumbnails_removed"]:
        print(f"{verb} {report['thumbnails_removed']} cached report thumbnails (made again when a report needs them)")
    if report.get("note"):
        print(report["note"])
    return 0
