"""The question bank: loading and its errors, prompts, grading by hand-worked cases."""

import json

import pytest

from caprecon.data.qa import QABankError, QAItem, build_prompt, load_qa_bank, normalize_short, parse_item
from caprecon.metrics.grading import box_iou, grade, infer_coords, mc_from_probs, read_box, score_answer

MC = QAItem("img", "What colour is the bus?", "mc", "B", choices=("red", "blue", "dark green"))
YN = QAItem("img", "Is there a dog?", "yesno", "no")
SHORT = QAItem("img", "How many birds?", "short", "two")
# normalised answer box (0.1, 0.2, 0.5, 0.6); on a 200x100 image that is pixels (20, 20, 100, 60)
BOX = QAItem("img", "Where is the ball?", "box", (0.1, 0.2, 0.5, 0.6), coords="normalized")
SIZE = (200, 100)


def _bank(tmp_path, *records, raw: str | None = None):
    path = tmp_path / "bank.jsonl"
    lines = [json.dumps(r) for r in records] + ([raw] if raw is not None else [])
    path.write_text("\n".join(lines) + "\n")
    return path


# -- loading --------------------------------------------------------------------------------


def test_load_bank(tmp_path):
    path = _bank(tmp_path,
                 {"image_id": "a", "question": "Colour?", "category": "colour", "type": "mc",
                  "choices": ["red", "Blue"], "answer": "blue"},
                 {"image_id": "a", "question": "Dog?", "type": "yesno", "answer": "Yes", "id": "q-dog", "src": "x"},
                 {"image_id": "b", "question": "Where?", "type": "box", "answer": [1, 2, 30, 40], "coords": "pixel"},
                 {"image_id": "a", "question": "Count?", "type": "short", "answer": 3})
    bank = load_qa_bank(path)
    assert list(bank) == ["a", "b"] and [q.id for q in bank["a"]] == ["a#0", "q-dog", "a#2"]
    mc, yn, short = bank["a"]
    assert mc.answer == "B" and mc.category == "colour" and mc.options == ("A", "B")  # answer given as text
    assert yn.answer == "yes" and yn.meta == {"src": "x"} and yn.correct_option == "Yes"
    assert short.answer == "3"
    assert bank["b"][0].answer == (1.0, 2.0, 30.0, 40.0) and bank["b"][0].coords == "pixel"


@pytest.mark.parametrize("record, message", [
    ({"image_id": "a", "question": "Q?", "type": "essay", "answer": "x"}, "unknown type 'essay'"),
    ({"image_id": "a", "question": "Q?", "type": "mc", "answer": "A"}, "needs 'choices'"),
    ({"image_id": "a", "question": "Q?", "type": "mc", "choices": ["red", "blue"], "answer": "green"},
     "neither an option letter nor one of the choices (A. red, B. blue)"),
    ({"image_id": "a", "question": "Q?", "type": "mc", "choices": ["red", "blue"], "answer": "C"},
     "neither an option letter"),
    ({"image_id": "a", "question": "Q?", "type": "mc", "choices": ["B", "A"], "answer": "A"}, "ambiguous"),
    ({"image_id": "a", "question": "Q?", "type": "yesno", "answer": "maybe"}, "must be yes or no"),
    ({"image_id": "a", "question": "Q?", "type": "box", "answer": [1, 2, 3]}, "must be [x1, y1, x2, y2]"),
    ({"image_id": "a", "question": "Q?", "type": "box", "answer": [5, 2, 3, 4]}, "x1 < x2 and y1 < y2"),
    ({"image_id": "a", "question": "Q?", "type": "box", "answer": ["a", 2, 3, 4]}, "four numbers"),
    ({"image_id": "a", "question": "Q?", "type": "box", "answer": [0, 0, 2, 2], "coords": "normalized"},
     "beyond 1"),
    ({"image_id": "a", "question": "Q?", "type": "box", "answer": [0, 0, 2, 2], "coords": "inches"},
     "unknown coords 'inches'"),
    ({"image_id": "a", "question": "Q?", "type": "short"}, "missing field 'answer'"),
    ({"image_id": "a", "question": " ", "type": "short", "answer": "x"}, "non-empty string"),
    ({"image_id": "a", "question": "Q?", "type": "yesno", "answer": "yes", "choices": ["y", "n"]},
     "choices are for mc"),
])
def test_bad_lines_name_line_and_problem(tmp_path, record, message):
    good = {"image_id": "a", "question": "Fine?", "type": "yesno", "answer": "no"}
    path = _bank(tmp_path, good, record)
    with pytest.raises(QABankError) as err:
        load_qa_bank(path)
    assert f"{path}:2: " in str(err.value) and message in str(err.value)


def test_bad_json_and_duplicate_ids(tmp_path):
    path = _bank(tmp_path, raw='{"image_id": "a", "question": ')
    with pytest.raises(QABankError, match=r"bank.jsonl:1: not valid JSON"):
        load_qa_bank(path)
    q = {"image_id": "a", "question": "Q?", "type": "yesno", "answer": "no", "id": "q1"}
    with pytest.raises(QABankError, match=r"bank.jsonl:3: id 'q1' already used on line 1"):
        load_qa_bank(_bank(tmp_path, q, {**q, "id": "q2", "question": "Q2?"}, {**q, "question": "Q3?"}))


# -- prompts ----------------------------------------------------------------------------------


def test_prompts():
    assert build_prompt(MC) == ("What colour is the bus?\nA. red\nB. blue\nC. dark green\n"
                                "Answer with the option's letter from the given choices directly.")
    assert build_prompt(YN).endswith("Answer the question with yes or no.")
    assert build_prompt(SHORT).endswith("Answer the question using a single word or phrase.")
    assert build_prompt(BOX).endswith("[x1, y1, x2, y2].")
    assert "0-1000" in build_prompt(BOX, box_coords="1000")
    with pytest.raises(ValueError, match="unknown box_coords"):
        build_prompt(BOX, box_coords="cm")


# -- grading ----------------------------------------------------------------------------------


@pytest.mark.parametrize("prediction, letter", [
    ("B", "B"), ("b", "B"), ("(B)", "B"), ("B.", "B"), ("B) blue", "B"), ("Answer: B", "B"),
    ("The answer is B.", "B"), ("Blue", "B"), ("blue!", "B"), ("The bus is blue.", "B"),
    ("Dark-green", "C"), ("A", "A"), ("A bus", None), ("E", None), ("red or blue", None), ("", None),
])
def test_mc(prediction, letter):
    g = grade(MC, prediction)
    assert g.parsed == letter and g.correct == (letter == "B")
    assert score_answer(MC, prediction) == float(letter == "B")


@pytest.mark.parametrize("prediction, said", [
    ("no", "no"), ("No.", "no"), ("NO, there is not.", "no"), ("nope", "no"), ("Yes", "yes"),
    ("I think so, yes.", "yes"), ("maybe", None), ("well, yes and no", None),
])
def test_yesno(prediction, said):
    assert grade(YN, prediction).parsed == said
    assert score_answer(YN, prediction) == float(said == "no")


@pytest.mark.parametrize("text, normal", [
    ("Two", "2"), ("the two birds.", "2 birds"), ("A Dog!", "dog"), ("don't", "dont"), ("Don’t", "dont"),
    ("1,000", "1000"), ("2.5 m", "2.5 m"), ("an apple, the pear", "apple pear"), ("none", "0"),
])
def test_normalize_short(text, normal):
    assert normalize_short(text) == normal


def test_short():
    assert score_answer(SHORT, "2") == 1.0 and score_answer(SHORT, "Two.") == 1.0
    assert score_answer(SHORT, "two birds") == 0.0  # exact match after normalisation, as in VQA
    assert score_answer(QAItem("i", "Q?", "short", "doesn't"), "doesnt") == 1.0


def test_read_box():
    assert read_box("[0.2, 0.3, 0.6, 0.7]") == (0.2, 0.3, 0.6, 0.7)
    assert read_box("(120,40),(300,200)") == (120, 40, 300, 200)
    assert read_box("x1=12, y1=30, x2=5, y2=40") == (5, 30, 12, 40)  # no digits from "x1"; axes put in order
    assert read_box("at 3, 4") is None


# Hand-worked: answer (0.1, 0.2, 0.5, 0.6), prediction (0.2, 0.3, 0.6, 0.7) as fractions.
# Intersection: x 0.2..0.5 = 0.3, y 0.3..0.6 = 0.3, area 0.09. Areas 0.4*0.4 = 0.16 each.
# Union 0.16 + 0.16 - 0.09 = 0.23. IoU = 0.09 / 0.23 = 0.391304...: wrong at 0.5.
# On the 200x100 image the prediction is pixels (40, 30, 120, 70) and 0-1000 (200, 300, 600, 700).
LOW = 0.09 / 0.23
# Prediction (0.1, 0.2, 0.5, 0.5): intersection 0.4*0.3 = 0.12, union 0.16 + 0.12 - 0.12 = 0.16,
# IoU 0.75: right. Pixels (20, 20, 100, 50); 0-1000 (100, 200, 500, 500).
HIGH = 0.12 / 0.16


@pytest.mark.parametrize("prediction, iou", [
    ("[0.2, 0.3, 0.6, 0.7]", LOW), ("[40, 30, 120, 70]", LOW), ("[200, 300, 600, 700]", LOW),
    ("[0.1, 0.2, 0.5, 0.5]", HIGH), ("[20, 20, 100, 50]", HIGH), ("<box>(100,200),(500,500)</box>", HIGH),
    ("[0.6, 0.7, 0.9, 0.9]", 0.0), ("no idea", 0.0),
])
def test_box_iou_in_three_conventions(prediction, iou):
    g = grade(BOX, prediction, image_size=SIZE)
    assert g.iou == pytest.approx(iou) and g.correct == (iou >= 0.5)
    assert grade(BOX, prediction, image_size=SIZE, iou_threshold=0.35).correct == (iou >= 0.35)


def test_box_conventions_explicit_and_inferred():
    assert infer_coords((0.1, 0.2, 0.5, 0.6)) == "normalized"
    assert infer_coords((40, 30, 120, 70), SIZE) == "pixel"
    assert infer_coords((200, 300, 600, 700), SIZE) == "1000"  # 600 > width 200: cannot be pixels
    assert infer_coords((40, 30, 120, 70)) is None  # pixel or 1000: the image size decides
    # the same answer box given in pixels: (20, 20, 100, 60) on 200x100
    in_pixels = QAItem("img", "Where?", "box", (20, 20, 100, 60), coords="pixel")
    assert grade(in_pixels, "[0.1, 0.2, 0.5, 0.5]", image_size=SIZE).iou == pytest.approx(HIGH)
    # without the image size two boxes of unknown convention compare as they are:
    # intersection 80 x 30 = 2400, union 3200 + 2400 - 2400 = 3200, IoU 0.75
    unknown = QAItem("img", "Where?", "box", (20, 20, 100, 60))
    assert grade(unknown, "[20, 20, 100, 50]").iou == pytest.approx(HIGH)
    assert grade(in_pixels, "[20, 20, 100, 50]", pred_coords="pixel").iou == pytest.approx(HIGH)
    with pytest.raises(ValueError, match="in pixels: pass image_size"):
        grade(in_pixels, "[0.1, 0.2, 0.5, 0.5]")
    with pytest.raises(ValueError, match="pixels or 0-1000 coordinates without the image size"):
        grade(BOX, "[20, 20, 100, 50]")
    # a 0-1000 answer that fits inside a large image reads as pixels unless told otherwise.
    # On 2000x1000, pixels (100, 200, 500, 600) are (0.05, 0.2, 0.25, 0.6): intersection
    # 0.15 x 0.4 = 0.06, union 0.16 + 0.08 - 0.06 = 0.18, IoU 1/3. As 0-1000 it is the answer box.
    big = (2000, 1000)
    assert grade(BOX, "[100, 200, 500, 600]", image_size=big).iou == pytest.approx(1 / 3)
    assert grade(BOX, "[100, 200, 500, 600]", image_size=big, pred_coords="1000").iou == pytest.approx(1.0)
    assert box_iou((0, 0, 1, 1), (0, 0, 500, 500), b_coords="1000") == pytest.approx(0.25)


def test_mc_from_probs():
    letter, probs, p_correct = mc_from_probs(MC, [0.1, 0.3, 0.1])
    assert letter == "B" and probs == pytest.approx([0.2, 0.6, 0.2]) and p_correct == pytest.approx(0.6)
    assert mc_from_probs(YN, [0.2, 0.6]) == ("No", pytest.approx([0.25, 0.75]), pytest.approx(0.75))
    assert mc_from_probs(MC, [0, 0, 0]) == (None, pytest.approx([1 / 3] * 3), pytest.approx(1 / 3))
    with pytest.raises(ValueError, match="2 probabilities for 3 options"):
        mc_from_probs(MC, [0.5, 0.5])
    with pytest.raises(ValueError, match="non-negative"):
        mc_from_probs(MC, [0.5, -0.1, 0.2])
    with pytest.raises(ValueError, match="no options"):
        mc_from_probs(SHORT, [1.0])


def test_parse_item_direct():
    item = parse_item({"image_id": 7, "question": "Q?", "type": "mc", "choices": ["x", "y"], "answer": "b"})
    assert item.image_id == "7" and item.answer == "B" and item.id == ""
