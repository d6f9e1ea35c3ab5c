"""Sharding for job arrays without Ray: `--shard i/n`, and `caprecon merge` of the shards.

A shard is a deterministic slice of the input that keeps every image whole: all captions of
one image (its best-of-N candidates, its references) land in the same shard, so per-image
work (the source's embedding, its reconstructions at a per-image seed) is never done twice.
Images are dealt largest group first, each to the shard holding the fewest rows so far (ties
to the lowest shard), which is deterministic and balances rows to within one image's group.

Each shard's run folder records in its manifest which shard it is and the input positions of
its rows; `merge` (`caprecon merge`) checks that exactly shards 0..n-1 of one run are present,
each once, and writes the folder the unsharded run would have written.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from caprecon.core.errors import ConfigError
from caprecon.data.samples import Sample
from caprecon.core.records import write_jsonl_atomically
from caprecon.metrics.base import CORPUS
from caprecon.core.records import is_number
from caprecon.run.folder import (CORPUS_STATISTICS_FILE, LOCK_FILE, corpus_values, holds_run_folder,
                                 read_corpus_statistics, summarise, write_corpus_statistics, write_reports, write_run)
from caprecon.run.records import read_scores


def parse_shard(text: str | tuple[int, int]) -> tuple[int, int]:
    """`"i/n"` (0 <= i < n) as (i, n)."""
    if isinstance(text, tuple):
        index, count = text
    else:
        match = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", str(text))
        if not match:
            raise ConfigError(f"--shard must look like I/N, e.g. 0/4 (the first of four shards), not {text!r}")
        index, count = int(match[1]), int(match[2])
    if count < 1 or not 0 <= index < count:
        raise ConfigError(f"--shard {index}/{count}: need 0 <= I < N (shards are numbered from 0)")
    return index, count


def shard_positions(samples: Sequence[Sample], count: int) -> list[list[int]]:
    """The input positions of each of `count` shards, each list in input order."""
    groups: dict[str, list[int]] = {}
    for position, sample in enumerate(samples):
        groups.setdefault(sample.image_id, []).append(position)
    loads = [0] * count
    shards: list[list[int]] = [[] for _ in range(count)]
    for image_id in sorted(groups, key=lambda k: (-len(groups[k]), k)):
        lightest = min(range(count), key=lambda s: (loads[s], s))
        shards[lightest].extend(groups[image_id])
        loads[lightest] += len(groups[image_id])
    return [sorted(positions) for positions in shards]


def select_shard(samples: Sequence[Sample], shard: tuple[int, int]) -> tuple[list[Sample], dict[str, Any]]:
    """The shard's samples and what its manifest records about it."""
    index, count = shard
    positions = shard_positions(samples, count)[index]
    return [samples[p] for p in positions], {"index": index, "count": count, "input_rows": len(samples),
                                             "input": input_fingerprint(samples), "positions": positions}


def input_fingerprint(samples: Sequence[Sample]) -> str:
    """What the whole input's rows say (id, image, caption, references), hashed: shards of one
    input agree on it, and shards of two inputs of the same length do not."""
    digest = hashlib.sha256()
    for sample in samples:
        image = sample.image
        if isinstance(image, bytes):
            image = hashlib.sha256(image).hexdigest()
        elif not isinstance(image, (str, Path, dict, type(None))):  # a decoded picture: its repr is an address
            image = None
        digest.update(json.dumps([sample.id, sample.image_id, image, sample.caption, list(sample.refs or [])],
                                 default=repr).encode("utf-8"))
    return digest.hexdigest()[:24]


@dataclass
class Merged:
    """What `merge` returns: the merged run folder, its rows (scores.jsonl, in input order), its
    summary (summary.json: the figures over all rows) and the shard folders it was made from, in
    shard order."""

    out: Path
    records: list[dict[str, Any]]
    summary: dict[str, Any]
    shards: list[Path]


@holds_run_folder("out", inputs=("shards", "samples"))
def merge(shards: Sequence[str | Path], out: str | Path, samples: Any = None) -> Merged:
    """`caprecon merge`: combine the run folders of `score --shard I/N` into `out`: scores.jsonl in
    input order, summaries recomputed over all rows, a manifest naming the shards, and the reports
    `score` writes (report.html; the per-category table of turing or halluc). Refuses a missing,
    doubled, unfinished or foreign shard, a row id that two rows carry, and a `samples` that is not
    the shards' input, before writing anything.

    A corpus-level metric's value (BLEU's, METEOR's, CIDEr's) pools statistics of every row, and
    no mean of the shards' values is the whole's: each shard keeps its rows' statistics in
    `corpus-statistics.json`, and the merge computes the value over all rows from them (METEOR's
    by its jar, so with Java), without the input. Shards scored before caprecon kept statistics
    need `samples`, the input they were scored from (a path or rows, checked against the shards'
    fingerprint; `--input`), to compute it; without either, the merged summary holds `corpus: null`
    for it.

        merged = caprecon.merge([f"runs/a-{i}" for i in range(8)], "runs/a", samples="captions.jsonl")
        print(merged.summary["samples"], merged.summary["metrics"]["recon"]["mean"])
    """
    folders = [shards] if isinstance(shards, (str, Path)) else list(shards)
    if not folders:
        raise ConfigError("caprecon merge needs the shard run folders to combine")
    manifests = [_manifest(Path(f)) for f in folders]
    first = manifests[0]
    count = first["shard"]["count"]
    seen: dict[int, Path] = {}
    for folder, manifest in zip(map(Path, folders), manifests):
        shard = manifest["shard"]
        if shard["count"] != count or shard["input_rows"] != first["shard"]["input_rows"]:
            raise ConfigError(f"{folder} is shard {shard['index']}/{shard['count']} of {shard['input_rows']} rows, "
                              f"but {folders[0]} is of {count} shards of {first['shard']['input_rows']} rows: "
                              "not the same sharded run")
        if shard.get("input") != first["shard"].get("input"):
            raise ConfigError(f"{folder} and {folders[0]} are shards of different inputs (the rows' ids, images or "
                              "captions differ); only shards of one input can be merged")
        if _comparable(manifest) != _comparable(first):
            raise ConfigError(f"{folder} was scored with other settings or metrics than {folders[0]}; "
                              "only shards of one run can be merged")
        if shard["index"] in seen:
            raise ConfigError(f"shard {shard['index']}/{count} is given twice ({seen[shard['index']]} and {folder})")
        seen[shard["index"]] = folder
    missing = sorted(set(range(count)) - set(seen))
    if missing:
        raise ConfigError(f"shard(s) {', '.join(f'{i}/{count}' for i in missing)} missing: merge needs all {count}")
    _check_merge_target(Path(out), [seen[i] for i in range(count)])
    summaries = _summaries(seen[0])
    summarised = list(summaries)
    pooled = [name for name, entry in summaries.items() if isinstance(entry, dict) and entry.get("aggregate") == CORPUS]
    kept = _kept_statistics([seen[i] for i in range(count)]) if pooled else None
    # the input, when given, is checked whatever it is for: a wrong file is refused, not ignored
    given = _input_rows(samples, first["shard"], first.get("image_root")) if samples is not None else None
    inputs = given if pooled and kept is None else None
    pooling = [_pooling_metric(name) for name in pooled] if inputs is not None else []
    for metric in pooling:
        metric.prepare(inputs)  # CIDEr's document frequencies from the whole input, as each shard's were

    by_position: dict[int, dict[str, Any]] = {}
    holders: dict[Any, list[Path]] = {}  # each row id with the shard folders holding it
    for folder, manifest in zip(map(Path, folders), manifests):
        rows = read_scores(folder / "scores.jsonl")
        positions = manifest["shard"]["positions"]
        if len(rows) != len(positions):
            raise ConfigError(f"{folder / 'scores.jsonl'} holds {len(rows)} rows, its manifest says "
                              f"{len(positions)}; score that shard again")
        for position, row in zip(positions, rows):
            if position in by_position:
                raise ConfigError(f"input row {position} is in two shards ({folder}); the shards come from "
                                  "different inputs")
            by_position[position] = row
            holders.setdefault(row.get("id"), []).append(folder)
    _refuse_repeated_ids(holders)
    total = first["shard"]["input_rows"]
    if sorted(by_position) != list(range(total)):
        raise ConfigError(f"the shards cover {len(by_position)} of the input's {total} rows; they come from "
                          "different inputs")
    records = [by_position[p] for p in range(total)]
    out_dir = Path(out)
    summary = summarise(records, summarised)
    for name in pooled:
        if name in summary["metrics"] and summary["metrics"][name]["n"]:
            summary["metrics"][name].update({"aggregate": CORPUS, "corpus": None})
    statistics: dict[str, Any] = {}
    if kept is not None:
        statistics = _corpus_from_statistics(summary, kept, records)
    elif inputs is not None:
        statistics = corpus_values(summary, pooling, records, inputs)
    write_jsonl_atomically(out_dir / "scores.jsonl", records)
    write_corpus_statistics(out_dir, statistics)
    manifest = {key: value for key, value in first.items() if key not in ("shard", "cache", "seconds", "started")}
    manifest.update({"samples": total, "merged_from": [str(seen[i]) for i in range(count)],
                     "cache": _summed([m.get("cache") or {} for m in manifests]),
                     "seconds": round(sum(m.get("seconds") or 0 for m in manifests), 3)})
    write_run(out_dir, summary, manifest)
    write_reports(out_dir, records, summary, manifest.get("metric_names") or summarised)  # as `score` ends
    return Merged(out=out_dir, records=records, summary=summary, shards=[Path(seen[i]) for i in range(count)])


def _kept_statistics(folders: list[Path]) -> dict[str, list[tuple[Path, Any]]] | None:
    """Each column's corpus statistics, with the file of each shard that holds them, in shard order
    (a shard none of whose rows has a value in a column keeps none for it); None when no shard keeps
    any (scored before caprecon kept them), refused when only some do."""
    kept = [(folder / CORPUS_STATISTICS_FILE, read_corpus_statistics(folder)) for folder in folders]
    lacking = [str(path) for path, parts in kept if parts is None]
    if len(lacking) == len(kept):
        return None
    if lacking:
        raise ConfigError(f"{', '.join(lacking)} missing, while the other shards keep their corpus statistics: "
                          "score that shard again (or give --input, the file the shards scored)")
    columns: dict[str, list[tuple[Path, Any]]] = {}
    for path, parts in kept:
        for name, part in parts.items():
            columns.setdefault(name, []).append((path, part))
    return columns


def _corpus_from_statistics(summary: dict[str, Any], kept: dict[str, list[tuple[Path, Any]]],
                            records: list[dict[str, Any]]) -> dict[str, Any]:
    """Each corpus column's value over the merged rows from the shards' statistics merged, as the
    unsharded run computes it over those rows, in input order; returns the merged statistics."""
    from caprecon.metrics.reference import ReferenceMetricError, ReferenceMetrics
    from caprecon.metrics.reference_statistics import CorpusStatisticsError, corpus_value, merge_parts, ordered_rows

    merged = {}
    for name, held in kept.items():
        entry = summary["metrics"].get(name)
        if not entry or not entry["n"]:
            continue
        order = [r["id"] for r in records if is_number(r.get(name))]
        try:
            part = merge_parts([p for _, p in held], names=[str(path) for path, _ in held])
            part.rows = list(zip(order, ordered_rows(part, order)))  # in input order, as the unsharded run's
            if name == "meteor":  # the jar computes METEOR's from its statistics lines
                with ReferenceMetrics(["meteor"]) as metric:
                    entry["corpus"] = metric.corpus_from_statistics(part, order)
            else:
                entry["corpus"] = corpus_value(part, order)
        except ReferenceMetricError as exc:
            raise ConfigError(f"{name}: its corpus value comes from the shards' statistics through pycocoevalcap's "
                              f"METEOR jar, which cannot run here: {exc}") from None
        except CorpusStatisticsError as exc:
            raise ConfigError(f"{name}: {exc}. A shard's statistics must match its scores.jsonl and the other "
                              "shards' (one caprecon and pycocoevalcap, one input): score that shard again") from None
        merged[name] = part
    return merged


def _refuse_repeated_ids(holders: dict[Any, list[Path]]) -> None:
    """A row id is one row of the merged run: an id that two rows carry (in two shards, or twice in
    one) would make the merged scores.jsonl hold it twice, and every reader keyed by id keep one."""
    repeated = {row_id: folders for row_id, folders in holders.items() if len(folders) > 1}
    if not repeated:
        return
    shown = "; ".join(f"{row_id!r} in {', '.join(map(str, folders))}" for row_id, folders in list(repeated.items())[:5])
    more = f" and {len(repeated) - 5} more" if len(repeated) > 5 else ""
    raise ConfigError(f"{len(repeated)} row id(s) appear more than once across the shards ({shown}{more}); each id "
                      "must be one row: score the shards again from one input with unique ids")


def _check_merge_target(out: Path, shards: list[Path]) -> None:
    """`out` is new, empty (but for its lock), or this same merge done before: never another run (its
    scores replaced, its report left). That it is no shard and no file the prologue checked."""
    if not any(p.name != LOCK_FILE for p in out.iterdir()):
        return
    try:
        earlier = json.loads((out / "manifest.json").read_text(encoding="utf-8")).get("merged_from")
    except (OSError, ValueError, AttributeError):
        earlier = None
    if earlier is None or sorted(Path(p).resolve() for p in earlier) != sorted(s.resolve() for s in shards):
        raise ConfigError(f"--out {out} already holds something other than a merge of these shards; merge into a "
                          "new or empty folder")


def _manifest(folder: Path) -> dict[str, Any]:
    path = folder / "manifest.json"
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{folder}: no manifest.json; is it a run folder?") from None
    except ValueError as exc:
        raise ConfigError(f"{path} is not valid JSON ({exc})") from None
    if not isinstance(manifest, dict):
        raise ConfigError(f"{path} holds {type(manifest).__name__}, not a run's manifest (a JSON object)")
    if "shard" not in manifest:
        raise ConfigError(f"{folder} is not a shard: it was scored without --shard")
    problem = _shard_problem(manifest["shard"])
    if problem:  # edited by hand or written by something else: read as it is, it would pass for another shard
        raise ConfigError(f"{path}: its shard record {problem}; score that shard again")
    if manifest.get("status") != "complete":
        raise ConfigError(f"{folder} (shard {manifest['shard']['index']}/{manifest['shard']['count']}) is "
                          f"{manifest.get('status')}, not complete; run its command again to finish it")
    return manifest


def _shard_problem(shard: Any) -> str | None:
    """What is wrong with a manifest's `shard` record (as `select_shard` writes it), or None."""
    if not isinstance(shard, dict):
        return f"is {type(shard).__name__}, not an object"
    for key in ("index", "count", "input_rows"):
        if isinstance(shard.get(key), bool) or not isinstance(shard.get(key), int) or shard[key] < 0:
            return f"needs {key}, a whole number, not {shard.get(key)!r}"
    if not shard["index"] < shard["count"]:
        return f"says shard {shard['index']} of {shard['count']}"
    positions = shard.get("positions")
    if not isinstance(positions, list) or not all(isinstance(p, int) and not isinstance(p, bool)
                                                  and 0 <= p < shard["input_rows"] for p in positions):
        return f"needs positions, a list of input rows (0 to {shard['input_rows'] - 1})"
    return None


def _input_rows(samples: Any, shard: dict[str, Any], image_root: Any) -> list[Sample]:
    """The input the shards were scored from, refused unless it is the one their fingerprint names."""
    from caprecon.data.loaders import load_samples

    rows = load_samples(samples, images_root=image_root)
    if input_fingerprint(rows) != shard.get("input"):
        where = f" {samples}" if isinstance(samples, (str, Path)) else ""
        raise ConfigError(f"--input{where} is not the input the shards were scored from (its rows' ids, images, "
                          "captions or references differ); give that file, or leave --input out (it only adds "
                          "the corpus values of BLEU, METEOR and CIDEr to shards that keep no corpus statistics)")
    return rows


def _pooling_metric(name: str) -> Any:
    """The metric that computes a corpus column's value: the reference metrics are the ones that pool."""
    from caprecon.metrics.reference import ReferenceMetric, reference_metric_name

    if reference_metric_name(name) is None:
        raise ConfigError(f"{name}: a corpus-level column that merge cannot recompute (only the reference metrics "
                          "BLEU, METEOR, CIDEr); merge without --input keeps its rows and leaves its corpus value out")
    return ReferenceMetric(name)


def _summaries(folder: Path) -> dict[str, Any]:
    """Each field a shard's summary holds (the headlines and what metrics report beside them:
    halluc's coverage, F and rate; the same in every shard of one run) with its entry, which says
    whether the field pools over the corpus."""
    path = folder / "summary.json"
    try:
        metrics = json.loads(path.read_text(encoding="utf-8"))["metrics"]
        return metrics if isinstance(metrics, dict) else dict.fromkeys(metrics)
    except FileNotFoundError:
        raise ConfigError(f"{folder}: no summary.json; run its command again to finish it") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"{path} is not a run summary ({exc}); run that shard's command again") from None


def _comparable(manifest: dict[str, Any]) -> tuple:
    config = {k: v for k, v in (manifest.get("config") or {}).items() if k not in ("batch_size", "cache_dir")}
    return json.dumps(config, sort_keys=True, default=str), manifest.get("metric_names")


def _summed(stats: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for one in stats:
        for key, value in one.items():
            if isinstance(value, (int, float)):
                out[key] = round(out.get(key, 0) + value, 4)
    return out
