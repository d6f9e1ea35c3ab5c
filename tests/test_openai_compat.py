"""OpenAI-compatible backends against real HTTP servers on loopback.

Two servers, each started here as a subprocess on 127.0.0.1 and stopped at session end,
serve the same tiny random-weight LLaMA built locally (no hub access):

- `tests/openai_server.py`, which returns logprobs and accepts images, for every
  probability path and the injected failures (503/429, slow answers, missing logprobs);
- `transformers serve`, a third-party server that ignores `logprobs`, for free-form
  generation and the missing-logprobs error as a real server produces it.
"""

from __future__ import annotations

import math
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import httpx
import caprecon
import pytest
from PIL import Image

from caprecon.models.llm import TextLLM
from caprecon.models.openai_compat import (LogprobsUnavailableError, OpenAICompatError, OpenAICompatLLM, OpenAICompatTimeout, OpenAICompatVLM, _token_prob, encode_image)
from caprecon.models.vlm import VisionLanguageModel, VLMRequest

SERVED = "tiny-judge"
SERVER_SCRIPT = Path(__file__).with_name("openai_server.py")
STARTUP_LIMIT = 90  # seconds; a cold import of torch and transformers on a slow CI runner


def _server_env() -> dict:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
            "PYTHONUNBUFFERED": "1"}


@pytest.fixture(scope="module", autouse=True)
def _loopback_bypasses_proxies():
    # httpx honours HTTP(S)_PROXY even for 127.0.0.1; a CI proxy must not see the test servers
    with pytest.MonkeyPatch.context() as patch:
        for name in ("NO_PROXY", "no_proxy"):
            patch.setenv(name, ",".join(filter(None, [os.environ.get(name), "127.0.0.1"])))
        yield


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@dataclass
class _Launched:
    proc: subprocess.Popen
    log_path: Path
    url_of: Callable[[], str | None]  # the server's root URL once known

    def wait_ready(self) -> str:
        """Poll /health within a bounded time; fail with the server's log if it dies or stalls."""
        deadline = time.monotonic() + STARTUP_LIMIT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"server exited with {self.proc.returncode} before it was ready:\n{self._log_tail()}")
            root = self.url_of()
            if root is not None:
                try:
                    if httpx.get(f"{root}/health", timeout=1).status_code == 200:
                        return root
                except httpx.TransportError:
                    pass
            time.sleep(0.1)
        pytest.fail(f"server not ready within {STARTUP_LIMIT} s:\n{self._log_tail()}")

    def _log_tail(self) -> str:
        return self.log_path.read_text()[-3000:]

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _launch(command: list[str], log_path: Path, url_of) -> _Launched:
    with open(log_path, "w") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=_server_env())
    return _Launched(proc, log_path, url_of)


@pytest.fixture(scope="session")
def tiny_lm(tmp_path_factory) -> Path:
    from openai_server import build_tiny_lm  # tests/ is on sys.path (conftest.py)

    return build_tiny_lm(tmp_path_factory.mktemp("tiny_lm"))


@pytest.fixture(scope="session")
def launched(tiny_lm, tmp_path_factory):
    """Both servers, started together so that their imports and model loads overlap."""
    work = tmp_path_factory.mktemp("servers")
    port_file = work / "port"

    def own_url():
        port = port_file.read_text() if port_file.exists() else ""
        return f"http://127.0.0.1:{port}" if port else None

    servers = {"own": _launch([sys.executable, str(SERVER_SCRIPT), "--model", str(tiny_lm), "--served-name",
                               SERVED, "--port-file", str(port_file)], work / "own.log", own_url)}
    cli = Path(sys.executable).with_name("transformers")
    if cli.exists():
        # transformers serve cannot bind port 0 and report it, so it gets a port just seen free
        port = _free_port()
        servers["transformers"] = _launch(
            [str(cli), "serve", str(tiny_lm), "--host", "127.0.0.1", "--port", str(port), "--device", "cpu"],
            work / "transformers.log", lambda: f"http://127.0.0.1:{port}")
    try:
        yield servers
    finally:
        for server in servers.values():
            server.stop()


@pytest.fixture(scope="session")
def server(launched) -> str:
    """Base URL (".../v1") of the test server."""
    return launched["own"].wait_ready() + "/v1"


@pytest.fixture(scope="session")
def transformers_server(launched) -> str:
    """Base URL of `transformers serve` pinned to the tiny model, which it serves under its path."""
    if "transformers" not in launched:
        pytest.skip("the `transformers` CLI is not installed next to this interpreter")
    return launched["transformers"].wait_ready() + "/v1"


class Faults:
    """The test server's failure switches and request counters."""

    def __init__(self, base_url: str):
        self.root = base_url.removesuffix("/v1")

    def set(self, **switches) -> None:
        httpx.post(f"{self.root}/_test/faults", json=switches, timeout=5).raise_for_status()

    def stats(self) -> dict:
        return httpx.get(f"{self.root}/_test/stats", timeout=5).json()

    def reset_peak(self) -> None:
        httpx.delete(f"{self.root}/_test/stats", timeout=5).raise_for_status()


@pytest.fixture
def faults(server):
    """Failure switches on the test server, all cleared after the test."""
    switches = Faults(server)
    yield switches
    switches.set(fail_next=0, status=503, delay=0.0, logprobs=True, script=None)


def _image(colours) -> Image.Image:
    """A 32x32 picture whose four quadrants have the given colours."""
    image = Image.new("RGB", (32, 32))
    for (x, y), colour in zip([(0, 0), (16, 0), (0, 16), (16, 16)], colours):
        image.paste(colour, (x, y, x + 16, y + 16))
    return image


RED, BLUE, GREEN, WHITE = (255, 0, 0), (0, 0, 255), (0, 255, 0), (255, 255, 255)
IMAGES = {"red": _image([RED] * 4), "mixed": _image([RED, BLUE, GREEN, WHITE]), "blue": _image([BLUE] * 4)}
MCQ = "Question: what colour is the sky in the image?\nA red\nB blue\nC green\nD white\nAnswer with the letter only."
YES_NO = "Is there a dog in the image? Answer Yes or No."


def _requests() -> list[VLMRequest]:
    return [VLMRequest(IMAGES[key], prompt, key) for key in IMAGES for prompt in (MCQ, YES_NO)]


def _options(requests) -> list[list[str]]:
    return [["A", "B", "C", "D"] if r.prompt == MCQ else ["Yes", "No"] for r in requests]


def test_backends_satisfy_role_protocols():
    vlm = OpenAICompatVLM(SERVED, "http://127.0.0.1:9")  # nothing listens there: construction is offline
    assert isinstance(vlm, VisionLanguageModel)
    assert isinstance(OpenAICompatLLM(SERVED, "http://127.0.0.1:9"), TextLLM)
    assert vlm.base_url == "http://127.0.0.1:9/v1"
    assert vlm.describe()["fingerprint"] == vlm.fingerprint
    assert "api_key" not in vlm.describe()
    same = OpenAICompatVLM(SERVED, "http://127.0.0.1:9/v1/", max_concurrency=1, timeout=5)
    assert same.fingerprint == vlm.fingerprint  # transport settings do not change answers
    for changed in (OpenAICompatVLM("other", "http://127.0.0.1:9"),
                    OpenAICompatVLM(SERVED, "http://127.0.0.1:9", image_format="jpeg"),
                    OpenAICompatVLM(SERVED, "http://127.0.0.1:9", top_logprobs=5),
                    OpenAICompatLLM(SERVED, "http://127.0.0.1:9")):
        assert changed.fingerprint != vlm.fingerprint
    with pytest.raises(ValueError, match="top_logprobs"):
        OpenAICompatVLM(SERVED, "http://127.0.0.1:9", top_logprobs=50)


def test_token_matching_reads_every_option_by_one_rule():
    """One token per option, spelled exactly as the option (t2v_metrics' rule for API judges:
    the top-logprob entry whose token is the answer): nothing summed over whitespace or case."""
    top = [{"token": "Yes", "logprob": math.log(0.3)}, {"token": " Yes", "logprob": math.log(0.2)},
           {"token": "yes", "logprob": math.log(0.1)}, {"token": " no", "logprob": math.log(0.05)}]
    assert _token_prob(top, "Yes") == pytest.approx(0.3)  # not 0.5: " Yes" is another token
    assert _token_prob(top, " Yes") == pytest.approx(0.2)
    assert _token_prob(top, "yes") == pytest.approx(0.1)
    assert _token_prob(top, "no") is None  # only " no" is there: unknown, not borrowed from it
    assert _token_prob(top, "No") is None
    assert _token_prob(top, "Maybe") is None
    with pytest.raises(ValueError, match="empty or whitespace"):
        _token_prob(top, " ")


def test_the_issue_distribution_gives_one_rule_not_a_case_fallback():
    """top-k {yes: .4, No: .1, no: .1}: P(yes | yes/no) by one rule is .4 / .6, where reading
    "Yes" by its lower-case token when no exact one exists gave .8."""
    from caprecon.metrics.vqascore import NO, YES

    top = [{"token": "yes", "logprob": math.log(0.4)}, {"token": "No", "logprob": math.log(0.1)},
           {"token": "no", "logprob": math.log(0.1)}]
    known = [p for p in (_token_prob(top, o) for o in (*YES, *NO)) if p is not None]
    assert sum(known[:1]) / sum(known) == pytest.approx(0.4 / 0.6)


SCRIPTED = {"yes": math.log(0.4), "No": math.log(0.1), "no": math.log(0.1), "Maybe": math.log(0.3),
            "Perhaps": math.log(0.06), ".": math.log(0.04)}


def test_server_and_local_backend_agree_on_one_distribution(server, faults):
    """The same next-token distribution through both paths: the server's top-k, and the local
    backend's full-vocabulary softmax read at each option's token (`answer_rows`, `probs_of`)."""
    import torch

    from caprecon.models.llm import answer_rows, probs_of

    vocab = list(SCRIPTED)
    logits = torch.tensor([[[SCRIPTED[t] for t in vocab]]])
    local = answer_rows(logits, [0], [1])[0]
    faults.set(script=[{"token": "yes", "top": SCRIPTED}])
    vlm = OpenAICompatVLM(SERVED, server, top_logprobs=20)
    options = ["yes", "No", "no", "Maybe"]
    served = vlm.option_probs(_requests()[:1], [options])[0]
    assert served == pytest.approx(probs_of(local, [vocab.index(o) for o in options]), rel=1e-6)


# one next-token distribution with case and whitespace variants of both answers
VARIANTS = {"Yes": 0.30, " Yes": 0.20, "yes": 0.10, " yes": 0.05, "YES": 0.05,
            "No": 0.12, " No": 0.08, "no": 0.04, " no": 0.02, ".": 0.04}


def test_case_and_whitespace_variants_are_each_their_own_token_over_a_server(server, faults, tmp_path):
    """Each option is the one token spelled as it: P("Yes") .30, not .30 + .20 for " Yes"; VQAScore
    normalised over Yes/yes and No/no is (.30 + .10) / (.30 + .10 + .12 + .04), by hand. A served
    template that ends its prompt on a word (`reply_space`) starts the reply with a space: then the
    options are " Yes", " yes", " No", " no": (.20 + .05) / (.20 + .05 + .08 + .02)."""
    faults.set(script=[{"token": "Yes", "top": {t: math.log(p) for t, p in VARIANTS.items()}}])
    options = ["Yes", "yes", "No", "no"]
    vlm = OpenAICompatVLM(SERVED, server)
    assert vlm.option_probs(_requests()[:1], [options])[0] == pytest.approx([0.30, 0.10, 0.12, 0.04], abs=1e-9)
    spaced = OpenAICompatVLM(SERVED, server, reply_space=True)
    assert spaced.option_probs(_requests()[:1], [options])[0] == pytest.approx([0.20, 0.05, 0.08, 0.02], abs=1e-9)
    assert spaced.fingerprint != vlm.fingerprint  # another token is read: another cache key
    picture = tmp_path / "red.png"
    IMAGES["red"].save(picture)
    sample = caprecon.Sample(id="a", image=picture, caption="a red picture")
    for judge, expected in ((vlm, 0.40 / 0.56), (spaced, 0.25 / 0.35)):
        normalised = caprecon.score([sample], ["vqascore"], judge=judge, vqa_normalise=True, no_cache=True)
        assert normalised.records[0]["vqascore"] == pytest.approx(expected, abs=1e-9)
        plain = caprecon.score([sample], ["vqascore"], judge=judge, no_cache=True)
        assert plain.records[0]["vqascore"] == pytest.approx(0.30 if judge is vlm else 0.20, abs=1e-9)


def test_one_token_rule_gives_the_same_number_over_the_server_and_locally(server, tiny_lm):
    """The same tiny LM and prompt, served and loaded locally, both with " Yes"/" No" in the top-k
    beside "Yes"/"No": each option's probability, and VQAScore's normalised P(yes), agree to 1e-6
    (they were 0.6417 over the server, which summed " Yes" into "Yes", against 0.7409 locally).
    The expected values come from the model's own forward pass here: the full-vocabulary softmax
    after the chat template's generation prompt, read at the vocabulary entry spelled as each option."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from caprecon.models.llm import TransformersLLM

    prompt = "Is there a dog in the picture? Answer Yes or No."
    options = ["Yes", "yes", "No", "no"]
    tokenizer = AutoTokenizer.from_pretrained(tiny_lm)
    model = AutoModelForCausalLM.from_pretrained(tiny_lm, dtype=torch.float32).eval()
    ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                        return_tensors="pt", return_dict=True)["input_ids"]
    with torch.no_grad():
        probs = torch.softmax(model(ids).logits[0, -1].double(), dim=-1)
    option_ids = [tokenizer.convert_tokens_to_ids(o) for o in options]
    assert [tokenizer.decode([i]) for i in option_ids] == options
    expected = [float(probs[i]) for i in option_ids]
    spaced = [float(probs[tokenizer.convert_tokens_to_ids("\u0120" + o)]) for o in options]
    top = set(torch.topk(probs, 20).indices.tolist())
    assert {tokenizer.convert_tokens_to_ids("\u0120" + o) for o in ("Yes", "No")} <= top  # variants in the top-k
    assert min(spaced) > 1e-3  # summing them in would move the numbers far beyond 1e-6

    served = OpenAICompatLLM(SERVED, server).option_probs([prompt], [options])[0]
    local = TransformersLLM(str(tiny_lm), device="cpu").option_probs([prompt], [options])[0]
    assert served == pytest.approx(expected, abs=1e-6)
    assert local == pytest.approx(expected, abs=1e-6)
    def normalised(p):  # VQAScore's P(yes) over Yes/yes and No/no
        return (p[0] + p[1]) / sum(p)

    assert normalised(served) == pytest.approx(normalised(local), abs=1e-6)
    assert normalised(served) == pytest.approx(normalised(expected), abs=1e-6)


def test_an_option_outside_the_top_k_is_unknown_and_its_row_says_why(server, faults, tmp_path):
    """"Yes" is not among the top 3 (yes .4, Maybe .3, No .1): VQAScore's row is an error with the
    reason, never 0 or 0.5; normalised, the known variants give (.4) / (.4 + .1)."""
    faults.set(script=[{"token": "yes", "top": SCRIPTED}])
    vlm = OpenAICompatVLM(SERVED, server, top_logprobs=3)
    probs = vlm.option_probs(_requests()[:1], [["Yes", "yes", "No", "no"]])[0]
    assert math.isnan(probs[0]) and math.isnan(probs[3]) and probs[1:3] == pytest.approx([0.4, 0.1])
    picture = tmp_path / "red.png"
    IMAGES["red"].save(picture)
    sample = caprecon.Sample(id="a", image=picture, caption="a red picture")
    plain = caprecon.score([sample], ["vqascore"], judge=vlm, no_cache=True)
    assert plain.records[0].get("vqascore") is None
    assert "'Yes' is not among the top-k" in plain.records[0]["error"]
    assert plain.records[0]["error_reasons"] == ["vqascore: answer outside the top-k"]
    normalised = caprecon.score([sample], ["vqascore"], judge=vlm, vqa_normalise=True, no_cache=True)
    assert normalised.records[0]["vqascore"] == pytest.approx(0.4 / 0.5)
    faults.set(script=[{"token": "Maybe", "top": {"Maybe": math.log(0.9), ".": math.log(0.1)}}])
    neither = caprecon.score([sample], ["vqascore"], judge=vlm, vqa_normalise=True, no_cache=True)
    assert neither.records[0].get("vqascore") is None and "none of Yes/yes/No/no" in neither.records[0]["error"]


def test_check_finds_the_served_model(server):
    OpenAICompatVLM(SERVED, server).check()
    with pytest.raises(OpenAICompatError, match=f"serves \\['{SERVED}'\\]"):
        OpenAICompatVLM("missing-model", server).check()


def test_description_names_the_served_context(server):
    from openai_server import MAX_MODEL_LEN

    assert OpenAICompatVLM(SERVED, server).describe()["text_budget"] == MAX_MODEL_LEN  # vLLM's max_model_len
    assert OpenAICompatLLM("missing-model", server).describe()["text_budget"] is None  # not listed: not known


def test_option_probs_are_probabilities_from_the_first_token(server):
    vlm = OpenAICompatVLM(SERVED, server, max_concurrency=4)
    requests = _requests()
    probs = vlm.option_probs(requests, _options(requests))
    assert [len(p) for p in probs] == [len(o) for o in _options(requests)]
    for row in probs:
        assert all(0.0 < p <= 1.0 for p in row)  # the tiny model keeps its answer tokens in the top-k
        assert sum(row) <= 1.0 + 1e-9
        normalised = [p / sum(row) for p in row]
        assert sum(normalised) == pytest.approx(1.0)

    # the client's number is the sum over the server's top-k entries that spell the option
    body = {"model": SERVED, "max_tokens": 1, "temperature": 0, "logprobs": True, "top_logprobs": 20,
            "messages": [{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": encode_image(IMAGES["red"])}},
                {"type": "text", "text": YES_NO}]}]}
    top = httpx.post(f"{server}/chat/completions", json=body, timeout=30).json()["choices"][0]["logprobs"][
        "content"][0]["top_logprobs"]
    expected = [math.exp(e["logprob"]) for e in top if e["token"] == "Yes"]  # the one token "Yes"
    assert {e["token"] for e in top} >= {"Yes", " Yes"}
    assert probs[1][0] == pytest.approx(expected[0], rel=1e-9) and len(expected) == 1


def test_results_are_deterministic_ordered_and_independent_of_concurrency(server):
    requests = _requests()
    options = _options(requests)
    serial = OpenAICompatVLM(SERVED, server, max_concurrency=1).option_probs(requests, options)
    parallel = OpenAICompatVLM(SERVED, server, max_concurrency=4)
    assert parallel.option_probs(requests, options) == serial
    assert parallel.option_probs(requests, options) == serial
    order = [4, 0, 5, 2, 1, 3]
    assert parallel.option_probs([requests[i] for i in order], [options[i] for i in order]) == [
        serial[i] for i in order]
    texts = parallel.generate(requests, max_new_tokens=6)
    assert OpenAICompatVLM(SERVED, server, max_concurrency=1).generate(requests, max_new_tokens=6) == texts
    assert parallel.generate([requests[i] for i in order], max_new_tokens=6) == [texts[i] for i in order]


def test_the_image_reaches_the_model(server):
    vlm = OpenAICompatVLM(SERVED, server, max_concurrency=3)
    red, mixed, blue = vlm.option_probs([VLMRequest(IMAGES[k], MCQ, k) for k in ("red", "mixed", "blue")],
                                        [["A", "B", "C", "D"]] * 3)
    assert red != mixed and red != blue and mixed != blue
    jpeg = OpenAICompatVLM(SERVED, server, image_format="jpeg").option_probs(
        [VLMRequest(IMAGES["red"], MCQ, "red")], [["A", "B", "C", "D"]])
    assert jpeg == [red]  # flat colours survive JPEG, so the model sees the same picture


def test_answer_prob_reads_single_token_answers(server):
    vlm = OpenAICompatVLM(SERVED, server, max_concurrency=2)
    requests = [VLMRequest(IMAGES[k], YES_NO, k) for k in ("red", "blue")]
    yes = vlm.answer_prob(requests, ["Yes", "Yes"])
    assert yes == [row[0] for row in vlm.option_probs(requests, [["Yes", "No"]] * 2)]
    with pytest.raises(NotImplementedError, match="single-token"):
        vlm.answer_prob(requests[:1], ["a red dog"])


def test_text_llm_generates_and_scores(server):
    llm = OpenAICompatLLM(SERVED, server, max_concurrency=2)
    prompts = ["Caption: a red car on a road.\n" + MCQ, "Caption: a cat.\n" + YES_NO]
    probs = llm.option_probs(prompts, [["A", "B", "C", "D"], ["Yes", "No"]])
    assert all(0 < p <= 1 for row in probs for p in row)
    texts = llm.generate(prompts, max_new_tokens=4)
    assert len(texts) == 2 and all(isinstance(t, str) and t for t in texts)
    assert llm.generate(prompts, max_new_tokens=4) == texts


def test_system_prompt_and_answer_prob_for_text(server):
    plain = OpenAICompatLLM(SERVED, server)
    steered = OpenAICompatLLM(SERVED, server, system_prompt="You are a careful judge of dog photos.")
    assert steered.fingerprint != plain.fingerprint
    prompt = ["Caption: a cat.\n" + YES_NO]
    assert steered.option_probs(prompt, [["Yes", "No"]]) != plain.option_probs(prompt, [["Yes", "No"]])
    assert steered.answer_prob(prompt, ["No"]) == [steered.option_probs(prompt, [["No"]])[0][0]]


def test_concurrency_is_bounded(server, faults):
    faults.set(delay=0.3)  # slow answers, so requests overlap on the server
    faults.reset_peak()
    vlm = OpenAICompatVLM(SERVED, server, max_concurrency=3)
    vlm.generate([VLMRequest(IMAGES["red"], f"{YES_NO} ({i})", "red") for i in range(7)], max_new_tokens=1)
    assert faults.stats()["max_in_flight"] == 3


@pytest.mark.parametrize("status", [503, 429])
def test_transient_errors_are_retried_with_backoff(server, faults, status):
    vlm = OpenAICompatVLM(SERVED, server, max_concurrency=1, max_retries=3, backoff=0.2)
    request = [VLMRequest(IMAGES["red"], YES_NO, "red")]
    clean = vlm.option_probs(request, [["Yes", "No"]])
    faults.set(fail_next=2, status=status)
    before = faults.stats()["chat_requests"]
    start = time.monotonic()
    assert vlm.option_probs(request, [["Yes", "No"]]) == clean
    assert time.monotonic() - start >= 0.2 + 0.4  # waits of backoff * 2**attempt
    assert faults.stats()["chat_requests"] - before == 3


def test_retries_are_bounded(server, faults):
    vlm = OpenAICompatVLM(SERVED, server, max_concurrency=1, max_retries=2, backoff=0.05)
    faults.set(fail_next=10, status=503)
    before = faults.stats()["chat_requests"]
    with pytest.raises(OpenAICompatError, match="HTTP 503.*gave up after 3 attempts"):
        vlm.generate([VLMRequest(IMAGES["red"], YES_NO, "red")])
    assert faults.stats()["chat_requests"] - before == 3


def test_client_errors_are_not_retried(server, faults):
    vlm = OpenAICompatVLM("missing-model", server, max_retries=3, backoff=0.05)
    before = faults.stats()["chat_requests"]
    with pytest.raises(OpenAICompatError, match="HTTP 404.*does not exist"):
        vlm.generate([VLMRequest(IMAGES["red"], YES_NO, "red")])
    assert faults.stats()["chat_requests"] - before == 1


def test_missing_logprobs_raise_a_clear_error(server, faults):
    faults.set(logprobs=False)
    vlm = OpenAICompatVLM(SERVED, server)
    with pytest.raises(LogprobsUnavailableError) as info:
        vlm.option_probs([VLMRequest(IMAGES["red"], YES_NO, "red")], [["Yes", "No"]])
    message = str(info.value)
    assert server in message and SERVED in message and "--max-logprobs" in message


def test_a_slow_server_times_out_clearly(server, faults):
    faults.set(delay=2.0)
    vlm = OpenAICompatVLM(SERVED, server, timeout=0.5, max_retries=0)
    start = time.monotonic()
    with pytest.raises(OpenAICompatTimeout, match=r"no answer within timeout=0\.5 s"):
        vlm.generate([VLMRequest(IMAGES["red"], YES_NO, "red")])
    assert time.monotonic() - start < 1.5


def test_an_unreachable_server_is_named():
    port = _free_port()  # closed again at once: nothing listens there
    vlm = OpenAICompatLLM(SERVED, f"http://127.0.0.1:{port}/v1", max_retries=1, backoff=0.05)
    with pytest.raises(OpenAICompatError, match=f"cannot reach http://127.0.0.1:{port}/v1"):
        vlm.generate(["hello"])


def test_transformers_serve_generates_but_has_no_logprobs(transformers_server, tiny_lm):
    model = str(tiny_lm)  # a server pinned to a local folder serves it under its path
    llm = OpenAICompatLLM(model, transformers_server, max_concurrency=2)
    llm.check()
    texts = llm.generate(["Is the sky blue? Answer Yes or No.", "Name a colour."], max_new_tokens=3)
    assert len(texts) == 2 and all(texts)
    assert llm.generate(["Is the sky blue? Answer Yes or No.", "Name a colour."], max_new_tokens=3) == texts
    with pytest.raises(LogprobsUnavailableError, match="transformers serve"):
        llm.option_probs(["Is the sky blue? Answer Yes or No."], [["Yes", "No"]])


def test_captioner_asks_for_n_seeded_choices_per_image(server, faults):
    from caprecon.models.captioner import Captioner, CaptionRequest, OpenAICompatCaptioner, Sampling

    captioner = OpenAICompatCaptioner(SERVED, server, max_concurrency=2)
    assert isinstance(captioner, Captioner)
    sampling = Sampling(temperature=1.0, top_p=0.95, max_new_tokens=6)
    requests = [CaptionRequest(IMAGES["red"], "Caption the image.", 3, seed=5, image_key="red"),
                CaptionRequest(IMAGES["mixed"], "Caption the image.", 3, seed=6, image_key="mixed")]
    before = faults.stats()["chat_requests"]
    first = captioner.caption(requests, sampling)
    assert faults.stats()["chat_requests"] - before == 2  # one call per image, `n` choices in it
    assert [len(c) for c in first] == [3, 3] and len(set(first[0])) > 1  # sampled: the choices differ
    assert captioner.caption(requests, sampling) == first  # the seed fixes them
    reseeded = captioner.caption([CaptionRequest(IMAGES["red"], "Caption the image.", 3, seed=7)], sampling)
    assert reseeded != [first[0]]
    # sampling settings travel with each call (and key the cache), so they do not change the fingerprint
    assert captioner.fingerprint == OpenAICompatCaptioner(SERVED, server, max_concurrency=8).fingerprint
    assert captioner.fingerprint != OpenAICompatCaptioner(SERVED, server, system_prompt="Be brief.").fingerprint
def test_fleur_over_the_server_reads_the_digits_where_the_rating_was_written(server, faults, tmp_path):
    from caprecon.metrics import Context
    from caprecon.metrics.fleur import Fleur
    from caprecon.data.images import open_image
    from caprecon.data.samples import Sample

    IMAGES["red"].save(tmp_path / "red.png")
    item = open_image(Sample(id="r", image=tmp_path / "red.png", caption="a red square"))
    # "0.75" with the first decimal 7 (p .5), 8 (.3), 6 (.1) and other tokens .1; the second
    # decimal 5 (.8), 4 (.2); digits missing from the top k count as 0, and the digits'
    # probabilities are used as the server gives them (FLEUR's reference does not rescale them)
    first, second = {"7": 0.5, "8": 0.3, "6": 0.1, "maybe": 0.1}, {"5": 0.8, "4": 0.2}
    faults.set(script=[{"token": "0", "top": {"0": 0.0}}, {"token": ".", "top": {".": 0.0}},
                       {"token": "7", "top": {t: math.log(p) for t, p in first.items()}},
                       {"token": "5", "top": {t: math.log(p) for t, p in second.items()}}])
    row = Fleur(OpenAICompatVLM(SERVED, server)).score([item], Context())[0]
    expected = (7 * 0.5 + 8 * 0.3 + 6 * 0.1) / 10 + (5 * 0.8 + 4 * 0.2) / 100  # .65 + .048
    assert row["fleur"] == pytest.approx(expected, abs=1e-9) and row["fleur_greedy"] == 0.75


def test_fleur_over_the_server_reports_the_top_k_mass_and_below_its_floor_the_row_is_missing(server, faults, tmp_path):
    """The digits outside the top k are read as 0, so they may hold up to 1 - (the mass the top k
    covered) where the rating's digits were written: `fleur_topk_mass` is the least of those
    masses (here .995 at the first decimal, 1 at the second, by hand), and under the floor (.99)
    the row has no fleur and its error says why (.95 here)."""
    from caprecon.metrics import Context
    from caprecon.metrics.fleur import TOPK_FLOOR, Fleur
    from caprecon.data.images import open_image
    from caprecon.data.samples import Sample

    IMAGES["red"].save(tmp_path / "red.png")
    item = open_image(Sample(id="r", image=tmp_path / "red.png", caption="a red square"))

    def script(other: float) -> list[dict]:
        first = {"7": 0.5, "8": 0.3, "6": 0.1, "maybe": other}  # the other digits are outside the top k
        return [{"token": "0", "top": {"0": 0.0}}, {"token": ".", "top": {".": 0.0}},
                {"token": "7", "top": {t: math.log(p) for t, p in first.items()}},
                {"token": "5", "top": {"5": math.log(0.8), "4": math.log(0.2)}}]

    assert TOPK_FLOOR == 0.99
    vlm = OpenAICompatVLM(SERVED, server)
    faults.set(script=script(0.095))
    row = Fleur(vlm).score([item], Context())[0]
    assert row["fleur_topk_mass"] == pytest.approx(0.995, abs=1e-12)
    assert row["fleur"] == pytest.approx((7 * 0.5 + 8 * 0.3 + 6 * 0.1) / 10 + (5 * 0.8 + 4 * 0.2) / 100, abs=1e-9)
    faults.set(script=script(0.05))
    low = caprecon.score([Sample(id="r", image=tmp_path / "red.png", caption="a red square")], ["fleur"], judge=vlm,
                         no_cache=True).records[0]
    assert low.get("fleur") is None and "covered 0.9500" in low["error"]
    assert low["error_reasons"] == ["fleur: digits outside the top-k"]
    assert Fleur(vlm, topk_floor=0.9).score([item], Context())[0]["fleur_topk_mass"] == pytest.approx(0.95)
    with pytest.raises(ValueError, match="topk_floor"):
        Fleur(vlm, topk_floor=1.5)


def test_token_probs_per_position_match_the_first_token_probabilities(server):
    vlm = OpenAICompatVLM(SERVED, server, max_new_tokens=3)
    requests = _requests()[:2]
    replies = vlm.generate_with_token_probs(requests, ["A", "B", "Yes"])
    first = vlm.option_probs(requests, [["A", "B", "Yes"]] * len(requests))
    for reply, probs, text in zip(replies, first, vlm.generate(requests)):
        assert reply["probs"][0] == pytest.approx(probs) and reply["text"] == text
        assert len(reply["tokens"]) == len(reply["probs"]) >= 1


def test_captioner_sends_the_checkpoints_sampling_settings_as_the_local_backend_uses_them(server, faults, tmp_path):
    from caprecon.models.captioner import CaptionRequest, OpenAICompatCaptioner, Sampling

    checkpoint = tmp_path / "checkpoint"
    checkpoint.mkdir()
    (checkpoint / "generation_config.json").write_text('{"temperature": 0.6, "top_p": 0.7, "top_k": 5}')
    request = [CaptionRequest(IMAGES["red"], "Caption the image.", 2, seed=5, image_key="red")]
    unset = Sampling(temperature=1.0, max_new_tokens=4)

    OpenAICompatCaptioner(SERVED, server, generation_config=str(checkpoint)).caption(request, unset)
    assert faults.stats()["last_sampling"] == {"temperature": 1.0, "top_p": 0.7, "top_k": 5, "n": 2, "seed": 5}
    # (test_caption: a transformers captioner of a checkpoint with this file samples with the same top_p and top_k)
    # the user's settings win
    OpenAICompatCaptioner(SERVED, server, generation_config=str(checkpoint)).caption(
        request, Sampling(temperature=1.0, top_p=0.9, top_k=3, max_new_tokens=4))
    assert faults.stats()["last_sampling"] == {"temperature": 1.0, "top_p": 0.9, "top_k": 3, "n": 2, "seed": 5}
    # no checkpoint to read: unset settings are left to the server (vLLM applies the checkpoint's)
    OpenAICompatCaptioner(SERVED, server).caption(request, unset)
    assert faults.stats()["last_sampling"] == {"temperature": 1.0, "n": 2, "seed": 5}
