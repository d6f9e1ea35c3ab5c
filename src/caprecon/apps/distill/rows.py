"""The training data of `caprecon distill`: the rows earlier runs scored (`scores.jsonl`), where each
run came from (its manifest), and the reconstructions a row names, found in its run's store by key."""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path, PurePath
from typing import Any, Sequence

from caprecon.core.errors import ConfigError
from caprecon.core.records import is_number, read_jsonl
from caprecon.store.index import INDEX, Store


@dataclass(frozen=True)
class Stored:
    """A reconstruction a row names, found in its run's store by key: the row's path gives the key
    (the file's name) and nothing else, so a row naming any other file reads nothing."""

    named: str  # as the row names it
    path: Path | None = None  # the store's own file for the key; None: no store of the run holds it
    checksum: str | None = None


@dataclass
class Row:
    image: str
    caption: str
    value: float
    #: the reconstructions the metric compared the image with (one per seed or generator), if the run wrote them
    reconstructions: tuple[Stored, ...] = ()
    #: where the row was read (`scores.jsonl:LINE`), for messages
    where: str = ""


def read_rows(runs: Sequence[str | Path], metric: str, store: Store | None = None
              ) -> tuple[list[Row], list[dict[str, Any]]]:
    """The rows of `runs` (run folders) that scored `metric` without error, and where each run came from.
    A value that is not finite (NaN, infinity) is refused, naming its rows. The reconstructions a row
    names are looked up by key in the store its run's manifest names (then in `store`)."""
    rows: list[Row] = []
    sources = []
    for run in runs:
        run = Path(run)
        scores = run / "scores.jsonl"
        if not scores.is_file():
            raise ConfigError(f"{run}: no scores.jsonl here; give run folders that `caprecon score` wrote")
        manifest = read_manifest(run)
        stores = [*run_stores(manifest), *([store] if store is not None else [])]
        found, not_finite = 0, []
        for where, record in read_jsonl(scores, ConfigError, keep_surrogates=True):
            value = record.get(metric)
            if isinstance(value, float) and not math.isfinite(value):
                not_finite.append(where)
                continue
            if is_number(value) and record.get("image") and isinstance(
                    record.get("caption"), str) and record["caption"].strip():
                rows.append(Row(str(record["image"]), record["caption"], float(value),
                                stored_reconstructions(record, stores), where))
                found += 1
        if not_finite:
            shown = ", ".join(not_finite[:5]) + (f" and {len(not_finite) - 5} more" if len(not_finite) > 5 else "")
            raise ConfigError(f"{metric} is not a finite number (NaN or infinity) in {len(not_finite)} row(s): "
                              f"{shown}; score them again or leave them out")
        cache = manifest.get("cache") or {}
        config = manifest.get("config") or {}
        described = [m for m in manifest.get("metrics") or [] if isinstance(m, dict)
                     and m.get("column", m.get("metric")) == metric]
        sources.append({"run": str(run), "rows": found, "store": (manifest.get("store") or {}).get("root"),
                        "samples": manifest.get("samples"), "model_seconds": cache.get("model_seconds"),
                        "embedder": config.get("embedder"), "embedder_options": config.get("embedder_options") or {},
                        # the run's metric compares the image with its reconstruction in an embedder's space
                        "compares_embeddings": bool(described) and all("embedder" in m for m in described),
                        "chose_by": choosing_fingerprints(manifest.get("models"))})
    if not rows:
        names = ", ".join(str(r) for r in runs)
        raise ConfigError(f"no row of {names} has a number for metric {metric!r} and an image path; "
                          f"score them with -m {metric} first")
    return rows, sources


def read_manifest(run: Path) -> dict[str, Any]:
    """A run's manifest.json as a dict ({} when there is none); one that is not JSON is refused."""
    path = run / "manifest.json"
    if not path.is_file():
        return {}
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: not valid JSON ({exc}); give run folders that `caprecon score` wrote") from None
    return manifest if isinstance(manifest, dict) else {}


def run_stores(manifest: dict[str, Any]) -> list[Store]:
    """The stores a run's manifest names (its store, and the one below an overlay), opened read-only;
    those that are gone are left out."""
    stores, described = [], manifest.get("store")
    while isinstance(described, dict):
        root = described.get("root")
        if isinstance(root, str) and (Path(root) / INDEX).is_file():
            stores.append(Store(root, read_only=True))  # quietly: Store.open would warn it is read-only
        described = described.get("below")
    return stores


#: a store key: the sha256 of what determines the result (`content_key`)
_KEY = re.compile(r"[0-9a-f]{64}")


def stored_reconstructions(record: dict[str, Any], stores: Sequence[Store]) -> tuple[Stored, ...]:
    """The reconstructions a row names (`reconstructions` of a row scored from several seeds or
    generators, else `reconstruction`), each looked up by its key (the file's name) in `stores`."""
    named = record.get("reconstructions")
    if not isinstance(named, list):
        named = [record.get("reconstruction")]
    out = []
    for name in named:
        if not isinstance(name, str) or not name:
            continue
        key = PurePath(name).stem
        found = None
        if _KEY.fullmatch(key):
            found = next((hit[key] for st in stores if key in (hit := st.get_images([key]))), None)
        out.append(Stored(name, found[1], found[2]) if found else Stored(name))
    return tuple(out)


def choosing_fingerprints(models: Any) -> list[str]:
    """The fingerprints of the text encoders a run's generators chose their pictures with (a
    retrieval generator's `matcher`), from its manifest's `models`."""
    found: list[str] = []

    def visit(node: Any) -> None:
        if isinstance(node, dict):
            matcher = node.get("matcher")
            if isinstance(matcher, dict) and isinstance(matcher.get("fingerprint"), str):
                found.append(matcher["fingerprint"])
            for value in node.values():
                visit(value)
        elif isinstance(node, list):
            for value in node:
                visit(value)

    visit(models)
    return sorted(set(found))
