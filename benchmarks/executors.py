"""The local executor against Ray with 1 and 2 workers, on the same samples.

Tiny diffusers + DINOv2 models built locally; every generated image also costs `--busy`
seconds of pure-Python CPU work (tests/scale_models.BusyGenerator), so the reconstruct stage
dominates the way a real generator does on a GPU. Each run starts from an empty store. Prints:

- Ray's fixed start-up cost (ray.init of a local cluster), and the fixed cost of each Ray run
  (starting its stages' actors: a run of 2 samples without the extra work)
- wall time: local executor; Ray with 1 reconstruct worker; Ray with 2
- speed-up of 2 workers over 1                                (goal >= 1.6 on 2 cores)
- the machine's load average before and after, since the cores may be shared

The Ray wall times include starting each stage's actors (each imports torch and loads the
tiny models), which is paid once per run, not per sample.

Usage: python benchmarks/executors.py [--samples 24] [--busy 2.0] [--cpus 2]
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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=24)
    parser.add_argument("--busy", type=float, default=2.0, help="CPU seconds added to each generated image")
    parser.add_argument("--cpus", type=int, default=2, help="CPUs of the local Ray cluster")
    args = parser.parse_args()
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

        def run(name: str, busy: float = args.busy, samples: list = rows, **executor) -> tuple[float, list]:
            generator = BusyGenerator(DiffusersGenerator(str(sd), steps=2), busy)
            started = time.perf_counter()
            results = caprecon.score(samples, ["recon"], generator=generator, embedder=str(dino), max_side=32,
                                     batch_size=2, no_cache=True, out=tmp / name, **executor)
            return time.perf_counter() - started, results.scores("recon")

        local_wall, local_scores = run("local")

        path = os.pathsep.join([str(ROOT / "src"), str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")])
        started = time.perf_counter()
        ray.init(num_cpus=args.cpus, include_dashboard=False, log_to_driver=False,
                 runtime_env={"env_vars": {"PYTHONPATH": path, "HF_HUB_OFFLINE": "1"}})
        startup = time.perf_counter() - started

        # what every Ray run pays before its first sample: starting the stages' actors, which
        # import torch and load their models (2 samples, no extra work)
        per_run, _ = run("ray-fixed", busy=0.0, samples=rows[:2], executor="ray")
        walls = {}
        for workers in (1, 2):
            # the reconstruct stage gets the CPUs; the light metric stage shares them
            stages = {"reconstruct": StageOptions(workers=workers, cpus=1), "recon": StageOptions(cpus=0)}
            walls[workers], scores = run(f"ray{workers}", executor="ray", ray={"stages": stages})
            assert np.allclose(scores, local_scores, atol=1e-4), "Ray and local scores differ"
        ray.shutdown()

    print(f"samples                         {args.samples} (each +{args.busy:.2f} CPU s in the generator)")
    print(f"ray start-up (ray.init)         {startup:8.2f} s   fixed, once per process")
    print(f"ray per-run cost (actors, 2 samples) {per_run:5.2f} s   fixed, once per run")
    print(f"local executor: wall            {local_wall:8.2f} s")
    print(f"ray, 1 worker: wall             {walls[1]:8.2f} s")
    print(f"ray, 2 workers: wall            {walls[2]:8.2f} s")
    print(f"speed-up, 2 workers over 1      {walls[1] / walls[2]:8.2f}   goal >= 1.6 on 2 cores")
    print(f"load average before / after     {load_before[0]:.1f} / {os.getloadavg()[0]:.1f} "
          f"on {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
