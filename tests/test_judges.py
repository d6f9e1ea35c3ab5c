"""The judge metrics end to end on tiny random Qwen2-VL / Qwen2 models built locally."""

import json

import pytest

import caprecon
from caprecon.cli import main
from caprecon.metrics import Context
from caprecon.metrics.captionqa import CaptionQA
from caprecon.metrics.fleur import Fleur
from caprecon.metrics.turing import CaptionTuringTest
from caprecon.metrics.vqascore import VQAScore
from caprecon.models.llm import TransformersLLM
from caprecon.models.vlm import TransformersVLM
from caprecon.qa import grade, load_qa_bank
from caprecon.samples import Sample, open_image
from caprecon.store import Store
from oracle import OracleGenerator, render
from tiny_vlm import build_qwen2_lm, build_qwen2_vl

BANK = [
    {"image_id": "shapes", "question": "What colour is the circle?", "category": "perception", "type": "mc",
     "choices": ["red", "blue", "green"], "answer": "A"},
    {"image_id": "shapes", "question": "Is there a square?", "category": "perception", "type": "yesno", "answer": "yes"},
    {"image_id": "shapes", "question": "How many shapes are there?", "category": "counting", "type": "short",
     "answer": "two"},
    {"image_id": "shapes", "question": "Where is the circle?", "category": "grounding", "type": "box",
     "answer": [0.05, 0.3, 0.45, 0.7], "coords": "normalized"},
]


@pytest.fixture(scope="module")
def judge(tmp_path_factory):
    return TransformersVLM(build_qwen2_vl(tmp_path_factory.mktemp("vl") / "qwen2vl"), max_new_tokens=8)


@pytest.fixture(scope="module")
def bank_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("bank") / "bank.jsonl"
    path.write_text("\n".join(json.dumps(q) for q in BANK))
    return path


@pytest.fixture
def samples(tmp_path):
    source = tmp_path / "shapes.png"
    render("a red circle and a blue square", 64, 64).save(source)
    return [Sample(id="good", image=source, caption="a red circle and a blue square", image_id="shapes"),
            Sample(id="bad", image=source, caption="a green triangle", image_id="shapes", candidate=1)]


def test_turing_scores_categories_and_caches(judge, bank_file, samples, tmp_path, monkeypatch):
    metric = CaptionTuringTest(OracleGenerator(), judge, bank_file, max_side=64)
    ctx = Context(Store(tmp_path / "store"))
    items = [open_image(s) for s in samples]
    rows = metric.score(items, ctx)
    for row in rows:
        assert 0 <= row["turing"] <= 1 and 0 <= row["turing_upper"] <= 1
        assert row["turing_gap"] == pytest.approx(row["turing_upper"] - row["turing"])
        assert row["turing_n"] == 4 and row["turing_n/perception"] == 2
        assert {"turing/perception", "turing/counting", "turing/grounding", "turing_upper/grounding"} <= set(row)
        assert 0 <= row["turing_iou"] <= 1
        per_cat = [row["turing/perception"]] * 2 + [row["turing/counting"], row["turing/grounding"]]
        assert row["turing"] == pytest.approx(sum(per_cat) / 4)  # mean over questions
        # flipped (right on I, wrong on Î) minus the reverse is the gap, so flips cover at least the gap
        flipped = row["turing_flipped"]
        assert len(flipped) >= round(row["turing_gap"] * row["turing_n"])
        by_question = {q["question"]: q for q in BANK}
        for flip in flipped:
            q = by_question[flip["question"]]
            assert (flip["category"], flip["answer"]) == (q["category"], q["answer"])
            if q["type"] != "box":  # a box grades against image sizes; the others by the answer alone
                item = load_qa_bank(bank_file)["shapes"][BANK.index(q)]
                assert grade(item, flip["on_original"]).correct and not grade(item, flip["on_reconstruction"]).correct
    # the two captions share one source image: its upper bound was asked once (4 questions),
    # the two different reconstructions 4 each
    assert ctx.computed["judge-answer"] == 4 + 8
    # both rows see the same original image, so the same upper bound
    assert rows[0]["turing_upper"] == rows[1]["turing_upper"]
    again = Context(Store(tmp_path / "store"))

    def not_opened(self):
        raise AssertionError("a cached run must not open reconstructions")

    monkeypatch.setattr("caprecon.reconstruct.Reconstruction.image", not_opened)
    assert metric.score(items, again) == rows and again.computed == {}


def test_vqascore_probabilities(judge, samples):
    items = [open_image(s) for s in samples]
    both = VQAScore(judge, on="both", generator=OracleGenerator()).score(items, Context())
    for row in both:
        assert 0 <= row["vqascore"] <= 1 and 0 <= row["vqascore_recon"] <= 1
    norm = VQAScore(judge, normalise=True).score(items, Context())
    assert all(0 <= row["vqascore"] <= 1 for row in norm)
    # the raw P("Yes") is the first entry of the judge's own option probabilities
    prompt = "Is the figure showing: a red circle and a blue square?"
    from caprecon.models.vlm import VLMRequest

    direct = judge.option_probs([VLMRequest(items[0].image, prompt, items[0].image_key)], [["Yes"]])[0][0]
    assert both[0]["vqascore"] == pytest.approx(direct, abs=1e-6)


def test_fleur_is_an_expectation_over_ratings(judge, samples):
    rows = Fleur(judge).score([open_image(s) for s in samples], Context())
    for row in rows:
        assert 0 <= row["fleur"] <= 1 and 0 < row["fleur_mass"] <= 1


def test_captionqa_with_text_llm(tmp_path, bank_file, samples):
    llm = TransformersLLM(build_qwen2_lm(tmp_path / "lm"), max_new_tokens=8)
    rows = CaptionQA(llm, load_qa_bank(bank_file)).score([open_image(s) for s in samples], Context())
    for row in rows:
        assert 0 <= row["captionqa"] <= 1 and row["captionqa_n"] == 4


def test_turing_and_vqascore_from_the_cli(judge, bank_file, samples, tmp_path, capsys):
    data = tmp_path / "in.jsonl"
    data.write_text("\n".join(json.dumps({"id": s.id, "image": str(s.image), "caption": s.caption,
                                          "image_id": s.image_id, "captioner": s.id}) for s in samples))
    out = tmp_path / "run"
    code = main(["score", "-i", str(data), "-m", "turing", "-m", "vqascore", "--qa-bank", str(bank_file),
                 "--judge", str(judge.source.path), "--judge-opt", "max_new_tokens=8",
                 "--generator", "oracle:OracleGenerator", "--max-side", "64", "--no-cache", "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    records = [json.loads(line) for line in (out / "scores.jsonl").read_text().splitlines()]
    assert all("turing" in r and "vqascore" in r for r in records)
    assert (out / "radar.png").stat().st_size > 10_000 and "upper bound" in (out / "categories.md").read_text()
    assert main(["report", str(out), "--out", str(tmp_path / "again")]) == 0
    assert (tmp_path / "again" / "categories.md").read_text() == (out / "categories.md").read_text()
    # the run's report.html shows the categories and, per sample, the questions that flipped
    html = (out / "report.html").read_text()
    assert 'id="categories-turing"' in html and (out / "report_files" / "radar-turing.png").is_file()
    items = json.loads(html.split('id="gallery-data">')[1].split("</script>")[0])["items"]
    assert [len(item.get("f", [])) for item in items] == [len(r["turing_flipped"]) for r in records]


def test_turing_needs_questions_for_the_image(judge, bank_file, tmp_path):
    render("a red circle").save(tmp_path / "x.png")
    res = caprecon.score([Sample(id="x", image=tmp_path / "x.png", caption="a red circle", image_id="unknown")],
                         [CaptionTuringTest(OracleGenerator(), judge, bank_file)], no_cache=True)
    assert "no questions in the QA bank for image_id 'unknown'" in res.records[0]["error"]
