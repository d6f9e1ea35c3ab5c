"""The `claims` metric: a caption's claims checked on the photo I and on its reconstruction Î.

Scripted models (`halluc_fakes`): two claims per coloured shape of the caption, an entity and
an attribute depending on it; the judge reads the pixels (P(yes) 0.9 true, 0.2 false). The
generator draws the caption's shapes but forgets every blue one (and, under `FlakyGenerator`,
also the red ones under its second seed), so which claims are lost is known by hand.
"""

from __future__ import annotations

import hashlib

import pytest

import caprecon
from caprecon.metrics.claim_check import span_offsets
from caprecon.models.generator import Generated
from halluc_fakes import ClaimLLM, PixelJudge
from oracle import render


def _drop(prompt: str, colours: tuple[str, ...]) -> str:
    kept = [part for part in prompt.split(" and ") if not any(c in part for c in colours)]
    return " and ".join(kept)


class ForgetfulGenerator:
    """Draws the caption's shapes except the blue ones."""

    fingerprint = hashlib.sha256(b"forgetful-v1").hexdigest()[:24]  # a pure function of the request: cacheable

    def generate(self, requests):
        return [Generated(render(_drop(r.prompt, ("blue",)), r.width, r.height)) for r in requests]


class FlakyGenerator:
    """Also forgets the red shapes under every seed but the first it is asked for (seed 0: the
    seeds themselves are derived from the sample, so their parity is not known in advance)."""

    def __init__(self):
        self.fingerprint = hashlib.sha256(f"flaky-{id(self)}".encode()).hexdigest()[:24]  # nothing cached from before
        self.first_seed: dict[str, int] = {}

    def generate(self, requests):
        out = []
        for r in requests:
            first = self.first_seed.setdefault(r.prompt, r.seed)
            out.append(Generated(render(_drop(r.prompt, ("blue",) if r.seed == first else ("blue", "red")),
                                        r.width, r.height)))
        return out


def _sample(tmp_path, drawn: str, caption: str) -> dict:
    image = tmp_path / f"{abs(hash(drawn))}.png"
    render(drawn, 96, 96).save(image)
    return {"id": "a", "image": str(image), "caption": caption}


def test_precision_conveyed_and_lost_by_hand(tmp_path):
    # photo: red circle, blue square, yellow triangle; caption: red circle, blue square, green triangle
    sample = _sample(tmp_path, "a red circle and a blue square and a yellow triangle",
                     "a red circle and a blue square and a green triangle")
    res = caprecon.score([sample], ["claims"], generator=ForgetfulGenerator(), judge=PixelJudge(), llm=ClaimLLM(),
                         max_side=96)
    row = res.records[0]
    # on I: red shape, red circle, blue shape, blue square supported; green shape not; green triangle gated
    assert row["claims_n"] == 6
    assert row["claims_precision"] == pytest.approx(4 / 6)
    # on Î (no blue drawn): red shape and circle hold; blue shape does not, blue square is gated there: 2 lost
    assert row["claims_conveyed"] == pytest.approx(2 / 4)
    assert row["claims_lost"] == 2
    assert row["claims_precision/entity"] == pytest.approx(2 / 3)
    assert row["claims_precision/attribute"] == pytest.approx(2 / 3)
    assert row["claims_conveyed/entity"] == pytest.approx(1 / 2)
    assert row["claims_conveyed/attribute"] == pytest.approx(1 / 2)
    assert row["claims_n/entity"] == 3 and row["claims_unlocated"] == 0
    evidence = {e["claim"]: e for e in row["claims_evidence"]}
    assert [e["status"] for e in row["claims_evidence"]] == ["conveyed", "conveyed", "lost", "lost",
                                                              "hallucinated", "hallucinated"]
    child = evidence["the green shape is a triangle"]
    assert child["gated_image"] and child["p_yes_image"] == 0.0  # the gated child: not asked on I
    lost = evidence["the blue shape is a square"]
    assert not lost["gated_image"] and lost["gated_recon"] and lost["p_yes_image"] == pytest.approx(0.9)
    caption = sample["caption"]
    assert caption[evidence["there is a blue shape"]["start"]:evidence["there is a blue shape"]["end"]] == "blue square"
    assert caption[child["start"]:child["end"]] == "triangle"
    assert res.summary["metrics"]["claims_conveyed"]["mean"] == pytest.approx(0.5)


def test_nothing_supported_leaves_conveyed_undefined(tmp_path):
    sample = _sample(tmp_path, "a yellow square", "a green circle")
    row = caprecon.score([sample], ["claims"], generator=ForgetfulGenerator(), judge=PixelJudge(), llm=ClaimLLM(),
                         max_side=96).records[0]
    assert row["claims_precision"] == 0.0 and row["claims_conveyed"] is None and row["claims_lost"] == 0


def test_a_span_not_in_the_caption_is_flagged():
    assert span_offsets("A Red circle", "red circle") == (2, 12)
    assert span_offsets("a red circle", "red") == (2, 5)
    assert span_offsets("a red circle", "blue") is None and span_offsets("a red circle", "") is None


def test_conveyed_carries_its_seed_interval(tmp_path):
    sample = _sample(tmp_path, "a red circle and a blue square", "a red circle and a blue square")
    res = caprecon.score([sample], ["claims"], generator=FlakyGenerator(), judge=PixelJudge(), llm=ClaimLLM(),
                         max_side=96, seeds=2)
    row = res.records[0]
    # seed 0: red kept (2 of 4 conveyed); seed 1: nothing drawn (0 of 4)
    assert row["claims_conveyed_seeds"] == pytest.approx([0.5, 0.0])
    assert row["claims_conveyed"] == pytest.approx(0.25)
    low, high = row["claims_conveyed_ci"]
    assert low < 0.25 < high
    assert row["claims_precision_seeds"] == pytest.approx([1.0, 1.0])


def test_the_reward_takes_precision_and_conveyed_as_parts_of_their_own(tmp_path):
    from caprecon.apps.reward import Reward
    from caprecon.core.errors import ConfigError

    llm, judge = ClaimLLM(), PixelJudge()
    parts = ["claims[claims_precision]", "claims[claims_conveyed]"]
    reward = Reward(parts, {"claims[claims_precision]": 1.0, "claims[claims_conveyed]": 0.5}, guards=None,
                    generator=ForgetfulGenerator(), judge=judge, llm=llm, max_side=96,
                    cache_dir=str(tmp_path / "cache"))
    photo = render("a red circle and a blue square and a yellow triangle")
    logged: dict[str, float] = {}
    values = reward(completions=["a red circle and a blue square and a green triangle"], image=[photo],
                    log_metric=lambda name, value: logged.__setitem__(name, value))
    # precision 4 of 6 (weight 1), conveyed 2 of 4 (weight 0.5), as worked out above
    assert values == [pytest.approx(4 / 6 + 0.5 * 2 / 4)]
    assert logged["caprecon/claims[claims_precision]"] == pytest.approx(4 / 6)
    assert logged["caprecon/claims[claims_conveyed]"] == pytest.approx(0.25)
    assert len(llm.prompts) == 1  # both parts from one scoring of the metric
    with pytest.raises(ConfigError, match="claims has no column claims_recall"):
        Reward(["claims[claims_recall]"], guards=None, generator=ForgetfulGenerator(), judge=judge, llm=llm,
               max_side=96, cache_dir=str(tmp_path / "cache"))([photo], ["a red circle"])
