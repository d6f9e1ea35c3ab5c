"""reward-audit with nothing to audit (issue 51 item 11): an empty input, one caption, every image missing
end in one message (the command line, exit 2) and the same ConfigError from `caprecon.reward_audit`,
before any model loads; the audit shows its stages."""

from __future__ import annotations

import json
import re

import pytest

from oracle import render

import caprecon
from caprecon.cli.commands import main
from caprecon.core.errors import ConfigError

MODELS = ["-g", "oracle:OracleGenerator", "-e", "oracle:PixelEmbedder", "--max-side", "64"]


def _captions(tmp_path, rows):
    path = tmp_path / "captions.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    return path


def _picture(tmp_path, name):
    path = tmp_path / f"{name.replace(' ', '-')}.png"
    render(name).save(path)
    return str(path)


CASES = {
    "empty file": (lambda tmp: [], r"no rows"),
    "one caption": (lambda tmp: [{"id": "1", "image": _picture(tmp, "red circle"), "caption": "a red circle"}],
                    r"1 of 1 caption\(s\) have an image that can be read, and an audit needs at least 3"),
    "every image missing": (lambda tmp: [{"id": str(k), "image": str(tmp / f"gone{k}.png"), "caption": "a cat"}
                                         for k in range(4)],
                            r"0 of 4 caption\(s\) .*4 image\(s\) cannot be read, the first: row 0: .*gone0.png"),
    "two of four images missing": (lambda tmp: [{"id": str(k), "image": _picture(tmp, "red circle") if k < 2 else
                                                 str(tmp / f"gone{k}.png"), "caption": "a red circle"}
                                                for k in range(4)],
                                   r"2 of 4 caption\(s\)"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_nothing_to_audit_is_one_message(tmp_path, case, capsys, caplog):
    rows, message = CASES[case]
    samples = _captions(tmp_path, rows(tmp_path))
    assert main(["reward-audit", "-i", str(samples), *MODELS, "--cache-dir", str(tmp_path / "cache"), "-q"]) == 2
    captured = capsys.readouterr()
    errors = [line for line in captured.err.splitlines() if line.strip()]
    assert len(errors) == 1 and errors[0].startswith("caprecon: error: ") and "mean reward" not in captured.out
    assert re.search(message, errors[0])
    assert "reward: row" not in caplog.text  # no warning per row before the message
    with pytest.raises(ConfigError, match=message):
        caprecon.reward_audit(str(samples), ["recon"], generator="oracle:OracleGenerator",
                              embedder="oracle:PixelEmbedder", max_side=64, cache_dir=str(tmp_path / "cache"),
                              progress=False)


def test_the_audit_shows_its_stages_and_its_figures_do_not_depend_on_them(tmp_path, capsys, monkeypatch):
    from caprecon.apps.reward import audit as module

    names = ["red circle", "blue square", "green triangle", "yellow circle", "black square"]
    samples = _captions(tmp_path, [{"id": str(k), "image": _picture(tmp_path, n), "caption": f"a {n}"}
                                   for k, n in enumerate(names)])
    settings = dict(generator="oracle:OracleGenerator", embedder="oracle:PixelEmbedder", max_side=64,
                    cache_dir=str(tmp_path / "cache"))
    whole = caprecon.reward_audit(str(samples), ["recon"], **settings)
    err = capsys.readouterr().err
    for stage in ("reward-audit: reading images", "reward-audit: scoring captions as given",
                  "reward-audit: scoring captions padded", "reward-audit: scoring captions repeated"):
        assert stage in err
    monkeypatch.setattr(module, "AUDIT_BATCH", 2)  # three steps per stage: the same figures
    stepped = caprecon.reward_audit(str(samples), ["recon"], progress=False, **settings)
    assert stepped.figures() == whole.figures()


def test_an_empty_caption_in_one_step_keeps_the_parts_aligned(tmp_path, monkeypatch):
    # the reward adds its `empty` part only to a batch holding an empty caption: scored in steps of 2,
    # the audit must give what one step gives
    from caprecon.apps.reward import audit as module

    names = ["red circle", "blue square", "green triangle", "yellow circle", "black square"]
    rows = [{"id": str(k), "image": _picture(tmp_path, n), "caption": f"a {n}" if k != 3 else " "}
            for k, n in enumerate(names)]
    samples = _captions(tmp_path, rows)
    settings = dict(generator="oracle:OracleGenerator", embedder="oracle:PixelEmbedder", max_side=64,
                    cache_dir=str(tmp_path / "cache"), progress=False)
    try:
        whole = caprecon.reward_audit(str(samples), ["recon"], **settings)
    except ConfigError as exc:  # a blank caption may be refused when the samples are read: nothing to align
        pytest.skip(f"a blank caption is refused on reading: {exc}")
    monkeypatch.setattr(module, "AUDIT_BATCH", 2)
    assert caprecon.reward_audit(str(samples), ["recon"], **settings).figures() == whole.figures()
