"""How a model is described in manifests and in the store's model table."""

from __future__ import annotations

import functools
from importlib import metadata
from typing import Any

from caprecon.core.redaction import redact


@functools.lru_cache(maxsize=None)  # reading the metadata scans the installed distributions
def installed_version(package: str) -> str | None:
    """A package's installed version from its metadata (None when it is not installed): reading
    it imports nothing, so a fully cached run can key and describe its work without loading torch."""
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def describe_model(model: Any) -> dict[str, Any]:
    """A backend's own description for manifests, or its class and fingerprint; secrets in it
    (a served model's URL with a password) masked, since both places are written to disk."""
    describe = getattr(model, "describe", None)
    if callable(describe):
        return redact(describe())
    return {"class": type(model).__name__, "fingerprint": getattr(model, "fingerprint", None)}
