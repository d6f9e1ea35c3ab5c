"""Every command family has a Python function of the same name, and it gives what the command gives:
each test runs the command and the function on the same tiny input and compares the numbers they
write and return (and, where the numbers can be worked out by hand, checks them too)."""

from __future__ import annotations

import csv
import json
import re

import numpy as np
import pytest

import caprecon
from caprecon.cli import main
from caprecon.core.errors import ConfigError
from caprecon.core.tables import number


def _seeded_run(folder, systems: dict[str, list[list[float]]], metric: str = "recon"):
    """A run folder whose rows carry per-seed values: one row per (system, image)."""
    folder.mkdir(parents=True)
    rows = [{"id": f"{name}-{i}", "image_id": f"img{i}", "captioner": name, metric: float(np.mean(draws)),
             f"{metric}_seeds": [float(v) for v in draws]}
            for name, images in systems.items() for i, draws in enumerate(images)]
    (folder / "scores.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def _jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_compare_two_runs_and_the_systems_of_one_match_the_command(tmp_path, capsys):
    rng = np.random.default_rng(3)
    base = rng.random((12, 1))
    values = {"a": base + 0.2 + rng.normal(0, 0.01, (12, 3)), "b": base + rng.normal(0, 0.01, (12, 3)),
              "c": base - 0.1 + rng.normal(0, 0.01, (12, 3))}
    # two runs, one system each
    run_a = _seeded_run(tmp_path / "A", {"a": values["a"].tolist()})
    run_b = _seeded_run(tmp_path / "B", {"b": values["b"].tolist()})
    assert main(["compare", str(run_a), str(run_b), "--resamples", "200", "--out", str(tmp_path / "cli.jsonl")]) == 0
    results = caprecon.compare([str(run_a), str(run_b)], resamples=200, out=tmp_path / "py.jsonl")
    assert _jsonl(tmp_path / "cli.jsonl") == _jsonl(tmp_path / "py.jsonl") == [c.row() for c in results.comparisons]
    [c] = results.comparisons
    assert c.difference == pytest.approx(float(values["a"].mean() - values["b"].mean()))  # same images, same seeds
    assert (c.images, c.seeds, c.better) == (12, 3, str(run_a))

    # three systems in one run: every pair, and their Elo ratings
    both = _seeded_run(tmp_path / "all", {name: v.tolist() for name, v in values.items()})
    capsys.readouterr()
    assert main(["compare", str(both), "--resamples", "200", "--out", str(tmp_path / "cli3.jsonl")]) == 0
    printed = capsys.readouterr().out
    results = caprecon.compare(both, resamples=200, out=tmp_path / "py3.jsonl")
    assert _jsonl(tmp_path / "cli3.jsonl") == _jsonl(tmp_path / "py3.jsonl")
    assert [(c.a, c.b) for c in results.comparisons] == [("a", "b"), ("a", "c"), ("b", "c")]
    # every image prefers a to b to c, so the Elo order is that
    assert [name for name, _ in results.elo] == ["a", "b", "c"] and results.battles == 3 * 12
    shown = re.findall(r"^\s*(\d) +(\w) +(-?[\d.]+)\s*$", printed, flags=re.M)
    assert [(int(k), name, float(r)) for k, name, r in shown] == \
        [(k, name, round(r, 1)) for k, (name, r) in enumerate(results.elo, 1)]


def test_seeds_matches_the_command(tmp_path):
    # final means A .1 < B .2 < C .3 < D .4; at one seed B (.05) falls below A: one discordant pair of six
    values = [[0.1] * 4, [0.05, 0.35, 0.2, 0.2], [0.3] * 4, [0.4] * 4]
    run = _seeded_run(tmp_path / "run", {"x": values})
    assert main(["seeds", str(run), "--resamples", "50", "--out", str(tmp_path / "cli")]) == 0
    results = caprecon.seeds(run, resamples=50, out=tmp_path / "py")
    assert (tmp_path / "cli" / "seeds.csv").read_text() == (tmp_path / "py" / "seeds.csv").read_text()
    assert results.out == tmp_path / "py" / "seeds.csv"
    assert [p.tau for p in results.curve] == pytest.approx([4 / 6, 1, 1, 1])
    assert results.needed == 2 and results.metric == "recon" and "higher is better" in results.read_as
    # without `out`, seeds.csv goes into the run folder, as the command's
    assert caprecon.seeds(run, resamples=50).out == run / "seeds.csv"
    assert (run / "seeds.csv").read_text() == (tmp_path / "py" / "seeds.csv").read_text()


# ----------------------------------------------------------------------------- meta (with --fit, --compare, verify)


def _rated_files(tmp_path, n_images: int = 30, per_image: int = 3):
    """Judgments rated exactly 2·a + b (c is noise), and a scores file of a, b and c by id."""
    rng = np.random.default_rng(7)
    n = n_images * per_image
    a, b, c = rng.normal(size=n), rng.normal(size=n), rng.normal(size=n)
    human = 2 * a + b
    judgments, scores = tmp_path / "judged.jsonl", tmp_path / "scores.jsonl"
    judgments.write_text("".join(json.dumps({"id": str(k), "image": f"img{k // per_image}.jpg",
                                             "caption": f"caption {k}", "human": float(human[k])}) + "\n"
                                 for k in range(n)))
    scores.write_text("".join(json.dumps({"id": str(k), "a": float(a[k]), "b": float(b[k]), "c": float(c[k])}) + "\n"
                              for k in range(n)))
    return judgments, scores, {"a": a, "b": b, "c": c}, human


def _csv(path):
    return list(csv.DictReader(path.open()))


def test_meta_on_judgments_matches_the_command_and_prints_the_fitted_row_once(tmp_path, capsys):
    from scipy import stats

    judgments, scores, features, human = _rated_files(tmp_path)
    options = ["--metric", "a", "b", "c", "--fit", "--compare", "a", "b", "--bootstrap", "50"]
    capsys.readouterr()
    assert main(["meta", "--judgments", str(judgments), "--scores", str(scores), *options,
                 "--out", str(tmp_path / "cli")]) == 0
    printed = capsys.readouterr().out
    results = caprecon.meta(judgments, scores=scores, metrics=["a", "b", "c"], fit=True, compare=("a", "b"),
                            bootstrap=50, out=tmp_path / "py")
    for name in ("meta.csv", "scores-judged.csv", "fit-weights.csv"):
        assert _csv(tmp_path / "cli" / name) == _csv(tmp_path / "py" / name), name
    written = _csv(tmp_path / "py" / "meta.csv")
    assert [(r["metric"], float(r["value"])) for r in written] == \
        [(r.metric, pytest.approx(r.value)) for r in results.rows]
    # the numbers, worked out here: Kendall's tau-b of each metric against the ratings ...
    by_metric = {r.metric: r.value for r in results.rows}
    for name, values in features.items():
        assert by_metric[name] == pytest.approx(stats.kendalltau(values, human).statistic)
    # ... and the fused metric, out of fold, recovers the exact combination nearly perfectly
    [fit] = results.fits
    assert by_metric[fit.name] > 0.95 > by_metric["a"]
    [comparison] = results.comparisons
    assert comparison.difference == pytest.approx(by_metric["a"] - by_metric["b"])
    assert (tmp_path / "py" / "report.html").is_file()

    # the fitted row is printed once (in the table of every row), not again beside its components
    fused_rows = [line for line in printed.splitlines() if re.match(rf"judged\.jsonl +{re.escape(fit.name)} ", line)]
    assert len(fused_rows) == 1, printed
    components = printed.split(f"{fit.name} on judged.jsonl (its row is above)")[1]
    assert all(name in components for name in ("a", "b", "c"))


def test_meta_on_a_benchmark_and_verify_match_the_command(tmp_path, capsys):
    # Pascal-50S, four pairs: "good" always prefers caption A, right on the three pairs people labelled A
    pair = lambda label: {"image": "p.jpg", "captions": ["x", "y"], "label": label,  # noqa: E731
                          "references": [f"ref {k}" for k in range(5)]}
    data = tmp_path / "pascal50s.json"
    data.write_text(json.dumps({"HC": [pair(0), pair(1)], "HI": [pair(0)], "HM": [], "MM": [pair(0)]}))
    scores = tmp_path / "scores.csv"
    scores.write_text("id,good,bad\n" + "".join(f"{i}:{s},{float(s == 'a')},{float(s == 'b')}\n"
                                                for i in ("HC-0", "HC-1", "HI-0", "MM-0") for s in "ab"))
    from caprecon.data.loaders.pascal50s import load_pascal50s

    assert sorted(s.id for s in load_pascal50s(data).samples()) == sorted(
        f"{i}:{s}" for i in ("HC-0", "HC-1", "HI-0", "MM-0") for s in "ab")  # the ids the scores file names
    common = ["--benchmark", "pascal50s", "--data", str(data), "--scores", str(scores), "--bootstrap", "50"]
    assert main(["meta", *common, "--metric", "good", "bad", "--compare", "good", "bad",
                 "--out", str(tmp_path / "cli")]) == 0
    results = caprecon.meta(benchmark="pascal50s", data=data, scores=scores, metrics=["good", "bad"],
                            compare=("good", "bad"), bootstrap=50, out=tmp_path / "py")
    for name in ("meta.csv", "compare.csv", "scores-pascal50s.csv"):
        assert _csv(tmp_path / "cli" / name) == _csv(tmp_path / "py" / name), name
    value = {r.metric: r.value for r in results.rows}
    assert (value["good"], value["bad"]) == (pytest.approx(0.75), pytest.approx(0.25))
    assert results.benchmark == "pascal50s" and results.comparisons[0].difference == pytest.approx(0.5)

    # verify: ours beside published values, one passing and one failing
    expected = tmp_path / "expected.csv"
    expected.write_text("benchmark,metric,key,value,source\npascal50s,good,HC,50,hand\npascal50s,good,mean,40,hand\n")
    assert main(["meta", "verify", *common, "--expected", str(expected), "--out", str(tmp_path / "cli-v")]) == 1
    checked = caprecon.meta(benchmark="pascal50s", data=data, scores=scores, bootstrap=50, expected=expected,
                            verify=True, out=tmp_path / "py-v")
    assert _csv(tmp_path / "cli-v" / "verify.csv") == _csv(tmp_path / "py-v" / "verify.csv")
    assert [(r.key, r.status) for r in checked.verify] == [("HC", "pass"), ("mean", "fail")] and checked.failed


# ----------------------------------------------------------------------------- report, demo


def _turing_row(image, captioner, answers):
    """A turing row from (correct, asked) per category; the judge on the original gets every one right."""
    record = {"id": f"{image}-{captioner}", "image_id": image, "caption": "...", "captioner": captioner}
    for category, (correct, asked) in answers.items():
        record.update({f"turing/{category}": correct / asked, f"turing_n/{category}": asked,
                       f"turing_upper/{category}": 1.0})
    asked = sum(n for _, n in answers.values())
    record.update(turing=sum(c for c, _ in answers.values()) / asked, turing_upper=1.0, turing_n=asked)
    return record


def test_report_matches_the_command(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    rows = [_turing_row("i1", "A", {"spatial": (1, 2), "ocr": (1, 1)}), _turing_row("i2", "A", {"spatial": (0, 1)}),
            _turing_row("i1", "B", {"spatial": (2, 2), "ocr": (0, 1)}), _turing_row("i2", "B", {"spatial": (1, 1)})]
    (run / "scores.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["report", str(run), "--out", str(tmp_path / "cli")]) == 0
    printed = capsys.readouterr().out
    result = caprecon.report(run, out=tmp_path / "py")
    assert _csv(tmp_path / "cli" / "categories.csv") == _csv(tmp_path / "py" / "categories.csv")
    assert result.html == tmp_path / "py" / "report.html" and result.html.is_file()
    assert result.files == {"markdown": tmp_path / "py" / "categories.md", "csv": tmp_path / "py" / "categories.csv",
                            "radar": tmp_path / "py" / "radar.png"}
    assert result.table.to_text() in printed
    # pooled by questions: A got 1 + 0 of 3 spatial questions and 1 of 1 ocr, B 2 + 1 of 3 and 0 of 1
    table = {r["captioner"]: r for r in _csv(tmp_path / "py" / "categories.csv")}
    assert [table[c]["spatial"] for c in "AB"] == ["33.33", "100.00"] and [table[c]["ocr"] for c in "AB"] == \
        ["100.00", "0.00"]
    assert [table[c]["mean over questions"] for c in "AB"] == ["50.00", "75.00"]
    # a run without turing scores: the page, and the line saying why there is no table
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "scores.jsonl").write_text(json.dumps({"id": "1", "caption": "x", "recon": 0.5}) + "\n")
    assert caprecon.report(plain).note == f"no turing scores in {plain / 'scores.jsonl'}: no per-category table"
    with pytest.raises(ConfigError, match="needs a run scored with -m halluc"):
        caprecon.report(plain, metric="halluc")


def test_demo_matches_the_command(tmp_path, capsys):
    assert main(["demo", "--out", str(tmp_path / "cli")]) == 0
    printed = capsys.readouterr().out
    results = caprecon.demo(out=tmp_path / "py")
    cli = {r["id"]: r["recon"] for r in _jsonl(tmp_path / "cli" / "scores.jsonl")}
    assert cli == {r["id"]: r["recon"] for r in results.records} and len(cli) >= 3
    assert (tmp_path / "py" / "report.html").is_file()
    for r in results.records:  # every score the command printed, to its four digits
        assert f"{r['recon']:.4f}" in printed
    # it ends as every command does, naming its report once (it printed its own two lines before these)
    assert printed.count("report.html") == 1 and printed.rstrip().endswith(f"report: {tmp_path / 'cli' / 'report.html'}")


def test_meta_refuses_what_its_options_refuse(tmp_path):
    judgments, scores, _, _ = _rated_files(tmp_path)
    with pytest.raises(ConfigError, match="--bootstrap must be between 0 and 100000, not -1"):
        caprecon.meta(judgments, scores=scores, metrics=["a"], bootstrap=-1, out=tmp_path / "o")
    with pytest.raises(ConfigError, match="--fit-model 'trees': choose from linear, logistic, gbt"):
        caprecon.meta(judgments, scores=scores, metrics=["a"], fit=True, fit_model="trees", out=tmp_path / "o")
    with pytest.raises(ConfigError, match="--out .* is a file"):
        caprecon.meta(judgments, scores=scores, metrics=["a"], out=scores)
    with pytest.raises(TypeError, match="run settings \\(preset\\) are for caprecon's own scoring"):
        caprecon.meta(judgments, metrics=["m"], score_metric=lambda name, samples: [0.0] * len(samples),
                      preset="fast", out=tmp_path / "o")
    assert not (tmp_path / "o").exists()  # refused before the run folder was made


# ----------------------------------------------------------------------------- caption (best-of-N, then --refine)


SHAPES = "a red square and a blue square and a green square"


def _shapes_world(tmp_path):
    """One picture of three squares, and a QA bank about their colours (the refine tests' world)."""
    from oracle import render

    images = tmp_path / "images"
    images.mkdir()
    render(SHAPES, 96, 96).save(images / "scene.png")
    bank = tmp_path / "bank.jsonl"
    questions = [f"Is there a {c} shape in the image?" for c in ("red", "blue", "green", "purple")]
    bank.write_text("".join(json.dumps({"image_id": "scene", "question": q, "category": "colour", "type": "yesno",
                                        "answer": "yes"}) + "\n" for q in [*questions, "Is the background white here?"]))
    return images, bank


def _recon_by_hand(caption: str) -> float:
    """ReconScore (1 + cos) / 2 of the oracle's drawing of `caption` against the picture."""
    from oracle import PixelEmbedder, render

    a, b = PixelEmbedder().embed([render(SHAPES, 96, 96), render(caption, 96, 96)])
    return (1.0 + float(np.clip(a @ b, -1, 1))) / 2.0


def test_caption_with_refine_matches_the_command(tmp_path, capsys):
    images, bank = _shapes_world(tmp_path)
    models = {"captioner": "refine_fakes:ShapesCaptioner", "generator": "oracle:OracleGenerator",
              "embedder": "oracle:PixelEmbedder", "judge": "refine_fakes:DescribingVLM"}
    assert main(["caption", "--images", str(images), *(a for k, v in models.items() for a in (f"--{k}", v)),
                 "--n", "2", "--qa-bank", str(bank), "--max-side", "96", "--cache-dir", str(tmp_path / "cache-cli"),
                 "--refine", "3", "--feedback", "flipped", "--out", str(tmp_path / "cli")]) == 0
    printed = capsys.readouterr().out
    run = caprecon.caption(images, n=2, qa_bank=str(bank), max_side=96, cache_dir=str(tmp_path / "cache-py"),
                           refine=3, feedback="flipped", out=tmp_path / "py", **models)
    cli, py = tmp_path / "cli", tmp_path / "py"
    assert _jsonl(cli / "selected.jsonl") == _jsonl(py / "selected.jsonl") == run.selected
    assert (cli / "curve.csv").read_text() == (py / "curve.csv").read_text()
    assert [(r["caption"], r["score"], r["selected"]) for r in _jsonl(cli / "candidates.jsonl")] == \
        [(r["caption"], r["score"], r["selected"]) for r in run.candidates]
    refined = _jsonl(py / "refine" / "refined.jsonl")
    assert [(r["original"], r["caption"]) for r in _jsonl(cli / "refine" / "refined.jsonl")] == \
        [(r["original"], r["caption"]) for r in refined] == [(r["original"], r["caption"]) for r in run.refined.captions]
    assert (cli / "refine" / "rounds.csv").read_text() == (py / "refine" / "rounds.csv").read_text()
    # the numbers, by hand: the red square beats the yellow one, and refinement adds the two missing squares
    [chosen] = run.selected
    assert chosen["caption"] == "a red square" and chosen["score"] == pytest.approx(_recon_by_hand("a red square"))
    assert [c["caption"] for c in chosen["candidates"]] == ["a yellow square", "a red square"]
    assert refined[0]["caption"] == SHAPES and _recon_by_hand(SHAPES) == pytest.approx(1.0)
    assert "improved 1 of 1 caption(s)" in printed and run.refined.manifest["improved"] == 1


def test_caption_refuses_bad_refine_settings_before_captioning(tmp_path):
    images, _ = _shapes_world(tmp_path)
    for options, message in (({"refine": 0}, "--rounds must be"), ({"refine": 2, "holdout": 1.0}, "--holdout must be"),
                             ({"refine": 2, "margin": -1}, "--margin must be")):
        with pytest.raises(ConfigError, match=message):
            caprecon.caption(images, captioner="refine_fakes:ShapesCaptioner", generator="oracle:OracleGenerator",
                             embedder="oracle:PixelEmbedder", out=tmp_path / "o", **options)
        assert not (tmp_path / "o").exists()  # nothing captioned, no run folder left


# ----------------------------------------------------------------------------- distill


def _scored_shapes_run(root, images: int = 12):
    """A scored run of one-shape pictures, six captions each, 'recon' 1 for the right colour and shape,
    .5 for one of the two, 0 for neither (test_distill's run, smaller)."""
    from oracle import render

    rng = np.random.default_rng(0)
    colours, shapes = ["red", "green", "blue", "yellow"], ["circle", "square", "triangle"]
    rows, truth = [], {}
    for k in range(images):
        colour, shape = colours[k % 4], shapes[(k // 4) % 3]
        path = root / f"img{k}.png"
        render(f"{colour} {shape}").save(path)
        for c in range(6):
            said = colours[rng.integers(4)], shapes[rng.integers(3)]
            value = 0.5 * (said[0] == colour) + 0.5 * (said[1] == shape)
            # numbered, so no caption of one picture is another's (distill leaves those out of training)
            rows.append({"id": f"{k}-{c}", "image": str(path), "caption": f"a {said[0]} {said[1]}, number {6 * k + c}",
                         "recon": value})
    run = root / "run"
    run.mkdir()
    (run / "scores.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run / "manifest.json").write_text(json.dumps({"samples": len(rows), "cache": {"model_seconds": 7.2}}))
    return run, rows


def test_distill_matches_the_command(tmp_path, capsys):
    import hashlib

    from scipy import stats

    from PIL import Image

    from caprecon.models.distilled import DistilledReward

    run, rows = _scored_shapes_run(tmp_path)
    encoders = {"image_encoder": "oracle:PixelEmbedder", "text_encoder": "cttd_fakes:WordMatcher"}
    settings = {"holdout": 0.25, "hidden": 16, "epochs": 60, "seed": 3}
    assert main(["distill", str(run), "-m", "recon", "--out", str(tmp_path / "cli"),
                 *(a for k, v in {**encoders, **settings}.items() for a in (f"--{k.replace('_', '-')}", str(v))),
                 "--cache-dir", str(tmp_path / "cache-cli")]) == 0
    printed = capsys.readouterr().out
    result = caprecon.distill(run, "recon", tmp_path / "py", cache_dir=tmp_path / "cache-py", **encoders, **settings)
    cli, py = tmp_path / "cli", tmp_path / "py"
    assert result.out == py and json.loads((cli / "config.json").read_text()) == json.loads((py / "config.json").read_text())
    assert (cli / "model.safetensors").read_bytes() == (py / "model.safetensors").read_bytes()
    assert json.loads((cli / "manifest.json").read_text())["report"]["held_out"] == result.report["held_out"]
    held = result.report["held_out"]
    assert f"pairwise accuracy {number(held['pairwise_accuracy'])} ({held['pairs']} pairs)" in printed
    # by hand: the documented split (a quarter of the 12 images, ranked by sha256 of "seed|file name") ...
    names = sorted({r["image"] for r in rows}, key=lambda p: hashlib.sha256(f"3|{p.rsplit('/', 1)[1]}".encode()).hexdigest())
    out_rows = [r for r in rows if r["image"] in names[:3]]
    assert (held["images"], held["rows"], result.report["train_images"]) == (3, len(out_rows), 9)
    # ... and the held-out Spearman, from the saved model scoring those rows afresh
    model = DistilledReward.from_pretrained(py, allow_plugins=True)
    predicted = model.score([Image.open(r["image"]).convert("RGB") for r in out_rows], [r["caption"] for r in out_rows])
    assert held["spearman"] == pytest.approx(stats.spearmanr(predicted, [r["recon"] for r in out_rows]).statistic,
                                             abs=1e-5)


def test_distill_refuses_what_its_options_refuse(tmp_path):
    run, _ = _scored_shapes_run(tmp_path, images=3)
    for options, message in (({"epochs": 0}, "--epochs must be between 1 and"), ({"hidden": 10**9}, "--hidden must be"),
                             ({"holdout": 1}, "--holdout must be"), ({"seed": -1}, "--seed must be at least 0")):
        with pytest.raises(ConfigError, match=message):
            caprecon.distill(run, "recon", tmp_path / "o", **options)
    with pytest.raises(ConfigError, match="is given twice"):
        caprecon.distill([run, str(run) + "/"], "recon", tmp_path / "o")
    with pytest.raises(ConfigError, match="--out .* lies inside the input"):
        caprecon.distill(run, "recon", run)
    with pytest.raises(ConfigError, match="--out .* is a file"):
        caprecon.distill(run, "recon", run / "scores.jsonl")
    assert not (tmp_path / "o").exists()


# ----------------------------------------------------------------------------- cttd build, cttd import


def test_cttd_build_matches_the_command(tmp_path, capsys):
    from cttd_fakes import write_example

    write_example(tmp_path / "example")
    images, taxonomy = tmp_path / "example" / "shapes", tmp_path / "example" / "taxonomy.json"
    models = {"vlm": "cttd_fakes:ScriptedVLM", "llm": "cttd_fakes:ScriptedLLM", "embedder": "oracle:PixelEmbedder",
              "matcher": "cttd_fakes:WordMatcher"}  # the llm runs the blind control, on by default
    assert main(["cttd", "build", "--images", str(images), "--out", str(tmp_path / "cli"),
                 *(a for k, v in models.items() for a in (f"--{k}", v)), "--taxonomy", str(taxonomy),
                 "--density-band", "0", "1", "--top-k", "6", "--allow-row-errors"]) == 0
    printed = capsys.readouterr().out
    result = caprecon.cttd_build(images, tmp_path / "py", taxonomy=str(taxonomy), density_band=(0, 1), top_k=6,
                                 **models)
    assert (tmp_path / "cli" / "bank.jsonl").read_text() == result.bank.read_text()
    cli_sheet = json.loads((tmp_path / "cli" / "datasheet.json").read_text())
    assert {k: cli_sheet[k] for k in ("questions", "images", "by_category")} == \
        {k: result.datasheet[k] for k in ("questions", "images", "by_category")}
    assert f"bank: {tmp_path / 'cli' / 'bank.jsonl'} — {result.datasheet['questions']} questions" in printed
    assert result.report == tmp_path / "py" / "report.html" and result.report.is_file()
    # by hand: stage 1 drops the four pictures made to be dropped; every question is about one of the six
    # scenes, at most --top-k of them each, and the file holds as many as the datasheet counts
    select = next(s for s in result.datasheet["stages"] if s["stage"] == "select")
    assert sum(select["dropped"].values()) == 4
    bank = _jsonl(result.bank)
    per_image = {r["image_id"]: sum(1 for b in bank if b["image_id"] == r["image_id"]) for r in bank}
    assert set(per_image) <= {f"scene{i}" for i in range(6)} and max(per_image.values()) <= 6
    assert len(bank) == result.datasheet["questions"] > 0
    assert {"select", "generate", "curate", "rank"} <= set(result.ran)
    again = caprecon.cttd_build(images, tmp_path / "py", taxonomy=str(taxonomy), density_band=(0, 1), top_k=6,
                                **models)
    assert again.ran == [] and again.bank.read_text() == result.bank.read_text()  # resumed: every stage done
    with pytest.raises(ConfigError, match="--top-k must be between 1 and 1000"):
        caprecon.cttd_build(images, tmp_path / "bad", top_k=0, **models)
    with pytest.raises(ConfigError, match="lies inside the input"):
        caprecon.cttd_build(images, images / "build", taxonomy=str(taxonomy), **models)
    assert not (tmp_path / "bad").exists() and not (images / "build").exists()


def test_cttd_import_matches_the_command(tmp_path, capsys):
    import base64
    import io

    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (12, 8), (200, 10, 10)).save(buffer, format="PNG")
    red = base64.b64encode(buffer.getvalue()).decode()
    header = ["index", "image", "question", "hint", "A", "B", "C", "answer", "category"]
    rows = [["11", red, "What colour is it?", "", "blue", "red", "green", "B", "colour"],
            ["12", "11", "Is it red?", "", "", "", "", "Yes", "existence"],
            ["13", "not base64 at all" * 40, "Name the colour.", "", "", "", "", "blue", "colour"]]
    tsv = tmp_path / "MMB.tsv"
    tsv.write_text("\n".join("\t".join(r) for r in [header, *rows]) + "\n")
    assert main(["cttd", "import", str(tsv), "--out", str(tmp_path / "cli"), "--id-prefix", "mmb-"]) == 1
    err = capsys.readouterr().err
    imported = caprecon.cttd_import(tsv, tmp_path / "py", id_prefix="mmb-")
    for name in ("bank.jsonl", "datasheet.md"):
        assert (tmp_path / "cli" / name).read_text() == (tmp_path / "py" / name).read_text().replace(
            str(tmp_path / "py"), str(tmp_path / "cli")), name
    # by hand: the third row's image is not base64, so its question is dropped and named; two remain
    assert imported.format == "vlmevalkit" and [r["question"] for r in imported.records] == \
        ["What colour is it?", "Is it red?"]
    [dropped] = imported.dropped
    assert dropped.image_id == "mmb-13" and f"(image mmb-13): {dropped.error}" in err
    # row 12 refers to row 11's picture: written under each id
    assert list(imported.images) == ["mmb-11", "mmb-12"] and all(p.is_file() for p in imported.images.values())
    with pytest.raises(ConfigError, match="question file not found"):
        caprecon.cttd_import(tmp_path / "nothing.tsv", tmp_path / "o")
    with pytest.raises(ConfigError, match="--format 'xml'"):
        caprecon.cttd_import(tsv, tmp_path / "o", format="xml")


# ----------------------------------------------------------------------------- reconstruct, embed, judge


def test_the_stages_match_the_commands_and_leave_score_nothing_to_compute(tmp_path, capsys):
    images, bank = _shapes_world(tmp_path)
    data = tmp_path / "captions.jsonl"
    data.write_text("".join(json.dumps({"id": i, "image": str(images / "scene.png"), "caption": c}) + "\n"
                            for i, c in (("a", "a red square"), ("b", SHAPES))))
    models = {"generator": "oracle:OracleGenerator", "embedder": "oracle:PixelEmbedder",
              "judge": "refine_fakes:DescribingVLM"}
    common = {"max_side": 96, "qa_bank": str(bank), **models}
    flags = [a for k, v in common.items() for a in (f"--{k.replace('_', '-')}", str(v))]
    results = {}
    for name, metrics in (("reconstruct", ["recon", "turing"]), ("embed", ["recon"]), ("judge", ["turing"])):
        assert main([name, "-i", str(data), *(a for m in metrics for a in ("-m", m)), *flags,
                     "--cache-dir", str(tmp_path / "cache-cli"), "-q"]) == 0, name
        printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        results[name] = caprecon.stage(name, data, metrics, cache_dir=str(tmp_path / "cache-py"), **common)
        assert printed == {**results[name].counts, "store": str(tmp_path / "cache-cli")}, name
        assert results[name].store == tmp_path / "cache-py" and results[name].problems == []
    # by hand: two captions, one reconstruction each, shared by recon and turing; embed and judge make none
    assert (results["reconstruct"].counts["rows"], results["reconstruct"].counts["generated"]) == (2, 2)
    assert results["embed"].counts.get("generated", 0) == results["judge"].counts["generated"] == 0
    assert results["judge"].counts["missing_reconstruction"] == 0
    # a score with the same settings finds every reconstruction, embedding and answer stored
    scored = caprecon.score(data, ["recon", "turing"], cache_dir=str(tmp_path / "cache-py"), **common)
    cache = scored.manifest["cache"]
    assert (cache["generated"], cache["embedded"]) == (0, 0) and cache["reused"] >= 2
    assert not {kind: n for kind, n in cache.items()  # no judge answer computed either
                if kind not in ("generated", "reused", "damaged", "embedded", "model_seconds") and n}
    unfilled = caprecon.score(data, ["recon", "turing"], cache_dir=str(tmp_path / "cold"), **common).manifest["cache"]
    assert unfilled["generated"] == 2 and any(n for kind, n in unfilled.items()  # what the stages spared it
                                              if kind not in ("generated", "reused", "damaged", "embedded", "model_seconds"))
    # judging before anything is reconstructed: the rows are named as missing, the command's exit 1
    fresh = caprecon.stage("judge", data, ["turing"], cache_dir=str(tmp_path / "empty"), **common)
    assert fresh.counts["missing_reconstruction"] == 2 and "no stored reconstruction: 2" in fresh.problems[0]
    with pytest.raises(ConfigError, match="stage 'score': choose from reconstruct, embed, judge"):
        caprecon.stage("score", data, ["recon"], **common)


# ----------------------------------------------------------------------------- merge


def test_merge_matches_the_command(tmp_path, capsys):
    from oracle import PixelEmbedder, render

    scenes = ["a red square", "a blue circle", "a green triangle", "a yellow square"]
    rows = []
    for k, drawn in enumerate(scenes):
        render(drawn, 96, 96).save(tmp_path / f"s{k}.png")
        rows += [{"id": f"{k}-{c}", "image": str(tmp_path / f"s{k}.png"), "caption": caption}
                 for c, caption in enumerate((drawn, scenes[(k + 1) % 4]))]
    data = tmp_path / "captions.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    settings = {"generator": "oracle:OracleGenerator", "embedder": "oracle:PixelEmbedder", "max_side": 96,
                "no_cache": True}
    shards = [tmp_path / f"shard{i}" for i in range(3)]
    for i, folder in enumerate(shards):
        caprecon.score(data, ["recon"], out=folder, shard=f"{i}/3", **settings)
    assert main(["merge", *map(str, shards), "--input", str(data), "--out", str(tmp_path / "cli")]) == 0
    printed = capsys.readouterr().out
    merged = caprecon.merge(list(reversed(shards)), tmp_path / "py", samples=data)  # the folders' order is free
    cli, py = tmp_path / "cli", tmp_path / "py"
    assert (cli / "scores.jsonl").read_text() == (py / "scores.jsonl").read_text()
    assert json.loads((cli / "summary.json").read_text()) == json.loads((py / "summary.json").read_text()) \
        == merged.summary
    assert _jsonl(py / "scores.jsonl") == merged.records and merged.out == py and merged.shards == shards
    # by hand: the rows in input order, each the oracle's recon of its caption against its picture
    assert [r["id"] for r in merged.records] == [r["id"] for r in rows]
    for row, record in zip(rows, merged.records):
        drawn = scenes[int(row["id"][0])]
        a, b = PixelEmbedder().embed([render(drawn, 96, 96), render(row["caption"], 96, 96)])
        assert record["recon"] == pytest.approx((1.0 + float(np.clip(a @ b, -1, 1))) / 2.0, abs=1e-6)
    mean = float(np.mean([r["recon"] for r in merged.records]))
    assert merged.summary["samples"] == 8 and merged.summary["metrics"]["recon"]["mean"] == pytest.approx(mean)
    assert "merged 3 shards: 8 rows, 0 with errors" in printed


# ----------------------------------------------------------------------------- reward-audit


def test_reward_audit_matches_the_command(tmp_path, capsys):
    from oracle import render

    rows = []
    for k, caption in enumerate(["red circle", "blue square green triangle", "yellow circle", "black square"]):
        render(caption).save(tmp_path / f"img{k}.png")
        rows.append({"id": str(k), "image": str(tmp_path / f"img{k}.png"), "caption": f"a {caption}"})
    data = tmp_path / "captions.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    models = {"generator": "oracle:OracleGenerator", "embedder": "oracle:PixelEmbedder"}
    def flags_of(options):
        return [a for k, v in options.items() for a in (f"--{k}", v)]

    assert main(["reward-audit", "-i", str(data), *flags_of(models),
                 "--max-side", "96", "--cache-dir", str(tmp_path / "cache-cli"), "--length-target", "4",
                 "--repetition-n", "2", "--weight", "recon=2", "--json", str(tmp_path / "cli.json"), "-q"]) == 0
    printed = capsys.readouterr().out
    found = caprecon.reward_audit(data, ["recon"], {"recon": 2.0}, max_side=96, cache_dir=str(tmp_path / "cache-py"),
                                  guards=caprecon.Guards(length_target=4, repetition_n=2), **models)
    assert json.loads((tmp_path / "cli.json").read_text()) == found.figures()
    assert isinstance(found, caprecon.Audit) and found.captions == 4 and found.reward["scored"] == 4
    assert found.parts == ["recon", "length", "repetition"] and "4 of 4 caption(s) scored" in printed

    # by hand: padding adds no shape, so recon stays and the guarded rise is the guards' change alone
    def guards(caption: str) -> float:
        said = re.findall(r"\w+", caption.lower())
        grams = list(zip(said, said[1:]))
        repeated = sum(g in grams[:i] for i, g in enumerate(grams))
        return -0.5 * max(0.0, len(said) / 4 - 1) - (repeated / len(grams) if grams else 0.0)

    padding = " The image shows many details, colors, textures and objects arranged in the scene."
    captions = [r["caption"] for r in rows]
    assert found.metrics["rise_padded"] == pytest.approx(0.0, abs=1e-9)
    assert found.reward["rise_padded"] == pytest.approx(np.mean([guards(c + padding) - guards(c) for c in captions]))
    assert found.reward["rise_repeated"] - found.metrics["rise_repeated"] == \
        pytest.approx(np.mean([guards(f"{c} {c}") - guards(c) for c in captions]))
    # an input of no rows: nothing to audit, the same ConfigError as the command's one line (exit 2), before
    # any model loads (this generator does not exist)
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(ConfigError, match="nothing to audit: the input holds no rows"):
        caprecon.reward_audit(tmp_path / "empty.jsonl", ["recon"], generator="no_such_module:Generator")
    assert main(["reward-audit", "-i", str(tmp_path / "empty.jsonl"), *flags_of(models)]) == 2


# ----------------------------------------------------------------------------- cache, store merge


def test_cache_commands_match_the_functions(tmp_path, capsys):
    import shutil

    from oracle import render

    for k, drawn in enumerate(["a red square", "a blue circle"]):
        render(drawn, 96, 96).save(tmp_path / f"s{k}.png")
    rows = [{"id": f"r{k}", "image": str(tmp_path / f"s{k}.png"), "caption": c}
            for k, c in enumerate(["a red square", "a green triangle"])]
    cache = tmp_path / "cache"
    caprecon.score(rows, ["recon"], generator="oracle:OracleGenerator", embedder="oracle:PixelEmbedder",
                   max_side=96, cache_dir=str(cache))
    shutil.copytree(cache, tmp_path / "copy")
    # `store merge`: the copies of every verified entry, counted alike by the command and the function
    assert main(["store", "merge", str(cache), "--into", str(tmp_path / "merged-cli")]) == 0
    merged = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert merged == caprecon.merge_stores([cache], tmp_path / "merged-py")
    assert caprecon.cache_info(tmp_path / "merged-py")["kinds"] == caprecon.cache_info(cache)["kinds"]

    def command(*argv) -> dict:
        capsys.readouterr()
        assert main(["cache", *argv, "--json"]) == 0
        return json.loads(capsys.readouterr().out)

    info = caprecon.cache_info(cache)
    assert command("info", "--cache-dir", str(cache)) == info
    # by hand: two reconstructions, and embeddings of two sources and two reconstructions
    kinds = {row["kind"]: row["entries"] for row in info["kinds"]}
    assert kinds["reconstruction"] == 2 and sum(kinds.values()) == sum(row["entries"] for row in info["models"])
    assert merged == {"copied": sum(kinds.values()), "present": 0, "damaged": 0}
    assert command("verify", "--cache-dir", str(cache)) == caprecon.cache_verify(cache)
    assert caprecon.cache_verify(cache)["entries"] == sum(kinds.values())
    dry = caprecon.cache_prune(cache, max_size=0, dry_run=True)
    assert command("prune", "--cache-dir", str(cache), "--max-size", "0", "--dry-run") == dry
    assert dry["removed"] == dry["entries"] == sum(kinds.values()) and dry["bytes_after"] == 0
    assert command("prune", "--cache-dir", str(tmp_path / "copy"), "--max-size", "0") == \
        {**caprecon.cache_prune(cache, max_size=0), "root": str(tmp_path / "copy")}
    assert caprecon.cache_info(cache)["kinds"] == caprecon.cache_info(tmp_path / "copy")["kinds"] == []
    # what the command's options refuse, the functions refuse
    for bad, message in (({"max_size": float("inf")}, "--max-size must be"), ({"older_than": -1}, "--older-than")):
        with pytest.raises(ConfigError, match=message):
            caprecon.cache_prune(cache, **bad)
    with pytest.raises(ConfigError, match="--cache-dir: not found"):
        caprecon.cache_info(tmp_path / "nowhere")
