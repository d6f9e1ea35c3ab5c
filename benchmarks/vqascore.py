"""VQAScore per sample at judge batch 1 and at batch 32.

VQAScore asks one question per image, so only batching across images fills a forward
pass. 32 different images (of two sizes) with one caption each, scored by the VQAScore
metric on the tiny random Qwen2-VL judge the tests use (and, with --hidden, a larger
one), each time into a fresh temporary store so nothing is cached. The two batch sizes
take turns over the rounds; each reports its median. Prints ms per sample, the ratio
(goal >= 4), the largest difference between the two ways' scores (they must agree), and
where each way's time goes: the model's forward passes, the processor (image
preprocessing and the batch's tokenising), and the rest (prompts, targets, cache keys,
the store), the parts that batching cannot shrink bounding the ratio.

Usage: python benchmarks/vqascore.py [--rounds 3] [--threads 1] [--hidden 64]
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
from caprecon.metrics import Context  # noqa: E402
from caprecon.metrics.vqascore import VQAScore  # noqa: E402
from caprecon.models.vlm_transformers import TransformersVLM  # noqa: E402
from caprecon.data.images import open_image  # noqa: E402
from caprecon.data.samples import Sample
from caprecon.store.index import Store  # noqa: E402

N = 32
GOAL = 4.0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--hidden", type=int, default=64, help="text hidden size (64: the tests' tiny judge)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    with tempfile.TemporaryDirectory() as tmp:
        path = tiny_vlm.build_qwen2_vl(Path(tmp) / "qwen2_vl", hidden=args.hidden)
        rng = np.random.RandomState(0)
        items = [open_image(Sample(id=str(i), image=Image.fromarray(
            (rng.rand(*((60, 80) if i % 2 else (90, 64)), 3) * 255).astype("uint8")),
            caption=f"a dog with a {['red', 'blue', 'green'][i % 3]} ball number {i}")) for i in range(N)]
        judges = {1: TransformersVLM(path, batch_size=1), N: TransformersVLM(path, batch_size=N)}
        for judge in judges.values():
            judge._load()  # weights load lazily: not inside the timings
            VQAScore(judge).score(items[:4], Context(Store.temporary()))  # warm-up

        times: dict[int, list[float]] = {b: [] for b in judges}
        parts: dict[int, dict[str, list[float]]] = {b: {"forward": [], "processor": []} for b in judges}
        spent = {"forward": 0.0, "processor": 0.0}
        for judge in judges.values():
            _time_calls(judge._model, "forward", spent)
            _time_calls(judge._processor, "__call__", spent)
        scores: dict[int, list[float]] = {}
        for _ in range(args.rounds):
            for batch, judge in judges.items():
                ctx = Context(Store.temporary())  # nothing cached between rounds
                spent.update(forward=0.0, processor=0.0)
                start = time.perf_counter()
                rows = VQAScore(judge).score(items, ctx)
                times[batch].append(time.perf_counter() - start)
                for part in spent:
                    parts[batch][part].append(spent[part])
                scores[batch] = [r["vqascore"] for r in rows]
        one, many = (statistics.median(times[b]) for b in (1, N))
        diff = float(np.abs(np.array(scores[1]) - np.array(scores[N])).max())
        print(f"VQAScore, {N} images (one question each), tiny Qwen2-VL judge (hidden {args.hidden}), "
              f"{args.threads} thread(s), median of {args.rounds} rounds")
        print(f"  judge batch 1     {1000 * one / N:8.2f} ms/sample")
        print(f"  judge batch {N}    {1000 * many / N:8.2f} ms/sample")
        print(f"  batch 1 / batch {N} per-sample cost   {one / many:6.1f}x   goal >= {GOAL}")
        print(f"  max |score difference|   {diff:.1e}")
        print("  where the time goes (ms/sample):   forward   processor   rest")
        for batch, total in ((1, one), (N, many)):
            forward, processor = (statistics.median(parts[batch][p]) for p in ("forward", "processor"))
            print(f"    batch {batch:<3d}                       {1000 * forward / N:7.2f}   {1000 * processor / N:9.2f}"
                  f"   {1000 * (total - forward - processor) / N:5.2f}")


def _time_calls(owner, name: str, spent: dict[str, float]) -> None:
    """Add the seconds `owner.name(...)` takes to `spent[...]` (the model's forward, the processor)."""
    part = "forward" if name == "forward" else "processor"
    real = getattr(owner.__class__, name)

    def timed(self, *args, **kwargs):
        started = time.perf_counter()
        try:
            return real(self, *args, **kwargs)
        finally:
            spent[part] += time.perf_counter() - started

    # on a subclass of the instance's own: a call looks __call__ (and nn.Module's forward) up there
    owner.__class__ = type(owner.__class__.__name__, (owner.__class__,), {name: timed})

if __name__ == "__main__":
    main()
