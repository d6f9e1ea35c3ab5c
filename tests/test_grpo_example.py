"""examples/grpo_caption_reward.py: TRL's real GRPOTrainer trains a tiny Qwen2-VL policy (built
here from a config) for a few steps on CPU with caprecon.Reward. The reward reconstructs through a
stand-in that draws noise seeded by the caption (a text-to-image model's cost, none of its
minutes on CPU), so every distinct completion gets its own reward and GRPO has advantages to learn
from."""

from __future__ import annotations

import hashlib
import importlib.util
import math
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tiny_vlm import build_qwen2_vl

from oracle import PixelEmbedder

from caprecon.apps.reward import Reward
from caprecon.models.generator import Generated

pytest.importorskip("trl")

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "grpo_caption_reward.py"


def load_example():
    spec = importlib.util.spec_from_file_location("grpo_caption_reward", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class NoiseGenerator:
    """Draws each request as noise seeded by its prompt and seed."""

    fingerprint = "caption-noise-v1"

    def generate(self, requests):
        out = []
        for r in requests:
            seed = int.from_bytes(hashlib.sha256(f"{r.prompt}|{r.seed}".encode()).digest()[:8], "little")
            pixels = np.random.default_rng(seed).integers(0, 255, (r.height, r.width, 3), dtype=np.uint8)
            out.append(Generated(Image.fromarray(pixels)))
        return out


class RecordingReward(Reward):
    """The reward, keeping every (picture, caption) and reward part the trainer asked for."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.seen: list[tuple[bytes, str, float | None]] = []

    def parts(self, images, captions):
        parts = super().parts(images, captions)
        for image, caption, value in zip(images, captions, parts["recon"]):
            self.seen.append((np.asarray(image).tobytes(), caption, value))
        return parts


def test_grpo_trains_a_tiny_vlm_with_the_reward(tmp_path):
    example = load_example()
    policy = build_qwen2_vl(tmp_path / "policy")
    photos = tmp_path / "photos"
    photos.mkdir()
    rng = np.random.default_rng(0)
    for k in range(2):
        Image.fromarray(rng.integers(0, 255, (56, 56, 3), dtype=np.uint8)).save(photos / f"p{k}.png")
    reward = RecordingReward(["recon"], generator=NoiseGenerator(), embedder=PixelEmbedder(), max_side=32,
                             cache_dir=str(tmp_path / "cache"), guards=None)
    # a random policy's next-token distribution is nearly flat; 2 tokens from the top 2 each give a
    # group of 4 its duplicates, as sampling a trained policy does
    trainer = example.build_trainer(str(policy), photos, reward, tmp_path / "out", steps=3, generations=4,
                                    prompts_per_step=2, completion_tokens=2, top_k=2, learning_rate=1e-3)
    trainer.train()

    assert trainer.state.global_step == 3
    logged = [row for row in trainer.state.log_history if "caprecon/recon" in row]
    assert len(logged) == 3 and all(math.isfinite(row["caprecon/recon"]) for row in logged)
    assert len(reward.seen) == 3 * 2 * 4 and all(v is not None for _, _, v in reward.seen)
    distinct = {(image, caption) for image, caption, _ in reward.seen}
    assert len(distinct) < len(reward.seen)  # the run did meet duplicate completions
    generated = reward.context.stats()["generated"]
    assert generated == len(distinct)  # ...and reconstructed each distinct one once

    # the same completion gets the same reward, now and at every step it came up, with no new generation
    first = {}
    for image, caption, value in reward.seen:
        assert first.setdefault((image, caption), value) == value
    pictures = [Image.open(photos / f"p{k}.png").convert("RGB") for k in range(2)]
    by_bytes = {np.asarray(p).tobytes(): p for p in pictures}
    keys = sorted(distinct)
    again = reward([by_bytes[image] for image, _ in keys], [caption for _, caption in keys])
    assert again == [first[k] for k in keys]
    assert reward.context.stats()["generated"] == generated
