"""Box answers in each judge's own convention, and a judge per question category."""

import json

import pytest

from caprecon.metrics import Context
from caprecon.metrics.turing import CaptionTuringTest
from caprecon.models import registry
from caprecon.models.openai_compat import OpenAICompatVLM
from caprecon.data.qa import QAItem
from caprecon.data.images import open_image
from caprecon.data.samples import Sample
from oracle import OracleGenerator, render

# the answer box as fractions of the image; in 0-1000 it is (100, 100, 400, 300), which fits
# inside a 500x375 image and so reads as pixels when the convention is guessed
TRUE = (0.1, 0.1, 0.4, 0.3)
BANK = {"shapes": [
    QAItem("shapes", "Where is the circle?", "box", TRUE, category="grounding", id="q-box", coords="normalized"),
    QAItem("shapes", "Is there a circle?", "yesno", "yes", category="perception", id="q-yes"),
]}


def qwen25_frame(size, max_pixels=200 * 150):
    """Qwen2.5-VL's resize (transformers' own smart_resize) with a small pixel budget."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

    height, width = smart_resize(size[1], size[0], factor=28, min_pixels=28 * 28, max_pixels=max_pixels)
    return width, height


class BoxJudge:
    """Answers every box question perfectly in its own convention, and "yes" otherwise."""

    def __init__(self, box_coords=None, name="box-judge", answer_in=None):
        self.box_coords = box_coords
        self.answer_in = answer_in or box_coords  # the convention it really answers in
        self.name = name
        self.prompts = []

    @property
    def fingerprint(self):
        return f"{self.name}-{self.answer_in}"

    def box_frame(self, size):
        return qwen25_frame(size)

    def generate(self, requests, max_new_tokens=64):
        out = []
        for r in requests:
            self.prompts.append(r.prompt)
            if "Where" not in r.prompt:
                out.append("yes")
                continue
            width, height = r.image.size
            scale = {"normalized": (1, 1), "1000": (1000, 1000), "pixel": self.box_frame((width, height)),
                     "image-pixel": (width, height)}[self.answer_in]
            x1, y1, x2, y2 = TRUE
            out.append(f"[{x1 * scale[0]:.2f}, {y1 * scale[1]:.2f}, {x2 * scale[0]:.2f}, {y2 * scale[1]:.2f}]")
        return out


@pytest.fixture
def wide(tmp_path):
    path = tmp_path / "wide.png"
    render("a red circle", 500, 375).save(path)
    return open_image(Sample(id="w", image=path, caption="a red circle", image_id="shapes"))


@pytest.mark.parametrize("coords", ["normalized", "1000", "pixel"])
def test_a_perfect_answer_scores_iou_one_in_every_convention(coords, wide):
    judge = BoxJudge(coords)
    metric = CaptionTuringTest(OracleGenerator(), judge, BANK, max_side=448)  # reconstruction 448x336
    row = metric.score([wide], Context())[0]
    assert row["turing_iou"] == pytest.approx(1.0) and row["turing_upper_iou"] == pytest.approx(1.0)
    assert row["turing/grounding"] == 1.0 and row["turing_upper/grounding"] == 1.0
    assert "turing_box_coords_guessed" not in row
    # the judge was told its own convention
    unit = {"normalized": "from 0 to 1", "1000": "0-1000", "pixel": "in pixels"}[coords]
    assert all(unit in p for p in judge.prompts if "Where" in p)


def test_the_pixel_frame_is_the_resized_image_not_the_original(wide):
    # a judge answering in pixels of the original image, while claiming Qwen2.5-VL's
    # convention, is wrong: the frame really is the processor's
    assert qwen25_frame(wide.image.size) != wide.image.size
    judge = BoxJudge("pixel", answer_in="image-pixel")
    row = CaptionTuringTest(OracleGenerator(), judge, BANK, max_side=448).score([wide], Context())[0]
    assert row["turing_upper_iou"] < 0.9


def test_an_unknown_convention_is_guessed_and_recorded(wide):
    judge = BoxJudge(None, answer_in="1000")
    metric = CaptionTuringTest(OracleGenerator(), judge, BANK, max_side=448)
    row = metric.score([wide], Context())[0]
    assert row["turing_box_coords_guessed"] == 1 and row["turing_upper_box_coords_guessed"] == 1
    # (100, 100, 400, 300) fits inside 500x375 and reads as pixels: the guess is wrong here
    assert row["turing_upper_iou"] < 0.5
    assert metric.describe()["box_coords"] == {"": "guessed per answer"}
    # the metric's own setting overrides the judge's
    fixed = CaptionTuringTest(OracleGenerator(), judge, BANK, max_side=448, judge_box_coords="1000")
    assert fixed.score([wide], Context())[0]["turing_upper_iou"] == pytest.approx(1.0)


def test_iou_threshold_decides_correctness(wide):
    # a pixel answer read in the wrong frame overlaps partly: correct or not by the threshold
    judge = BoxJudge("pixel", answer_in="image-pixel")
    row = CaptionTuringTest(OracleGenerator(), judge, BANK, max_side=448).score([wide], Context())[0]
    iou = row["turing_upper_iou"]
    assert 0 < iou < 1
    for threshold, expected in ((iou - 0.01, 1.0), (iou + 0.01, 0.0)):
        metric = CaptionTuringTest(OracleGenerator(), judge, BANK, max_side=448, iou_threshold=threshold)
        assert metric.score([wide], Context())[0]["turing_upper/grounding"] == expected


def test_registry_gives_each_family_its_convention_and_options_override():
    url = "http://127.0.0.1:9/v1"  # never contacted: building a backend does not touch the network
    expected = {"qwen3-vl-8b": "1000", "qwen3-vl-32b": "1000", "qwen2.5-vl-7b": "pixel", "qwen2.5-vl-72b": "pixel",
                "llava-1.5-13b": "normalized", "instructblip-flan-t5-xl": "normalized"}
    for name, coords in expected.items():
        assert registry.construct("judge", name, base_url=url).box_coords == coords
    assert registry.construct("judge", "qwen3-vl-8b", base_url=url, box_coords="pixel").box_coords == "pixel"
    # a served name of a known family, and one of an unknown family
    assert OpenAICompatVLM("Qwen/Qwen2.5-VL-7B-Instruct", url).box_coords == "pixel"
    assert OpenAICompatVLM("my-model", url).box_coords is None
    with pytest.raises(ValueError, match="box_coords must be one of"):
        OpenAICompatVLM("my-model", url, box_coords="inches")
    served = OpenAICompatVLM("Qwen/Qwen2.5-VL-7B-Instruct", url, max_pixels=200 * 150, min_pixels=28 * 28)
    assert served.box_frame((500, 375)) == qwen25_frame((500, 375))


def test_transformers_judge_reads_its_family_and_its_processor_frame(tmp_path):
    from PIL import Image

    from caprecon.models.vlm_processors import load_processor
    from caprecon.models.vlm_transformers import TransformersVLM
    from tiny_vlm import build_qwen2_vl

    folder = build_qwen2_vl(tmp_path / "qwen2vl")
    judge = TransformersVLM(folder)
    assert judge.box_coords == "1000"  # Qwen2-VL's grid, from the checkpoint's model type
    assert TransformersVLM(folder, box_coords="pixel").box_coords == "pixel"
    # the frame is what the processor makes of the image: its patch grid times the patch size
    out = load_processor(str(folder)).image_processor(images=[Image.new("RGB", (500, 375))], return_tensors="pt")
    _, rows, cols = out["image_grid_thw"][0].tolist()
    assert judge.box_frame((500, 375)) == (cols * 14, rows * 14) != (500, 375)
    assert judge._model is None  # the frame needed the processor only


class NamedJudge(BoxJudge):
    def __init__(self, name="named", box_coords="normalized"):
        super().__init__(box_coords, name=name)


def test_a_judge_per_category(wide):
    default, grounding = BoxJudge("normalized", name="small"), BoxJudge("1000", name="large")
    metric = CaptionTuringTest(OracleGenerator(), default, BANK, max_side=448, judges_for={"grounding": grounding})
    row = metric.score([wide], Context())[0]
    assert row["turing_iou"] == pytest.approx(1.0) and row["turing"] == 1.0
    # each judge was asked only its own questions
    assert all("Where" in p for p in grounding.prompts) and len(grounding.prompts) == 2
    assert not any("Where" in p for p in default.prompts) and len(default.prompts) == 2
    assert metric.describe()["judges_for"]["grounding"]["fingerprint"] == grounding.fingerprint


def test_judge_for_from_the_cli_and_config_reaches_the_manifest(wide, tmp_path, capsys, monkeypatch):
    from caprecon.cli import main

    monkeypatch.syspath_prepend(str(tmp_path))
    bank = tmp_path / "bank.jsonl"
    bank.write_text("\n".join(json.dumps({"image_id": q.image_id, "question": q.question, "type": q.type,
                                          "category": q.category, "answer": list(q.answer) if q.type == "box"
                                          else q.answer, **({"coords": q.coords} if q.coords else {})})
                              for q in BANK["shapes"]))
    data = tmp_path / "in.jsonl"
    data.write_text(json.dumps({"id": "w", "image": str(wide.sample.image), "caption": "a red circle",
                                "image_id": "shapes"}))
    config = tmp_path / "run.yaml"
    config.write_text("judge_for_options:\n  grounding: {name: large, box_coords: '1000'}\niou_threshold: 0.75\n")
    out = tmp_path / "run"
    code = main(["score", "-i", str(data), "-m", "turing", "--qa-bank", str(bank), "--config", str(config),
                 "--judge", "test_grounding:NamedJudge", "--judge-for", "grounding=test_grounding:NamedJudge",
                 "--generator", "oracle:OracleGenerator", "--max-side", "448", "--no-cache", "--out", str(out),
                 "--quiet"])
    assert code == 0, capsys.readouterr().err
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["config"]["judge_for"] == {"grounding": "test_grounding:NamedJudge"}
    assert manifest["config"]["iou_threshold"] == 0.75
    assert manifest["models"]["judge_for/grounding"]["fingerprint"] == "large-1000"
    assert manifest["metrics"][0]["box_coords"] == {"": "normalized", "grounding": "1000"}
    record = json.loads((out / "scores.jsonl").read_text())
    assert record["turing_iou"] == pytest.approx(1.0)
    assert main(["score", "-i", str(data), "--judge-for", "grounding"]) == 2
    assert "must look like CATEGORY=MODEL" in capsys.readouterr().err

