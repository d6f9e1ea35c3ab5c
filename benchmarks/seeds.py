"""--seeds K: generation time per image, and what raising K costs.

1. Time per image at K=4: caprecon's `Reconstructor.reconstruct_seeds` (a batch's K·n
   requests in one generator call, a caption's four seeds in one pipeline batch, each image
   stored as PNG in a fresh store) against raw diffusers, one `pipe(prompt, num_images_per_prompt=4,
   generator=[4 generators])` per caption with nothing stored. Tiny random-weight SD (the
   tests' model) at --side pixels and --steps steps; the two take turns over the rounds and
   each reports its median. Goal: caprecon within 1.1x of raw diffusers.
2. A re-run at K=8 after K=4 (through `caprecon.score`, one cache): the images generated
   per caption (goal: exactly 4).
3. The demo data (the 12 bundled captions of 4 images) at K=8 with the tiny SD and the tiny
   DINOv2 as embedder: Kendall tau between the ranking of captions at k seeds and at 8.

Usage: python benchmarks/seeds.py [--rounds 3] [--captions 8] [--side 128] [--steps 4] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
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

import tiny_models  # noqa: E402
from scale_models import Counting  # noqa: E402
import caprecon  # noqa: E402
from caprecon.data.images import open_image  # noqa: E402
from caprecon.data.samples import Sample  # noqa: E402
from caprecon.models.generator import DiffusersGenerator  # noqa: E402
from caprecon.reconstruct.reconstructor import Reconstructor, ReconstructionSpec  # noqa: E402
from caprecon.stats.seeds import seeds_needed, stability  # noqa: E402
from caprecon.store.index import Store  # noqa: E402

GOAL = 1.1
K = 4
DEMO = Path(caprecon.__file__).parent / "data" / "demo"
WORDS = ["a dog on a beach", "two cups of coffee", "a red bicycle by a wall", "a cat asleep on a sofa",
         "a city street at night", "a bowl of fruit", "a mountain lake", "a child flying a kite"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--captions", type=int, default=8)
    parser.add_argument("--side", type=int, default=128, help="reconstruction side in pixels")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (1: least disturbed by other work)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    work = Path(tempfile.mkdtemp(prefix="caprecon-seeds-bench-"))
    sd = tiny_models.build_tiny_sd(work / "sd")
    dinov2 = tiny_models.build_tiny_dinov2(work / "dinov2")
    generator = DiffusersGenerator(sd, steps=args.steps, batch_size=K, device="cpu")
    pipe = generator.pipeline
    captions = [WORDS[i % len(WORDS)] + (f", take {i}" if i >= len(WORDS) else "") for i in range(args.captions)]
    picture = Image.new("RGB", (args.side, args.side), (120, 90, 60))
    items = [open_image(Sample(id=f"c{i}", image=picture, caption=c)) for i, c in enumerate(captions)]
    spec = ReconstructionSpec(size=(args.side, args.side))

    def ours() -> float:
        store = Store.temporary()  # a fresh, empty cache; opening it is a run's start-up, not generation
        started = time.perf_counter()
        Reconstructor(generator, store, spec).reconstruct_seeds(items, K)
        store.flush()
        return time.perf_counter() - started

    def raw() -> float:
        started = time.perf_counter()
        for i, caption in enumerate(captions):
            gens = [torch.Generator("cpu").manual_seed(1000 * i + k) for k in range(K)]
            with torch.inference_mode():
                pipe(prompt=caption, num_images_per_prompt=K, generator=gens, width=args.side, height=args.side,
                     num_inference_steps=args.steps, output_type="pil")
        return time.perf_counter() - started

    ours(), raw()  # warm-up: first calls allocate
    times: dict[str, list[float]] = {"caprecon": [], "raw diffusers": []}
    for _ in range(args.rounds):
        times["caprecon"].append(ours())
        times["raw diffusers"].append(raw())
    per_image = {name: 1000 * statistics.median(t) / (K * len(captions)) for name, t in times.items()}
    print(f"K={K} seeds x {len(captions)} captions, tiny SD at {args.side}px, {args.steps} steps, "
          f"{args.threads} thread(s), median of {args.rounds}")
    for name, ms in per_image.items():
        print(f"  {name:14s} {ms:8.1f} ms per image")
    ratio = per_image["caprecon"] / per_image["raw diffusers"]
    print(f"  caprecon / raw diffusers  {ratio:5.2f}x   goal <= {GOAL}")

    # 2. K=8 after K=4: only the new seeds are generated
    rows = [{"id": f"c{i}", "image": str(DEMO / "images" / "cat.jpg"), "caption": c} for i, c in enumerate(captions[:4])]
    samples = work / "samples.jsonl"
    samples.write_text("\n".join(json.dumps(r) for r in rows))
    counting = Counting(DiffusersGenerator(sd, steps=1, batch_size=K, device="cpu"))
    common = {"generator": counting, "embedder": str(dinov2), "max_side": 32, "cache_dir": str(work / "cache")}
    caprecon.score(samples, ["recon"], seeds=4, **common)
    first = counting.calls
    caprecon.score(samples, ["recon"], seeds=8, **common)
    print(f"K=8 after K=4, {len(rows)} captions: {first / len(rows):.0f} then {(counting.calls - first) / len(rows):.0f} "
          f"images generated per caption (goal: 4 then 4)")

    # 3. the demo data's ranking stability over seeds
    demo = caprecon.score(DEMO / "captions.jsonl", ["recon"], seeds=8, generator=counting, embedder=str(dinov2),
                          max_side=32, cache_dir=str(work / "cache"))
    curve = stability(demo.records, "recon", n_resamples=1000)
    print(f"demo data ({len(demo.records)} captions of 4 images), tiny SD + tiny DINOv2, recon at 8 seeds:")
    print("  k    tau    95% interval")
    for p in curve:
        print(f"  {p.k}  {p.tau:6.3f}  [{p.ci_low:6.3f}, {p.ci_high:6.3f}]")
    print(f"  seeds needed for tau >= 0.9: {seeds_needed(curve)}; "
          f"mean seed sd {np.mean([r['recon_sd'] for r in demo.records]):.4f}, "
          f"sd of caption means {np.std([r['recon'] for r in demo.records], ddof=1):.4f}")


if __name__ == "__main__":
    main()
