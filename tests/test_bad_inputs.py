"""The bad-input catalogue: each kind of mistake a user makes, and what `caprecon score`
does with it — one clear line and exit 2 for the run as a whole, a row error for one row.
The test prints the catalogue as a table (kind -> outcome) and checks every entry."""

import base64
import io
import json
import math
import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from caprecon.cli import main
from tiny_vlm import build_qwen2_lm
from clirun import run_cli as _run


def _write(path, text, encoding="utf-8"):
    path.write_text(text, encoding=encoding)
    return path


def _jsonl(path, rows):
    return _write(path, "".join(json.dumps(r) + "\n" for r in rows))




def _outcome(code: int, err: str) -> str:
    lines = [line for line in err.strip().splitlines() if line.strip()]
    return f"exit {code}: {lines[-1] if lines else ''}"


class Workspace:
    """Files the bad-input cases share: a picture, a one-row input and the tiny models."""

    def __init__(self, root, tiny_clip, tiny_sd, tiny_dinov2):
        self.root, self.tiny_clip, self.tiny_sd, self.tiny_dinov2 = root, tiny_clip, tiny_sd, tiny_dinov2
        self.tiny_lm = build_qwen2_lm(root / "text-lm")
        Image.fromarray(np.random.default_rng(0).integers(0, 255, (24, 32, 3), dtype=np.uint8)).save(root / "pic.png")
        self.good = [{"id": "a", "image": "pic.png", "caption": "a picture"}]
        self.ok = _jsonl(root / "in.jsonl", self.good)
        self.clip = ["-m", "clipscore", "--clip", str(tiny_clip), "--cache-dir", str(root / "cache"), "-q"]
        self.sd = ["--generator", str(tiny_sd), "--embedder", str(tiny_dinov2), "-m", "recon", "--max-side", "32"]

    def file(self, name, text, encoding="utf-8"):
        return _write(self.root / name, text, encoding)

    def rows(self, name, rows):
        return _jsonl(self.root / name, rows)

    def score(self, input_path, *extra, out=None):
        out = out or f"run-{input_path.stem}"
        return ["score", "-i", str(input_path), *self.clip, "--out", str(self.root / out), *extra]

    def scored_run(self):
        run = self.root / "run-clip"
        if not (run / "scores.jsonl").exists():
            assert main(self.score(self.rows("clip.jsonl", self.good), out="run-clip")) == 0
        return run

    def shards(self, name, captions, missing=None):
        """Two shards of an input of two images, one caption each, scored with clipscore;
        `missing`: the row whose image is not there."""
        Image.new("RGB", (16, 16), (200, 10, 10)).save(self.root / "red.png")
        images = ["pic.png", "red.png"]
        if missing is not None:
            images[missing] = "absent.png"
        rows = self.rows(f"{name}.jsonl", [{"id": f"{name}-{i}", "image": image, "caption": caption}
                                          for i, (image, caption) in enumerate(zip(images, captions))])
        folders = [self.root / f"{name}-shard{i}" for i in range(2)]
        for i, folder in enumerate(folders):
            if not (folder / "manifest.json").exists():
                assert main(self.score(rows, "--shard", f"{i}/2", "--allow-row-errors", out=folder.name)) == 0
        return [str(f) for f in folders]

    def folder_of_two(self):
        folder = self.root / "two-pictures"
        folder.mkdir(exist_ok=True)
        for name in ("a.png", "b.png"):
            Image.open(self.root / "pic.png").save(folder / name)
        return folder

    def cache(self):
        """A cache of its own, so that no other case's results are found in it."""
        self.caches = getattr(self, "caches", 0) + 1
        return ["--cache-dir", str(self.root / f"cache-{self.caches}")]

    def shapes(self):
        """Four captions of one picture; a picky model fails the one with a triangle."""
        return self.rows("shapes.jsonl", [{"id": f"s{i}", "image": "pic.png", "caption": caption} for i, caption in
                                          enumerate(["a red circle", "a blue square", "a green triangle",
                                                     "a red square"])])

    def suite(self, *extra, captions=("a red card", "a blue card")):
        """`caprecon suite` on a two-question MME file (two images) and published captions."""
        cards = []
        for colour in ((220, 30, 30), (30, 60, 220)):
            data = io.BytesIO()
            Image.new("RGB", (32, 32), colour).save(data, format="PNG")
            cards.append(base64.b64encode(data.getvalue()).decode())
        tsv = self.file("cards.tsv", "index\timage\tquestion\tanswer\tcategory\n" + "".join(
            f"{i}\t{card}\tIs the card red?\t{'Yes' if i == 0 else 'No'}\tcolor\n" for i, card in enumerate(cards)))
        written = self.rows("card-captions.jsonl", [{"dataset": "mme", "index": str(i), "caption": caption}
                                                    for i, caption in enumerate(captions)])
        return ["suite", "--suite", "mme", "--data", str(tsv), "--captions", f"published={written}", "--size", "32x32",
                *self.cache(), "-q", *extra]

    def unwritable(self):
        if os.geteuid() == 0:  # permissions do not stop root; a folder under /sys does
            return "/sys/caprecon-run"
        locked = self.root / "locked"
        locked.mkdir(exist_ok=True)
        locked.chmod(0o500)
        return str(locked)


@pytest.fixture(scope="module")
def ws(tmp_path_factory, tiny_clip, tiny_sd, tiny_dinov2):
    return Workspace(tmp_path_factory.mktemp("bad-inputs"), tiny_clip, tiny_sd, tiny_dinov2)


def _coco_annotations(w):
    return w.file("ann.json", json.dumps({"images": [{"id": 1, "file_name": "pic.png"}],
                                          "annotations": [{"image_id": 1, "caption": "a pic"}]}))


# how a library's own error (or a bug) ends a message: its type as a detail after what it says
UNEXPECTED = " (an unexpected {} inside the model or metric: run again with --verbose"

# kind -> (the command for it, the exit status, what stderr's last line must say)
WHOLE_FILE = {
    "input not UTF-8 (Latin-1 CSV)": lambda w: (
        w.score(w.file("l1.csv", "id,image,caption\na,pic.png,café\n", "latin-1")), 2, "not UTF-8 text"),
    "a JSONL line that is not JSON": lambda w: (w.score(w.file("bad.jsonl", '{"id": "a"\n')), 2, "not valid JSON"),
    "COCO results that are not JSON": lambda w: (
        w.score(w.file("res.json", "[{image_id: 1}"), "--annotations", str(_coco_annotations(w))), 2,
        "not valid JSON"),
    "COCO annotations that are not JSON": lambda w: (
        w.score(w.file("r.json", '[{"image_id": 1, "caption": "x"}]'), "--annotations", str(w.file("a.json", "{oops"))),
        2, "not valid JSON"),
    "COCO results without --annotations": lambda w: (
        w.score(w.file("r2.json", '[{"image_id": 1, "caption": "x"}]')), 2, "add --annotations"),
    "CSV image column named otherwise": lambda w: (
        w.score(w.file("p.csv", "id,path,caption\na,pic.png,x\n")), 2, "name it one of image, image_path, file_name"),
    "no caption column": lambda w: (w.score(w.file("nc.csv", "id,image\na,pic.png\n")), 2, "no 'caption' field"),
    "the same id twice": lambda w: (w.score(w.rows("dup.jsonl", w.good * 2)), 2, "ids must be unique"),
    "an empty input": lambda w: (w.score(w.file("empty.jsonl", "")), 1, "the input holds no rows"),
    "refs that are not a list": lambda w: (
        w.score(w.rows("refs.jsonl", [{**w.good[0], "refs": 3}])), 2, "refs must be a list"),
    "--out is a file": lambda w: (w.score(w.ok, out="in.jsonl"), 2, "is a file"),
    "--out not writable": lambda w: (["score", "-i", str(w.ok), *w.clip, "--out", w.unwritable()], 2, "not writable"),
    "--batch-size 0": lambda w: (w.score(w.ok, "--batch-size", "0"), 2, "argument --batch-size: must be at least 1"),
    "--seed -1": lambda w: (w.score(w.ok, "--seed", "-1"), 2, "argument --seed: must be between 0"),
    "bad --generator-opt value (steps=abc)": lambda w: (
        w.score(w.ok, *w.sd, "--generator-opt", "steps=abc"), 2, "steps='abc'"),
    "--generator-opt without =": lambda w: (
        w.score(w.ok, *w.sd, "--generator-opt", "steps"), 2, "must look like key=value"),
    "broken YAML config": lambda w: (
        w.score(w.ok, "--config", str(w.file("c.yaml", "seed: [1,\n"))), 2, "not valid YAML at line"),
    "broken TOML config": lambda w: (w.score(w.ok, "--config", str(w.file("c.toml", "seed = \n"))), 2, "not valid TOML"),
    "config with batch_size: 0": lambda w: (
        w.score(w.ok, "--config", str(w.file("b.yaml", "batch_size: 0\n"))), 2, "--batch-size must be at least 1"),
    "report on a run without the metric": lambda w: (
        ["report", str(w.scored_run()), "--metric", "turing"], 2, "needs a run scored with -m turing"),
    "a generator folder given as --embedder": lambda w: (
        w.score(w.ok, "-m", "recon", "--generator", str(w.tiny_sd), "--embedder", str(w.tiny_sd)), 2,
        "holds a diffusers pipeline"),
    "an embedder folder given as --generator": lambda w: (
        w.score(w.ok, *w.sd[2:], "--generator", str(w.tiny_dinov2)), 2, "not a diffusers text-to-image pipeline"),
    "a model folder that does not exist": lambda w: (
        w.score(w.ok, "--clip", str(w.root / "nothing")), 2, "folder not found"),
    "an unknown metric": lambda w: (w.score(w.ok, "-m", "bleurt"), 2, "unknown metric"),
    # a row without an image is valid only for metrics that never look at the source (issue 16)
    "a row without an image, for a metric that needs one": lambda w: (
        w.score(w.rows("noimage.jsonl", [*w.good, {"id": "none", "caption": "x"}])), 2, "have no image"),
    # issue 22: each of these was a traceback
    **{f"--iou-threshold {value}": (lambda value: lambda w: (
        w.score(w.ok, "--iou-threshold", value), 2, "--iou-threshold must be a number above 0 and at most 1"))(value)
       for value in ("nan", "-1", "2", "inf")},
    # issue 42, class 12: older inputs that were still accepted without a word
    **{f"--template with {kind}": (lambda template: lambda w: (
        w.score(w.ok, *w.sd, "--template", template), 2, "is not filled in (only {caption} is)"))(template)
       for kind, template in (("an unknown placeholder", "{caption} in {style}"),
                              ("a positional placeholder", "{} {caption}"), ("a numbered one", "{caption}, {0}"))},
    "refs that are not strings": lambda w: (
        w.score(w.rows("refs-numbers.jsonl", [{**w.good[0], "refs": ["a cat", 3]}])), 2, "refs must be a list of captions, a JSON list or '|'-separated text, not a list holding the int 3"),
    "--vqa-template with another placeholder": lambda w: (
        w.score(w.ok, "-m", "vqascore", "--judge", str(w.root / "no-judge"), "--vqa-template", "{foo}"), 2,
        "--vqa-template must contain {caption} and no other"),
    "a .parquet file that is not parquet": lambda w: (
        w.score(w.file("fake.parquet", "id,caption\n")), 2, "not a readable parquet file"),
    "a JSON line nested 100k deep": lambda w: (
        w.score(w.file("deep.jsonl", "[" * 100_000 + "]" * 100_000 + "\n")), 2, "deep.jsonl:1: nested too deeply"),
    "--config names a folder": lambda w: (w.score(w.ok, "--config", str(w.root)), 2, "not a file"),
    "report on a file that is not a scores file": lambda w: (
        ["report", str(w.file("notes.txt", "some notes\n"))], 2, "notes.txt:1: not valid JSON"),
    "a CSV quote never closed": lambda w: (
        w.score(w.file("quote.csv", 'id,image,caption\na,pic.png,"a cat\nb,pic.png,a dog\n')), 2,
        "quote.csv:2: a quote opened on this row is never closed"),
    # issue 22: options the backend would have taken silently, or failed on every row
    "--generator-opt steps=-1": lambda w: (
        w.score(w.ok, *w.sd, "--generator-opt", "steps=-1"), 2, "steps must be at least 1, not -1"),
    "--generator-opt steps=0": lambda w: (
        w.score(w.ok, *w.sd, "--generator-opt", "steps=0"), 2, "steps must be at least 1, not 0"),
    "--generator-opt guidance=inf": lambda w: (
        w.score(w.ok, *w.sd, "--generator-opt", "guidance=inf"), 2,
        "--generator-opt guidance='inf': guidance must be a finite number"),
    "--generator-opt steps=2.5": lambda w: (
        w.score(w.ok, *w.sd, "--generator-opt", "steps=2.5"), 2, "--generator-opt steps=2.5: steps must be a whole"),
    "a text-only model as --judge": lambda w: (
        w.score(w.ok, "-m", "vqascore", "--judge", str(w.tiny_lm)), 2, "a text-only language model (qwen2) cannot see"),
    "a suite TSV whose base64 is not an image": lambda w: (
        ["suite", "--suite", "mme", "--data", str(w.file("mme.tsv", "index\timage\tquestion\tanswer\tcategory\n0\t"
                                                          + base64.b64encode(b"no picture in here, only words").decode()
                                                          + "\tIs there a card?\tYes\tcolor\n")),
         "--captions", f"x={w.file('suite-captions.jsonl', '')}", "--generator", str(w.tiny_sd),
         "--judge", str(w.tiny_dinov2), "--cache-dir", str(w.root / "cache"), "-q"], 2,
        "mme.tsv:2: the base64 `image` is not a picture"),
    "cttd build --taxonomy with a name that is not text": lambda w: (
        ["cttd", "build", "--images", str(w.root), "--out", str(w.root.parent / "cttd"), "--taxonomy",
         str(w.file("taxonomy.json", '[{"name": 1}]'))], 2, "taxonomy.json item 1: needs a 'name' that is non-empty text"),
    **{f"t2i --limit {n}": (lambda n: lambda w: (
        ["t2i", "--input", str(w.ok), "--generator", str(w.tiny_sd), "--limit", n], 2,
        f"argument --limit: must be between 1 and 100000000, not {n}"))(n) for n in ("0", "-2")},
    # issue 22: merges that went through
    "merge shards of different inputs": lambda w: (
        ["merge", w.shards("one", ("a cat", "a dog"))[0], w.shards("two", ("a cow", "a hen"))[1],
         "--out", str(w.root / "merged-mix")], 2, "are shards of different inputs"),
    "merge --out one of the shards": lambda w: (
        ["merge", *w.shards("one", ("a cat", "a dog")), "--out", w.shards("one", ("a cat", "a dog"))[1]], 2,
        "lies inside the input"),
    "merge --out another run": lambda w: (
        ["merge", *w.shards("one", ("a cat", "a dog")), "--out", str(w.scored_run())], 2,
        "already holds something other than a merge of these shards"),
    # issue 22: a model failing every row alike stops the run with the reason (exit 2), in every command
    "reconstruct: a generator failing every row": lambda w: (
        ["reconstruct", "-i", str(w.shapes()), "-m", "recon", "-g", "broken_models:BrokenGenerator", "--embedder",
         str(w.tiny_dinov2), *w.cache(), "-q"], 2,
        "reconstruct failed on every row of a batch with the same error, so the problem is not the rows: "
        "the generator's server answered 503 Service Unavailable" + UNEXPECTED.format("RuntimeError")),
    "reconstruct: the same failure on the first rows, one at a time": lambda w: (
        ["reconstruct", "-i", str(w.shapes()), "-m", "recon", "-g", "broken_models:BrokenGenerator", "--embedder",
         str(w.tiny_dinov2), "--batch-size", "1", *w.cache(), "-q"], 2,
        "reconstruct failed on each of the first 3 rows with the same error"),
    "embed: an embedder failing every row": lambda w: (
        ["embed", "-i", str(w.shapes()), "-m", "recon", "-g", "broken_models:PickyGenerator", "--embedder",
         "broken_models:BrokenEmbedder", *w.cache(), "-q"], 2,
        "embed failed on every row of a batch with the same error, so the problem is not the rows: "
        "the embedder's weights are corrupt" + UNEXPECTED.format("RuntimeError")),
    "judge: a judge failing every row": lambda w: (
        ["judge", "-i", str(w.shapes()), "-m", "vqascore", "--judge", "broken_models:BrokenJudge", *w.cache(), "-q"],
        2, "vqascore failed on every row of a batch with the same error, so the problem is not the rows: "
           "connection refused by the judge's server" + UNEXPECTED.format("ConnectionError")),
    "suite: a generator failing every row": lambda w: (
        w.suite("-g", "broken_models:BrokenGenerator", "--judge", "broken_models:PickyJudge"), 2,
        "reconstruct failed on every row of a batch with the same error"),
    "suite: a judge that cannot be reached": lambda w: (
        w.suite("-g", "oracle:OracleGenerator", "--judge", "broken_models:BrokenJudge"), 2,
        "judge: connection refused by the judge's server" + UNEXPECTED.format("ConnectionError")),
    "caption: a captioner that cannot be reached": lambda w: (
        ["caption", "--images", str(w.folder_of_two()), "--out", str(w.root / "caption-down"), "--captioner",
         "broken_models:BrokenCaptioner", "--n", "2", "--select", "recon", "-g", "oracle:OracleGenerator", "--embedder",
         str(w.tiny_dinov2), *w.cache(), "-q"], 2,
        "captioner: connection refused by the captioner's server" + UNEXPECTED.format("ConnectionError")),
    "suite: a captioner that cannot be reached": lambda w: (
        w.suite("-g", "oracle:OracleGenerator", "--judge", "broken_models:PickyJudge", "--captioner",
                "down=broken_models:BrokenCaptioner"), 2,
        "captioner: connection refused by the captioner's server" + UNEXPECTED.format("ConnectionError")),
    "t2i: a judge that cannot be reached": lambda w: (
        ["t2i", "-i", str(w.shapes()), "-g", "oracle:OracleGenerator", "--judge", "broken_models:BrokenJudge",
         "--size", "32x32", *w.cache(), "-q"], 2,
        "vqascore failed on every row of a batch with the same error, so the problem is not the rows: "
        "connection refused by the judge's server" + UNEXPECTED.format("ConnectionError")),
    # issue 22: some rows failing: exit 1, saying how many and why; --allow-row-errors exits 0
    **{f"{command}: some rows fail{', --allow-row-errors' if allow else ''}": (
        lambda make, allow: lambda w: _allowing(make(w), allow))(make, allow)
       for command, make in {
           "reconstruct": lambda w: (
               ["reconstruct", "-i", str(w.shapes()), "-m", "recon", "-g", "broken_models:PickyGenerator",
                "--embedder", str(w.tiny_dinov2), *w.cache(), "-q"],
               "failed: reconstruct: ValueError: 1 (first: cannot draw a triangle: 'a green triangle')"),
           "embed": lambda w: (
               ["embed", "-i", str(w.shapes()), "-m", "recon", "-g", "broken_models:PickyGenerator", "--embedder",
                str(w.tiny_dinov2), *w.cache(), "-q"], "failed: no stored reconstruction: 4"),
           "judge": lambda w: (
               ["judge", "-i", str(w.shapes()), "-m", "vqascore", "--judge", "broken_models:PickyJudge", *w.cache(),
                "-q"], "failed: vqascore: ValueError: 1 (first: cannot judge a triangle"),
           "suite": lambda w: (
               w.suite("-g", "oracle:OracleGenerator", "--judge", "broken_models:PickyJudge", captions=("a red card",)),
               "failed: no caption for this image: 1 question(s)"),
           "caption": lambda w: (
               ["caption", "--images", str(w.folder_of_two()), "--out", str(w.root / f"caption-{w.cache()[1][-1]}"),
                "--captioner", "broken_models:ShapeCaptioner", "--n", "2", "--select", "recon", "-g",
                "broken_models:PickyGenerator", "--embedder", str(w.tiny_dinov2), "--max-side", "32", *w.cache(), "-q"],
               "failed: recon: ValueError: 2 candidate(s)"),
           "merge": lambda w: (
               ["merge", *w.shards("holes", ("a cat", "a dog"), missing=1),
                "--out", str(w.root / f"merged-{w.cache()[1][-1]}")], "failed: image not found: 1 row(s)"),
           "t2i": lambda w: (
               ["t2i", "-i", str(w.shapes()), "-g", "broken_models:PickyGenerator", "--judge",
                "broken_models:PickyJudge", "--size", "32x32", *w.cache(), "-q"],
               "failed: vqascore: ValueError: 1 row(s)"),
       }.items() for allow in (False, True)},
    "a NUL in an image path": lambda w: (
        w.score(w.rows("nul.jsonl", [{**w.good[0], "image": "pic\0.png"}])), 1, "row(s) failed"),
}


def _allowing(case, allow):
    """(argv, message) of a run where some rows fail, as a case: exit 1, or 0 with --allow-row-errors."""
    argv, message = case
    return [*argv, "--allow-row-errors"] if allow else argv, 0 if allow else 1, message


def _expect(code, err, expected_code, message):
    assert "Traceback" not in err, err
    assert code == expected_code and message in err, _outcome(code, err)


@pytest.mark.parametrize("kind", list(WHOLE_FILE))
def test_bad_input(kind, ws, capsys):
    argv, expected_code, message = WHOLE_FILE[kind](ws)
    code, _, err = _run(argv, capsys)
    _expect(code, err, expected_code, message)


# every kind of QA-bank mistake (`QABankError`): one line naming the bank's line, before any model loads
BANK_ERRORS = {
    "not JSON": ('{"image_id": "a"', "not valid JSON"),
    "not an object": ("[1, 2]", "expected a record (object), got list"),
    "a field missing": ('{"image_id": "a", "question": "q?", "type": "yesno"}', "missing field 'answer'"),
    "an empty question": ('{"image_id": "a", "question": " ", "type": "yesno", "answer": "yes"}',
                          "question must be a non-empty string"),
    "an unknown type": ('{"image_id": "a", "question": "q?", "type": "essay", "answer": "x"}', "unknown type 'essay'"),
    "choices on a yesno": ('{"image_id": "a", "question": "q?", "type": "yesno", "answer": "yes", "choices": ["a"]}',
                           "choices are for mc questions"),
    "coords on a yesno": ('{"image_id": "a", "question": "q?", "type": "yesno", "answer": "yes", "coords": "pixel"}',
                          "coords is for box questions"),
    "mc without choices": ('{"image_id": "a", "question": "q?", "type": "mc", "answer": "A"}', "needs 'choices'"),
    "mc with 27 choices": (json.dumps({"image_id": "a", "question": "q?", "type": "mc", "answer": "A",
                                       "choices": [f"c{i}" for i in range(27)]}), "at most 26 choices"),
    "mc with two equal choices": ('{"image_id": "a", "question": "q?", "type": "mc", "answer": "A", '
                                  '"choices": ["cat", "Cat"]}', "two choices read the same"),
    "mc answer both a letter and a text": ('{"image_id": "a", "question": "q?", "type": "mc", "answer": "B", '
                                           '"choices": ["B", "dog"]}', "is ambiguous"),
    "mc answer not an option": ('{"image_id": "a", "question": "q?", "type": "mc", "answer": "fish", '
                                '"choices": ["cat", "dog"]}', "neither an option letter nor one of the choices"),
    "yesno answered maybe": ('{"image_id": "a", "question": "q?", "type": "yesno", "answer": "maybe"}',
                             "must be yes or no"),
    "short answer empty": ('{"image_id": "a", "question": "q?", "type": "short", "answer": ""}',
                           "a short answer must be a non-empty"),
    "unknown coords": ('{"image_id": "a", "question": "q?", "type": "box", "answer": [0, 0, 1, 1], "coords": "cm"}',
                       "unknown coords 'cm'"),
    "box not four values": ('{"image_id": "a", "question": "q?", "type": "box", "answer": [0, 1]}',
                            "must be [x1, y1, x2, y2]"),
    "box not numbers": ('{"image_id": "a", "question": "q?", "type": "box", "answer": [0, 0, "a", 1]}',
                        "must hold four numbers"),
    "box negative": ('{"image_id": "a", "question": "q?", "type": "box", "answer": [-1, 0, 1, 1]}',
                     "finite and non-negative"),
    "box inside out": ('{"image_id": "a", "question": "q?", "type": "box", "answer": [5, 0, 1, 1]}', "x1 < x2"),
    "box beyond its coords": ('{"image_id": "a", "question": "q?", "type": "box", "answer": [0, 0, 2, 1], '
                              '"coords": "normalized"}', "goes beyond 1"),
    "an id used twice": ('{"image_id": "a", "question": "q?", "type": "yesno", "answer": "yes", "id": "x"}\n'
                         '{"image_id": "a", "question": "q2?", "type": "yesno", "answer": "no", "id": "x"}',
                         "id 'x' already used on line 1"),
    "an empty bank": ("\n", "the QA bank holds no questions"),
    "a question twice for one image": ('{"image_id": "a", "question": "Is it red?", "type": "yesno", "answer": "yes"}\n'
                                       '{"image_id": "a", "question": "is it red? ", "type": "yesno", "answer": "no"}',
                                       ":2: image 'a' is asked this question on line 1 already"),
}


@pytest.mark.parametrize("kind", list(BANK_ERRORS))
def test_bad_qa_bank(kind, ws, capsys):
    line, message = BANK_ERRORS[kind]
    bank = ws.file(f"bank-{kind.replace(' ', '-')}.jsonl", line + "\n")
    # the text LLM does not exist: the bank is read, and refused, before any model is looked for
    code, _, err = _run(ws.score(ws.ok, "-m", "captionqa", "--llm", str(ws.root / "no-llm"), "--qa-bank", str(bank)),
                        capsys)
    _expect(code, err, 2, message)


def test_disk_full_on_out_keeps_the_rows_written(ws, capsys, monkeypatch):
    import errno

    import caprecon.run.local as local
    from caprecon.core.records import append_jsonl

    rows = ws.rows("three.jsonl", [{**ws.good[0], "id": f"r{i}"} for i in range(3)])
    writes = []

    def fill_up(sink, batch, **kw):  # the second batch finds the disk full after half a line
        writes.append(batch)
        if len(writes) == 2:
            sink.write('{"id": "r1", "capt')
            sink.flush()
            raise OSError(errno.ENOSPC, "No space left on device")
        return append_jsonl(sink, batch, **kw)

    monkeypatch.setattr(local, "append_jsonl", fill_up)
    argv = ws.score(rows, "--batch-size", "1", out="full")
    code, _, err = _run(argv, capsys)
    _expect(code, err, 2, f"{ws.root / 'full'} is full")
    kept = [json.loads(line) for line in (ws.root / "full" / "scores.jsonl").read_text().splitlines()]
    assert [r["id"] for r in kept] == ["r0"] and isinstance(kept[0]["clipscore"], float)
    monkeypatch.undo()
    code, _, err = _run(argv, capsys)  # space again: the run resumes from the row kept
    assert code == 0, err
    assert [r["id"] for r in map(json.loads, (ws.root / "full" / "scores.jsonl").open())] == ["r0", "r1", "r2"]


def test_output_piped_into_head_ends_quietly(ws):
    import subprocess
    import sys

    # the reader closes the pipe before anything is written, as `| head` does once it has its lines
    command = [sys.executable, "-m", "caprecon.cli", "cache", "info", "--json", "--cache-dir", str(ws.root / "cache")]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait() == 141 and err == ""


def test_bad_rows(tmp_path, tiny_clip, capsys):
    pic = tmp_path / "pic.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (24, 32, 3), dtype=np.uint8)).save(pic)
    (tmp_path / "ok.jsonl").write_text("{}\n")
    clip = ["-m", "clipscore", "--clip", str(tiny_clip), "--cache-dir", str(tmp_path / "cache"), "-q"]
    table = []

    def score(input_path, *extra, out="run"):
        return ["score", "-i", str(input_path), *clip, "--out", str(tmp_path / out), *extra]

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
        "caption with a lone surrogate": ("pic.png", "half \ud800"),
        "reference with a lone surrogate": ("pic.png", "x"),
        "image outside --image-root (..)": ("../ok.jsonl", "x"),
        "image outside --image-root (absolute)": (str(tmp_path / "cache"), "x"),
    }
    references = {"reference with a lone surrogate": ["fine", "half \udfff"]}
    samples = _jsonl(images / "rows.jsonl", [{"id": kind, "image": image, "caption": caption,
                                              "refs": references.get(kind, [])}
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
                     "caption with a lone surrogate": "text not valid Unicode",
                     "reference with a lone surrogate": "text not valid Unicode",
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


@pytest.fixture
def read_only_cache(ws, monkeypatch):
    """A healthy cache on what behaves as a read-only mount: no write permission, and SQLite
    cannot open its index read-write (root ignores the permission bits; a mount does not)."""
    import shutil
    import sqlite3

    ws.scored_run()  # fills ws.root / "cache"
    cache = ws.root / "ro-cache"
    if not cache.exists():
        shutil.copytree(ws.root / "cache", cache)
    for path in [cache, *cache.rglob("*")]:
        path.chmod(path.stat().st_mode & ~0o222)
    connect = sqlite3.connect

    def read_only_mount(database, *args, **kwargs):
        if not kwargs.get("uri") and Path(str(database)).parent == cache:
            raise sqlite3.OperationalError("unable to open database file")
        return connect(database, *args, **kwargs)

    monkeypatch.setattr(sqlite3, "connect", read_only_mount)
    yield cache
    for path in [cache, *cache.rglob("*")]:
        path.chmod(path.stat().st_mode | 0o200)


@pytest.mark.parametrize("repair", [False, True], ids=["verify", "verify --repair"])
def test_cache_verify_on_a_read_only_cache(read_only_cache, repair, capsys):
    before = sorted(p.name for p in read_only_cache.iterdir())
    code, out, err = _run(["cache", "verify", "--cache-dir", str(read_only_cache), *(["--repair"] * repair)], capsys)
    if repair:
        _expect(code, err, 2, "is read-only here; --repair needs write access")
    else:
        assert code == 0 and "index: ok" in out and "entries checked: 0" not in out, out + err
    assert sorted(p.name for p in read_only_cache.iterdir()) == before  # nothing moved aside or added


def test_verbose_logs_the_traceback_behind_a_stop(ws, capsys, caplog):
    import logging

    argv = ["-v", "reconstruct", "-i", str(ws.shapes()), "-m", "recon", "-g", "broken_models:BrokenGenerator",
            "--embedder", str(ws.tiny_dinov2), *ws.cache(), "-q"]
    with caplog.at_level(logging.INFO, logger="caprecon"):
        code, _, err = _run(argv, capsys)
    assert code == 2 and "reconstruct failed on every row" in err
    stopped = [r for r in caplog.records if r.exc_info and "503 Service Unavailable" in str(r.exc_info[1])]
    assert stopped and stopped[0].exc_info[2] is not None  # the traceback, for a bug report


def test_json_list_with_a_lone_surrogate_names_its_item(tmp_path):
    # a .json list of records is checked like a .jsonl line: half a pair refused, a whole pair read
    from caprecon.core.records import read_records

    bad = tmp_path / "rows.json"
    bad.write_text('[{"id": "a", "caption": "whole \\ud83d\\ude00"}, {"id": "b", "caption": "half \\ud800"}]')
    with pytest.raises(ValueError, match=r"rows\.json item 2: holds half a UTF-16 surrogate pair"):
        list(read_records(bad))
    good = tmp_path / "good.json"
    good.write_text('[{"id": "a", "caption": "whole \\ud83d\\ude00"}]')
    assert [r["caption"] for _, r in read_records(good)] == ["whole \U0001F600"]


# issue 42, class 8: every count has a bound and every number a domain, in every command that takes it;
# (command family, option, value, what stderr's last line must say) -- each refused before any file is read
HUGE = str(10**9)
COUNTS_AND_DOMAINS = [
    ("refine", "--rounds", HUGE, "argument --rounds: must be between 1 and 100, not 1000000000"),
    ("refine", "--rounds", "-1", "argument --rounds: must be between 1 and 100, not -1"),
    ("caption", "--refine", HUGE, "argument --refine: must be between 1 and 100"),
    ("score", "--seeds", HUGE, "argument --seeds: must be between 1 and 1000, not 1000000000"),
    ("refine", "--seeds", HUGE, "argument --seeds: must be between 1 and 1000"),
    ("caption", "--seeds", "-3", "argument --seeds: must be between 1 and 1000, not -3"),
    ("compare", "--resamples", HUGE, "argument --resamples: must be between 1 and 100000"),
    ("seeds", "--resamples", "-5", "argument --resamples: must be between 1 and 100000, not -5"),
    ("t2i", "--bootstrap", HUGE, "argument --bootstrap: must be between 1 and 100000"),
    ("t2i", "--bootstrap", "-1", "argument --bootstrap: must be between 1 and 100000, not -1"),
    ("meta", "--bootstrap", HUGE, "argument --bootstrap: must be between 0 and 100000"),
    ("t2i", "--limit", HUGE, "argument --limit: must be between 1 and 100000000"),
    ("suite", "--limit", "-2", "argument --limit: must be between 1 and 100000000, not -2"),
    ("caption", "--n", HUGE, "argument --n: must be between 1 and 1000"),
    ("refine", "--margin", "nan", "argument --margin: must be a finite number at least 0, not nan"),
    ("refine", "--margin", "-0.1", "argument --margin: must be a finite number at least 0, not -0.1"),
    ("seeds", "--threshold", "nan", "argument --threshold: must be above 0 and at most 1, not nan"),
    ("seeds", "--threshold", "2", "argument --threshold: must be above 0 and at most 1, not 2.0"),
    ("meta", "--tolerance", "nan", "argument --tolerance: must be a finite number at least 0, not nan"),
    ("meta", "--tolerance", "-1", "argument --tolerance: must be a finite number at least 0, not -1.0"),
    ("suite", "--sigma", "inf", "argument --sigma: must be a finite number above 0, not inf"),
    ("caption", "--temperature", "-1", "argument --temperature: must be a finite number at least 0"),
    ("caption", "--top-p", "0", "argument --top-p: must be above 0 and at most 1, not 0.0"),
]


def _with_required(command, root):
    """`command`'s required arguments, so that only the option under test is wrong."""
    (root / "rows.jsonl").touch()  # there, so that what is refused is the option, not a missing input
    return {"refine": ["refine", "-i", str(root / "rows.jsonl"), "--out", str(root / "o")],
            "caption": ["caption", "--images", str(root), "--out", str(root / "o")],
            "score": ["score", "-i", str(root / "none.jsonl")],
            "compare": ["compare", str(root)], "seeds": ["seeds", str(root)],
            "t2i": ["t2i", "-i", str(root / "none.jsonl")], "meta": ["meta"],
            "suite": ["suite", "--suite", "mme"]}[command]


@pytest.mark.parametrize("command, option, value, message", COUNTS_AND_DOMAINS,
                         ids=[f"{c} {o} {v}" for c, o, v, _ in COUNTS_AND_DOMAINS])
def test_counts_and_numbers_out_of_range_are_refused(command, option, value, message, tmp_path, capsys):
    code, _, err = _run([*_with_required(command, tmp_path), f"{option}={value}"], capsys)
    _expect(code, err, 2, message)


# weights of the selection score (refine and caption's best-of-N share Selection), refused before any file is read
@pytest.mark.parametrize("weights, message", [
    ("recon=nan", "selection weight of recon: must be a finite number above 0, not nan"),
    ("recon=-1", "selection weight of recon: must be a finite number above 0, not -1.0"),
    ("recon=0.5,clipscore=inf", "selection weight of clipscore: must be a finite number above 0, not inf"),
    ("recon=0", "selection weight of recon: must be a finite number above 0, not 0.0"),
])
@pytest.mark.parametrize("command", ["refine", "caption"])
def test_selection_weights_must_be_finite_and_positive(command, weights, message, tmp_path, capsys):
    code, _, err = _run([*_with_required(command, tmp_path), "--select", weights, "--llm", "x"], capsys)
    _expect(code, err, 2, message)


def test_the_python_api_bounds_the_same_counts(tmp_path):
    from caprecon.apps.refine import refine
    from caprecon.apps.t2i import t2i
    from caprecon.core.errors import ConfigError
    from caprecon.run.captioning import Selection
    from caprecon.run.config import RunConfig
    from caprecon.stats.bootstrap import bootstrap_ci
    from caprecon.stats.seeds import compare, stability

    rows = [{"id": f"r{i}", "image_id": f"i{i}", "recon_seeds": [0.1 * i, 0.2, 0.3]} for i in range(4)]
    cases = {
        "--rounds must be between 1 and 100, not 1000000000": lambda: refine([], rounds=10**9),
        "--margin must be a finite number at least 0, not nan": lambda: refine([], margin=float("nan")),
        "selection weight of recon: must be a finite number above 0, not nan": lambda: Selection.parse(
            {"recon": float("nan")}),
        "--seeds must be between 1 and 1000, not 1000000000": lambda: RunConfig(seeds=10**9),
        "n_resamples must be between 0 and 100000, not 1000000000": lambda: compare(rows, rows, "recon",
                                                                                    n_resamples=10**9),
        "n_resamples must be between 0 and 100000, not -1": lambda: stability(rows, "recon", n_resamples=-1),
        "n_resamples must be between 0 and 100000, not -2": lambda: bootstrap_ci(len, ["a", "b"], n_resamples=-2),
        "--limit must be between 1 and 100000000, not -1": lambda: t2i([], [], limit=-1),
        "--bootstrap must be between 1 and 100000, not 0": lambda: t2i([], [], n_bootstrap=0),
    }
    for message, call in cases.items():
        with pytest.raises(ConfigError) as raised:
            call()
        assert str(raised.value) == message


# issue 42, class 9: what is missing is said, never averaged away
def _scores(folder, rows):
    folder.mkdir(parents=True, exist_ok=True)
    _jsonl(folder / "scores.jsonl", rows)
    return str(folder)


def _seeded(i, system, values):
    return {"id": f"{system}{i}", "image_id": f"img{i}", "captioner": system, "recon": sum(values) / len(values),
            "recon_seeds": values}


def _two_systems(tmp_path, extra_a=(), extra_b=()):
    a = [_seeded(i, "a", [0.1 * i, 0.1 * i + 0.05]) for i in range(4)]
    b = [_seeded(i, "b", [0.1 * i + 0.01, 0.1 * i + 0.02]) for i in range(4)]
    return _scores(tmp_path / "A", a + list(extra_a)), _scores(tmp_path / "B", b + list(extra_b))


MISSING_SAID = {  # kind -> (argv from the two runs' folders, exit status, what the output must say)
    "compare: an id twice in a run": lambda a, b: (
        ["compare", a, _scores(Path(b).parent / "dup", [_seeded(0, "b", [0.1, 0.2])] * 2)], 2,
        "id 'b0' is on rows 1 and 2"),
    "compare --by: an id twice in a system": lambda a, b: (
        ["compare", _scores(Path(a).parent / "dup-in", [_seeded(0, "a", [0.1, 0.2])] * 2
                            + [_seeded(0, "b", [0.3, 0.4])])], 2, "id 'a0' is on rows 1 and 2"),
    "seeds: an id twice": lambda a, b: (
        ["seeds", _scores(Path(a).parent / "dup-seeds", [_seeded(0, "a", [0.1, 0.2])] * 2), "--out",
         str(Path(a).parent / "s")], 2, "id 'a0' is on rows 1 and 2"),
    "compare: a run with itself": lambda a, b: (["compare", a, str(Path(a) / "scores.jsonl")], 2, "are the same run"),
    "compare: an unknown --metric": lambda a, b: (["compare", a, b, "--metric", "recno"], 2,
                                                   "--metric recno: no row of"),
    "seeds: an unknown --metric": lambda a, b: (["seeds", a, "--metric", "recno", "--out", str(Path(a).parent / "s")],
                                                2, "this score; it has: recon"),
    "compare: rows without a finite score": lambda a, b: (
        ["compare", *_two_systems(Path(a).parent / "holes", extra_a=[{"id": "a9", "image_id": "img9", "recon": None,
                                                                      "error": "image not found"}],
                                  extra_b=[{"id": "b8", "image_id": "img1", "recon": float("nan")}])], 0,
        "left out 1 row(s) of "),
    "seeds: rows without a finite score": lambda a, b: (
        ["seeds", _scores(Path(a).parent / "holes-seeds", [*(_seeded(i, "a", [0.1 * i, 0.2 * i]) for i in range(3)),
                                                           {"id": "x", "image_id": "img9", "recon_seeds": None}]),
         "--out", str(Path(a).parent / "s")], 0, "left out 1 of 4 row(s) without a finite recon score"),
    # Kendall's tau of one caption is undefined (issue 51 item 21): said, not a table of blanks and exit 0
    "seeds: a run of one caption": lambda a, b: (
        ["seeds", _scores(Path(a).parent / "one-seeds", [_seeded(0, "a", [0.1, 0.2])]), "--out",
         str(Path(a).parent / "s")], 2, "found one: Kendall's tau of one caption is undefined"),
    "seeds: one caption left with a score": lambda a, b: (
        ["seeds", _scores(Path(a).parent / "one-left", [_seeded(0, "a", [0.1, 0.2]),
                                                        {"id": "x", "image_id": "img9", "recon_seeds": None}]),
         "--out", str(Path(a).parent / "s")], 2, "needs at least two rows with a recon score"),
}


@pytest.mark.parametrize("kind", list(MISSING_SAID))
def test_what_is_missing_is_said(kind, tmp_path, capsys):
    a, b = _two_systems(tmp_path)
    argv, expected_code, message = MISSING_SAID[kind](a, b)
    code, out, err = _run(argv, capsys)
    assert "Traceback" not in err
    assert code == expected_code and message in out + err, _outcome(code, err) + out


def test_the_metric_error_lists_the_metrics_a_run_has(tmp_path, capsys):
    a, b = _two_systems(tmp_path)
    code, _, err = _run(["compare", a, b, "--metric", "recno"], capsys)
    assert code == 2 and err.strip().endswith("has this score; it has: recon"), err


def test_scores_near_the_largest_float_do_not_overflow(tmp_path, capsys):
    import warnings

    big = [_seeded(i, "a", [1e308 * (0.5 + 0.1 * i), 1e308]) for i in range(4)]
    small = [_seeded(i, "b", [0.5, 0.5]) for i in range(4)]
    a, b = _scores(tmp_path / "big", big), _scores(tmp_path / "small", small)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # numpy's overflow warnings become failures
        code, out, err = _run(["compare", a, b, "--out", str(tmp_path / "c.jsonl")], capsys)
        assert code == 0, err
        seeds_code, seeds_out, _ = _run(["seeds", a, "--out", str(tmp_path / "s")], capsys)
    assert seeds_code == 0 and "nan" not in seeds_out.split("k  tau")[1].splitlines()[2]
    row = json.loads((tmp_path / "c.jsonl").read_text())
    # mean of A by hand: 1e308 * (0.5 + 0.1 i + 1) / 2 per image i = 0..3, averaged: 1e308 * (1.5 + 0.15) / 2
    assert row["mean_a"] == pytest.approx(0.825e308) and row["difference"] == pytest.approx(0.825e308 - 0.5)
    assert all(math.isfinite(row[k]) for k in ("mean_a", "difference", "ci_low", "ci_high"))
    assert "inf" not in out and "nan" not in out and "8.2500e+307" in out


def test_report_t2i_and_seed_means_of_scores_near_the_largest_float(tmp_path, capsys):
    import warnings

    from caprecon.apps.t2i import adherence_table
    from caprecon.metrics.seeds import seed_interval

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # numpy's overflow warnings become failures
        # by hand: the mean of 1e308 and 1.5e308 is 1.25e308, their sd (n - 1) 0.5e308 / sqrt(2)
        mean, sd, interval = seed_interval([1e308, 1.5e308])
        assert mean == pytest.approx(1.25e308) and sd == pytest.approx(0.5e308 / math.sqrt(2))
        assert interval[0] < mean < interval[1] and all(math.isfinite(v) for v in interval)
        assert seed_interval([0.25, 0.75]) == seed_interval([0.25, 0.75])  # scores within 1 untouched
        records = [{"id": str(i), "generator": g, "vqa/j": v} for i in range(3)
                   for g, v in (("a", 1.5e308), ("b", -1.5e308))]
        table = adherence_table(records, ["a", "b"], ["vqa/j"], n_bootstrap=50)
        assert table.means["a", "vqa/j"].mean == pytest.approx(1.5e308)
        difference = table.differences["a", "b", "vqa/j"]  # 3e308 is beyond the largest float: saturated
        assert difference.mean == pytest.approx(1.7976931348623157e308) and math.isfinite(difference.ci_high)
        text = table.to_text()
        assert "1.5000e+308" in text and "inf" not in text and "nan" not in text
        run = _scores(tmp_path / "big", [{"id": f"r{i}", "image": "x.png", "caption": "c", "recon": 1e308 * (1 + i / 4),
                                          "captioner": "ab"[i % 2]} for i in range(4)])
        code, out, err = _run(["report", run], capsys)
    assert code == 0, err
    page = (tmp_path / "big" / "report.html").read_text()
    # by hand: a's mean of 1e308 and 1.5e308, b's of 1.25e308 and 1.75e308
    assert ">1.2500e+308<" in page and ">1.5000e+308<" in page and ">inf<" not in page and ">nan<" not in page


def test_report_refuses_a_folder_with_nothing_to_report_and_accuracies_beyond_1(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    code, out, err = _run(["report", str(tmp_path / "empty")], capsys)
    assert code == 2 and "nothing to report: no scores (scores.jsonl or candidates.jsonl)" in err
    assert not {"report.html", "report_files"} & {f.name for f in (tmp_path / "empty").iterdir()}  # no empty page
    run = _scores(tmp_path / "turing", [{"id": "r0", "image": "x.png", "caption": "c", "turing": 0.5,
                                         "turing/color": 1e308, "turing_n/color": 3}])
    code, out, err = _run(["report", run], capsys)
    assert code == 2 and err.strip().endswith("row 'r0': turing/color is 1e+308; the per-category table pools "
                                              "accuracies and probabilities (0 to 1) or cosines (-1 to 1)"), err


@pytest.mark.parametrize("text", ["nan", "inf", "-inf"])
def test_verify_refuses_expected_values_that_are_not_finite(tmp_path, text):
    from caprecon.apps.metabench.verify import read_expected
    from caprecon.data.judgments import JudgmentFormatError

    path = tmp_path / "expected.csv"
    path.write_text(f"benchmark,metric,key,value\nflickr8k-expert,bleu-4,tau_c,0.3\nflickr8k-expert,cider,tau_c,{text}\n")
    with pytest.raises(JudgmentFormatError) as caught:
        read_expected(path, "flickr8k-expert")
    assert str(caught.value) == f"{path}:3: value must be a finite number, not {float(text)!r}"


def test_pearson_of_scores_near_the_largest_float(recwarn):
    from caprecon.stats.correlation import pearson

    human = [1.0, 0.0, 2.0, 1.5]
    small = [1.0, 0.5, 1.7, 1.2]
    # r does not depend on the scale: by hand it is the r of the same scores divided by 1e308
    assert pearson([v * 1e308 for v in small], human) == pytest.approx(pearson(small, human), rel=1e-12)
    assert pearson(small, human) == pytest.approx(np.corrcoef(small, human)[0, 1], rel=1e-12)
    assert not [w for w in recwarn if "overflow" in str(w.message)]


def _png_base64(colour=(200, 10, 10)) -> str:
    buffer = io.BytesIO()
    Image.fromarray(np.random.default_rng(1).integers(0, 255, (24, 32, 3), dtype=np.uint8)).save(buffer, "PNG")
    return base64.b64encode(buffer.getvalue()).decode()


def _generic_bank(path, inline_images):
    return _jsonl(path, [{"image_id": image_id, "image": image, "question": "What colour?", "answer": "red"}
                         for image_id, image in inline_images])


def _vlmevalkit_bank(path, inline_images):
    lines = ["index\timage\tquestion\tA\tB\tanswer"]
    lines += [f"{image_id}\t{image}\tWhat colour?\tred\tblue\tA" for image_id, image in inline_images]
    return _write(path, "\n".join(lines) + "\n")


@pytest.mark.parametrize("layout, writer", [("generic", _generic_bank), ("vlmevalkit", _vlmevalkit_bank)])
def test_cttd_import_no_images_still_drops_undecodable_inline_images(layout, writer, tmp_path, capsys):
    good = _png_base64()
    not_base64 = "@" * 600
    not_an_image = base64.b64encode(b"plain text " * 60).decode()
    questions = writer(tmp_path / ("q.jsonl" if layout == "generic" else "q.tsv"),
                       [("1", good), ("2", not_base64), ("3", not_an_image)])
    out = tmp_path / "bank"
    code, stdout, err = _run(["cttd", "import", str(questions), "--out", str(out), "--no-images"], capsys)
    assert "Traceback" not in err
    assert [json.loads(line)["image_id"] for line in (out / "bank.jsonl").open()] == ["1"]
    assert not (out / "images").exists()  # decoded, never written
    assert err.splitlines()[0].startswith("dropped: 2 question(s) whose image could not be used (image not base64: 1, "
                                          "image not decodable: 1)")
    first = 1 if layout == "generic" else 2  # a TSV's line 1 is its header
    assert f"  {questions}:{first + 1} (image 2): the image is not valid base64" in err
    assert f"  {questions}:{first + 2} (image 3): " in err
    assert code == 1


HELP_COMMANDS = ["score", "meta", "caption", "refine", "t2i", "suite", "cttd build", "reward-audit", "reconstruct",
                 "cttd import", "compare", "seeds", "report", "cache info", "merge", "distill", "models", "demo",
                 "suite-agree"]


@pytest.mark.parametrize("command", HELP_COMMANDS)
def test_allow_plugins_only_on_commands_that_read_a_config(command, capsys):
    code, out, _ = _run([*command.split(), "--help"], capsys)
    assert code == 0
    assert ("--allow-plugins" in out) == ("--config" in out), out


def test_allow_plugins_is_refused_where_no_config_is_read(tmp_path, capsys):
    code, _, err = _run(["compare", str(tmp_path), str(tmp_path), "--allow-plugins"], capsys)
    assert code == 2 and "unrecognized arguments: --allow-plugins" in err


@pytest.mark.parametrize("value", ["-1e-3", "-2E+5", "-1.", "-inf", "-Infinity"])
def test_negative_numbers_are_values_not_options(value, tmp_path, capsys):
    (tmp_path / "images").mkdir()
    code, _, err = _run(["cttd", "build", "--images", str(tmp_path / "images"), "--out", str(tmp_path / "b"),
                         "--alpha", value], capsys)
    # the value reaches its own check, which names the option and the number
    assert code == 2 and f"--alpha must be a finite number at least 0, not {float(value)!r}" in err, err
    assert "unrecognized arguments" not in err


def test_meta_takes_negative_numbers_as_values(tmp_path, capsys):
    from caprecon.cli.meta import main as meta_main

    with pytest.raises(SystemExit) as stop:
        meta_main(["--bootstrap", "-1e3"])
    assert stop.value.code == 2
    assert "argument --bootstrap: must be a whole number, not '-1e3'" in capsys.readouterr().err


MISSING_INPUTS = {  # command line with a path that is not there -> how the message names it
    "score": (["score", "-i", "{x}", "-m", "clipscore", "--out", "{out}"], "--input"),
    "caption": (["caption", "--images", "{x}", "--out", "{out}"], "--images"),
    "refine": (["refine", "-i", "{x}", "--out", "{out}"], "--input"),
    "t2i": (["t2i", "-i", "{x}", "--out", "{out}"], "--input"),
    "reconstruct": (["reconstruct", "-i", "{x}", "-m", "recon", "--out", "{out}"], "--input"),
    "compare": (["compare", "{x}", "{x}"], "runs"),
    "seeds": (["seeds", "{x}"], "run"),
    "report": (["report", "{x}"], "run"),
    "merge": (["merge", "{x}", "--out", "{out}"], "shards"),
    "meta --scores": (["meta", "--scores", "{x}", "--benchmark", "flickr8k-expert", "--out", "{out}"], "--scores"),
    "cttd import": (["cttd", "import", "{x}", "--out", "{out}"], "file"),
    "cttd build": (["cttd", "build", "--images", "{x}", "--out", "{out}"], "--images"),
    "suite-agree": (["suite-agree", "--suite-run", "{x}", "--turing", "a=b", "--out", "{out}"], "--suite-run"),
}


@pytest.mark.parametrize("kind", list(MISSING_INPUTS))
def test_a_missing_input_names_its_option(kind, tmp_path, capsys):
    argv, option = MISSING_INPUTS[kind]
    missing, out = tmp_path / "nofile.jsonl", tmp_path / "out"
    code, _, err = _run([a.format(x=missing, out=out) for a in argv], capsys)
    assert code == 2 and err.strip().splitlines()[-1] == f"caprecon: error: {option}: not found: {missing}", err
    assert not out.exists()  # refused before any folder is made


@pytest.mark.parametrize("scores", [[1e308, 1.5e308], [-1e308, -1.7e308, 1e308], [0.25, 0.75]],
                         ids=["near the largest", "both signs", "within 1"])
def test_a_run_summary_of_scores_near_the_largest_float(scores):
    import statistics

    from caprecon.run.folder import summarise

    summary = summarise([{"id": str(i), "recon": v} for i, v in enumerate(scores)], ["recon"])["metrics"]["recon"]
    # by hand at 1e-300 scale (exact in ratio), then scaled back
    small = [v * 1e-300 for v in scores]
    assert summary["mean"] == pytest.approx(statistics.fmean(small) * 1e300, rel=1e-12)
    assert summary["std"] == pytest.approx(statistics.pstdev(small) * 1e300, rel=1e-12)
    assert math.isfinite(summary["mean"]) and math.isfinite(summary["std"]) and summary["n"] == len(scores)
