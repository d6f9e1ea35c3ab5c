"""Adaptive seeds: further reconstructions only for the captions whose noise asks for them.

`--seeds MIN..MAX --target-width W` is a staged procedure (Stein's two-stage one with the
variance moderated over the run's captions, and by default up to three more stages, taken only
while some caption still needs them):

1. every caption is scored from MIN seeds; their sample variance s_i^2 (MIN - 1 degrees of
   freedom) is the caption's first-stage variance;
2. from the draws so far, the run's rule (`--adaptive-rule`, default mixture; its fits are
   `metrics/variance_priors.py`'s) gives the caption's interval half-width at one seed, h_i,
   from its own variance and what the other captions say about it (written here for the first
   stage, df = MIN - 1; at a later decision s_i^2 is the variance of all the caption's n_i draws
   so far, df = n_i - 1): stein its own t(0.975, MIN - 1) s_i; pooled, moderated and mixture
   borrow the other captions' spread (the module there says how each is fitted); its need is
   N_i = ceil((2 h_i / W)^2) seeds, at least the n_i it has and at most MAX;
3. at each decision every caption still open draws, all of them in one generator call:
   - a caption whose need is no more than its draws (N_i <= n_i: its interval is at most W wide
     already, or it has MAX) stops there and draws nothing;
   - at the last decision the procedure allows, the `stages` - 1-th (`--adaptive-stages S`, the
     most rounds of generation, default 5), it draws all of its need and stops; so it does at a
     decision whose prior borrows nothing (fewer than two captions to fit it on: a run of one
     caption), which is Stein's two-stage rule: its own variance looked at again after draws its
     first ones chose would be biased low (0.916 coverage over 2,000 one-caption runs at sd 0.05,
     W = 0.08, where Stein's two stages cover 0.9525);
   - at the others it draws a share of its need, ceil(share (2 h_i / W)^2) seeds in n_i..MAX:
     STAGE_SHARE (0.35) at the first decision, LATER_SHARE (0.6) at the later ones;
   then the rule's prior is fitted again over every caption's draws so far (each caption's
   variance at its own df) and step 2 repeats for the captions still open. The decisions end
   once none is: S is a cap on rounds, which a run whose captions are all met earlier does not
   pay. With S = 2 this is Stein's rule; with S = 3 the former three-stage rule (whose second
   decision drew every caption's whole need) but for a caption already met at the first decision,
   which stopped there instead of a second look under the refitted prior;
4. the caption's interval is mean_N ± h_i / sqrt(N_i): the mean of all its N_i draws, h_i the
   half-width of the decision it stopped at. That width is at most W unless the caption hit MAX.

Why stages: from MIN = 3 draws (2 degrees of freedom) a caption's sd is known to within a factor
of several, so a 95 % interval given those draws must pay for the noisier possibilities: the
best two-stage rule, knowing the spread of the captions' sds, needs 1.16-1.21 times the seeds of
an allocation that knows each sd, where the sds are spread log-uniformly over 20x and W asks
most captions for 5-16 seeds. A second look after a share of the need (more degrees of freedom,
a prior refitted on more draws) brings that bound to 1.06-1.10 in three stages. A decision that
draws a caption's whole need still pays, with every seed of it, for what its draws so far leave
uncertain; one that draws a share and looks again pays only for what the larger sample leaves,
and a caption stops as soon as its posterior says its interval is W wide. Deciding after every
draw is the limit (1.03-1.05); at most five stages the bound is 1.03-1.08 with the same shares
(`benchmarks/adaptive_seeds.py` prints each beside each width). Each stage is one more round of
generation: one more generator call per batch of captions (for the open ones only), and one
more pass over the input before scoring, since each decision's prior is fitted over the whole
input; the manifest records the decisions the run made and the captions open at each.

Why this covers by construction: N_i, and the decision a caption stops at, depend on the draws
up to its last decision only through their location-free part (the variances), and the mean of
normal draws is independent of that part, so given it the mean of the N_i draws is normal around the true value with variance
sigma_i^2 / N_i, and (mean - true) sqrt(N_i) has the distribution h_i is the quantile of: for
stein whatever the caption's noise (two stages only: its own variance after a stage its first
draws chose is biased low where those draws agreed by chance), for pooled when every caption's
noise is alike, for moderated and mixture when the captions' variances follow the fitted
distribution (which includes both: d0 large is pooled, d0 = 0 is stein). h_i is the quantile of
the caption's posterior given all the draws its last decision saw, and a posterior does not
depend on why the caption drew as many as it did (the stopping rule's factor of the likelihood
holds no parameter), so a caption that stopped early because its first draws agreed is covered
as often as the others: that is what moderating buys over stein (as long as the fitted prior is
the captions' spread).

Stein's own variance covers 95 % over all captions, but not among those that stopped at MIN, mostly captions whose first draws agreed by chance: 0.54 of them with 1,000
captions of sd 0.05 at W = 0.08 (the rule this replaced, which stopped once a caption's own
interval was narrower than W, covered 0.63 of them). The moderated variance borrows the other
captions' spread, so its coverage holds at every N: 0.96 there (`benchmarks/adaptive_seeds.py`
measures the rules and their generations against the best allocation and the best two-stage,
staged and fully sequential ones; docs/rank.md says where each falls short). A caption's interval then depends on the other captions of the run: `score()` fits the
distribution over the whole input (`fit`, once per decision) before scoring the first batch, so it does not
depend on batches (with `--shard`, over the shard's captions); an `AdaptiveSeeds` scored
without that fit takes it over the captions of each call.

Seeds are the fixed-K seeds (seed k of a caption is the same image with either), each one
stored: a later run with a smaller W or a larger MAX generates only the seeds it adds, and a
fixed `--seeds K` run reuses them too. Rows carry the fields of `SeedAveraged` (their
`_seeds` lists as long as the caption's draws; `_sd` the sd of all draws, `_ci` the
staged interval above, for the headline and each companion) and `seeds_drawn`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from caprecon.core.checks import MAX_SEEDS, check_count, check_number
from caprecon.core.errors import ConfigError
from caprecon.data.images import LoadedSample
from caprecon.metrics.base import Context, Metric
from caprecon.metrics.seeds import SeedAveraged, seed_interval
from caprecon.metrics.variance_priors import (DEFAULT_RULE, RULES, IntegratedPrior, MixturePrior, VariancePrior,
                                              fit_prior)

#: the most rounds of generation per caption (`--adaptive-stages`), chosen by `benchmarks/adaptive_seeds.py`
DEFAULT_STAGES = 5
#: the share of a caption's estimated need the first decision draws where a later one follows, and the share each
#: later decision but the last draws, chosen by the benchmark
STAGE_SHARE, LATER_SHARE = 0.35, 0.6
INTERVALS = {  # "staged": the variance of a caption's draws up to the last decision (the first stage's, in two)
    "mixture": "95% staged (Stein) interval over seeds, the variance so far moderated over the run's captions "
               "by a mixture of 1-3 scaled inverse chi-square distributions (maximum likelihood, BIC; one "
               "component integrated over its posterior, not plugged in): the quantile of the mixture of "
               "Student-t posteriors",
    "moderated": "95% staged (Stein) Student-t over seeds, the variance so far moderated over the run's "
                 "captions (scaled inverse chi-square fitted by moments of log s^2, Smyth 2004)",
    "pooled": "95% staged (Stein) Student-t over seeds, the variance so far pooled over the run's captions",
    "stein": "95% two-stage (Stein) Student-t over seeds, each caption's own first-stage variance",
}


def seeds_for_width(half: float, least: int, most: int, width: float, share: float = 1.0) -> int:
    """Stein's second-stage size: the fewest seeds N in least..most with 2 half / sqrt(N) at most
    `width`, where `half` is the interval's half-width at one seed (t(level, df) sd for one
    Student-t); `most` when none is. With `share` below 1, an intermediate stage's size: that
    share of the need, rounded up, in least..most."""
    need = share * (2 * half / width) ** 2
    return min(most, max(least, math.ceil(need)))



def stage_share(decision: int) -> float:
    """The share of its need an open caption draws at `decision` (0: the first) when it is not the last."""
    return STAGE_SHARE if decision == 0 else LATER_SHARE


class AdaptiveSeeds(SeedAveraged):
    """`inner` scored from `seeds`..`max_seeds` reconstructions per caption by the staged
    procedure of the module doc, aiming at intervals `target_width` wide, in `stages` rounds of
    generation (None: the rule's default, `default_stages`)."""

    def __init__(self, inner: Metric, seeds: int, max_seeds: int, target_width: float, rule: str = DEFAULT_RULE,
                 stages: int | None = None):
        super().__init__(inner, seeds)
        check_count("--seeds (the most)", max_seeds, self.seeds, MAX_SEEDS)
        check_number("--target-width", target_width, 0, low_open=True)
        self.stages = check_stages(rule, stages)
        self.max_seeds, self.target_width, self.rule = int(max_seeds), float(target_width), rule
        #: what the run's captions say about a caption's variance, per seed field, at each decision (after
        #: stage 1, 2, ...: `fit`); where the run made fewer than the procedure asks, the rest are fitted on each
        #: call's captions
        self.priors: list[dict[str, VariancePrior | MixturePrior | IntegratedPrior]] = []
        #: the run's captions still open at each of its passes before scoring (`fit`; all of them at the first)
        self.open_by_decision: list[int] = []

    def describe(self) -> dict[str, Any]:
        fitted = {"variance_prior": {f: p.to_json() for f, p in self.priors[-1].items()},
                  "variance_prior_by_stage": [{f: p.to_json() for f, p in fit.items()} for fit in self.priors],
                  "decisions": len(self.priors), "open_by_decision": self.open_by_decision,
                  } if (self.priors and not self.deciding) or len(self.priors) == self.stages - 1 else {}
        return {**super().describe(), "seeds": f"{self.seeds}..{self.max_seeds}", "target_width": self.target_width,
                "adaptive_rule": self.rule, "stages": self.stages, "stage_share": STAGE_SHARE,
                "later_share": LATER_SHARE, "interval": INTERVALS[self.rule], **fitted}

    def draw(self, items: Sequence[LoadedSample], ctx: Context, decisions: int
             ) -> tuple[list[list[dict[str, Any]]], list[list[Any]], list[dict[str, float]], list[bool]]:
        """Each item's rows (one per seed drawn) and reconstructions after the first stage and up to
        `decisions` decisions, each followed by its draws (the module doc's steps 2-3); each item's
        half-widths at one seed per field from its last decision ({} before any); and whether it is
        still open (a later decision would look at it again). Stops early once none is open."""
        rows, recons = self.first_stage(items, ctx)
        priors, halves, open_ = list(self.priors), [{} for _ in rows], [True] * len(rows)
        for decision in range(decisions):
            if not any(open_):
                break
            sds = [self.drawn_sds(r) for r in rows]
            if decision == len(priors):  # not fitted over the run's captions: this call's captions are the run
                priors.append(self.fit_priors([{"seeds": len(r), "sds": sd} for r, sd in zip(rows, sds)]))
            last = decision == self.stages - 2
            want = [len(r) for r in rows]
            for i, (r, caption) in enumerate(zip(rows, sds)):
                if not open_[i]:
                    continue
                prior = priors[decision][self.headline]
                if self.headline in caption:
                    head = prior.half_width(caption[self.headline], len(r) - 1)
                    need = seeds_for_width(head, len(r), self.max_seeds, self.target_width)
                else:  # the headline not finite at every seed: nothing to draw on
                    head, need = None, len(r)
                # a caption whose interval is W wide already stops; the last decision draws all of its
                # need and stops; so does a decision on the caption's own variance alone (fewer than two
                # captions to borrow from: `borrows_nothing`), since a later look at its own variance, after
                # draws its first ones chose, would be biased low (Stein's rule is two-stage); the others
                # draw their stage's share
                done = last or head is None or need <= len(r) or borrows_nothing(prior)
                want[i] = need if done else seeds_for_width(head, len(r), self.max_seeds, self.target_width,
                                                           stage_share(decision))
                if done:  # the interval's half-widths, every field's, are the caption's last decision's: the
                    open_[i] = False  # headline's is `head`, the others' are computed here, at the same df
                    halves[i] = {name: head if name == self.headline
                                 else priors[decision][name].half_width(sd, len(r) - 1) for name, sd in caption.items()}
            self._draw_up_to(items, ctx, rows, recons, want)
        return rows, recons, halves, open_

    def _draw_up_to(self, items: Sequence[LoadedSample], ctx: Context, rows: list[list[dict[str, Any]]],
                    recons: list[list[Any]], want: Sequence[int]) -> None:
        """Draws each item's seeds from those it has up to `want`, in one generator call, and scores them."""
        open_ = [i for i, n in enumerate(want) if n > len(rows[i])]
        if not open_:
            return
        had = {i: len(rows[i]) for i in open_}
        drawn = ctx.reconstruct_seeds(self.generator, self.spec, [items[i] for i in open_],
                                      [want[i] for i in open_], [had[i] for i in open_])
        for i, images in zip(open_, drawn):
            recons[i].extend(images)
        for k in range(min(had.values()), max(want[i] for i in open_)):
            at_k = [i for i in open_ if had[i] <= k < want[i]]
            with ctx.seed(k):
                for i, row in zip(at_k, self.inner.score([items[i] for i in at_k], ctx)):
                    rows[i].append(row)

    def first_stage(self, items: Sequence[LoadedSample], ctx: Context) -> tuple[list[list[dict[str, Any]]], list]:
        """Each item's rows of its first `seeds` seeds, and their reconstructions."""
        recons = ctx.reconstruct_seeds(self.generator, self.spec, items, self.seeds)
        passes = []
        for k in range(self.seeds):
            with ctx.seed(k):
                passes.append(self.inner.score(items, ctx))
        return [list(rows) for rows in zip(*passes)], [list(r) for r in recons]

    def drawn_sds(self, rows: Sequence[dict[str, Any]]) -> dict[str, float]:
        """A caption's sd over all its draws so far of each seed field that has a finite value at every seed."""
        out = {}
        for name in self.seed_fields():
            values = [r.get(name) for r in rows]
            if all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in values):
                out[name] = seed_interval(values)[1]
        return out

    def fit_priors(self, seen: Sequence[dict[str, Any]]) -> dict[str, VariancePrior | MixturePrior | IntegratedPrior]:
        """Per seed field, the prior from every caption's sds so far (`{"seeds": n, "sds": drawn_sds}`,
        n - 1 degrees of freedom each)."""
        return {name: fit_prior([c["sds"][name] for c in seen if name in c["sds"]],
                                [c["seeds"] - 1 for c in seen if name in c["sds"]], self.rule)
                for name in self.seed_fields()}

    def fit(self, seen: Sequence[dict[str, Any]]) -> None:
        """The run's prior for the next decision, from every caption's draws so far (`StageDraws`), where
        a caption is still open; else the run's decisions are over (`deciding` False)."""
        self.open_by_decision.append(sum(bool(c["open"]) for c in seen))
        if self.deciding:
            self.priors.append(self.fit_priors(seen))

    @property
    def deciding(self) -> bool:
        """Whether the run's last pass (`fit`) found a caption open: another decision is to be made."""
        return not self.open_by_decision or self.open_by_decision[-1] > 0

    def score(self, items: Sequence[LoadedSample], ctx: Context) -> list[dict[str, Any]]:
        rows, recons, halves, _ = self.draw(items, ctx, self.stages - 1)
        out = []
        for caption_rows, images, plan in zip(rows, recons, halves):
            row = {**self._combine(caption_rows, images), "seeds_drawn": len(caption_rows)}
            for name, half in plan.items():
                if row.get(f"{name}_ci") is not None:  # every draw gave a value: the staged interval
                    row[f"{name}_ci"] = two_stage_interval(row[name], half, len(caption_rows))
            out.append(row)
        return out


def borrows_nothing(prior: VariancePrior | MixturePrior | IntegratedPrior) -> bool:
    """Whether a fitted prior leaves each caption its own variance (`stein`, or a borrowing rule fitted on
    fewer than two captions: `fit_prior` then returns its `OWN`)."""
    return isinstance(prior, VariancePrior) and not prior.pooled and prior.df == 0


def check_stages(rule: str, stages: int | None) -> int:
    """The stage count of `rule` (None: its default), checked: stein's own variance is two-stage only."""
    if rule not in RULES:
        raise ValueError(f"--adaptive-rule must be one of {', '.join(RULES)}, not {rule!r}")
    if stages is None:
        return default_stages(rule)
    check_count("--adaptive-stages", stages, 2, MAX_SEEDS)
    if rule == "stein" and stages != 2:
        raise ConfigError(f"--adaptive-stages {stages} needs a rule that borrows from the other captions (mixture, "
                         "moderated, pooled): a caption's own variance after a later stage is biased low where "
                         "its first draws, which chose that stage's seeds, agreed by chance; stein is two-stage")
    return int(stages)


def check_scored_alone(max_seeds: int | None, rule: str, scorer: str, why: str) -> None:
    """Refuses adaptive seeds under a rule that borrows each caption's variance from the other captions
    (mixture, moderated, pooled) where `scorer` (a reward, a cascade) scores captions in sets that are not
    the run's whole input (`why` says which): `score` fits the variance over its whole input, such a
    scorer only over the set at hand, so a caption's seed count, and its value, would change with the
    captions scored beside it. Stein's rule takes the caption's own variance and passes, as do fixed K."""
    if max_seeds is not None and rule != "stein":
        raise ConfigError(f"adaptive seeds (up to {max_seeds}) in {scorer} need adaptive_rule='stein' "
                          f"(--adaptive-rule stein), not {rule!r}: that rule borrows each caption's seed variance "
                          f"from the other captions scored with it, {why}, so a caption's value would change "
                          f"with the captions beside it; or give a fixed number of seeds (seeds=K)")


def default_stages(rule: str) -> int:
    """Two for stein (its own variance cannot be updated without bias), `DEFAULT_STAGES` otherwise."""
    return 2 if rule == "stein" else DEFAULT_STAGES


def two_stage_interval(mean: float, half: float, seeds: int) -> list[float]:
    """[low, high]: mean ± half / sqrt(seeds), `half` the last decision's half-width at one seed."""
    half = half / math.sqrt(seeds)
    return [mean - half, mean + half]


class StageDraws(Metric):
    """An `AdaptiveSeeds`' draws up to its decision `decision` (0: the first stage alone), for the
    run's fit of that decision's prior before scoring: each row's seeds drawn and sds so far under `key`."""

    def __init__(self, adaptive: AdaptiveSeeds, key: str, decision: int):
        self.adaptive, self.key, self.name, self.decision = adaptive, key, key, decision
        self.needs_source_image = adaptive.needs_source_image

    def score(self, items: Sequence[LoadedSample], ctx: Context) -> list[dict[str, Any]]:
        rows, _, _, open_ = self.adaptive.draw(items, ctx, self.decision)
        return [{self.key: {"seeds": len(r), "sds": self.adaptive.drawn_sds(r), "open": still}}
                for r, still in zip(rows, open_)]


def adaptive_parts(metric: Any) -> list[AdaptiveSeeds]:
    """The `AdaptiveSeeds` inside a built metric (under an ensemble, a ceiling or a fusion)."""
    if isinstance(metric, AdaptiveSeeds):
        return [metric]
    found: list[AdaptiveSeeds] = []
    components = getattr(metric, "components", None)
    for part in [getattr(metric, "inner", None), *getattr(metric, "members", ()),
                 *(components.values() if isinstance(components, dict) else ())]:
        if part is not None:
            found += adaptive_parts(part)
    return found
