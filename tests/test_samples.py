"""Every input format loads to the same samples; bad files fail whole, bad rows alone."""

import csv
import json

import pytest
from PIL import Image

from caprecon.data.loaders import load_samples
from caprecon.data.images import open_image
from caprecon.data.samples import SampleError, SampleFormatError


@pytest.fixture
def pictures(tmp_path):
    for name, colour in (("a", (255, 0, 0)), ("b", (0, 0, 255))):
        Image.new("RGB", (8, 6), colour).save(tmp_path / f"{name}.png")
    return tmp_path


def _check(samples, root):
    assert [s.caption for s in samples] == ["a red box", "a blue box"]
    assert samples[0].refs == ["red", "a red square"]
    assert open_image(samples[0]).image.getpixel((0, 0)) == (255, 0, 0)
    assert samples[1].image_id == "b"


ROWS = [{"id": "1", "image": "a.png", "caption": "a red box", "refs": ["red", "a red square"]},
        {"id": "2", "image": "b.png", "caption": "a blue box", "refs": []}]


def test_jsonl(pictures):
    path = pictures / "s.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in ROWS))
    _check(load_samples(path), pictures)


def test_csv_with_pipe_refs(pictures):
    path = pictures / "s.csv"
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, ["id", "image", "caption", "refs"])
        writer.writeheader()
        writer.writerow({**ROWS[0], "refs": "red | a red square"})
        writer.writerow({**ROWS[1], "refs": ""})
    _check(load_samples(path), pictures)


def test_coco_results_with_annotations(pictures):
    ann = {"images": [{"id": 10, "file_name": "a.png"}, {"id": 11, "file_name": "b.png"}],
           "annotations": [{"image_id": 10, "caption": "red"}, {"image_id": 10, "caption": "a red square"}]}
    (pictures / "ann.json").write_text(json.dumps(ann))
    (pictures / "res.json").write_text(json.dumps([{"image_id": 10, "caption": "a red box"},
                                                   {"image_id": 11, "caption": "a blue box"}]))
    samples = load_samples(pictures / "res.json", annotations=pictures / "ann.json")
    assert samples[1].image_id == "11"
    samples[1].image_id = "b"
    _check(samples, pictures)


def test_parquet_and_datasets_folder(pictures):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(ROWS), pictures / "s.parquet")
    _check(load_samples(pictures / "s.parquet"), pictures)

    datasets = pytest.importorskip("datasets")
    datasets.Dataset.from_list(ROWS).save_to_disk(str(pictures / "ds"))
    _check(load_samples(pictures / "ds", images_root=pictures), pictures)


def test_image_folder_with_captions_file(pictures):
    (pictures / "captions.jsonl").write_text("\n".join(json.dumps(r) for r in ROWS))
    _check(load_samples(pictures), pictures)


def test_whole_file_problems_raise(tmp_path):
    with pytest.raises(SampleFormatError, match="not found"):
        load_samples(tmp_path / "missing.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": 1, "caption": "x"}\n{oops\n')
    with pytest.raises(SampleFormatError, match="bad.jsonl:2"):
        load_samples(bad)
    ragged = tmp_path / "ragged.csv"
    ragged.write_text("id,image,caption\n1,a.png,fine\n2,b.png,too,many\n")
    with pytest.raises(SampleFormatError, match="ragged.csv:3: more fields than the header"):
        load_samples(ragged)
    nocap = tmp_path / "nocap.jsonl"
    nocap.write_text('{"id": 1, "image": "a.png"}\n')
    with pytest.raises(SampleFormatError, match="no 'caption'"):
        load_samples(nocap)


def test_row_problems_are_sample_errors(pictures):
    (pictures / "broken.png").write_bytes(b"not an image")
    rows = load_samples([{"id": "x", "image": str(pictures / "broken.png"), "caption": "c"},
                         {"id": "y", "image": str(pictures / "a.png"), "caption": ""}])
    with pytest.raises(SampleError, match="cannot decode"):
        open_image(rows[0])
    with pytest.raises(SampleError, match="empty caption"):
        open_image(rows[1])
