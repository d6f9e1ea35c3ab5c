"""`caprecon serve` on Ray Serve itself: a local Ray (2 CPUs), 2 replicas of a reward on tiny models (the
oracle generator, logging what it draws, and the pixel embedder), called through `RemoteReward` from 8
concurrent clients, after pickling, across a replica killed mid-batch, and by TRL's GRPOTrainer
(examples/grpo_caption_reward.py --remote). Every reward is worked out here from the oracle's pictures."""

from __future__ import annotations

import json
import math
import os
import pickle
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from oracle import PixelEmbedder, render
from serve_models import LoggedOracle, generations

pytestmark = pytest.mark.slow
ray = pytest.importorskip("ray")
pytest.importorskip("ray.serve")

SRC = Path(__file__).resolve().parents[1] / "src"
PORT = 18_765


def expected_recon(image: Image.Image, caption: str) -> float:
    a, b = PixelEmbedder().embed([image, render(caption, *image.size)])
    return (1.0 + float(np.clip(a @ b, -1, 1))) / 2.0


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    import caprecon

    root = tmp_path_factory.mktemp("served")
    path = os.pathsep.join([str(SRC), str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": path, "HF_HUB_OFFLINE": "1"}})
    log, die = str(root / "generated.log"), str(root / "die")
    started = caprecon.serve(["recon"], generator=LoggedOracle(log, delay=0.05, die=die), embedder=PixelEmbedder(),
                             max_side=96, guards=None, cache_dir=str(root / "cache"), keep="vectors", replicas=2,
                             port=PORT, out=str(root / "run"), token="t0ken-for-tests")
    try:
        yield started, root, log, die
    finally:
        started.stop()
        from ray import serve

        serve.shutdown()
        ray.shutdown()


def client(url: str, **options):
    from caprecon.apps.remote import RemoteReward

    return RemoteReward(url, token="t0ken-for-tests", retries=8, backoff=0.5, **options)


COLOURS = ("red", "green", "blue", "yellow")
SHAPES = ("circle", "square", "triangle")


def batch(k: int) -> tuple[list[Image.Image], list[str]]:
    """Client k's GRPO step: 2 pictures x 4 completions, some shared with other clients, some repeated."""
    pictures = [render(f"{COLOURS[k % 4]} circle blue square"), render(f"{COLOURS[(k + 1) % 4]} triangle")]
    captions = [f"{COLOURS[k % 4]} circle", f"{COLOURS[k % 4]} circle", f"{COLOURS[k % 4]} circle blue square",
                f"{COLOURS[k % 2]} {SHAPES[k % 3]}", f"{COLOURS[(k + 1) % 4]} triangle", "green square",
                "green square", f"{COLOURS[k % 3]} circle"]
    return [pictures[0]] * 4 + [pictures[1]] * 4, captions


def test_eight_concurrent_clients_get_the_in_process_values_once_each(service):
    started, root, log, _ = service
    assert started.url == f"http://127.0.0.1:{PORT}"  # bound to this machine only
    remote = pickle.loads(pickle.dumps(client(started.url)))  # as TRL's async GRPO ships it

    def one(k: int) -> list[float | None]:
        images, captions = batch(k)
        return pickle.loads(pickle.dumps(remote))(images, captions)

    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(one, range(8)))
    distinct = set()
    for k, values in enumerate(got):
        images, captions = batch(k)
        assert values == pytest.approx([expected_recon(i, c) for i, c in zip(images, captions)], abs=1e-6)
        distinct |= {(np.asarray(i).tobytes(), c) for i, c in zip(images, captions)}
    drawn = generations(log)
    # one generation per distinct (picture, caption) across both replicas; the store keeps no picture
    assert len(drawn) == len(distinct)
    assert not [p for p in (root / "cache" / "images").rglob("*") if p.is_file()]
    # a second round: every reward from the store, none generated
    assert one(3) == got[3] and len(generations(log)) == len(distinct)
    manifest = json.loads((root / "run" / "manifest.json").read_text())
    assert manifest["replicas"] == 2 and manifest["access"] == "restricted" and manifest["host"] == "127.0.0.1"
    assert "t0ken" not in json.dumps(manifest) and "t0ken" not in json.dumps(remote.manifest())


def test_a_replica_killed_mid_batch_is_retried_and_every_reward_arrives_once(service):
    started, root, log, die = service
    Path(die).touch()  # the next replica to generate exits mid-batch
    images = [render("purple square yellow circle")] * 3 + [render("black triangle")] * 3
    captions = ["purple square", "yellow circle purple square", "purple square yellow circle", "black triangle",
                "black circle", "black triangle red square"]
    values = client(started.url)(images, captions)
    assert Path(die + ".taken").exists()  # a replica did die
    assert values == pytest.approx([expected_recon(i, c) for i, c in zip(images, captions)], abs=1e-6)
    # the dying replica drew nothing it could log; after it, each of the six pairs was drawn once
    assert sorted(p for p in generations(log) if p in captions) == sorted(captions)


def test_a_client_that_disconnects_leaves_no_half_written_entry(service):
    import socket
    import time

    from caprecon.apps.wire import encode_cell
    from caprecon.store.maintenance import cache_verify

    started, root, log, _ = service
    # captions no other test asks for, so the log's lines of them are this test's
    images, captions = [render("purple triangle purple circle")] * 2, ["purple triangle purple circle", "purple circle"]
    body = json.dumps({"captions": captions, "images": [encode_cell(i) for i in images]}).encode()
    with socket.create_connection(("127.0.0.1", PORT)) as raw:
        raw.sendall(b"POST /reward HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer t0ken-for-tests\r\n"
                    b"Content-Type: application/json\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        time.sleep(0.05)  # the request is in; the client goes before its answer
    values = client(started.url)(images, captions)
    assert values == pytest.approx([expected_recon(i, c) for i, c in zip(images, captions)], abs=1e-6)
    report = cache_verify(root / "cache")
    assert report["ok"] and not report["bad_values"] and not report["missing_files"]
    assert not list((root / "cache").rglob("*.part"))
    assert sorted(p for p in generations(log) if p in captions) == sorted(captions)  # the dropped request's work counted once


def test_grpo_example_trains_with_the_remote_reward(service, tmp_path):
    import importlib.util

    from tiny_vlm import build_qwen2_vl

    pytest.importorskip("trl")
    started, *_ = service
    spec = importlib.util.spec_from_file_location("grpo_caption_reward",
                                                  SRC.parent / "examples" / "grpo_caption_reward.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    photos = tmp_path / "photos"
    photos.mkdir()
    for k, caption in enumerate(("red circle", "green triangle")):
        render(caption, 56, 56).save(photos / f"p{k}.png")
    os.environ["CAPRECON_SERVE_TOKEN"] = "t0ken-for-tests"
    try:
        reward = example.make_reward(example.parse(["--policy", "x", "--images", str(photos), "--remote",
                                                    started.url]))
    finally:
        del os.environ["CAPRECON_SERVE_TOKEN"]
    trainer = example.build_trainer(str(build_qwen2_vl(tmp_path / "policy")), photos, reward, tmp_path / "out",
                                    steps=2, generations=4, prompts_per_step=2, completion_tokens=2, top_k=2,
                                    learning_rate=1e-3)
    trainer.train()
    logged = [row for row in trainer.state.log_history if "caprecon/reward" in row]
    assert trainer.state.global_step == 2 and len(logged) == 2
    assert all(math.isfinite(row["caprecon/reward"]) and 0.0 <= row["caprecon/reward"] <= 1.0 for row in logged)
