"""The one answer grader: IoU and box conventions worked by hand, and the same grade for the
same reply whether the Caption Turing Test, CTTD curation or a task suite asks."""

import json
import types

import pytest
from PIL import Image

from caprecon.apps.cttd import BuildConfig, curate
from caprecon.apps.cttd.stage import Job
from caprecon.apps.suites import caption_sources, load_suites, suite
from caprecon.apps.suites.entries import SUITES
from caprecon.apps.suites.loaders import BenchQuestion
from caprecon.apps.suites.table import UPPER
from caprecon.apps.suites.scoring import grade as suite_grade
from caprecon.data.qa import QAItem
from caprecon.data.images import open_image
from caprecon.data.samples import Sample
from caprecon.metrics import Context
from caprecon.metrics.grading import BoxReading, box_iou, grade, grade_reply
from caprecon.metrics.turing import CaptionTuringTest
from oracle import OracleGenerator

BIG = (1280, 960)
# the answer box in fractions (0.5, 0.5, 0.9, 0.7); in pixels of a 1280x960 image
# (640, 480, 1152, 672); on the 0-1000 grid (500, 500, 900, 700), which fits inside
# 1280x960 and so reads as pixels when the convention is guessed
BOX_PIXELS = (640.0, 480.0, 1152.0, 672.0)
GRID_REPLY = "[500, 500, 900, 700]"
# (500/1280, 500/960, 900/1280, 700/960) = (0.390625, 25/48, 0.703125, 35/48) against
# (0.5, 0.5, 0.9, 0.7): intersection (0.703125 - 0.5) x (0.7 - 25/48), union 0.4 x 0.2 +
# 0.3125 x 10/48 - intersection; 0.3348
_INTER = (0.703125 - 0.5) * (0.7 - 25 / 48)
GRID_AS_PIXELS_IOU = _INTER / (0.4 * 0.2 + 0.3125 * 10 / 48 - _INTER)
# Qwen2.5-VL's resize of 1280x960 with max_pixels 320000: beta = sqrt(1280*960/320000) = 1.959592;
# width floor(1280/beta/28)*28 = 23*28 = 644, height floor(960/beta/28)*28 = 17*28 = 476
FRAME = (644, 476)
# the answer box in pixels of that frame: (0.5*644, 0.5*476, 0.9*644, 0.7*476)
FRAME_REPLY = "[322, 238, 579.6, 333.2]"


class Judge:
    """Gives `reply` to every box question, "yes" to the rest; its own convention is `box_coords`
    and, for pixels, its frame is Qwen2.5-VL's resize on a 320000-pixel budget."""

    def __init__(self, box_coords, reply):
        self.box_coords = box_coords
        self.reply = reply
        self.prompts = []

    @property
    def fingerprint(self):
        return f"grading-judge-{self.box_coords}-{self.reply}"

    def box_frame(self, size):
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

        height, width = smart_resize(size[1], size[0], factor=28, min_pixels=28 * 28, max_pixels=320000)
        return width, height

    def generate(self, requests, max_new_tokens=64):
        self.prompts += [r.prompt for r in requests]
        return [self.reply if "[x1, y1, x2, y2]" in r.prompt else "yes" for r in requests]

    def option_probs(self, requests, options):
        raise NotImplementedError

    def answer_prob(self, requests, answers):
        raise NotImplementedError


def box_item(answer=BOX_PIXELS, coords="pixel"):
    return QAItem("big", "Where is the red square?", "box", answer, category="grounding", id="big#0", coords=coords)


@pytest.fixture(scope="module")
def big_image(tmp_path_factory):
    path = tmp_path_factory.mktemp("grading") / "big.png"
    Image.new("RGB", BIG, (255, 255, 255)).save(path)
    return path


def curation_keeps(tmp_path, image_path, item, judge, judge_box_coords=None) -> bool:
    """Run CTTD curation's judge check on one candidate pair about `image_path`."""
    folder = tmp_path / "curate"
    folder.mkdir()
    config = BuildConfig(judge_box_coords=judge_box_coords)
    job = Job(folder=folder, build=tmp_path, config=config, models=types.SimpleNamespace(judge=judge),
              ctx=Context(), images=[], progress=False)
    width, height = Image.open(image_path).size
    entry = {"image_id": item.image_id, "key": "big-image", "path": str(image_path), "width": width, "height": height}
    record = {"id": item.id, "image_id": item.image_id, "category": item.category, "question": item.question,
              "type": "box", "answer": list(item.answer), "coords": item.coords}
    curate.run(job, [entry], [record])
    kept = [json.loads(line) for line in (folder / curate.OUTPUT).read_text().splitlines()]
    return [r["id"] for r in kept] == [item.id]


# ---------------------------------------------------------------------------------------
# by hand


def test_iou_of_hand_computed_boxes():
    # (0, 0, 4, 4) and (2, 2, 6, 6): intersection 2x2 = 4, union 16 + 16 - 4 = 28
    assert box_iou((0, 0, 4, 4), (2, 2, 6, 6), a_coords="pixel", b_coords="pixel") == pytest.approx(4 / 28)
    # the same pair as fractions (0.1, 0.1, 0.5, 0.5) and on the 0-1000 grid (300, 300, 700, 700):
    # intersection 0.2 x 0.2 = 0.04, union 0.16 + 0.16 - 0.04 = 0.28
    assert box_iou((0.1, 0.1, 0.5, 0.5), (300, 300, 700, 700), b_coords="1000") == pytest.approx(0.04 / 0.28)
    # disjoint boxes, and a box against itself
    assert box_iou((0, 0, 1, 1), (2, 2, 3, 3), a_coords="pixel", b_coords="pixel") == 0.0
    assert box_iou((10, 20, 30, 40), (10, 20, 30, 40), a_coords="pixel", b_coords="pixel") == 1.0


def test_a_grid_answer_read_in_the_judges_convention_not_guessed():
    reading = BoxReading.of(Judge("1000", GRID_REPLY))
    assert reading.coords == "1000"
    right = grade_reply(box_item(), GRID_REPLY, reading, seen_size=BIG)
    assert right.iou == pytest.approx(1.0) and right.correct and not right.coords_guessed
    guessed = grade_reply(box_item(), GRID_REPLY, BoxReading(), seen_size=BIG)
    assert guessed.iou == pytest.approx(GRID_AS_PIXELS_IOU) and not guessed.correct and guessed.coords_guessed
    # the run's setting overrides the judge's own convention
    assert BoxReading.of(Judge("1000", GRID_REPLY), "normalized").coords == "normalized"
    with pytest.raises(ValueError, match="box coords must be one of"):
        BoxReading("percent")


def test_qwen25_pixels_count_the_resized_image():
    judge = Judge("pixel", FRAME_REPLY)
    assert judge.box_frame(BIG) == FRAME
    reading = BoxReading.of(judge)
    assert reading.frame(BIG) == FRAME and BoxReading.of(Judge("1000", "")).frame(BIG) is None
    assert grade_reply(box_item(), FRAME_REPLY, reading, seen_size=BIG).iou == pytest.approx(1.0)
    # read in pixels of the original instead: (322/1280, 238/960, 579.6/1280, 333.2/960) =
    # (0.25, 0.25, 0.45, 0.35), no overlap with (0.5, 0.5, 0.9, 0.7)
    assert grade(box_item(), FRAME_REPLY, image_size=BIG, pred_coords="pixel").iou == 0.0
    # on a reconstruction of another size the answer box goes over in fractions: a 0-1000
    # reply about a 320x240 reconstruction grades against the source's box
    assert grade(box_item(), GRID_REPLY, image_size=(320, 240), source_size=BIG,
                 pred_coords="1000").iou == pytest.approx(1.0)


# ---------------------------------------------------------------------------------------
# where the copies disagreed


@pytest.mark.parametrize("item", [box_item((0.5, 0.5, 0.9, 0.7), "normalized"), box_item()],
                         ids=["bank-box-normalized", "bank-box-pixels"])
def test_curation_keeps_a_perfect_grid_answer_on_a_large_image(tmp_path, big_image, item):
    # a Qwen3-VL-like judge (its own convention 0-1000), no judge_box_coords set, on
    # 1280x960: before, curation guessed pixels and dropped the pair (IoU 0.3348)
    judge = Judge("1000", GRID_REPLY)
    assert curation_keeps(tmp_path, big_image, item, judge)
    assert all("0-1000" in p for p in judge.prompts)  # asked as turing asks it: the same cache entry


def test_curation_reads_qwen25_pixels_in_the_resized_frame(tmp_path, big_image):
    assert curation_keeps(tmp_path, big_image, box_item(), Judge("pixel", FRAME_REPLY), judge_box_coords="pixel")


def test_suite_refcoco_row_with_a_grid_judge_scores_iou_one_on_1024x768(tmp_path):
    # a 640x480 original whose box (320, 240)-(576, 336) is (0.5, 0.5, 0.9, 0.7) in fractions;
    # the reconstruction is 1024x768, where the grid reply (500, 500, 900, 700) fits and,
    # guessed as pixels, is (0.48828, 0.65104, 0.87891, 0.91146): IoU 0.018551 / 0.163174 = 0.1137
    image = tmp_path / "source.png"
    Image.new("RGB", (640, 480), (220, 30, 30)).save(image)
    bench = tmp_path / "refcoco.jsonl"
    bench.write_text(json.dumps({"index": 0, "image": str(image), "expression": "the red square",
                                 "bbox": [320, 240, 256, 96]}) + "\n")
    captions = tmp_path / "drawn.jsonl"
    captions.write_text(json.dumps({"dataset": "refcoco", "index": "0", "caption": "a red square"}) + "\n")
    judge = Judge("1000", GRID_REPLY)
    results = suite(load_suites(["refcoco"], [str(bench)]), caption_sources([], {"drawn": captions}),
                              generator=OracleGenerator(), judge=judge, size="1024x768",
                              cache_dir=str(tmp_path / "cache"))
    rows = {r["captioner"]: r for r in results.records}
    assert rows["drawn"]["iou"] == pytest.approx(1.0) and rows["drawn"]["correct"]
    assert rows[UPPER]["iou"] == pytest.approx(1.0)
    assert results.table.scores["drawn"]["refcoco"]["miou"] == pytest.approx(100.0)
    assert results.manifest["judge"]["box_coords"] == "1000"
    assert all("0-1000" in p for p in judge.prompts)


@pytest.mark.parametrize("coords, reply", [("1000", GRID_REPLY), ("pixel", FRAME_REPLY)])
def test_suite_scores_iou_one_on_the_1024x768_reconstruction_of_a_1280x960_original(coords, reply, tmp_path,
                                                                                   big_image):
    # the reconstruction takes the original's aspect at the default long side 1024: 1024x768.
    # A grid reply is the same on both; Qwen2.5-VL's frame of 1024x768 on a 320000-pixel budget
    # is (644, 476) as for 1280x960 (beta = sqrt(1024*768/320000) = 1.5677: 23 and 17 patches of 28)
    bench = tmp_path / "refcoco.jsonl"
    x, y, x2, y2 = BOX_PIXELS
    bench.write_text(json.dumps({"index": 0, "image": str(big_image), "expression": "the red square",
                                 "bbox": [x, y, x2 - x, y2 - y]}) + "\n")
    captions = tmp_path / "drawn.jsonl"
    captions.write_text(json.dumps({"dataset": "refcoco", "index": "0", "caption": "a red square"}) + "\n")
    results = suite(load_suites(["refcoco"], [str(bench)]), caption_sources([], {"drawn": captions}),
                              generator=OracleGenerator(), judge=Judge(coords, reply),
                              cache_dir=str(tmp_path / "cache"))
    rows = {r["captioner"]: r for r in results.records}
    assert Image.open(rows["drawn"]["reconstruction"]).size == (1024, 768)
    assert rows["drawn"]["iou"] == pytest.approx(1.0) and rows[UPPER]["iou"] == pytest.approx(1.0)
    assert results.table.score("drawn", "refcoco") == pytest.approx(100.0)  # the mean IoU, in percent


# ---------------------------------------------------------------------------------------
# one grade wherever it is asked

CASES = [  # (judge's convention, reply, IoU by hand)
    ("1000", GRID_REPLY, 1.0),
    ("normalized", "[0.5, 0.5, 0.9, 0.7]", 1.0),
    ("pixel", FRAME_REPLY, 1.0),
    (None, GRID_REPLY, GRID_AS_PIXELS_IOU),  # no convention known: guessed as pixels
    # (0.5, 0.5, 0.9, 1.0): intersection 0.4 x 0.2 = 0.08 over union 0.4 x 0.5 = 0.2
    ("1000", "[500, 500, 900, 1000]", 0.4),
]


@pytest.mark.parametrize("coords, reply, iou", CASES)
def test_turing_curation_and_suites_agree(coords, reply, iou, tmp_path, big_image):
    correct = iou >= 0.5
    item = box_item()

    judge = Judge(coords, reply)
    loaded = open_image(Sample(id="s", image=big_image, caption="a red square", image_id="big"))
    row = CaptionTuringTest(OracleGenerator(), judge, {"big": [item]}, max_side=128).score([loaded], Context())[0]
    assert row["turing_upper_iou"] == pytest.approx(iou) and row["turing_upper"] == float(correct)

    assert curation_keeps(tmp_path, big_image, item, Judge(coords, reply)) is correct

    question = BenchQuestion(dataset="refcoco", id="0", image_id="big", type="box", question="the red square",
                             answer=BOX_PIXELS, item=item)
    graded = suite_grade(question, reply, SUITES["refcoco"], source_size=BIG, seen_size=BIG,
                         reading=BoxReading.of(Judge(coords, reply)))
    assert graded.iou == pytest.approx(iou) and graded.correct is correct
