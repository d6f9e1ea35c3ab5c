"""How the cache should store reconstructions: PNG at zlib level 1 with the run-length
strategy (what the store writes), PNG at level 1 with zlib's default strategy, PNG at
Pillow's default level, or lossless WebP.

Every reconstruction is written once and read whenever a later run needs its pixels, so
encode time is paid per generated image and size per cached one. The images are real
photographs (the Flickr8k-dev folder, resized to the side a generator would output),
with a random-noise image as the worst case. All four are lossless: each decode is
checked to give back the same pixels. Prints encode and decode ms per image and bytes, then
the stored format against Pillow's default PNG:

- encode time, stored / default PNG          goal <= 0.5 (written once per generated image)
- bytes per photo, stored / default PNG      goal <= 1.15 (what the cache pays on disk)
- encode time and bytes, stored / PNG level 1 with zlib's default strategy   goal <= 1 both

Usage: python benchmarks/encoding.py [--side 512] [--images 16]
"""

from __future__ import annotations

import argparse
import io
import statistics
import time
from pathlib import Path

import numpy as np
from PIL import Image

from caprecon.store.images import PNG_SAVE

ROOT = Path(__file__).resolve().parents[1]
# the Flickr8k-dev photos: in the project's shared/ folder, or in the shared/ folder beside the project
PHOTO_FOLDERS = [base / "shared" / "data" / "flickr8k-dev" / "images" for base in (ROOT, ROOT.parent)]
STORED, DEFAULT = "png level 1 rle (stored)", "png default (level 6)"
FORMATS = {
    STORED: PNG_SAVE,
    "png level 1": dict(format="PNG", compress_level=1),
    "png default (level 6)": dict(format="PNG"),
    "webp lossless": dict(format="WEBP", lossless=True, quality=0, method=0),
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--side", type=int, default=512)
    parser.add_argument("--images", type=int, default=16)
    parser.add_argument("--photos", type=Path, help="a folder of .jpg photos (default: the Flickr8k-dev images "
                                                     "in the project's shared/ folder or the one beside it)")
    args = parser.parse_args()
    folders = [args.photos] if args.photos else PHOTO_FOLDERS
    folder = next((f for f in folders if f.is_dir() and any(f.glob("*.jpg"))), None)
    paths = sorted(folder.glob("*.jpg"))[: args.images] if folder else []
    images = [Image.open(p).convert("RGB").resize((args.side, args.side)) for p in paths]
    source = f"{len(images)} photos from {folder}"
    if not images:
        source = (f"NO PHOTOS in {' or '.join(map(str, folders))}: fell back to random noise, "
                  "whose ratios say nothing about photos")
    rng = np.random.default_rng(0)
    noise = Image.fromarray(rng.integers(0, 255, (args.side, args.side, 3), dtype=np.uint8))
    print(f"{source} at {args.side}x{args.side}, and one random-noise image")
    print(f"{'format':24} {'encode ms':>10} {'decode ms':>10} {'KiB/photo':>10} {'KiB noise':>10}")
    medians: dict[str, tuple[float, float]] = {}
    for name, options in FORMATS.items():
        encode, decode, sizes = [], [], []
        for image in images or [noise]:
            started = time.perf_counter()
            buf = io.BytesIO()
            image.save(buf, **options)
            encode.append(time.perf_counter() - started)
            data = buf.getvalue()
            sizes.append(len(data))
            started = time.perf_counter()
            back = Image.open(io.BytesIO(data)).convert("RGB")
            decode.append(time.perf_counter() - started)
            assert np.array_equal(np.asarray(back), np.asarray(image)), f"{name} is not lossless"
        buf = io.BytesIO()
        noise.save(buf, **options)
        print(f"{name:24} {1000 * statistics.median(encode):10.1f} {1000 * statistics.median(decode):10.1f} "
              f"{statistics.mean(sizes) / 1024:10.0f} {len(buf.getvalue()) / 1024:10.0f}")
        medians[name] = (statistics.median(encode), statistics.mean(sizes))
    (stored_time, stored_size), (default_time, default_size) = medians[STORED], medians[DEFAULT]
    print()
    print(f"encode time, stored / default PNG   {stored_time / default_time:6.2f}   goal <= 0.5")
    print(f"bytes per photo, stored / default   {stored_size / default_size:6.2f}   goal <= 1.15")
    level1_time, level1_size = medians["png level 1"]
    print(f"stored / level 1's default strategy: encode time {stored_time / level1_time:5.2f}, "
          f"bytes {stored_size / level1_size:5.2f}   goal <= 1 both")


if __name__ == "__main__":
    main()
