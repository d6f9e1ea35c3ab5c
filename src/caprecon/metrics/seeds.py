"""A score over K noise seeds: the mean, its spread and a 95 % interval, per caption.

A reconstruction metric scores one draw of the generator's noise. `SeedAveraged` wraps
such a metric (anything with a `generator` and a `spec`: recon, clip-image, turing,
vqascore on Î, halluc's coverage) and scores each caption from K seeds:

    <field>          mean over the K seeds (the metric's value, summarised like any)
    <field>_seeds    the K per-seed values, seed 0 first
    <field>_sd       their sample standard deviation (n - 1)
    <field>_ci       [low, high], the 95 % Student-t interval of the mean:
                     mean ± t(0.975, K - 1) · sd / √K

for the headline and its companions (suffixes, not "/": a "/" field is a question category);
where some seeds give such a field no number, it has none (None, without `_seeds`, `_sd` and
`_ci`): the mean of the others is not the K-seed mean, and seed 0's value would pass for it.
Every other fractional number of the row is its mean over the seeds, and the rest (counts,
paths, answers) is seed 0's. `reconstructions` lists the K images and
`seeds` their seeds. The K images of a batch are generated in one generator call first,
so a caption's seeds share a pipeline batch, and each is stored like any reconstruction:
raising K later generates only the new seeds.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from caprecon.core.scaling import rescale, unit_scale
from caprecon.data.images import LoadedSample
from caprecon.metrics.base import Context, Metric

LEVEL = 0.95


def uses_reconstruction(metric: Metric) -> bool:
    """Whether the metric scores a reconstruction, and so depends on the noise seed."""
    return getattr(metric, "generator", None) is not None and getattr(metric, "spec", None) is not None


def seed_interval(values: Sequence[float], level: float = LEVEL) -> tuple[float, float | None, list[float] | None]:
    """(mean, sample sd, [low, high]) of values (a caption's per-seed scores; the report's rows
    of a group): the Student-t interval of the mean. One value has no spread: sd and interval
    are None. Computed at unit scale (`caprecon.core.scaling`), so scores near 1e308 give
    their mean, not inf."""
    from scipy.special import stdtrit  # the Student-t quantile, without scipy.stats' second of imports

    n = len(values)
    values, exponent = unit_scale(values)
    mean = math.fsum(values) / n
    if n < 2:
        return rescale(mean, exponent), None, None
    sd = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (n - 1))
    half = float(stdtrit(n - 1, 0.5 + level / 2)) * sd / math.sqrt(n)
    return (rescale(mean, exponent), rescale(sd, exponent),
            [rescale(mean - half, exponent), rescale(mean + half, exponent)])


class SeedAveraged(Metric):
    """`inner` scored from `seeds` reconstructions of each caption; see the module doc."""

    def __init__(self, inner: Metric, seeds: int):
        if not uses_reconstruction(inner):
            raise ValueError(f"{inner.name} scores no reconstruction: its value does not depend on the seed")
        if int(seeds) < 2:
            raise ValueError(f"seeds must be at least 2 to average over, not {seeds}")
        self.inner, self.seeds = inner, int(seeds)
        self.name = inner.name
        self.primary = inner.headline
        self.companions, self.columns = tuple(inner.companions), inner.columns
        self.needs_source_image = inner.needs_source_image
        self.generator, self.spec = inner.generator, inner.spec

    def describe(self) -> dict[str, Any]:
        return {**self.inner.describe(), "seeds": self.seeds, "interval": f"{LEVEL:.0%} Student-t over seeds"}

    def seed_fields(self) -> list[str]:
        return [self.headline, *self.companions]

    def score(self, items: Sequence[LoadedSample], ctx: Context) -> list[dict[str, Any]]:
        recons = ctx.reconstruct_seeds(self.generator, self.spec, items, self.seeds)
        passes = []
        for k in range(self.seeds):
            with ctx.seed(k):
                passes.append(self.inner.score(items, ctx))
        return [self._combine(list(rows), row_recons) for rows, row_recons in zip(zip(*passes), recons)]

    def _combine(self, rows: list[dict[str, Any]], recons: list[Any]) -> dict[str, Any]:
        out = dict(rows[0])
        for key in rows[0]:
            values = [r.get(key) for r in rows]
            if all(_number(v) for v in values) and any(isinstance(v, float) for v in values):
                out[key] = math.fsum(values) / len(values)
        for name in self.seed_fields():
            values = [r.get(name) for r in rows]
            if not any(_number(v) for v in values):
                continue  # the metric left this field out (no value for this row)
            if not all(_number(v) for v in values):  # some seeds gave no number: the K-seed mean is unknown,
                out[name] = None  # and seed 0's value must not pass for it
                continue
            mean, sd, ci = seed_interval(values)
            out.update({name: mean, f"{name}_seeds": values, f"{name}_sd": sd, f"{name}_ci": ci})
        out["reconstructions"] = [r.location for r in recons]
        out["seeds"] = [r.seed for r in recons]
        return out


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def variance_split(values: Sequence[Sequence[float]]) -> tuple[float, float] | tuple[None, None]:
    """(generator, seed) variance components of a generators x seeds table, one-way random
    effects: the seed's is the mean within-generator variance (MS within); the generator's is
    (MS between - MS within) / K, at least 0. (None, None) without two generators and two seeds."""
    g, k = len(values), min(len(v) for v in values)
    if g < 2 or k < 2:
        return None, None
    means = [math.fsum(v[:k]) / k for v in values]
    grand = math.fsum(means) / g
    within = math.fsum(math.fsum((x - m) ** 2 for x in v[:k]) for v, m in zip(values, means)) / (g * (k - 1))
    between = k * math.fsum((m - grand) ** 2 for m in means) / (g - 1)
    return max(0.0, (between - within) / k), within


class GeneratorEnsemble(Metric):
    """One reconstruction metric under several generators (each member the same metric built
    with another generator, seed-averaged or not): per caption the mean over generators and
    seeds, and how much of the spread is the generator's and how much the seed's.

        <field>                    mean over generators and seeds
        <field>_seeds              per seed, the mean over generators (what compare and
                                   stability resample)
        <field>_by_generator       {label: [per-seed values]}
        <field>_var_generator, <field>_var_seed   the variance split (`variance_split`)
        <field>_sd, <field>_ci     sd of the generator means and their 95 % Student-t interval

    A field some generator gives no number (at some seed) has no ensemble value: None, with its
    `_seeds`, `_sd` and `_ci`.
    """

    def __init__(self, members: Sequence[Metric], labels: Sequence[str]):
        if len(members) < 2 or len(members) != len(labels):
            raise ValueError("an ensemble needs two or more generators, one label each")
        if len(set(labels)) != len(labels):
            raise ValueError(f"the ensemble's generators need distinct labels, not {list(labels)}")
        self.members, self.labels = list(members), list(labels)
        first = self.members[0]
        self.name, self.primary = first.name, first.headline
        self.companions, self.columns = tuple(first.companions), first.columns
        self.needs_source_image = first.needs_source_image

    def describe(self) -> dict[str, Any]:
        return {**self.members[0].describe(), "ensemble": dict(zip(self.labels, (m.describe() for m in self.members)))}

    def score(self, items: Sequence[LoadedSample], ctx: Context) -> list[dict[str, Any]]:
        per_member = [m.score(items, ctx) for m in self.members]
        fields = self.members[0].seed_fields() if isinstance(self.members[0], SeedAveraged) \
            else [self.headline, *self.companions]
        out = []
        for rows in zip(*per_member):
            row = dict(rows[0])
            for name in fields:
                tables = [r.get(f"{name}_seeds", [r.get(name)]) for r in rows]
                if not all(_number(v) for table in tables for v in table):
                    if any(_number(r.get(name)) for r in rows):  # a generator gave no number: no ensemble
                        row.update({name: None, f"{name}_seeds": None, f"{name}_sd": None, f"{name}_ci": None})
                    continue  # value (the first generator's must not pass for it)
                k = min(len(t) for t in tables)
                tables = [list(t[:k]) for t in tables]
                means = [math.fsum(t) / k for t in tables]
                _, sd, ci = seed_interval(means)
                var_generator, var_seed = variance_split(tables)
                row.update({name: math.fsum(means) / len(means),
                            f"{name}_seeds": [math.fsum(t[s] for t in tables) / len(tables) for s in range(k)],
                            f"{name}_by_generator": dict(zip(self.labels, tables)),
                            f"{name}_var_generator": var_generator, f"{name}_var_seed": var_seed,
                            f"{name}_sd": sd, f"{name}_ci": ci})
            row["reconstructions"] = [p for r in rows for p in r.get("reconstructions", [r.get("reconstruction")])]
            out.append(row)
        return out


class HumanCeiling(Metric):
    """A reconstruction metric with the human ceiling beside each score: the row's references
    (`refs`) are reconstructed with the caption's seeds (same image id and candidate) and
    scored the same way, so a score reads against what people's captions of that image reach.

        <headline>_refs        the references' scores
        <headline>_refs_mean   their mean, and _refs_best their best
        <headline>_ratio       caption / references' mean (None when that is 0)

    A row without references has none of these."""

    def __init__(self, inner: Metric):
        self.inner = inner
        self.name, self.primary = inner.name, inner.headline
        self.companions, self.columns = tuple(inner.companions), inner.columns
        self.needs_source_image = inner.needs_source_image
        self.generator, self.spec = getattr(inner, "generator", None), getattr(inner, "spec", None)

    def describe(self) -> dict[str, Any]:
        return {**self.inner.describe(), "ceiling": "references reconstructed with the caption's seeds"}

    def score(self, items: Sequence[LoadedSample], ctx: Context) -> list[dict[str, Any]]:
        rows = self.inner.score(items, ctx)
        refs = [(row, item.with_caption(ref)) for row, item in enumerate(items) for ref in item.sample.refs
                if ref.strip()]
        if not refs:
            return rows
        name = self.headline
        scored: dict[int, list[float]] = {}
        for (row, _), ref_row in zip(refs, self.inner.score([item for _, item in refs], ctx)):
            if _number(ref_row.get(name)):
                scored.setdefault(row, []).append(float(ref_row[name]))
        for row, values in scored.items():
            mean = math.fsum(values) / len(values)
            caption = rows[row].get(name)
            rows[row].update({f"{name}_refs": values, f"{name}_refs_mean": mean, f"{name}_refs_best": max(values),
                              f"{name}_ratio": caption / mean if _number(caption) and mean else None})
        return rows
