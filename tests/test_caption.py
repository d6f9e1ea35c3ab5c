"""Captioners and best-of-N selection on tiny local models: seeded sampling, the choice,
shared noise, the selection curve, the exported dataset and resuming a killed run."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import tiny_vlm
from caprecon.models.captioner import (Captioner, CaptionRequest, PROMPTS, Sampling, TransformersCaptioner, _SeededSampler, resolve_prompt)
from caprecon.models.generator import DiffusersGenerator
from caprecon.models.vlm import VLMRequest
from caprecon.models.vlm_transformers import TransformersVLM
from caprecon.apps.selection import best_of_n, expected_best, selection_curve
from caprecon.run.captioning import Selection, select_best
from logged_models import LoggedCaptioner, LoggedGenerator

PROMPT = "Describe the image."


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models gain nothing from intra-op threads; on a busy machine the threads' spinning slows them."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def vlm_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny-captioners")
    return {"qwen2_vl": tiny_vlm.build_qwen2_vl(root / "qwen2_vl"), "llava": tiny_vlm.build_llava(root / "llava")}


def _image(seed: int, size=(40, 30)) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 255, (size[1], size[0], 3), dtype=np.uint8))


def _image_folder(folder: Path, count: int) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        _image(i, (40 + 8 * i, 30)).save(folder / f"img{i}.png")
    return folder


# ---------------------------------------------------------------------------------------
# the selection curve


def _brute_force(scores, n, values=None):
    """Mean, over every n-subset, of the value of the candidate `select_best` picks in it."""
    values = scores if values is None else values
    picks = []
    for subset in itertools.combinations(range(len(scores)), n):  # in candidate order, as select_best sees them
        picks.append(values[subset[select_best([scores[i] for i in subset])]])
    return sum(picks) / len(picks)


def test_expected_best_equals_enumeration_of_subsets():
    rng = np.random.default_rng(3)
    pools = [[0.3, 0.7, 0.7, 0.1, 0.5, 0.9, 0.7],  # ties, which the first candidate wins
             list(rng.random(6)), [0.4, 0.4, 0.4, 0.4]]
    for scores in pools:
        other = list(rng.random(len(scores)))  # another metric, read off the selected candidate
        curve = [expected_best(scores, n) for n in range(1, len(scores) + 1)]
        for n, value in enumerate(curve, 1):
            assert value == pytest.approx(_brute_force(scores, n), abs=1e-12)
            assert expected_best(scores, n, other) == pytest.approx(_brute_force(scores, n, other), abs=1e-12)
        assert all(b >= a - 1e-15 for a, b in zip(curve, curve[1:]))  # non-decreasing
        assert curve[0] == pytest.approx(np.mean(scores)) and curve[-1] == pytest.approx(max(scores))
    with pytest.raises(ValueError):
        expected_best([0.1, 0.2], 3)


def test_curve_averages_images_that_have_n_candidates():
    pools = [[0.2, 0.6, 0.4], [0.9, 0.1], [0.5, 0.8, 0.3, 0.7]]
    rows = selection_curve(pools)
    assert [r["n"] for r in rows] == [1, 2, 3, 4] and [r["images"] for r in rows] == [3, 3, 2, 1]
    for row in rows:
        used = [p for p in pools if len(p) >= row["n"]]
        assert row["score"] == pytest.approx(np.mean([_brute_force(p, row["n"]) for p in used]))


def test_select_best_and_selection_parsing():
    assert select_best([0.2, None, 0.9, 0.9, 0.1]) == 2  # the first of the best
    assert select_best([None, None]) is None
    weighted = Selection.parse("recon=0.7, clipscore=0.3")
    assert weighted.weights == {"recon": 0.7, "clipscore": 0.3} and not weighted.is_single
    headlines = {"recon": "recon", "clipscore": "clipscore"}
    assert weighted.value({"recon": 0.5, "clipscore": 2.0}, headlines) == pytest.approx(0.7 * 0.5 + 0.3 * 2.0)
    assert weighted.value({"recon": 0.5}, headlines) is None  # a missing value never wins
    assert weighted.value({"recon": 0.5, "clipscore": 1.0, "error": "x"}, headlines) is None
    assert Selection.parse("recon").is_single
    from caprecon.core.errors import ConfigError

    for bad, message in (("bleu-9", "not a metric"), ("recon=high", "must be a number"), ("recon=0", "must be a finite number above 0")):
        with pytest.raises(ConfigError, match=message):
            Selection.parse(bad)


# ---------------------------------------------------------------------------------------
# the captioner


def test_seeded_sampler_draws_from_the_tempered_distribution():
    import torch

    logits = torch.log(torch.tensor([0.5, 0.3, 0.2, 0.0]))
    rows = 4000
    sampler = _SeededSampler(range(rows), Sampling(temperature=1.0))
    out = sampler(None, logits.repeat(rows, 1))
    chosen = out.argmax(-1)
    assert bool((out.isfinite().sum(-1) == 1).all())  # exactly one token allowed per row
    freq = torch.bincount(chosen, minlength=4).double() / rows
    assert torch.allclose(freq, torch.tensor([0.5, 0.3, 0.2, 0.0], dtype=torch.float64), atol=0.03)
    # temperature 2 flattens: p ∝ sqrt(p)
    flat = _SeededSampler(range(rows), Sampling(temperature=2.0))(None, logits.repeat(rows, 1)).argmax(-1)
    expected = torch.tensor([0.5, 0.3, 0.2]).sqrt() / torch.tensor([0.5, 0.3, 0.2]).sqrt().sum()
    assert torch.allclose(torch.bincount(flat, minlength=3)[:3].double() / rows, expected.double(), atol=0.03)
    # top-p 0.6 keeps the two most likely tokens (0.5 + 0.3 reach it), renormalised
    top = _SeededSampler(range(rows), Sampling(top_p=0.6))(None, logits.repeat(rows, 1)).argmax(-1)
    counts = torch.bincount(top, minlength=4)
    assert counts[2] == 0 and counts[3] == 0 and abs(counts[0] / rows - 0.625) < 0.03


@pytest.mark.parametrize("family", ["qwen2_vl", "llava"])
def test_captioner_is_seeded_per_image_and_candidate(family, vlm_dirs):
    sampling = Sampling(temperature=1.0, top_p=0.95, max_new_tokens=6)
    a = CaptionRequest(_image(0), PROMPT, 4, seed=11)
    b = CaptionRequest(_image(1, (64, 90)), PROMPT, 4, seed=12)
    captioner = TransformersCaptioner(vlm_dirs[family], batch_size=8)
    assert isinstance(captioner, Captioner)
    both = captioner.caption([a, b], sampling)
    assert [len(c) for c in both] == [4, 4] and len(set(both[0])) > 1  # sampled, so they differ
    # a fresh model, another batch size, the image alone, fewer candidates: the same captions
    again = TransformersCaptioner(vlm_dirs[family], batch_size=4).caption([a, b], sampling)
    assert again == both
    assert captioner.caption([b], sampling) == [both[1]]
    assert captioner.caption([CaptionRequest(a.image, PROMPT, 2, seed=11)], sampling) == [both[0][:2]]
    assert captioner.caption([CaptionRequest(a.image, PROMPT, 4, seed=99)], sampling) != [both[0]]


def test_temperature_zero_and_tiny_top_p_are_greedy(vlm_dirs):
    image = _image(2)
    greedy = TransformersVLM(vlm_dirs["qwen2_vl"]).generate([VLMRequest(image, PROMPT)], max_new_tokens=6)[0]
    captioner = TransformersCaptioner(vlm_dirs["qwen2_vl"])
    for sampling in (Sampling(temperature=0, max_new_tokens=6),
                     Sampling(temperature=1.0, top_p=1e-6, max_new_tokens=6)):
        assert captioner.caption([CaptionRequest(image, PROMPT, 3, seed=1)], sampling) == [[greedy] * 3]


def test_greedy_decoding_ignores_the_checkpoints_repetition_penalty(vlm_dirs):
    image = _image(4)
    vlm = TransformersVLM(vlm_dirs["llava"])
    plain = vlm.generate([VLMRequest(image, PROMPT)], max_new_tokens=12)
    vlm._model.generation_config.repetition_penalty = 5.0  # as a checkpoint's generation_config.json may set
    assert vlm.generate([VLMRequest(image, PROMPT)], max_new_tokens=12) == plain


def test_prompt_presets():
    assert resolve_prompt(None) == PROMPTS["detailed"]
    assert "at most 25 words" in resolve_prompt("limited", 25)
    rs = resolve_prompt("remote-sensing")
    for word in ("how many", "colours", "materials", "shapes", "sizes", "relative", "invented"):
        assert word in rs
    assert resolve_prompt("Say what you see.") == "Say what you see."
    with pytest.raises(ValueError, match="max_words"):
        resolve_prompt("limited")
    with pytest.raises(ValueError, match="applies only"):
        resolve_prompt("detailed", 20)


# ---------------------------------------------------------------------------------------
# best of N, end to end


def _run(images, vlm_dir, tiny_sd, tiny_dinov2, cache, **overrides):
    captioner = LoggedCaptioner(inner=TransformersCaptioner(vlm_dir))
    generator = LoggedGenerator(inner=DiffusersGenerator(tiny_sd, steps=1))
    options = dict(captioner=captioner, n=3, temperature=1.0, max_new_tokens=6, generator=generator,
                   embedder=str(tiny_dinov2), max_side=32, cache_dir=str(cache), seed=5)
    options.update(overrides)
    return best_of_n(images, **options), captioner, generator


def test_best_of_n_selects_the_argmax_from_shared_noise(tmp_path, vlm_dirs, tiny_sd, tiny_dinov2):
    images = _image_folder(tmp_path / "images", 2)
    (images / "broken.png").write_bytes(b"not a picture")
    out = tmp_path / "out"
    run, captioner, generator = _run(images, vlm_dirs["qwen2_vl"], tiny_sd, tiny_dinov2, tmp_path / "cache", out=out)
    assert len(captioner.produced) == 2 and len(run.selected) == 2

    written = [json.loads(line) for line in (out / "candidates.jsonl").read_text().splitlines()]
    broken = [r for r in written if r["image_id"] == "broken"]
    assert len(broken) == 1 and "cannot decode image" in broken[0]["error"]  # its row's error; the run goes on
    assert run.manifest["selection"]["unselected"] == ["broken"]
    written = [r for r in written if r["image_id"] != "broken"]
    assert len(written) == 6
    for image_id in ("img0", "img1"):
        rows = [r for r in written if r["image_id"] == image_id]
        scores = [r["recon"] for r in rows]
        assert [r["score"] for r in rows] == scores  # one metric, weight 1
        assert [r["selected"] for r in rows] == [i == int(np.argmax(scores)) for i in range(3)]
        chosen = next(s for s in run.selected if s["image_id"] == image_id)
        assert chosen["caption"] == rows[int(np.argmax(scores))]["caption"] and chosen["score"] == max(scores)
        # one noise for all the candidates of an image: only their text differs
        assert len({r["seed"] for r in rows}) == 1 and generator.seeds[image_id] == {rows[0]["seed"]}
    assert generator.seeds["img0"] != generator.seeds["img1"]  # per image, not one for the whole run

    # the curve: brute force over the written pools, and not a single model call more
    calls = (len(captioner.produced), len(generator.produced))
    pools = [[r["score"] for r in written if r["image_id"] == i] for i in ("img0", "img1")]
    curve = selection_curve(pools)
    assert (len(captioner.produced), len(generator.produced)) == calls
    for row in curve:
        assert row["score"] == pytest.approx(np.mean([_brute_force(p, row["n"]) for p in pools]))
    assert curve[-1]["score"] == pytest.approx(np.mean([s["score"] for s in run.selected]))
    csv_rows = (out / "curve.csv").read_text().splitlines()
    assert csv_rows[0] == "n,images,score" and len(csv_rows) == 4
    assert (out / "curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| n | images | score |" in (out / "curve.md").read_text()

    # the dataset a trainer reads: JSONL and parquet with the same rows, loadable as samples
    import pyarrow.parquet as pq

    import caprecon

    selected = [json.loads(line) for line in (out / "selected.jsonl").read_text().splitlines()]
    table = pq.read_table(out / "selected.parquet").to_pylist()
    assert [r["caption"] for r in table] == [r["caption"] for r in selected] == [s["caption"] for s in run.selected]
    assert {"image", "caption", "score", "candidates"} <= set(table[0])
    assert [c["caption"] for c in table[0]["candidates"]] == [r["caption"] for r in written[:3]]
    samples = caprecon.load_samples(out / "selected.jsonl")
    assert [s.caption for s in samples] == [r["caption"] for r in selected] and Path(samples[0].image).exists()
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["captioning"]["n"] == 3 and manifest["config"]["seed_policy"] == "per-image"


def test_a_read_only_cache_is_never_written_by_captioning(tmp_path, vlm_dirs, tiny_sd, tiny_dinov2):
    # caption used to open the cache for its candidates on its own, ignoring --cache-read-only;
    # now it opens the run's store (new results in the overlay), as the scoring after it does
    import hashlib
    import sqlite3

    from caprecon.store.index import Store

    def digest(folder):
        return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.rglob("*"))
                if p.is_file() and not p.name.endswith(("-shm", "-wal"))}

    cache = tmp_path / "shared"
    Store(cache)
    before = digest(cache)
    run, captioner, _ = _run(_image_folder(tmp_path / "images", 1), vlm_dirs["qwen2_vl"], tiny_sd, tiny_dinov2, cache,
                             n=2, out=tmp_path / "out", cache_read_only=True)
    assert captioner.calls == 1 and len(run.selected) == 1
    assert digest(cache) == before
    with sqlite3.connect(tmp_path / "out" / "cache-overlay" / "index.sqlite") as db:
        kinds = dict(db.execute("SELECT kind, COUNT(*) FROM results GROUP BY kind").fetchall())
    assert kinds.get("caption-candidates") == 1


def test_same_seeds_same_candidates_and_choice_and_n1(tmp_path, vlm_dirs, tiny_sd, tiny_dinov2):
    images = _image_folder(tmp_path / "images", 2)
    first, _, _ = _run(images, vlm_dirs["llava"], tiny_sd, tiny_dinov2, tmp_path / "cache-a")
    # a fresh cache: the same captions and choices come from the seeds, not from the store
    second, captioner, _ = _run(images, vlm_dirs["llava"], tiny_sd, tiny_dinov2, tmp_path / "cache-b")
    assert len(captioner.produced) == 2
    assert [c["caption"] for c in second.candidates] == [c["caption"] for c in first.candidates]
    assert [s["candidate"] for s in second.selected] == [s["candidate"] for s in first.selected]
    assert [s["score"] for s in second.selected] == pytest.approx([s["score"] for s in first.selected], abs=1e-6)
    other, _, _ = _run(images, vlm_dirs["llava"], tiny_sd, tiny_dinov2, tmp_path / "cache-a", seed=6)
    assert [c["caption"] for c in other.candidates] != [c["caption"] for c in first.candidates]

    single, _, _ = _run(images, vlm_dirs["llava"], tiny_sd, tiny_dinov2, tmp_path / "cache-a", n=1)
    for chosen in single.selected:
        assert chosen["candidate"] == 0 and len(chosen["candidates"]) == 1
        assert chosen["caption"] == chosen["candidates"][0]["caption"]
    assert [r["n"] for r in single.curve] == [1]
    assert single.curve[0]["score"] == pytest.approx(np.mean([s["score"] for s in single.selected]))


def test_weighted_selection_and_preset(tmp_path, vlm_dirs, tiny_sd, tiny_dinov2, tiny_clip):
    images = _image_folder(tmp_path / "images", 1)
    run, _, _ = _run(images, vlm_dirs["qwen2_vl"], tiny_sd, tiny_dinov2, tmp_path / "cache",
                     select="recon=0.7,clipscore=0.3", clip=str(tiny_clip), preset="remote-describer", n=2,
                     max_new_tokens=4, temperature=None)
    rows = run.candidates
    for row in rows:
        assert row["score"] == pytest.approx(0.7 * row["recon"] + 0.3 * row["clipscore"])
    assert run.selected[0]["candidate"] == int(np.argmax([r["score"] for r in rows]))
    assert set(run.curve[0]) == {"n", "images", "score", "recon", "clipscore"}
    assert run.curve[-1]["recon"] == pytest.approx(rows[run.selected[0]["candidate"]]["recon"])
    # what the preset set and the call did not override: the paper's setting
    captioning = run.manifest["captioning"]
    assert captioning["sampling"]["temperature"] == 0.8 and captioning["prompt"] == PROMPTS["remote-sensing"]
    assert run.manifest["config"]["preset"] == "paper-recon" and run.manifest["config"]["seed_policy"] == "fixed"
    assert run.manifest["config"]["template"] == "remote-sensing"


def test_cli_errors_name_the_problem(tmp_path, capsys):
    from caprecon.cli import main

    images = _image_folder(tmp_path / "images", 1)
    base = ["caption", "--images", str(images), "--out", str(tmp_path / "out"), "--captioner", "x"]
    for extra, message in ((["--select", "bleu-9"], "not a metric"),
                           (["--prompt", "limited"], "--max-words"),
                           (["--seed-policy", "per-sample"], "same noise"),
                           (["--n", "0"], "--n: must be between 1 and 1000, not 0")):
        try:
            code = main(base + extra)
        except SystemExit as stop:  # an option's bound is the parser's own error
            code = stop.code
        assert code == 2
        assert message in capsys.readouterr().err
    assert main(["caption", "--images", str(tmp_path / "nowhere"), "--out", str(tmp_path / "o"), "-c", "x"]) == 2
    assert "--images: not found" in capsys.readouterr().err
    assert not (tmp_path / "out" / "candidates.jsonl").exists()


def test_interrupted_run_resumes_without_regenerating(tmp_path, vlm_dirs, tiny_sd, tiny_dinov2):
    images = _image_folder(tmp_path / "images", 3)
    captioner = LoggedCaptioner(inner=TransformersCaptioner(vlm_dirs["qwen2_vl"]), block_after=1)
    generator = LoggedGenerator(inner=DiffusersGenerator(tiny_sd, steps=1), block_after=1)
    options = dict(captioner=captioner, generator=generator, n=2, max_new_tokens=4, temperature=1.0,
                   embedder=str(tiny_dinov2), max_side=32, cache_dir=str(tmp_path / "cache"), batch_size=2)
    with pytest.raises(KeyboardInterrupt):  # in captioning: two of three images stored (two per call)
        best_of_n(images, **options)
    captioner.block_after = None
    with pytest.raises(KeyboardInterrupt):  # in scoring: the first batch of two reconstructions stored
        best_of_n(images, **options)
    generator.block_after = None
    run = best_of_n(images, **options)
    assert len(captioner.produced) == len(set(captioner.produced)) == 3
    distinct = {(c["caption"].strip(), c["seed"]) for c in run.candidates if not c.get("error")}
    assert len(generator.produced) == len(set(generator.produced)) == len(distinct) > 2
    assert len(run.selected) == 3


@pytest.mark.slow  # three processes, each importing torch, transformers and diffusers
def test_killed_caption_run_resumes_without_regenerating(tmp_path, vlm_dirs, tiny_sd, tiny_dinov2):
    images = _image_folder(tmp_path / "images", 3)
    logs = {"captioner": tmp_path / "captioner.log", "generator": tmp_path / "generator.log"}
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": os.pathsep.join(
        [str(Path(__file__).parents[1] / "src"), str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])}

    def command(block: str | None) -> list[str]:
        args = [sys.executable, "-m", "caprecon.cli", "caption", "--images", str(images), "--out",
                str(tmp_path / "out"), "--n", "2", "--max-new-tokens", "4", "--temperature", "1",
                "--captioner", "logged_models:LoggedCaptioner", "--captioner-opt", f"model={vlm_dirs['qwen2_vl']}",
                "--captioner-opt", f"log={logs['captioner']}",
                "--generator", "logged_models:LoggedGenerator", "--generator-opt", f"model={tiny_sd}",
                "--generator-opt", "steps=1", "--generator-opt", f"log={logs['generator']}",
                "--embedder", str(tiny_dinov2), "--max-side", "32", "--batch-size", "2",
                "--cache-dir", str(tmp_path / "cache"), "--quiet"]
        if block:  # hang in the second call of that model, after the first call's results are stored
            args += [f"--{block}-opt", "block_after=1", f"--{block}-opt", f"marker={tmp_path / block}.blocked"]
        return args

    for block in ("captioner", "generator"):
        proc = subprocess.Popen(command(block), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        marker, deadline = tmp_path / f"{block}.blocked", time.monotonic() + 120
        while not marker.exists():
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
            assert time.monotonic() < deadline, f"the run never reached the {block}'s second call"
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    done = subprocess.run(command(None), env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]

    captioned = logs["captioner"].read_text().splitlines()
    generated = logs["generator"].read_text().splitlines()
    # each image captioned once and each reconstruction generated once, over three processes
    assert len(captioned) == len(set(captioned)) == 3
    candidates = [json.loads(line) for line in (tmp_path / "out" / "candidates.jsonl").read_text().splitlines()]
    distinct = {(c["caption"].strip(), c["seed"]) for c in candidates if not c.get("error")}
    assert len(generated) == len(set(generated)) == len(distinct)
    assert len((tmp_path / "out" / "selected.jsonl").read_text().splitlines()) == 3


def test_a_wrong_scoring_model_stops_the_run_before_captioning(tmp_path, vlm_dirs):
    from caprecon.models.common import ModelNotFoundError

    captioner = LoggedCaptioner(inner=TransformersCaptioner(vlm_dirs["qwen2_vl"]))
    with pytest.raises(ModelNotFoundError, match="generator folder not found"):
        best_of_n(_image_folder(tmp_path / "images", 1), captioner=captioner, generator=str(tmp_path / "nowhere"),
                  embedder="dinov2", cache_dir=str(tmp_path / "cache"))
    assert captioner.calls == 0


# ---------------------------------------------------------------------------------------
# issue 21 item 11: the captioner's own sampling settings


def test_seeded_sampler_applies_top_k():
    import torch

    logits = torch.log(torch.tensor([0.5, 0.3, 0.2, 0.0]))
    rows = 4000
    chosen = _SeededSampler(range(rows), Sampling(top_k=2))(None, logits.repeat(rows, 1)).argmax(-1)
    counts = torch.bincount(chosen, minlength=4)
    # the two likeliest tokens, renormalised: 0.5 / 0.8 and 0.3 / 0.8
    assert counts[2] == 0 and counts[3] == 0 and abs(counts[0] / rows - 0.625) < 0.03


def _with_generation_config(folder: Path, into: Path, **settings) -> Path:
    import shutil

    shutil.copytree(folder, into)
    path = into / "generation_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **settings}))
    return into


def test_the_checkpoints_generation_config_samples_unless_set(tmp_path, vlm_dirs, tiny_sd, tiny_dinov2):
    model = _with_generation_config(vlm_dirs["qwen2_vl"], tmp_path / "captioner", temperature=0.6, top_p=0.7,
                                    top_k=5)
    captioner = TransformersCaptioner(model)
    request = CaptionRequest(_image(3), PROMPT, 4, seed=21)
    unset = captioner.caption([request], Sampling(temperature=1.0, max_new_tokens=6))
    assert unset == captioner.caption([request], Sampling(temperature=1.0, top_p=0.7, top_k=5, max_new_tokens=6))
    assert unset != captioner.caption([request], Sampling(temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=6))

    images = _image_folder(tmp_path / "images", 1)
    run, _, _ = _run(images, model, tiny_sd, tiny_dinov2, tmp_path / "cache", n=2, temperature=None)
    captioning = run.manifest["captioning"]
    assert captioning["sampling"] == {"temperature": 0.6, "top_p": 0.7, "top_k": 5, "max_new_tokens": 6}
    assert captioning["sampling_from"] == {"temperature": "captioner", "top_p": "captioner", "top_k": "captioner"}
    # what the user sets wins, setting by setting
    run, _, _ = _run(images, model, tiny_sd, tiny_dinov2, tmp_path / "cache", n=2, temperature=0.9, top_k=3)
    captioning = run.manifest["captioning"]
    assert captioning["sampling"] == {"temperature": 0.9, "top_p": 0.7, "top_k": 3, "max_new_tokens": 6}
    assert captioning["sampling_from"] == {"temperature": "call", "top_p": "captioner", "top_k": "call"}
    # a checkpoint without sampling settings: ours (temperature 0.8), top-k and top-p off
    run, _, _ = _run(images, vlm_dirs["qwen2_vl"], tiny_sd, tiny_dinov2, tmp_path / "cache", n=2, temperature=None)
    assert run.manifest["captioning"]["sampling"] == {"temperature": 0.8, "top_p": None, "top_k": None,
                                                      "max_new_tokens": 6}
    assert run.manifest["captioning"]["sampling_from"] == {"temperature": "default", "top_p": "default",
                                                           "top_k": "default"}


# ---------------------------------------------------------------------------------------
# what the captioner is shown


class SeeingCaptioner:
    """Records each picture it is asked to caption; one fixed caption per candidate."""

    fingerprint = "seeing-captioner-v1"

    def __init__(self):
        self.seen: list[Image.Image] = []

    def generation_defaults(self) -> dict:
        return {}

    def caption(self, requests, sampling):
        self.seen += [r.image for r in requests]
        return [["a red square"] * r.n for r in requests]


def _oracle_settings(tmp_path) -> dict:
    from oracle import OracleGenerator, PixelEmbedder

    return dict(generator=OracleGenerator(), embedder=PixelEmbedder(), max_side=96, cache_dir=str(tmp_path / "cache"))


def test_best_of_n_on_a_folder_never_reads_a_link_out_of_it(tmp_path, opened):
    folder = tmp_path / "photos"
    folder.mkdir()
    Image.new("RGB", (40, 30), (220, 30, 30)).save(folder / "inside.png")
    outside = tmp_path / "private.png"
    Image.new("RGB", (50, 20), (30, 60, 220)).save(outside)
    (folder / "link.png").symlink_to(outside)
    opened.clear()  # what the test itself wrote
    captioner = SeeingCaptioner()
    run = best_of_n(folder, captioner=captioner, n=2, out=tmp_path / "out", **_oracle_settings(tmp_path))
    assert outside.resolve() not in opened
    assert [im.size for im in captioner.seen] == [(40, 30)]  # the inside picture only
    errors = {c["image_id"]: c["error"] for c in run.candidates if c.get("error")}
    # named by the option that set the folder: `caption` has --images, not score's --image-root
    assert errors == {"link": f"image {folder / 'link.png'} lies outside --images {folder}"}
    assert [s["image_id"] for s in run.selected] == ["inside"]
    # the scoring (and so the report's gallery) keeps to the folder too
    assert run.manifest["image_root"] == str(folder.resolve())


def test_the_captioner_sees_the_picture_upright_and_over_white(tmp_path):
    folder = tmp_path / "photos"
    folder.mkdir()
    stored = Image.new("RGB", (48, 32), (220, 30, 30))
    exif = Image.Exif()
    exif[0x0112] = 6  # stored on its side: a viewer turns it 90 degrees clockwise
    stored.save(folder / "a_rotated.jpg", exif=exif)
    Image.new("RGBA", (20, 10), (0, 0, 0, 0)).save(folder / "b_clear.png")  # transparent black
    with Image.open(folder / "a_rotated.jpg") as raw:
        width, height = raw.size  # the stored pixels, not turned
    assert (width, height) == (48, 32)
    captioner = SeeingCaptioner()
    best_of_n(folder, captioner=captioner, n=1, **_oracle_settings(tmp_path))
    rotated, clear = captioner.seen
    assert rotated.size == (height, width)
    assert clear.mode == "RGB" and clear.size == (20, 10)
    assert set(clear.getdata()) == {(255, 255, 255)}


def test_an_image_swapped_for_a_link_after_hashing_is_not_read(tmp_path, opened, monkeypatch):
    """The bytes captioned are read under the folder's confinement too, not only hashed under it."""
    import caprecon.run.captioning as captioning

    folder = tmp_path / "photos"
    folder.mkdir()
    Image.new("RGB", (40, 30), (220, 30, 30)).save(folder / "swapped.png")
    outside = tmp_path / "private.png"
    Image.new("RGB", (50, 20), (30, 60, 220)).save(outside)
    hash_file = captioning.image_file_key

    def hash_then_swap(path, *args, **kwargs):
        got = hash_file(path, *args, **kwargs)
        Path(path).unlink()
        Path(path).symlink_to(outside)
        return got

    monkeypatch.setattr(captioning, "image_file_key", hash_then_swap)
    opened.clear()
    captioner = SeeingCaptioner()
    run = best_of_n(folder, captioner=captioner, n=1, **_oracle_settings(tmp_path))
    assert outside.resolve() not in opened and captioner.seen == []
    assert [(c["image_id"], c["error"]) for c in run.candidates] == [
        ("swapped", f"image {folder / 'swapped.png'} lies outside --images {folder}")]


def test_the_curve_table_leaves_a_missing_score_blank():
    from caprecon.apps.selection import curve_markdown

    table = curve_markdown([{"n": 1, "images": 2, "score": 0.123456}, {"n": 2, "images": 0, "score": None}])
    assert "| 1 | 2 | 0.1235 |" in table and "| 2 | 0 |  |" in table and "None" not in table


def test_a_hub_captioner_not_yet_downloaded_samples_with_its_own_settings(tmp_path, monkeypatch):
    """The first run of a hub checkpoint, before its weights are in the local cache, reads the
    checkpoint's generation_config.json as every later run does (fetched alone)."""
    import huggingface_hub
    from huggingface_hub.errors import EntryNotFoundError

    from caprecon.models.captioner import Sampling, TransformersCaptioner, complete_sampling

    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))  # an empty cache: nothing downloaded yet
    shipped = tmp_path / "generation_config.json"
    shipped.write_text(json.dumps({"temperature": 0.7, "top_p": 0.8, "top_k": 20, "do_sample": True}))
    fetched = []

    def download(repo_id, filename, revision=None, **_):
        fetched.append((repo_id, filename, revision))
        return str(shipped)

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", download)
    monkeypatch.setattr(huggingface_hub.HfApi, "model_info", lambda *a, **k: None)  # a Hub that has it
    captioner = TransformersCaptioner("some-org/some-captioner")
    assert captioner.source.path is None
    own = captioner.generation_defaults()
    assert own == {"temperature": 0.7, "top_p": 0.8, "top_k": 20}
    assert fetched == [("some-org/some-captioner", "generation_config.json", None)]
    assert complete_sampling(Sampling(temperature=1.0), own) == Sampling(temperature=1.0, top_p=0.8, top_k=20)

    def missing(repo_id, filename, revision=None, **_):
        raise EntryNotFoundError("no such file")

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", missing)
    assert captioner.generation_defaults() == {}  # a checkpoint that ships none


# ---------------------------------------------------------------------------------------
# what the scoring costs


class RepeatingCaptioner:
    """Three candidates per picture, one of them twice, the same three for every picture."""

    fingerprint = "repeating-captioner-v1"

    def generation_defaults(self) -> dict:
        return {}

    def caption(self, requests, sampling):
        return [["a red square", "a blue circle", "a red square"][: r.n] for r in requests]


@pytest.mark.parametrize("policy", ["per-image", "fixed"])
def test_selection_embeds_each_image_once_and_reconstructs_each_distinct_candidate_once(tmp_path, policy):
    from oracle import CountingEmbedder, CountingOracle, PixelEmbedder, render

    folder = tmp_path / "photos"
    folder.mkdir()
    photos = {f"p{k}": render(scene, 96, 80) for k, scene in enumerate(["red square", "blue circle", "green triangle"])}
    for name, photo in photos.items():
        photo.save(folder / f"{name}.png")
    generator, embedder = CountingOracle(), CountingEmbedder()
    run = best_of_n(folder, captioner=RepeatingCaptioner(), n=3, generator=generator, embedder=embedder,
                    seed_policy=policy, size="96x96", cache_dir=str(tmp_path / "cache"))
    # per image: each picture its own noise, so a candidate is rebuilt once per picture that has it;
    # fixed: one noise (and one size) for all, so once for the whole run
    distinct = ["a blue circle", "a red square"] * (3 if policy == "per-image" else 1)
    assert sorted(generator.prompts) == sorted(distinct)
    assert sorted(embedder.seen) == [(96, 80)] * 3 + [(96, 96)] * len(distinct)  # each photo embedded once
    for row in run.candidates:  # by hand: (1 + cos) / 2 of the photo's ink and the drawing's at 96 x 96
        a, b = PixelEmbedder().embed([photos[row["image_id"]], render(row["caption"], 96, 96)])
        assert row["recon"] == pytest.approx((1 + float(np.clip(a @ b, -1, 1))) / 2, abs=1e-6)
    assert [s["caption"] for s in run.selected] == ["a red square", "a blue circle", run.selected[2]["caption"]]
