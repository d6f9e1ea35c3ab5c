"""What every metric shares: the `Metric` interface and the run `Context`.

A metric is a small class holding the models it talks to (through their roles, never a
library directly). `score(items, ctx)` takes a batch of opened samples and returns one
dict of named fields per item; the executor owns the batch loop, errors and output.
`score_pairs(images, texts, ctx, pairs)` is its all-pairs form (each image opened once, shared by
its texts), behind `metric(images, texts, all_pairs=True)` and the reward.
`prepare(samples)` sees the run's whole input first, for what is computed over the corpus.
`columns` declares each number a metric writes (`Column`: direction, range, aggregation,
needs); the run writes the declarations into its manifest, and the report, `compare`, `seeds`
and `meta` read them there instead of guessing from a name.
A metric written outside caprecon is built by `from_roles(roles, config)` (see `Metric`).
The `Context` is what metrics of one run share: the store, one `Reconstructor` per
(generator, spec), and cached embeddings, so one reconstruction serves every metric.
"""

from __future__ import annotations

import math
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, ClassVar, Iterable, Iterator, Mapping, Sequence

import numpy as np
from PIL import Image

from caprecon.core.errors import ConfigError, MetricContractError
from caprecon.core.recent import Recent
from caprecon.core.records import is_number
from caprecon.metrics.catalogue import names_of, target_of
from caprecon.models.embedder import ImageEmbedder
from caprecon.models.generator import TextToImage
from caprecon.reconstruct.reconstructor import Reconstructor, ReconstructionSpec
from caprecon.data.images import LoadedSample, open_image
from caprecon.data.samples import Sample, SampleError
from caprecon.store.index import Store, content_key


#: how many vectors a context keeps in memory (4,096 of DreamSim's 1,792 floats: 29 MB)
KNOWN_ARRAYS = 4_096


class Context:
    """What a metric's `score` works through: the store its model results are cached in, the
    reconstructors (one per generator, spec and seed), and counts of model time and of results computed."""

    def __init__(self, store: Store | None = None):
        self.store = store if store is not None else Store.temporary()
        self._reconstructors: dict[tuple[int, ReconstructionSpec, int], Reconstructor] = {}
        #: which of a caption's K seeds the metrics reconstruct from now (`seed`)
        self.seed_index = 0
        self._held: dict[str, tuple] = {}  # the last `reconstruct_seeds` batch, shared by its reconstructors
        self.model_seconds = 0.0  # wall time inside model calls made through the context
        self.computed: dict[str, int] = {}  # model results computed (not found in the store), by kind
        # the vectors (embeddings) read or computed lately, so a row asking for one again (a duplicate
        # row, the same photo under many captions) costs no second read of the store; bounded
        self._arrays: Recent = Recent(KNOWN_ARRAYS)

    def reconstructor(self, generator: TextToImage, spec: ReconstructionSpec) -> Reconstructor:
        slot = (id(generator), spec, self.seed_index)
        if slot not in self._reconstructors:
            self._reconstructors[slot] = Reconstructor(generator, self.store, spec, seed_index=self.seed_index,
                                                       held=self._held)
        return self._reconstructors[slot]

    @contextmanager
    def seed(self, index: int) -> Iterator[None]:
        """Metrics called inside reconstruct from the `index`-th seed of each caption."""
        before, self.seed_index = self.seed_index, index
        try:
            yield
        finally:
            self.seed_index = before

    def reconstruct_seeds(self, generator: TextToImage, spec: ReconstructionSpec, items: Sequence[LoadedSample],
                          seeds: int | Sequence[int], start: int | Sequence[int] = 0) -> list[list[Any]]:
        """The reconstructions of each item from seeds `start`..`seeds`-1 in one go (see
        `Reconstructor.reconstruct_seeds`); they are held in memory until the next call, for
        the metric passes of each seed."""
        self._held.clear()
        with self.seed(0):
            return self.reconstructor(generator, spec).reconstruct_seeds(items, seeds, start)

    def _cached(self, kind: str, keys: Sequence[str], compute: Callable[[list[int]], Sequence[Any]],
                get: Callable, put: Callable, model: Any = None) -> list[Any]:
        """Results by key; `compute(indices)` runs once, for the first row of each missing key.
        `compute` times its own model call (`model_call`), so input preparation stays outside."""
        known = get(list(set(keys)))
        first_of: dict[str, int] = {}
        for i, k in enumerate(keys):
            if k not in known:
                first_of.setdefault(k, i)
        if first_of:
            order = list(first_of.values())
            new = {keys[i]: v for i, v in zip(order, compute(order))}
            put(kind, new, model=model)
            known.update(new)
            self.computed[kind] = self.computed.get(kind, 0) + len(order)
        return [known[k] for k in keys]

    def cached(self, kind: str, keys: Sequence[str], compute: Callable[[list[int]], Sequence[Any]],
               model: Any = None) -> list[Any]:
        """JSON-able model results (answers, probabilities) by content key; `model`, the
        backend that computes them, is recorded so `caprecon cache prune --model` finds them."""
        return self._cached(kind, keys, compute, self.store.get_json, self.store.put_json, model)

    def cached_arrays(self, kind: str, keys: Sequence[str], compute: Callable[[list[int]], Sequence[np.ndarray]],
                      model: Any = None) -> np.ndarray:
        """Vectors (embeddings) by content key, stacked in the order of `keys`."""
        rows = self._cached(kind, keys, compute, self._get_arrays, self._put_arrays, model)
        return np.stack(rows) if rows else np.zeros((0, 0), dtype=np.float32)  # a copy: the memo stays as it was

    def _get_arrays(self, keys: list[str]) -> dict[str, np.ndarray]:
        """Vectors by key: those this context read or computed lately from memory, the rest from the store."""
        found = {k: self._arrays[k] for k in keys if k in self._arrays}
        rest = [k for k in keys if k not in found]
        if rest:
            stored = self.store.get_arrays(rest)
            self._arrays.put(stored)
            found.update(stored)
        return found

    def _put_arrays(self, kind: str, values: dict[str, np.ndarray], model: Any = None) -> None:
        self.store.put_arrays(kind, values, model=model)
        self._arrays.put(values)

    @contextmanager
    def model_call(self) -> Iterator[None]:
        """Wrap every model call a metric makes, so run overhead can be measured."""
        started = time.perf_counter()
        try:
            yield
        finally:
            self.model_seconds += time.perf_counter() - started

    def stats(self) -> dict[str, float]:
        recons = self._reconstructors.values()
        return {"generated": sum(r.generated for r in recons), "reused": sum(r.reused for r in recons),
                "damaged": sum(r.damaged for r in recons),
                "embedded": self.computed.get("embedding", 0),
                **{kind: n for kind, n in self.computed.items() if kind != "embedding"},
                "model_seconds": round(self.model_seconds + sum(r.model_seconds for r in recons), 4)}

    def embed(self, embedder: ImageEmbedder, image_keys: Sequence[str],
              load: Callable[[int], Image.Image]) -> np.ndarray:
        """Embeddings of images named by content keys; `load(i)` is called only on misses."""
        fingerprint = embedder.fingerprint  # once a batch, not once an image
        keys = [content_key("embedding", embedder=fingerprint, image=k) for k in image_keys]

        def compute(order: list[int]) -> Sequence[np.ndarray]:
            images = [load(i) for i in order]  # decoding is run overhead, not model time
            with self.model_call():
                return embedder.embed(images)

        return self.cached_arrays("embedding", keys, compute, model=embedder)


#: how a column's summary is formed: the mean of the rows' values, or the metric's own corpus-level
#: value (`Metric.corpus`: corpus BLEU pools n-gram counts over every caption, it is no mean)
MEAN, CORPUS = "mean", "corpus"


@dataclass(frozen=True)
class Column:
    """One number a metric writes per row, and how to read it (as torchmetrics' `higher_is_better`).

    `higher_is_better` None: neither direction is better (a count, a spread). `low`/`high`: the
    range the value lies in (None: unbounded that side). `aggregate`: MEAN or CORPUS. The needs say
    what a row must carry (references, its source image) or what the run must name (a judge)."""

    name: str
    higher_is_better: bool | None = True
    low: float | None = None
    high: float | None = None
    aggregate: str = MEAN
    needs_references: bool = False
    needs_source_image: bool = False
    needs_judge: bool = False

    def __post_init__(self) -> None:
        if self.aggregate not in (MEAN, CORPUS):
            raise ValueError(f"column {self.name}: aggregate must be {MEAN!r} or {CORPUS!r}, not {self.aggregate!r}")

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Column:
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        return cls(**known)

    def best(self, values: Iterable[tuple[float, Any]]) -> Any:
        """The label of the best (value, label) pair by this column's direction; None when it has none."""
        values = list(values)
        if self.higher_is_better is None or not values:
            return None
        return (max if self.higher_is_better else min)(values, key=lambda pair: pair[0])[1]


#: how far past a declared bound a value may lie and still count as inside: the rounding of a
#: cosine computed in float32 ((1 + cos) / 2 of two equal unit vectors is 1 + 6e-8)
RANGE_SLACK = 1e-6


def check_columns(metric: Metric) -> None:
    """A metric's declarations as a run can read them: each column's direction True, False or None,
    its bounds numbers (or None) with `low` not above `high`. Raises `ConfigError` naming the metric
    and the column, before any work."""
    for column in metric.columns:
        where = f"metric contract: {metric.name or type(metric).__name__}: column {column.name!r}"
        if column.higher_is_better not in (True, False, None):
            raise ConfigError(f"{where}: higher_is_better must be True, False or None (neither), not "
                              f"{column.higher_is_better!r}")
        for side in ("low", "high"):
            bound = getattr(column, side)
            if bound is not None and not is_number(bound):
                raise ConfigError(f"{where}: {side} must be a finite number or None, not {bound!r}")
        if column.low is not None and column.high is not None and column.low > column.high:
            raise ConfigError(f"{where}: low ({column.low}) is above high ({column.high})")


def checked_rows(metric: Metric, count: int, rows: Any) -> list[dict[str, Any]]:
    """What `metric.score` returned for `count` items, held to the contract every caller of a metric
    relies on (the run, `score`, the `Reward`): one dict per item, in order; each with the metric's
    headline field; each declared column present as a number (None: no value) inside its declared
    range. Anything else raises `MetricContractError` naming the metric, the row and the problem."""
    where = f"metric contract: {metric.name or type(metric).__name__}"
    try:
        rows = list(rows)
    except TypeError:
        raise MetricContractError(f"{where}: score returned a {type(rows).__name__}, not a list of one dict "
                                  f"per item") from None
    if len(rows) != count:
        raise MetricContractError(f"{where}: score returned {len(rows)} rows for {count} items; it must return "
                                  f"one dict per item, in order")
    columns = {c.name: c for c in metric.columns}
    for i, row in enumerate(rows):
        if not isinstance(row, Mapping):
            raise MetricContractError(f"{where}: row {i} of the batch is a {type(row).__name__}, not a dict")
        if metric.headline not in row:
            raise MetricContractError(f"{where}: row {i} of the batch has no {metric.headline!r} (its headline "
                                      f"column); it wrote {', '.join(map(repr, row)) or 'nothing'}")
        for key, column in columns.items():
            value = row.get(key)
            if value is None:
                continue
            if hasattr(value, "item") and type(value).__module__ == "numpy":
                value = value.item()  # a numpy scalar is a number (the run writes it as one)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise MetricContractError(f"{where}: row {i} of the batch has {key} = {value!r:.60}, but the "
                                          f"column is declared a number")
            if math.isfinite(value) and not _inside(value, column):
                raise MetricContractError(f"{where}: row {i} of the batch has {key} = {value!r}, outside the "
                                          f"declared range [{column.low}, {column.high}]")
    return rows


def _inside(value: float, column: Column) -> bool:
    low, high = column.low, column.high
    return ((low is None or value >= low - RANGE_SLACK * max(1.0, abs(low)))
            and (high is None or value <= high + RANGE_SLACK * max(1.0, abs(high))))


def declared_columns(metrics: Iterable[Metric]) -> dict[str, dict[str, Any]]:
    """The columns the metrics declare, by name, as a run's manifest holds them (`columns`)."""
    return {c.name: c.to_json() for m in metrics for c in m.columns}


def read_columns(manifest: Mapping[str, Any]) -> dict[str, Column]:
    """The column declarations of a run's manifest (empty for a run written before they existed:
    its columns then have no known direction)."""
    found = manifest.get("columns") if isinstance(manifest, Mapping) else None
    if not isinstance(found, Mapping):
        return {}
    out = {}
    for name, data in found.items():
        if isinstance(data, Mapping):
            try:
                out[str(name)] = Column.from_json({**data, "name": str(name)})
            except (TypeError, ValueError):
                continue  # a hand-edited declaration the report cannot read: that column shows no best
    return out


class Metric:
    """Base class: subclasses have a `name`, declare `columns` and implement `score`.

    A metric written outside caprecon sets its `name`; one of caprecon's takes it from its entry in
    `caprecon.metrics.catalogue` (the one place it is written) when the class is defined, and one
    that several names share (halluc's reports, the reference metrics) names each instance.

    The registry builds every metric, caprecon's and plug-ins alike, with `from_roles(roles, config,
    **options)`: `roles` holds the run's shared models (`generator`, `embedder`, `clip`,
    `clip_matcher`, `judge`, `llm`, `qa_bank`, ... of `caprecon.run.roles.Roles`), `config` the run's
    `caprecon.run.config.RunConfig`, and `options` are a catalogue entry's (a plug-in gets none). The
    default calls `cls()`, so a metric that needs no model needs no constructor at all."""

    name: ClassVar[str] = ""
    #: the field of `score`'s output that is this metric's headline number
    primary: ClassVar[str] = ""
    #: whether it looks at the source image; if not, caption-only samples are valid
    needs_source_image: bool = True
    #: other fields of `score`'s output summarised beside the headline (mean, std, n)
    companions: tuple[str, ...] = ()
    #: every number `score` writes that a reader compares across rows or runs, headline first
    columns: tuple[Column, ...] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        names = names_of(target_of(cls))
        if not names:
            return  # a plug-in, or a class no name builds: its `name` is its own
        if "name" in cls.__dict__:
            raise TypeError(f"{cls.__module__}.{cls.__qualname__} sets name = {cls.__dict__['name']!r}, but "
                            f"caprecon.metrics.catalogue names it {', '.join(names)}: write the name there only")
        cls.name = names[0] if len(names) == 1 else ""  # a shared class names each instance

    @classmethod
    def from_roles(cls, roles: Any, config: Any) -> Metric:
        return cls()

    def score(self, items: Sequence[LoadedSample], ctx: Context) -> list[dict[str, Any]]:
        raise NotImplementedError

    def prepare(self, samples: Sequence[Sample]) -> None:
        """Called by a run once, with its whole input (every shard's rows, not only this shard's),
        before any batch is scored: a metric whose number depends on the corpus (CIDEr's document
        frequencies) takes it from here, so a row's score does not depend on its batch or shard."""

    def corpus(self, samples: Sequence[Sample]) -> dict[str, float]:
        """The corpus-level value of each CORPUS column over `samples` (the rows it scored): what
        the run's summary shows for that column in place of the rows' mean."""
        return {}

    def corpus_statistics(self, samples: Sequence[Sample]) -> tuple[dict[str, float], dict[str, Any]]:
        """`corpus(samples)`, with the statistics it pools, by column, which merge with those of other
        rows (other shards) into the corpus value of all of them without the input (the reference
        metrics': `metrics/reference_statistics.py`); a metric that keeps none returns them empty."""
        return self.corpus(samples), {}

    def describe(self) -> dict[str, Any]:
        return {"metric": self.name}

    @property
    def headline(self) -> str:
        return self.primary or self.name

    def score_pairs(self, images: Sequence[LoadedSample], texts: Sequence[str], ctx: Context,
                    pairs: Sequence[tuple[int, int]]) -> list[dict[str, Any]]:
        """The rows of `score` for the (image, text) pairs named by `pairs` ((i, j): `images[i]`
        under `texts[j]`), in their order: the all-pairs form of `score`, where each image is opened
        once and shared by its texts (its image id, so its seeds, are its own under every text).
        This default builds the pairs' items and scores them in one call: the context embeds each
        distinct image and makes each distinct reconstruction once. A metric that can share more
        (ReconScore: a vector per image and per reconstruction, then cosines) overrides it."""
        return self.score([images[i].with_caption(texts[j]) for i, j in pairs], ctx)

    def __call__(self, images: Sequence[Image.Image | str | Path], captions: Sequence[str], *,
                 all_pairs: bool = False, store: Store | None = None) -> list[float] | np.ndarray:
        """Score images and captions directly (PIL images, paths or bytes; the captions as text).

        `metric(images, captions)` pairs them in order: one score per pair, any unreadable pair raises
        `SampleError` naming it. `metric(images, texts, all_pairs=True)` scores every image with every
        text, as t2v_metrics' `score(images=..., texts=...)` does: an m x n array, `scores[i, j]` the
        score of image i with text j (NaN where the metric gives no number), equal to what the paired
        call gives image i at its place under text j. Each image is read once (and embedded once, by a
        metric that embeds it) and each distinct reconstruction made once; under the default seed
        policy a reconstruction's noise derives from its image, so `seed_policy="fixed"` (and one
        output `size`) makes one per distinct text. Empty lists, a caption that is not text or is
        blank, and an unreadable image raise before any model runs, naming it."""
        images, captions = _as_sequence("images", images), _as_sequence("captions", captions)
        if all_pairs:
            return self._all_pairs(images, captions, store)
        if len(images) != len(captions):
            raise ValueError(f"{len(images)} images but {len(captions)} captions")
        items = []
        for i, (image, caption) in enumerate(zip(images, captions)):
            try:
                items.append(open_image(Sample(id=str(i), image=image, caption=caption)))
            except SampleError as exc:
                raise SampleError(f"pair {i}: {exc}") from None
        rows = checked_rows(self, len(items), self.score(items, Context(store)))
        return [row[self.headline] for row in rows]

    def _all_pairs(self, images: Sequence[Any], texts: Sequence[Any], store: Store | None) -> np.ndarray:
        if not images or not texts:
            raise ValueError(f"an all-pairs call needs at least one image and one caption, not {len(images)} "
                             f"images and {len(texts)} captions")
        for j, text in enumerate(texts):
            if not isinstance(text, str):
                raise SampleError(f"caption {j} is a {type(text).__name__}, not text: {text!r:.60}",
                                  "caption not text")
            if not text.strip():
                raise SampleError(f"caption {j} is empty", "empty caption")
        opened = []
        for i, image in enumerate(images):  # under its first text: its id and seeds are the paired call's
            try:
                opened.append(open_image(Sample(id=str(i), image=image, caption=texts[0])))
            except SampleError as exc:
                raise SampleError(f"image {i}: {exc}") from None
        pairs = [(i, j) for i in range(len(images)) for j in range(len(texts))]
        rows = checked_rows(self, len(pairs), self.score_pairs(opened, texts, Context(store), pairs))
        values = [row[self.headline] for row in rows]
        return np.array([np.nan if v is None else float(v) for v in values], dtype=np.float64).reshape(
            len(images), len(texts))


def _as_sequence(name: str, values: Any) -> Sequence[Any]:
    """A direct call's images or captions as a list; one text or one path where a list belongs is
    refused (iterating it would score its characters)."""
    if isinstance(values, (str, bytes, Path, Image.Image)):
        raise TypeError(f"{name} must be a list (one entry per {name[:-1]}), not a single "
                        f"{type(values).__name__}: wrap it in a list")
    try:
        return list(values)
    except TypeError:
        raise TypeError(f"{name} must be a list, not a {type(values).__name__}") from None
