"""`caprecon serve`: the reward as a Ray Serve application, for trainers that keep it off their own GPUs.

    caprecon serve -m recon --preset fast --replicas 2 --cache-dir /shared/cache --keep vectors
    reward = caprecon.RemoteReward("http://127.0.0.1:8000")    # in the trainer: TRL's contract

Each replica holds one `caprecon.Reward` built from the options (metrics, weights, guards, models, the
store and its keep policy) and scores through the same code as the in-process reward. Requests are
batched by Ray Serve (`@serve.batch`: the rows of the requests that arrive together are scored in one
call, their duplicates once); the replicas share one store, whose claims keep two replicas from
generating the same reconstruction, so each distinct (image, caption) is generated once across all
of them. With GPUs, each replica takes one of its own.

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

import asyncio
import hashlib
import hmac
import ipaddress
import json
import logging
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, AsyncIterator, Awaitable, Callable, Mapping, Sequence

from caprecon.apps.reward import Guards, Reward
from caprecon.apps.reward.wire import (CONFIG_KIND, CONTRACT_KIND, PATH, CellError, decode_cell,
                                        pixels_within_limit, token_problem)
from caprecon.core.checks import check_count, check_number
from caprecon.core.errors import ConfigError, MetricContractError
from caprecon.core.redaction import install_log_filter, redact, redact_text
from caprecon.data.images import MAX_IMAGE_BYTES
from caprecon.run.folder import holds_run_folder, write_manifest

log = logging.getLogger(__name__)

#: the most bytes a request body may hold: a GRPO step's images, encoded (64 completions of 2 MB photos)
MAX_BODY_BYTES = 256 * 2**20
DEFAULT_PORT = 8000
#: Ray Serve's batching: the most requests scored in one call, and how long the first waits for others
BATCH_REQUESTS, BATCH_WAIT_S = 16, 0.002


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


# -- the Ray Serve application ------------------------------------------------------


def reward_options(metrics: Sequence[str] | None = None, weights: Mapping[str, float] | Sequence[float] | None = None,
                   *, guards: Guards | None = Guards(), empty: float = 0.0, preset: str | None = None,
                   config: str | Path | None = None, **settings: Any) -> dict[str, Any]:
    """The keywords of `Reward`, checked now (a bad option is refused before Ray starts)."""
    options = {"metrics": list(metrics) if metrics else None, "weights": weights, "guards": guards, "empty": empty,
               "preset": preset, "config": config, **settings}
    Reward(**options)
    return options


def application(settings: ServiceSettings, *, replicas: int = 1, gpus_per_replica: float = 0.0,
                batch_requests: int = BATCH_REQUESTS, batch_wait_s: float = BATCH_WAIT_S) -> Any:
    """The Ray Serve application: `replicas` copies of `RewardService`, requests batched by Serve."""
    from ray import serve
    from starlette.requests import Request
    from starlette.responses import JSONResponse

    @serve.deployment(name="caprecon-reward", num_replicas=replicas, max_ongoing_requests=4 * batch_requests,
                      ray_actor_options={"num_gpus": gpus_per_replica, "num_cpus": 1},
                      health_check_period_s=5, health_check_timeout_s=60)
    class RewardDeployment:
        def __init__(self, settings: ServiceSettings):
            replica_logging()
            self.service = RewardService(settings)

        @serve.batch(max_batch_size=batch_requests, batch_wait_timeout_s=batch_wait_s)
        async def score(self, requests: list[Parsed]) -> list[dict[str, Any]]:
            # in a thread: the replica's event loop goes on taking requests (and health checks) meanwhile
            return await asyncio.to_thread(self.service.score_many, requests)

        async def __call__(self, request: Request) -> JSONResponse:
            headers = {k.lower(): v for k, v in request.headers.items()}
            status, body = await self.service.respond(request.method, request.url.path, headers, request.stream(),
                                                      self.score)
            return JSONResponse(body, status_code=status)

    return RewardDeployment.bind(settings)


def check_service_settings(*, replicas: Any, gpus_per_replica: Any, port: Any, max_image_bytes: Any,
                           max_body_bytes: Any, batch_requests: Any, batch_wait_s: Any, missing: Any) -> None:
    """The service's own settings, checked as the command line checks its options (`caprecon.core.checks`),
    so `serve(...)` from Python refuses what `caprecon serve` refuses, before Ray starts: a `missing` of NaN
    would make every OpenRLHF answer fail to encode, a byte limit of 0 was read as the default."""
    check_count("replicas", replicas, 1, 1024)
    check_count("port", port, 1, 65535)
    check_count("batch_requests", batch_requests, 1, 4096)
    for name, value in (("max_image_bytes", max_image_bytes), ("max_body_bytes", max_body_bytes)):
        if value is not None:
            check_count(name, value, 1)
    if gpus_per_replica is not None:
        check_number("gpus_per_replica", gpus_per_replica, 0.0)
    check_number("batch_wait_s", batch_wait_s, 0.0)
    check_number("missing", missing)


def replica_logging() -> None:
    """A replica's log: warnings and above, and every handler of the root logger masking secrets, as the
    command line's do (`install_log_filter`): caprecon's own records are masked as they are made, but
    another library's (an HTTP client retrying a judge server) may name a URL with its password."""
    logging.basicConfig(level=logging.WARNING)
    install_log_filter()


def gpus_for(replicas: int, gpus: float | None) -> float:
    """GPUs per replica: `gpus` as given, else one each when the cluster has a GPU for every replica, none
    when it has none. A cluster with some GPUs but fewer than replicas is refused (say --gpus-per-replica)."""
    if gpus is not None:
        return gpus
    import ray

    have = ray.cluster_resources().get("GPU", 0.0)
    if have == 0:
        return 0.0
    if have < replicas:
        raise ConfigError(f"{replicas} replicas but {have:g} GPUs: give each replica a share with "
                          f"--gpus-per-replica (e.g. {have / replicas:g}) or ask for fewer replicas")
    return 1.0


def loopback(host: str) -> bool:
    """Whether `host` is an address of this machine only (127.0.0.0/8, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may be reached from elsewhere
        return False


@dataclass
class Service:
    """A running service: its `url`; `stop()` takes it down, and with `everything` also Ray Serve and
    the local Ray that `start` began (a Ray the caller had started stays up)."""

    url: str
    replicas: int
    manifest: dict[str, Any]
    started_ray: bool = False

    def stop(self, *, everything: bool = False) -> None:
        import ray
        from ray import serve

        serve.delete("caprecon")
        if everything:
            serve.shutdown()
            if self.started_ray:
                ray.shutdown()


def start(settings: ServiceSettings, *, replicas: int = 1, host: str = "127.0.0.1", port: int = DEFAULT_PORT,
          gpus_per_replica: float | None = None, batch_requests: int = BATCH_REQUESTS,
          batch_wait_s: float = BATCH_WAIT_S, ray_address: str | None = None) -> Service:
    """Start the service on Ray Serve (a local Ray unless `ray_address`), and return once every replica
    answers. A Ray the caller started stays up after `stop()`."""
    import ray
    from ray import serve

    started_ray = not ray.is_initialized()
    if started_ray:
        ray.init(address=ray_address, include_dashboard=False, log_to_driver=False)
    gpus = gpus_for(replicas, gpus_per_replica)
    serve.start(http_options={"host": host, "port": port})
    app = application(settings, replicas=replicas, gpus_per_replica=gpus, batch_requests=batch_requests,
                      batch_wait_s=batch_wait_s)
    serve.run(app, name="caprecon", route_prefix="/", blocking=False)
    shown = "127.0.0.1" if host in ("0.0.0.0", "") else host
    settings.manifest.setdefault("replicas", replicas)
    settings.manifest.setdefault("gpus_per_replica", gpus)
    return Service(url=f"http://{shown}:{port}", replicas=replicas, manifest=settings.manifest, started_ray=started_ray)


@holds_run_folder("out", inputs=("image_root",))
def serve(metrics: Sequence[str] | str | None = None, weights: Mapping[str, float] | Sequence[float] | None = None, *,
          length_target: int = 60, length_weight: float = 0.5, repetition_n: int = 3, repetition_weight: float = 1.0,
          hallucination_weight: float = 1.0, guards: Guards | None = None, empty: float = 0.0, replicas: int = 1,
          gpus_per_replica: float | None = None, host: str = "127.0.0.1", port: int = DEFAULT_PORT,
          token: str | None = None, image_root: str | Path | None = None, max_image_bytes: int | None = None,
          max_body_bytes: int | None = None, batch_requests: int = BATCH_REQUESTS, batch_wait_s: float = BATCH_WAIT_S,
          missing: float = 0.0, ray_address: str | None = None, out: str | Path | None = None,
          preset: str | None = None, config: str | Path | None = None, **settings: Any) -> Service:
    """`caprecon serve`: start the reward service and return it (`Service.url`, `Service.stop()`).

    The reward is `caprecon.Reward(metrics, weights, guards=..., empty=..., preset=..., config=...,
    **settings)` (`guards`, else one made of the length and repetition settings); the store's `keep`
    and `cache_max_size` are among the settings. `token`: the bearer token clients must send (only
    its SHA-256 reaches the replicas). `out`: a folder for `manifest.json`, the served settings."""
    metrics = [metrics] if isinstance(metrics, str) else metrics
    check_service_settings(replicas=replicas, gpus_per_replica=gpus_per_replica, port=port,
                           max_image_bytes=max_image_bytes, max_body_bytes=max_body_bytes,
                           batch_requests=batch_requests, batch_wait_s=batch_wait_s, missing=missing)
    if token and (problem := token_problem(token)):
        raise ConfigError(f"the bearer token {problem}")
    if not token and not loopback(host):
        # said without a colon after "token": the redactor would take what follows for its value
        log.warning("serving on %s with no token, so anyone who can reach port %d can spend this reward's GPUs "
                    "and read its answers; export one in $CAPRECON_SERVE_TOKEN (or the variable --token-env "
                    "names) for the server and its clients", host, port)
    guards = guards if guards is not None else Guards(
        length_target=length_target, length_weight=length_weight, repetition_n=repetition_n,
        repetition_weight=repetition_weight, hallucination_weight=hallucination_weight)
    options = reward_options(metrics, weights, guards=guards, empty=empty, preset=preset, config=config, **settings)
    if image_root is not None and not Path(image_root).is_dir():
        raise ConfigError(f"--image-root: not a folder: {image_root}")
    reward = Reward(**options)
    manifest = {
        "command": "serve", "metrics": [m if isinstance(m, str) else m.name for m in reward.metrics],
        "weights": reward.weights, "guards": guards.__dict__, "empty": empty, "preset": preset,
        "settings": {k: v for k, v in vars(reward.cfg).items() if not k.startswith("_")},
        "host": host, "port": port, "replicas": replicas, "access": "restricted" if token else "open",
        "image_root": str(image_root) if image_root is not None else None,
        "max_image_bytes": max_image_bytes or MAX_IMAGE_BYTES, "max_body_bytes": max_body_bytes or MAX_BODY_BYTES,
        "batch_requests": batch_requests, "batch_wait_s": batch_wait_s, "missing": missing,
    }
    settings_ = ServiceSettings(reward=options, image_root=str(image_root) if image_root is not None else None,
                                max_image_bytes=max_image_bytes or MAX_IMAGE_BYTES,
                                max_body_bytes=max_body_bytes or MAX_BODY_BYTES, token_sha256=token_digest(token),
                                missing=missing, manifest=manifest)
    service = start(settings_, replicas=replicas, host=host, port=port, gpus_per_replica=gpus_per_replica,
                    batch_requests=batch_requests, batch_wait_s=batch_wait_s, ray_address=ray_address)
    if out is not None:
        write_manifest(Path(out), service.manifest)
    return service
