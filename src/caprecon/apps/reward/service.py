"""The reward service's requests, apart from Ray: `RewardService` reads a request, scores the
requests of a batch through one `caprecon.Reward`, and answers; `caprecon.apps.reward.serve` runs
it as a Ray Serve deployment.

Routes: `GET /health` (no token needed), `GET /manifest` (the served settings, redacted), `POST
/reward` (caprecon's own: `caprecon.apps.reward.wire`), `POST /openrlhf` (OpenRLHF's remote reward-model
protocol: `{"query", "prompts", "labels"}` in, `{"rewards", "scores", "extra_logs"}` out; see
`openrlhf_reply`). The server binds 127.0.0.1 unless given another host; with a token, every route
but `/health` wants `Authorization: Bearer TOKEN` (only the token's SHA-256 is held, and it is
never logged or written). A body over `max_body_bytes` is refused whole (413), as soon as its
Content-Length says so or its bytes pass the limit (the rest is never read); a body that is not JSON,
or nested deeper than the parser goes, is refused (400); an image over `max_image_bytes`, one that
does not read, or a caption that is not text is an error of its row (its reward null, its message in
`errors`), as is a row the reward fails on (a file that does not decode, a metric's failure: its reason
redacted). A metric that breaks the metric contract is answered with its message and `"kind":
"metric contract"`, which the client raises at once as `MetricContractError`, as the in-process
`Reward` does (sending it again would break it again); so is a configuration error (`"kind":
"config"`); any other failure is a 500 the client retries, its message redacted and logged.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, AsyncIterator, Awaitable, Callable, Mapping, Sequence

from caprecon.apps.reward import Reward
from caprecon.apps.reward.wire import (CONFIG_KIND, CONTRACT_KIND, PATH, CellError, decode_cell,
                                        pixels_within_limit)
from caprecon.core.errors import ConfigError, MetricContractError
from caprecon.core.redaction import redact, redact_text
from caprecon.data.images import MAX_IMAGE_BYTES

log = logging.getLogger(__name__)

#: the most bytes a request body may hold: a GRPO step's images, encoded (64 completions of 2 MB photos)
MAX_BODY_BYTES = 256 * 2**20


def token_digest(token: str | None) -> str | None:
    """What a replica holds of the bearer token: its SHA-256, never the token itself."""
    return None if not token else hashlib.sha256(token.encode("utf-8")).hexdigest()


@dataclass
class Parsed:
    """One request's rows as `Reward` takes them, and the rows already known to be errors."""

    captions: list[Any]
    pictures: list[Any]
    errors: dict[int, str] = field(default_factory=dict)


@dataclass
class ServiceSettings:
    """What a replica is built from. `reward`: the keywords of `caprecon.Reward` (metrics, weights,
    preset, config, guards, empty and the run settings). `image_root`: where `{"path": ...}` images
    are opened (None: paths are refused). `token_sha256`: the token's digest (`token_digest`).
    `manifest`: the served settings, as `GET /manifest` shows them (redacted)."""

    reward: dict[str, Any]
    image_root: str | None = None
    max_image_bytes: int = MAX_IMAGE_BYTES
    max_body_bytes: int = MAX_BODY_BYTES
    token_sha256: str | None = None
    missing: float = 0.0  # OpenRLHF's reward where a row has none (it takes numbers only)
    manifest: dict[str, Any] = field(default_factory=dict)


class HttpError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


class RewardService:
    """One replica's work, apart from Ray: reading requests, scoring batches of them through one
    `Reward`, answering. `caprecon serve` wraps it in a Ray Serve deployment."""

    def __init__(self, settings: ServiceSettings):
        self.settings = settings
        self.reward = Reward(**settings.reward)  # the config is checked here; models load on the first batch

    # -- requests -------------------------------------------------------------------

    def check_token(self, headers: Mapping[str, str]) -> None:
        expected = self.settings.token_sha256
        if expected is None:
            return
        given = headers.get("authorization", "")
        scheme, _, token = given.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token_digest(token.strip()) or "", expected):
            raise HttpError(401, "this server wants Authorization: Bearer <its token>")

    def check_declared_length(self, headers: Mapping[str, str]) -> None:
        """Refuse a body whose Content-Length is over the limit (or not a number) before reading any of it."""
        declared = headers.get("content-length")
        if declared is None:
            return
        if not declared.strip().isdigit():
            raise HttpError(400, f"Content-Length is not a number of bytes: {declared!r:.40}")
        if int(declared) > self.settings.max_body_bytes:
            raise HttpError(413, f"request body of {int(declared)} bytes is over the server's limit of "
                                 f"{self.settings.max_body_bytes} (--max-body-bytes)")

    async def receive(self, headers: Mapping[str, str], chunks: AsyncIterator[bytes]) -> Any:
        """The request's JSON, its body read piece by piece and refused (413) as soon as it passes the
        limit, whatever its Content-Length said (a chunked body declares none): a client cannot make a
        replica hold more than `max_body_bytes` of it."""
        self.check_declared_length(headers)
        limit, pieces, size = self.settings.max_body_bytes, [], 0
        async for chunk in chunks:
            size += len(chunk)
            if size > limit:
                raise HttpError(413, f"request body of over {limit} bytes is over the server's limit of {limit} "
                                     "(--max-body-bytes)")
            pieces.append(chunk)
        return read_json(b"".join(pieces))

    async def respond(self, method: str, path: str, headers: Mapping[str, str], chunks: AsyncIterator[bytes],
                      score: Callable[[Parsed], Awaitable[dict[str, Any]]]) -> tuple[int, dict[str, Any]]:
        """One request's answer, (HTTP status, JSON body), whatever it holds: the routes of the module's
        docstring. `headers`: lower-cased names; `chunks`: the body as it arrives; `score`: how the
        parsed rows are scored (the Ray Serve deployment's batched call). A failure is answered, never
        raised: a refusal with its status, a broken metric contract or configuration with its `kind`
        (the client does not send those again), anything else as a 500 the client retries."""
        path = path.rstrip("/") or "/"
        try:
            if path == "/health":
                return 200, self.health()
            self.check_token(headers)
            if path == "/manifest" and method == "GET":
                return 200, self.manifest()
            if method != "POST" or path not in ("/reward", "/openrlhf"):
                raise HttpError(404, f"no route {method} {path:.80}: GET /health, GET /manifest, POST /reward, "
                                     "POST /openrlhf")
            payload = await self.receive(headers, chunks)
            if path == "/reward":
                return 200, await score(self.parse(payload))
            return 200, openrlhf_reply(await score(self.parse_openrlhf(payload)), self.settings.missing)
        except HttpError as exc:
            return exc.status, {"error": str(exc)}
        except MetricContractError as exc:
            log.error("%s", exc)
            return 500, {"error": redact_text(str(exc)), "kind": CONTRACT_KIND}
        except ConfigError as exc:
            log.error("%s", exc)
            return 500, {"error": redact_text(str(exc)), "kind": CONFIG_KIND}
        except Exception as exc:  # noqa: BLE001 -- answered (and logged, redacted), so the client sees why
            log.exception("reward service: %s %s failed", method, path)
            return 500, {"error": redact_text(f"{type(exc).__name__}: {exc}"), "kind": "internal"}

    def parse(self, payload: Any) -> Parsed:
        """caprecon's request (`caprecon.apps.reward.wire`): captions and images, one each per row."""
        if not isinstance(payload, Mapping):
            raise HttpError(400, "the body must be a JSON object with captions and images")
        captions, cells = payload.get("captions"), payload.get("images")
        if not isinstance(captions, list) or not isinstance(cells, list):
            raise HttpError(400, "the body needs a list of captions and a list of images")
        if len(captions) != len(cells):
            raise HttpError(400, f"{len(cells)} images but {len(captions)} captions")
        parsed = Parsed(captions=list(captions), pictures=[])
        for row, cell in enumerate(cells):
            parsed.pictures.append(self.picture(row, cell, parsed.errors))
        return parsed

    def parse_openrlhf(self, payload: Any) -> Parsed:
        """OpenRLHF's request (`openrlhf_request`), its pictures read as `parse` reads caprecon's."""
        parsed = openrlhf_request(payload)
        parsed.pictures = [self.picture(row, cell, parsed.errors) for row, cell in enumerate(parsed.pictures)]
        return parsed

    def picture(self, row: int, cell: Any, errors: dict[int, str]) -> Any:
        """What `Reward` takes for the wire cell of `row`; None, with the row's error in `errors`, when it cannot be read."""
        try:
            picture = decode_cell(cell, max_bytes=self.settings.max_image_bytes)
        except CellError as exc:
            errors[row] = str(exc)
            return None
        if isinstance(picture, str):
            if self.settings.image_root is None:
                errors[row] = "this server opens no paths: send the image's bytes, or start it with --image-root"
                return None
            return self._confined(row, picture, errors)
        return picture

    def _confined(self, row: int, path: str, errors: dict[int, str]) -> Any:
        """The file's bytes, named by the file as `Reward` names a path (its reconstruction's seed derives
        from the name), once it is found inside the image root and its header within the pixel limit."""
        from caprecon.data.images import read_image_file
        from caprecon.data.samples import SampleError

        root = Path(self.settings.image_root)
        try:
            data = read_image_file(root / path, root, max_bytes=self.settings.max_image_bytes)
            pixels_within_limit(PATH, data)
        except (SampleError, CellError) as exc:
            errors[row] = str(exc)
            return None
        return {"bytes": data, "path": path}

    # -- scoring --------------------------------------------------------------------

    def score_many(self, requests: Sequence[Parsed]) -> list[dict[str, Any]]:
        """The parts of every row of `requests`, scored in one `Reward.parts` call (what Ray Serve
        batched together), each request's rows answered apart."""
        pictures = [p for r in requests for p in r.pictures]
        captions = [c if isinstance(c, str) else "" for r in requests for c in r.captions]
        known_bad = {start + row for start, r in zip(_starts(requests), requests) for row in r.errors}
        # a row whose picture failed goes in as having none: its parts are null, as in process
        pictures = [None if i in known_bad else p for i, p in enumerate(pictures)]
        failed: dict[int, str] = {}  # why the reward could not score a row (a file that does not decode, a metric)
        parts = self.reward.parts(pictures, captions, errors=failed) if pictures else {}
        answers = []
        for start, request in zip(_starts(requests), requests):
            stop = start + len(request.captions)
            rows = {name: [_finite(v) for v in values[start:stop]] for name, values in parts.items()}
            errors = dict(request.errors)
            for row in range(len(request.captions)):
                if start + row in failed:  # redacted: a metric's message may quote a backend's URL or key
                    errors.setdefault(row, redact_text(failed[start + row]))
            for row, caption in enumerate(request.captions):
                if not isinstance(caption, str):
                    errors[row] = f"caption is {_kind(caption)}, not text"
                    # it went in as "": no part of a caption that is not there is a value (nor `empty`'s)
                    for values in rows.values():
                        values[row] = None
            answers.append({"parts": rows, "errors": {str(k): v for k, v in sorted(errors.items())}})
        return answers

    def manifest(self) -> dict[str, Any]:
        """The served settings, redacted, as JSON (a model given as an object is named by its text, which
        is redacted too: a backend's repr may show its key)."""
        return redact(json.loads(json.dumps(self.settings.manifest, default=str)))

    def health(self) -> dict[str, Any]:
        return {"status": "ok", "pid": os.getpid(), "metrics": [m if isinstance(m, str) else m.name
                                                                 for m in self.reward.metrics]}


def read_json(body: bytes) -> Any:
    """A request body's JSON; `HttpError` 400 for one that is not JSON or nests deeper than Python's parser goes."""
    try:
        return json.loads(body)
    except ValueError as exc:  # not JSON, not UTF-8, or an integer of more digits than Python converts (4,300)
        raise HttpError(400, f"the body is not JSON: {exc}") from None
    except RecursionError:  # `[[[[...` a few thousand deep: Python's parser recurses once per level
        raise HttpError(400, "the body is JSON nested deeper than this server reads; a request is an object "
                             "of two flat lists") from None


def _starts(requests: Sequence[Parsed]) -> list[int]:
    out, at = [], 0
    for request in requests:
        out.append(at)
        at += len(request.captions)
    return out


def _finite(value: Any) -> float | None:
    return value if isinstance(value, (int, float)) and math.isfinite(value) else None


def _kind(value: Any) -> str:
    """`a number`, `a list`, `null`: what a JSON value is, for a row's error."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    return {"list": "a list", "dict": "an object"}.get(type(value).__name__, f"a {type(value).__name__}")


# -- OpenRLHF's remote reward model -------------------------------------------------


def openrlhf_request(payload: Any) -> Parsed:
    """OpenRLHF's request (`openrlhf/utils/remote_rm_utils.py`: `{"query": prompt + response, "prompts",
    "labels"}`, one each per sample) as caprecon rows: the caption is the query with its prompt cut
    off, the picture is the label (a path under the server's --image-root, or `data:...;base64,...`)."""
    if not isinstance(payload, Mapping) or not isinstance(payload.get("query"), list):
        raise HttpError(400, "OpenRLHF's request carries a list `query` (and `prompts`, `labels`)")
    queries = payload["query"]
    prompts = payload.get("prompts") or [""] * len(queries)
    labels = payload.get("labels") or [None] * len(queries)
    if not isinstance(prompts, list) or not isinstance(labels, list):  # a string would be read a row per character
        raise HttpError(400, "OpenRLHF's `prompts` and `labels` are lists, one entry per query")
    if not (len(queries) == len(prompts) == len(labels)):
        raise HttpError(400, f"{len(queries)} queries, {len(prompts)} prompts and {len(labels)} labels")
    captions = [q[len(p):] if isinstance(q, str) and isinstance(p, str) and q.startswith(p) else q
                for q, p in zip(queries, prompts)]
    cells = [_label_cell(label) for label in labels]
    return Parsed(captions=[c.strip() if isinstance(c, str) else c for c in captions], pictures=cells)


def _label_cell(label: Any) -> Any:
    if isinstance(label, str) and label.startswith("data:") and ";base64," in label:
        return {"encoded": label.split(";base64,", 1)[1]}
    if isinstance(label, str) and label:
        return {"path": label}
    return None


def openrlhf_reply(answer: Mapping[str, Any], missing: float) -> dict[str, Any]:
    """OpenRLHF's reply: `rewards` (the sum of the parts; `missing` where a row has no reward, since
    OpenRLHF takes numbers only), `scores` (the same) and `extra_logs` (each part, `missing` likewise)."""
    parts = answer["parts"]
    rows = len(next(iter(parts.values()))) if parts else 0
    totals = [None if any(values[i] is None for values in parts.values()) else math.fsum(v[i] for v in parts.values())
              for i in range(rows)]
    filled = [missing if t is None else t for t in totals]
    logs = {name: [missing if v is None else v for v in values] for name, values in parts.items()}
    return {"rewards": filled, "scores": filled, "extra_logs": logs, "errors": answer["errors"]}
