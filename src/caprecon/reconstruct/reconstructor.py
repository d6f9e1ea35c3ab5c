"""Reconstruction: caption -> image, cached by content, shared by every metric that needs it.

`Reconstructor` owns the policy that turns a sample into a generation request (prompt
template, seed, output size) and the cache around the generator. Two metrics asking for
the same sample's reconstruction get the same image, generated once.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Sequence

from PIL import Image

from caprecon.core.recent import Recent
from caprecon.models.common import derive_seed
from caprecon.models.generator import GenerationRequest, TextToImage
from caprecon.reconstruct.templates import render, resolve_template
from caprecon.data.images import LoadedSample
from caprecon.data.normalise import collapse_whitespace
from caprecon.store.errors import StoreError

if TYPE_CHECKING:
    from caprecon.store.index import Store

log = logging.getLogger(__name__)

SEED_POLICIES = ("per-sample", "per-image", "fixed")


@dataclass(frozen=True)
class ReconstructionSpec:
    """Everything besides the caption and the source's shape that decides an image.

    seed_policy:
      - "per-sample": seed = hash(seed, image_id, candidate index): every sample gets its
        own noise, reproducible whatever the batch or order;
      - "per-image": seed = hash(seed, image_id): all captions of one image (best-of-N
        candidates) are rebuilt from the same noise, so they differ only by their text;
      - "fixed": the same seed for every caption, so the initial noise z is one constant
        across the whole evaluation (the ReconScore paper's protocol).
    A caption rebuilt from K seeds (`--seeds K`) takes the policy's seed as its first and
    derives the others from it, so the first seed's images (and caches) are those of a
    one-seed run, and every caption sharing a noise under the policy shares all K.
    Output size: `size` (width, height) when given, for every sample; otherwise the
    source's aspect ratio with the long side at `max_side` (never above it; smaller
    sources are scaled up unless `upscale=False`), both sides rounded to multiples of
    `multiple`; a caption-only sample (no source image) gets the generator's native
    resolution (`native_size`; a `max_side` square for generators that have none).
    """

    template: str = "{caption}"
    seed: int = 0
    seed_policy: str = "per-sample"
    max_side: int = 1024
    multiple: int = 16
    upscale: bool = True
    size: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "template", resolve_template(self.template))
        if self.size is not None:
            object.__setattr__(self, "size", parse_size(self.size, self.multiple))
        if self.seed_policy not in SEED_POLICIES:
            raise ValueError(f"seed_policy must be one of {SEED_POLICIES}, not {self.seed_policy!r}")
        if self.max_side < self.multiple:
            raise ValueError(f"max_side ({self.max_side}) must be at least multiple ({self.multiple})")
        check_max_side(self.max_side)

    def seed_for(self, image_id: str, candidate: int, index: int = 0) -> int:
        """The seed of the `index`-th reconstruction (of K) of a caption."""
        if self.seed_policy == "fixed":
            first = self.seed
        elif self.seed_policy == "per-image":
            first = derive_seed(self.seed, image_id)
        else:
            first = derive_seed(self.seed, image_id, candidate)
        return first if index == 0 else derive_seed(first, "seed", index)

    def size_for(self, width: int, height: int) -> tuple[int, int]:
        long_side = max(width, height)
        target = self.max_side if self.upscale else min(self.max_side, long_side)
        scale = target / long_side
        snap = lambda v: max(self.multiple, int(round(v * scale / self.multiple)) * self.multiple)  # noqa: E731
        return snap(width), snap(height)


def parse_size(value: str | Sequence[int], multiple: int = 16) -> tuple[int, int]:
    """`"WxH"` or (W, H) as a checked (width, height)."""
    try:
        parts = value.lower().split("x") if isinstance(value, str) else list(value)
        width, height = (int(p) for p in parts)
    except (ValueError, TypeError):
        raise ValueError(f"size must look like WIDTHxHEIGHT, e.g. 1024x1024, not {value!r}") from None
    if width <= 0 or height <= 0 or width % multiple or height % multiple:
        raise ValueError(f"size {width}x{height}: both sides must be positive multiples of {multiple}")
    limit = Image.MAX_IMAGE_PIXELS
    if limit and width * height > limit:
        raise ValueError(f"size {width}x{height}: {width * height} pixels, over the {limit} that PIL treats as a "
                         f"possible decompression bomb (PIL.Image.MAX_IMAGE_PIXELS)")
    return width, height


def check_max_side(max_side: int) -> None:
    """A long side whose square image PIL would take for a decompression bomb is refused before
    any work: such a request asks the generator for tens of gigabytes."""
    limit = Image.MAX_IMAGE_PIXELS
    if limit and max_side * max_side > limit:
        raise ValueError(f"max_side {max_side}: a square reconstruction would have {max_side * max_side} pixels, "
                         f"over the {limit} that PIL treats as a possible decompression bomb "
                         f"(PIL.Image.MAX_IMAGE_PIXELS); at most {math.isqrt(limit)}")


@dataclass
class Reconstruction:
    key: str
    path: Path | None  # None: the store does not keep its picture (`keep="vectors"` or `"none"`)
    prompt: str
    seed: int
    width: int
    height: int
    tokens_cut: int
    detail: dict[str, Any]
    checksum: str | None = None  # sha256 of the file, checked whenever it is read
    #: the pixels as just generated (and stored losslessly), so this run never reads them back
    pixels: Image.Image | None = field(default=None, repr=False, compare=False)
    regenerate: Callable[[], "Reconstruction"] | None = field(default=None, repr=False, compare=False)
    #: waits until the store has written the file, when its write is still queued (`Store.write_behind`)
    written: Callable[[], None] | None = field(default=None, repr=False, compare=False)

    def image(self) -> Image.Image:
        """The pixels, verified against the stored checksum; a damaged file is generated
        again (when the reconstructor is known) rather than scored. A file this process has
        queued for writing (no checksum yet) is read once written, never before."""
        if self.pixels is not None:
            return self.pixels
        if self.checksum is None and self.written is not None and self.path is not None:
            # the reconstructor remembers a fresh image without its pixels: a second metric of the
            # batch asking for it would otherwise read a file the writing thread has not written yet
            self.written()
        # the store's modules are imported where used: reading a config imports this module (for the
        # spec), and loads no more of the store than its errors (tests/test_startup.py counts the modules)
        from caprecon.store.images import read_verified

        image = read_verified(self.path, self.checksum) if self.path is not None else None
        if image is None and self.regenerate is not None:
            fresh = self.regenerate()
            self.path, self.checksum, self.pixels = fresh.path, fresh.checksum, fresh.pixels
            image = fresh.pixels if fresh.pixels is not None else read_verified(self.path, self.checksum)
        if image is None:
            raise StoreError(f"cached reconstruction {self.path} is missing or damaged; "
                             f"run `caprecon cache verify --repair`")
        return image

    @property
    def location(self) -> str | None:
        """The stored picture's path as text; None when the store keeps no picture of it."""
        return None if self.path is None else str(self.path)

    def record(self) -> dict[str, Any]:
        out = {"reconstruction": self.location, "seed": self.seed, "size": [self.width, self.height],
               "tokens_cut": self.tokens_cut}
        out.update(self.detail)
        return out


#: how many (record, path, checksum) entries a reconstructor keeps in memory (a few hundred bytes each)
KNOWN_IMAGES = 65_536


class Reconstructor:
    """Generates (or finds in the store) the reconstruction of each sample.

    Processes sharing a store share the work: each generates only the items it holds a
    claim on, and waits for the items another process is generating. `seed_index` picks
    which of a caption's K seeds this reconstructor rebuilds from; `held` is where
    `reconstruct_seeds` leaves the images it just generated, so the reconstructors of
    the other seeds (sharing the dict) take their pixels from memory.
    """

    KIND = "reconstruction"
    #: seconds a process waiting on another's claim keeps its own kept claims (`Store.keeping_claims`)
    #: before letting them go: long enough for the other to end a batch, short enough to break the
    #: wait of two processes on each other
    KEPT_PATIENCE_S = 1.0
    # bump when a change here (request sizing, seeding, prompting) changes the images stored under a key;
    # the generator's own code and libraries are in its fingerprint
    code_revision: ClassVar[int] = 1

    def __init__(self, generator: TextToImage, store: Store, spec: ReconstructionSpec | None = None,
                 poll_seconds: float = 0.25, *, seed_index: int = 0, held: dict[str, tuple] | None = None):
        self.generator = generator
        self.store = store
        self.spec = spec or ReconstructionSpec()
        self.seed_index = seed_index
        self.held = held if held is not None else {}
        self.poll_seconds = poll_seconds
        self.generated = 0  # images the generator actually produced (cache misses)
        self.reused = 0
        self.damaged = 0  # stored images found missing or damaged, and so generated again
        self.model_seconds = 0.0  # wall time inside the generator
        # (record, path, checksum) of the images this reconstructor found or made, by key, so a request
        # asked again (a duplicate row in a later batch, a GRPO group's repeated completion) costs
        # no second look-up in the store; bounded, the oldest forgotten first
        self._known: Recent = Recent(KNOWN_IMAGES)

    def describe(self) -> dict[str, Any]:
        return asdict(self.spec)

    def request_for(self, item: LoadedSample, seed_index: int | None = None) -> tuple[str, GenerationRequest]:
        """The request and its cache key (of this reconstructor's seed, or of `seed_index`); see `requests_for`."""
        return self.requests_for([item], [seed_index])[0]

    def requests_for(self, items: Sequence[LoadedSample],
                     seed_indexes: Sequence[int | None] | None = None) -> list[tuple[str, GenerationRequest]]:
        """Each item's request and its cache key (of this reconstructor's seed, or of the item's
        seed index), the generator's fingerprint read once for all. The caption's whitespace is
        collapsed first (`collapse_whitespace`): the one place every reconstruction request is
        made, so captions differing only by spaces cost one generation. A caption-only sample without
        a set `size` asks for the generator's native resolution: the key says "native" (the
        generator's fingerprint pins what that is) and the request's sides stay 0 until generation."""
        from caprecon.store.index import content_key  # as in `Reconstruction.image`

        fingerprint = self.generator.fingerprint
        by_image_id = getattr(self.generator, "depends_on_image_id", False)
        out = []
        for item, seed_index in zip(items, seed_indexes or [None] * len(items)):
            s = item.sample
            if self.spec.size:
                width, height = self.spec.size
            elif item.image_key:  # the size needs no decoding when the file was seen before
                width, height = self.spec.size_for(*item.size)
            else:
                width = height = 0
            caption = collapse_whitespace(s.caption)  # " a cat" and "a  cat" are one request with "a cat"
            request = GenerationRequest(prompt=render(self.spec.template, caption),
                                        seed=self.spec.seed_for(s.image_id, s.candidate, self.seed_index
                                                                if seed_index is None else seed_index),
                                        width=width, height=height, image_id=s.image_id,
                                        source_key=item.image_key if by_image_id else "")
            key = content_key(self.KIND, caption=caption, template=self.spec.template, prompt=request.prompt,
                              generator=fingerprint, reconstructor=self.code_revision, seed=request.seed,
                              size=[width, height] if width else "native",
                              image_id=s.image_id if by_image_id else None,
                              # a generator that reads the source (retrieval leaving it out) answers per picture
                              **({"source": item.image_key} if by_image_id else {}))
            out.append((key, request))
        return out

    def native_size(self) -> tuple[int, int]:
        size = getattr(self.generator, "native_size", None)
        return tuple(size) if size else (self.spec.max_side, self.spec.max_side)

    def _sized(self, request: GenerationRequest) -> GenerationRequest:
        if request.width:
            return request
        width, height = self.native_size()
        return replace(request, width=width, height=height)

    def reconstruct(self, items: Sequence[LoadedSample]) -> list[Reconstruction]:
        return self._reconstruct(self.requests_for(items))

    def reconstruct_seeds(self, items: Sequence[LoadedSample], seeds: int | Sequence[int],
                          start: int | Sequence[int] = 0) -> list[list[Reconstruction]]:
        """Each item's reconstructions from seeds `start`..`seeds`-1 (one bound for all items, or
        one per item: adaptive seeds draw further seeds only for some captions), those missing
        from the store generated in one generator call, a caption's seeds side by side (so they
        share a pipeline batch); they stay in `held` for the reconstructors of each seed."""
        stops = [seeds] * len(items) if isinstance(seeds, int) else list(seeds)
        starts = [start] * len(items) if isinstance(start, int) else list(start)
        ranges = [range(a, b) for a, b in zip(starts, stops)]
        keyed = self.requests_for([item for item, span in zip(items, ranges) for _ in span],
                                  [k for span in ranges for k in span])
        flat = self._reconstruct(keyed, hold=True)
        out, at = [], 0
        for span in ranges:
            out.append(flat[at : at + len(span)])
            at += len(span)
        return out

    def _reconstruct(self, keyed: list[tuple[str, GenerationRequest]], hold: bool = False) -> list[Reconstruction]:
        wanted: dict[str, GenerationRequest] = {}
        for key, request in keyed:
            wanted.setdefault(key, request)
        found = {k: self.held[k] for k in wanted if k in self.held}
        held = sum(1 for key, _ in keyed if key in found)
        found.update({k: self._known[k] for k in wanted if k not in found and k in self._known})
        damaged_before = self.store.damaged
        # an image kept as its record alone is made again only if its pixels are asked for (`image()`)
        found.update(self.store.get_images([k for k in wanted if k not in found], records=True))
        self.damaged += self.store.damaged - damaged_before
        generated_before = self.generated
        missing = {k: r for k, r in wanted.items() if k not in found}
        if missing:
            found.update(self._obtain(missing, records=True))
        # an image held from this batch's `reconstruct_seeds` was counted there
        self.reused += len(keyed) - held - (self.generated - generated_before)
        if hold:
            self.held.update({k: found[k] for k in wanted})
        self._known.put({k: found[k][:3] for k in wanted})  # without the pixels a fresh image carries
        return [self._reconstruction(key, request, found[key]) for key, request in keyed]

    def _reconstruction(self, key: str, request: GenerationRequest, entry: tuple) -> Reconstruction:
        record, path, checksum, *pixels = entry  # pixels: when generated by this call
        return Reconstruction(key=key, path=path, prompt=record["prompt"], seed=record["seed"],
                              width=record["width"], height=record["height"], tokens_cut=record["tokens_cut"],
                              detail=record["detail"], checksum=checksum, pixels=pixels[0] if pixels else None,
                              regenerate=lambda: self._regenerate(key, request, kept=path is not None),
                              written=lambda: self.store.flush_images([key]))

    def _regenerate(self, key: str, request: GenerationRequest, kept: bool) -> Reconstruction:
        """The reconstruction made again: its stored picture is missing or failed its checksum (`kept`),
        or the store keeps no picture of it (`keep="vectors"`: no damage, the picture is made when needed)."""
        if kept:
            log.warning("cached reconstruction %s is missing or fails its checksum; generating it again", key)
            self.damaged += 1
        entry = self._obtain({key: request}, records=False)[key]
        self._known.put({key: entry[:3]})
        return self._reconstruction(key, request, entry)

    def _obtain(self, missing: dict[str, GenerationRequest], *, records: bool) -> dict[str, tuple]:
        """Generate the items no other process is generating; wait for the others. `records`: an
        item whose picture the store did not keep (`keep="vectors"`) counts as there by its record;
        else (its pixels are wanted) only a picture does."""
        out: dict[str, tuple] = {}
        pending = dict(missing)
        waiting_since: float | None = None
        while pending:
            mine = self.store.claim(list(pending))
            if mine:
                with self.store.holding(mine) as handed:
                    # another process may have finished some between our look and our claim
                    done = self.store.get_images(sorted(mine), verify=True, records=records)
                    todo = {k: pending[k] for k in pending if k in mine and k not in done}
                    out.update(done)
                    if todo:
                        out.update(self._generate(todo, handed))
                for key in mine:
                    pending.pop(key)
            if pending:
                if waiting_since is None:
                    log.info("waiting for %d reconstruction(s) another process is generating", len(pending))
                    waiting_since = time.monotonic()
                # no claim kept for long while waiting on another's (`Store.keeping_claims`): two processes
                # each keeping what the other waits for would wait for ever. A short wait (the other ending
                # its batch) keeps them, so that no one takes a record whose embedding is on its way
                if time.monotonic() - waiting_since >= self.KEPT_PATIENCE_S:
                    self.store.release_kept()
                time.sleep(self.poll_seconds)
                done = self.store.get_images(list(pending), records=records)
                out.update(done)
                for key in done:
                    pending.pop(key)
        return out

    def _generate(self, todo: dict[str, GenerationRequest], handed: set[str]) -> dict[str, tuple]:
        """Generate and store `todo`; their claims go with the write (released once the
        images are in the store, which may be after this returns: `Store.write_behind`)."""
        started = time.perf_counter()
        results = self.generator.generate([self._sized(r) for r in todo.values()])
        self.model_seconds += time.perf_counter() - started
        items = {}
        for (key, request), generated in zip(todo.items(), results):
            items[key] = (generated.image, {"prompt": request.prompt, "seed": request.seed,
                                            "width": generated.image.width, "height": generated.image.height,
                                            "tokens_cut": generated.tokens_cut, "detail": generated.detail})
        stored = self.store.put_images(self.KIND, items, model=self.generator, release=list(items))
        handed.update(items)
        self.generated += len(todo)
        # PNG is lossless: the pixels in memory are those of the stored file (or will be)
        return {key: (*entry, _rgb(items[key][0])) for key, entry in stored.items()}


def _rgb(image: Image.Image) -> Image.Image:
    return image if image.mode == "RGB" else image.convert("RGB")
