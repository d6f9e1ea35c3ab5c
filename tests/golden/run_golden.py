#!/usr/bin/env python
"""Golden run: every command family of the `caprecon` CLI on tiny local random-weight models.

    PYTHONPATH=SRC python tests/golden/run_golden.py --models DIR --out DIR [--jobs 2] [--only NAME ...]

`--models DIR` holds the tiny checkpoints and the input fixtures (images, captions, QA banks,
judgments, benchmark files). It is built on first use from the test helpers (tests/tiny_models.py,
tiny_vlm.py, openai_server.py, cttd_fakes.py, oracle.py and a few test modules' fixture writers)
and reused as it is afterwards, so a run before and a run after a change see the same weights and
the same inputs.

Every command runs as `sys.executable -c "from caprecon.cli import main; ..."`, so the caprecon
that PYTHONPATH (or the installed package) selects is the one run. The fakes named by `module:Class`
specs (oracle:OracleGenerator, cttd_fakes:ScriptedVLM, test_probes:ScriptedLLM, ...) come from the
tests folder (`--tests`, default: the folder above this script's).

OUT/<step>/ holds each command's `command.json` (its arguments with the folders as placeholders, and
its exit status), `stdout.txt`, `stderr.txt` and `run/` (its --out). OUT/inputs is a copy of the
fixtures, OUT/caches the content-addressed caches (one per chain of commands, fresh each run).
OUT/_golden.json records the folders used (compare_golden.py normalises them) and OUT/_timings.json
the seconds per step; neither is compared.

The run works in a fixed folder (--work, default /tmp/caprecon-golden-work) and moves it to --out at
the end, so that hashes of absolute paths (CTTD stage fingerprints, thumbnail names) are the same in
every run. Two runs therefore cannot go at once on one machine.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
FIXTURES_VERSION = 1
CLI = "import sys; from caprecon.cli import main; sys.exit(main())"
OPENAI_PORT = 47613
STAGING = Path("/tmp/caprecon-golden-work")

# the shared Flickr8k dev subset (tests/conftest.py's FLICKR); the meta-flickr chain needs it
FLICKR_DEFAULT = HERE.parents[2] / "shared" / "data" / "flickr8k-dev"
if not FLICKR_DEFAULT.exists():
    FLICKR_DEFAULT = Path("/work/shared/data/flickr8k-dev")


# ----------------------------------------------------------------------------------------------
# models and fixtures, built once


def build_models(root: Path, tests: Path) -> None:
    """Tiny checkpoints and every input file, into root/models and root/fixtures (skipped if done)."""
    done = root / "COMPLETE"
    if done.exists():
        return
    if root.exists() and any(root.iterdir()):
        raise SystemExit(f"{root} exists but is incomplete (no COMPLETE marker): remove it or name another")
    sys.path.insert(0, str(tests))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    started = time.time()
    models, fixtures = root / "models", root / "fixtures"
    models.mkdir(parents=True, exist_ok=True)
    fixtures.mkdir(parents=True, exist_ok=True)

    import tiny_models
    import tiny_vlm
    from openai_server import build_tiny_lm

    tiny_models.build_tiny_sd(models / "sd")
    tiny_models.build_tiny_flux(models / "flux")
    tiny_models.build_tiny_clip(models / "clip")
    tiny_models.build_tiny_dinov2(models / "dinov2")
    tiny_vlm.build_qwen2_vl(models / "qwen2vl")
    tiny_vlm.build_llava(models / "llava")
    tiny_vlm.build_qwen2_lm(models / "qwen2lm")
    build_tiny_lm(models / "openai-lm")
    build_fixtures(fixtures)
    done.write_text(json.dumps({"fixtures_version": FIXTURES_VERSION, "seconds": round(time.time() - started, 1)}))
    print(f"built models and fixtures in {root} ({time.time() - started:.0f} s)", flush=True)


def _jsonl(path: Path, rows) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def build_fixtures(root: Path) -> None:
    import base64
    import io

    import numpy as np
    from PIL import Image

    import cttd_fakes
    from oracle import render

    # score: three random pictures (tests/test_cli.py), references, and one caption over CLIP's 77 tokens
    score = root / "score"
    score.mkdir()
    rng = np.random.default_rng(1)
    rows = []
    for i in range(3):
        Image.fromarray(rng.integers(0, 255, (30, 40, 3), dtype=np.uint8)).save(score / f"p{i}.png")
        rows.append({"id": f"r{i}", "image": f"p{i}.png", "caption": f"picture {i}",
                     "refs": [f"a picture numbered {i}", "a noisy image"]})
    rows.append({"id": "long", "image": "p0.png", "refs": ["a cat on a mat"],
                 "caption": "a cat asleep on a soft woollen mat near a tall window on a rainy afternoon in a quiet "
                            "old stone house"})
    _jsonl(score / "in.jsonl", rows)

    # shapes: the judge metrics' fixture (tests/test_judges.py)
    shapes = root / "shapes"
    shapes.mkdir()
    render("a red circle and a blue square", 64, 64).save(shapes / "shapes.png")
    bank = [
        {"image_id": "shapes", "question": "What colour is the circle?", "category": "perception", "type": "mc",
         "choices": ["red", "blue", "green"], "answer": "A"},
        {"image_id": "shapes", "question": "Is there a square?", "category": "perception", "type": "yesno",
         "answer": "yes"},
        {"image_id": "shapes", "question": "How many shapes are there?", "category": "counting", "type": "short",
         "answer": "two"},
        {"image_id": "shapes", "question": "Where is the circle?", "category": "grounding", "type": "box",
         "answer": [0.05, 0.3, 0.45, 0.7], "coords": "normalized"},
    ]
    _jsonl(shapes / "bank.jsonl", bank)
    _jsonl(shapes / "in.jsonl", [
        {"id": "good", "image": "shapes.png", "caption": "a red circle and a blue square", "image_id": "shapes",
         "captioner": "good"},
        {"id": "bad", "image": "shapes.png", "caption": "a green triangle", "image_id": "shapes", "candidate": 1,
         "captioner": "bad"}])

    # scale: five images with 1-3 candidates each and a missing one (tests/test_scale.py)
    scale = root / "scale"
    scale.mkdir()
    rng = np.random.default_rng(4)
    rows = []
    for i, n in enumerate((1, 3, 2, 1, 2)):
        Image.fromarray(rng.integers(0, 255, (24, 32, 3), dtype=np.uint8)).save(scale / f"p{i}.png")
        rows += [{"id": f"r{i}-{c}", "image": f"p{i}.png", "image_id": f"img{i}", "candidate": c,
                  "caption": f"a picture of {i} things, take {c}"} for c in range(n)]
    rows.append({"id": "broken", "image": "missing.png", "image_id": "gone", "caption": "nothing to see"})
    _jsonl(scale / "in.jsonl", rows)

    # caption: two pictures and an undecodable file (tests/test_caption.py)
    images = root / "caption-images"
    images.mkdir()
    for i in range(2):
        rng = np.random.default_rng(i)
        Image.fromarray(rng.integers(0, 255, (30, 40 + 8 * i, 3), dtype=np.uint8)).save(images / f"img{i}.png")
    (images / "broken.png").write_bytes(b"not a picture")

    # t2i: captions only (tests/test_t2i.py)
    _jsonl(root / "t2i" / "captions.jsonl", [
        {"id": "list", "caption": "1. A red car\n2. A blue sky"},
        {"id": "bold", "caption": "**Subject:** a dog on grass"},
        {"id": "long", "caption": "a cat asleep on a soft woollen mat near a tall window on a rainy afternoon in a "
                                  "quiet old stone house"}])

    # suite: one small file per benchmark format (tests/test_suites.py)
    from test_suites import make_benchmarks

    bench = root / "bench"
    make_benchmarks(bench)
    (bench / "suite.toml").write_text('[[datasets]]\nsuite = "mmbench"\ndata = "mmbench.tsv"\n'
                                      '[[datasets]]\nsuite = "refcoco"\ndata = "refcoco.jsonl"\n')
    _jsonl(bench / "published.jsonl", [
        {"dataset": "mmbench", "index": "10", "caption": "**A red card**"},
        {"dataset": "mmbench", "index": "12", "caption": "A blue card"},
        {"dataset": "refcoco", "index": "1", "caption": "A green card"}])
    agree = root / "agree"
    agree.mkdir()
    (agree / "turing-a").mkdir()
    (agree / "turing-a" / "summary.json").write_text(json.dumps({"metrics": {"turing": {"mean": 0.9}}}))

    # cttd: the docs' offline example (docs/question-bank.md) (shapes/, taxonomy.json, captions.jsonl)
    cttd_fakes.write_example(root / "cttd")

    # cttd import: a VLMEvalKit TSV and a generic CSV (tests/test_cttd.py)
    imp = root / "cttd-import"
    imp.mkdir()

    def png64(colour):
        buffer = io.BytesIO()
        Image.new("RGB", (12, 8), colour).save(buffer, format="PNG")
        return base64.b64encode(buffer.getvalue()).decode()

    header = ["index", "image", "question", "hint", "A", "B", "C", "D", "answer", "category"]
    tsv_rows = [["11", png64((200, 10, 10)), "What colour is the image?", "Look closely.", "blue", "red", "green", "",
                 "B", "colour"],
                ["12", "11", "Is the image red?", "", "", "", "", "", "Yes", "existence"],
                ["13", png64((10, 10, 200)), "Name the colour.", "nan", "", "", "", "", "blue", "colour"]]
    (imp / "MMBench_DEV_EN.tsv").write_text("\n".join("\t".join(r) for r in [header, *tsv_rows]) + "\n")
    (imp / "pics").mkdir()
    Image.new("RGB", (10, 10), "white").save(imp / "pics" / "dog.png")
    (imp / "questions.csv").write_text("pic,q,correct,opts,kind\n"
                                       "pics/dog.png,What animal?,dog,cat|dog|bird,\n"
                                       "pics/dog.png,Is it outdoors?,no,,\n"
                                       "pics/dog.png,Where is the dog?,\"[0.1, 0.2, 0.5, 0.9]\",,\n")

    # meta: a small judgments file with references (tests/test_probes.py), user triples, Pascal-50S files
    # with scores and expected values (tests/test_metabench.py)
    from test_metabench import _pascal_cli_files
    from test_probes import GOOD, _judgments_file

    meta = root / "meta"
    meta.mkdir()
    _judgments_file(meta)
    ref = "A black dog runs on the grass ."
    _jsonl(meta / "triples.jsonl", [
        {"image": "i1.png", "reference": ref, "paraphrase": GOOD[ref], "perturbed": "A white dog runs on the grass ."},
        {"image": "i1.png", "reference": ref, "paraphrase": ref, "perturbed": "A cat ."}])
    pascal = root / "pascal"
    pascal.mkdir()
    _pascal_cli_files(pascal)
    (pascal / "expected.csv").write_text("benchmark,metric,key,value,source\npascal50s,good,HC,50,hand\n"
                                         "pascal50s,good,mean,83.33,hand\npascal50s,other,HI,99,paper\n")


# ----------------------------------------------------------------------------------------------
# the commands


def S(name, *argv, rc=0):
    """A step: the CLI's arguments, with {M} models, {I} inputs, {C} caches, {O} out, {R} this step's run folder,
    {F} the Flickr8k dev folder, {URL} the OpenAI-compatible server of the chain."""
    return {"name": name, "argv": list(argv), "rc": rc}


def chains() -> dict[str, list[dict]]:
    sd = ["--generator", "{M}/sd", "--generator-opt", "steps=1"]
    recon = [*sd, "--embedder", "{M}/dinov2", "--max-side", "32"]
    judge = ["--judge", "{M}/qwen2vl", "--judge-opt", "max_new_tokens=8"]
    shapes = ["-i", "{I}/shapes/in.jsonl", "--qa-bank", "{I}/shapes/bank.jsonl", "--generator", "oracle:OracleGenerator",
              "--max-side", "64"]
    scale = ["-i", "{I}/scale/in.jsonl", "-m", "recon", "--generator", "{M}/sd", "--generator-opt", "steps=2",
             "--embedder", "{M}/dinov2", "--max-side", "32", "--batch-size", "2"]
    return {
        "score-recon": [
            S("score-recon", "score", "-i", "{I}/score/in.jsonl", "-m", "recon", *recon, "--template", "photo",
              "--cache-dir", "{C}/recon", "--out", "{R}"),
            S("score-recon-cached", "score", "-i", "{I}/score/in.jsonl", "-m", "recon", *recon, "--template", "photo",
              "--cache-dir", "{C}/recon", "--out", "{R}"),
            S("cache-info", "cache", "info", "--cache-dir", "{C}/recon"),
            S("cache-info-json", "cache", "info", "--json", "--cache-dir", "{C}/recon"),
            S("cache-verify", "cache", "verify", "--cache-dir", "{C}/recon"),
            S("cache-verify-json", "cache", "verify", "--json", "--cache-dir", "{C}/recon"),
            S("cache-prune-dry-run", "cache", "prune", "--max-size", "0B", "--dry-run", "--cache-dir", "{C}/recon"),
        ],
        "score-clip": [
            S("score-clip-image", "score", "-i", "{I}/score/in.jsonl", "-m", "clip-image", *sd, "--clip", "{M}/clip",
              "--max-side", "32", "--cache-dir", "{C}/clip", "--out", "{R}"),
            S("score-clipscore", "score", "-i", "{I}/score/in.jsonl", "-m", "clipscore", "-m", "refclipscore",
              "--clip", "{M}/clip", "--cache-dir", "{C}/clip", "--out", "{R}"),
        ],
        "score-judges": [
            S("score-turing-vqascore", "score", *shapes, "-m", "turing", "-m", "vqascore", *judge,
              "--cache-dir", "{C}/judges", "--out", "{R}"),
            S("report-turing", "report", "{O}/score-turing-vqascore/run", "--out", "{R}"),
            S("score-vqascore-both", "score", *shapes, "-m", "vqascore", "--vqa-on", "both", "--vqa-normalise",
              *judge, "--cache-dir", "{C}/judges", "--out", "{R}"),
            S("score-fleur", "score", "-i", "{I}/shapes/in.jsonl", "-m", "fleur", *judge, "--cache-dir", "{C}/judges",
              "--out", "{R}"),
            S("score-captionqa", "score", "-i", "{I}/shapes/in.jsonl", "-m", "captionqa", "--llm", "{M}/qwen2lm",
              "--llm-opt", "max_new_tokens=8", "--qa-bank", "{I}/shapes/bank.jsonl", "--cache-dir", "{C}/judges",
              "--out", "{R}"),
        ],
        "stages-judge": [  # tests/test_judges.py: judge before reconstruct (refused rows), reconstruct, judge, score
            S("judge-before-reconstruct", "judge", *shapes, "-m", "turing", *judge, "--cache-dir", "{C}/stages-judge",
              "-q", rc=1),
            S("reconstruct-shapes", "reconstruct", *shapes, "-m", "turing", *judge, "--cache-dir", "{C}/stages-judge",
              "-q"),
            S("judge", "judge", *shapes, "-m", "turing", *judge, "--cache-dir", "{C}/stages-judge", "-q"),
            S("score-after-stages", "score", *shapes, "-m", "turing", *judge, "--cache-dir", "{C}/stages-judge", "-q",
              "--out", "{R}"),
        ],
        "stages-recon": [  # tests/test_scale.py: reconstruct, embed, then score computes nothing
            S("reconstruct", "reconstruct", *scale, "--cache-dir", "{C}/stages-recon", "-q"),
            S("embed", "embed", *scale, "--cache-dir", "{C}/stages-recon", "-q"),
            S("embed-empty-store", "embed", *scale, "--cache-dir", "{C}/stages-empty", "-q", rc=1),
            S("score-after-embed", "score", *scale, "--cache-dir", "{C}/stages-recon", "--allow-row-errors",
              "--out", "{R}"),
        ],
        "shards": [
            S("score-shard-0", "score", *scale, "--shard", "0/2", "--cache-dir", "{C}/shard0", "--allow-row-errors",
              "--out", "{R}"),
            S("score-shard-1", "score", *scale, "--shard", "1/2", "--cache-dir", "{C}/shard1", "--allow-row-errors",
              "--out", "{R}"),
            S("merge", "merge", "{O}/score-shard-0/run", "{O}/score-shard-1/run", "--out", "{R}"),
            S("store-merge", "store", "merge", "{C}/shard0", "{C}/shard1", "--into", "{C}/shards-merged"),
            S("cache-verify-merged", "cache", "verify", "--cache-dir", "{C}/shards-merged"),
        ],
        "caption": [
            S("caption", "caption", "--images", "{I}/caption-images", "--out", "{R}", "--captioner", "{M}/qwen2vl",
              "--n", "3", "--temperature", "1", "--max-new-tokens", "6", *recon, "--seed", "5",
              "--cache-dir", "{C}/caption"),
            S("caption-weighted", "caption", "--images", "{I}/caption-images", "--out", "{R}", "--captioner",
              "{M}/llava", "--n", "2", "--max-new-tokens", "4", "--select", "recon=0.7,clipscore=0.3", "--clip",
              "{M}/clip", *recon, "--seed", "5", "--cache-dir", "{C}/caption"),
        ],
        "t2i": [
            S("t2i", "t2i", "--input", "{I}/t2i/captions.jsonl", "--generator", "sd={M}/sd", "--generator",
              "flux={M}/flux", "--judge", "qwen={M}/qwen2vl", "--judge", "llava={M}/llava", "--size", "32x32",
              "--generator-opt", "steps=1", "--bootstrap", "200", "--cache-dir", "{C}/t2i", "--out", "{R}"),
            S("text-to-image", "text-to-image", "--input", "{I}/t2i/captions.jsonl", "--generator",
              "shapes=oracle:OracleGenerator", "--judge", "{M}/qwen2vl", "--vqa-normalise", "--size", "32x32",
              "--seed", "5", "--bootstrap", "50", "--cache-dir", "{C}/t2i", "--out", "{R}"),
        ],
        "suite": [
            S("suite", "suite", "--suite", "{I}/bench/suite.toml", "--captioner", "tinyqwen={M}/qwen2vl", "--captions",
              "published={I}/bench/published.jsonl", "--caption-max-new-tokens", "5", *sd, "--judge", "{M}/qwen2vl",
              "--judge-max-new-tokens", "4", "--judge-box-coords", "1000", "--size", "32x32",
              "--cache-dir", "{C}/suite", "--out", "{R}"),
            S("suite-agree", "suite-agree", "--suite-run", "{O}/suite/run", "--turing", "tinyqwen={I}/agree/turing-a",
              "--turing", "published=0.7", "--out", "{R}"),
        ],
        "cttd": [  # the docs' offline example (docs/question-bank.md)
            S("cttd-build", "cttd", "build", "--images", "{I}/cttd/shapes", "--out", "{R}", "--vlm",
              "cttd_fakes:ScriptedVLM", "--embedder", "oracle:PixelEmbedder", "--matcher", "cttd_fakes:WordMatcher",
              "--taxonomy", "{I}/cttd/taxonomy.json", "--density-band", "0", "1", "--top-k", "6"),
            S("score-turing-cttd-bank", "score", "-i", "{I}/cttd/captions.jsonl", "-m", "turing", "--qa-bank",
              "{O}/cttd-build/run/bank.jsonl", "--generator", "oracle:OracleGenerator", "--judge",
              "cttd_fakes:ScriptedVLM", "--max-side", "96", "--cache-dir", "{C}/cttd", "--out", "{R}"),
            S("report-cttd-bank", "report", "{O}/cttd-build/run", "--out", "{R}"),
            S("cttd-import-tsv", "cttd", "import", "{I}/cttd-import/MMBench_DEV_EN.tsv", "--out", "{R}",
              "--id-prefix", "mmb-"),
            S("cttd-import-csv", "cttd", "import", "{I}/cttd-import/questions.csv", "--out", "{R}", "--column",
              "image=pic", "--column", "question=q", "--column", "answer=correct", "--column", "choices=opts",
              "--column", "type=kind", "--category", "general"),
        ],
        "meta": [
            S("meta-probes", "meta", "--judgments", "{I}/meta/judged.jsonl", "--metric", "bleu-1", "clipscore",
              "--clip", "{M}/clip", "--probes", "--llm", "test_probes:ScriptedLLM", "--bootstrap", "50", "-q",
              "--cache-dir", "{C}/meta", "--out", "{R}"),
            S("meta-triples", "meta", "--judgments", "{I}/meta/judged.jsonl", "--metric", "rouge", "recon",
              *recon, "--triples", "{I}/meta/triples.jsonl", "--bootstrap", "0", "--cache-dir", "{C}/meta",
              "--out", "{R}"),
            S("meta-benchmark", "meta", "--benchmark", "pascal50s", "--data", "{I}/pascal/pascal50s.json", "--scores",
              "{I}/pascal/scores.csv", "--metric", "good", "bad", "--compare", "good", "bad", "--bootstrap", "50",
              "--out", "{R}"),
            S("meta-verify", "meta", "verify", "--benchmark", "pascal50s", "--data", "{I}/pascal/pascal50s.json",
              "--scores", "{I}/pascal/scores.csv", "--expected", "{I}/pascal/expected.csv", "--tolerance", "0.01",
              "--out", "{R}"),
            S("report-meta", "report", "{O}/meta-probes/run", "--out", "{R}"),
        ],
        "meta-flickr": [  # tests/test_meta.py: the reference metrics on the Flickr8k dev subset (Java)
            S("meta-flickr", "meta", "--judgments", "{F}/expert.jsonl", "--images", "{F}/images", "--bootstrap",
              "100", "--seed", "0", "--out", "{R}"),  # the default metrics: every reference metric but SPICE
        ],
        "openai": [  # a judge behind an OpenAI-compatible server (tests/openai_server.py over a tiny LLaMA)
            S("score-vqascore-openai", "score", "-i", "{I}/shapes/in.jsonl", "-m", "vqascore", "--judge",
              "tiny-judge", "--judge-opt", "base_url={URL}", "--cache-dir", "{C}/openai", "--out", "{R}"),
        ],
        "misc": [
            S("models", "models"),
            S("models-json", "models", "--json"),
            S("demo", "demo", "--out", "{R}"),
        ],
    }


# ----------------------------------------------------------------------------------------------
# running


class Runner:
    def __init__(self, args, tests: Path, work: Path):
        self.models = args.models.resolve() / "models"
        self.out = work
        self.inputs = work / "inputs"
        self.caches = self.out / "caches"
        self.tests = tests
        self.flickr = args.flickr.resolve()
        self.timeout = args.timeout
        self.timings: dict[str, float] = {}
        self.failures: list[str] = []
        self.lock = threading.Lock()
        self.env = dict(os.environ)
        pythonpath = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        self.env.update({
            "PYTHONPATH": os.pathsep.join([*pythonpath, str(tests)]),  # the code first, then the test helpers
            "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
            "TRANSFORMERS_VERBOSITY": "error", "HF_HUB_DISABLE_PROGRESS_BARS": "1",
            "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONHASHSEED": "0", "PYTHONUNBUFFERED": "1",
            "CAPRECON_CACHE": str(self.caches / "default"), "MPLCONFIGDIR": str(self.out / "_mplconfig"),
            "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost",
            "COLUMNS": "120", "TZ": "UTC", "LC_ALL": "C.UTF-8",
        })
        self.env.pop("CTTD_FAKE_LOG", None)
        self.env.pop("CTTD_FAKE_BLOCK_AFTER", None)

    def fill(self, text: str, step: str, url: str | None) -> str:
        return (text.replace("{M}", str(self.models)).replace("{I}", str(self.inputs))
                .replace("{C}", str(self.caches)).replace("{O}", str(self.out)).replace("{F}", str(self.flickr))
                .replace("{R}", str(self.out / step / "run")).replace("{URL}", url or "{URL}"))

    def run_step(self, step: dict, url: str | None = None) -> None:
        name = step["name"]
        folder = self.out / name
        folder.mkdir(parents=True)
        argv = [self.fill(a, name, url) for a in step["argv"]]
        started = time.time()
        try:
            proc = subprocess.run([sys.executable, "-c", CLI, *argv], cwd=folder, env=self.env, capture_output=True,
                                  text=True, timeout=self.timeout)
            rc, stdout, stderr = proc.returncode, proc.stdout, proc.stderr
        except subprocess.TimeoutExpired as exc:
            rc, stdout, stderr = "timeout", exc.stdout or "", exc.stderr or ""
            stdout, stderr = (s.decode() if isinstance(s, bytes) else s for s in (stdout, stderr))
        seconds = time.time() - started
        (folder / "stdout.txt").write_text(stdout)
        (folder / "stderr.txt").write_text(stderr)
        (folder / "command.json").write_text(json.dumps({"argv": step["argv"], "rc": rc, "expected_rc": step["rc"]},
                                                        indent=1) + "\n")
        ok = rc == step["rc"]
        with self.lock:
            self.timings[name] = round(seconds, 1)
            if not ok:
                self.failures.append(f"{name}: exit {rc}, expected {step['rc']}")
            print(f"{'ok  ' if ok else 'FAIL'} {name:28s} exit {rc} ({seconds:.1f} s)", flush=True)
            if not ok:
                print("     " + "\n     ".join(stderr.strip().splitlines()[-8:]), flush=True)

    def run_chain(self, name: str, steps: list[dict]) -> None:
        if name == "openai":
            return self._run_openai(steps)
        if name == "meta-flickr" and not self.flickr.exists():
            with self.lock:
                print(f"skip {name}: {self.flickr} not present", flush=True)
            return
        for step in steps:
            self.run_step(step)

    def _run_openai(self, steps: list[dict]) -> None:
        """Serve models/openai-lm with tests/openai_server.py's app on a fixed loopback port (the
        server's URL is part of the judge's fingerprint, hence of the cache keys), run the steps, stop it."""
        import socket
        import urllib.request

        log_dir = self.out / "_server"
        log_dir.mkdir()
        port = OPENAI_PORT
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:  # taken: any free port (the run still works; the comparison will show the URL)
                probe.bind(("127.0.0.1", 0))
                port = probe.getsockname()[1]
        serve = ("import sys, uvicorn; from openai_server import create_app; "
                 "uvicorn.run(create_app(sys.argv[1], 'tiny-judge'), host='127.0.0.1', port=int(sys.argv[2]), "
                 "log_level='warning')")
        log = (log_dir / "server.log").open("w")
        proc = subprocess.Popen([sys.executable, "-c", serve, str(self.models / "openai-lm"), str(port)],
                                env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        root, ready = f"http://127.0.0.1:{port}", False
        try:
            deadline = time.time() + 120
            while time.time() < deadline and proc.poll() is None and not ready:
                try:
                    with urllib.request.urlopen(f"{root}/health", timeout=1) as r:
                        ready = r.status == 200
                except OSError:
                    time.sleep(0.2)
            if not ready:
                with self.lock:
                    self.failures.append("openai: the server did not start (see _server/server.log)")
                    print("FAIL openai server did not start", flush=True)
                return
            for step in steps:
                self.run_step(step, f"{root}/v1")
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            log.close()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", type=Path, required=True, help="tiny models and fixtures (built if missing)")
    parser.add_argument("--out", type=Path, required=True, help="output folder (must not exist, or be empty)")
    parser.add_argument("--tests", type=Path, default=HERE.parent, help="the tests folder whose helpers to use")
    parser.add_argument("--flickr", type=Path, default=FLICKR_DEFAULT, help="the Flickr8k dev folder")
    parser.add_argument("--jobs", type=int, default=2, help="chains of commands run at once (default 2)")
    parser.add_argument("--only", nargs="+", metavar="CHAIN", help="run only these chains")
    parser.add_argument("--timeout", type=int, default=300, help="seconds per command (default 300)")
    parser.add_argument("--work", type=Path, default=STAGING,
                        help=f"working folder, the same for every run, moved to --out at the end (default {STAGING})")
    parser.add_argument("--list", action="store_true", help="list the chains and their steps, run nothing")
    args = parser.parse_args(argv)
    tests = args.tests.resolve()
    plan = chains()
    if args.list:
        for chain, steps in plan.items():
            print(f"{chain}: {', '.join(s['name'] for s in steps)}")
        return 0
    if args.only:
        unknown = set(args.only) - set(plan)
        if unknown:
            parser.error(f"unknown chain(s) {', '.join(sorted(unknown))}; chains: {', '.join(plan)}")
        plan = {k: v for k, v in plan.items() if k in args.only}
    if args.out.exists() and (not args.out.is_dir() or any(args.out.iterdir())):
        parser.error(f"{args.out} exists and is not an empty folder")

    started = time.time()
    build_models(args.models.resolve(), tests)
    import caprecon

    # Every run works in the same folder (--work) and is moved to --out at the end: stage fingerprints and
    # other hashes of absolute paths then come out the same in every run, wherever --out is.
    out, work = args.out.resolve(), args.work.resolve()
    if work.exists():
        if not (work / "_golden.json").exists():
            parser.error(f"{work} exists and is not a golden run's working folder: remove it or choose --work")
        shutil.rmtree(work)
    work.mkdir(parents=True)
    shutil.copytree(args.models.resolve() / "fixtures", work / "inputs")  # keeps the files' times
    runner = Runner(args, tests, work)
    (work / "_golden.json").write_text(json.dumps({
        "out": str(work), "models": str(runner.models), "inputs": str(runner.inputs), "tests": str(tests),
        "src": str(Path(caprecon.__file__).resolve().parent.parent), "flickr": str(runner.flickr),
        "python": sys.executable, "chains": list(plan)}, indent=1) + "\n")
    print(f"caprecon from {Path(caprecon.__file__).resolve().parent}; helpers from {tests}; working in {work}",
          flush=True)

    # longest chains first, so the pool ends together
    order = sorted(plan, key=lambda c: -len(plan[c]) - (8 if c in ("meta-flickr", "t2i", "suite") else 0))
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        for future in [pool.submit(runner.run_chain, name, plan[name]) for name in order]:
            future.result()
    runner.timings["_total"] = round(time.time() - started, 1)
    (work / "_timings.json").write_text(json.dumps(runner.timings, indent=1) + "\n")
    if out.exists():
        out.rmdir()  # checked empty above
    out.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(str(work), str(out))
    print(f"{len(runner.timings) - 1} commands in {time.time() - started:.0f} s; outputs in {out}")
    if runner.failures:
        print("unexpected exit statuses:\n  " + "\n  ".join(runner.failures))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
