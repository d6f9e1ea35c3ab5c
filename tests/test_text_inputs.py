"""Text that is not valid Unicode on the score path. A lone surrogate (half a UTF-16 pair, which a JSON
escape such as "\\ud800" lets into a Python string) in a caption, a reference or an image id makes that
row's error, naming the row, the field and the character; the text never reaches a model, every other
row is scored as it would be without it, and every file the run writes (scores.jsonl, summary, report,
manifest) holds it as an escape that reads back as the same string. Expected values: the error message
written out by hand, the oracle's ReconScore computed with numpy (`expected_recon`), CLIPScore of a run
that never saw the bad row."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
from PIL import Image

import caprecon
from caprecon.core.records import json_text, read_jsonl
from clirun import run_cli
from oracle import CountingOracle, PixelEmbedder, expected_recon, render

BROKEN = "a red \ud800 circle"  # the surrogate at character 6
BROKEN_ERROR = ("caption holds a lone surrogate ('\\ud800') at character 6, which is not text: "
                "the input's encoding is broken")


def test_json_text_escapes_a_lone_surrogate_and_reads_back_the_same_string():
    value = {"caption": BROKEN, "note": "naïve \udcff", "plain": "ascii"}
    text = json_text(value)
    assert text == '{"caption": "a red \\ud800 circle", "note": "naïve \\udcff", "plain": "ascii"}'
    assert json.loads(text.encode("utf-8").decode("utf-8")) == value
    assert json_text({"a": "雪 🙂"}) == '{"a": "雪 🙂"}'  # real characters stay themselves


def _write_rows(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def test_the_cli_makes_a_broken_caption_its_rows_error_and_scores_the_rest(tmp_path, tiny_clip, capsys):
    rng = np.random.default_rng(0)
    for name in ("a", "b", "c"):
        Image.fromarray(rng.integers(0, 255, (24, 32, 3), dtype=np.uint8)).save(tmp_path / f"{name}.png")
    good = [{"id": "a", "image": "a.png", "caption": "a cat on a mat"},
            # an id and a free field with a lone surrogate are no model's input: the row is scored, and kept as given
            {"id": "c-\udfff", "image": "c.png", "caption": "a dog in the snow", "note": "half \udc80"}]
    broken = {"id": "b", "image": "b.png", "caption": BROKEN}
    clip = ["-m", "clipscore", "--clip", str(tiny_clip), "--cache-dir", str(tmp_path / "cache"), "-q"]
    code, _, _ = run_cli(["score", "-i", _write_rows(tmp_path / "good.jsonl", good), *clip,
                          "--out", tmp_path / "without"], capsys)
    assert code == 0
    alone = [json.loads(line) for line in (tmp_path / "without" / "scores.jsonl").open(encoding="utf-8")]
    source = _write_rows(tmp_path / "in.jsonl", [good[0], broken, good[1]])
    for attempt in ("first", "resumed"):  # a second run into the folder resumes from what the first wrote
        code, out, err = run_cli(["score", "-i", source, *clip, "--out", tmp_path / "run"], capsys)
        assert code == 1 and "Traceback" not in err, err
        assert "rows failed: 1 (text not valid Unicode: 1)" in out, attempt
        text = (tmp_path / "run" / "scores.jsonl").read_bytes().decode("utf-8")  # strict UTF-8
        rows = [json.loads(line) for line in text.splitlines()]
        assert [row["clipscore"] for row in (rows[0], rows[2])] == [row["clipscore"] for row in alone], attempt
        assert rows[1]["error"] == f"row 1 (id b): {BROKEN_ERROR}" and "clipscore" not in rows[1]
        assert rows[1]["caption"] == BROKEN and rows[2]["id"] == "c-\udfff" and rows[2]["note"] == "half \udc80"
    run = tmp_path / "run"
    assert json.loads((run / "summary.json").read_bytes().decode("utf-8"))["failed_by_reason"] == \
        {"text not valid Unicode": 1}
    json.loads((run / "manifest.json").read_bytes().decode("utf-8"))
    page = (run / "report.html").read_bytes().decode("utf-8")
    assert "a red \\ud800 circle" in page  # the escape, where no character can stand
    assert [record["caption"] for _, record in read_jsonl(run / "scores.jsonl", keep_surrogates=True)][1] == BROKEN
    code, _, err = run_cli(["report", run], capsys)  # the report reads the run back
    assert code == 0 and "Traceback" not in err


@pytest.mark.parametrize("field, value, message", [
    ("caption", BROKEN, BROKEN_ERROR),
    ("refs", ["fine", "half \udfff"], "reference 1 holds a lone surrogate ('\\udfff') at character 5"),
    ("image_id", "pic-\ud800", "image_id holds a lone surrogate ('\\ud800') at character 4"),
])
def test_the_python_api_keeps_broken_text_from_every_model(tmp_path, field, value, message):
    picture = render("red circle", 48, 48)
    picture.save(tmp_path / "pic.png")
    rows = [{"id": "a", "image": str(tmp_path / "pic.png"), "caption": "red circle"},
            {"id": "b", "image": str(tmp_path / "pic.png"), "caption": "blue square"},
            {"id": "c", "image": str(tmp_path / "pic.png"), "caption": "green triangle"}]
    rows[1][field] = value
    generator = CountingOracle()
    results = caprecon.score(rows, metrics=["recon"], generator=generator, embedder=PixelEmbedder(), max_side=48,
                             cache_dir=str(tmp_path / "cache"), out=str(tmp_path / "run"), progress=False)
    got = {row["id"]: row for row in results.records}
    assert got["a"]["recon"] == pytest.approx(expected_recon(picture, "red circle"), abs=1e-6)
    assert got["c"]["recon"] == pytest.approx(expected_recon(picture, "green triangle"), abs=1e-6)
    assert got["b"]["error"].startswith(f"row 1 (id b): {message}") and "recon" not in got["b"]
    assert generator.prompts == ["red circle", "green triangle"]  # the broken row reached no model
    written = [json.loads(line) for line in (tmp_path / "run" / "scores.jsonl").read_bytes().decode("utf-8")
               .splitlines()]
    assert written[1] == got["b"]  # the file holds the row as it was, whichever field was broken


def test_the_cascade_decides_every_other_row_and_names_the_broken_one(tmp_path):
    """`caprecon cascade` scores through the same path: the broken row is its error for the cheap signal
    and the full metric alike, reaches neither, and every other row's decision is the full metric's."""
    from noisy_standin import NoisyGenerator, NoisyScore

    from caprecon.apps.cascade import cascade
    from caprecon.metrics.base import Metric

    class Fixed(Metric):
        name = primary = "cheap"
        needs_source_image = False

        def __init__(self, values):
            self.values, self.seen = values, []

        def score(self, items, ctx):
            self.seen += [item.caption for item in items]
            return [{"cheap": self.values[item.caption]} for item in items]

    cheap_values = {f"img{k}/caption {k}": k / 20 for k in range(20)}  # 0.00, 0.05, ..., 0.95
    full = {caption: value + 0.01 for caption, value in cheap_values.items()}
    generator = NoisyGenerator({caption: (value, 0.0) for caption, value in full.items()})
    rows = [{"id": f"r{k}", "caption": caption, "image_id": caption.split("/")[0]}
            for k, caption in enumerate(cheap_values)]
    rows.insert(3, {"id": "broken", "caption": BROKEN, "image_id": "img-broken"})
    cheap = Fixed(cheap_values)
    result = cascade(rows, cheap=cheap, metric=NoisyScore(generator), decision="threshold:0.5", budget=1.0,
                     cache_dir=str(tmp_path / "cache"))
    by_id = {record["id"]: record for record in result.records}
    assert by_id["broken"]["error"] == f"row 3 (id broken): {BROKEN_ERROR}"
    assert by_id["broken"].get("keep") is None and BROKEN not in cheap.seen
    assert all(by_id[row["id"]]["keep"] == (full[row["caption"]] >= 0.5) for row in rows if row["id"] != "broken")


def test_a_lone_surrogate_is_printed_as_its_escape():
    from caprecon.core.tables import format_table, terminal_safe

    assert terminal_safe(BROKEN) == "a red \\ud800 circle"
    assert format_table([["caption"], [BROKEN]]).encode("utf-8").decode("utf-8").splitlines()[-1].strip() == \
        "a red \\ud800 circle"


def test_parquet_exports_hold_a_lone_surrogate_as_its_escape(tmp_path):
    pq = pytest.importorskip("pyarrow.parquet")
    from caprecon.run.captioning import export_parquet

    path = export_parquet([{"caption": BROKEN, "rounds": [{"caption": "half \udfff"}], "score": 0.5}],
                          tmp_path / "selected.parquet")
    assert pq.read_table(path).to_pylist() == [{"caption": "a red \\ud800 circle",
                                                "rounds": [{"caption": "half \\udfff"}], "score": 0.5}]


class _ScriptedCaptioner:
    """A captioner stand-in that answers every image with the same candidates, one of them broken (as a
    server's JSON reply with a lone "\\ud800" escape would be)."""

    fingerprint = "scripted-captioner-v1"

    def __init__(self, candidates):
        self.candidates = candidates

    def caption(self, requests, sampling):
        return [list(self.candidates[: request.n]) for request in requests]


def test_best_of_n_never_selects_or_reconstructs_a_broken_candidate(tmp_path):
    from caprecon.apps.selection import best_of_n

    images = tmp_path / "images"
    images.mkdir()
    picture = render("red circle", 48, 48)
    picture.save(images / "pic.png")
    generator = CountingOracle()
    candidates = ["green triangle", BROKEN, "red circle"]
    run = best_of_n(images, captioner=_ScriptedCaptioner(candidates), n=3, temperature=1.0, generator=generator,
                    embedder=PixelEmbedder(), max_side=48, cache_dir=str(tmp_path / "cache"), out=tmp_path / "out")
    assert [row["caption"] for row in run.selected] == ["red circle"]
    assert run.selected[0]["score"] == pytest.approx(expected_recon(picture, "red circle"), abs=1e-6)
    assert not any("\ud800" in prompt for prompt in generator.prompts)
    written = [json.loads(line) for line in (tmp_path / "out" / "candidates.jsonl").read_bytes().decode("utf-8")
               .splitlines()]
    assert [row["caption"] for row in written] == candidates
    assert written[1]["error"].endswith(BROKEN_ERROR) and not written[1]["selected"]


def test_t2i_scores_every_caption_of_a_set_but_the_broken_one(tmp_path):
    from caprecon.apps.t2i import t2i

    class QuarterJudge:
        """P('Yes') = 0.25 for every image."""

        fingerprint = "quarter-judge"

        def option_probs(self, requests, options):
            return [[0.25] * len(o) for o in options]

    captions = _write_rows(tmp_path / "set.jsonl", [{"id": "a", "caption": "red circle"},
                                                    {"id": "b", "caption": BROKEN},
                                                    {"id": "c", "caption": "green triangle"}])
    generator = CountingOracle()
    run = t2i(captions, {"oracle": generator}, {"quarter": QuarterJudge()}, size="48x48",
              cache_dir=str(tmp_path / "cache"), out=tmp_path / "out", n_bootstrap=10)
    rows = {row["id"]: row for row in run.records}
    assert rows["a"]["vqa/quarter"] == rows["c"]["vqa/quarter"] == 0.25
    assert rows["b"]["error"] == f"row 1 (id b): {BROKEN_ERROR}" and "vqa/quarter" not in rows["b"]
    assert generator.prompts == ["red circle", "green triangle"]  # the broken caption reached no generator


@pytest.mark.parametrize("parts, message", [
    ({"caption": BROKEN, "seed": 3}, BROKEN_ERROR),
    ({"request": {"messages": ["fine", "half \udcff"]}},
     "request.messages[1] holds a lone surrogate ('\\udcff') at character 5, which is not text: "
     "the input's encoding is broken"),
    ({"sampling": {"t\udc80": 1.0}},
     "the name of a field of sampling holds a lone surrogate ('\\udc80') at character 1, which is not text: "
     "the input's encoding is broken"),
    ({"refs": ("fine", "\ud83d")},
     "refs[1] holds a lone surrogate ('\\ud83d') at character 0, which is not text: the input's encoding is broken"),
])
def test_a_content_key_of_broken_text_names_the_field(parts, message):
    """A caller that hands a lone surrogate straight to the store's key gets a ValueError naming the
    field (nested fields by their path), never a bare UnicodeEncodeError; a valid text keys as the
    sha256 of its JSON, as before."""
    from caprecon.store.index import content_key

    with pytest.raises(ValueError) as raised:
        content_key("reconstruction", **parts)
    assert str(raised.value) == f"cannot key a 'reconstruction' result: {message}"
    assert content_key("k", caption="naïve", seed=3) == hashlib.sha256(
        '{"caption": "naïve", "kind": "k", "seed": 3}'.encode("utf-8")).hexdigest()


def test_a_metric_called_with_a_broken_caption_names_it_and_calls_no_model():
    """A row built by hand (not read through `read_image`, which refuses it first) reaches the metric
    with its lone surrogate: the metric's key names the caption, and the generator draws nothing."""
    from caprecon.data.images import LoadedSample
    from caprecon.data.samples import Sample
    from caprecon.metrics import Context
    from caprecon.metrics.recon import ReconScore
    from caprecon.store.index import Store

    generator = CountingOracle()
    picture = render("red circle", 48, 48)
    item = LoadedSample(Sample("r", picture, BROKEN), picture, "0" * 64)
    with pytest.raises(ValueError) as raised:
        ReconScore(generator, PixelEmbedder()).score([item], Context(Store.temporary()))
    assert str(raised.value) == f"cannot key a 'reconstruction' result: {BROKEN_ERROR}"
    assert generator.prompts == []
