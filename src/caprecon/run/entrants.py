"""Several models in one role, each under a label: the generators and judges of `caprecon t2i`,
the captioners of `caprecon suite`.

Given as `LABEL=SPEC` or `SPEC` on the command line, `{label, model, options}` mappings in
a config file, or a mapping of labels to specs or built objects from Python.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

from caprecon.core.errors import ConfigError


@dataclass(frozen=True)
class Entrant:
    """A generator or a judge of the run, under the label its rows and columns carry."""

    label: str
    spec: Any  # registry name, hub id, folder, module:Class, or a built object
    options: dict[str, Any] = field(default_factory=dict)


def default_label(spec: Any) -> str:
    """A registry name as is; a folder or hub id by its last part; an object by its class."""
    if not isinstance(spec, str):
        return type(spec).__name__
    return spec if "/" not in spec and "\\" not in spec else Path(spec.rstrip("/\\")).name


def entrants(given: Iterable[Any] | Mapping[str, Any], role: str) -> list[Entrant]:
    """Entrants from `LABEL=SPEC` or `SPEC` strings, `{label, model, options}` mappings
    (config files), or a mapping of labels to specs or built objects (Python)."""
    if isinstance(given, Mapping):
        out = [Entrant(str(label), spec) for label, spec in given.items()]
    else:
        out = []
        for entry in given:
            if isinstance(entry, Mapping):
                unknown = set(entry) - {"label", "name", "model", "options"}
                if "model" not in entry or unknown:
                    raise ConfigError(f"a {role} entry needs `model` (and may have `label`, `options`): {dict(entry)}")
                spec = entry["model"]
                out.append(Entrant(str(entry.get("label") or entry.get("name") or default_label(spec)), spec,
                                   dict(entry.get("options") or {})))
            elif isinstance(entry, str) and "=" in entry:
                label, _, spec = entry.partition("=")
                if not label.strip() or not spec.strip():
                    raise ConfigError(f"{role} {entry!r} must look like LABEL=SPEC or SPEC")
                out.append(Entrant(label.strip(), spec.strip()))
            else:
                out.append(Entrant(default_label(entry), entry))
    labels = [e.label for e in out]
    repeated = sorted({label for label in labels if labels.count(label) > 1})
    if repeated:
        raise ConfigError(f"{role} label(s) {repeated} given twice; name them apart with LABEL=SPEC")
    return out
