"""Downstream task suites on reconstructions (Eq. 4-5): loaders, graders, the table, Eq. 4,
the surrogate's ranking agreement, and `caprecon suite` end to end on tiny local models."""

from __future__ import annotations

import base64
import csv
import io
import json
import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from PIL import Image

from caprecon.cli import main
from caprecon.core.errors import ConfigError
from caprecon.models.generator import DiffusersGenerator
from caprecon.models.vlm_transformers import TransformersVLM
from caprecon.apps.suites import SuiteTable, caption_sources, load_suites, suite, surrogate_agreement
from caprecon.apps.suites.entries import SUITES, SuiteEntry
from caprecon.apps.suites.loaders import SuiteFormatError, image_id_of, load_benchmark
from caprecon.apps.suites.table import UPPER
from caprecon.apps.suites.scoring import Graded, dataset_scores, grade, read_number
from caprecon.metrics.grading import BoxReading
from caprecon.run.failures import RunError
from oracle import OracleGenerator
from tiny_vlm import build_qwen2_vl


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models gain nothing from intra-op threads; on a busy machine the threads' spinning slows them."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


COLOURS = {"red": (220, 30, 30), "blue": (30, 60, 220), "green": (30, 180, 60), "black": (10, 10, 10)}


def png(colour: str, size=(40, 40)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, COLOURS[colour]).save(buf, format="PNG")
    return buf.getvalue()


def b64(colour: str) -> str:
    return base64.b64encode(png(colour)).decode()


def write_tsv(path: Path, rows: list[dict]) -> Path:
    header = list(dict.fromkeys(k for r in rows for k in r))
    with path.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=header, delimiter="\t")
        writer.writeheader()
        writer.writerows(rows)
    return path


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    return path


def make_benchmarks(root: Path) -> dict[str, Path]:
    """One small file per format, as VLMEvalKit (TSV) or as JSONL with image paths."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "imgs").mkdir(exist_ok=True)
    (root / "imgs" / "green.png").write_bytes(png("green"))
    files = {
        # row 1 reuses row 0's image by its index, as VLMEvalKit writes repeated images
        "mmbench": write_tsv(root / "mmbench.tsv", [
            {"index": "10", "question": "What colour is the card?", "hint": "Look closely", "A": "red",
             "B": "blue", "C": "green", "D": "", "answer": "A", "category": "colour", "l2-category": "perception",
             "image": b64("red")},
            {"index": "11", "question": "Which shape is shown?", "hint": "", "A": "square", "B": "circle", "C": "",
             "D": "", "answer": "circle", "category": "shape", "l2-category": "perception", "image": "10"},
            {"index": "12", "question": "Is it daytime in the picture?", "hint": "", "A": "no", "B": "maybe",
             "C": "yes", "D": "", "answer": "C", "category": "scene", "l2-category": "reasoning",
             "image": b64("blue")}]),
        "mme": write_tsv(root / "mme.tsv", [
            {"index": "0", "image": b64("red"), "question": "Is there a red card?", "answer": "Yes",
             "category": "color"},
            {"index": "1", "image": "0", "question": "Is there a blue card?", "answer": "No", "category": "color"},
            {"index": "2", "image": "3", "question": "Is the card black?", "answer": "Yes",
             "category": "color"},  # names a later row's image, as VLMEvalKit may
            {"index": "3", "image": b64("black"), "question": "Is the card white?", "answer": "No",
             "category": "color"}]),
        "mathvista": write_jsonl(root / "math.jsonl", [
            {"index": "a", "image": "imgs/green.png", "question": "How many leaves are there?", "answer": "1,200"},
            {"index": "b", "image": "imgs/green.png", "question": "Which option fits? (A) 2 (B) 3",
             "answer": "B"},
            {"index": "c", "image": b64("red"), "question": "What is the value of x?", "choices": ["3", "4"],
             "answer": "4"}]),
        "ocrbench": write_tsv(root / "ocr.tsv", [
            {"index": "0", "image": b64("black"), "question": "What does the sign say?",
             "answer": "['Hello', 'hello world']", "category": "Regular Text Recognition"},
            {"index": "1", "image": b64("blue"), "question": "Write the formula.", "answer": "x + 1",
             "category": "Handwritten Mathematical Expression Recognition"}]),
        "refcoco": write_jsonl(root / "refcoco.jsonl", [
            {"index": 0, "image": b64("red"), "expression": "the red card on the left", "bbox": [10, 10, 20, 20]},
            {"index": 1, "image": "imgs/green.png", "sentence": "the green card at the top",
             "bbox": [10, 10, 20, 20]}]),
    }
    return files


@pytest.fixture
def bench_files(tmp_path):
    return make_benchmarks(tmp_path / "bench")


def _entry(name: str, path: Path) -> SuiteEntry:
    return load_suites([name], [str(path)])[0]


# ---------------------------------------------------------------------------------------
# loaders


def test_vlmevalkit_tsv_rows(bench_files):
    images = {}
    bench = load_benchmark(_entry("mmbench", bench_files["mmbench"]), images)
    q0, q1, q2 = bench.questions
    assert [q.id for q in bench.questions] == ["10", "11", "12"]
    assert q0.type == "mc" and q0.answer == "A" and q0.item.choices == ("red", "blue", "green")
    assert q0.question == "Hint: Look closely\nWhat colour is the card?"
    assert q0.category == "colour" and q0.meta["l2-category"] == "perception"
    assert q1.answer == "B" and q1.item.choices == ("square", "circle")  # answer given as the option's text
    assert q1.image_id == q0.image_id == image_id_of(png("red"))  # the index reference
    assert q2.image_id == image_id_of(png("blue")) and set(images) == {q0.image_id, q2.image_id}
    assert images[q0.image_id] == png("red")


def test_mme_pairs_math_ocr_and_refcoco_rows(bench_files):
    images = {}
    mme = load_benchmark(_entry("mme", bench_files["mme"]), images).questions
    assert [(q.type, q.answer) for q in mme] == [("yesno", "yes"), ("yesno", "no"), ("yesno", "yes"), ("yesno", "no")]
    assert mme[0].group == mme[1].group != mme[2].group == mme[3].group  # pairs by image
    assert mme[2].image_id == image_id_of(png("black"))

    math_q = load_benchmark(_entry("mathvista", bench_files["mathvista"]), images).questions
    assert (math_q[0].type, math_q[0].answer) == ("math", "1,200")
    assert math_q[0].image_id == image_id_of(png("green"))  # a path relative to the file
    assert (math_q[1].type, math_q[1].answer) == ("math", "B")
    assert (math_q[2].type, math_q[2].answer, math_q[2].item.choices) == ("mc", "B", ("3", "4"))

    ocr = load_benchmark(_entry("ocrbench", bench_files["ocrbench"]), images).questions
    assert ocr[0].answer == ("Hello", "hello world") and ocr[1].answer == ("x + 1",)

    ref = load_benchmark(_entry("refcoco", bench_files["refcoco"]), images).questions
    assert ref[0].question == "the red card on the left" and ref[1].question == "the green card at the top"
    assert ref[0].answer == (10.0, 10.0, 30.0, 30.0)  # COCO x, y, w, h -> x1, y1, x2, y2
    assert ref[0].image_id == mme[0].image_id  # the same red image in two benchmarks: one id


def test_bad_rows_and_suite_specs_name_the_problem(tmp_path, bench_files):
    bad = write_tsv(tmp_path / "bad.tsv", [{"index": "0", "image": "not an image!", "question": "q?", "A": "x",
                                            "B": "y", "answer": "A"}])
    with pytest.raises(SuiteFormatError, match=r"bad.tsv:2: image is neither"):
        load_benchmark(_entry("mmbench", bad), {})
    wrong = write_tsv(tmp_path / "wrong.tsv", [{"index": "0", "image": b64("red"), "question": "q?", "A": "x",
                                                "B": "y", "answer": "E"}])
    with pytest.raises(SuiteFormatError, match=r"wrong.tsv:2: answer 'E' is neither"):
        load_benchmark(_entry("mmbench", wrong), {})
    with pytest.raises(ConfigError, match="unknown suite 'mmbenchh'"):
        load_suites(["mmbenchh"])
    with pytest.raises(ConfigError, match="no data file"):
        load_suites(["mmbench"])
    with pytest.raises(ConfigError, match="box questions go with the grounding metric"):
        SuiteEntry(name="x", question="box")


def test_suite_file_and_custom_entry(tmp_path, bench_files):
    suite = tmp_path / "bench" / "suite.yaml"
    suite.write_text("datasets:\n  - suite: mme\n    data: mme.tsv\n"
                     "  - name: my-ocr\n    label: MyOCR\n    question: ocr\n    match: exact\n    data: ocr.tsv\n")
    entries = load_suites([str(suite), "refcoco"], [str(bench_files["refcoco"])])
    assert [(e.name, e.label, e.metric) for e in entries] == [("mme", "MME", "accuracy+"), ("my-ocr", "MyOCR",
                                                                                           "accuracy"),
                                                              ("refcoco", "CO.", "grounding")]
    assert entries[0].data == bench_files["mme"] and entries[1].match == "exact"
    # --data NAME=PATH names its suite; plain paths go to the others in order
    entries = load_suites(["mmbench", "mme"], [f"mme={bench_files['mme']}", str(bench_files["mmbench"])])
    assert [e.data for e in entries] == [bench_files["mmbench"], bench_files["mme"]]
    with pytest.raises(ConfigError, match="2 --data file.s. for 1 suite"):
        load_suites(["mmbench"], [str(bench_files["mmbench"]), str(bench_files["mme"])])
    assert list(SUITES) == ["mmbench", "mmstar", "hallusionbench", "mme", "mathvista", "mathverse", "mathvision",
                            "ocrbench", "ocrvqa", "refcoco"]


# ---------------------------------------------------------------------------------------
# graders and dataset numbers


def test_numbers_are_read_with_commas_fractions_percent_and_units():
    assert read_number("1,234", gold=True) == (1234.0, False)
    assert read_number("3/4") == (0.75, False)
    assert read_number("\\frac{3}{4}") == (0.75, False)
    assert read_number("about 45% of them") == (45.0, True)
    assert read_number("12 cm") == (12.0, False)
    assert read_number("$5") == (5.0, False)
    assert read_number("The answer is 7. Since 3 + 4 = 7 and 2 > 1") == (7.0, False)
    assert read_number("3 + 4 = 7") == (7.0, False)  # no marker: the last number
    assert read_number("none") is None


def _math(answer: str, entry=None, **meta):
    from caprecon.apps.suites.loaders import BenchQuestion

    return BenchQuestion(dataset="m", id="0", image_id="i", type="math", question="q", answer=answer, meta=meta)


def test_math_grading_tolerance_precision_and_percent():
    entry = SUITES["mathvista"]
    size = dict(source_size=(10, 10), seen_size=(10, 10))
    assert grade(_math("1,200"), "1200", entry, **size).correct
    assert grade(_math("1200"), "The answer is 1,200 leaves.", entry, **size).correct
    assert not grade(_math("1200"), "1201", entry, **size).correct
    assert grade(_math("0.75"), "3/4", entry, **size).correct
    assert grade(_math("45"), "45%", entry, **size).correct and grade(_math("0.45"), "45%", entry, **size).correct
    assert grade(_math("3.14"), "3.1416", entry, **size).correct is False
    assert grade(_math("3.14", precision=2), "3.1416", entry, **size).correct  # rounded to 2 decimals
    loose = SuiteEntry(name="loose", question="math", rel_tol=0.01)
    assert grade(_math("200"), "201.5", loose, **size).correct and not grade(_math("200"), "203", loose, **size).correct
    assert grade(_math("B"), "(B) 3", entry, **size).correct and not grade(_math("B"), "A", entry, **size).correct
    assert grade(_math("triangle"), "A triangle.", entry, **size).correct


def test_ocr_contains_and_exact_rules(bench_files):
    ocr = load_benchmark(_entry("ocrbench", bench_files["ocrbench"]), {}).questions
    size = dict(source_size=(40, 40), seen_size=(40, 40))
    contains, exact = SUITES["ocrbench"], SUITES["ocrvqa"]
    assert grade(ocr[0], "The sign says HELLO there", contains, **size).correct  # contained, any case
    assert not grade(ocr[0], "The sign says HELLO there", exact, **size).correct
    assert grade(ocr[0], "Hello World!", exact, **size).correct  # the second accepted answer, normalised
    assert grade(ocr[1], "x+1", contains, **size).correct  # handwritten formulas: spaces dropped
    assert not grade(ocr[1], "y+1", contains, **size).correct


def test_box_grading_by_iou_in_the_judges_convention(bench_files):
    q = load_benchmark(_entry("refcoco", bench_files["refcoco"]), {}).questions[0]  # (10,10)-(30,30) in 40x40
    entry = SUITES["refcoco"]
    # on a 32x32 reconstruction, in fractions: the gold box is (.25, .25, .75, .75)
    half = grade(q, "[0.25, 0.25, 0.75, 0.5]", entry, source_size=(40, 40), seen_size=(32, 32),
                 reading=BoxReading("normalized"))
    assert half.iou == pytest.approx(0.5) and half.correct  # IoU >= 0.5 counts
    third = grade(q, "[0.5, 0.25, 1.0, 0.75]", entry, source_size=(40, 40), seen_size=(32, 32),
                  reading=BoxReading("normalized"))
    assert third.iou == pytest.approx(1 / 3) and not third.correct
    pixels = grade(q, "[8, 8, 24, 24]", entry, source_size=(40, 40), seen_size=(32, 32), reading=BoxReading("pixel"))
    assert pixels.iou == pytest.approx(1.0)
    grid = grade(q, "(250,250),(750,750)", entry, source_size=(40, 40), seen_size=(32, 32), reading=BoxReading("1000"))
    assert grid.iou == pytest.approx(1.0)


def test_dataset_numbers_mme_accuracy_plus_and_grounding(bench_files):
    mme = load_benchmark(_entry("mme", bench_files["mme"]), {}).questions
    scores = dataset_scores(SUITES["mme"], mme, [Graded(True), Graded(True), Graded(True), Graded(False)])
    assert scores["accuracy"] == 75.0 and scores["accuracy_plus"] == 50.0 and scores["score"] == 75.0
    assert scores["categories"] == {"color": 75.0}
    ref = load_benchmark(_entry("refcoco", bench_files["refcoco"]), {}).questions
    scores = dataset_scores(SUITES["refcoco"], ref, [Graded(True, 1.0), Graded(False, 1 / 3)])
    assert scores["accuracy"] == 50.0 and scores["miou"] == pytest.approx(100 * (1 + 1 / 3) / 2)


def test_grounding_headline_is_mean_iou_with_accuracy_at_the_threshold_beside_it():
    """The CO. column and the Avg. of Table 1 take the mean IoU (the paper's grounding metric)."""
    entry = SuiteEntry(name="co", question="box", metric="grounding", label="CO.")
    mc = SuiteEntry(name="mc", question="mc", label="MC")
    # IoUs .9, .6, .2 and a reply without a box: mean (.9 + .6 + .2 + 0)/4 = .425; two of four at >= .5
    graded = [Graded(True, 0.9), Graded(True, 0.6), Graded(False, 0.2), Graded(False, 0.0)]
    scores = dataset_scores(entry, [SimpleNamespace(category="", group="")] * 4, graded)
    assert scores["score"] == pytest.approx(42.5) and scores["miou"] == pytest.approx(42.5)
    assert scores["accuracy"] == 50.0 and scores["iou_threshold"] == 0.5
    table = SuiteTable([mc, entry], {UPPER: {"mc": {"score": 80.0}, "co": {"score": 60.0}},
                                     "a": {"mc": {"score": 70.0}, "co": scores}}, ["a"])
    assert table.score("a", "co") == pytest.approx(42.5)
    assert table.average("a") == pytest.approx((70 + 42.5) / 2)  # 56.25
    row = next(r for r in table.rows() if r["captioner"] == "a" and r["dataset"] == "co")
    assert (row["score"], row["accuracy"], row["miou"]) == (pytest.approx(42.5), 50.0, pytest.approx(42.5))
    assert next(line for line in table.to_text().splitlines() if line.startswith("a ")).split()[1:4] == [
        "70.00", "42.50", "56.25"]


# ---------------------------------------------------------------------------------------
# Eq. 4 and the surrogate's agreement


def test_sigma_equivalence_on_constructed_numbers():
    datasets = [SuiteEntry(name="d1", question="mc"), SuiteEntry(name="d2", question="mc")]
    scores = {UPPER: {"d1": {"score": 80.0}, "d2": {"score": 60.0}},
              "close": {"d1": {"score": 78.0}, "d2": {"score": 50.0}},  # |gaps| 2 and 10: mean 6
              "over": {"d1": {"score": 85.0}, "d2": {"score": 55.0}}}  # +5 and -5: mean |gap| 5, gap of averages 0
    table = SuiteTable(datasets, scores, ["close", "over"], sigma=5)
    assert table.mean_abs_gap("close") == 6 and table.equivalent("close") is False
    assert table.gap("over") == 0 and table.mean_abs_gap("over") == 5 and table.equivalent("over") is True
    assert SuiteTable(datasets, scores, ["close"], sigma=6).equivalent("close") is True  # the bound is inclusive
    text = table.to_text()
    assert "mean|Δ|" in text and "≤σ=5" in text
    close = next(line for line in text.splitlines() if line.startswith("close"))
    assert close.split() == ["close", "78.00", "50.00", "64.00", "6.00", "6.00", "no"]


def test_ranking_tau_on_constructed_rankings(tmp_path, capsys):
    suite = {"a": 50.0, "b": 40.0, "c": 30.0, "d": 20.0, "only-suite": 10.0}
    turing = {"a": 0.9, "b": 0.7, "c": 0.8, "d": 0.1}
    agreement = surrogate_agreement(suite, turing)
    # pairs: (b, c) discordant, the other five concordant: tau = (5 - 1) / 6
    assert agreement.tau == pytest.approx(4 / 6)
    assert agreement.ranking(suite) == ["a", "b", "c", "d"] and agreement.ranking(turing) == ["a", "c", "b", "d"]
    assert agreement.only_suite == ["only-suite"]
    assert surrogate_agreement(suite, {k: -v for k, v in turing.items()}).tau == pytest.approx(-4 / 6)
    # all averages tied: no ranking, and the table says that is why there is no tau
    tied = surrogate_agreement({"a": 50.0, "b": 50.0, "c": 50.0}, {"a": 0.9, "b": 0.7, "c": 0.8})
    assert math.isnan(tied.tau) and "n/a (the task-suite averages are all tied" in tied.to_text()
    assert "fewer than two captioners" in surrogate_agreement({"a": 1.0}, {"a": 0.5}).to_text()

    # the command: a suite run's summary and turing runs (a folder, or a number)
    run = tmp_path / "suite-run"
    run.mkdir()
    (run / "summary.json").write_text(json.dumps({"captioners": {k: {"average": v} for k, v in suite.items()}}))
    turing_run = tmp_path / "turing-a"
    turing_run.mkdir()
    (turing_run / "summary.json").write_text(json.dumps({"metrics": {"turing": {"mean": 0.9}}}))
    argv = ["suite-agree", "--suite-run", str(run), "--turing", f"a={turing_run}", "--turing", "b=0.7",
            "--turing", "c=0.8", "--turing", "d=0.1", "--out", str(tmp_path / "agree")]
    assert main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[2].split() == ["1", "a", "50.00", "a", "0.9000"]
    assert lines[3].split() == ["2", "b", "40.00", "c", "0.8000"]
    assert any(line.startswith("Kendall tau_b over 4 captioners: +0.667") for line in lines)
    saved = json.loads((tmp_path / "agree" / "agreement.json").read_text())
    assert saved["turing_ranking"] == ["a", "c", "b", "d"] and saved["tau_b"] == pytest.approx(4 / 6)


# ---------------------------------------------------------------------------------------
# the whole run with a scripted judge: numbers checked by hand


class ScriptedJudge:
    """Answers by the question in the prompt: right on an original (40x40), on a
    reconstruction with something drawn the scripted reply, on a blank one a wrong reply."""

    def __init__(self, script: dict[str, tuple[str, str]]):
        self.script = script
        self.asked: list[tuple[str, str]] = []

    @property
    def fingerprint(self) -> str:
        return "scripted-judge-v1"

    def generate(self, requests, max_new_tokens=32):
        out = []
        for r in requests:
            self.asked.append((r.image_key, r.prompt))
            right, on_reconstruction = next(v for k, v in self.script.items() if k in r.prompt)
            if r.image.size == (40, 40):
                out.append(right)
            elif np.asarray(r.image).min() == 255:  # the oracle drew nothing: a caption that names nothing
                out.append("Z 0 [0, 0, 0.01, 0.01]")
            else:
                out.append(on_reconstruction)
        return out


SCRIPT = {  # question -> (reply on the original, reply on a drawn reconstruction)
    "What colour is the card?": ("A", "A"),
    "Which shape is shown?": ("B", "B. circle"),
    "Is it daytime": ("C", "A"),  # mmbench on reconstructions: 2 of 3
    "Is there a red card?": ("Yes", "Yes"),
    "Is there a blue card?": ("No", "no"),
    "Is the card black?": ("Yes", "yes"),
    "Is the card white?": ("No", "Yes"),  # mme: acc 3/4, acc+ 1/2
    "How many leaves": ("1200", "The answer is 1,200."),
    "Which option fits?": ("B", "(B)"),
    "value of x": ("B", "A"),  # math: 2 of 3
    "What does the sign say?": ("hello", "It says Hello"),
    "Write the formula.": ("x+1", "y + 1"),  # ocr: 1 of 2
    "the red card on the left": ("[0.25, 0.25, 0.75, 0.75]", "[0.25, 0.25, 0.75, 0.75]"),
    "the green card at the top": ("[0.25, 0.25, 0.75, 0.75]", "[0.5, 0.25, 1.0, 0.75]"),  # refcoco: 1 of 2
}


def test_table_one_with_a_scripted_judge(tmp_path, bench_files):
    names = ["mmbench", "mme", "mathvista", "ocrbench", "refcoco"]
    suites = load_suites(names, [str(bench_files[n]) for n in names])
    captions = {"drawn": "1. A **red** square\n2. a blue circle", "blank": "Nothing at all."}
    files = {}
    for label, text in captions.items():
        image_ids = sorted({q.image_id for s in suites for q in load_benchmark(s, {}).questions})
        files[label] = write_jsonl(tmp_path / f"{label}.jsonl", [{"image_id": i, "caption": text}
                                                                 for i in image_ids])
    judge = ScriptedJudge(SCRIPT)
    results = suite(suites, caption_sources([], files), generator=OracleGenerator(), judge=judge,
                              size="32x32", judge_box_coords="normalized", cache_dir=str(tmp_path / "cache"),
                              out=tmp_path / "run", sigma=40)
    table = results.table
    # refcoco's headline is its mean IoU: IoU 1 and 1/3 on the two questions
    expected = {"mmbench": 200 / 3, "mme": 75.0, "mathvista": 200 / 3, "ocrbench": 50.0,
                "refcoco": 100 * (1 + 1 / 3) / 2}
    for name, value in expected.items():
        assert table.score(UPPER, name) == 100.0
        assert table.score("drawn", name) == pytest.approx(value)
        assert table.score("blank", name) == 0.0
    assert table.scores["drawn"]["mme"]["accuracy_plus"] == 50.0
    assert table.scores["drawn"]["refcoco"]["accuracy"] == 50.0  # Acc@IoU>=0.5 beside it
    average = sum(expected.values()) / 5
    assert table.average("drawn") == pytest.approx(average) and table.gap("drawn") == pytest.approx(100 - average)
    assert table.mean_abs_gap("drawn") == pytest.approx(100 - average) and table.equivalent("drawn") is True
    assert table.equivalent("blank") is False  # mean |gap| 100 > 40

    # the upper bound: each (original image, question) asked once, although two sources were scored
    recon_keys = {Path(r["reconstruction"]).stem for r in results.records if r.get("reconstruction")}
    originals = [a for a in judge.asked if a[0] not in recon_keys]
    assert len(originals) == len(set(originals)) == 14
    # the normaliser ran before generation, the raw caption kept
    drawn = next(r for r in results.captions if r["captioner"] == "drawn")
    assert drawn["caption"] == "A red square. a blue circle." and drawn["caption_raw"] == captions["drawn"]

    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["captioners"]["drawn"]["average"] == pytest.approx(average)
    assert summary["upper_bound"]["average"] == 100.0
    md = (tmp_path / "run" / "table.md").read_text()
    assert md.splitlines()[0] == "| captioner | MMB. | MME | Vista. | OB. | CO. | Avg. | Gap | mean\\|Δ\\| | ≤σ=40 |"

    # a third source on the same cache: the upper bound is not asked again
    asked_before = len(judge.asked)
    files["third"] = write_jsonl(tmp_path / "third.jsonl", [{"dataset": "mmbench", "index": "10",
                                                             "caption": "a green triangle"}])
    again = suite(suites, caption_sources([], files), generator=OracleGenerator(), judge=judge,
                            size="32x32", judge_box_coords="normalized", cache_dir=str(tmp_path / "cache"))
    new = judge.asked[asked_before:]
    # only the red image's questions (mmbench 2, mme 2, math 1, refcoco 1) on its one new reconstruction
    assert len(new) == 6 and again.manifest["cache"]["judge_answers_computed"] == 6
    assert {k for k, _ in new} <= {Path(r["reconstruction"]).stem for r in again.records if r.get("reconstruction")}
    assert again.table.scores["third"]["mmbench"]["n"] == 2  # the questions of images it has no caption for are out
    assert any("third: 8 question(s) without an answer" in n for n in again.table.notes)


class GridJudge(ScriptedJudge):
    """A grounding judge of its own, answering on Qwen3-VL's 0-1000 grid."""

    box_coords = "1000"

    @property
    def fingerprint(self) -> str:
        return "scripted-grid-judge-v1"


def test_a_dataset_has_a_judge_of_its_own(tmp_path, bench_files):
    names = ["mmbench", "refcoco"]
    suites = load_suites(names, [str(bench_files[n]) for n in names])
    image_ids = sorted({q.image_id for s in suites for q in load_benchmark(s, {}).questions})
    drawn = write_jsonl(tmp_path / "drawn.jsonl", [{"image_id": i, "caption": "a red square"} for i in image_ids])
    default = ScriptedJudge({k: v for k, v in SCRIPT.items() if not k.startswith("the ")})  # no refcoco
    # the gold boxes are (.25, .25, .75, .75) of their images: on the grid (250, 250, 750, 750)
    grounding = GridJudge({"the red card on the left": ("[250, 250, 750, 750]", "[250, 250, 750, 750]"),
                           "the green card at the top": ("[250, 250, 750, 750]", "[500, 250, 1000, 750]")})
    results = suite(suites, caption_sources([], {"drawn": drawn}), generator=OracleGenerator(),
                              judge=default, judge_for={"refcoco": grounding}, size="32x32",
                              judge_box_coords="normalized", cache_dir=str(tmp_path / "cache"))
    # every refcoco question, on the originals and on the reconstructions, went to its own judge
    assert len(grounding.asked) == 2 * 2 and all("Answer with the bounding box" in p for _, p in grounding.asked)
    assert len(default.asked) == 3 * 2 and not any("bounding box" in p for _, p in default.asked)
    # read in the grid judge's own convention (the run's `normalized` is the default judge's):
    # IoU 1 and, for (.5, .25, 1, .75) against (.25, .25, .75, .75), .25/.75 = 1/3
    ious = [r["iou"] for r in results.records if r["captioner"] == "drawn" and r["dataset"] == "refcoco"]
    assert ious == [pytest.approx(1.0), pytest.approx(1 / 3)]
    assert results.table.score(UPPER, "refcoco") == pytest.approx(100.0)
    assert results.table.score("drawn", "refcoco") == pytest.approx(100 * (1 + 1 / 3) / 2)
    assert results.table.score("drawn", "mmbench") == pytest.approx(200 / 3)
    assert results.manifest["judge"]["box_coords"] == "normalized"
    assert results.manifest["judge"]["judge_for"] == {"refcoco": {"box_coords": "1000"}}
    assert [r["dataset"] for r in results.records] == ["mmbench"] * 3 + ["refcoco"] * 2 + ["mmbench"] * 3 + [
        "refcoco"] * 2  # upper bound, then the source, each in the suite's order

    # only the datasets without a judge of their own need the default one
    alone = suite(suites[1:], caption_sources([], {"drawn": drawn}), generator=OracleGenerator(),
                            judge_for={"refcoco": grounding}, size="32x32", cache_dir=str(tmp_path / "cache"))
    assert alone.table.score("drawn", "refcoco") == pytest.approx(100 * (1 + 1 / 3) / 2)
    with pytest.raises(ConfigError, match="no judge"):
        suite(suites, caption_sources([], {"drawn": drawn}), generator=OracleGenerator(),
                        judge_for={"refcoco": grounding}, size="32x32", cache_dir=str(tmp_path / "cache"))
    with pytest.raises(ConfigError, match="--judge-for refcocog: no such dataset in this suite"):
        suite(suites, caption_sources([], {"drawn": drawn}), generator=OracleGenerator(), judge=default,
                        judge_for={"refcocog": grounding}, size="32x32", cache_dir=str(tmp_path / "cache"))


def test_suite_command_passes_judge_for_from_the_options_and_the_config_file(tmp_path, bench_files, monkeypatch):
    import caprecon.apps.suites as suites_app

    seen = {}

    def capture(suites, sources, *, config, **kwargs):
        seen["judge_for"] = config.judge_for
        return SimpleNamespace(out=None, records=[])

    monkeypatch.setattr(suites_app, "suite", capture)
    captions = write_jsonl(tmp_path / "c.jsonl", [{"dataset": "mmbench", "index": "10", "caption": "a red card"}])
    config = tmp_path / "run.yaml"
    config.write_text("judge_for: {mmbench: qwen3-vl-8b, refcoco: qwen2.5-vl-7b}\n")
    argv = ["suite", "--suite", "mmbench", "--data", str(bench_files["mmbench"]), "--suite", "refcoco", "--data",
            str(bench_files["refcoco"]), "--generator", "x:Y", "--judge", "a:B", "--captions",
            f"c={captions}", "--config", str(config), "--judge-for", "refcoco=qwen2.5-vl-72b", "--quiet"]
    assert main(argv) == 0
    assert seen["judge_for"] == {"mmbench": "qwen3-vl-8b", "refcoco": "qwen2.5-vl-72b"}


# ---------------------------------------------------------------------------------------
# `caprecon suite` end to end on tiny models


@pytest.fixture(scope="module")
def tiny_qwen(tmp_path_factory):
    return build_qwen2_vl(tmp_path_factory.mktemp("suite-vlm") / "qwen")


@pytest.fixture
def counted(monkeypatch):
    calls = {"generated": [], "judged": [], "captioned": 0}
    generate, judge = DiffusersGenerator.generate, TransformersVLM.generate

    def counting_generate(self, requests):
        calls["generated"] += [r.prompt for r in requests]
        return generate(self, requests)

    def counting_judge(self, requests, max_new_tokens=None):
        calls["judged"] += [(r.image_key, r.prompt) for r in requests]
        return judge(self, requests, max_new_tokens)

    from caprecon.models.captioner import TransformersCaptioner

    caption = TransformersCaptioner.caption

    def counting_caption(self, requests, sampling):
        calls["captioned"] += len(requests)
        return caption(self, requests, sampling)

    monkeypatch.setattr(DiffusersGenerator, "generate", counting_generate)
    monkeypatch.setattr(TransformersVLM, "generate", counting_judge)
    monkeypatch.setattr(TransformersCaptioner, "caption", counting_caption)
    return calls


def test_suite_command_end_to_end_and_rerun_makes_no_model_call(tmp_path, bench_files, tiny_sd, tiny_qwen,
                                                                 counted, capsys):
    suite = tmp_path / "bench" / "suite.toml"
    suite.write_text('[[datasets]]\nsuite = "mmbench"\ndata = "mmbench.tsv"\n'
                     '[[datasets]]\nsuite = "refcoco"\ndata = "refcoco.jsonl"\n')
    captions = write_jsonl(tmp_path / "published.jsonl", [
        {"dataset": "mmbench", "index": "10", "caption": "**A red card**"},
        {"dataset": "mmbench", "index": "12", "caption": "A blue card"},
        {"dataset": "refcoco", "index": "1", "caption": "A green card"}])
    out = tmp_path / "run"
    argv = ["suite", "--suite", str(suite), "--captioner", f"tinyqwen={tiny_qwen}", "--captions",
            f"published={captions}", "--caption-max-new-tokens", "5", "--generator", str(tiny_sd),
            "--generator-opt", "steps=1", "--judge", str(tiny_qwen), "--judge-max-new-tokens", "4",
            "--judge-box-coords", "1000", "--size", "32x32", "--cache-dir", str(tmp_path / "cache"),
            "--out", str(out)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    header = printed.splitlines()[0].split()
    assert header[:4] == ["captioner", "MMB.", "CO.", "Avg."]
    assert [line.split()[0] for line in printed.splitlines()[2:5]] == ["Upper", "tinyqwen", "published"]

    images = 3  # red (mmbench 10, 11; refcoco 0), blue (mmbench 12), green (refcoco 1)
    questions = 5
    assert counted["captioned"] == images
    assert len(counted["generated"]) == images * 2  # every image of each source, none twice
    assert "A red card" in counted["generated"]  # the published caption, normalised
    records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    recon_keys = {Path(r["reconstruction"]).stem for r in records if r.get("reconstruction")}
    on_originals = [a for a in counted["judged"] if a[0] not in recon_keys]
    assert len(on_originals) == len(set(on_originals)) == questions  # the upper bound once per question
    assert len([a for a in counted["judged"] if a[0] in recon_keys]) == questions * 2

    # the table's numbers are the records' means
    summary = json.loads((out / "summary.json").read_text())
    for label in ("tinyqwen", "published"):
        for dataset in ("mmbench", "refcoco"):
            rows = [r for r in records if r["captioner"] == label and r["dataset"] == dataset]
            # mmbench: the share of right answers; refcoco (grounding): the mean IoU
            right = [r["iou"] if dataset == "refcoco" else r["correct"] for r in rows]
            assert summary["captioners"][label]["scores"][dataset]["score"] == pytest.approx(
                100 * sum(right) / len(right))
        row = summary["captioners"][label]
        assert row["average"] == pytest.approx(sum(s["score"] for s in row["scores"].values()) / 2)
        assert row["gap"] == pytest.approx(summary["upper_bound"]["average"] - row["average"])
    listed = [json.loads(line) for line in (out / "images.jsonl").read_text().splitlines()]
    assert len(listed) == images and all(Path(i["path"]).exists() for i in listed)

    # a rerun: every caption, image and answer comes from the store
    before = {k: (len(v) if isinstance(v, list) else v) for k, v in counted.items()}
    assert main(argv[:-2] + ["--out", str(tmp_path / "rerun"), "--quiet"]) == 0
    assert {k: (len(v) if isinstance(v, list) else v) for k, v in counted.items()} == before
    manifest = json.loads((tmp_path / "rerun" / "manifest.json").read_text())
    assert manifest["cache"]["judge_answers_computed"] == 0
    assert manifest["cache"]["reconstructions"]["generated"] == 0
    assert manifest["cache"]["captions/tinyqwen"]["generated"] == 0
    assert json.loads((tmp_path / "rerun" / "summary.json").read_text()) == summary


def test_suite_command_errors_stop_before_any_work(tmp_path, bench_files, capsys):
    base = ["suite", "--suite", "mmbench", "--data", str(bench_files["mmbench"]), "--generator", "x:Y"]
    assert main(base + ["--captions", str(tmp_path / "missing.jsonl"), "--judge", "a:B"]) == 2
    assert f"--captions: not found: {tmp_path / 'missing.jsonl'}" in capsys.readouterr().err
    assert main(["suite", "--suite", "mmbench", "--captions", str(bench_files["mme"])]) == 2
    assert "no data file" in capsys.readouterr().err
    assert main(base + ["--judge", "a:B", "--judge-for", "refcoco"]) == 2
    # suite's key is a dataset, not score's question category
    assert "--judge-for 'refcoco' must look like DATASET=MODEL" in capsys.readouterr().err


class HungryGenerator(OracleGenerator):
    """Runs out of memory on more than `room` prompts at once, as a GPU does."""

    def __init__(self, room: int):
        self.room, self.sizes = room, []

    def generate(self, requests):
        self.sizes.append(len(requests))
        if len(requests) > self.room:
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return super().generate(requests)


def test_a_suite_reconstructs_in_halved_batches_after_out_of_memory(tmp_path, bench_files):
    """The suite's generator meets out of memory as a scoring run does: the batch is halved and
    stays halved, and a generator that cannot take one prompt stops the run with advice (where
    each picture used to become its own 'reconstruction failed' row)."""
    names = ["mmbench", "mme", "mathvista", "ocrbench", "refcoco"]
    suites = load_suites(names, [str(bench_files[n]) for n in names])
    image_ids = sorted({q.image_id for s in suites for q in load_benchmark(s, {}).questions})
    files = {label: write_jsonl(tmp_path / f"{label}.jsonl", [{"image_id": i, "caption": f"a {label} square {n}"}
                                                             for n, i in enumerate(image_ids)])
             for label in ("red", "blue")}
    hungry = HungryGenerator(room=2)
    results = suite(suites, caption_sources([], files), generator=hungry, judge=ScriptedJudge(SCRIPT),
                              size="32x32", cache_dir=str(tmp_path / "cache"), batch_size=4)
    # two captioners' 4 pictures in batches of 4: 4 fails, then 2 and 2; the second batch starts at 2
    assert len(image_ids) == 4 and hungry.sizes == [4, 2, 2, 2, 2]
    made = [r for r in results.records if r["captioner"] != UPPER]
    assert made and all(r.get("reconstruction") and not r.get("error") for r in made)
    with pytest.raises(RunError, match="reconstruct: out of memory on a single row"):
        suite(suites, caption_sources([], files), generator=HungryGenerator(room=0),
                        judge=ScriptedJudge(SCRIPT), size="32x32", cache_dir=str(tmp_path / "fresh"))


def test_each_registered_entry_describes_the_number_it_reports():
    """The registry's words match the headline: a grounding entry reports the mean IoU (its
    accuracy at the threshold is the companion), so its description leads with that."""
    from caprecon.apps.suites.entries import SUITES

    for entry in SUITES.values():
        if entry.metric == "grounding":
            headline = entry.about.split("; ", 1)[1]
            assert headline.startswith("mean IoU"), entry.about
