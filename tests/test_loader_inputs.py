"""Benchmark files received from others, held to what their rows may ask: images inside the root
each loader was given, fields of the types the format has, and files whose statistics would be
blanks or ±1 by construction refused with a sentence that says so."""

from __future__ import annotations

import csv
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


LOADERS = {"caparena": _caparena, "nebula-raw": _expert("nebula"), "polaris": _expert("polaris"),
           "pascal50s": _pascal, "flickr8k-expert": _flickr, "composite": _composite, "foil-polos-allref": _foil,
           "thumb": _thumb, "longcaparena-testb-desc": _longcap}  # fmt: skip


@pytest.mark.parametrize("benchmark", [*LOADERS, "polaris-csv", "nebula-captionevalkit"])
def test_every_loader_refuses_an_image_outside_its_root(tmp_path, benchmark):
    write = {"polaris-csv": _polaris, "nebula-captionevalkit": _captionevalkit}.get(benchmark) or LOADERS[benchmark]
    name = {"polaris-csv": "polaris", "nebula-captionevalkit": "nebula-raw"}.get(benchmark, benchmark)
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
