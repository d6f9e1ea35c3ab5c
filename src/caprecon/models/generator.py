"""The text-to-image role: rebuild a scene from a caption.

A generator takes `GenerationRequest`s and returns one `Generated` per request, in
order. It groups and batches requests itself; callers never loop over samples. Every
request carries its own seed, and backends honour it per request (one random generator
per image), so an image never depends on which other requests share its batch.
"""

from __future__ import annotations

import hashlib
import inspect
import json
from functools import cached_property
import logging
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar, Protocol, Sequence, runtime_checkable

import numpy as np
from PIL import Image

from caprecon.models.common import ModelSource, computation, dtype_name, resolve_device, resolve_source, torch_dtype

# what a description says of a text budget only the loaded pipeline can tell
UNKNOWN_BUDGET = "unknown until loaded"

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GenerationRequest:
    """One image to generate: the full prompt (template applied), its seed and size."""

    prompt: str
    seed: int
    width: int
    height: int
    image_id: str = ""  # the source picture, for backends that must know it (retrieval)
    #: the source picture's content key (its file's digest, or its pixels' for a picture given in
    #: memory: `caprecon.data.images`), set for backends that must know it (retrieval)
    source_key: str = ""


@dataclass
class Generated:
    image: Image.Image
    tokens_cut: int = 0  # prompt tokens dropped by the most-truncating text encoder
    detail: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class TextToImage(Protocol):
    """Role protocol. `fingerprint` must change whenever outputs could."""

    @property
    def fingerprint(self) -> str: ...

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Generated]: ...


# ----------------------------------------------------------------------------- diffusers


class DiffusersGenerator:
    """Any text-to-image pipeline that `diffusers.DiffusionPipeline` loads.

    SD 1.x/2.x, SDXL, SD3/3.5, FLUX, Qwen-Image, Z-Image and others, by hub id or local
    folder. Options the pipeline's `__call__` does not accept are left out (and logged
    once) rather than failing, so one configuration style serves every family.

    Float kernels give slightly different results for a batch of 9 than for 1 (measured on
    the tiny SD: up to 2e-7 in the text encoder, 5e-7 in the UNet, 2e-6 in the VAE), so a
    pixel near a rounding edge can come out one level apart: the same request, seed and model
    can give another image when it shares its pipeline call with other requests. Within a run
    that is invisible; across runs it means a reconstruction cached by a run of one batch size
    and a fresh one made at another can differ in a few pixels (a ReconScore apart by ~3e-6).
    `batch_invariant=True` runs every request through the pipeline alone, so an image never
    depends on its neighbours; on the CPU it costs throughput (tiny SD, 32 requests of 64 px:
    2.8 s against 1.1 s in batches of 8). The thread count can still move the last bits.
    """

    code_revision: ClassVar[int] = 1  # bump when a change here changes the images generated
    numeric_libraries: ClassVar[tuple[str, ...]] = ("torch", "diffusers", "transformers")

    def __init__(
        self,
        model: str | Path,
        *,
        revision: str | None = None,
        steps: int = 28,
        guidance: float | None = None,
        negative_prompt: str | None = None,
        max_sequence_length: int | None = None,
        dtype: str | None = "auto",
        device: str | None = "auto",
        batch_size: int = 4,
        cpu_offload: bool = False,
        call_kwargs: dict[str, Any] | None = None,
        batch_invariant: bool = False,
    ):
        if int(steps) < 1:
            raise ValueError(f"steps must be at least 1, not {steps}")
        if guidance is not None and not guidance >= 0:
            raise ValueError(f"guidance must be 0 or more, not {guidance}")
        self.source: ModelSource = resolve_source(model, revision, kind="generator")
        self.steps = int(steps)
        self.guidance = guidance
        self.negative_prompt = negative_prompt
        self.max_sequence_length = max_sequence_length
        self.device = resolve_device(device)
        self.dtype_name = dtype_name(dtype, self.device)
        self.batch_size = max(1, int(batch_size))
        self.cpu_offload = cpu_offload
        self.call_kwargs = dict(call_kwargs or {})
        if not isinstance(batch_invariant, bool):
            raise ValueError(f"batch_invariant must be true or false, not {batch_invariant!r}")
        self.batch_invariant = batch_invariant
        self._pipe = None
        self._accepted: set[str] = set()

    @property
    def fingerprint(self) -> str:
        return self.source.fingerprint(
            backend="diffusers", steps=self.steps, guidance=self.guidance, negative_prompt=self.negative_prompt,
            max_sequence_length=self.max_sequence_length, dtype=self.dtype_name, call_kwargs=self.call_kwargs,
            **computation(self),
        )

    def describe(self) -> dict[str, Any]:
        described = {"backend": "diffusers", "model": self.source.name, "revision": self.source.revision,
                     "steps": self.steps, "guidance": self.guidance, "dtype": self.dtype_name, "device": self.device,
                     "max_sequence_length": self.max_sequence_length, "fingerprint": self.fingerprint}
        # Each text encoder's budget is read from the loaded pipeline; a run whose images all came from
        # the store never loads it, and describing it must not load it either: then the tokenizers'
        # config files say what they can
        budgets = {name: limit for name, _, limit in self._token_limits} if self._pipe is not None \
            else self._budgets_on_disk()
        described["text_budget_by_encoder"] = budgets
        # the budget a caption keeps whole under every encoder; rows count what the tightest cut (`tokens_cut`)
        known = [b for b in budgets.values() if isinstance(b, int)]
        unread = self._pipe is None and (self.source.path is None or len(known) < len(budgets))
        described["text_budget"] = UNKNOWN_BUDGET if unread else min(known, default=None)
        return described

    def _budgets_on_disk(self) -> dict[str, int | str]:
        """`_token_limits`' budgets from each tokenizer's `tokenizer_config.json`, without loading
        the pipeline: a CLIP tokenizer's own limit; a long-text encoder's is `max_sequence_length`
        when set, else the pipeline's default, which only the loaded pipeline says."""
        budgets: dict[str, int | str] = {}
        for name in ("tokenizer", "tokenizer_2", "tokenizer_3"):
            config = self.source.path / name / "tokenizer_config.json" if self.source.path is not None else None
            if config is None or not config.is_file():
                continue
            try:
                native = json.loads(config.read_text()).get("model_max_length") or 0
            except (OSError, ValueError):
                native = 0
            budgets[name] = native if 0 < native <= 77 else self.max_sequence_length or UNKNOWN_BUDGET
        return budgets

    @property
    def dtype(self):
        return torch_dtype(self.dtype_name, self.device)

    @property
    def pipeline(self):
        if self._pipe is None:
            from diffusers import DiffusionPipeline

            from diffusers.utils import logging as diffusers_logging

            diffusers_logging.disable_progress_bar()  # we show one bar for the run, not one per component
            import diffusers
            from packaging.version import Version

            # diffusers renamed torch_dtype to dtype in 0.42
            dtype_arg = "dtype" if Version(diffusers.__version__) >= Version("0.42") else "torch_dtype"
            pipe = DiffusionPipeline.from_pretrained(self.source.load_target, revision=self.source.revision,
                                                     **{dtype_arg: self.dtype})
            if self.cpu_offload:
                pipe.enable_model_cpu_offload()
            else:
                pipe = pipe.to(self.device)
            pipe.set_progress_bar_config(disable=True)
            self._accepted = set(inspect.signature(pipe.__call__).parameters)
            self._pipe = pipe
        return self._pipe

    @property
    def native_size(self) -> tuple[int, int]:
        """(width, height) the pipeline generates when given none: its default sample size
        (the denoiser's `sample_size` where the pipeline keeps no default) times the VAE's
        scale factor. Loads the pipeline."""
        pipe = self.pipeline
        sample = getattr(pipe, "default_sample_size", None)
        if sample is None:
            denoiser = getattr(pipe, "unet", None) or getattr(pipe, "transformer", None)
            sample = getattr(getattr(denoiser, "config", None), "sample_size", None)
        scale = getattr(pipe, "vae_scale_factor", None)
        if not sample or not scale:
            raise ValueError(f"{type(pipe).__name__} has no default resolution; set the output size (--size WxH)")
        height, width = (sample, sample) if isinstance(sample, int) else sample
        return int(width) * scale, int(height) * scale

    def _call_options(self) -> dict[str, Any]:
        wanted = {"num_inference_steps": self.steps, "guidance_scale": self.guidance,
                  "negative_prompt": self.negative_prompt, "max_sequence_length": self.max_sequence_length,
                  **self.call_kwargs}
        options = {}
        for name, value in wanted.items():
            if value is None:
                continue
            if name in self._accepted:
                options[name] = value
            else:
                log.warning("%s does not accept %r; ignored", type(self.pipeline).__name__, name)
        return options

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Generated]:
        import torch

        pipe = self.pipeline
        options = self._call_options()
        out: list[Generated | None] = [None] * len(requests)
        by_size: dict[tuple[int, int], list[int]] = defaultdict(list)
        for i, r in enumerate(requests):
            by_size[(r.width, r.height)].append(i)
        gen_device = "cpu" if self.cpu_offload else self.device
        per_call = 1 if self.batch_invariant else self.batch_size
        for (width, height), indices in by_size.items():
            for start in range(0, len(indices), per_call):
                chunk = indices[start : start + per_call]
                prompts = [requests[i].prompt for i in chunk]
                generators = [torch.Generator(gen_device).manual_seed(requests[i].seed) for i in chunk]
                if "negative_prompt" in options:
                    options["negative_prompt"] = [self.negative_prompt] * len(chunk)
                with torch.inference_mode():
                    result = pipe(prompt=prompts, width=width, height=height, generator=generators,
                                  output_type="pil", **options)
                for i, image, cut in zip(chunk, result.images, self.tokens_cut_batch(prompts)):
                    out[i] = Generated(image=image if image.mode == "RGB" else image.convert("RGB"),
                                       tokens_cut=max(cut.values(), default=0),
                                       detail={"tokens_cut_by_encoder": cut} if any(cut.values()) else {})
        return out  # type: ignore[return-value]

    def tokens_cut(self, prompt: str) -> dict[str, int]:
        """Prompt tokens each of the pipeline's text encoders will drop."""
        return self.tokens_cut_batch([prompt])[0]

    def tokens_cut_batch(self, prompts: Sequence[str]) -> list[dict[str, int]]:
        """`tokens_cut` of many prompts (`token_counts`)."""
        out: list[dict[str, int]] = [{} for _ in prompts]
        for attr, count, limit in self._token_counters:
            for counts, n in zip(out, count(list(prompts))):
                counts[attr] = max(0, n - limit)
        return out

    def token_room(self, prompt: str) -> int | None:
        """Tokens `prompt` could still grow by before the most limiting text encoder cuts it
        (negative: it is cut by that many); None when no encoder has a limit. What a caption
        reviser may spend (`caprecon.apps.refine`)."""
        rooms = [limit - count([prompt])[0] for _, count, limit in self._token_counters]
        return min(rooms, default=None)

    @cached_property
    def _token_counters(self) -> list[tuple[str, Callable[[list[str]], list[int]], int]]:
        """(name, `token_counts` of its tokenizer, limit) per text encoder (`_token_limits`)."""
        return [(attr, token_counts(tok), limit) for attr, tok, limit in self._token_limits]

    @cached_property
    def _token_limits(self) -> list[tuple[str, Any, int]]:
        """(name, tokenizer, limit) per text encoder, read once from the pipeline.

        CLIP-style encoders (limit <= 77) cut at their tokenizer's limit; the long-text
        encoder (T5, Qwen, ...) cuts at the pipeline's `max_sequence_length`.
        """
        pipe = self.pipeline
        params = inspect.signature(pipe.__call__).parameters
        long_limit = self.max_sequence_length
        if long_limit is None and "max_sequence_length" in params:
            default = params["max_sequence_length"].default
            long_limit = default if isinstance(default, int) else None
        limits = []
        for attr in ("tokenizer", "tokenizer_2", "tokenizer_3"):
            tok = getattr(pipe, attr, None)
            if tok is None:
                continue
            native = getattr(tok, "model_max_length", None) or 0
            limit = native if 0 < native <= 77 else long_limit or (native if native < 100_000 else None)
            if limit:
                limits.append((attr, tok, limit))
        return limits


def token_counts(tokenizer: Any) -> Callable[[list[str]], list[int]]:
    """A function giving the number of tokens (special tokens included, nothing cut) `tokenizer`
    makes of each of a list of prompts, as `tokenizer(prompts, add_special_tokens=True)` counts them.

    A fast tokenizer's own Rust tokenizer is copied once, its truncation and padding turned off,
    and asked one prompt at a time: its batch call hands the work, even of one prompt, to the
    library's thread pool, whose threads spin before they sleep (at 2 steps of the tiny pipeline
    they took 0.015 s of CPU per 256 prompts more than the pipeline's own calls leave), and the
    tokenizer the pipeline holds keeps the truncation and padding of its last call (77 tokens),
    so it is neither asked directly nor changed. A tokenizer without one (a Python tokenizer) is
    called as it is."""
    import copy

    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return lambda prompts: [len(ids) for ids in tokenizer(prompts, add_special_tokens=True,
                                                               verbose=False)["input_ids"]]
    own = copy.deepcopy(backend)
    own.no_truncation()
    own.no_padding()
    own.encode_special_tokens = bool(getattr(tokenizer, "split_special_tokens", False))  # as its own calls do
    return lambda prompts: [len(own.encode(prompt, add_special_tokens=True).ids) for prompt in prompts]


# ----------------------------------------------------------------------------- retrieval


@runtime_checkable
class CaptionImageMatcher(Protocol):
    """Scores how well texts describe images: embeddings of both in one space."""

    @property
    def fingerprint(self) -> str: ...

    def embed_texts(self, texts: Sequence[str]) -> np.ndarray: ...

    def embed_images(self, images: Sequence[Image.Image]) -> np.ndarray: ...


class RetrievalGenerator:
    """'Reconstruct' by retrieval: return the gallery image the caption matches best.

    With the source image in the gallery this asks whether the caption singles its own
    image out; with `exclude_source=True` (the gallery entries that are the request's picture
    are skipped: the one whose file or pixels have the request's `source_key`, whatever the
    picture is called, and the one whose id equals its `image_id`; a gallery of that photo
    alone is the row's error) it asks how
    close the nearest *other* scene the caption fits is, and `source_rank` in the detail
    says where the caption ranks its own photo among the whole gallery (1 = first). The
    image is returned as stored: retrieval ignores the requested size and seed.
    A cheap screening mode with CLIP as the matcher, and the offline stand-in behind
    `make demo` with the ImageNet-label matcher.
    """

    # bump when a change here changes which image is retrieved or what its detail says
    code_revision: ClassVar[int] = 3
    numeric_libraries: ClassVar[tuple[str, ...]] = ()  # the matcher's fingerprint carries its own

    def __init__(self, gallery: str | Path | Sequence[str | Path], matcher: CaptionImageMatcher, *,
                 exclude_source: bool = False):
        paths = _gallery_paths(gallery)
        if not paths:
            raise FileNotFoundError(f"retrieval gallery is empty: {gallery}")
        self.paths = paths
        self.ids = [p.stem for p in paths]
        self.matcher = matcher
        self.exclude_source = exclude_source
        self._gallery_embeddings: np.ndarray | None = None
        self._content_keys: list[set[str]] | None = None

    @property
    def depends_on_image_id(self) -> bool:
        return self.exclude_source

    @cached_property
    def fingerprint(self) -> str:
        import hashlib

        h = hashlib.sha256()
        for p in self.paths:
            h.update(p.name.encode())
            h.update(hashlib.sha256(p.read_bytes()).digest())
        h.update(f"{self.matcher.fingerprint}|{self.exclude_source}|{computation(self)}".encode())
        return h.hexdigest()[:24]

    def describe(self) -> dict[str, Any]:
        return {"backend": "retrieval", "gallery": [str(p) for p in self.paths], "exclude_source": self.exclude_source,
                "matcher": getattr(self.matcher, "describe", lambda: type(self.matcher).__name__)(),
                "fingerprint": self.fingerprint}

    def _load(self, i: int) -> Image.Image:
        with Image.open(self.paths[i]) as im:
            return im.convert("RGB")

    def _sources(self, request: GenerationRequest) -> list[int]:
        """The gallery entries that are the request's own picture: by content, else by name."""
        if self._content_keys is None:  # each entry's file digest and pixel key (a picture read into memory)
            from caprecon.data.images import decode_image, pixels_key

            self._content_keys = []
            for path in self.paths:
                with Image.open(path) as im:
                    pixels = pixels_key(decode_image(im, f"gallery image {path}"))
                self._content_keys.append({hashlib.sha256(path.read_bytes()).hexdigest(), pixels})
        return [i for i, (gid, keys) in enumerate(zip(self.ids, self._content_keys))
                if gid == request.image_id or request.source_key in keys]

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Generated]:
        if self._gallery_embeddings is None:
            self._gallery_embeddings = self.matcher.embed_images([self._load(i) for i in range(len(self.paths))])
        sims = self.matcher.embed_texts([r.prompt for r in requests]) @ self._gallery_embeddings.T
        out = []
        for r, row in zip(requests, sims):
            row = row.copy()
            detail: dict[str, Any] = {}
            if self.exclude_source:
                source = self._sources(r)
                if source:
                    # what retrieval can still tell about a caption whose photo is left out: whether the
                    # caption singles that photo out (1 = the best match of the whole gallery)
                    detail["source_rank"] = 1 + int(np.sum(row > row[source].max()))
                row[source] = -np.inf
                if np.isneginf(row).all():  # argmax would hand back the source after all
                    raise ValueError(f"retrieval gallery holds no photo other than {r.image_id!r}, the one "
                                     f"being scored (exclude_source leaves it out)")
            best = int(np.argmax(row))
            detail = {"retrieved": self.ids[best], "match": round(float(row[best]), 6), **detail}
            out.append(Generated(image=self._load(best), detail=detail))
        return out


def _gallery_paths(gallery: str | Path | Sequence[str | Path]) -> list[Path]:
    from caprecon.data.samples import IMAGE_SUFFIXES

    if isinstance(gallery, (str, Path)):
        folder = Path(gallery)
        if not folder.is_dir():
            raise FileNotFoundError(f"retrieval gallery folder not found: {folder}")
        return sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
    return [Path(p) for p in gallery]
