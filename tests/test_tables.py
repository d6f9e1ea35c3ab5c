"""The shared helpers: accuracy per category, and the one text-table layout."""

import pytest

from caprecon.core.tables import format_table
from caprecon.metrics.categories import CategoryTally


def test_category_tally_weighs_questions_and_categories_apart():
    tally = CategoryTally()
    for correct in (1, 1, 0, 1):
        tally.add("spatial", correct)
    tally.add("ocr", 0)
    assert tally.accuracy("spatial") == 0.75 and tally.accuracy("ocr") == 0.0 and tally.accuracy("math") is None
    assert tally.overall == pytest.approx(3 / 5)  # over questions
    assert tally.mean_over_categories() == pytest.approx((0.75 + 0.0) / 2)  # every category alike
    assert tally.fields("turing") == {"turing": 0.6, "turing_n": 5, "turing/spatial": 0.75, "turing_n/spatial": 4,
                                      "turing/ocr": 0.0, "turing_n/ocr": 1}
    assert tally.fields("turing_upper", counts=False) == {"turing_upper": 0.6, "turing_upper/spatial": 0.75,
                                                          "turing_upper/ocr": 0.0}
    # pooling rows: a row's accuracy times its questions; overall-only rows count toward the total only
    pooled = CategoryTally()
    pooled.add("spatial", 0.5 * 4, 4)
    pooled.add(None, 1.0 * 2, 2)
    assert pooled.overall == pytest.approx(4 / 6) and pooled.accuracy("spatial") == 0.5


def test_format_table_aligns_columns():
    text = format_table([["name", "value"], ["a", 1.5], ["longer", None]], right=[1])
    assert text.splitlines() == ["name    value", "a         1.5", "longer"]
    ruled = format_table([["x", "y"], ["1", "22"]], rule=True).splitlines()
    assert ruled == ["x  y", "-  --", "1  22"]
