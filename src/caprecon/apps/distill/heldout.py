"""The held-out side of `caprecon distill`: which images are held out (by a hash of the seed and the
file's name), and the figures on them: correlations, within-image pair accuracy and the speed-up."""

from __future__ import annotations

import hashlib
import math
import time
from pathlib import PurePath
from typing import Any, Sequence

import numpy as np

from caprecon.apps.distill.rows import Row
from caprecon.core.errors import ConfigError
from caprecon.data.images import read_image
from caprecon.data.samples import Sample


def shuffled(images: Sequence[str], seed: int, salt: str = "") -> list[str]:
    """The distinct images in an order drawn by a hash of the seed and each file's name (then its
    path): the same photos come first on every machine, whatever the rows' order."""
    return sorted(set(images), key=lambda im: (
        hashlib.sha256(f"{seed}|{salt}{PurePath(im).name}".encode()).hexdigest(), im))


def split_images(images: Sequence[str], holdout: float, seed: int) -> set[str]:
    """The held-out images: a share `holdout` of the distinct images, chosen by a hash of the seed and
    the image's file name (then its full path), so the split depends neither on the rows' order nor on
    where the images lie: the same photos held out on every machine."""
    distinct = shuffled(images, seed)
    count = min(len(distinct) - 1, max(1, round(holdout * len(distinct))))
    if count < 1:
        raise ConfigError(f"distillation needs captions of at least 2 images to hold some out, got {len(distinct)}")
    return set(distinct[:count])


def same_image_pairs(groups: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    from caprecon.stats.correlation import within_image_pairs

    i, j, _ = within_image_pairs(groups, np.zeros(len(groups)))
    return i, j


def evaluate(predicted: np.ndarray, truth: np.ndarray, groups: Sequence[str]) -> dict[str, Any]:
    from caprecon.stats.correlation import kendall_tau, pairwise_accuracy, spearman

    i, j = same_image_pairs(groups)
    pairs = pairwise_accuracy(predicted[i], predicted[j], (np.sign(truth[i] - truth[j]) + 1) / 2)
    figures = {"spearman": spearman(predicted, truth), "kendall": kendall_tau(predicted, truth, "b"),
               "pairwise_accuracy": pairs.accuracy}
    # undefined (held-out values all equal, or a constant prediction): None, which strict JSON can hold
    return {"rows": len(truth), "images": len(set(groups)), "pairs": pairs.n,
            **{k: float(v) if v is not None and math.isfinite(v) else None for k, v in figures.items()}}


def speed(model: Any, rows: Sequence[Row], test: np.ndarray, sources: list[dict[str, Any]],
          sample: int = 32) -> dict[str, Any]:
    """Seconds per row of the distilled reward, both encoders computing afresh (no store), on up to
    `sample` held-out rows; beside the metric's model seconds per row where the runs recorded them."""
    picked = [rows[i] for i in np.flatnonzero(test)[:sample]]
    images = [read_image(Sample(id=str(k), image=r.image, caption=r.caption)).image for k, r in enumerate(picked)]
    started = time.perf_counter()
    model.score(images, [r.caption for r in picked])
    per_row = (time.perf_counter() - started) / max(1, len(picked))
    timed = [s for s in sources if s["model_seconds"] and s["samples"]]
    metric_per_row = sum(s["model_seconds"] for s in timed) / sum(s["samples"] for s in timed) if timed else None
    return {"distilled_seconds_per_row": per_row, "metric_seconds_per_row": metric_per_row,
            "speedup": metric_per_row / per_row if metric_per_row and per_row else None}
