"""What batching one image's questions saves the vision-language judge.

15 multiple-choice questions about one image, scored with `option_probs` (and answered
with `generate`) on a small random Qwen2-VL built locally, three ways in one process:

- one call per question (15 calls of one request),
- one call, questions batched with the image repeated (share_prefix=False),
- one call, image and shared prompt start run once, its cache copied across the batch.

The ways take turns over several rounds and each reports its median, so a busy machine
slows them alike. Prints ms per question, the ratio to one call per question (goal for
the image-once call: >= 3), and the largest difference in probabilities from the
per-question results (they must agree).

Usage: python benchmarks/judge.py [--rounds 5] [--threads 1] [--image-side 336]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

GOAL = 3.0  # the image-once call against one call per question

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the tiny models and stand-ins
import offline_env  # noqa: E402, F401  (the offline environment, before torch, transformers or caprecon)

import numpy as np  # noqa: E402
import torch  # noqa: E402
from PIL import Image  # noqa: E402

import tiny_vlm  # noqa: E402
from caprecon.models.vlm import VLMRequest  # noqa: E402
from caprecon.models.vlm_transformers import TransformersVLM  # noqa: E402

QUESTIONS = 15
OPTIONS = ["A", "B", "C", "D"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--image-side", type=int, default=336,
                        help="images are resized to about side^2 pixels, one token per 28x28")
    parser.add_argument("--new-tokens", type=int, default=8)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from transformers.utils import logging

    logging.disable_progress_bar()

    with tempfile.TemporaryDirectory() as tmp:
        path = tiny_vlm.build_qwen2_vl(Path(tmp) / "qwen2_vl", hidden=256, layers=4, vision_depth=4,
                                       image_side=args.image_side)
        rng = np.random.RandomState(0)
        image = Image.fromarray((rng.rand(480, 640, 3) * 255).astype("uint8"))
        colours = ["red", "blue", "green", "yellow", "black"]
        requests = [VLMRequest(image, f"What colour is object {i} near the {colours[i % 5]} house?\n"
                                      f"A. red\nB. blue\nC. green\nD. yellow\n"
                                      f"Answer with the option's letter from the given choices directly.", "img")
                    for i in range(QUESTIONS)]
        options = [OPTIONS] * QUESTIONS
        shared = TransformersVLM(path, batch_size=16)
        repeated = TransformersVLM(path, batch_size=16, share_prefix=False)

        ways = {
            "one call per question": lambda op: [x for r in requests for x in op(shared, [r])],
            "one call, image repeated": lambda op: op(repeated, requests),
            "one call, image once": lambda op: op(shared, requests),
        }
        ops = {
            "option_probs": lambda vlm, reqs: vlm.option_probs(reqs, options[: len(reqs)]),
            "generate": lambda vlm, reqs: vlm.generate(reqs, max_new_tokens=args.new_tokens),
        }
        shared._load(), repeated._load()  # weights are loaded lazily: not inside the timings
        processed = shared._process([shared.render(requests[0].prompt)], image)["input_ids"][0]
        image_tokens = int((processed == shared._model.config.image_token_id).sum())
        print(f"tiny Qwen2-VL (hidden 256, 4 text + 4 vision layers), {QUESTIONS} questions about one image, "
              f"{image_tokens} image tokens, {len(processed)} prompt tokens each, "
              f"{args.threads} thread(s), median of {args.rounds} rounds")
        for op_name, op in ops.items():
            for way in ways.values():  # warm-up: first calls pay for allocation and kernel selection
                way(op)
            times: dict[str, list[float]] = {name: [] for name in ways}
            results: dict[str, list] = {}
            for _ in range(args.rounds):
                for name, way in ways.items():
                    start = time.perf_counter()
                    results[name] = way(op)
                    times[name].append(time.perf_counter() - start)
            base = statistics.median(times["one call per question"])
            print(f"\n{op_name}:")
            for name in ways:
                t = statistics.median(times[name])
                if op_name == "option_probs":
                    diff = float(np.abs(np.array(results[name]) - np.array(results["one call per question"])).max())
                    agree = f"max |dP| {diff:.1e}"
                else:
                    agree = "same answers" if results[name] == results["one call per question"] else "ANSWERS DIFFER"
                print(f"  {name:26s} {1000 * t / QUESTIONS:8.1f} ms/question   {base / t:5.1f}x cheaper   {agree}")
            once = base / statistics.median(times["one call, image once"])
            print(f"  one call per question / image once   {once:5.1f}x   goal >= {GOAL:g}")


if __name__ == "__main__":
    main()
