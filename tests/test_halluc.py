"""The halluc metric: claims of a caption checked on the original image (precision), the
references' claims or the QA bank checked on the reconstruction (coverage), and their F.

Scripted models (`halluc_fakes`): the claim splitter names two claims per coloured shape
(an entity and an attribute depending on it), the judge reads the pixels and says P(yes) =
0.9 for a true claim, 0.2 for a false one; the expected values below are written out by
hand from those two numbers.
"""

from __future__ import annotations

import math

import pytest
from PIL import Image

import caprecon
from caprecon.core.errors import ConfigError
from caprecon.core.replies import ParseTally
from caprecon.data.images import open_image
from caprecon.data.samples import Sample
from caprecon.metrics.base import Context
from caprecon.metrics.claims import extract_claims, levels
from caprecon.metrics.halluc import Hallucination
from caprecon.reconstruct.reconstructor import ReconstructionSpec
from caprecon.run.config import RunConfig
from caprecon.apps.metabench.probe_captions import inserted_object_captions
from caprecon.stats.probes import insertion_probe
from caprecon.store.index import Store
from halluc_fakes import NO, YES, ClaimLLM, PixelJudge
from oracle import OracleGenerator, render

SPEC = ReconstructionSpec(max_side=96)


def _items(rows: list[tuple[str, str, str, list[str]]], folder) -> list:
    """(id, scene drawn as the image, caption, references) -> opened samples."""
    out = []
    for sid, drawn, caption, refs in rows:
        path = folder / f"{abs(hash(drawn))}.png"
        render(drawn, 96, 96).save(path)
        out.append(open_image(Sample(id=sid, image=path, caption=caption, refs=refs, image_id=drawn)))
    return out


def test_claim_lists_are_read_strictly_repaired_retried_or_dropped():
    llm, ctx, tally = ClaimLLM(), Context(Store.temporary()), ParseTally()
    captions = ["a red circle", "fenced a blue square", "prose a green triangle", "garbled words",
                "hopeless words", "sloppy a yellow square"]
    sets = extract_claims(ctx, llm, captions, tally=tally)
    texts = [[c.text for c in s.claims] for s in sets]
    assert texts[0] == ["there is a red shape", "the red shape is a circle"]
    assert texts[1] == ["there is a blue shape", "the blue shape is a square"]  # fence and trailing comma
    assert texts[2] == ["there is a green shape", "the green shape is a triangle"]  # quotes and prose
    assert texts[3] == ["there is a red shape", "the red shape is a circle"]  # what the retry said
    assert sets[4].claims == () and sets[4].unreadable
    assert [c.depends_on for c in sets[0].claims] == [(), (0,)]
    sloppy = sets[5]
    assert sloppy.dropped == 2 and len(sloppy.claims) == 2  # no text; an unknown type
    assert sloppy.claims[0].depends_on == ()  # it named a later claim
    assert sloppy.claims[0].span == "yellow square"
    assert tally.to_dict() == {"strict": 1, "repaired": 3, "retried": 1, "dropped": 1,
                               "drop_reasons": {"not JSON": 1}}
    asked = len(llm.prompts)
    again = extract_claims(ctx, llm, captions)  # cached per (LLM, caption)
    assert len(llm.prompts) == asked and again == sets


def test_levels_follow_dependencies():
    from caprecon.metrics.claims import Claim

    claims = [Claim("a", "entity", "?"), Claim("b", "attribute", "?", depends_on=(0,)),
              Claim("c", "relation", "?", depends_on=(0, 1)), Claim("d", "entity", "?")]
    assert levels(claims) == [0, 1, 2, 0]


def test_a_false_parent_gates_its_children_and_one_batch_per_level(tmp_path):
    # image: red circle, blue square; the caption claims a green triangle (absent: its shape is
    # never asked) and a blue circle (present, wrong shape: asked, false)
    items = _items([("a", "a red circle and a blue square", "a red circle and a green triangle and a blue circle", []),
                    ("b", "a yellow square", "a yellow square", [])], tmp_path)
    judge = PixelJudge()
    rows = Hallucination(judge, ClaimLLM()).score(items, Context(Store.temporary()))
    # level 0: the 3 + 1 entity claims; level 1: the attributes of present shapes only (2 + 1)
    assert [len(b) for b in judge.batches] == [4, 3]
    asked = [q for batch in judge.batches for _, q in batch]
    assert "Is the green shape a triangle?" not in asked
    assert {q for _, q in judge.batches[0]} == {"Is there a red shape?", "Is there a green shape?",
                                                "Is there a blue shape?", "Is there a yellow shape?"}
    assert (rows[0]["halluc_asked"], rows[0]["halluc_skipped"]) == (5, 1)
    assert (rows[1]["halluc_asked"], rows[1]["halluc_skipped"]) == (2, 0)
    gated = [u for u in rows[0]["halluc_unsupported"] if u["gated"]]
    assert [(u["claim"], u["p_yes"]) for u in gated] == [("the green shape is a triangle", 0.0)]


def test_precision_coverage_and_f_by_hand(tmp_path):
    image = tmp_path / "scene.png"
    render("a red circle and a blue square", 96, 96).save(image)
    sample = {"id": "a", "image": str(image), "caption": "a red circle and a green triangle and a blue circle",
              "refs": ["a red circle and a blue square"]}
    judge = PixelJudge()
    res = caprecon.score([sample], ["halluc"], generator=OracleGenerator(), judge=judge, llm=ClaimLLM(),
                         max_side=96, beta=2.0)
    row = res.records[0]
    # on I: red shape yes, red circle yes, green shape no, green triangle gated (0), blue shape yes,
    # blue circle no (a square)
    precision = (YES + YES + NO + 0 + YES + NO) / 6
    # the reference's claims on Î (red circle, green triangle, blue circle): blue square no
    coverage = (YES + YES + YES + NO) / 4
    assert row["halluc"] == pytest.approx(precision)
    assert row["halluc/entity"] == pytest.approx((YES + NO + YES) / 3)
    assert row["halluc/attribute"] == pytest.approx((YES + 0 + NO) / 3)
    assert row["halluc_rate"] == pytest.approx(3 / 6)
    assert row["halluc_coverage"] == pytest.approx(coverage)
    assert row["halluc_coverage/attribute"] == pytest.approx((YES + NO) / 2)
    assert row["halluc_coverage_source"] == "references"
    assert row["halluc_f"] == pytest.approx(5 * precision * coverage / (4 * precision + coverage))  # beta 2
    assert [(u["claim"], u["span"]) for u in row["halluc_unsupported"]] == [
        ("there is a green shape", "green triangle"), ("the green shape is a triangle", "triangle"),
        ("the blue shape is a circle", "circle")]
    # the pair (and F) side by side in the summary
    metrics = res.summary["metrics"]
    assert list(metrics)[:4] == ["halluc", "halluc_coverage", "halluc_f", "halluc_rate"]
    assert metrics["halluc_coverage"]["mean"] == pytest.approx(coverage)
    f1 = caprecon.score([sample], ["halluc-f"], generator=OracleGenerator(), judge=judge, llm=ClaimLLM(),
                        max_side=96)
    assert f1.records[0]["halluc_f"] == pytest.approx(2 * precision * coverage / (precision + coverage))
    assert f1.metric_names == ["halluc_f"]


def test_precision_needs_no_generator_and_beta_is_checked(tmp_path):
    image = tmp_path / "scene.png"
    render("a red circle", 96, 96).save(image)
    res = caprecon.score([{"id": "a", "image": str(image), "caption": "a red circle"}], ["halluc"],
                         judge=PixelJudge(), llm=ClaimLLM())
    assert res.records[0]["halluc"] == pytest.approx(YES) and "halluc_coverage" not in res.records[0]
    assert list(res.summary["metrics"]) == ["halluc", "halluc_rate"]
    for bad in (0, -1.0, math.nan, True):
        with pytest.raises(ConfigError, match="--beta"):
            RunConfig(beta=bad)


def test_coverage_is_the_turing_value_when_a_bank_is_given(tmp_path):
    import json

    image = tmp_path / "scene.png"
    render("a red circle and a blue square", 96, 96).save(image)
    bank = tmp_path / "bank.jsonl"
    questions = [{"image_id": "s", "question": f"Is there a {c} shape in the image?", "type": "yesno",
                  "answer": a, "category": "perception"} for c, a in (("red", "yes"), ("blue", "yes"), ("green", "no"))]
    bank.write_text("\n".join(json.dumps(q) for q in questions) + "\n")
    sample = {"id": "a", "image": str(image), "image_id": "s", "caption": "a red circle and a green square"}
    res = caprecon.score([sample], ["halluc", "turing"], generator=OracleGenerator(), judge=PixelJudge(),
                         llm=ClaimLLM(), qa_bank=str(bank), max_side=96)
    row = res.records[0]
    # Î shows a red circle and a green square: red yes (right), blue no (wrong), green yes (wrong)
    assert row["turing"] == pytest.approx(1 / 3)
    assert row["halluc_coverage"] == row["turing"] and row["halluc_coverage_source"] == "turing"
    assert row["halluc_coverage/perception"] == row["turing/perception"]


def test_an_inserted_absent_object_lowers_precision_and_leaves_coverage(tmp_path):
    scenes = ["a red circle and a blue square", "a green triangle", "a yellow square"]
    items = _items([(str(i), s, s, [s]) for i, s in enumerate(scenes)], tmp_path)
    llm, judge, ctx = ClaimLLM(), PixelJudge(), Context(Store.temporary())
    claims = [s.claims for s in extract_claims(ctx, llm, scenes)]
    inserted = inserted_object_captions(scenes, scenes, claims, seed=0)
    for caption, original in zip(inserted, scenes):
        assert caption.startswith(original + ", and a ")
        added = caption[len(original) + len(", and a "):-1]
        assert added.split()[0] not in original  # another image's shape, in a colour this image lacks
    metric = Hallucination(judge, llm, generator=OracleGenerator(), spec=SPEC)
    before = metric.score(items, ctx)
    after_items = _items([(str(i), s, c, [s]) for i, (s, c) in enumerate(zip(scenes, inserted))], tmp_path)
    after = metric.score(after_items, ctx)
    for b, a in zip(before, after):
        assert b["halluc"] == pytest.approx(YES)
        assert a["halluc"] < b["halluc"]
        assert a["halluc_coverage"] == pytest.approx(b["halluc_coverage"])
    drop, change = insertion_probe("halluc", [r["halluc"] for r in before], [r["halluc"] for r in after],
                                   [r["halluc_coverage"] for r in before], [r["halluc_coverage"] for r in after],
                                   scenes, n_bootstrap=50)
    # each caption gained an absent entity (0.2) and its gated attribute (0) to its 2k true claims
    expected_after = [(4 * YES + NO) / 6, (2 * YES + NO) / 4, (2 * YES + NO) / 4]
    assert drop.probe == "insert_precision_drop"
    assert drop.value == pytest.approx(YES - sum(expected_after) / 3)
    assert change.probe == "insert_coverage_change" and change.value == pytest.approx(0.0)


def test_no_other_image_offers_an_absent_object():
    from caprecon.metrics.claims import Claim

    red = [Claim("there is a red shape", "entity", "?", span="red circle")]
    assert inserted_object_captions(["a red circle", "a red circle too"], ["x", "y"], [red, red]) == [None, None]


def test_unused_image_rows_keep_their_own_image():
    # a sample whose image is not a file: Image objects work the same way
    items = [open_image(Sample(id="a", image=Image.new("RGB", (32, 32), "white"), caption="a red circle"))]
    rows = Hallucination(PixelJudge(), ClaimLLM()).score(items, Context(Store.temporary()))
    assert rows[0]["halluc"] == pytest.approx(NO / 2)  # red shape absent; its attribute gated


def test_categories_md_puts_precision_and_coverage_side_by_side_per_captioner(tmp_path):
    image = tmp_path / "scene.png"
    render("a red circle and a blue square", 96, 96).save(image)
    right, wrong = "a red circle and a blue square", "a red circle and a green triangle and a blue circle"
    samples = [{"id": name, "image": str(image), "caption": caption, "refs": [right], "captioner": name}
               for name, caption in (("alpha", right), ("beta", wrong))]
    caprecon.score(samples, ["halluc"], generator=OracleGenerator(), judge=PixelJudge(), llm=ClaimLLM(),
                   max_side=96, out=tmp_path / "run")
    text = (tmp_path / "run" / "categories.md").read_text()
    precision, coverage = (3 * YES + 2 * NO) / 6, (3 * YES + NO) / 4  # beta's, as worked out above

    def pct(v):
        return f"{100 * v:.2f}"

    # precision by claim type: attribute, entity, over claims, over types
    assert f"| alpha | {pct(YES)} | {pct(YES)} | {pct(YES)} | {pct(YES)} |" in text
    assert (f"| beta | {pct((YES + NO) / 3)} | {pct((2 * YES + NO) / 3)} | {pct(precision)} | "
            f"{pct(((2 * YES + NO) / 3 + (YES + NO) / 3) / 2)} |") in text
    assert "## coverage by claim type or question category (halluc_coverage)" in text
    assert f"| alpha | {pct(YES)} | {pct(YES)} | {pct(YES)} | 0.00 of 4 | 0 of 1 |" in text
    f1 = 2 * precision * coverage / (precision + coverage)
    assert f"| beta | {pct(precision)} | {pct(coverage)} | {pct(f1)} | 50.00 of 6 | 1 of 1 |" in text
    html = (tmp_path / "run" / "report.html").read_text()
    assert 'id="gallery-halluc"' in html
    from caprecon.cli import main

    (tmp_path / "run" / "categories.md").unlink()
    assert main(["report", str(tmp_path / "run"), "--metric", "halluc"]) == 0
    assert (tmp_path / "run" / "categories.md").read_text() == text


def test_meta_takes_precision_coverage_and_f_like_any_metric(tmp_path):
    import argparse
    import csv

    from caprecon.cli.meta import add_meta_arguments, run_meta_command
    from caprecon.metrics import METRICS
    from caprecon.stats.agreement import scores_from_records

    # per image, three captions: right, one shape wrong, two shapes invented; people rate them 3, 2, 1
    rows = ["image,caption,human,refs"]
    for i, (a, b) in enumerate((("red", "blue"), ("green", "yellow"), ("black", "purple"))):
        scene = f"a {a} circle and a {b} square"
        render(scene, 96, 96).save(tmp_path / f"i{i}.png")
        rows += [f"i{i}.png,{scene},3,{scene}", f"i{i}.png,a {a} circle and a {b} circle,2,{scene}",
                 f"i{i}.png,a {a} triangle and a {b} triangle and a {'red' if a != 'red' else 'green'} circle,1,"
                 f"{scene}"]
    (tmp_path / "judged.csv").write_text("\n".join(rows) + "\n")
    models = {"generator": OracleGenerator(), "judge": PixelJudge(), "llm": ClaimLLM()}

    def score_metric(name, samples):
        res = caprecon.score(samples, [name], max_side=96, images_root=tmp_path, **models)
        return scores_from_records(res.records, res.metric_names[0], [s.id for s in samples])

    parser = argparse.ArgumentParser()
    add_meta_arguments(parser)
    args = parser.parse_args(["--judgments", str(tmp_path / "judged.csv"), "--metric", "halluc", "halluc-coverage",
                              "halluc-f", "--out", str(tmp_path / "meta"), "--bootstrap", "20"])
    assert run_meta_command(args, score_metric=score_metric, scorable=METRICS) == 0
    found = {r["metric"]: r for r in csv.DictReader((tmp_path / "meta" / "meta.csv").open())}
    assert set(found) >= {"halluc", "halluc-coverage", "halluc-f"}
    for name in ("halluc", "halluc-coverage", "halluc-f"):
        assert found[name]["n"] == "9"
    assert float(found["halluc"]["pair_accuracy"]) == 1.0  # precision orders every image's captions as people do


def test_a_real_judge_gives_each_claim_the_vqascore_of_its_question(tmp_path):
    """On the tiny random Qwen2-VL: an image's claims asked in one batch (on the image's
    shared prefix) get what VQAScore gives each question asked alone, at judge batch 1."""
    from caprecon.metrics.claims import Claim, check_claims
    from caprecon.metrics.judging import LazyImages
    from caprecon.metrics.vqascore import VQAScore
    from caprecon.models.vlm_transformers import TransformersVLM
    from tiny_vlm import build_qwen2_vl

    path = build_qwen2_vl(tmp_path / "vl")
    picture = render("a red circle and a blue square", 64, 48)
    questions = ["Is there a red shape?", "Is there a green shape?", "Is the red shape a circle?",
                 "Is the blue shape a square?", "Are there two shapes?"]
    claims = [Claim(q, "entity", q) for q in questions]
    images = LazyImages()
    [checked] = check_claims(Context(Store.temporary()), TransformersVLM(path, batch_size=16), images,
                             [(images.add("picture", lambda: picture), claims)])
    alone = VQAScore(TransformersVLM(path, batch_size=1), template="{caption}")
    expected = [alone([picture], [q], store=Store.temporary())[0] for q in questions]
    assert [c.p_yes for c in checked] == pytest.approx(expected, abs=1e-6)
    assert len(set(round(p, 6) for p in expected)) > 1  # the questions are told apart


def test_meta_probes_run_the_inserted_object_probe_for_halluc(tmp_path):
    import csv
    import json

    from caprecon.cli import main

    scenes = ["a red circle and a blue square", "a green triangle", "a yellow square"]
    rows = []
    for k, scene in enumerate(scenes):
        render(scene, 96, 96).save(tmp_path / f"s{k}.png")
        rows.append({"image": f"s{k}.png", "caption": scene, "human": k + 1, "refs": [scene]})
    judged = tmp_path / "judged.jsonl"
    judged.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "o"
    assert main(["meta", "--judgments", str(judged), "--metric", "halluc", "halluc-coverage", "--probes",
                 "--bootstrap", "0", "-q", "--out", str(out), "--cache-dir", str(tmp_path / "cache"),
                 "--llm", "halluc_fakes:ProbingClaimLLM", "--judge", "halluc_fakes:PixelJudge",
                 "--generator", "oracle:OracleGenerator", "--max-side", "96"]) == 0
    probes = {(r["metric"], r["probe"]): r for r in csv.DictReader((out / "probes.csv").open())}
    drop, change = probes[("halluc", "insert_precision_drop")], probes[("halluc", "insert_coverage_change")]
    # as in the test above: each caption gains an absent entity (0.2) and its gated attribute (0)
    expected_after = [(4 * YES + NO) / 6, (2 * YES + NO) / 4, (2 * YES + NO) / 4]
    assert float(drop["value"]) == pytest.approx(YES - sum(expected_after) / 3)
    assert float(drop["value"]) > 0 and int(drop["n"]) == 3
    assert float(change["value"]) == pytest.approx(0.0) and int(change["n"]) == 3


def test_merged_shards_summarise_halluc_companions_as_a_whole_run_does(tmp_path):
    scenes = [("a red circle and a blue square", "a red circle and a green triangle"),
              ("a green triangle", "a green triangle and a blue circle"), ("a yellow square", "a yellow square"),
              ("a blue circle", "a red circle")]
    data = []
    for k, (drawn, caption) in enumerate(scenes):
        render(drawn, 96, 96).save(tmp_path / f"s{k}.png")
        data.append({"id": f"r{k}", "image": str(tmp_path / f"s{k}.png"), "caption": caption, "refs": [drawn]})
    settings = dict(generator=OracleGenerator(), judge=PixelJudge(), llm=ClaimLLM(), max_side=96, no_cache=True)
    whole = caprecon.score(data, ["halluc"], out=tmp_path / "whole", **settings)
    shards = [tmp_path / f"shard{i}" for i in range(2)]
    for i, folder in enumerate(shards):
        caprecon.score(data, ["halluc"], out=folder, shard=f"{i}/2", **settings)
    merged = caprecon.merge(shards, tmp_path / "merged").summary
    assert list(merged["metrics"]) == ["halluc", "halluc_coverage", "halluc_f", "halluc_rate"]
    for name in merged["metrics"]:
        # each companion by hand from the whole run's rows, and equal to the whole run's summary
        values = [r[name] for r in whole.records]
        assert merged["metrics"][name]["n"] == whole.summary["metrics"][name]["n"] == len(values)
        assert merged["metrics"][name]["mean"] == pytest.approx(sum(values) / len(values))
        assert merged["metrics"][name]["mean"] == pytest.approx(whole.summary["metrics"][name]["mean"])
        assert merged["metrics"][name]["std"] == pytest.approx(whole.summary["metrics"][name]["std"])


def test_a_judge_without_option_probabilities_is_refused_by_the_metric_asked_for():
    """halluc-coverage and halluc-f name themselves when their judge cannot give option probabilities."""

    class Describer:  # can describe a picture, but cannot score a yes/no question
        def generate(self, *args, **kwargs):
            return []

    for report, name in (("precision", "halluc"), ("coverage", "halluc-coverage"), ("f", "halluc-f")):
        with pytest.raises(ConfigError, match=rf"^metric {name} needs a judge that can `option_probs`"):
            Hallucination(Describer(), ClaimLLM(), generator=OracleGenerator(), report=report)


class _FixedJudge:
    """P('Yes') set per question."""

    fingerprint = "fixed-judge"

    def __init__(self, p_yes: dict[str, float]):
        self.p_yes = p_yes

    def option_probs(self, requests, options):
        return [[self.p_yes[r.prompt] if o == "Yes" else 0.0 for o in opts]
                for r, opts in zip(requests, options)]


@pytest.mark.parametrize("parent, child_asked", [(0.5, True), (0.4999, False)])
def test_the_gate_opens_at_exactly_supported(parent, child_asked):
    """A claim is supported at P(yes) >= 0.5: a parent at exactly 0.5 lets its child be asked."""
    from caprecon.metrics.claims import Claim, check_claims
    from caprecon.metrics.judging import LazyImages

    claims = [Claim("there is a dog", "entity", "there is a dog"),
              Claim("the dog is brown", "attribute", "the dog is brown", depends_on=(0,))]
    images = LazyImages()
    key = images.add("img", lambda: Image.new("RGB", (8, 8)))
    checked = check_claims(Context(Store.temporary()), _FixedJudge({"there is a dog": parent, "the dog is brown": 0.9}),
                           images, [(key, claims)])[0]
    assert checked[0].supported is child_asked
    assert (checked[1].gated, checked[1].p_yes) == ((False, 0.9) if child_asked else (True, 0.0))


def test_cached_claims_name_the_parser_that_read_them(monkeypatch):
    """The store keeps parsed claims: a new parser revision must read the replies again rather
    than serve what the old one made of them."""
    from caprecon.metrics import claims as claims_module

    llm, ctx = ClaimLLM(), Context(Store.temporary())
    first = extract_claims(ctx, llm, ["a red circle"])
    asked = len(llm.prompts)
    assert extract_claims(ctx, llm, ["a red circle"]) == first and len(llm.prompts) == asked
    monkeypatch.setattr(claims_module, "CLAIMS_PARSER_REVISION", claims_module.CLAIMS_PARSER_REVISION + 1)
    extract_claims(ctx, llm, ["a red circle"])
    assert len(llm.prompts) == asked + 1


def test_a_claim_list_that_cannot_be_read_is_the_rows_error_not_a_blank(tmp_path):
    # "hopeless" gets no JSON, even on the retry: that row fails with a reason, the other is scored
    for name in ("one", "two"):
        render("a red circle", 96, 96).save(tmp_path / f"{name}.png")
    samples = [{"id": "ok", "image": str(tmp_path / "one.png"), "caption": "a red circle"},
               {"id": "bad", "image": str(tmp_path / "two.png"), "caption": "hopeless words"}]
    res = caprecon.score(samples, ["halluc"], judge=PixelJudge(), llm=ClaimLLM())
    ok, bad = res.records
    assert ok["halluc"] == pytest.approx(YES) and "error" not in ok
    assert "halluc" not in bad and "could not be read" in bad["error"]
    assert bad["error_reasons"] == ["halluc: claims unreadable"]
    assert res.summary["errors"] == 1 and res.summary["failed_by_reason"] == {"halluc: claims unreadable": 1}
    assert res.summary["metrics"]["halluc"]["n"] == 1
    # an unreadable reference makes the row's coverage short: the same row error
    samples[1] = {**samples[0], "id": "ref", "refs": ["a red circle", "hopeless words"]}
    res = caprecon.score(samples, ["halluc"], generator=OracleGenerator(), judge=PixelJudge(), llm=ClaimLLM(),
                         max_side=96)
    assert "error" not in res.records[0] and res.records[1]["error_reasons"] == ["halluc: claims unreadable"]
