"""`caprecon serve`: the reward as a Ray Serve application, for trainers that keep it off their own GPUs.

    caprecon serve -m recon --preset fast --replicas 2 --cache-dir /shared/cache --keep vectors
    reward = caprecon.RemoteReward("http://127.0.0.1:8000")    # in the trainer: TRL's contract

Each replica holds one `caprecon.Reward` built from the options (metrics, weights, guards, models, the
store and its keep policy) and scores through the same code as the in-process reward. Requests are
batched by Ray Serve (`@serve.batch`: the rows of the requests that arrive together are scored in one
call, their duplicates once); the replicas share one store, whose claims keep two replicas from
generating the same reconstruction, so each distinct (image, caption) is generated once across all
of them. With GPUs, each replica takes one of its own.

The requests themselves (routes, limits, errors) are read and answered by
`caprecon.apps.reward.service`, apart from Ray.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from caprecon.apps.reward import Guards, Reward
from caprecon.apps.reward.service import (MAX_BODY_BYTES, Parsed, RewardService, ServiceSettings,
                                           token_digest)
from caprecon.apps.reward.wire import token_problem
from caprecon.core.checks import check_count, check_number
from caprecon.core.errors import ConfigError
from caprecon.core.redaction import install_log_filter
from caprecon.data.images import MAX_IMAGE_BYTES
from caprecon.run.folder import holds_run_folder, write_manifest

log = logging.getLogger(__name__)

DEFAULT_PORT = 8000
#: Ray Serve's batching: the most requests scored in one call, and how long the first waits for others
BATCH_REQUESTS, BATCH_WAIT_S = 16, 0.002


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
