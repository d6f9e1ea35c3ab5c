"""The reward's statistics held to what the docs promise, each expected value worked out here by hand:
a reward over adaptive seeds is Stein's two-stage mean of the caption's own draws, whatever the batch,
and the value `score` gives; a distilled reward's held-out captions are never training captions."""

from __future__ import annotations

import math

import numpy as np
import pytest
from noisy_standin import NoisyGenerator, NoisyScore
from PIL import Image
from scipy import stats

import caprecon
from caprecon.apps.reward import Reward
from caprecon.core.errors import ConfigError
from caprecon.models.common import derive_seed

WIDTH, LOW, HIGH = 0.02, 3, 16


def _truth():
    # seed sds chosen so that Stein's need falls at the minimum, in between and at the cap
    return {f"caption {i}": (0.5 + 0.01 * i, [0.002, 0.005, 0.03][i % 3]) for i in range(9)}


def _pictures(tmp_path, count):
    paths = []
    for i in range(count):
        paths.append(tmp_path / f"photo{i}.png")
        Image.new("RGB", (8, 8), (20 * i, 10, 30)).save(paths[-1])
    return paths


def _stein_by_hand(true, sd, image_id):
    """Stein's two-stage mean of a caption's draws: the stand-in's value at seed k is true + sd * z_k, z_k
    from seed k of the default policy (seed 0, the picture's id, candidate 0; seed k > 0 derived from it)."""
    first = derive_seed(0, image_id, 0)
    seeds = [first] + [derive_seed(first, "seed", k) for k in range(1, HIGH)]
    values = [true + sd * float(np.random.default_rng(s).standard_normal()) for s in seeds]
    half = stats.t.ppf(0.975, LOW - 1) * np.std(values[:LOW], ddof=1)
    need = min(HIGH, max(LOW, math.ceil((2 * half / WIDTH) ** 2)))
    return float(np.mean(values[:need])), need


def test_an_adaptive_seed_reward_is_steins_mean_of_its_own_draws_whatever_the_batch(tmp_path):
    truth = _truth()
    captions = list(truth)
    paths = [str(p) for p in _pictures(tmp_path, len(captions))]
    expected = [_stein_by_hand(*truth[c], f"photo{i}") for i, c in enumerate(captions)]
    assert {need for _, need in expected} >= {LOW, HIGH} and len({need for _, need in expected}) > 2

    def reward(**options):
        return Reward([NoisyScore(NoisyGenerator(truth))], guards=None, progress=False, seeds=f"{LOW}..{HIGH}",
                      target_width=WIDTH, adaptive_rule="stein", cache_dir=str(tmp_path / "cache"), **options)

    whole = reward()(paths, captions)
    assert whole == pytest.approx([value for value, _ in expected], abs=1e-12)
    alone = [reward()([p], [c])[0] for p, c in zip(paths, captions)]
    in_twos = reward(batch_size=2)(paths[::-1], captions[::-1])[::-1]
    assert alone == whole and in_twos == whole
    scored = caprecon.score([{"id": f"r{i}", "image": p, "caption": c} for i, (p, c) in enumerate(zip(paths, captions))],
                            [NoisyScore(NoisyGenerator(truth))], seeds=f"{LOW}..{HIGH}", target_width=WIDTH,
                            adaptive_rule="stein", cache_dir=str(tmp_path / "cache"))
    assert scored.scores("noisy") == pytest.approx(whole, abs=1e-12)
    assert [r["seeds_drawn"] for r in scored.records] == [need for _, need in expected]


@pytest.mark.parametrize("rule", ["mixture", "moderated", "pooled"])
def test_a_reward_refuses_adaptive_rules_that_borrow_from_the_batch(rule):
    # under these rules a completion's seed count comes from the variance of the other completions scored
    # with it: its reward would change with its batch (measured before this check: 0.5129 in a batch of 12,
    # 0.5055 alone, for one caption)
    with pytest.raises(ConfigError, match=rf"adaptive_rule='stein'.*not '{rule}'"):
        Reward([NoisyScore(NoisyGenerator(_truth()))], seeds="3..16", target_width=WIDTH, adaptive_rule=rule)
    Reward([NoisyScore(NoisyGenerator(_truth()))], seeds=4)  # a fixed K borrows nothing: allowed
