"""Turning a model setting into a model, the same way for every command.

Every command (score, caption, t2i, suite, cttd build) builds its models through
`build_model`, so each gets the same three things:

- the secrets among the options (`api_key`, a token, a URL's password) are registered for
  masking before anything can print or write them;
- a name the registry cannot resolve, or an option or value the backend refuses, stops
  the run with one line naming the setting, rather than a traceback;
- a local folder holding the wrong kind of model for its role (a generator's pipeline
  given as an embedder, an embedder as the generator, a text-only language model as a
  judge or captioner) is refused before any work. Backends load weights on first use, so
  without this the mistake would show only then, as one error per row.
"""

from __future__ import annotations

import importlib
import json
import math
import types
import typing
from pathlib import Path
from typing import Any, Mapping

from caprecon.core.errors import ConfigError
from caprecon.core.redaction import redact, remember_options
from caprecon.models import registry

# the roles whose model must read images
_SEES_IMAGES = ("judge", "captioner")


def build_model(role: str, spec: Any, options: Mapping[str, Any] | None = None, *, setting: str | None = None) -> Any:
    """The `role`'s model from `spec` (see `registry.construct`) and its `options`.

    `setting` names the option that gave the model (`judge`, `vlm`, `judge-for colour=MODEL`),
    so the error says what to change; it defaults to the role. Raises `ConfigError`.
    """
    setting = setting or role
    options = dict(options or {})
    remember_options(options)  # masked in logs, messages and manifests from here on
    if spec is None:
        raise ConfigError(f"this run needs a {role}: set --{setting} (see `caprecon models`)")
    flag = f"--{setting}-opt" if setting in _OPTION_FLAGS else f"--{setting}"
    check_option_types(_constructor(role, spec), options, flag)  # before the backend converts them
    try:
        model = registry.construct(role, spec, **options)
    except ConfigError:  # already one line naming its setting (a plug-in refused)
        raise
    except (TypeError, ValueError) as exc:  # an unknown option, or a value the backend refuses
        shown = ", ".join(f"{k}={v!r}" for k, v in redact(options).items()) or "none"
        raise ConfigError(f"--{setting} {spec!r}: bad {role} or options ({shown}): {exc}") from None
    check_model_kind(role, setting, model)
    check_option_types(type(model), options, flag)  # a factory may pass options on to the class it picks
    return model


def build(role: str, spec: Any, **options: Any) -> Any:
    """A model for `role` (`generator`, `embedder`, `matcher`, `judge`, `llm`, `captioner`) from a
    registry name, a local folder, a hub id or `module:Class`, built as every command builds it.

        judge = caprecon.build("judge", "qwen2.5-vl-3b", base_url="http://localhost:8000/v1", api_key=KEY)

    Raises `ConfigError` naming the setting when the model cannot serve as `role`."""
    return build_model(role, spec, options)


def model_of(role: str, model: Any) -> Any:
    """`model` itself when it is a model; a name or path given to a metric built by `build`."""
    return build_model(role, model) if isinstance(model, (str, Path)) else model


def _constructor(role: str, spec: Any) -> Any:
    """What `registry.construct` calls for a registry name or a model path; None for an object or
    a plug-in (`module:Class`), which are not imported here."""
    if not isinstance(spec, str) or role not in registry.ROLES:
        return None
    table, default_backend = registry.ROLES[role]
    if spec in table:
        target = table[spec].factory
    elif registry.imports_code(spec):
        return None
    else:
        target = default_backend
    module, _, name = target.partition(":")
    try:
        return getattr(importlib.import_module(module), name, None)
    except ImportError:  # `registry.construct` says so in one line, as a ConfigError
        return None


# the settings whose options come from a --NAME-opt flag
_OPTION_FLAGS = ("generator", "embedder", "judge", "llm", "captioner")


def check_option_types(constructor: Any, options: Mapping[str, Any], flag: str) -> None:
    """Each option that `constructor` declares must have the declared type (a float a finite
    number): backends convert with int()/float() or pass a value on, so a wrong type would
    otherwise surface only when the model runs, as one error per row, or never."""
    if constructor is None:
        return
    if isinstance(constructor, type):
        constructor = constructor.__init__
    try:
        hints = typing.get_type_hints(constructor)
    except (NameError, TypeError, AttributeError):  # an annotation this Python cannot evaluate: left to the backend
        return
    for key, value in options.items():
        expected = hints.get(key)
        if expected is not None and not _has_type(value, expected):
            raise ConfigError(f"{flag} {key}={value!r}: {key} must be {_describe(expected)}")


def _has_type(value: Any, expected: Any) -> bool:
    origin = typing.get_origin(expected)
    if origin in (typing.Union, types.UnionType):
        return any(_has_type(value, arg) for arg in typing.get_args(expected))
    if expected is Any or isinstance(expected, typing.TypeVar):
        return True
    if expected is type(None):
        return value is None
    if expected is bool:
        return isinstance(value, bool)
    if expected is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if expected is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if expected is Path:
        return isinstance(value, (str, Path))
    cls = origin or expected
    return not isinstance(cls, type) or isinstance(value, cls)


def _describe(expected: Any) -> str:
    if typing.get_origin(expected) in (typing.Union, types.UnionType):
        return " or ".join(_describe(arg) for arg in typing.get_args(expected))
    names = {int: "a whole number", float: "a finite number", bool: "true or false", str: "text",
             type(None): "unset (null)", Path: "a path"}
    return names.get(expected, getattr(typing.get_origin(expected) or expected, "__name__", str(expected)))


def check_model_kind(role: str, setting: str, model: Any) -> None:
    """Refuse a local folder that holds the wrong kind of model for `role`.

    A diffusers pipeline folder has `model_index.json`; a transformers model, `config.json`
    with its `model_type`. Models that are not a local folder (a served model, an object
    built in Python) are not checked here.
    """
    source = getattr(model, "source", None)
    folder = getattr(source, "path", None)
    if folder is None or not Path(folder).is_dir():
        return
    folder = Path(folder)
    is_pipeline = (folder / "model_index.json").exists()
    if role == "generator" and not is_pipeline:
        found = _model_type(folder)
        raise ConfigError(f"--{setting} {source.name}: not a diffusers text-to-image pipeline (no model_index.json"
                          f"{'; it holds a ' + found + ' model' if found else ''}); give a generator's folder or hub id")
    if role != "generator" and is_pipeline:
        raise ConfigError(f"--{setting} {source.name}: this folder holds a diffusers pipeline (a generator), "
                          f"not {'an' if role[0] in 'aeiou' else 'a'} {role}; pass it to --generator")
    if role in _SEES_IMAGES:
        text_only = _text_only_type(folder)
        if text_only:
            raise ConfigError(f"--{setting} {source.name}: a text-only language model ({text_only}) cannot see "
                              f"images; a {role} must be a vision-language model (see `caprecon models`)")


def _model_type(folder: Path) -> str | None:
    try:
        return json.loads((folder / "config.json").read_text(encoding="utf-8")).get("model_type")
    except (OSError, ValueError, AttributeError):
        return None


def _text_only_type(folder: Path) -> str | None:
    """The folder's model type when transformers knows it as a language model that does not
    read images; None for a vision-language model and for anything transformers does not
    know (a served or custom architecture is left to its backend)."""
    model_type = _model_type(folder)
    if model_type is None:
        return None
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES,
        MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES)

    if model_type in MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES:
        return None
    if model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES or model_type in MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES:
        return model_type
    return None
