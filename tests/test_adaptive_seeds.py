"""Adaptive seeds (`--seeds MIN..MAX --target-width W`): further reconstructions only for captions
whose interval is still wide, each through the store. Generator calls are counted on a
stand-in whose per-caption noise is known (`noisy_standin`)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from noisy_standin import NoisyGenerator, NoisyScore

import caprecon
from caprecon.cli import main as cli_main
from caprecon.core.errors import ConfigError
from caprecon.metrics.adaptive import seeds_for_width, two_stage_interval
from caprecon.metrics.variance_priors import MixturePrior, VariancePrior, fit_mixture, fit_prior, trigamma_inverse
from scipy.special import polygamma

QUIET, NOISY = 0.001, 0.05  # seed sd of half the captions each


def _truth(n=8):
    return {f"caption {i}": (0.5 + 0.02 * i, NOISY if i % 2 else QUIET) for i in range(n)}


def _rows(truth):
    return [{"id": f"c{i}", "caption": caption} for i, caption in enumerate(truth)]


def _score(generator, truth, tmp_path, **settings):
    return caprecon.score(_rows(truth), [NoisyScore(generator)], cache_dir=str(tmp_path / "cache"), **settings)


def test_quiet_captions_stop_at_the_minimum_and_noisy_ones_draw_to_the_cap(tmp_path):
    truth = _truth()
    generator = NoisyGenerator(truth)
    rows = _score(generator, truth, tmp_path, seeds="3..16", target_width=0.01).records
    drawn = [r["seeds_drawn"] for r in rows]
    # a quiet caption's 3-seed interval is about 2 * 4.3 * 0.001 / sqrt(3) = 0.005 wide; a noisy one
    # needs (2 * 2.1 * 0.05 / 0.01)^2 ~ 440 seeds for 0.01, so stops at the cap
    assert drawn == [3, 16] * 4
    assert generator.calls == sum(drawn) == 4 * 3 + 4 * 16  # fixed K = 16 would be 128
    for row, k in zip(rows, drawn):
        assert len(row["noisy_seeds"]) == len(row["seeds"]) == len(row["reconstructions"]) == k
        assert row["noisy"] == pytest.approx(math.fsum(row["noisy_seeds"]) / k)
    for row in rows[::2]:
        assert row["noisy_ci"][1] - row["noisy_ci"][0] <= 0.01


def test_a_tighter_target_later_generates_only_the_seeds_it_adds(tmp_path):
    truth = _truth()
    generator = NoisyGenerator(truth)
    first = _score(generator, truth, tmp_path, seeds="3..16", target_width=0.01).records
    before = generator.calls
    second = _score(generator, truth, tmp_path, seeds="3..24", target_width=0.002).records
    added = sum(b["seeds_drawn"] - a["seeds_drawn"] for a, b in zip(first, second))
    assert added > 0 and generator.calls - before == added
    for a, b in zip(first, second):  # the seeds drawn before are the first of the later run's
        assert b["noisy_seeds"][: a["seeds_drawn"]] == a["noisy_seeds"]
    before = generator.calls
    fixed = _score(generator, truth, tmp_path, seeds=8).records  # a fixed K reuses the adaptive draws
    assert generator.calls - before == sum(max(0, 8 - b["seeds_drawn"]) for b in second)
    for f, b in zip(fixed, second):
        shared = min(8, b["seeds_drawn"])
        assert f["noisy_seeds"][:shared] == b["noisy_seeds"][:shared]


def test_the_seeds_are_those_of_a_fixed_k(tmp_path):
    truth = _truth(4)
    adaptive = _score(NoisyGenerator(truth), truth, tmp_path / "a", seeds="3..16", target_width=0.01).records
    fixed = _score(NoisyGenerator(truth), truth, tmp_path / "f", seeds=16).records
    for a, f in zip(adaptive, fixed):
        assert a["seeds"] == f["seeds"][: a["seeds_drawn"]]


def test_seeds_for_a_width_by_hand():
    # Stein's second stage: N = ceil((2 t(0.975, df) sd / W)^2); t(0.975, 2) = 4.302653 (tables), so with
    # sd = W: (8.605306)^2 = 74.05 -> 75 seeds; with df 30, t = 2.042272: (4.084545)^2 = 16.68 -> 17
    stein = VariancePrior(0.0, 0.0)
    assert stein.half_width(0.01, 2) == pytest.approx(0.04302653, rel=1e-6)
    assert seeds_for_width(stein.half_width(0.01, 2), 3, 100, 0.01) == 75
    assert seeds_for_width(0.02042272, 3, 100, 0.01) == 17
    assert seeds_for_width(0.01021136, 3, 100, 0.01) == 5  # (2.042272)^2 = 4.17 -> 5
    assert seeds_for_width(0.04302653, 3, 12, 0.01) == 12  # capped
    assert seeds_for_width(0.0, 3, 12, 0.01) == 3  # never below the first stage
    assert two_stage_interval(0.5, 0.04, 16) == pytest.approx([0.49, 0.51])  # mean +- 0.04 / sqrt(16)


def test_the_drawn_seeds_and_interval_by_hand_under_steins_rule(tmp_path):
    # each caption's own first three seeds fix its seed count and interval: recomputed here with numpy and
    # scipy.stats from the per-seed values the rows carry
    from scipy import stats

    truth = {f"caption {i}": (0.5, sd) for i, sd in enumerate([0.002, 0.01, 0.02, 0.03, 0.05, 0.004])}
    rows = _score(NoisyGenerator(truth), truth, tmp_path, seeds="3..40", target_width=0.03,
                  adaptive_rule="stein").records
    t2 = stats.t.ppf(0.975, 2)
    for row in rows:
        first = np.array(row["noisy_seeds"][:3])
        sd = first.std(ddof=1)
        n = int(min(40, max(3, np.ceil((2 * t2 * sd / 0.03) ** 2))))
        assert row["seeds_drawn"] == len(row["noisy_seeds"]) == n
        mean = np.mean(row["noisy_seeds"])
        assert row["noisy_ci"] == pytest.approx([mean - t2 * sd / np.sqrt(n), mean + t2 * sd / np.sqrt(n)], abs=1e-12)
        if n < 40:
            assert row["noisy_ci"][1] - row["noisy_ci"][0] <= 0.03
    assert len({r["seeds_drawn"] for r in rows}) > 2  # the rule did tell the captions apart


def test_a_fitted_prior_recovers_the_distribution_of_the_captions_variances():
    # 50,000 captions whose variances are drawn from a scaled inverse chi-square (d0 = 6, s0 = 0.01), each seen
    # through 5 seeds (4 degrees of freedom): the moment fit finds d0 and s0 back (5.90-6.18 over five draws)
    rng = np.random.default_rng(5)
    sigma2 = 6 * 0.01**2 / rng.chisquare(6, 50000)
    sds = np.sqrt(sigma2 * rng.chisquare(4, 50000) / 4)
    prior = fit_prior(list(sds), 4, "moderated")
    assert prior.df == pytest.approx(6, rel=0.06)
    assert prior.sd == pytest.approx(0.01, rel=0.02)
    prior = fit_prior(list(sds[:2000]), 4, "moderated")
    assert trigamma_inverse(float(polygamma(1, 3.7))) == pytest.approx(3.7, rel=1e-6)
    # the moderated variance: (d0 s0^2 + 2 s^2) / (d0 + 2) with d0 + 2 degrees of freedom
    sd, df = prior.moderate(0.02, 2)
    assert df == pytest.approx(prior.df + 2)
    assert sd == pytest.approx(math.sqrt((prior.df * prior.sd**2 + 2 * 0.02**2) / (prior.df + 2)))
    # all captions alike: the fit borrows every other caption's draws, no more
    equal = fit_prior([0.01] * 11, 2, "moderated")
    assert equal.df == 20
    pooled = fit_prior([0.01, 0.02, 0.02], 2, "pooled")
    assert (pooled.df, pooled.moderate(0.5, 2)) == (6, (pytest.approx(math.sqrt(0.0009 / 3)), 6))
    assert fit_prior([0.01, 0.02], 2, "stein").moderate(0.5, 2) == (0.5, 2)


def _coverage(rows, truth, field="noisy"):
    covered = np.array([lo <= t <= hi for r, (t, _) in zip(rows, truth.values()) for lo, hi in [r[f"{field}_ci"]]])
    drawn = np.array([r["seeds_drawn"] for r in rows])
    fewest = drawn == drawn.min()
    return covered.mean(), covered[fewest].mean(), int(fewest.sum())


def test_intervals_cover_where_first_draws_agree_by_chance(tmp_path):
    # the case: 1,000 captions of seed sd 0.05, --seeds 3..16 --target-width 0.08. The rule this
    # replaced stopped those whose first three draws agreed and covered 0.63 of them; with the variance
    # moderated over the captions every caption's interval covers, also among those that drew the fewest
    truth = {f"caption {i}": (0.5 + 0.0002 * i, 0.05) for i in range(1000)}
    generator = NoisyGenerator(truth)
    rows = caprecon.score(_rows(truth), [NoisyScore(generator)], batch_size=500, no_cache=True,
                          seeds="3..16", target_width=0.08).records
    overall, fewest, at_fewest = _coverage(rows, truth)
    assert overall >= 0.94 and fewest >= 0.94 and at_fewest >= 500
    # a pooled sd near 0.05: ceil((2 x 1.96 x 0.05 / 0.08)^2) = 7 seeds for nearly all (6 to 8 with the fit's error)
    assert generator.calls == sum(r["seeds_drawn"] for r in rows) and all(6 <= r["seeds_drawn"] <= 8 for r in rows)
    assert all(r["noisy_ci"][1] - r["noisy_ci"][0] <= 0.08 for r in rows)


def _simulate(profile, rule, n=4000, width=0.03, seed=11, low=3, high=16):
    """The procedure's own functions on simulated draws: (true sds, seeds drawn, covered)."""
    rng = np.random.default_rng(seed)
    sds = {"mixed": lambda: np.where(rng.uniform(size=n) < 0.9, 0.004, 0.04),
           "log-uniform": lambda: np.exp(rng.uniform(math.log(0.002), math.log(0.04), n)),
           "alike": lambda: np.full(n, 0.02)}[profile]()
    first = rng.standard_normal((n, low)) * sds[:, None]
    prior = fit_prior(list(first.std(axis=1, ddof=1)), low - 1, rule)
    covered, drawn = [], []
    for sd, draws in zip(sds, first):
        half = prior.half_width(float(draws.std(ddof=1)), low - 1)
        k = seeds_for_width(half, low, high, width)
        mean = (draws.sum() + (rng.standard_normal(k - low) * sd).sum()) / k
        lo, hi = two_stage_interval(mean, half, k)
        covered.append(lo <= 0 <= hi)
        drawn.append(k)
    return sds, np.array(drawn), np.array(covered)


@pytest.mark.parametrize("profile", ["mixed", "log-uniform"])
def test_intervals_cover_when_captions_noise_differs(profile):
    # 4,000 captions, the draws simulated: a tenth of the captions ten times as noisy, or sd log-uniform over
    # 20x; coverage of all and of those that drew the fewest seeds, under the one-component moderated rule
    _, drawn, covered = _simulate(profile, "moderated")
    assert covered.mean() >= 0.94
    # log-uniform is no scaled inverse chi-square: there the fewest-draws group covers 0.935-0.940 (seeds 11-13),
    # the fitted shape's misfit, said in docs/rank.md; the mixed profile 0.970-0.973
    assert covered[drawn == 3].mean() >= (0.94 if profile == "mixed" else 0.93) and (drawn == 3).sum() > 1000


def _best_allocation(sds, width, low=3, high=16):
    # the allocation that knows each caption's sd: ceil((2 x 1.959964 x sd / W)^2) seeds, in low..high
    return np.clip(np.ceil((2 * 1.959964 * sds / width) ** 2), low, high).sum()


@pytest.mark.parametrize("profile, width, most", [("mixed", 0.01, 1.10), ("mixed", 0.0067, 1.10),
                                                   ("alike", 0.0324, 1.10), ("log-uniform", 0.05, 1.10)])
def test_the_mixture_prior_covers_and_draws_near_the_best_allocation(profile, width, most):
    # issue 54 item 2: with the variance moderated by a mixture, the quiet captions of a two-point spread no
    # longer pay for the noisy ones (the one-component fit drew 1.44-1.53 of the best allocation at these W)
    sds, drawn, covered = _simulate(profile, "mixture", width=width)
    fewest = drawn == drawn.min()
    assert covered.mean() >= 0.94 and covered[fewest].mean() >= 0.94 and fewest.sum() > 400
    assert drawn.sum() <= most * _best_allocation(sds, width)
    if profile == "mixed":
        _, one, _ = _simulate(profile, "moderated", width=width)
        assert one.sum() >= 1.3 * _best_allocation(sds, width)  # what the mixture saves: the one-component fit


def test_a_mixture_half_width_by_hand():
    # two components, half-width recomputed with scipy.stats: the posterior weight of component c is prop. to
    # w_c f_c(s^2), f_c the density of s^2 = s0_c^2 F(d, d0_c); given c, sigma^2 is scaled inverse chi-square
    # (d0_c + d, (d0_c s0_c^2 + d s^2) / (d0_c + d)), so (mean - true) sqrt(N) is t(d0_c + d) times its sd;
    # the half-width h has sum_c post_c (2 T_c(h / sd_c) - 1) = 0.95
    from scipy import optimize, stats

    prior = MixturePrior((0.8, 0.2), (30.0, 8.0), (0.004, 0.03))
    for sd in (0.002, 0.008, 0.01, 0.012, 0.05):
        dens = np.array([w * stats.f.pdf(sd**2 / s0**2, 2, d0) / s0**2 for w, d0, s0 in zip(*map(np.array, (
            prior.weights, prior.dfs, prior.sds)))])
        post = dens / dens.sum()
        post_df = np.array(prior.dfs) + 2
        post_sd = np.sqrt((np.array(prior.dfs) * np.array(prior.sds) ** 2 + 2 * sd**2) / post_df)
        half = optimize.brentq(lambda h, post=post, post_sd=post_sd, post_df=post_df:
                               (post * (2 * stats.t.cdf(h / post_sd, post_df) - 1)).sum() - 0.95, 1e-9, 1)
        assert prior.half_width(sd, 2) == pytest.approx(half, rel=1e-7)
        assert 0.1 < post[1] < 0.9 or sd in (0.002, 0.05)  # the middle sds are truly mixed
    # one component: the moderated variance's t interval
    one = MixturePrior((1.0,), (6.0,), (0.01,))
    assert one.half_width(0.02, 2) == pytest.approx(stats.t.ppf(0.975, 8) * math.sqrt((6e-4 + 8e-4) / 8), rel=1e-9)


def test_the_mixture_fit_finds_two_spreads_of_noise_and_one_where_it_is_alike():
    rng = np.random.default_rng(2)
    # 3,000 captions, 0.9 of them at sd 0.004 and 0.1 at 0.04, each seen through 3 seeds (2 degrees of freedom)
    sds = np.where(rng.uniform(size=3000) < 0.9, 0.004, 0.04)
    first = sds * np.sqrt(rng.chisquare(2, 3000) / 2)
    prior = fit_mixture(list(first), 2)
    assert len(prior.weights) == 2
    order = np.argsort(prior.sds)
    assert np.array(prior.weights)[order] == pytest.approx([0.9, 0.1], abs=0.03)
    assert np.array(prior.sds)[order] == pytest.approx([0.004, 0.04], rel=0.1)
    # a point mass is a scaled inverse chi-square of many degrees of freedom, but no more than the
    # component's other captions hold: (captions in it - 1) x 2
    for w, d in zip(prior.weights, prior.dfs):
        assert d <= (3000 * w - 1) * 2 + 1e-6
    assert min(prior.dfs) > 50
    # noise alike: one shared variance (the pooled rule), whose maximum likelihood is the mean of the s^2
    alike_sds = 0.02 * np.sqrt(rng.chisquare(2, 3000) / 2)
    alike = fit_mixture(list(alike_sds), 2)
    assert alike == VariancePrior(6000, pytest.approx(math.sqrt(np.mean(alike_sds**2)), rel=1e-9), pooled=True)
    assert alike.sd == pytest.approx(0.02, rel=0.03)
    # a spread of one scaled inverse chi-square (d0 = 6): one component of about that df, not the pooled one
    spread = 0.01 * np.sqrt(6 / rng.chisquare(6, 3000) * rng.chisquare(2, 3000) / 2)
    one = fit_mixture(list(spread), 2)
    assert isinstance(one, MixturePrior) and len(one.weights) == 1 and one.dfs[0] == pytest.approx(6, rel=0.3)
    # fewer than 40 captions: one component whatever their spread; fewer than two with an sd: Stein's own
    halves = np.repeat([0.001, 0.1], 20) * np.sqrt(rng.chisquare(2, 40) / 2)  # 20 quiet, 20 very noisy
    assert len(fit_mixture(list(halves[:39]), 2).weights) == 1
    assert len(fit_mixture(list(halves), 2).weights) == 2
    assert fit_prior(list(halves), 2) == fit_mixture(list(halves), 2)  # the default rule
    assert fit_mixture([0.01, 0.0], 2) == VariancePrior(0.0, 0.0)


@pytest.mark.parametrize("settings, message", [
    ({"seeds": "3..16"}, "--target-width"),
    ({"seeds": 4, "target_width": 0.01}, "--target-width"),
    ({"seeds": "1..16", "target_width": 0.01}, "--seeds"),
    ({"seeds": "8..4", "target_width": 0.01}, "--seeds"),
    ({"seeds": "3..x", "target_width": 0.01}, "MIN..MAX"),
    ({"seeds": "3..16", "target_width": 0}, "--target-width"),
])
def test_adaptive_settings_are_checked_before_any_work(tmp_path, settings, message):
    generator = NoisyGenerator(_truth(2))
    with pytest.raises(ConfigError, match=message):
        _score(generator, _truth(2), tmp_path, **settings)
    assert generator.calls == 0


@pytest.mark.parametrize("argv, message", [
    (["--seeds", "1..16", "--target-width", "0.01"], "--seeds"),
    (["--seeds", "3..", "--target-width", "0.01"], "--seeds"),
    (["--seeds", "auto", "--target-width", "-1"], "--target-width"),
    # issue 51 item 15: auto alone says what to add
    (["--seeds", "auto"], "--seeds auto (adaptive seeds) needs --target-width W"),
    (["--seeds", "3..16"], "--seeds 3..16 (adaptive seeds) needs --target-width W"),
    (["--target-width", "0.01"], "give it with --seeds MIN..MAX (e.g. 3..16) or --seeds auto"),
])
def test_adaptive_options_on_the_command_line_are_usage_errors(tmp_path, capsys, argv, message):
    samples = tmp_path / "s.jsonl"
    samples.write_text('{"id": "a", "caption": "x"}\n')
    try:  # argparse's usage errors exit; the run's settings' errors return
        code = cli_main(["score", "-i", str(samples), "--out", str(tmp_path / "out"), *argv])
    except SystemExit as exit_:
        code = exit_.code
    assert code == 2
    assert message in capsys.readouterr().err


def test_a_run_setting_that_a_metric_object_would_not_see_is_refused(tmp_path):
    # the benchmark's replicates passed seed=rep beside NoisyScore(generator): the metric's own spec
    # (seed 0) rebuilt every replicate from the same noise, and nothing said so
    from caprecon.reconstruct.reconstructor import ReconstructionSpec

    truth = _truth(2)
    with pytest.raises(ConfigError, match=r"seed=1 does not reach the metric object NoisyScore.*seed=0"):
        _score(NoisyGenerator(truth), truth, tmp_path, seed=1)
    with pytest.raises(ConfigError, match="template"):
        _score(NoisyGenerator(truth), truth, tmp_path, template="a photo of {caption}")
    first = _score(NoisyGenerator(truth), truth, tmp_path, seed=0).records  # the spec's own value: fine
    other = caprecon.score(_rows(truth), [NoisyScore(NoisyGenerator(truth), ReconstructionSpec(size=(16, 16),
                                                                                                seed=1))],
                           cache_dir=str(tmp_path / "cache")).records
    assert [r["noisy"] for r in first] != [r["noisy"] for r in other]  # the spec's seed does reach it


def test_the_variance_is_fitted_over_the_whole_input_not_a_batch_and_the_manifest_says_how(tmp_path):
    # the moderated variance borrows from the other captions: all of the run's, so a caption's seed count
    # and interval do not depend on the captions it shares a batch with
    import json

    truth = {f"caption {i}": (0.5, [0.002, 0.01, 0.03][i % 3]) for i in range(30)}
    small = caprecon.score(_rows(truth), [NoisyScore(NoisyGenerator(truth))], batch_size=4, no_cache=True,
                           seeds="3..16", target_width=0.02, out=str(tmp_path / "run")).records
    whole = caprecon.score(_rows(truth), [NoisyScore(NoisyGenerator(truth))], batch_size=64, no_cache=True,
                           seeds="3..16", target_width=0.02).records
    assert [(r["seeds_drawn"], r["noisy_ci"]) for r in small] == [(r["seeds_drawn"], r["noisy_ci"]) for r in whole]
    assert len({r["seeds_drawn"] for r in small}) > 1
    described = json.loads((tmp_path / "run" / "manifest.json").read_text())["metrics"][0]
    assert described["adaptive_rule"] == "mixture" and "Stein" in described["interval"]
    # 30 captions: one component, integrated over its (d0, s0); the manifest gives their posterior quantiles
    integrated = described["variance_prior"]["noisy"]["integrated"]
    assert integrated["points"] > 100
    for name in ("df_5_50_95", "sd_5_50_95"):
        assert 0 < integrated[name][0] < integrated[name][1] < integrated[name][2]
    assert 0.002 < integrated["sd_5_50_95"][1] < 0.03  # between the quietest and the noisiest captions' sd


def test_an_unknown_adaptive_rule_is_refused(tmp_path, capsys):
    with pytest.raises(ConfigError, match="--adaptive-rule"):
        _score(NoisyGenerator(_truth(2)), _truth(2), tmp_path, seeds="3..16", target_width=0.01,
               adaptive_rule="guess")
    samples = tmp_path / "s.jsonl"
    samples.write_text('{"id": "a", "caption": "x"}\n')
    with pytest.raises(SystemExit):
        cli_main(["score", str(samples), "--out", str(tmp_path / "out"), "--seeds", "auto", "--target-width",
                  "0.01", "--adaptive-rule", "guess"])
    assert "--adaptive-rule" in capsys.readouterr().err


def test_the_pooled_variance_is_chosen_by_bic_as_a_reference_computes_it():
    # runs of 12 captions of alike noise (too few for two components): the shared variance (1 parameter, its
    # maximum likelihood the mean of the s^2) against one scaled inverse chi-square (2 parameters, df at most
    # 11 x 2 = 22), each log-likelihood recomputed with scipy.stats' chi-square and F densities
    from scipy import optimize, stats

    rng = np.random.default_rng(7)
    chosen = []
    for _ in range(40):
        variances = 0.02**2 * rng.chisquare(2, 12) / 2
        shared = variances.mean()
        loglik_shared = np.sum(stats.chi2.logpdf(2 * variances / shared, 2) + np.log(2 / shared))

        def minus_loglik(x, variances=variances):
            d0, s0sq = min(math.exp(x[0]), 22.0), math.exp(x[1])
            return -np.sum(stats.f.logpdf(variances / s0sq, 2, d0) - np.log(s0sq))

        free = min((optimize.minimize(minus_loglik, [math.log(start), math.log(shared)], method="Nelder-Mead",
                                      options={"xatol": 1e-8, "fatol": 1e-10}) for start in (2.0, 20.0)),
                   key=lambda r: r.fun)
        pooled = -2 * loglik_shared + math.log(12) <= 2 * free.fun + 2 * math.log(12)
        prior = fit_mixture(list(np.sqrt(variances)), 2)
        assert isinstance(prior, VariancePrior) == pooled
        chosen.append(pooled)
    assert 0 < sum(chosen) < len(chosen)  # both happen: the rule, not one answer, is checked
