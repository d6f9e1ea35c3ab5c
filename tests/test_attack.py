"""The classes of bad input that scripts/attack.py found still ending badly on the newer commands
(issue 42's fresh attack), each held to one line naming the problem and exit 2 (1 where rows
are missing) — before any model loads or any work is done:

- a path that is empty, not a file or folder (a FIFO hung the command), or a run given twice;
- an output file or folder of the wrong kind, and a missing input named by its option, for the
  commands that had no prologue (`distill`, `reward-audit`) or their own words (`cache`, `suite`,
  `meta verify --expected`);
- numbers without a bound or a domain (`cache prune` sizes and ages, `distill`'s epochs and width,
  `reward-audit --weight`), and a metric weighted twice;
- scores that are no number (text in `compare`, `seeds` and `meta --scores`), read before as missing;
- run-folder files of the wrong shape (a shard's manifest, a report's manifest), and a suite file's
  entries of the wrong type;
- an input with no rows (`reward-audit`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from oracle import render

from caprecon.cli import main
from clirun import run_cli as _run

TESTS = Path(__file__).parent
WORLD = ["-g", "oracle:OracleGenerator", "--embedder", "oracle:PixelEmbedder", "--max-side", "32"]




def _refused(code, err, message, expected_code=2):
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert "Traceback" not in err, err
    assert code == expected_code and lines and message in lines[-1], (code, err)


def _jsonl(path: Path, rows) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture
def w(tmp_path):
    render("a red square", 32, 32).save(tmp_path / "red.png")
    render("a blue circle", 32, 32).save(tmp_path / "blue.png")
    rows = _jsonl(tmp_path / "rows.jsonl", [{"id": "a", "image": "red.png", "caption": "a red square"},
                                            {"id": "b", "image": "blue.png", "caption": "a blue circle"}])
    seeded = [{"id": f"{s}{i}", "image_id": f"img{i}", "captioner": s, "recon": 0.1 * i + shift,
               "recon_seeds": [0.1 * i + shift, 0.1 * i + shift + 0.01]} for s, shift in (("x", 0), ("y", 0.05))
              for i in range(4)]
    run = _jsonl(tmp_path / "run" / "scores.jsonl", seeded).parent
    expert = _jsonl(tmp_path / "expert.jsonl", [  # Flickr8k-Expert's rows: three experts' ratings of 1 to 4
        {"id": f"{i}-{k}", "image": f"img{i}.jpg", "caption": f"caption {i} {k}", "refs": ["a ref", "b ref"],
         "ratings": [1 + k, 1 + (k + i) % 4, 2]} for i in range(4) for k in range(3)])
    return {"root": tmp_path, "rows": rows, "run": run, "seeded": seeded, "out": tmp_path / "out", "expert": expert}


# --------------------------------------------------------------------------- paths that cannot be read


# (command line with {path} the input under test, the option the message names)
READERS = {
    "score": (["score", "-i", "{path}", "-m", "recon", *WORLD, "--out", "{out}"], "--input"),
    "refine": (["refine", "-i", "{path}", "--llm", "refine_fakes:ReviserLLM", *WORLD, "--out", "{out}"], "--input"),
    "t2i": (["t2i", "-i", "{path}", "-g", "oracle:OracleGenerator", "--out", "{out}"], "--input"),
    "reward-audit": (["reward-audit", "-i", "{path}", "-m", "recon", *WORLD], "--input"),
    "distill": (["distill", "{path}", "-m", "recon", "--out", "{out}"], "runs"),
    "seeds": (["seeds", "{path}", "--out", "{out}"], "run"),
}


@pytest.mark.parametrize("command", list(READERS))
@pytest.mark.parametrize("kind", ["a device", "an empty path"])
def test_an_input_that_is_not_a_file_or_folder_is_refused_naming_its_option(command, kind, w, capsys):
    argv, option = READERS[command]
    path = "/dev/null" if kind == "a device" else ""
    code, _, err = _run([a.format(path=path, out=w["out"]) for a in argv], capsys)
    message = f"{option}: not a file or folder: /dev/null is a device" if kind == "a device" else \
        f"{option}: empty path ''; give a file or folder"
    _refused(code, err, message)
    assert not w["out"].exists()  # refused before any folder is made


def test_a_fifo_no_one_writes_to_is_refused_not_waited_on(w):
    # before, `refine -i pipe.jsonl` blocked for ever opening the pipe
    os.mkfifo(w["root"] / "pipe.jsonl")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
           "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-m", "caprecon.cli", "refine", "-i", str(w["root"] / "pipe.jsonl"),
                           "--llm", "refine_fakes:ReviserLLM", *WORLD, "--out", str(w["out"])],
                          env=env, capture_output=True, text=True, timeout=120)
    _refused(done.returncode, done.stderr, f"--input: not a file or folder: {w['root'] / 'pipe.jsonl'} is a FIFO")


@pytest.mark.parametrize("argv, message", [
    (lambda w: ["refine", "-i", w["rows"], "--llm", "refine_fakes:ReviserLLM", *WORLD, "--out", ""],
     "--out is empty (''); give a folder"),
    (lambda w: ["score", "-i", w["rows"], "-m", "recon", *WORLD, "--out", " "], "--out is empty (' '); give a folder"),
    (lambda w: ["compare", w["run"], "--out", ""], "--out is empty (''); give a file name"),
    (lambda w: ["meta", "--judgments", w["rows"], "--out", ""], "argument --out: is empty (''); give a path"),
], ids=["refine", "score", "compare", "meta"])
def test_an_empty_output_path_is_refused_not_the_working_folder(argv, message, w, capsys, monkeypatch):
    monkeypatch.chdir(w["root"])  # before, Path('') was the working folder, written into
    before = sorted(p.name for p in w["root"].iterdir())
    code, _, err = _run(argv(w), capsys)
    _refused(code, err, message)
    assert sorted(p.name for p in w["root"].iterdir()) == before


def test_distill_refuses_a_run_given_twice(w, capsys):
    code, _, err = _run(["distill", w["run"], str(w["run"]) + "/", "-m", "recon", "--out", w["out"]], capsys)
    _refused(code, err, f"runs: {w['run']}/ is given twice (also as {w['run']})")


# --------------------------------------------------------------------------- outputs and missing inputs


@pytest.mark.parametrize("argv, message", [
    (lambda w: ["distill", w["run"], "-m", "recon", "--out", w["rows"]], "--out {rows} is a file; give a folder"),
    (lambda w: ["distill", w["run"], "-m", "recon", "--out", w["run"]], "--out {run} lies inside the input"),
    (lambda w: ["reward-audit", "-i", w["rows"], "-m", "recon", *WORLD, "--json", w["run"]],
     "--json {run} is a folder; give a file name"),
    (lambda w: ["reward-audit", "-i", w["rows"], "-m", "recon", *WORLD, "--json", w["rows"]],
     "--json {rows} lies inside the input"),
], ids=["distill --out a file", "distill --out a run", "reward-audit --json a folder", "reward-audit --json the input"])
def test_outputs_of_distill_and_reward_audit_are_checked_before_any_work(argv, message, w, capsys):
    rows_before = w["rows"].read_text()
    code, _, err = _run(argv(w), capsys)
    _refused(code, err, message.format(rows=w["rows"], run=w["run"]))
    assert w["rows"].read_text() == rows_before and not (w["run"] / "config.json").exists()


MISSING = {  # command line with {x}, a path that is not there -> the option the message names
    "distill": (["distill", "{x}", "-m", "recon", "--out", "{out}"], "runs"),
    "reward-audit": (["reward-audit", "-i", "{x}", "-m", "recon"], "--input"),
    "cache info": (["cache", "info", "--cache-dir", "{x}"], "--cache-dir"),
    "cache verify": (["cache", "verify", "--cache-dir", "{x}"], "--cache-dir"),
    "cache prune": (["cache", "prune", "--cache-dir", "{x}", "--max-size", "1GB"], "--cache-dir"),
    "suite --suite": (["suite", "--suite", "{x}.yaml", "--captions", "{x}"], "--suite"),
    "suite --data": (["suite", "--suite", "mme", "--data", "{x}", "--captions", "{x}"], "--data"),
    "suite --captions": (["suite", "--suite", "mme", "--data", "{rows}", "--captions", "pub={x}"], "--captions"),
    "meta verify --expected": (["meta", "verify", "--benchmark", "flickr8k-expert", "--data", "{rows}",
                                "--expected", "{x}"], "--expected"),
}


@pytest.mark.parametrize("kind", list(MISSING))
def test_a_missing_input_names_its_option_in_the_words_of_the_others(kind, w, capsys):
    argv, option = MISSING[kind]
    missing = w["root"] / "nofile"
    code, _, err = _run([a.format(x=missing, out=w["out"], rows=w["rows"]) for a in argv], capsys)
    shown = f"{missing}.yaml" if kind == "suite --suite" else missing
    assert code == 2 and err.strip().splitlines()[-1] == f"caprecon: error: {option}: not found: {shown}", err
    assert not w["out"].exists()


@pytest.mark.parametrize("argv, message", [
    (lambda w: ["cache", "info", "--cache-dir", w["rows"]], "--cache-dir: not a folder: {rows} is a file"),
    (lambda w: ["suite", "--suite", "mme", "--data", w["run"], "--captions", f"pub={w['rows']}"],
     "--data: not a file: {run}"),
    (lambda w: ["suite", "--suite", "mme", "--data", w["rows"], "--captions", f"pub={w['run']}"],
     "--captions: not a file: {run}"),
    (lambda w: ["suite", "--suite", "mme", "--data", w["rows"], "--captions", "pub="],
     "--captions 'pub=' must look like [LABEL=]FILE, with both parts"),
    (lambda w: ["meta", "verify", "--benchmark", "flickr8k-expert", "--data", w["expert"], "--expected", w["run"]],
     "--expected: not a file: {run}"),
], ids=["cache-dir a file", "suite --data a folder", "suite --captions a folder", "suite --captions no file",
        "meta --expected a folder"])
def test_a_folder_where_a_file_is_read_and_the_reverse(argv, message, w, capsys):
    code, _, err = _run(argv(w), capsys)
    _refused(code, err, message.format(rows=w["rows"], run=w["run"]))


# --------------------------------------------------------------------------- numbers: bounds and domains

HUGE = "1" + "0" * 400  # beyond the largest float: inf when read as one


@pytest.mark.parametrize("argv, message", [
    (["cache", "prune", "--max-size", HUGE + "GB"], f"argument --max-size: size '{HUGE}GB': must be at most 1000 PB"),
    (["cache", "prune", "--max-size", "1.2.3GB"], "argument --max-size: size '1.2.3GB': use a number with B, KB"),
    (["cache", "prune", "--older-than", HUGE + "d"], f"argument --older-than: age '{HUGE}d': must be at most 1000 years"),
    (["distill", "run", "-m", "recon", "--out", "o", "--epochs", str(10**9)],
     "argument --epochs: must be between 1 and 100000, not 1000000000"),
    (["distill", "run", "-m", "recon", "--out", "o", "--hidden", str(10**9)],
     "argument --hidden: must be between 1 and 65536, not 1000000000"),
    (["reward-audit", "-i", "{rows}", "--weight", "recon=abc"], "--weight 'recon=abc': W must be a number, not 'abc'"),
    (["reward-audit", "-i", "{rows}", "--weight", "recon=nan"], "--weight 'recon=nan': W must be a finite number, not nan"),
    (["reward-audit", "-i", "{rows}", "--weight", "recon=-inf"],
     "--weight 'recon=-inf': W must be a finite number, not -inf"),
    (["reward-audit", "-i", "{rows}", "--weight", "recon=1", "--weight", "recon=2"],
     "--weight 'recon=2': recon is given a weight twice"),
    (["reward-audit", "-i", "{rows}", "--weight", "=2"], "--weight '=2' must look like METRIC=W"),
    (["refine", "-i", "{rows}", "--out", "{out}", "--llm", "x", "--select", "recon=0.5,recon=0.5"],
     "selection 'recon=0.5': recon is named twice; give each metric once"),
], ids=["prune --max-size inf", "prune --max-size 1.2.3", "prune --older-than inf", "distill --epochs",
        "distill --hidden", "audit weight text", "audit weight nan", "audit weight -inf", "audit weight twice",
        "audit weight unnamed", "refine select twice"])
def test_numbers_out_of_their_bounds_or_domain_are_refused(argv, message, w, capsys, monkeypatch):
    monkeypatch.chdir(w["root"])
    (w["root"] / "cache").mkdir()
    code, _, err = _run([a.format(rows=w["rows"], out=w["out"]) for a in argv] + (
        ["--cache-dir", str(w["root"] / "cache")] if argv[0] == "cache" else []), capsys)
    _refused(code, err, message)


def test_a_weight_of_a_metric_with_a_dash_is_read_as_written(w, capsys):
    # --weight went through the key=value options, whose '-' becomes '_': bleu-4's weight named no metric
    from caprecon.cli.reward import parse_weights

    assert parse_weights(["bleu-4=0.5", "recon=2"]) == {"bleu-4": 0.5, "recon": 2.0}


@pytest.mark.parametrize("weights, message", [
    ({"recon": float("nan")}, "weight of recon must be a finite number, not nan"),
    ([float("inf")], "weight of recon must be a finite number, not inf"),
    ({"recon": "2"}, "weight of recon must be a number, not '2'"),
])
def test_the_reward_api_refuses_weights_that_are_no_finite_number(weights, message):
    from caprecon.apps.reward import Reward
    from caprecon.core.errors import ConfigError

    with pytest.raises(ConfigError) as raised:
        Reward(["recon"], weights, generator="oracle:OracleGenerator", embedder="oracle:PixelEmbedder")
    assert str(raised.value) == message


def test_selection_weights_from_a_mapping_must_be_numbers():
    from caprecon.core.errors import ConfigError
    from caprecon.run.captioning import Selection

    with pytest.raises(ConfigError, match=r"^selection weight of recon: must be a number, not 'high'$"):
        Selection.parse({"recon": "high"})
    assert Selection.parse({"recon": 1, "clipscore": 0.5}).weights == {"recon": 1.0, "clipscore": 0.5}


# --------------------------------------------------------------------------- scores that are no number


@pytest.mark.parametrize("field, value, message", [
    ("recon", "0.5", "x: row 'x0': recon is the text '0.5', not a number"),
    ("recon", True, "x: row 'x0': recon is bool True, not a number"),
    ("recon_seeds", "0.1,0.2", "x: row 'x0': recon_seeds is the text '0.1,0.2', not a list of numbers"),
    ("recon_seeds", [0.1, "0.2"], "x: row 'x0': recon_seeds is a list holding the text '0.2', not a list of numbers"),
])
def test_compare_refuses_a_score_that_is_no_number(field, value, message, w, capsys):
    rows = [dict(r) for r in w["seeded"]]
    rows[0][field] = value  # x0, the first row of system x
    run = _jsonl(w["root"] / "edited" / "scores.jsonl", rows).parent
    code, _, err = _run(["compare", run], capsys)
    _refused(code, err, message)
    code, _, err = _run(["seeds", run, "--out", w["out"]], capsys)
    _refused(code, err, message.replace("x: ", "the run: "))


def test_missing_scores_are_still_left_out_and_counted(w, capsys):
    rows = [dict(r) for r in w["seeded"]]
    rows[0]["recon"], rows[0]["recon_seeds"], rows[0]["error"] = None, None, "image not found"
    rows[4]["recon_seeds"] = [0.1, None]  # one seed failed: the row has no finite score
    run = _jsonl(w["root"] / "holes" / "scores.jsonl", rows).parent
    code, out, err = _run(["compare", run], capsys)
    assert code == 0, err
    assert "left out 1 row(s) of x and 1 of y without a finite recon score" in out + err


def test_compare_says_when_rows_have_no_image_id(w, capsys):
    rows = [{k: v for k, v in r.items() if k != "image_id"} for r in w["seeded"]]
    run = _jsonl(w["root"] / "no-images" / "scores.jsonl", rows).parent
    code, _, err = _run(["compare", run], capsys)
    _refused(code, err, "x and y have no image with a recon score in common: their rows have no image_id, so each "
                        "row's id stands for its image, and no id is in both")


@pytest.mark.parametrize("values, message", [
    ([0.1, 0.2, "high", 0.4], "row 'c': cider is 'high', not a number"),  # JSON numbers and one text
    (["0.1", "0.2", "n/a", "0.4"], "row 'c': cider is 'n/a', not a number"),  # a CSV's column: mostly numbers
])
def test_a_scores_column_of_numbers_with_text_in_it_is_refused(values, message):
    from caprecon.core.errors import ConfigError
    from caprecon.stats.agreement import scores_from_records

    records = [{"id": i, "cider": v} for i, v in zip("abcd", values)]
    with pytest.raises(ConfigError) as raised:
        scores_from_records(records, "cider", list("abcd"))
    assert str(raised.value).startswith(message)


def test_a_text_column_and_empty_scores_are_no_error():
    import math

    from caprecon.stats.agreement import scores_from_records

    captioners = [{"id": i, "captioner": name} for i, name in zip("abc", ["blip", "git", "llava"])]
    assert all(math.isnan(v) for v in scores_from_records(captioners, "captioner", list("abc")))
    holes = [{"id": "a", "cider": "0.5"}, {"id": "b", "cider": ""}, {"id": "c", "cider": None}]
    values = scores_from_records(holes, "cider", list("abc"))
    assert values[0] == 0.5 and math.isnan(values[1]) and math.isnan(values[2])


def test_meta_fit_refuses_a_text_score_in_scores(w, capsys):
    judged = [{"id": f"{i}-{k}", "image": f"img{i}.jpg", "caption": f"caption {i} {k}", "refs": ["a ref", "b ref"],
               "human": float(k + i % 2)} for i in range(6) for k in range(3)]
    scores = [{"id": j["id"], "bleu-1": 0.1 * n, "cider": "high" if n == 4 else 0.2 * n} for n, j in enumerate(judged)]
    code, _, err = _run(["meta", "--judgments", _jsonl(w["root"] / "judged.jsonl", judged), "--scores",
                         _jsonl(w["root"] / "scores.jsonl", scores), "--metric", "bleu-1", "cider", "--fit",
                         "--bootstrap", "0", "--out", w["out"]], capsys)
    _refused(code, err, "row '1-1': cider is 'high', not a number")


# --------------------------------------------------------------------------- files of the wrong shape


def _shard(w, edit) -> Path:
    """A two-row input scored in two shards with bleu-4 (no model); `edit` changes shard 1's manifest."""
    rows = _jsonl(w["root"] / "refs.jsonl", [
        {"id": "a", "image": "red.png", "caption": "a red square", "refs": ["a red square"]},
        {"id": "b", "image": "blue.png", "caption": "a blue circle", "refs": ["a blue circle"]}])
    for i in range(2):
        assert main(["score", "-i", str(rows), "-m", "bleu-4", "--shard", f"{i}/2", "--out",
                     str(w["root"] / f"shard{i}"), "-q"]) == 0
    path = w["root"] / "shard1" / "manifest.json"
    manifest = json.loads(path.read_text())
    path.write_text(json.dumps(edit(manifest)))
    return path


@pytest.mark.parametrize("edit, problem", [
    (lambda m: {**m, "shard": {**m["shard"], "index": "x"}}, "its shard record needs index, a whole number, not 'x'"),
    (lambda m: {**m, "shard": {**m["shard"], "index": 2}}, "its shard record says shard 2 of 2"),
    (lambda m: {**m, "shard": {**m["shard"], "positions": [7]}},
     "its shard record needs positions, a list of input rows (0 to 1)"),
    (lambda m: {**m, "shard": "1/2"}, "its shard record is str, not an object"),
    (lambda m: [m], "holds list, not a run's manifest (a JSON object)"),
], ids=["index text", "index beyond count", "positions outside the input", "shard a text", "a list"])
def test_merge_refuses_a_shard_manifest_of_the_wrong_shape(edit, problem, w, capsys):
    manifest = _shard(w, edit)
    code, _, err = _run(["merge", w["root"] / "shard0", w["root"] / "shard1", "--out", w["out"]], capsys)
    _refused(code, err, f"{manifest}{':' if problem.startswith('its') else ''} {problem}")
    assert not w["out"].exists()


@pytest.mark.parametrize("text, problem", [
    ("{not json", "is not valid JSON (line 1)"),
    ("[1, 2]", "holds a JSON list, not a run's manifest (an object)"),
    (b"\xff\xfe{", "is not UTF-8 text"),
])
def test_report_says_when_the_manifest_cannot_be_read(text, problem, w, capsys, caplog):
    import logging

    path = w["run"] / "manifest.json"
    path.write_bytes(text) if isinstance(text, bytes) else path.write_text(text)
    with caplog.at_level(logging.WARNING, logger="caprecon"):
        code, _, err = _run(["report", w["run"]], capsys)
    assert code == 0 and (w["run"] / "report.html").is_file(), err  # the page is still made from the scores
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warned == [f"{path} {problem}: the report shows none of the run's settings"]


@pytest.mark.parametrize("text, message", [
    ("datasets: [5]\n", "a suite file's datasets are names or entries (mappings), not int 5"),
    ("datasets: [[mme]]\n", "a suite file's datasets are names or entries (mappings), not list ['mme']"),
])
def test_a_suite_file_entry_of_the_wrong_type_is_refused(text, message, w, capsys):
    suite = w["root"] / "suite.yaml"
    suite.write_text(text)
    code, _, err = _run(["suite", "--suite", suite, "--captions", f"pub={w['rows']}"], capsys)
    _refused(code, err, message)


# --------------------------------------------------------------------------- no rows


def test_reward_audit_of_an_empty_input_says_so(w, capsys):
    empty = w["root"] / "empty.jsonl"
    empty.write_text("")
    code, out, err = _run(["reward-audit", "-i", empty, "-m", "recon", *WORLD, "--cache-dir", w["root"] / "c"],
                          capsys)
    _refused(code, err, "nothing to audit: the input holds no rows")
    assert "Spearman" not in out  # no table of figures over nothing
