"""A run's configuration: defaults < preset < config file < explicit arguments.

The same `RunConfig` is built from the CLI, a YAML/TOML file or Python keywords, and is
written whole into the run manifest.
"""

from __future__ import annotations

import json
import string
from dataclasses import dataclass, field, fields
from functools import cached_property
from pathlib import Path
from typing import Any, Iterator

from caprecon.core.checks import MAX_SEEDS, check_count, check_number
from caprecon.models import registry
from caprecon.core.errors import ConfigError
from caprecon.core.records import read_text
from caprecon.core.paths import default_cache_dir
from caprecon.reconstruct.reconstructor import SEED_POLICIES, ReconstructionSpec, check_max_side, parse_size


def _placeholders(template: str) -> set[str] | None:
    """The `{names}` a format string fills; None when it is not a valid one."""
    try:
        return {name for _, name, _, _ in string.Formatter().parse(template) if name is not None}
    except ValueError:
        return None


@dataclass
class RunConfig:
    metrics: list[str] = field(default_factory=lambda: ["recon"])
    generator: Any = None
    generator_options: dict[str, Any] = field(default_factory=dict)
    embedder: Any = None
    embedder_options: dict[str, Any] = field(default_factory=dict)
    clip: Any = "openai/clip-vit-base-patch32"  # the CLIP of clip-image, clipscore and refclipscore
    judge: Any = None  # the VLM of turing, vqascore and fleur
    judge_options: dict[str, Any] = field(default_factory=dict)
    judge_for: dict[str, Any] = field(default_factory=dict)  # turing: category -> its own judge
    judge_for_options: dict[str, dict[str, Any]] = field(default_factory=dict)  # category -> that judge's options
    iou_threshold: float = 0.5  # turing/captionqa: a box answer is correct at IoU >= this
    llm: Any = None  # the text LLM of captionqa
    llm_options: dict[str, Any] = field(default_factory=dict)
    qa_bank: str | None = None  # the QA bank (JSONL) of turing and captionqa
    vqa_template: str = "Is the figure showing: {caption}?"
    vqa_on: str = "image"  # image, reconstruction or both
    vqa_normalise: bool = False
    fleur_prompt: str | None = None  # None: FLEUR's own instruction; any other is named in the manifest
    clipscore_weight: float | None = None  # None: clipscore's own w = 2.5 (Hessel); clip-s keeps 100
    clipscore_prefix: str | None = None  # None: "A photo depicts "; "" for the bare caption
    beta: float = 1.0  # halluc's F_beta: beta > 1 weighs coverage more, beta < 1 precision
    template: str = "plain"
    seed: int = 0
    seed_policy: str = "per-sample"
    seeds: int = 1  # reconstructions per caption: image metrics report their mean, sd and 95 % interval
    max_seeds: int | None = None  # adaptive seeds ("MIN..MAX" or "auto" as seeds): further seeds up to this
    target_width: float | None = None  # adaptive seeds: the interval width each caption's draws aim at
    adaptive_rule: str = "mixture"  # adaptive seeds' variance: mixture, moderated, pooled or stein (metrics/adaptive.py)
    adaptive_stages: int | None = None  # adaptive seeds' most rounds of generation; None: the rule's own (5; stein 2)
    ceiling: bool = False  # also reconstruct each row's references: its score beside theirs (the human ceiling)
    max_side: int = 1024
    upscale: bool = True
    size: str | None = None  # "WxH" for every reconstruction; caption-only rows default to the generator's own
    normalise_captions: bool = False  # markdown, list markers and line breaks out (caprecon.normalise)
    batch_size: int = 16
    workers: int = 4  # threads reading, hashing and decoding images ahead of the models (0: in line)
    cache_dir: str | None = None
    cache_overlay: str | None = None  # where new results go when cache_dir is read-only (default OUT/cache-overlay)
    cache_read_only: bool | None = None  # None: detected; True: never write to cache_dir
    no_cache: bool = False
    keep: str = "images"  # what the store keeps: images, vectors (no picture files) or none (caprecon.store.index)
    cache_max_size: int | None = None  # bytes the store may hold; past it, the oldest entries are deleted
    preset: str | None = None
    # trust config files that name code (module:Class): the --config file, a distilled:FOLDER's config.json.
    # Set by the caller only (`build`'s allow_plugins), never by a config file itself
    allow_plugins: bool = False

    def __post_init__(self) -> None:
        # settings come from the CLI, YAML/TOML files and Python alike: check them once, here
        check_count("--batch-size", self.batch_size, 1)
        check_count("--workers", self.workers, 0)
        check_count("--max-side", self.max_side, 16)
        try:  # sizes the generator could not allocate stop here, not at the first reconstruction
            check_max_side(self.max_side)
            if self.size is not None:
                parse_size(self.size)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        check_count("--seed", self.seed, 0, 2**63 - 1)
        given = self.seeds
        if isinstance(self.seeds, str):
            self.seeds, self.max_seeds = parse_seeds(self.seeds)
        check_count("--seeds", self.seeds, 1, MAX_SEEDS)
        if self.max_seeds is not None and self.target_width is None:
            raise ConfigError(f"--seeds {str(given).strip()} (adaptive seeds) needs --target-width W, the width of the "
                              f"95% interval each caption's seeds aim at (e.g. --target-width 0.01)")
        if self.max_seeds is None and self.target_width is not None:
            raise ConfigError("--target-width is for adaptive seeds: give it with --seeds MIN..MAX (e.g. 3..16) "
                              "or --seeds auto")
        if self.max_seeds is not None:
            check_count("--seeds", self.seeds, 2, MAX_SEEDS)  # an interval needs two seeds
            check_count("--seeds (the most)", self.max_seeds, self.seeds, MAX_SEEDS)
            check_number("--target-width", self.target_width, 0, low_open=True)
        # imported here, not with the module: reading a config (`caprecon --help`) loads no metric or store
        from caprecon.metrics.adaptive import RULES as ADAPTIVE_RULES, check_stages
        from caprecon.store.index import check_policy

        if self.adaptive_rule not in ADAPTIVE_RULES:
            raise ConfigError(f"--adaptive-rule must be one of {', '.join(ADAPTIVE_RULES)}, "
                              f"not {self.adaptive_rule!r}")
        if self.adaptive_stages is not None and self.max_seeds is None:
            raise ConfigError("--adaptive-stages is for adaptive seeds: give it with --seeds MIN..MAX (e.g. 3..16) "
                              "and --target-width W")
        if self.max_seeds is not None:
            check_stages(self.adaptive_rule, self.adaptive_stages)
        if isinstance(self.generator, (list, tuple)):  # several: an ensemble; one in a list is just that one
            if not self.generator:
                raise ConfigError("generator: an empty list names no generator")
            self.generator = list(self.generator) if len(self.generator) > 1 else self.generator[0]
        for name in ("upscale", "no_cache", "vqa_normalise", "ceiling", "allow_plugins"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name} must be true or false, not {getattr(self, name)!r}")
        check_policy(self.keep, self.cache_max_size)
        for option, folder in (("--cache-dir", self.cache_dir), ("--cache-overlay", self.cache_overlay)):
            # a file there would pass for a read-only cache, and the first new result be refused as one
            if folder is not None and Path(folder).exists() and not Path(folder).is_dir():
                raise ConfigError(f"{option}: not a folder: {folder} is a file")
        weight = self.clipscore_weight
        if weight is not None and (isinstance(weight, bool) or not isinstance(weight, (int, float))
                                   or not weight > 0):
            raise ConfigError(f"clipscore_weight must be a positive number, not {weight!r}")
        if isinstance(self.beta, bool) or not isinstance(self.beta, (int, float)) \
                or not 0 < self.beta < float("inf"):  # NaN fails this too
            raise ConfigError(f"--beta must be a positive number, not {self.beta!r}")
        if self.clipscore_prefix is not None and not isinstance(self.clipscore_prefix, str):
            raise ConfigError(f"clipscore_prefix must be text, not {self.clipscore_prefix!r}")
        if isinstance(self.iou_threshold, bool) or not isinstance(self.iou_threshold, (int, float)) \
                or not 0 < self.iou_threshold <= 1:  # NaN fails this too
            raise ConfigError(f"--iou-threshold must be a number above 0 and at most 1, not {self.iou_threshold!r}")
        if not isinstance(self.vqa_template, str) or _placeholders(self.vqa_template) != {"caption"}:
            raise ConfigError(f"--vqa-template must contain {{caption}} and no other {{...}} placeholder, not "
                              f"{self.vqa_template!r} (write a literal brace as {{{{ or }}}})")
        for name, allowed in (("vqa_on", ("image", "reconstruction", "both")), ("seed_policy", SEED_POLICIES)):
            if getattr(self, name) not in allowed:
                raise ConfigError(f"{name} must be one of {', '.join(allowed)}, not {getattr(self, name)!r}")

    @classmethod
    def build(cls, *, preset: str | None = None, file: str | Path | None = None, allow_plugins: bool = False,
              **explicit: Any) -> "RunConfig":
        """Defaults < `preset` < the config `file` < `explicit` settings. A plug-in (`module:Class`)
        named in the file is refused unless `allow_plugins` (see `load_config_file`)."""
        values: dict[str, Any] = {}
        file_values = load_config_file(file, allow_plugins=allow_plugins) if file else {}
        if "allow_plugins" in file_values:
            raise ConfigError(f"{file}: allow_plugins cannot be set in a config file (a file cannot vouch for "
                              f"itself); pass --allow-plugins")
        preset = explicit.get("preset") or preset or file_values.get("preset")
        if preset:
            if preset not in registry.PRESETS:
                raise ConfigError(f"unknown preset {preset!r}; presets: {', '.join(sorted(registry.PRESETS))}")
            values.update({k: v for k, v in registry.PRESETS[preset].items() if k != "about"})
            values["preset"] = preset
        values.update(file_values)
        values.update({k: v for k, v in explicit.items() if v is not None})
        values["allow_plugins"] = allow_plugins  # a file cannot vouch for itself
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - names)
        if unknown:
            raise ConfigError(f"unknown setting(s) {unknown}; known: {sorted(names)}")
        for key in ("generator_options", "embedder_options", "judge_options", "llm_options", "judge_for",
                    "judge_for_options"):  # options merge rather than replace
            merged = {}
            for layer in (registry.PRESETS.get(preset or "", {}), file_values, explicit):
                merged.update(layer.get(key) or {})
            values[key] = merged
        if isinstance(values.get("metrics"), str):
            values["metrics"] = [values["metrics"]]
        return cls(**values)

    @cached_property
    def spec(self) -> ReconstructionSpec:
        try:
            return ReconstructionSpec(template=self.template, seed=self.seed, seed_policy=self.seed_policy,
                                      max_side=self.max_side, upscale=self.upscale, size=self.size)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None

    @property
    def memo_folder(self) -> Path | None:
        """Where this run keeps its memo of file digests (`caprecon.core.digests.keep_memo_in`): its cache
        folder; None (the process alone) under --no-cache, which reads and writes nothing there, and under
        --cache-read-only, which writes nothing there."""
        return None if self.no_cache or self.cache_read_only else Path(self.cache_dir or default_cache_dir())

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        for key in ("generator", "embedder", "clip", "judge", "llm"):
            if isinstance(out[key], list):
                out[key] = [v if isinstance(v, (str, int, float)) else type(v).__name__ for v in out[key]]
            elif out[key] is not None and not isinstance(out[key], (str, int, float)):
                out[key] = type(out[key]).__name__
        out["judge_for"] = {cat: spec if isinstance(spec, (str, int, float)) else type(spec).__name__
                            for cat, spec in self.judge_for.items()}
        return json.loads(json.dumps(out, default=str))


AUTO_SEEDS = (3, 16)  # `--seeds auto`: three seeds give a usable first interval (t = 4.3; two give t = 12.7)


def parse_seeds(text: str | int) -> tuple[int, int | None]:
    """`--seeds`: K (a fixed count: (K, None)), MIN..MAX or auto (adaptive: (MIN, MAX))."""
    if isinstance(text, int) and not isinstance(text, bool):
        return text, None
    text = str(text).strip()
    if text == "auto":
        return AUTO_SEEDS
    low, sep, high = text.partition("..")
    try:
        return (int(low), int(high)) if sep else (int(text), None)
    except ValueError:
        raise ConfigError(f"--seeds must be a count K, a range MIN..MAX (e.g. 3..16) or auto, not {text!r}") from None


def load_config_file(path: str | Path, *, allow_plugins: bool = False) -> dict[str, Any]:
    """The settings of a YAML or TOML file. A file can come from anyone, and a plug-in it names
    (`generator: "pkg.module:Class"`) is code the run would import and call, with the file's
    options as arguments (`os:system` runs a command): unless `allow_plugins`, such a value
    stops with a `ConfigError` here, before any model loads, and the file's every text is
    handed to `registry.distrust`, so that a spec this scan missed is still refused where
    it would be imported. Plug-ins given on the command line are the user's own and load
    as always."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"config file not found: {path}")
    if not path.is_file():
        raise ConfigError(f"--config {path}: not a file (give the YAML or TOML file of settings)")
    text = read_text(path, ConfigError)
    if path.suffix == ".toml":
        import tomllib

        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path}: not valid TOML ({exc})") from None
    else:
        import yaml

        try:
            data = yaml.safe_load(text) or {}
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
            raise ConfigError(f"{path}: not valid YAML{where} ({getattr(exc, 'problem', None) or exc})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of settings")
    if not allow_plugins:
        texts = list(_texts(data))
        for where, text in texts:
            for spec in registry.plugins_in(text):
                raise registry.plugin_refused(str(path), where, spec)
        registry.distrust(str(path), texts)
    return {k.replace("-", "_"): v for k, v in data.items()}


def _texts(value: Any, where: str = "") -> Iterator[tuple[str, str]]:
    """(setting, text) of every string in a config file, keys included, at any depth."""
    if isinstance(value, dict):
        for key, item in value.items():
            setting = f"{where}.{key}" if where else str(key)
            yield setting, str(key)
            yield from _texts(item, setting)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _texts(item, f"{where}[{i}]")
    elif isinstance(value, str):
        yield where, value


def parse_options(pairs: list[str] | None) -> dict[str, Any]:
    """`key=value` strings from the CLI; values parsed as YAML (numbers, bools, lists)."""
    import yaml

    out: dict[str, Any] = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ConfigError(f"option {pair!r} must look like key=value")
        try:
            out[key.replace("-", "_")] = yaml.safe_load(value)
        except yaml.YAMLError as exc:  # the value is not echoed: it may hold a header's credentials
            mark = getattr(exc, "problem_mark", None)
            where = f" at character {mark.column + 1}" if mark else ""
            raise ConfigError(f"option {key}: its value is not valid YAML{where} "
                              f"({getattr(exc, 'problem', None) or type(exc).__name__})") from None
    return out


def parse_pairs(pairs: list[str], option: str, key_word: str = "CATEGORY") -> dict[str, str]:
    """`name=value` strings kept as text (a model name is never a number or a list); `key_word`
    says in an error what the option's names are (score's categories, suite's datasets)."""
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise ConfigError(f"{option} {pair!r} must look like {key_word}=MODEL")
        out[key.strip()] = value.strip()
    return out
