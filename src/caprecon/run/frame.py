"""What a run that writes a folder holds beside its own work (`RunFrame`): its checked
configuration, the store its model results are cached in and the `Context` its model calls go
through, its output folder (None: nothing saved), and its clock.

The folder's lock is not here: `holds_run_folder` takes it around the whole call, before any
of this is opened. A run opens its frame once its settings are checked (every configuration
error raised), so a refused run opens no store.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from caprecon.metrics.base import Context
from caprecon.run.config import RunConfig
from caprecon.run.folder import open_store, write_manifest
from caprecon.store.index import Store


@dataclass
class RunFrame:
    cfg: RunConfig
    out_dir: Path | None
    store: Store
    ctx: Context
    started: float  # time.time() when the run began, before its settings were checked

    @classmethod
    def open(cls, cfg: RunConfig, out: str | Path | None, *, started: float, store: Store | None = None) -> RunFrame:
        """The frame of a run whose settings `cfg` holds: `store`, when given (a command's nested run
        scoring into its caller's store), else the store the cache settings name (`open_store`)."""
        out_dir = Path(out) if out else None
        store = store if store is not None else open_store(cfg, out_dir)
        return cls(cfg, out_dir, store, Context(store), started)

    @property
    def started_at(self) -> str:
        """When the run began, in local time, as manifests record it."""
        return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(self.started))

    def seconds(self) -> float:
        """Wall time since the run began, to the millisecond, as manifests record it."""
        return round(time.time() - self.started, 3)

    def write_manifest(self, manifest: dict[str, Any]) -> Path | None:
        """The folder's `manifest.json` (redacted, `write_manifest`); nothing without a folder."""
        return write_manifest(self.out_dir, manifest) if self.out_dir else None
