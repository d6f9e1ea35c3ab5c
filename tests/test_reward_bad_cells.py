"""Bad input on the training path, after the review of the reward service (guard7b): a path no file
system takes, a dataset cell whose bytes are empty, a picture given as a numpy array or a number, a
row the reward cannot score in a served reward, and numpy numbers among the guards.

Each expected message is written out here by hand; each expected reward is the oracle's ReconScore
computed with numpy (`expected_recon`)."""

from __future__ import annotations

import base64
import io
import logging
import os
import re

import numpy as np
import pytest

import caprecon
from caprecon.apps.reward import Guards
from caprecon.apps.reward.remote import RemoteReward, verl_reward
from caprecon.apps.reward.service import RewardService, ServiceSettings
from caprecon.apps.reward.wire import encode_cell
from caprecon.core.errors import ConfigError
from caprecon.data.images import image_file_key, path_refusal, read_image_file
from caprecon.data.samples import Sample, SampleError
from oracle import CountingOracle, PixelEmbedder, expected_recon, render
from test_serve import StandIn

SURROGATE_NAME = "a\ud800.png"  # the lone surrogate at character 1: no file name can hold it
SURROGATE_PROBLEM = ("image path 'a\\ud800.png' holds a lone surrogate ('\\ud800') at character 1, which no file "
                     "name can hold: the input's encoding is broken")


# -- 1: a path with a lone surrogate ----------------------------------------------------------------


def test_a_path_with_a_lone_surrogate_is_refused_naming_the_problem(tmp_path):
    for root in (None, tmp_path):  # the root's check resolves the path: an OS call too
        with pytest.raises(SampleError) as refused:
            read_image_file(SURROGATE_NAME, root)
        assert str(refused.value) == SURROGATE_PROBLEM and refused.value.reason == "image path invalid"
    with pytest.raises(SampleError, match=re.escape(SURROGATE_PROBLEM)):
        image_file_key(SURROGATE_NAME)
    assert path_refusal(Sample(id="a", image=SURROGATE_NAME, caption="a red circle")) == SURROGATE_PROBLEM


def test_a_name_decoded_with_surrogateescape_still_reads(tmp_path):
    # "\udcff" stands for the byte 0xff (a file name that is not UTF-8): a real file, not a refusal
    (tmp_path.joinpath(os.fsdecode(b"b\xff.png"))).write_bytes(b"the bytes")
    assert read_image_file(str(tmp_path / "b\udcff.png"), tmp_path) == b"the bytes"


# -- 2a: empty bytes beside a path ----------------------------------------------------------------


def _options(tmp_path, generator):
    return dict(metrics=["recon"], generator=generator, embedder=PixelEmbedder(), max_side=48,
                cache_dir=str(tmp_path / "cache"), guards=caprecon.Guards.off(), progress=False)


def test_empty_bytes_are_the_rows_error_not_a_cue_to_open_the_path(tmp_path, caplog):
    picture = render("red circle", 48, 48)
    picture.save(tmp_path / "on-disk.png")  # what the cell names: read before, scored as if it were the picture
    reward = caprecon.Reward(**_options(tmp_path, CountingOracle()))
    on_disk = str(tmp_path / "on-disk.png")
    cells = [{"bytes": b"", "path": on_disk}, b"", {"bytes": None, "path": on_disk}]
    cells.append(cells[0])  # under an empty completion, whose reward is `empty` (0) whatever its picture
    captions = ["red circle"] * 3 + [""]
    with caplog.at_level(logging.WARNING):
        got = reward(cells, captions)
    assert got[:2] == [None, None] and got[3] == 0.0
    assert got[2] == pytest.approx(expected_recon(picture, "red circle"), abs=1e-6)  # no bytes (None): its path
    errors: dict[int, str] = {}
    reward.parts(cells, captions, errors=errors)
    assert errors == {0: "the image's bytes are empty (no picture)", 1: "the image's bytes are empty (no picture)"}
    assert any("row 0: the image's bytes are empty" in r.getMessage() for r in caplog.records)
    # the client sends them as they are (the server refuses an empty image), never the file the cell names
    assert encode_cell({"bytes": b"", "path": str(tmp_path / "on-disk.png")}) == {"encoded": ""}


# -- 2b: a picture in a form no reward reads --------------------------------------------------------


def test_a_numpy_array_or_a_number_as_a_picture_is_refused_naming_the_row(tmp_path):
    generator = CountingOracle()
    reward = caprecon.Reward(**_options(tmp_path, generator))
    picture = render("red circle", 48, 48)
    forms = "give a path, the file's bytes, a PIL image or a datasets Image cell ({bytes, path}), or None"
    with pytest.raises(ConfigError, match=re.escape("image 1 is a ndarray (a numpy array: give "
                                                    f"PIL.Image.fromarray(...) of it); {forms}") + "$"):
        reward([picture, np.asarray(picture)], ["red circle", "red circle"])
    with pytest.raises(ConfigError, match=re.escape(f"image 0 is an int; {forms}") + "$"):
        reward(completions=["red circle"], image=[42])
    with pytest.raises(ConfigError, match=re.escape("image 0 is a mapping whose bytes or path is neither bytes nor "
                                                    f"a path; {forms}") + "$"):
        reward([{"bytes": np.zeros(3, np.uint8), "path": None}], ["red circle"])
    assert generator.prompts == []  # refused before any scoring


def test_verls_reward_refuses_a_numpy_picture_naming_the_sample_before_any_request():
    compute_score = verl_reward("http://127.0.0.1:9")  # nothing listens: a request would fail otherwise
    with pytest.raises(ConfigError, match=re.escape(
            "verl reward: the picture of sample 1 (extra_info['image'], else its ground_truth) is a ndarray "
            "(a numpy array: give PIL.Image.fromarray(...) of it); give a path")):
        compute_score(data_sources=["d", "d"], solution_strs=["a red circle", "a red circle"], ground_truths=[None, None],
                      extra_infos=[{"image": b"png bytes"}, {"image": np.zeros((4, 4, 3), np.uint8)}])


# -- 2c: rows the reward fails on, in a served reward's answer ----------------------------------------


class FailingOracle(CountingOracle):
    """The oracle, failing on a caption that names a purple shape, with a message that quotes a key."""

    def generate(self, requests):
        if any("purple" in r.prompt for r in requests):
            raise RuntimeError("backend refused: api_key=sk-live-0123456789abcdef")
        return super().generate(requests)


def _encoded(picture) -> dict[str, str]:
    buffer = io.BytesIO()
    picture.save(buffer, format="PNG")
    return {"encoded": base64.b64encode(buffer.getvalue()).decode("ascii")}


def test_a_served_reward_says_why_a_row_failed_inside_the_reward_redacted(tmp_path, caplog):
    service = RewardService(ServiceSettings(reward={**_options(tmp_path, FailingOracle()), "max_side": 96}))
    picture = render("red circle", 96, 96)
    whole = _encoded(picture)
    data = base64.b64decode(whole["encoded"])
    truncated = {"encoded": base64.b64encode(data[: len(data) // 2]).decode("ascii")}  # its header reads
    stand_in = StandIn(service)
    try:
        with caplog.at_level(logging.WARNING, logger="caprecon.apps.reward.remote"):
            got = RemoteReward(stand_in.url)([picture, None, picture], ["red circle", "red circle", "purple square"])
            answer = RemoteReward(stand_in.url).post("/reward", {
                "captions": ["red circle", "red circle", "purple square"], "images": [truncated, whole, whole]})
    finally:
        stand_in.close()
    assert got[0] == pytest.approx(expected_recon(picture, "red circle"), abs=1e-6)
    assert got[1] is None and got[2] is None
    errors = answer["errors"]
    assert sorted(errors) == ["0", "2"]  # row 1 read and scored
    assert errors["0"] == "recon failed: cannot decode the embedded image: image file is truncated"
    assert errors["2"] == "recon failed: backend refused: api_key=***"  # redacted as every other message
    assert answer["parts"]["recon"][0] is None and answer["parts"]["recon"][2] is None
    assert answer["parts"]["recon"][1] == pytest.approx(expected_recon(picture, "red circle"), abs=1e-6)
    logged = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("reward service: row 2: recon failed: ") for m in logged), logged


# -- 2d: numpy numbers among the guards ----------------------------------------------------------------


def test_a_numpy_float64_weight_is_kept_as_pythons_float():
    guards = Guards(length_weight=np.float64(0.25), repetition_weight=2)
    assert type(guards.length_weight) is float and type(guards.repetition_weight) is float
    assert repr(guards) == ("Guards(length_target=60, length_weight=0.25, repetition_n=3, repetition_weight=2.0, "
                            "hallucination_weight=1.0)")
