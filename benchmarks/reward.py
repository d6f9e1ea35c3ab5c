"""caprecon.Reward on a GRPO-shaped batch, and the distilled reward's fidelity on Flickr8k-dev.

1. Throughput: 64 prompts (random pictures) x 8 completions, each completion drawn from its prompt's
   12 captions with Zipf weights (1/rank), so a group holds duplicates as sampling gives them. The
   reward is recon through a stand-in generator that draws noise seeded by the caption and costs
   `--seconds-per-image` (sleep; a real text-to-image model costs far more: the tiny random-weight
   SD of the tests takes ~4.7 s per 32 px image on a shared 2-core CPU) and the pixel embedder.
   Timed in one run: the batch through `Reward` in a fresh store (uncached), again (cached), through
   the distilled reward (`distilled:FOLDER`, the offline default encoders, trained here on the
   uncached rewards; fresh store), and each completion scored alone with `caprecon.score`.
   Goals: generator calls = distinct completions; cached >= 20x faster than uncached; the distilled
   reward makes no generator call and, once its pictures were seen (each epoch shows them again),
   takes <= 1.5x one text-encoder pass over the completions; with a fresh store it also encodes
   the 64 pictures, printed beside.
2. Fidelity, the student apart from the stand-in: the 5,910 CrowdFlower captions of
   ../shared/data/flickr8k-dev's 125 images (read in place), 20 % of the images held out (split by
   image, as `distill` splits them). Each caption is scored with recon (EfficientNet-Lite0 features)
   through a stand-in that retrieves its "reconstruction" from the 100 training photos (the scored
   one left out) by word overlap with the ImageNet label names of their top 10 classes
   (`tests/label_words.py`), and distilled with the offline default encoders (EfficientNet-Lite0,
   MiniLM): the student reads captions with MiniLM, which the stand-in never uses, so it cannot learn
   the stand-in's own rule (with the offline preset's retrieval, which matches by MiniLM, it can).
   Held-out Spearman against the true recon for 12, 25, 50 and all 100 training images (the
   learning curve), with the reconstruction objective and, beside it, the value head; and a
   baseline that ignores the caption (every held-out caption scored as if it retrieved the photo
   most training captions retrieve). Goal: >= 0.85 with all training images (reconstruction).
   Skipped with a message when the folder is absent.

Usage: python benchmarks/reward.py [--seconds-per-image 0.05] [--cache-dir DIR] [--skip-fidelity] [--skip-throughput]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the tiny models and stand-ins
import offline_env  # noqa: E402, F401  (the offline environment, before torch, transformers or caprecon)

import numpy as np  # noqa: E402
from PIL import Image  # noqa: E402

import caprecon  # noqa: E402
from bench_common import write_samples  # noqa: E402
from caprecon.apps.distill import distill  # noqa: E402
from caprecon.apps.distill.heldout import split_images  # noqa: E402
from caprecon.models.generator import RetrievalGenerator  # noqa: E402
from caprecon.models.generator import Generated  # noqa: E402
from label_words import LabelWordMatcher  # noqa: E402
from oracle import PixelEmbedder  # noqa: E402

PROMPTS, GROUP, POOL = 64, 8, 12
FLICKR = Path(__file__).resolve().parents[2] / "shared" / "data" / "flickr8k-dev"
CURVE = (12, 25, 50, None)
HOLDOUT, SEED, TOP_K = 0.2, 0, 10


class CostlyNoiseGenerator:
    """Each request drawn as noise seeded by its prompt and seed, after `seconds` of sleep; counts calls."""

    fingerprint = "caption-noise-v1"

    def __init__(self, seconds: float):
        self.seconds, self.calls = seconds, 0

    def generate(self, requests):
        self.calls += len(requests)
        out = []
        for r in requests:
            time.sleep(self.seconds)
            seed = int.from_bytes(hashlib.sha256(f"{r.prompt}|{r.seed}".encode()).digest()[:8], "little")
            out.append(Generated(Image.fromarray(np.random.default_rng(seed).integers(
                0, 255, (r.height, r.width, 3), dtype=np.uint8))))
        return out


def grpo_batch(folder: Path) -> tuple[list[str], list[str]]:
    """(image path, completion) per row: 64 prompts x 8 completions, duplicates within groups."""
    _, rows = write_samples(folder, PROMPTS)
    rng = np.random.default_rng(0)
    weights = 1.0 / np.arange(1, POOL + 1)
    images, captions = [], []
    for k, row in enumerate(rows):
        pool = [f"a photo of scene {k}, version {j}: a red car beside a house" for j in range(POOL)]
        for j in rng.choice(POOL, size=GROUP, p=weights / weights.sum()):
            images.append(row["image"])
            captions.append(pool[j])
    return images, captions


def timed(call):
    started = time.perf_counter()
    result = call()
    return result, time.perf_counter() - started


def line(name: str, value: float, goal: str = "") -> None:
    print(f"{name:<52} {value:>10.3f}  {goal}".rstrip())


def throughput(root: Path, seconds: float) -> None:
    paths, captions = grpo_batch(root / "photos")
    pictures = {p: Image.open(p).convert("RGB") for p in set(paths)}
    images = [pictures[p] for p in paths]
    distinct = len(set(zip(paths, captions)))
    print(f"batch: {PROMPTS} prompts x {GROUP} completions = {len(captions)}, {distinct} distinct; "
          f"stand-in generator {seconds * 1000:.0f} ms per image")

    generator = CostlyNoiseGenerator(seconds)
    settings = dict(generator=generator, embedder=PixelEmbedder(), max_side=64)
    reward = caprecon.Reward(["recon"], cache_dir=str(root / "cache"), **settings)
    reward([images[0]], ["warm-up"])  # models and store opened before any timing
    generator.calls = 0
    values, uncached = timed(lambda: reward(images, captions))
    calls = generator.calls
    _, cached = timed(lambda: reward(images, captions))
    line("reward generator calls / distinct completions", calls / distinct, "goal <= 1.000")
    line("reward uncached, seconds per completion", uncached / len(captions))
    line("reward cached, seconds per completion", cached / len(captions))
    line("reward cached speed-up over uncached", uncached / cached, "goal >= 20")

    generator.calls = 0
    lone_cache = str(root / "cache-one-by-one")
    _, alone = timed(lambda: [caprecon.score([{"id": str(i), "image": p, "caption": c}], ["recon"],
                                             cache_dir=lone_cache, **settings)
                              for i, (p, c) in enumerate(zip(paths, captions))])
    line("score one by one, generator calls / distinct", generator.calls / distinct)
    line("reward uncached speed-up over score one by one", alone / uncached, "goal >= 1")

    run = root / "run"
    run.mkdir()
    (run / "scores.jsonl").write_text("\n".join(json.dumps({"image": p, "caption": c, "recon": v})
                                                for p, c, v in zip(paths, captions, values)))
    folder = root / "distilled"
    distilled = distill([run], "recon", folder, cache_dir=root / "cache-distill", epochs=20, progress=False)
    generator.calls = 0
    fast = caprecon.Reward([f"distilled:{folder}"], cache_dir=str(root / "cache-distilled"))
    _, text_encoder = distilled.model.encoders
    fast._build()  # the encoders load before timing, as the reward's do
    text_encoder.embed_texts(["warm-up"])
    _, one_pass = timed(lambda: text_encoder.embed_texts(captions))
    _, fresh = timed(lambda: fast(images, captions))
    line("distilled reward generator calls", generator.calls, "goal <= 0")
    line("distilled reward, fresh store / one text-encoder pass", fresh / one_pass)
    # a training run shows each picture again every epoch, its features then in the store: the next
    # step's new completions cost their text pass and the head
    seen = caprecon.Reward([f"distilled:{folder}"], cache_dir=str(root / "cache-distilled-seen"))
    seen(images, [f"an earlier completion {i}" for i in range(len(images))])
    _, steady = timed(lambda: seen(images, captions))
    line("distilled reward, pictures seen / one text-encoder pass", steady / one_pass, "goal <= 1.5")
    line("distilled reward speed-up over uncached reward", uncached / fresh)


def fidelity(root: Path, cache_dir: str) -> None:
    """The distilled reward where the student cannot read the stand-in's rule: the stand-in retrieves
    its "reconstruction" by ImageNet label words (`tests/label_words.py`), the student reads the
    caption with MiniLM."""
    if not (FLICKR / "crowdflower.jsonl").is_file():
        print(f"fidelity: skipped, {FLICKR} is absent (see its README for what it holds)")
        return
    rows = [json.loads(x) for x in (FLICKR / "crowdflower.jsonl").read_text().splitlines() if x.strip()]
    samples = [{"id": str(i), "image": str(FLICKR / "images" / r["image"]), "caption": r["candidate"]}
               for i, r in enumerate(rows)]
    held = split_images([s["image"] for s in samples], HOLDOUT, SEED)
    # the gallery is the training photos alone: no held-out photo is ever a training caption's reconstruction
    gallery = sorted({s["image"] for s in samples} - held)
    run = root / "flickr-run"
    generator = RetrievalGenerator(gallery, LabelWordMatcher(top_k=TOP_K), exclude_source=True)
    _, seconds = timed(lambda: caprecon.score(samples, ["recon"], generator=generator,
                                              embedder="efficientnet-lite0", cache_dir=cache_dir, out=run))
    print(f"fidelity: {len(samples)} captions of {len({s['image'] for s in samples})} images scored with recon "
          f"in {seconds:.0f} s; the stand-in retrieves from the {len(gallery)} training photos (the scored one "
          f"left out) by ImageNet label words (top {TOP_K} classes), the student reads captions with MiniLM")
    told, caption_blind = baseline(run, held)
    print(f"baseline ignoring the caption: {told}")
    print("objective       training images  training rows  held-out Spearman  Kendall  pairwise accuracy")
    last = {}
    for objective in ("reconstruction", "value"):
        for images in CURVE:
            report = distill([run], "recon", objective=objective, cache_dir=cache_dir, holdout=HOLDOUT, seed=SEED,
                             max_train_images=images, progress=False).report
            figures = report["held_out"]
            print(f"{objective:<14}  {report['train_images']:>15}  {report['train_rows']:>13}  "
                  f"{figures['spearman']:>17.3f}  {figures['kendall']:>7.3f}  {figures['pairwise_accuracy']:>17.3f}")
            last[objective] = report
    figures = last["reconstruction"]["held_out"]
    print(f"held out: {figures['images']} images, {figures['rows']} rows")
    line("held-out Spearman, student apart from the stand-in", figures["spearman"], "goal >= 0.85")
    line("held-out Spearman, value head (beside it)", last["value"]["held_out"]["spearman"])
    line("held-out Spearman, baseline ignoring the caption", caption_blind)


def baseline(run: Path, held: set[str]) -> tuple[str, float]:
    """A reward that ignores the caption: every held-out caption scored as if it retrieved the photo that
    most training captions retrieve, (1 + cos) / 2 of the image with that photo in the metric's space."""
    from caprecon.models.build import build_model
    from caprecon.stats.correlation import spearman

    records = [json.loads(x) for x in (run / "scores.jsonl").read_text().splitlines() if x.strip()]
    training = Counter(r["retrieved"] for r in records if r["image"] not in held and r.get("retrieved"))
    (photo, count), total = training.most_common(1)[0], sum(training.values())
    test = [r for r in records if r["image"] in held and isinstance(r.get("recon"), float)]
    embedder = build_model("embedder", "efficientnet-lite0")
    paths = sorted({r["image"] for r in test})
    by_path = dict(zip(paths, embedder.embed([Image.open(p).convert("RGB") for p in paths])))
    mode = embedder.embed([Image.open(FLICKR / "images" / f"{photo}.jpg").convert("RGB")])[0]
    unit = mode / np.linalg.norm(mode)
    predicted = [(1 + by_path[r["image"]] @ unit / np.linalg.norm(by_path[r["image"]])) / 2 for r in test]
    rho = spearman(np.array(predicted), np.array([r["recon"] for r in test]))
    return f"{photo} is retrieved by {count} of {total} training captions; held-out Spearman {rho:.3f}", rho


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds-per-image", type=float, default=0.05)
    p.add_argument("--cache-dir", help="store for the fidelity run (default: a temporary one)")
    p.add_argument("--skip-fidelity", action="store_true")
    p.add_argument("--skip-throughput", action="store_true")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        if not args.skip_throughput:
            throughput(root, args.seconds_per_image)
        if not args.skip_fidelity:
            fidelity(root, args.cache_dir or str(root / "cache-flickr"))


if __name__ == "__main__":
    main()
