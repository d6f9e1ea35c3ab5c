"""Benchmark files received from others, held to what their rows may ask: images inside the root
each loader was given, fields of the types the format has, and files whose statistics would be
blanks or ±1 by construction refused with a sentence that says so."""

from __future__ import annotations

import csv
import math
import json
import os
from pathlib import Path

import pytest
from PIL import Image

from caprecon.apps.metabench import get_benchmark
from caprecon.data.images import path_refusal, read_image
from caprecon.data.judgments import JudgmentFormatError
from caprecon.data.samples import SampleError


def _json(path: Path, data) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def _csv(path: Path, header, rows) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(header)
        writer.writerows(rows)
    return path


# ----------------------------------------------------------------------------- images stay inside their root

ESCAPE = "../outside/secret.png"  # from the images folder `data/images`: data/outside/secret.png


def _caparena(data: Path, name: str) -> Path:
    return _json(data / "caparena_annots_eval.json", [
        {"img": name, "source1": "A", "source2": "B", "caption1": "a cat", "caption2": "a dog", "ref": "r",
         "winner": "A", "cluster": "level 1"}])  # fmt: skip


def _expert(benchmark: str):
    def write(data: Path, name: str) -> Path:
        # EXPERT joins `{imgid}.jpg` to `Nebula/` (or `Polaris/`): two levels up leaves the images folder
        imgid = "../../outside/secret" if name == ESCAPE else Path(name).stem
        return _json(data / f"{benchmark}_test.json", [{"imgid": imgid, "mt": "a cat", "refs": ["r"], "score": 0.5}])
    return write


def _pascal(data: Path, name: str) -> Path:
    return _json(data / "pascal50s.json", {"HC": [{"image": name, "captions": ["a", "b"], "label": 0,
                                                   "references": ["r"]}]})  # fmt: skip


def _flickr(data: Path, name: str) -> Path:
    return _json(data / "flickr8k.json", {"1": {"image_path": name, "ground_truth": ["a reference"],
                                                "human_judgement": [{"caption": "a cat", "rating": 2}]}})  # fmt: skip


def _composite(data: Path, name: str) -> Path:
    name = "../" + name if name == ESCAPE else name  # joined to `flickr8k/`, as FLEUR's code does
    return _json(data / "composite.json", {"flickr8k": [{"image": name, "caption": "a cat", "human": 4,
                                                         "refs": ["a reference"]}]})  # fmt: skip


def _foil(data: Path, name: str) -> Path:
    return _json(data / "foilv1.0_test_2017.json", {
        "images": [{"id": 1, "file_name": name}],
        "annotations": [{"id": 7, "image_id": 1, "caption": "a dog on a sofa", "foil": False},
                        {"id": 8, "image_id": 1, "caption": "a brown dog on a sofa", "foil": False},
                        {"id": 7, "image_id": 1, "caption": "a cat on a sofa", "foil": True}]})  # fmt: skip


def _thumb(data: Path, name: str) -> Path:
    (data / "mscoco").mkdir(parents=True, exist_ok=True)
    (data / "mscoco" / "mscoco_references.json").write_text(json.dumps({"seg_id": 1, "refs": ["r"]}) + "\n")
    (data / "mscoco" / "mscoco_THumB-1.0.jsonl").write_text(json.dumps(
        {"seg_id": 1, "image": name, "hyp": "a cat", "SYS": "S1", "P": 4.0, "R": 4.0, "human_score": 4.0}) + "\n")
    return data / "mscoco"


def _polaris(data: Path, name: str) -> Path:
    return _csv(data / "polaris_test.csv", ["mt", "refs", "score", "imgid"], [["a cat", "['r']", 0.5, name]])


def _longcap(data: Path, name: str) -> Path:
    _csv(data / "desc_dci_test.csv", ["mt", "refs", "score", "imgid"], [["a cat", "['r']", 3.0, name]])
    return data


def _captionevalkit(data: Path, name: str) -> Path:
    # its CSV names no path: the image is found in nebula/images/, so a link there is the way out
    (data / "nebula" / "images").mkdir(parents=True, exist_ok=True)
    link = data / "nebula" / "images" / "secret.png"
    link.unlink(missing_ok=True)
    if name == ESCAPE:
        os.symlink((data / "images" / name).resolve(), link)
    else:
        Image.new("RGB", (8, 8)).save(link)
    _csv(data / "nebula" / "nebula_test.csv", ["imgid", "mt", "refs", "score"], [["secret", "a cat", "['r']", 0.5]])
    return data / "nebula"


def _hub_table(data: Path, name: str) -> Path:
    # a Hugging Face copy (Nebula's): a parquet shard whose stored image goes by the name it was stored under
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    (data / "Nebula" / "data").mkdir(parents=True, exist_ok=True)
    kind = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    pq.write_table(pa.table({"file_name": [name], "image": pa.array([{"bytes": b"x", "path": name}], type=kind),
                             "refs": [["r"]], "mt": ["a cat"], "human_score": [0.5]}),
                   data / "Nebula" / "data" / "test-00000-of-00001.parquet")  # fmt: skip
    return data / "Nebula"


LOADERS = {"caparena": _caparena, "nebula-raw": _expert("nebula"), "polaris": _expert("polaris"),
           "pascal50s": _pascal, "flickr8k-expert": _flickr, "composite": _composite, "foil-polos-allref": _foil,
           "thumb": _thumb, "longcaparena-testb-desc": _longcap}  # fmt: skip


OTHER_COPIES = {"polaris-csv": ("polaris", _polaris), "nebula-captionevalkit": ("nebula-raw", _captionevalkit),
                "nebula-hub": ("nebula-raw", _hub_table)}


@pytest.mark.parametrize("benchmark", [*LOADERS, *OTHER_COPIES])
def test_every_loader_refuses_an_image_outside_its_root(tmp_path, benchmark):
    name, write = OTHER_COPIES.get(benchmark) or (benchmark, LOADERS[benchmark])
    images = tmp_path / "data" / "images"
    (images / "Nebula").mkdir(parents=True)
    (images / "Polaris").mkdir(parents=True)
    (tmp_path / "data" / "outside").mkdir()
    Image.new("RGB", (8, 8), (200, 0, 0)).save(tmp_path / "data" / "outside" / "secret.png")
    Image.new("RGB", (8, 8), (200, 0, 0)).save(tmp_path / "data" / "outside" / "secret.jpg")
    Image.new("RGB", (8, 8), (0, 0, 200)).save(images / "inside.png")
    given = images if benchmark != "nebula-captionevalkit" else None  # CaptionEvalKit's images sit beside its CSV

    judgments = get_benchmark(name).load(str(write(tmp_path / "data", ESCAPE)))
    samples = judgments.samples(given)
    option = "--images" if given else "the judgments' folder"
    for sample in samples:
        assert f"lies outside {option}" in path_refusal(sample)
        with pytest.raises(SampleError, match=f"outside {option}"):
            read_image(sample)

    for folder, inside in (("Nebula", "inside.jpg"), ("Polaris", "inside.jpg"), ("flickr8k", "inside.png")):
        (images / folder).mkdir(exist_ok=True)  # the folders EXPERT and FLEUR join the names to
        Image.new("RGB", (8, 8), (0, 0, 200)).save(images / folder / inside)
    inside = get_benchmark(name).load(str(write(tmp_path / "data", "inside.png"))).samples(given)
    for sample in inside:  # the same file naming an image inside its root is read
        assert path_refusal(sample) is None
        assert read_image(sample).image.size == (8, 8)


def test_a_judgments_file_of_ones_own_is_confined_only_under_images(tmp_path):
    from caprecon.data.judgments import load_judgments

    Image.new("RGB", (8, 8)).save(tmp_path / "elsewhere.png")
    path = tmp_path / "mine" / "judged.jsonl"
    path.parent.mkdir()
    path.write_text(json.dumps({"image": str(tmp_path / "elsewhere.png"), "caption": "a cat", "human": 3}) + "\n")
    (sample,) = load_judgments(path).samples()
    assert path_refusal(sample) is None  # as `score` reads its input without --image-root
    (sample,) = load_judgments(path).samples(tmp_path / "mine")
    assert "lies outside --images" in path_refusal(sample)


def test_meta_names_the_refused_row_and_scores_the_rest(tmp_path, capsys):
    from caprecon.cli.meta import main as meta_main

    images = tmp_path / "images"
    images.mkdir()
    (tmp_path / "outside").mkdir()
    Image.new("RGB", (8, 8)).save(tmp_path / "outside" / "secret.png")
    Image.new("RGB", (8, 8)).save(images / "a.png")
    battles = [{"img": img, "source1": "A", "source2": "B", "caption1": f"a cat {k}", "caption2": f"a dog {k}",
                "ref": "r", "winner": "A", "cluster": "level 1"} for k, img in enumerate(["../outside/secret.png", "a.png"])]
    _json(tmp_path / "caparena_annots_eval.json", battles)
    seen = []

    def score(name, samples):
        seen.extend(s.image for s in samples)
        return [1.0] * len(samples)

    from caprecon.apps.metabench.meta import meta

    results = meta(benchmark="caparena", data=tmp_path, images=images, metrics=["m"], out=tmp_path / "out",
                   score_metric=score, scorable={"m"}, human_ranking="recomputed", bootstrap=0)
    assert all("secret" not in str(image) for image in seen) and len(seen) == 2  # battle 2's captions only
    assert any("m: 2 row(s) refused, left out as row errors (row 1: image" in n and "lies outside --images" in n
               for n in results.notes), results.notes


# ----------------------------------------------------------------------------- CapArena files


def _battle(img, a, b, winner, caption1=None, caption2=None):
    return {"img": img, "source1": a, "source2": b, "caption1": caption1 or f"{a} on {img}",
            "caption2": caption2 or f"{b} on {img}", "ref": "r", "winner": winner, "cluster": "level 1"}


def test_caparena_winner_outside_the_labels_is_an_error_naming_the_battle(tmp_path):
    path = _json(tmp_path / "caparena_annots_eval.json", [_battle("1.jpg", "A", "B", "A"),
                                                          _battle("2.jpg", "A", "B", "Tie")])
    with pytest.raises(JudgmentFormatError, match=r"\[1\]: winner 'Tie' is neither source1 \('A'\), source2 \('B'\) "
                                                  r"nor one of equal, skip, bad"):
        get_benchmark("caparena").load(str(path))
    for label in ("equal", "skip", "bad", "B"):  # the labels the file has
        _json(path, [_battle("1.jpg", "A", "B", label)])
        assert get_benchmark("caparena").load(str(path)).items[0].verdict == label


def test_caparena_drops_a_model_against_itself_and_repeated_battles_and_says_so(tmp_path):
    path = _json(tmp_path / "caparena_annots_eval.json", [
        _battle("1.jpg", "A", "B", "A"), _battle("2.jpg", "A", "A", "equal"), _battle("3.jpg", "B", "C", "C"),
        _battle("1.jpg", "A", "B", "B"),  # the first battle again, judged otherwise
        _battle("1.jpg", "B", "A", "A", caption1="B on 1.jpg", caption2="A on 1.jpg"),  # and in the other order
        _battle("1.jpg", "A", "B", "A", caption1="another caption of A")])  # fmt: skip
    judgments = get_benchmark("caparena").load(str(path))
    assert [it.row for it in judgments.items] == [1, 3, 6]
    assert judgments.notes == [f"{path}: 1 battle(s) of a model against itself dropped ([1])",
                               f"{path}: 2 repeated battle(s) dropped ([3] repeats [0], [4] repeats [0])"]
    _json(path, [_battle("2.jpg", "A", "A", "equal")])
    with pytest.raises(JudgmentFormatError, match=r"no battles \(.*1 battle\(s\) of a model against itself"):
        get_benchmark("caparena").load(str(path))


def _arena_meta(tmp_path, battles, *extra):
    from caprecon.cli.meta import main as meta_main

    folder = tmp_path / f"arena{len(list(tmp_path.iterdir()))}"
    _json(folder / "caparena_annots_eval.json", battles)
    return meta_main(["--benchmark", "caparena", "--data", str(folder), "--metric", "m", "--scores",
                      str(_scores(folder, battles)), "--human-ranking", "recomputed", "--bootstrap", "0",
                      "--out", str(folder / "out"), *extra])  # fmt: skip


def _scores(folder: Path, battles) -> Path:
    path = folder / "scores.csv"
    rows = [[f"{k + 1}:{side}", 0.1 * k + (0.5 if side == "a" else 0.0)] for k in range(len(battles)) for side in "ab"]
    return _csv(path, ["id", "m"], rows)


def test_caparena_files_without_a_statistic_say_so(tmp_path, capsys):
    every_human = [_battle(f"{k}.jpg", "A", "human", "human") for k in range(3)]
    assert _arena_meta(tmp_path, every_human) == 2
    assert "every battle involves the human caption, which CapArena's protocol leaves out" in capsys.readouterr().err

    only_ties = [_battle("1.jpg", "A", "B", "equal"), _battle("2.jpg", "B", "C", "skip"),
                 _battle("3.jpg", "A", "C", "bad"), _battle("4.jpg", "A", "human", "human")]
    assert _arena_meta(tmp_path, only_ties) == 2
    assert "people called every battle without the human caption a tie" in capsys.readouterr().err

    two_models = [_battle("1.jpg", "A", "B", "A"), _battle("2.jpg", "A", "B", "B"), _battle("3.jpg", "A", "human", "A")]
    assert _arena_meta(tmp_path, two_models, "--model-level") == 2
    assert ("only 2 model(s) besides the human caption (A, B): a correlation of their rankings is ±1 by "
            "construction; --model-level needs 3 or more") in capsys.readouterr().err
    assert _arena_meta(tmp_path, two_models) == 0  # the caption-level agreement stands: battle 1 agrees, 2 not
    out = capsys.readouterr().out
    assert "so the model-level agreement is left out" in out
    assert "model level: every battle without the human caption; models against people's Elo of the file" in out
    row = next(csv.DictReader((tmp_path / "arena3" / "out" / "meta.csv").open()))
    assert row["value"] == "0.5" and "spearman_model" not in row


# ----------------------------------------------------------------------------- EXPERT and Pascal-50S field types

_ENTRY = {"imgid": "a", "mt": "a cat", "refs": ["a cat on a mat"], "score": 0.5}


@pytest.mark.parametrize("field, value, message", [
    ("mt", 3, r"\[1\]: mt must be text, not the int 3"),
    ("refs", "a cat|a mat", r"\[1\]: refs must be a list of captions, got 'a cat\|a mat'"),
    ("refs", ["a cat", 7], r"\[1\]: each of refs must be text, not the int 7"),
    ("score", float("nan"), r"\[1\]: score nan is not a finite number"),
    ("score", "inf", r"\[1\]: score 'inf' is not a finite number"),
    ("score", True, r"\[1\]: score True is not a finite number"),
    ("imgid", ["a"], r"\[1\]: imgid must be an image's name"),
])  # fmt: skip
def test_expert_rows_of_the_wrong_type_are_refused_naming_the_row(tmp_path, field, value, message):
    path = tmp_path / "nebula_test.json"
    path.write_text(json.dumps([_ENTRY, {**_ENTRY, field: value}]))  # json writes NaN as NaN, as Python reads it
    with pytest.raises(JudgmentFormatError, match=message):
        get_benchmark("nebula-raw").load(str(path))
    path.write_text(json.dumps([_ENTRY, _ENTRY]))
    assert [it.caption for it in get_benchmark("nebula-raw").load(str(path)).items] == ["a cat", "a cat"]


def test_an_empty_expert_list_says_it_is_empty(tmp_path):
    path = tmp_path / "nebula_test.json"
    path.write_text("[]")
    for name in ("nebula-raw", "polaris"):
        with pytest.raises(JudgmentFormatError, match=r"nebula_test.json: the list is empty: no rated captions"):
            get_benchmark(name).load(str(path))


_PAIR = {"image": "VOC2012/a.jpg", "captions": ["a plane", "an airplane"], "label": 0, "references": ["a jet"]}


@pytest.mark.parametrize("data, message", [
    ({"HC": [{**_PAIR, "references": "a jet|a plane"}]}, r"HC\[0\]: references must be a list of captions"),
    ({"HC": [_PAIR], "XX": [_PAIR]}, r"unknown category 'XX'; Pascal-50S has HC, HI, HM, MM"),
    ({"HC": [{**_PAIR, "preference": float("nan")}]}, r"HC\[0\]: preference nan is not a finite number"),
    ({"HC": [{**_PAIR, "captions": ["a plane", 5]}]}, r"HC\[0\]: the second caption must be text"),
    ({"HC": [{**_PAIR, "label": True}]}, r"HC\[0\]: `label` must be 0 or 1"),
    ({"HC": ["a pair"]}, r"HC\[0\]: a pair is an object"),
    ({"HC": {"0": _PAIR}}, r"HC: must be a list of pairs, not dict"),
    ({"HC": [{**_PAIR, "image": 42}]}, r"HC\[0\]: `image` must be a file name"),
])  # fmt: skip
def test_pascal_rows_of_the_wrong_type_are_refused_naming_the_row(tmp_path, data, message):
    path = _json(tmp_path / "pascal50s.json", data)
    with pytest.raises(JudgmentFormatError, match=message):
        get_benchmark("pascal50s").load(str(path))
    _json(path, {"HC": [_PAIR], "MM": [{**_PAIR, "label": "1"}]})
    assert [it.preference for it in get_benchmark("pascal50s").load(str(path)).items] == [1.0, 0.0]


# ----------------------------------------------------------------------------- meta verify


def test_meta_verify_refuses_fit_options(tmp_path, capsys):
    from caprecon.cli.meta import main as meta_main

    path = _json(tmp_path / "pascal50s.json", {"HC": [_PAIR]})
    for action, extra in ((["verify"], ["--fit"]), ([], ["--fit", "--save", str(tmp_path / "f.json")])):
        assert meta_main([*action, "--benchmark", "pascal50s", "--data", str(path), "--out", str(tmp_path / "o"),
                          *extra]) == 2  # fmt: skip
        err = capsys.readouterr().err
        assert f"{', '.join(o for o in extra if o.startswith('--'))}: " in err and "fits nothing" in err
        assert "caprecon meta --judgments FILE... --fit" in err and not (tmp_path / "o" / "meta.csv").exists()


def test_verify_all_says_a_pascal_file_without_hm_pairs_has_none(tmp_path, capsys):
    from caprecon.cli.meta import main as meta_main

    root = tmp_path / "data"
    _json(root / "pascal50s.json", {"HC": [_PAIR, {**_PAIR, "label": 1}], "MM": [_PAIR]})
    assert meta_main(["verify", "--all", "--data-root", str(root), "--metric", "bleu-4", "--out",
                      str(tmp_path / "out")]) in (0, 1)  # fmt: skip
    table = {(r["metric"], r["key"]): r for r in csv.DictReader((tmp_path / "out" / "verify.csv").open())
             if r["benchmark"] == "pascal50s"}
    assert table[("bleu-4", "HM")]["status"] == "skipped"
    assert table[("bleu-4", "HM")]["reason"] == ("bleu-4 HM: the pascal50s file holds no HM items, so there is no "
                                                 "HM value to check")  # fmt: skip
    assert table[("bleu-4", "HC")]["status"] in ("pass", "fail")  # HC pairs are there: compared
    others = {r["reason"] for (m, _), r in table.items() if m != "bleu-4"}
    assert all("not scored (give its per-caption scores with --scores)" in r for r in others)


def test_expert_file_whose_every_image_lies_outside_ends_with_its_reason_not_a_traceback(tmp_path):
    from caprecon.apps.metabench.meta import meta

    images = tmp_path / "images"
    (images / "Nebula").mkdir(parents=True)
    path = _json(tmp_path / "annotations" / "nebula_test.json", [
        {"imgid": "../../outside/secret", "mt": f"a cat {k}", "refs": ["r"], "score": k} for k in range(3)])
    called = []
    results = meta(benchmark="nebula-raw", data=path, images=images, metrics=["m"], out=tmp_path / "out",
                   score_metric=lambda name, samples: called.append(samples) or [1.0] * len(samples),
                   scorable={"m"}, bootstrap=20)  # the interval's bootstrap ran into an IndexError on no rows
    (row,) = results.rows
    assert called == [] and row.n == 0 and row.n_failed == 3 and math.isnan(row.ci_low)
    assert any("m: 3 row(s) refused" in note and "lies outside --images" in note for note in results.notes)


@pytest.mark.parametrize("benchmark, data, message", [
    ("composite", {"flickr8k": [{"image": "a.jpg", "caption": 4, "human": 4, "refs": ["r"]}]},
     r"flickr8k\[0\]: caption must be text, not the int 4"),
    ("composite", {"flickr8k": [{"image": "a.jpg", "caption": "a cat", "human": 4, "refs": "r|s"}]},
     r"flickr8k\[0\]: refs must be a list of captions"),
    ("composite", {"flickr8k": [{"image": "a.jpg", "caption": "a cat", "human": "nan", "refs": ["r"]}]},
     r"flickr8k\[0\]: human 'nan' is not a finite number"),
    ("flickr8k-expert", {"1": {"image_path": "a.jpg", "ground_truth": "a dog|a cat",
                               "human_judgement": [{"caption": "a cat", "rating": 2}]}},
     r"\['1'\]: ground_truth must be a list of captions"),
    ("flickr8k-expert", {"1": {"image_path": "a.jpg", "ground_truth": ["a dog"],
                               "human_judgement": [{"caption": 5, "rating": 2}]}},
     r"human_judgement\[0\]: caption must be text"),
])  # fmt: skip
def test_expert_copies_of_composite_and_flickr8k_refuse_wrong_types(tmp_path, benchmark, data, message):
    path = _json(tmp_path / ("composite.json" if benchmark == "composite" else "flickr8k.json"), data)
    with pytest.raises(JudgmentFormatError, match=message):
        get_benchmark(benchmark).load(str(path))
