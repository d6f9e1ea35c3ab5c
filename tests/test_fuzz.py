"""Loaders and answer parsers on arbitrary input: they return a value or raise their own,
named error — never anything else (hypothesis, bounded so the default suite stays fast)."""

import json
import math
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from caprecon.data.qa import LETTERS, QABankError, parse_item
from caprecon.data.loaders import load_samples
from caprecon.data.images import LoadedSample, open_image
from caprecon.data.samples import SampleError, SampleFormatError
from caprecon.metrics.grading import grade, read_box, read_choice, read_yes_no

FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.floats(allow_nan=False) | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6)
field_names = st.sampled_from(["id", "image", "image_path", "file_name", "caption", "text", "refs", "image_id",
                               "candidate_index", "references", "other"]) | st.text(max_size=6)
records = st.dictionaries(field_names, json_values, max_size=6)


def _load_and_open(name: str, data: bytes) -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / name
        path.write_bytes(data)
        try:
            samples = load_samples(path)
        except SampleFormatError:
            return
        for sample in samples:
            try:
                assert isinstance(open_image(sample), LoadedSample)
            except SampleError as exc:
                assert exc.reason and str(exc)


@FUZZ
@given(st.sampled_from(["in.jsonl", "in.csv", "in.tsv", "in.json"]), st.binary(max_size=300))
def test_any_bytes_load_or_fail_with_a_format_error(name, data):
    _load_and_open(name, data)


@FUZZ
@given(st.lists(records, max_size=5))
def test_any_records_load_and_each_row_opens_or_is_a_row_error(rows):
    _load_and_open("in.jsonl", "\n".join(json.dumps(r) for r in rows).encode())
    _load_and_open("in.json", json.dumps(rows).encode())


@FUZZ
@given(st.lists(st.dictionaries(st.sampled_from(["id", "image", "caption", "refs", "x"]),
                                st.text(alphabet=st.characters(blacklist_categories=["Cs"]), max_size=10),
                                max_size=4), max_size=5))
def test_any_csv_table_loads_or_fails_with_a_format_error(rows):
    import csv
    import io

    names = sorted({k for r in rows for k in r}) or ["caption"]
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=names)
    writer.writeheader()
    writer.writerows(rows)
    _load_and_open("in.csv", buf.getvalue().encode("utf-8"))


@FUZZ
@given(st.text(max_size=60), st.lists(st.text(min_size=1, max_size=8), min_size=2, max_size=5, unique=True))
def test_read_choice_returns_a_letter_of_the_options_or_none(prediction, choices):
    picked = read_choice(prediction, choices)
    assert picked is None or picked in LETTERS[: len(choices)]


@FUZZ
@given(st.text(max_size=60))
def test_read_yes_no_returns_yes_no_or_none(prediction):
    assert read_yes_no(prediction) in (None, "yes", "no")


@FUZZ
@given(st.text(alphabet=st.sampled_from("0123456789.,-[]() xyab"), max_size=60))
def test_read_box_returns_an_ordered_box_or_none(prediction):
    box = read_box(prediction)
    if box is not None:
        x1, y1, x2, y2 = box
        assert x1 <= x2 and y1 <= y2 and all(math.isfinite(v) for v in box)


@FUZZ
@given(records, st.text(max_size=40))
def test_any_bank_record_parses_or_names_its_problem_and_any_answer_grades(record, prediction):
    try:
        item = parse_item(record, "bank.jsonl:1")
    except QABankError as exc:
        assert str(exc).startswith("bank.jsonl:1: ")
        return
    result = grade(item, prediction, image_size=(64, 48))
    assert isinstance(result.correct, bool)


@FUZZ
@given(st.sampled_from(["mc", "yesno", "short", "box"]), st.text(max_size=40))
def test_valid_items_grade_any_answer(kind, prediction):
    record = {"image_id": "i", "question": "q?", "type": kind,
              "answer": {"mc": "B", "yesno": "no", "short": "two", "box": [0.1, 0.2, 0.5, 0.6]}[kind]}
    if kind == "mc":
        record["choices"] = ["red", "blue", "green"]
    result = grade(parse_item(record), prediction, image_size=(64, 48))
    assert isinstance(result.correct, bool)


@FUZZ
@given(st.one_of(st.text(max_size=80), json_values.map(json.dumps).flatmap(
    lambda text: st.integers(0, len(text)).map(lambda cut: "Sure: ```json\n" + text[:cut]))))
def test_model_replies_parse_or_raise_reply_error(reply):
    # json_repair sits behind parse_json_reply: whatever it makes of a reply, the caller sees
    # a strict value, a non-empty repaired object or list, or ReplyError
    from caprecon.core.replies import ReplyError, parse_json_reply

    try:
        value, repaired = parse_json_reply(reply)
    except ReplyError:
        return
    assert not repaired or (isinstance(value, (dict, list)) and value)
    json.dumps(value)  # plain JSON data
