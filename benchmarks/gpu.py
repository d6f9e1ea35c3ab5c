"""The prepared GPU check (run it through `benchmarks/gpu.sh`): caprecon against raw diffusers and
VQAScore batched against a per-sample loop, on one device, no network, in a few minutes.

Models: the tests' tiny random-weight SD and Qwen2-VL, built here, unless --sd / --vlm give a
local folder of a real one. Prints images/s of caprecon's reconstruction (`Reconstructor`, a
fresh store: cache keys, PNG writes, the index) against the raw diffusers pipeline called on the
same prompts and seeds at generator batch 1, 8 and 32; VQAScore items/s at judge batch 32
against a per-sample loop (batch 1); and the peak device memory (CUDA: torch's peak allocated;
CPU: the process's peak resident set). `--device cpu` runs the same on a machine without a GPU.

Usage: benchmarks/gpu.sh [--device cuda|cpu] [--sd PATH] [--vlm PATH] [--images 64] [--steps 4] [--side 256]
"""

from __future__ import annotations

import argparse
import resource
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

from caprecon.data.images import open_image  # noqa: E402
from caprecon.data.samples import Sample  # noqa: E402
from caprecon.metrics import Context  # noqa: E402
from caprecon.metrics.vqascore import VQAScore  # noqa: E402
from caprecon.models.generator import DiffusersGenerator  # noqa: E402
from caprecon.models.vlm_transformers import TransformersVLM  # noqa: E402
from caprecon.reconstruct.reconstructor import Reconstructor, ReconstructionSpec  # noqa: E402
from caprecon.store.index import Store  # noqa: E402

BATCHES = (1, 8, 32)


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed(fn, device: str, rounds: int) -> float:
    """Median seconds of `rounds` calls of `fn`, after one warm-up call."""
    fn()
    sync(device)
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def peak_memory(device: str) -> str:
    if device.startswith("cuda"):
        return f"{torch.cuda.max_memory_allocated() / 2**20:.0f} MiB (torch peak allocated on {device})"
    return f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10:.0f} MiB (peak resident set, CPU)"


def generation(args, sd: str, items, device: str) -> None:
    spec = ReconstructionSpec(size=(args.side, args.side))
    print(f"generation: {len(items)} images at {args.side}x{args.side}, {args.steps} steps, {sd}")
    print(f"  {'batch':>5s} {'raw diffusers':>14s} {'caprecon':>10s} {'ratio':>6s}   (images/s)")
    for batch in BATCHES:
        generator = DiffusersGenerator(sd, steps=args.steps, batch_size=batch, device=device)
        pipe = generator.pipeline
        reconstructor = Reconstructor(generator, Store.temporary(), spec)
        requests = [reconstructor.request_for(item)[1] for item in items]

        def ours() -> None:
            store = Store.temporary()  # nothing cached between rounds
            Reconstructor(generator, store, spec).reconstruct(items)
            store.flush()

        def raw() -> None:
            for start in range(0, len(requests), batch):
                chunk = requests[start : start + batch]
                with torch.inference_mode():
                    pipe(prompt=[r.prompt for r in chunk], width=args.side, height=args.side,
                         num_inference_steps=args.steps, output_type="pil",
                         generator=[torch.Generator(device).manual_seed(r.seed) for r in chunk])

        raw_s, ours_s = timed(raw, device, args.rounds), timed(ours, device, args.rounds)
        n = len(items)
        print(f"  {batch:5d} {n / raw_s:14.2f} {n / ours_s:10.2f} {raw_s / ours_s:6.3f}   goal >= 0.95")
        del generator, pipe


def vqascore(args, vlm: str, items, device: str) -> None:
    print(f"VQAScore: {len(items)} images, one question each, {vlm}")
    rates = {}
    for label, batch in (("per-sample loop", 1), (f"batch {max(BATCHES)}", max(BATCHES))):
        metric = VQAScore(TransformersVLM(vlm, batch_size=batch, device=device))
        rates[label] = len(items) / timed(lambda: metric.score(items, Context(Store.temporary())), device, args.rounds)
    for label, rate in rates.items():
        print(f"  {label:16s} {rate:10.2f} items/s")
    one, many = rates.values()
    print(f"  batched / per-sample {many / one:6.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    parser.add_argument("--sd", help="a local diffusers folder (default: the tiny random SD, built here)")
    parser.add_argument("--vlm", help="a local Qwen2-VL-style folder (default: the tiny random one, built here)")
    parser.add_argument("--images", type=int, default=64)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--side", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        sys.exit("gpu.py: no CUDA device here; run with --device cpu to check the script itself")
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        import tiny_models
        import tiny_vlm

        sd = args.sd or str(tiny_models.build_tiny_sd(Path(tmp) / "sd"))
        vlm = args.vlm or str(tiny_vlm.build_qwen2_vl(Path(tmp) / "qwen2_vl"))
        rng = np.random.default_rng(0)
        items = [open_image(Sample(id=str(i), image=Image.fromarray(rng.integers(0, 255, (96, 128, 3), dtype=np.uint8)),
                                   caption=f"a dog with a {['red', 'blue', 'green'][i % 3]} ball number {i}"))
                 for i in range(args.images)]
        name = torch.cuda.get_device_name(args.device) if args.device.startswith("cuda") else "CPU"
        print(f"device {args.device} ({name}), torch {torch.__version__}")
        generation(args, sd, items, args.device)
        vqascore(args, vlm, items, args.device)
    print(f"peak memory {peak_memory(args.device)}")
    print(f"total {time.perf_counter() - started:.1f} s")


if __name__ == "__main__":
    main()
