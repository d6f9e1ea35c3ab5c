"""`caprecon t2i` and caption-only inputs, on tiny SD / FLUX generators and tiny Qwen2-VL / LLaVA judges."""

import csv
import json

import numpy as np
import pytest

import caprecon
from caprecon.data.caption_sets import load_caption_set
from caprecon.cli import main
from caprecon.core.errors import ConfigError
from caprecon.models.generator import DiffusersGenerator
from caprecon.models.vlm_transformers import TransformersVLM
from caprecon.data.samples import SampleFormatError
from caprecon.apps.t2i import adherence_table, mean_ci
from caprecon.run.entrants import entrants
from oracle import OracleGenerator, PixelEmbedder
from tiny_vlm import build_llava, build_qwen2_vl

CAPTIONS = [
    {"id": "list", "caption": "1. A red car\n2. A blue sky"},
    {"id": "bold", "caption": "**Subject:** a dog on grass"},
    # 80 letters: the tiny CLIP tokenizers make a token of each, and cut at 77 with start and end tokens
    {"id": "long", "caption": "a cat asleep on a soft woollen mat near a tall window on a rainy afternoon in a quiet "
                              "old stone house"},
]


@pytest.fixture(scope="module")
def judges(tmp_path_factory):
    root = tmp_path_factory.mktemp("t2i-judges")
    return {"qwen": build_qwen2_vl(root / "qwen"), "llava": build_llava(root / "llava")}


@pytest.fixture
def calls(monkeypatch):
    """Counts what the real backends are asked: prompts per generator folder, images per judge folder."""
    counted = {"generated": [], "judged": []}
    generate, option_probs = DiffusersGenerator.generate, TransformersVLM.option_probs

    def counting_generate(self, requests):
        counted["generated"] += [(self.source.path.name, r.prompt, r.seed) for r in requests]
        return generate(self, requests)

    def counting_option_probs(self, requests, options):
        counted["judged"] += [(self.source.path.name, r.image_key) for r in requests]
        return option_probs(self, requests, options)

    monkeypatch.setattr(DiffusersGenerator, "generate", counting_generate)
    monkeypatch.setattr(TransformersVLM, "option_probs", counting_option_probs)
    return counted


def _captions(tmp_path):
    path = tmp_path / "captions.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in CAPTIONS), encoding="utf-8")
    return path


def test_two_generators_two_judges_end_to_end(tmp_path, tiny_sd, tiny_flux, judges, calls, capsys):
    out = tmp_path / "run"
    argv = ["t2i", "--input", str(_captions(tmp_path)), "--generator", f"sd={tiny_sd}", "--generator",
            f"flux={tiny_flux}", "--judge", f"qwen={judges['qwen']}", "--judge", f"llava={judges['llava']}",
            "--size", "32x32", "--generator-opt", "steps=1", "--bootstrap", "200", "--cache-dir",
            str(tmp_path / "cache"), "--out", str(out), "--quiet"]
    assert main(argv) == 0

    # each caption generated once per generator, whatever the number of judges
    assert sorted((g, p) for g, p, _ in calls["generated"]) == sorted(
        (g, p) for g in ("sd", "flux") for p in ("A red car. A blue sky.", "Subject: a dog on grass",
                                                 CAPTIONS[2]["caption"]))
    seeds = {}
    for g, prompt, seed in calls["generated"]:
        seeds.setdefault(prompt, set()).add(seed)
    assert all(len(s) == 1 for s in seeds.values())  # same caption, same seed for both generators
    # every generated image judged by both judges, once each
    for judge in ("qwen", "llava"):
        keys = [k for j, k in calls["judged"] if j == judge]
        assert len(keys) == 6 and len(set(keys)) == 6

    records = [json.loads(line) for line in (out / "scores.jsonl").read_text().splitlines()]
    assert [(r["generator"], r["id"]) for r in records] == [(g, c["id"]) for g in ("sd", "flux") for c in CAPTIONS]
    for r in records:
        assert 0 <= r["vqa/qwen"] <= 1 and 0 <= r["vqa/llava"] <= 1 and r["size"] == [32, 32]
    assert records[0]["caption_raw"] == CAPTIONS[0]["caption"] and records[0]["caption"] == "A red car. A blue sky."

    # the table's paired difference is the mean of the per-caption differences in scores.jsonl
    table = list(csv.DictReader((out / "table.csv").open()))
    by = {(r["generator"], r["id"]): r for r in records}
    for judge in ("vqa/qwen", "vqa/llava"):
        (diff,) = [t for t in table if t["kind"] == "difference" and t["judge"] == judge]
        assert (diff["generator"], diff["versus"], diff["n"]) == ("sd", "flux", "3")
        expected = np.mean([by["sd", c["id"]][judge] - by["flux", c["id"]][judge] for c in CAPTIONS])
        assert float(diff["mean"]) == pytest.approx(expected, abs=1e-12)
        assert float(diff["ci_low"]) <= float(diff["mean"]) <= float(diff["ci_high"])
        for g in ("sd", "flux"):
            (mean,) = [t for t in table if t["kind"] == "mean" and t["judge"] == judge and t["generator"] == g]
            assert float(mean["mean"]) == pytest.approx(np.mean([by[g, c["id"]][judge] for c in CAPTIONS]))
    assert [r["tokens_cut"] for r in records] == [0, 0, 5] * 2
    assert records[5]["tokens_cut_by_encoder"] == {"tokenizer": 5, "tokenizer_2": 0}  # FLUX T5 reads 512 tokens
    markdown = (out / "table.md").read_text()
    assert "| sd - flux |" in markdown and "vqa/llava" in markdown
    assert "- flux: 1 of 3 prompts were cut by tokenizer" in markdown

    # a rerun makes no model call and prints the same table
    made, judged, first = len(calls["generated"]), len(calls["judged"]), markdown
    capsys.readouterr()  # the first run's closing lines
    assert main(argv[:-1]) == 0
    printed = capsys.readouterr().out
    assert (len(calls["generated"]), len(calls["judged"])) == (made, judged)
    assert printed.startswith("mean P(yes) [95% CI] over 3 captions") and "sd - flux" in printed
    assert (out / "table.md").read_text() == first
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["cache"]["sd"]["generated"] == 0 and manifest["cache"]["sd"]["reused"] == 6  # 3 captions x 2 judges


def test_native_resolution_when_no_size(tmp_path, tiny_sd, tiny_flux, judges):
    # tiny SD: UNet sample size 16 x VAE factor 2; tiny FLUX: the pipeline's default 128 x 2
    assert DiffusersGenerator(tiny_sd).native_size == (32, 32)
    assert DiffusersGenerator(tiny_flux).native_size == (256, 256)
    res = caprecon.score([{"id": "c", "caption": "## Scene\nA red ball"}], ["vqascore"], generator=str(tiny_sd),
                         generator_options={"steps": 1}, judge=str(judges["qwen"]), vqa_on="reconstruction",
                         normalise_captions=True, cache_dir=str(tmp_path / "cache"))
    (record,) = res.records
    assert record["size"] == [32, 32] and 0 <= record["vqascore_recon"] <= 1
    assert (record["caption"], record["caption_raw"]) == ("Scene. A red ball.", "## Scene\nA red ball")


def test_caption_only_row_given_to_recon_fails_before_any_work(tmp_path, capsys):
    rows = [{"id": "with", "image": str(tmp_path / "x.png"), "caption": "a red circle"},
            {"id": "without", "caption": "a blue square"}]
    OracleGenerator.calls = 0
    with pytest.raises(ConfigError, match=r"1 row\(s\) have no image \(first: row 1, id 'without'\).*recon"):
        caprecon.score(rows, ["recon"], generator=OracleGenerator(), embedder=PixelEmbedder(), no_cache=True)
    assert OracleGenerator.calls == 0
    path = tmp_path / "captions.jsonl"
    path.write_text(json.dumps({"id": "only", "caption": "a red circle"}))
    assert main(["score", "-i", str(path), "-m", "recon", "--generator", "oracle:OracleGenerator",
                 "--embedder", "oracle:PixelEmbedder", "--out", str(tmp_path / "run")]) == 2
    assert "no image" in capsys.readouterr().err and not (tmp_path / "run" / "scores.jsonl").exists()


def test_caption_only_rows_reconstruct_at_the_size_given(tmp_path):
    res = caprecon.score([{"id": "a", "caption": "a red circle"}], ["vqascore"], generator=OracleGenerator(),
                         judge=_YesJudge(), vqa_on="reconstruction", size="48x32", no_cache=True)
    assert res.records[0]["size"] == [48, 32] and res.records[0]["vqascore_recon"] == 0.25
    with pytest.raises(ConfigError, match="multiples of 16"):
        caprecon.score([{"id": "a", "caption": "x"}], ["vqascore"], generator=OracleGenerator(), judge=_YesJudge(),
                       vqa_on="reconstruction", size="50x50", no_cache=True)


class _YesJudge:
    """A judge that gives every image P('Yes') = 0.25."""

    fingerprint = "yes-judge-0.25"

    def option_probs(self, requests, options):
        return [[0.25] * len(o) for o in options]


# ----------------------------------------------------------------------------- the table's statistics


def test_paired_difference_ci_on_constructed_numbers():
    rng = np.random.default_rng(3)
    base = rng.uniform(0.2, 0.8, 200)  # captions differ a lot from one another
    ids = [f"c{i}" for i in range(200)]
    records = [{"id": i, "generator": "a", "vqa/j": v + 0.02} for i, v in zip(ids, base)]
    records += [{"id": i, "generator": "b", "vqa/j": v} for i, v in zip(ids, base)]
    table = adherence_table(records, ["a", "b"], ["vqa/j"], n_bootstrap=500)
    diff = table.differences["a", "b", "vqa/j"]
    # every caption gains exactly 0.02: every resample's mean difference is 0.02
    assert (diff.mean, diff.n) == (pytest.approx(0.02), 200)
    assert diff.ci_low == pytest.approx(0.02) and diff.ci_high == pytest.approx(0.02)
    # while the two means' intervals, which ignore the pairing, overlap
    a, b = table.means["a", "vqa/j"], table.means["b", "vqa/j"]
    assert a.ci_low < b.ci_high and a.mean == pytest.approx(base.mean() + 0.02)


def test_mean_ci_matches_the_normal_approximation():
    x = np.random.default_rng(7).normal(0.6, 0.1, 400)
    est = mean_ci(list(x), [str(i) for i in range(400)], n_bootstrap=2000, seed=1)
    half = 1.96 * x.std() / np.sqrt(len(x))
    assert est.ci_low < x.mean() < est.ci_high
    assert (est.ci_high - est.ci_low) / (2 * half) == pytest.approx(1.0, abs=0.1)
    assert mean_ci(list(x), [str(i) for i in range(400)], n_bootstrap=2000, seed=1) == est  # seeded


def test_failed_rows_leave_only_shared_captions_in_a_pair():
    records = [{"id": "1", "generator": "a", "vqa/j": 0.9}, {"id": "2", "generator": "a", "vqa/j": 0.7},
               {"id": "3", "generator": "a", "vqa/j": 0.5},
               {"id": "1", "generator": "b", "vqa/j": 0.4}, {"id": "2", "generator": "b", "error": "boom"},
               {"id": "3", "generator": "b", "vqa/j": 0.3}]
    table = adherence_table(records, ["a", "b"], ["vqa/j"], n_bootstrap=0)
    assert table.means["b", "vqa/j"].n == 2 and table.means["a", "vqa/j"].mean == pytest.approx(0.7)
    diff = table.differences["a", "b", "vqa/j"]
    assert (diff.n, diff.mean) == (2, pytest.approx(((0.9 - 0.4) + (0.5 - 0.3)) / 2))
    text = table.to_text()
    assert "a - b" in text and "+0.3500 n=2" in text and "0.7000" in text


def test_entrants_labels():
    got = entrants(["sdxl-turbo", "mine=/models/flux-dev/", {"model": "org/Model-X", "options": {"steps": 4}}],
                   "generator")
    assert [(e.label, e.spec, e.options) for e in got] == [
        ("sdxl-turbo", "sdxl-turbo", {}), ("mine", "/models/flux-dev/", {}), ("Model-X", "org/Model-X", {"steps": 4})]
    with pytest.raises(ConfigError, match="given twice"):
        entrants(["a/x", "b/x"], "judge")


# ----------------------------------------------------------------------------- caption sets


def test_caption_set_files_and_column_choice(tmp_path):
    rows = [{"key": "000001", "url": "http://example.org/1.jpg", "caption": "alt text one",
             "re_caption": "**Subject:** a dog\n**Setting:** a park", "width": 640},
            {"key": "000002", "url": "http://example.org/2.jpg", "caption": "alt text two",
             "re_caption": "1. A boat\n2. A harbour at dusk", "width": 480}]
    import pyarrow as pa
    import pyarrow.parquet as pq

    parquet = tmp_path / "relaion.parquet"
    pq.write_table(pa.Table.from_pylist(rows), parquet)
    samples, column = load_caption_set(parquet)
    assert column == "re_caption" and [s.id for s in samples] == ["000001", "000002"]
    assert samples[0].caption == rows[0]["re_caption"] and samples[0].image is None
    assert samples[1].meta == {"url": "http://example.org/2.jpg", "caption": "alt text two", "width": 480}
    samples, column = load_caption_set(parquet, caption_column="caption", limit=1)
    assert column == "caption" and [s.caption for s in samples] == ["alt text one"]
    with pytest.raises(SampleFormatError, match="no column 'prompt_text'.*columns: key, url"):
        load_caption_set(parquet, caption_column="prompt_text")

    csv_path = tmp_path / "prompts.csv"
    csv_path.write_text("prompt,category\na red bus,vehicles\na green frog,animals\n", encoding="utf-8")
    samples, column = load_caption_set(csv_path)
    assert column == "prompt" and [(s.id, s.caption, s.meta) for s in samples] == [
        ("0", "a red bus", {"category": "vehicles"}), ("1", "a green frog", {"category": "animals"})]
    bad = tmp_path / "nothing.jsonl"
    bad.write_text(json.dumps({"id": 1, "words": "x"}))
    with pytest.raises(SampleFormatError, match="no caption column.*--caption-column"):
        load_caption_set(bad)


def test_structured_caption_cells_become_lines():
    from caprecon.data.caption_sets import caption_text
    from caprecon.data.normalise import normalise_caption

    cell = {"subject": "a dog", "setting": "a park", "camera": None}
    assert caption_text(cell) == "subject: a dog\nsetting: a park"
    assert normalise_caption(caption_text(["A dog", "A park"])) == "A dog. A park."


def test_config_file_lists_and_models_that_cannot_be_found(tmp_path, judges, capsys):
    captions = _captions(tmp_path)
    config = tmp_path / "t2i.yaml"
    config.write_text(f"generators:\n  - {{label: shapes, model: 'oracle:OracleGenerator'}}\n"
                      f"judges: ['{judges['qwen']}']\nsize: 32x32\nseed: 5\n")
    # the file names a plug-in, which loads only when the user vouches for the file
    assert main(["t2i", "-i", str(captions), "--config", str(config), "--allow-plugins", "--no-cache", "--out",
                 str(tmp_path / "a"), "--quiet"]) == 0
    records = [json.loads(line) for line in (tmp_path / "a" / "scores.jsonl").read_text().splitlines()]
    assert {r["generator"] for r in records} == {"shapes"} and all("vqa/qwen" in r for r in records)
    assert json.loads((tmp_path / "a" / "manifest.json").read_text())["config"]["seed"] == 5

    # offline, the paper's default judges are not in the cache: stop before generating anything
    OracleGenerator.calls = 0
    assert main(["t2i", "-i", str(captions), "-g", "oracle:OracleGenerator", "--out", str(tmp_path / "b")]) == 2
    assert "llava-hf/llava-1.5-13b-hf" in capsys.readouterr().err
    assert OracleGenerator.calls == 0 and not (tmp_path / "b" / "scores.jsonl").exists()
    assert main(["t2i", "-i", str(captions), "-g", "oracle:OracleGenerator", "--judge", str(judges["qwen"]),
                 "--vqa-template", "Does it match?"]) == 2
    assert "must contain {caption}" in capsys.readouterr().err and OracleGenerator.calls == 0


def test_score_says_when_clip_reads_a_cut_caption(tmp_path, tiny_clip, capsys):
    from PIL import Image

    Image.new("RGB", (32, 32), (200, 30, 30)).save(tmp_path / "red.png")
    rows = [{"id": "short", "image": "red.png", "caption": "a red square"},
            {"id": "long", "image": "red.png", "caption": CAPTIONS[2]["caption"]}]
    path = tmp_path / "in.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    assert main(["score", "-i", str(path), "-m", "clipscore", "--clip", str(tiny_clip), "--no-cache"]) == 0
    assert "note: 1 caption(s) exceed CLIP's 77 text tokens and were cut" in capsys.readouterr().out


def test_text_to_image_is_another_name_for_t2i():
    from caprecon.cli.commands import build_parser

    short = build_parser().parse_args(["t2i", "-i", "captions.jsonl", "--caption-column", "caption"])
    long = build_parser().parse_args(["text-to-image", "-i", "captions.jsonl", "--caption-column", "caption"])
    assert short.func is long.func and long.caption_column == "caption"
