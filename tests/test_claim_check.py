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


def test_the_rationale_is_built_from_the_evidence_alone():
    from caprecon.reports.html.collect import claim_evidence, claim_rationale

    caption = "a red car and two dogs near a wooden table"
    raw = [{"claim": "there is a car", "type": "entity", "question": "Is there a car?", "span": "red car",
            "start": 2, "end": 9, "p_yes_image": 0.1, "p_yes_recon": 0.9, "gated_image": False, "gated_recon": False,
            "status": "hallucinated"},
           {"claim": "there are two dogs", "type": "count", "question": "Are there two dogs?", "span": "two dogs",
            "start": 14, "end": 22, "p_yes_image": 0.3, "p_yes_recon": 0.9, "gated_image": False,
            "gated_recon": False, "status": "hallucinated"},
           {"claim": "there is a table", "type": "entity", "question": "Is there a table?", "span": "wooden table",
            "start": 30, "end": 42, "p_yes_image": 0.9, "p_yes_recon": 0.2, "gated_image": False,
            "gated_recon": False, "status": "lost"},
           {"claim": "it is daytime", "type": "global", "question": "Is it daytime?", "span": "sunny",
            "start": None, "end": None, "p_yes_image": 0.8, "p_yes_recon": 0.7, "gated_image": False,
            "gated_recon": False, "status": "conveyed"},
           {"claim": "bad", "status": "unknown"}]
    evidence = claim_evidence({"claims_evidence": raw})
    assert [e["st"] for e in evidence] == ["hallucinated", "hallucinated", "lost", "conveyed"]
    assert evidence[3]["s"] is None
    assert claim_rationale(evidence, caption) == ("2 of 4 claims not on the photo: 'red car', 'two dogs'; "
                                                  "1 of 2 lost in reconstruction: 'wooden table'")
    assert claim_rationale(evidence[3:], caption) == ("0 of 1 claims not on the photo; "
                                                      "all 1 supported claims conveyed by the reconstruction")
    assert claim_rationale([], caption) == ""


def test_the_report_marks_each_claim_with_its_answers_in_chromium(tmp_path, browser):
    from caprecon.reports.html import write_html_report

    sample = _sample(tmp_path, "a red circle and a blue square and a yellow triangle",
                     "a red circle and a blue square and a green triangle")
    out = tmp_path / "run"
    caprecon.score([sample], ["claims"], generator=ForgetfulGenerator(), judge=PixelJudge(), llm=ClaimLLM(),
                   max_side=96, out=out)
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    problems: list[str] = []
    page.on("console", lambda m: m.type in ("error", "warning") and problems.append(f"console {m.type}: {m.text}"))
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    page.goto(write_html_report(out).resolve().as_uri())
    page.wait_for_load_state("load")
    card = page.locator("#gallery-items .card[data-id='a']")
    # each shape's words marked by its entity claim's status; the attribute's word lies inside them
    assert card.locator("mark.claim.conveyed").all_text_contents() == ["red circle"]
    assert card.locator("mark.claim.lost").all_text_contents() == ["blue square"]
    assert card.locator("mark.claim.hallucinated").all_text_contents() == ["green triangle"]
    title = card.locator("mark.claim.lost").get_attribute("title")
    assert "Is there a blue shape?" in title and "on the original: P(yes) 0.9000" in title
    assert "on the reconstruction: P(yes) 0.2000" in title
    assert card.locator("p.rationale").text_content() == (
        "2 of 6 claims not on the photo: 'green triangle', 'triangle'; "
        "2 of 4 lost in reconstruction: 'blue square', 'square'")
    listed = card.locator("details.claims li")
    assert listed.count() == 6
    assert listed.nth(3).locator(".answers").text_content() == (
        "on the original: P(yes) 0.9000; on the reconstruction: not asked (a claim it depends on is false)")
    assert card.locator("figure").count() == 2  # the photo and its reconstruction beside the caption
    assert problems == []
    page.close()


def test_t2i_asks_dsgs_questions_of_live_judges(tmp_path):
    import csv as csv_module

    from caprecon.apps.t2i import t2i
    from oracle import OracleGenerator

    text = "a red circle and a blue square"
    rows = [("1", "0", "entity", "whole", "Is there a red shape?"), ("2", "1", "attribute", "shape", "Is the red shape a circle?"),
            ("3", "0", "entity", "whole", "Is there a blue shape?"),
            ("4", "3", "attribute", "state", "Is there a red shape?")]  # true where its parent is not: gated there
    with (tmp_path / "dsg.csv").open("w", newline="") as fh:
        writer = csv_module.writer(fh)
        writer.writerow(["item_id", "text", "keywords", "proposition_id", "dependency", "category_broad",
                         "category_detailed", "tuple", "question_natural_language"])
        for pid, dep, broad, detail, question in rows:
            writer.writerow(["p_1", text, "k", pid, dep, broad, detail, f"{broad} - {detail} (k)", question])
    captions = [{"id": "p_1", "caption": text}, {"id": "same-text", "caption": text},
                {"id": "unknown", "caption": "a green triangle"}]
    results = t2i(captions, {"all": OracleGenerator(), "forget": ForgetfulGenerator()}, {"pix": PixelJudge()},
                  questions=tmp_path / "dsg.csv", size="96x96", n_bootstrap=20, cache_dir=str(tmp_path / "cache"))
    by = {(r["generator"], r["id"]): r for r in results.records}
    # the oracle draws both shapes: every answer yes
    assert by["all", "p_1"]["dsg/pix"] == 1.0 and by["all", "p_1"]["dsg/pix_ungated"] == 1.0
    # without the blue square: 1, 2 yes; 3 no; 4 yes but its parent 3 scored 0
    assert by["forget", "p_1"]["dsg/pix_ungated"] == pytest.approx(3 / 4)
    assert by["forget", "p_1"]["dsg/pix"] == pytest.approx(2 / 4) and by["forget", "p_1"]["dsg/pix_n"] == 4
    assert by["forget", "same-text"]["dsg/pix"] == pytest.approx(2 / 4)  # matched by its text
    assert "no DSG questions for row 'unknown'" in by["forget", "unknown"]["error"]
    assert "dsg/pix" in results.table.columns and "dsg/pix_ungated" in results.table.columns
