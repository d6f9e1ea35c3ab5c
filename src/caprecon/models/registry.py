"""Names for models and presets, mapped to constructors: one table per role, no if/elif.

A role is built from a *spec* plus keyword options:

- a registry name (`caprecon models` lists them): its defaults, overridden by options;
- `module:Class` (or `module:function`): imported and called with the options;
- anything else is a hub id or a local folder, given to the role's default backend
  (`DiffusersGenerator` for generators, `HFVisionEmbedder` for embedders, ...).

A plug-in is code, so whether to import it is decided here, on the spec as `construct` got it
(labels, spaces and quotes already taken off by whoever parsed it): text read from a config
file without `--allow-plugins` is remembered (`distrust`), and a plug-in spec found in any
of it is refused, whatever syntax carried it there.
"""

from __future__ import annotations

import importlib
import re
import threading
from dataclasses import dataclass, field
from importlib import resources
from typing import Any, Callable, Iterable

from caprecon.core.errors import ConfigError


@dataclass(frozen=True)
class Entry:
    factory: str  # "module:attr", imported only when used
    defaults: dict[str, Any] = field(default_factory=dict)
    about: str = ""
    # caption tokens the model reads at once, as its published files state (the loaded model's own
    # figure goes in the manifest); None where not stated here
    text_budget: int | None = None


def _diffusers(model: str, about: str, text_budget: int | None = None, **defaults: Any) -> Entry:
    return Entry("caprecon.models.generator:DiffusersGenerator", {"model": model, **defaults}, about, text_budget)


def _hf_vision(model: str, about: str) -> Entry:
    return Entry("caprecon.models.embedder:HFVisionEmbedder", {"model": model}, about)


GENERATORS: dict[str, Entry] = {
    # the base Z-Image uses classifier-free guidance: no guidance here leaves the pipeline's own
    # default in force (guidance 0 turns it off, which suits only the distilled Turbo model)
    "z-image": _diffusers("Tongyi-MAI/Z-Image", "Z-Image (the ReconScore paper's generator)", steps=28,
                          max_sequence_length=512),
    # one LLM text encoder (Qwen3-4B), no CLIP beside it: 512 tokens, the default max_sequence_length
    # of diffusers' ZImagePipeline (0.42)
    "z-image-turbo": _diffusers("Tongyi-MAI/Z-Image-Turbo", "Z-Image-Turbo, 8 steps", text_budget=512, steps=8,
                                guidance=0.0),
    "qwen-image": _diffusers("Qwen/Qwen-Image", "Qwen-Image", steps=28),
    "sd3.5-large": _diffusers("stabilityai/stable-diffusion-3.5-large", "Stable Diffusion 3.5 Large", steps=28,
                              guidance=3.5),
    "sd3.5-medium": _diffusers("stabilityai/stable-diffusion-3.5-medium", "Stable Diffusion 3.5 Medium", steps=28,
                               guidance=4.5),
    "flux.1-dev": _diffusers("black-forest-labs/FLUX.1-dev", "FLUX.1 [dev]", steps=28, guidance=3.5),
    "flux.1-schnell": _diffusers("black-forest-labs/FLUX.1-schnell", "FLUX.1 [schnell], 4 steps", steps=4,
                                 guidance=0.0),
    "flux.2-klein-4b": _diffusers("black-forest-labs/FLUX.2-klein-4B", "FLUX.2 [klein] 4B", steps=4),
    "sdxl": _diffusers("stabilityai/stable-diffusion-xl-base-1.0", "SDXL base", steps=30, guidance=5.0),
    "sdxl-turbo": _diffusers("stabilityai/sdxl-turbo", "SDXL-Turbo, 4 steps, no guidance", steps=4, guidance=0.0),
    "retrieval": Entry("caprecon.models.registry:build_retrieval", {},
                       "retrieve the best-matching gallery image (options: gallery, matcher, exclude_source)"),
}

EMBEDDERS: dict[str, Entry] = {
    "dreamsim": Entry("caprecon.models.embedder:DreamSimEmbedder", {"variant": "ensemble"},
                      "DreamSim ensemble (the ReconScore paper's default; extra 'dreamsim')"),
    "clip": _hf_vision("openai/clip-vit-large-patch14", "CLIP ViT-L/14 image features"),
    "clip-b32": _hf_vision("openai/clip-vit-base-patch32", "CLIP ViT-B/32 image features"),
    "siglip2": _hf_vision("google/siglip2-base-patch16-224", "SigLIP 2 base image features"),
    "dinov2": _hf_vision("facebook/dinov2-base", "DINOv2 base, CLS token"),
    "dinov2-large": _hf_vision("facebook/dinov2-large", "DINOv2 large, CLS token"),
    "efficientnet-lite0": Entry("caprecon.models.efficientnet:EfficientNetLite0Embedder", {},
                                "EfficientNet-Lite0 ImageNet features, shipped on PyPI (offline default)"),
}

MATCHERS: dict[str, Entry] = {
    "imagenet-labels": Entry("caprecon.models.matcher:ImageNetLabelMatcher", {},
                             "caption vs the image's ImageNet labels, in MiniLM sentence space (offline)"),
    "clip": Entry("caprecon.models.matcher:ClipMatcher", {"model": "openai/clip-vit-large-patch14"},
                  "CLIP text-image similarity"),
}

def _judge(model: str, about: str, box_coords: str, text_budget: int | None = None) -> Entry:
    # box_coords: the family's own grounding convention (0-1000 grid, pixels of the resized input, fractions)
    return Entry("caprecon.models.registry:build_judge", {"model": model, "box_coords": box_coords}, about,
                 text_budget)


JUDGES: dict[str, Entry] = {
    # 262,144 tokens: text_config.max_position_embeddings of the checkpoint's config.json
    "qwen3-vl-8b": _judge("Qwen/Qwen3-VL-8B-Instruct", "Qwen3-VL 8B Instruct (the Caption Turing Test judge)",
                          "1000", text_budget=262144),
    "qwen3-vl-32b": _judge("Qwen/Qwen3-VL-32B-Instruct", "Qwen3-VL 32B Instruct", "1000"),
    "qwen2.5-vl-7b": _judge("Qwen/Qwen2.5-VL-7B-Instruct", "Qwen2.5-VL 7B Instruct", "pixel"),
    "qwen2.5-vl-72b": _judge("Qwen/Qwen2.5-VL-72B-Instruct", "Qwen2.5-VL 72B Instruct (the paper's grounding judge)",
                             "pixel"),
    "llava-1.5-13b": _judge("llava-hf/llava-1.5-13b-hf", "LLaVA-1.5 13B (VQAScore's judge)", "normalized"),
    "instructblip-flan-t5-xl": _judge("Salesforce/instructblip-flan-t5-xl", "InstructBLIP Flan-T5-XL (VQAScore)",
                                      "normalized"),
    # no model: published answers replayed (--judge-opt answers=FILE), keyed by generator/item and question
    "recorded": Entry("caprecon.models.recorded:RecordedJudge", {}, "answers recorded in a file, replayed (DSG's layout)"),
}

LLMS: dict[str, Entry] = {
    # 40,960 tokens: max_position_embeddings of the checkpoint's config.json
    "qwen3-8b": Entry("caprecon.models.registry:build_llm", {"model": "Qwen/Qwen3-8B"}, "Qwen3 8B (CaptionQA)",
                      text_budget=40960),
    "qwen2.5-7b": Entry("caprecon.models.registry:build_llm", {"model": "Qwen/Qwen2.5-7B-Instruct"},
                        "Qwen2.5 7B Instruct"),
}

def _captioner(model: str, about: str) -> Entry:
    return Entry("caprecon.models.registry:build_captioner", {"model": model}, about)


CAPTIONERS: dict[str, Entry] = {
    "qwen3-vl-8b": _captioner("Qwen/Qwen3-VL-8B-Instruct", "Qwen3-VL 8B Instruct (RemoteDescriber's captioner)"),
    "qwen2.5-vl-7b": _captioner("Qwen/Qwen2.5-VL-7B-Instruct", "Qwen2.5-VL 7B Instruct"),
    "llava-1.5-7b": _captioner("llava-hf/llava-1.5-7b-hf", "LLaVA-1.5 7B"),
}

ROLES: dict[str, tuple[dict[str, Entry], str]] = {
    "generator": (GENERATORS, "caprecon.models.generator:DiffusersGenerator"),
    "embedder": (EMBEDDERS, "caprecon.models.embedder:HFVisionEmbedder"),
    "matcher": (MATCHERS, "caprecon.models.matcher:ClipMatcher"),
    "judge": (JUDGES, "caprecon.models.registry:build_judge"),
    "llm": (LLMS, "caprecon.models.registry:build_llm"),
    "captioner": (CAPTIONERS, "caprecon.models.registry:build_captioner"),
}


def build_judge(model: str, base_url: str | None = None, **options: Any):
    """A transformers VLM, or with `base_url` a model on an OpenAI-compatible server."""
    if base_url:
        from caprecon.models.openai_compat import OpenAICompatVLM

        return OpenAICompatVLM(model, base_url, **options)
    from caprecon.models.vlm_transformers import TransformersVLM

    return TransformersVLM(model, **options)


def build_llm(model: str, base_url: str | None = None, **options: Any):
    if base_url:
        from caprecon.models.openai_compat import OpenAICompatLLM

        return OpenAICompatLLM(model, base_url, **options)
    from caprecon.models.llm import TransformersLLM

    return TransformersLLM(model, **options)


def build_captioner(model: str, base_url: str | None = None, **options: Any):
    """A transformers VLM sampling captions, or with `base_url` a model on an OpenAI-compatible server."""
    from caprecon.models.captioner import OpenAICompatCaptioner, TransformersCaptioner

    if base_url:
        return OpenAICompatCaptioner(model, base_url, **options)
    return TransformersCaptioner(model, **options)


def register(role: str, name: str, factory: str, about: str = "", **defaults: Any) -> None:
    """Add a name to a role's table (plug-ins call this at import)."""
    ROLES[role][0][name] = Entry(factory, defaults, about)


def _import(target: str) -> Callable[..., Any]:
    module, _, attr = target.partition(":")
    try:
        return getattr(importlib.import_module(module), attr)
    except ModuleNotFoundError as exc:
        where = ("; a module:Class is imported from an installed package or a folder on PYTHONPATH, not from the "
                 f"working folder: run with PYTHONPATH=FOLDER (the folder holding {exc.name}/ or {exc.name}.py)"
                 if exc.name and module.split(".")[0] == exc.name else "")
        raise ValueError(f"cannot import {target!r}: {exc}{where}") from None
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"cannot import {target!r}: {exc}") from None


def imports_code(spec: Any) -> bool:
    """Whether `construct` takes `spec` for a plug-in, `module:attribute`, and so imports and calls
    code (a hub id or folder has a `/` or `\\`; registry names are looked up before this)."""
    return isinstance(spec, str) and ":" in spec and "/" not in spec and "\\" not in spec


# (file, setting, text) of every text read from a config file without --allow-plugins. Process-wide
# rather than per context: a model built in another thread must be refused all the same.
_untrusted: list[tuple[str, str, str]] = []
_untrusted_lock = threading.Lock()
# what a parser may strip around a spec (`x= os:system`, `"os:system"`): ignored when looking for one in text
_PADDING = re.compile(r"[\s\"'`]")


def distrust(source: str, texts: Iterable[tuple[str, str]]) -> None:
    """Remember the (setting, text) pairs of the config file `source`, read without --allow-plugins:
    `construct` imports no plug-in whose spec occurs in any of them."""
    with _untrusted_lock:
        _untrusted.extend((str(source), where, text) for where, text in texts)


def plugins_in(text: str) -> list[str]:
    """The plug-in specs a setting's `text` could be resolved to: the whole or any part of a
    `LABEL=SPEC`, spaces and quotes around it stripped. Prompts and templates (spaces or braces
    inside) are text, never a model."""
    parts = {part.strip().strip("\"'`").strip() for part in [text, *text.split("=")]}
    return sorted(part for part in parts if imports_code(part) and not re.search(r"[\s{}]", part))


def plugin_refused(source: str, where: str, spec: str) -> ConfigError:
    return ConfigError(f"{source}: {where} names the plug-in {spec!r}, code the run would import and call; "
                       f"plug-ins named in a config file load only with --allow-plugins (give it if you "
                       f"trust this file, or name the plug-in on the command line)")


def _check_trusted(spec: str) -> None:
    bare = _PADDING.sub("", spec)
    with _untrusted_lock:
        found = next(((source, where) for source, where, text in _untrusted if bare in _PADDING.sub("", text)), None)
    if found:
        raise plugin_refused(*found, spec)


def import_plugin(spec: str) -> Any:
    """What the plug-in spec `module:attribute` names, imported unless a config file read without
    --allow-plugins named it (`distrust`); every plug-in, of any role or a metric, comes through here."""
    _check_trusted(spec)
    return _import(spec)


def construct(role: str, spec: str | Any, **options: Any) -> Any:
    """Construct a role's backend from a spec (see the module doc); objects pass through. Unchecked and
    unmasked: commands and `caprecon.build` build through `caprecon.models.build.build_model`, which
    registers the options as secrets to mask and checks the model serves its role."""
    if role not in ROLES:
        raise ValueError(f"unknown role {role!r}; roles: {sorted(ROLES)}")
    if not isinstance(spec, str):
        return spec
    table, default_backend = ROLES[role]
    if spec in table:
        entry = table[spec]
        return _import(entry.factory)(**{**entry.defaults, **options})
    if imports_code(spec):
        return import_plugin(spec)(**options)
    return _import(default_backend)(spec, **options)


def demo_gallery() -> str:
    return str(resources.files("caprecon.data") / "demo" / "images")


def build_retrieval(gallery: str | None = None, matcher: str | Any = "imagenet-labels",
                    exclude_source: bool = False, matcher_options: dict[str, Any] | None = None):
    from caprecon.models.generator import RetrievalGenerator

    return RetrievalGenerator(gallery or demo_gallery(), construct("matcher", matcher, **(matcher_options or {})),
                              exclude_source=exclude_source)


# Run presets: defaults for a whole run, overridden by anything the user sets.
PRESETS: dict[str, dict[str, Any]] = {
    "paper-recon": {
        # The paper gives steps (28), text length (512 tokens) and size, not a guidance scale:
        # the pipeline's own default applies unless the user sets one.
        "about": "the ReconScore paper: Z-Image, 28 steps, 512 text tokens, the pipeline's default guidance, "
                 "the source's aspect ratio with the long side capped at 1024 (smaller sources kept at their "
                 "size), DreamSim, remote-sensing template (our wording), one fixed noise for every caption",
        "generator": "z-image", "generator_options": {"steps": 28, "max_sequence_length": 512},
        "embedder": "dreamsim", "template": "remote-sensing", "max_side": 1024, "upscale": False,
        "seed_policy": "fixed",
    },
    "fast": {
        "about": "screening: SDXL-Turbo in 4 steps at long side 512, DINOv2 features",
        "generator": "sdxl-turbo", "embedder": "dinov2", "max_side": 512,
    },
    "offline": {
        "about": "the embedded offline stand-in behind `make demo`: retrieval from the bundled gallery by "
                 "ImageNet labels + MiniLM, the photo being scored left out, EfficientNet-Lite0 features "
                 "(no text-to-image model)",
        # with its own photo in the gallery a faithful caption would score 1.000 by lookup, which no
        # generator can: left out, the score says how close the nearest other scene the caption fits is
        "generator": "retrieval", "generator_options": {"exclude_source": True},
        "embedder": "efficientnet-lite0", "clip": None,
    },
    # Paragraph-long captions (~300 tokens: DOCCI, CapArena, DetailCaps) read whole by every role;
    # each budget is the registry entry's `text_budget`, with its source there (the generator's 512 is
    # also set as an option, so it does not hang on the pipeline's default). DINOv2 reads no text. CLIP
    # reads 77 tokens, SigLIP 2 64, Long-CLIP 248 (its paper; whether transformers' CLIPModel loads
    # zer0int/LongCLIP-L-Diffusers was not checked offline): none holds a paragraph, so no CLIP is set.
    "detailed": {
        "about": "paragraph-long captions, read whole by every role: Z-Image-Turbo (one Qwen3 text encoder, "
                 "512 tokens), DINOv2 features (no text), Qwen3-VL-8B judge (262,144) and Qwen3-8B text LLM "
                 "(40,960); no CLIP (77 tokens; Long-CLIP's 248 fall short too)",
        "generator": "z-image-turbo", "generator_options": {"max_sequence_length": 512},
        "embedder": "dinov2", "judge": "qwen3-vl-8b", "llm": "qwen3-8b", "clip": None,
    },
}


# Captioning presets for `caprecon caption`: the captioner and how it samples, plus the run
# preset that scores the candidates. Anything the user sets overrides them.
CAPTION_PRESETS: dict[str, dict[str, Any]] = {
    "remote-describer": {
        "about": "RemoteDescriber (ReconScore paper): Qwen3-VL-8B-Instruct, remote-sensing prompt, N = 10 at "
                 "temperature 0.8 (top-k and top-p: the checkpoint's own, as the paper names none), up to 512 "
                 "new tokens (Z-Image reads 512), selected by ReconScore under paper-recon (Z-Image, 28 steps, "
                 "DreamSim, one fixed noise)",
        "captioner": "qwen3-vl-8b", "prompt": "remote-sensing", "n": 10, "temperature": 0.8,
        "max_new_tokens": 512, "select": "recon", "run_preset": "paper-recon",
    },
}


def describe_registry() -> dict[str, dict[str, str]]:
    out = {role: {name: e.about for name, e in table.items()} for role, (table, _) in ROLES.items()}
    out["preset"] = {name: p["about"] for name, p in PRESETS.items()}
    out["caption-preset"] = {name: p["about"] for name, p in CAPTION_PRESETS.items()}
    return out


def registered_as(name: str) -> set[str]:
    """The hub ids or folders a registry name (z-image, dinov2, ...) stands for: a model's
    description in the store names those, not the registry name it was chosen by."""
    return {entry.defaults["model"] for table, _ in ROLES.values() for key, entry in table.items()
            if key == name and isinstance(entry.defaults.get("model"), str)}
