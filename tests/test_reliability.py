"""Runs that say how they went: per-metric summaries, JSON numbers, checked options, row
errors versus run errors, interruption and resumption, paths confined to a folder."""

import json
from typing import Any

import numpy as np
import pytest
from PIL import Image

import caprecon
from caprecon.cli.commands import build_parser, main
from caprecon.run.config import RunConfig
from caprecon.core.errors import ConfigError
from caprecon.metrics import Metric
from caprecon.run.failures import RunError
from caprecon.data.loaders import load_samples
from caprecon.data.images import open_image
from caprecon.data.samples import Sample, SampleError


def pictures(folder, n=3, rows_extra=None):
    rng = np.random.default_rng(7)
    rows = []
    for i in range(n):
        Image.fromarray(rng.integers(0, 255, (24, 32, 3), dtype=np.uint8)).save(folder / f"p{i}.png")
        rows.append({"id": f"r{i}", "image": f"p{i}.png", "caption": f"picture number {i}"})
    return rows


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


class Recorded(Metric):
    """A metric whose behaviour each test sets: it records the batch sizes it was called with."""

    name = "fake"

    def __init__(self, name="fake", fail=lambda items: None, value=lambda item: 0.5):
        self.name, self.fail, self.value = name, fail, value
        self.calls: list[int] = []

    def score(self, items, ctx):
        self.calls.append(len(items))
        self.fail(items)
        return [{self.name: self.value(it)} for it in items]


def fail_on(word, exc=ValueError):
    def fail(items):
        bad = [it.id for it in items if word in it.caption]
        if bad:
            raise exc(f"cannot score {bad[0]}")
    return fail


# --------------------------------------------------------------------------- item 1: per-metric summaries


def test_each_metric_summary_counts_exactly_the_rows_it_scored(tmp_path):
    rows = pictures(tmp_path, 4)
    rows[1]["caption"] = "picture bad one"
    a = Recorded("a", value=lambda it: float(it.id[1]))  # r0..r3 -> 0, 1, 2, 3
    b = Recorded("b", fail=fail_on("bad"), value=lambda it: 10.0)
    results = caprecon.score(write_jsonl(tmp_path / "in.jsonl", rows), metrics=[a, b], out=tmp_path / "run")
    summary = results.summary
    # a row that failed b still counts for a: mean of 0, 1, 2, 3
    assert summary["metrics"]["a"] == {"mean": 1.5, "std": pytest.approx(np.std([0, 1, 2, 3])), "n": 4}
    assert summary["metrics"]["b"]["n"] == 3 and summary["metrics"]["b"]["mean"] == 10.0
    assert summary["errors"] == 1 and summary["failed_by_reason"] == {"b: ValueError": 1}
    failed = results.records[1]
    assert failed["a"] == 1.0 and "b" not in failed and failed["error"].startswith("b: cannot score r1 (an unexpected ValueError")
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["metrics"]["a"]["n"] == 4


# --------------------------------------------------------------------------- item 2: JSON numbers


def _numbers_round_trip(record: dict[str, Any], fields):
    for name in fields:
        value = record[name]
        assert isinstance(value, (int, float)) and not isinstance(value, bool), (name, value)


def test_numpy_scalars_are_written_as_json_numbers(tmp_path):
    numpy_metric = Recorded("np", value=lambda it: np.float32(0.25))
    arrays = Recorded("arr")
    arrays.score = lambda items, ctx: [{"arr": np.float64(1.5), "arr_n": np.int64(3), "arr_v": np.arange(2)}
                                       for _ in items]
    results = caprecon.score(write_jsonl(tmp_path / "in.jsonl", pictures(tmp_path)), metrics=[numpy_metric, arrays],
                             out=tmp_path / "run")
    for line in (tmp_path / "run" / "scores.jsonl").read_text().splitlines():
        row = json.loads(line)
        assert row["np"] == 0.25 and row["arr"] == 1.5 and row["arr_n"] == 3 and row["arr_v"] == [0, 1]
    assert results.summary["metrics"]["np"] == {"mean": 0.25, "std": 0.0, "n": 3}


def test_a_nan_score_is_that_rows_error(tmp_path):
    odd = Recorded("odd", value=lambda it: float("nan") if it.id == "r1" else 0.5)
    results = caprecon.score(write_jsonl(tmp_path / "in.jsonl", pictures(tmp_path)), metrics=[odd],
                             out=tmp_path / "run")
    assert results.summary["metrics"]["odd"]["n"] == 2
    assert "nan" in results.records[1]["error"] and "odd" not in results.records[1]
    json.loads((tmp_path / "run" / "summary.json").read_text())  # strict JSON: no NaN token anywhere


@pytest.fixture(scope="module")
def tiny_judges(tmp_path_factory):
    from tiny_vlm import build_qwen2_lm, build_qwen2_vl

    from caprecon.models.llm import TransformersLLM
    from caprecon.models.vlm_transformers import TransformersVLM

    root = tmp_path_factory.mktemp("judges")
    return (TransformersVLM(build_qwen2_vl(root / "vl"), max_new_tokens=6),
            TransformersLLM(build_qwen2_lm(root / "lm"), max_new_tokens=6))


def test_every_metric_writes_json_numbers(tmp_path, tiny_clip, tiny_dinov2, tiny_judges):
    from oracle import OracleGenerator, render

    from caprecon.metrics import METRICS
    from caprecon.metrics.captionqa import CaptionQA
    from caprecon.metrics.clipscore import ClipS, ClipScore, RefClipScore
    from caprecon.metrics.fleur import Fleur
    from caprecon.metrics.halluc import Hallucination
    from caprecon.metrics.recon import ClipImageScore, ReconScore
    from caprecon.metrics.turing import CaptionTuringTest
    from caprecon.metrics.vqascore import VQAScore
    from caprecon.models.embedder import HFVisionEmbedder
    from caprecon.models.matcher import ClipMatcher
    from caprecon.data.qa import load_qa_bank
    from caprecon.reconstruct.reconstructor import ReconstructionSpec

    judge, llm = tiny_judges
    render("a red circle and a blue square", 48, 48).save(tmp_path / "shapes.png")
    bank = write_jsonl(tmp_path / "bank.jsonl", [
        {"image_id": "shapes", "question": "Is there a square?", "category": "objects", "type": "yesno",
         "answer": "yes"},
        {"image_id": "shapes", "question": "Which colour is the circle?", "category": "colour", "type": "mc",
         "choices": ["red", "blue"], "answer": "A"}])
    samples = [Sample(id="s0", image=tmp_path / "shapes.png", caption="a red circle and a blue square",
                      image_id="shapes", refs=["a red circle beside a blue square"])]
    spec = ReconstructionSpec(max_side=48)
    oracle = OracleGenerator()
    metrics = [ReconScore(oracle, HFVisionEmbedder(tiny_dinov2), spec),
               ClipImageScore(oracle, HFVisionEmbedder(tiny_clip), spec),
               CaptionTuringTest(oracle, judge, load_qa_bank(bank), spec),
               VQAScore(judge, on="both", generator=oracle, spec=spec), CaptionQA(llm, load_qa_bank(bank)),
               Fleur(judge), ClipScore(ClipMatcher(tiny_clip)), RefClipScore(ClipMatcher(tiny_clip)),
               ClipS(ClipMatcher(tiny_clip))]
    # halluc's claims come from a scripted splitter: a random tiny LLM writes no claim list to check
    from halluc_fakes import ClaimLLM

    metrics += [Hallucination(judge, ClaimLLM(), generator=oracle, spec=spec, report=report)
                for report in ("precision", "coverage", "f")]
    from caprecon.metrics.claim_check import ClaimCheck

    metrics.append(ClaimCheck(judge, ClaimLLM(), generator=oracle, spec=spec))
    # a new metric must join this test; the reference metrics (Java) have theirs in test_open_metrics
    from caprecon.metrics.reference import REFERENCE_METRICS

    assert {m.name for m in metrics} == set(METRICS) - set(REFERENCE_METRICS)
    results = caprecon.score(samples, metrics=metrics, out=tmp_path / "run", cache_dir=str(tmp_path / "cache"))
    written = json.loads((tmp_path / "run" / "scores.jsonl").read_text())
    assert not written.get("error"), written.get("error")
    for metric in metrics:
        assert metric.headline in written, metric.name
        numeric = [k for k, v in results.records[0].items() if k.startswith(metric.name.split("-")[0]) and
                   not isinstance(v, (str, list, dict, type(None)))]
        _numbers_round_trip(written, numeric)
        # a random tiny judge may write no parseable rating: FLEUR then leaves the row out of its n
        unrated = metric.name == "fleur" and written.get("fleur") is None and written.get("fleur_unparsed")
        # ... and may find none of the caption's claims on the photo: conveyed (a share of those) is then undefined
        unrated = unrated or (metric.name == "claims" and written.get("claims_conveyed") is None
                              and written.get("claims_precision") == 0.0)
        assert results.summary["metrics"][metric.headline]["n"] == (0 if unrated else 1), metric.name
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert all(s["n"] == 1 and isinstance(s["mean"], float) for name, s in summary["metrics"].items()
               if not (name == "fleur" and written.get("fleur") is None)
               and not (name == "claims_conveyed" and written.get("claims_conveyed") is None))
    assert summary["metrics"]["fleur"]["n"] == (0 if written.get("fleur") is None else 1)


# --------------------------------------------------------------------------- item 3: numeric options


@pytest.mark.parametrize("argv", [["--batch-size", "0"], ["--batch-size", "-2"], ["--max-side", "8"],
                                  ["--seed", "-1"], ["--seed", "1.5"], ["--batch-size", "many"]])
def test_bad_numeric_options_are_refused(argv, tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        main(["score", "-i", "in.jsonl", *argv])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {argv[0]}: must be" in err


@pytest.mark.parametrize("setting", [{"batch_size": 0}, {"batch_size": -1}, {"batch_size": "16"},
                                     {"max_side": 0}, {"seed": -5}, {"upscale": "no"}, {"vqa_on": "video"}])
def test_settings_from_files_and_python_are_checked_too(setting):
    with pytest.raises(ConfigError) as err:
        RunConfig.build(**setting)
    assert next(iter(setting)).split("_")[0] in str(err.value)


def test_meta_bootstrap_must_not_be_negative(capsys):
    with pytest.raises(SystemExit):
        main(["meta", "--judgments", "j.jsonl", "--out", "x", "--bootstrap", "-5"])
    assert "--bootstrap" in capsys.readouterr().err


# --------------------------------------------------------------------------- item 4: encodings


def test_utf8_bom_keeps_the_id_column(tmp_path):
    pictures(tmp_path, 2)
    (tmp_path / "in.csv").write_text("id,image,caption\nfirst,p0.png,a cat\nsecond,p1.png,a dog\n",
                                     encoding="utf-8-sig")
    assert [s.id for s in load_samples(tmp_path / "in.csv")] == ["first", "second"]


@pytest.mark.parametrize("encoding", ["utf-16", "utf-32"])
def test_a_bom_names_the_encoding(tmp_path, encoding):
    (tmp_path / "in.jsonl").write_text('{"id": "ä1", "image": "p.png", "caption": "ein Bär"}\n', encoding=encoding)
    [sample] = load_samples(tmp_path / "in.jsonl")
    assert (sample.id, sample.caption) == ("ä1", "ein Bär")


def test_text_that_is_not_utf8_is_refused_naming_the_line(tmp_path, capsys):
    (tmp_path / "in.csv").write_bytes("id,image,caption\nx,p.png,ok\ny,p.png,caf\xe9\n".encode("latin-1"))
    assert main(["score", "-i", str(tmp_path / "in.csv"), "--clip", "x", "-m", "clipscore"]) == 2
    err = capsys.readouterr().err
    assert "not UTF-8" in err and "line 3" in err and "in.csv" in err and "Traceback" not in err


# --------------------------------------------------------------------------- item 5: image modes


def _opened(tmp_path, image, name="x.png", **save):
    image.save(tmp_path / name, **save)
    return np.asarray(open_image(Sample(id="x", image=tmp_path / name, caption="c")).image)


def test_sixteen_bit_png_is_scaled_not_clipped(tmp_path):
    levels = np.array([[0, 257 * 10, 257 * 128, 65535]], dtype=np.uint16)
    rgb = _opened(tmp_path, Image.fromarray(levels))
    assert rgb.shape == (1, 4, 3) and rgb[0, :, 0].tolist() == [0, 10, 128, 255]
    assert (rgb[..., 0] == rgb[..., 2]).all()


def test_deep_and_float_modes(tmp_path):
    ints = Image.fromarray(np.array([[0, 1000, 65535]], dtype=np.int32), "I")
    assert _opened(tmp_path, ints, "i.tif")[0, :, 0].tolist() == [0, round(1000 / 257), 255]
    floats = Image.fromarray(np.array([[0.0, 0.5, 1.0]], dtype=np.float32), "F")
    assert _opened(tmp_path, floats, "f.tif")[0, :, 1].tolist() == [0, 128, 255]


def test_transparency_is_laid_over_white(tmp_path):
    rgba = Image.new("RGBA", (2, 1), (0, 0, 0, 0))
    rgba.putpixel((1, 0), (255, 0, 0, 255))
    assert _opened(tmp_path, rgba).tolist() == [[[255, 255, 255], [255, 0, 0]]]
    la = Image.new("LA", (1, 1), (0, 0))
    assert _opened(tmp_path, la, "la.png").tolist() == [[[255, 255, 255]]]
    pal = Image.new("P", (2, 1))
    pal.putpalette([0, 0, 0, 0, 0, 255] + [0] * 762)
    pal.putpixel((1, 0), 1)
    assert _opened(tmp_path, pal, "p.png", transparency=0).tolist() == [[[255, 255, 255], [0, 0, 255]]]


def test_cmyk_and_exif_rotation(tmp_path):
    cmyk = Image.new("CMYK", (1, 1), (0, 255, 255, 0))  # no black, full magenta and yellow: red
    assert _opened(tmp_path, cmyk, "c.jpg", quality=100)[0, 0].tolist()[0] > 240
    wide = Image.new("RGB", (4, 2), (0, 128, 0))
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90 clockwise to display"
    assert _opened(tmp_path, wide, "r.jpg", exif=exif).shape[:2] == (4, 2)


def test_an_undecodable_embedded_image_is_a_row_error(tmp_path):
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa

    import io
    good = io.BytesIO()
    Image.new("RGB", (8, 8), (9, 9, 9)).save(good, format="PNG")
    table = pa.table({"id": ["ok", "broken"], "caption": ["grey", "grey"],
                      "image": [{"bytes": good.getvalue(), "path": None},
                                {"bytes": good.getvalue()[:40], "path": None}]})
    pq.write_table(table, tmp_path / "in.parquet")
    samples = load_samples(tmp_path / "in.parquet")  # loading never decodes
    assert open_image(samples[0]).image.size == (8, 8)
    with pytest.raises(SampleError) as err:
        open_image(samples[1])
    assert err.value.reason == "image not decodable"


# --------------------------------------------------------------------------- item 6: captions that are not text


def test_a_list_caption_is_a_row_error(tmp_path):
    rows = pictures(tmp_path)
    rows[0]["caption"] = ["a", "cat"]
    rows[2]["caption"] = 42
    results = caprecon.score(write_jsonl(tmp_path / "in.jsonl", rows), metrics=[Recorded()])
    assert "caption is a list" in results.records[0]["error"] and "caption is a int" in results.records[2]["error"]
    assert results.records[1]["fake"] == 0.5
    assert results.summary["failed_by_reason"] == {"caption not text": 2}


# --------------------------------------------------------------------------- issue 7 item 9: run errors


def test_the_same_error_on_every_row_of_a_batch_stops_the_run(tmp_path):
    broken = Recorded(fail=lambda items: (_ for _ in ()).throw(ValueError("weights are not a vision model")))
    with pytest.raises(RunError, match="every row of a batch.*not a vision model"):
        caprecon.score(write_jsonl(tmp_path / "in.jsonl", pictures(tmp_path)), metrics=[broken], batch_size=3)


def test_the_same_error_on_the_first_rows_one_by_one_stops_the_run(tmp_path):
    broken = Recorded(fail=lambda items: (_ for _ in ()).throw(KeyError("lm_head")))
    with pytest.raises(RunError, match="first 3 rows"):
        caprecon.score(write_jsonl(tmp_path / "in.jsonl", pictures(tmp_path, 5)), metrics=[broken], batch_size=1)
    assert broken.calls == [1, 1, 1]


def test_an_unsupported_operation_stops_the_run(tmp_path):
    unsupported = Recorded(fail=lambda items: (_ for _ in ()).throw(NotImplementedError("no logprobs here")))
    with pytest.raises(RunError, match="the model does not support this: no logprobs"):
        caprecon.score(write_jsonl(tmp_path / "in.jsonl", pictures(tmp_path)), metrics=[unsupported])
    assert unsupported.calls == [3]  # stopped at once, not retried row by row


def _torch_oom(message):
    import torch

    return torch.OutOfMemoryError(message)  # what CUDA raises; constructible without a GPU


@pytest.mark.parametrize("error", [RuntimeError, _torch_oom])
def test_out_of_memory_halves_the_batch_and_keeps_it_halved(tmp_path, error):
    def oom(items):
        if len(items) > 2:
            raise error("CUDA out of memory. Tried to allocate 2.00 GiB")

    hungry = Recorded(fail=oom)
    results = caprecon.score(write_jsonl(tmp_path / "in.jsonl", pictures(tmp_path, 10)), metrics=[hungry],
                             batch_size=8)
    assert results.summary["metrics"]["fake"]["n"] == 10 and results.summary["errors"] == 0
    # 8 fails, 4 fails, then 2s; the last batch of 2 starts at the smaller size
    assert hungry.calls == [8, 4, 2, 2, 2, 2, 2]


@pytest.mark.parametrize("error", [RuntimeError, _torch_oom])
def test_the_separate_stages_halve_the_batch_on_out_of_memory_too(tmp_path, error):
    """`caprecon judge` (and reconstruct, embed) as a scoring run: 8 fails, 4 fails, then 2s for
    the rest of the stage; a model that cannot take one row stops the stage with advice."""
    from caprecon.data.loaders import load_samples
    from caprecon.metrics import Context
    from caprecon.run.stages import judge_all
    from caprecon.store.index import Store

    def oom(items):
        if len(items) > 2:
            raise error("CUDA out of memory. Tried to allocate 2.00 GiB")

    hungry = Recorded(fail=oom)
    hungry.judge = "a judge"  # what makes the judge stage take a metric
    samples = load_samples(write_jsonl(tmp_path / "in.jsonl", pictures(tmp_path, 10)))
    counts = judge_all(samples, [hungry], Context(Store.temporary()), batch_size=8, progress=False)
    assert counts["failed"] == 0 and "failed_by_reason" not in counts
    assert hungry.calls == [8, 4, 2, 2, 2, 2, 2]
    full = Recorded(fail=lambda items: (_ for _ in ()).throw(error("CUDA out of memory")))
    full.judge = "a judge"
    with pytest.raises(RunError, match="fake: out of memory on a single row"):
        judge_all(samples, [full], Context(Store.temporary()), batch_size=1, progress=False)


def test_out_of_memory_on_a_row_tried_alone_stops_at_once(tmp_path):
    """A batch that failed otherwise is tried row by row; the first row out of memory stops the
    run there, and the batch is not halved and tried again."""
    def fail(items):
        if len(items) > 1:
            raise ValueError("a batch-level bug")
        raise RuntimeError("CUDA out of memory")

    hungry = Recorded(fail=fail)
    with pytest.raises(RunError, match="out of memory on a single row"):
        caprecon.score(write_jsonl(tmp_path / "in.jsonl", pictures(tmp_path, 4)), metrics=[hungry], batch_size=4)
    assert hungry.calls == [4, 1]


def test_a_fatal_error_on_a_row_tried_alone_stops_with_its_own_message(tmp_path):
    """After a batch failed, a row alone meeting an error no row can cause (here: an operation
    the model does not support) stops the run with that error, not as out of memory."""
    def fail(items):
        if len(items) > 1:
            raise ValueError("a batch-level bug")
        raise NotImplementedError("no logprobs here")

    picky = Recorded(fail=fail)
    with pytest.raises(RunError, match=r"^fake: the model does not support this: no logprobs here; choose a backend"):
        caprecon.score(write_jsonl(tmp_path / "in.jsonl", pictures(tmp_path, 4)), metrics=[picky], batch_size=4)
    assert picky.calls == [4, 1]


def test_out_of_memory_on_one_row_stops_the_run(tmp_path):
    hungry = Recorded(fail=lambda items: (_ for _ in ()).throw(RuntimeError("MPS backend out of memory")))
    with pytest.raises(RunError, match="out of memory on a single row"):
        caprecon.score(write_jsonl(tmp_path / "in.jsonl", pictures(tmp_path)), metrics=[hungry], batch_size=1)


def test_a_run_stopped_part_way_keeps_and_sums_up_what_finished(tmp_path):
    def server_gone(items):
        if len(flaky.calls) > 1:
            raise ConnectionError("judge server refused the connection")

    flaky = Recorded(fail=server_gone)
    data = write_jsonl(tmp_path / "in.jsonl", pictures(tmp_path, 4))
    with pytest.raises(RunError, match="refused") as stop:
        caprecon.score(data, metrics=[flaky], batch_size=2, out=tmp_path / "run")
    assert [r["id"] for r in stop.value.records] == ["r0", "r1"]
    assert json.loads((tmp_path / "run" / "manifest.json").read_text())["status"] == "stopped"
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["metrics"]["fake"]["n"] == 2
    healthy = Recorded()
    results = caprecon.score(data, metrics=[healthy], batch_size=2, out=tmp_path / "run")
    assert healthy.calls == [2] and results.manifest["resumed_rows"] == 2  # only r2, r3 were scored again


def test_row_errors_stay_row_errors(tmp_path):
    rows = pictures(tmp_path, 4)
    rows[2]["caption"] = "a bad picture"
    picky = Recorded(fail=fail_on("bad"))
    results = caprecon.score(write_jsonl(tmp_path / "in.jsonl", rows), metrics=[picky], batch_size=4)
    assert [("error" in r) for r in results.records] == [False, False, True, False]
    assert picky.calls == [4, 1, 1, 1, 1]


# --------------------------------------------------------------------------- items 11, 12: interruption, outcome


def clipscore_args(tmp_path, tiny_clip, rows, *extra):
    path = write_jsonl(tmp_path / "in.jsonl", rows)
    return ["score", "-i", str(path), "-m", "clipscore", "--clip", str(tiny_clip),
            "--cache-dir", str(tmp_path / "cache"), "--out", str(tmp_path / "run"), "-q", *extra]


def test_ctrl_c_ends_with_one_line_a_summary_and_a_resumable_folder(tmp_path, tiny_clip, capsys, monkeypatch):
    from caprecon.metrics.clipscore import ClipScore

    real = ClipScore.score
    calls = []

    def interrupted_on_the_second_batch(self, items, ctx):
        calls.append(len(items))
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(self, items, ctx)

    monkeypatch.setattr(ClipScore, "score", interrupted_on_the_second_batch)
    args = clipscore_args(tmp_path, tiny_clip, pictures(tmp_path, 3), "--batch-size", "1")
    assert main(args) == 130
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1
    assert "1 of 3 rows" in err and "run the same command again to resume" in err
    run = tmp_path / "run"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["complete"] is False and summary["metrics"]["clipscore"]["n"] == 1
    assert json.loads((run / "manifest.json").read_text())["status"] == "interrupted"

    monkeypatch.setattr(ClipScore, "score", real)
    assert main(args) == 0
    ids = [json.loads(line)["id"] for line in (run / "scores.jsonl").read_text().splitlines()]
    assert ids == ["r0", "r1", "r2"]
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["status"] == "complete" and manifest["resumed_rows"] == 1


def test_a_resumed_run_scores_again_the_rows_whose_input_changed(tmp_path):
    rows = pictures(tmp_path, 3)
    data = write_jsonl(tmp_path / "in.jsonl", rows)
    first = Recorded(value=lambda it: len(it.caption))
    caprecon.score(data, metrics=[first], out=tmp_path / "run")
    manifest = tmp_path / "run" / "manifest.json"
    manifest.write_text(json.dumps({**json.loads(manifest.read_text()), "status": "interrupted"}))
    rows[1]["caption"] = "an entirely different caption"
    write_jsonl(data, rows)
    again = Recorded(value=lambda it: len(it.caption))
    results = caprecon.score(data, metrics=[again], out=tmp_path / "run")
    assert again.calls == [1] and results.manifest["resumed_rows"] == 2
    assert results.records[1]["fake"] == len("an entirely different caption")


def test_a_folder_of_other_settings_is_not_resumed_into(tmp_path, tiny_clip, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "scores.jsonl").write_text('{"id": "r0", "clipscore": 0.1}\n')
    (run / "manifest.json").write_text(json.dumps({"status": "interrupted", "config": {"seed": 7}}))
    assert main(clipscore_args(tmp_path, tiny_clip, pictures(tmp_path))) == 2
    assert "other settings" in capsys.readouterr().err


def test_stdout_ends_with_the_outcome_and_the_exit_status_follows_it(tmp_path, tiny_clip, capsys):
    rows = pictures(tmp_path, 3)
    rows[1]["image"] = "missing.png"
    rows[2]["caption"] = " "
    args = clipscore_args(tmp_path, tiny_clip, rows)
    assert main(args) == 1
    out = capsys.readouterr().out.strip().splitlines()
    assert out[-4:] == ["rows scored: 1 of 3", "rows failed: 2 (empty caption: 1, image not found: 1)",
                        f"outputs: {tmp_path / 'run' / 'scores.jsonl'}", f"report: {tmp_path / 'run' / 'report.html'}"]
    assert main([*args, "--allow-row-errors"]) == 0
    assert main(clipscore_args(tmp_path, tiny_clip, [])) == 1
    assert "holds no rows" in capsys.readouterr().err


# --------------------------------------------------------------------------- item 14: paths


def test_relative_paths_resolve_against_the_samples_file(tmp_path, monkeypatch):
    data = tmp_path / "data"
    data.mkdir()
    write_jsonl(data / "in.jsonl", pictures(data, 2))
    monkeypatch.chdir(tmp_path)
    samples = load_samples("data/in.jsonl")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # a later working folder must not matter
    assert [open_image(s).image.size for s in samples] == [(32, 24), (32, 24)]


def test_a_datasets_folder_resolves_paths_against_itself(tmp_path, monkeypatch):
    datasets = pytest.importorskip("datasets")
    folder = tmp_path / "ds"
    folder.mkdir()
    pictures(folder, 1)
    monkeypatch.chdir(folder)  # written from inside the folder, so its rows name images relative to it
    ds = datasets.Dataset.from_dict(
        {"image": [{"path": "p0.png", "bytes": None}], "caption": ["one"]},
        features=datasets.Features({"image": datasets.Image(decode=False), "caption": datasets.Value("string")}))
    ds.cast_column("image", datasets.Image()).save_to_disk(str(folder))
    monkeypatch.chdir(tmp_path)
    [sample] = load_samples(folder)
    assert open_image(sample).image.size == (32, 24)


def test_image_root_confines_every_image(tmp_path):
    inside = tmp_path / "inside"
    inside.mkdir()
    rows = pictures(inside, 1)
    Image.new("RGB", (4, 4)).save(tmp_path / "secret.png")
    (inside / "link.png").symlink_to(tmp_path / "secret.png")
    rows += [{"id": "up", "image": "../secret.png", "caption": "c"},
             {"id": "abs", "image": str(tmp_path / "secret.png"), "caption": "c"},
             {"id": "link", "image": "link.png", "caption": "c"}]
    samples = load_samples(write_jsonl(inside / "in.jsonl", rows), images_root=inside)
    assert open_image(samples[0]).image.size == (32, 24)
    for sample in samples[1:]:
        with pytest.raises(SampleError) as err:
            open_image(sample)
        assert err.value.reason == "image outside --image-root"
    # without the option the same file scores every row
    assert all(open_image(s) for s in load_samples(inside / "in.jsonl"))


# --------------------------------------------------------------------------- item 16: help and README


def _parsers(parser):
    yield parser
    for action in parser._actions:
        for sub in getattr(action, "choices", None).values() if isinstance(action.choices, dict) else ():
            yield from _parsers(sub)


def test_every_option_has_help():
    missing = [(p.prog, a.option_strings) for p in _parsers(build_parser()) for a in p._actions
               if a.option_strings and not a.help]
    assert missing == []


# options the docs name that belong to another program, with the file that defines them there
OTHER_PROGRAMS = {
    "--local-dir": "huggingface_hub/cli/download.py",  # `hf download`
    "--repo-type": "huggingface_hub/cli/download.py",
    "--hidden": "benchmarks/halluc.py",
    "--tiny-pictures": "benchmarks/adaptive_seeds.py",
    "--replicates": "benchmarks/adaptive_seeds.py",
    "--tiny-replicates": "benchmarks/adaptive_seeds.py",
    "--tiny-seeds": "benchmarks/adaptive_seeds.py",
    "--steady-heap": "benchmarks/throughput.py",
    "--threads": "benchmarks/throughput.py",
    "--no-fork": "scripts/mutants.py",
    "--timeout": "scripts/mutants.py",
    "--list": "scripts/walk.py",
    "--strict": "mkdocs/__main__.py",  # `mkdocs build --strict`
    # the GRPO example's own flags (docs/train.md)
    **{flag: "examples/grpo_caption_reward.py" for flag in ("--policy", "--steps", "--generations",
                                                            "--completion-tokens", "--remote")},
}
PLACEHOLDERS = {"--option"}  # "every `--option`" in prose
# the servers' own flags in the docs' recipes (`vllm serve`, `python -m sglang.launch_server`),
# programs not installed here: each option is named beside the program's command
SERVER_RECIPES = {"--host", "--port", "--api-key", "--model-path", "--max-logprobs"}


def test_docs_name_only_options_that_exist():
    import re
    import sysconfig
    from pathlib import Path

    root = Path(__file__).parents[1]
    pages = [root / "README.md", *sorted((root / "docs").rglob("*.md"))]
    known = {s for p in _parsers(build_parser()) for a in p._actions for s in a.option_strings}
    named = {(option, page.relative_to(root).as_posix()) for page in pages
             for option in re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", page.read_text())}
    unknown = sorted((o, page) for o, page in named
                     if o not in known | OTHER_PROGRAMS.keys() | PLACEHOLDERS | SERVER_RECIPES)
    assert unknown == []
    # only on a line that runs a server, or in prose about one (`caprecon serve` has --host and --port of its own)
    for option in SERVER_RECIPES - known:
        lines = [line for page in pages for line in page.read_text().splitlines() if option in line]
        assert lines and all(re.search(r"vllm serve|sglang|server|^\s", line) for line in lines), (option, lines)
    # the exemptions stay true: each option is still the other program's
    site = Path(sysconfig.get_paths()["purelib"])
    for option, where in OTHER_PROGRAMS.items():
        source = root / where if where.startswith(("benchmarks/", "examples/", "scripts/")) else site / where
        assert option in source.read_text(), (option, where)


def test_global_options_work_after_the_subcommand_too():
    parser = build_parser()
    assert parser.parse_args(["score", "-i", "x", "--verbose"]).verbose is True
    assert parser.parse_args(["--verbose", "score", "-i", "x"]).verbose is True
    assert parser.parse_args(["score", "-i", "x"]).verbose is False
    assert parser.parse_args(["models", "-v", "--json"]).verbose is True
