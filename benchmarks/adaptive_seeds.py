"""Adaptive seeds against the best allocation and a fixed K = 8: generations and coverage side by side.

Every side scores the captions over several replicates (other base seeds, so other draws) and
counts its generations, the share of its 95 % intervals that cover the true value (of all
captions, and of those that drew the fewest seeds: where a rule that stops on lucky first
draws fails), and Kendall tau between the captions' means and their true values. Adaptive
runs `--seeds 3..16 --target-width W` under its default rule (mixture, in its default stages)
at several W, and once at one W in two and in three stages and under each other rule (moderated, pooled,
stein) to show why they are not the default. Beside each goal side, where its generations differ from the
best allocation's (below), caption by caption: the captions whose best is MIN that drew more (what only an
estimate of the sd asks for), and the other captions' seeds over or under their best.

The best allocation at width W knows each caption's true seed sd sigma_i and gives it the
fewest seeds in 3..16 whose known-sd 95 % interval is at most W wide:
    n_i = min(16, max(3, ceil((2 x 1.96 x sigma_i / W)^2)))
(its intervals cover 0.95 exactly). No rule that must estimate sigma_i from the draws can
need fewer for the same width and coverage, so adaptive generations / best is the price
of not knowing the noise: goal <= 1.10. Against fixed K: at W = fixed K's own median
interval width (the same precision), adaptive must not draw more than fixed K where the
noise is alike (goal <= 1.00).

Bounds beside it say what part of that price no rule that sees the draws first can avoid:

- the best two-stage allocation knows the spread of the captions' sds (their true sds, each
  caption's equally likely) but not which caption has which: from a caption's MIN first draws
  it takes the posterior of its sd and gives it the fewest seeds in MIN..MAX whose interval
  covers 0.95 given those draws (what `--adaptive-rule mixture` does with a fitted spread);
  its expected generations by quadrature over the first-stage variance. Where it is above
  1.10 x the best allocation, no covering two-stage rule can meet that goal.
- the best staged allocation (the rule's most stages, `--stages`) does the same in the rule's
  steps: at each decision the posterior after all draws so far, a caption whose need is no more
  than its draws stopping, the others drawing `STAGE_SHARE` of the need at the first decision,
  `LATER_SHARE` at the later ones and all of it at the last; and the best fully sequential one
  decides after every draw, stopping once its need is no more than its draws. Both by simulation
  (each caption 8 times, a fixed seed).
- where the noise is alike, a rule that knows it is alike but must learn the one shared sd
  from the captions' draws so far (their degrees of freedom summed, in the default stages)
  needs about t(0.975, that)^2 / 1.96^2 times the seeds of one that knows the sd, more where W
  puts the best allocation just under a whole number of seeds (an estimate a hair high asks
  for one more): its generations by simulation, against the best allocation and fixed K.
  On the tiny pipeline, whose sds differ somewhat, the rule knows each caption's sd up to that
  shared factor.

1. A seeded stand-in generator (`tests/noisy_standin.py`) whose captions have known true
   scores (uniform in [0.6, 0.8]) and known seed noise, in three profiles: `mixed` (sd 0.004
   for nine captions in ten, 0.04 for the tenth: specific and vague captions), `log-uniform`
   (sd log-uniform in [0.002, 0.04]) and `alike` (sd 0.02 for all).
2. The tiny pipeline (random-weight SD + DINOv2, recon) on the demo's captions, each caption's
   "true" value and sd its mean and sd over 128 seeds of another base seed (so its best
   allocation is an estimate), 24 replicates; W in multiples of the width fixed K expects, and
   fixed K's median interval width. Its noise is alike (sd 0.005-0.014). Why 128 seeds and 24
   replicates: a T-seed sd is off by about 1 / sqrt(2 (T - 1)) of itself, so a caption's best
   count, which goes with sd^2, by twice that: 25 % at T = 32 (`--seed 2` took a median sd 22 %
   low from 32 seeds, and so a W 22 % narrower than 128 seeds give), 13 % at 128, against a goal
   10 % above the best; and 12 captions are few, so even 24 replicates leave the ratio an error of
   several hundredths (`--tiny-replicates 96` reads closer): over 96 replicates, four groups of 24 read
   0.945-1.127 of the best allocation at 1.5 x the width fixed K expects with `--seed 0`,
   1.060-1.186 with `--seed 2` (docs/rank.md). A true value that is
   itself a mean of T seeds misses the interval more often than the real one: a caption's mean
   of N draws differs from it by sigma^2 (1/N + 1/T), so an exact 95 % interval (known sigma)
   covers it 2 Phi(1.96 / sqrt(1 + N / T)) - 1 of the time, 0.943 for N = 8 and T = 128 (0.920
   at T = 32); the coverage lines print that beside each side's own.

   `--tiny-pictures N` scores N random pictures instead: values close together, noise alike.

Usage: python benchmarks/adaptive_seeds.py [--captions 400] [--replicates 3] [--tiny-replicates 24]
    [--tiny-seeds 128] [--tiny-pictures N] [--part stand-in|tiny] [--profile mixed|log-uniform|alike]
    [--stages 5] [--seed 0]
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the tiny models and stand-ins
import offline_env  # noqa: E402, F401  (the offline environment, before torch, transformers or caprecon)

import numpy as np  # noqa: E402

import caprecon  # noqa: E402
from caprecon.reconstruct.reconstructor import ReconstructionSpec  # noqa: E402
from caprecon.stats.correlation import kendall_tau  # noqa: E402
from caprecon.metrics.adaptive import DEFAULT_STAGES as STAGES, LATER_SHARE, STAGE_SHARE, stage_share  # noqa: E402
from noisy_standin import NoisyGenerator, NoisyScore  # noqa: E402

FIXED = 8
LOW, HIGH = 3, 16
ADAPTIVE = f"{LOW}..{HIGH}"
WIDTHS = (0.01, 0.02, 0.03, 0.05)
TINY_WIDTHS = (1, 1.5, 2, 3, 4)  # multiples of fixed K's median interval width
COVERAGE_GOAL, BEST_GOAL, FIXED_GOAL = 0.94, 1.10, 1.00
Z = 1.959964  # the normal 0.975 quantile: the best allocation's interval knows sigma
DEMO = Path(caprecon.__file__).parent / "data" / "demo"

PROFILES = {
    "mixed": "seed sd 0.004 for 90 % of captions, 0.04 for 10 %",
    "log-uniform": "seed sd log-uniform 0.002-0.04",
    "alike": "seed sd 0.02 for every caption",
}


def noise(profile: str, rng: np.random.Generator, n: int) -> np.ndarray:
    if profile == "log-uniform":
        return np.exp(rng.uniform(math.log(0.002), math.log(0.04), n))
    if profile == "alike":
        return np.full(n, 0.02)
    return np.where(rng.uniform(size=n) < 0.9, 0.004, 0.04)


def best_counts(sds, width: float) -> np.ndarray:
    """Each caption's seeds under the allocation that knows its sd (module doc)."""
    return np.clip(np.ceil((2 * Z * np.asarray(sds, float) / width) ** 2), LOW, HIGH).astype(int)


def best_allocation(sds, width: float) -> int:
    """The generations of the allocation that knows each caption's sd (module doc), per replicate."""
    return int(best_counts(sds, width).sum())


def where_extra_goes(drawn, sds, width: float) -> str:
    """Where a side's generations differ from the best allocation's, caption by caption (`drawn`: each
    replicate's captions in turn): those whose best is MIN (the draws that only an estimate of the sd
    asks for) and the others."""
    best = np.tile(best_counts(sds, width), len(drawn) // len(sds))
    drawn = np.asarray(drawn)
    at_min = best == LOW
    return (f"captions whose best is {LOW}: {int((drawn[at_min] > LOW).sum())} of {int(at_min.sum())} drew more, "
            f"{int((drawn[at_min] - LOW).sum()):+d} seeds; the others {int((drawn[~at_min] - best[~at_min]).sum()):+d} "
            f"seeds ({int((drawn[~at_min] < best[~at_min]).sum())} of {int((~at_min).sum())} under their best)")


def sd_atoms(sds, atoms: int = 64):
    """The captions' true sds as a prior over a grid: each distinct sd with its share of the captions
    when there are at most `atoms`, else `atoms` equally likely quantiles. Returns (grid, prior)."""
    sds = np.asarray(sds, float)
    grid = np.unique(sds) if len(np.unique(sds)) <= atoms else np.quantile(sds, (np.arange(atoms) + 0.5) / atoms)
    prior = np.array([np.sum(np.isclose(sds, g)) for g in grid], float) if len(grid) < atoms else np.ones(len(grid))
    return grid, prior / prior.sum()


def best_two_stage(sds, width: float, atoms: int = 64, points: int = 64) -> float:
    """The expected generations of the best two-stage allocation (module doc), per replicate: the
    captions' true sds as the prior (`sd_atoms`), the first-stage variance sigma^2 chi2(MIN - 1) /
    (MIN - 1) at `points` quantiles per caption, and each one's half-width from its posterior
    (`posterior_half`)."""
    from scipy import stats

    df = LOW - 1
    sds = np.asarray(sds, float)
    grid, prior = sd_atoms(sds, atoms)
    first = (sds[:, None] ** 2 * stats.chi2.ppf((np.arange(points) + 0.5) / points, df)[None, :] / df).ravel()
    half = posterior_half(first, np.full(len(first), LOW), grid, prior)
    seeds = np.clip(np.ceil((2 * half / width) ** 2), LOW, HIGH)
    return float(seeds.reshape(len(sds), points).mean(axis=1).sum())


def staged_draws(sds, replicates: int, seed: int = 0):
    """Simulated draws for the staged bounds: each caption `replicates` times, `HIGH` normal draws of
    its sd each; returns (true sds, draws) as rows."""
    truth = np.tile(np.asarray(sds, float), replicates)
    return truth, np.random.default_rng(seed).standard_normal((len(truth), HIGH)) * truth[:, None]


def variance_of_first(draws, seeds):
    """Each row's sample variance of its first `seeds[row]` draws."""
    rows = np.arange(len(draws))
    total, squares = np.cumsum(draws, 1)[rows, seeds - 1], np.cumsum(draws**2, 1)[rows, seeds - 1]
    return (squares - total * total / seeds) / (seeds - 1)


def posterior_half(variances, seeds, grid, prior):
    """The half-width at one seed whose known-sd normal interval covers 0.95 given each row's draws:
    the posterior over the `grid` of sds (weights `prior`) from its sample variance, by bisection."""
    from scipy import stats

    df = (seeds - 1)[:, None].astype(float)
    log_post = (stats.chi2.logpdf(df * variances[:, None] / grid[None, :] ** 2, df) - 2 * np.log(grid)[None, :]
                + np.log(prior)[None, :])
    post = np.exp(log_post - log_post.max(axis=1, keepdims=True))
    post /= post.sum(axis=1, keepdims=True)
    low, high = np.zeros(len(variances)), np.full(len(variances), 10 * Z * grid.max())
    for _ in range(60):  # bisection on the half-width whose coverage given the draws is 0.95
        mid = (low + high) / 2
        short = (post * (2 * stats.norm.cdf(mid[:, None] / grid[None, :]) - 1)).sum(axis=1) < 0.95
        low, high = np.where(short, mid, low), np.where(short, high, mid)
    return high


def best_staged(sds, width: float, stages: int | None, replicates: int = 8, atoms: int = 64) -> float:
    """The generations per replicate of the best staged allocation (module doc) by simulation: the
    captions' true sds as equally likely atoms of the prior (at most `atoms`, by quantile); at each
    decision a caption's posterior over them from all its draws so far, and the staged rule's steps
    (`metrics/adaptive.py`): the stage's share of its need (`stage_share`), all of it at the last
    decision, and a caption whose need is no more than its draws stops.
    `stages` None: fully sequential, a decision after every draw, stopping once the caption's need is
    no more than its draws."""
    grid, prior = sd_atoms(sds, atoms)
    _, draws = staged_draws(sds, replicates)
    seeds = np.full(len(draws), LOW)
    open_ = np.ones(len(draws), bool)
    if stages is None:
        while open_.any():
            need = np.ceil((2 * posterior_half(variance_of_first(draws, seeds), seeds, grid, prior) / width) ** 2)
            open_ &= (need > seeds) & (seeds < HIGH)
            seeds = seeds + open_
        return float(seeds.sum() / replicates)
    for decision in range(stages - 1):
        raw = (2 * posterior_half(variance_of_first(draws, seeds), seeds, grid, prior) / width) ** 2
        need = np.clip(np.ceil(raw), seeds, HIGH).astype(int)
        open_ &= need > seeds
        share = need if decision == stages - 2 else np.clip(np.ceil(stage_share(decision) * raw), seeds, HIGH)
        seeds = np.where(open_, share, seeds).astype(int)
    return float(seeds.sum() / replicates)


def shared_scale_staged(sds, width: float, stages: int, replicates: int = 64) -> float:
    """The generations per replicate, by simulation, of a staged rule that knows each caption's sd up to
    one factor shared by all and learns it from every caption's draws so far (their degrees of freedom
    summed, t intervals): where the noise is alike, the pooled rule that knows it is alike."""
    from scipy.special import stdtrit

    relative = np.asarray(sds, float)
    truth, draws = staged_draws(relative, replicates, seed=1)
    seeds, group = np.full(len(draws), LOW), np.repeat(np.arange(replicates), len(relative))
    open_ = np.ones(len(draws), bool)
    for decision in range(stages - 1):  # the staged rule's steps, as in best_staged
        df = np.bincount(group, seeds - 1)
        factor = np.sqrt(np.bincount(group, (seeds - 1) * variance_of_first(draws, seeds) / truth**2) / df)
        raw = (2 * stdtrit(df, 0.975)[group] * factor[group] * truth / width) ** 2
        need = np.clip(np.ceil(raw), seeds, HIGH).astype(int)
        open_ &= need > seeds
        share = need if decision == stages - 2 else np.clip(np.ceil(stage_share(decision) * raw), seeds, HIGH)
        seeds = np.where(open_, share, seeds).astype(int)
    return float(seeds.sum() / replicates)


def side(run, truth: list[float], metric: str, settings: dict, replicates: int, truth_seeds: int = 0) -> dict:
    """One side over `replicates` (`run(settings, rep)` -> (generations, records)): totals. With
    `truth_seeds`, the true values are means over that many seeds: also what an exact 95 % interval
    would cover of them."""
    out = {"gens": 0, "covered": [], "drawn": [], "taus": []}
    for rep in range(replicates):
        generations, records = run(settings, rep)
        out["gens"] += generations
        out["covered"] += [lo <= v <= hi for r, v in zip(records, truth) for lo, hi in [r[f"{metric}_ci"]]]
        out["drawn"] += [r.get("seeds_drawn", settings["seeds"]) for r in records]
        out["taus"].append(kendall_tau([r[metric] for r in records], truth))
        out.setdefault("widths", []).extend(hi - lo for r in records for lo, hi in [r[f"{metric}_ci"]])
    covered, drawn = np.array(out["covered"]), np.array(out["drawn"])
    fewest = drawn == drawn.min()
    if truth_seeds:  # an exact interval's coverage of a truth that is a truth_seeds-seed mean (module doc)
        from scipy.stats import norm

        exact = 2 * norm.cdf(Z / np.sqrt(1 + drawn / truth_seeds)) - 1
        out.update(exact=exact.mean(), exact_fewest=exact[fewest].mean())
    out.update(coverage=covered.mean(), fewest=covered[fewest].mean(), at=int(drawn.min()),
               n_fewest=int(fewest.sum()), n=len(covered), tau=statistics.mean(out["taus"]))
    return out


def compare(label: str, run, truth: list[float], sds, metric: str, widths, replicates: int, alike: bool,
            truth_seeds: int = 0) -> None:
    """Fixed K, adaptive (mixture, its default stages) at each width and at one width the two-stage
    mixture and the other rules, with the goal lines and the bounds beside them (`truth_seeds`: the
    true values are means over that many seeds; `side`)."""
    fixed = side(run, truth, metric, {"seeds": FIXED}, replicates, truth_seeds)
    own_width = statistics.median(fixed["widths"])
    widths = sorted({*widths, own_width})
    sides = [(f"adaptive W={w:.4f}", w, {}) for w in widths]
    other = widths[len(widths) // 2]
    sides += [(f"adaptive W={other:.4f} {n} stages", other, {"adaptive_stages": n}) for n in (2, 3) if n != STAGES]
    sides += [(f"adaptive W={other:.4f} {rule}", other, {"adaptive_rule": rule}) for rule in ("moderated", "pooled", "stein")]
    print(f"  {'side':34s} {'gens':>7s} {'cover':>6s} {'fewest (k, n)':>19s} {'tau':>6s} {'/best':>6s} {'/fixed':>7s}"
          f" {'/2-stage':>8s} {f'/{STAGES}-stage':>8s}")
    print(f"  {f'fixed K = {FIXED}':34s} {fixed['gens']:7d} {fixed['coverage']:6.3f} "
          f"{fixed['fewest']:6.3f} ({fixed['at']:2d}, {fixed['n_fewest']:5d}) {fixed['tau']:6.3f}")
    results, bounds = [], {}
    for name, width, options in sides:
        stages = {} if "adaptive_rule" in options else {"adaptive_stages": STAGES}  # stein: two stages alone
        got = side(run, truth, metric, {"seeds": ADAPTIVE, "target_width": width, **stages, **options}, replicates,
                   truth_seeds)
        if width not in bounds:  # per replicate: best allocation, best two-stage, best STAGES-stage, fully sequential
            bounds[width] = (best_allocation(sds, width), best_two_stage(sds, width), best_staged(sds, width, STAGES),
                             best_staged(sds, width, None))
        best, two_stage, staged, sequential = (b * replicates for b in bounds[width])
        results.append((name, width, options, got, best, two_stage, staged, sequential))
        print(f"  {name:34s} {got['gens']:7d} {got['coverage']:6.3f} {got['fewest']:6.3f} ({got['at']:2d}, "
              f"{got['n_fewest']:5d}) {got['tau']:6.3f} {got['gens'] / best:6.3f} {got['gens'] / fixed['gens']:7.3f}"
              f" {got['gens'] / two_stage:8.3f} {got['gens'] / staged:8.3f}   best allocation {best}, best two-stage "
              f"{two_stage:.0f}, best {STAGES}-stage {staged:.0f}, fully sequential {sequential:.0f}")
    print(f"{label}: fixed K's median interval width {own_width:.4f}; adaptive: --adaptive-rule mixture, "
          f"at most {STAGES} stages (shares {STAGE_SHARE}, then {LATER_SHARE})")
    for name, width, options, got, best, two_stage, staged, sequential in results:
        if options:
            continue
        beside = (f"   (an exact 95 % interval would read {got['exact']:.3f}, fixed K's {fixed['exact']:.3f}: the true "
                  f"values are {truth_seeds}-seed means; fixed K reads {fixed['coverage']:.3f})" if truth_seeds else "")
        print(f"{label} {name} coverage, all intervals          {got['coverage']:.3f}  goal >= {COVERAGE_GOAL}{beside}")
        print(f"{label} {name} coverage, fewest draws ({got['at']:2d})     {got['fewest']:.3f}  goal >= {COVERAGE_GOAL}"
              + (f"   (exact: {got['exact_fewest']:.3f})" if truth_seeds else ""))
        print(f"{label} {name} generations / best allocation  {got['gens'] / best:.3f}  goal <= {BEST_GOAL}"
              f"   (bounds: the best two-stage needs {two_stage / best:.3f}, the best {STAGES}-stage "
              f"{staged / best:.3f}, the best fully sequential {sequential / best:.3f})")
        print(f"{label} {name} generations / best {STAGES}-stage   {got['gens'] / staged:.3f}  goal <= {BEST_GOAL}")
        print(f"{label} {name}   (against the best allocation, {where_extra_goes(got['drawn'], sds, width)})")
        if alike:
            shared = shared_scale_staged(sds, width, STAGES) * replicates
            print(f"{label} {name}   (bound where the noise is alike: learning the shared sd from {len(truth)} "
                  f"captions' draws in {STAGES} stages needs {shared / best:.3f} of the best allocation, "
                  f"{shared / fixed['gens']:.3f} of fixed K)")
        if width == own_width and alike:
            print(f"{label} {name} generations / fixed K (alike noise)  {got['gens'] / fixed['gens']:.3f}  "
                  f"goal <= {FIXED_GOAL}")


def stand_in(args, profile: str) -> None:
    rng = np.random.default_rng(args.seed)
    true = rng.uniform(0.6, 0.8, args.captions)
    sds = noise(profile, rng, args.captions)
    truth = {f"caption {i}": (float(t), float(s)) for i, (t, s) in enumerate(zip(true, sds))}
    rows = [{"id": f"c{i}", "caption": c} for i, c in enumerate(truth)]

    def run(settings, rep):
        generator = NoisyGenerator(truth)
        # a metric object keeps its own spec: the replicate's seed goes there, not to score()
        spec = ReconstructionSpec(size=(16, 16), seed=100 * args.seed + rep)
        records = caprecon.score(rows, [NoisyScore(generator, spec)], batch_size=64, no_cache=True, **settings).records
        return generator.calls, records

    label = f"stand-in ({profile})"
    print(f"{label}: {args.captions} captions x {args.replicates} replicates, true scores uniform 0.6-0.8, "
          f"{PROFILES[profile]}")
    compare(label, run, list(true), sds, "noisy", WIDTHS, args.replicates, alike=profile == "alike")


def tiny(args, work: Path) -> None:
    import tiny_models
    from scale_models import Counting
    from caprecon.models.generator import DiffusersGenerator

    sd = tiny_models.build_tiny_sd(work / "sd")
    dinov2 = str(tiny_models.build_tiny_dinov2(work / "dinov2"))
    common = {"embedder": dinov2, "max_side": 32, "batch_size": 16}
    if args.tiny_pictures:
        from bench_common import write_samples

        samples, _ = write_samples(work / "pictures", args.tiny_pictures)
        what = f"{args.tiny_pictures} random pictures' captions"
    else:
        samples, what = DEMO / "captions.jsonl", "the demo's captions"
    caches = iter(range(10**6))

    def generate(settings, seed):
        generator = Counting(DiffusersGenerator(sd, steps=1, batch_size=16, device="cpu"))
        records = caprecon.score(samples, ["recon"], generator=generator, cache_dir=str(work / f"c{next(caches)}"),
                                 seed=seed, **common, **settings).records
        return generator.calls, records

    def run(settings, rep):
        return generate(settings, 100 * args.seed + rep)

    # the "true" value and sd: the mean and sd over many seeds of a base seed no replicate uses
    _, reference = generate({"seeds": args.tiny_seeds}, 1000 + args.seed)
    truth = [r["recon"] for r in reference]
    sds = [r["recon_sd"] for r in reference]
    from scipy.special import stdtrit

    width = 2 * float(stdtrit(FIXED - 1, 0.975)) * statistics.median(sds) / math.sqrt(FIXED)
    print(f"tiny pipeline (SD + DINOv2, random weights, 1 step, 32 px), recon on {what} ({len(truth)}) x "
          f"{args.tiny_replicates} replicates; 'true' = mean over {args.tiny_seeds} seeds of another base seed; "
          f"seed sd {min(sds):.4f}-{max(sds):.4f}; W = {', '.join(map(str, TINY_WIDTHS))} x fixed K's expected "
          f"interval width {width:.4f}")
    compare("tiny", run, truth, sds, "recon", [m * width for m in TINY_WIDTHS], args.tiny_replicates, alike=True,
            truth_seeds=args.tiny_seeds)


def main() -> None:
    global STAGES  # --stages: the sides' and the bounds' stage count
    parser = argparse.ArgumentParser()
    parser.add_argument("--captions", type=int, default=400)
    parser.add_argument("--replicates", type=int, default=3)
    parser.add_argument("--tiny-replicates", type=int, default=24)
    parser.add_argument("--tiny-seeds", type=int, default=128,
                        help="seeds of the tiny pipeline's true values and sds (the best allocation's estimate)")
    parser.add_argument("--tiny-pictures", type=int, default=0,
                        help="score this many random pictures on the tiny pipeline instead of the demo's captions")
    parser.add_argument("--part", choices=["stand-in", "tiny"], help="run this part alone (default: both)")
    parser.add_argument("--profile", choices=list(PROFILES), help="the stand-in's profile alone (default: each)")
    parser.add_argument("--stages", type=int, default=STAGES,
                        help="adaptive seeds' most stages for the default rule's sides and the staged bounds "
                             f"(default {STAGES}, the rule's)")
    parser.add_argument("--seed", type=int, default=0,
                        help="the simulation's seed: the stand-in's true values and sds, and the replicates' base "
                             "seeds (100 x seed + replicate)")
    args = parser.parse_args()
    STAGES = args.stages
    with tempfile.TemporaryDirectory() as tmp:
        for profile in ([args.profile] if args.profile else PROFILES) if args.part != "tiny" else ():
            stand_in(args, profile)
        if args.part != "stand-in":
            tiny(args, Path(tmp))


if __name__ == "__main__":
    main()
