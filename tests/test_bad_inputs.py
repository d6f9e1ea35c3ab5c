"""The bad-input catalogue: each kind of mistake a user makes, and what `caprecon score`
does with it — one clear line and exit 2 for the run as a whole, a row error for one row.
The test prints the catalogue as a table (kind -> outcome) and checks every entry."""

import io
import json
import os

import numpy as np
import pytest
from PIL import Image

from caprecon.cli import main


def _write(path, text, encoding="utf-8"):
    path.write_text(text, encoding=encoding)
    return path


def _jsonl(path, rows):
    return _write(path, "".join(json.dumps(r) + "\n" for r in rows))


def _run(argv, capsys) -> tuple[int, str, str]:
    try:
        code = main(argv)
    except SystemExit as stop:  # argparse refuses the option itself
        code = stop.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _outcome(code: int, err: str) -> str:
    lines = [line for line in err.strip().splitlines() if line.strip()]
    return f"exit {code}: {lines[-1] if lines else ''}"


def test_bad_input_catalogue(tmp_path, tiny_clip, tiny_sd, tiny_dinov2, capsys):
    pic = tmp_path / "pic.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (24, 32, 3), dtype=np.uint8)).save(pic)
    good = [{"id": "a", "image": "pic.png", "caption": "a picture"}]
    clip = ["-m", "clipscore", "--clip", str(tiny_clip), "--cache-dir", str(tmp_path / "cache"), "-q"]

    def score(input_path, *extra, out="run"):
        return ["score", "-i", str(input_path), *clip, "--out", str(tmp_path / out), *extra]

    coco_ann = _write(tmp_path / "ann.json", json.dumps({"images": [{"id": 1, "file_name": "pic.png"}],
                                                         "annotations": [{"image_id": 1, "caption": "a pic"}]}))
    scored_run = tmp_path / "run-clip"
    assert main(score(_jsonl(tmp_path / "ok.jsonl", good), out="run-clip")) == 0
    unwritable = tmp_path / "locked"
    unwritable.mkdir()
    unwritable.chmod(0o500)
    if os.geteuid() == 0:  # permissions do not stop root; a folder under /sys does
        unwritable = "/sys/caprecon-run"
    sd = ["--generator", str(tiny_sd), "--embedder", str(tiny_dinov2), "-m", "recon", "--max-side", "32"]
    ok = _jsonl(tmp_path / "in.jsonl", good)

    whole_file = {  # kind -> (argv, what the outcome must say)
        "input not UTF-8 (Latin-1 CSV)": (score(_write(tmp_path / "l1.csv", "id,image,caption\na,pic.png,café\n",
                                                       "latin-1")), "exit 2: caprecon: error: "),
        "a JSONL line that is not JSON": (score(_write(tmp_path / "bad.jsonl", '{"id": "a"\n')), "not valid JSON"),
        "COCO results that are not JSON": (score(_write(tmp_path / "res.json", "[{image_id: 1}"), "--annotations",
                                                 str(coco_ann)), "not valid JSON"),
        "COCO annotations that are not JSON": (score(_write(tmp_path / "r.json", '[{"image_id": 1, "caption": "x"}]'),
                                                     "--annotations", str(_write(tmp_path / "a.json", "{oops"))),
                                               "not valid JSON"),
        "COCO results without --annotations": (score(_write(tmp_path / "r2.json", '[{"image_id": 1, "caption": "x"}]')),
                                               "add --annotations"),
        "CSV image column named otherwise": (score(_write(tmp_path / "p.csv", "id,path,caption\na,pic.png,x\n")),
                                             "name it one of image, image_path, file_name"),
        "no caption column": (score(_write(tmp_path / "nc.csv", "id,image\na,pic.png\n")), "no 'caption' field"),
        "the same id twice": (score(_jsonl(tmp_path / "dup.jsonl", good * 2)), "ids must be unique"),
        "an empty input": (score(_write(tmp_path / "empty.jsonl", "")), "exit 1: caprecon: error: the input holds no rows"),
        "refs that are not a list": (score(_jsonl(tmp_path / "refs.jsonl", [{**good[0], "refs": 3}])),
                                     "refs must be a list"),
        "--out is a file": (score(ok, out="ok.jsonl"), "is a file"),
        "--out not writable": (["score", "-i", str(ok), *clip, "--out", str(unwritable)], "not writable"),
        "--batch-size 0": (score(ok, "--batch-size", "0"), "argument --batch-size: must be at least 1"),
        "--seed -1": (score(ok, "--seed", "-1"), "argument --seed: must be between 0"),
        "bad --generator-opt value (steps=abc)": (score(ok, *sd, "--generator-opt", "steps=abc"), "steps='abc'"),
        "--generator-opt without =": (score(ok, *sd, "--generator-opt", "steps"), "must look like key=value"),
        "broken YAML config": (score(ok, "--config", str(_write(tmp_path / "c.yaml", "seed: [1,\n"))),
                               "not valid YAML at line"),
        "broken TOML config": (score(ok, "--config", str(_write(tmp_path / "c.toml", "seed = \n"))),
                               "not valid TOML"),
        "config with batch_size: 0": (score(ok, "--config", str(_write(tmp_path / "b.yaml", "batch_size: 0\n"))),
                                      "--batch-size must be at least 1"),
        "report on a run without the metric": (["report", str(scored_run), "--metric", "turing"], "needs a run scored with -m turing"),
        "a generator folder given as --embedder": (score(ok, "-m", "recon", "--generator", str(tiny_sd), "--embedder",
                                                         str(tiny_sd)), "holds a diffusers pipeline"),
        "an embedder folder given as --generator": (score(ok, *sd[2:], "--generator", str(tiny_dinov2)),
                                                    "not a diffusers text-to-image pipeline"),
        "a model folder that does not exist": (score(ok, "--clip", str(tmp_path / "nothing")), "folder not found"),
        "an unknown metric": (score(ok, "-m", "bleurt"), "unknown metric"),
        # a row without an image is valid only for metrics that never look at the source (issue 16)
        "a row without an image, for a metric that needs one": (
            score(_jsonl(tmp_path / "noimage.jsonl", [*good, {"id": "none", "caption": "x"}])),
            "have no image"),
    }
    table = []
    for kind, (argv, expected) in whole_file.items():
        code, out, err = _run(argv, capsys)
        outcome = _outcome(code, err)
        table.append((kind, outcome))
        assert expected in outcome, (kind, outcome)
        assert code in (1, 2) and "Traceback" not in err, (kind, err)

    # one run, one row per kind of bad row: each becomes that row's error, the rest is scored
    images = tmp_path / "images"
    images.mkdir()
    Image.fromarray(np.array([[0, 30000], [50000, 65535]], dtype=np.uint16)).save(images / "deep.png")
    rgba = Image.new("RGBA", (8, 8), (0, 0, 0, 0))
    rgba.save(images / "clear.png")
    Image.new("CMYK", (8, 8), (0, 255, 255, 0)).save(images / "cmyk.jpg")
    Image.new("RGB", (8, 8)).save(images / "plain.png")
    data = io.BytesIO()
    Image.new("RGB", (64, 64), (1, 2, 3)).save(data, format="PNG")
    (images / "truncated.png").write_bytes(data.getvalue()[: len(data.getvalue()) // 2])
    (images / "noise.png").write_bytes(b"not an image at all")
    (images / "folder.png").mkdir()
    pic.rename(images / "pic.png")
    rows = {
        "16-bit greyscale PNG": ("deep.png", "grey levels"),
        "transparent RGBA PNG": ("clear.png", "nothing"),
        "CMYK JPEG": ("cmyk.jpg", "red"),
        "caption in another script": ("plain.png", "一只猫坐在垫子上"),
        "caption longer than CLIP's 77 tokens": ("plain.png", "word " * 60),
        "image file missing": ("absent.png", "x"),
        "image not an image": ("noise.png", "x"),
        "image truncated": ("truncated.png", "x"),
        "image path is a folder": ("folder.png", "x"),
        "empty caption": ("pic.png", "   "),
        "caption is a list": ("pic.png", ["a", "cat"]),
        "caption is a number": ("pic.png", 7),
        "image outside --image-root (..)": ("../ok.jsonl", "x"),
        "image outside --image-root (absolute)": (str(tmp_path / "cache"), "x"),
    }
    samples = _jsonl(images / "rows.jsonl", [{"id": kind, "image": image, "caption": caption}
                                            for kind, (image, caption) in rows.items()])
    code, out, err = _run(["score", "-i", str(samples), *clip, "--image-root", str(images), "--out",
                           str(tmp_path / "rows")], capsys)
    assert code == 1 and "Traceback" not in err
    written = {r["id"]: r for r in map(json.loads, (tmp_path / "rows" / "scores.jsonl").open())}
    expected_rows = {"16-bit greyscale PNG": "scored", "transparent RGBA PNG": "scored", "CMYK JPEG": "scored",
                     "caption in another script": "scored", "caption longer than CLIP's 77 tokens": "scored",
                     "image file missing": "image not found", "image not an image": "image not decodable",
                     "image truncated": "image not decodable", "image path is a folder": "image unreadable",
                     "empty caption": "empty caption",
                     "caption is a list": "caption not text", "caption is a number": "caption not text",
                     "image outside --image-root (..)": "image outside --image-root",
                     "image outside --image-root (absolute)": "image outside --image-root"}
    for kind, expected in expected_rows.items():
        row = written[kind]
        outcome = "scored" if isinstance(row.get("clipscore"), float) else f"row error: {row['error_reasons'][0]}"
        table.append((f"row: {kind}", outcome))
        assert outcome.endswith(expected), (kind, row)
    assert f"rows failed: {sum(v != 'scored' for v in expected_rows.values())}" in out

    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa

    pq.write_table(pa.table({"id": ["fine", "broken"], "caption": ["x", "y"],
                             "image": [{"bytes": data.getvalue(), "path": None},
                                       {"bytes": data.getvalue()[:50], "path": None}]}), tmp_path / "in.parquet")
    code, out, err = _run(score(tmp_path / "in.parquet", out="pq"), capsys)
    parquet = {r["id"]: r for r in map(json.loads, (tmp_path / "pq" / "scores.jsonl").open())}
    assert code == 1 and "clipscore" in parquet["fine"] and parquet["broken"]["error_reasons"] == ["image not decodable"]
    table.append(("row: parquet with one undecodable image", "row error: image not decodable (other rows scored)"))

    width = max(len(kind) for kind, _ in table)
    with capsys.disabled():
        print(f"\n{'kind'.ljust(width)}  outcome")
        for kind, outcome in table:
            print(f"{kind.ljust(width)}  {outcome}")
