"""A bad-input attack on the newer commands: each case one mistake a user makes, run as
`caprecon ...` in a subprocess with a timeout, and classified by what came back.

    python scripts/attack.py              # every case, then the table of outcomes
    python scripts/attack.py -k refine    # the cases whose name contains one of the words
    python scripts/attack.py -v           # also each case's last line of stderr
    git archive COMMIT src | tar -x -C /tmp/old
    python scripts/attack.py --before /tmp/old/src   # that commit's outcomes beside this tree's

Outcomes:

- `clean`: exit 2 (the command could not run) or 1 (some rows failed), no traceback, and the
  last line of stderr names the problem (each case says which words it must hold: the option,
  the file, the row);
- `vague`: a refusal without a traceback whose last line does not name the problem;
- `traceback`: Python's traceback on stderr;
- `silent`: exit 0 without a word about the mistake (each case says what a warning must hold);
- `hang`: still running after the timeout (the process group is killed);
- `leak`: a secret the case gave (`absent`) shows on stdout or stderr, whatever the exit.

A case with `python=True` attacks the Python API (`caprecon.Reward` and its guards, as a trainer
calls them): its `argv` gives a few lines of code run by `python -c` after `PYTHON_PRELUDE`, which
reports caprecon's own refusals (`ConfigError`, `MetricContractError`, `RunError`, `ServerError`) as the command
line does, in one `caprecon: error: ...` line with exit 2, and lets anything else end as it ends.

The inputs are tiny and offline: the shapes world of tests/oracle.py and the scripted models of
tests/ (`oracle:OracleGenerator`, `broken_models:PickyJudge`, ...), loaded as `module:Class`
options with tests/ on PYTHONPATH, so no model weights are read. The cases are not those of
tests/test_bad_inputs.py, tests/test_reliability.py and tests/test_lifecycle.py: the point is
to find what those did not. Exit status 1 when any case is not `clean`.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"
TIMEOUT = 90  # seconds; a case still running after this is a hang
OUTCOMES = ("clean", "vague", "traceback", "silent", "hang", "leak")


@dataclass
class Case:
    name: str
    kind: str  # the kind of mistake (malformed row, wrong type, empty file, ...)
    argv: Callable[["Workspace"], list]
    names: tuple[str, ...]  # what the last line of stderr must hold (all of them, case-insensitive)
    codes: tuple[int, ...] = (2,)  # the exit statuses of a clean refusal
    warned: bool = False  # exit 0 with a warning naming the problem (stderr holds `names`) is clean too
    stream: str = "err"  # where the message is: stderr, or stdout (a report such as `cache verify`'s)
    python: bool = False  # `argv` gives Python code against the API (see the module's docstring)
    absent: tuple[str, ...] = ()  # secrets that must show nowhere on stdout or stderr


@dataclass
class Result:
    case: Case
    outcome: str
    code: int | None
    seconds: float
    last: str = ""
    stderr: str = ""


class Workspace:
    """The files every case starts from, in a temporary folder: two shape pictures, their
    captions with references, a QA bank, a scored run of two systems with per-seed scores,
    two shards of a bleu-4 run, an MME-style suite file, human judgments, a filled cache."""

    def __init__(self, root: Path):
        self.root = root
        sys.path.insert(0, str(TESTS))
        from oracle import render
        from PIL import Image

        render("a red square", 32, 32).save(root / "red.png")
        render("a blue circle", 32, 32).save(root / "blue.png")
        self.rows = self.jsonl("rows.jsonl", [
            {"id": "a", "image": "red.png", "caption": "a red square", "refs": ["a red square", "one red square"]},
            {"id": "b", "image": "blue.png", "caption": "a blue circle", "refs": ["a blue circle", "a circle"]}])
        self.bank = self.jsonl("bank.jsonl", [
            {"image_id": image_id, "question": f"Is there a {colour} shape in the image?", "category": "colour",
             "type": "yesno", "answer": answer} for image_id in ("a", "b")
            for colour, answer in (("red", "yes" if image_id == "a" else "no"), ("blue", "yes" if image_id == "b"
                                                                                 else "no"), ("green", "no"))])
        # a run of two systems, each row with three per-seed scores
        seeded = [{"id": f"{system}{i}", "image_id": f"img{i}", "captioner": system, "caption": f"caption {i}",
                   "recon": 0.1 * i + shift, "recon_seeds": [0.1 * i + shift, 0.1 * i + shift + 0.01,
                                                             0.1 * i + shift - 0.01]}
                  for system, shift in (("x", 0.0), ("y", 0.05)) for i in range(4)]
        self.run = self.folder("run", seeded)
        self.run_x = self.folder("run-x", [r for r in seeded if r["captioner"] == "x"])
        self.run_y = self.folder("run-y", [r for r in seeded if r["captioner"] == "y"])
        # the MME-style suite file: two cards, one question each
        cards = []
        for colour in ((220, 30, 30), (30, 60, 220)):
            data = io.BytesIO()
            Image.new("RGB", (32, 32), colour).save(data, format="PNG")
            cards.append(base64.b64encode(data.getvalue()).decode())
        self.tsv = self.text("cards.tsv", "index\timage\tquestion\tanswer\tcategory\n" + "".join(
            f"{i}\t{card}\tIs the card red?\t{'Yes' if i == 0 else 'No'}\tcolor\n" for i, card in enumerate(cards)))
        self.card_captions = self.jsonl("card-captions.jsonl", [
            {"dataset": "mme", "index": str(i), "caption": c} for i, c in enumerate(("a red card", "a blue card"))])
        # human judgments of captions with references (meta --fit), and their scores
        judged, scores = [], []
        for i in range(6):
            for k in range(3):
                judged.append({"id": f"{i}-{k}", "image": f"img{i}.jpg", "caption": f"caption {i} {k}",
                               "refs": ["a reference", "another one"], "human": float(k + (i % 2))})
                scores.append({"id": f"{i}-{k}", "bleu-1": 0.1 * k + 0.01 * i, "cider": 0.2 * k - 0.01 * i})
        self.judgments = self.jsonl("judged.jsonl", judged)
        self.scores = self.jsonl("judged-scores.jsonl", scores)
        self.judged, self.scored = judged, scores
        self.expert = self.jsonl("expert.jsonl", [  # Flickr8k-Expert's rows: three experts' ratings of 1-4
            {**{k: j[k] for k in ("id", "image", "caption", "refs")}, "ratings": [1 + k % 4, 1 + (k + 1) % 4, 2]}
            for k, j in enumerate(judged)])
        self.shards = self.bleu_shards()
        self.cache = root / "cache"
        self.caprecon(["score", "-i", self.rows, "-m", "recon", *self.world, "--cache-dir", self.cache,
                       "--out", root / "cached-run", "-q"])

    # the scripted models, as options
    world = ["-g", "oracle:OracleGenerator", "--embedder", "oracle:PixelEmbedder", "--max-side", "32"]
    judge = ["--judge", "broken_models:PickyJudge"]

    def text(self, name: str, text: str) -> Path:
        path = self.root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        return path

    def jsonl(self, name: str, rows: list) -> Path:
        return self.text(name, "".join(json.dumps(r) + "\n" for r in rows))

    def folder(self, name: str, rows: list, manifest: dict | None = None) -> Path:
        self.jsonl(f"{name}/scores.jsonl", rows)
        if manifest is not None:
            self.text(f"{name}/manifest.json", json.dumps(manifest))
        return self.root / name

    def caprecon(self, argv: list) -> None:
        done = subprocess.run([sys.executable, "-m", "caprecon.cli", *map(str, argv)], cwd=self.root,
                              env=environment(), capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            raise SystemExit(f"setting up the workspace failed: caprecon {' '.join(map(str, argv))}\n{done.stderr}")

    def bleu_shards(self) -> list[Path]:
        folders = [self.root / f"shard{i}" for i in range(2)]
        for i, folder in enumerate(folders):
            self.caprecon(["score", "-i", self.rows, "-m", "bleu-4", "--shard", f"{i}/2", "--out", folder, "-q"])
        return folders

    def copy(self, source: Path, name: str) -> Path:
        import shutil

        target = self.root / name
        if not target.exists():
            shutil.copytree(source, target)
        return target

    def fifo(self, name: str) -> Path:
        path = self.root / name
        if not path.exists():
            os.mkfifo(path)
        return path

    def refine(self, *extra) -> list:
        return ["refine", "-i", self.rows, "--llm", "refine_fakes:ReviserLLM", *self.world,
                "--judge", "refine_fakes:DescribingVLM", "--qa-bank", self.bank, "--cache-dir", self.root / "c-refine",
                "-q", *extra]

    def t2i(self, *extra) -> list:
        return ["t2i", "-g", "oracle:OracleGenerator", *self.judge, "--size", "32x32", "--cache-dir",
                self.root / "c-t2i", "-q", *extra]

    def suite(self, *extra) -> list:
        return ["suite", "-g", "oracle:OracleGenerator", *self.judge, "--size", "32x32", "--cache-dir",
                self.root / "c-suite", "-q", *extra]

    def audit(self, *extra) -> list:
        return ["reward-audit", "-m", "recon", *self.world, "--cache-dir", self.root / "c-audit", *extra]


SOURCE = ROOT / "src"  # the caprecon under attack (--src: another checkout's, e.g. an earlier commit's)


def environment() -> dict:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error",
            "PYTHONPATH": os.pathsep.join(filter(None, [str(TESTS), str(SOURCE), os.environ.get("PYTHONPATH")]))}


def out(w: Workspace, name: str) -> Path:
    return w.root / "outs" / name


CASES = [
    # --- refine
    Case("refine: a row that is a JSON list, not an object", "malformed row",
         lambda w: w.refine("-i", w.text("list-row.jsonl", '["a", "red.png", "a red square"]\n'),
                            "--out", out(w, "r1")), ("list-row.jsonl:1",)),
    Case("refine: --input is a folder", "folder for a file",
         lambda w: w.refine("-i", w.root / "run", "--out", out(w, "r2")), ("run", "captions file")),
    Case("refine: --input is a FIFO nobody writes", "odd file",
         lambda w: w.refine("-i", w.fifo("pipe.jsonl"), "--out", out(w, "r3")), ("--input", "pipe.jsonl")),
    Case("refine: --holdout nan", "out of range",
         lambda w: w.refine("--holdout", "nan", "--out", out(w, "r4")), ("--holdout",)),
    Case("refine: --feedback that is no source", "out of range",
         lambda w: w.refine("--feedback", "flipped,gossip", "--out", out(w, "r5")), ("--feedback", "gossip")),
    Case("refine: --select naming a metric twice", "conflicting options",
         lambda w: w.refine("--select", "recon=0.5,recon=0.5", "--out", out(w, "r6")), ("recon",)),
    Case("refine: --select with an unknown metric", "out of range",
         lambda w: w.refine("--select", "reconn", "--out", out(w, "r7")), ("reconn",)),
    Case("refine: two rows with one id", "duplicate ids",
         lambda w: w.refine("-i", w.jsonl("dup-refine.jsonl", [{"id": "a", "image": "red.png", "caption": "x"}] * 2),
                            "--out", out(w, "r8")), ("'a'",)),
    Case("refine: --config with rounds as text", "config wrong type",
         lambda w: w.refine("--config", w.text("rounds.yaml", "seed: many\n"), "--out", out(w, "r9")), ("seed",)),
    Case("refine: resumed with another --holdout than the folder's run", "conflicting options",
         lambda w: w.refine("--holdout", "0.25", "--out", refined_once(w, "r11")), ("other captions or settings",)),
    Case("refine: --out '' (an unset shell variable)", "odd path",
         lambda w: w.refine("--out", ""), ("--out", "empty")),
    Case("refine: --input ''", "odd path",
         lambda w: w.refine("-i", "", "--out", out(w, "r10")), ("--input", "empty")),
    # --- halluc (score -m halluc)
    Case("halluc: --beta nan", "out of range",
         lambda w: ["score", "-i", w.rows, "-m", "halluc", "--judge", "halluc_fakes:PixelJudge", "--llm",
                    "halluc_fakes:ClaimLLM", "--beta", "nan", "--out", out(w, "h1")], ("--beta",)),
    Case("halluc: --beta 0", "out of range",
         lambda w: ["score", "-i", w.rows, "-m", "halluc", "--judge", "halluc_fakes:PixelJudge", "--llm",
                    "halluc_fakes:ClaimLLM", "--beta", "0", "--out", out(w, "h2")], ("--beta",)),
    # --- compare and seeds
    Case("compare: a score that is text", "wrong type",
         lambda w: ["compare", w.folder("text-score", [{"id": "a0", "image_id": "i", "captioner": "x",
                                                        "recon": "0.5"}, {"id": "b0", "image_id": "i",
                                                                          "captioner": "y", "recon": 0.4}])],
         ("recon", "a0")),
    Case("compare: an empty scores.jsonl", "empty file",
         lambda w: ["compare", w.folder("empty-run", []), w.run_y], ("empty-run",)),
    Case("compare: a folder without scores.jsonl", "missing file",
         lambda w: ["compare", w.root / "shard0" / "report_files", w.run_y], ("scores.jsonl",)),
    Case("compare: --by a field no row has", "missing column",
         lambda w: ["compare", w.run, "--by", "model"], ("'model'", "found 0")),
    Case("compare: rows without image_id", "missing column",
         lambda w: ["compare", w.folder("no-image-id", [{"id": "a", "captioner": "x", "recon": 0.4},
                                                        {"id": "b", "captioner": "y", "recon": 0.5}])],
         ("image_id",)),
    Case("compare: --out ''", "odd path",
         lambda w: ["compare", w.run_x, w.run_y, "--out", ""], ("--out", "empty")),
    Case("compare: scores.jsonl a symlink to itself", "symlink",
         lambda w: ["compare", loop(w, "loop-run"), w.run_y], ("scores.jsonl",)),
    Case("seeds: per-seed scores that are text", "wrong type",
         lambda w: ["seeds", w.folder("text-seeds", [{"id": f"s{i}", "image_id": f"i{i}", "recon": 0.1,
                                                      "recon_seeds": "0.1,0.2"} for i in range(3)]),
                    "--out", out(w, "s1")], ("recon_seeds",)),
    Case("seeds: a run of one seed per caption", "out of range",
         lambda w: ["seeds", w.folder("one-seed", [{"id": f"s{i}", "image_id": f"i{i}", "recon": 0.1 * i,
                                                    "recon_seeds": [0.1 * i]} for i in range(3)]),
                    "--out", out(w, "s2")], ("seed",)),
    Case("seeds: the run ''", "odd path",
         lambda w: ["seeds", "", "--out", out(w, "s5")], ("run", "empty")),
    Case("seeds: scores.jsonl is a folder", "folder for a file",
         lambda w: ["seeds", folder_named(w, "dir-scores"), "--out", out(w, "s3")], ("scores.jsonl",)),
    Case("seeds: a truncated last line", "malformed row",
         lambda w: ["seeds", truncated(w, "cut-run"), "--out", out(w, "s4")],
         ("scores.jsonl:9",)),
    # --- a model server that cannot be reached: what happened and what to do, the password masked
    Case("score: a judge server that refuses connections, its URL with a password", "unreachable server",
         lambda w: ["score", "-i", w.rows, "-m", "vqascore", "--judge", "m1", "--judge-opt",
                    f"base_url=http://user:pw-4242@127.0.0.1:{closed_port()}/v1", "--judge-opt", "max_retries=0",
                    "--no-cache", "--out", out(w, "srv1"), "-q"],
         ("the model server failed", "***@127.0.0.1", "once the server answers")),
    # --- report
    Case("report: a manifest.json that is not JSON", "malformed file",
         lambda w: ["report", with_manifest(w, "bad-manifest", "{not json")], ("manifest.json",),
         warned=True),
    Case("report: a manifest.json that is a JSON list", "wrong type",
         lambda w: ["report", with_manifest(w, "list-manifest", json.dumps([{"config": {}}]))], ("manifest.json",),
         warned=True),
    Case("report: --metric that the run lacks, in another script", "odd name",
         lambda w: ["report", w.run, "--metric", "réc\u00f6n"], ("réc\u00f6n",)),
    # --- merge
    Case("merge: one shard given twice", "duplicate ids",
         lambda w: ["merge", w.shards[0], w.shards[0], "--out", out(w, "m1")], ("shard", "twice")),
    Case("merge: a shard whose manifest says shard 'x'", "wrong type",
         lambda w: ["merge", w.shards[0], forged_shard(w), "--out", out(w, "m2")], ("manifest",)),
    Case("merge: one of two shards", "missing file",
         lambda w: ["merge", w.shards[1], "--out", out(w, "m3")], ("shard",)),
    Case("merge: --input another file than the shards'", "wrong file",
         lambda w: ["merge", *w.shards, "-i", w.jsonl("not-the-input.jsonl", [
             {"id": "a", "image": "red.png", "caption": "a red square!"}]), "--out", out(w, "m4")],
         ("--input", "not the input the shards were scored from")),
    Case("merge: one id in two shards", "duplicate ids",
         lambda w: ["merge", w.shards[0], same_id_shard(w), "--out", out(w, "m5")],
         ("more than once", "same-id-shard")),
    # --- meta --fit and verify
    Case("meta --fit: --scores with a text score", "wrong type",
         lambda w: ["meta", "--judgments", w.judgments, "--scores", w.jsonl("text-scores.jsonl", [
             {**s, "cider": "high"} if i == 4 else s for i, s in enumerate(w.scored)]), "--metric", "bleu-1",
                    "cider", "--fit", "--bootstrap", "0", "--out", out(w, "f1")], ("cider",)),
    Case("meta --fit: human ratings that are NaN", "out of range",
         lambda w: ["meta", "--judgments", w.jsonl("nan-judged.jsonl", [{**j, "human": float("nan")} if i < 3 else j
                                                                       for i, j in enumerate(w.judged)]),
                    "--scores", w.scores, "--metric", "bleu-1", "cider", "--fit", "--bootstrap", "0", "--out",
                    out(w, "f2")], ("human",)),
    Case("meta --fit: --folds 1", "out of range",
         lambda w: ["meta", "--judgments", w.judgments, "--scores", w.scores, "--metric", "bleu-1", "cider", "--fit",
                    "--folds", "1", "--out", out(w, "f3")], ("--folds",)),
    Case("meta --fit: an empty --judgments file", "empty file",
         lambda w: ["meta", "--judgments", w.text("empty-judged.jsonl", ""), "--scores", w.scores, "--metric",
                    "bleu-1", "--fit", "--out", out(w, "f4")], ("empty-judged.jsonl",)),
    Case("meta verify: --expected without a value column", "missing column",
         lambda w: ["meta", "verify", "--benchmark", "flickr8k-expert", "--data", w.expert, "--scores", w.scores,
                    "--expected", w.text("expected.csv", "benchmark,metric,key\nflickr8k-expert,bleu-1,tau_c\n")],
         ("expected.csv",)),
    Case("meta verify: --expected is a folder", "folder for a file",
         lambda w: ["meta", "verify", "--benchmark", "flickr8k-expert", "--data", w.expert, "--scores", w.scores,
                    "--expected", w.root / "run"], ("--expected",)),
    # --- suite
    Case("suite: a suite file whose datasets is a text", "config wrong type",
         lambda w: w.suite("--suite", w.text("suite.yaml", "datasets: mme\n"), "--captions",
                           f"pub={w.card_captions}"), ("datasets",)),
    Case("suite: a suite file listing a number", "config wrong type",
         lambda w: w.suite("--suite", w.text("suite-number.yaml", "datasets: [5]\n"), "--captions",
                           f"pub={w.card_captions}"), ("datasets", "5")),
    Case("suite: --captions with no file after the label", "malformed option",
         lambda w: w.suite("--suite", "mme", "--data", w.tsv, "--captions", "pub="), ("--captions",)),
    Case("suite: --data is a folder", "folder for a file",
         lambda w: w.suite("--suite", "mme", "--data", w.root / "run", "--captions", f"pub={w.card_captions}"),
         ("--data",)),
    Case("suite: --config with seed as a list", "config wrong type",
         lambda w: w.suite("--suite", "mme", "--data", w.tsv, "--captions", f"pub={w.card_captions}",
                           "--config", w.text("suite-seed.yaml", "seed: [1, 2]\n")), ("seed",)),
    Case("suite: a caption that is a number", "wrong type",
         lambda w: w.suite("--suite", "mme", "--data", w.tsv, "--captions", "pub=" + str(w.jsonl(
             "number-captions.jsonl", [{"dataset": "mme", "index": "0", "caption": 7}]))), ("caption",)),
    # --- t2i
    Case("t2i: --size 0x32", "out of range",
         lambda w: w.t2i("-i", w.rows, "--size", "0x32", "--out", out(w, "t1")), ("size 0x32", "positive")),
    Case("t2i: --caption-column no row has", "missing column",
         lambda w: w.t2i("-i", w.rows, "--caption-column", "prompt", "--out", out(w, "t2")), ("prompt",)),
    Case("t2i: --config with generators a number", "config wrong type",
         lambda w: ["t2i", "-i", w.rows, "--config", w.text("gens.yaml", "generators: 5\n"), "--out", out(w, "t3")],
         ("generators",)),
    Case("t2i: two generators with one label", "conflicting options",
         lambda w: w.t2i("-i", w.rows, "-g", "a=oracle:OracleGenerator", "-g", "a=broken_models:PickyGenerator",
                         "--out", out(w, "t4")), ("'a'",)),
    Case("t2i: --input a symlink to a missing file", "symlink",
         lambda w: w.t2i("-i", dangling(w, "gone.jsonl"), "--out", out(w, "t5")), ("--input", "gone.jsonl")),
    # --- cache
    Case("cache prune: --max-size beyond any float", "out of range",
         lambda w: ["cache", "prune", "--cache-dir", w.cache, "--max-size", "1" + "0" * 400 + "GB", "--dry-run"],
         ("--max-size",)),
    Case("cache prune: no criterion", "conflicting options",
         lambda w: ["cache", "prune", "--cache-dir", w.cache], ("--older-than",)),
    Case("cache info: --cache-dir is a file", "folder for a file",
         lambda w: ["cache", "info", "--cache-dir", w.rows], ("--cache-dir",)),
    Case("cache verify: an index that is not SQLite", "malformed file",
         lambda w: ["cache", "verify", "--cache-dir", garbage_index(w)], ("index.sqlite", "not a database", "--repair"),
         codes=(1,)),
    Case("cache verify: index.sqlite is a folder", "folder for a file",
         lambda w: ["cache", "verify", "--cache-dir", folder_index(w)], ("index.sqlite", "a folder", "--repair"),
         codes=(1,)),
    Case("cache prune: --older-than 1e400d", "out of range",
         lambda w: ["cache", "prune", "--cache-dir", w.cache, "--older-than", "1" + "0" * 400 + "d", "--dry-run"],
         ("--older-than",)),
    # --- distill
    Case("distill: --epochs 10**9", "out of range",
         lambda w: ["distill", w.root / "cached-run", "-m", "recon", "--epochs", str(10**9), "--out", out(w, "d1")],
         ("--epochs",)),
    Case("distill: --hidden 10**9", "out of range",
         lambda w: ["distill", w.root / "cached-run", "-m", "recon", "--hidden", str(10**9), "--out", out(w, "d2")],
         ("--hidden",)),
    Case("distill: one run given twice", "duplicate ids",
         lambda w: ["distill", w.root / "cached-run", w.root / "cached-run", "-m", "recon", "--out", out(w, "d3")],
         ("cached-run", "twice")),
    Case("distill: a metric the runs lack", "missing column",
         lambda w: ["distill", w.run, "-m", "turing", "--out", out(w, "d4")], ("turing",)),
    Case("distill: --out an existing file", "folder for a file",
         lambda w: ["distill", w.run, "-m", "recon", "--out", w.rows], ("--out",)),
    # --- reward-audit
    Case("reward-audit: --weight recon=abc", "wrong type",
         lambda w: w.audit("-i", w.rows, "--weight", "recon=abc"), ("--weight", "abc")),
    Case("reward-audit: --weight for a metric not in the reward", "conflicting options",
         lambda w: w.audit("-i", w.rows, "--weight", "clipscore=2"), ("clipscore",)),
    Case("reward-audit: an empty --input", "empty file",
         lambda w: w.audit("-i", w.text("empty.jsonl", "")), ("holds no rows",)),
    Case("reward-audit: --json is a folder", "folder for a file",
         lambda w: w.audit("-i", w.rows, "--json", w.root / "run"), ("--json",)),
    Case("reward-audit: --weight recon=nan", "out of range",
         lambda w: w.audit("-i", w.rows, "--weight", "recon=nan"), ("--weight",)),
    # --- issue 51: distill's reconstructions by key, damaged distilled folders, non-finite values, audits of nothing
    Case("distill: a row naming /etc/passwd as its reconstruction", "path escape",
         lambda w: ["distill", recon_rows(w, "d-passwd", reconstruction="/etc/passwd"), "-m", "recon",
                    "--objective", "reconstruction", "--out", out(w, "d5"), "-q"], ("/etc/passwd", "store")),
    Case("distill: a NaN metric value", "out of range",
         lambda w: ["distill", recon_rows(w, "d-nan", value=float("nan")), "-m", "recon", "--out", out(w, "d6"),
                    "-q"], ("scores.jsonl:1", "finite")),
    Case("distill: an infinite metric value", "out of range",
         lambda w: ["distill", recon_rows(w, "d-inf", value=float("inf")), "-m", "recon", "--out", out(w, "d7"),
                    "-q"], ("scores.jsonl:1", "finite")),
    *(Case(f"score -m distilled: {what}", kind,
           lambda w, what=what: ["score", "-i", w.rows, "-m", f"distilled:{damaged(w, what)}", *w.world,
                                 "--cache-dir", w.cache, "--out", out(w, f"ds-{what.replace(' ', '-')}"), "-q",
                                 *([] if what.startswith("plug-in") else ["--allow-plugins"])],
           names) for what, kind, names in (
        ("pickled weights", "malformed file", ("model.safetensors", "not a safetensors")),
        ("empty weights", "empty file", ("model.safetensors", "not a safetensors")),
        ("config not JSON", "malformed file", ("config.json", "not valid JSON")),
        ("config lacking hidden", "missing column", ("config.json", "lacks hidden")),
        ("hidden as text", "config wrong type", ("config.json", "hidden")),
        ("sizes not the weights'", "malformed file", ("model.safetensors", "do not belong together")),
        ("a config asking for 40 TB", "out of range", ("config.json", "image_dim")),
        ("an encoder in /etc", "path escape", ("config.json", "/etc")),
        ("plug-in encoders without --allow-plugins", "plug-in", ("--allow-plugins",)))),
    Case("reward-audit: one caption", "empty file",
         lambda w: w.audit("-i", w.jsonl("one.jsonl", [json.loads(w.rows.read_text().splitlines()[0])])),
         ("at least 3",)),
    Case("reward-audit: every image missing", "missing file",
         lambda w: w.audit("-i", w.jsonl("gone.jsonl", [{"id": str(k), "image": f"gone{k}.png", "caption": "a cat"}
                                                        for k in range(3)])), ("cannot be read", "gone0.png")),
    # --- benchmark loaders: images outside their root (issue 51, item 2)
    Case("meta caparena: a battle's img leading out of --images", "path escape",
         lambda w: ["meta", "--benchmark", "caparena", "--data", arena(w, "arena-escape", [
             battle("../outside/secret.png", "A", "B", "A"), *DECIDED]), "--images", outside(w), "--metric", "recon",
                    *w.world, "--cache-dir", w.root / "c-meta", "--human-ranking", "recomputed", "--bootstrap", "0",
                    "--out", out(w, "b1")], ("lies outside --images", "secret.png"), warned=True),
    Case("meta nebula (EXPERT): an imgid leading out of --images", "path escape",
         lambda w: ["meta", "--benchmark", "nebula-raw", "--data", w.text("expert-ann/nebula_test.json", json.dumps([
             {"imgid": "../../outside/secret", "mt": "a red square", "refs": ["r"], "score": 0.5},
             {"imgid": "red", "mt": "a blue circle", "refs": ["r"], "score": 0.1}])), "--images", outside(w),
                    "--metric", "recon", *w.world, "--cache-dir", w.root / "c-meta", "--bootstrap", "0",
                    "--out", out(w, "b2")], ("lies outside --images", "secret.jpg"), warned=True),
    # --- CapArena files (item 9)
    Case("meta caparena: a winner outside the labels", "out of range",
         lambda w: arena_meta(w, "arena-tie", [*DECIDED, battle("x.png", "A", "B", "Tie")], "b3"),
         ("[3]", "winner 'Tie'")),
    Case("meta caparena: a model against itself and a repeated battle", "duplicate ids",
         lambda w: arena_meta(w, "arena-dup", [*DECIDED, battle("x.png", "A", "A", "equal"), DECIDED[0]], "b4"),
         ("against itself",), warned=True),
    Case("meta caparena: every battle has the human caption", "empty file",
         lambda w: arena_meta(w, "arena-human", [battle(f"{k}.png", "A", "human", "human") for k in range(3)], "b5"),
         ("every battle involves the human caption",)),
    Case("meta caparena --model-level: only two models", "out of range",
         lambda w: arena_meta(w, "arena-two", [battle("1.png", "A", "B", "A"), battle("2.png", "A", "B", "B")], "b6",
                              "--model-level"), ("±1 by construction",)),
    Case("meta caparena: only ties", "out of range",
         lambda w: arena_meta(w, "arena-ties", [battle("1.png", "A", "B", "equal"), battle("2.png", "B", "C", "skip"),
                                                battle("3.png", "A", "C", "bad")], "b7"), ("a tie",)),
    # --- EXPERT and Pascal-50S fields of the wrong type (item 10)
    Case("meta nebula (EXPERT): mt a number", "wrong type",
         lambda w: expert_meta(w, "mt-number", {"mt": 7}), ("[1]", "mt must be text")),
    Case("meta nebula (EXPERT): refs a string", "wrong type",
         lambda w: expert_meta(w, "refs-string", {"refs": "a cat|a dog"}), ("[1]", "refs must be a list")),
    Case("meta nebula (EXPERT): a NaN score", "out of range",
         lambda w: expert_meta(w, "nan-score", {"score": float("nan")}), ("[1]", "score nan")),
    Case("meta nebula (EXPERT): an empty list", "empty file",
         lambda w: ["meta", "--benchmark", "nebula-raw", "--data", w.text("empty-nebula/nebula_test.json", "[]"),
                    "--metric", "bleu-1", "--out", out(w, "b8")], ("the list is empty",)),
    Case("meta pascal50s: references a string", "wrong type",
         lambda w: pascal_meta(w, "refs-string", {"HC": [{**PAIR, "references": "a jet|a plane"}]}),
         ("HC[0]", "references must be a list")),
    Case("meta pascal50s: an unknown category", "out of range",
         lambda w: pascal_meta(w, "category", {"HC": [PAIR], "XY": [PAIR]}), ("unknown category 'XY'",)),
    # --- meta --fit and verify (items 18, 19)
    Case("meta --fit: an infinite score", "out of range",
         lambda w: ["meta", "--judgments", w.judgments, "--scores", w.jsonl("inf-scores.jsonl", [
             {**s, "cider": float("inf")} if i == 4 else s for i, s in enumerate(w.scored)]), "--metric", "bleu-1",
                    "cider", "--fit", "--bootstrap", "0", "--out", out(w, "f5")], ("cider", "infinite", "1-1")),
    Case("meta verify: --fit", "conflicting options",
         lambda w: ["meta", "verify", "--benchmark", "pascal50s", "--data", pascal(w, "fit", {"HC": [PAIR]}),
                    "--fit"], ("--fit", "fits nothing")),
    # --- cttd import (item 20)
    Case("cttd import: a VLMEvalKit image that is not base64", "wrong type",
         lambda w: ["cttd", "import", w.text("not-base64.tsv", "index\timage\tquestion\tanswer\n"
                                                               "0\t@@not base64@@\tIs it red?\tYes\n"),
                    "--format", "vlmevalkit", "--out", out(w, "c1")], ("image not base64",), codes=(1,)),
]

PAIR = {"image": "red.png", "captions": ["a plane", "an airplane"], "label": 0, "references": ["a jet"]}


def battle(img: str, a: str, b: str, winner: str) -> dict:
    return {"img": img, "source1": a, "source2": b, "caption1": f"{a} describes {img}",
            "caption2": f"{b} describes {img}", "ref": "r", "winner": winner, "cluster": "level 1"}


DECIDED = [battle("red.png", "A", "B", "A"), battle("blue.png", "B", "C", "C"), battle("red.png", "A", "C", "A")]


def outside(w: Workspace) -> Path:
    """An images folder holding the two shapes, beside a folder `outside/` with a secret picture."""
    import shutil

    images = w.root / "bench-images"
    if not images.exists():
        (images / "Nebula").mkdir(parents=True)
        for name in ("red.png", "blue.png"):
            shutil.copy(w.root / name, images / name)
        shutil.copy(w.root / "red.png", images / "Nebula" / "red.jpg")
        (w.root / "outside").mkdir()
        shutil.copy(w.root / "blue.png", w.root / "outside" / "secret.png")
        shutil.copy(w.root / "blue.png", w.root / "outside" / "secret.jpg")
    return images


def arena(w: Workspace, name: str, battles: list) -> Path:
    w.text(f"{name}/caparena_annots_eval.json", json.dumps(battles))
    return w.root / name


def arena_meta(w: Workspace, name: str, battles: list, out_name: str, *extra) -> list:
    return ["meta", "--benchmark", "caparena", "--data", arena(w, name, battles), "--metric", "bleu-1",
            "--human-ranking", "recomputed", "--bootstrap", "0", "--out", out(w, out_name), *extra]


def expert_meta(w: Workspace, name: str, change: dict) -> list:
    entry = {"imgid": "red", "mt": "a red square", "refs": ["a red square"], "score": 0.5}
    data = w.text(f"expert-{name}/nebula_test.json", json.dumps([entry, {**entry, **change}]))
    return ["meta", "--benchmark", "nebula-raw", "--data", data, "--metric", "bleu-1", "--out", out(w, f"e-{name}")]


def pascal(w: Workspace, name: str, data: dict) -> Path:
    return w.text(f"pascal-{name}/pascal50s.json", json.dumps(data))


def pascal_meta(w: Workspace, name: str, data: dict) -> list:
    return ["meta", "--benchmark", "pascal50s", "--data", pascal(w, name, data), "--metric", "bleu-1",
            "--out", out(w, f"p-{name}")]


def recon_rows(w: Workspace, name: str, *, reconstruction: str | None = None, value: float | None = None) -> Path:
    """The cached recon run, its first row's reconstruction or value replaced."""
    folder = w.copy(w.root / "cached-run", name)
    records = [json.loads(line) for line in (w.root / "cached-run" / "scores.jsonl").read_text().splitlines()]
    for k, record in enumerate(records):
        if k == 0 and reconstruction is not None:
            record["reconstruction"] = reconstruction
        if k == 0 and value is not None:
            record["recon"] = value
    (folder / "scores.jsonl").write_text("\n".join(json.dumps(r) for r in records))  # NaN, Infinity as json writes them
    return folder


def damaged(w: Workspace, what: str) -> Path:
    """A distilled folder of the cached run (the shapes world's encoders, as plug-ins), damaged as `what` says."""
    import shutil

    base = w.root / "distilled"
    if not base.exists():
        w.caprecon(["distill", w.root / "cached-run", "-m", "recon", "--image-encoder", "oracle:PixelEmbedder",
                    "--text-encoder", "cttd_fakes:WordMatcher", "--holdout", "0.5", "--epochs", "2", "--hidden", "4",
                    "--cache-dir", w.cache, "--out", base, "-q"])
    folder = w.root / f"distilled-{what.replace(' ', '-')}"
    if folder.exists():
        return folder
    shutil.copytree(base, folder)
    config = json.loads((folder / "config.json").read_text())
    weights = folder / "model.safetensors"
    changed = {"config lacking hidden": {k: v for k, v in config.items() if k != "hidden"},
               "hidden as text": {**config, "hidden": "four"},
               "sizes not the weights'": {**config, "hidden": config["hidden"] + 1},
               "a config asking for 40 TB": {**config, "image_dim": 10**7, "hidden": 10**6},
               "an encoder in /etc": {**config, "image_encoder": "/etc"}}.get(what)
    if changed is not None:
        (folder / "config.json").write_text(json.dumps(changed))
    elif what == "pickled weights":
        import pickle

        weights.write_bytes(pickle.dumps({"head": [1.0, 2.0]}))
    elif what == "empty weights":
        weights.write_bytes(b"")
    elif what == "config not JSON":
        (folder / "config.json").write_text("{'hidden': 4,")
    return folder  # plug-in encoders without --allow-plugins: the folder as distill wrote it
# what a `python=True` case runs: its lines inside caprecon's own refusals, reported as the command line does
PYTHON_PRELUDE = """\
import logging, sys
logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s %(message)s")  # a program's own handler
import caprecon
from caprecon.core import errors
from caprecon.run.failures import RunError
from oracle import OracleGenerator, PixelEmbedder, render
# an earlier caprecon (--before) may lack some of them
REFUSALS = (RunError, *(getattr(errors, name) for name in ("ConfigError", "MetricContractError", "ServerError")
                        if hasattr(errors, name)))
try:
{body}
except REFUSALS as exc:
    print(f"caprecon: error: {{exc}}", file=sys.stderr)
    sys.exit(2)
"""


def reward_call(call: str, **options: str) -> Callable[[Workspace], str]:
    """A case's code: a `Reward` over the shapes world (its `options` added, as Python source) called as `call`."""
    settings = ", ".join(f"{k}={v}" for k, v in {"generator": "OracleGenerator()", "embedder": "PixelEmbedder()",
                                                  "max_side": "32", **options}.items())

    def code(w: Workspace) -> str:  # no progress bar where the reward has one (an earlier caprecon's has not)
        return (f"quiet = {{'progress': False}} if 'progress' in __import__('inspect').signature(caprecon.Reward)"
                f".parameters else {{}}\n"
                f"reward = caprecon.Reward(['recon'], cache_dir={str(w.root / 'c-reward')!r}, {settings}, **quiet)\n"
                f"picture = render('a red square', 32, 32)\n"
                f"print(reward{call})\n")
    return code


def breaking_rows(w: Workspace) -> Path:
    """Four captions of one picture, the last two saying "break" (tests/contract_metrics.py breaks there)."""
    return w.jsonl("breaking.jsonl", [{"id": f"b{k}", "image": "red.png", "caption": caption} for k, caption in
                                      enumerate(["one two", "one two three", "please break now", "break here"])])


def contract_case(kind: str, name: str, problem: str) -> Case:
    """`score` with tests/contract_metrics.py's metric `kind`, which breaks the contract in its second batch."""
    return Case(f"score: a plug-in metric whose {problem}", "broken plug-in",
                lambda w: ["score", "-i", breaking_rows(w), "-m", "contract_metrics:Words", "-m",
                           f"contract_metrics:{kind}", "--batch-size", "2", "--cache-dir", w.root / "c-contract",
                           "--out", out(w, f"contract-{name}"), "-q"], ("metric contract", name))


CASES += [
    # --- the metric contract, on every call (score on the command line; reward-audit through the Reward)
    contract_case("FewerRows", "fewer-rows", "score returns fewer rows than items"),
    contract_case("NoRows", "no-rows", "score returns no rows at all"),
    contract_case("ExtraRows", "extra-rows", "score returns more rows than items"),
    contract_case("MissingColumn", "missing-column", "rows lack its declared column"),
    contract_case("TextValue", "text-value", "declared number is text"),
    contract_case("OutOfRange", "out-of-range", "value lies outside its declared range"),
    contract_case("NotADict", "not-a-dict", "rows are numbers, not dicts"),
    contract_case("BadDirection", "bad-direction", "column's direction is 'up'"),
    contract_case("LowAboveHigh", "low-above-high", "range has low above high"),
    Case("reward-audit: a plug-in metric that returns fewer rows than items", "broken plug-in",
         lambda w: ["reward-audit", "-i", breaking_rows(w), "-m", "contract_metrics:FewerRows", *w.world,
                    "--cache-dir", w.root / "c-audit-contract"], ("metric contract", "fewer-rows")),
    # --- caprecon.Reward from Python: TRL-shaped inputs, settings, the metric contract, secrets in its logs
    Case("Reward: a message whose content is a number", "wrong type",
         reward_call("(completions=[[{'role': 'assistant', 'content': 42}]], image=[picture])"),
         ("completion 0", "content is an int"), python=True),
    Case("Reward: a text part that is a number", "wrong type",
         reward_call("(completions=[[{'role': 'assistant', 'content': [{'type': 'text', 'text': 7}]}]], "
                     "image=[picture])"), ("completion 0", "text part"), python=True),
    Case("Reward: a caption that is a number", "wrong type",
         reward_call("([picture, picture], ['a red square', 42])"), ("caption 1", "not text"), python=True),
    Case("Reward: one string for the captions", "wrong type",
         reward_call("([picture], 'a red square')"), ("captions must be a list",), python=True),
    Case("Reward: fewer pictures than completions", "mismatched lengths",
         reward_call("(completions=['a red square'] * 3, image=[picture] * 2)"), ("2 images but 3 completions",),
         python=True),
    Case("Reward: empty=nan", "out of range", reward_call("([picture], [''])", empty="float('nan')"),
         ("empty", "nan"), python=True),
    Case("Reward: Guards(length_target=nan)", "out of range",
         reward_call("([picture], ['a red square'])", guards="caprecon.Guards(length_target=float('nan'))"),
         ("length_target", "nan"), python=True),
    Case("Reward: Guards(repetition_n=2.5)", "wrong type",
         reward_call("([picture], ['a red square'])", guards="caprecon.Guards(repetition_n=2.5)"),
         ("repetition_n", "2.5"), python=True),
    Case("Reward: a metric named twice", "conflicting options",
         lambda w: reward_call("([picture], ['a red square'])")(w).replace("['recon']", "['recon', 'recon']"),
         ("recon", "more than once"), python=True),
    Case("Reward: a plug-in metric that returns fewer rows than items (hung at full CPU)", "broken plug-in",
         lambda w: reward_call("([picture] * 2, ['one two', 'please break'])")(w).replace(
             "['recon']", "[__import__('contract_metrics').FewerRows()]"), ("metric contract", "fewer-rows"),
         python=True),
    Case("Reward: a judge server's URL password, unreachable, retried", "secret",
         lambda w: reward_call("([picture], ['a red square'])")(w).replace("['recon']", "['vqascore']").replace(
             "max_side=32", "max_side=32, judge='m', judge_options={'base_url': "
             "'http://user:pw-attack-5150@127.0.0.1:9/v1', 'max_retries': 2, 'backoff': 0.0}"),
         ("cannot reach",), warned=True, python=True, absent=("pw-attack-5150",)),
    # the reward service's client and command (a review of the training path's inputs)
    Case("RemoteReward: a URL with user:password@ (urllib took it for a host, errors showed it)", "secret",
         lambda w: "caprecon.RemoteReward('http://bob:pw-attack-7311@127.0.0.1:9', retries=0)\n",
         ("user name or password", "bearer token"), python=True, absent=("pw-attack-7311",)),
    Case("RemoteReward: a token with a newline (http.client's error quoted it)", "secret",
         lambda w: ("reward = caprecon.RemoteReward('http://127.0.0.1:9', token='tok-attack-8822\\n', retries=0)\n"
                    "print(reward([render('a red square', 32, 32)], ['a red square']))\n"),
         ("token", "http header cannot carry"), python=True, absent=("tok-attack-8822",)),
    Case("serve: --token-env naming a variable that is unset (served open)", "missing secret",
         lambda w: ["serve", "-m", "recon", "--token-env", "CAPRECON_ATTACK_UNSET_TOKEN", "--preset", "offline"],
         ("--token-env CAPRECON_ATTACK_UNSET_TOKEN names", "unset or empty")),
]


def truncated(w: Workspace, name: str) -> Path:
    """The run of two systems, its last line cut off mid-row (a run killed while it wrote)."""
    folder = w.copy(w.run, name)
    (folder / "scores.jsonl").write_text((w.run / "scores.jsonl").read_text() + '{"id": "z9", "recon_se')
    return folder


def loop(w: Workspace, name: str) -> Path:
    folder = w.root / name
    folder.mkdir(exist_ok=True)
    link = folder / "scores.jsonl"
    if not link.is_symlink():
        link.symlink_to("scores.jsonl")
    return folder


def dangling(w: Workspace, name: str) -> Path:
    link = w.root / name
    if not link.is_symlink():
        link.symlink_to(w.root / "nothing-here.jsonl")
    return link


def folder_named(w: Workspace, name: str) -> Path:
    (w.root / name / "scores.jsonl").mkdir(parents=True, exist_ok=True)
    return w.root / name


def with_manifest(w: Workspace, name: str, text: str) -> Path:
    folder = w.copy(w.run, name)
    (folder / "manifest.json").write_text(text)
    return folder


def forged_shard(w: Workspace) -> Path:
    folder = w.copy(w.shards[1], "forged-shard")
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["shard"] = "x" if not isinstance(manifest.get("shard"), dict) else {**manifest["shard"], "index": "x"}
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return folder


def same_id_shard(w: Workspace) -> Path:
    """The second shard, its row given the id of the first shard's row."""
    folder = w.copy(w.shards[1], "same-id-shard")
    taken = json.loads((w.shards[0] / "scores.jsonl").read_text().splitlines()[0])["id"]
    rows = [{**json.loads(line), "id": taken} for line in (folder / "scores.jsonl").read_text().splitlines()]
    (folder / "scores.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def folder_index(w: Workspace) -> Path:
    folder = w.root / "folder-index-cache"
    (folder / "index.sqlite").mkdir(parents=True, exist_ok=True)
    return folder


def refined_once(w: Workspace, name: str) -> Path:
    """A folder holding a finished refinement of the workspace's rows, at the default --holdout."""
    folder = out(w, name)
    if not (folder / "rounds.jsonl").exists():
        w.caprecon(w.refine("--rounds", "1", "--out", folder))
    return folder


def closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def garbage_index(w: Workspace) -> Path:
    folder = w.root / "garbage-cache"
    folder.mkdir(exist_ok=True)
    (folder / "index.sqlite").write_text("this is not a database\n" * 10)
    return folder


def run_case(case: Case, w: Workspace) -> Result:
    if case.python:
        command = [sys.executable, "-c", PYTHON_PRELUDE.format(body=textwrap.indent(case.argv(w), "    "))]
    else:
        command = [sys.executable, "-m", "caprecon.cli", *[str(a) for a in case.argv(w)]]
    start = time.monotonic()
    proc = subprocess.Popen(command, cwd=w.root, env=environment(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return Result(case, "hang", None, time.monotonic() - start)
    seconds = time.monotonic() - start
    said = stderr if case.stream == "err" else stdout
    lines = [line for line in said.splitlines() if line.strip() and not line.startswith("PTBTokenizer")]
    last = lines[-1] if lines else ""
    named = all(n.lower() in last.lower() for n in case.names)
    if any(secret in stdout + stderr for secret in case.absent):
        outcome = "leak"
    elif "Traceback (most recent call last)" in stderr:
        outcome = "traceback"
    elif proc.returncode == 0:
        said = all(n.lower() in stderr.lower() for n in case.names) and "warning" in stderr.lower()
        outcome = "clean" if case.warned and said else "silent"
    elif proc.returncode in case.codes and named and (last.startswith("caprecon") or ": error: " in last
                                                      or case.stream == "out"):
        outcome = "clean"
    else:
        outcome = "vague"
    return Result(case, outcome, proc.returncode, seconds, last, stderr)


def attack(cases: list[Case], verbose: bool, keep: bool) -> list[Result]:
    """Every case against the caprecon under SOURCE, in a workspace of its own; one line per case."""
    root = Path(tempfile.mkdtemp(prefix="caprecon-attack-"))
    try:
        w = Workspace(root)
        results = []
        for case in cases:
            result = run_case(case, w)
            results.append(result)
            code = "-" if result.code is None else result.code
            print(f"{result.outcome:9s} exit {code!s:3s} {result.seconds:5.1f}s  {case.name}", flush=True)
            if verbose or result.outcome != "clean":
                detail = result.last if result.outcome != "traceback" else \
                    "\n".join(result.stderr.strip().splitlines()[-3:])
                print(f"          {detail}", flush=True)
        return results
    finally:
        if keep:
            print(f"workspace: {root}")
        else:
            import shutil

            shutil.rmtree(root, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    global SOURCE
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-k", nargs="+", metavar="WORD", help="only the cases whose name holds one of these")
    parser.add_argument("-v", "--verbose", action="store_true", help="each case's last line of stderr")
    parser.add_argument("--keep", action="store_true", help="keep the workspace folder (its path is printed)")
    parser.add_argument("--src", type=Path, help="attack the caprecon package under this src/ folder instead")
    parser.add_argument("--before", type=Path, metavar="SRC",
                        help="first attack the src/ folder of an earlier commit (`git archive COMMIT src | tar -x "
                             "-C DIR`), then this one, and print the outcomes side by side")
    args = parser.parse_args(argv)
    cases = [c for c in CASES if not args.k or any(k in c.name for k in args.k)]
    columns = {}
    if args.before:
        print(f"before: {args.before}")
        SOURCE, after = args.before.resolve(), SOURCE
        columns["before"] = attack(cases, args.verbose, args.keep)
        SOURCE = after
        print(f"\nafter: {SOURCE}")
    SOURCE = args.src.resolve() if args.src else SOURCE
    columns["after" if args.before else "cases"] = results = attack(cases, args.verbose, args.keep)
    print()
    print("outcome   " + "".join(f"{name:>8s}" for name in columns))
    for outcome in (*OUTCOMES, "all"):
        print(f"{outcome:10s}" + "".join(f"{sum(outcome in ('all', r.outcome) for r in rs):8d}"
                                        for rs in columns.values()))
    return 0 if all(r.outcome == "clean" for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
