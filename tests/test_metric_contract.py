"""The metric contract, checked on every call by the one check the run, `score` and the `Reward`
share (`caprecon.metrics.base.checked_rows`, `check_columns`): a plug-in metric that returns fewer
rows than items (it used to spin at full CPU for ever), more, a row without its column, text where a
number is declared, a value outside the declared range, an impossible direction or a range with low
above high each end in one error naming the metric, and nothing already computed is lost.

The metrics are tests/contract_metrics.py's: each scores correctly until a batch holds the word
"break", so the rows of the batches before, and of the other metric in the breaking batch, are known
by hand (a caption's words over 10)."""

from __future__ import annotations

import json
import re

import pytest
from oracle import render

from caprecon.apps.reward import Reward
from caprecon.core.errors import ConfigError
from caprecon.core.errors import MetricContractError
from caprecon.run.failures import RunError
from clirun import run_cli

# four captions in batches of two: the second batch breaks the contract
CAPTIONS = ["one two", "one two three", "please break now", "four words break here"]
BREAKING = {
    "FewerRows": "metric contract: fewer-rows: score returned 1 rows for 2 items",
    "NoRows": "metric contract: no-rows: score returned 0 rows for 2 items",
    "ExtraRows": "metric contract: extra-rows: score returned 3 rows for 2 items",
    "MissingColumn": "metric contract: missing-column: row 0 of the batch has no 'contract' (its headline column)",
    "TextValue": "metric contract: text-value: row 0 of the batch has contract = 'high', but the column is "
                 "declared a number",
    "OutOfRange": "metric contract: out-of-range: row 0 of the batch has contract = 1.5, outside the declared "
                  "range [0.0, 1.0]",
    "NotADict": "metric contract: not-a-dict: row 0 of the batch is a float, not a dict",
}


def _rows(tmp_path):
    render("red circle").save(tmp_path / "p.png")
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps({"id": f"r{k}", "image": "p.png", "caption": c}) + "\n"
                            for k, c in enumerate(CAPTIONS)))
    return path


@pytest.mark.parametrize("kind", BREAKING)
def test_a_broken_metric_stops_the_run_naming_it_and_keeps_what_was_scored(tmp_path, capsys, kind):
    out = tmp_path / "run"
    code, _, err = run_cli(["score", "-i", _rows(tmp_path), "-m", "contract_metrics:Words", "-m",
                            f"contract_metrics:{kind}", "--batch-size", "2", "--out", out, "-q",
                            "--cache-dir", tmp_path / "cache"], capsys)
    last = err.strip().splitlines()[-1]
    assert code == 2 and "Traceback" not in err
    assert last.startswith(f"caprecon: error: {BREAKING[kind]}"), err
    rows = [json.loads(line) for line in (out / "scores.jsonl").read_text().splitlines()]
    # the first batch whole; the breaking batch with the other metric's values and this one's error
    assert [r["words"] for r in rows] == [0.2, 0.3, 0.3, 0.4]
    assert [r.get("contract") for r in rows] == [0.2, 0.3, None, None]
    assert [bool(r.get("error")) for r in rows] == [False, False, True, True]
    assert BREAKING[kind] in rows[2]["error"]
    assert json.loads((out / "manifest.json").read_text())["status"] == "stopped"


@pytest.mark.parametrize("kind", BREAKING)
def test_score_and_the_reward_raise_the_same_error(tmp_path, kind):
    import contract_metrics
    from caprecon import score

    metric = getattr(contract_metrics, kind)()
    with pytest.raises(RunError, match=re.escape(BREAKING[kind])):
        score([{"id": str(k), "caption": c} for k, c in enumerate(CAPTIONS)], [metric], batch_size=2,
              cache_dir=str(tmp_path / "cache"))
    reward = Reward([getattr(contract_metrics, kind)()], guards=None, progress=False, batch_size=2,
                    cache_dir=str(tmp_path / "cache"))
    picture = render("red circle")
    assert reward([picture] * 2, CAPTIONS[:2]) == pytest.approx([0.2, 0.3])  # kept while it keeps the contract
    with pytest.raises(MetricContractError, match=re.escape(BREAKING[kind])):
        reward([picture] * 4, CAPTIONS)


@pytest.mark.parametrize("kind, message", [
    ("BadDirection", "metric contract: bad-direction: column 'contract': higher_is_better must be True, False or "
                     "None (neither), not 'up'"),
    ("LowAboveHigh", "metric contract: low-above-high: column 'contract': low (1.0) is above high (0.0)"),
])
def test_impossible_declarations_are_refused_before_any_work(tmp_path, capsys, kind, message):
    import contract_metrics

    out = tmp_path / "run"
    code, _, err = run_cli(["score", "-i", _rows(tmp_path), "-m", f"contract_metrics:{kind}", "--out", out, "-q"],
                           capsys)
    assert code == 2 and err.strip().splitlines()[-1] == f"caprecon: error: {message}", err
    assert not (out / "scores.jsonl").exists()
    with pytest.raises(ConfigError, match=re.escape(message)):
        Reward([getattr(contract_metrics, kind)()], progress=False)._build()


def test_a_value_within_rounding_of_its_bound_is_inside(tmp_path):
    from caprecon.metrics.base import Column, Metric, checked_rows

    class Cosine(Metric):
        name = "cosine"
        columns = (Column("cosine", low=-1.0, high=1.0),)

    # (1 + cos) / 2 of two equal float32 unit vectors comes out a few 1e-8 above 1
    assert checked_rows(Cosine(), 2, [{"cosine": 1.0 + 6e-8}, {"cosine": -1.0 - 6e-8}])
    with pytest.raises(MetricContractError, match="outside"):
        checked_rows(Cosine(), 1, [{"cosine": 1.0 + 1e-4}])
    assert checked_rows(Cosine(), 1, [{"cosine": None}]) == [{"cosine": None}]  # no value is no breach


class Spinning(BaseException):
    """Raised by a stage asked too often: without the check, the loop would ask for ever."""


def test_a_stage_that_returns_fewer_results_than_rows_stops_instead_of_spinning():
    from caprecon.run.failures import FailureWatch, isolated

    calls = []

    def fewer(part):
        calls.append(len(part))
        if len(calls) > 20:
            raise Spinning(calls)
        return part[:-1]

    with pytest.raises(RunError, match=re.escape("generator returned 2 results for 3 rows; it must return one per "
                                                 "row, in order")):
        isolated(fewer, [1, 2, 3], FailureWatch("generator"))
    assert calls == [3]


def test_on_ray_a_broken_metric_stops_the_run_at_once_naming_it(tmp_path):
    ray = pytest.importorskip("ray")
    pytest.importorskip("ray.data")
    import os
    from pathlib import Path

    import caprecon
    import contract_metrics
    from caprecon import score

    tests = Path(__file__).parent
    # the workers import the caprecon this test imported (a mutated copy's, under scripts/mutants.py)
    path = os.pathsep.join([str(Path(caprecon.__file__).parents[1]), str(tests), os.environ.get("PYTHONPATH", "")])
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": path, "HF_HUB_OFFLINE": "1"}})
    try:
        with pytest.raises(RunError, match=re.escape(BREAKING["FewerRows"])) as stop:
            score([{"id": str(k), "caption": c} for k, c in enumerate(CAPTIONS)], [contract_metrics.FewerRows()],
                  batch_size=2, executor="ray", ray={"workers": 1, "retries": 3}, cache_dir=str(tmp_path / "cache"))
        assert "retries" not in str(stop.value)  # stopped at once: retrying a broken metric's batch cannot help
    finally:
        ray.shutdown()
