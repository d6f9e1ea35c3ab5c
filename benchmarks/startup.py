"""Start-up: a fully cached `caprecon score` from the command line against the imports any
such tool pays anyway.

Tiny diffusers + DINOv2 models built locally; one first run fills the cache, then the same
command is timed in fresh interpreters (median of --rounds), beside
`python -c "import numpy, PIL.Image, sqlite3"` timed the same way, alternating the two so
the machine's load falls on both alike. Also prints which heavy libraries the cached run
imported (none is the point: resolving devices, fingerprints and cache keys needs no torch).

Prints cached CLI run / bare imports (goal <= 8).

Usage: python benchmarks/startup.py [--samples 256] [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

GOAL = 8.0
HEAVY = ("torch", "transformers", "diffusers", "scipy.stats", "scipy.special")
PROBE = ("import runpy, sys\nsys.argv = ['caprecon', *sys.argv[1:]]\ntry:\n    runpy.run_module('caprecon.cli', "
         "run_name='__main__')\nexcept SystemExit:\n    pass\n"
         f"print('HEAVY', *[m for m in {HEAVY!r} if m in sys.modules], file=sys.stderr)")


def _time(argv: list[str], env: dict) -> float:
    started = time.perf_counter()
    subprocess.run(argv, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    import tiny_models
    from bench_common import write_samples

    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "TRANSFORMERS_VERBOSITY": "error"}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        sd, dino = tiny_models.build_tiny_sd(tmp / "sd"), tiny_models.build_tiny_dinov2(tmp / "dino")
        samples = write_samples(tmp / "samples", args.samples)[0]
        cli = ["score", "-i", str(samples), "-m", "recon", "--generator", str(sd), "--embedder", str(dino),
               "--max-side", "32", "--generator-opt", "steps=2", "--cache-dir", str(tmp / "cache"), "--quiet"]
        t = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "caprecon.cli", *cli, "--out", str(tmp / "first")], env=env,
                              capture_output=True, text=True)
        if done.returncode:
            sys.exit(f"the first run failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
        first = time.perf_counter() - t
        heavy = subprocess.run([sys.executable, "-c", PROBE, *cli, "--out", str(tmp / "probe")], env=env,
                               capture_output=True, text=True).stderr.splitlines()
        heavy = next((line.split()[1:] for line in heavy if line.startswith("HEAVY")), ["?"])
        cached, bare = [], []
        for i in range(args.rounds):  # alternated, so a burst of load elsewhere hits both sides
            cached.append(_time([sys.executable, "-m", "caprecon.cli", *cli, "--out", str(tmp / f"c{i}")], env))
            bare.append(_time([sys.executable, "-c", "import numpy, PIL.Image, sqlite3"], env))
        cached_s, bare_s = statistics.median(cached), statistics.median(bare)
        print(f"first {args.samples}-sample CLI run          {first:8.2f} s")
        print(f"cached {args.samples}-sample CLI run         {cached_s:8.2f} s   (median of {args.rounds})")
        print(f"python -c 'import numpy, PIL.Image, sqlite3' {bare_s:5.2f} s")
        print(f"heavy modules the cached run imported: {', '.join(heavy) or 'none'}")
        print(f"cached CLI run / bare imports  {cached_s / bare_s:8.1f}   goal <= {GOAL:g}")


if __name__ == "__main__":
    main()
