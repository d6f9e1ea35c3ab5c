"""Claims with structure (DSG's files), the gate, recorded answers and the TIFA160 benchmark."""

from __future__ import annotations

import json
import math

import pytest

from conftest import SHARED

from caprecon.data.judgments import JudgmentFormatError
from caprecon.data.loaders.dsg import (PropositionFile, claim_type, read_likert, read_propositions,
                                       read_recorded_answers, write_propositions)
from caprecon.metrics.claims import answer_score, gate, item_score
from caprecon.models.recorded import RecordedJudge, image_key
from caprecon.models.vlm import VLMRequest

DSG = SHARED / "data" / "dsg"
needs_dsg = pytest.mark.skipif(not (DSG / "dsg-1k-anns.csv").exists(), reason="the shared DSG files are absent")

HEADER = ("item_id,text,keywords,proposition_id,dependency,category_broad,category_detailed,tuple,"
          "question_natural_language\r\n")
# a quoted field over two lines, a dependency with a word among its ids, no line break after the last row
SMALL = HEADER + (
    'p_1,A red car,car,1,0,entity,whole,entity - whole (car),Is there a car?\r\n'
    'p_1,A red car,"car, red",2,1,attribute,color,"attribute - color (car, red)",Is the car red?\r\n'
    'p_2,"two dogs,\non grass",dogs,1,0,entity,whole,entity - whole (dogs),Are there dogs?\r\n'
    'p_2,"two dogs,\non grass","dogs, ==2",2,1,other,count,"other - count (dogs, ==2)",Are there two dogs?\r\n'
    'p_2,"two dogs,\non grass",grass,3,0,entity,whole,entity - whole (grass),Is there grass?\r\n'
    'p_2,"two dogs,\non grass","dogs, grass",4,"1,3",relation,spatial,"relation - spatial (dogs, grass, on)",'
    'Are the dogs on the grass?\r\n'
    'p_2,"two dogs,\non grass","dogs, grass",5,"1, outside",relation,spatial,"relation - spatial (dogs, out)",'
    'Are the dogs outside?'
)


def test_a_small_dsg_file_is_read_and_written_back_byte_for_byte(tmp_path):
    src = tmp_path / "small.csv"
    src.write_bytes(SMALL.encode())
    read = read_propositions(src)
    assert len(read.propositions) == 7 and not read.final_newline
    by_item = read.by_item()
    assert [p.proposition_id for p in by_item["p_2"]] == [1, 2, 3, 4, 5]
    assert by_item["p_2"][0].text == "two dogs,\non grass"
    assert by_item["p_1"][0].parents == () and by_item["p_1"][1].parents == (1,)
    assert by_item["p_2"][3].parents == (1, 3) and by_item["p_2"][3].dependency_problem == ""
    assert by_item["p_2"][4].parents == (1,)
    assert "'outside'" in by_item["p_2"][4].dependency_problem
    assert [p.claim_type for p in by_item["p_2"]] == ["entity", "count", "entity", "spatial", "spatial"]
    out = tmp_path / "out.csv"
    write_propositions(out, read)
    assert out.read_bytes() == SMALL.encode()
    write_propositions(out, PropositionFile(read.propositions, final_newline=True))
    assert out.read_bytes() == SMALL.encode() + b"\r\n"


def test_dsg_categories_map_to_claim_types():
    assert claim_type("other", "text rendering") == "text"
    assert claim_type("relation", "action") == "relation"
    assert claim_type("global", "-") == "global"
    assert claim_type("attribute", "color") == "attribute"
    assert claim_type("other", "id") == "attribute"


def test_a_proposition_id_that_is_not_a_number_names_its_row(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text(HEADER + "p_1,A car,car,one,0,entity,whole,entity - whole (car),Is there a car?\r\n")
    with pytest.raises(JudgmentFormatError, match=r"row 1 \(p_1\): proposition_id must be a positive whole number"):
        read_propositions(bad)
    other = tmp_path / "other.csv"
    other.write_text("a,b\n1,2\n")
    with pytest.raises(JudgmentFormatError, match="no column item_id"):
        read_propositions(other)


@needs_dsg
def test_dsg_1k_is_read_as_shipped_and_written_back_identically(tmp_path):
    read = read_propositions(DSG / "dsg-1k-anns.csv")
    assert len(read.propositions) == 8182 and len(read.by_item()) == 1060
    write_propositions(tmp_path / "again.csv", read)
    assert (tmp_path / "again.csv").read_bytes() == (DSG / "dsg-1k-anns.csv").read_bytes()


# the gate: controlled scores, expected values by hand


def test_answers_score_one_only_for_yes():
    assert [answer_score(a) for a in ("yes", "Yes.", " YES ", "no", "", "unsuitable", "stat stat", None)] == \
        [1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0]


def test_a_question_whose_parent_scored_zero_scores_zero():
    # 1 entity (yes), 2 its colour (yes), 3 another entity (no), 4 attribute of 3 (yes: gated to 0),
    # 5 relation of 1 and 3 (yes: gated to 0 by 3)
    scores = {1: 1.0, 2: 1.0, 3: 0.0, 4: 1.0, 5: 1.0}
    parents = {1: (), 2: (1,), 3: (), 4: (3,), 5: (1, 3)}
    assert gate(scores, parents) == {1: 1.0, 2: 1.0, 3: 0.0, 4: 0.0, 5: 0.0}
    s = item_score(scores, parents)
    assert s.gated == pytest.approx(2 / 5) and s.ungated == pytest.approx(4 / 5) and s.n == 5


def test_the_gate_reads_a_parents_own_score_and_soft_scores_at_one_half():
    # DSG gates by the parent's own answer: 3's parent 2 is itself gated, but 2 answered yes
    scores = {1: 0.0, 2: 1.0, 3: 1.0}
    assert gate(scores, {2: (1,), 3: (2,)}) == {1: 0.0, 2: 0.0, 3: 1.0}
    # soft scores: a parent at exactly 0.5 is supported; just under is not
    assert gate({1: 0.5, 2: 0.8}, {2: (1,)}) == {1: 0.5, 2: 0.8}
    assert gate({1: 0.49, 2: 0.8}, {2: (1,)}) == {1: 0.49, 2: 0.0}
    # a parent with no score of its own cannot vouch for its child
    assert gate({2: 1.0}, {2: (7,)}) == {2: 0.0}
    assert item_score({}, {}).gated == 0.0 and item_score({}, {}).ungated == 0.0


# recorded answers

ANSWERS = ("dsg_prompt_split,qg_model,t2i_model,item_id,question,question_id,dependency_id,answer\n"
           "t,dsg,gen-a,p_2,Are there dogs?,1,0,yes\n"
           "t,dsg,gen-a,p_2,Are there two dogs?,2,1,no\n"
           "t,dsg,gen-a,p_2,Is there grass?,3,0,\n"
           "t,dsg,gen-a,p_2,Are the dogs on the grass?,4,\"1,3\",yes\n"
           "t,dsg,gen-b,p_2,Are there dogs?,1,0,unsuitable\n")


def test_recorded_answers_are_replayed_by_image_and_question(tmp_path):
    path = tmp_path / "answers.csv"
    path.write_text(ANSWERS)
    assert len(read_recorded_answers(path)) == 5
    judge = RecordedJudge(path)
    key = image_key("gen-a", "p_2")
    assert judge.answer(key, 3) == "" and judge.answer(key, 9) is None
    assert sorted(judge.answers(key)) == [1, 2, 3, 4]
    requests = [VLMRequest(None, "Are there two dogs?", key),
                VLMRequest(None, "Answer yes or no. Are the dogs on the grass?", key),
                VLMRequest(None, "Is there a cat?", key)]
    probs = judge.option_probs(requests, [["Yes", "No"]] * 3)
    assert probs[0] == [0.0, 1.0] and probs[1] == [1.0, 0.0] and all(math.isnan(p) for p in probs[2])
    assert judge.generate(requests[:2]) == ["no", "yes"]
    with pytest.raises(KeyError, match="no recorded answer"):
        judge.generate(requests[2:])
    other = tmp_path / "other.csv"
    other.write_text(ANSWERS.replace("unsuitable", "yes"))
    assert RecordedJudge(other).fingerprint != judge.fingerprint


def test_tifa160_scores_items_by_hand(tmp_path):
    from caprecon.apps.metabench.tifa160 import score_images

    (tmp_path / "q.csv").write_bytes(SMALL.encode())
    (tmp_path / "a.csv").write_text(ANSWERS)
    (tmp_path / "l.csv").write_text("t2i_model,item_id,worker_id,answer\ngen-a,p_2,w1,4\ngen-a,p_2,w2,5\n"
                                    "gen-b,p_2,w1,2\ngen-c,p_2,w1,1\n")
    images, notes = score_images(read_propositions(tmp_path / "q.csv").by_item(), RecordedJudge(tmp_path / "a.csv"),
                                 read_likert(tmp_path / "l.csv"))
    by = {i.generator: i for i in images}
    # gen-a: answers 1 yes, 2 no, 3 empty, 4 yes; p_2 has "1, outside" so, as DSG's script, no gate at all
    assert by["gen-a"].ungated == pytest.approx(2 / 4) and by["gen-a"].gated == pytest.approx(2 / 4)
    assert by["gen-a"].human == pytest.approx(4.5)
    assert by["gen-b"].gated == 0.0 and by["gen-b"].n_questions == 1  # "unsuitable" scores 0
    assert by["gen-c"].gated == 0.0 and by["gen-c"].n_questions == 0  # nothing recorded: 0, as DSG's script
    assert any("1 rated image(s) have no recorded answer" in n for n in notes)
    assert any("p_2" in n and "without their dependencies" in n for n in notes)


def test_tifa160_gates_a_well_formed_item(tmp_path):
    from caprecon.apps.metabench.tifa160 import score_images

    (tmp_path / "q.csv").write_bytes(SMALL.encode().rsplit(b"\r\np_2,\"two dogs,\non grass\",\"dogs, grass\",5", 1)[0])
    (tmp_path / "a.csv").write_text(ANSWERS)
    (tmp_path / "l.csv").write_text("t2i_model,item_id,worker_id,answer\ngen-a,p_2,w1,4\n")
    (image,), _ = score_images(read_propositions(tmp_path / "q.csv").by_item(), RecordedJudge(tmp_path / "a.csv"),
                               read_likert(tmp_path / "l.csv"))
    # 4 depends on 1 (yes) and 3 (empty: 0): gated to 0; 2 answered no stays 0
    assert image.ungated == pytest.approx(2 / 4) and image.gated == pytest.approx(1 / 4)


def test_a_likert_rating_out_of_range_names_its_row(tmp_path):
    (tmp_path / "l.csv").write_text("t2i_model,item_id,worker_id,answer\ngen-a,p_2,w1,4\ngen-a,p_2,w2,7\n")
    with pytest.raises(JudgmentFormatError, match=r"row 2 \(gen-a, p_2\).*not '7'"):
        read_likert(tmp_path / "l.csv")


@needs_dsg
def test_tifa160_reproduces_dsgs_correlation_script(tmp_path, capsys):
    """DSG's tifa160_correlation.py on PaLI-17B's answers: ρ 0.571 / τ_b 0.458 gated, 0.570 / 0.457 ungated."""
    from caprecon.cli.meta import main

    code = main(["--benchmark", "tifa160", "--judgments", str(DSG / "tifa160-likert-anns.csv"),
                 "--questions", str(DSG / "dsg-1k-anns.csv"), "--answers", str(DSG / "pali17b_dsg.csv"),
                 "--out", str(tmp_path / "out"), "--bootstrap", "50", "--json"])
    assert code == 0
    with_out = capsys.readouterr().out
    assert (tmp_path / "out" / "scores-tifa160.csv").exists() and (tmp_path / "out" / "meta.csv").exists()
    # as the issue writes the command: no --out, the same figures printed
    code = main(["--benchmark", "tifa160", "--judgments", str(DSG / "tifa160-likert-anns.csv"),
                 "--questions", str(DSG / "dsg-1k-anns.csv"), "--answers", str(DSG / "pali17b_dsg.csv"),
                 "--bootstrap", "50", "--json"])
    assert code == 0
    printed = capsys.readouterr().out
    found = json.loads(printed[: printed.rindex("}") + 1])
    rows = {r["metric"]: r for r in found["rows"]}
    gated, ungated = rows["pali17b_dsg/gated"], rows["pali17b_dsg/ungated"]
    assert gated["n"] == 800 and ungated["n"] == 800
    assert abs(gated["spearman"] - 0.571) <= 0.002 and abs(gated["tau_b"] - 0.458) <= 0.002
    assert abs(ungated["spearman"] - 0.570) <= 0.002 and abs(ungated["tau_b"] - 0.457) <= 0.002
    assert gated["ci_low"] < gated["tau_b"] < gated["ci_high"]
    assert gated["spearman_ci_low"] < gated["spearman"] < gated["spearman_ci_high"]
    assert json.loads(with_out[: with_out.rindex("}") + 1]) == found


@needs_dsg
def test_tifa160_verify_passes_against_the_pinned_values(capsys):
    from caprecon.cli.meta import main

    code = main(["verify", "--benchmark", "tifa160", "--judgments", str(DSG / "tifa160-likert-anns.csv"),
                 "--questions", str(DSG / "dsg-1k-anns.csv"), "--answers", str(DSG / "pali17b_dsg.csv"),
                 "--tolerance", "0.2"])
    out = capsys.readouterr().out
    assert code == 0 and out.count(" pass ") == 4


def test_claims_go_to_dsg_rows_and_back(tmp_path):
    from caprecon.metrics.claims import Claim, from_propositions, to_propositions

    claims = [Claim("there is a dog", "entity", "Is there a dog?", "a brown dog", (), "whole"),
              Claim("the dog is brown", "attribute", "Is the dog brown?", "brown", (0,), "color"),
              Claim("there is grass", "entity", "Is there grass?", "grass"),
              Claim("the dog is on the grass", "spatial", "Is the dog on the grass?", "on the grass", (0, 2)),
              Claim("a sign says STOP", "text", "Does a sign say STOP?", "STOP")]
    rows = to_propositions("cap_1", "a brown dog on the grass, STOP", claims)
    assert [r.fields()[3:8] for r in rows] == [
        ["1", "0", "entity", "whole", "entity - whole (a brown dog)"],
        ["2", "1", "attribute", "color", "attribute - color (brown)"],
        ["3", "0", "entity", "whole", "entity - whole (grass)"],
        ["4", "1,3", "relation", "spatial", "relation - spatial (on the grass)"],
        ["5", "0", "other", "text rendering", "other - text rendering (STOP)"]]
    write_propositions(tmp_path / "mine.csv", PropositionFile(tuple(rows)))
    back = from_propositions(read_propositions(tmp_path / "mine.csv").propositions)
    assert [(c.type, c.depends_on, c.question, c.span) for c in back] == \
        [(c.type, c.depends_on, c.question, c.span) for c in claims]
    assert [c.kind for c in back] == ["whole", "color", "whole", "spatial", "text rendering"]


def test_dsg_rows_become_claims_with_parents_as_indices(tmp_path):
    from caprecon.metrics.claims import from_propositions

    (tmp_path / "q.csv").write_bytes(SMALL.encode())
    claims = from_propositions(read_propositions(tmp_path / "q.csv").by_item()["p_2"])
    assert [c.depends_on for c in claims] == [(), (0,), (), (0, 2), (0,)]
    assert [c.type for c in claims] == ["entity", "count", "entity", "spatial", "spatial"]
    assert claims[1].question == "Are there two dogs?" and claims[1].kind == "count"


def test_the_llms_claims_carry_dsgs_types_and_kinds():
    from caprecon.metrics.claims import shape_claims

    shaped, adjusted = shape_claims({"claims": [
        {"claim": "it is a watercolour", "type": "global", "kind": "style", "question": "Is it a watercolour?",
         "span": "watercolour", "depends_on": []},
        {"claim": "a sign reads OPEN", "type": "text rendering", "kind": "Text Rendering",
         "question": "Does a sign read OPEN?", "span": "OPEN", "depends_on": [0]}]})
    assert [(c["type"], c["kind"], c["depends_on"]) for c in shaped["claims"]] == \
        [("global", "style", []), ("text", "text rendering", [0])]
    assert adjusted  # "text rendering" was renamed to caprecon's "text"


def test_the_recorded_judge_is_built_by_name_as_any_judge(tmp_path):
    import caprecon

    (tmp_path / "a.csv").write_text(ANSWERS)
    judge = caprecon.build("judge", "recorded", answers=str(tmp_path / "a.csv"))
    assert isinstance(judge, RecordedJudge) and judge.answer(image_key("gen-b", "p_2"), 1) == "unsuitable"


# question banks with dependencies: the Caption Turing Test gates by them


def _bank(tmp_path, records) -> str:
    path = tmp_path / "bank.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in records))
    return str(path)


def test_turing_scores_a_question_whose_parent_was_answered_wrong_as_wrong(tmp_path):
    import caprecon
    from halluc_fakes import PixelJudge
    from oracle import OracleGenerator, render

    render("a red circle and a blue square", 96, 96).save(tmp_path / "photo.png")
    bank = _bank(tmp_path, [
        {"id": "red", "image_id": "photo", "question": "Is there a red shape in the image?", "type": "yesno",
         "answer": "yes", "category": "object"},
        {"id": "blue", "image_id": "photo", "question": "Is there a blue shape in the image?", "type": "yesno",
         "answer": "yes", "category": "object"},
        {"id": "left", "image_id": "photo", "question": "Is the leftmost shape red?", "type": "yesno",
         "answer": "yes", "category": "position", "parents": ["blue"]}])
    sample = {"id": "c", "image": str(tmp_path / "photo.png"), "image_id": "photo", "caption": "a red circle"}
    row = caprecon.score([sample], ["turing"], generator=OracleGenerator(), judge=PixelJudge(), qa_bank=bank,
                         max_side=96).records[0]
    # on Î (a red circle only): red right, blue wrong, "leftmost red" right but its parent "blue" wrong
    assert row["turing_ungated"] == pytest.approx(2 / 3)
    assert row["turing"] == pytest.approx(1 / 3) and row["turing_gated"] == 1
    assert row["turing/position"] == 0.0
    # on I every answer is right, so the gate changes nothing
    assert row["turing_upper"] == 1.0 and row["turing_upper_ungated"] == 1.0


def test_a_bank_parent_must_be_a_question_about_the_same_image(tmp_path):
    from caprecon.data.qa import QABankError, load_qa_bank

    base = {"image_id": "a", "type": "yesno", "answer": "yes"}
    ok = load_qa_bank(_bank(tmp_path, [{**base, "id": "x", "question": "Is there a dog?"},
                                       {**base, "id": "y", "question": "Is the dog brown?", "parents": ["x"]}]))
    assert ok["a"][1].parents == ("x",) and ok["a"][0].parents == ()
    with pytest.raises(QABankError, match="has as parent 'z', which is no question about this image"):
        load_qa_bank(_bank(tmp_path, [{**base, "id": "x", "question": "Is there a dog?", "parents": ["z"]}]))
    with pytest.raises(QABankError, match="form a cycle"):
        load_qa_bank(_bank(tmp_path, [{**base, "id": "x", "question": "Is there a dog?", "parents": ["y"]},
                                      {**base, "id": "y", "question": "Is the dog brown?", "parents": ["x"]}]))
    with pytest.raises(QABankError, match="parents must be a list of question ids"):
        load_qa_bank(_bank(tmp_path, [{**base, "id": "x", "question": "Is there a dog?", "parents": "y"}]))
