"""caprecon's ReconScore throughput against raw batched loops over the same models, doing like work.

Both sides run on the same tiny Stable Diffusion + DINOv2 models built locally, already
loaded: the raw loop decodes each source image, calls the diffusers pipeline on a batch
of prompts (one seeded generator per prompt, as caprecon does) and embeds sources and
reconstructions with the same embedder; caprecon runs `caprecon.score` into a fresh cache
and output folder, with everything it adds (hashing, cache look-ups, JSON rows, the
manifest, the HTML report every score run ends with). Before the rounds each side runs once
on one batch (caprecon into a cache of its own), as dedup.py does: a process's first `score`
imports caprecon's run, store and report modules, a once-per-process cost that is startup.py's
to measure. The sides run in every round, back to back, the order reversed from one round to
the next:

- `raw`: the bare loop, keeping nothing;
- `raw+png`: the loop keeping each reconstruction as caprecon's cache keeps it, a new PNG file
  each, saved with the store's options (`PNG_SAVE`), in a folder named by its key's first two
  characters (a new folder tree each round, so every file and folder is new, as in a fresh cache;
  it makes the folders its files need, about 160 for 256 keys, as a fresh cache makes its pictures'
  (the thumbnails of pictures that are their own go in one folder of the cache);
- `caprecon`: `caprecon.score` with the default store policy (`keep="images"`: a PNG file a
  reconstruction, its thumbnails for the report);
- `caprecon vectors` (at 2 steps; `--vectors-at` names others): the same with `keep="vectors"`:
  the store keeps each reconstruction's record and its embeddings but no picture, so it is set
  against the bare loop.

Each goal is a median over rounds of that round's side-by-side ratio (so the machine's drift
between rounds cancels), printed as `name VALUE goal <= X` or `goal >= X` with its direction
in its name:

- `cpu caprecon/raw+png` <= 1.05 at every step count (CPU of this process and its children,
  all threads, user and system);
- `wall raw+png/caprecon` >= 0.97 (the raw loop's seconds over caprecon's, report included:
  caprecon's throughput as a share of the loop's);
- `cpu caprecon-vectors/raw` <= 1.05 (at 2 steps).

Beside each goal the quartiles of the single rounds' ratios (on a shared VM they spread by a
tenth and more), and, unmarked, what each side adds over the bare loop; beside each side's CPU and
wall its minor page faults (the whole process's, `getrusage`). With `--in-use` a fifth
side scores new pictures and captions into a cache in use (its picture and thumbnail folders
made by an earlier run, as the default per-user cache's are), which a fresh cache makes as its
first pictures come: a one-time cost that weighs on 256 samples.

Before the rounds it prints what creating one file costs here, in the folder the benchmark
writes to (the temporary folder: set TMPDIR to move it): each reconstruction is a new file and
a fresh cache makes about 160 folders for 256 pictures, and on ext4 without a journal a new file costs up to a
millisecond of kernel CPU, 10-70x what it costs on tmpfs (docs/scale.md).

With `--steady-heap` the process's C heap is set, before anything runs, to keep what it frees
(glibc `mallopt`: no trimming below 256 MiB, blocks up to 32 MiB from the heap rather than
mapped afresh), for every side alike. By default glibc hands freed memory back to the system and
maps large blocks anew, so the models' own CPU depends on what else their thread allocated
between calls: on the project's machine (2026-12-07) the raw loops, which decode their sources
and encode their PNGs on the models' thread, took 240,000-320,000 minor page faults inside the
models per 256-sample run at 2 steps, caprecon (which does that work on other threads)
93,000-109,000, some 0.1-0.4 s of kernel CPU that moves each side's CPU by up to 10 %. With the
flag the faults inside the models fall to almost none on every side and what is left of the
ratios is each side's own work (docs/scale.md).

Usage: python benchmarks/throughput.py [--samples 256] [--steps 2 8] [--rounds 5] [--threads 1] [--vectors-at 2] [--in-use]
       [--steady-heap]
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the tiny models and stand-ins
import offline_env  # noqa: E402, F401  (the offline environment, before torch, transformers or caprecon)

started = time.perf_counter()
import torch  # noqa: E402
import diffusers  # noqa: E402, F401
import transformers  # noqa: E402, F401

IMPORT_SECONDS = time.perf_counter() - started

import numpy as np  # noqa: E402
from PIL import Image  # noqa: E402

import caprecon  # noqa: E402
import tiny_models  # noqa: E402
from bench_common import ReportTimer, file_creation_ms, write_samples  # noqa: E402
from caprecon.models.embedder import HFVisionEmbedder  # noqa: E402
from caprecon.models.generator import DiffusersGenerator  # noqa: E402
from caprecon.reconstruct.reconstructor import ReconstructionSpec  # noqa: E402
from caprecon.store.images import PNG_SAVE  # noqa: E402

CPU_GOAL = 1.05  # a side's CPU over the like raw loop's: goal <= this
WALL_GOAL = 0.97  # the like raw loop's seconds over caprecon's: goal >= this
BATCH = 16
REPORT = ReportTimer()


# glibc's mallopt parameters (malloc.h); the values --steady-heap gives them
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
STEADY_TRIM_BYTES, STEADY_MMAP_BYTES = 256 << 20, 32 << 20


def steady_heap() -> None:
    """Keep freed memory in the C heap (`--steady-heap`): no trimming below STEADY_TRIM_BYTES, blocks up to
    STEADY_MMAP_BYTES served from the heap, so a model call finds its buffers' pages mapped already."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError as exc:
        raise SystemExit(f"--steady-heap needs glibc ({exc})") from None
    if not (libc.mallopt(M_TRIM_THRESHOLD, STEADY_TRIM_BYTES) and libc.mallopt(M_MMAP_THRESHOLD, STEADY_MMAP_BYTES)):
        raise SystemExit("--steady-heap: glibc refused the heap settings (mallopt)")


def cpu_seconds() -> float:
    """CPU time of this process and its finished children, all threads, user and system."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def raw_loop(generator: DiffusersGenerator, embedder: HFVisionEmbedder, rows: list[dict], side: int,
             files: Path | None = None) -> None:
    """The same work with nothing around it: decode, generate in batches, embed, cosine. With
    `files`, each reconstruction is also kept there as caprecon's cache keeps it: a PNG saved
    with the store's options (`PNG_SAVE`) in a folder named by its key's first two characters."""
    pipe, spec = generator.pipeline, ReconstructionSpec(max_side=side)
    for start in range(0, len(rows), BATCH):
        chunk = rows[start : start + BATCH]
        sources = [Image.open(r["image"]).convert("RGB") for r in chunk]
        width, height = spec.size_for(*sources[0].size)  # every source has one size here
        seeds = [spec.seed_for(Path(r["image"]).stem, 0) for r in chunk]
        with torch.inference_mode():
            images = pipe(prompt=[r["caption"] for r in chunk], width=width, height=height, output_type="pil",
                          generator=[torch.Generator("cpu").manual_seed(s) for s in seeds],
                          num_inference_steps=generator.steps).images
        a, b = embedder.embed(sources), embedder.embed(images)
        (1 + np.sum(a * b, axis=1)) / 2
        for row, image in zip(chunk, images) if files else ():
            key = hashlib.sha256(row["caption"].encode()).hexdigest()
            (files / key[:2]).mkdir(parents=True, exist_ok=True)
            image.save(files / key[:2] / f"{key}.png", **PNG_SAVE)


def spread(ratios) -> str:
    """The lower and upper quartile of per-round ratios (their range with fewer than 4 rounds)."""
    ratios = sorted(ratios)
    low, high = (ratios[0], ratios[-1]) if len(ratios) < 4 else statistics.quantiles(ratios, n=4)[::2]
    return f"{low:.3f}-{high:.3f}"


class Side:
    """One side of the comparison: the wall and CPU seconds and the minor page faults of each of its rounds."""

    def __init__(self, run) -> None:
        self.run, self.wall, self.cpu, self.faults = run, [], [], []

    def __call__(self, r: int) -> None:
        t, cpu, faults = time.perf_counter(), cpu_seconds(), resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        self.run(r)
        self.wall.append(time.perf_counter() - t)
        self.cpu.append(cpu_seconds() - cpu)
        self.faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults)


def per_round(top: list[float], bottom: list[float]) -> list[float]:
    return [a / b for a, b in zip(top, bottom)]


def goal_line(name: str, ratios: list[float], relation: str, goal: float) -> str:
    """`name VALUE goal <= X`, the value the median of the rounds' ratios, their quartiles beside it."""
    return f"  {name:<34} {statistics.median(ratios):6.3f}   goal {relation} {goal:.2f}   (single rounds {spread(ratios)})"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=256)
    parser.add_argument("--steps", type=int, nargs="+", default=[2, 8])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--side", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--vectors-at", type=int, nargs="*", default=[2], metavar="STEPS",
                        help="the step counts at which caprecon --keep vectors runs too (its goal is at 2 steps)")
    parser.add_argument("--in-use", action="store_true",
                        help="also score into a cache in use (its folders made by an earlier run)")
    parser.add_argument("--steady-heap", action="store_true",
                        help="keep freed memory in the C heap (glibc mallopt), for every side: the models' "
                             "page faults then no longer depend on what their thread did between calls")
    args = parser.parse_args()
    if args.steady_heap:
        steady_heap()
    torch.set_num_threads(args.threads)
    REPORT.install()

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        sd, dino = tiny_models.build_tiny_sd(tmp / "sd"), tiny_models.build_tiny_dinov2(tmp / "dino")
        samples, rows = write_samples(tmp / "samples", args.samples)
        warm_up = tmp / "warm-up.jsonl"  # one batch of other captions, so no round finds its work cached
        warm_up.write_text("\n".join(json.dumps({**r, "caption": r["caption"] + " (warm-up)"}) for r in rows[:BATCH]))

        print(f"imports (torch, diffusers, transformers)  {IMPORT_SECONDS:7.2f} s   (outside every timing below)")
        print("C heap: " + ("steady (--steady-heap: freed memory kept, every side)" if args.steady_heap
                            else "glibc's defaults (freed memory handed back: the models' page faults vary by side)"))
        print(f"creating a file in {tmp.parent}: {file_creation_ms(tmp):.3f} ms of CPU   "
              f"(0.02 on tmpfs, 0.14-0.9 on ext4 without a journal, on the project's machine)")
        for steps in args.steps:
            t = time.perf_counter()
            generator = DiffusersGenerator(str(sd), steps=steps, batch_size=BATCH)
            embedder = HFVisionEmbedder(str(dino), batch_size=BATCH)
            generator.pipeline, embedder.model  # noqa: B018 -- load both before any timing
            report: list[float] = []

            def run_caprecon(data: Path, cache: Path, out: Path, keep: str = "images") -> None:
                caprecon.score(data, ["recon"], generator=generator, embedder=embedder, max_side=args.side,
                               batch_size=BATCH, cache_dir=str(cache), out=out, keep=keep)

            # warm-up, each side once: the models' first batch, and caprecon's first `score`, which
            # imports its run, store and report modules and compiles the report's template (a
            # once-per-process cost, startup.py's to measure; dedup.py warms up the same way)
            raw_loop(generator, embedder, rows[:BATCH], args.side)
            run_caprecon(warm_up, tmp / f"cache-warm-up-{steps}", tmp / f"out-warm-up-{steps}")
            load = time.perf_counter() - t

            def run_ours(r: int) -> None:
                REPORT.seconds.clear()
                run_caprecon(samples, tmp / f"cache-{steps}-{r}", tmp / f"out-{steps}-{r}")
                report.append(sum(REPORT.seconds))

            sides = {
                "raw": Side(lambda r: raw_loop(generator, embedder, rows, args.side)),
                "raw+png": Side(lambda r: raw_loop(generator, embedder, rows, args.side,
                                                   files=tmp / f"files-{steps}-{r}")),
                "caprecon": Side(run_ours),
            }
            if steps in args.vectors_at:
                sides["caprecon vectors"] = Side(lambda r: run_caprecon(
                    samples, tmp / f"cache-vectors-{steps}-{r}", tmp / f"out-vectors-{steps}-{r}", keep="vectors"))
            if args.in_use:
                in_use = tmp / f"cache-in-use-{steps}"  # its folders made by a first run, as a long-used cache's are
                run_caprecon(samples, in_use, tmp / f"out-in-use-{steps}")

                # new pictures and captions each round, so the cache in use holds nothing of that round's work
                fresh = [write_samples(tmp / f"samples-{steps}-{r}", args.samples, seed=1 + r,
                                       tag=f" ({steps} steps, round {r})")[0] for r in range(args.rounds)]
                sides["caprecon, cache in use"] = Side(
                    lambda r: run_caprecon(fresh[r], in_use, tmp / f"out-in-use-{steps}-{r}"))
            order = list(sides.values())
            for r in range(args.rounds):
                for side in (order if r % 2 == 0 else order[::-1]):  # who goes first alternates
                    side(r)

            n = args.samples
            raw, kept, ours = (sides[k] for k in ("raw", "raw+png", "caprecon"))
            print(f"{steps} steps: load + warm-up {load:.2f} s; {n} samples, median of {args.rounds} rounds")
            for name, side in sides.items():
                print(f"  {name:<24} {n / statistics.median(side.wall):8.1f} samples/s   "
                      f"CPU {statistics.median(side.cpu):6.2f} s   wall {statistics.median(side.wall):6.2f} s   "
                      f"minor page faults {statistics.median(side.faults):9,.0f}")
            print(f"  HTML report (inside caprecon's time)  {statistics.median(report):.2f} s")
            print(goal_line(f"cpu caprecon/raw+png {steps} steps", per_round(ours.cpu, kept.cpu), "<=", CPU_GOAL))
            print(goal_line(f"wall raw+png/caprecon {steps} steps", per_round(kept.wall, ours.wall), ">=", WALL_GOAL))
            if "caprecon vectors" in sides:
                print(goal_line(f"cpu caprecon-vectors/raw {steps} steps",
                                per_round(sides["caprecon vectors"].cpu, raw.cpu), "<=", CPU_GOAL))
            # what each side adds over the bare loop, no goal: the PNGs' share, and caprecon's over the bare loop
            for name in ("raw+png", "caprecon", "caprecon vectors", "caprecon, cache in use"):
                if name in sides:
                    print(f"  cpu {name}/raw {statistics.median(per_round(sides[name].cpu, raw.cpu)):6.3f}   "
                          f"wall raw/{name} {statistics.median(per_round(raw.wall, sides[name].wall)):6.3f}")


if __name__ == "__main__":
    main()
