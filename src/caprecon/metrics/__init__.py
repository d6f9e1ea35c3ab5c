"""Metrics by name: each entry builds a metric from the run's shared models (`Roles`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from .base import Context, Metric
from .recon import ClipImageScore, ReconScore

if TYPE_CHECKING:
    from ..config import Roles, RunConfig

MetricFactory = Callable[["Roles", "RunConfig"], Metric]

METRICS: dict[str, tuple[MetricFactory, str]] = {
    "recon": (lambda roles, cfg: ReconScore(roles.generator, roles.embedder, cfg.spec),
              "ReconScore (1 + cos(F(I), F(Î)))/2, F = --embedder"),
    "clip-image": (lambda roles, cfg: ClipImageScore(roles.generator, roles.clip, cfg.spec),
                   "cos(E(I), E(Î)) in CLIP image space, E = --clip"),
}


def build_metric(name: str, roles: "Roles", config: "RunConfig") -> Metric:
    from ..config import ConfigError

    if name not in METRICS:
        raise ConfigError(f"unknown metric {name!r}; metrics: {', '.join(sorted(METRICS))}")
    return METRICS[name][0](roles, config)


__all__ = ["METRICS", "ClipImageScore", "Context", "Metric", "ReconScore", "build_metric"]
