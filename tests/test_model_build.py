"""Every command builds its models one way (`caprecon.models.build.build_model`): the secrets
among their options never reach a file of the run, a text-only model given as a judge stops
the run before any work with one message, and a value a backend refuses is one line and
exit 2, whatever the command."""

import base64
import io
import json
from pathlib import Path

import pytest

from caprecon.cli import main
from caprecon.core.errors import ConfigError
from cttd_fakes import ScriptedLLM, ScriptedVLM, write_example
from oracle import OracleGenerator, render
from tiny_vlm import build_qwen2_lm, build_qwen2_vl

# the module's classes, as a user names a model class: `module:Class`
HERE = Path(__file__).stem


def url_with_password(password: str) -> str:
    return f"http://user:{password}@127.0.0.1:9/v1"


class KeyedJudge(ScriptedVLM):
    """The scripted judge taking what a served model takes (an API key, the server's URL) and
    describing itself with that URL, as the OpenAI-compatible backends do."""

    def __init__(self, model=None, *, api_key=None, base_url=None):
        super().__init__()
        self.base_url = base_url

    def describe(self) -> dict:
        return {**super().describe(), "base_url": self.base_url}


class KeyedLLM(ScriptedLLM):
    def __init__(self, model=None, *, api_key=None, base_url=None):
        super().__init__()
        self.base_url = base_url

    def describe(self) -> dict:
        return {"backend": "scripted-llm", "base_url": self.base_url, "fingerprint": self.fingerprint}


class KeyedGenerator(OracleGenerator):
    def __init__(self, model=None, *, api_key=None, base_url=None):
        self.base_url = base_url

    def describe(self) -> dict:
        return {"backend": "oracle", "base_url": self.base_url, "fingerprint": self.fingerprint}


class KeyedCaptioner:
    """Names a shape n times over, numbered; counts the images it was asked about."""

    calls = 0

    def __init__(self, model=None, *, api_key=None, base_url=None):
        self.base_url = base_url

    fingerprint = "keyed-captioner-v1"

    def describe(self) -> dict:
        return {"backend": "keyed-captioner", "base_url": self.base_url, "fingerprint": self.fingerprint}

    def caption(self, requests, sampling):
        KeyedCaptioner.calls += len(requests)
        return [[f"a red circle, take {k}" for k in range(r.n)] for r in requests]


@pytest.fixture(scope="module")
def text_lm(tmp_path_factory):
    return build_qwen2_lm(tmp_path_factory.mktemp("text-lm") / "qwen2")


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """One input of every command's kind: scored rows, a caption set, an image folder, a
    benchmark file and its captions, the CTTD example (images and taxonomy)."""
    root = tmp_path_factory.mktemp("inputs")
    images = root / "images"
    images.mkdir()
    for name, scene in (("one", "a red circle"), ("two", "a blue square")):
        render(scene, 48, 48).save(images / f"{name}.png")
    rows = root / "rows.jsonl"
    rows.write_text("".join(json.dumps({"id": n, "image": str(images / f"{n}.png"), "caption": c}) + "\n"
                            for n, c in (("one", "a red circle"), ("two", "a blue square"))))
    captions = root / "captions.jsonl"
    captions.write_text("".join(json.dumps({"id": n, "caption": c}) + "\n"
                                for n, c in (("one", "a red circle"), ("two", "a blue square"))))
    picture = io.BytesIO()
    render("a green triangle", 40, 40).save(picture, format="PNG")
    bench = root / "mmbench.tsv"
    bench.write_text("index\tquestion\tA\tB\tanswer\timage\n"
                     f"1\tWhat colour is the shape?\tgreen\tred\tA\t{base64.b64encode(picture.getvalue()).decode()}\n")
    published = root / "published.jsonl"
    published.write_text(json.dumps({"dataset": "mmbench", "index": "1", "caption": "a green triangle"}) + "\n")
    write_example(root / "cttd")
    return {"rows": rows, "captions": captions, "images": images, "bench": bench, "published": published,
            "cttd_images": root / "cttd" / "shapes", "taxonomy": root / "cttd" / "taxonomy.json"}


def commands(inputs, out: Path, judge: list[str]) -> dict[str, list[str]]:
    """Each command's argv, with `judge` (options and all) as its judge."""
    captioner = f"{HERE}:KeyedCaptioner"
    return {
        "score": ["score", "-i", str(inputs["rows"]), "-m", "vqascore", *judge, "--no-cache", "--out",
                  str(out / "score"), "-q"],
        "t2i": ["t2i", "-i", str(inputs["captions"]), "-g", f"{HERE}:KeyedGenerator", *judge, "--size", "32x32",
                "--bootstrap", "20", "--no-cache", "--out", str(out / "t2i"), "-q"],
        "suite": ["suite", "--suite", "mmbench", "--data", str(inputs["bench"]), "--captioner", f"keyed={captioner}",
                  "--captions", f"published={inputs['published']}", "--generator", f"{HERE}:KeyedGenerator",
                  *judge, "--size", "32x32", "--no-cache", "--out", str(out / "suite"), "-q"],
        "caption": ["caption", "--images", str(inputs["images"]), "--captioner", captioner, "--n", "2", "--select",
                    "vqascore", *judge, "--no-cache", "--out", str(out / "caption"), "-q"],
        "cttd build": ["cttd", "build", "--images", str(inputs["cttd_images"]), "--out", str(out / "cttd"),
                       "--vlm", f"{HERE}:KeyedJudge", *judge, "--llm", f"{HERE}:KeyedLLM", "--embedder",
                       "oracle:PixelEmbedder", "--matcher", "cttd_fakes:WordMatcher", "--taxonomy",
                       str(inputs["taxonomy"]), "--density-band", "0", "1", "--quiet",
                       "--allow-row-errors"],  # its unreadable image and non-JSON replies are counted failures
    }


def files_holding(folder: Path, secrets: list[str]) -> dict[str, list[str]]:
    found = {}
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            data = path.read_bytes()
            held = [s for s in secrets if s.encode() in data]
            if held:
                found[str(path.relative_to(folder))] = held
    return found


# every model a command builds gets a key and a URL with a password; each command its own
# secrets, since values seen once are masked for the rest of the process
EXTRA_OPTIONS = {
    "score": [],
    "t2i": ["--generator-opt", "api_key={key}-generator"],
    "suite": ["--generator-opt", "api_key={key}-generator", "--captioner-opt", "api_key={key}-captioner",
              "--captioner-opt", "base_url={url}"],
    "caption": ["--captioner-opt", "api_key={key}-captioner", "--captioner-opt", "base_url={url}"],
    "cttd build": ["--vlm-opt", "api_key={key}-vlm", "--vlm-opt", "base_url={url}", "--llm-opt", "api_key={key}-llm",
                   "--llm-opt", "base_url={url}"],
}


@pytest.mark.parametrize("command", list(EXTRA_OPTIONS))
def test_no_secret_reaches_a_file_of_the_run(command, inputs, tmp_path, capsys):
    tag = command.replace(" ", "")
    key, password = f"SECRET{tag}KEY123", f"PASSWORD{tag}456"
    judge = ["--judge", f"{HERE}:KeyedJudge", "--judge-opt", f"api_key={key}-judge", "--judge-opt",
             f"base_url={url_with_password(password)}"]
    if command == "cttd build":  # the questioner checks its own answers: its options are the judge's
        judge = []
    extra = [a.format(key=key, url=url_with_password(password)) for a in EXTRA_OPTIONS[command]]
    argv = commands(inputs, tmp_path / "runs", judge)[command] + extra
    assert main(argv) == 0, capsys.readouterr().err
    written = tmp_path / "runs" / tag.replace("build", "")
    assert (written / ("datasheet.json" if command == "cttd build" else "manifest.json")).is_file()
    assert files_holding(tmp_path / "runs", [key]) == {}
    # the password inside a URL is masked by the redactor itself (core/redaction.py)
    assert files_holding(tmp_path / "runs", [password]) == {}
    printed = capsys.readouterr()
    assert key not in printed.out + printed.err and password not in printed.out + printed.err


def test_a_text_only_model_as_judge_stops_every_command_before_any_work(inputs, text_lm, tmp_path, capsys):
    argvs = commands(inputs, tmp_path / "runs", ["--judge", str(text_lm)])
    said = {}
    for command, argv in argvs.items():
        OracleGenerator.calls = KeyedCaptioner.calls = 0
        code = main(argv)
        err = capsys.readouterr().err
        said[command] = err.strip().splitlines()[-1] if err.strip() else ""
        assert code == 2, (command, err)
        assert OracleGenerator.calls == 0 and KeyedCaptioner.calls == 0, command
        run = tmp_path / "runs" / command.replace(" build", "")
        assert not [p for p in run.rglob("*") if p.suffix in (".jsonl", ".json")], command
    assert len(set(said.values())) == 1, said
    message = said["score"]
    assert message.startswith(f"caprecon: error: --judge {text_lm}: ") and "text-only" in message, message
    assert "qwen2" in message


def test_a_text_only_captioner_and_a_language_model_as_generator_stop_the_run(inputs, text_lm, tmp_path, capsys):
    argvs = commands(inputs, tmp_path / "runs", ["--judge", f"{HERE}:KeyedJudge"])
    caption = [a if a != f"{HERE}:KeyedCaptioner" else str(text_lm) for a in argvs["caption"]]
    assert main(caption) == 2
    assert f"--captioner {text_lm}: " in capsys.readouterr().err
    for command in ("t2i", "suite"):
        argv = [str(text_lm) if a == f"{HERE}:KeyedGenerator" else a for a in argvs[command]]
        assert main(argv) == 2, command
        err = capsys.readouterr().err
        assert f"--generator {text_lm}: not a diffusers text-to-image pipeline" in err, (command, err)
        assert "it holds a qwen2 model" in err


def test_a_value_the_backend_refuses_is_one_line_and_exit_2_in_every_command(inputs, tmp_path, capsys):
    # a served judge whose URL is not one: the backend refuses it when built
    argvs = commands(inputs, tmp_path / "runs", ["--judge", "served-judge", "--judge-opt", "base_url=not-a-url"])
    said = {}
    for command, argv in argvs.items():
        code = main(argv)
        err = capsys.readouterr().err
        assert code == 2 and "Traceback" not in err, (command, err)
        said[command] = err.strip().splitlines()[-1]
    assert len(set(said.values())) == 1, said
    assert said["score"] == ("caprecon: error: --judge 'served-judge': bad judge or options (base_url='not-a-url'): "
                             "base_url must look like http://HOST:PORT/v1, not 'not-a-url'")
    caption = argvs["caption"] + ["--captioner-opt", "base_url=not-a-url"]
    caption[caption.index(f"{HERE}:KeyedCaptioner")] = "served-captioner"
    caption[caption.index("--judge") + 1:caption.index("--judge") + 4] = [f"{HERE}:KeyedJudge"]
    assert main(caption) == 2
    assert "--captioner 'served-captioner': bad captioner or options" in capsys.readouterr().err


def test_build_model_registers_secrets_and_checks_the_kind(tmp_path, text_lm):
    from caprecon.core.redaction import redact_text
    from caprecon.models.build import build_model

    judge = build_model("judge", f"{HERE}:KeyedJudge", {"api_key": "built-key-789"}, setting="judge")
    assert isinstance(judge, KeyedJudge)
    assert redact_text("the key built-key-789 said") == "the key *** said"  # masked from the moment it is built
    with pytest.raises(ConfigError, match="this run needs a judge: set --judge"):
        build_model("judge", None, {}, setting="judge")
    with pytest.raises(ConfigError, match="text-only"):
        build_model("captioner", str(text_lm), {}, setting="captioner")
    # a text-only model is what the text roles want
    assert build_model("llm", str(text_lm), {}, setting="llm").source.path == text_lm.resolve()
    vlm = build_qwen2_vl(tmp_path / "vlm")
    assert build_model("judge", str(vlm), {}, setting="judge").source.path == vlm.resolve()


def test_a_registered_name_whose_module_is_missing_is_a_one_line_config_error(monkeypatch):
    """A plug-in registered under a name whose module cannot be imported stops with a
    ConfigError naming it, not an import traceback."""
    from caprecon.models import registry
    from caprecon.models.build import build_model

    table = dict(registry.ROLES["generator"][0])
    monkeypatch.setitem(registry.ROLES, "generator", (table, registry.ROLES["generator"][1]))
    registry.register("generator", "bogus-gen", "no_such_module_xyz:Generator")
    with pytest.raises(ConfigError, match="no_such_module_xyz"):
        build_model("generator", "bogus-gen")


def test_caprecon_build_is_the_commands_builder(text_lm):
    import caprecon
    from caprecon.core.redaction import redact_text

    judge = caprecon.build("judge", f"{HERE}:KeyedJudge", api_key="public-key-456")
    assert isinstance(judge, KeyedJudge)
    assert redact_text("the key public-key-456 said") == "the key *** said"
    with pytest.raises(ConfigError, match="text-only"):
        caprecon.build("judge", str(text_lm))


@pytest.mark.parametrize("metric", ["VQAScore", "Fleur"])
def test_a_metric_given_a_model_path_builds_it_as_the_commands_do(metric, text_lm):
    import caprecon

    with pytest.raises(ConfigError, match=f"--judge {text_lm}: .*text-only"):
        getattr(caprecon, metric)(str(text_lm))


def test_clipscore_called_on_a_clip_path_matches_the_score_command(tiny_clip, tmp_path):
    import numpy as np
    from PIL import Image

    import caprecon

    rng = np.random.default_rng(1)
    images = [Image.fromarray(rng.integers(0, 255, (24, 32, 3), dtype=np.uint8)) for _ in range(2)]
    captions = ["a red square", "two boats on a lake"]
    rows = []
    for i, image in enumerate(images):
        image.save(tmp_path / f"{i}.png")
        rows.append({"id": str(i), "image": str(tmp_path / f"{i}.png"), "caption": captions[i]})
    (tmp_path / "in.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    called = caprecon.ClipScore(str(tiny_clip))(images, captions)
    assert main(["score", "-i", str(tmp_path / "in.jsonl"), "-m", "clipscore", "--clip", str(tiny_clip),
                 "--out", str(tmp_path / "run"), "--cache-dir", str(tmp_path / "cache"), "--quiet"]) == 0
    scored = [json.loads(line)["clipscore"] for line in (tmp_path / "run" / "scores.jsonl").open()]
    assert called == pytest.approx(scored, abs=1e-6) and len(set(called)) == 2
