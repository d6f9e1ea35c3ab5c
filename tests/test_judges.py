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
from caprecon.models.vlm_transformers import TransformersVLM
from caprecon.data.qa import load_qa_bank
from caprecon.metrics.grading import grade
from caprecon.data.images import open_image
from caprecon.data.samples import Sample
from caprecon.store.index import Store
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

    monkeypatch.setattr("caprecon.reconstruct.reconstructor.Reconstruction.image", not_opened)
    assert metric.score(items, again) == rows and again.computed == {}


def test_vqascore_is_the_softmax_of_the_judges_own_logits(judge, samples):
    """P("Yes") against a softmax computed by hand from the model's logits at the reply start."""
    import torch

    items = [open_image(s) for s in samples]
    both = VQAScore(judge, on="both", generator=OracleGenerator()).score(items, Context())
    norm = VQAScore(judge, normalise=True).score(items, Context())
    model, processor = judge._load()
    tokenizer = processor.tokenizer
    for item, row, normalised in zip(items, both, norm):
        text = judge.render(f"Is the figure showing: {item.caption}?")
        inputs = processor(text=[text], images=[item.image.convert("RGB")], return_tensors="pt")
        with torch.no_grad():
            p = torch.softmax(model(**inputs).logits[0, -1].double(), -1)
        prompt_ids = tokenizer(text)["input_ids"]

        def first(word):  # the word's first token as it starts the reply after the prompt
            return tokenizer(text + word)["input_ids"][len(prompt_ids)]

        assert row["vqascore"] == pytest.approx(float(p[first("Yes")]), rel=1e-4)
        yes, no = float(p[first("Yes")] + p[first("yes")]), float(p[first("No")] + p[first("no")])
        assert normalised["vqascore"] == pytest.approx(yes / (yes + no), rel=1e-4)


def test_fleur_applies_the_reference_rule_to_the_judges_own_reply(judge, samples):
    from caprecon.metrics.fleur import DIGITS, PROMPT, fleur_score
    from caprecon.models.vlm import VLMRequest

    items = [open_image(s) for s in samples]
    rows = Fleur(judge).score(items, Context())
    for item, row in zip(items, rows):
        request = VLMRequest(item.image, PROMPT.replace("{caption}", item.caption), item.image_key)
        reply = judge.generate_with_token_probs([request], DIGITS, 16)[0]
        assert (row["fleur"], row["fleur_greedy"]) == fleur_score(reply["tokens"], reply["probs"])
        assert row.get("fleur_unparsed") == (reply["text"] if row["fleur"] is None else None)


class ScriptedLLM:
    """Answers each CaptionQA prompt by a rule the test sets (the text LLM role)."""

    fingerprint = "scripted-llm"

    def __init__(self, answer):
        self.answer, self.prompts = answer, []

    def generate(self, prompts, max_new_tokens=64):
        self.prompts += prompts
        return [self.answer(p) for p in prompts]


def test_captionqa_counts_cannot_answer_as_wrong(bank_file, samples):
    from caprecon.metrics.captionqa import CANNOT

    bank = load_qa_bank(bank_file)
    items = [open_image(s) for s in samples]

    def abstain(prompt):  # the "cannot answer" option of mc (its letter D), the phrase otherwise
        return "D" if f"D. {CANNOT}" in prompt else "cannot answer"

    llm = ScriptedLLM(abstain)
    rows = CaptionQA(llm, bank).score(items, Context())
    assert all(row["captionqa"] == 0.0 and row["captionqa_n"] == 4 for row in rows)
    assert any(f"D. {CANNOT}" in p for p in llm.prompts)  # offered as an extra option

    def knows(prompt):  # right on the mc and yes/no questions, abstains on the others
        if f"D. {CANNOT}" in prompt:
            return "A"
        return "yes" if "Is there a square?" in prompt else "cannot answer"

    row = CaptionQA(ScriptedLLM(knows), bank).score(items[:1], Context())[0]
    assert row["captionqa"] == 0.5 and row["captionqa/perception"] == 1.0 and row["captionqa/counting"] == 0.0
    assert row["captionqa_n/perception"] == 2 and row["captionqa_n/grounding"] == 1


def test_captionqa_with_text_llm(tmp_path, bank_file, samples):
    from caprecon.metrics.captionqa import captionqa_prompt
    from caprecon.metrics.grading import score_answer

    llm = TransformersLLM(build_qwen2_lm(tmp_path / "lm"), max_new_tokens=8)
    items = [open_image(s) for s in samples]
    bank = load_qa_bank(bank_file)
    rows = CaptionQA(llm, bank).score(items, Context())
    questions = bank["shapes"]
    for item, row in zip(items, rows):
        # graded by hand from the LLM's own answers to the same prompts
        answers = llm.generate([captionqa_prompt(item.caption, q) for q in questions], max_new_tokens=32)
        size = item.image.size
        marks = [score_answer(q, a, image_size=size, source_size=size) for q, a in zip(questions, answers)]
        assert row["captionqa"] == pytest.approx(sum(marks) / 4) and row["captionqa_n"] == 4


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


def test_judge_stage_fills_the_answers_a_later_score_finds(judge, bank_file, samples, tmp_path, capsys):
    """`caprecon judge` asks the judge about sources and stored reconstructions only: before
    `reconstruct` it answers nothing that needs a reconstruction and counts the rows missing;
    after it, a `score` with the same settings asks the judge nothing and generates nothing."""
    data = tmp_path / "in.jsonl"
    data.write_text("\n".join(json.dumps({"id": s.id, "image": str(s.image), "caption": s.caption,
                                          "image_id": s.image_id}) for s in samples))
    common = ["-i", str(data), "-m", "turing", "--qa-bank", str(bank_file), "--judge", str(judge.source.path),
              "--judge-opt", "max_new_tokens=8", "--generator", "oracle:OracleGenerator", "--max-side", "64",
              "--cache-dir", str(tmp_path / "cache"), "-q"]

    def counts(command):
        code = main([command, *common])
        return code, json.loads(capsys.readouterr().out.strip().splitlines()[-1])

    code, before = counts("judge")
    assert code == 1 and before["missing_reconstruction"] == 2 and before["generated"] == 0
    assert not list((tmp_path / "cache" / "images").rglob("*.png"))  # nothing generated
    code, made = counts("reconstruct")
    assert code == 0 and made["generated"] == 2
    code, answered = counts("judge")
    assert code == 0 and answered["missing_reconstruction"] == 0 and answered["generated"] == 0
    assert answered["computed"]["judge-answer"] == 12  # 4 questions on the shared source, 4 on each reconstruction
    code = main(["score", *common, "--out", str(tmp_path / "run")])
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert code == 0 and manifest["cache"]["generated"] == 0 and manifest["cache"].get("judge-answer", 0) == 0
    assert manifest["cache"]["reused"] == 2
    # asking a stage that has no judge to answer is refused with a message
    assert main(["judge", "-i", str(data), "-m", "recon", "--generator", "oracle:OracleGenerator",
                 "--embedder", "oracle:PixelEmbedder", "--cache-dir", str(tmp_path / "cache"), "-q"]) == 2
    assert "asks a judge" in capsys.readouterr().err
