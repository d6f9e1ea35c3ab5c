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
signal, so a split by row would flatter the held-out figures. On the held-out images it reports the
Spearman and Kendall (tau-b) correlation with the true metric, the accuracy on pairs of captions of
one image, and the speed-up over the metric (its model seconds per row, from the runs' manifests,
over the distilled reward's per row with both encoders computing afresh).
"""

from __future__ import annotations

import hashlib
import json
import math
import logging
import re
import time
from dataclasses import dataclass, field
from pathlib import Path, PurePath
from typing import Any, Sequence

import numpy as np
from tqdm.auto import tqdm

from caprecon.core.checks import MAX_EPOCHS, MAX_WIDTH, check_count, check_number
from caprecon.core.errors import ConfigError
from caprecon.core.records import is_number, read_jsonl
from caprecon.data.images import LoadedSample, read_image
from caprecon.data.samples import Sample, SampleError
from caprecon.metrics.base import Context
from caprecon.run.folder import LOCK_FILE, holds_run_folder, write_manifest
from caprecon.store.index import INDEX, Store, content_key, read_verified

OBJECTIVES = ("auto", "reconstruction", "value", "pairs")
log = logging.getLogger(__name__)


def head_of(objective: str) -> str:
    """The head an objective trains (`caprecon.models.distilled.HEADS`): the reconstruction head for
    `reconstruction`, the value head for `value` and `pairs`."""
    return "reconstruction" if objective == "reconstruction" else "value"


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


@dataclass
class Distilled:
    """What `distill` returns: the folder written, the held-out figures, and the model."""

    out: Path | None
    report: dict[str, Any]
    model: Any = field(repr=False, default=None)


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
        for where, record in read_jsonl(scores, ConfigError):
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


def features(rows: Sequence[Row], image_encoder: Any, text_encoder: Any, ctx: Context,
             batch: int = 64, progress: bool = False) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """(image features, text features, indices of the rows they belong to): rows whose image cannot
    be read are left out. Both go through the store, keyed by image content and by caption."""
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
        np.concatenate(texts), kept


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
        raise ConfigError(f"row {k + 1} ({rows[k].where or rows[k].image}): its reconstruction {stored.named} is "
                          f"not in the run's store, or its file fails its checksum (reconstructions are read from "
                          f"the store, by key); score the run again, or choose --objective value")
    unit = embed_images(loaded, image_encoder, ctx, batch, "reconstruction features" if progress else None) \
        if loaded else np.zeros((0, 0))
    unit = unit / np.maximum(np.linalg.norm(unit, axis=1, keepdims=True), 1e-12)
    where = {p: k for k, p in enumerate(paths)}
    return np.stack([unit[[where[r.path] for r in row.reconstructions]].mean(axis=0) for row in rows])


def choose_objective(objective: str, rows: Sequence[Row], sources: Sequence[dict[str, Any]] = ()) -> str:
    """`auto`: reconstruction where every run describes the metric as comparing the image with its
    reconstruction by an embedder (recon, clip-image; not VQAScore on the reconstruction) and every
    row names reconstructions its run's store holds, else value. `reconstruction` on rows without
    reconstructions is refused, naming the first such row."""
    if objective == "auto":
        complete = all(s.get("compares_embeddings") for s in sources) and \
            all(r.reconstructions and all(x.path is not None for x in r.reconstructions) for r in rows)
        return "reconstruction" if complete else "value"
    if objective == "reconstruction":
        bare = next((k for k, r in enumerate(rows) if not r.reconstructions), None)
        if bare is not None:
            raise ConfigError(f"--objective reconstruction: row {bare + 1} ({rows[bare].where or rows[bare].image}) "
                              f"names no reconstruction (only reconstruction metrics' runs do); choose --objective "
                              f"value or pairs")
    return objective


def runs_embedder(sources: Sequence[dict[str, Any]]) -> str | None:
    """The embedder the runs' metric compared images with, when they all name the same one without
    options and by a name or folder (not `module:Class` code): the reconstruction head's image encoder,
    so that the reward compares in the metric's own space. None: the default encoder."""
    from caprecon.models import registry

    named = {s.get("embedder") for s in sources}
    spec = named.pop() if len(named) == 1 else None
    if isinstance(spec, str) and spec and not registry.imports_code(spec) and \
            not any(s.get("embedder_options") for s in sources):
        return spec
    return None


def same_image_pairs(groups: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    from caprecon.stats.correlation import within_image_pairs

    i, j, _ = within_image_pairs(groups, np.zeros(len(groups)))
    return i, j


def train_head(image: np.ndarray, text: np.ndarray, target: np.ndarray, groups: Sequence[str], *,
               objective: str = "value", hidden: int = 256, epochs: int = 200, lr: float = 1e-3,
               weight_decay: float = 1e-4, seed: int = 0, batch: int = 256, progress: bool = False):
    """A `RewardHead` fitted to the standardised `target` (value) or to its order within each image
    (pairs); for `reconstruction`, a `ReconstructionHead` whose text MLP regresses `target`, the
    rows' mean unit reconstruction embeddings (squared error summed over the dimensions), so that
    it predicts the embedding expected over seeds."""
    import torch

    from caprecon.models.distilled import HEADS

    torch.manual_seed(seed)
    head = HEADS[head_of(objective)](image.shape[1], text.shape[1], hidden)
    opt = torch.optim.AdamW(head.parameters(), lr=lr, weight_decay=weight_decay)
    x_img, x_txt = torch.as_tensor(image, dtype=torch.float32), torch.as_tensor(text, dtype=torch.float32)
    y = torch.as_tensor(target, dtype=torch.float32)
    generator = torch.Generator().manual_seed(seed)
    count = len(y)
    if objective == "pairs":
        i, j = same_image_pairs(groups)
        decided = target[i] != target[j]
        i, j = torch.as_tensor(i[decided]), torch.as_tensor(j[decided])
        if not len(i):
            raise ConfigError("objective pairs: no two captions of one image differ in the metric")
        wins = (y[i] > y[j]).float()
        count = len(i)

    def loss_of(idx: torch.Tensor) -> torch.Tensor:
        if objective == "reconstruction":
            return ((head.reconstruction(x_txt[idx]) - y[idx]) ** 2).sum(-1).mean()
        if objective == "pairs":
            a, b = i[idx], j[idx]
            margin = head(x_img[a], x_txt[a]) - head(x_img[b], x_txt[b])
            return torch.nn.functional.binary_cross_entropy_with_logits(margin, wins[idx])
        return torch.nn.functional.mse_loss(head(x_img[idx], x_txt[idx]), y[idx])

    head.train()
    for _ in tqdm(range(epochs), desc=f"distill: training ({objective})", unit="epoch", disable=not progress):
        for idx in torch.randperm(count, generator=generator).split(batch):
            loss = loss_of(idx)
            opt.zero_grad()
            loss.backward()
            opt.step()
    head.eval()
    return head


def onto_metric(head: Any, image: np.ndarray, text: np.ndarray, truth: np.ndarray) -> tuple[float, float]:
    """(mean, scale) mapping the reconstruction head's cosine onto the metric's scale: the least-squares
    line of the metric on the head's output over the training rows (ReconScore is (1 + cos) / 2, a
    raw-cosine metric the cosine itself; the line finds either)."""
    import torch

    with torch.inference_mode():
        out = head(torch.as_tensor(image, dtype=torch.float32), torch.as_tensor(text, dtype=torch.float32)).numpy()
    if np.ptp(out) == 0:
        return float(truth.mean()), 1.0
    scale, mean = np.polyfit(out.astype(np.float64), truth, 1)
    return float(mean), float(scale)


def evaluate(predicted: np.ndarray, truth: np.ndarray, groups: Sequence[str]) -> dict[str, Any]:
    from caprecon.stats.correlation import kendall_tau, pairwise_accuracy, spearman

    i, j = same_image_pairs(groups)
    pairs = pairwise_accuracy(predicted[i], predicted[j], (np.sign(truth[i] - truth[j]) + 1) / 2)
    figures = {"spearman": spearman(predicted, truth), "kendall": kendall_tau(predicted, truth, "b"),
               "pairwise_accuracy": pairs.accuracy}
    # undefined (held-out values all equal, or a constant prediction): None, which strict JSON can hold
    return {"rows": len(truth), "images": len(set(groups)), "pairs": pairs.n,
            **{k: float(v) if v is not None and math.isfinite(v) else None for k, v in figures.items()}}


@holds_run_folder("out", inputs=("runs",))
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
    from caprecon.models.distilled import (DEFAULT_IMAGE_ENCODER, DEFAULT_TEXT_ENCODER, DistilledReward,
                                           encoder_spec)

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
    image_features, text_features, kept = features(rows, image_encoder, text_encoder, ctx, progress=progress)
    rows = [rows[k] for k in kept]
    groups = [r.image for r in rows]
    truth = np.array([r.value for r in rows])
    held = split_images(groups, holdout, seed)
    test = np.array([g in held for g in groups])
    train = ~test
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


def standardising(values: np.ndarray, rows: Sequence[Row], metric: str) -> tuple[float, float]:
    """(mean, standard deviation) of the training rows' values (a deviation of 0: 1), refused, naming
    the largest value's row, where they are too large for either to be a finite number."""
    with np.errstate(over="ignore", invalid="ignore"):
        mean, scale = float(values.mean()), float(values.std())
    if not (math.isfinite(mean) and math.isfinite(scale)):
        k = int(np.argmax(np.abs(values)))
        raise ConfigError(f"{metric}'s values are too large to learn (their mean or spread is not a finite number; "
                          f"{values[k]!r} at {rows[k].where or rows[k].image}); rescale them first")
    return mean, scale or 1.0


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
