"""The walk of a `score` call's samples: which functions, in which modules, the samples pass through.

Issue 55 measures readability by following the samples of one `caprecon.score` call through the
code: how many stops (functions that receive them), in how many modules, and how many of those
calls climb back up a layer (a lower layer calling into a higher one through an object or a
callback handed down). This script makes that reading mechanical, so it can be repeated on any
commit: it runs `caprecon.score` on the demo's captions with the offline stand-in and ReconScore,
and records, with `sys.setprofile`, every call into a caprecon function one of whose arguments is
a `Sample` (or the `LoadedSample` it becomes once its picture is read), or a list, tuple or dict
of them.

- a stop is a distinct function that received samples;
- a climb is a step of that walk, stop to next stop in the order they are first reached, that goes
  back up to a higher layer (pyproject.toml's import-linter layers) than the stop before: the reader,
  having gone down into a lower layer, has to come back up to follow the samples on;
- an upward call is a caller → callee pair among those calls whose callee sits in a higher layer than
  its caller (a lower layer calling into a higher one through an object or callback handed down).

Usage: HF_HUB_OFFLINE=1 python scripts/walk.py [--list]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def layers() -> list[str]:
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    return next(c["layers"] for c in contracts if c["type"] == "layers")


def layer_of(module: str, order: list[str]) -> int:
    """0 for the top layer (cli); the package's own `__init__` counts as the top."""
    for i, name in enumerate(order):
        if module == name or module.startswith(name + "."):
            return i
    return -1


def carries_samples(value, sample_types, depth: int = 2) -> bool:
    """A sample (as read, or loaded with its picture), or a list, tuple or dict that holds one
    (two levels down: a batch of (position, sample) pairs counts)."""
    if isinstance(value, sample_types):
        return True
    if depth == 0:
        return False
    if isinstance(value, dict):
        value = list(value.values())[:1]
    if isinstance(value, (list, tuple)) and value:
        return any(carries_samples(v, sample_types, depth - 1) for v in value[:2])
    return False


def walk() -> tuple[list[tuple[str, str]], set[tuple[tuple[str, str], tuple[str, str]]]]:
    import caprecon
    from caprecon.data.images import LoadedSample
    from caprecon.data.samples import Sample

    demo = Path(caprecon.__file__).parent / "data" / "demo" / "captions.jsonl"
    stops: dict[tuple[str, str], None] = {}
    edges: set[tuple[tuple[str, str], tuple[str, str]]] = set()

    def caprecon_caller(frame):
        frame = frame.f_back
        while frame is not None and not frame.f_globals.get("__name__", "").startswith("caprecon"):
            frame = frame.f_back
        return frame

    def profile(frame, event, arg):
        if event != "call":
            return
        module = frame.f_globals.get("__name__", "")
        if not module.startswith("caprecon"):
            return
        code = frame.f_code
        names = code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]
        if not any(carries_samples(frame.f_locals.get(n), (Sample, LoadedSample)) for n in names):
            return
        here = (module, code.co_qualname)
        stops.setdefault(here)
        caller = caprecon_caller(frame)
        if caller is not None:
            edges.add(((caller.f_globals["__name__"], caller.f_code.co_qualname), here))

    with tempfile.TemporaryDirectory() as tmp:
        sys.setprofile(profile)
        try:
            caprecon.score(str(demo), metrics=["recon"], preset="offline", out=f"{tmp}/run", cache_dir=f"{tmp}/cache")
        finally:
            sys.setprofile(None)
    return list(stops), edges


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--list", action="store_true", help="print each stop and each climb")
    args = parser.parse_args()
    order = layers()
    stops, edges = walk()
    upward = sorted((a, b) for a, b in edges if layer_of(b[0], order) < layer_of(a[0], order))
    climbs = [(a, b) for a, b in zip(stops, stops[1:]) if layer_of(b[0], order) < layer_of(a[0], order)]
    modules = {m for m, _ in stops}
    if args.list:
        for module, name in stops:
            print(f"stop   {module}.{name}")
        for kind, pairs in (("climb", climbs), ("upcall", upward)):
            for (ma, fa), (mb, fb) in pairs:
                print(f"{kind:<6} {ma}.{fa}  ->  {mb}.{fb}")
    print(f"stops {len(stops)} in {len(modules)} modules, climbs back up a layer {len(climbs)}, "
          f"upward calls {len(upward)}")


if __name__ == "__main__":
    main()
