"""Metrics by name: each entry builds a metric from the run's shared models (`Roles`).

Metric modules are imported when a metric is built, so a run that only needs ReconScore
never imports the judge or text-LLM code.

The registry is open: besides the names of `METRICS`, a metric is

- `module:Class`, a `Metric` subclass written outside caprecon, given on the command line or,
  with --allow-plugins, in a config file (a plug-in, trusted as every other: `models.registry`);
- the name of a `caprecon.metrics` entry point of an installed package, pointing at such a class.

Either is built with `Class.from_roles(roles, config)` (see `Metric`).
"""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import Any, Callable

from caprecon.core.errors import ConfigError
from caprecon.metrics.base import Column, Context, Metric
from caprecon.metrics.recon import ClipImageScore, ReconScore

# A factory receives the run's shared models (`caprecon.run.roles.Roles`: generator, embedder,
# clip, clip_matcher, judge, judges_for, llm, qa_bank) and its `caprecon.run.config.RunConfig`.
# Metrics sit below the run layer, so both arrive untyped here.


def _recon(roles: Any, cfg: Any) -> Metric:
    return ReconScore(roles.generator, roles.embedder, cfg.spec)


def _clip_image(roles: Any, cfg: Any) -> Metric:
    return ClipImageScore(roles.generator, roles.clip, cfg.spec)


def _turing(roles: Any, cfg: Any) -> Metric:
    from caprecon.metrics.turing import CaptionTuringTest

    bank = roles.qa_bank  # a bad bank is found before any model loads
    return CaptionTuringTest(roles.generator, roles.judge, bank, cfg.spec, iou_threshold=cfg.iou_threshold,
                             judges_for=roles.judges_for)


def _vqascore(roles: Any, cfg: Any) -> Metric:
    from caprecon.metrics.vqascore import VQAScore

    return VQAScore(roles.judge, template=cfg.vqa_template, on=cfg.vqa_on,
                    generator=roles.generator if cfg.vqa_on != "image" else None, spec=cfg.spec,
                    normalise=cfg.vqa_normalise)


def _captionqa(roles: Any, cfg: Any) -> Metric:
    from caprecon.metrics.captionqa import CaptionQA

    bank = roles.qa_bank  # a bad bank is found before any model loads
    return CaptionQA(roles.llm, bank, iou_threshold=cfg.iou_threshold)


def _fleur(roles: Any, cfg: Any) -> Metric:
    from caprecon.metrics.fleur import Fleur

    return Fleur(roles.judge, **({"prompt": cfg.fleur_prompt} if cfg.fleur_prompt else {}))


def _clipscore(roles: Any, cfg: Any) -> Metric:
    from caprecon.metrics.clipscore import ClipScore

    options = {"weight": cfg.clipscore_weight, "prefix": cfg.clipscore_prefix}
    return ClipScore(roles.clip_matcher, **{k: v for k, v in options.items() if v is not None})


def _clip_s(roles: Any, cfg: Any) -> Metric:
    from caprecon.metrics.clipscore import ClipS

    return ClipS(roles.clip_matcher)


def _refclipscore(roles: Any, cfg: Any) -> Metric:
    from caprecon.metrics.clipscore import RefClipScore

    return RefClipScore(roles.clip_matcher)


def _halluc(report: str) -> Callable[[Any, Any], Metric]:
    def build(roles: Any, cfg: Any) -> Metric:
        from caprecon.metrics.halluc import Hallucination

        bank = roles.qa_bank if cfg.qa_bank else None
        # precision alone needs no generator; coverage (and F) is checked on the reconstruction
        generator = roles.generator if cfg.generator is not None or report != "precision" else None
        return Hallucination(roles.judge, roles.llm, generator=generator, bank=bank, spec=cfg.spec, beta=cfg.beta,
                             normalise=cfg.vqa_normalise, iou_threshold=cfg.iou_threshold,
                             judges_for=roles.judges_for if bank else None, report=report)

    return build


def _claims(roles: Any, cfg: Any) -> Metric:
    from caprecon.metrics.claim_check import ClaimCheck

    return ClaimCheck(roles.judge, roles.llm, roles.generator, spec=cfg.spec, normalise=cfg.vqa_normalise)


def _reference(name: str) -> Callable[[Any, Any], Metric]:
    def build(roles: Any, cfg: Any) -> Metric:
        from caprecon.metrics.reference import ReferenceMetric, ReferenceMetricError

        try:
            return ReferenceMetric(name)
        except ReferenceMetricError as exc:  # no Java, no pycocoevalcap, SPICE's jars missing
            raise ConfigError(f"-m {name}: {exc}") from None

    return build


MetricFactory = Callable[[Any, Any], Metric]
ENTRY_POINTS = "caprecon.metrics"

METRICS: dict[str, tuple[MetricFactory, str]] = {
    "recon": (_recon, "ReconScore (1 + cos(F(I), F(Î)))/2, F = --embedder"),
    "clip-image": (_clip_image, "cos(E(I), E(Î)) in CLIP image space, E = --clip"),
    "turing": (_turing, "Caption Turing Test: --judge accuracy on --qa-bank questions seen through Î; "
                        "upper bound on I"),
    "vqascore": (_vqascore, "P('Yes') of --judge for 'Is the figure showing: {caption}?' on I (and/or Î: --vqa-on)"),
    "captionqa": (_captionqa, "--llm answers the --qa-bank questions from the caption alone"),
    "fleur": (_fleur, "--judge rates the caption 0-1 (FLEUR's instruction), smoothed over the digit "
                      "probabilities where it wrote the rating"),
    "clipscore": (_clipscore, "2.5 max(cos(E(I), E('A photo depicts ' + C)), 0), E = --clip (Hessel et al.; "
                              "--clipscore-weight, --clipscore-prefix)"),
    "clip-s": (_clip_s, "100 max(cos(E(I), E(C)), 0), E = --clip: the Caption Turing Test paper's CLIP-S"),
    "refclipscore": (_refclipscore, "harmonic mean of CLIPScore and the best reference similarity"),
    "halluc": (_halluc("precision"), "soft precision of the caption's claims (--llm splits it) checked by --judge "
                                     "on I; coverage on Î and F (--beta) beside it"),
    "halluc-coverage": (_halluc("coverage"), "halluc's coverage: turing with --qa-bank, else the references' claims "
                                             "checked on Î"),
    "halluc-f": (_halluc("f"), "F_beta (--beta) of halluc's precision and coverage"),
    "claims": (_claims, "the caption's claims (--llm splits them, DSG-style, gated) checked by --judge on I and on Î: "
                        "conveyed, precision, lost, per claim type, with each claim's evidence"),
    **{f"bleu-{n}": (_reference(f"bleu-{n}"), f"BLEU-{n} against the row's references (pycocoevalcap); "
                                               f"summary: corpus BLEU") for n in range(1, 5)},
    "meteor": (_reference("meteor"), "METEOR 1.5 against the references (pycocoevalcap, Java); summary: corpus METEOR"),
    "rouge": (_reference("rouge"), "ROUGE-L against the references (pycocoevalcap)"),
    "cider": (_reference("cider"), "CIDEr-D against the references, IDF from the whole input (pycocoevalcap)"),
    "spice": (_reference("spice"), "SPICE F-score against the references (pycocoevalcap; Java and CoreNLP's jars)"),
}


def plugin_metric(name: str) -> type[Metric] | None:
    """The class a `module:Class` metric or a `caprecon.metrics` entry point names; None when
    `name` is neither."""
    from caprecon.models import registry

    if registry.imports_code(name):
        try:
            found = registry.import_plugin(name)
        except ValueError as exc:
            raise ConfigError(f"-m {name}: {exc}") from None
    else:
        point = next((p for p in entry_points(group=ENTRY_POINTS) if p.name == name), None)
        if point is None:
            return None
        try:
            found = point.load()
        except Exception as exc:  # an installed package's import failed: say which and why, in one line
            raise ConfigError(f"-m {name}: the {ENTRY_POINTS} entry point {point.value!r} does not load "
                              f"({type(exc).__name__}: {exc})") from None
    if not (isinstance(found, type) and issubclass(found, Metric)):
        raise ConfigError(f"-m {name}: {found!r} is not a caprecon.metrics.Metric subclass")
    return found


def is_metric(name: str) -> bool:
    """Whether `name` names a metric: registered, fused:/distilled:, `module:Class` or an entry point
    (a `module:Class` is not imported here)."""
    from caprecon.models import registry

    return (name in METRICS or name.startswith(("fused:", "distilled:")) or registry.imports_code(name)
            or any(p.name == name for p in entry_points(group=ENTRY_POINTS)))


def declared_column(name: str) -> Column | None:
    """What the metric named `name` declares of its column `name`, known without building it: a
    reference metric's, or a plug-in's whose class declares `columns`. None otherwise: caprecon's
    other metrics declare their columns once built from the run's models, and their run's manifest
    holds them (`read_columns`)."""
    from caprecon.metrics.reference import reference_column, reference_metric_name

    if canonical := reference_metric_name(name):
        return reference_column(canonical)
    if name in METRICS or name.startswith(("fused:", "distilled:")):
        return None
    found = plugin_metric(name)
    columns = getattr(found, "columns", ()) if found is not None else ()
    if isinstance(columns, (tuple, list)) and columns:
        named = [c for c in columns if isinstance(c, Column) and c.name in (name, found.name)]
        return named[0] if named else next((c for c in columns if isinstance(c, Column)), None)
    return None


def build_metric(name: str, roles: Any, config: Any,
                 finish: Callable[[str, Metric], Metric] | None = None) -> Metric:
    """The metric `name` names, built from the run's models. `finish(name, metric)`, when given,
    turns each metric built by name into the one the run scores (`caprecon.run.score.build_metrics`:
    seeds, generator ensemble, ceiling); a `fused:` metric is not finished itself, its components are,
    so it combines what a run of each alone would report. The one place `fused:` is read."""
    if name.startswith("fused:"):  # a fitted combination: its file names the components
        from caprecon.metrics.fused import build_fused

        return build_fused(name.partition(":")[2], lambda component: build_metric(component, roles, config, finish))
    if name.startswith("distilled:"):  # a reward model `caprecon distill` trained: its folder names the encoders
        from caprecon.metrics.distilled import DistilledMetric

        # its folder's config.json is a config file: module:Class encoders there need the run's --allow-plugins
        built: Metric = DistilledMetric(name.partition(":")[2],
                                        allow_plugins=bool(getattr(config, "allow_plugins", False)))
    elif name in METRICS:
        built = METRICS[name][0](roles, config)
    elif (cls := plugin_metric(name)) is None:
        installed = sorted(p.name for p in entry_points(group=ENTRY_POINTS))
        raise ConfigError(f"unknown metric {name!r}; metrics: {', '.join(sorted([*METRICS, *installed]))}, "
                          f"fused:FILE, distilled:FOLDER, module:Class")
    else:
        built = cls.from_roles(roles, config)
    return finish(name, built) if finish else built


__all__ = ["METRICS", "ClipImageScore", "Column", "Context", "Metric", "ReconScore", "build_metric", "is_metric",
           "plugin_metric"]
