"""halluc: claims checked per second per image, all of an image's claims in one judge batch
vs one question at a time.

Each of 8 images (of two sizes) carries 16 independent claims (a caption of 16 facts); the
judge is the tiny random Qwen2-VL the tests use (and, with --hidden, a larger one). Batched:
`check_claims` puts an image's claims to the judge in one call, which encodes the image once
and scores the questions on its shared prefix. One at a time: each claim is its own call,
at judge batch 1. Each round uses a fresh temporary store, so nothing is cached; the two
ways take turns over the rounds and each reports its median. Prints claims per second and
milliseconds per image both ways, the ratio (goal >= 4) and the largest difference between the two ways'
P(yes) (they must agree).

Usage: python benchmarks/halluc.py [--rounds 3] [--threads 1] [--hidden 64] [--claims 16]
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
from caprecon.metrics.base import Context  # noqa: E402
from caprecon.metrics.claims import Claim, check_claims  # noqa: E402
from caprecon.metrics.judging import LazyImages  # noqa: E402
from caprecon.models.vlm_transformers import TransformersVLM  # noqa: E402
from caprecon.store.index import Store, content_key  # noqa: E402

IMAGES = 8
GOAL = 4.0
THINGS = ["dog", "cat", "ball", "tree", "car", "bench", "kite", "boat"]
COLOURS = ["red", "blue", "green", "yellow"]


def claims(n: int) -> list[Claim]:
    out = []
    for k in range(n):
        thing, colour = THINGS[k % len(THINGS)], COLOURS[(k // len(THINGS)) % len(COLOURS)]
        out.append(Claim(f"there is a {colour} {thing}", "entity", f"Is there a {colour} {thing} in the image?"))
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--hidden", type=int, default=64, help="text hidden size (64: the tests' tiny judge)")
    parser.add_argument("--claims", type=int, default=16, help="claims per image")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    rng = np.random.RandomState(0)
    pictures = [Image.fromarray((rng.rand(*((60, 80) if i % 2 else (90, 64)), 3) * 255).astype("uint8"))
                for i in range(IMAGES)]
    keys = [content_key("bench-image", i=i) for i in range(IMAGES)]
    facts = claims(args.claims)

    def batched(judge, ctx: Context) -> list[float]:
        images = LazyImages()
        out = []
        for key, picture in zip(keys, pictures):  # one image at a time, as the metric meets them
            [checked] = check_claims(ctx, judge, images, [(images.add(key, lambda p=picture: p), facts)])
            out += [c.p_yes for c in checked]
        return out

    def one_at_a_time(judge, ctx: Context) -> list[float]:
        images = LazyImages()
        out = []
        for key, picture in zip(keys, pictures):
            images.add(key, lambda p=picture: p)
            for fact in facts:
                [[checked]] = check_claims(ctx, judge, images, [(key, [fact])])
                out.append(checked.p_yes)
        return out

    with tempfile.TemporaryDirectory() as tmp:
        path = tiny_vlm.build_qwen2_vl(Path(tmp) / "qwen2_vl", hidden=args.hidden)
        ways = {"batched": (batched, TransformersVLM(path, batch_size=64)),
                "one at a time": (one_at_a_time, TransformersVLM(path, batch_size=1))}
        for run, judge in ways.values():
            judge._load()  # weights load lazily: not inside the timings
            run(judge, Context(Store.temporary()))  # warm-up
        times: dict[str, list[float]] = {name: [] for name in ways}
        probs: dict[str, list[float]] = {}
        for _ in range(args.rounds):
            for name, (run, judge) in ways.items():
                ctx = Context(Store.temporary())  # nothing cached between rounds
                start = time.perf_counter()
                probs[name] = run(judge, ctx)
                times[name].append(time.perf_counter() - start)
    seconds = {name: statistics.median(t) for name, t in times.items()}
    rate = {name: args.claims * IMAGES / s for name, s in seconds.items()}
    diff = float(np.abs(np.array(probs["batched"]) - np.array(probs["one at a time"])).max())
    print(f"halluc claim checks, {IMAGES} images x {args.claims} claims, tiny Qwen2-VL judge (hidden {args.hidden}), "
          f"{args.threads} thread(s), median of {args.rounds} rounds")
    for name, r in rate.items():
        print(f"  {name:14s} {r:8.1f} claims/s   {1000 * seconds[name] / IMAGES:8.1f} ms per image")
    print(f"  batched / one at a time   {rate['batched'] / rate['one at a time']:6.1f}x   goal >= {GOAL}")
    print(f"  max |P(yes) difference|   {diff:.1e}")


if __name__ == "__main__":
    main()
