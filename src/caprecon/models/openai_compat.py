"""Judge and text-LLM roles served over an OpenAI-compatible `/v1/chat/completions` API.

Point these at vLLM (`vllm serve MODEL`), SGLang (`python -m sglang.launch_server`) or any
server that speaks the chat-completions protocol. Each request is one HTTP call; up to
`max_concurrency` calls are in flight at once, and results come back in request order.
The server does its own batching, so nothing here groups requests by image.

Probabilities come from the `top_logprobs` of the first generated token. A server
reports the full-vocabulary log-probability of each of its top-k tokens, so
P(option) here is that full-vocabulary probability, the same number a local transformers
judge gives for the same distribution, as long as the option is among the top k. One rule
reads every option: the top-k tokens whose text, stripped of whitespace, equals the option
exactly (case included) are summed, so "Yes" and " Yes" add up and "yes" is an option of its
own. An option outside the top k has an unknown probability (below the k-th token's):
`option_probs` gives NaN for it, and the metric makes that row an error with the reason
rather than read it as 0 or 0.5. (Recent vLLM reports the raw model distribution by
default, before temperature or penalties.) Options should be single tokens, as letters
("A".."D") and "Yes"/"No" are in the tokenizers of common judge models.
For models that think before answering, turn thinking off through the server's chat
template, e.g. `extra_body={"chat_template_kwargs": {"enable_thinking": False}}`, or the
first token is not the answer.

The API key comes from `api_key_env=NAME` (an environment variable), else from
`OPENAI_API_KEY`; an explicit `api_key` works too but is visible in the process list.
It is never part of the fingerprint or the description, and manifests mask it.

Transient failures (connection errors, timeouts, HTTP 429 and 5xx) are retried with
exponential backoff; other 4xx answers mean the request itself is wrong and fail at once.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import logging
import math
import os
import random
import time
from concurrent.futures import ThreadPoolExecutor
from functools import cached_property
from typing import Any, Sequence
from urllib.parse import urlsplit

from PIL import Image

from caprecon.core.errors import ServerError
from caprecon.core.redaction import redact_text
from caprecon.data.qa import judge_box_coords
from caprecon.models.common import computation
from caprecon.models.vlm import VLMRequest, check_box_coords

log = logging.getLogger(__name__)

_MAX_RETRY_AFTER = 120.0  # seconds; a longer Retry-After is more likely a misconfiguration than advice


class OpenAICompatError(ServerError):
    """The server failed, refused, or answered in a shape this client cannot use. The message is
    masked here, once for every site that raises one: a URL's password or a key never reaches a
    traceback, a row's error or the terminal."""

    def __init__(self, message: str):
        super().__init__(redact_text(message))


class OpenAICompatTimeout(OpenAICompatError, TimeoutError):
    """The server did not answer within the configured timeout, on every attempt."""


class LogprobsUnavailableError(OpenAICompatError):
    """The server answered without the log-probabilities that probability scoring needs."""


class _ChatBackend:
    """What the vision and text roles share: settings, HTTP with retries, fan-out, parsing."""

    _backend = "openai-compat"
    # bump when a change to the requests or to reading the replies changes the answers; the server's
    # libraries are invisible from here
    code_revision = 2  # 2: one token rule for every option, and NaN (unknown) outside the top-k
    numeric_libraries: tuple[str, ...] = ()

    def __init__(self, model: str, base_url: str, *, api_key: str | None = None, api_key_env: str | None = None,
                 max_concurrency: int = 8, timeout: float = 60, max_retries: int = 4, backoff: float = 1.0,
                 max_new_tokens: int = 64,
                 top_logprobs: int = 20, temperature: float = 0, system_prompt: str | None = None,
                 extra_body: dict[str, Any] | None = None):
        if max_concurrency < 1:
            raise ValueError("max_concurrency must be at least 1")
        if max_retries < 0 or backoff < 0 or timeout <= 0:
            raise ValueError("need max_retries >= 0, backoff >= 0 and timeout > 0")
        if not 1 <= top_logprobs <= 20:
            # 20 is the OpenAI API's limit and vLLM's default `--max-logprobs`
            raise ValueError("top_logprobs must be between 1 and 20")
        self.model = model
        self.base_url = _normalise_base_url(base_url)
        self.api_key = api_key or _key_from_environment(api_key_env) or "EMPTY"
        self.max_concurrency = max_concurrency
        self.timeout = float(timeout)
        self.max_retries = max_retries
        self.backoff = backoff
        self.max_new_tokens = max_new_tokens
        self.top_logprobs = top_logprobs
        self.temperature = temperature
        self.system_prompt = system_prompt
        # server-specific request fields, e.g. {"chat_template_kwargs": {"enable_thinking": False}}
        self.extra_body = dict(extra_body or {})
        self._http = None  # created on first use: constructing a backend never touches the network

    # -- identity

    def _output_settings(self) -> dict[str, Any]:
        return {"backend": self._backend, "base_url": self.base_url, "model": self.model,
                "max_new_tokens": self.max_new_tokens, "top_logprobs": self.top_logprobs,
                "temperature": self.temperature, "system_prompt": self.system_prompt, "extra_body": self.extra_body}

    @property
    def fingerprint(self) -> str:
        """Server, model name and the settings that change outputs. The weights behind a served
        name are invisible from here: serve a new checkpoint under a new name."""
        blob = json.dumps({**self._output_settings(), **computation(self)}, sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:24]

    def describe(self) -> dict[str, Any]:
        return {**self._output_settings(), "max_concurrency": self.max_concurrency, "timeout": self.timeout,
                "max_retries": self.max_retries, "text_budget": self.text_budget, "fingerprint": self.fingerprint}

    @cached_property
    def text_budget(self) -> int | None:
        """The served context in tokens, where the server's `/models` listing gives it (vLLM's
        `max_model_len`); None otherwise. Asked once, without retries: a description must not wait
        on a server that is down. No server here cuts a prompt (vLLM refuses one over its context
        with HTTP 400, which becomes that row's error)."""
        try:
            listing = self._client().get(self.base_url + "/models", timeout=min(self.timeout, 5.0)).json()
        except Exception:  # down, unreachable, or not JSON: the budget is simply not known
            return None
        for entry in listing.get("data", []) if isinstance(listing, dict) else []:
            if isinstance(entry, dict) and entry.get("id") == self.model:
                budget = entry.get("max_model_len")
                return int(budget) if isinstance(budget, int) and budget > 0 else None
        return None

    def check(self) -> None:
        """Ask the server's `/models` whether it serves `model`; raise `OpenAICompatError` if not."""
        listing = self._request("GET", "/models")
        served = [entry.get("id") for entry in listing.get("data", []) if isinstance(entry, dict)]
        if self.model not in served:
            raise OpenAICompatError(
                f"{self.base_url} does not serve model {self.model!r}; it serves {served or 'nothing'}. "
                f"Pass one of those names (vLLM: the --served-model-name, or the model path it was started with)."
            )

    def __getstate__(self) -> dict:
        # an open HTTP client cannot be pickled; worker processes open their own
        return {**self.__dict__, "_http": None}

    def close(self) -> None:
        if self._http is not None:
            self._http.close()
            self._http = None

    # -- transport

    def _client(self):
        if self._http is None:
            import httpx

            self._http = httpx.Client(
                timeout=self.timeout, headers={"Authorization": f"Bearer {self.api_key}"},
                limits=httpx.Limits(max_connections=self.max_concurrency,
                                    max_keepalive_connections=self.max_concurrency),
            )
        return self._http

    def _request(self, method: str, path: str, body: dict | None = None) -> dict:
        import httpx

        url = self.base_url + path
        where = f"{url} (model {self.model!r})"
        for attempt in range(self.max_retries + 1):
            retry_after = 0.0
            try:
                response = self._client().request(method, url, json=body)
            except httpx.TimeoutException as exc:
                error, failure = OpenAICompatTimeout, (
                    f"{where} gave no answer within timeout={self.timeout:g} s ({type(exc).__name__}); the server "
                    f"may be overloaded or still loading the model: raise `timeout` or lower `max_concurrency`")
            except httpx.TransportError as exc:
                error, failure = OpenAICompatError, (
                    f"cannot reach {where} ({exc or type(exc).__name__}): check that the server is running and "
                    "that base_url's host and port are right")
            else:
                status = response.status_code
                if status < 400:
                    try:
                        return response.json()
                    except ValueError:
                        raise OpenAICompatError(f"{where} answered HTTP {status} with a body that is not JSON: "
                                                f"{response.text[:200]!r}") from None
                if status != 429 and status < 500:
                    raise OpenAICompatError(f"{where} rejected the request with HTTP {status}: "
                                            f"{_error_detail(response)}")
                error, failure = OpenAICompatError, f"{where} answered HTTP {status}: {_error_detail(response)}"
                retry_after = _retry_after(response)
            if attempt == self.max_retries:
                break
            delay = max(self.backoff * 2 ** attempt * (1 + 0.1 * random.random()), retry_after)
            log.warning("%s; retrying in %.1f s (attempt %d of %d)", failure, delay, attempt + 2,
                        self.max_retries + 1)
            time.sleep(delay)
        raise error(f"{failure} (gave up after {self.max_retries + 1} attempt{'s' if self.max_retries else ''})")

    def _chat_all(self, bodies: list[dict]) -> list[dict]:
        """POST every body to /chat/completions, `max_concurrency` at a time; results in input order."""
        bodies = [{**body, **self.extra_body} for body in bodies]
        if self.max_concurrency == 1 or len(bodies) <= 1:
            return [self._request("POST", "/chat/completions", body) for body in bodies]
        self._client()  # one shared client, created before the worker threads race to create it
        with ThreadPoolExecutor(max_workers=min(self.max_concurrency, len(bodies))) as pool:
            futures = [pool.submit(self._request, "POST", "/chat/completions", body) for body in bodies]
            try:
                return [future.result() for future in futures]
            except BaseException:
                for future in futures:
                    future.cancel()
                raise

    # -- the role operations, over whatever `_contents` makes of the inputs

    def _contents(self, items: Sequence[Any]) -> list[Any]:
        """The user-turn content of each input, in the chat-completions message format."""
        raise NotImplementedError

    def generate(self, items: Sequence[Any], max_new_tokens: int | None = None) -> list[str]:
        """Greedy (at temperature 0) free-form answer per input."""
        n = self.max_new_tokens if max_new_tokens is None else max_new_tokens
        responses = self._chat_all([self._body(c, n, logprobs=False) for c in self._contents(items)])
        return [((_first_choice(r, self.base_url).get("message") or {}).get("content") or "").strip()
                for r in responses]

    def option_probs(self, items: Sequence[Any], options: Sequence[Sequence[str]]) -> list[list[float]]:
        """Per input, the probability of each option as the first reply token, from the top-k
        (see the module notes); an option missing from the top-k is NaN: its probability is
        unknown, and the metric says so rather than read it as 0."""
        if len(options) != len(items):
            raise ValueError(f"{len(items)} inputs but {len(options)} option lists")
        responses = self._chat_all([self._body(c, 1, logprobs=True) for c in self._contents(items)])
        tops = [self._first_token_top(response) for response in responses]
        return [[_or(_token_prob(top, option), math.nan) for option in opts] for top, opts in zip(tops, options)]

    def generate_with_token_probs(self, items: Sequence[Any], tokens: Sequence[str],
                                  max_new_tokens: int | None = None) -> list[dict[str, Any]]:
        """Greedy answer per input, with each of `tokens`' probability at every generated
        position read from that position's `top_logprobs` (0 outside the top k), in the shape
        of `TransformersVLM.generate_with_token_probs`."""
        n = self.max_new_tokens if max_new_tokens is None else max_new_tokens
        responses = self._chat_all([self._body(c, n, logprobs=True) for c in self._contents(items)])
        out = []
        for response in responses:
            steps = self._logprob_steps(response)
            out.append({"text": ((_first_choice(response, self.base_url).get("message") or {}).get("content")
                                 or "").strip(),
                        "tokens": [str(step.get("token", "")) for step in steps],
                        "probs": [[_or(_token_prob(step.get("top_logprobs") or [], t), 0.0) for t in tokens]
                                  for step in steps]})
        return out

    def answer_prob(self, items: Sequence[Any], answers: Sequence[str]) -> list[float]:
        """P(answer) for single-token answers such as "Yes", read like `option_probs`.

        A chat-completions server reports the top-k of the tokens it generates, not the
        probability of a given string, so longer answers cannot be teacher-forced here. An
        answer with inner whitespace is several tokens and raises `NotImplementedError`; a
        single word that the model's tokenizer splits cannot be detected from here and
        is NaN (as if outside the top-k: unknown), so keep answers to words that are one token.
        """
        if len(answers) != len(items):
            raise ValueError(f"{len(items)} inputs but {len(answers)} answers")
        for answer in answers:
            if not answer.strip() or len(answer.split()) > 1:
                raise NotImplementedError(
                    f"answer {answer!r}: over a chat-completions API only single-token answers can be scored "
                    f"(the server reports the top-k of the first generated token, not a given string's "
                    f"probability). Use a one-word answer such as 'Yes', or a local transformers backend.")
        return [probs[0] for probs in self.option_probs(items, [[a] for a in answers])]

    # -- request bodies and answers

    def _body(self, content: Any, max_new_tokens: int, logprobs: bool) -> dict:
        messages = [{"role": "user", "content": content}]
        if self.system_prompt is not None:
            messages.insert(0, {"role": "system", "content": self.system_prompt})
        body = {"model": self.model, "messages": messages, "max_tokens": max_new_tokens,
                "temperature": self.temperature}
        if logprobs:
            body.update(logprobs=True, top_logprobs=self.top_logprobs)
        return body

    def _first_token_top(self, response: dict) -> list[dict]:
        """The first generated token's top-k list of {"token", "logprob"} entries."""
        return self._logprob_steps(response)[0]["top_logprobs"]

    def _logprob_steps(self, response: dict) -> list[dict]:
        """The generated tokens' logprob entries, each with a non-empty `top_logprobs`."""
        choice = _first_choice(response, self.base_url)
        content = (choice.get("logprobs") or {}).get("content")
        if not content:
            raise LogprobsUnavailableError(
                f"{self.base_url} returned no logprobs for model {self.model!r}. Probability scoring needs a server "
                f"that honours `logprobs`/`top_logprobs` in chat completions: vLLM and SGLang do when asked "
                f"(vLLM caps top_logprobs at its `--max-logprobs` flag, default 20; start it with "
                f"`--max-logprobs {self.top_logprobs}` or more if it was lowered). `transformers serve` ignores "
                f"these fields, so it can serve free-form generation only.")
        if not content[0].get("top_logprobs"):
            raise LogprobsUnavailableError(
                f"{self.base_url} returned the chosen token's logprob but no top_logprobs for model {self.model!r}; "
                f"the server must support `top_logprobs` (vLLM: `--max-logprobs` of at least {self.top_logprobs}).")
        return content


class OpenAICompatVLM(_ChatBackend):
    """Vision-language judge (`VisionLanguageModel`) behind an OpenAI-compatible server.

    Each request is one user turn: the image as a base64 data URL (`image_format` "png",
    lossless, or "jpeg", smaller), then the prompt. Requests sharing an `image_key` reuse
    one encoding.
    """

    _backend = "openai-compat-vlm"

    def __init__(self, model: str, base_url: str, *, api_key: str | None = None, api_key_env: str | None = None,
                 max_concurrency: int = 8, timeout: float = 60, max_retries: int = 4, backoff: float = 1.0,
                 image_format: str = "png", max_new_tokens: int = 64, top_logprobs: int = 20, temperature: float = 0,
                 system_prompt: str | None = None, extra_body: dict[str, Any] | None = None,
                 box_coords: str | None = None, min_pixels: int = 3136, max_pixels: int = 12845056):
        super().__init__(model, base_url, api_key=api_key, api_key_env=api_key_env,
                         max_concurrency=max_concurrency, timeout=timeout,
                         max_retries=max_retries, backoff=backoff, max_new_tokens=max_new_tokens,
                         top_logprobs=top_logprobs, temperature=temperature, system_prompt=system_prompt,
                         extra_body=extra_body)
        # the convention of the served model's box answers: given, else its family's by name
        self.box_coords = check_box_coords(box_coords) or judge_box_coords(model)
        # the pixel budget of the server's Qwen2.5-VL processor (its published defaults):
        # pixel box answers count pixels of the image resized within it
        self.min_pixels, self.max_pixels = int(min_pixels), int(max_pixels)
        image_format = image_format.lower()
        if image_format not in {"png", "jpeg", "jpg"}:
            raise ValueError(f"image_format must be 'png' or 'jpeg', not {image_format!r}")
        self.image_format = "jpeg" if image_format == "jpg" else image_format

    def _output_settings(self) -> dict[str, Any]:
        return {**super()._output_settings(), "image_format": self.image_format}

    def describe(self) -> dict[str, Any]:
        pixels = {"min_pixels": self.min_pixels, "max_pixels": self.max_pixels} if self.box_coords == "pixel" else {}
        return {**super().describe(), "box_coords": self.box_coords, **pixels}

    def box_frame(self, size: tuple[int, int]) -> tuple[int, int]:
        """(width, height) of the image the server's Qwen2.5-VL processor makes of `size`."""
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

        height, width = smart_resize(int(size[1]), int(size[0]), factor=28, min_pixels=self.min_pixels,
                                     max_pixels=self.max_pixels)
        return width, height

    def _contents(self, requests: Sequence[VLMRequest]) -> list[list[dict]]:
        urls: dict[Any, str] = {}
        contents = []
        for request in requests:
            key = request.image_key or id(request.image)  # "" is the default key, not a shared image
            if key not in urls:
                urls[key] = encode_image(request.image, self.image_format)
            contents.append([{"type": "image_url", "image_url": {"url": urls[key]}},
                             {"type": "text", "text": request.prompt}])
        return contents


class OpenAICompatLLM(_ChatBackend):
    """Text-only LLM (`TextLLM`: CaptionQA answers, question writing) behind an OpenAI-compatible server."""

    _backend = "openai-compat-llm"

    def _contents(self, prompts: Sequence[str]) -> list[str]:
        return list(prompts)


def _key_from_environment(variable: str | None) -> str | None:
    """The API key from `variable` (`api_key_env=NAME`), else from OPENAI_API_KEY. Keys
    belong in the environment: an `api_key=` option shows in the process list."""
    if variable is None:
        return os.environ.get("OPENAI_API_KEY")
    if not os.environ.get(variable):
        raise ValueError(f"api_key_env={variable}: the environment variable {variable} is not set")
    return os.environ[variable]


def encode_image(image: Image.Image, image_format: str = "png") -> str:
    """A base64 data URL of the image, as chat-completions servers accept in `image_url`."""
    if image_format == "jpeg" or image.mode not in {"RGB", "RGBA", "L", "LA"}:
        image = image.convert("RGB")  # JPEG has no alpha; palette and 16-bit modes confuse some decoders
    buffer = io.BytesIO()
    image.save(buffer, format=image_format.upper(), **({"quality": 95} if image_format == "jpeg" else {}))
    return f"data:image/{image_format};base64,{base64.b64encode(buffer.getvalue()).decode('ascii')}"


def _token_prob(top: list[dict], option: str) -> float | None:
    """Summed probability of the top-k tokens that spell `option`, by one rule for every option:
    the token with its surrounding whitespace stripped equals the option exactly, case included
    ("Yes" and " Yes" add up; "yes" is another option). None when no top-k token spells it: its
    probability is then unknown (below the k-th token's), not zero."""
    target = option.strip()
    if not target:
        raise ValueError("options must not be empty or whitespace")
    matches = [entry.get("logprob") for entry in top if str(entry.get("token", "")).strip() == target]
    matches = [lp for lp in matches if lp is not None]
    return min(1.0, sum(math.exp(lp) for lp in matches)) if matches else None


def _or(value: float | None, missing: float) -> float:
    return missing if value is None else value


def _first_choice(response: dict, base_url: str) -> dict:
    choices = response.get("choices")
    if not choices or not isinstance(choices[0], dict):
        raise OpenAICompatError(f"{base_url} answered without choices: {json.dumps(response)[:300]}")
    return choices[0]


def _normalise_base_url(base_url: str) -> str:
    """Keep the OpenAI-client convention (".../v1"), adding "/v1" to a bare host:port."""
    parts = urlsplit(base_url.strip())
    if parts.scheme not in {"http", "https"} or not parts.netloc:
        raise ValueError(f"base_url must look like http://HOST:PORT/v1, not {base_url!r}")
    url = base_url.strip().rstrip("/")
    return url + "/v1" if parts.path in {"", "/"} else url


def _error_detail(response) -> str:
    try:
        payload = response.json()
    except ValueError:
        return response.text[:300] or response.reason_phrase
    error = payload.get("error") if isinstance(payload, dict) else None
    if isinstance(error, dict) and error.get("message"):
        return str(error["message"])
    if isinstance(payload, dict) and payload.get("detail"):
        return str(payload["detail"])
    return json.dumps(payload)[:300]


def _retry_after(response) -> float:
    try:
        return min(float(response.headers.get("retry-after", 0)), _MAX_RETRY_AFTER)
    except ValueError:  # the HTTP-date form: fall back to our own backoff
        return 0.0
