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
