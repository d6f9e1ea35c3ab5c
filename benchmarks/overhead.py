"""How much time a run spends outside the models, and what the cache saves.

One run of 64 samples on tiny diffusers + DINOv2 models built locally, then the same run
again on the warm cache. Prints, from this one process:

- total wall time / time inside model calls, first run      (goal <= 1.15)
- first-run time / cached-run time                          (goal >= 20)

Usage: python benchmarks/overhead.py [--samples 64] [--steps 4]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import numpy as np  # noqa: E402
from PIL import Image  # noqa: E402

import caprecon  # noqa: E402
import tiny_models  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=64)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--side", type=int, default=64)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        sd = tiny_models.build_tiny_sd(tmp / "sd")
        dino = tiny_models.build_tiny_dinov2(tmp / "dino")
        rng = np.random.default_rng(0)
        rows = []
        for i in range(args.samples):
            path = tmp / f"img{i}.jpg"
            Image.fromarray(rng.integers(0, 255, (240, 320, 3), dtype=np.uint8)).save(path)
            rows.append({"id": str(i), "image": str(path), "caption": f"a photo of scene number {i} with a red car"})
        samples = tmp / "samples.jsonl"
        samples.write_text("\n".join(json.dumps(r) for r in rows))

        def run(out: str):
            started = time.perf_counter()
            res = caprecon.score(samples, ["recon"], generator=str(sd), embedder=str(dino), max_side=args.side,
                                 generator_options={"steps": args.steps, "batch_size": 8}, batch_size=16,
                                 cache_dir=str(tmp / "cache"), out=tmp / out)
            return time.perf_counter() - started, res

        first_wall, first = run("first")
        cached_wall, cached = run("cached")

    model = first.manifest["cache"]["model_seconds"]
    print(f"samples                       {args.samples}")
    print(f"first run: wall               {first_wall:8.3f} s")
    print(f"first run: inside models      {model:8.3f} s  (generated {first.manifest['cache']['generated']}, "
          f"embedded {first.manifest['cache']['embedded']})")
    print(f"cached run: wall              {cached_wall:8.3f} s  (generated {cached.manifest['cache']['generated']}, "
          f"embedded {cached.manifest['cache']['embedded']})")
    print(f"wall / model time (first)     {first_wall / model:8.3f}   goal <= 1.15")
    print(f"first / cached run time       {first_wall / cached_wall:8.1f}   goal >= 20")


if __name__ == "__main__":
    main()
