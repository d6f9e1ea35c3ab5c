"""Bad input on the training path. A cache folder or overlay that is a file is refused when the
reward is built, naming the option (it passed for a read-only cache, whose refusal of the first new
result advised an overlay). A completion that is not valid Unicode (a lone surrogate, which a JSON
escape such as "\\ud800" lets into a Python string): the reward gives that row None and logs its
row and character, never hands it to a model (its cache key could not even be written as UTF-8),
and scores the other rows of the batch as it would without it; the served reward says why in the
row's error. Expected values are the oracle's ReconScore computed with numpy (`expected_recon`)."""

from __future__ import annotations

import base64
import io
import logging
import re

import pytest

import caprecon
from caprecon.apps.reward import Guards
from caprecon.apps.reward.service import RewardService, ServiceSettings
from caprecon.core.errors import ConfigError
from caprecon.core.records import unicode_problem
from oracle import CountingOracle, PixelEmbedder, expected_recon, render

BROKEN = "a red \ud800 circle"  # the surrogate at character 6


def test_a_lone_surrogate_is_the_problem_named_and_real_characters_are_none():
    assert unicode_problem(BROKEN) == ("holds a lone surrogate ('\\ud800') at character 6, which is not text: "
                                       "the input's encoding is broken")
    assert unicode_problem("naïve café, 雪, 🙂") is None and unicode_problem("") is None


def _options(tmp_path, generator):
    return dict(metrics=["recon"], generator=generator, embedder=PixelEmbedder(), max_side=48,
                cache_dir=str(tmp_path / "cache"), guards=caprecon.Guards.off(), progress=False)


def test_the_reward_gives_a_broken_completion_none_and_scores_the_rest(tmp_path, caplog):
    picture = render("red circle", 48, 48)
    generator = CountingOracle()
    reward = caprecon.Reward(**_options(tmp_path, generator))
    captions = ["red circle", BROKEN, "green triangle"]
    with caplog.at_level(logging.WARNING):
        got = reward([picture] * 3, captions)
    assert got[0] == pytest.approx(expected_recon(picture, "red circle"), abs=1e-6)
    assert got[1] is None
    assert got[2] == pytest.approx(expected_recon(picture, "green triangle"), abs=1e-6)
    assert not any("\ud800" in prompt for prompt in generator.prompts)  # no model saw it
    warned = [r.getMessage() for r in caplog.records]
    assert any("row 1: the caption holds a lone surrogate" in m and "character 6" in m for m in warned), warned
    assert not any("failed" in m for m in warned), warned  # no batch failed on it and was retried row by row


def test_the_served_reward_names_the_row_and_its_character(tmp_path):
    service = RewardService(ServiceSettings(reward=_options(tmp_path, CountingOracle())))
    buffer = io.BytesIO()
    render("red circle", 48, 48).save(buffer, format="PNG")
    cell = {"encoded": base64.b64encode(buffer.getvalue()).decode("ascii")}
    answer = service.score_many([service.parse({"captions": ["red circle", BROKEN], "images": [cell, cell]})])[0]
    assert answer["errors"] == {"1": f"caption {unicode_problem(BROKEN)}"}
    assert answer["parts"]["recon"][0] == pytest.approx(expected_recon(render("red circle", 48, 48), "red circle"),
                                                        abs=1e-6)
    assert answer["parts"]["recon"][1] is None


@pytest.mark.parametrize("option", ["cache_dir", "cache_overlay"])
def test_a_cache_folder_that_is_a_file_is_refused_when_the_reward_is_built(tmp_path, option):
    a_file = tmp_path / "a-file"
    a_file.write_text("not a cache")
    flag = "--" + option.replace("_", "-")
    with pytest.raises(ConfigError, match=f"^{flag}: not a folder: {a_file} is a file$"):
        caprecon.Reward(**{**_options(tmp_path, CountingOracle()), option: str(a_file)})
    assert a_file.read_text() == "not a cache"


def test_a_numpy_number_is_refused_with_what_to_give_instead():
    # "length_target must be a whole number, not np.int64(40)" read as a contradiction
    import numpy as np

    with pytest.raises(ConfigError, match=re.escape("guards: length_target must be a whole number, not np.int64(40) "
                                                    "(a numpy int64: give int(...) of it)")):
        Guards(length_target=np.int64(40))
    with pytest.raises(ConfigError, match=re.escape("guards: length_weight must be a number, not np.float32(0.5) "
                                                    "(a numpy float32: give float(...) of it)")):
        Guards(length_weight=np.float32(0.5))
    with pytest.raises(ConfigError, match=re.escape("guards: repetition_n must be a whole number, not np.True_") + "$"):
        Guards(repetition_n=np.True_)
