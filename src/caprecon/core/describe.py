"""How a model is described in manifests and in the store's model table."""

from __future__ import annotations

from typing import Any

from caprecon.core.redaction import redact


def describe_model(model: Any) -> dict[str, Any]:
    """A backend's own description for manifests, or its class and fingerprint; secrets in it
    (a served model's URL with a password) masked, since both places are written to disk."""
    describe = getattr(model, "describe", None)
    if callable(describe):
        return redact(describe())
    return {"class": type(model).__name__, "fingerprint": getattr(model, "fingerprint", None)}
