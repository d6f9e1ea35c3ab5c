"""A cascade: score every caption with a cheap signal, reconstruct only where the decision is open.

    result = caprecon.cascade("captions.jsonl", cheap="clipscore", metric="recon",
                              decision="threshold:0.7", budget=0.3, preset="offline", out="runs/c")
    result.generations, result.full_generations, [r["decision_score"] for r in result.records]

Users score captions to decide something: keep or drop each at a threshold (`threshold:X`), the
best of an image's N captions (`best-of-n`), or an order (`rank`: with `by`, of the captioning
systems that field names, by their mean; without it, of the captions themselves). The cheap
metric (`clipscore`, `distilled:FOLDER`, any metric that needs no reconstruction) scores every row.
The full metric (`recon` by default) then runs in rounds on the rows whose decision the cheap
score leaves open:

1. a calibration sample (every `CALIBRATION_EVERY`-th row in a fixed shuffled order, and with `by`
   at least `MIN_PER_SYSTEM` rows of each system) is scored by both, and the full score is fitted
   as `a + b * cheap` by least squares; the residuals' standard deviation `sigma` is the cheap
   score's uncertainty in the full metric's units, and its leave-one-out coverage (the share of
   reconstructed rows whose residual, predicted without them, lies within `z` sds) says whether
   that sd is honest;
2. every row not yet reconstructed gets the prediction `a + b * cheap` plus its image's offset (the
   residuals split as a per-image offset and a row's own error, fitted on the reconstructed rows:
   `image_effects`; an image none of whose rows is reconstructed has offset 0), with sd from the
   row's own error and the offset's uncertainty (a reconstructed row: its full score, sd 0), and is
   *open* when the decision could change: its `z`-sd interval holds the threshold; in best-of-n,
   its difference from the image leader is within `z` sds *of that difference* (the two rows'
   variances less twice what they share: an image offset cancels in a difference; the leader is
   then open too); in a ranking of captions, its mean chance of swapping places with each other
   caption is above Phi(-z); in a ranking of systems, its system's interval overlaps another's.
   A system's mean is the difference estimator: the mean of its rows' predictions plus the mean
   residual of its reconstructed rows (a simple random sample of its rows: its next rows in the
   shuffled order), with the standard error of that sample mean from the residual sd pooled
   within systems;
3. the most open rows (the smallest margin in sds first) are reconstructed, up to this round's
   share of the budget; for systems, the share is spread over the open systems by `allocation`
   (each row where it lowers the expected number of system pairs in the wrong order most, given
   the gaps between the means and the rows each system has left). The fit is redone with them,
   and the next round starts.

It stops when no row is open or the budget (a fraction of the rows) is spent. The decision is
then taken on each row's `decision_score`: the full score where it was computed, else the
calibrated prediction plus its image's offset (with `by`, plus its system's mean residual instead,
so that a system's mean is the mean of its rows' decision scores). The run reports the generations and model calls the full
metric made and what scoring every row would have made (the same calls per reconstructed row,
times the rows).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np
from tqdm import tqdm

from caprecon.apps.cascade.estimates import (DEFAULT_Z, Calibration, Decision, SystemMeans, allocation, calibrate,
                                              image_effects, margins, system_margins, system_means)
from caprecon.core.checks import check_number
from caprecon.core.errors import ConfigError
from caprecon.core.records import is_number, write_jsonl_atomically
from caprecon.data.loaders import load_samples
from caprecon.data.samples import Sample, check_unique_ids
from caprecon.metrics.adaptive import check_scored_alone
from caprecon.metrics.base import Metric
from caprecon.run.config import RunConfig
from caprecon.run.folder import run_folder, write_manifest, write_summary
from caprecon.run.score import score

#: one row in this many (at least MIN_CALIBRATION) is reconstructed first, whatever its cheap score,
#: so the residuals are measured on rows the selection did not choose
CALIBRATION_EVERY = 20
MIN_CALIBRATION = 8
#: with `by`: rows of each system in the calibration sample, so that every system's residual mean
#: and the pooled sd within systems exist from the first round
MIN_PER_SYSTEM = 2
DEFAULT_ROUNDS = 4


@dataclass
class CascadeResults:
    """What `cascade` did: one record per row (its cheap score, full score where reconstructed, the
    `decision_score` the decision used and the decision itself), the rounds and the costs."""

    records: list[dict[str, Any]]
    decision: str
    cheap: str
    metric: str
    reconstructed: int
    rows: int
    generations: int  # reconstructions the full metric needed: made by its generator, or found in the cache
    full_generations: int  # what scoring every row with the full metric would have made
    model_calls: dict[str, int]  # the full metric's model calls by kind (generated, embedded, llm-answer, ...)
    full_model_calls: dict[str, int]
    rounds: list[dict[str, Any]] = field(default_factory=list)
    calibration: Calibration | None = None
    systems: SystemMeans | None = None  # with `by`: each system's mean, its standard error and rank
    out: Path | None = None
    summary: dict[str, Any] = field(default_factory=dict)

    def closing_lines(self) -> list[str]:
        share = self.generations / self.full_generations if self.full_generations else 0.0
        lines = [f"cascade {self.cheap} -> {self.metric}, decision {self.decision}: reconstructed "
                 f"{self.reconstructed} of {self.rows} row(s) in {len(self.rounds)} round(s)",
                 f"generations: {self.generations} ({self.model_calls.get('reused', 0)} from the cache); the full "
                 f"pipeline: {self.full_generations} ({share:.1%} used)"]
        for kind, n in self.model_calls.items():
            if kind not in ("generated", "reused"):
                lines.append(f"{kind} calls: {n}; the full pipeline: {self.full_model_calls.get(kind, 0)}")
        if self.calibration is not None:
            c = self.calibration
            coverage = "" if c.coverage is None else f", leave-one-out coverage {c.coverage:.3f}"
            lines.append(f"calibration on {c.rows} row(s): {self.metric} = {c.intercept:.4f} + {c.slope:.4f} * "
                         f"{self.cheap}, residual sd {c.sigma:.4f}{coverage}")
        if self.systems is not None:
            m = self.systems
            for s in np.argsort(m.ranks()):
                lines.append(f"  rank {m.ranks()[s]}: {m.names[s]}  mean {m.mean[s]:.4f} +- {m.se[s]:.4f} (se), "
                             f"reconstructed {m.reconstructed[s]} of {m.rows[s]}")
        return lines


def _calls(stats: dict[str, Any]) -> dict[str, int]:
    """The model calls a run made, by kind, and `reused`: the reconstructions found in the cache."""
    return {k: int(v) for k, v in stats.items() if k not in ("model_seconds", "damaged") and is_number(v)}


def cascade(samples: str | Path | Iterable[Sample | dict], *, cheap: str | Metric, decision: str,
            metric: str | Metric = "recon", budget: float = 0.3, rounds: int = DEFAULT_ROUNDS, z: float = DEFAULT_Z,
            by: str | None = None, seed: int = 0, out: str | Path | None = None, progress: bool = False,
            images_root: str | Path | None = None, max_image_bytes: int | None = None,
            annotations: str | Path | None = None, captions: str | Path | None = None,
            **settings: Any) -> CascadeResults:
    """Decide with `cheap` scores first and `metric` (the full one) only where the decision is open.

    `decision`: `best-of-n` (captions of one image compete), `rank` (every caption, or with `by`
    the systems that field names, by their mean) or `threshold:X`. `budget`: the most rows the
    full metric may score, as a fraction of all rows. `settings` are `score`'s (preset, generator,
    cache_dir, ...), shared by both metrics. `out`: a folder for scores.jsonl, summary.json and
    manifest.json. `seed`: the shuffle that draws the calibration sample and each system's rows.
    `images_root`, `max_image_bytes`, `annotations`, `captions`: as `load_samples`'.
    """
    wanted = Decision.parse(decision)
    check_number("--budget", budget, 0, 1, low_open=True)
    if rounds < 1:
        raise ConfigError(f"--rounds must be at least 1, not {rounds}")
    if cheap == metric:
        raise ConfigError(f"--cascade {cheap} is the full metric itself: give a cheaper signal (clipscore, "
                          "distilled:FOLDER)")
    check_seed_rule(settings)
    rows = load_samples(samples, images_root=images_root, annotations=annotations, captions=captions,
                        max_image_bytes=max_image_bytes)
    check_unique_ids(rows)
    if out is None:
        return _run(rows, wanted, cheap, metric, budget, rounds, z, by, seed, None, progress, settings)
    with run_folder(out, inputs=[samples] if isinstance(samples, (str, Path)) else ()) as folder:
        return _run(rows, wanted, cheap, metric, budget, rounds, z, by, seed, folder, progress, settings)


def check_seed_rule(settings: dict[str, Any]) -> None:
    """Adaptive seeds for the full metric only under Stein's rule (`check_scored_alone`): each round
    scores its own rows, and the other rules would fit the seed variance over them, so a row's full
    score would depend on the round that reconstructed it, not on the row alone as `score`'s on its input."""
    run = {k: v for k, v in settings.items() if k not in ("shard", "executor", "ray", "store")}
    cfg = RunConfig.build(preset=run.pop("preset", None), file=run.pop("config", None), **run)
    check_scored_alone(cfg.max_seeds, cfg.adaptive_rule, "a cascade",
                       "which for a cascade are the rows reconstructed in the same round")


def _run(rows: list[Sample], wanted: Decision, cheap: str, metric: str, budget: float, rounds: int, z: float,
         by: str | None, seed: int, folder: Path | None, progress: bool, settings: dict[str, Any]) -> CascadeResults:
    n = len(rows)
    systems = None
    if by is not None:
        if wanted.kind != "rank":
            raise ConfigError(f"--by {by} ranks systems: give --decision rank with it")
        missing = [r.id for r in rows if r.meta.get(by) is None]
        if missing:
            raise ConfigError(f"--by {by}: row(s) {', '.join(missing[:5])} have no {by} field")
        systems = [str(r.meta[by]) for r in rows]
    cheap_run = score(rows, [cheap], progress=progress, **settings)
    cheap_name = cheap_run.metric_names[0]
    cheap_costs = cheap_run.manifest["cache"]
    if cheap_costs.get("generated", 0) or cheap_costs.get("reused", 0):
        raise ConfigError(f"--cascade {cheap} reconstructs: a cheap signal must not (clipscore, distilled:FOLDER)")
    cheap_values = [r.get(cheap_name) for r in cheap_run.records]
    usable = [i for i, v in enumerate(cheap_values) if is_number(v) and math.isfinite(v)]
    cheap_arr = np.array([float(cheap_values[i]) for i in usable])
    groups = [rows[i].image_id or str(rows[i].image) for i in usable]
    units = [systems[i] for i in usable] if systems is not None else None

    limit = max(1, int(budget * n))
    full: dict[int, float] = {}  # position in `usable` -> full score
    full_records: dict[int, dict[str, Any]] = {}
    calls: dict[str, int] = {}
    history: list[dict[str, Any]] = []
    order = list(range(len(usable)))
    random.Random(seed).shuffle(order)
    pending = _calibration_sample(order, units, limit)
    calibration, means = None, None
    metric_name = metric if isinstance(metric, str) else metric.name
    bar = tqdm(total=limit, desc=f"cascade {metric}", unit="row", disable=not progress)
    for round_number in range(1, rounds + 1):
        if pending:
            run = score([rows[usable[i]] for i in pending], [metric], progress=False, **settings)
            metric_name = run.metric_names[0]
            for i, record in zip(pending, run.records):
                full_records[i] = {**record, "cascade_round": round_number}
                if is_number(record.get(metric_name)) and math.isfinite(record[metric_name]):
                    full[i] = float(record[metric_name])
            for kind, count in _calls(run.manifest["cache"]).items():
                calls[kind] = calls.get(kind, 0) + count
            bar.update(len(pending))
        known = sorted(full)
        calibration = calibrate(cheap_arr[known], np.array([full[i] for i in known]), z)
        left = limit - len(full_records)
        share = math.ceil(left / max(1, rounds - round_number))  # the next round's part of what is left
        if units is not None:
            means = system_means(units, _predict(cheap_arr, calibration), full)
            open_rows, still_open = _open_system_rows(means, system_margins(means), z, units, order, full_records,
                                                      share)
        else:
            value, sd, shared = _scores(cheap_arr, full, calibration, groups)
            margin = margins(wanted, value, sd, groups, shared)
            open_rows = [int(i) for i in np.argsort(margin, kind="stable")
                         if margin[i] < z and i not in full_records]
            still_open = len(open_rows)
        history.append({"round": round_number, "reconstructed": len(pending), "calibrated_on": calibration.rows,
                        "sigma": calibration.sigma, "coverage": calibration.coverage, "open": still_open})
        if not open_rows or left <= 0 or round_number == rounds:
            break
        pending = open_rows[:share]
    bar.close()
    if means is not None:
        value, sd = _system_scores(cheap_arr, full, calibration, means, units)
    else:
        value, sd, _ = _scores(cheap_arr, full, calibration, groups)
    records = _records(rows, cheap_run.records, cheap_name, usable, full, full_records, value, sd, wanted, groups,
                       means, units)
    done = len(full_records)
    full_calls = {kind: round(count * n / done) if done else 0 for kind, count in calls.items()}
    needed = calls.get("generated", 0) + calls.get("reused", 0)  # made now or found in the cache
    results = CascadeResults(records, str(wanted) if by is None else f"rank --by {by}", cheap_name, metric_name, done,
                             n, needed, round(needed * n / done) if done else 0, calls, full_calls, history,
                             calibration, means, folder)
    results.summary = _summary(results, budget, z, seed)
    if folder is not None:
        write_jsonl_atomically(folder / "scores.jsonl", records, allow_nan=True)
        write_summary(folder, results.summary)
        write_manifest(folder, {"status": "complete", "command": "cascade", "samples": n,
                                "metric_names": [cheap_name, metric_name, "decision_score"],
                                "cascade": results.summary["cascade"], "settings": settings})
    return results


def _calibration_sample(order: list[int], units: Sequence[str] | None, limit: int) -> list[int]:
    """The first round's rows, within the budget: the first of the shuffled order (one in
    CALIBRATION_EVERY, at least MIN_CALIBRATION); with systems, the first MIN_PER_SYSTEM of each
    system's rows in that order come before them (so a tight budget still gives each system a
    residual), and each system's reconstructed rows stay a prefix of its own shuffled rows: a
    simple random sample of them."""
    first = order[: max(MIN_CALIBRATION, len(order) // CALIBRATION_EVERY)]
    if units is None:
        return first[:limit]
    taken: dict[str, int] = {}
    per_system = []
    for i in order:
        if taken.get(units[i], 0) < MIN_PER_SYSTEM:
            per_system.append(i)
            taken[units[i]] = taken.get(units[i], 0) + 1
    chosen = set(per_system)
    return (per_system + [i for i in first if i not in chosen])[:limit]


def _open_system_rows(means: SystemMeans, margin: np.ndarray, z: float, units: Sequence[str], order: list[int],
                      done: dict[int, Any], rows: int) -> tuple[list[int], int]:
    """Up to `rows` rows to reconstruct next for a ranking of systems, and how many rows the open
    systems have not reconstructed: among the systems whose interval overlaps another's, as many rows
    of each as `allocation` gives it (by the gaps between the means and the rows each system has
    left), each system's next rows not yet reconstructed in the shuffled order, so that its
    reconstructed rows stay a simple random sample of it."""
    open_systems = [int(s) for s in np.argsort(margin, kind="stable") if margin[s] < z]
    queues = {s: [i for i in order if units[i] == means.names[s] and i not in done] for s in open_systems}
    still_open = sum(len(q) for q in queues.values())
    return [queues[s].pop(0) for s in allocation(means, open_systems, rows) if queues[s]], still_open


def _predict(cheap: np.ndarray, calibration: Calibration) -> np.ndarray:
    return calibration.predict(cheap) if calibration.slope else np.full(len(cheap), calibration.intercept)


def _scores(cheap: np.ndarray, full: dict[int, float], calibration: Calibration,
            groups: Sequence[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each row's decision score and its sd, and the variance it shares with its image's other
    unreconstructed rows: the full score where known (sd 0, nothing shared); else the calibrated
    prediction plus its image's offset as its reconstructed siblings' residuals estimate it
    (`image_effects`), with sd^2 the row's own error's variance plus that offset's."""
    value = _predict(cheap, calibration)
    effects = image_effects(groups, {i: v - value[i] for i, v in full.items()}, calibration.sigma)
    shared = np.array([effects.shared(g) for g in groups])
    value += np.array([effects.shift(g) for g in groups])
    sd = np.sqrt(effects.within + shared)
    for i, v in full.items():
        value[i], sd[i], shared[i] = v, 0.0, 0.0
    return value, sd, shared


def _system_scores(cheap: np.ndarray, full: dict[int, float], calibration: Calibration, means: SystemMeans,
                   units: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """With systems: a row not reconstructed has the prediction plus its system's mean residual, so
    that the mean of a system's decision scores is its difference estimate; sd the pooled one."""
    value = _predict(cheap, calibration)
    index = {name: s for s, name in enumerate(means.names)}
    value += np.array([means.residual_mean[index[u]] for u in units])
    sd = np.full(len(cheap), means.sigma)
    for i, v in full.items():
        value[i], sd[i] = v, 0.0
    return value, sd


def _records(rows, cheap_records, cheap_name, usable, full, full_records, value, sd, wanted, groups, means, units):
    """One record per input row, in input order: the cheap run's record with the full score, the
    decision score and its sd, whether it was reconstructed and what was decided (with systems:
    the system's rank, mean and standard error)."""
    decided: dict[int, Any] = {}
    key = {"threshold": "keep", "best-of-n": "best", "rank": "rank"}[wanted.kind]
    if wanted.kind == "threshold":
        decided = {i: bool(value[i] >= wanted.threshold) for i in range(len(usable))}
    elif wanted.kind == "best-of-n":
        best: dict[str, int] = {}
        for i, g in enumerate(groups):
            if g not in best or value[i] > value[best[g]]:
                best[g] = i
        decided = {i: best[g] == i for i, g in enumerate(groups)}
    elif means is not None:
        key = "system_rank"
        index = {name: s for s, name in enumerate(means.names)}
        ranks = means.ranks()
        decided = {i: int(ranks[index[u]]) for i, u in enumerate(units)}
    else:
        ranks = np.argsort(np.argsort(-value, kind="stable"), kind="stable") + 1
        decided = {i: int(ranks[i]) for i in range(len(usable))}
    position = {row: k for k, row in enumerate(usable)}
    records = []
    for row, record in enumerate(cheap_records):
        record = dict(record)
        k = position.get(row)
        if k is not None:
            full_record = full_records.get(k)
            record.update({"reconstructed": full_record is not None, "decision_score": float(value[k]),
                           "decision_sd": float(sd[k]), key: decided[k]})
            if means is not None:
                s = means.names.index(units[k])
                record.update({"system_mean": float(means.mean[s]), "system_se": float(means.se[s])})
            if full_record is not None:
                record.update({f: v for f, v in full_record.items() if f not in record})
                if k not in full and full_record.get("error"):
                    record["error"] = f"full metric: {full_record['error']} (decided on the cheap score)"
        records.append(record)
    return records


def _summary(results: CascadeResults, budget: float, z: float, seed: int) -> dict[str, Any]:
    c, m = results.calibration, results.systems
    share = results.generations / results.full_generations if results.full_generations else None
    return {"samples": results.rows, "cascade": {
        "cheap": results.cheap, "metric": results.metric, "decision": results.decision, "budget": budget, "z": z,
        "seed": seed,
        "reconstructed": results.reconstructed, "generations": results.generations,
        "full_generations": results.full_generations, "generation_share": share,
        "model_calls": results.model_calls, "full_model_calls": results.full_model_calls,
        "rounds": results.rounds,
        "calibration": None if c is None else {"intercept": c.intercept, "slope": c.slope, "sigma": c.sigma,
                                               "rows": c.rows, "coverage": c.coverage},
        "systems": None if m is None else {
            name: {"rank": int(m.ranks()[s]), "mean": float(m.mean[s]), "se": float(m.se[s]),
                   "rows": int(m.rows[s]), "reconstructed": int(m.reconstructed[s])}
            for s, name in enumerate(m.names)},
    }}
