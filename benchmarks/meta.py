"""`caprecon meta`'s own cost against the reference metrics it evaluates.

Flickr8k-Expert judgments from the shared dev folder (only its 125 images here, not the
full 5,664 captions) and the full Flickr8k-CrowdFlower set there (5,910 judgments), each
on its own: the reference metrics computed as `caprecon meta` computes them,
then the agreement statistics with a 1,000-resample bootstrap — the vectorised one, and
for comparison the per-resample scipy loop it replaced (same draws, same interval).

Prints the seconds of each part and (metrics + statistics) / metrics (goal <= 1.2), per
judgments file.

Usage: python benchmarks/meta.py [--judgments PATH ...] [--resamples 1000] [--metrics bleu-4 cider ...]
"""

from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path

import numpy as np

from caprecon.data.judgments import load_judgments
from caprecon.stats.agreement import run_meta, scores_from_records
from caprecon.stats.bootstrap import bootstrap_ci
from caprecon.stats.correlation import kendall_tau
from caprecon.metrics.reference import ReferenceMetrics

GOAL = 1.2
ROOT = Path(__file__).resolve().parents[1]
# the shared dev folder: in the project, or beside it
DEV = next((d for d in (ROOT / "shared" / "data" / "flickr8k-dev", ROOT.parent / "shared" / "data" / "flickr8k-dev")
            if d.is_dir()), ROOT.parent / "shared" / "data" / "flickr8k-dev")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--judgments", nargs="+", default=[f"{DEV}/expert.jsonl", f"{DEV}/crowdflower.jsonl"])
    parser.add_argument("--resamples", type=int, default=1000)
    default = ["bleu-1", "bleu-4", "rouge", "cider"] + (["meteor"] if shutil.which("java") else [])
    parser.add_argument("--metrics", nargs="+", default=default)
    args = parser.parse_args()
    for path in args.judgments:
        measure(path, args)


def measure(path: str, args: argparse.Namespace) -> None:
    judgments = load_judgments(path)
    samples = judgments.samples()
    ids = [s.id for s in samples]
    with ReferenceMetrics(args.metrics) as reference:
        t = time.perf_counter()
        records = reference.score(samples)
        metrics_s = time.perf_counter() - t
    scores = {m: scores_from_records(records, m, ids) for m in args.metrics}

    t = time.perf_counter()
    rows = run_meta(judgments, scores, n_bootstrap=args.resamples)
    stats_s = time.perf_counter() - t

    # the loop it replaced, for one metric: scipy's τ on each resample's rows
    items = judgments.items
    human = np.array([r for it in items for r in it.ratings], float)
    groups = np.array([it.image_id for it in items for _ in it.ratings], dtype=object)
    x = scores[args.metrics[0]][np.array([k for k, it in enumerate(items) for _ in it.ratings])]
    t = time.perf_counter()
    loop = bootstrap_ci(lambda idx: kendall_tau(x[idx], human[idx], judgments.tau_variant), groups,
                        n_resamples=args.resamples)
    loop_s = time.perf_counter() - t

    n_images = len({it.image_id for it in items})
    print(f"{judgments.name}: {len(samples)} captions, {len(human)} judgments, {n_images} images; "
          f"{len(args.metrics)} metrics ({', '.join(args.metrics)}); {args.resamples} resamples")
    print(f"  reference metrics                       {metrics_s:8.3f} s")
    print(f"  agreement + bootstrap, all metrics      {stats_s:8.3f} s")
    print(f"  old per-resample loop, one metric       {loop_s:8.3f} s   (interval {loop[0]:.4f}..{loop[1]:.4f}; "
          f"vectorised {rows[0].ci_low:.4f}..{rows[0].ci_high:.4f})")
    print(f"  (metrics + statistics) / metrics        {(metrics_s + stats_s) / metrics_s:8.3f}   goal <= {GOAL}")


if __name__ == "__main__":
    main()
