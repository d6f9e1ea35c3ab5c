"""The reward served by `caprecon serve`, called from a trainer: TRL's contract, verl's custom reward.

    reward = caprecon.RemoteReward("http://127.0.0.1:8000")          # TRL: reward_funcs=[reward]
    compute_score = caprecon.verl_reward("http://127.0.0.1:8000")    # verl: custom_reward_function.name

`RemoteReward` is called exactly as `caprecon.Reward` is (TRL's keywords, conversational completions,
the `image` or `images` column, None where a row has no single picture, the parts through
`log_metric`): it sends the rows (`caprecon.apps.reward.wire`), gets each part back and sums them as
`Reward` does, so its values are the in-process reward's. It holds no connection and no model, so
it pickles (TRL's async GRPO pickles its rewards). A request that fails for a reason that may pass
(the server unreachable, a replica that died, a 5xx) is sent again after 0.5, 1, 2, ... seconds,
`retries` times; then it raises `RemoteRewardError` with the last failure. A request the server
refuses (a bad token, a body over its limit) raises at once, and so does a metric that broke the
metric contract on the server: `MetricContractError`, as the in-process `Reward` raises it. A file the
client cannot read as `Reward` reads it (missing, not a regular file, over 64 MiB) is that row's
problem, logged with its row: its reward is None, as in process. The URL is shown redacted (a
`user:password@` in it is refused: the service takes a bearer token), and the token is never shown,
nor sent on: a redirect is not followed. An answer that is not one finite number or null per row for
each part raises `RemoteRewardError` at once.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Mapping, Sequence

from caprecon.apps.reward import Reward
from caprecon.apps.reward.inputs import completion_text, picture_problem, row_image
from caprecon.apps.reward.wire import CONFIG_KIND, CONTRACT_KIND, encode_cell, token_problem
from caprecon.core.checks import check_count, check_number
from caprecon.core.errors import ConfigError, MetricContractError
from caprecon.core.redaction import redact_text
from caprecon.data.samples import SampleError

log = logging.getLogger(__name__)

#: where a token for the service is read from when none is given
TOKEN_ENV = "CAPRECON_SERVE_TOKEN"
#: the most retries: with the doubling pauses, 20 already wait about six days
MAX_RETRIES = 20


class RemoteRewardError(RuntimeError):
    """The reward service did not answer, after every retry; or it refused the request."""


class RemoteReward:
    """`caprecon.Reward`'s contract over HTTP, against `caprecon serve` at `url`; see the module's docstring.

    `token`: the service's bearer token (default: $CAPRECON_SERVE_TOKEN; never shown by repr).
    `send_paths`: send a path as it is, for a server started with --image-root over the same files
    (else the file's bytes travel). `timeout`: seconds one request may take (a step's generations).
    `retries`, `backoff`: how often a failed request is sent again, and the first pause (doubling)."""

    __name__ = "caprecon"  # TRL names a reward function by its __name__: `rewards/caprecon/mean`

    def __init__(self, url: str, *, token: str | None = None, send_paths: bool = False, timeout: float = 600.0,
                 retries: int = 5, backoff: float = 0.5, log_parts: bool = True):
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            shown = redact_text(url) if isinstance(url, str) else url
            raise ConfigError(f"RemoteReward: url must be http://HOST:PORT or https://..., not {shown!r}")
        if urllib.parse.urlsplit(url).username is not None:  # urllib would take it for part of the host
            raise ConfigError(f"RemoteReward: the url carries a user name or password ({redact_text(url)}); the "
                              f"service takes a bearer token: pass token=... or set ${TOKEN_ENV}")
        check_count("RemoteReward: retries", retries, 0, MAX_RETRIES)
        check_number("RemoteReward: backoff", backoff, 0.0)
        check_number("RemoteReward: timeout", timeout, 0.0, low_open=True)
        self.url = url.rstrip("/")
        self.token = token if token is not None else os.environ.get(TOKEN_ENV) or None
        if self.token is not None and (problem := token_problem(self.token)):
            raise ConfigError(f"RemoteReward: the token {problem}")
        self.send_paths, self.timeout, self.retries, self.backoff = send_paths, timeout, retries, backoff
        self.log_parts = log_parts

    def __repr__(self) -> str:
        return f"RemoteReward({self.shown_url!r}{', token=***' if self.token else ''})"

    @property
    def shown_url(self) -> str:
        """The url as messages show it: a secret in it (`?token=...`) masked."""
        return redact_text(self.url)

    # the contract of Reward.__call__ (keywords, completions, image/images, log_metric), on `parts` below
    __call__ = Reward.__call__

    def parts(self, images: Sequence[Any], captions: Sequence[str]) -> dict[str, list[float | None]]:
        """Each part of the reward per caption, from the service; the reward is their sum."""
        cells = []
        for row, picture in enumerate(images):
            try:
                cells.append(encode_cell(picture, send_paths=self.send_paths))
            except SampleError as exc:  # as `Reward` takes a picture it cannot read: the row's reward is None
                log.warning("reward: row %d: %s", row, exc)
                cells.append(None)
        answer = self.post("/reward", {"captions": list(captions), "images": cells})
        parts = self._checked_parts(answer, len(cells))
        for row, problem in answer.get("errors", {}).items():
            log.warning("reward service: row %s: %s", row, problem)
        return parts

    def _checked_parts(self, answer: Any, rows: int) -> dict[str, list[float | None]]:
        """The answer's parts, held to what `Reward.parts` returns: for each part one value per row, each
        a finite number or None. An answer that is not (another server, or a proxy's page, at the URL) is
        refused at once: summed as it is, its values would land on other completions, or be NaN."""
        parts = answer.get("parts") if isinstance(answer, Mapping) else None
        where = f"the reward service at {self.shown_url} answered"
        if not isinstance(parts, Mapping) or not isinstance(answer.get("errors", {}), Mapping):
            raise RemoteRewardError(f"{where} without caprecon's `parts` and `errors`: is it caprecon serve?")
        for name, values in parts.items():
            if not isinstance(values, list) or len(values) != rows:
                got = len(values) if isinstance(values, list) else type(values).__name__
                raise RemoteRewardError(f"{where} {got} values of part {name!r} for {rows} rows")
            for row, value in enumerate(values):
                if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                          or not math.isfinite(value)):
                    raise RemoteRewardError(f"{where} {value!r:.40} as part {name!r} of row {row}, not a finite "
                                            "number or null")
        return dict(parts)

    def health(self) -> dict[str, Any]:
        return self._request("GET", "/health", None)

    def manifest(self) -> dict[str, Any]:
        """The settings the service serves (redacted)."""
        return self._request("GET", "/manifest", None)

    def post(self, route: str, payload: Mapping[str, Any]) -> dict[str, Any]:
        return self._request("POST", route, json.dumps(payload).encode("utf-8"))

    def _request(self, method: str, route: str, body: bytes | None) -> dict[str, Any]:
        headers = {"Content-Type": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        last = "no attempt"
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self.backoff * 2 ** (attempt - 1))
            request = urllib.request.Request(self.url + route, data=body, headers=headers, method=method)
            try:
                with urllib.request.build_opener(_NoRedirect).open(request, timeout=self.timeout) as response:
                    return _json_answer(response.read(), f"the reward service at {self.shown_url}", method, route)
            except urllib.error.HTTPError as exc:
                if 300 <= exc.code < 400:  # never followed: the token would go wherever it points
                    raise RemoteRewardError(f"the reward service at {self.shown_url} answered {method} {route} with "
                                            f"a redirect (HTTP {exc.code}), which is not followed, so the token "
                                            "goes nowhere else: caprecon serve never redirects; give its own "
                                            "URL") from None
                detail, kind = _error_text(exc)
                if kind == CONTRACT_KIND:  # the server's metric broke its contract: as in process, at once
                    raise MetricContractError(f"{detail} (on the reward service at {self.shown_url})") from None
                if exc.code < 500 or kind == CONFIG_KIND:  # refused: sending it again would be refused again
                    raise RemoteRewardError(f"the reward service at {self.shown_url} refused {method} {route}: "
                                            f"HTTP {exc.code}: {detail}") from None
                last = f"HTTP {exc.code}: {detail}"
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError) as exc:
                last = f"{type(exc).__name__}: {getattr(exc, 'reason', exc)}"
            log.warning("reward service %s%s: %s (attempt %d of %d)", self.shown_url, route, last, attempt + 1,
                        self.retries + 1)
        raise RemoteRewardError(f"the reward service at {self.shown_url} did not answer {method} {route} after "
                                f"{self.retries + 1} attempts; last: {last}")


def _json_answer(body: bytes, where: str, method: str, route: str) -> Any:
    try:
        return json.loads(body)
    except ValueError:  # a proxy's or another server's page: sending it again would get the same
        raise RemoteRewardError(f"{where} answered {method} {route} with something that is not JSON "
                                f"({body[:60]!r}): is it caprecon serve?") from None


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """Redirects left unfollowed (urllib would send the Authorization header on to any host they name);
    the 3xx answer then raises `HTTPError` as it is."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def _error_text(exc: urllib.error.HTTPError) -> tuple[str, str | None]:
    """The error an answer names, and its `kind` (`caprecon.apps.reward.service`), from its JSON body."""
    try:
        body = json.loads(exc.read())
        return str(body.get("error", "")), body.get("kind")
    except (ValueError, AttributeError, OSError):
        return exc.reason or "", None


class AsyncRemoteReward(RemoteReward):
    """The same as a coroutine: TRL awaits it beside its other async rewards; the request waits in a
    worker thread, so the trainer's event loop is never blocked."""

    async def __call__(self, *args: Any, **kwargs: Any) -> list[float | None]:  # type: ignore[override]
        return await asyncio.to_thread(RemoteReward.__call__, self, *args, **kwargs)


class VerlReward:
    """verl's custom reward function (`custom_reward_function.path` / `.name`, verl's
    `verl/workers/reward_manager/`), against `caprecon serve`.

    Per sample, as verl's naive reward manager calls it: `compute_score(data_source, solution_str,
    ground_truth, extra_info)` returns `{"score": reward, <part>: value, ...}`. Batched, as verl's batch
    reward manager calls it (`reward_model.reward_manager=batch`: one request per step, the service's
    batching and dedup then see the whole step): `compute_score(data_sources=..., solution_strs=...,
    ground_truths=..., extra_infos=...)` returns one such dict per sample. The picture is the sample's
    `extra_info[image_key]` (a path, bytes or a PIL image), else its `ground_truth`; verl takes numbers
    only, so a sample without a reward scores `missing` (and `caprecon_missing` 1.0)."""

    def __init__(self, url: str, *, image_key: str = "image", missing: float = 0.0, **options: Any):
        self.remote = RemoteReward(url, log_parts=False, **options)
        self.image_key, self.missing = image_key, float(check_number("verl reward: missing", missing))
        self.__name__ = "compute_score"

    def __call__(self, data_source: Any = None, solution_str: str | None = None, ground_truth: Any = None,
                 extra_info: Any = None, *, data_sources: Sequence[Any] | None = None,
                 solution_strs: Sequence[str] | None = None, ground_truths: Sequence[Any] | None = None,
                 extra_infos: Sequence[Any] | None = None, **_: Any) -> dict[str, float] | list[dict[str, float]]:
        if solution_strs is not None:
            n = len(solution_strs)
            truths = list(ground_truths) if ground_truths is not None else [None] * n
            extras = list(extra_infos) if extra_infos is not None else [None] * n
            return self._scores(list(solution_strs), [self._picture(t, e) for t, e in zip(truths, extras)])
        if solution_str is None:
            raise ConfigError("verl reward: call it as verl does, compute_score(data_source, solution_str, "
                              "ground_truth, extra_info), or batched with solution_strs=...")
        return self._scores([solution_str], [self._picture(ground_truth, extra_info)])[0]

    def _picture(self, ground_truth: Any, extra_info: Any) -> Any:
        if isinstance(extra_info, Mapping) and extra_info.get(self.image_key) is not None:
            return row_image(extra_info[self.image_key])
        return ground_truth

    def _scores(self, texts: list[str], pictures: list[Any]) -> list[dict[str, float]]:
        for sample, picture in enumerate(pictures):  # before any request, as `Reward.__call__` checks its rows
            if problem := picture_problem(picture):
                raise ConfigError(f"verl reward: the picture of sample {sample} (extra_info[{self.image_key!r}], "
                                  f"else its ground_truth) {problem}")
        parts = self.remote.parts(pictures, [completion_text(t) for t in texts])
        out = []
        for i in range(len(texts)):
            values = {name: column[i] for name, column in parts.items()}
            total = None if any(v is None for v in values.values()) else math.fsum(values.values())
            row = {"score": self.missing if total is None else total,
                   "caprecon_missing": 1.0 if total is None else 0.0}
            row.update({name: self.missing if v is None else v for name, v in values.items()})
            out.append(row)
        return out


def verl_reward(url: str, **options: Any) -> VerlReward:
    """verl's `compute_score` against the service at `url` (see `VerlReward`); in the file verl loads:
    `compute_score = caprecon.verl_reward("http://127.0.0.1:8000")`."""
    return VerlReward(url, **options)
