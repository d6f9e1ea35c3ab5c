"""Sampling captions of images, cached by content: the captioner calls of best-of-N selection
and of the task suites' captioning phase; and what decides between captions of one image
(the selection score, `Selection`) and exports the chosen ones (`export_parquet`), shared by
best-of-N selection and refinement.

An image's candidates are keyed by the captioner's fingerprint, the prompt, the image's
bytes, the sampling seed, n and the sampling settings, so a re-run (or another command
asking for the same captions) captions nothing twice.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from tqdm.auto import tqdm

from caprecon.core.checks import number_problem
from caprecon.core.errors import ConfigError
from caprecon.core.records import is_number
from caprecon.data.images import decode_bytes, image_file_key, read_image_file
from caprecon.data.samples import SampleError
from caprecon.models.captioner import CaptionRequest, Sampling
from caprecon.models.common import derive_seed
from caprecon.run.failures import FATAL, RunError, explain_failure
from caprecon.store.index import Store, content_key

log = logging.getLogger(__name__)


@dataclass
class Pool:
    """One image and its candidate captions."""

    image_id: str
    image: Path
    seed: int  # the sampling seed of this image's candidates
    captions: list[str] = field(default_factory=list)
    error: str | None = None


def image_ids(paths: Sequence[Path]) -> list[str]:
    ids = [p.stem for p in paths]
    if len(set(ids)) == len(ids):
        return ids
    return [p.name for p in paths]  # photo.jpg and photo.png side by side


def generate_candidates(captioner, paths: Sequence[Path], *, prompt: str, n: int, sampling: Sampling, seed: int,
                        store: Store, images_per_call: int = 16, progress: bool = False,
                        image_root: Path | None = None) -> tuple[list[Pool], dict]:
    """Every image's `n` candidates, from the store where known. Images are decoded only
    when they must be captioned, `images_per_call` at a time, and each call's results are
    stored as soon as it returns, so a killed run loses at most the call in flight.

    The captioner sees each picture as scoring does (upright by its EXIF orientation,
    transparency over white). With `image_root` (the `--images` folder, as errors name it), every
    image must lie inside it: one that escapes it (a symbolic link out of the folder) is that
    image's error, and is never read."""
    pools, keys = [], []
    for image_id, path in zip(image_ids(paths), paths):
        pool = Pool(image_id, path, derive_seed("caption", seed, image_id))
        try:
            # a file hashed before (same size and mtime) is not read again
            digest, _ = image_file_key(path, image_root, root_option="--images")
        except SampleError as exc:  # a missing, unreadable or oversized file is this image's error, not the run's
            pool.error = str(exc)  # it names the file
            digest = None
        keys.append(content_key("caption-candidates", captioner=captioner.fingerprint, prompt=prompt, image=digest,
                                seed=pool.seed, n=n, sampling=sampling.to_dict()) if digest else None)
        pools.append(pool)
    known = store.get_json([k for k in keys if k])
    missing = [i for i, k in enumerate(keys) if k and k not in known]
    bar = tqdm(total=len(missing), desc="captioning", unit="image", disable=not progress or not missing,
               dynamic_ncols=True)
    try:
        for lo in range(0, len(missing), max(1, images_per_call)):
            requests, chunk = [], []
            for i in missing[lo : lo + images_per_call]:
                try:
                    data = read_image_file(pools[i].image, image_root, root_option="--images")
                    image = decode_bytes(data, f"image {pools[i].image}")
                except SampleError as exc:  # it names the file
                    pools[i].error = str(exc)
                    continue
                requests.append(CaptionRequest(image, prompt, n, pools[i].seed, keys[i]))
                chunk.append(i)
            if requests:
                try:
                    captions = captioner.caption(requests, sampling)
                except FATAL:
                    raise
                except Exception as exc:  # one call serves several images: its failure is the run's, not theirs
                    raise RunError(f"captioner: {explain_failure(exc)}; the captions of earlier calls are "
                                   "stored, so the same command resumes after them") from exc
                new = {keys[i]: {"captions": c} for i, c in zip(chunk, captions)}
                store.put_json("caption-candidates", new)
                known.update(new)
            bar.update(len(missing[lo : lo + images_per_call]))
    finally:
        bar.close()
    for pool, key in zip(pools, keys):
        if not pool.error:
            pool.captions = list(known[key]["captions"])
    generated = sum(1 for i in missing if not pools[i].error)
    return pools, {"generated": generated, "reused": sum(1 for k in keys if k) - len(missing)}


@dataclass(frozen=True)
class Selection:
    """The selection score: a weighted sum of metrics' headline values (one metric: weight 1).

    Metrics are summed on their own scales (ReconScore lies in [0, 1], CLIPScore in
    [0, 2.5]); choose the weights with that in mind.
    """

    weights: dict[str, float]

    @classmethod
    def parse(cls, spec: str | Mapping[str, float] | Sequence[str]) -> "Selection":
        """"recon", "recon=0.7,clipscore=0.3", {"recon": 0.7, ...} or ["recon", "clipscore"]."""
        from caprecon.metrics import METRICS

        if isinstance(spec, str):
            spec = [part for part in spec.split(",") if part.strip()]
        if not isinstance(spec, Mapping):
            weights: dict[str, float] = {}
            for part in spec:
                name, sep, value = str(part).partition("=")
                if name.strip() in weights:  # recon=0.7,recon=0.3: which weight was meant?
                    raise ConfigError(f"selection {part!r}: {name.strip()} is named twice; give each metric once")
                try:
                    weights[name.strip()] = float(value) if sep else 1.0
                except ValueError:
                    raise ConfigError(f"selection {part!r}: the weight after '=' must be a number") from None
            spec = weights
        for name, weight in spec.items():  # a mapping from Python or a config file: numbers only
            if isinstance(weight, bool) or not isinstance(weight, (int, float)):
                raise ConfigError(f"selection weight of {name}: must be a number, not {weight!r}")
        weights = {str(k): float(v) for k, v in spec.items()}
        if not weights:
            raise ConfigError("name at least one metric to select by, e.g. --select recon")
        unknown = [name for name in weights if name not in METRICS]
        if unknown:
            raise ConfigError(f"cannot select by {', '.join(map(repr, unknown))}: not a metric; "
                              f"metrics: {', '.join(sorted(METRICS))}")
        for name, weight in weights.items():  # NaN would make every score NaN; a negative one reverses the guard
            problem = number_problem(weight, 0, low_open=True)
            if problem:
                raise ConfigError(f"selection weight of {name}: {problem}")
        return cls(weights)

    @property
    def metrics(self) -> list[str]:
        return list(self.weights)

    @property
    def is_single(self) -> bool:
        return len(self.weights) == 1 and next(iter(self.weights.values())) == 1.0

    def value(self, record: Mapping[str, Any], headlines: Mapping[str, str]) -> float | None:
        """The selection score of a scored candidate; None when it has an error or lacks a value."""
        if record.get("error"):
            return None
        total = 0.0
        for name, weight in self.weights.items():
            value = record.get(headlines[name])
            if not is_number(value):
                return None
            total += weight * value
        return total

    def describe(self) -> str:
        return ",".join(f"{k}={v:g}" for k, v in self.weights.items())


def select_best(scores: Sequence[float | None]) -> int | None:
    """Index of the highest score (the first of ties); None when no candidate has one."""
    best = None
    for i, s in enumerate(scores):
        if s is not None and (best is None or s > scores[best]):
            best = i
    return best


def export_parquet(rows: Sequence[Mapping[str, Any]], path: str | Path) -> Path | None:
    """The chosen captions as parquet (best-of-N's selected.parquet, refinement's
    refined.parquet); None without pyarrow (the `data` extra), which the JSONL of the same
    name beside it does not need."""
    path = Path(path)
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        log.warning("pyarrow is not installed: %s not written (pip install 'caprecon[data]'); %s holds the same rows",
                    path.name, path.with_suffix(".jsonl").name)
        return None
    pq.write_table(pa.Table.from_pylist([_utf8(row) for row in rows]), path)
    return path


def _utf8(value: Any) -> Any:
    """`value` with every string one parquet can hold (UTF-8): a lone surrogate (a caption's broken
    JSON escape) is written as its escape, `\\ud800`, as the report shows it."""
    if isinstance(value, str):
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, Mapping):
        return {key: _utf8(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_utf8(item) for item in value]
    return value


def one_noise_per_image(cfg, settings: Mapping[str, Any], what: str) -> None:
    """Make every caption of an image rebuilt from the same noise, so their scores differ by the caption alone.

    Best-of-N and refinement compare captions of one image; per-sample seeds would add the noise's
    difference to the caption's. An explicit per-sample request is refused, the preset's is replaced.
    """
    if cfg.seed_policy != "per-sample":
        return
    if settings.get("seed_policy") == "per-sample":
        raise ConfigError(f"{what} reconstructs every caption of an image from the same noise: use "
                          "--seed-policy per-image (the default here) or fixed, not per-sample")
    cfg.seed_policy = "per-image"
