"""The per-category report: pooling by question counts, the deduplicated upper bound, outputs."""

import csv
import json

import pytest
from PIL import Image

from caprecon.reports.categories import PAPER_ORDER, category_table, radar_chart, write_report


def row(image, captioner, answers, upper, **extra):
    """A turing row from (correct, asked) per category, on the reconstruction and on the original."""
    record = {"id": f"{image}-{captioner}", "image_id": image, "caption": "...", **extra}
    if captioner is not None:
        record["captioner"] = captioner
    for category, (correct, asked) in answers.items():
        record[f"turing/{category}"] = correct / asked
        record[f"turing_n/{category}"] = asked
        record[f"turing_upper/{category}"] = upper[category][0] / asked
    asked = sum(n for _, n in answers.values())
    record["turing"] = sum(c for c, _ in answers.values()) / asked
    record["turing_upper"] = sum(c for c, _ in upper.values()) / asked
    record["turing_n"] = asked
    return record


# The bank: image i1 asks 2 spatial + 1 ocr questions, image i2 asks 1 spatial + 3 math.
# On the original images the judge gets i1: spatial 1/2, ocr 1/1; i2: spatial 1/1, math 2/3.
UPPER_I1 = {"spatial": (1, 2), "ocr": (1, 1)}
UPPER_I2 = {"spatial": (1, 1), "math": (2, 3)}


def two_by_two(captioner_key="captioner"):
    rows = [
        row("i1", "A", {"spatial": (1, 2), "ocr": (1, 1)}, UPPER_I1),
        row("i2", "A", {"spatial": (0, 1), "math": (2, 3)}, UPPER_I2),
        row("i1", "B", {"spatial": (2, 2), "ocr": (0, 1)}, UPPER_I1),
        row("i2", "B", {"spatial": (1, 1), "math": (0, 3)}, UPPER_I2),
    ]
    if captioner_key != "captioner":
        for r in rows:
            r[captioner_key] = r.pop("captioner")
    return rows


def test_categories_pool_correct_answers_over_questions():
    table = category_table(two_by_two())
    assert table.captioners == ["A", "B"]
    assert table.categories == ["spatial", "math", "ocr"]  # the paper's order, not alphabetical
    a, b, upper = table.rows["A"], table.rows["B"], table.rows["upper bound"]
    # A spatial: (1 + 0) correct of (2 + 1) asked = 1/3; the mean of the rows' 0.5 and 0.0 would be 1/4
    assert a["spatial"] == pytest.approx(1 / 3)
    assert a["ocr"] == pytest.approx(1.0)        # 1 of 1
    assert a["math"] == pytest.approx(2 / 3)     # 2 of 3
    assert a["mean over questions"] == pytest.approx(4 / 7)       # (1 + 1 + 0 + 2) of 7 questions
    assert a["mean over categories"] == pytest.approx(2 / 3)      # (1/3 + 1 + 2/3) / 3
    # B spatial: (2 + 1) of (2 + 1) = 1; ocr 0 of 1; math 0 of 3
    assert (b["spatial"], b["ocr"], b["math"]) == pytest.approx((1.0, 0.0, 0.0))
    assert b["mean over questions"] == pytest.approx(3 / 7)
    assert b["mean over categories"] == pytest.approx(1 / 3)
    # upper: spatial (1 + 1) of (2 + 1) = 2/3; ocr 1 of 1; math 2 of 3; all: 5 of 7
    assert (upper["spatial"], upper["ocr"], upper["math"]) == pytest.approx((2 / 3, 1.0, 2 / 3))
    assert upper["mean over questions"] == pytest.approx(5 / 7)
    assert upper["mean over categories"] == pytest.approx(7 / 9)  # (2/3 + 1 + 2/3) / 3
    assert table.questions == {"spatial": 3, "math": 3, "ocr": 1}  # each image's bank once, not per captioner


def test_upper_bound_counts_each_image_once():
    # a third captioner on i1 alone: counting i1 once per row would give upper spatial 5 of 8
    records = [*two_by_two(), row("i1", "C", {"spatial": (0, 2), "ocr": (0, 1)}, UPPER_I1)]
    table = category_table(records)
    assert table.rows["upper bound"]["spatial"] == pytest.approx(2 / 3)
    assert table.rows["upper bound"]["mean over questions"] == pytest.approx(5 / 7)
    assert table.rows["C"]["spatial"] == 0.0
    assert table.rows["C"]["math"] is None and table.rows["C"]["mean over categories"] == 0.0
    assert table.questions["spatial"] == 3


def test_rows_with_errors_are_skipped():
    broken = {"id": "z", "image_id": "i3", "captioner": "A", "error": "turing: TimeoutError: judge timed out"}
    only_broken = {"id": "x", "image_id": "i4", "captioner": "D", "error": "unreadable image"}
    unscored = {"id": "y", "image_id": "i5", "captioner": "E", "recon": 0.7}  # another metric only
    table = category_table([*two_by_two(), broken, only_broken, unscored])
    assert table.captioners == ["A", "B"]
    assert table.rows == category_table(two_by_two()).rows
    assert table.questions["spatial"] == 3


def test_a_row_failed_by_another_metric_still_counts():
    # recon failed on this row, turing did not: the turing table must include it
    other = row("i3", "C", {"spatial": (1, 4)}, {"spatial": (3, 4)}, error="recon: OSError: disk full")
    table = category_table([*two_by_two(), other])
    assert table.captioners == ["A", "B", "C"]
    assert table.rows["C"]["spatial"] == pytest.approx(0.25)
    assert table.questions["spatial"] == 7


def test_without_a_captioner_column_all_rows_form_one_group():
    table = category_table(two_by_two(captioner_key="none"))
    assert table.captioners == ["all"]
    # spatial (1 + 0 + 2 + 1) of (2 + 1 + 2 + 1); ocr (1 + 0) of 2; math (2 + 0) of 6
    assert table.rows["all"]["spatial"] == pytest.approx(4 / 6)
    assert table.rows["all"]["ocr"] == pytest.approx(1 / 2)
    assert table.rows["all"]["math"] == pytest.approx(1 / 3)
    assert table.rows["upper bound"]["spatial"] == pytest.approx(2 / 3)


def test_model_column_names_the_captioner_too():
    records = two_by_two(captioner_key="model")
    assert category_table(records).captioners == ["A", "B"]
    assert category_table(records, group_by="captioner").captioners == ["all"]


def test_reads_a_run_folder(tmp_path):
    (tmp_path / "scores.jsonl").write_text("".join(json.dumps(r) + "\n" for r in two_by_two()))
    assert category_table(tmp_path).rows == category_table(two_by_two()).rows
    with pytest.raises(ValueError, match="turing"):
        category_table([{"id": "1", "recon": 0.5}])


def test_markdown_csv_and_text(tmp_path):
    table = category_table(two_by_two())
    lines = table.to_markdown().splitlines()
    assert lines[0] == "| captioner | spatial | math | ocr | mean over questions | mean over categories |"
    assert lines[2:] == [
        "| A | 33.33 | 66.67 | 100.00 | 57.14 | 66.67 |",
        "| B | 100.00 | 0.00 | 0.00 | 42.86 | 33.33 |",
        "| upper bound | 66.67 | 66.67 | 100.00 | 71.43 | 77.78 |",
    ]
    with table.to_csv(tmp_path / "t.csv").open() as f:
        grid = list(csv.reader(f))
    assert grid[0][0] == "captioner" and [r[0] for r in grid[1:]] == ["A", "B", "upper bound"]
    assert grid[1][1:] == ["33.33", "66.67", "100.00", "57.14", "66.67"]
    text = table.to_text().splitlines()
    # aligned: every line but the last (whose empty question count is dropped) ends at one column
    assert len({len(line) for line in text[:-1]}) == 1 and len(text[-1]) < len(text[0])
    assert text[1].split() == ["spatial", "33.33", "100.00", "66.67", "3"]


def many_captioners(n_captioners, categories):
    records = []
    for image in range(6):
        for k in range(n_captioners):
            answers = {c: ((image + k + j) % 4, 3 + j % 2) for j, c in enumerate(categories)}
            answers = {c: (min(ok, asked), asked) for c, (ok, asked) in answers.items()}
            upper = {c: (asked - 1, asked) for c, (_, asked) in answers.items()}
            records.append(row(f"img{image}", f"captioner-{k}", answers, upper))
    return records


def test_write_report_writes_the_three_files(tmp_path):
    pytest.importorskip("matplotlib")
    paths = write_report(many_captioners(4, PAPER_ORDER), tmp_path / "report")
    assert {p.name for p in paths.values()} == {"categories.md", "categories.csv", "radar.png"}
    assert len(paths["markdown"].read_text().splitlines()) == 2 + 4 + 1  # header, rule, captioners, upper bound
    with Image.open(paths["radar"]) as image:
        assert image.format == "PNG"
        assert image.width > 800 and image.height > 600
        assert len(image.convert("L").getcolors(maxcolors=1 << 16)) > 50  # drawn, not a blank canvas
    assert paths["radar"].stat().st_size > 30_000


def test_radar_handles_many_captioners_and_missing_cells(tmp_path):
    pytest.importorskip("matplotlib")
    table = category_table([*many_captioners(12, PAPER_ORDER), row("x", "late", {"ocr": (1, 2)}, {"ocr": (2, 2)})])
    assert table.rows["late"]["spatial"] is None
    path = radar_chart(table, tmp_path / "radar.png", title="twelve captioners")
    with Image.open(path) as image:
        assert image.format == "PNG"
