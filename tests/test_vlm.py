"""TransformersVLM and TransformersLLM on tiny random-weight checkpoints built here.

Random weights answer nonsense, so these tests check the machinery: probabilities are
probabilities, the batched and image-once paths agree with one call per request, and
answers are tokenised the way a reply starts.
"""

import os

os.environ["HF_HUB_OFFLINE"] = "1"

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from PIL import Image  # noqa: E402

import tiny_vlm  # noqa: E402
from caprecon.models.llm import TextLLM, TransformersLLM, reply_text, reply_token_ids  # noqa: E402
from caprecon.models.vlm import VisionLanguageModel, VLMRequest, group_by_image
from caprecon.models.vlm_processors import load_processor
from caprecon.models.vlm_transformers import TransformersVLM
from caprecon.data.qa import QAItem  # noqa: E402
from caprecon.metrics.grading import mc_from_probs  # noqa: E402

MC = ("How many birds are there?\nA. 1\nB. 2\nC. 3\nD. 4\n"
      "Answer with the option's letter from the given choices directly.")
QUESTIONS = [MC, "Is there a dog in the image? Answer yes or no.", "What colour is the car?",
             "Where is the bird? Give the bounding box as [x1, y1, x2, y2] of the red ball."]
LETTERS = ["A", "B", "C", "D"]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models gain nothing from intra-op threads, and on a busy machine the threads'
    spin-waiting makes these tests ten times slower."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def vlm_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny-vlm")
    return {"qwen2_vl": tiny_vlm.build_qwen2_vl(root / "qwen2_vl"), "llava": tiny_vlm.build_llava(root / "llava")}


@pytest.fixture(scope="session")
def lm_dir(tmp_path_factory):
    return tiny_vlm.build_qwen2_lm(tmp_path_factory.mktemp("tiny-lm") / "qwen2")


def _image(seed: int, size=(80, 60)) -> Image.Image:
    rng = np.random.RandomState(seed)
    return Image.fromarray((rng.rand(size[1], size[0], 3) * 255).astype("uint8"))


@pytest.fixture(scope="module")
def requests_():
    """Two images' questions, interleaved, so grouping has to restore the caller's order."""
    images = {"a": _image(0), "b": _image(1, (64, 90))}
    return [VLMRequest(images[k], q, k) for q in QUESTIONS for k in ("a", "b")]


@pytest.fixture(scope="module", params=["qwen2_vl", "llava"])
def family(request, vlm_dirs):
    return request.param, vlm_dirs[request.param]


ANSWERS = {QUESTIONS[0]: "A", QUESTIONS[1]: "yes", QUESTIONS[2]: "red", QUESTIONS[3]: "[1, 2, 3, 4]"}


def _run_all(vlm, reqs):
    """(option probabilities, answer probabilities, greedy replies) for `reqs`."""
    return (np.array(vlm.option_probs(reqs, [LETTERS] * len(reqs))),
            np.array(vlm.answer_prob(reqs, [ANSWERS[r.prompt] for r in reqs])),
            vlm.generate(reqs, max_new_tokens=5))


@pytest.fixture(scope="module")
def naive(family, requests_):
    """One call per request: the reference every faster path must reproduce."""
    vlm = TransformersVLM(family[1], batch_size=1, share_prefix=False)
    runs = [_run_all(vlm, [r]) for r in requests_]
    return (np.concatenate([r[0] for r in runs]), np.concatenate([r[1] for r in runs]),
            [r[2][0] for r in runs], vlm)


def test_protocol_and_lazy_loading(vlm_dirs):
    vlm = TransformersVLM(vlm_dirs["qwen2_vl"], system_prompt="Be brief.")
    assert isinstance(vlm, VisionLanguageModel)
    fp = vlm.fingerprint
    assert vlm._model is None  # fingerprinting reads no weights
    assert vlm.describe()["fingerprint"] == fp and vlm.describe()["share_prefix"] == "auto"
    assert TransformersVLM(vlm_dirs["qwen2_vl"], system_prompt="Be brief.", batch_size=2).fingerprint == fp
    assert TransformersVLM(vlm_dirs["qwen2_vl"]).fingerprint != fp
    assert "Be brief." in vlm.render("Q?")


def test_image_only_processor_loads_without_torchvision(vlm_dirs):
    from transformers import AutoProcessor
    from transformers.utils import is_torchvision_available

    path = str(vlm_dirs["qwen2_vl"])
    if not is_torchvision_available():
        with pytest.raises(ImportError):
            AutoProcessor.from_pretrained(path)
    processor = load_processor(path)
    assert type(processor).__name__ == "ImageOnlyQwen2VLProcessor" or is_torchvision_available()
    message = {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Hi"}]}
    text = processor.apply_chat_template([message], tokenize=False, add_generation_prompt=True)
    out = processor(text=[text], images=[_image(0, (56, 56))], return_tensors="pt")
    assert int((out["input_ids"] == processor.image_token_id).sum()) == 4  # (56/28)^2 merged patches


def test_probabilities_are_probabilities(family, naive):
    probs, answer, _, _ = naive
    assert probs.shape == (8, 4)
    assert ((probs >= 0) & (probs <= 1)).all() and (probs.sum(axis=1) <= 1 + 1e-6).all()
    assert ((answer >= 0) & (answer <= 1)).all()
    item = QAItem("a", "How many birds?", "mc", "B", choices=("1", "2", "3", "4"))
    for row in probs:
        letter, normalised, p_correct = mc_from_probs(item, row)
        assert abs(sum(normalised) - 1) < 1e-9 and letter == LETTERS[int(np.argmax(row))]
        assert p_correct == normalised[1]


def test_deterministic(family, requests_, naive):
    probs, answer, generated, vlm = naive
    again = _run_all(vlm, requests_[:2])
    assert np.array_equal(again[0], probs[:2]) and again[2] == generated[:2]


def test_batch_size_does_not_change_results(family, requests_, naive):
    probs, answer, generated, _ = naive
    vlm = TransformersVLM(family[1], batch_size=4, share_prefix=False)
    got_probs, got_answer, got_generated = _run_all(vlm, requests_)
    np.testing.assert_allclose(got_probs, probs, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(got_answer, answer, rtol=1e-5, atol=1e-12)
    assert got_generated == generated


@pytest.mark.parametrize("batch_size", [16, 3])  # 3: one image's questions span two batches
def test_image_once_matches_naive(family, requests_, naive, batch_size):
    probs, answer, generated, _ = naive
    vlm = TransformersVLM(family[1], batch_size=batch_size)
    got_probs, got_answer, got_generated = _run_all(vlm, requests_)
    assert vlm._prefix_ok
    image, indices = group_by_image(requests_)[0]
    texts = [vlm.render(requests_[i].prompt) for i in indices]
    assert vlm._split_prefix(image, texts, [vlm._tokenize(t) for t in texts]) is not None
    np.testing.assert_allclose(got_probs, probs, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(got_answer, answer, rtol=1e-5, atol=1e-12)
    assert got_generated == generated


def test_one_question_per_image_batches_across_images(family):
    """VQAScore's shape of work: five images of three sizes, one question each. With
    batch_size 8 they share one forward pass (scoring) and one `generate` call, and every
    answer equals the one-request-at-a-time answer."""
    images = [_image(10 + i, size) for i, size in enumerate([(80, 60), (64, 90), (80, 60), (56, 56), (64, 90)])]
    reqs = [VLMRequest(im, QUESTIONS[i % 2], f"img{i}") for i, im in enumerate(images)]
    alone = TransformersVLM(family[1], batch_size=1)
    expected = [_run_all(alone, [r]) for r in reqs]
    vlm = TransformersVLM(family[1], batch_size=8)
    model = vlm._load()[0]
    calls = {"forward": 0, "generate": 0}
    hook = model.register_forward_pre_hook(lambda *_: calls.__setitem__("forward", calls["forward"] + 1))
    try:
        probs = np.array(vlm.option_probs(reqs, [LETTERS] * len(reqs)))
        assert calls["forward"] == 1
        answer = np.array(vlm.answer_prob(reqs, [ANSWERS[r.prompt] for r in reqs]))
        assert calls["forward"] == 2
        generate = model.generate
        model.generate = lambda *a, **k: (calls.__setitem__("generate", calls["generate"] + 1), generate(*a, **k))[1]
        try:
            generated = vlm.generate(reqs, max_new_tokens=5)
        finally:
            del model.generate
        assert calls["generate"] == 1
    finally:
        hook.remove()
    np.testing.assert_allclose(probs, np.concatenate([e[0] for e in expected]), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(answer, np.concatenate([e[1] for e in expected]), rtol=1e-5, atol=1e-12)
    assert generated == [e[2][0] for e in expected]


def test_a_batch_of_prompts_is_rendered_and_tokenised_at_once_as_each_alone(family):
    """The chat template is rendered once around a placeholder and the tokenizer called once
    for all prompts (and once for all prompt-plus-option texts), with the same texts and ids
    as rendering and tokenising each prompt alone; prompts a template could trim go alone."""
    vlm = TransformersVLM(family[1], batch_size=8, system_prompt="Be brief.")
    processor = vlm._load()[1]
    prompts = [f'Does this figure show "a dog with a red ball number {i}"?' for i in range(6)] + \
        [" padded prompt ", "two\nlines"]
    assert vlm._render_all(prompts) == [vlm.render(p) for p in prompts]
    tokenizer = processor.tokenizer
    texts = [vlm.render(p) for p in prompts]
    alone = [tokenizer(t, add_special_tokens=not t.startswith(tokenizer.bos_token or "\x00"))["input_ids"]
             for t in texts]
    assert vlm._tokenize_all(texts) == alone
    calls = []
    real = type(tokenizer).__call__
    reqs = [VLMRequest(_image(20 + i), p, f"img{i}") for i, p in enumerate(prompts)]
    one = TransformersVLM(family[1], batch_size=1, system_prompt="Be brief.")
    expected = np.concatenate([one.option_probs([r], [["Yes", "No"]]) for r in reqs])
    type(tokenizer).__call__ = lambda self, *a, **k: (calls.append(1), real(self, *a, **k))[1]
    try:
        got = vlm.option_probs(reqs, [["Yes", "No"]] * len(reqs))
    finally:
        type(tokenizer).__call__ = real
    # prompts, prompt-plus-reply texts, and the processor's own call for the batch (twice on some
    # processors): not two per request as before
    assert len(calls) <= 5, len(calls)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-7)


def test_answer_prob_matches_option_probs_for_single_tokens(family, requests_):
    vlm = TransformersVLM(family[1])
    reqs = requests_[:4]
    tokenizer = vlm._load()[1].tokenizer
    text = vlm.render(reqs[0].prompt)
    lengths = [len(reply_token_ids(tokenizer, text, vlm._tokenize(text), o, True)) for o in ("A", "B", "zebra")]
    assert lengths[:2] == [1, 1] and lengths[2] > 1
    opts = np.array(vlm.option_probs(reqs, [["A", "B", "zebra"]] * 4))
    np.testing.assert_allclose(vlm.answer_prob(reqs, ["A"] * 4), opts[:, 0], rtol=1e-5)
    np.testing.assert_allclose(vlm.answer_prob(reqs, ["B"] * 4), opts[:, 1], rtol=1e-5)
    # several tokens: P(first) times the rest, so below P(first)
    assert (np.array(vlm.answer_prob(reqs, ["zebra"] * 4)) < opts[:, 2]).all()


def test_options_are_tokenised_as_the_reply_starts(family):
    vlm = TransformersVLM(family[1])
    tokenizer = vlm._load()[1].tokenizer
    text = vlm.render(MC)
    first = reply_token_ids(tokenizer, text, vlm._tokenize(text), "A", True)[0]
    if family[0] == "qwen2_vl":  # "...<|im_start|>assistant\n": the reply is "A"
        assert text.endswith("\n") and tokenizer.convert_ids_to_tokens(first) == "A"
    else:  # "... ASSISTANT:": the reply is " A" (byte-level "ĠA")
        assert text.endswith("ASSISTANT:") and tokenizer.convert_ids_to_tokens(first) == "ĠA"


def test_reply_text():
    assert reply_text("<|im_start|>assistant\n", "A") == "A"
    assert reply_text("ASSISTANT:", "A") == " A"
    assert reply_text("Answer:", " A") == " A"


def test_argument_errors(vlm_dirs, requests_):
    vlm = TransformersVLM(vlm_dirs["llava"])
    with pytest.raises(ValueError, match="2 requests but 1 option lists"):
        vlm.option_probs(requests_[:2], [LETTERS])
    with pytest.raises(ValueError, match="empty answer"):
        vlm.answer_prob(requests_[:1], [""])


def test_transformers_llm(lm_dir):
    prompts = ["Caption: a red car near a house.\n\n" + MC, "Caption: two dogs.\n\nIs there a dog? Answer yes or no.",
               "What colour is the car?"]
    llm = TransformersLLM(lm_dir, batch_size=1)
    assert isinstance(llm, TextLLM) and llm._model is None
    probs = np.array(llm.option_probs(prompts, [LETTERS] * 3))
    assert ((probs >= 0) & (probs <= 1)).all() and (probs.sum(axis=1) <= 1 + 1e-6).all()
    generated = llm.generate(prompts, max_new_tokens=5)
    batched = TransformersLLM(lm_dir, batch_size=4)
    np.testing.assert_allclose(batched.option_probs(prompts, [LETTERS] * 3), probs, rtol=1e-5, atol=1e-7)
    assert batched.generate(prompts, max_new_tokens=5) == generated
    np.testing.assert_allclose(batched.answer_prob(prompts, ["B"] * 3), probs[:, 1], rtol=1e-5)
    assert llm.render("Q?").endswith("<|im_start|>assistant\n")
