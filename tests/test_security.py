"""Security probes: nothing is read outside --image-root (thumbnails, CTTD import), only regular
files of bounded size are images, secrets never reach any output, terminal control characters in
captions cannot forge the table, and a config file cannot run code without --allow-plugins.

Expected values are written out by hand or read from the pictures the test itself drew (their
colours), never computed by the code under test.
"""

import base64
import io
import json
import os
import re
import subprocess
import shutil
import sys
import uuid
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from clirun import run_cli as _run

RED, BLUE, GREEN = (220, 20, 20), (20, 20, 220), (20, 200, 20)
# what a subprocess probing a hang or an endless read may use, so a failure cannot take the machine with
# it: memory, and the size of any one file it writes (a copy of /dev/zero fills the disk otherwise)
PROBE_MEMORY, PROBE_FILE_SIZE = 3 * 2**30, 256 * 2**20


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _png(path, colour, size=(32, 24)):
    Image.new("RGB", size, colour).save(path)
    return path




def _gallery(page: str) -> dict:
    text = re.search(r'<script type="application/json" id="gallery-data">(.*?)</script>', page, re.S).group(1)
    return json.loads(text)


def _mean_colour(path) -> tuple[int, ...]:
    with Image.open(path) as im:
        return tuple(int(round(v)) for v in np.asarray(im.convert("RGB"), dtype=np.float64).mean(axis=(0, 1)))


def _limited():
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (PROBE_MEMORY, PROBE_MEMORY))
    resource.setrlimit(resource.RLIMIT_FSIZE, (PROBE_FILE_SIZE, PROBE_FILE_SIZE))


def _probe(code: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """Run `code` in a fresh interpreter with bounded memory and time (a hang is a failure, not a stuck test)."""
    try:
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout,
                              preexec_fn=_limited, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    except subprocess.TimeoutExpired:
        pytest.fail(f"still running after {timeout} s: {code}")


# --------------------------------------------------------------------------- 1: thumbnails keep to --image-root


@pytest.fixture
def escaping_rows(tmp_path):
    """An --image-root holding one red picture, and rows whose blue picture lies outside it by
    `..`, an absolute path and a symbolic link."""
    root = tmp_path / "root"
    root.mkdir()
    _png(root / "inside.png", RED)
    outside = _png(tmp_path / "outside.png", BLUE)
    (root / "link.png").symlink_to(outside)
    rows = [{"id": "inside", "image": "inside.png", "caption": "a red picture"},
            {"id": "dotdot", "image": "../outside.png", "caption": "a blue picture"},
            {"id": "absolute", "image": str(outside), "caption": "a blue picture"},
            {"id": "symlink", "image": "link.png", "caption": "a blue picture"}]
    return root, _jsonl(root / "rows.jsonl", rows)


def test_the_report_shows_no_thumbnail_of_an_image_outside_the_root(tmp_path, tiny_clip, escaping_rows, capsys):
    root, rows = escaping_rows
    cache = tmp_path / "cache"
    clip = ["-m", "clipscore", "--clip", tiny_clip, "--cache-dir", cache, "-q"]
    # an earlier, unconfined run of the outside picture leaves its thumbnail in the store's cache
    _jsonl(tmp_path / "trusted.jsonl", [{"id": "t", "image": "outside.png", "caption": "a blue picture"}])
    assert _run(["score", "-i", tmp_path / "trusted.jsonl", *clip, "--out", tmp_path / "trusted"], capsys)[0] == 0
    assert len(list((tmp_path / "trusted" / "report_files" / "thumbs").glob("*.jpg"))) == 1

    run = tmp_path / "run"
    code, _, err = _run(["score", "-i", rows, *clip, "--image-root", root, "--out", run], capsys)
    assert code == 1 and "Traceback" not in err  # the three escaping rows are row errors
    scores = {r["id"]: r for r in map(json.loads, (run / "scores.jsonl").open())}
    assert {i for i, r in scores.items() if r.get("error")} == {"dotdot", "absolute", "symlink"}

    def check():
        thumbs = list((run / "report_files" / "thumbs").glob("*.jpg"))
        assert len(thumbs) == 1 and _mean_colour(thumbs[0])[0] > 150  # the red one alone
        items = {item["i"]: item for item in _gallery((run / "report.html").read_text(encoding="utf-8"))["items"]}
        assert items["inside"]["o"] == thumbs[0].name
        assert [items[i]["o"] for i in ("dotdot", "absolute", "symlink")] == [None, None, None]

    check()
    # rendered again by `caprecon report`, from scratch
    for thumb in (run / "report_files" / "thumbs").glob("*.jpg"):
        thumb.unlink()
    assert _run(["report", run], capsys)[0] == 0
    check()


# --------------------------------------------------------------------------- 4: only regular files, of bounded size


def test_a_fifo_or_an_endless_device_as_image_is_refused_at_once(tmp_path):
    fifo = tmp_path / "pipe.png"
    os.mkfifo(fifo)
    probe = _probe(f"""
import time
from caprecon.data.images import read_image
from caprecon.data.samples import Sample, SampleError
for path in ({str(fifo)!r}, "/dev/zero", {str(tmp_path)!r}):
    started = time.monotonic()
    try:
        read_image(Sample(id="r", image=path, caption="c"))
        print("read", path)
    except SampleError as exc:
        print(exc.reason, "|", exc, "|", round(time.monotonic() - started, 1))
""")
    assert probe.returncode == 0, probe.stderr[-2000:]
    lines = [line.split(" | ") for line in probe.stdout.strip().splitlines()]
    assert [(reason, message) for reason, message, _ in lines] == [
        ("image unreadable", f"cannot read image {fifo}: not a regular file (a named pipe)"),
        ("image unreadable", "cannot read image /dev/zero: not a regular file (a device)"),
        ("image unreadable", f"cannot read image {tmp_path}: not a regular file (a folder)")]
    assert all(float(seconds) < 5 for _, _, seconds in lines)


def test_score_refuses_fifo_and_dev_zero_rows_and_scores_the_rest(tmp_path, tiny_clip):
    os.mkfifo(tmp_path / "pipe.png")
    _png(tmp_path / "ok.png", RED)
    rows = _jsonl(tmp_path / "rows.jsonl", [{"id": "ok", "image": "ok.png", "caption": "red"},
                                            {"id": "fifo", "image": "pipe.png", "caption": "red"},
                                            {"id": "zero", "image": "/dev/zero", "caption": "red"}])
    probe = _probe(f"""
import sys
from caprecon.cli import main
sys.exit(main(["score", "-i", {str(rows)!r}, "-m", "clipscore", "--clip", {str(tiny_clip)!r}, "--cache-dir",
               {str(tmp_path / "cache")!r}, "--out", {str(tmp_path / "run")!r}, "-q"]))
""", timeout=180)
    assert probe.returncode == 1 and "Traceback" not in probe.stderr, probe.stderr[-2000:]
    scores = {r["id"]: r for r in map(json.loads, (tmp_path / "run" / "scores.jsonl").open())}
    assert isinstance(scores["ok"]["clipscore"], float)
    assert scores["fifo"]["error_reasons"] == ["image unreadable"] and "a named pipe" in scores["fifo"]["error"]
    assert scores["zero"]["error_reasons"] == ["image unreadable"] and "a device" in scores["zero"]["error"]


def test_an_image_file_over_max_image_bytes_is_a_row_error(tmp_path, tiny_clip, capsys):
    _png(tmp_path / "small.png", RED, (8, 8))
    big = _png(tmp_path / "big.png", BLUE, (64, 64))
    rows = _jsonl(tmp_path / "rows.jsonl", [{"id": "small", "image": "small.png", "caption": "red"},
                                            {"id": "big", "image": "big.png", "caption": "blue"}])
    limit = (tmp_path / "small.png").stat().st_size
    assert big.stat().st_size > limit
    code, out, err = _run(["score", "-i", rows, "-m", "clipscore", "--clip", tiny_clip, "--cache-dir",
                           tmp_path / "cache", "--out", tmp_path / "run", "--max-image-bytes", limit, "-q"], capsys)
    assert code == 1 and "Traceback" not in err
    scores = {r["id"]: r for r in map(json.loads, (tmp_path / "run" / "scores.jsonl").open())}
    assert isinstance(scores["small"]["clipscore"], float)
    assert scores["big"]["error_reasons"] == ["image too large"]
    assert scores["big"]["error"] == (f"row 1 (id big): image {big} holds {big.stat().st_size} bytes, over the limit of {limit} "
                                      f"(--max-image-bytes)")
    code, _, err = _run(["score", "-i", rows, "--max-image-bytes", "0"], capsys)
    assert code == 2 and "--max-image-bytes" in err


def test_the_default_byte_cap_is_64_mib_and_refuses_unread(tmp_path):
    from caprecon.data.images import read_image_file
    from caprecon.data.samples import SampleError

    huge = tmp_path / "huge.png"
    with huge.open("wb") as fh:  # sparse: no disk is used
        fh.truncate(64 * 1024 * 1024 + 1)
    with pytest.raises(SampleError) as refused:
        read_image_file(huge)
    assert (refused.value.reason, str(refused.value)) == (
        "image too large", f"image {huge} holds 67108865 bytes, over the limit of 67108864 (--max-image-bytes)")
    at_limit = tmp_path / "at-limit.png"
    with at_limit.open("wb") as fh:
        fh.truncate(64 * 1024 * 1024)
    assert len(read_image_file(at_limit)) == 64 * 1024 * 1024



def test_a_file_longer_than_its_size_says_is_read_whole_and_still_capped():
    """Bytes are asked for by the size fstat gives (one more to see a file that grew), not by
    the 64 MiB cap; a file holding more than its size (as /proc's do: size 0) is still read to
    its end, and refused past --max-image-bytes."""
    from caprecon.data.images import read_image_file
    from caprecon.data.samples import SampleError

    proc = Path("/proc/self/maps")
    if not proc.exists() or proc.stat().st_size != 0:
        pytest.skip("needs a file whose size says 0 while it holds bytes (Linux /proc)")
    data = read_image_file(proc)
    assert len(data) > 100 and data.count(b"\n") > 3  # every line, not the single byte past size 0
    with pytest.raises(SampleError) as refused:
        read_image_file(proc, max_bytes=10)
    assert refused.value.reason == "image too large" and "holds over 10 bytes" in str(refused.value)


PAYLOAD = bytes(range(256)) * 40  # 10,240 bytes


def test_an_unchanged_image_file_is_read_in_one_read(tmp_path, monkeypatch):
    """The size fstat gave, plus one byte to see a file that grew: one read brings the whole file."""
    from caprecon.data.images import read_image_file

    path = tmp_path / "photo.jpg"
    path.write_bytes(PAYLOAD)
    asked, real = [], os.read
    monkeypatch.setattr(os, "read", lambda fd, n: (asked.append(n), real(fd, n))[1])
    assert read_image_file(path) == PAYLOAD
    assert asked == [10_241]


def _read_payload(tmp_path, monkeypatch, said: int, limit: int, piece: int | None) -> bytes:
    """PAYLOAD read back by the image reader from a file whose fstat said `said` bytes, under `limit`,
    the file system answering each read with at most `piece` bytes (None: with all it is asked)."""
    from caprecon.data import images as images_module

    path = tmp_path / "photo.jpg"
    path.write_bytes(PAYLOAD)
    if piece:
        real = os.read
        monkeypatch.setattr(os, "read", lambda fd, n: real(fd, min(n, piece)))
    fd = os.open(path, os.O_RDONLY)
    try:
        return images_module._read_limited(fd, path, limit, said)
    finally:
        os.close(fd)


@pytest.mark.parametrize("said, limit, piece", [
    (100, 20_000, None),  # grew after its fstat: read on to its end
    (20_000, 20_000, None),  # shrank: what it holds
    (10_240, 10_240, 3),  # a file system answering in pieces: read on after a short read
    (0, 10_240, 7),  # a size of 0 (as /proc's files say), in pieces
])
def test_an_image_file_of_another_length_than_its_fstat_is_read_to_its_end(tmp_path, monkeypatch, said, limit, piece):
    assert _read_payload(tmp_path, monkeypatch, said, limit, piece) == PAYLOAD


@pytest.mark.parametrize("said, limit, piece", [
    (100, 5_000, None),  # grew past the limit after its fstat
    # in pieces of 3 after the first byte, 10,237 bytes are in hand with the limit at 10,237: one more
    # read must show the file holds more than the limit, not stop there and pass the first 10,237 bytes
    (0, 10_237, 3),
])
def test_an_image_file_growing_past_the_limit_while_read_is_refused(tmp_path, monkeypatch, said, limit, piece):
    from caprecon.data.samples import SampleError

    with pytest.raises(SampleError) as refused:
        _read_payload(tmp_path, monkeypatch, said, limit, piece)
    assert refused.value.reason == "image too large" and f"holds over {limit} bytes" in str(refused.value)


def test_write_file_writes_everything_into_a_new_or_emptied_file(tmp_path, monkeypatch):
    """The store's pictures go through `write_file`: a write that takes less than it is given is
    followed by more, a file already there is emptied first, and a missing folder is made."""
    from caprecon.core.paths import write_file

    target = tmp_path / "images" / "ab" / "abc.part"
    real = os.write
    monkeypatch.setattr(os, "write", lambda fd, data: real(fd, bytes(data[:1000])))  # 1,000 bytes a write at most
    write_file(target, PAYLOAD)
    assert target.read_bytes() == PAYLOAD
    write_file(target, b"short")
    assert target.read_bytes() == b"short"


def test_write_file_never_writes_through_a_link_at_its_path(tmp_path):
    """The store writes each picture to `<key>.<pid>.part` before renaming it: a name anyone sharing the
    cache folder can predict. A link planted there was followed: the file it named was emptied and
    overwritten with the picture."""
    import errno

    from caprecon.core.paths import write_file

    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    (tmp_path / "images" / "ab").mkdir(parents=True)
    planted = tmp_path / "images" / "ab" / "abc.1234.part"
    planted.symlink_to(victim)
    with pytest.raises(OSError) as refused:
        write_file(planted, PAYLOAD)
    assert refused.value.errno == errno.ELOOP
    assert victim.read_text() == "keep me" and planted.is_symlink()


# --------------------------------------------------------------------------- 5: terminal escapes in captions

FORGING = "a cat\x1b[2J\x1b]0;owned\x07\rrow ok\x08\x08\u202eevil\x9b31m\x00"
FORGING_SHOWN = "a cat\\x1b[2J\\x1b]0;owned\\x07\\rrow ok\\x08\\x08\\u202eevil\\x9b31m\\x00"


def test_format_table_shows_control_characters_escaped():
    from caprecon.core.tables import format_table

    assert format_table([["id", "caption"], ["r\x1b", FORGING], ["plain", "一只猫 é 😀"]]) == (
        "id     caption\n"
        f"r\\x1b  {FORGING_SHOWN}\n"
        "plain  一只猫 é 😀")


def test_score_prints_a_forging_caption_escaped(tmp_path, tiny_clip, capsys):
    _png(tmp_path / "pic.png", RED)
    rows = _jsonl(tmp_path / "rows.jsonl", [{"id": "r", "image": "pic.png", "caption": FORGING}])
    code, out, err = _run(["score", "-i", rows, "-m", "clipscore", "--clip", tiny_clip, "--cache-dir",
                           tmp_path / "cache", "--out", tmp_path / "run"], capsys)
    assert code == 0, err
    assert FORGING_SHOWN in out
    assert not re.search("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202e]", out)  # newlines and tabs of the layout only


# --------------------------------------------------------------------------- 4: sizes PIL takes for a bomb

# PIL sets Image.MAX_IMAGE_PIXELS to 1024**3 // 4 // 3 = 89478485: 9459^2 = 89472681 is under it, 9460^2 = 89491600 over
@pytest.mark.parametrize("option, message", [
    (["--size", "65536x65536"], "size 65536x65536: 4294967296 pixels, over the 89478485 that PIL treats as a "
                                "possible decompression bomb (PIL.Image.MAX_IMAGE_PIXELS)"),
    (["--max-side", "100000"], "max_side 100000: a square reconstruction would have 10000000000 pixels, over the "
                               "89478485 that PIL treats as a possible decompression bomb "
                               "(PIL.Image.MAX_IMAGE_PIXELS); at most 9459"),
    (["--max-side", "9460"], "max_side 9460: a square reconstruction would have 89491600 pixels"),
])
def test_a_reconstruction_size_over_pils_pixel_limit_stops_before_any_work(tmp_path, option, message, capsys):
    assert Image.MAX_IMAGE_PIXELS == 89478485
    _png(tmp_path / "pic.png", RED)
    rows = _jsonl(tmp_path / "rows.jsonl", [{"id": "r", "image": "pic.png", "caption": "red"}])
    # the generator named does not exist: the size must be refused before anything looks for it
    commands = [["score", "-i", rows, "-m", "recon", "--generator", tmp_path / "no-generator"]]
    if option[0] == "--size":  # t2i has no --max-side
        commands.append(["t2i", "-i", rows, "--generator", tmp_path / "no-generator", "--judge", "j"])
    for command in commands:
        code, _, err = _run([*command, *option, "--out", tmp_path / "run"], capsys)
        assert code == 2 and "Traceback" not in err
        assert err.strip().splitlines()[-1].startswith(f"caprecon: error: {message}"), err


def test_a_size_under_the_limit_is_accepted():
    from caprecon.run.config import RunConfig

    assert RunConfig(size="9472x9440", max_side=9459).spec.size == (9472, 9440)


# --------------------------------------------------------------------------- 6: config files name no code


REFUSED = ("names the plug-in {spec!r}, code the run would import and call; plug-ins named in a config file load "
           "only with --allow-plugins (give it if you trust this file, or name the plug-in on the command line)")


@pytest.fixture
def marker_plugin(tmp_path, monkeypatch):
    """A harmless plug-in, `module:make`, that leaves a file behind when imported and another when
    called: what a config file's code would do, without doing anything else."""
    name = f"caprecon_probe_{uuid.uuid4().hex}"
    (tmp_path / f"{name}.py").write_text(f"from pathlib import Path\nPath({str(tmp_path / 'imported')!r}).touch()\n"
                                         f"def make(*args, **options):\n"
                                         f"    Path({str(tmp_path / 'called')!r}).touch()\n", encoding="utf-8")
    # and a model the command line names, trusted: an object with no abilities
    (tmp_path / f"{name}_given.py").write_text("def make(*args, **options):\n    return object()\n", encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    return f"{name}:make"


def _untouched(tmp_path, spec):
    return not (tmp_path / "imported").exists() and not (tmp_path / "called").exists() \
        and spec.partition(":")[0] not in sys.modules


# every command that reads settings from a file: its command line, and the settings it builds models from (a
# run builds them in its own order, so all name the plug-in)
ENTRY_POINTS = {
    "score": (["score", "-i", "{rows}", "-m", "recon", "--config", "{config}"], ("generator",)),
    "reconstruct": (["reconstruct", "-i", "{rows}", "--out", "{out}", "--config", "{config}"], ("generator",)),
    "embed": (["embed", "-i", "{rows}", "--out", "{out}", "--config", "{config}"], ("embedder", "generator")),
    "judge": (["judge", "-i", "{rows}", "-m", "vqascore", "--out", "{out}", "--config", "{config}"],
              ("judge", "generator")),
    "caption": (["caption", "--images", "{images}", "--captioner", "{given}", "--out", "{out}", "--config",
                 "{config}"], ("generator",)),
    "refine": (["refine", "-i", "{rows}", "--captioner", "{given}", "--out", "{out}", "--config", "{config}"],
               ("generator", "judge", "llm")),
    "t2i": (["t2i", "-i", "{rows}", "--config", "{config}"], ("generators", "judges")),
    "suite": (["suite", "--suite", "mmstar", "--data", "{bench}", "--captions", "{rows}", "--config", "{config}"],
              ("judge", "generator")),
    "suite file": (["suite", "--suite", "{config}", "--captions", "{rows}"], ("datasets",)),
    "meta": (["meta", "--config", "{config}"], ("llm",)),
    "cttd build": (["cttd", "build", "--images", "{images}", "--out", "{out}", "--config", "{config}"],
                   ("vlm", "judge", "llm", "embedder", "matcher")),
}
# how a file can carry a spec past a guard that reads each value as it stands
FORMS = {
    "spaced": lambda spec: f"  {spec}\t",
    "labelled": lambda spec: [f"x= {spec}"],
    "quoted": lambda spec: f"'{spec}'",
    "nested": lambda spec: [{"label": "x", "model": f" {spec} ", "options": {}}],
}


def _entry_point(tmp_path, command, settings, plugin):
    images = tmp_path / "images"
    images.mkdir(exist_ok=True)
    _png(images / "pic.png", RED)
    rows = _jsonl(tmp_path / "rows.jsonl", [{"id": "r", "image": str(images / "pic.png"), "caption": "red"}])
    bench = _jsonl(tmp_path / "bench.jsonl", [{"index": 1, "image": str(images / "pic.png"), "question": "Colour?",
                                               "A": "red", "B": "blue", "answer": "A", "category": "colour"}])
    config = tmp_path / "settings.yaml"
    config.write_text(json.dumps(settings), encoding="utf-8")  # JSON is YAML
    where = {"rows": rows, "images": images, "out": tmp_path / "run", "config": config, "bench": bench,
             "given": plugin.replace(":", "_given:")}
    return [word.format(**where) for word in ENTRY_POINTS[command][0]], config


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("command", ENTRY_POINTS)
def test_no_config_file_names_a_plugin_in_any_form_for_any_command(tmp_path, marker_plugin, command, form, capsys):
    key = ENTRY_POINTS[command][1][0]
    argv, config = _entry_point(tmp_path, command, {key: FORMS[form](marker_plugin),
                                                    "generator_options": {"command": "echo"}}, marker_plugin)
    code, _, err = _run(argv, capsys)
    assert code == 2 and "Traceback" not in err, err
    assert err.strip().splitlines()[-1].startswith(f"caprecon: error: {config}: {key}")
    assert err.strip().endswith(REFUSED.format(spec=marker_plugin))
    assert _untouched(tmp_path, marker_plugin)


@pytest.mark.parametrize("command", [c for c in ENTRY_POINTS if c != "suite file"])  # a suite file names no model
def test_a_plugin_the_file_scan_misses_is_still_refused_where_it_would_be_imported(tmp_path, marker_plugin,
                                                                                   monkeypatch, command, capsys):
    """Trust is decided where a spec is resolved: with the early scan blind, every command still
    refuses the file's plug-in when it builds the model, after its own parsing took the label off."""
    from caprecon.models import registry

    monkeypatch.setattr(registry, "plugins_in", lambda text: [])
    keys = ENTRY_POINTS[command][1]
    settings = {key: FORMS["labelled" if key.endswith("s") else "spaced"](marker_plugin) for key in keys}
    argv, config = _entry_point(tmp_path, command, settings, marker_plugin)
    code, _, err = _run(argv, capsys)
    assert code == 2 and "Traceback" not in err, err
    last = err.strip().splitlines()[-1]
    assert re.fullmatch(rf"caprecon: error: {re.escape(str(config))}: ({'|'.join(keys)})(\[0\])? names the plug-in "
                        rf"'(  )?{marker_plugin}(\\t)?', code the run would import and call; .*", last), last
    assert last.endswith(REFUSED.partition(", code the run would import and call")[2])
    assert _untouched(tmp_path, marker_plugin)


def test_a_toml_file_and_a_category_judge_are_refused_too(tmp_path, marker_plugin, capsys):
    _jsonl(tmp_path / "rows.jsonl", [{"id": "r", "caption": "red"}])
    judge_for = tmp_path / "judge-for.toml"
    judge_for.write_text(f'[judge_for]\ncolour = "  {marker_plugin}"\n', encoding="utf-8")
    code, _, err = _run(["score", "-i", tmp_path / "rows.jsonl", "--config", judge_for], capsys)
    assert code == 2 and f"judge_for.colour {REFUSED.format(spec=marker_plugin)}" in err
    assert _untouched(tmp_path, marker_plugin)


def test_allow_plugins_loads_them_and_the_command_line_needs_nothing(tmp_path, marker_plugin, capsys):
    _png(tmp_path / "pic.png", RED)
    rows = _jsonl(tmp_path / "rows.jsonl", [{"id": "r", "image": "pic.png", "caption": "red"}])
    config = tmp_path / "settings.yaml"
    config.write_text(json.dumps({"generator": marker_plugin}), encoding="utf-8")
    for flags in (["--allow-plugins", "score"], ["score", "--allow-plugins"]):
        _run([*flags, "-i", rows, "-m", "recon", "--config", config, "--out", tmp_path / "run"], capsys)
        assert (tmp_path / "called").exists()
        (tmp_path / "called").unlink()
    _run(["score", "-i", rows, "-m", "recon", "--generator", marker_plugin, "--out", tmp_path / "run2"], capsys)
    assert (tmp_path / "called").exists()


def test_prompts_and_urls_in_a_config_file_are_not_taken_for_plugins(tmp_path):
    from caprecon.run.config import load_config_file

    config = tmp_path / "ok.yaml"
    config.write_text('vqa_template: "Question: is the figure showing {caption}?"\n'
                      'judge_options: {base_url: "http://127.0.0.1:8000/v1"}\ntemplate: "photo:{caption}"\n'
                      'cache_dir: "C:\\\\caches\\\\caprecon"\n', encoding="utf-8")
    assert load_config_file(config) == {"vqa_template": "Question: is the figure showing {caption}?",
                                        "judge_options": {"base_url": "http://127.0.0.1:8000/v1"},
                                        "template": "photo:{caption}", "cache_dir": "C:\\caches\\caprecon"}


# --------------------------------------------------------------------------- 2: cttd import decodes and confines


def _png_bytes(colour, size=(40, 30)) -> bytes:
    """A PNG of `colour` with a little noise, so it is a few kilobytes (base64 over 512 characters)."""
    noise = np.random.default_rng(sum(colour)).integers(-8, 8, (size[1], size[0], 3))
    pixels = np.clip(np.array(colour)[None, None, :] + noise, 0, 255).astype(np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels, "RGB").save(buffer, format="PNG")
    return buffer.getvalue()


def test_cttd_import_writes_only_decoded_images_inside_the_root(tmp_path, capsys):
    root = tmp_path / "root"
    (root / "pics").mkdir(parents=True)
    ok = root / "pics" / "ok.png"
    ok.write_bytes(_png_bytes(RED))
    outside = tmp_path / "outside.png"
    outside.write_bytes(_png_bytes(BLUE))
    (root / "pics" / "link.png").symlink_to(outside)
    os.mkfifo(root / "pics" / "pipe.png")
    (root / "pics" / "text.png").write_text("not a picture\n")
    inline = base64.b64encode(_png_bytes(GREEN)).decode()
    assert len(inline) > 512  # the importer takes a long value for base64, a short one for a path
    questions = tmp_path / "elsewhere" / "q.jsonl"
    questions.parent.mkdir()
    rows = [("ok", "pics/ok.png"), ("passwd", "/etc/passwd"), ("dotdot", "../outside.png"),
            ("absolute", str(outside)), ("symlink", "pics/link.png"), ("fifo", "pics/pipe.png"),
            ("text", "pics/text.png"), ("missing", "pics/none.png"), ("inline", inline),
            ("badbase64", "@" * 600), ("notimage", base64.b64encode(b"plain text " * 60).decode())]
    _jsonl(questions, [{"image_id": i, "image": image, "question": "What colour?", "answer": "red"}
                       for i, image in rows])
    out = tmp_path / "bank"
    code, stdout, err = _run(["cttd", "import", questions, "--out", out, "--image-root", root], capsys)
    assert code == 1 and "Traceback" not in err
    # the two decodable images inside the root, byte for byte as given; nothing else
    assert sorted(p.name for p in (out / "images").iterdir()) == ["inline.png", "ok.png"]
    assert (out / "images" / "ok.png").read_bytes() == ok.read_bytes()
    assert (out / "images" / "inline.png").read_bytes() == base64.b64decode(inline)
    assert [json.loads(line)["image_id"] for line in (out / "bank.jsonl").open()] == ["ok", "inline"]
    expected = {  # image id -> reason, line of the question file
        "passwd": ("image outside --image-root", 2), "dotdot": ("image outside --image-root", 3),
        "absolute": ("image outside --image-root", 4), "symlink": ("image outside --image-root", 5),
        "fifo": ("image unreadable", 6), "text": ("image not decodable", 7), "missing": ("image not found", 8),
        "badbase64": ("image not base64", 10), "notimage": ("image not decodable", 11)}
    sheet = json.loads((out / "datasheet.json").read_text())
    assert {d["image_id"]: (d["reason"], int(d["where"].rsplit(":", 1)[1])) for d in sheet["dropped_questions"]} \
        == expected
    assert sheet["stages"][0]["dropped"] == {"image outside --image-root": 4, "image unreadable": 1,
                                             "image not decodable": 2, "image not found": 1, "image not base64": 1}
    assert err.splitlines()[0] == ("dropped: 9 question(s) whose image could not be used (image outside --image-root: "
                                   "4, image unreadable: 1, image not decodable: 2, image not found: 1, image not "
                                   "base64: 1); datasheet.json lists them")
    for image_id, (_, line) in expected.items():
        assert f"  {questions}:{line} (image {image_id}): " in err


def test_cttd_import_without_a_root_still_refuses_what_is_not_an_image(tmp_path):
    outside = tmp_path / "outside.png"
    outside.write_bytes(_png_bytes(BLUE))
    questions = _jsonl(tmp_path / "q.jsonl", [
        {"image_id": "passwd", "image": "/etc/passwd", "question": "What colour?", "answer": "red"},
        {"image_id": "hostname", "image": "../../../../../../etc/hostname", "question": "What colour?",
         "answer": "red"},
        {"image_id": "zero", "image": "/dev/zero", "question": "What colour?", "answer": "red"},
        {"image_id": "blue", "image": str(outside), "question": "What colour?", "answer": "blue"}])
    out = tmp_path / "bank"
    # in a bounded subprocess: an import that copies /dev/zero would otherwise fill the disk
    probe = _probe(f"""
import sys
from caprecon.cli import main
sys.exit(main(["cttd", "import", {str(questions)!r}, "--out", {str(out)!r}]))
""")
    assert probe.returncode == 1, probe.stderr[-2000:]
    assert [p.name for p in (out / "images").iterdir()] == ["blue.png"]  # no root given: any real image may come
    assert "dropped: 3 question(s)" in probe.stderr
    assert "/etc/passwd: not in any image format PIL reads" in probe.stderr
    assert "cannot read image /dev/zero: not a regular file (a device)" in probe.stderr


def test_cttd_import_of_a_vlmevalkit_tsv_names_a_row_whose_base64_is_no_image(tmp_path, capsys):
    good = base64.b64encode(_png_bytes(RED)).decode()
    bad = base64.b64encode(b"\x89PNG but nothing after it " * 10).decode()
    header = ["index", "image", "question", "A", "B", "answer", "category"]
    rows = [["1", good, "Colour?", "red", "blue", "A", "colour"], ["2", bad, "Colour?", "red", "blue", "A", "colour"],
            ["3", "1", "Is it red?", "", "", "Yes", "colour"]]
    tsv = tmp_path / "Bench.tsv"
    tsv.write_text("\n".join("\t".join(r) for r in [header, *rows]) + "\n")
    out = tmp_path / "bank"
    code, stdout, err = _run(["cttd", "import", tsv, "--out", out], capsys)
    assert code == 1 and "2 questions about 2 images" in stdout  # row 3 names row 1's image
    assert [json.loads(line)["id"] for line in (out / "bank.jsonl").open()] == ["1", "3"]
    assert err.splitlines()[1].startswith(f"  {tsv}:3 (image 2): cannot decode the image of {tsv}:3:")


# --------------------------------------------------------------------------- 1: CTTD build keeps to --images


def test_cttd_build_drops_a_link_out_of_the_image_folder(tmp_path):
    from cttd_fakes import TAXONOMY, ScriptedLLM, ScriptedVLM, WordMatcher
    from oracle import PixelEmbedder, render

    from caprecon.apps.cttd import BuildConfig, build_bank
    from caprecon.data.qa import load_qa_bank

    folder = tmp_path / "images" / "shapes"
    folder.mkdir(parents=True)
    scenes = ["a red circle and a blue square", "a green triangle", "a yellow square and a red circle"]
    for i, scene in enumerate(scenes):
        render(scene, 96, 96).save(folder / f"scene{i}.png")
    render("a blue circle", 96, 96).save(tmp_path / "private.png")
    (folder / "link.png").symlink_to(tmp_path / "private.png")
    taxonomy = tmp_path / "taxonomy.json"
    taxonomy.write_text(json.dumps(TAXONOMY))
    config = BuildConfig(embedder=PixelEmbedder(), matcher=WordMatcher(), vlm=ScriptedVLM(), llm=ScriptedLLM(),
                         taxonomy=str(taxonomy), density_band=(0, 1))
    result = build_bank(tmp_path / "images", tmp_path / "build", config, progress=False)
    select = next(s for s in result.datasheet["stages"] if s["stage"] == "select")
    assert select["dropped"] == {"unreadable (image outside --image-root)": 1}
    assert sorted(load_qa_bank(result.bank)) == ["scene0", "scene1", "scene2"]


# --------------------------------------------------------------------------- 3: credentials reach no output

URL_PASSWORD, BEARER, HEADER, UNUSED = "pw-url-5151", "tok-bearer-5252", "hdr-val-5353", "hdr-unused-5454"


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_secrets_never_reach_the_manifest_argv_logs_errors_stdout_or_report(tmp_path):
    """A judge behind a URL with a password and headers with a bearer token and a custom value,
    unreachable so that every row fails and the reason is printed, logged and written."""
    _png(tmp_path / "pic.png", RED)
    rows = _jsonl(tmp_path / "rows.jsonl", [{"id": "r", "image": "pic.png", "caption": "red"}])
    run = tmp_path / "run"
    headers = json.dumps({"headers": {"Authorization": f"Bearer {BEARER}", "X-Org": HEADER}})
    argv = [str(Path(sys.executable).parent / "caprecon"), "-v", "score", "-i", str(rows), "-m", "vqascore",
            "--judge", "m1", "--judge-opt", f"base_url=http://alice:{URL_PASSWORD}@127.0.0.1:{_closed_port()}/v1",
            "--judge-opt", "max_retries=1", "--judge-opt", "backoff=0", "--judge-opt", f"extra_body={headers}",
            "--llm-opt", "extra_body=" + json.dumps({"headers": {"X-Unused": UNUSED}}),  # an unused role's too
            "--no-cache", "--out", str(run)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 1, done.stderr[-3000:]
    assert "vqascore: model server failed" in done.stdout and "WARNING" in done.stderr  # the reason is shown, and logged
    report = subprocess.run([argv[0], "report", str(run)], capture_output=True, text=True, timeout=300)
    assert report.returncode == 0, report.stderr[-3000:]
    written = {str(p.relative_to(run)): p.read_text(errors="replace") for p in run.rglob("*")
               if p.is_file() and p.suffix in (".json", ".jsonl", ".html", ".csv", ".md", ".txt")}
    assert {"manifest.json", "scores.jsonl", "report.html"} <= set(written)
    manifest = json.loads(written["manifest.json"])
    assert manifest["command"][:3] == [argv[0], "-v", "score"]  # the argv copy is there, masked
    assert "http://***@127.0.0.1" in written["manifest.json"]
    for where, text in {"stdout": done.stdout, "stderr": done.stderr, "report stdout": report.stdout,
                        "report stderr": report.stderr, **written}.items():
        for secret in (URL_PASSWORD, "alice:", BEARER, HEADER, UNUSED):
            assert secret not in text, (secret, where)


def test_a_headers_mapping_written_as_text_is_masked_whole():
    import logging

    from caprecon.core.redaction import RedactingFilter, redact, redact_text

    assert redact(["--llm-opt", 'extra_body={"headers": {"X-Org": "hdr-text-6161"}}']) == \
        ["--llm-opt", 'extra_body={"headers": ***}']
    assert redact_text("headers={'X-Trace': 'hdr-text-6262', 'X-B': 'hdr-text-6363'}, model=m") == \
        "headers=***, model=m"
    record = logging.LogRecord("caprecon", logging.INFO, __file__, 1, "sending %s", (
        'default_headers: {"Authorization": "Basic aGRyLXRleHQ6NjQ2NA==", "X-Quote": "a \\"}\\" b"} next',), None)
    assert RedactingFilter().filter(record) and record.getMessage() == "sending default_headers: *** next"
    # each value, once seen, is masked wherever it appears alone
    assert redact_text("hdr-text-6161 hdr-text-6262 hdr-text-6363 aGRyLXRleHQ6NjQ2NA==") == "*** *** *** ***"


def test_a_malformed_header_option_stops_in_one_line_that_does_not_echo_it(tmp_path, capsys):
    _png(tmp_path / "pic.png", RED)
    rows = _jsonl(tmp_path / "rows.jsonl", [{"id": "r", "image": "pic.png", "caption": "red"}])
    code, out, err = _run(["score", "-i", rows, "-m", "vqascore", "--judge", "m1", "--judge-opt",
                           'extra_body={"headers": {"Authorization": "Bearer tok-yaml-6565"}'], capsys)
    assert code == 2 and "tok-yaml-6565" not in out + err and "Traceback" not in err
    # the value has 53 characters: YAML finds the mapping unclosed one past its end
    assert err.strip() == ("caprecon: error: option extra_body: its value is not valid YAML at character 54 "
                           "(expected ',' or '}', but got '<stream end>')")


# --------------------------------------------------------------------------- 4: the suites read images the same way


def test_a_suite_image_over_the_byte_cap_is_refused_naming_its_row(tmp_path):
    from caprecon.apps.suites import load_suites
    from caprecon.apps.suites.loaders import SuiteFormatError, load_benchmark

    huge = tmp_path / "huge.png"
    with huge.open("wb") as fh:  # sparse: no disk is used
        fh.truncate(64 * 1024 * 1024 + 1)
    data = _jsonl(tmp_path / "bench.jsonl", [{"index": 1, "image": "huge.png", "question": "Colour?",
                                              "A": "red", "B": "blue", "answer": "A", "category": "colour"}])
    entry = load_suites(["mmbench"], [str(data)])[0]
    with pytest.raises(SuiteFormatError) as refused:
        load_benchmark(entry, {})
    assert str(refused.value) == (f"{data}:1: image {huge} holds 67108865 bytes, over the limit of 67108864 "
                                  f"(--max-image-bytes)")


# --------------------------------------------------------------------------- 7: --no-cache writes nothing there


def test_no_cache_writes_nothing_to_the_cache_folder(tmp_path, tiny_clip):
    _png(tmp_path / "pic.png", RED)
    rows = _jsonl(tmp_path / "rows.jsonl", [{"id": "r", "image": "pic.png", "caption": "red"}])

    def cache_after(*flags):
        cache = tmp_path / f"cache{len(flags)}"
        done = subprocess.run([sys.executable, "-m", "caprecon.cli", "score", "-i", str(rows), "-m", "clipscore",
                               "--clip", str(tiny_clip), *flags, "--out", str(tmp_path / f"run{len(flags)}"), "-q"],
                              capture_output=True, text=True, timeout=300,
                              env={**os.environ, "HF_HUB_OFFLINE": "1", "CAPRECON_CACHE": str(cache)})
        assert done.returncode == 0, done.stderr[-2000:]
        return sorted(p.name for p in cache.rglob("*")) if cache.exists() else []

    assert "digests.sqlite" in cache_after()  # the file-digest memo, which --no-cache wrote too
    assert cache_after("--no-cache") == []


def test_report_writes_nothing_through_a_link_out_of_the_run_folder(tmp_path, tiny_clip, capsys):
    _png(tmp_path / "pic.png", RED)
    rows = _jsonl(tmp_path / "rows.jsonl", [{"id": "r", "image": "pic.png", "caption": "red"}])
    run = tmp_path / "run"
    assert _run(["score", "-i", rows, "-m", "clipscore", "--clip", tiny_clip, "--cache-dir", tmp_path / "cache",
                 "--out", run, "-q"], capsys)[0] == 0
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    for name in ("report_files", "report.html"):
        shutil.rmtree(run / "report_files")
        (run / "report.html").unlink(missing_ok=True)
        (run / name).symlink_to(elsewhere / name if name == "report.html" else elsewhere)
        code, _, err = _run(["report", run], capsys)
        assert code == 2 and "Traceback" not in err
        assert err.strip() == (f"caprecon: error: {run / name} is a link to {elsewhere / name if name == 'report.html' else elsewhere}, "
                               f"outside {run}: the report writes only inside its folder; remove the link (or give "
                               f"--out another folder)")
        assert list(elsewhere.iterdir()) == []
        (run / name).unlink()
        (run / "report_files").mkdir()
    inside = run / "charts"  # a link that stays inside the folder is the user's own layout
    inside.mkdir()
    shutil.rmtree(run / "report_files")
    (run / "report_files").symlink_to(inside)
    assert _run(["report", run], capsys)[0] == 0 and (inside / "thumbs").is_dir()
