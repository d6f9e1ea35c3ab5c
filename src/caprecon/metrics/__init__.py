"""Metrics by name: each built from the run's shared models (`Roles`) by its class's `from_roles`.

caprecon's own metrics are named once, in `caprecon.metrics.catalogue` (`METRICS`: name ->
`module:Class`, what it measures, the options a shared class is built with). Metric modules are
imported when a metric is built, so a run that only needs ReconScore never imports the judge or
text-LLM code.

The registry is open: besides the names of `METRICS`, a metric is

- `module:Class`, a `Metric` subclass written outside caprecon, given on the command line or,
  with --allow-plugins, in a config file (a plug-in, trusted as every other: `models.registry`);
- the name of a `caprecon.metrics` entry point of an installed package, pointing at such a class.

Every metric, caprecon's and a plug-in alike, is built with `Class.from_roles(roles, config,
**options)` (see `Metric`); a plug-in gets no options.
"""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import Any, Callable

from caprecon.core.errors import ConfigError
from caprecon.metrics.base import Column, Context, Metric
from caprecon.metrics.catalogue import METRICS
from caprecon.metrics.recon import ClipImageScore, ReconScore

ENTRY_POINTS = "caprecon.metrics"


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
    elif name in METRICS:  # roles and config are untyped here: metrics sit below the run layer
        built = METRICS[name].load().from_roles(roles, config, **METRICS[name].options)
    elif (cls := plugin_metric(name)) is None:
        installed = sorted(p.name for p in entry_points(group=ENTRY_POINTS))
        raise ConfigError(f"unknown metric {name!r}; metrics: {', '.join(sorted([*METRICS, *installed]))}, "
                          f"fused:FILE, distilled:FOLDER, module:Class")
    else:
        built = cls.from_roles(roles, config)
    return finish(name, built) if finish else built


__all__ = ["METRICS", "ClipImageScore", "Column", "Context", "Metric", "ReconScore", "build_metric", "is_metric",
           "plugin_metric"]
