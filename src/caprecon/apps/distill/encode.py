"""The features `caprecon distill` learns from: the frozen encoders' image and caption features, and
the reconstruction head's targets (its rows' stored reconstructions, embedded), all through the store."""

from __future__ import annotations

import hashlib
from typing import Any, Sequence

import numpy as np
from tqdm.auto import tqdm

from caprecon.apps.distill.rows import Row, Stored
from caprecon.core.errors import ConfigError
from caprecon.data.images import LoadedSample, read_image
from caprecon.data.samples import Sample, SampleError
from caprecon.metrics.base import Context
from caprecon.store.images import read_verified
from caprecon.store.index import content_key


def features(rows: Sequence[Row], image_encoder: Any, text_encoder: Any, ctx: Context,
             batch: int = 64, progress: bool = False) -> tuple[np.ndarray, np.ndarray, list[int], list[str]]:
    """(image features, text features, indices of the rows they belong to, those rows' image content
    keys): rows whose image cannot be read are left out. Both go through the store, keyed by image
    content and by caption."""
    items: list[LoadedSample] = []
    kept = []
    loaded: dict[str, LoadedSample | None] = {}
    for i, row in enumerate(rows):
        if row.image not in loaded:
            try:
                loaded[row.image] = read_image(Sample(id=str(i), image=row.image, caption=row.caption))
            except SampleError:
                loaded[row.image] = None
        base = loaded[row.image]
        if base is not None:
            items.append(base.with_caption(row.caption))
            kept.append(i)
    texts, fingerprint = [], text_encoder.fingerprint
    for start in tqdm(range(0, len(items), batch), desc="distill: caption features", unit="batch",
                      disable=not progress or not items):
        part = items[start : start + batch]
        keys = [content_key("text-embedding", encoder=fingerprint, text=it.caption) for it in part]
        texts.append(ctx.cached_arrays("text-embedding", keys,
                                       lambda order, p=part: list(text_encoder.embed_texts([p[j].caption
                                                                                            for j in order])),
                                       model=text_encoder))
    if not items:
        raise ConfigError("no row's image could be read")
    return embed_images(items, image_encoder, ctx, batch, "image features" if progress else None), \
        np.concatenate(texts), kept, [it.image_key for it in items]


def embed_images(items: Sequence[LoadedSample], image_encoder: Any, ctx: Context, batch: int = 64,
                 progress: str | None = None) -> np.ndarray:
    """The image encoder's features of opened images, a batch at a time, through the store (with a
    progress bar named `progress`, when given)."""
    starts = tqdm(range(0, len(items), batch), desc=f"distill: {progress}", unit="batch", disable=progress is None)
    return np.concatenate([ctx.embed(image_encoder, [it.image_key for it in part], lambda j, p=part: p[j].image)
                           for part in (items[start : start + batch] for start in starts)])


def reconstruction_targets(rows: Sequence[Row], image_encoder: Any, ctx: Context, batch: int = 64,
                           progress: bool = False) -> np.ndarray:
    """Each row's target for the reconstruction head: the mean of its reconstructions' unit
    embeddings under the image encoder (through the store). Each is read from the store by key,
    checked against the checksum the store recorded; one the store does not hold, or whose file
    fails its checksum, is an error naming the row (the store may have been pruned)."""
    wanted = {r.path: r for row in rows for r in row.reconstructions}
    loaded, paths = [], sorted(p for p in wanted if p is not None)
    for path in paths:
        image = read_verified(path, wanted[path].checksum)
        if image is None:
            wanted[path] = Stored(wanted[path].named)  # damaged: as good as absent
            continue
        # keyed as any image file is (the sha256 of its bytes, which is the store's checksum), so the
        # embeddings the run's metric cached serve here
        key = wanted[path].checksum or hashlib.sha256(path.read_bytes()).hexdigest()
        loaded.append(LoadedSample(Sample(id=path.stem, image=str(path), caption="-"), image, key))
    missing = next(((k, r) for k, row in enumerate(rows) for r in row.reconstructions
                    if r.path is None or wanted[r.path].path is None), None)
    if missing is not None:
        k, stored = missing
        # named by where it was read: `rows` are the training rows, so their position is not the file's
        raise ConfigError(f"{rows[k].where or f'row {k + 1} ({rows[k].image})'}: its reconstruction {stored.named} is "
                          f"not in the run's store, or its file fails its checksum (reconstructions are read from "
                          f"the store, by key); score the run again, or choose --objective value")
    unit = embed_images(loaded, image_encoder, ctx, batch, "reconstruction features" if progress else None) \
        if loaded else np.zeros((0, 0))
    unit = unit / np.maximum(np.linalg.norm(unit, axis=1, keepdims=True), 1e-12)
    where = {p: k for k, p in enumerate(paths)}
    return np.stack([unit[[where[r.path] for r in row.reconstructions]].mean(axis=0) for row in rows])
