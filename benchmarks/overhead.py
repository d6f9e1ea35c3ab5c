"""How much time a run spends outside the models, what the cache saves, and start-up.

Tiny diffusers + DINOv2 models built locally. Imports and model loading are timed apart
and printed, never counted as model time: the models are loaded (and warmed up) before
the first timed run. Then, for each sample count (64 and 1,024 by default), one run into
a fresh cache and the same run again on the warm cache, all in this process. Finally a
fully cached 64-sample `caprecon score` in a fresh interpreter, against `python -c pass`.

Model time is measured inside the models' own calls only: the diffusers pipeline's
`__call__` and the embedder network's `forward` (not the embedder's preprocessing, nor
anything the run adds around them), in wall time and in CPU time of the calling thread
(torch runs on it with --threads 1).

Prints:
- wall time / time inside model calls, first run            (goal <= 1.15)
- CPU time of the run (process + children) / CPU time inside model calls
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
MODEL = {"wall": 0.0, "cpu": 0.0}  # inside the models' own calls, since the last reset


def _timed(call):
    def timed(*args, **kwargs):
        wall, cpu = time.perf_counter(), time.thread_time()
        try:
            return call(*args, **kwargs)
        finally:
            MODEL["wall"] += time.perf_counter() - wall
            MODEL["cpu"] += time.thread_time() - cpu

    return timed


def _instrument(generator: DiffusersGenerator, embedder: HFVisionEmbedder) -> None:
    """Time the pipeline's `__call__` and the embedder network's `forward`, nothing around them."""
    pipe = generator.pipeline
    call = type(pipe).__call__
    pipe.__class__ = type(type(pipe).__name__, (type(pipe),), {"__call__": _timed(call)})
    embedder.model.forward = _timed(embedder.model.forward)


def _cpu() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


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
        _instrument(generator, embedder)
        warm = write_samples(tmp / "warm", 8)[0]  # first calls are slow (allocator, kernels): not a run's cost
        caprecon.score(warm, ["recon"], generator=generator, embedder=embedder, max_side=args.side,
                       cache_dir=str(tmp / "warm-cache"))
        print(f"imports (torch, diffusers, transformers)  {IMPORT_SECONDS:8.2f} s")
        print(f"model loading                             {load_seconds:8.2f} s   (neither counts below)")

        for n in args.samples:
            samples = write_samples(tmp / f"n{n}", n)[0]

            def run(out: str):
                REPORT.seconds.clear()
                MODEL.update(wall=0.0, cpu=0.0)
                t, cpu = time.perf_counter(), _cpu()
                res = caprecon.score(samples, ["recon"], generator=generator, embedder=embedder, max_side=args.side,
                                     batch_size=16, cache_dir=str(tmp / f"cache{n}"), out=tmp / f"{out}{n}")
                return time.perf_counter() - t, sum(REPORT.seconds), res, _cpu() - cpu, dict(MODEL)

            first_wall, first_report, first, first_cpu, inside = run("first")
            cached_wall, cached_report, cached, _, _ = run("cached")
            model = inside["wall"]
            print(f"--- {n} samples, {args.steps} steps")
            print(f"first run: wall               {first_wall:8.3f} s  (of which the HTML report {first_report:.3f} s)")
            print(f"first run: inside models      {model:8.3f} s  (generated {first.manifest['cache']['generated']}, "
                  f"embedded {first.manifest['cache']['embedded']}; the run's own count, with preprocessing: "
                  f"{first.manifest['cache']['model_seconds']:.3f} s)")
            print(f"first run: CPU s              {first_cpu:8.3f}  (inside models {inside['cpu']:.3f})")
            print(f"cached run: wall              {cached_wall:8.3f} s  (report {cached_report:.3f} s; generated {cached.manifest['cache']['generated']}, "
                  f"embedded {cached.manifest['cache']['embedded']})")
            print(f"wall / model time (first)     {first_wall / model:8.3f}   goal <= 1.15")
            print(f"wall / model, no report       {(first_wall - first_report) / model:8.3f}")
            print(f"CPU run / CPU in models       {first_cpu / inside['cpu']:8.3f}   "
                  f"(side by side with wall / model {first_wall / model:.3f})")
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
