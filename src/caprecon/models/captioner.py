"""The captioner role: write N candidate captions of an image by sampling.

Best-of-N selection (RemoteDescriber, the ReconScore paper) needs diverse candidates:
the captioner samples with a temperature (and optionally top-k and top-p) and returns `n`
captions per request, in one batched call per group of images. Sampling is seeded:
the same request (image, prompt, seed, n) and the same sampling settings give the same
candidates. A setting left unset (None) is the checkpoint's own, from its
`generation_config.json` (Qwen3-VL's top_k 20, top_p 0.8, for instance): `complete_sampling`
fills it in where the backend can read that file (a local transformers checkpoint fetches
that file alone when its weights are not downloaded yet, so the first run samples as the
later ones), so both backends sample alike and the manifest can say what was used.

Two backends:

- `TransformersCaptioner`: any `AutoModelForImageTextToText` checkpoint, loaded and
  prompted like the judge (`TransformersVLM`: chat template, image-only processors).
  Every candidate row draws its tokens from its own `torch.Generator`, seeded from
  (request seed, candidate index), so a candidate does not depend on which other images
  share its batch, nor on how many candidates were asked for (the first five of ten are
  the five of five), up to float rounding in batched kernels.
- `OpenAICompatCaptioner`: a model behind an OpenAI-compatible server (vLLM, SGLang):
  one request per image with `n` candidates and the request's `seed`. The server decides
  how a seed maps to samples; vLLM's per-request seeds are reproducible.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Protocol, Sequence, runtime_checkable

from PIL import Image

from caprecon.models.common import computation, derive_seed
from caprecon.models.llm import NO_PENALTIES, eos_token_ids
from caprecon.models.openai_compat import OpenAICompatError, OpenAICompatVLM
from caprecon.models.vlm import VLMRequest

# Prompt presets, in our own words. `limited` needs `max_words`.
from caprecon.models.vlm_transformers import TransformersVLM

# Prompt presets, in our own words. `limited` needs `max_words`.
PROMPTS: dict[str, str] = {
    "detailed": (
        "Describe this image in detail. Name the main subjects and what they are doing, the setting, the "
        "colours, materials and textures, the lighting, any visible text, and where things are relative to "
        "each other. Describe only what can be seen. Answer in plain prose."
    ),
    "limited": (
        "Describe this image in at most {max_words} words. Mention the most important subjects, their "
        "attributes and where they are. Describe only what can be seen. Answer in plain prose."
    ),
    # The ReconScore paper's task prompt asks for every geographic object with its attributes and
    # spatial relations; this wording is ours.
    "remote-sensing": (
        "Describe this remote sensing image so that someone could redraw it. First state the kind of scene "
        "and its overall layout. Then go through the objects in it: for each kind of object say how many "
        "there are, and give their colours, materials, shapes and sizes, their absolute position in the image "
        "(for example top left, centre, along the bottom edge) and their positions relative to one another. "
        "Report only what is visible: no impressions or feelings, and nothing guessed or invented. Answer in "
        "plain prose."
    ),
}


def resolve_prompt(prompt: str | None, max_words: int | None = None) -> str:
    """A preset name or a literal prompt, with `{max_words}` filled in where it appears."""
    text = PROMPTS.get(prompt or "detailed", prompt or "")
    if not text.strip():
        raise ValueError("the caption prompt is empty")
    if "{max_words}" in text:
        if max_words is None or int(max_words) < 1:
            raise ValueError(f"this prompt limits the caption's length: give max_words (--max-words), "
                             f"a positive number of words: {text[:60]!r}...")
        return text.replace("{max_words}", str(int(max_words)))
    if max_words is not None:
        raise ValueError("max_words (--max-words) applies only to a prompt with {max_words}, such as the "
                         "'limited' preset")
    return text


SAMPLING_KEYS = ("temperature", "top_p", "top_k")  # what a checkpoint's generation_config.json may set


@dataclass(frozen=True)
class Sampling:
    """How candidates are drawn. temperature 0 is greedy: every candidate is the same.
    top_k 0 and top_p 1 are off; None leaves the setting to the checkpoint (see `complete_sampling`),
    and where that is unknown, off (a server applies its own default)."""

    temperature: float = 1.0
    top_p: float | None = None
    max_new_tokens: int = 256
    top_k: int | None = None

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, not {self.temperature}")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], not {self.top_p}")
        if self.top_k is not None and (isinstance(self.top_k, bool) or not isinstance(self.top_k, int)
                                       or self.top_k < 0):
            raise ValueError(f"top_k must be a whole number >= 0 (0: off), not {self.top_k}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be at least 1, not {self.max_new_tokens}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def generation_defaults(path: str | Path | None) -> dict[str, Any]:
    """The sampling settings a checkpoint ships (temperature, top_p, top_k of its
    `generation_config.json`; `path` is that file or its folder), read without loading
    anything; {} when there is none."""
    if path is None:
        return {}
    path = Path(path)
    file = path / "generation_config.json" if path.is_dir() else path
    try:
        config = json.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot read the generation config {file}: {exc}") from None
    return {key: config[key] for key in SAMPLING_KEYS if config.get(key) is not None}


def hub_generation_config(repo_id: str, revision: str | None) -> str | None:
    """The local path of a hub checkpoint's `generation_config.json`, downloaded alone (a few
    hundred bytes) when it is not cached yet; None when the checkpoint has none. A hub that
    cannot be reached is a `ValueError` (the weights could not be fetched either)."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError

    try:
        return hf_hub_download(repo_id, "generation_config.json", revision=revision)
    except EntryNotFoundError:
        return None
    except Exception as exc:
        raise ValueError(f"the generation config of {repo_id!r} cannot be fetched, so its own sampling settings "
                         f"are unknown: {type(exc).__name__}: {exc}") from None


def complete_sampling(sampling: Sampling, defaults: dict[str, Any]) -> Sampling:
    """`sampling` with its unset top_p/top_k taken from `defaults` (a checkpoint's)."""
    filled = {key: defaults[key] for key in ("top_p", "top_k")
              if getattr(sampling, key) is None and defaults.get(key) is not None}
    return replace(sampling, **filled) if filled else sampling


@dataclass(frozen=True)
class CaptionRequest:
    image: Image.Image
    prompt: str  # the whole user turn
    n: int  # how many candidates
    seed: int  # the request's sampling seed
    image_key: str = ""  # identifies the image (content hash), so one encoding serves repeats


@runtime_checkable
class Captioner(Protocol):
    @property
    def fingerprint(self) -> str:
        """Changes whenever the captions for a given request and sampling could."""
        ...

    def caption(self, requests: Sequence[CaptionRequest], sampling: Sampling) -> list[list[str]]:
        """`request.n` captions per request, in request order."""
        ...

    # Optional: `generation_defaults() -> dict`, the checkpoint's own temperature/top_p/top_k, which
    # best-of-N uses for the settings nobody set (`complete_sampling`).


# ---------------------------------------------------------------------------------------
# transformers


class _SeededSampler:
    """A logits processor that picks each row's next token with the row's own generator.

    transformers samples with the process-wide random state, shared by the whole batch.
    This processor applies temperature, top-k and top-p (in transformers' order), draws the token by inverse CDF from a
    uniform number of the row's own CPU `torch.Generator` (so the draws do not depend on the
    device either), and returns logits that allow only that token, so the sampler that
    follows has one choice.
    """

    def __init__(self, seeds: Sequence[int], sampling: Sampling):
        import torch

        self.generators = [torch.Generator().manual_seed(int(s)) for s in seeds]
        self.sampling = sampling

    def __call__(self, input_ids, scores):
        import torch
        from transformers import TopKLogitsWarper, TopPLogitsWarper

        if scores.shape[0] != len(self.generators):
            raise RuntimeError(f"generate gave {scores.shape[0]} rows for {len(self.generators)} seeded candidates")
        logits = scores.float()
        if self.sampling.temperature == 0:
            chosen = logits.argmax(-1)
        else:
            logits = logits / self.sampling.temperature
            if self.sampling.top_k:
                logits = TopKLogitsWarper(self.sampling.top_k)(input_ids, logits)
            if self.sampling.top_p is not None and self.sampling.top_p < 1:
                logits = TopPLogitsWarper(self.sampling.top_p)(input_ids, logits)
            cdf = logits.softmax(-1).double().cumsum(-1)
            draws = torch.cat([torch.rand(1, generator=g, dtype=torch.float64) for g in self.generators])
            targets = draws.to(cdf.device)[:, None] * cdf[:, -1:]
            # the first token whose cumulative probability exceeds the draw; tokens removed by
            # top-p add nothing to the sum, so they are never the first to exceed it
            chosen = torch.searchsorted(cdf, targets, right=True)[:, 0].clamp(max=cdf.shape[-1] - 1)
        only = torch.full_like(scores, float("-inf"))
        only[torch.arange(scores.shape[0], device=scores.device), chosen.to(scores.device)] = 0.0
        return only


def sampling_config(model, tokenizer, sampling: Sampling, n: int):
    """`generate` settings that leave every choice to `_SeededSampler`. Penalties are off
    (see `NO_PENALTIES`); the checkpoint's own warpers (top-k, top-p, ...) may still run
    after the sampler, but on logits that allow one token they change nothing."""
    from transformers import GenerationConfig

    return GenerationConfig(do_sample=True, num_beams=1, num_return_sequences=int(n),
                            max_new_tokens=sampling.max_new_tokens, **NO_PENALTIES,
                            eos_token_id=eos_token_ids(model, tokenizer), pad_token_id=tokenizer.pad_token_id)


class TransformersCaptioner(TransformersVLM):
    """Any transformers `AutoModelForImageTextToText` checkpoint as the captioner.

    Loading, processors and chat templates are the judge's (`TransformersVLM`); so is
    `system_prompt`. `batch_size` counts sequences: each `generate` call takes as many
    images as fit `batch_size // n` (at least one), each expanded to its `n` candidates.
    """

    def __init__(self, model, *, revision: str | None = None, device: str | None = "auto",
                 dtype: str | None = "auto", batch_size: int = 16, system_prompt: str | None = None):
        super().__init__(model, revision=revision, device=device, dtype=dtype, batch_size=batch_size,
                         system_prompt=system_prompt, share_prefix=False)

    @property
    def fingerprint(self) -> str:
        return self.source.fingerprint(backend="transformers-captioner", dtype=self.dtype_name,
                                       system_prompt=self.system_prompt, **computation(self))

    def describe(self) -> dict[str, Any]:
        return {"backend": "transformers-captioner", "model": self.source.name, "revision": self.source.revision,
                "device": self.device, "dtype": self.dtype_name, "batch_size": self.batch_size,
                "system_prompt": self.system_prompt, "fingerprint": self.fingerprint}

    def generation_defaults(self) -> dict[str, Any]:
        """The checkpoint's own sampling settings, from its folder or, for a hub id not yet in
        the local cache, from its `generation_config.json` fetched alone: the first run, before
        the weights are downloaded, must sample as every later one does."""
        if self.source.path is not None:
            return generation_defaults(self.source.path)
        return generation_defaults(hub_generation_config(self.source.name, self.source.revision))

    def caption(self, requests: Sequence[CaptionRequest], sampling: Sampling) -> list[list[str]]:
        import torch

        sampling = complete_sampling(sampling, self.generation_defaults())
        model, processor = self._load()
        out: list[list[str]] = []
        for n, group in itertools.groupby(requests, key=lambda r: r.n):  # callers normally use one n throughout
            if n < 1:
                raise ValueError(f"a caption request asks for {n} candidates; ask for at least one")
            group = list(group)
            per_call = max(1, self.batch_size // n)
            for lo in range(0, len(group), per_call):
                chunk = group[lo : lo + per_call]
                # expanded rows are request-major: row r is candidate r % n of request r // n
                seeds = [derive_seed(r.seed, j) for r in chunk for j in range(n)]
                inputs = self._process([self.render(r.prompt) for r in chunk],
                                       [r.image.convert("RGB") for r in chunk], padding_side="left")
                config = sampling_config(model, processor.tokenizer, sampling, n)
                with torch.inference_mode():
                    generated = model.generate(**inputs, generation_config=config,
                                               logits_processor=[_SeededSampler(seeds, sampling)])
                texts = processor.tokenizer.batch_decode(generated[:, inputs["input_ids"].shape[1] :],
                                                         skip_special_tokens=True)
                out += [[t.strip() for t in texts[i * n : (i + 1) * n]] for i in range(len(chunk))]
        return out


# ---------------------------------------------------------------------------------------
# OpenAI-compatible servers


class OpenAICompatCaptioner(OpenAICompatVLM):
    """A captioner behind an OpenAI-compatible `/v1/chat/completions` server.

    Each request is one HTTP call asking for `n` choices (`n`, `temperature`, `top_p`,
    `top_k`, `max_tokens` from the sampling settings, and the request's `seed`); up to
    `max_concurrency` calls are in flight. `top_k` is not in OpenAI's API; vLLM and SGLang
    take it in the body, and it is sent only when set. The image goes as a data URL
    (`image_format`).

    The checkpoint's own sampling settings come from `generation_config` (its folder or
    `generation_config.json`), else from the served name when it is a folder here, else
    from its snapshot in the local Hugging Face cache. Where neither exists, an unset top_p/top_k is left out of the request and
    the server applies its default (vLLM: the checkpoint's generation_config.json too).
    """

    _backend = "openai-compat-captioner"

    def __init__(self, model: str, base_url: str, *, api_key: str | None = None, api_key_env: str | None = None,
                 max_concurrency: int = 8, timeout: float = 300, max_retries: int = 4, backoff: float = 1.0,
                 image_format: str = "png", system_prompt: str | None = None,
                 extra_body: dict[str, Any] | None = None, generation_config: str | None = None):
        super().__init__(model, base_url, api_key=api_key, api_key_env=api_key_env,
                         max_concurrency=max_concurrency, timeout=timeout,
                         max_retries=max_retries, backoff=backoff, image_format=image_format,
                         system_prompt=system_prompt, extra_body=extra_body)
        self.generation_config = generation_config
        if generation_config is not None and not Path(generation_config).exists():
            raise FileNotFoundError(f"captioner generation_config not found: {generation_config}")

    def generation_defaults(self) -> dict[str, Any]:
        if self.generation_config is not None:
            return generation_defaults(self.generation_config)
        if Path(self.model).is_dir():  # served (or, in process, loaded) from a folder this machine sees
            return generation_defaults(self.model)
        try:
            from huggingface_hub import try_to_load_from_cache

            cached = try_to_load_from_cache(self.model, "generation_config.json")
        except Exception:  # a served name that is no hub id, or no hub library: nothing to read
            return {}
        return generation_defaults(cached) if isinstance(cached, str) else {}

    def _output_settings(self) -> dict[str, Any]:
        # sampling settings come with each call and are part of the cache key, not of the backend
        settings = super()._output_settings()
        for key in ("max_new_tokens", "top_logprobs", "temperature"):
            settings.pop(key)
        return settings

    def caption(self, requests: Sequence[CaptionRequest], sampling: Sampling) -> list[list[str]]:
        contents = self._contents([VLMRequest(r.image, r.prompt, r.image_key) for r in requests])
        sampling = complete_sampling(sampling, self.generation_defaults())
        bodies = []
        for request, content in zip(requests, contents):
            body = self._body(content, sampling.max_new_tokens, logprobs=False)
            body.update(temperature=sampling.temperature, n=request.n, seed=request.seed)
            body.update({key: getattr(sampling, key) for key in ("top_p", "top_k") if getattr(sampling, key) is not None})
            bodies.append(body)
        out = []
        for request, response in zip(requests, self._chat_all(bodies)):
            choices = sorted(response.get("choices") or [], key=lambda c: c.get("index", 0))
            if len(choices) != request.n:
                raise OpenAICompatError(
                    f"{self.base_url} returned {len(choices)} choices for n={request.n} (model {self.model!r}); "
                    f"the server must support `n` in chat completions (vLLM and SGLang do)")
            out.append([((c.get("message") or {}).get("content") or "").strip() for c in choices])
        return out
