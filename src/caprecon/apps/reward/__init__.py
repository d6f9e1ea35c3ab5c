"""Rewards for training captioners: caprecon's metrics as a reward function (TRL's contract).

    reward = caprecon.Reward(metrics=["recon"], preset="fast", cache_dir="cache")
    GRPOTrainer(model=..., reward_funcs=[reward], train_dataset=ds_with_an_image_column, ...)
    reward(images, captions)  # the same reward outside TRL: one float per caption

One call scores a whole generation batch as all pairs (`Metric.score_pairs`): each picture read and
embedded once, each distinct (picture content, caption) pair scored once, and, under one noise for
every caption (`seed_policy="fixed"`) and one `size`, a caption shared by several pictures rebuilt once.
Every model result goes through the store (a caption seen before costs lookups), and
each caption's reconstruction seed derives from its picture (a file by its name, as `score` names it;
a picture in memory or as bytes by its content), never from the row, so the same completion always
gets the same reward, whatever its place in the batch, and the value `score` gives the same pair
under the same settings.

The reward is the weighted sum of its metrics plus the guards, each a part of its own, logged
through TRL's `log_metric` as `caprecon/<part>`; an empty completion's parts are 0 but one, `empty`,
which holds its reward (`Reward(empty=...)`):
- length: -length_weight * max(0, words / length_target - 1): nothing up to the target, then a
  penalty growing with the overshoot (TRL's overlong punishment, on tokens, can stand beside it);
- repetition: -repetition_weight * the share of the caption's word n-grams (n = repetition_n)
  that repeat an earlier one;
- hallucination: -hallucination_weight * (1 - halluc), the share of the caption's claims the judge
  does not find on the original image; only where a judge and an LLM are configured.

A metric named `name[column]` is one of the metric's columns as a part of its own, with its own
weight: `Reward(["claims[claims_precision]", "claims[claims_conveyed]"], {"claims[claims_precision]": 1.0,
"claims[claims_conveyed]": 0.5})` logs precision (what the caption gets wrong about the photo) and
conveyed (what of it a generator rebuilt) apart, from one scoring of `claims`.

The guards and the text measures they read are `guards`; what a call is given (completions,
pictures, columns) is read by `inputs`. The reward served over HTTP lives beside it, one app with
it: `wire` (the request's cells), `service` (a replica's requests, apart from Ray), `serve` (the Ray
Serve application, `caprecon serve`) and `remote` (the clients: `RemoteReward`, verl's function).
The audit of a reward before training with it (`caprecon reward-audit`) is `audit`.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import re
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from tqdm.auto import tqdm

from caprecon.apps.reward.guards import Guards
from caprecon.apps.reward.inputs import column_list, completion_text, image_source, kind_of, picture_problem, row_image
from caprecon.core.checks import number_problem
from caprecon.core.digests import keep_memo_in, memo_scoped
from caprecon.core.errors import ConfigError
from caprecon.core.records import is_number, unicode_problem
from caprecon.data.images import LoadedSample, read_image
from caprecon.data.normalise import normalise_caption
from caprecon.data.samples import Sample, SampleError
from caprecon.metrics import Context, Metric
from caprecon.metrics.adaptive import check_scored_alone
from caprecon.run.config import RunConfig
from caprecon.run.folder import open_store
from caprecon.run.local import MetricRunner
from caprecon.run.roles import Roles
from caprecon.run.score import build_metrics

log = logging.getLogger(__name__)

_COLUMN = re.compile(r"^(?P<metric>[^\[\]]+)\[(?P<column>[^\[\]]+)\]$")


def metric_column(label: str) -> tuple[str, str | None]:
    """`"claims[claims_precision]"` as ("claims", "claims_precision"); a plain name as (name, None)."""
    found = _COLUMN.match(label)
    return (found["metric"], found["column"]) if found else (label, None)


def _own_memo(method: Callable) -> Callable:
    """A `Reward` method that hashes files (model weights, pictures) remembers their digests in the memo
    of the reward's own cache folder, whatever another reward or run in the process uses."""
    @memo_scoped
    @functools.wraps(method)
    def scoped(self: "Reward", *args: Any, **kwargs: Any) -> Any:
        keep_memo_in(self.cfg.memo_folder)
        return method(self, *args, **kwargs)

    return scoped


class Reward:
    """A caprecon reward: picklable, batched, cached; see the module's docstring.

    `metrics`: metric names (`recon`, `clipscore`, `distilled:PATH`, ...) or `Metric` objects
    (default: the config's, else recon), each at most once; `weights`: one per metric, or
    {name: weight} (default 1 each). `guards`: a `Guards` (default: all on), or None for none.
    `empty`: the reward of an empty completion, whatever the metrics, weights and guards (no metric
    can score it, and a policy must not learn that silence is safe). `progress`: progress bars over
    each call's scoring and the first call's model loading (False: none). `preset`, `config` and `settings` are those of
    `caprecon.score` (generator, embedder, judge, llm, cache_dir, seed, ...), and a (picture,
    caption) gets the value `score` gives it under them (adaptive seeds under Stein's rule only:
    `check_seed_rule`). Every setting is checked here, before any model loads; models load on the first call; a pickled copy (a trainer's worker) loads its own.
    """

    def __init__(self, metrics: Sequence[str | Metric] | str | None = None,
                 weights: Sequence[float] | Mapping[str, float] | None = None, *, preset: str | None = None,
                 config: str | Path | None = None, guards: Guards | None = Guards(), empty: float = 0.0,
                 log_parts: bool = True, progress: bool = True, **settings: Any):
        metrics = [metrics] if isinstance(metrics, (str, Metric)) else list(metrics or [])
        names = list(dict.fromkeys(metric_column(m)[0] for m in metrics if isinstance(m, str)))
        self.preset, self.config, self.settings = preset, config, settings
        self.cfg = RunConfig.build(preset=preset, file=config, **({"metrics": names} if names else {}), **settings)
        check_seed_rule(self.cfg)
        self.metrics = metrics or list(self.cfg.metrics)
        labels = [m if isinstance(m, str) else m.name for m in self.metrics]
        check_once(labels)
        if weights is None:
            self.weights = [1.0] * len(self.metrics)
        elif isinstance(weights, Mapping):
            unknown = sorted(set(weights) - set(labels))
            if unknown:
                raise ConfigError(f"weights name {', '.join(unknown)}, which is not among the metrics "
                                  f"({', '.join(labels)})")
            given = [weights.get(name, 1.0) for name in labels]
        else:
            given = list(weights)
            if len(given) != len(self.metrics):
                raise ConfigError(f"{len(given)} weights for {len(self.metrics)} metrics")
        if weights is not None:  # NaN would make every reward NaN, text would fail on the first caption
            for name, weight in zip(labels, given):
                problem = number_problem(weight)
                if problem:
                    raise ConfigError(f"weight of {name} {problem}")
            self.weights = [float(w) for w in given]
        if guards is not None and not isinstance(guards, Guards):
            raise ConfigError(f"guards must be a caprecon.Guards or None, not a {type(guards).__name__}")
        self.guards = guards or Guards.off()
        self.hallucination = (self.guards.hallucination_weight > 0 and self.cfg.judge is not None
                              and self.cfg.llm is not None and "halluc" not in labels)
        problem = number_problem(empty)
        if problem:
            raise ConfigError(f"empty (the reward of an empty completion) {problem}")
        self.empty = float(empty)
        self.log_parts = log_parts
        self.progress = progress
        self._built: dict[str, Any] | None = None
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_built"] = None  # models, store and context are rebuilt where the copy is called
        state.pop("_lock")
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    @_own_memo
    def _build(self) -> dict[str, Any]:
        if self._built is None:
            roles = Roles(self.cfg)
            wanted = [*self.metrics, *(["halluc"] if self.hallucination else [])]
            once: dict[str, Metric] = {}  # columns of one metric share its scoring
            built: list[Metric] = []
            # the first call loads the models (seconds to minutes): a bar says so before any scoring
            with tqdm(wanted, desc="reward: loading models", unit="metric", disable=not self.progress, leave=False,
                      dynamic_ncols=True) as bar:
                for m in bar:
                    if isinstance(m, str):
                        name = metric_column(m)[0]
                        if name not in once:
                            once[name] = build_metrics(name, roles, self.cfg)
                        built.append(once[name])
                    else:
                        built.append(build_metrics(m, roles, self.cfg))
            for m, metric in zip(self.metrics, built):
                column = metric_column(m)[1] if isinstance(m, str) else None
                known = [c.name for c in metric.columns] or [metric.headline, *metric.companions]
                if column is not None and column.split("/")[0] not in known:
                    raise ConfigError(f"reward part {m}: {metric.name} has no column {column} "
                                      f"(its columns: {', '.join(known)}, each also per category as column/<category>)")
            check_once(self._part_names(built))  # two objects of one metric write one column
            self._built = {"metrics": built, "ctx": Context(open_store(self.cfg, None)), "roles": roles}
        return self._built

    @property
    def context(self) -> Context:
        """The context the reward scores through (its store, and counts of results computed)."""
        return self._build()["ctx"]

    def describe(self) -> dict[str, Any]:
        built = self._build()
        return {"metrics": [m.describe() for m in built["metrics"]], "weights": self.weights,
                "guards": self.guards.__dict__, "hallucination_guard": self.hallucination, "empty": self.empty,
                "models": built["roles"].describe(), "store": built["ctx"].store.describe()}

    def __call__(self, images: Iterable[Any] | None = None, captions: Iterable[str] | None = None, *,
                 prompts: Sequence[Any] | None = None, completions: Iterable[Any] | None = None,
                 completion_ids: Any = None, image: Iterable[Any] | None = None,
                 log_metric: Callable[[str, float], None] | None = None, **columns: Any) -> list[float | None]:
        """TRL's form (keywords: `completions` and the dataset's `image` or `images` column, one per
        completion), or `reward(images, captions)`. One reward per completion: `empty` for an empty
        one; None where it has no single image, its picture does not read or a metric failed on it (TRL
        skips those). Inputs that cannot be read (a caption that is not text, a picture that is none of
        `PICTURE_FORMS`, columns of different lengths) raise `ConfigError` naming the row, before any scoring."""
        if completions is not None:
            captions = []
            for row, completion in enumerate(column_list("completions", completions)):
                try:
                    captions.append(completion_text(completion))
                except ConfigError as exc:
                    raise ConfigError(f"completion {row}: {exc}") from None
            pictures = image if image is not None else images
            if pictures is None:
                raise ConfigError("the reward needs the picture each completion describes: give the dataset an "
                                  "`image` (or `images`) column")
            pictures = [row_image(p) if image is not None else row_image(images=p)
                        for p in column_list("image" if image is not None else "images", pictures)]
        else:
            if images is None or captions is None:
                raise ConfigError("call the reward as reward(images, captions) or with TRL's keywords "
                                  "(completions=..., image=...)")
            pictures, captions = column_list("images", images), column_list("captions", captions)
            for row, caption in enumerate(captions):
                if not isinstance(caption, str):
                    raise ConfigError(f"caption {row} is {kind_of(caption)}, not text: {caption!r:.60}")
        if len(pictures) != len(captions):
            raise ConfigError(f"{len(pictures)} images but {len(captions)} completions: give one picture per "
                              "completion")
        for row, picture in enumerate(pictures):
            if problem := picture_problem(picture):
                raise ConfigError(f"image {row} {problem}")
        parts = self.parts(pictures, captions)
        totals = [None if any(v is None for v in row) else math.fsum(row) for row in zip(*parts.values())]
        if log_metric is not None and self.log_parts:
            blank = parts.get(EMPTY_PART, [0.0] * len(totals))
            for name, values in {**parts, "reward": totals}.items():
                # a part's mean over the completions it scored: an empty one's zeros would only dilute it
                known = [v for v, b in zip(values, blank) if v is not None and (name == "reward" or b == 0.0)]
                if known and name != EMPTY_PART:
                    log_metric(f"caprecon/{name}", math.fsum(known) / len(known))
        return totals

    @_own_memo
    def parts(self, images: Sequence[Any], captions: Sequence[str], *,
              errors: dict[int, str] | None = None) -> dict[str, list[float | None]]:
        """Each part of the reward (weighted metrics, then the guards) per caption; the reward is their
        sum (None where a part is None). When a caption is empty, every part of it is 0 and one more
        part, `empty`, holds the reward of an empty completion (0 for the other captions), so the sum
        is `empty` whatever the metrics, weights and guards. A caption that is not valid Unicode (a lone
        surrogate: `unicode_problem`) gets None from its metrics, logged with its row, and reaches no model.
        `errors`, when given, is filled with why each row whose metric parts are None is so (its picture did
        not read, its caption is not valid Unicode, a metric failed on it), by row: a served reward's answer
        carries them to its client."""
        images, captions = list(images), self._read(captions)
        empty = [not caption.strip() for caption in captions]
        broken = {row: problem for row, problem in enumerate(map(unicode_problem, captions)) if problem}
        for row, problem in broken.items():
            log.warning("reward: row %d: the caption %s; its reward is None", row, problem)
        with self._lock:  # one context (its counts, its held reconstructions) serves one batch at a time
            built = self._build()
            # the call as all pairs: each picture read once, each caption once, and the distinct
            # (picture, caption) pairs of the rows scored through the metrics' all-pairs form
            pictures: dict[tuple[str, str], int] = {}
            opened: list[LoadedSample] = []
            texts: dict[str, int] = {}
            bases: dict[int, LoadedSample | Exception] = {}
            row_pairs = [None if empty[i] or i in broken else self._pair(i, picture, caption, bases, pictures, opened,
                                                                         texts)
                         for i, (picture, caption) in enumerate(zip(images, captions))]
            pairs = list(dict.fromkeys(pair for pair in row_pairs if pair is not None))
            names = self._part_names(built["metrics"])
            failures: dict[int, str] = {}
            scored = self._score_all(built["metrics"], self._part_columns(built["metrics"]), opened, list(texts),
                                     pairs, built["ctx"], failures)
        position = {pair: j for j, pair in enumerate(pairs)}
        if errors is not None:
            failed = {pairs[at]: why for at, why in failures.items()}
            errors.update(row_errors(images, empty, bases, broken, row_pairs, failed))

        def part(values: list[float | None], term: Callable[[float], float]) -> list[float | None]:
            return [0.0 if blank else None if pair is None or values[position[pair]] is None
                    else term(values[position[pair]]) for blank, pair in zip(empty, row_pairs)]

        parts: dict[str, list[float | None]] = {}
        for name, weight, values in zip(names, self.weights, scored):
            parts[name] = part(values, lambda value, weight=weight: weight * value)
        if self.hallucination:
            parts["hallucination"] = part(scored[-1], lambda rate: -self.guards.hallucination_weight * (1.0 - rate))
        if self.guards.length_weight:  # an empty caption has no words: its terms are 0
            parts["length"] = [self.guards.length(c) for c in captions]
        if self.guards.repetition_weight:
            parts["repetition"] = [self.guards.repetition(c) for c in captions]
        if any(empty):
            parts[EMPTY_PART] = [self.empty if blank else 0.0 for blank in empty]
        return parts

    def _read(self, captions: Sequence[str]) -> list[str]:
        """The captions as the metrics read them: cleaned as `score` cleans them under the same settings."""
        return [normalise_caption(c) for c in captions] if self.cfg.normalise_captions else list(captions)

    def _pair(self, row: int, picture: Any, caption: str, bases: dict, pictures: dict, opened: list,
              texts: dict) -> tuple[int, int] | None:
        """The row's (picture, caption) by their places in `opened` and `texts`, each added when new;
        None for a row without a readable picture. A picture is one by its content key and image id.
        The image id is `score`'s for a file (its name; a dataset cell's `path` names its bytes), and
        the content key for a picture in memory or as bare bytes, which nothing else names:
        the reconstruction's seed derives from it, so a completion gets the reward `score` gives it."""
        if picture is None:
            return None
        base = bases.get(id(picture))  # a dataset repeats one image object across its G completions
        if base is None:
            try:
                source = image_source(picture)
                # a file's name: the path, or a dataset cell's `path` beside its bytes
                name = picture.get("path") if isinstance(picture, Mapping) else \
                    source if isinstance(source, (str, Path)) else None
                base = read_image(Sample(id=str(row), image=source, caption=caption,
                                         image_id=Path(name).stem if name else ""))
                if not name:
                    base.sample = replace(base.sample, image_id=base.image_key[:32])
            except SampleError as exc:
                log.warning("reward: row %d: %s", row, exc)
                base = exc
            bases[id(picture)] = base
        if isinstance(base, Exception):
            return None
        image = pictures.setdefault((base.image_key, base.sample.image_id), len(opened))
        if image == len(opened):
            opened.append(base)
        return image, texts.setdefault(caption, len(texts))

    def _labels(self) -> list[str]:
        labels = [m if isinstance(m, str) else m.name for m in self.metrics]
        return [*labels, "halluc"] if self.hallucination else labels

    def _part_columns(self, metrics: Sequence[Metric]) -> list[str]:
        """The column each part reads: the one a `name[column]` label names, else the metric's headline."""
        return [metric_column(label)[1] or metric.headline for label, metric in zip(self._labels(), metrics)]

    def _part_names(self, metrics: Sequence[Metric]) -> list[str]:
        """Each part's name: its `name[column]` label, or the metric's headline."""
        return [label if metric_column(label)[1] else metric.headline
                for label, metric in zip(self._labels(), metrics)]

    def _score_all(self, metrics: list[Metric], columns: list[str], images: list[LoadedSample], texts: list[str],
                   pairs: list[tuple[int, int]], ctx: Context,
                   failures: dict[int, str] | None = None) -> list[list[float | None]]:
        """Each part's value per (image, text) pair (None where its metric failed on the pair or wrote no
        number): every distinct metric scored once through its all-pairs form (`Metric.score_pairs`), in
        the run's batches of pairs under a progress bar, each batch held to the metric contract as a
        run holds it; parts that read columns of one metric share it. `failures`: filled with the first
        failure of each pair that has one, by its place in `pairs`."""
        batch = self.cfg.batch_size
        distinct = list({id(m): m for m in metrics}.values())
        wanted: dict[int, list[str]] = {}
        for metric, column in zip(metrics, columns):
            wanted.setdefault(id(metric), []).append(column)
        values: dict[tuple[int, str], list[float | None]] = {(id(m), c): [] for m, c in zip(metrics, columns)}
        with tqdm(total=len(pairs) * len(distinct), desc="reward", unit="caption", disable=not self.progress,
                  leave=False, dynamic_ncols=True) as bar:
            for metric in distinct:
                runner = MetricRunner(metric, ctx, batch)
                for start in range(0, len(pairs), batch):
                    part = pairs[start : start + batch]
                    for at, ((_, text), result) in enumerate(zip(part, runner.score_pairs(images, texts, part)),
                                                             start):
                        if isinstance(result, Exception):
                            log.warning("reward: %s failed on caption %.60r: %s", metric.name, texts[text], result)
                            if failures is not None:
                                failures.setdefault(at, f"{metric.name} failed: {result}")
                        for column in wanted[id(metric)]:
                            value = None if isinstance(result, Exception) else result.get(column)
                            values[id(metric), column].append(float(value) if is_number(value) else None)
                    bar.update(len(part))
        return [values[id(m), c] for m, c in zip(metrics, columns)]


def row_errors(images: Sequence[Any], empty: Sequence[bool], bases: Mapping[int, Any], broken: Mapping[int, str],
               row_pairs: Sequence[Any], failed: Mapping[Any, str]) -> dict[int, str]:
    """Why each row's metric parts are None, by row: its picture's `SampleError` (`bases`, by the
    picture's id), its caption's Unicode problem (`broken`), or its pair's first metric failure (`failed`).
    An empty caption's parts are 0, whatever its picture: no error."""
    out: dict[int, str] = {}
    for row, (picture, blank, pair) in enumerate(zip(images, empty, row_pairs)):
        if blank:
            continue
        base = bases.get(id(picture)) if picture is not None else None
        why = (f"caption {broken[row]}" if row in broken else str(base) if isinstance(base, Exception)
               else failed.get(pair) if pair is not None else None)
        if why is not None:
            out[row] = why
    return out


#: the part that holds the reward of an empty completion (present when a call has one)
EMPTY_PART = "empty"


def check_seed_rule(cfg: RunConfig) -> None:
    """Adaptive seeds in a reward only under Stein's rule (`check_scored_alone`). The other rules
    (mixture, moderated, pooled) borrow each caption's variance from the other captions scored with it:
    `score` fits it over its whole input, a reward call could only fit it over the completions of its
    batch, so a completion's seed count, and with it its reward, would change with the completions
    beside it (and with `batch_size`). Stein's rule takes each caption's own variance: its reward is a
    function of the (picture, caption) alone, the value `score` gives it."""
    check_scored_alone(cfg.max_seeds, cfg.adaptive_rule, "a reward",
                       "which for a reward are the completions of its batch")


def check_once(labels: Sequence[str]) -> None:
    """Each metric of a reward at most once: named twice, its parts would collapse into one and
    the weights would no longer sum as given."""
    twice = sorted({label for label in labels if labels.count(label) > 1})
    if twice:
        raise ConfigError(f"metric {', '.join(twice)} is named more than once; name each metric once and give it "
                          f"the weight you want (weights={{{twice[0]!r}: 2.0}})")


class AsyncReward(Reward):
    """The same reward as a coroutine: TRL awaits it beside its other async reward functions, and
    the scoring (reconstruction and judge servers: vLLM, OpenAI-compatible) runs in a worker
    thread, so the trainer's event loop is never blocked. The backends' own calls stay blocking
    inside that thread; calls overlap other rewards, not each other."""

    async def __call__(self, *args: Any, **kwargs: Any) -> list[float | None]:  # type: ignore[override]
        return await asyncio.to_thread(Reward.__call__, self, *args, **kwargs)
