"""Probabilities from an encoder-decoder judge (InstructBLIP with a Flan-T5-style language
model, VQAScore's strongest family): read from the decoder's first step."""

import numpy as np
import pytest
from PIL import Image

from caprecon.metrics import Context
from caprecon.metrics.vqascore import VQAScore
from caprecon.models.vlm import VLMRequest
from caprecon.models.vlm_transformers import TransformersVLM
from caprecon.data.images import open_image
from caprecon.data.samples import Sample
from tiny_vlm import build_instructblip_t5


@pytest.fixture(scope="module")
def blip(tmp_path_factory):
    return TransformersVLM(build_instructblip_t5(tmp_path_factory.mktemp("blip") / "instructblip"), max_new_tokens=4)


@pytest.fixture
def items(tmp_path):
    out = []
    for i, (colour, caption) in enumerate([((200, 30, 30), "a red square"), ((30, 30, 200), "a dog on grass")]):
        Image.new("RGB", (40, 30), colour).save(tmp_path / f"{i}.png")
        out.append(open_image(Sample(id=str(i), image=tmp_path / f"{i}.png", caption=caption)))
    return out


def first_step_by_hand(blip, image, prompt):
    """The decoder's first-step softmax, from the model's own logits."""
    import torch

    model, processor = blip._load()
    inputs = processor(images=[image.convert("RGB")], text=[prompt], return_tensors="pt")
    start = model.config.text_config.decoder_start_token_id
    with torch.no_grad():
        logits = model(**inputs, decoder_input_ids=torch.tensor([[start]])).logits[0, 0]
    return torch.softmax(logits.double(), -1).numpy()


def token(blip, text):
    """The first token of `text` as the decoder's reply (a split word is read by its first piece)."""
    return blip._load()[1].tokenizer(text, add_special_tokens=False)["input_ids"][0]


def test_vqascore_is_p_yes_at_the_decoders_first_step(blip, items):
    assert len(blip._load()[1].tokenizer("Yes", add_special_tokens=False)["input_ids"]) == 1
    rows = VQAScore(blip).score(items, Context())
    normalised = VQAScore(blip, normalise=True).score(items, Context())
    for item, row, norm in zip(items, rows, normalised):
        p = first_step_by_hand(blip, item.image, f"Is the figure showing: {item.caption}?")
        assert row["vqascore"] == pytest.approx(p[token(blip, "Yes")], rel=1e-4)
        yes = p[token(blip, "Yes")] + p[token(blip, "yes")]
        no = p[token(blip, "No")] + p[token(blip, "no")]
        assert norm["vqascore"] == pytest.approx(yes / (yes + no), rel=1e-4)
    assert rows[0]["vqascore"] != pytest.approx(rows[1]["vqascore"], rel=1e-2)  # the input matters
    assert max(row["vqascore"] for row in rows) > 1e-4  # not a vanishing probability compared loosely


def test_answer_prob_teacher_forces_the_decoder(blip, items):
    import torch

    image, prompt, answer = items[0].image, "What colour is the car?", "red car"
    model, processor = blip._load()
    ids = processor.tokenizer(answer, add_special_tokens=False)["input_ids"]
    assert len(ids) > 1
    inputs = processor(images=[image.convert("RGB")], text=[prompt], return_tensors="pt")
    start = model.config.text_config.decoder_start_token_id
    with torch.no_grad():
        logits = model(**inputs, decoder_input_ids=torch.tensor([[start, *ids[:-1]]])).logits[0]
    by_hand = np.prod([torch.softmax(logits[k].double(), -1)[t].item() for k, t in enumerate(ids)])
    got = blip.answer_prob([VLMRequest(image, prompt, "a")], [answer])[0]
    assert got == pytest.approx(by_hand, rel=1e-4)


def test_generation_and_scoring_agree_on_the_first_step(blip, items):
    requests = [VLMRequest(it.image, "Is there a dog in the image?", it.image_key) for it in items]
    replies = blip.generate_with_token_probs(requests, ["Yes", "No"])
    probs = blip.option_probs(requests, [["Yes", "No"]] * len(requests))
    for reply, p, text in zip(replies, probs, blip.generate(requests)):
        np.testing.assert_allclose(reply["probs"][0], p, rtol=1e-4)
        assert reply["text"] == text
