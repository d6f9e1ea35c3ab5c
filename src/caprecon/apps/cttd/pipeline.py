"""The CTTD builder: an image folder in, a Caption Turing Test QA bank and its datasheet out.

    result = build_bank("photos/", "builds/mine", BuildConfig(vlm="qwen3-vl-32b", judge="qwen3-vl-8b"))

Stages run in order, each in its own folder of the build folder:

    01-select      images.jsonl            every image, kept or why not
    02-propose     questions.jsonl         (only with taxonomy="discover")
    03-categorise  taxonomy.json
    04-generate    candidates.jsonl, rejects.jsonl
    05-curate      kept.jsonl, dropped.jsonl
    06-rank        bank.jsonl, scores.jsonl

and the build folder gets `bank.jsonl`, `datasheet.md` and `datasheet.json`. A stage
writes `manifest.json` last, holding a fingerprint of its settings, its models, its
inputs and its code revision; a rerun skips a stage whose manifest matches, and reruns it
(and what follows) otherwise. Every model call is cached in the store (`store/` in the build folder unless
`cache_dir` says otherwise) one image at a time, so a stage interrupted half-way asks
nothing again about the images it had finished.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from dataclasses import dataclass, field, fields
from functools import cached_property
from pathlib import Path
from typing import Any, Callable

from caprecon.metrics.base import Context
from caprecon.models.build import build_model
from caprecon.core.checks import MAX_LIMIT, check_count, check_number
from caprecon.core.describe import describe_model
from caprecon.core.digests import keep_memo_in, memo_scoped
from caprecon.core.errors import ConfigError
from caprecon.core.redaction import redact
from caprecon.store.index import Store, content_key
from caprecon.apps.cttd import categorise, curate, generate, propose, rank, select
from caprecon.apps.cttd.stage import Job, read_records, write_json

QUESTION_TYPES = ("mc", "yesno", "short", "box")


@dataclass
class BuildConfig:
    # models: registry names, hub ids, local folders, `module:Class`, or built objects
    embedder: Any = "clip"  # stage 1: image embeddings for duplicates and density
    embedder_options: dict[str, Any] = field(default_factory=dict)
    matcher: Any = "clip"  # stages 3, 5, 6: texts (and images) in one space
    matcher_options: dict[str, Any] = field(default_factory=dict)
    vlm: Any = "qwen3-vl-32b"  # stages 2 and 4: proposes questions, writes pairs (the paper's questioner)
    vlm_options: dict[str, Any] = field(default_factory=dict)
    judge: Any = None  # stage 5: checks answers on the original image; None: the vlm
    judge_options: dict[str, Any] = field(default_factory=dict)
    llm: Any = "qwen3-8b"  # stage 3 names clusters; stage 5's blind filter
    llm_options: dict[str, Any] = field(default_factory=dict)
    # 1 select
    min_side: int = 64
    uniform_std: float = 4.0
    duplicate_cos: float = 0.95
    density_band: tuple[float, float] = (0.1, 0.9)
    gmm_components: int = 8
    pca_dims: int | None = 64
    seed: int = 0
    # 2-3 categories
    taxonomy: str = "paper"  # "paper", "discover" or a taxonomy JSON file
    propose_prompt: str | None = None
    questions_per_image: int = 10
    dbscan_eps: float = 0.15
    dbscan_min_samples: int = 3
    examples_per_cluster: int = 8
    name_prompt: str | None = None
    # 4 generate
    generate_prompt: str | None = None
    qas_per_category: int = 5
    types: tuple[str, ...] = QUESTION_TYPES
    box_coords: str = "normalized"
    max_new_tokens: int = 1024
    # 5 curate
    judge_check: bool = True
    judge_box_coords: str | None = None
    judge_max_new_tokens: int = 32
    qa_duplicate_cos: float = 0.9
    blind_filter: bool = True  # questions a text-only LLM answers without the image are left out
    blind_keep: bool = False  # keep them instead, flagged "blind": true
    blind_permutations: int = 3
    # 6 rank
    alpha: float = 0.5
    top_k: int = 15

    def __post_init__(self) -> None:
        self.types = tuple(self.types)
        self.density_band = tuple(float(q) for q in self.density_band)  # type: ignore[assignment]
        unknown = [t for t in self.types if t not in QUESTION_TYPES]
        if unknown or not self.types:
            raise ValueError(f"types must be some of {', '.join(QUESTION_TYPES)}, got {list(self.types)}")
        if self.box_coords not in ("normalized", "1000", "pixel"):
            raise ValueError(f"box_coords must be normalized, 1000 or pixel, got {self.box_coords!r}")
        if len(self.density_band) != 2 or not 0 <= self.density_band[0] < self.density_band[1] <= 1:
            raise ValueError(f"density_band must be two quantiles 0 <= low < high <= 1, got {self.density_band}")
        if self.taxonomy not in ("paper", "discover"):
            if not Path(self.taxonomy).is_file():
                raise ValueError(f"taxonomy must be 'paper', 'discover' or a taxonomy JSON file; {self.taxonomy!r} "
                                 f"is none of these")
            categorise.load_taxonomy(self.taxonomy)  # a bad file stops here, before stage 1's models run
        # counts bounded far above any useful setting, so a typo cannot ask for hours of model calls
        for name, low, high in (("min_side", 1, 65536), ("gmm_components", 1, 1000), ("seed", 0, 2**63 - 1),
                                ("questions_per_image", 1, 100), ("dbscan_min_samples", 1, MAX_LIMIT),
                                ("examples_per_cluster", 1, 100), ("qas_per_category", 1, 100),
                                ("max_new_tokens", 1, 131072), ("judge_max_new_tokens", 1, 131072),
                                ("blind_permutations", 1, 26), ("top_k", 1, 1000)):
            check_count(_setting(name), getattr(self, name), low, high)
        if self.pca_dims is not None:
            check_count("--pca-dims", self.pca_dims, 1, 65536)
        check_number("--uniform-std", self.uniform_std, 0, 255)  # a grey level's spread
        for name in ("duplicate_cos", "qa_duplicate_cos"):
            check_number(_setting(name), getattr(self, name), -1, 1)
        check_number("--dbscan-eps", self.dbscan_eps, 0, 2, low_open=True)  # a cosine distance
        # a negative weight would reward redundant questions instead of penalising them
        check_number("--alpha", self.alpha, 0)
        if self.propose_prompt is not None and "{n}" not in self.propose_prompt:
            raise ValueError("the propose prompt must contain {n} (the number of questions)")
        if self.name_prompt is not None and "{questions}" not in self.name_prompt:
            raise ValueError("the cluster-naming prompt must contain {questions}")
        if self.generate_prompt is not None:
            missing = [p for p in ("{category}", "{description}", "{m}", "{types}") if p not in self.generate_prompt]
            if missing:
                raise ValueError(f"the generation prompt must contain {', '.join(missing)}")

    def to_dict(self) -> dict[str, Any]:
        """The settings as the datasheet records them: the options' keys and tokens masked."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        for key in ("embedder", "matcher", "vlm", "judge", "llm"):
            if not isinstance(out[key], (str, type(None))):
                out[key] = type(out[key]).__name__
        return redact(json.loads(json.dumps(out, default=str)))


_ROLES = {"embedder": "embedder", "matcher": "matcher", "vlm": "judge", "judge": "judge", "llm": "llm"}


class BuildModels:
    """The build's models, constructed on first use (weights load later still, on first call)."""

    def __init__(self, config: BuildConfig):
        self.config = config

    def _build(self, name: str) -> Any:
        spec, options = getattr(self.config, name), getattr(self.config, f"{name}_options")
        if name == "judge" and (spec is None or (spec == self.config.vlm and options == self.config.vlm_options)):
            return self.vlm  # one model in both roles: loaded once
        return build_model(_ROLES[name], spec, options, setting=name)

    @cached_property
    def embedder(self):
        return self._build("embedder")

    @cached_property
    def matcher(self):
        from caprecon.models.embedder import HFVisionEmbedder
        from caprecon.models.matcher import ClipMatcher

        cfg = self.config
        if (cfg.matcher, cfg.matcher_options) == (cfg.embedder, cfg.embedder_options) and \
                isinstance(self.embedder, HFVisionEmbedder):  # one CLIP for both: loaded once
            return ClipMatcher(image_embedder=self.embedder)
        return self._build("matcher")

    @cached_property
    def vlm(self):
        return self._build("vlm")

    @cached_property
    def judge(self):
        return self._build("judge")

    @cached_property
    def llm(self):
        return self._build("llm")

    def describe(self) -> dict[str, Any]:
        return {name: describe_model(self.__dict__[name]) for name in _ROLES if name in self.__dict__}


@dataclass(frozen=True)
class Stage:
    name: str
    folder: str
    settings: tuple[str, ...]  # BuildConfig fields the stage's output depends on
    roles: Callable[[BuildConfig], tuple[str, ...]]  # the models it uses
    inputs: tuple[str, ...]  # earlier stages' output files it reads (relative to the build folder)
    run: Callable[[Job], None]
    # bumped when a change to the stage's code changes what it writes, so a finished stage of an
    # older build is redone; 0, the code of the first builds, is left out of the key, so builds
    # made before stages had revisions keep the stages that have not changed since
    revision: int = 0


def _setting(name: str) -> str:
    """A setting as the message names it: its option, or the config key of one that has none."""
    return name if name in ("examples_per_cluster", "judge_max_new_tokens") else "--" + name.replace("_", "-")


def _select(job: Job) -> None:
    select.run(job, job.images)


def _propose(job: Job) -> None:
    if job.config.taxonomy != "discover":
        job.manifest["skipped"] = "a taxonomy is given: no questions to propose"
        return
    propose.run(job, select.selected(job.build))


def _categorise(job: Job) -> None:
    categorise.run(job, read_records(job.upstream(propose.FOLDER, propose.OUTPUT)))


def _generate(job: Job) -> None:
    generate.run(job, select.selected(job.build), categorise.read_taxonomy(job.build))


def _curate(job: Job) -> None:
    curate.run(job, select.selected(job.build), read_records(job.upstream(generate.FOLDER, generate.OUTPUT)))


def _rank(job: Job) -> None:
    rank.run(job, select.selected(job.build), read_records(job.upstream(curate.FOLDER, curate.OUTPUT)))


def _discovering(cfg: BuildConfig, *roles: str) -> tuple[str, ...]:
    return roles if cfg.taxonomy == "discover" else ()


STAGES: tuple[Stage, ...] = (
    Stage("select", select.FOLDER, ("min_side", "uniform_std", "duplicate_cos", "density_band", "gmm_components",
                                    "pca_dims", "seed"), lambda cfg: ("embedder",), (), _select),
    Stage("propose", propose.FOLDER, ("taxonomy", "propose_prompt", "questions_per_image", "max_new_tokens"),
          lambda cfg: _discovering(cfg, "vlm"), (f"{select.FOLDER}/{select.OUTPUT}",), _propose),
    Stage("categorise", categorise.FOLDER, ("taxonomy", "dbscan_eps", "dbscan_min_samples", "examples_per_cluster",
                                            "name_prompt", "max_new_tokens"),
          lambda cfg: _discovering(cfg, "matcher", "llm"), (f"{propose.FOLDER}/{propose.OUTPUT}",), _categorise),
    Stage("generate", generate.FOLDER, ("generate_prompt", "qas_per_category", "types", "box_coords",
                                        "max_new_tokens"), lambda cfg: ("vlm",),
          (f"{select.FOLDER}/{select.OUTPUT}", f"{categorise.FOLDER}/{categorise.OUTPUT}"), _generate,
          revision=1),  # 1: the prompt asks for dependencies, written as parents
    Stage("curate", curate.FOLDER, ("types", "judge_check", "judge_box_coords", "judge_max_new_tokens",
                                    "qa_duplicate_cos", "blind_filter", "blind_keep", "blind_permutations"),
          lambda cfg: ("matcher",) + (("judge",) if cfg.judge_check else ()) + (("llm",) if cfg.blind_filter else ()),
          (f"{generate.FOLDER}/{generate.OUTPUT}",), _curate,
          revision=2),  # 1: the judge check before near-duplicate removal (issue 21 item 6); 2: parents
    Stage("rank", rank.FOLDER, ("alpha", "top_k"), lambda cfg: ("matcher",),
          (f"{curate.FOLDER}/{curate.OUTPUT}",), _rank,
          revision=1),  # 1: parents not among the top k are left out of their children's
)


def _file_digest(path: Path) -> str | None:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else None


@dataclass
class BuildResult:
    """What `cttd_build` (and `build_bank`) returns: the build folder, its bank and datasheet, and
    what this run did."""

    folder: Path
    bank: Path
    datasheet: dict[str, Any]
    ran: list[str]  # stages run this time
    skipped: list[str]  # stages found finished
    computed: dict[str, int]  # model results computed this time (not found in the store), by kind
    report: Path | None = None  # report.html (`cttd_build` writes it)


@memo_scoped
def build_bank(images: str | Path, out: str | Path, config: BuildConfig | None = None, *,
               cache_dir: str | Path | None = None, progress: bool = True) -> BuildResult:
    """Run (or resume) a build of `images` into the build folder `out`."""
    from caprecon.apps.cttd.datasheet import write_datasheet

    config = config or BuildConfig()
    out = Path(out)
    listing = select.list_images(Path(images))
    out.mkdir(parents=True, exist_ok=True)
    models = BuildModels(config)
    ctx = Context(Store(cache_dir or out / "store"))
    # the models' and photos' digests are remembered in the build's store, for this build alone
    keep_memo_in(None if ctx.store.read_only else ctx.store.root)
    images_digest = content_key("images", files=[(e["path"], Path(e["path"]).stat().st_size,
                                                  Path(e["path"]).stat().st_mtime_ns) for e in listing])
    for stage in STAGES:  # a model that cannot be found stops the build before any work
        for role in stage.roles(config):
            getattr(models, role)
    ran, skipped = [], []
    for stage in STAGES:
        folder = out / stage.folder
        roles = stage.roles(config)
        settings = {name: getattr(config, name) for name in stage.settings}
        if stage.name == "categorise" and config.taxonomy not in ("paper", "discover"):
            settings["taxonomy_file"] = _file_digest(Path(config.taxonomy))
        fingerprint = content_key(
            "cttd-stage", stage=stage.name, settings=settings,
            models={role: getattr(models, role).fingerprint for role in roles},
            inputs={name: _file_digest(out / name) for name in stage.inputs},
            images=images_digest if stage.name == "select" else None,
            **({"revision": stage.revision} if stage.revision else {}))
        manifest_path = folder / "manifest.json"
        if manifest_path.exists() and json.loads(manifest_path.read_text()).get("fingerprint") == fingerprint:
            skipped.append(stage.name)
            continue
        if manifest_path.exists():
            manifest_path.unlink()  # outdated: whatever follows must rerun too
        folder.mkdir(parents=True, exist_ok=True)
        job = Job(folder=folder, build=out, config=config, models=models, ctx=ctx, images=listing, progress=progress)
        before, started = dict(ctx.computed), time.time()
        stage.run(job)
        write_json(manifest_path, redact({
            "stage": stage.name, "revision": stage.revision, "fingerprint": fingerprint,
            "finished": time.strftime("%Y-%m-%dT%H:%M:%S"), "seconds": round(time.time() - started, 3),
            "computed": {k: v - before.get(k, 0) for k, v in ctx.computed.items() if v - before.get(k, 0)},
            "settings": json.loads(json.dumps(settings, default=str)),
            "models": {role: describe_model(getattr(models, role)) for role in roles},
            **job.manifest}))
        ran.append(stage.name)
    bank = out / "bank.jsonl"
    shutil.copyfile(out / rank.FOLDER / rank.OUTPUT, bank)
    datasheet = write_datasheet(out, config, STAGES)
    return BuildResult(out, bank, datasheet, ran, skipped, dict(ctx.computed))


def cttd_build(images: str | Path, out: str | Path, *, config: str | Path | None = None, allow_plugins: bool = False,
               cache_dir: str | Path | None = None, progress: bool = False, **settings: Any) -> BuildResult:
    """`caprecon cttd build`: run (or resume) the CTTD pipeline on the image folder `images` into the
    build folder `out`, and write its report.html. `settings` are `BuildConfig` fields (vlm, judge,
    llm, embedder, matcher and their `*_options`, taxonomy, top_k, ...), over those of the YAML or
    TOML file `config` (a plug-in it names loads only with `allow_plugins`); a role's options merge
    with the file's. Every setting is checked, and `out` refused when it is a file or lies inside
    `images`, before any model loads.

        result = caprecon.cttd_build("photos/", "builds/photos", vlm="qwen3-vl-32b", judge="qwen3-vl-8b")
        print(result.bank, result.datasheet["questions"])
    """
    from caprecon.apps.cttd.categorise import TaxonomyError
    from caprecon.apps.cttd.select import ImageFolderError
    from caprecon.reports.html import write_html_report
    from caprecon.run.config import load_config_file
    from caprecon.run.folder import run_folder

    values = load_config_file(config, allow_plugins=allow_plugins) if config else {}
    for key, value in settings.items():
        if key.endswith("_options") and isinstance(value, dict):
            value = {**values.get(key, {}), **value}
        values[key] = value
    try:
        build = BuildConfig(**values)
    except TypeError as exc:
        raise ConfigError(f"unknown build setting: {exc}") from None
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    with run_folder(out, trees=[images]):
        try:
            result = build_bank(images, out, build, cache_dir=cache_dir, progress=progress)
        except (ImageFolderError, TaxonomyError) as exc:
            raise ConfigError(str(exc)) from None
        result.report = write_html_report(result.folder, progress=progress)
    return result
