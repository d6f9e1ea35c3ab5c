"""A captioner and a generator that record every item they produce, for tests.

In-process, `produced` lists the items. In a `caprecon caption` subprocess (built from a
`module:Class` spec), each item is also appended to the file `log` and flushed at once,
so the record survives the process being killed. With `block_after=k`, the call after
the k-th produces nothing: it writes the file `marker` and hangs, so a test can kill the
process at a known point, or without a marker raises `KeyboardInterrupt`, as a user's
Ctrl-C would.
"""

from __future__ import annotations

import json
import time
from pathlib import Path


class _Logged:
    def __init__(self, inner, log: str | None = None, block_after: int | None = None, marker: str | None = None):
        self.inner = inner
        self.log = Path(log) if log else None
        self.block_after = block_after
        self.marker = Path(marker) if marker else None
        self.calls = 0
        self.produced: list[str] = []

    @property
    def fingerprint(self) -> str:
        return self.inner.fingerprint

    def _before_call(self) -> None:
        if self.block_after is not None and self.calls >= self.block_after:
            if self.marker is None:
                raise KeyboardInterrupt("stopped by the test")
            self.marker.write_text("blocked")
            time.sleep(3600)  # until the test kills the process

    def _record(self, items: list[str]) -> None:
        self.calls += 1
        self.produced += items
        if self.log:
            with self.log.open("a", encoding="utf-8") as fh:
                fh.writelines(json.dumps(item) + "\n" for item in items)


class LoggedCaptioner(_Logged):
    """Records one item per image captioned: its content key and sampling seed."""

    def __init__(self, model: str | None = None, *, inner=None, log=None, block_after=None, marker=None, **options):
        if inner is None:
            from caprecon.models.captioner import TransformersCaptioner

            inner = TransformersCaptioner(model, **options)
        super().__init__(inner, log, block_after, marker)

    def generation_defaults(self):
        return self.inner.generation_defaults()

    def caption(self, requests, sampling):
        self._before_call()
        out = self.inner.caption(requests, sampling)
        self._record([f"{r.image_key}|{r.seed}" for r in requests])
        return out


class LoggedGenerator(_Logged):
    """Records one item per image generated: its prompt, seed and size."""

    def __init__(self, model: str | None = None, *, inner=None, log=None, block_after=None, marker=None, **options):
        if inner is None:
            from caprecon.models.generator import DiffusersGenerator

            inner = DiffusersGenerator(model, **options)
        super().__init__(inner, log, block_after, marker)
        self.seeds: dict[str, set[int]] = {}  # image id -> seeds it was generated with

    def generate(self, requests):
        self._before_call()
        out = self.inner.generate(requests)
        for r in requests:
            self.seeds.setdefault(r.image_id, set()).add(r.seed)
        self._record([f"{r.prompt}|{r.seed}|{r.width}x{r.height}" for r in requests])
        return out
