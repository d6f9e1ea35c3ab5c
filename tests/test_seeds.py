"""Scores over K seeds: the textbook interval, seed 0 as today's seed, one generator call per
batch, and the cache making K=8 after K=4 generate only the four new seeds."""

import hashlib
import json
import math

import numpy as np
import pytest
from logged_models import LoggedGenerator
from oracle import OracleGenerator, PixelEmbedder, render
from PIL import Image

import caprecon
from caprecon.core.errors import ConfigError
from caprecon.data.images import open_image
from caprecon.metrics.seeds import seed_interval
from caprecon.models.generator import DiffusersGenerator, Generated

# Student t quantiles t(0.975, df) from a printed table
T975 = {1: 12.706, 3: 3.182, 7: 2.365}


class ShiftingOracle(OracleGenerator):
    """The oracle's drawing moved sideways by a seed-dependent amount: the seed matters."""

    span, axis = 11, 1  # shifts of -span // 2 .. span // 2 pixels along this axis

    @property
    def fingerprint(self) -> str:
        return "shifting-oracle-v1"

    def generate(self, requests):
        return [Generated(Image.fromarray(np.roll(np.asarray(render(r.prompt, r.width, r.height)),
                                                  r.seed % self.span - self.span // 2, axis=self.axis)))
                for r in requests]


def _samples(folder, n=3):
    rows = []
    for i, caption in enumerate(["a red circle and a blue square", "a green triangle", "a yellow square"][:n]):
        render(caption, 48, 48).save(folder / f"img{i}.png")
        rows.append({"id": f"s{i}", "image": f"img{i}.png", "caption": caption})
    path = folder / "samples.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    return path


def _hand_interval(values, t):
    n = len(values)
    mean = sum(values) / n
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    return mean, sd, (mean - t * sd / math.sqrt(n), mean + t * sd / math.sqrt(n))


def test_the_interval_is_the_textbook_student_t_one():
    mean, sd, ci = seed_interval([0.5, 0.6, 0.7, 0.4])
    # mean 0.55; squared deviations .0025 .0025 .0225 .0225 sum to .05, over n-1 = 3
    assert mean == pytest.approx(0.55)
    assert sd == pytest.approx(math.sqrt(0.05 / 3))
    half = 3.182 * math.sqrt(0.05 / 3) / 2
    assert ci == pytest.approx([0.55 - half, 0.55 + half], abs=1e-3)
    mean, sd, ci = seed_interval([1.0, 0.0])  # sd = 1/sqrt(2); half = 12.706 * sd / sqrt(2) = 6.353
    assert ci == pytest.approx([0.5 - 6.353, 0.5 + 6.353], abs=1e-3)
    assert seed_interval([0.3]) == (0.3, None, None)


def test_rows_report_the_mean_over_seeds_with_sd_and_interval(tmp_path):
    samples = _samples(tmp_path)
    common = {"generator": ShiftingOracle(), "embedder": PixelEmbedder(), "max_side": 48, "batch_size": 2,
                  "cache_dir": str(tmp_path / "cache")}
    one = caprecon.score(samples, ["recon"], **common)
    four = caprecon.score(samples, ["recon"], seeds=4, out=tmp_path / "four", **common)
    for single, row in zip(one.records, four.records):
        values = row["recon_seeds"]
        assert len(values) == 4 and len(set(row["seeds"])) == 4 and len(set(row["reconstructions"])) == 4
        # seed 0 is today's seed (per-sample: sha256 of "0|image_id|candidate"), so its score is a one-seed run's
        today = int.from_bytes(hashlib.sha256(f"0|{row['image_id']}|0".encode()).digest()[:8], "big") >> 1
        assert row["seeds"][0] == single["seed"] == today
        assert values[0] == pytest.approx(single["recon"])
        mean, sd, (low, high) = _hand_interval(values, T975[3])
        assert row["recon"] == pytest.approx(mean)
        assert row["recon_sd"] == pytest.approx(sd)
        assert row["recon_ci"] == pytest.approx([low, high], abs=1e-3 * max(sd, 1e-9) + 1e-12)
    assert len(set(four.records[0]["recon_seeds"])) > 1  # the seeds do differ
    # the summary's headline is the mean of the per-caption means
    assert four.summary["metrics"]["recon"]["mean"] == pytest.approx(np.mean([r["recon"] for r in four.records]))
    manifest = json.loads((tmp_path / "four" / "manifest.json").read_text())
    assert manifest["reconstruction"]["seeds"] == 4 and manifest["metrics"][0]["seeds"] == 4


def test_k8_after_k4_generates_only_the_four_new_seeds_in_one_call_per_batch(tmp_path, tiny_sd):
    samples = _samples(tmp_path, n=2)
    generator = LoggedGenerator(inner=DiffusersGenerator(tiny_sd, steps=1, batch_size=4))
    common = {"generator": generator, "embedder": PixelEmbedder(), "max_side": 32, "batch_size": 2,
                  "cache_dir": str(tmp_path / "cache")}
    caprecon.score(samples, ["recon"], seeds=4, **common)
    assert generator.calls == 1 and len(generator.produced) == 8  # two captions x four seeds, one call
    first_four = {image: set(seeds) for image, seeds in generator.seeds.items()}
    generator.produced.clear()
    generator.seeds.clear()
    eight = caprecon.score(samples, ["recon"], seeds=8, **common)
    assert generator.calls == 2 and len(generator.produced) == 8  # four new per caption
    for image, seeds in generator.seeds.items():
        assert len(seeds) == 4 and not seeds & first_four[image]
    assert all(len(r["recon_seeds"]) == 8 for r in eight.records)
    assert eight.manifest["cache"]["generated"] == 8


def test_seeds_must_be_a_whole_number_from_one(tmp_path):
    with pytest.raises(ConfigError, match="--seeds"):
        caprecon.score(_samples(tmp_path, n=1), ["recon"], generator=OracleGenerator(), embedder=PixelEmbedder(),
                       seeds=0)


# ----------------------------------------------------------------------------- compare, stability


def test_the_seed_level_of_the_bootstrap_by_hand():
    from caprecon.stats.bootstrap import paired_bootstrap_seeds

    # one image; A's seeds score 1 and 0, B's 0 and 0: a resample's A is the mean of two seeds drawn from {1, 0}:
    # 0 with probability 1/4, 0.5 with 1/2, 1 with 1/4; the observed difference is 0.5
    result = paired_bootstrap_seeds(np.array([[1.0, 0.0]]), np.array([[0.0, 0.0]]), n_resamples=20000)
    assert result.difference == 0.5
    assert result.flip == pytest.approx(0.25, abs=0.01)
    assert (result.ci_low, result.ci_high) == (0.0, 1.0)


def test_the_seed_bootstrap_draws_in_runs_what_it_would_draw_at_once(monkeypatch):
    """Resamples are drawn a run at a time, so memory stays bounded; the numbers are those of the
    protocol drawn whole: the image draws, then every resample's seeds, the same for A and B."""
    from caprecon.stats import bootstrap
    from caprecon.stats.bootstrap import draws, paired_bootstrap_seeds

    rng = np.random.default_rng(5)
    a, b = rng.random((9, 4)), rng.random((9, 4)) + 0.05
    monkeypatch.setattr(bootstrap, "SEED_DRAW_CELLS", 50)  # runs of one resample, where one would hold 400
    result = paired_bootstrap_seeds(a, b, n_resamples=400, seed=7)
    picked, seeds = draws(9, 400, 7), np.random.default_rng([7, 1]).integers(0, 4, (400, 9, 4))
    whole_a = a[picked[:, :, None], seeds].mean(axis=(1, 2))
    whole_b = b[picked[:, :, None], seeds].mean(axis=(1, 2))
    low, high = np.quantile(whole_a - whole_b, [0.025, 0.975])
    assert (result.ci_low, result.ci_high) == pytest.approx((low, high), abs=1e-12)
    assert a.mean() < b.mean() and result.flip == pytest.approx(np.mean(whole_a - whole_b >= 0))
    with pytest.raises(ValueError, match="one shape"):
        paired_bootstrap_seeds(a, b[:, :3])


def test_one_seed_per_image_is_the_image_bootstrap():
    from caprecon.stats.bootstrap import paired_bootstrap, paired_bootstrap_seeds

    rng = np.random.default_rng(3)
    a, b = rng.random(25), rng.random(25)

    seeded = paired_bootstrap_seeds(a[:, None], b[:, None], n_resamples=500, seed=4)
    # groups named so that their sorted order is the rows' order, as the images of `compare` are
    plain = paired_bootstrap(lambda i: a[i].mean(), lambda i: b[i].mean(), [f"{i:02d}" for i in range(25)],
                             n_resamples=500, seed=4)
    assert (seeded.ci_low, seeded.ci_high, seeded.p_value) == pytest.approx((plain.ci_low, plain.ci_high,
                                                                              plain.p_value))


def _rows(values, captioner=None, metric="recon"):
    rows = []
    for i, seeds in enumerate(values):
        row = {"id": f"{captioner}-{i}", "image_id": f"img{i}", metric: float(np.mean(seeds)),
               f"{metric}_seeds": [float(v) for v in seeds]}
        if captioner:
            row["captioner"] = captioner
        rows.append(row)
    return rows


def test_a_difference_one_seed_makes_is_not_significant_over_eight(tmp_path):
    from caprecon.cli import main
    from caprecon.stats.seeds import compare

    rng = np.random.default_rng(0)
    base = rng.random((30, 1))
    lucky = 0.1 * np.array([1, -1, 1, -1, 1, -1, 1, -1])  # A's seed 0 happens to suit it; over seeds it evens out
    a = base + lucky + rng.normal(0, 0.01, (30, 8))
    b = base + rng.normal(0, 0.01, (30, 8))
    one = compare(_rows(a[:, :1]), _rows(b[:, :1]), "recon")
    assert one.ci_low > 0 and one.p_value < 0.05 and one.flip < 0.025
    eight = compare(_rows(a), _rows(b), "recon")
    assert eight.ci_low < 0 < eight.ci_high and eight.p_value > 0.05 and eight.flip > 0.1
    assert (eight.seeds, eight.images) == (8, 30)

    for name, values in (("A", a), ("B", b)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "scores.jsonl").write_text("\n".join(json.dumps(r) for r in _rows(values)))
    assert main(["compare", str(tmp_path / "A"), str(tmp_path / "B"), "--out", str(tmp_path / "cmp.jsonl")]) == 0
    written = json.loads((tmp_path / "cmp.jsonl").read_text())
    assert written["difference"] == pytest.approx(eight.difference) and written["flip"] == pytest.approx(eight.flip)
    # the same two systems as captioners of one run
    (tmp_path / "both").mkdir()
    (tmp_path / "both" / "scores.jsonl").write_text(
        "\n".join(json.dumps(r) for r in _rows(a, "A") + _rows(b, "B")))
    assert main(["compare", str(tmp_path / "both"), "--out", str(tmp_path / "within.jsonl")]) == 0
    within = json.loads((tmp_path / "within.jsonl").read_text())
    assert (within["a"], within["b"]) == ("A", "B") and within["flip"] == pytest.approx(eight.flip)


def _unpaired_interval(a, b, n_resamples, seed):
    """The bootstrap over images and seeds with each system's seeds drawn on their own (what
    compare did before it paired the draws), written out here as the yardstick."""
    picked = np.random.default_rng(seed).integers(0, len(a), (n_resamples, len(a)))
    rng = np.random.default_rng([seed, 2])
    means = [x[picked[:, :, None], rng.integers(0, x.shape[1], (n_resamples, *x.shape))].mean(axis=(1, 2))
             for x in (a, b)]
    return np.quantile(means[0] - means[1], [0.025, 0.975])


def test_paired_draws_cancel_the_noise_both_systems_share():
    """A and B rebuilt from the same seeds share each (image, seed)'s noise, which is large; drawn
    together, that noise cancels: the interval is much narrower than unpaired draws give, and it
    still covers the true difference."""
    from caprecon.stats.seeds import compare

    true = 0.02
    rng = np.random.default_rng(11)
    # deterministic: every draw of A is B's plus the true difference, so every paired resample is exactly it
    b = rng.normal(0.5, 0.1, (30, 1)) + rng.normal(0, 0.1, (30, 8))
    exact = compare(_rows(b + true), _rows(b), "recon", n_resamples=500)
    assert (exact.ci_low, exact.ci_high) == pytest.approx((true, true), abs=1e-9) and exact.flip == 0.0
    low, high = _unpaired_interval(b + true, b, 500, 0)
    assert high - low > true  # drawn unpaired, the shared noise makes it wider than the difference itself
    # with noise of their own as well (sd 0.01 each, against 0.1 shared), over many runs
    covered, trials = 0, 200
    for trial in range(trials):
        image = rng.normal(0.5, 0.1, (30, 1))
        shared = rng.normal(0, 0.1, (30, 8))
        a = image + shared + true + rng.normal(0, 0.01, (30, 8))
        b = image + shared + rng.normal(0, 0.01, (30, 8))
        paired = compare(_rows(a), _rows(b), "recon", n_resamples=200, seed=trial)
        low, high = _unpaired_interval(a, b, 200, trial)
        assert paired.ci_high - paired.ci_low < (high - low) / 4
        covered += paired.ci_low <= true <= paired.ci_high
    assert covered >= 0.9 * trials


def test_what_cannot_be_paired_is_left_out_and_said(tmp_path, capsys):
    from caprecon.cli import main
    from caprecon.stats.seeds import compare

    def row(system, image, values, seeds, questions=4):
        return {"id": f"{system}-{image}", "image_id": image, "captioner": system, "turing": float(np.mean(values)),
                "turing_seeds": values, "seeds": seeds, "turing_n": questions}

    a = [row("A", "img0", [0.5, 0.7, 0.9], [1, 2, 3]), row("A", "img1", [0.4, 0.6, 0.2], [4, 5, 6]),
         row("A", "img2", [0.5, 0.5, 0.5], [7, 8, 9]), row("A", "img3", [0.1, 0.1, 0.1], [10, 11, 12], questions=6)]
    b = [row("B", "img0", [0.2, 0.3], [1, 2]), row("B", "img1", [0.1, 0.3], [40, 50]),
         row("B", "img3", [0.9, 0.9], [10, 11], questions=5), row("B", "img4", [0.3, 0.3], [13, 14])]
    c = compare(a, b, "turing", names=("A", "B"))
    # img0 and img1 are paired on their first two seeds; img2 only A scored, img4 only B; img3 was asked
    # about with 6 questions for A and 5 for B
    assert (c.images, c.seeds, c.seeds_a, c.seeds_b) == (2, 2, 3, 2)
    assert (c.only_a, c.only_b, c.other_questions, c.shared_noise) == (1, 1, 1, 1)  # img1's seeds differ
    assert c.mean_a == pytest.approx((0.5 + 0.7 + 0.4 + 0.6) / 4)
    assert c.difference == pytest.approx((0.5 + 0.7 + 0.4 + 0.6 - 0.2 - 0.3 - 0.1 - 0.3) / 4)
    run = tmp_path / "both"
    run.mkdir()
    (run / "scores.jsonl").write_text("\n".join(json.dumps(r) for r in a + b))
    assert main(["compare", str(run), "-m", "turing", "--resamples", "50"]) == 0
    out = capsys.readouterr().out
    assert "left out 1 image(s) only A scored and 1 only B scored" in out
    assert "left out 1 image(s) they were asked different numbers of questions about (turing_n)" in out
    assert "A has 3 seed(s) per image, B 2: the first 2 of each are paired" in out
    assert "on 1 of 2 images their rows were rebuilt from other seeds" in out
    # rows naming no seeds cannot say whether their noise is shared
    assert compare([{k: v for k, v in r.items() if k != "seeds"} for r in a], b, "turing").shared_noise is None
    with pytest.raises(ConfigError, match="asked the same questions"):
        compare(a[3:], b[2:3], "turing")


def test_stability_curve_on_constructed_rankings(tmp_path):
    from caprecon.cli import main
    from caprecon.stats.seeds import seeds_needed, stability

    # final means A .1 < B .2 < C .3 < D .4; at one seed B (.05) falls below A: one discordant pair of six,
    # tau = (5 - 1) / 6; from two seeds on (B at .2) the ranking is the final one
    values = [[0.1] * 4, [0.05, 0.35, 0.2, 0.2], [0.3] * 4, [0.4] * 4]
    curve = stability(_rows(values), "recon", n_resamples=200)
    assert [p.k for p in curve] == [1, 2, 3, 4]
    assert [p.tau for p in curve] == pytest.approx([4 / 6, 1, 1, 1])
    assert (curve[-1].ci_low, curve[-1].ci_high) == (1.0, 1.0)
    assert curve[0].ci_low <= 4 / 6 <= curve[0].ci_high
    assert seeds_needed(curve, 0.9) == 2 and seeds_needed(curve, 0.5) == 1

    run = tmp_path / "run"
    run.mkdir()
    (run / "scores.jsonl").write_text("\n".join(json.dumps(r) for r in _rows(values)))
    assert main(["seeds", str(run), "--resamples", "50"]) == 0
    lines = (run / "seeds.csv").read_text().splitlines()
    assert lines[0] == "metric,k,tau,ci_low,ci_high,units,threshold,seeds_needed"
    assert len(lines) == 5 and all(line.endswith(",0.9,2") for line in lines[1:])


def test_a_one_seed_run_has_no_stability_to_show(tmp_path):
    from caprecon.stats.seeds import stability

    with pytest.raises(ConfigError, match="--seeds"):
        stability([{"id": "a", "recon": 0.5}, {"id": "b", "recon": 0.4}], "recon")


# ----------------------------------------------------------------------------- several generators


class WideShiftingOracle(ShiftingOracle):
    span, axis = 17, 0

    @property
    def fingerprint(self) -> str:
        return "wide-shifting-oracle-v1"


def test_the_variance_split_of_a_two_generator_table_by_hand():
    from caprecon.metrics.seeds import variance_split

    # generator means .7 and .3 (grand .5); within: each generator's two seeds differ by .2, variance .02;
    # between: K * ((.2)^2 + (.2)^2) / (G - 1) = 2 * .08 = .16; generator part (.16 - .02) / 2 = .07
    assert variance_split([[0.6, 0.8], [0.2, 0.4]]) == pytest.approx((0.07, 0.02))
    # generators that agree in the mean: all of the spread is the seed's (the estimate is floored at 0)
    assert variance_split([[0.4, 0.6], [0.6, 0.4]]) == pytest.approx((0.0, 0.02))
    assert variance_split([[0.5], [0.4]]) == (None, None)


def test_two_generators_as_one_ensemble(tmp_path):
    samples = _samples(tmp_path, n=2)
    common = {"embedder": PixelEmbedder(), "max_side": 48, "batch_size": 2, "cache_dir": str(tmp_path / "cache")}
    narrow, wide = ShiftingOracle(), WideShiftingOracle()
    alone = {label: caprecon.score(samples, ["recon"], generator=g, seeds=2, **common)
             for label, g in (("ShiftingOracle-0", narrow), ("WideShiftingOracle-1", wide))}
    both = caprecon.score(samples, ["recon"], generator=[narrow, wide], seeds=2, **common)
    for i, row in enumerate(both.records):
        tables = row["recon_by_generator"]
        assert list(tables) == ["ShiftingOracle-0", "WideShiftingOracle-1"]
        for label, run in alone.items():  # each generator's seeds are its own run's
            assert tables[label] == pytest.approx(run.records[i]["recon_seeds"])
        (a1, a2), (b1, b2) = tables.values()
        ma, mb = (a1 + a2) / 2, (b1 + b2) / 2
        assert row["recon"] == pytest.approx((ma + mb) / 2)
        assert row["recon_seeds"] == pytest.approx([(a1 + b1) / 2, (a2 + b2) / 2])
        within = ((a1 - ma) ** 2 + (a2 - ma) ** 2 + (b1 - mb) ** 2 + (b2 - mb) ** 2) / 2
        between = 2 * ((ma - row["recon"]) ** 2 + (mb - row["recon"]) ** 2)
        assert row["recon_var_seed"] == pytest.approx(within)
        assert row["recon_var_generator"] == pytest.approx(max(0.0, (between - within) / 2))
        assert len(row["reconstructions"]) == 4
    assert len(both.manifest["models"]["generators"]) == 2


def test_generator_given_twice_on_the_command_line_is_an_ensemble():
    from caprecon.cli.commands import build_parser
    from caprecon.cli.common import run_settings
    from caprecon.run.config import RunConfig

    def config(*argv):
        return RunConfig.build(**{k: v for k, v in run_settings(build_parser().parse_args(
            ["score", "-i", "x.jsonl", *argv])).items() if k != "allow_plugins"})

    assert config("-g", "sd-a", "-g", "sd-b", "--seeds", "4").generator == ["sd-a", "sd-b"]
    assert config("-g", "sd-a").generator == "sd-a"
    assert config("-g", "sd-a", "-g", "sd-b").to_dict()["generator"] == ["sd-a", "sd-b"]


# ----------------------------------------------------------------------------- the human ceiling


def test_the_human_ceiling_beside_each_score(tmp_path):
    render("a red circle and a blue square", 48, 48).save(tmp_path / "img0.png")
    render("a yellow square", 48, 48).save(tmp_path / "img1.png")
    refs = ["a red circle and a blue square", "a red circle"]
    rows = [{"id": "s0", "image": "img0.png", "caption": "a red circle and a green square", "refs": refs},
            {"id": "s1", "image": "img1.png", "caption": "a yellow square"}]
    (tmp_path / "samples.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    common = {"generator": ShiftingOracle(), "embedder": PixelEmbedder(), "max_side": 48, "seeds": 2,
                  "cache_dir": str(tmp_path / "cache")}
    run = caprecon.score(tmp_path / "samples.jsonl", ["recon"], ceiling=True, **common)
    # each reference scored on its own as the caption of the same row (same id, image and candidate: same seeds)
    alone = []
    for i, ref in enumerate(refs):
        path = tmp_path / f"ref{i}.jsonl"
        path.write_text(json.dumps({**rows[0], "caption": ref, "refs": []}))
        alone.append(caprecon.score(path, ["recon"], **common).records[0])
    assert [r["seeds"] for r in alone] == [run.records[0]["seeds"]] * 2
    values = [r["recon"] for r in alone]
    row = run.records[0]
    assert row["recon_refs"] == pytest.approx(values)
    assert row["recon_refs_mean"] == pytest.approx((values[0] + values[1]) / 2)
    assert row["recon_refs_best"] == pytest.approx(max(values))
    assert row["recon_ratio"] == pytest.approx(row["recon"] / ((values[0] + values[1]) / 2))
    assert row["recon_refs_best"] > row["recon"]  # the exact reference rebuilds the scene better than the caption
    assert "recon_refs" not in run.records[1]  # no references: no ceiling


# ----------------------------------------------------------------------------- the report


def test_the_report_shows_the_seeds(tmp_path):
    rows = []
    for i, (good, bad) in enumerate([("a red circle and a blue square", "a blue circle"),
                                     ("a green triangle", "a purple square"), ("a yellow square", "a red circle")]):
        render(good, 48, 48).save(tmp_path / f"img{i}.png")
        rows += [{"id": f"good{i}", "image": f"img{i}.png", "caption": good, "captioner": "good"},
                 {"id": f"bad{i}", "image": f"img{i}.png", "caption": bad, "captioner": "bad"}]
    (tmp_path / "samples.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    run = caprecon.score(tmp_path / "samples.jsonl", ["recon"], generator=ShiftingOracle(), embedder=PixelEmbedder(),
                         max_side=48, seeds=3, cache_dir=str(tmp_path / "cache"), out=tmp_path / "run")
    html = (tmp_path / "run" / "report.html").read_text()
    assert '<section id="seeds">' in html and "Systems compared (captioner)" in html
    gallery = json.loads(html.split('<script type="application/json" id="gallery-data">')[1].split("</script>")[0])
    first = gallery["items"][0]
    assert len(first["r"]) == 3  # the three seeds' reconstructions side by side
    assert first["ci"][0] == pytest.approx(run.records[0]["recon_ci"], abs=1e-6)


class HalfSeedOracle(OracleGenerator):
    """The oracle, drawing only the first shape the caption names when the seed is odd."""

    @property
    def fingerprint(self) -> str:
        return "half-seed-oracle-v1"

    def generate(self, requests):
        return [Generated(render(r.prompt if r.seed % 2 == 0 else r.prompt.split(" and ")[0], r.width, r.height))
                for r in requests]


def test_vqascore_on_both_images_summarises_both_and_the_reconstructions_seeds(tmp_path):
    """With --vqa-on both, the reconstruction's VQAScore is summarised beside the source's, and
    over seeds it gets each seed's value, their mean, sd and interval."""

    class InkJudge:  # P(yes): where the ink lies across the picture (0 left, 1 right), which a shift moves
        fingerprint = "ink-judge-v1"

        def option_probs(self, requests, options):
            return [[_ink_position(r.image) if o == "Yes" else 0.0 for o in opts] for r, opts in zip(requests, options)]

    run = caprecon.score(_samples(tmp_path, n=2), ["vqascore"], judge=InkJudge(), generator=ShiftingOracle(),
                         vqa_on="both", max_side=48, seeds=4, cache_dir=str(tmp_path / "cache"))
    for row in run.records:
        expected = [_ink_position(Image.open(p)) for p in row["reconstructions"]]
        assert row["vqascore_recon_seeds"] == pytest.approx(expected) and len(set(expected)) > 1
        mean, sd, ci = _hand_interval(expected, T975[3])
        assert (row["vqascore_recon"], row["vqascore_recon_sd"]) == pytest.approx((mean, sd))
        assert row["vqascore_recon_ci"] == pytest.approx(list(ci), abs=1e-4)  # the table's t has 4 digits
        assert row["vqascore"] == pytest.approx(_ink_position(Image.open(tmp_path / f"img{row['id'][1:]}.png")))
    summary = run.summary["metrics"]
    assert summary["vqascore_recon"]["mean"] == pytest.approx(np.mean([r["vqascore_recon"] for r in run.records]))
    assert summary["vqascore"]["mean"] == pytest.approx(np.mean([r["vqascore"] for r in run.records]))


def _ink_position(image):
    columns = np.nonzero(np.asarray(image.convert("L")) < 250)[1]
    return float(columns.mean() / image.width) if len(columns) else 0.5


def test_turing_over_seeds(tmp_path):
    from cttd_fakes import ScriptedVLM

    render("a red circle and a blue square", 96, 96).save(tmp_path / "img0.png")
    (tmp_path / "samples.jsonl").write_text(json.dumps(
        {"id": "s0", "image": "img0.png", "caption": "a red circle and a blue square"}))
    bank = tmp_path / "bank.jsonl"
    bank.write_text("\n".join(json.dumps({"image_id": "img0", "question": f"Is there a {c} shape?",
                                          "category": "colour", "type": "yesno", "answer": "yes"})
                              for c in ("red", "blue")))
    run = caprecon.score(tmp_path / "samples.jsonl", ["turing"], generator=HalfSeedOracle(), judge=ScriptedVLM(),
                         qa_bank=str(bank), max_side=96, seeds=4, cache_dir=str(tmp_path / "cache"))
    row = run.records[0]
    # an even seed rebuilds both shapes (both questions right), an odd one only the red circle (one of two)
    expected = [1.0 if seed % 2 == 0 else 0.5 for seed in row["seeds"]]
    assert row["turing_seeds"] == expected and len(set(expected)) == 2  # this image's four seeds have both parities
    assert row["turing"] == pytest.approx(sum(expected) / 4)
    assert row["turing_upper"] == 1.0 and row["turing_n"] == 2  # the source and the count do not depend on the seed
    assert row["turing_gap"] == pytest.approx(1.0 - row["turing"])


def test_the_reconstruct_stage_makes_every_seed_of_every_generator(tmp_path):
    from caprecon.data.loaders import load_samples
    from caprecon.metrics import Context, ReconScore
    from caprecon.metrics.seeds import GeneratorEnsemble, HumanCeiling, SeedAveraged
    from caprecon.run.ray import reconstruction_plan
    from caprecon.run.stages import reconstruct_all
    from caprecon.store.index import Store

    narrow, wide = ShiftingOracle(), WideShiftingOracle()
    members = [SeedAveraged(ReconScore(g, PixelEmbedder(), max_side=48), 3) for g in (narrow, wide)]
    metric = HumanCeiling(GeneratorEnsemble(members, ["narrow", "wide"]))
    assert [(g, k) for g, _, k in reconstruction_plan([metric])] == [(narrow, 3), (wide, 3)]
    samples = load_samples(_samples(tmp_path, n=2))
    ctx = Context(Store.temporary())
    counts = reconstruct_all(samples, [metric], ctx, batch_size=2, progress=False)
    assert counts["generated"] == 2 * 3 * 2  # captions x seeds x generators
    scoring = Context(ctx.store)  # a later scoring run on the same store generates nothing
    rows = metric.score([open_image(s) for s in samples], scoring)
    assert scoring.stats()["generated"] == 0 and all(len(r["recon_seeds"]) == 3 for r in rows)


def test_caprecon_reconstruct_makes_every_seed(tmp_path, tiny_sd, tiny_dinov2):
    from caprecon.cli import main

    samples = _samples(tmp_path, n=2)
    args = ["--input", str(samples), "-g", str(tiny_sd), "--generator-opt", "steps=1", "-e", str(tiny_dinov2),
            "--max-side", "32", "--cache-dir", str(tmp_path / "cache"), "-q"]
    assert main(["reconstruct", *args, "--seeds", "3"]) == 0
    generator = LoggedGenerator(inner=DiffusersGenerator(tiny_sd, steps=1))
    run = caprecon.score(samples, ["recon"], generator=generator, embedder=PixelEmbedder(), max_side=32, seeds=3,
                         cache_dir=str(tmp_path / "cache"))
    assert generator.produced == [] and all(len(r["recon_seeds"]) == 3 for r in run.records)
