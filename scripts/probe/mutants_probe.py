"""A pytest plugin for `scripts/mutants.py`'s baseline run: which test calls the function each
mutant changes, so a mutant is then tried on those tests alone.

It reads MUTANTS_PROBE_TARGETS, a JSON object {mutant name: [file, [first lines of its
function]]}, traces Python calls (`sys.settrace` on 'call' events only, no line events; every
thread too) while each test's setup, call and teardown run, and writes MUTANTS_PROBE_OUT:
`reached`, {mutant name: [node ids, in the order they ran]}, and `seconds`, {node id: how long
it took}. A call made in a subprocess is not seen: the script falls back to a mutant's named
tests whenever the narrowed ones pass. The tracing costs about 15 % more CPU (tests/test_store.py:
23.4 s without, 26.9 s with).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time

import pytest

_targets: dict[tuple[str, int], list[str]] = {}  # (file, first line of a function) -> mutants in it
_reached: dict[str, list[str]] = {}
_current: list[str | None] = [None]
_seconds: dict[str, float] = {}  # how long each test took (traced), so the quickest reaching a mutant go first


def _on_call(frame, event, arg):
    if event == "call":
        names = _targets.get((frame.f_code.co_filename, frame.f_code.co_firstlineno))
        test = _current[0]
        if names and test is not None:
            for name in names:
                seen = _reached.setdefault(name, [])
                if not seen or seen[-1] != test:
                    seen.append(test)
    return None  # no line events inside the frame: only calls are traced


def pytest_configure(config):
    plan = json.loads(open(os.environ["MUTANTS_PROBE_TARGETS"], encoding="utf-8").read())
    for name, (path, lines) in plan.items():
        for line in lines:
            _targets.setdefault((os.path.realpath(path), line), []).append(name)
            _targets.setdefault((path, line), []).append(name)
    sys.settrace(_on_call)
    threading.settrace(_on_call)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    _current[0] = item.nodeid
    sys.settrace(_on_call)  # a test that set its own trace function (a debugger, coverage) gave it back
    started = time.perf_counter()
    yield
    _seconds[item.nodeid] = time.perf_counter() - started
    _current[0] = None


def pytest_unconfigure(config):
    sys.settrace(None)
    threading.settrace(None)
    with open(os.environ["MUTANTS_PROBE_OUT"], "w", encoding="utf-8") as fh:
        json.dump({"reached": {name: list(dict.fromkeys(nodes)) for name, nodes in _reached.items()},
                   "seconds": _seconds}, fh)
