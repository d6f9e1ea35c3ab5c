"""The reward service (`caprecon serve`) against itself and against the in-process `Reward`.

A local Ray runs the service on tiny models: the oracle generator (it draws the shapes a caption
names) made to cost `--image-seconds` of pure-Python CPU per picture (`BusyGenerator`: generation
dominates, as it does with a real text-to-image model), and the pixel embedder. `--clients` threads,
each a pickled `RemoteReward`, send `--requests` GRPO steps of 2 pictures x 4 completions; the
completions repeat within a step and across clients, as a policy's do.

Prints, each in one run:
- rewards per second with 2 replicas over 1 replica (each a fresh store; goal >= 1.6; on a host
  with 2 cores to spare, each replica a process of its own). Each client sends 8 steps: with 3, the
  run is 12 batches long and its last one decides the figure (one replica idle while the other
  finishes it): 1.47-1.74 on an idle 2-core host, against 1.81-1.82 with 8, where the stream is
  closer to the steady one a GRPO run sends;
- the service's added latency per request at the median: a step already in the store, through
  `RemoteReward` (encoding, HTTP, Ray Serve's routing and batching window) less the same step
  through the in-process `Reward` on the same store (goal <= 20 ms);
- generator calls over the distinct (picture, caption) pairs asked for, across both replicas
  (goal <= 1.0: the shared store's claims let no two replicas make the same picture).

Usage: python benchmarks/serve.py [--clients 4] [--requests 8] [--image-seconds 0.15] [--rounds 30]
"""

from __future__ import annotations

import argparse
import os
import pickle
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
import offline_env  # noqa: E402,F401  (the offline environment, before anything else)

import numpy as np  # noqa: E402

import caprecon  # noqa: E402
from oracle import PixelEmbedder, render  # noqa: E402
from scale_models import BusyGenerator  # noqa: E402
from serve_models import LoggedOracle, generations  # noqa: E402

COLOURS = ("red", "green", "blue", "yellow", "purple", "black")
SHAPES = ("circle", "square", "triangle")


def step(client: int, request: int) -> tuple[list, list[str]]:
    """One GRPO step: 2 pictures x 4 completions; two completions repeat, one is shared by every client."""
    k = client * 97 + request * 13
    a, b = COLOURS[k % 6], COLOURS[(k + 1) % 6]
    pictures = [render(f"{a} circle {b} square"), render(f"{b} triangle")]
    captions = [f"{a} circle", f"{a} circle", f"{a} circle {b} square {request}", f"{b} square {client}",
                f"{b} triangle", f"{b} triangle", f"{a} triangle {client} {request}", "green circle"]
    return [pictures[0]] * 4 + [pictures[1]] * 4, captions


def run_clients(url: str, clients: int, requests: int) -> tuple[float, int, set]:
    remote = pickle.dumps(caprecon.RemoteReward(url, retries=3))

    def one(client: int) -> int:
        reward = pickle.loads(remote)
        n = 0
        for r in range(requests):
            images, captions = step(client, r)
            values = reward(images, captions)
            assert all(v is not None for v in values), values
            n += len(values)
        return n

    started = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        rewards = sum(pool.map(one, range(clients)))
    seconds = time.perf_counter() - started
    distinct = set()
    for c in range(clients):
        for r in range(requests):
            images, captions = step(c, r)
            distinct |= {(np.asarray(i).tobytes(), t) for i, t in zip(images, captions)}
    return rewards / seconds, rewards, distinct


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--image-seconds", type=float, default=0.15)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--port", type=int, default=18_900)
    args = parser.parse_args()
    import ray

    path = os.pathsep.join([str(ROOT / "src"), str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")])
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": path, "HF_HUB_OFFLINE": "1"}})
    rates, ratios = {}, None
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for replicas in (1, 2):
            log = str(tmp / f"generated-{replicas}.log")
            generator = BusyGenerator(LoggedOracle(log), args.image_seconds)
            options = dict(generator=generator, embedder=PixelEmbedder(), max_side=96, guards=None,
                           cache_dir=str(tmp / f"cache-{replicas}"))
            service = caprecon.serve(["recon"], replicas=replicas, port=args.port, **options)
            caprecon.RemoteReward(service.url).health()
            rate, rewards, distinct = run_clients(service.url, args.clients, args.requests)
            rates[replicas] = rate
            print(f"replicas {replicas}: {rewards} rewards in {rewards / rate:.1f} s: {rate:.1f} rewards/s; "
                  f"{len(generations(log))} generations for {len(distinct)} distinct pairs", flush=True)
            if replicas == 2:
                ratios = len(generations(log)) / len(distinct)
                # added latency: a step already in the store, through the service and in process
                images, captions = step(0, 0)
                remote = caprecon.RemoteReward(service.url)
                local = caprecon.Reward(["recon"], progress=False, **options)
                local(images, captions)  # models built, the store's entries read once
                served, inline = [], []
                for _ in range(args.rounds):
                    started = time.perf_counter()
                    remote(images, captions)
                    served.append(time.perf_counter() - started)
                    started = time.perf_counter()
                    local(images, captions)
                    inline.append(time.perf_counter() - started)
                added_ms = (statistics.median(served) - statistics.median(inline)) * 1000
                print(f"median per request: service {statistics.median(served) * 1000:.1f} ms, in process "
                      f"{statistics.median(inline) * 1000:.1f} ms")
            service.stop()
    ray.shutdown()
    print(f"rewards/s 2 replicas over 1  {rates[2] / rates[1]:.2f}  goal >= 1.6")
    print(f"added latency per request (median, ms)  {added_ms:.1f}  goal <= 20")
    print(f"generator calls over distinct requests  {ratios:.2f}  goal <= 1.0")


if __name__ == "__main__":
    main()
