"""Sampling captions of images, cached by content: the captioner calls of best-of-N selection
and of the task suites' captioning phase.

An image's candidates are keyed by the captioner's fingerprint, the prompt, the image's
bytes, the sampling seed, n and the sampling settings, so a re-run (or another command
asking for the same captions) captions nothing twice.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from PIL import Image
from tqdm.auto import tqdm

from caprecon.models.captioner import CaptionRequest, Sampling
from caprecon.models.common import derive_seed
from caprecon.store.index import Store, content_key


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
                        store: Store, images_per_call: int = 16, progress: bool = False) -> tuple[list[Pool], dict]:
    """Every image's `n` candidates, from the store where known. Images are decoded only
    when they must be captioned, `images_per_call` at a time, and each call's results are
    stored as soon as it returns, so a killed run loses at most the call in flight."""
    pools, keys = [], []
    for image_id, path in zip(image_ids(paths), paths):
        pool = Pool(image_id, path, derive_seed("caption", seed, image_id))
        try:
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
        except OSError as exc:  # a missing or unreadable file is this image's error, not the run's
            pool.error = f"{path}: cannot read image: {exc}"
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
                    with Image.open(pools[i].image) as im:
                        image = im.convert("RGB")
                except Exception as exc:  # PIL raises several types for corrupt files
                    pools[i].error = f"{pools[i].image}: cannot decode image: {type(exc).__name__}: {exc}"
                    continue
                requests.append(CaptionRequest(image, prompt, n, pools[i].seed, keys[i]))
                chunk.append(i)
            if requests:
                new = {keys[i]: {"captions": c} for i, c in zip(chunk, captioner.caption(requests, sampling))}
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
