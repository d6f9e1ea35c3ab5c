"""Corpus statistics of BLEU and CIDEr kept row by row, merged from parts: the corpus value of the
whole, as pycocoevalcap computes it over the whole corpus at once. No Java here: the captions are
given already tokenised (lower case, no punctuation), as pycocoevalcap's scorers take them after
its PTB tokenizer; METEOR's statistics (its jar) are tested in tests/test_reference.py."""

from __future__ import annotations

import json
import math

import pytest

from caprecon.metrics.reference_statistics import (CorpusPart, CorpusStatisticsError, bleu_counts, corpus_bleu,
                                                   corpus_value, implementation, merge_parts, ordered_rows,
                                                   parts_from_document, references_identity, statistics_document)

pytest.importorskip("pycocoevalcap")

# (id, candidate, references), tokenised. "tie" is 9 tokens long between references of 10 (first)
# and 8: pycocoevalcap takes the shorter; "short" is short of its references, so the corpus's
# candidates are shorter than its references in all and the brevity penalty applies.
ROWS = [
    ("dog", "a brown dog runs across the grass",
     ["a dog running on grass", "the brown dog runs in a field", "a dog plays outside"]),
    ("tie", "a man rides his bike down a steep hill",
     ["a man riding a bicycle down the hill very fast", "a cyclist rides down a steep hill road"]),
    ("short", "children at the beach",
     ["kids playing on a sandy beach at sunset", "two children build a sandcastle on the beach"]),
    ("cats", "two cats sleep on a sofa", ["a dog running on grass", "a dog plays outside"]),
    ("snow", "a skier jumps high in the air", ["a skier in mid air", "someone skiing jumps off a ramp"]),
]
# no candidate shares a 4-gram with its references: pycocoevalcap's 1e-15 keeps BLEU-4 just above 0
NO_FOUR = [
    ("a", "a dog on the grass", ["a dog running on grass"]),
    ("b", "the man rides a bike", ["a man riding a bike"]),
]
SPLITS = [[0, 3], [1], [2, 4]]  # three parts, not in input order within the whole


def _bleu_scorer(rows):
    from pycocoevalcap.bleu.bleu_scorer import BleuScorer

    scorer = BleuScorer(n=4)
    for _, candidate, refs in rows:
        scorer += (candidate, refs)
    return scorer


def _bleu_part(rows, column="bleu-4"):
    counts = [bleu_counts(cooked) for cooked in _bleu_scorer(rows).ctest]
    return CorpusPart(column, {"pycocoevalcap": "test"}, [(row[0], c) for row, c in zip(rows, counts)])


def _their_corpus_bleu(rows):
    from pycocoevalcap.bleu.bleu import Bleu

    gts = {row_id: refs for row_id, _, refs in rows}
    res = {row_id: [candidate] for row_id, candidate, _ in rows}
    return Bleu(4).compute_score(gts, res, verbose=0)[0]


def test_closest_reference_length_ties_to_the_shorter():
    tie = bleu_counts(_bleu_scorer([ROWS[1]]).ctest[0])
    assert tie["testlen"] == 9 and tie["reflen"] == 8  # 10 and 8 are both 1 away: the shorter
    assert bleu_counts(_bleu_scorer([ROWS[2]]).ctest[0])["reflen"] == 8
    # counted by hand: "a brown dog runs across the grass" against the dog references
    dog = bleu_counts(_bleu_scorer([ROWS[0]]).ctest[0])
    assert dog == {"testlen": 7, "reflen": 7, "guess": [7, 6, 5, 4], "correct": [6, 2, 1, 0]}


def test_corpus_bleu_by_hand():
    # one row: 6 tokens against a reference of 8; 4, 2, 1, 0 of its 6, 5, 4, 3 n-grams match
    counts = {"testlen": 6, "reflen": 8, "guess": [6, 5, 4, 3], "correct": [4, 2, 1, 0]}
    penalty = math.exp(1 - 8 / 6)
    precisions = [4 / 6, 2 / 5, 1 / 4, 1e-15 / 3]  # pycocoevalcap's 1e-15 stands in for no match
    expected = [math.prod(precisions[:n]) ** (1 / n) * penalty for n in range(1, 5)]
    assert corpus_bleu([counts]) == pytest.approx(expected, rel=1e-8)
    # longer than its reference: no penalty; and two rows pool their counts
    longer = {"testlen": 9, "reflen": 8, "guess": [9, 8, 7, 6], "correct": [9, 8, 7, 6]}
    assert corpus_bleu([longer]) == pytest.approx([1.0] * 4, rel=1e-8)
    pooled = corpus_bleu([counts, longer])  # 15 tokens against 16: the penalty again
    precisions = [13 / 15, 10 / 13, 8 / 11, 6 / 9]
    expected = [math.prod(precisions[:n]) ** (1 / n) * math.exp(1 - 16 / 15) for n in range(1, 5)]
    assert pooled == pytest.approx(expected, rel=1e-8)


@pytest.mark.parametrize("rows", [ROWS, NO_FOUR], ids=["rows", "no-4-gram-match"])
def test_merged_parts_give_pycocoevalcaps_corpus_bleu(rows):
    theirs = _their_corpus_bleu(rows)
    splits = SPLITS if rows is ROWS else [[1], [0]]
    for n in range(1, 5):
        parts = [_bleu_part([rows[i] for i in split], f"bleu-{n}") for split in splits]
        merged = merge_parts(parts)
        order = [row[0] for row in rows]
        assert corpus_value(merged, order) == theirs[n - 1], n  # to the last bit
    if rows is ROWS:  # the corpus exercises the brevity penalty
        totals = [sum(c[k] for _, c in _bleu_part(rows).rows) for k in ("testlen", "reflen")]
        assert totals[0] < totals[1]
        assert corpus_value(_bleu_part(rows)) < corpus_value(_bleu_part(rows[:2]))  # a part is not the whole
    else:
        assert 0 < theirs[3] < 1e-3


def test_merged_parts_give_pycocoevalcaps_corpus_cider():
    from pycocoevalcap.cider.cider import Cider

    gts = {row_id: refs for row_id, _, refs in ROWS}
    res = {row_id: [candidate] for row_id, candidate, _ in ROWS}
    mean, scores = Cider().compute_score(gts, res)
    assert len(set(scores)) == len(ROWS)  # the rows' values differ: a median or one part is not the mean
    made = implementation("cider", references_identity(gts.values()))
    parts = [CorpusPart("cider", made, [(ROWS[i][0], float(scores[i])) for i in split]) for split in SPLITS]
    assert corpus_value(merge_parts(parts), [row[0] for row in ROWS]) == pytest.approx(float(mean), abs=1e-12)


def test_cider_parts_of_other_references_do_not_merge():
    ours = implementation("cider", references_identity([r for _, _, r in ROWS]))
    other = implementation("cider", references_identity([r for _, _, r in ROWS[:4]]))
    assert ours["cider_corpus"]["documents"] == 5 and other["cider_corpus"]["documents"] == 4
    with pytest.raises(CorpusStatisticsError, match="cider_corpus"):
        merge_parts([CorpusPart("cider", ours, [("a", 1.0)]), CorpusPart("cider", other, [("b", 2.0)])])


def test_merge_refuses_another_implementation_or_a_row_twice():
    first = CorpusPart("bleu-4", {"pycocoevalcap": "1.2"}, [("a", 1)])
    with pytest.raises(CorpusStatisticsError, match=r"shard1/x\.json.*shard0/x\.json|pycocoevalcap: '1.2' against '1.3'"):
        merge_parts([first, CorpusPart("bleu-4", {"pycocoevalcap": "1.3"}, [("b", 1)])],
                    names=["shard0/x.json", "shard1/x.json"])
    with pytest.raises(CorpusStatisticsError, match="row 'a' is in the bleu-4 statistics of both part 0 and part 1"):
        merge_parts([first, CorpusPart("bleu-4", {"pycocoevalcap": "1.2"}, [("a", 1)])])
    with pytest.raises(CorpusStatisticsError, match="holds cider statistics"):
        merge_parts([first, CorpusPart("cider", {"pycocoevalcap": "1.2"}, [("b", 1.0)])])


def test_the_rows_must_be_those_scored():
    part = CorpusPart("cider", {}, [("a", 1.0), ("b", 3.0)])
    assert ordered_rows(part, ["b", "a"]) == [3.0, 1.0]
    with pytest.raises(CorpusStatisticsError, match="lack row"):
        ordered_rows(part, ["a", "b", "c"])
    with pytest.raises(CorpusStatisticsError, match="hold row.*'b'.*no cider score"):
        ordered_rows(part, ["a"])


def test_document_round_trip_and_damaged_documents():
    parts = {"bleu-4": _bleu_part(ROWS), "cider": CorpusPart("cider", {"x": 1}, [("dog", 0.5)])}
    text = json.dumps(statistics_document(parts), allow_nan=False)
    back = parts_from_document(json.loads(text), "f.json")
    assert back == parts
    good = json.loads(text)

    def refused(edit, match):
        document = json.loads(text)
        edit(document)
        with pytest.raises(CorpusStatisticsError, match=match):
            parts_from_document(document, "f.json")

    refused(lambda d: d.update(format="other"), "f.json is not a caprecon corpus statistics file")
    refused(lambda d: d.update(version=2), "version 2")
    refused(lambda d: d["columns"]["bleu-4"]["rows"][1][1].update(correct=[10, 0, 0, 0]), "row 1 .*'tie'.*correct > guess")
    refused(lambda d: d["columns"]["bleu-4"]["rows"][0][1].update(testlen=True), "testlen and reflen")
    refused(lambda d: d["columns"]["bleu-4"]["rows"][0][1].update(guess=[1, 2]), "guess, 4 whole numbers")
    refused(lambda d: d["columns"]["cider"]["rows"][0].__setitem__(1, -1.0), "finite CIDEr value")
    refused(lambda d: d["columns"].update(rouge=d["columns"]["cider"]), "'rouge' is no column")
    refused(lambda d: d["columns"].update(meteor={"implementation": {}, "rows": [["a", "1.0 x"]]}), "METEOR jar's line")
    assert good["columns"]["bleu-4"]["rows"][0][0] == "dog"
