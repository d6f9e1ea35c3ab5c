"""Generator wrappers for the tests (counting, flaky, busy), importable by Ray's worker processes."""

from __future__ import annotations

import time
from pathlib import Path


class Counting:
    """Wraps a generator and counts the images it is asked for (in this process)."""

    def __init__(self, inner):
        self.inner, self.calls = inner, 0

    @property
    def fingerprint(self):
        return self.inner.fingerprint

    def generate(self, requests):
        self.calls += len(requests)
        return self.inner.generate(requests)


class FlakyGenerator:
    """Raises once, the first time it is asked for a prompt containing `trigger` (a marker file
    records that it did, across processes), then generates normally."""

    def __init__(self, inner, trigger: str, marker: str):
        self.inner, self.trigger, self.marker = inner, trigger, Path(marker)

    @property
    def fingerprint(self) -> str:
        return self.inner.fingerprint

    def generate(self, requests):
        if any(self.trigger in r.prompt for r in requests) and not self.marker.exists():
            self.marker.write_text("raised")
            raise RuntimeError("flaky worker: lost its connection (once)")
        return self.inner.generate(requests)


class BusyGenerator:
    """A generator whose every image costs `seconds` of pure-Python CPU work on top of the inner
    generator's: makes generation dominate, for the executor benchmark. Pure Python holds the
    GIL, so only more processes (workers) make it faster."""

    def __init__(self, inner, seconds: float):
        self.inner, self.seconds = inner, seconds

    @property
    def fingerprint(self) -> str:
        return self.inner.fingerprint

    def generate(self, requests):
        for _ in requests:
            end = time.thread_time() + self.seconds  # this thread's CPU time: other threads' work does not count
            while time.thread_time() < end:
                pass
        return self.inner.generate(requests)
