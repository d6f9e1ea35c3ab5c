"""The cascade (`score --cascade`) against the full pipeline: the same decisions at a fraction of the generations?

Each part scores every row with the full pipeline (recon), then runs the cascade in the same store
once per decision and per seed (5 shuffles of the calibration sample; the goal lines hold the mean
over them, each seed's figure is printed) at `--budget` (default 0.3) of the rows; the cascade's
reconstructions come from the store, and count as generations all the same (what a cold run would
make). Printed per part:

- the order of systems (`--decision rank --by system`): Kendall tau_b between the systems' means as
  the cascade estimates them and their means under the full pipeline (goal);
- best-of-N (`--decision best-of-n`): the share of images whose pick is the full pipeline's (goal);
- the order of every caption (`--decision rank` without `--by`): tau_b between the cascade's decision
  scores and recon over every row (no goal: the issue's ranking is of systems);
- the cascade's generations over the full pipeline's (the largest of its runs; goal);
- what the cheap signal can do: its own tau_b with recon over the captions and over the systems, its
  own best-of-N picks (no reconstruction), the calibration's leave-one-out coverage of the residual
  intervals, how often an image's best is among its m best by the cheap score (and what
  reconstructing those costs), the full pipeline's own standard error of each system's mean, and
  two oracles that know recon and spend the same budget: best-of-N fixing the images
  that need the fewest reconstructions first (the least set of an image's rows whose recon makes its
  pick right, searched exhaustively up to 4 rows), and the caption ranking reconstructing the rows
  with the largest residuals first (greedy, not exact).

1. Flickr8k-dev (../shared/data/flickr8k-dev, read in place; skipped when absent), the offline
   stand-in (`--preset offline`). The 125 images split in two by a fixed shuffle: the Expert
   candidates of one half, scored with recon, train the cheap signal (`caprecon distill`, its
   default objective and encoders); the cascade runs on the Expert candidates of the other half
   (about six captions an image). Flickr8k-Expert names no captioning system (its candidates are
   captions of other images, retrieved), so the systems here are the candidates grouped by the
   total of their three expert ratings (3 to 8 each a system, 9 to 12 one: 7 systems of 11 to 166
   captions), a rule fixed before any cascade ran: systems of graded quality by people, ranked by
   recon. Caveat (docs/scale.md): the stand-in retrieves its "reconstruction" by MiniLM features and
   the student reads the caption with MiniLM too, so this cheap signal knows the stand-in's rule
   better than it would know a real generator's. The same figures at budgets 0.5 and 0.7 follow,
   without goals: how much the agreement costs.
2. The tiny pipeline (random-weight SD at 1 step, 32 px, and DINOv2): the demo's 12 captions of 4
   images, its systems its `quality` field (faithful, vague, wrong: 4 captions each); the cheap
   signal is CLIPScore with the tiny random-weight CLIP, which knows nothing of the images, so this
   part shows the cascade where its cheap score carries no information.

Usage: python benchmarks/cascade.py [--budget 0.3] [--part flickr|tiny] [--cache-dir DIR] [--work DIR]
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the tiny models and stand-ins
import offline_env  # noqa: E402, F401  (the offline environment, before torch, transformers or caprecon)

import numpy as np  # noqa: E402

import caprecon  # noqa: E402
from caprecon.apps.cascade.estimates import calibrate  # noqa: E402
from caprecon.stats.correlation import kendall_tau  # noqa: E402

FLICKR = Path(__file__).resolve().parents[2] / "shared" / "data" / "flickr8k-dev"
DEMO = Path(caprecon.__file__).parent / "data" / "demo" / "captions.jsonl"
TAU_GOAL, PICKS_GOAL, SHARE_GOAL = 0.95, 0.95, 0.30
SEEDS = 5  # shuffles of the calibration sample per decision: the goal lines hold the mean over them
CURVE = (0.5, 0.7)  # Flickr8k-dev: the same figures at larger budgets, where the goals' agreement is reached


def line(name: str, value: float, goal: str = "") -> None:
    print(f"{name:<60} {value:>8.3f}  {goal}".rstrip())


def generations(run: caprecon.Results) -> int:
    cache = run.manifest["cache"]
    return int(cache.get("generated", 0)) + int(cache.get("reused", 0))


def best_picks(records: list[dict], score: dict[str, float]) -> list[bool]:
    """Per image with 2+ captions: is the pick by `score` (id -> value) the full pipeline's? (`records`
    carry the full score under `full`)."""
    by_image: dict[str, list[dict]] = {}
    for r in records:
        by_image.setdefault(str(r["image_id"]), []).append(r)
    return [max(rows, key=lambda r: score[r["id"]])["id"] == max(rows, key=lambda r: r["full"])["id"]
            for rows in by_image.values() if len(rows) > 1]


def system_table(records: list[dict], score: dict[str, float]) -> dict[str, float]:
    """Each system's mean of `score` (id -> value) over its rows."""
    members: dict[str, list[float]] = {}
    for r in records:
        members.setdefault(r["system"], []).append(score[r["id"]])
    return {name: sum(v) / len(v) for name, v in members.items()}


def images(records: list[dict]) -> list[list[dict]]:
    by_image: dict[str, list[dict]] = {}
    for r in records:
        by_image.setdefault(str(r["image_id"]), []).append(r)
    return [rows for rows in by_image.values() if len(rows) > 1]


def image_spread(records: list[dict], value) -> float:
    """The mean over images (2+ captions) of the sd of `value` among an image's captions."""
    return float(np.mean([np.std([value(r) for r in rows], ddof=1) for rows in images(records)]))


def best_gap(records: list[dict]) -> float:
    """The mean over images of how far the full pipeline's best caption leads its second."""
    return float(np.mean([np.subtract(*sorted((r["full"] for r in rows), reverse=True)[:2])
                          for rows in images(records)]))


def intra_image_correlation(records: list[dict], value) -> float:
    """One-way ANOVA estimate of the share of `value`'s variance that images share (ICC(1))."""
    groups = [np.array([value(r) for r in rows]) for rows in images(records)]
    every = np.concatenate(groups)
    k, n = len(groups), len(every)
    size = (n - sum(len(g) ** 2 for g in groups) / n) / (k - 1)
    between = sum(len(g) * (g.mean() - every.mean()) ** 2 for g in groups) / (k - 1)
    within = sum(float(np.sum((g - g.mean()) ** 2)) for g in groups) / (n - k)
    return float((between - within) / (between + (size - 1) * within))


def oracle_best_of_n(records: list[dict], predicted: dict[str, float], budget_rows: int) -> float:
    """The most images an oracle that knows recon gets right with `budget_rows` reconstructions: per
    image, the least set of rows whose recon (the rest at their calibrated prediction) makes the pick
    the full pipeline's (exhaustive up to 4 rows, else all of its rows); the cheapest images first."""
    by_image: dict[str, list[dict]] = {}
    for r in records:
        by_image.setdefault(str(r["image_id"]), []).append(r)
    costs = []
    for rows in by_image.values():
        if len(rows) < 2:
            continue
        truth = max(rows, key=lambda r: r["full"])["id"]
        cost = len(rows)
        for size in range(0, min(4, len(rows)) + 1):
            if any(max(rows, key=lambda r: r["full"] if r["id"] in chosen else predicted[r["id"]])["id"] == truth
                   for chosen in ({r["id"] for r in c} for c in itertools.combinations(rows, size))):
                cost = size
                break
        costs.append(cost)
    right, spent = 0, 0
    for cost in sorted(costs):
        if spent + cost > budget_rows:
            break
        spent, right = spent + cost, right + 1
    return right / len(costs)


def oracle_caption_tau(records: list[dict], predicted: dict[str, float], budget_rows: int) -> float:
    """tau_b of the captions' order when the rows with the largest |recon - prediction| are reconstructed."""
    ordered = sorted(records, key=lambda r: -abs(r["full"] - predicted[r["id"]]))
    known = {r["id"] for r in ordered[:budget_rows]}
    return kendall_tau([r["full"] if r["id"] in known else predicted[r["id"]] for r in records],
                       [r["full"] for r in records])


def top_m_recall(records: list[dict], cheap: dict[str, float]) -> list[tuple[int, float, float]]:
    """Per m: the share of images (2+ captions) whose full-pipeline best is among its m best by the
    cheap score, and what reconstructing those m of every image costs over all rows: what any
    policy that reconstructs in the cheap score's order can reach."""
    by_image: dict[str, list[dict]] = {}
    for r in records:
        by_image.setdefault(str(r["image_id"]), []).append(r)
    images = [rows for rows in by_image.values() if len(rows) > 1]
    out = []
    for m in range(1, max(len(rows) for rows in images) + 1):
        hits = [max(rows, key=lambda r: r["full"]) in sorted(rows, key=lambda r: -cheap[r["id"]])[:m] for rows in images]
        cost = sum(min(m, len(rows)) for rows in by_image.values())
        out.append((m, sum(hits) / len(hits), cost / len(records)))
    return out


def compare(label: str, samples: list[dict], full_run: caprecon.Results, cheap: str, budget: float,
            goals: bool = True, **settings) -> None:
    """The cascade's decisions beside the full pipeline's (each at SEEDS shuffles of its calibration
    sample: the goal lines hold their mean), the cheap signal's own figures and the oracles', and the
    goal lines (without `goals`: the same figures at another budget, for the curve)."""
    full = {r["id"]: r.get("recon") for r in full_run.records}
    full_generations = generations(full_run)
    system_of = {s["id"]: s["system"] for s in samples}
    used, figures = 0, {"systems": [], "best-of-n": [], "captions": []}
    for seed in range(SEEDS):
        results = {}
        for name, decision, by in (("systems", "rank", "system"), ("best-of-n", "best-of-n", None),
                                   ("captions", "rank", None)):
            started = time.perf_counter()
            result = caprecon.cascade(samples, cheap=cheap, metric="recon", decision=decision, by=by, budget=budget,
                                      seed=seed, **settings)
            results[name] = result
            used = max(used, result.generations)
            c = result.calibration
            coverage = "none under 4 rows" if c.coverage is None else f"{c.coverage:.3f} at z 1.96"
            print(f"{label}: seed {seed}: {name}: reconstructed {result.reconstructed} of {result.rows} in "
                  f"{len(result.rounds)} round(s), {time.perf_counter() - started:.1f} s; calibration recon = "
                  f"{c.intercept:.3f} + {c.slope:.3f} * cheap, residual sd {c.sigma:.4f} on {c.rows} row(s), "
                  f"leave-one-out coverage {coverage}")
        rows = [{**r, "full": full[r["id"]], "system": system_of[r["id"]]} for r in results["captions"].records
                if isinstance(full.get(r["id"]), float) and "decision_score" in r]
        figures["captions"].append(kendall_tau([r["decision_score"] for r in rows], [r["full"] for r in rows]))
        best = [{**r, "full": full[r["id"]]} for r in results["best-of-n"].records
                if isinstance(full.get(r["id"]), float) and "decision_score" in r]
        same = best_picks(best, {r["id"]: r["decision_score"] for r in best})
        figures["best-of-n"].append(sum(same) / len(same))
        truth = system_table(rows, {r["id"]: r["full"] for r in rows})
        estimated = results["systems"].systems
        names = sorted(truth)
        figures["systems"].append(kendall_tau([float(estimated.mean[estimated.names.index(n)]) for n in names],
                                              [truth[n] for n in names]))
        if seed == 0:
            spread = {n: float(np.std([r["full"] for r in rows if r["system"] == n], ddof=1)) for n in names}
            sizes = {n: sum(r["system"] == n for r in rows) for n in names}
            own_se = {n: spread[n] / sizes[n] ** 0.5 for n in names}
            ranked = sorted(names, key=lambda n: -truth[n])
            print(f"{label}: systems by the full pipeline (mean +- its own se over the system's captions): " + ", ".join(
                f"{n} {truth[n]:.4f} +- {own_se[n]:.4f} ({sizes[n]})" for n in ranked))
            apart = sum(truth[a] - truth[b] > 1.96 * float(np.hypot(own_se[a], own_se[b]))
                        for a, b in zip(ranked, ranked[1:]))
            print(f"{label}: neighbouring systems whose full-pipeline means differ by more than 1.96 se of the "
                  f"difference: {apart} of {len(ranked) - 1}")
            print(f"{label}: seed 0: systems by the cascade: " + ", ".join(
                f"{n} {estimated.mean[estimated.names.index(n)]:.4f} +- {estimated.se[estimated.names.index(n)]:.4f} "
                f"(se, {estimated.reconstructed[estimated.names.index(n)]} reconstructed)"
                for n in sorted(names, key=lambda n: -estimated.mean[estimated.names.index(n)])))
    cheap_name = results["captions"].cheap
    cheap_score = {r["id"]: r[cheap_name] for r in rows}
    fit = calibrate(np.array([r[cheap_name] for r in rows]), np.array([r["full"] for r in rows]))
    predicted = {r["id"]: fit.intercept + fit.slope * r[cheap_name] for r in rows}
    budget_rows = int(budget * len(samples))

    def residual(r: dict) -> float:
        return r["full"] - predicted[r["id"]]

    cheap_systems = system_table(rows, cheap_score)
    print(f"{label}: {len(rows)} rows, {len(same)} images with 2+ captions, {len(names)} systems; full pipeline "
          f"{full_generations} generations, the cascade at most {used} (budget {budget})")
    print(f"{label}: the cheap signal alone: tau_b with recon over the captions "
          f"{kendall_tau([cheap_score[r['id']] for r in rows], [r['full'] for r in rows]):.3f}, over the systems "
          f"{kendall_tau([cheap_systems[n] for n in names], [truth[n] for n in names]):.3f}; best-of-N picks the "
          f"same {np.mean(best_picks(rows, cheap_score)):.3f}; its residual sd about the line fitted on every row "
          f"{fit.sigma:.4f}")
    print(f"{label}: within an image: recon's sd {image_spread(rows, lambda r: r['full']):.4f}, its best ahead of "
          f"its second by {best_gap(rows):.4f} on average; the residuals' sd {image_spread(rows, residual):.4f} and "
          f"intra-image correlation {intra_image_correlation(rows, residual):.3f}")
    print(f"{label}: the full pipeline's best among an image's m best by the cheap score (m: share, generations): "
          + ", ".join(f"{m}: {hit:.3f} at {cost:.2f}" for m, hit, cost in top_m_recall(rows, cheap_score)))
    print(f"{label}: oracles that know recon, at {budget_rows} reconstructions: best-of-N picks the same "
          f"{oracle_best_of_n(rows, predicted, budget_rows):.3f}; captions' tau_b (largest residuals first) "
          f"{oracle_caption_tau(rows, predicted, budget_rows):.3f}")
    for name, values in figures.items():
        print(f"{label}: {name} over {SEEDS} seeds: " + ", ".join(f"{v:.3f}" for v in values)
              + f" (mean {np.mean(values):.3f}, min {min(values):.3f})")
    tau_systems, picks, tau_captions = (float(np.mean(figures[k])) for k in ("systems", "best-of-n", "captions"))
    if not goals:
        print(f"{label}: at budget {budget}: systems' tau {tau_systems:.3f}, best-of-N picks the same "
              f"{picks:.3f}, captions' tau {tau_captions:.3f} (means over {SEEDS} seeds), generations over the "
              f"full pipeline's {used / full_generations:.3f}")
        return
    line(f"{label}: Kendall tau of the cascade's order of systems vs the full pipeline's", tau_systems,
         f"goal >= {TAU_GOAL}")
    line(f"{label}: best-of-N picks the same", picks, f"goal >= {PICKS_GOAL}")
    line(f"{label}: generations over the full pipeline's", used / full_generations, f"goal <= {SHARE_GOAL}")
    line(f"{label}: Kendall tau of the cascade's order of captions (no goal)", tau_captions)


def expert_system(ratings: list[int]) -> str:
    """The benchmark's stand-in for a captioning system: the total of the three expert ratings,
    9 to 12 together (each of those totals has under 20 captions in Flickr8k-dev)."""
    total = sum(ratings)
    return "experts 9-12" if total >= 9 else f"experts {total}"


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
                              "image_id": r["image"], "system": expert_system(r["ratings"])})
    started = time.perf_counter()
    if (work / "student" / "manifest.json").is_file():  # kept by an earlier run with --work
        held = json.loads((work / "student" / "manifest.json").read_text())["report"]["held_out"]
    else:
        caprecon.score(samples["train"], ["recon"], preset="offline", cache_dir=cache, out=work / "train",
                       progress=True)
        held = distill([work / "train"], "recon", out=work / "student", cache_dir=cache).report["held_out"]
    print(f"flickr: cheap signal distilled on {len(samples['train'])} Expert captions of {len(train_images)} images "
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
        s["image"], s["image_id"], s["system"] = str(DEMO.parent / s["image"]), s["image"], s["quality"]
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
    p.add_argument("--work", help="a folder for the distilled head and the tiny models, kept for a rerun")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(args.work or tmp)
        work.mkdir(parents=True, exist_ok=True)
        if args.part in (None, "flickr"):
            flickr(work, args.budget, args.cache_dir or str(work / "cache-flickr"))
        if args.part in (None, "tiny"):
            tiny(work, args.budget, args.cache_dir or str(work / "cache-tiny"))


if __name__ == "__main__":
    main()
