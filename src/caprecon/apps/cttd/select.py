"""Stage 1: which images get questions.

In order, an image is dropped when it cannot be decoded, when its shorter side is under
`min_side` pixels, when it is near-uniform (grey-level standard deviation under
`uniform_std`, on a 0-255 scale, of a 64x64 thumbnail), and when its embedding's cosine
with an earlier kept image exceeds `duplicate_cos` (file order decides which copy
stays). The rest pass the density filter of the Caption Turing Test paper (Eq. 6): a
Gaussian mixture fitted to the embeddings, keeping images whose log-density lies between
its `density_band` quantiles — neither the crowded centre (many near-alike images) nor the
sparse outskirts (outliers).
"""

from __future__ import annotations

import hashlib
import io
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image
from tqdm.auto import tqdm

from caprecon.data.images import read_image_file
from caprecon.data.samples import IMAGE_SUFFIXES, SampleError
from caprecon.apps.cttd.stage import Job, entry_image, write_jsonl

FOLDER = "01-select"
OUTPUT = "images.jsonl"
CHUNK = 32  # images embedded per cached call: what an interruption can lose


class ImageFolderError(ValueError):
    """The image folder cannot be used as it is."""


def list_images(folder: Path) -> list[dict[str, Any]]:
    """Image files under `folder` (recursively, in path order) with their id (the file stem,
    as `caprecon score` names images), source (first sub-folder, or the folder's name) and
    root (the folder, which a symbolic link must not lead out of)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ImageFolderError(f"image folder not found: {folder}")
    paths = sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)
    if not paths:
        raise ImageFolderError(f"{folder}: no images ({', '.join(sorted(IMAGE_SUFFIXES))})")
    seen: dict[str, Path] = {}
    out = []
    for p in paths:
        if p.stem in seen:
            raise ImageFolderError(f"two images share the id {p.stem!r}: {seen[p.stem]} and {p}; image ids are file "
                                   f"names without suffix, so rename one")
        seen[p.stem] = p
        rel = p.relative_to(folder)
        out.append({"image_id": p.stem, "path": str(p.resolve()),
                    "source": rel.parts[0] if len(rel.parts) > 1 else folder.resolve().name,
                    "root": str(folder.resolve())})
    return out


def density_filter(embeddings: np.ndarray, band: tuple[float, float], *, components: int = 8,
                   pca_dims: int | None = 64, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(log-density of each row under a Gaussian mixture fitted to all rows, keep mask).

    Rows are first projected on their top `pca_dims` principal components (at most n-1:
    a mixture in more dimensions than points is degenerate); the mixture has
    min(components, n // 10) diagonal-covariance components, at least one. Kept: log-density
    within the [low, high] quantiles of all log-densities.
    """
    try:
        from sklearn.decomposition import PCA
        from sklearn.mixture import GaussianMixture
    except ImportError:
        raise ImportError("the CTTD builder needs scikit-learn: pip install 'caprecon[cttd]'") from None

    low, high = band
    if not 0 <= low < high <= 1:
        raise ValueError(f"density band must be quantiles 0 <= low < high <= 1, got {band}")
    x = np.asarray(embeddings, dtype=np.float64)
    n = len(x)
    if n < 3:  # too few images to say what is dense
        return np.zeros(n), np.ones(n, dtype=bool)
    dims = min(pca_dims or x.shape[1], n - 1, x.shape[1])
    if dims < x.shape[1]:
        x = PCA(n_components=dims, random_state=seed).fit_transform(x)
    gmm = GaussianMixture(n_components=max(1, min(components, n // 10)), covariance_type="diag", random_state=seed,
                          reg_covar=1e-6)
    log_density = gmm.fit(x).score_samples(x)
    lo, hi = np.quantile(log_density, [low, high])
    return log_density, (log_density >= lo) & (log_density <= hi)


def _inspect(entry: dict[str, Any], min_side: int, uniform_std: float) -> tuple[str | None, str | None]:
    """(content key, reason to drop or None)."""
    try:
        data = read_image_file(entry["path"], entry.get("root"))
        with Image.open(io.BytesIO(data)) as im:
            im.load()
            entry["width"], entry["height"] = im.size
            thumb = im.convert("L").resize((64, 64), Image.BILINEAR)
    except SampleError as exc:  # outside the folder, not a regular file, too large
        return None, f"unreadable ({exc.reason})"
    except Exception as exc:  # PIL raises several types for corrupt files
        return None, f"unreadable ({type(exc).__name__})"
    key = hashlib.sha256(data).hexdigest()
    if min(entry["width"], entry["height"]) < min_side:
        return key, "too small"
    if float(np.asarray(thumb, dtype=np.float32).std()) < uniform_std:
        return key, "near-uniform"
    return key, None


def run(job: Job, images: list[dict[str, Any]]) -> None:
    cfg = job.config
    entries = [dict(e) for e in images]
    for entry in tqdm(entries, desc="select: checking images", unit="image", disable=not job.progress):
        entry["key"], reason = _inspect(entry, cfg.min_side, cfg.uniform_std)
        entry["kept"], entry["reason"] = reason is None, reason
    candidates = [e for e in entries if e["kept"]]

    embedder = job.models.embedder
    vectors = []
    with tqdm(total=len(candidates), desc="select: embedding", unit="image", disable=not job.progress) as bar:
        for start in range(0, len(candidates), CHUNK):
            chunk = candidates[start : start + CHUNK]
            vectors.append(job.ctx.embed(embedder, [e["key"] for e in chunk],
                                         lambda i, chunk=chunk: entry_image(chunk[i])))
            bar.update(len(chunk))
    vectors_all = np.concatenate(vectors) if vectors else np.zeros((0, 1), dtype=np.float32)

    unique: list[int] = []
    for i, entry in enumerate(candidates):
        if unique:
            sims = vectors_all[unique] @ vectors_all[i]
            best = int(np.argmax(sims))
            if sims[best] > cfg.duplicate_cos:
                entry["kept"], entry["reason"] = False, "near-duplicate"
                entry["duplicate_of"] = candidates[unique[best]]["image_id"]
                continue
        unique.append(i)

    log_density, keep = density_filter(vectors_all[unique], tuple(cfg.density_band), components=cfg.gmm_components,
                                       pca_dims=cfg.pca_dims, seed=cfg.seed)
    for j, i in enumerate(unique):
        candidates[i]["log_density"] = round(float(log_density[j]), 6)
        if not keep[j]:
            candidates[i]["kept"], candidates[i]["reason"] = False, "outside density band"

    for entry in entries:
        if not entry["kept"]:
            job.drop(entry["reason"])
    write_jsonl(job.folder / OUTPUT, entries)
    job.manifest["counts"] = {"in": len(entries), "out": sum(e["kept"] for e in entries)}


def selected(build: Path) -> list[dict[str, Any]]:
    from caprecon.apps.cttd.stage import read_records

    return [e for e in read_records(build / FOLDER / OUTPUT) if e["kept"]]
