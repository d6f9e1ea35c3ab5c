"""Where caprecon keeps things on disk by default."""

from __future__ import annotations

import os
from pathlib import Path


def default_cache_dir() -> Path:
    """`$CAPRECON_CACHE`, else `$XDG_CACHE_HOME/caprecon`, else `~/.cache/caprecon`."""
    if os.environ.get("CAPRECON_CACHE"):
        return Path(os.environ["CAPRECON_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "caprecon"
