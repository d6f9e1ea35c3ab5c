"""Adaptive seeds (`--seeds MIN..MAX --target-width W`): further reconstructions only for captions
whose interval is still wide, each through the store. Generator calls are counted on a
stand-in whose per-caption noise is known (`noisy_standin`)."""

from __future__ import annotations

import math

import pytest
from noisy_standin import NoisyGenerator, NoisyScore

import caprecon
from caprecon.cli import main as cli_main
from caprecon.core.errors import ConfigError
from caprecon.metrics.adaptive import seeds_for_width

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
    # 2 t(0.975, k-1) sd / sqrt(k) <= w with sd = w: t(16) / sqrt(17) = 2.120 / 4.123 = 0.514 > 0.5,
    # t(17) / sqrt(18) = 2.110 / 4.243 = 0.497 <= 0.5
    assert seeds_for_width(0.01, 3, 100, 0.01) == 18
    assert seeds_for_width(0.01, 3, 12, 0.01) == 12  # capped
    assert seeds_for_width(0.0, 3, 12, 0.01) == 4  # at least one more


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
])
def test_adaptive_options_on_the_command_line_are_usage_errors(tmp_path, capsys, argv, message):
    samples = tmp_path / "s.jsonl"
    samples.write_text('{"id": "a", "caption": "x"}\n')
    with pytest.raises(SystemExit) as exit_:
        cli_main(["score", str(samples), "--out", str(tmp_path / "out"), *argv])
    assert exit_.value.code == 2
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
