"""The cascade (`score --cascade`) against the full pipeline: the same decisions at a fraction of the generations?

Each part scores every row with the full pipeline (recon), then runs the cascade twice in the same
store, once per decision (`rank`, `best-of-n`), at `--budget` (default 0.3) of the rows; the
cascade's reconstructions come from the store, and count as generations all the same (what a cold
run would make). Printed per part: Kendall tau_b between the cascade's decision scores (recon where
it reconstructed, the calibrated cheap score elsewhere) and the full pipeline's recon over every
row, the share of images whose best-of-N pick is the full pipeline's, and the cascade's generations
over the full pipeline's (the larger of the two decisions' runs).

1. Flickr8k-dev (../shared/data/flickr8k-dev, read in place; skipped when absent), the offline
   stand-in (`--preset offline`). The 125 images split in two by a fixed shuffle: the Expert
   candidates of one half, scored with recon, train the cheap signal (`caprecon distill`, its
   default objective and encoders); the cascade runs on the Expert candidates of the other half
   (about six captions an image). Caveat (docs/scale.md): the stand-in retrieves its
   "reconstruction" by MiniLM features and the student reads the caption with MiniLM too, so this
   cheap signal knows the stand-in's rule better than it would know a real generator's. The same
   figures at budgets 0.5 and 0.7 follow, without goals: how much the agreement costs.
2. The tiny pipeline (random-weight SD at 1 step, 32 px, and DINOv2): the demo's 12 captions of 4
   images; the cheap signal is CLIPScore with the tiny random-weight CLIP, which knows nothing of
   the images, so this part shows the cascade where its cheap score carries no information.

Usage: python benchmarks/cascade.py [--budget 0.3] [--part flickr|tiny] [--cache-dir DIR]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the tiny models and stand-ins
import offline_env  # noqa: E402, F401  (the offline environment, before torch, transformers or caprecon)

import caprecon  # noqa: E402
from caprecon.stats.correlation import kendall_tau  # noqa: E402

FLICKR = Path(__file__).resolve().parents[2] / "shared" / "data" / "flickr8k-dev"
DEMO = Path(caprecon.__file__).parent / "data" / "demo" / "captions.jsonl"
TAU_GOAL, PICKS_GOAL, SHARE_GOAL = 0.95, 0.95, 0.30
CURVE = (0.5, 0.7)  # Flickr8k-dev: the same figures at larger budgets, where the goals' agreement is reached


def line(name: str, value: float, goal: str = "") -> None:
    print(f"{name:<60} {value:>8.3f}  {goal}".rstrip())


def generations(run: caprecon.Results) -> int:
    cache = run.manifest["cache"]
    return int(cache.get("generated", 0)) + int(cache.get("reused", 0))


def compare(label: str, samples: list[dict], full_run: caprecon.Results, cheap: str, budget: float,
            goals: bool = True, **settings) -> None:
    """The cascade's two decisions beside the full pipeline's, and the goal lines (without `goals`:
    the same figures at another budget, for the curve)."""
    full = {r["id"]: r.get("recon") for r in full_run.records}
    full_generations = generations(full_run)
    used, results = 0, {}
    for decision in ("rank", "best-of-n"):
        started = time.perf_counter()
        result = caprecon.cascade(samples, cheap=cheap, metric="recon", decision=decision, budget=budget, **settings)
        results[decision] = result
        used = max(used, result.generations)
        c = result.calibration
        print(f"{label}: {decision}: reconstructed {result.reconstructed} of {result.rows} in {len(result.rounds)} "
              f"round(s), {time.perf_counter() - started:.1f} s; calibration recon = {c.intercept:.3f} + "
              f"{c.slope:.3f} * cheap, residual sd {c.sigma:.4f} on {c.rows} row(s)")
    ranked = [r for r in results["rank"].records if isinstance(full.get(r["id"]), float) and "decision_score" in r]
    tau = kendall_tau([r["decision_score"] for r in ranked], [full[r["id"]] for r in ranked])
    by_image: dict[str, list[dict]] = {}
    for r in results["best-of-n"].records:
        if isinstance(full.get(r["id"]), float) and "decision_score" in r:
            by_image.setdefault(str(r["image_id"]), []).append(r)
    same = [max(rows, key=lambda r: r["decision_score"])["id"] == max(rows, key=lambda r: full[r["id"]])["id"]
            for rows in by_image.values() if len(rows) > 1]
    print(f"{label}: {len(ranked)} rows, {len(same)} images with 2+ captions; full pipeline {full_generations} "
          f"generations, the cascade at most {used} (budget {budget})")
    if not goals:
        print(f"{label}: at budget {budget}: tau {tau:.3f}, best-of-N picks the same {sum(same) / len(same):.3f}, "
              f"generations over the full pipeline's {used / full_generations:.3f}")
        return
    line(f"{label}: Kendall tau of the cascade's ranking vs the full pipeline's", tau, f"goal >= {TAU_GOAL}")
    line(f"{label}: best-of-N picks the same", sum(same) / len(same), f"goal >= {PICKS_GOAL}")
    line(f"{label}: generations over the full pipeline's", used / full_generations, f"goal <= {SHARE_GOAL}")


def flickr(work: Path, budget: float, cache: str) -> None:
    if not (FLICKR / "expert.jsonl").is_file():
        print(f"flickr: skipped, {FLICKR} is absent (see its README for what it holds)")
        return
    from caprecon.apps.distill import distill

    rows = [json.loads(x) for x in (FLICKR / "expert.jsonl").read_text().splitlines() if x.strip()]
    images = sorted({r["image"] for r in rows})
    random.Random(0).shuffle(images)
    train_images = set(images[: len(images) // 2])
    samples = {"train": [], "test": []}
    for i, r in enumerate(rows):
        part = "train" if r["image"] in train_images else "test"
        samples[part].append({"id": str(i), "image": str(FLICKR / "images" / r["image"]), "caption": r["candidate"],
                              "image_id": r["image"]})
    started = time.perf_counter()
    train_run = caprecon.score(samples["train"], ["recon"], preset="offline", cache_dir=cache, out=work / "train",
                               progress=True)
    student = distill([work / "train"], "recon", out=work / "student", cache_dir=cache)
    held = student.report["held_out"]
    print(f"flickr: cheap signal distilled on {len(train_run.records)} Expert captions of {len(train_images)} images "
          f"in {time.perf_counter() - started:.0f} s (its own held-out Spearman {held['spearman']:.3f})")
    started = time.perf_counter()
    full_run = caprecon.score(samples["test"], ["recon"], preset="offline", cache_dir=cache, progress=True)
    print(f"flickr: full pipeline (recon, --preset offline) on {len(samples['test'])} captions of "
          f"{len(images) - len(train_images)} other images in {time.perf_counter() - started:.0f} s")
    for share in (budget, *CURVE):
        compare("flickr", samples["test"], full_run, f"distilled:{work / 'student'}", share, goals=share == budget,
                preset="offline", cache_dir=cache)


def tiny(work: Path, budget: float, cache: str) -> None:
    import tiny_models
    from caprecon.models.generator import DiffusersGenerator

    sd = tiny_models.build_tiny_sd(work / "sd")
    settings = {"generator": DiffusersGenerator(sd, steps=1, batch_size=16, device="cpu"),
                "embedder": str(tiny_models.build_tiny_dinov2(work / "dinov2")),
                "clip": str(tiny_models.build_tiny_clip(work / "clip")), "max_side": 32, "batch_size": 16,
                "cache_dir": cache}
    samples = [json.loads(x) for x in DEMO.read_text().splitlines() if x.strip()]
    for s in samples:
        s["image"], s["image_id"] = str(DEMO.parent / s["image"]), s["image"]
    started = time.perf_counter()
    full_run = caprecon.score(samples, ["recon"], **settings)
    print(f"tiny: full pipeline (SD + DINOv2, random weights, 1 step, 32 px) on the demo's {len(samples)} captions "
          f"in {time.perf_counter() - started:.0f} s; cheap signal CLIPScore with the tiny random CLIP")
    compare("tiny", samples, full_run, "clipscore", budget, **settings)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--budget", type=float, default=0.3)
    p.add_argument("--part", choices=("flickr", "tiny"))
    p.add_argument("--cache-dir", help="the store of both parts, kept for a rerun (default: a temporary one)")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        if args.part in (None, "flickr"):
            flickr(work, args.budget, args.cache_dir or str(work / "cache-flickr"))
        if args.part in (None, "tiny"):
            tiny(work, args.budget, args.cache_dir or str(work / "cache-tiny"))


if __name__ == "__main__":
    main()
