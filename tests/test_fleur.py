"""FLEUR as its reference code (`fleur.py` in FLEUR's repository) computes it: the rating
read from the reply's digits and dots, smoothed by the full-vocabulary digit probabilities
at the positions where the judge wrote the digits of str(float(rating)). Every expected
value below is worked out by hand from the distributions the test sets."""

import numpy as np
import pytest
from PIL import Image

from caprecon.core.errors import ConfigError
from caprecon.metrics import Context
from caprecon.metrics.fleur import DIGITS, PROMPT, Fleur, fleur_score
from caprecon.data.images import open_image
from caprecon.data.samples import Sample


def digits(weights, elsewhere=0.0):
    """Full-vocabulary probabilities of the ten digits: `weights` (by digit) scaled so that
    `elsewhere` of the mass sits on other tokens."""
    p = np.zeros(10)
    for d, w in weights.items():
        p[d] = w
    return list(p / p.sum() * (1 - elsewhere))


class ScriptedRater:
    """A judge whose greedy reply and per-position digit probabilities the test sets."""

    fingerprint = "scripted-rater"

    def __init__(self, tokens, probs):
        self.tokens, self.probs, self.prompts = tokens, probs, []

    def generate_with_token_probs(self, requests, tokens, max_new_tokens=None):
        assert list(tokens) == DIGITS
        self.prompts += [r.prompt for r in requests]
        return [{"text": "".join(self.tokens), "tokens": list(self.tokens), "probs": self.probs} for _ in requests]


@pytest.fixture
def item(tmp_path):
    Image.new("RGB", (16, 12), (200, 30, 30)).save(tmp_path / "a.png")
    return open_image(Sample(id="a", image=tmp_path / "a.png", caption="a red square"))


NONE = [0.0] * 10
# a distribution that would change the score wherever it were (wrongly) read
DECOY = digits({9: 1.0})


def test_the_issues_worked_examples_use_full_vocabulary_probabilities(item):
    # "0.75": at the first decimal P(7, 8, 6) = (.6, .3, .1) of 80 % of the vocabulary's mass,
    # i.e. (.48, .24, .08): (7·.48 + 8·.24 + 6·.08)/10 = (3.36 + 1.92 + .48)/10 = .576;
    # at the second P(5, 0, 9) = (.5, .25, .25) of 50 %, i.e. (.25, .125, .125):
    # (5·.25 + 0·.125 + 9·.125)/100 = (1.25 + 1.125)/100 = .02375; in all .59975
    rater = ScriptedRater(["0", ".", "7", "5"], [DECOY, DECOY, digits({7: .6, 8: .3, 6: .1}, 0.2),
                                                 digits({5: .5, 0: .25, 9: .25}, 0.5)])
    row = Fleur(rater).score([item], Context())[0]
    assert row["fleur"] == pytest.approx(0.59975, abs=1e-12) and row["fleur_greedy"] == 0.75
    assert rater.prompts == [PROMPT.replace("{caption}", "a red square")]
    # "1.0": P(1, 0, 9) = (.7, .2, .1) of 70 % at the "1", i.e. P("1") = .49, P("0") = .14:
    # .9·.14 + .49 = .616
    one = ScriptedRater(["1", ".", "0"], [digits({1: .7, 0: .2, 9: .1}, 0.3), DECOY, DECOY])
    row = Fleur(one).score([item], Context())[0]
    assert row["fleur"] == pytest.approx(0.616, abs=1e-12) and row["fleur_greedy"] == 1.0


@pytest.mark.parametrize("tokens, probs, expected, written", [
    # "0.50" is 0.5 to float(): its first decimal only; P(5, 4) = (.6, .2), 20 % elsewhere:
    # (5·.6 + 4·.2)/10 = .38 (the decoy at the written "0" adds nothing)
    (["0", ".", "5", "0"], [DECOY, DECOY, digits({5: .75, 4: .25}, 0.2), DECOY], 0.38, 0.5),
    # "0.7": P(7, 6) = (.5, .3), 20 % elsewhere: (7·.5 + 6·.3)/10 = .53
    (["0", ".", "7"], [DECOY, DECOY, digits({7: .625, 6: .375}, 0.2)], 0.53, 0.7),
    # "0.05": the first decimal is a "0", read at its second occurrence (the first is the
    # leading "0", whose decoy is ignored): P(0, 1, 2) = (.4, .4, .1): (0 + .4 + .2)/10 = .06;
    # the second decimal: P(5, 6) = (.6, .2): (3 + 1.2)/100 = .042; in all .102
    (["0", ".", "0", "5"], [DECOY, DECOY, digits({0: .4, 1: .4, 2: .1}, 0.1), digits({5: .75, 6: .25}, 0.2)],
     0.102, 0.05),
    # "1": as "1.0": P(1, 0, 2) = (.5, .3, .1) at the "1": .9·.3 + .5 = .77
    (["1"], [digits({1: .5, 0: .3, 2: .1}, 0.1)], 0.77, 1.0),
    # a bare "0" (str(0.0) = "0.0"): smoothed at that "0" as the first decimal:
    # P(0, 3, 8) = (.2, .4, .1): (0 + 1.2 + .8)/10 = .2
    (["0"], [digits({0: .2, 3: .4, 8: .1}, 0.3)], 0.2, 0.0),
    # the reply's other characters are dropped before float(): "Score: 0.8." reads 0.8;
    # P(8, 9) = (.3, .3): (2.4 + 2.7)/10 = .51
    (["Score", ":", " ", "0", ".", "8", "."], [DECOY, DECOY, DECOY, DECOY, DECOY, digits({8: .5, 9: .5}, 0.4),
                                               DECOY], 0.51, 0.8),
])
def test_written_ratings_are_smoothed_where_the_reference_reads_them(tokens, probs, expected, written, item):
    row = Fleur(ScriptedRater(tokens, probs)).score([item], Context())[0]
    assert row["fleur"] == pytest.approx(expected, abs=1e-12) and row["fleur_greedy"] == written
    assert "fleur_unparsed" not in row and "fleur_unsmoothed" not in row


def test_a_repeated_second_decimal_is_read_at_its_second_occurrence():
    # "0.77": the first decimal at the first "7", the second at the second:
    # (7·.5)/10 + (4·.5)/100 = .35 + .02
    tokens = ["0", ".", "7", "7"]
    assert fleur_score(tokens, [DECOY, DECOY, digits({7: 1}, 0.5), digits({4: 1}, 0.5)]) == (
        pytest.approx(0.37, abs=1e-12), 0.77)


@pytest.mark.parametrize("tokens", [["1", ".", "5"], ["2"], ["good"], ["Score", ":", " ", "7", ".", "0"],
                                    ["0", ".", "8", "/", "1", ".", "0"], ["8", "/", "1", "0"]])
def test_ratings_outside_zero_one_are_not_parseable(tokens, item):
    # "0.8/1.0" keeps "0.81.0", which float() refuses; "8/10" keeps "810"
    rater = ScriptedRater(tokens, [digits({1: 1})] * len(tokens))
    row = Fleur(rater).score([item], Context())[0]
    assert row["fleur"] is None and row["fleur_unparsed"] == "".join(tokens)


def test_digits_sharing_a_token_cannot_be_smoothed():
    assert fleur_score(["0.", "75"], [digits({0: 1}), digits({7: 1})]) == (None, 0.75)
    assert fleur_score(["1.0"], [digits({1: 1})]) == (None, 1.0)
    # str(0.00001) is "1e-05": no decimal to read, as the reference finds none
    assert fleur_score(list("0.00001"), [DECOY] * 7) == (None, 1e-05)


def test_a_judge_without_the_capability_stops_before_the_run():
    class GenerateOnly:
        fingerprint = "x"

        def generate(self, requests, max_new_tokens=64):
            return ["0.5"] * len(requests)

    with pytest.raises(ConfigError, match="fleur needs a judge that can `generate_with_token_probs`"):
        Fleur(GenerateOnly())


def test_a_custom_prompt_is_named_in_the_manifest():
    rater = ScriptedRater(["0"], [NONE])
    assert Fleur(rater).describe()["prompt"] == "FLEUR's instruction"
    assert Fleur(rater, prompt="Rate {caption}").describe()["prompt"] == "Rate {caption}"


def test_transformers_judge_reports_the_softmax_at_each_generated_position(tmp_path):
    """Against a softmax computed by hand from the model's own logits on prompt + reply."""
    import torch

    from caprecon.models.vlm import VLMRequest
    from caprecon.models.vlm_transformers import TransformersVLM
    from tiny_vlm import build_qwen2_vl

    judge = TransformersVLM(build_qwen2_vl(tmp_path / "vl"), max_new_tokens=5)
    image = Image.new("RGB", (56, 56), (20, 120, 200))
    requests = [VLMRequest(image, "What colour is the car?", "im"), VLMRequest(image, "Where is the bird?", "im")]
    # one request alone (plain generate) and two sharing the image (the prefix path)
    for batch in (requests[:1], requests):
        replies = judge.generate_with_token_probs(batch, DIGITS + ["A"])
        assert [r["text"] for r in replies] == judge.generate(batch)
        model, processor = judge._load()
        tokenizer = processor.tokenizer
        watched = [tokenizer.convert_tokens_to_ids(t) for t in DIGITS + ["A"]]
        for request, reply in zip(batch, replies):
            inputs = processor(text=[judge.render(request.prompt)], images=[image], return_tensors="pt")
            length = inputs["input_ids"].shape[1]
            with torch.no_grad():
                sequence = model.generate(**inputs, do_sample=False, max_new_tokens=5,
                                          eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
            generated = sequence[0, length:].tolist()
            if tokenizer.eos_token_id in generated:
                generated = generated[: generated.index(tokenizer.eos_token_id)]
            assert tokenizer.decode(generated, skip_special_tokens=True).strip() == reply["text"]
            ids = sequence[:, : length + len(generated)]
            extra = {k: torch.cat([v, torch.zeros((1, len(generated)), dtype=v.dtype)], dim=1)
                     for k, v in inputs.items() if k == "mm_token_type_ids"}
            with torch.no_grad():
                full = {**inputs, **extra, "input_ids": ids, "attention_mask": torch.ones_like(ids)}
                logits = model(**full).logits[0]
            assert len(reply["probs"]) == len(reply["tokens"]) == len(generated) > 0
            for k, probs in enumerate(reply["probs"]):
                by_hand = torch.softmax(logits[length - 1 + k].double(), -1)[watched]
                np.testing.assert_allclose(probs, by_hand.numpy(), atol=1e-5)
            assert "".join(reply["tokens"]).strip() == reply["text"]


def test_a_prompt_set_in_the_run_config_reaches_the_judge_and_the_manifest(item):
    import caprecon

    rater = ScriptedRater(["0", ".", "5"], [NONE, NONE, digits({5: 1})])
    sample = Sample(id="a", image=item.sample.image, caption="a red square")
    results = caprecon.score([sample], ["fleur"], judge=rater, fleur_prompt="Rate 0-1: {caption}", no_cache=True)
    assert rater.prompts == ["Rate 0-1: a red square"] and results.records[0]["fleur"] == pytest.approx(0.5)
    assert results.manifest["metrics"][0]["prompt"] == "Rate 0-1: {caption}"
    assert results.manifest["config"]["fleur_prompt"] == "Rate 0-1: {caption}"


def test_vqascore_needs_option_probabilities_before_the_run():
    from caprecon.metrics.vqascore import VQAScore

    with pytest.raises(ConfigError, match="vqascore needs a judge that can `option_probs`"):
        VQAScore(ScriptedRater([], []))


def test_a_rating_in_merged_digit_tokens_is_kept_but_not_smoothed(item):
    row = Fleur(ScriptedRater(["0", ".", "75"], [NONE, NONE, digits({7: 1})])).score([item], Context())[0]
    assert row["fleur"] is None and row["fleur_greedy"] == 0.75 and row["fleur_unsmoothed"] == "0.75"
