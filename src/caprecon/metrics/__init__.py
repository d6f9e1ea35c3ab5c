"""Metrics by name: each entry builds a metric from the run's shared models (`Roles`).

Metric modules are imported when a metric is built, so a run that only needs ReconScore
never imports the judge or text-LLM code.
"""

from __future__ import annotations

from typing import Any, Callable

from caprecon.core.errors import ConfigError
from caprecon.metrics.base import Context, Metric
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


MetricFactory = Callable[[Any, Any], Metric]

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
}


def build_metric(name: str, roles: Any, config: Any) -> Metric:
    if name.startswith("fused:"):  # a fitted combination: its file names the components
        from caprecon.metrics.fused import build_fused

        return build_fused(name.partition(":")[2], lambda component: build_metric(component, roles, config))
    if name.startswith("distilled:"):  # a reward model `caprecon distill` trained: its folder names the encoders
        from caprecon.metrics.distilled import DistilledMetric

        return DistilledMetric(name.partition(":")[2])
    if name not in METRICS:
        raise ConfigError(f"unknown metric {name!r}; metrics: {', '.join(sorted(METRICS))}, fused:FILE, "
                          f"distilled:FOLDER")
    return METRICS[name][0](roles, config)


__all__ = ["METRICS", "ClipImageScore", "Context", "Metric", "ReconScore", "build_metric"]
