"""The local executor against Ray with 1 and 2 workers, on the same samples.

Tiny diffusers + DINOv2 models built locally; every generated image also costs `--busy`
seconds of pure-Python CPU work (tests/scale_models.BusyGenerator), so the reconstruct stage
dominates the way a real generator does on a GPU. Each run starts from an empty store.

A Ray run pays a fixed cost before its first sample: each actor is a fresh process that
imports torch and loads its models (on a GPU cluster, loading a real checkpoint: tens of
seconds). To separate that from how throughput scales, every Ray configuration runs twice,
on `--small` and on `--samples` samples: the difference is the time the extra samples
took (the steady state), and what is left of the small run is the fixed cost.

Prints:
- Ray's start-up (ray.init of a local cluster), once per process
- per configuration and worker count: wall time of the full run, fixed cost per run, and
  seconds per sample in the steady state
- speed-up of 2 workers over 1 in the steady state        (goal >= 1.6 on 2 cores)
  and over whole runs of `--samples` (fixed costs included)
- configurations: the metric stage run inside the reconstruct actors (the default for recon
  and clip-image; `--stage recon:with=reconstruct`), and in a pool of its own
  (`--stage recon:cpus=0`)
- the machine's load average before and after, since the cores may be shared

Usage: python benchmarks/executors.py [--samples 24] [--small 4] [--busy 2.0] [--cpus 2]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import numpy as np  # noqa: E402
from PIL import Image  # noqa: E402

import caprecon  # noqa: E402
import tiny_models  # noqa: E402
from caprecon.models.generator import DiffusersGenerator  # noqa: E402
from caprecon.run.ray import StageOptions  # noqa: E402
from scale_models import BusyGenerator  # noqa: E402

GOAL = 1.6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=24)
    parser.add_argument("--small", type=int, default=4, help="samples of the run that measures the fixed cost")
    parser.add_argument("--busy", type=float, default=2.0, help="CPU seconds added to each generated image")
    parser.add_argument("--cpus", type=int, default=2, help="CPUs of the local Ray cluster")
    args = parser.parse_args()
    if not 0 < args.small < args.samples:
        parser.error("--small must be between 0 and --samples")
    load_before = os.getloadavg()

    import ray

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        sd = tiny_models.build_tiny_sd(tmp / "sd")
        dino = tiny_models.build_tiny_dinov2(tmp / "dino")
        rng = np.random.default_rng(0)
        rows = []
        for i in range(args.samples):
            path = tmp / f"img{i}.png"
            Image.fromarray(rng.integers(0, 255, (24, 32, 3), dtype=np.uint8)).save(path)
            rows.append({"id": str(i), "image": str(path), "caption": f"a photo of scene number {i}"})

        def run(name: str, samples: list, **executor) -> tuple[float, list]:
            generator = BusyGenerator(DiffusersGenerator(str(sd), steps=2), args.busy)
            started = time.perf_counter()
            results = caprecon.score(samples, ["recon"], generator=generator, embedder=str(dino), max_side=32,
                                     batch_size=2, no_cache=True, out=tmp / name, **executor)
            return time.perf_counter() - started, results.scores("recon")

        local_wall, local_scores = run("local", rows)

        path = os.pathsep.join([str(ROOT / "src"), str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")])
        started = time.perf_counter()
        ray.init(num_cpus=args.cpus, include_dashboard=False, log_to_driver=False,
                 runtime_env={"env_vars": {"PYTHONPATH": path, "HF_HUB_OFFLINE": "1"}})
        startup = time.perf_counter() - started

        configurations = {
            # the reconstruct stage gets the CPUs; the light metric stage shares them ...
            "separate": lambda w: {"reconstruct": StageOptions(workers=w, cpus=1), "recon": StageOptions(cpus=0)},
            # ... or runs inside the reconstruct actors
            "fused": lambda w: {"reconstruct": StageOptions(workers=w, cpus=1), "recon": StageOptions(with_="reconstruct")},
        }
        extra = args.samples - args.small
        measured: dict[str, dict[int, tuple[float, float, float]]] = {}
        for label, stages in configurations.items():
            measured[label] = {}
            for workers in (1, 2):
                small, _ = run(f"{label}{workers}-small", rows[: args.small], executor="ray",
                               ray={"stages": stages(workers)})
                full, scores = run(f"{label}{workers}", rows, executor="ray", ray={"stages": stages(workers)})
                assert np.allclose(scores, local_scores, atol=1e-4), f"Ray ({label}) and local scores differ"
                per_sample = (full - small) / extra
                measured[label][workers] = (full, small - args.small * per_sample, per_sample)
        ray.shutdown()

    print(f"samples                         {args.samples} (each +{args.busy:.2f} CPU s in the generator); "
          f"fixed costs from runs of {args.small}")
    print(f"ray start-up (ray.init)         {startup:8.2f} s   once per process")
    print(f"local executor: wall            {local_wall:8.2f} s   ({local_wall / args.samples:.2f} s per sample)")
    titles = {"separate": "recon in a pool of its own (--stage recon:cpus=0)",
              "fused": "recon inside the reconstruct actors (the default; --stage recon:with=reconstruct)"}
    for label, by_workers in measured.items():
        print(titles[label])
        for workers, (full, fixed, per_sample) in by_workers.items():
            print(f"  {workers} worker(s): wall {full:7.2f} s = fixed {fixed:6.2f} s + {per_sample:5.2f} s per sample")
        (full1, _, one), (full2, _, two) = by_workers[1], by_workers[2]
        print(f"  speed-up, 2 workers over 1, steady state   {one / two:6.2f}   goal >= {GOAL} on 2 cores")
        print(f"  speed-up, 2 workers over 1, whole runs     {full1 / full2:6.2f}   (fixed costs included)")
    print(f"load average before / after     {load_before[0]:.1f} / {os.getloadavg()[0]:.1f} "
          f"on {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
