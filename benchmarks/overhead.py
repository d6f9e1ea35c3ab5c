"""How much time a run spends outside the models, what the cache saves, and start-up.

Tiny diffusers + DINOv2 models built locally. Imports and model loading are timed apart
and printed, never counted as model time: the models are loaded (and warmed up) before
the first timed run. Then, for each sample count (64 and 1,024 by default), one run into
a fresh cache and the same run again on the warm cache, all in this process. Finally a
fully cached 64-sample `caprecon score` in a fresh interpreter, against `python -c pass`.

Prints:
- wall time / time inside model calls, first run            (goal <= 1.15)
- first-run time / cached-run time                          (goal >= 20)
- start-up of a fully cached 64-sample CLI run / `python -c pass`

Usage: python benchmarks/overhead.py [--samples 64 1024] [--steps 4] [--threads 1]
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
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

started = time.perf_counter()
import torch  # noqa: E402
import diffusers  # noqa: E402, F401
import transformers  # noqa: E402, F401

IMPORT_SECONDS = time.perf_counter() - started


import caprecon  # noqa: E402
import tiny_models  # noqa: E402
from bench_common import ReportTimer, write_samples  # noqa: E402
from caprecon.models.embedder import HFVisionEmbedder  # noqa: E402
from caprecon.models.generator import DiffusersGenerator  # noqa: E402


REPORT = ReportTimer()


def _seconds(argv: list[str], rounds: int) -> float:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        subprocess.run(argv, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, nargs="+", default=[64, 1024])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--side", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--startup-rounds", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    REPORT.install()

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        sd, dino = tiny_models.build_tiny_sd(tmp / "sd"), tiny_models.build_tiny_dinov2(tmp / "dino")
        t = time.perf_counter()
        generator = DiffusersGenerator(str(sd), steps=args.steps, batch_size=8)
        embedder = HFVisionEmbedder(str(dino))
        generator.pipeline, embedder.model  # noqa: B018 -- loaded before any timed run
        load_seconds = time.perf_counter() - t
        warm = write_samples(tmp / "warm", 8)[0]  # first calls are slow (allocator, kernels): not a run's cost
        caprecon.score(warm, ["recon"], generator=generator, embedder=embedder, max_side=args.side,
                       cache_dir=str(tmp / "warm-cache"))
        print(f"imports (torch, diffusers, transformers)  {IMPORT_SECONDS:8.2f} s")
        print(f"model loading                             {load_seconds:8.2f} s   (neither counts below)")

        for n in args.samples:
            samples = write_samples(tmp / f"n{n}", n)[0]

            def run(out: str):
                REPORT.seconds.clear()
                t = time.perf_counter()
                res = caprecon.score(samples, ["recon"], generator=generator, embedder=embedder, max_side=args.side,
                                     batch_size=16, cache_dir=str(tmp / f"cache{n}"), out=tmp / f"{out}{n}")
                return time.perf_counter() - t, sum(REPORT.seconds), res

            first_wall, first_report, first = run("first")
            cached_wall, cached_report, cached = run("cached")
            model = first.manifest["cache"]["model_seconds"]
            print(f"--- {n} samples, {args.steps} steps")
            print(f"first run: wall               {first_wall:8.3f} s  (of which the HTML report {first_report:.3f} s)")
            print(f"first run: inside models      {model:8.3f} s  (generated {first.manifest['cache']['generated']}, "
                  f"embedded {first.manifest['cache']['embedded']})")
            print(f"cached run: wall              {cached_wall:8.3f} s  (report {cached_report:.3f} s; generated {cached.manifest['cache']['generated']}, "
                  f"embedded {cached.manifest['cache']['embedded']})")
            print(f"wall / model time (first)     {first_wall / model:8.3f}   goal <= 1.15")
            print(f"wall / model, no report       {(first_wall - first_report) / model:8.3f}")
            print(f"first / cached run time       {first_wall / cached_wall:8.1f}   goal >= 20")
            print(f"  the same without the report {(first_wall - first_report) / (cached_wall - cached_report):8.1f}")

        # start-up: a fresh interpreter running a fully cached 64-sample score from the CLI
        samples = write_samples(tmp / "cli", 64)[0]
        cli = [sys.executable, "-m", "caprecon.cli", "score", "-i", str(samples), "-m", "recon", "--generator", str(sd),
               "--embedder", str(dino), "--max-side", str(args.side), "--generator-opt", f"steps={args.steps}",
               "--generator-opt", "batch_size=8", "--cache-dir", str(tmp / "cli-cache"), "--quiet"]
        _seconds([*cli, "--out", str(tmp / "cli-first")], 1)
        cached_cli = _seconds([*cli, "--out", str(tmp / "cli-cached")], args.startup_rounds)
        bare = _seconds([sys.executable, "-c", "pass"], args.startup_rounds)
        print("--- start-up")
        print(f"python -c pass                {bare:8.3f} s")
        print(f"cached 64-sample CLI score    {cached_cli:8.3f} s")
        print(f"cached CLI score / python     {cached_cli / bare:8.1f}")


if __name__ == "__main__":
    main()
