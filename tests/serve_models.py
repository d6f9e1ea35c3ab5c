"""Models for the reward service's tests that replicas (other processes) build from pickles: the
oracle, logging each picture it draws to a file (so a test counts generations across replicas),
slowed down so a batch is in flight long enough, and able to kill its own replica mid-batch."""

from __future__ import annotations

import os
import time

from oracle import OracleGenerator


class LoggedOracle(OracleGenerator):
    """The oracle; each prompt drawn is appended to `log` (one line each, appends are atomic). When
    the file `die` exists, the first replica to take it (by renaming it) exits mid-batch."""

    def __init__(self, log: str, delay: float = 0.0, die: str | None = None):
        self.log, self.delay, self.die = log, delay, die

    def generate(self, requests):
        if self.die is not None:
            try:
                os.rename(self.die, self.die + ".taken")
            except FileNotFoundError:
                pass
            else:
                time.sleep(0.2)
                os._exit(1)  # the replica's process is gone, its batch with it
        time.sleep(self.delay * len(requests))
        out = super().generate(requests)
        with open(self.log, "a", encoding="utf-8") as fh:
            fh.write("".join(f"{os.getpid()}\t{r.prompt}\n" for r in requests))
        return out


def generations(log: str) -> list[str]:
    try:
        with open(log, encoding="utf-8") as fh:
            return [line.rstrip("\n").split("\t", 1)[1] for line in fh]
    except FileNotFoundError:
        return []
