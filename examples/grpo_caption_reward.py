"""Train a captioner with GRPO (TRL 1.16) on a caprecon reward.

    pip install 'caprecon[train]'
    python examples/grpo_caption_reward.py --policy Qwen/Qwen2-VL-2B-Instruct --images photos/ \
        --preset fast --cache-dir cache --steps 200

The policy is a vision-language model that sees each picture of `--images` and is asked to
describe it; `caprecon.Reward` scores each of its completions against the picture (the dataset's
`image` column). Without `--preset`, the reward is the offline stand-in (`--preset offline`: no
text-to-image model, nothing downloaded beyond the policy). The store under `--cache-dir` makes a
completion seen before cost lookups, also across runs. With `--remote URL`, the reward is the one
`caprecon serve` serves there (`caprecon.RemoteReward`), on GPUs of its own. See docs/train.md.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Sequence

PROMPT = "Describe the image."
SUFFIXES = {".jpg", ".jpeg", ".png", ".webp", ".bmp"}


def dataset(images: Path, prompt: str = PROMPT):
    """One row per picture of the folder: TRL's conversational prompt with an image slot, and the
    picture itself in `image` (TRL hands it to the policy's processor, and to the reward)."""
    from datasets import Dataset
    from PIL import Image

    paths = sorted(p for p in images.iterdir() if p.suffix.lower() in SUFFIXES)
    if not paths:
        raise SystemExit(f"--images {images}: no pictures ({', '.join(sorted(SUFFIXES))}) in this folder")
    message = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": prompt}]}]
    return Dataset.from_dict({"prompt": [message] * len(paths),
                              "image": [Image.open(p).convert("RGB") for p in paths]})


def load_policy(name: str):
    """The model to train and its processor; the processor loads without torchvision too (Qwen-VL
    processors otherwise want a video processor that needs it)."""
    from transformers import AutoModelForImageTextToText

    from caprecon.models.vlm_processors import load_processor

    return AutoModelForImageTextToText.from_pretrained(name), load_processor(name)


def build_trainer(policy: str, images: Path, reward: Any, out: Path, *, steps: int = 200, generations: int = 8,
                  prompts_per_step: int = 2, completion_tokens: int = 64, temperature: float = 1.0,
                  top_k: int = 0, learning_rate: float = 1e-6):
    """A `GRPOTrainer` whose only reward is `reward`: each step samples `generations` completions for
    each of `prompts_per_step` pictures, and the reward scores all of them in one call."""
    from trl import GRPOConfig, GRPOTrainer

    model, processor = load_policy(policy)
    args = GRPOConfig(output_dir=str(out), max_steps=steps, per_device_train_batch_size=prompts_per_step * generations,
                      num_generations=generations, max_completion_length=completion_tokens, temperature=temperature,
                      top_k=top_k, learning_rate=learning_rate, logging_steps=1, save_strategy="no", report_to="none",
                      seed=0, use_cpu=not _cuda())
    return GRPOTrainer(model=model, processing_class=processor, reward_funcs=[reward], args=args,
                       train_dataset=dataset(images))


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--policy", required=True, help="the vision-language model to train: a Hub name or a folder")
    p.add_argument("--images", type=Path, required=True, help="a folder of pictures to caption")
    p.add_argument("--out", type=Path, default=Path("runs/grpo"), help="the trainer's output folder")
    p.add_argument("-m", "--metric", action="append", help="reward metric (repeatable; default recon)")
    p.add_argument("--preset", default=None, help="caprecon run preset (default: offline unless -g is given)")
    p.add_argument("-g", "--generator", help="text-to-image generator (name, folder or module:Class)")
    p.add_argument("-e", "--embedder", help="image embedder (name, folder or module:Class)")
    p.add_argument("--max-side", type=int, help="reconstruction size (long side, pixels)")
    p.add_argument("--cache-dir", default="cache", help="the store the reward reads and writes")
    p.add_argument("--remote", metavar="URL", help="score with the reward `caprecon serve` serves at URL "
                   "(caprecon.RemoteReward) instead of in this process; the reward options are the server's")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--generations", type=int, default=8, help="completions per prompt (GRPO's group size)")
    p.add_argument("--prompts-per-step", type=int, default=2)
    p.add_argument("--completion-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0, help="sample from the k likeliest tokens only (0: all)")
    p.add_argument("--learning-rate", type=float, default=1e-6)
    return p.parse_args(argv)


def make_reward(args: argparse.Namespace):
    import caprecon

    if args.remote:
        return caprecon.RemoteReward(args.remote)
    settings = {k: v for k, v in {"generator": args.generator, "embedder": args.embedder,
                                  "max_side": args.max_side}.items() if v is not None}
    preset = args.preset or (None if args.generator else "offline")
    return caprecon.Reward(args.metric or ["recon"], preset=preset, cache_dir=args.cache_dir, **settings)


def main(argv: Sequence[str] | None = None):
    args = parse(argv)
    trainer = build_trainer(args.policy, args.images, make_reward(args), args.out, steps=args.steps,
                            generations=args.generations, prompts_per_step=args.prompts_per_step,
                            completion_tokens=args.completion_tokens, temperature=args.temperature,
                            top_k=args.top_k, learning_rate=args.learning_rate)
    trainer.train()
    return trainer


if __name__ == "__main__":
    main(sys.argv[1:])
