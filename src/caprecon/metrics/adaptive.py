"""Adaptive seeds: further reconstructions only for the captions whose interval is still wide.

`--seeds MIN..MAX --target-width W` scores every caption from MIN seeds, then, round by round,
draws more seeds only for the captions whose 95 % interval (`seed_interval`) is still wider
than W, until it is at most W or the caption has MAX seeds. A caption whose reconstructions
hardly vary stops at MIN; a noisy one gets as many as its noise needs. Each round asks, per
caption still open, for the fewest seeds that would bring its interval to W at its current sd
(at least one more), so a batch needs few rounds, and a round's draws of every open caption
go to the generator in one call. Seeds are the fixed-K seeds (seed k of a caption is the same
image with either), each one stored: a later run with a smaller W or a larger MAX generates
only the seeds it adds, and a fixed `--seeds K` run reuses them too.

Rows carry the fields of `SeedAveraged` (their `_seeds` lists as long as the caption's draws)
and `seeds_drawn`, how many seeds the caption took. The interval is the fixed-K Student-t one
over the seeds drawn; stopping when it is narrow leans it slightly towards undercoverage
near W (`benchmarks/adaptive_seeds.py` measures it against a fixed K).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from caprecon.core.checks import MAX_SEEDS, check_count, check_number
from caprecon.data.images import LoadedSample
from caprecon.metrics.base import Context, Metric
from caprecon.metrics.seeds import LEVEL, SeedAveraged, seed_interval


def seeds_for_width(sd: float, seeds: int, most: int, width: float, level: float = LEVEL) -> int:
    """The fewest seeds (more than `seeds`, at most `most`) whose Student-t interval at standard
    deviation `sd` is at most `width` wide; `most` when none is."""
    from scipy.special import stdtrit

    for k in range(seeds + 1, most + 1):
        if 2 * float(stdtrit(k - 1, 0.5 + level / 2)) * sd / math.sqrt(k) <= width:
            return k
    return most


class AdaptiveSeeds(SeedAveraged):
    """`inner` scored from `seeds`..`max_seeds` reconstructions per caption, stopping once the
    caption's interval is at most `target_width` wide; see the module doc."""

    def __init__(self, inner: Metric, seeds: int, max_seeds: int, target_width: float):
        super().__init__(inner, seeds)
        check_count("--seeds (the most)", max_seeds, self.seeds, MAX_SEEDS)
        check_number("--target-width", target_width, 0, low_open=True)
        self.max_seeds, self.target_width = int(max_seeds), float(target_width)

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "seeds": f"{self.seeds}..{self.max_seeds}", "target_width": self.target_width}

    def score(self, items: Sequence[LoadedSample], ctx: Context) -> list[dict[str, Any]]:
        rows: list[list[dict[str, Any]]] = [[] for _ in items]
        recons: list[list[Any]] = [[] for _ in items]
        have, want = [0] * len(items), [self.seeds] * len(items)
        while True:
            open_ = [i for i in range(len(items)) if want[i] > have[i]]
            if not open_:
                break
            drawn = ctx.reconstruct_seeds(self.generator, self.spec, [items[i] for i in open_],
                                          [want[i] for i in open_], [have[i] for i in open_])
            for i, images in zip(open_, drawn):
                recons[i].extend(images)
            for k in range(min(have[i] for i in open_), max(want[i] for i in open_)):
                at_k = [i for i in open_ if have[i] <= k < want[i]]
                with ctx.seed(k):
                    for i, row in zip(at_k, self.inner.score([items[i] for i in at_k], ctx)):
                        rows[i].append(row)
            for i in open_:
                have[i] = want[i]
                want[i] = self._next(rows[i], have[i])
        return [{**self._combine(r, images), "seeds_drawn": len(r)} for r, images in zip(rows, recons)]

    def _next(self, rows: list[dict[str, Any]], seeds: int) -> int:
        """How many seeds the caption should have: `seeds` when its interval is narrow enough, it
        is at the cap, or its headline has no value to narrow."""
        values = [r.get(self.headline) for r in rows]
        if seeds >= self.max_seeds or not all(isinstance(v, (int, float)) and math.isfinite(v) for v in values):
            return seeds
        _, sd, ci = seed_interval(values)
        if ci is None or ci[1] - ci[0] <= self.target_width:
            return seeds
        return seeds_for_width(sd, seeds, self.max_seeds, self.target_width)
