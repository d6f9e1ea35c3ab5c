"""`caprecon serve`: the reward as a Ray Serve application (see `caprecon.apps.reward.serve`)."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading

from caprecon.cli.common import Writes, add_run_options, real_number, run_settings, whole_number
from caprecon.core.errors import ConfigError

TOKEN_ENV = "CAPRECON_SERVE_TOKEN"


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "serve", help="serve the reward (TRL, verl, OpenRLHF) on Ray Serve",
        description="Serves caprecon.Reward, built from these options, as a Ray Serve application: replicas that "
                    "share one store (each distinct caption generated once across them), requests batched across "
                    "clients. Call it with caprecon.RemoteReward(URL) (TRL), caprecon.verl_reward(URL) (verl) or "
                    "OpenRLHF's --remote_rm_url URL/openrlhf. Runs until interrupted.")
    p.add_argument("--metric", "-m", action="append", dest="metrics", metavar="NAME",
                   help="a metric of the reward (repeatable; default recon)")
    p.add_argument("--weight", action="append", metavar="METRIC=W", help="a metric's weight (default 1)")
    p.add_argument("--seed", type=whole_number(0, 2**63 - 1), help="base seed of the reconstructions (default 0)")
    guards = p.add_argument_group("guards (as caprecon.Guards; a weight of 0 turns a term off)")
    guards.add_argument("--length-target", type=whole_number(1), default=60,
                        help="words before the length term starts (default 60)")
    guards.add_argument("--length-weight", type=real_number(0), default=0.5,
                        help="length term: -W * max(0, words / target - 1) (default 0.5)")
    guards.add_argument("--repetition-n", type=whole_number(1), default=3,
                        help="n of the repeated n-grams (default 3)")
    guards.add_argument("--repetition-weight", type=real_number(0), default=1.0,
                        help="repetition term: -W * share of repeated n-grams (default 1)")
    guards.add_argument("--hallucination-weight", type=real_number(0), default=1.0,
                        help="with --judge and --llm: -W * (1 - halluc) (default 1)")
    guards.add_argument("--empty", type=real_number(), default=0.0, help="the reward of an empty completion (default 0)")
    service = p.add_argument_group("service")
    service.add_argument("--replicas", type=whole_number(1, 1024), default=1,
                         help="copies of the reward, each with its own models (default 1); with GPUs, one GPU each")
    service.add_argument("--gpus-per-replica", type=real_number(0), metavar="G",
                         help="GPUs each replica takes (default: 1 when the cluster has one per replica, else 0)")
    service.add_argument("--host", default="127.0.0.1",
                         help="address to bind (default 127.0.0.1: this machine only; 0.0.0.0 opens it to the network)")
    service.add_argument("--port", type=whole_number(1, 65535), default=8000, help="HTTP port (default 8000)")
    service.add_argument("--token-env", metavar="VAR",
                         help=f"environment variable holding the bearer token clients must send (default {TOKEN_ENV}, "
                              "where unset means no token; a VAR named here must hold one). The token is never logged "
                              "or written")
    service.add_argument("--image-root", metavar="DIR",
                         help="clients may name images by paths under DIR (default: images travel as bytes only)")
    service.add_argument("--max-image-bytes", type=whole_number(1), metavar="N",
                         help="an image holding more bytes is an error of its row (default 64 MiB)")
    service.add_argument("--max-body-bytes", type=whole_number(1), metavar="N",
                         help="a request body holding more bytes is refused (default 256 MiB)")
    service.add_argument("--batch-requests", type=whole_number(1, 4096), default=16,
                         help="requests Ray Serve batches into one scoring call per replica (default 16)")
    service.add_argument("--missing", type=real_number(), default=0.0,
                         help="the reward OpenRLHF gets for a row without one (it takes numbers only; default 0)")
    service.add_argument("--ray-address", metavar="ADDRESS", help="join this Ray cluster (default: a local Ray)")
    p.add_argument("--out", "-o", help="folder for manifest.json, the served settings (redacted)")
    add_run_options(p, for_meta=True)
    p.set_defaults(func=cmd_serve, writes=Writes(inputs=("image_root",), outputs="manifest.json"))


def cmd_serve(args: argparse.Namespace) -> int:
    from caprecon.apps.reward.serve import serve
    from caprecon.cli.reward import parse_weights

    settings = run_settings(args)  # with allow_plugins: a --config naming plug-ins loads them only with it
    token = os.environ.get(args.token_env or TOKEN_ENV) or None
    if args.token_env and token is None:  # asked for a token: serving open instead would be a silent hole
        # no "NAME: value" in it: the redactor would mask what follows a name ending in _TOKEN
        raise ConfigError(f"--token-env {args.token_env} names an environment variable that is unset or empty; "
                          "export the token in it, or leave --token-env out to serve without one")
    service = serve(args.metrics, parse_weights(args.weight) if args.weight else None,
                    length_target=args.length_target, length_weight=args.length_weight,
                    repetition_n=args.repetition_n, repetition_weight=args.repetition_weight,
                    hallucination_weight=args.hallucination_weight, empty=args.empty, replicas=args.replicas,
                    gpus_per_replica=args.gpus_per_replica, host=args.host, port=args.port, token=token,
                    image_root=args.image_root, max_image_bytes=args.max_image_bytes,
                    max_body_bytes=args.max_body_bytes, batch_requests=args.batch_requests, missing=args.missing,
                    ray_address=args.ray_address, out=args.out, config=settings.pop("config", None) or args.config,
                    **settings)
    print(f"serving {', '.join(service.manifest['metrics'])} on {service.url} with {service.replicas} replica(s)"
          f"{'; bearer token required' if token else ''}; Ctrl-C stops it", file=sys.stderr, flush=True)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    while not stop.wait(0.5):  # a wait without a timeout would let no signal handler run
        pass
    service.stop(everything=True)
    return 0
