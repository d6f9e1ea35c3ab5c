"""Issue 51 item 23: a failure's message says what happened and what to do, never a bare exception
class name before its text; URL passwords in it stay masked."""

from __future__ import annotations

import json
import socket

import pytest

from caprecon.cli import main
from caprecon.core.errors import ConfigError, ServerError
from caprecon.data.samples import SampleError
from caprecon.run.failures import explain_failure, failure_reason


def test_own_errors_are_their_message_and_others_say_what_to_do():
    assert explain_failure(SampleError("image not found: a.png", "image not found")) == "image not found: a.png"
    assert explain_failure(ConfigError("--seeds must be at least 1")) == "--seeds must be at least 1"
    assert explain_failure(ServerError("cannot reach http://h/v1")) == (
        "the model server failed: cannot reach http://h/v1; once the server answers, run the same command again "
        "(what finished is kept)")
    assert explain_failure(ModuleNotFoundError("No module named 'open_clip'")) == (
        "a library it needs cannot be imported (No module named 'open_clip'): install it, or choose another model "
        "or metric")
    assert explain_failure(NotImplementedError("option_probs")).startswith(
        "the model does not support this: option_probs; choose a backend that does")
    assert explain_failure(RuntimeError("CUDA out of memory")).startswith("out of memory: CUDA out of memory; use a")
    bug = explain_failure(KeyError("pixel_values"))
    assert bug == ("'pixel_values' (an unexpected KeyError inside the model or metric: run again with --verbose for "
                   "where it came from, and report it if the input is right)")
    for exc in (SampleError("x"), ServerError("x"), ImportError("x"), RuntimeError("x"), ValueError("x")):
        assert not explain_failure(exc).startswith(type(exc).__name__)
    assert failure_reason("vqascore", ServerError("down")) == "vqascore: model server failed"


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("rows", [1, 3])
def test_an_unreachable_server_says_so_with_its_password_masked(tmp_path, capsys, rows):
    """One row: that row's error; several: the run stops (the same error on every row). Either way the
    message says the server failed, how to go on, and masks the URL's password."""
    from PIL import Image

    Image.new("RGB", (16, 16), (200, 30, 30)).save(tmp_path / "red.png")
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps({"id": f"r{i}", "image": "red.png", "caption": f"a red square {i}"}) + "\n"
                            for i in range(rows)))
    out = tmp_path / "run"
    code = main(["score", "-i", str(data), "-m", "vqascore", "--judge", "m1", "--judge-opt",
                 f"base_url=http://alice:pw-9191@127.0.0.1:{_closed_port()}/v1", "--judge-opt", "max_retries=0",
                 "--no-cache", "--out", str(out), "-q"])
    captured = capsys.readouterr()
    said = captured.out + captured.err + (out / "scores.jsonl").read_text()
    assert "pw-9191" not in said and "http://***@127.0.0.1" in said
    assert "OpenAICompatError" not in said and "ConnectError" not in said
    assert "the model server failed: cannot reach http://***@127.0.0.1" in said
    assert "check that the server is running" in said and "once the server answers, run the same command" in said
    if rows == 1:
        assert code == 1 and "rows failed: 1 (vqascore: model server failed: 1)" in captured.out
    else:
        assert code == 2 and "the problem is not the rows: the model server failed" in captured.err
