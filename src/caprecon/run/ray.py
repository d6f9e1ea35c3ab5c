"""The Ray executor: the same plan as `run_local`, on Ray Data, across GPUs and machines.

The plan is a chain of stages, each a pool of Ray actors (`ActorPoolStrategy`) with its own
worker count, GPU share and batch size; batches stream from one stage to the next:

    reconstruct  (the generator of every metric that rebuilds the image; only when one does)
    <metric>     (one stage per metric, in the order given: recon, turing, ...)

A stage given `with=EARLIER` (`--stage recon:with=reconstruct`) has no pool of its own: it
runs inside EARLIER's actors, right after it, on the same batch (one process less per
worker, no hand-over between processes; its models share that stage's GPU).

Each actor unpickles its own copy of the stage's models (backends load weights on first
use, so what travels is a path and options, not weights) and opens the run's store itself:
results land in the same store as the local executor's, and a metric stage finds the
reconstruction stage's images there, so it never calls the generator. A metric stage scores
with the local executor's `MetricRunner`, so row errors, OOM halving and run-stopping
failures mean the same on both executors, and per-sample scores are identical.

Retries: an exception a stage raises (a flaky remote judge, a worker that lost its GPU) is
retried by Ray up to `retries` times on a live actor (`actor_task_retry_on_errors`), and a
dead actor is restarted (`max_restarts`); a run-stopping error (missing model, ...) is not
retried but stops the run with the local executor's `RunError`. Finished rows are appended
to `scores.jsonl` as they arrive, so a stopped or interrupted run resumes like a local one.
"""

from __future__ import annotations

import json
import logging
import pickle
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence


from caprecon.core.digests import keep_memo_in, memo_folder, memo_scoped
from caprecon.core.records import json_text
from caprecon.core.errors import ConfigError, MetricContractError
from caprecon.metrics.base import Context, Metric
from caprecon.metrics.recon import ReconScore
from caprecon.data.images import open_image
from caprecon.data.samples import Sample, SampleError
from caprecon.store.index import Store
from caprecon.run.failures import FATAL, RunError, explain_failure, fail_row
from caprecon.run.local import MetricRunner, RunRows
from caprecon.run.records import base_record

log = logging.getLogger(__name__)

RECONSTRUCT = "reconstruct"
_UNOPENED = "_unopened"  # set on a row whose sample could not be opened, so later stages skip it
_STOP = "_stop"  # a stage's run-stopping error, carried back to the driver rather than retried


@dataclass
class StageOptions:
    """One stage's actor pool: how many actors, the GPU share each holds, rows per batch."""

    workers: int = 1
    gpus: float = 0.0
    cpus: float = 1.0
    batch_size: int | None = None  # None: the run's --batch-size
    #: run inside the actors of this earlier stage (`with=reconstruct`): no pool of its own, its
    #: models load beside that stage's, and its batches never leave the process
    with_: str | None = None


def parse_stage_options(specs: Sequence[str] | None) -> dict[str, StageOptions]:
    """`--stage NAME:workers=2,gpus=0.5,batch_size=4` (repeatable) as options by stage name;
    `--stage recon:with=reconstruct` runs a stage inside an earlier stage's actors."""
    out: dict[str, StageOptions] = {}
    for spec in specs or []:
        name, _, rest = spec.partition(":")
        if not name or not rest:
            raise ConfigError(f"--stage {spec!r}: expected NAME:KEY=VALUE,... e.g. reconstruct:workers=2,gpus=1")
        options = StageOptions()
        for pair in rest.split(","):
            key, _, value = pair.partition("=")
            key = key.strip().replace("-", "_")
            if key == "with" and value.strip():
                options.with_ = value.strip()
                continue
            if key not in ("workers", "gpus", "cpus", "batch_size") or not value:
                raise ConfigError(f"--stage {spec!r}: unknown or empty {key!r}; use workers, gpus, cpus, batch_size "
                                  f"or with")
            try:
                number = float(value) if key in ("gpus", "cpus") else int(value)
            except ValueError:
                raise ConfigError(f"--stage {spec!r}: {key} must be a number, not {value!r}") from None
            if number < 0 or (key in ("workers", "batch_size") and number < 1):
                raise ConfigError(f"--stage {spec!r}: {key}={value} is out of range")
            setattr(options, key, number)
        if options.with_ and (options.workers, options.gpus, options.cpus) != (1, 0.0, 1.0):
            raise ConfigError(f"--stage {spec!r}: a stage run with={options.with_} uses that stage's actors; "
                              f"give workers, gpus and cpus to {options.with_}")
        out[name.strip()] = options
    return out


def default_stages(metrics: Sequence[Metric], stages: dict[str, StageOptions], *,
                   reconstructing: bool) -> dict[str, StageOptions]:
    """The stages as `--stage` gave them, and each embedding metric (recon, clip-image) it does
    not name run inside the reconstruct actors (`with=reconstruct`).

    Its embedder is small beside a generator: inside the reconstruct actor it runs on that
    actor's GPU and its batches never leave the process, where a pool of its own is another
    process per worker, on the CPU unless given GPUs. benchmarks/executors.py measured it scaling
    better in every run (2 workers over 1, whole runs: 1.55-1.66 against 1.31-1.47). Naming the
    metric (`--stage recon:workers=2,gpus=0.25`) gives it a pool of its own; judges keep theirs."""
    out = dict(stages)
    if reconstructing:
        for metric in metrics:
            if isinstance(metric, ReconScore) and metric.name not in out:
                out[metric.name] = StageOptions(with_=RECONSTRUCT)
    return out


def store_recipe(store: Store) -> tuple:
    """How a worker opens the driver's store: (root, read_only, recipe of the store below)."""
    return (str(store.root), store.read_only, store_recipe(store.below) if store.below is not None else None)


def open_recipe(recipe: tuple) -> Store:
    root, read_only, below = recipe
    return Store(root, read_only=read_only, below=open_recipe(below) if below else None)


def reconstruction_plan(metrics: Sequence[Metric]) -> list[tuple[Any, Any, int]]:
    """(generator, spec, seeds) of what the metrics rebuild, each pair once with the most seeds
    asked of it; a metric wrapping others (over seeds, an ensemble of generators, the human
    ceiling, a fused metric's components) is looked into, so a reconstruct stage makes every
    seed of every generator."""
    plan: dict[tuple[int, Any], list] = {}

    def visit(metric: Any) -> None:
        generator, spec = getattr(metric, "generator", None), getattr(metric, "spec", None)
        if generator is not None and spec is not None:
            seeds = getattr(metric, "seeds", 1)
            entry = plan.setdefault((id(generator), spec), [generator, spec, 1])
            entry[2] = max(entry[2], seeds if isinstance(seeds, int) else 1)
        for part in [*getattr(metric, "members", ()), getattr(metric, "inner", None),
                     *getattr(metric, "components", {}).values()]:
            if part is not None:
                visit(part)

    for metric in metrics:
        visit(metric)
    return [tuple(entry) for entry in plan.values()]


def _decode(batch: dict[str, Any]) -> tuple[list[Sample], list[dict[str, Any]]]:
    return [pickle.loads(b) for b in batch["sample"]], [json.loads(r) for r in batch["record"]]


def _encode(batch: dict[str, Any], records: list[dict[str, Any]], stats: dict[str, float]) -> dict[str, Any]:
    """The batch for the next stage; `stats` (this stage's cache counts for the batch) ride on
    its first row, and add up with those earlier stages put there."""
    carried = [json.loads(t) if t else {} for t in batch["stats"]]
    for key, value in stats.items():
        carried[0][key] = carried[0].get(key, 0) + value
    return {"position": batch["position"], "row": batch["row"], "sample": batch["sample"],
            "record": [json_text(r, allow_nan=False, default=str) for r in records],
            "stats": [json.dumps(c) if c else "" for c in carried]}


class _Counting:
    """What a stage's context computed since the last batch (generated, embedded, seconds...)."""

    def __init__(self, ctx: Context):
        self.ctx, self.before = ctx, ctx.stats()

    def delta(self) -> dict[str, float]:
        now = self.ctx.stats()
        out = {k: v - self.before.get(k, 0) for k, v in now.items() if v != self.before.get(k, 0)}
        self.before = now
        return out


def _opened(samples: list[Sample], records: list[dict[str, Any]], row_numbers: list[int], caption_only: bool):
    """The batch's opened samples and their indices; a row that cannot be opened fails once."""
    items, kept = [], []
    for i, (sample, record) in enumerate(zip(samples, records)):
        if record.get(_UNOPENED) or record.get(_STOP):
            continue
        try:
            items.append(open_image(sample, caption_only=caption_only))
            kept.append(i)
        except SampleError as exc:
            fail_row(record, f"row {row_numbers[i]} (id {sample.id}): {exc}", exc.reason)
            record[_UNOPENED] = True
    return items, kept


class ReconstructStage:
    """Fills the store with the reconstructions the metrics will need; rows pass through."""

    def __init__(self, plan: list, recipe: tuple, caption_only: bool, memo: str | None):
        self.memo = memo  # the driver's memo of file digests: its run's cache folder, or none
        self.ctx = Context(open_recipe(recipe))
        self.plan, self.caption_only = plan, caption_only
        self.counting = _Counting(self.ctx)

    @memo_scoped
    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        keep_memo_in(self.memo)  # for this batch alone: a worker may serve more than one run
        samples, records = _decode(batch)
        items, _ = _opened(samples, records, list(batch["row"]), self.caption_only)
        if items:
            try:
                for generator, spec, seeds in self.plan:
                    self.ctx.reconstruct_seeds(generator, spec, items, seeds)
            except FATAL as exc:  # the configuration is wrong: retrying cannot help
                for record in records:
                    record[_STOP] = f"{RECONSTRUCT}: {explain_failure(exc)}"
            # any other exception propagates, and Ray retries the batch
        return _encode(batch, records, self.counting.delta())


class MetricStage:
    """Scores one metric on each batch, exactly as the local executor does."""

    def __init__(self, metric: Metric, recipe: tuple, batch_size: int, caption_only: bool, memo: str | None):
        self.memo = memo  # as in `ReconstructStage`
        self.runner = MetricRunner(metric, Context(open_recipe(recipe)), batch_size)
        self.caption_only = caption_only
        self.counting = _Counting(self.runner.ctx)

    @memo_scoped
    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        keep_memo_in(self.memo)  # as in `ReconstructStage`
        samples, records = _decode(batch)
        items, kept = _opened(samples, records, list(batch["row"]), self.caption_only)
        if items:
            try:
                self.runner.score_into(items, [records[i] for i in kept])
            except (RunError, MetricContractError) as stop:  # a broken metric: retrying the batch cannot help
                for record in records:
                    record[_STOP] = str(stop)
                return _encode(batch, records, {})
        # the metric stage finds the reconstruct stage's images: "reused" would count them twice
        return _encode(batch, records, {k: v for k, v in self.counting.delta().items() if k != "reused"})


class ChainStage:
    """Stages fused into one actor (`--stage NAME:with=EARLIER`): each batch goes through
    them in order without leaving the process."""

    def __init__(self, steps: list[tuple[type, dict[str, Any]]]):
        self.steps = [cls(**kwargs) for cls, kwargs in steps]

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        for step in self.steps:
            batch = step(batch)
        return batch


def _groups(plan: list[tuple[str, type, dict[str, Any]]], stages: dict[str, StageOptions]) -> list[list[tuple]]:
    """The plan's stages grouped into actor pools: a stage `with` an earlier one joins its group."""
    groups: list[list[tuple]] = []
    where: dict[str, int] = {}
    for step in plan:
        name = step[0]
        host = stages[name].with_ if name in stages else None
        if host is None:
            where[name] = len(groups)
            groups.append([step])
            continue
        if host not in where:
            earlier = [n for n in where] or ["(none)"]
            raise ConfigError(f"--stage {name}:with={host}: {host} is not a stage before {name} in this run; "
                              f"earlier stages: {', '.join(earlier)}")
        where[name] = where[host]
        groups[where[host]].append(step)
    return groups


def run_ray(samples: Sequence[Sample], metrics: Sequence[Metric], cfg: Any, ctx: Context, *,
            scores_path: Path | None = None, progress: bool = True, done: dict[str, dict[str, Any]] | None = None,
            address: str | None = None, stages: dict[str, StageOptions] | None = None, workers: int = 1,
            retries: int = 3, fields: dict[str, Any] | None = None,
            row_numbers: Sequence[int] | None = None,
            on_rows: Callable[[list[dict[str, Any]]], None] | None = None) -> list[dict[str, Any]]:
    """Score `samples` with `metrics` on Ray Data; the records `run_local` would return.

    `address`: a running cluster to join (`ray://host:10001` or `auto`); without it, a Ray
    already initialised in this process is used, else one is started locally. `stages`:
    per-stage pool options (by stage name: reconstruct, or a metric's name); `workers`: the
    pool size of stages not named there. What the stages computed (generated, embedded, model
    seconds, ...) is added to `ctx`, so `ctx.stats()` counts the whole run as locally."""
    try:
        import ray
        from ray.data import ActorPoolStrategy, DataContext
    except ImportError:
        raise ConfigError("--executor ray needs Ray Data: pip install 'caprecon[ray]'") from None
    stages = stages or {}
    unknown = set(stages) - {RECONSTRUCT, *(m.name for m in metrics)}
    if unknown:
        raise ConfigError(f"--stage names {', '.join(sorted(unknown))}: no such stage in this run; stages are "
                          f"{', '.join([RECONSTRUCT, *(m.name for m in metrics)])}")
    recipe = store_recipe(ctx.store)
    memo = None if memo_folder() is None else str(memo_folder())
    caption_only = not any(m.needs_source_image for m in metrics)
    needed = reconstruction_plan(metrics)
    stages = default_stages(metrics, stages, reconstructing=bool(needed))
    plan: list[tuple[str, type, dict[str, Any]]] = []
    if needed:
        plan.append((RECONSTRUCT, ReconstructStage, {"plan": needed, "recipe": recipe, "caption_only": caption_only,
                                                          "memo": memo}))
    for metric in metrics:
        own = stages.get(metric.name)
        plan.append((metric.name, MetricStage, {
            "metric": metric, "recipe": recipe, "caption_only": caption_only, "memo": memo,
            "batch_size": (own.batch_size if own else None) or cfg.batch_size}))
    groups = _groups(plan, stages)  # a bad `with` fails before Ray starts
    if address or not ray.is_initialized():
        ray.init(address=address, ignore_reinit_error=True, log_to_driver=False, include_dashboard=False)
    numbers = list(row_numbers) if row_numbers else list(range(len(samples)))
    out = RunRows(samples, done, scores_path, on_rows=on_rows, progress=progress, desc="scoring (ray)")
    todo = out.todo

    def pool(name: str) -> dict[str, Any]:
        options = stages.get(name, StageOptions(workers=workers))
        return {"compute": ActorPoolStrategy(size=options.workers), "num_gpus": options.gpus or None,
                "num_cpus": options.cpus, "batch_size": options.batch_size or cfg.batch_size,
                "max_restarts": retries, "max_task_retries": retries}

    context = DataContext.get_current()
    before = (context.actor_task_retry_on_errors, context.enable_progress_bars)
    context.actor_task_retry_on_errors = True  # a stage's exception is retried; run-stopping ones come back as values
    context.enable_progress_bars = False  # the run has one bar, this one
    try:
        if todo:
            rows = [{"position": i, "row": numbers[i], "sample": pickle.dumps(s),
                     "record": json_text({**base_record(s), **(fields or {})}, default=str),
                     "stats": ""}
                    for i, s in todo]
            ds = ray.data.from_items(rows, override_num_blocks=max(1, -(-len(rows) // cfg.batch_size)))
            for group in groups:
                name, cls, kwargs = group[0]
                if len(group) > 1:  # fused: the pool of the group's first stage runs them all
                    cls, kwargs = ChainStage, {"steps": [(c, k) for _, c, k in group]}
                with warnings.catch_warnings():
                    # Ray 2.60 deprecates passing the actors' retry limits as remote args (removal in
                    # 2.64, which the `ray` extra excludes) and names no replacement yet
                    warnings.filterwarnings("ignore", message=".*ray_remote_args.*deprecated")
                    ds = ds.map_batches(cls, fn_constructor_kwargs=kwargs, **pool(name))
            for batch in ds.iter_batches(batch_size=None, batch_format="numpy"):
                positions, rows_done = [], []
                for text in batch["stats"]:
                    for key, value in (json.loads(text) if text else {}).items():
                        if key == "model_seconds":
                            ctx.model_seconds += value
                        else:  # counts by kind; they stand in for the driver's own (it computes nothing)
                            ctx.computed[key] = ctx.computed.get(key, 0) + value
                for position, text in zip(batch["position"], batch["record"]):
                    record = json.loads(text)
                    record.pop(_UNOPENED, None)
                    stop = record.pop(_STOP, None)
                    if stop:
                        raise RunError(stop)
                    positions.append(int(position))
                    rows_done.append(record)
                out.finish(positions, rows_done)
    except KeyboardInterrupt:
        raise out.interrupted() from None
    except RunError as stop:
        raise out.stopped(stop)
    except Exception as exc:  # a stage that kept failing after its retries
        if type(exc).__module__.split(".")[0] == "ray":  # Ray's wrapper around the stage's own exception
            raise out.stopped(RunError(f"a Ray stage failed after {retries} retries: {_root_cause(exc)}")) from exc
        raise
    finally:
        context.actor_task_retry_on_errors, context.enable_progress_bars = before
        out.close()
    return out.records()


def _root_cause(exc: BaseException) -> str:
    """The stage's own exception inside Ray's wrappers (RayTaskError, UserCodeException)."""
    deepest, current, seen = exc, exc, set()
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if type(current).__module__.split(".")[0] != "ray":
            deepest = current
        current = getattr(current, "cause", None) or current.__cause__
    lines = str(deepest).strip().splitlines()
    return f"{type(deepest).__name__}: {lines[-1] if lines else ''}"

