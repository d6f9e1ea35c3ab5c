"""caprecon.Reward: TRL's reward-function contract, one generation per distinct completion, the
same reward for the same completion, and the guards against length and repetition.

The oracle draws the shapes a caption names and the pixel embedder compares ink, so each
expected ReconScore is worked out here from the two pictures directly."""

from __future__ import annotations

import asyncio
import pickle

import numpy as np
import pytest
from PIL import Image

from oracle import OracleGenerator, PixelEmbedder, render

from caprecon.apps.reward import AsyncReward, Guards, Reward, completion_text, repetition
from caprecon.core.errors import ConfigError


class CountingOracle(OracleGenerator):
    """The oracle, counting the prompts it draws (per instance, so a pickled copy counts its own)."""

    def __init__(self):
        self.prompts: list[str] = []

    def generate(self, requests):
        self.prompts += [r.prompt for r in requests]
        return super().generate(requests)


def expected_recon(image: Image.Image, caption: str) -> float:
    a, b = PixelEmbedder().embed([image, render(caption, *image.size)])
    return (1.0 + float(np.clip(a @ b, -1, 1))) / 2.0


@pytest.fixture
def pictures():
    return [render("red circle blue square"), render("green triangle")]


def make(tmp_path, **options):
    generator = CountingOracle()
    options.setdefault("guards", None)
    reward = Reward(["recon"], generator=generator, embedder=PixelEmbedder(), max_side=96,
                    cache_dir=str(tmp_path / "cache"), **options)
    return reward, generator


def test_trl_call_scores_each_distinct_completion_once(tmp_path, pictures):
    reward, generator = make(tmp_path)
    # GRPO: 2 prompts x 4 completions, duplicates among them, in TRL's conversational form
    texts = ["red circle blue square", "red circle", "red circle blue square", "red circle blue square",
             "green triangle", "blue triangle", "green triangle", "green triangle"]
    completions = [[{"role": "assistant", "content": t}] for t in texts]
    image = [pictures[0]] * 4 + [pictures[1]] * 4
    logged: dict[str, float] = {}
    got = reward(prompts=["describe"] * 8, completions=completions, completion_ids=[[1]] * 8, image=image,
                 log_metric=logged.__setitem__, trainer_state=None, log_extra=lambda *a: None)
    assert len(generator.prompts) == 4  # distinct (image, caption) pairs, not 8
    want = [expected_recon(im, t) for im, t in zip(image, texts)]
    assert got == pytest.approx(want, abs=1e-6)
    assert got[0] == pytest.approx(1.0, abs=1e-6) and got[1] < 0.99  # the exact caption rebuilds its picture
    assert logged["caprecon/recon"] == pytest.approx(sum(want) / 8, abs=1e-6)
    assert logged["caprecon/reward"] == pytest.approx(sum(want) / 8, abs=1e-6)
    # the next step: the same completions cost no generation, and get the same rewards
    again = reward(prompts=["describe"] * 8, completions=list(reversed(completions)), image=list(reversed(image)))
    assert len(generator.prompts) == 4
    assert again == list(reversed(got))


def test_same_completion_same_reward_anywhere_and_after_pickling(tmp_path, pictures):
    reward, _ = make(tmp_path)
    first = reward([pictures[0], pictures[1]], ["red circle", "green triangle"])
    # another batch, another position: the seed comes from the image's content, not the row
    moved = reward([pictures[1], pictures[1], pictures[0]], ["blue square", "green triangle", "red circle"])
    assert moved[2] == first[0] and moved[1] == first[1]
    copy = pickle.loads(pickle.dumps(reward))
    assert copy._built is None  # models and store are rebuilt by the copy, not shipped
    assert copy([pictures[0]], ["red circle"]) == [first[0]]
    assert copy.context.stats()["generated"] == 0  # found in the shared store


def test_guards_lower_padded_and_repeated_captions(tmp_path, pictures):
    guards = Guards(length_target=4, length_weight=0.5, repetition_n=2, repetition_weight=1.0)
    reward, _ = make(tmp_path, guards=guards)
    caption = "red circle blue square"
    repeated = "red circle red circle red circle"  # bigrams: rc, cr, rc, cr, rc -> 3 of 5 repeat
    padded = caption + " in a photo that shows a scene"  # 11 words: 11/4 - 1 = 1.75 over the target
    parts = reward.parts([pictures[0]] * 3, [caption, repeated, padded])
    assert parts["repetition"] == pytest.approx([0.0, -0.6, 0.0])
    assert parts["length"] == pytest.approx([0.0, -0.5 * (6 / 4 - 1), -0.5 * 1.75])
    total = reward([pictures[0]] * 3, [caption, repeated, padded])
    assert total[0] == pytest.approx(expected_recon(pictures[0], caption), abs=1e-6)
    assert total[1] == pytest.approx(expected_recon(pictures[0], repeated) - 0.6 - 0.25, abs=1e-6)
    assert total[2] < total[0] - 0.8


def test_weights_combine_metrics(tmp_path, pictures):
    reward, _ = make(tmp_path, weights={"recon": 2.0})
    assert reward([pictures[1]], ["green triangle"]) == pytest.approx([2.0 * 1.0], abs=1e-6)
    with pytest.raises(ConfigError, match="clipscore"):
        make(tmp_path, weights={"clipscore": 1.0})


def test_rows_it_cannot_score(tmp_path, pictures):
    reward, generator = make(tmp_path, empty=-1.0)
    got = reward(completions=["red circle", "  ", "green triangle"],
                 images=[[pictures[0]], [pictures[0]], [pictures[0], pictures[1]]])
    assert got[0] == pytest.approx(expected_recon(pictures[0], "red circle"), abs=1e-6)
    assert got[1] == -1.0  # an empty completion is the floor, never skipped
    assert got[2] is None  # two images: which one the caption describes is not known
    assert len(generator.prompts) == 1
    with pytest.raises(ConfigError, match="image"):
        reward(completions=["red circle"], prompts=["p"])


def test_async_reward_gives_the_same_values(tmp_path, pictures):
    sync, _ = make(tmp_path)
    run = AsyncReward(["recon"], generator=CountingOracle(), embedder=PixelEmbedder(), max_side=96,
                      cache_dir=str(tmp_path / "cache"), guards=None)
    got = asyncio.run(run(completions=["red circle"], image=[pictures[0]]))
    assert got == sync([pictures[0]], ["red circle"])


def test_text_of_completions_and_repetition():
    assert completion_text([{"role": "user", "content": "q"},
                            {"role": "assistant", "content": [{"type": "text", "text": "a dog"}]}]) == "a dog"
    assert completion_text("a cat") == "a cat"
    assert repetition("a dog runs", 3) == 0.0
    assert repetition("the dog the dog the dog", 2) == pytest.approx(3 / 5)  # td dt td dt td: 3 repeats


def test_reward_audit_shows_the_guards_lowering_padded_and_repeated_captions(tmp_path):
    from caprecon.cli.commands import main

    rows = []
    for k, caption in enumerate(["red circle", "blue square green triangle", "yellow circle", "black square"]):
        path = tmp_path / f"img{k}.png"
        render(caption).save(path)
        rows.append({"id": str(k), "image": str(path), "caption": f"a {caption}"})
    samples = tmp_path / "captions.jsonl"
    samples.write_text("\n".join(__import__("json").dumps(r) for r in rows))
    figures = tmp_path / "audit.json"
    code = main(["reward-audit", "-i", str(samples), "-g", "oracle:OracleGenerator", "-e", "oracle:PixelEmbedder",
                 "--max-side", "96", "--cache-dir", str(tmp_path / "cache"), "--length-target", "4",
                 "--repetition-n", "2", "--json", str(figures), "-q"])
    assert code == 0
    result = __import__("json").loads(figures.read_text())
    # padding adds no shape, so the oracle's picture and the metric stay; the length term takes 0.5 * overshoot
    assert result["metrics"]["rise_padded"] == pytest.approx(0.0, abs=1e-9)
    assert result["reward"]["rise_padded"] < -1.0
    assert result["reward"]["rise_repeated"] < result["metrics"]["rise_repeated"] - 0.2
    assert result["reward"]["scored"] == 4
