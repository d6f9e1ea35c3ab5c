"""`caprecon distill`: a reward model trained on the (image, caption, metric value) rows earlier runs
scored, so that training needs no text-to-image model in the loop.

The rows come from run folders (their `scores.jsonl`; the manifest names the store the run worked
through). A frozen image encoder and text encoder (default: the demo's EfficientNet-Lite0 and
MiniLM, offline) give features, cached in the store like every embedding, and a small head
learns the metric from them, by one of three objectives:

- `reconstruction` (where the rows name their reconstructions, as reconstruction metrics write
  them): the head learns, from the caption alone, the image encoder's embedding of the caption's
  reconstruction (`ReconstructionHead`), and the reward is the image's cosine with that prediction,
  mapped onto the metric's scale by a line fitted on the training rows. Every caption is a
  training example of the text-to-reconstruction map, whichever picture it describes, so it needs
  far fewer pictures than the other two; it is the metric's own form when the image encoder is the
  metric's embedder (the offline default is).
- `value`: mean squared error on the standardised metric (`RewardHead` over both features).
- `pairs`: a logistic loss on the difference of two captions of one image, the better one known
  from the metric (`RewardHead`).

`auto` (the default) takes `reconstruction` for a metric the runs describe as comparing embeddings
(recon, clip-image) where every row names a reconstruction its run's store holds, else `value`.
Reconstructions are read from the store by key only (the file name a row gives is taken for the
key, nothing else of it), checked against the checksum the store recorded: a row cannot make
`distill` open any other file. A value that is not finite is refused, naming its rows. When the text
encoder is the one a run's generator chose its reconstructions with (the offline stand-in's
retrieval matches captions with MiniLM, the default text encoder), it warns: the head can then
learn the generator's own rule, and the held-out figures overstate how well it would follow a
text-to-image model.

Images, not rows, are split into training and held-out: captions of one image share most of their
signal, so a split by row would flatter the held-out figures. An image is a photo, whatever paths name
it (`one_name_per_photo`), and a caption said of a held-out image is not learnt from where a training
image has it too (`shares_a_held_out_caption`). On the held-out images it reports the Spearman and
Kendall (tau-b) correlation with the true metric, the accuracy on pairs of captions of one image, and
the speed-up over the metric (its model seconds per row, from the runs' manifests,
over the distilled reward's per row with both encoders computing afresh).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from caprecon.apps.distill.encode import features, reconstruction_targets
from caprecon.apps.distill.heldout import evaluate, shuffled, speed, split_images
from caprecon.apps.distill.rows import read_rows
from caprecon.apps.distill.train import (
    OBJECTIVES,
    choose_objective,
    head_of,
    onto_metric,
    runs_embedder,
    standardising,
    train_head,
)
from caprecon.core.checks import MAX_EPOCHS, MAX_WIDTH, check_count, check_number
from caprecon.core.digests import keep_memo_in, memo_scoped
from caprecon.core.errors import ConfigError
from caprecon.data.normalise import collapse_whitespace
from caprecon.metrics.base import Context
from caprecon.run.folder import LOCK_FILE, holds_run_folder, write_manifest
from caprecon.store.index import Store

log = logging.getLogger(__name__)


@dataclass
class Distilled:
    """What `distill` returns: the folder written, the held-out figures, and the model."""

    out: Path | None
    report: dict[str, Any]
    model: Any = field(repr=False, default=None)


def shares_a_held_out_caption(rows: Sequence[Any], test: np.ndarray) -> np.ndarray:
    """Per row, whether its caption (up to case and whitespace) is also the caption of a held-out row. Such
    a row is left out of training: the head would learn that very caption's value or reconstruction, and
    the held-out figures would measure recall of it, not a caption the reward has never read (datasets
    whose candidate captions are drawn from other images' references repeat them across images:
    Flickr8k-CrowdFlower's 5,910 rows hold 970 distinct captions)."""
    def same(caption: str) -> str:
        return collapse_whitespace(caption).casefold()

    held_out = {same(r.caption) for r, t in zip(rows, test) if t}
    return np.array([same(r.caption) in held_out for r in rows], dtype=bool)


def one_name_per_photo(images: Sequence[str], photos: Sequence[str]) -> list[str]:
    """Each row's image named by one path per photo (`photos`: the rows' image content keys): the first in
    sorted order of the paths that hold those bytes. One photo under two paths (two runs that named it
    relative and absolute, a copy under another name) is then one image to the split, held out or trained
    on whole, and one image for the within-image pairs."""
    first: dict[str, str] = {}
    for image, photo in sorted(zip(images, photos)):
        first.setdefault(photo, image)
    return [first[photo] for photo in photos]


@holds_run_folder("out", inputs=("runs",))
@memo_scoped
def distill(runs: str | Path | Sequence[str | Path], metric: str, out: str | Path | None = None, *,
            image_encoder: Any = None, text_encoder: Any = None, objective: str = "auto", holdout: float = 0.2,
            hidden: int = 256, epochs: int = 200, lr: float = 1e-3, seed: int = 0, max_train_images: int | None = None,
            store: Store | None = None, cache_dir: str | Path | None = None, progress: bool = True) -> Distilled:
    """`caprecon distill`: train a distilled reward for `metric` on the rows of `runs` (run folders, or
    one); write it to `out`, a new or empty folder (config.json, model.safetensors, manifest.json),
    held under the run lock for the whole run. The encoders are objects or names, as
    `--image-encoder`/`--text-encoder` take them (no image encoder: for the reconstruction objective
    the runs' own embedder, see `runs_embedder`); `max_train_images` caps the training images (a
    learning curve); `progress` shows a bar per stage. It warns (and the report says, as
    `text_encoder_chose_reconstructions`) when the text encoder is the one a run's generator chose
    its reconstructions with: the head can then learn the generator's own rule, and the held-out
    figures overstate how well it would follow a real text-to-image model. Returns `Distilled`."""
    from caprecon.core.paths import default_cache_dir
    from caprecon.models.build import build_model
    from caprecon.models.distilled import (
        DEFAULT_IMAGE_ENCODER,
        DEFAULT_TEXT_ENCODER,
        DistilledReward,
        encoder_spec,
    )

    # every setting and the output, checked before any encoder loads (the command's options say the same)
    if objective not in OBJECTIVES:
        raise ConfigError(f"--objective must be one of {', '.join(OBJECTIVES)}, not {objective!r}")
    check_number("--holdout", holdout, 0, 1, low_open=True, high_open=True)
    check_count("--epochs", epochs, 1, MAX_EPOCHS)
    check_count("--hidden", hidden, 1, MAX_WIDTH)
    check_count("--seed", seed, 0)
    check_number("--lr", lr, 0, low_open=True)
    if max_train_images is not None:
        check_count("--max-train-images", max_train_images, 1)
    runs = [runs] if isinstance(runs, (str, Path)) else list(runs)
    given: dict[Path, str | Path] = {}
    for run in runs:  # a run given twice would count its rows twice
        first = given.get(Path(run).resolve())
        if first is not None:
            also = f" (also as {first})" if str(first) != str(run) else ""
            raise ConfigError(f"runs: {run} is given twice{also}")
        given[Path(run).resolve()] = run
    if out is not None and any(p.name != LOCK_FILE for p in Path(out).iterdir()):
        # checked and locked by the run lifecycle (holds_run_folder); it must hold nothing but the lock
        raise ConfigError(f"--out {out}: the folder exists and is not empty; choose a new one")
    store = store if store is not None else Store.open(cache_dir or default_cache_dir())
    # the encoders' files and the photos are hashed into this cache's memo of digests, and none under $HOME,
    # for this call alone (`memo_scoped`)
    keep_memo_in(None if store.read_only else store.root)
    rows, sources = read_rows(runs, metric, store)
    objective = choose_objective(objective, rows, sources)
    if image_encoder is None and objective == "reconstruction":
        image_encoder = runs_embedder(sources)
    # config.json names the encoders as they were given: a registry name rebuilds without --allow-plugins
    image_spec = encoder_spec(image_encoder or DEFAULT_IMAGE_ENCODER)
    text_spec = encoder_spec(text_encoder or DEFAULT_TEXT_ENCODER)
    image_encoder = build_model("embedder", image_encoder or DEFAULT_IMAGE_ENCODER, setting="image-encoder")
    text_encoder = build_model("matcher", text_encoder or DEFAULT_TEXT_ENCODER, setting="text-encoder")
    shared_rule = getattr(text_encoder, "fingerprint", None) in {f for s in sources for f in s["chose_by"]}
    if shared_rule:
        log.warning("distill: the text encoder (%s) is the one the runs' generator chose its reconstructions with; "
                    "the head can learn the generator's own rule, so the held-out figures overstate how well it "
                    "would follow a text-to-image model: give --text-encoder another encoder", text_spec)
    ctx = Context(store)
    image_features, text_features, kept, photos = features(rows, image_encoder, text_encoder, ctx, progress=progress)
    rows = [rows[k] for k in kept]
    groups = one_name_per_photo([r.image for r in rows], photos)
    truth = np.array([r.value for r in rows])
    held = split_images(groups, holdout, seed)
    test = np.array([g in held for g in groups])
    shared = ~test & shares_a_held_out_caption(rows, test)
    train = ~test & ~shared
    if not train.any():
        raise ConfigError(f"every training row's caption is also a caption of a held-out image ({int(shared.sum())} "
                          f"row(s)): learning them would give the held-out figures their answers; give rows with "
                          f"more distinct captions, or a smaller --holdout")
    if max_train_images is not None:
        kept = set(shuffled([g for g, t in zip(groups, train) if t], seed, "train|")[:max_train_images])
        train &= np.array([g in kept for g in groups])
    mean, scale = standardising(truth[train], [rows[k] for k in np.flatnonzero(train)], metric)
    started = time.perf_counter()
    if objective == "reconstruction":
        target = reconstruction_targets([rows[k] for k in np.flatnonzero(train)], image_encoder, ctx,
                                        progress=progress)
    else:
        target = (truth[train] - mean) / scale
    head = train_head(image_features[train], text_features[train], target,
                      [g for g, t in zip(groups, train) if t], objective=objective, hidden=hidden, epochs=epochs,
                      lr=lr, seed=seed, progress=progress)
    if objective == "reconstruction":
        mean, scale = onto_metric(head, image_features[train], text_features[train], truth[train])
    if not (math.isfinite(mean) and math.isfinite(scale)):  # config.json is strict JSON, and a reward must be a number
        raise ConfigError(f"training diverged: the line onto {metric}'s scale is {scale!r} x + {mean!r}; "
                          f"lower --lr or --epochs")
    train_seconds = time.perf_counter() - started
    config = {"metric": metric, "objective": objective, "head": head_of(objective), "image_encoder": image_spec,
              "text_encoder": text_spec, "image_dim": int(image_features.shape[1]),
              "text_dim": int(text_features.shape[1]), "hidden": hidden, "target_mean": mean, "target_scale": scale}
    model = DistilledReward(config, head)
    model.use_encoders(image_encoder, text_encoder)
    predicted = model.predict(image_features[test], text_features[test])
    report = {"metric": metric, "objective": objective, "image_encoder": image_spec, "text_encoder": text_spec,
              "train_rows": int(train.sum()),
              "train_rows_left_out_sharing_a_held_out_caption": int(shared.sum()),
              "train_images": len({g for g, t in zip(groups, train) if t}),
              "held_out": evaluate(predicted, truth[test], [g for g, t in zip(groups, test) if t]),
              "text_encoder_chose_reconstructions": shared_rule,
              "train_seconds": round(train_seconds, 3), **speed(model, rows, test, sources)}
    if out is not None:
        out = Path(out)
        model.save_pretrained(out)
        digest = hashlib.sha256(json.dumps([[r.image, r.caption, r.value] for r in rows]).encode()).hexdigest()
        write_manifest(out, {"metric": metric, "runs": sources, "rows": len(rows), "rows_digest": digest,
                             "store": store.describe(), "seed": seed, "holdout": holdout, "report": report,
                             "config": config})
    return Distilled(out, report, model)
