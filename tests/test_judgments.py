"""Reading human judgments: format detection, each format's fields, and row-level errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from caprecon.data.judgments import (FLICKR8K_CROWDFLOWER, FLICKR8K_EXPERT, PAIRS, SCORES, JudgmentFormatError, load_judgments, load_triples)



def _jsonl(path: Path, records) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


REFS = ["a dog runs", "a brown dog running", "dog on grass"]


def test_expert_rows_keep_every_rating(tmp_path):
    path = _jsonl(
        tmp_path / "expert.jsonl",
        [
            {"image": "d.jpg", "candidate": "a dog", "refs": REFS, "ratings": [1, 2, 2]},
            {"image": "d.jpg", "candidate": "a cat", "refs": REFS, "ratings": [1, 1, 1]},
        ],
    )
    judgments = load_judgments(path)
    assert judgments.format == FLICKR8K_EXPERT and judgments.tau_variant == "c"
    first = judgments.items[0]
    assert first.ratings == (1.0, 2.0, 2.0) and first.caption == "a dog" and first.refs == REFS
    assert (first.id, first.row, first.image_id) == ("1", 1, "d")

    samples = judgments.samples(tmp_path / "imgs")
    assert [s.id for s in samples] == ["1", "2"]
    assert samples[1].image == tmp_path / "imgs" / "d.jpg"
    assert [s.candidate for s in samples] == [0, 1] and {s.image_id for s in samples} == {"d"}


def test_crowdflower_rows(tmp_path):
    path = _jsonl(
        tmp_path / "cf.jsonl",
        [{"image": "d.jpg", "candidate": "a dog", "refs": REFS, "yes_frac": 0.667, "n_yes": 2, "n_no": 1}],
    )
    judgments = load_judgments(path)
    assert judgments.format == FLICKR8K_CROWDFLOWER and judgments.tau_variant == "b"
    assert judgments.items[0].ratings == (0.667,)
    assert judgments.samples()[0].image == tmp_path / "d.jpg"  # default root: the file's folder


def test_generic_csv_scores(tmp_path):
    path = tmp_path / "mine.csv"
    path.write_text("id,image,caption,score,refs\nx1,a.png,a red car,4.5,one ref|another ref\nx2,b.png,a bus,2,\n")
    judgments = load_judgments(path)
    assert judgments.format == SCORES
    assert [j.ratings for j in judgments.items] == [(4.5,), (2.0,)]
    assert judgments.items[0].refs == ["one ref", "another ref"] and judgments.items[1].refs == []
    assert [j.id for j in judgments.items] == ["x1", "x2"]


def test_pairs_in_every_spelling(tmp_path):
    path = _jsonl(
        tmp_path / "pairs.jsonl",
        [
            {"image": "p.jpg", "caption_a": "one", "caption_b": "two", "preference": "A", "category": "HC"},
            {"image": "p.jpg", "caption_a": "one", "caption_b": "two", "preference": "b"},
            {"image": "q.jpg", "caption_a": "one", "caption_b": "two", "preference": 0.5},
            {"image": "q.jpg", "caption_a": "one", "caption_b": "two", "votes_a": 3, "votes_b": 1},
            {"image": "q.jpg", "caption_a": "one", "caption_b": "two", "preference": "tie"},
        ],
    )
    judgments = load_judgments(path)
    assert judgments.format == PAIRS and judgments.pairwise
    assert [p.preference for p in judgments.items] == [1.0, 0.0, 0.5, 0.75, 0.5]
    assert judgments.items[0].category == "HC"
    samples = judgments.samples()
    assert [s.id for s in samples[:4]] == ["1:a", "1:b", "2:a", "2:b"]
    assert [s.caption for s in samples[:2]] == ["one", "two"]


def test_pairs_csv_with_capital_headers(tmp_path):
    path = tmp_path / "pascal.csv"
    path.write_text("Image,Caption_A,Caption_B,Preference\nx.jpg,a cat,a dog,0.2\n")
    [pair] = load_judgments(path).items
    assert (pair.caption_a, pair.caption_b, pair.preference) == ("a cat", "a dog", 0.2)


@pytest.mark.parametrize(
    ("record", "message"),
    [
        ({"image": "a.jpg", "human": 1}, "no caption"),
        ({"caption": "x", "human": 1}, "no image"),
        ({"image": "a.jpg", "caption": "x", "human": "high"}, "'high' is not a number"),
        ({"image": "a.jpg", "caption": "x"}, "cannot tell the judgments format"),
    ],
)
def test_row_errors_name_the_line(tmp_path, record, message):
    good = {"image": "a.jpg", "caption": "fine", "human": 2}
    path = _jsonl(tmp_path / "j.jsonl", [good, record] if "cannot tell" not in message else [record])
    with pytest.raises(JudgmentFormatError, match=message) as info:
        load_judgments(path)
    line = 1 if "cannot tell" in message else 2
    assert f"j.jsonl:{line}:" in str(info.value)


def test_more_errors(tmp_path):
    bad_frac = _jsonl(tmp_path / "cf.jsonl", [{"image": "a.jpg", "candidate": "x", "yes_frac": 1.5}])
    with pytest.raises(JudgmentFormatError, match=r"cf.jsonl:1: yes_frac 1.5 is outside"):
        load_judgments(bad_frac)
    bad_pref = _jsonl(tmp_path / "p.jsonl", [{"image": "a.jpg", "caption_a": "x", "caption_b": "y", "preference": -1}])
    with pytest.raises(JudgmentFormatError, match="fraction of judges preferring A"):
        load_judgments(bad_pref)
    twice = _jsonl(tmp_path / "d.jsonl", [{"id": 7, "image": "a", "caption": "x", "human": 1}] * 2)
    with pytest.raises(JudgmentFormatError, match="id '7' is used by rows 1 and 2"):
        load_judgments(twice)
    empty = tmp_path / "e.jsonl"
    empty.write_text("\n")
    with pytest.raises(JudgmentFormatError, match="no judgments"):
        load_judgments(empty)
    broken = tmp_path / "b.jsonl"
    broken.write_text('{"image": "a", "caption": "x", "human": 1}\n{oops\n')
    with pytest.raises(JudgmentFormatError, match="b.jsonl:2: not valid JSON"):
        load_judgments(broken)
    with pytest.raises(JudgmentFormatError, match="unknown judgments format"):
        load_judgments(broken, "mystery")
    with pytest.raises(JudgmentFormatError, match="unknown judgments file type"):
        load_judgments((tmp_path / "x.xml").touch() or tmp_path / "x.xml")
    with pytest.raises(JudgmentFormatError, match="no `ratings`"):
        load_judgments(_jsonl(tmp_path / "g.jsonl", [{"image": "a", "caption": "x", "human": 1}]), FLICKR8K_EXPERT)


def _flickr8k_originals(tmp_path: Path) -> tuple[Path, Path, Path]:
    tokens = tmp_path / "Flickr8k.token.txt"
    lines = [f"A.jpg#{k}\tcaption {k} of A" for k in range(3)] + [f"B.jpg#{k}\tcaption {k} of B" for k in range(3)]
    tokens.write_text("\n".join(lines) + "\n")
    expert = tmp_path / "ExpertAnnotations.txt"
    expert.write_text("A.jpg\tB.jpg#1\t1\t1\t2\nA.jpg\tA.jpg#0\t4\t4\t4\nB.jpg\tA.jpg#2\t2\t3\t3\n")
    crowd = tmp_path / "CrowdFlowerAnnotations.txt"
    crowd.write_text("A.jpg\tA.jpg#0\t1.0\t3\t0\nA.jpg\tB.jpg#2\t0.333333333333\t1\t2\n")
    return tokens, expert, crowd


def test_original_flickr8k_files(tmp_path):
    tokens, expert, crowd = _flickr8k_originals(tmp_path)
    e = load_judgments(expert, captions=tokens)
    assert e.format == FLICKR8K_EXPERT
    # the row judging A's own caption 0 is dropped, as in the SPICE / CLIPScore protocol
    assert [(j.image, j.caption, j.ratings) for j in e.items] == [
        ("A.jpg", "caption 1 of B", (1.0, 1.0, 2.0)),
        ("B.jpg", "caption 2 of A", (2.0, 3.0, 3.0)),
    ]
    assert e.items[0].refs == ["caption 0 of A", "caption 1 of A", "caption 2 of A"]

    c = load_judgments(crowd, captions=tokens)
    assert c.format == FLICKR8K_CROWDFLOWER
    own, other = c.items
    # CrowdFlower keeps the image's own caption but leaves it out of the references
    assert own.caption == "caption 0 of A" and own.refs == ["caption 1 of A", "caption 2 of A"]
    assert other.ratings == (pytest.approx(1 / 3),)

    with pytest.raises(JudgmentFormatError, match="need the captions file"):
        load_judgments(expert)
    bad = tmp_path / "bad.txt"
    bad.write_text("A.jpg\tC.jpg#0\t1\t1\t1\n")
    with pytest.raises(JudgmentFormatError, match=r"bad.txt:1: caption 'C.jpg#0' is not in"):
        load_judgments(bad, captions=tokens)


def test_triples(tmp_path):
    path = _jsonl(
        tmp_path / "t.jsonl",
        [
            {"image": "i.jpg", "reference": "a red car", "paraphrase": "a car that is red", "perturbed": "a blue car"},
            {"image": "j.jpg", "reference": "r", "paraphrase": "p", "perturbed": "q", "refs": ["r", "s"], "kind": "x"},
        ],
    )
    first, second = load_triples(path)
    assert first.refs == ["a red car"] and first.image_id == "i"
    assert second.refs == ["r", "s"] and second.kind == "x"
    bad = _jsonl(tmp_path / "u.jsonl", [{"image": "i.jpg", "reference": "r", "paraphrase": "p"}])
    with pytest.raises(JudgmentFormatError, match="u.jsonl:1: no perturbed caption"):
        load_triples(bad)


def test_flickr8k_dev_files(flickr_dir):
    expert = load_judgments(flickr_dir / "expert.jsonl")
    assert expert.format == FLICKR8K_EXPERT and len(expert.items) == 747
    assert all(len(j.ratings) == 3 and len(j.refs) == 5 for j in expert.items)
    assert len({j.image_id for j in expert.items}) == 125
    crowd = load_judgments(flickr_dir / "crowdflower.jsonl")
    assert crowd.format == FLICKR8K_CROWDFLOWER and len(crowd.items) == 5910
    assert all(0.0 <= j.ratings[0] <= 1.0 for j in crowd.items)
    sample = expert.samples(flickr_dir / "images")[0]
    assert Path(sample.image).is_file()
