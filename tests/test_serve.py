"""The reward service's replica (`RewardService`) and its clients (`RemoteReward`, verl's and OpenRLHF's
protocols), without Ray: a small local HTTP server hands each request to one `RewardService`, as a
Ray Serve replica does. The Ray Serve application itself is tested in test_serve_ray.py (slow).

Expected values come from the oracle: it draws the shapes a caption names, and the pixel embedder
compares ink, so each ReconScore is worked out here from the two pictures."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import pickle
import threading
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest
from PIL import Image

from oracle import CountingOracle, OracleGenerator, PixelEmbedder, expected_recon, render

from caprecon.apps.reward.remote import AsyncRemoteReward, RemoteReward, RemoteRewardError, verl_reward
from caprecon.apps.reward import Guards
from caprecon.apps.reward.serve import HttpError, RewardService, ServiceSettings, openrlhf_reply, token_digest
from caprecon.apps.reward.wire import encode_cell
from caprecon.core.errors import ConfigError



def guards() -> Guards:
    # a length term that bites at 3 words, so the parts and their sum are both checked
    return Guards(length_target=3, length_weight=0.5, repetition_weight=0.0, hallucination_weight=0.0)


def length_term(caption: str) -> float:
    return -0.5 * max(0.0, len(caption.split()) / 3 - 1.0)


class StandIn:
    """A local HTTP server over one `RewardService`, as one Ray Serve replica answers."""

    def __init__(self, service: RewardService, fail_first: int = 0):
        self.service, self.fail_first, self.requests = service, fail_first, 0
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def answer(self, status, body):
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                stand_in.handle(self, "GET")

            def do_POST(self):
                stand_in.handle(self, "POST")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def handle(self, handler, method):
        self.requests += 1
        if self.requests <= self.fail_first:
            return handler.answer(503, {"error": "replica restarting"})
        headers = {k.lower(): v for k, v in handler.headers.items()}
        body = handler.rfile.read(int(headers.get("content-length", 0) or 0))
        try:
            if handler.path == "/health":
                return handler.answer(200, self.service.health())
            self.service.check_token(headers)
            if handler.path == "/manifest":
                return handler.answer(200, self.service.manifest())
            payload = self.service.read_body(headers, body)
            if handler.path == "/openrlhf":
                answer = self.service.score_many([self.service.parse_openrlhf(payload)])[0]
                return handler.answer(200, openrlhf_reply(answer, self.service.settings.missing))
            return handler.answer(200, self.service.score_many([self.service.parse(payload)])[0])
        except HttpError as exc:
            return handler.answer(exc.status, {"error": str(exc)})

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def make_service(tmp_path, **settings):
    generator = CountingOracle()
    options = dict(metrics=["recon"], generator=generator, embedder=PixelEmbedder(), max_side=96, guards=guards(),
                   cache_dir=str(tmp_path / "cache"))
    return RewardService(ServiceSettings(reward=options, manifest={"metrics": ["recon"], "token": "do-not-show"},
                                         **settings)), generator


@pytest.fixture
def served(tmp_path):
    service, generator = make_service(tmp_path)
    stand_in = StandIn(service)
    yield stand_in, generator
    stand_in.close()


PICTURES = [render("red circle blue square"), render("green triangle")]


def test_remote_reward_gives_the_in_process_values(served, tmp_path):
    stand_in, generator = served
    texts = ["red circle blue square", "red circle", "red circle blue square", "green triangle blue circle",
             "green triangle", ""]
    image = [PICTURES[0]] * 3 + [PICTURES[1]] * 3
    logged: dict[str, float] = {}
    remote = RemoteReward(stand_in.url)
    got = remote(prompts=["p"] * 6, completions=[[{"role": "assistant", "content": t}] for t in texts],
                 completion_ids=[[1]] * 6, image=image, log_metric=logged.__setitem__)
    want = [expected_recon(im, t) + length_term(t) for im, t in zip(image[:5], texts[:5])] + [0.0]  # empty: 0
    assert got == pytest.approx(want, abs=1e-6)
    assert len(generator.prompts) == 4  # four distinct (picture, caption) pairs; the empty one needs none
    assert logged["caprecon/reward"] == pytest.approx(sum(want) / 6, abs=1e-6)
    assert logged["caprecon/length"] == pytest.approx(sum(length_term(t) for t in texts) / 6, abs=1e-9)
    # the same through a pickled copy (TRL's async GRPO) and the coroutine form
    copy = pickle.loads(pickle.dumps(remote))
    assert copy(image, texts) == got
    assert asyncio.run(AsyncRemoteReward(stand_in.url)(image, texts)) == got
    assert len(generator.prompts) == 4


def test_every_image_form_keys_as_in_process(served, tmp_path):
    stand_in, _ = served
    path = tmp_path / "photo.png"
    PICTURES[0].save(path)
    from caprecon.apps.reward import Reward

    local = Reward(["recon"], generator=OracleGenerator(), embedder=PixelEmbedder(), max_side=96, guards=guards(),
                   cache_dir=str(tmp_path / "local-cache"))
    remote = RemoteReward(stand_in.url)
    forms = [PICTURES[0], str(path), path.read_bytes(), {"bytes": path.read_bytes(), "path": None}]
    captions = ["red circle"] * 4
    # the seed is drawn from the picture's content key: a form keyed otherwise would draw another one
    assert remote(forms, captions) == local(forms, captions)
    # a datasets image in another mode is sent upright in RGB, as Reward reads it
    grey = PICTURES[1].convert("L")
    assert remote([grey], ["green triangle"]) == local([grey], ["green triangle"])


def test_requests_batched_together_are_answered_apart(tmp_path):
    service, generator = make_service(tmp_path)
    first = service.parse({"captions": ["red circle", "red circle blue square"],
                           "images": [encode_cell(PICTURES[0])] * 2})
    second = service.parse({"captions": ["green triangle", "green triangle", "red circle"],
                            "images": [{"encoded": "@@"}, encode_cell(PICTURES[1]), encode_cell(PICTURES[1])]})
    one, two = service.score_many([first, second])  # as Ray Serve hands a replica one batch of two requests
    assert one["parts"]["recon"] == pytest.approx([expected_recon(PICTURES[0], "red circle"),
                                                   expected_recon(PICTURES[0], "red circle blue square")], abs=1e-6)
    assert one["errors"] == {} and list(two["errors"]) == ["0"]
    assert two["parts"]["recon"][0] is None
    assert two["parts"]["recon"][1:] == pytest.approx([expected_recon(PICTURES[1], "green triangle"),
                                                       expected_recon(PICTURES[1], "red circle")], abs=1e-6)
    assert two["parts"]["length"] == pytest.approx([0.0, 0.0, 0.0])
    assert len(generator.prompts) == 4


def test_a_rotated_photo_is_sent_upright_as_reward_reads_it(served, tmp_path):
    stand_in, _ = served
    from caprecon.apps.reward import Reward

    exif = Image.Exif()
    exif[0x0112] = 6  # EXIF orientation: rotate 90 degrees to show it upright
    path = tmp_path / "turned.jpg"
    render("red circle green triangle", 96, 64).save(path, exif=exif, quality=95)
    photo = Image.open(path)  # as a dataset hands it: EXIF not applied
    local = Reward(["recon"], generator=OracleGenerator(), embedder=PixelEmbedder(), max_side=96, guards=guards(),
                   cache_dir=str(tmp_path / "local-cache"))
    want = local([photo], ["red circle green triangle"])
    assert RemoteReward(stand_in.url)([photo], ["red circle green triangle"]) == want


def test_rows_without_a_picture_and_bad_cells_are_row_errors(served, caplog):
    stand_in, _ = served
    remote = RemoteReward(stand_in.url)
    got = remote(completions=["red circle", "green triangle"], images=[[PICTURES[0], PICTURES[1]], [PICTURES[1]]])
    assert got[0] is None and got[1] == pytest.approx(expected_recon(PICTURES[1], "green triangle"), abs=1e-6)
    answer = remote.post("/reward", {"captions": ["a", "b", "c"],
                                     "images": [{"encoded": "@@not base64"}, {"path": "x.png"}, {"what": 1}]})
    assert answer["errors"] == {"0": "encoded: not base64 (Only base64 data is allowed)",
                                "1": "this server opens no paths: send the image's bytes, or start it with --image-root",
                                "2": 'an image must be null, {"encoded": ...}, {"pixels": ...} or {"path": ...}'}
    assert answer["parts"]["recon"] == [None, None, None]


def test_size_limits_and_the_image_root(tmp_path):
    (tmp_path / "root").mkdir()
    PICTURES[0].save(tmp_path / "root" / "a.png")
    PICTURES[0].save(tmp_path / "outside.png")
    size = (tmp_path / "root" / "a.png").stat().st_size
    service, _ = make_service(tmp_path, image_root=str(tmp_path / "root"), max_image_bytes=size, max_body_bytes=50_000)
    stand_in = StandIn(service)
    try:
        remote = RemoteReward(stand_in.url, send_paths=True)
        big = np.random.default_rng(0).integers(0, 255, (96, 96, 3), dtype=np.uint8)
        answer = remote.post("/reward", {"captions": ["red circle"] * 3,
                                         "images": [{"path": "a.png"}, {"path": "../outside.png"},
                                                    encode_cell(Image.fromarray(big))]})
        assert answer["parts"]["recon"][0] == pytest.approx(expected_recon(PICTURES[0], "red circle"), abs=1e-6)
        assert "lies outside --image-root" in answer["errors"]["1"]
        assert answer["errors"]["2"].endswith(f"over the server's limit of {size} (--max-image-bytes)")
        with pytest.raises(RemoteRewardError, match=r"HTTP 413: request body of \d+ bytes is over the server's "
                                                    r"limit of 50000 \(--max-body-bytes\)"):
            remote.post("/reward", {"captions": ["x"], "images": [{"encoded": "A" * 60_000}]})
        assert stand_in.requests == 2  # refused at once, never retried
    finally:
        stand_in.close()


def test_bearer_token_is_checked_and_never_shown(tmp_path):
    service, _ = make_service(tmp_path, token_sha256=token_digest("s3cret-token"))
    stand_in = StandIn(service)
    try:
        assert RemoteReward(stand_in.url).health()["status"] == "ok"  # health needs no token
        # refused, not sent again (were it retried, a short backoff keeps this test quick)
        with pytest.raises(RemoteRewardError, match="refused POST /reward: HTTP 401"):
            RemoteReward(stand_in.url, token="wrong", backoff=0.01)([PICTURES[0]], ["red circle"])
        assert stand_in.requests == 2  # the health check, then the one refused request
        remote = RemoteReward(stand_in.url, token="s3cret-token")
        assert remote([PICTURES[0]], ["red circle"])[0] == pytest.approx(
            expected_recon(PICTURES[0], "red circle"), abs=1e-6)
        assert "s3cret" not in repr(remote) and "s3cret" not in json.dumps(vars(service.settings), default=str)
        assert remote.manifest()["token"] != "do-not-show"  # the manifest is redacted
    finally:
        stand_in.close()


def test_retries_with_backoff_then_fails_loudly(tmp_path):
    service, _ = make_service(tmp_path)
    stand_in = StandIn(service, fail_first=2)
    try:
        remote = RemoteReward(stand_in.url, retries=2, backoff=0.01)
        assert remote([PICTURES[1]], ["green triangle"])[0] == pytest.approx(
            expected_recon(PICTURES[1], "green triangle"), abs=1e-6)
        assert stand_in.requests == 3  # two 503s, then the answer
    finally:
        stand_in.close()
    gone = RemoteReward(stand_in.url, retries=1, backoff=0.01)
    with pytest.raises(RemoteRewardError, match=r"did not answer POST /reward after 2 attempts; last: URLError"):
        gone([PICTURES[1]], ["green triangle"])
    with pytest.raises(ConfigError, match="url must be"):
        RemoteReward("127.0.0.1:8000")


def test_verl_custom_reward_function(served):
    stand_in, _ = served
    compute_score = verl_reward(stand_in.url)
    want = expected_recon(PICTURES[0], "red circle") + length_term("red circle")
    # as verl's naive reward manager calls it: one sample, keywords, the picture in extra_info
    one = compute_score(data_source="captions", solution_str="red circle", ground_truth=None,
                        extra_info={"image": PICTURES[0]})
    assert one["score"] == pytest.approx(want, abs=1e-6) and one["caprecon_missing"] == 0.0
    assert one["recon"] + one["length"] == pytest.approx(one["score"], abs=1e-12)
    # as verl's batch reward manager calls it: lists; a sample without a picture scores `missing`
    many = compute_score(data_sources=["c", "c"], solution_strs=["red circle", "green triangle"],
                         ground_truths=[None, None], extra_infos=[{"image": PICTURES[0]}, {}])
    assert many[0]["score"] == pytest.approx(want, abs=1e-6)
    assert many[1] == {"score": 0.0, "caprecon_missing": 1.0, "recon": 0.0, "length": 0.0}
    assert pickle.loads(pickle.dumps(compute_score)).__name__ == "compute_score"


def test_openrlhf_remote_reward_model_protocol(tmp_path):
    (tmp_path / "root").mkdir()
    PICTURES[1].save(tmp_path / "root" / "g.png")
    service, _ = make_service(tmp_path, image_root=str(tmp_path / "root"), missing=-1.0)
    stand_in = StandIn(service)
    try:
        # OpenRLHF's caller (openrlhf/utils/remote_rm_utils.py, request_api_wrapper): POST the json, read "rewards"
        buffer = io.BytesIO()
        PICTURES[0].save(buffer, format="PNG")
        # the prompts name a shape: a caption that kept its prompt would draw it too
        data = {"query": ["<p>not a blue square</p> green triangle", "<p>not a blue square</p> red circle", "x"],
                "prompts": ["<p>not a blue square</p>", "<p>not a blue square</p>", ""],
                "labels": ["g.png", "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode(), ""]}
        request = urllib.request.Request(stand_in.url + "/openrlhf", data=json.dumps(data).encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as response:
            reply = json.loads(response.read())
        want = [expected_recon(PICTURES[1], "green triangle"), expected_recon(PICTURES[0], "red circle"), -1.0]
        assert reply["rewards"] == pytest.approx(want, abs=1e-6) and reply["scores"] == reply["rewards"]
        assert reply["extra_logs"]["recon"] == pytest.approx(want, abs=1e-6)
    finally:
        stand_in.close()


def test_the_command_passes_its_options_and_stops_on_a_signal(tmp_path, monkeypatch, capsys):
    import signal

    import caprecon.apps.reward.serve as served_module
    from clirun import run_cli

    seen = {}

    class Running:
        url, replicas, manifest = "http://127.0.0.1:8123", 2, {"metrics": ["recon"]}

        def stop(self, *, everything=False):
            seen["stopped"] = everything

    def fake_serve(metrics, weights, **options):
        seen.update(metrics=metrics, weights=weights, **options)
        threading.Timer(0.2, signal.raise_signal, (signal.SIGINT,)).start()  # Ctrl-C, once it serves
        return Running()

    monkeypatch.setattr(served_module, "serve", fake_serve)
    monkeypatch.setenv("MY_TOKEN", "tok-123")
    code, out, err = run_cli(["serve", "-m", "recon", "--weight", "recon=2", "--replicas", "2", "--port", "8123",
                              "--keep", "vectors", "--cache-max-size", "2GB", "--length-target", "40",
                              "--token-env", "MY_TOKEN", "--preset", "offline"], capsys)
    assert code == 0 and seen["stopped"] is True
    assert seen["metrics"] == ["recon"] and seen["weights"] == {"recon": 2.0} and seen["replicas"] == 2
    assert seen["keep"] == "vectors" and seen["cache_max_size"] == 2 * 10**9 and seen["length_target"] == 40
    assert seen["token"] == "tok-123" and seen["host"] == "127.0.0.1" and seen["preset"] == "offline"
    assert "serving recon on http://127.0.0.1:8123 with 2 replica(s); bearer token required" in err
    assert "tok-123" not in out + err


class SeededDrawing(OracleGenerator):
    """The oracle's drawing darkened by noise drawn from the request's seed: a reward is only the same
    when the picture was rebuilt from the same seed, so from the same image id."""

    @property
    def fingerprint(self) -> str:
        return "seeded-drawing-v1"

    def generate(self, requests):
        from caprecon.models.generator import Generated

        out = []
        for r in requests:
            ink = np.asarray(render(r.prompt, r.width, r.height), dtype=np.int64)
            noise = np.random.default_rng(r.seed).integers(0, 90, size=(r.height, r.width, 1))
            out.append(Generated(Image.fromarray(np.clip(ink - noise, 0, 255).astype(np.uint8))))
        return out


def test_a_served_file_is_named_as_in_process_so_seeded_rewards_agree(tmp_path):
    from caprecon.apps.reward import Reward

    paths = []
    for k, picture in enumerate(PICTURES):
        paths.append(tmp_path / f"photo{k}.png")
        picture.save(paths[-1])
    options = dict(metrics=["recon"], generator=SeededDrawing(), embedder=PixelEmbedder(), max_side=96, guards=None)
    service = RewardService(ServiceSettings(reward={**options, "cache_dir": str(tmp_path / "served")},
                                            manifest={"metrics": ["recon"]}))
    stand_in = StandIn(service)
    try:
        captions = ["red circle blue square", "green triangle"]
        served = RemoteReward(stand_in.url)([str(p) for p in paths], captions)
        cells = RemoteReward(stand_in.url)([{"bytes": p.read_bytes(), "path": str(p)} for p in paths], captions)
    finally:
        stand_in.close()
    in_process = Reward(**options, progress=False, cache_dir=str(tmp_path / "local"))([str(p) for p in paths], captions)
    assert served == cells == in_process  # to the bit: the file's name seeds its reconstruction on both sides
    assert in_process != Reward(**options, progress=False, cache_dir=str(tmp_path / "bytes"))(
        [p.read_bytes() for p in paths], captions)  # bare bytes are named by content: another seed, another draw
