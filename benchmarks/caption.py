"""What drawing an image's N candidates in one batched call saves the captioner.

N = 10 sampled captions of one image from a small random Qwen2-VL built locally, two ways
in one process: one `caption` call per candidate (ten calls of n = 1), and one call with
n = 10 (the image processed once, expanded to ten rows that decode together). The ways
take turns over several rounds and each reports its median, so a busy machine slows
them alike. Prints ms per candidate and the ratio (goal for the batched call: >= 3).

Usage: python benchmarks/caption.py [--rounds 3] [--threads 1] [--new-tokens 32]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the tiny models and stand-ins
import offline_env  # noqa: E402, F401  (the offline environment, before torch, transformers or caprecon)

import numpy as np  # noqa: E402
import torch  # noqa: E402
from PIL import Image  # noqa: E402

import tiny_vlm  # noqa: E402
from caprecon.models.captioner import CaptionRequest, Sampling, TransformersCaptioner  # noqa: E402

N = 10
GOAL = 3.0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--new-tokens", type=int, default=32)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from transformers.utils import logging

    logging.disable_progress_bar()

    with tempfile.TemporaryDirectory() as tmp:
        path = tiny_vlm.build_qwen2_vl(Path(tmp) / "qwen2_vl", hidden=256, layers=4, vision_depth=4, image_side=336)
        image = Image.fromarray((np.random.RandomState(0).rand(480, 640, 3) * 255).astype("uint8"))
        captioner = TransformersCaptioner(path, batch_size=N)
        sampling = Sampling(temperature=0.8, max_new_tokens=args.new_tokens)
        ways = {
            "one call per candidate": lambda: [captioner.caption([CaptionRequest(image, "Describe the image.", 1, j)],
                                                                 sampling) for j in range(N)],
            f"one call, n = {N}": lambda: captioner.caption([CaptionRequest(image, "Describe the image.", N, 0)],
                                                             sampling),
        }
        for way in ways.values():  # warm-up: loading and first-call allocations stay out of the timings
            way()
        times: dict[str, list[float]] = {name: [] for name in ways}
        for _ in range(args.rounds):
            for name, way in ways.items():
                start = time.perf_counter()
                way()
                times[name].append(time.perf_counter() - start)
        print(f"tiny Qwen2-VL (hidden 256, 4 text + 4 vision layers), {N} candidates of up to {args.new_tokens} "
              f"tokens for one image, {args.threads} thread(s), median of {args.rounds} rounds")
        base = statistics.median(times["one call per candidate"])
        for name in ways:
            t = statistics.median(times[name])
            print(f"  {name:24s} {1000 * t / N:8.1f} ms/candidate")
        batched = base / statistics.median(times[f"one call, n = {N}"])
        print(f"batched_over_per_candidate  {batched:.1f}  goal >= {GOAL:g}")


if __name__ == "__main__":
    main()
