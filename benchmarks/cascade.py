"""The cascade (`score --cascade`) against the full pipeline: the same decisions at a fraction of the generations?

Each part scores every row with the full pipeline (recon), then runs the cascade in the same store
once per decision and per seed (5 shuffles of the calibration sample; the goal lines hold the mean
over them, each seed's figure is printed) at `--budget` (default 0.3) of the rows; the cascade's
reconstructions come from the store, and count as generations all the same (what a cold run would
make). Printed per part:

- the order of systems (`--decision rank --by system`): Kendall tau_b between the systems' means as
  the cascade estimates them and their means under the full pipeline (goal);
- best-of-N (`--decision best-of-n`): the share of images whose pick the full pipeline makes (goal): its
  pick, or a caption whose full score equals it (under the offline stand-in, captions that retrieve
  the same gallery picture score exactly alike, and most images' best is shared so: the full
  pipeline's own pick among them is by input order); beside it, without a goal, the share whose pick
  is the very caption the full pipeline picks;
- the order of every caption (`--decision rank` without `--by`): tau_b between the cascade's decision
  scores and recon over every row (no goal: the issue's ranking is of systems);
- the cascade's generations over the full pipeline's (the largest of its runs; goal);
- what the cheap signal can do: its own tau_b with recon over the captions and over the systems, its
  own best-of-N picks (no reconstruction), the calibration's leave-one-out coverage of the residual
  intervals, the images whose best is shared, the residuals' sd within an image and their
  intra-image correlation, how often an image's best is among its m best by the cheap score (and
  what reconstructing those costs), the full pipeline's own standard error of each system's mean,
  and oracles that know recon and spend the same budget: best-of-N fixing the images that need the
  fewest reconstructions first (the least set of an image's rows whose recon makes its pick right,
  searched exhaustively up to 4 rows), and the caption ranking reconstructing the rows with the
  largest residuals first (greedy, not exact);
- what the budget can do for the order of systems: per pair of systems, the gap between their
  full-pipeline means, the standard error of the estimated gap under the oracle's allocation of the
  budget and under the cascade's (first seed), and the fewest rows of the two that settle it alone
  (gap at 1.96 standard errors); then the allocation of an oracle that knows each system's mean and
  residual sd (greedy on the expected pairs in the wrong order, as the cascade allocates on its
  estimates) with its expected tau and the tau of 400 random draws of rows at that allocation.

1. Flickr8k-dev (../shared/data/flickr8k-dev, read in place; skipped when absent), the offline
   stand-in (`--preset offline`). The 125 images split in two by a fixed shuffle: the captions of
   one half's images, scored with recon, train the cheap signal (`caprecon distill`, its default
   encoders; `--objective`, default auto: reconstruction here): their Expert and CrowdFlower
   candidates, each (image, caption) once, 3,053 rows (`--train expert`: the Expert ones alone, 376,
   the first cascade's student); the cascade runs on the Expert candidates of the other half (about
   six captions an image); no row of that half trains the student. Flickr8k-Expert names no
   captioning system (its candidates are captions of other images, retrieved), so the systems here
   are the candidates grouped by the
   total of their three expert ratings (3 to 8 each a system, 9 to 12 one: 7 systems of 11 to 166
   captions), a rule fixed before any cascade ran: systems of graded quality by people, ranked by
   recon. Caveat (docs/scale.md): the stand-in retrieves its "reconstruction" (one of 7 gallery
   pictures) by MiniLM features and the student reads the caption with MiniLM too, so this cheap
   signal learns the stand-in's rule, and the more rows it trains on the better: it knows the
   stand-in far better than it would know a real generator. The same figures at budgets 0.5 and 0.7 follow,
   without goals: how much the agreement costs.
2. The tiny pipeline (random-weight SD at 1 step, 32 px, and DINOv2): the demo's 12 captions of 4
   images, its systems its `quality` field (faithful, vague, wrong: 4 captions each); the cheap
   signal is CLIPScore with the tiny random-weight CLIP, which knows nothing of the images, so this
   part shows the cascade where its cheap score carries no information.

Usage: python benchmarks/cascade.py [--budget 0.3] [--part flickr|tiny] [--seeds 5] [--train crowd|expert]
       [--objective auto|reconstruction|value|pairs] [--cache-dir DIR] [--work DIR]
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the tiny models and stand-ins
import offline_env  # noqa: E402, F401  (the offline environment, before torch, transformers or caprecon)

import numpy as np  # noqa: E402

import caprecon  # noqa: E402
from caprecon.apps.cascade.estimates import calibrate, standard_error  # noqa: E402
from caprecon.stats.correlation import kendall_tau  # noqa: E402

FLICKR = Path(__file__).resolve().parents[2] / "shared" / "data" / "flickr8k-dev"
DEMO = Path(caprecon.__file__).parent / "data" / "demo" / "captions.jsonl"
TAU_GOAL, PICKS_GOAL, SHARE_GOAL = 0.95, 0.95, 0.30
SEEDS = 5  # shuffles of the calibration sample per decision (--seeds): the goal lines hold the mean over them
CURVE = (0.5, 0.7)  # Flickr8k-dev: the same figures at larger budgets, where the goals' agreement is reached


def line(name: str, value: float, goal: str = "") -> None:
    print(f"{name:<60} {value:>8.3f}  {goal}".rstrip())


def generations(run: caprecon.Results) -> int:
    cache = run.manifest["cache"]
    return int(cache.get("generated", 0)) + int(cache.get("reused", 0))


def best_picks(records: list[dict], score: dict[str, float], ties: bool = True) -> list[bool]:
    """Per image with 2+ captions: is the pick by `score` (id -> value) one the full pipeline makes?
    (`records` carry the full score under `full`.) With `ties`, any caption whose full score equals
    the image's best is right: under the offline stand-in captions that retrieve the same gallery
    picture score exactly alike, and the full pipeline's own pick among them is by input order, not
    by score. Without: the very caption the full pipeline picks (the first of its tied best)."""
    out = []
    for rows in images(records):
        pick = max(rows, key=lambda r: score[r["id"]])
        best = max(rows, key=lambda r: r["full"])
        out.append(pick["full"] == best["full"] if ties else pick["id"] == best["id"])
    return out


def tied_best(records: list[dict]) -> int:
    """The images (2+ captions) whose best full score is shared by 2 or more captions."""
    return sum(sorted((r["full"] for r in rows), reverse=True)[1] == max(r["full"] for r in rows)
               for rows in images(records))


def grouped(records: list[dict], field: str) -> dict[str, list[dict]]:
    """The records by the value of `field` (as text), in the order each value first appears."""
    out: dict[str, list[dict]] = {}
    for r in records:
        out.setdefault(str(r[field]), []).append(r)
    return out


def system_table(records: list[dict], score: dict[str, float]) -> dict[str, float]:
    """Each system's mean of `score` (id -> value) over its rows."""
    return {name: sum(score[r["id"]] for r in rows) / len(rows) for name, rows in grouped(records, "system").items()}


def images(records: list[dict]) -> list[list[dict]]:
    """The images' rows, of each image with 2+ captions."""
    return [rows for rows in grouped(records, "image_id").values() if len(rows) > 1]


def image_spread(records: list[dict], value) -> float:
    """The mean over images (2+ captions) of the sd of `value` among an image's captions."""
    return float(np.mean([np.std([value(r) for r in rows], ddof=1) for rows in images(records)]))


def sibling_difference_sd(records: list[dict], value) -> float:
    """The root mean square of `value`'s differences over every pair of captions of one image (each
    image's pairs weighted alike): what a best-of-N rule comparing two captions of an image must allow
    for. sqrt(2) times `value`'s sd over all rows when an image's captions share nothing; less when
    they share an offset, which cancels in a difference."""
    return float(np.sqrt(np.mean([np.mean([(value(a) - value(b)) ** 2 for a, b in itertools.combinations(rows, 2)])
                                  for rows in images(records)])))


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
    costs = []
    for rows in images(records):
        truth = max(r["full"] for r in rows)
        cost = len(rows)
        for size in range(0, min(4, len(rows)) + 1):
            if any(max(rows, key=lambda r: r["full"] if r["id"] in chosen else predicted[r["id"]])["full"] == truth
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


def discordance(gaps: dict[tuple[str, str], float], sd: dict[str, float], size: dict[str, int],
                taken: dict[str, int]) -> float:
    """The expected number of system pairs a ranking by the difference estimates puts in the wrong
    order: the sum over pairs of Phi(-|gap| / se of the difference) (normal estimates)."""
    from scipy.special import ndtr

    total = 0.0
    for (a, b), gap in gaps.items():
        spread = math.hypot(standard_error(sd[a], taken[a], size[a]), standard_error(sd[b], taken[b], size[b]))
        total += float(ndtr(-abs(gap) / spread)) if spread > 0 else (0.5 if gap == 0 else 0.0)
    return total


def oracle_allocation(truth: dict[str, float], sd: dict[str, float], size: dict[str, int], rows: int) -> dict[str, int]:
    """How an oracle that knows every system's true mean and residual sd would spread `rows`
    reconstructions over the systems (2 each first, as the cascade's calibration sample does, or 1
    where the budget has no room for 2): each
    step takes the move that lowers the expected discordant pairs most per row, a move being one more
    row of a system or the rest of a system's rows at once (a pair whose means nearly agree gains
    nothing until both systems are whole, which one row at a time never sees). Greedy, not proven
    best; what allocation by gaps and sds can do at this budget."""
    names = sorted(truth)
    gaps = {(a, b): truth[a] - truth[b] for a, b in itertools.combinations(names, 2)}
    first = 2 if 2 * len(names) <= rows else 1  # the calibration sample's rows of each system, as the budget allows
    taken = {n: min(first, size[n]) for n in names}
    left = rows - sum(taken.values())
    while left > 0:
        now = discordance(gaps, sd, size, taken)
        best, gain_per_row = None, 0.0
        for n in names:
            for extra in {1, size[n] - taken[n]}:
                if 0 < extra <= min(left, size[n] - taken[n]):  # a whole system takes no more
                    gain = now - discordance(gaps, sd, size, {**taken, n: taken[n] + extra})
                    if gain / extra > gain_per_row:
                        best, gain_per_row = (n, extra), gain / extra
        if best is None:
            break
        taken[best[0]] += best[1]
        left -= best[1]
    return taken


def rows_to_settle(gap: float, sd: tuple[float, float], size: tuple[int, int], z: float = 1.96) -> int | None:
    """The fewest reconstructed rows of two systems whose difference estimates then differ by z standard
    errors of the difference (None: not even all of both rows, when the gap is 0)."""
    best = None
    for n_a in range(1, size[0] + 1):
        se_a = standard_error(sd[0], n_a, size[0])
        for n_b in range(1, size[1] + 1):
            if z * math.hypot(se_a, standard_error(sd[1], n_b, size[1])) <= abs(gap) and abs(gap) > 0:
                best = n_a + n_b if best is None else min(best, n_a + n_b)
                break
    return best


def simulated_tau(records: list[dict], predicted: dict[str, float], taken: dict[str, int], draws: int = 400,
                  seed: int = 0) -> list[float]:
    """tau_b of the systems' difference estimates against their true means, each system's `taken` rows
    drawn at random (without replacement) `draws` times: what that allocation gives a cascade that
    samples as the cascade does."""
    members = grouped(records, "system")
    names = sorted(members)
    truth = [float(np.mean([r["full"] for r in members[n]])) for n in names]
    rng = np.random.default_rng(seed)
    taus = []
    for _ in range(draws):
        estimate = []
        for n in names:
            rows = members[n]
            sample = rng.choice(len(rows), size=taken[n], replace=False)
            estimate.append(float(np.mean([predicted[r["id"]] for r in rows]))
                            + float(np.mean([rows[k]["full"] - predicted[rows[k]["id"]] for k in sample])))
        taus.append(kendall_tau(estimate, truth))
    return taus


def system_reach(label: str, rows: list[dict], predicted: dict[str, float], budget_rows: int,
                 cascade_se: dict[str, float]) -> None:
    """Per pair of systems: the gap of their full-pipeline means, the standard error of its estimate under
    the oracle's allocation of the budget and under the cascade's (its first seed), and the rows of the
    two that would settle it; then the oracle's allocation and the tau it reaches (expected, simulated)."""
    members = grouped(rows, "system")
    truth = {n: float(np.mean([r["full"] for r in m])) for n, m in members.items()}
    size = {n: len(m) for n, m in members.items()}
    sd = {n: float(np.std([r["full"] - predicted[r["id"]] for r in m], ddof=1)) for n, m in members.items()}
    taken = oracle_allocation(truth, sd, size, budget_rows)
    print(f"{label}: systems' residual sd about their own mean residual (line fitted on every row): "
          + ", ".join(f"{n} {sd[n]:.4f}" for n in sorted(sd, key=lambda n: -truth[n])))
    out_of_reach = 0
    for a, b in sorted(itertools.combinations(truth, 2), key=lambda p: abs(truth[p[0]] - truth[p[1]])):
        gap = abs(truth[a] - truth[b])
        oracle_se = math.hypot(standard_error(sd[a], taken[a], size[a]), standard_error(sd[b], taken[b], size[b]))
        own_se = math.hypot(cascade_se[a], cascade_se[b])
        need = rows_to_settle(gap, (sd[a], sd[b]), (size[a], size[b]))
        beyond = need is None or need > budget_rows
        out_of_reach += beyond
        print(f"{label}: pair {a} / {b}: gap {gap:.4f}; se of the difference at {budget_rows} rows: oracle's "
              f"allocation {oracle_se:.4f} (gap {gap / oracle_se if oracle_se else math.inf:.1f} se), the cascade's "
              f"{own_se:.4f}; rows of the two to settle it at 1.96 se: "
              f"{'none suffice' if need is None else need} of {size[a] + size[b]}"
              + (" (beyond the budget)" if beyond else ""))
    names = sorted(truth)
    gaps = {(a, b): truth[a] - truth[b] for a, b in itertools.combinations(names, 2)}
    expected = discordance(gaps, sd, size, taken)
    taus = simulated_tau(rows, predicted, taken)
    print(f"{label}: {out_of_reach} of {len(gaps)} pairs need more than the budget's {budget_rows} rows to settle "
          f"alone; the oracle's allocation (" + ", ".join(f"{n} {taken[n]}/{size[n]}" for n in names)
          + f"): expected discordant pairs {expected:.2f} of {len(gaps)}, tau about {1 - 2 * expected / len(gaps):.3f}; "
          f"simulated over {len(taus)} draws: mean tau {np.mean(taus):.3f}, tau >= {TAU_GOAL} in "
          f"{np.mean(np.array(taus) >= TAU_GOAL):.3f} of them")


def top_m_recall(records: list[dict], cheap: dict[str, float]) -> list[tuple[int, float, float]]:
    """Per m: the share of images (2+ captions) whose full-pipeline best (or one tied with it) is among its m best by the
    cheap score, and what reconstructing those m of every image costs over all rows: what any
    policy that reconstructs in the cheap score's order can reach."""
    by_image = grouped(records, "image_id")
    several = [rows for rows in by_image.values() if len(rows) > 1]  # as `images`, from the grouping above
    out = []
    for m in range(1, max(len(rows) for rows in several) + 1):
        hits = [max(r["full"] for r in rows) in [r["full"] for r in sorted(rows, key=lambda r: -cheap[r["id"]])[:m]]
                for rows in several]
        cost = sum(min(m, len(rows)) for rows in by_image.values())
        out.append((m, sum(hits) / len(hits), cost / len(records)))
    return out


def compare(label: str, samples: list[dict], full_run: caprecon.Results, cheap: str, budget: float,
            goals: bool = True, seeds: int = SEEDS, **settings) -> None:
    """The cascade's decisions beside the full pipeline's (each at `seeds` shuffles of its calibration
    sample: the goal lines hold their mean), the cheap signal's own figures and the oracles', and the
    goal lines (without `goals`: the same figures at another budget, for the curve)."""
    full = {r["id"]: r.get("recon") for r in full_run.records}
    full_generations = generations(full_run)
    system_of = {s["id"]: s["system"] for s in samples}
    used, figures = 0, {"systems": [], "best-of-n": [], "best-of-n, the very caption": [], "captions": []}
    for seed in range(seeds):
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
        figures["best-of-n, the very caption"].append(
            float(np.mean(best_picks(best, {r["id"]: r["decision_score"] for r in best}, ties=False))))
        truth = system_table(rows, {r["id"]: r["full"] for r in rows})
        estimated = results["systems"].systems
        names = sorted(truth)
        figures["systems"].append(kendall_tau([float(estimated.mean[estimated.names.index(n)]) for n in names],
                                              [truth[n] for n in names]))
        if seed == 0:
            cascade_se = {n: float(estimated.se[estimated.names.index(n)]) for n in names}
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
          f"{kendall_tau([cheap_systems[n] for n in names], [truth[n] for n in names]):.3f}; best-of-N picks a best "
          f"{np.mean(best_picks(rows, cheap_score)):.3f} (the very caption "
          f"{np.mean(best_picks(rows, cheap_score, ties=False)):.3f}); its residual sd about the line fitted on "
          f"every row {fit.sigma:.4f}")
    print(f"{label}: {tied_best(rows)} of {len(same)} images have their best full score shared by 2+ captions")
    print(f"{label}: within an image: recon's sd {image_spread(rows, lambda r: r['full']):.4f}, its best ahead of "
          f"its second by {best_gap(rows):.4f} on average; the residuals' sd {image_spread(rows, residual):.4f} and "
          f"intra-image correlation {intra_image_correlation(rows, residual):.3f}; the residuals' differences "
          f"between two captions of an image: sd {sibling_difference_sd(rows, residual):.4f}, against sqrt 2 times "
          f"the residual sd about the line {2 ** 0.5 * fit.sigma:.4f} (the same if captions of an image shared "
          f"nothing) and the sum of two such sds {2 * fit.sigma:.4f} (what overlapping intervals allow for)")
    print(f"{label}: the full pipeline's best among an image's m best by the cheap score (m: share, generations): "
          + ", ".join(f"{m}: {hit:.3f} at {cost:.2f}" for m, hit, cost in top_m_recall(rows, cheap_score)))
    system_reach(label, rows, predicted, budget_rows, cascade_se)
    print(f"{label}: oracles that know recon, at {budget_rows} reconstructions: best-of-N picks the same "
          f"{oracle_best_of_n(rows, predicted, budget_rows):.3f}; captions' tau_b (largest residuals first) "
          f"{oracle_caption_tau(rows, predicted, budget_rows):.3f}")
    for name, values in figures.items():
        print(f"{label}: {name} over {seeds} seeds: " + ", ".join(f"{v:.3f}" for v in values)
              + f" (mean {np.mean(values):.3f}, min {min(values):.3f})")
    tau_systems, picks, tau_captions = (float(np.mean(figures[k])) for k in ("systems", "best-of-n", "captions"))
    if not goals:
        print(f"{label}: at budget {budget}: systems' tau {tau_systems:.3f}, best-of-N picks the same "
              f"{picks:.3f}, captions' tau {tau_captions:.3f} (means over {seeds} seeds), generations over the "
              f"full pipeline's {used / full_generations:.3f}")
        return
    line(f"{label}: Kendall tau of the cascade's order of systems vs the full pipeline's", tau_systems,
         f"goal >= {TAU_GOAL}")
    line(f"{label}: best-of-N picks the same (a caption tied with its pick counts)", picks, f"goal >= {PICKS_GOAL}")
    line(f"{label}: best-of-N picks the very caption the full pipeline picks (no goal)",
         float(np.mean(figures["best-of-n, the very caption"])))
    line(f"{label}: generations over the full pipeline's", used / full_generations, f"goal <= {SHARE_GOAL}")
    line(f"{label}: Kendall tau of the cascade's order of captions (no goal)", tau_captions)


def expert_system(ratings: list[int]) -> str:
    """The benchmark's stand-in for a captioning system: the total of the three expert ratings,
    9 to 12 together (each of those totals has under 20 captions in Flickr8k-dev)."""
    total = sum(ratings)
    return "experts 9-12" if total >= 9 else f"experts {total}"


def training_rows(expert: list[dict], train_images: set[str], crowd: bool) -> list[dict]:
    """The cheap signal's training rows: the Expert candidates of the training half's images and, with
    `crowd`, the CrowdFlower candidates of the same images (never one of the cascade's half), each
    (image, caption) once."""
    if not crowd:
        return expert
    seen = {(Path(r["image"]).name, r["caption"]) for r in expert}
    out = list(expert)
    for i, r in enumerate(json.loads(x) for x in (FLICKR / "crowdflower.jsonl").read_text().splitlines() if x.strip()):
        if r["image"] in train_images and (r["image"], r["candidate"]) not in seen:
            seen.add((r["image"], r["candidate"]))
            out.append({"id": f"crowd{i}", "image": str(FLICKR / "images" / r["image"]), "caption": r["candidate"],
                        "image_id": r["image"]})
    return out


def flickr(work: Path, budget: float, cache: str, crowd: bool = True, objective: str = "auto",
           seeds: int = SEEDS) -> None:
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
    samples["train"] = training_rows(samples["train"], train_images, crowd)
    name = f"student-{'crowd' if crowd else 'expert'}-{objective}"
    started = time.perf_counter()
    if (work / name / "manifest.json").is_file():  # kept by an earlier run with --work
        held = json.loads((work / name / "manifest.json").read_text())["report"]["held_out"]
    else:
        caprecon.score(samples["train"], ["recon"], preset="offline", cache_dir=cache, out=work / f"train-{name}",
                       progress=True)
        held = distill([work / f"train-{name}"], "recon", out=work / name, objective=objective,
                       cache_dir=cache).report["held_out"]
    print(f"flickr: cheap signal distilled ({objective}) on {len(samples['train'])} captions of "
          f"{len(train_images)} images ({'Expert and CrowdFlower candidates' if crowd else 'Expert candidates'}) "
          f"in {time.perf_counter() - started:.0f} s (its own held-out Spearman {held['spearman']:.3f})")
    started = time.perf_counter()
    full_run = caprecon.score(samples["test"], ["recon"], preset="offline", cache_dir=cache, progress=True)
    print(f"flickr: full pipeline (recon, --preset offline) on {len(samples['test'])} captions of "
          f"{len(images) - len(train_images)} other images in {time.perf_counter() - started:.0f} s")
    for share in (budget, *CURVE):
        compare("flickr", samples["test"], full_run, f"distilled:{work / name}", share, goals=share == budget,
                seeds=seeds, preset="offline", cache_dir=cache)


def tiny(work: Path, budget: float, cache: str, seeds: int = SEEDS) -> None:
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
    compare("tiny", samples, full_run, "clipscore", budget, seeds=seeds, **settings)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--budget", type=float, default=0.3)
    p.add_argument("--part", choices=("flickr", "tiny"))
    p.add_argument("--cache-dir", help="the store of both parts, kept for a rerun (default: a temporary one)")
    p.add_argument("--seeds", type=int, default=SEEDS,
                   help=f"shuffles of the calibration sample per decision and budget (default {SEEDS})")
    p.add_argument("--train", choices=("crowd", "expert"), default="crowd",
                   help="flickr: the cheap signal's training rows: the training half's Expert and CrowdFlower "
                        "candidates (default), or its Expert candidates alone (the first cascade's student)")
    p.add_argument("--objective", default="auto", choices=("auto", "reconstruction", "value", "pairs"),
                   help="flickr: the cheap signal's `caprecon distill` objective")
    p.add_argument("--work", help="a folder for the distilled head and the tiny models, kept for a rerun")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(args.work or tmp)
        work.mkdir(parents=True, exist_ok=True)
        if args.part in (None, "flickr"):
            flickr(work, args.budget, args.cache_dir or str(work / "cache-flickr"), crowd=args.train == "crowd",
                   objective=args.objective, seeds=args.seeds)
        if args.part in (None, "tiny"):
            tiny(work, args.budget, args.cache_dir or str(work / "cache-tiny"), seeds=args.seeds)


if __name__ == "__main__":
    main()
