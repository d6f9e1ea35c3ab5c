"""Scores over K seeds: the textbook interval, seed 0 as today's seed, one generator call per
batch, and the cache making K=8 after K=4 generate only the four new seeds."""

import hashlib
import json
import math

import numpy as np
import pytest
from PIL import Image

import caprecon
from caprecon.core.errors import ConfigError
from caprecon.metrics.seeds import seed_interval
from caprecon.models.generator import DiffusersGenerator, Generated
from logged_models import LoggedGenerator
from oracle import OracleGenerator, PixelEmbedder, render

# Student t quantiles t(0.975, df) from a printed table
T975 = {1: 12.706, 3: 3.182, 7: 2.365}


class ShiftingOracle(OracleGenerator):
    """The oracle's drawing moved sideways by a seed-dependent amount: the seed matters."""

    @property
    def fingerprint(self) -> str:
        return "shifting-oracle-v1"

    def generate(self, requests):
        return [Generated(Image.fromarray(np.roll(np.asarray(render(r.prompt, r.width, r.height)), r.seed % 11 - 5,
                                                  axis=1))) for r in requests]


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
    common = dict(generator=ShiftingOracle(), embedder=PixelEmbedder(), max_side=48, batch_size=2,
                  cache_dir=str(tmp_path / "cache"))
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
    common = dict(generator=generator, embedder=PixelEmbedder(), max_side=32, batch_size=2,
                  cache_dir=str(tmp_path / "cache"))
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
