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
import re
import threading
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest
from PIL import Image

from oracle import CountingOracle, OracleGenerator, PixelEmbedder, expected_recon, render

from caprecon.apps.reward.remote import AsyncRemoteReward, RemoteReward, RemoteRewardError, verl_reward
from caprecon.apps.reward import Guards
from caprecon.apps.reward.service import HttpError, RewardService, ServiceSettings, token_digest
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
        declared = handler.headers.get("Content-Length", "0")
        unread = [int(declared) if declared.isdigit() else 0]
        if self.requests <= self.fail_first:
            handler.rfile.read(unread[0])
            return handler.answer(503, {"error": "replica restarting"})

        async def chunks():  # the body as it arrives, as Ray Serve's request.stream() hands it
            while unread[0] > 0:
                piece = handler.rfile.read(min(unread[0], 65536))
                if not piece:
                    return
                unread[0] -= len(piece)
                yield piece

        async def score(parsed):  # one request per batch: what Ray Serve's batching hands a replica alone
            return self.service.score_many([parsed])[0]

        headers = {k.lower(): v for k, v in handler.headers.items()}
        # the deployment's own dispatch (`RewardService.respond`): routes, token, limits, failures answered
        status, body = asyncio.run(self.service.respond(method, handler.path, headers, chunks(), score))
        handler.rfile.read(unread[0])  # what a refusal left unread, so the client reads the answer
        handler.answer(status, body)

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


# -- bad input and file safety (a fresh-eyes review of the training path's inputs) ---------------------------------


def test_an_empty_encoded_cell_never_opens_the_file_its_name_names(tmp_path):
    # `{"encoded": "", "name": PATH}` reached Reward as {"bytes": b"", "path": PATH}; Reward took the empty bytes
    # for none and opened PATH on the server's disk, outside any --image-root, and scored it
    (tmp_path / "root").mkdir()
    PICTURES[0].save(tmp_path / "private.png")
    service, generator = make_service(tmp_path, image_root=str(tmp_path / "root"))
    parsed = service.parse({"captions": ["red circle", "red circle"],
                            "images": [{"encoded": "", "name": str(tmp_path / "private.png")}, {"pixels": ""}]})
    answer = service.score_many([parsed])[0]
    assert answer["errors"] == {"0": "encoded: no bytes (an empty image)", "1": "pixels: no bytes (an empty image)"}
    assert answer["parts"]["recon"] == [None, None]
    assert generator.prompts == []  # nothing was scored: the private picture was never read


@pytest.mark.parametrize("cell, error", [
    ({"path": "\ud800.png"}, "path: holds a lone surrogate ('\\ud800') at character 0, which is not text: "
                             "the input's encoding is broken"),
    ({"path": "a\x00.png"}, "path: holds a NUL character"),
    ({"encoded": base64.b64encode(b"x").decode(), "name": "b\udc80.png"},
     "name: holds a lone surrogate ('\\udc80') at character 1, which is not text: the input's encoding is broken"),
    ({"encoded": base64.b64encode(b"x").decode(), "name": "c\x00.png"}, "name: holds a NUL character"),
])
def test_a_path_or_name_no_file_system_takes_is_an_error_of_its_row(tmp_path, cell, error):
    # a lone surrogate (a JSON escape lets it in) made the server's stat raise UnicodeEncodeError: a 500 for the
    # whole batch, which the client sent again and again
    (tmp_path / "root").mkdir()
    service, _ = make_service(tmp_path, image_root=str(tmp_path / "root"))
    parsed = service.parse({"captions": ["red circle", "green triangle"], "images": [cell, encode_cell(PICTURES[1])]})
    answer = service.score_many([parsed])[0]
    assert answer["errors"] == {"0": error}
    assert answer["parts"]["recon"][0] is None
    assert answer["parts"]["recon"][1] == pytest.approx(expected_recon(PICTURES[1], "green triangle"), abs=1e-6)


def test_a_caption_that_is_not_text_gets_no_reward(served):
    # it went in as "", the empty completion, and came back with the empty completion's reward beside its error
    stand_in, generator = served
    answer = RemoteReward(stand_in.url).post("/reward", {"captions": [5, ["red"], "red circle"],
                                                         "images": [encode_cell(PICTURES[0])] * 3})
    assert answer["errors"] == {"0": "caption is a number, not text", "1": "caption is a list, not text"}
    assert {name: values[:2] for name, values in answer["parts"].items()} == {
        name: [None, None] for name in answer["parts"]}
    assert answer["parts"]["recon"][2] == pytest.approx(expected_recon(PICTURES[0], "red circle"), abs=1e-6)
    assert len(generator.prompts) == 1


def _png(size: tuple[int, int]) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", size, "white").save(buffer, format="PNG")
    return buffer.getvalue()


def test_garbage_and_decompression_bombs_are_row_errors_that_say_why(tmp_path, monkeypatch):
    # garbage bytes were scored as None with the reason in the server's log only; a picture over PIL's pixel
    # limit (a few KB of PNG can declare gigabytes of pixels; PIL only warns up to twice it) was decoded
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 10_000)  # the reconstructions, 96 x 96, stay under it
    service, generator = make_service(tmp_path)
    over = base64.b64encode(_png((110, 110))).decode()  # 12,100 pixels: over the limit, under PIL's own error
    bomb = base64.b64encode(_png((150, 150))).decode()  # 22,500: PIL refuses it itself
    parsed = service.parse({"captions": ["red circle"] * 5, "images": [
        {"encoded": base64.b64encode(b"not a picture").decode()}, {"pixels": over}, {"encoded": over},
        {"encoded": bomb}, {"pixels": base64.b64encode(_png((30, 30))).decode()}]})
    answer = service.score_many([parsed])[0]
    limit = "over the limit of 10000 pixels (PIL.Image.MAX_IMAGE_PIXELS, the decompression-bomb guard)"
    assert answer["errors"]["0"] == "encoded: not in any image format PIL reads (UnidentifiedImageError)"
    assert answer["errors"]["1"] == f"pixels: image of 110x110 pixels is {limit}"
    assert answer["errors"]["2"] == f"encoded: image of 110x110 pixels is {limit}"
    assert answer["errors"]["3"].startswith("encoded: Image size (22500 pixels) exceeds limit of 20000 pixels")
    assert list(answer["errors"]) == ["0", "1", "2", "3"]
    assert answer["parts"]["recon"][:4] == [None] * 4 and answer["parts"]["recon"][4] is not None
    assert len(generator.prompts) == 1


def test_deep_json_and_a_content_length_that_is_no_number_are_refused(tmp_path):
    service, _ = make_service(tmp_path)

    async def body(data):
        yield data

    async def never(parsed):
        raise AssertionError("scored")

    def answer(headers, data):
        return asyncio.run(service.respond("POST", "/reward", headers, body(data), never))

    # RecursionError, then ValueError from int(): each a 500 the client sent again and again
    assert answer({}, b"[" * 100_000) == (400, {"error": "the body is JSON nested deeper than this server reads; "
                                                         "a request is an object of two flat lists"})
    assert answer({"content-length": "abc"}, b"{}") == (400, {"error": "Content-Length is not a number of bytes: "
                                                                       "'abc'"})
    assert answer({}, b"\xff") == (400, {"error": "the body is not JSON: 'utf-8' codec can't decode byte 0xff in "
                                                  "position 0: invalid start byte"})
    # an integer of more digits than Python converts: a ValueError that is no JSONDecodeError, a 500 before
    status, body = answer({}, b'{"captions": [' + b"7" * 5000 + b'], "images": [null]}')
    assert status == 400 and body["error"].startswith("the body is not JSON: Exceeds the limit (4300 digits)")


def test_a_body_over_the_limit_is_read_no_further_than_the_limit(tmp_path):
    # the deployment read the whole body (`await request.body()`) before it looked at the limit: a chunked
    # request, with no Content-Length, of 10 GB was held in the replica's memory first
    service, _ = make_service(tmp_path, max_body_bytes=10_000)
    read = []

    async def endless():  # as good as endless: 50 times the limit
        for _ in range(500):
            read.append(1000)
            yield b" " * 1000

    async def never(parsed):
        raise AssertionError("scored")

    status, body = asyncio.run(service.respond("POST", "/reward", {}, endless(), never))
    assert status == 413 and body == {"error": "request body of over 10000 bytes is over the server's limit of "
                                               "10000 (--max-body-bytes)"}
    assert sum(read) == 11_000  # the piece that passed the limit, and nothing after it
    status, _ = asyncio.run(service.respond("POST", "/reward", {"content-length": "20000"}, endless(), never))
    assert status == 413 and sum(read) == 11_000  # a declared length over the limit: nothing read at all


def test_a_metric_that_breaks_its_contract_on_the_server_raises_at_once_as_in_process(tmp_path):
    import contract_metrics

    from caprecon.core.errors import MetricContractError

    options = dict(metrics=[contract_metrics.FewerRows()], guards=None, batch_size=2,
                   cache_dir=str(tmp_path / "cache"))
    stand_in = StandIn(RewardService(ServiceSettings(reward=options)))
    try:
        remote = RemoteReward(stand_in.url, backoff=0.01)
        assert remote([PICTURES[0]] * 2, ["one two", "one two three"]) == pytest.approx([0.2, 0.3])
        with pytest.raises(MetricContractError, match=r"^metric contract: fewer-rows: score returned 1 rows for 2 "
                                                      r"items.* \(on the reward service at http://127\.0\.0\.1:"):
            remote([PICTURES[0]] * 2, ["please break now", "four words break here"])
        assert stand_in.requests == 2  # not sent again: it would break again
    finally:
        stand_in.close()


def test_a_configuration_the_server_cannot_score_is_refused_once_not_retried(tmp_path):
    service, _ = make_service(tmp_path)
    service.reward = type(service.reward)(["recon[no_such_column]"], generator=OracleGenerator(),
                                          embedder=PixelEmbedder(), max_side=96, cache_dir=str(tmp_path / "c"))
    stand_in = StandIn(service)
    try:
        with pytest.raises(RemoteRewardError, match=r"refused POST /reward: HTTP 500: reward part "
                                                    r"recon\[no_such_column\]: recon has no column no_such_column"):
            RemoteReward(stand_in.url, backoff=0.01)([PICTURES[0]], ["red circle"])
        assert stand_in.requests == 1  # it is checked when the models load, the first call: no retry changes it
    finally:
        stand_in.close()


def test_any_other_failure_is_answered_redacted_and_retried(tmp_path, monkeypatch, caplog):
    service, _ = make_service(tmp_path)
    stand_in = StandIn(service)

    def unreachable(pictures, captions, errors=None):
        raise RuntimeError("cannot reach the judge at http://bob:pw-98765@judge.internal/v1")

    monkeypatch.setattr(service.reward, "parts", unreachable)
    try:
        with pytest.raises(RemoteRewardError, match=r"after 2 attempts; last: HTTP 500: RuntimeError: cannot reach "
                                                    r"the judge at http://\*\*\*@judge.internal/v1") as failed:
            RemoteReward(stand_in.url, retries=1, backoff=0.01)([PICTURES[0]], ["red circle"])
        assert stand_in.requests == 2  # a failure that may pass is sent again
    finally:
        stand_in.close()
    assert "pw-98765" not in str(failed.value) and "pw-98765" not in caplog.text
    assert "reward service: POST /reward failed" in caplog.text  # logged on the server, with its traceback


def test_openrlhf_prompts_or_labels_that_are_not_lists_are_refused(tmp_path):
    service, _ = make_service(tmp_path)
    with pytest.raises(HttpError, match="`prompts` and `labels` are lists") as refused:
        service.parse_openrlhf({"query": ["ab", "cd"], "prompts": "ab", "labels": ["x.png", "y.png"]})
    assert refused.value.status == 400


@pytest.mark.parametrize("url, token", [("http://bob:hunter22@127.0.0.1:9", None),
                                        ("http://hunter22@127.0.0.1:9", None),
                                        ("http://127.0.0.1:9", "hunter22\n"), ("http://127.0.0.1:9", "hun ter22"),
                                        ("http://127.0.0.1:9", "hunter22é")])
def test_the_client_refuses_url_credentials_and_unsendable_tokens_without_showing_them(url, token):
    # a user:password@ URL was taken by urllib for a host name and shown whole in every error and in repr;
    # a token with a newline ended in http.client's "Invalid header value b'Bearer hunter22\\n'"
    with pytest.raises(ConfigError) as refused:
        RemoteReward(url, token=token, retries=0)
    assert "hunter22" not in str(refused.value) and "ter22" not in str(refused.value)
    assert ("user name or password" if token is None else "which an HTTP header cannot carry") in str(refused.value)


def test_a_picture_file_the_client_cannot_read_is_a_row_without_reward_as_in_process(served, tmp_path, caplog):
    import os

    from caprecon.apps.reward import Reward

    stand_in, _ = served
    good = tmp_path / "good.png"
    PICTURES[0].save(good)
    os.mkfifo(tmp_path / "pipe.png")  # read whole, it would hang the trainer for ever
    files = [str(tmp_path / "missing.png"), str(tmp_path / "pipe.png"), str(good)]
    captions = ["red circle"] * 3
    local = Reward(["recon"], generator=OracleGenerator(), embedder=PixelEmbedder(), max_side=96, guards=guards(),
                   cache_dir=str(tmp_path / "local-cache"), progress=False)(files, captions)
    remote = RemoteReward(stand_in.url)(files, captions)
    assert remote == local and local[:2] == [None, None]
    assert local[2] == pytest.approx(expected_recon(PICTURES[0], "red circle"), abs=1e-6)
    assert f"reward: row 0: image not found: {tmp_path / 'missing.png'}" in caplog.text
    assert "reward: row 1: cannot read image" in caplog.text and "not a regular file (a named pipe)" in caplog.text


def test_a_token_env_named_but_unset_is_refused_before_serving(monkeypatch, capsys):
    import caprecon.apps.reward.serve as served_module
    from clirun import run_cli

    def must_not_serve(*args, **options):
        raise AssertionError("served without the token asked for")

    monkeypatch.setattr(served_module, "serve", must_not_serve)
    monkeypatch.delenv("MY_SERVE_TOKEN", raising=False)
    code, _, err = run_cli(["serve", "-m", "recon", "--token-env", "MY_SERVE_TOKEN", "--preset", "offline"], capsys)
    assert code == 2
    assert err.strip().splitlines()[-1] == ("caprecon: error: --token-env MY_SERVE_TOKEN names an environment "
                                            "variable that is unset or empty; export the token in it, or leave "
                                            "--token-env out to serve without one")


def test_a_server_token_no_client_can_send_is_refused_before_anything_starts(monkeypatch):
    import caprecon.apps.reward.serve as served_module

    monkeypatch.setattr(served_module, "start", lambda *a, **k: pytest.fail("started"))
    with pytest.raises(ConfigError) as refused:
        served_module.serve("recon", token="s3cret-token\n", preset="offline")
    assert str(refused.value).startswith("the bearer token holds a space, a control character")
    assert "s3cret" not in str(refused.value)


class Canned:
    """A server that answers every request with one canned answer (status, headers, body), and records the
    headers it was sent: another server, a proxy or a redirect where the service should be."""

    def __init__(self, status=200, body=b"{}", headers=()):
        self.seen = []
        canned = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                canned.seen.append(dict(self.headers))
                self.rfile.read(int(self.headers.get("Content-Length", 0) or 0))
                self.send_response(status)
                for name, value in headers:
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_POST = do_GET

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def test_a_redirect_is_not_followed_so_the_token_goes_nowhere_else():
    # urllib followed it, Authorization header and all, to whatever host it named
    elsewhere = Canned(body=json.dumps({"status": "ok", "parts": {}, "errors": {}}).encode())
    port = elsewhere.server.server_address[1]
    redirect = Canned(status=302, body=b"", headers=[("Location", f"http://localhost:{port}/reward")])
    try:
        remote = RemoteReward(redirect.url, token="tok-abcdef", retries=0)
        with pytest.raises(RemoteRewardError, match=r"answered GET /health with a redirect \(HTTP 302\), which is "
                                                    r"not followed"):
            remote.health()
        with pytest.raises(RemoteRewardError, match=r"answered POST /reward with a redirect \(HTTP 302\)"):
            remote([PICTURES[0]], ["red circle"])
    finally:
        redirect.close()
        elsewhere.close()
    assert elsewhere.seen == [] and len(redirect.seen) == 2


@pytest.mark.parametrize("body, message", [
    ({"parts": {"recon": [0.5]}, "errors": {}}, "answered 1 values of part 'recon' for 2 rows"),
    ({"parts": {"recon": [0.5, 0.1, 0.2]}, "errors": {}}, "answered 3 values of part 'recon' for 2 rows"),
    ({"parts": {"recon": 0.5}, "errors": {}}, "answered float values of part 'recon' for 2 rows"),
    ({"parts": {"recon": [0.5, "0.4"]}, "errors": {}}, "answered '0.4' as part 'recon' of row 1, not a finite number"),
    ({"parts": {"recon": [0.5, True]}, "errors": {}}, "answered True as part 'recon' of row 1, not a finite number"),
    ({"rewards": [0.5, 0.5]}, "answered without caprecon's `parts` and `errors`: is it caprecon serve?"),
    ({"parts": {}, "errors": ["x"]}, "answered without caprecon's `parts` and `errors`"),
])
def test_an_answer_not_shaped_as_reward_parts_is_refused(body, message):
    # summed as it came, one value for two completions gave TRL one reward for two
    server = Canned(body=json.dumps(body).encode())
    try:
        with pytest.raises(RemoteRewardError, match=re.escape(message)):
            RemoteReward(server.url, retries=0)([PICTURES[0]] * 2, ["red circle", "green triangle"])
    finally:
        server.close()


@pytest.mark.parametrize("raw", [b'{"parts": {"recon": [0.5, NaN]}, "errors": {}}', b"<html>proxy error</html>"])
def test_a_nan_or_a_page_that_is_not_json_is_refused(raw):
    server = Canned(body=raw)
    try:
        with pytest.raises(RemoteRewardError, match=r"(answered nan as part 'recon' of row 1|with something that "
                                                    r"is not JSON \(b'<html>proxy error</html>'\))"):
            RemoteReward(server.url, retries=0)([PICTURES[0]] * 2, ["red circle", "green triangle"])
        assert len(server.seen) == 1  # not sent again
    finally:
        server.close()


class KeyedGenerator(OracleGenerator):
    """A backend given as an object whose text shows its key, as a dataclass's repr shows every field."""

    def __init__(self):
        self.api_key = "sk-live-0123456789"

    def __repr__(self):
        return f"KeyedGenerator(api_key={self.api_key!r})"


def test_the_manifest_masks_a_key_in_the_text_of_a_model_given_as_an_object(tmp_path):
    # the manifest was redacted first and made text after, so the object's text went out as it was
    generator = KeyedGenerator()
    options = dict(metrics=["recon"], generator=generator, embedder=PixelEmbedder(), cache_dir=str(tmp_path / "c"))
    service = RewardService(ServiceSettings(reward=options, manifest={"settings": {"generator": generator}}))
    stand_in = StandIn(service)
    try:
        shown = RemoteReward(stand_in.url).manifest()
    finally:
        stand_in.close()
    assert shown == {"settings": {"generator": "KeyedGenerator(api_key='***')"}}


@pytest.mark.parametrize("host, token, warned", [("0.0.0.0", None, True), ("10.1.2.3", None, True),
                                                 ("gpu-node-7", None, True), ("0.0.0.0", "tok-123456", False),
                                                 ("127.0.0.1", None, False), ("127.0.0.2", None, False),
                                                 ("::1", None, False), ("localhost", None, False)])
def test_serving_beyond_this_machine_without_a_token_is_warned_of(monkeypatch, caplog, host, token, warned):
    import caprecon.apps.reward.serve as served_module

    class Running:
        manifest = {}

    monkeypatch.setattr(served_module, "start", lambda *a, **k: Running())
    served_module.serve("recon", host=host, port=8123, token=token, preset="offline")
    said = [r.getMessage() for r in caplog.records if "with no token" in r.getMessage()]
    assert said == ([f"serving on {host} with no token, so anyone who can reach port 8123 can spend this reward's "
                     "GPUs and read its answers; export one in $CAPRECON_SERVE_TOKEN (or the variable --token-env "
                     "names) for the server and its clients"] if warned else [])


def test_a_file_sent_by_its_path_is_named_as_in_process_so_seeded_rewards_agree(tmp_path):
    # the server read the file under --image-root and handed Reward its bare bytes, named by content: another
    # seed than the in-process reward draws for the same path, so another reward
    from caprecon.apps.reward import Reward

    (tmp_path / "root" / "sub").mkdir(parents=True)
    paths = [tmp_path / "root" / "photo0.png", tmp_path / "root" / "sub" / "photo1.png"]
    for picture, path in zip(PICTURES, paths):
        picture.save(path)
    options = dict(metrics=["recon"], generator=SeededDrawing(), embedder=PixelEmbedder(), max_side=96, guards=None)
    service = RewardService(ServiceSettings(reward={**options, "cache_dir": str(tmp_path / "served")},
                                            image_root=str(tmp_path / "root"), manifest={}))
    stand_in = StandIn(service)
    captions = ["red circle blue square", "green triangle"]
    try:
        served = RemoteReward(stand_in.url, send_paths=True)(["photo0.png", "sub/photo1.png"], captions)
    finally:
        stand_in.close()
    in_process = Reward(**options, progress=False, cache_dir=str(tmp_path / "local"))([str(p) for p in paths], captions)
    assert served == in_process and None not in served


@pytest.mark.parametrize("name", ["link.png", "ABSOLUTE", "sub/../../outside.png", "linked-folder/outside.png"])
def test_no_path_leads_out_of_the_image_root(tmp_path, name):
    # held before this review (each refused); the link forms were untested
    (tmp_path / "root" / "sub").mkdir(parents=True)
    PICTURES[0].save(tmp_path / "outside.png")
    (tmp_path / "root" / "link.png").symlink_to(tmp_path / "outside.png")
    (tmp_path / "root" / "linked-folder").symlink_to(tmp_path)
    name = str(tmp_path / "outside.png") if name == "ABSOLUTE" else name
    service, generator = make_service(tmp_path, image_root=str(tmp_path / "root"))
    answer = service.score_many([service.parse({"captions": ["red circle"], "images": [{"path": name}]})])[0]
    assert answer["errors"]["0"] == f"image {tmp_path / 'root' / name} lies outside --image-root {tmp_path / 'root'}"
    assert answer["parts"]["recon"] == [None] and generator.prompts == []


def test_a_file_under_the_root_over_the_pixel_limit_is_an_error_of_its_row(tmp_path, monkeypatch):
    (tmp_path / "root").mkdir()
    (tmp_path / "root" / "big.png").write_bytes(_png((110, 110)))
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 10_000)
    service, generator = make_service(tmp_path, image_root=str(tmp_path / "root"))
    answer = service.score_many([service.parse({"captions": ["red circle"], "images": [{"path": "big.png"}]})])[0]
    assert answer["errors"] == {"0": "path: image of 110x110 pixels is over the limit of 10000 pixels "
                                     "(PIL.Image.MAX_IMAGE_PIXELS, the decompression-bomb guard)"}
    assert generator.prompts == []


@pytest.mark.parametrize("option, value, message", [
    ("missing", float("nan"), "missing must be a finite number, not nan"),
    ("max_body_bytes", 0, "max_body_bytes must be at least 1, not 0"),
    ("max_image_bytes", -5, "max_image_bytes must be at least 1, not -5"),
    ("replicas", 0, "replicas must be between 1 and 1024, not 0"),
    ("port", 70000, "port must be between 1 and 65535, not 70000"),
    ("batch_requests", 2.5, "batch_requests must be a whole number, not 2.5"),
    ("batch_wait_s", float("inf"), "batch_wait_s must be a finite number at least 0, not inf"),
    ("gpus_per_replica", -1.0, "gpus_per_replica must be a finite number at least 0, not -1.0"),
])
def test_serve_from_python_refuses_what_the_command_line_refuses(monkeypatch, option, value, message):
    # a NaN `missing` made every OpenRLHF answer fail to encode (a 500 each); a limit of 0 was read as the default
    import caprecon.apps.reward.serve as served_module

    monkeypatch.setattr(served_module, "start", lambda *a, **k: pytest.fail("started"))
    with pytest.raises(ConfigError, match=re.escape(message)):
        served_module.serve("recon", preset="offline", **{option: value})


@pytest.mark.parametrize("make, message", [
    (lambda: RemoteReward("http://127.0.0.1:9", retries=2.5), "RemoteReward: retries must be a whole number, not 2.5"),
    (lambda: RemoteReward("http://127.0.0.1:9", retries=10**6), "RemoteReward: retries must be between 0 and 20"),
    (lambda: RemoteReward("http://127.0.0.1:9", timeout=float("nan")), "RemoteReward: timeout must be a finite number "
                                                                        "above 0, not nan"),
    (lambda: RemoteReward("http://127.0.0.1:9", backoff="1"), "RemoteReward: backoff must be a number, not '1'"),
    (lambda: verl_reward("http://127.0.0.1:9", missing=float("nan")), "verl reward: missing must be a finite number, "
                                                                       "not nan"),
])
def test_the_clients_refuse_settings_that_would_fail_later(make, message):
    # retries=2.5 failed at the first call (range of a float), 10**6 retried for ever; a NaN `missing` gave verl NaN
    with pytest.raises(ConfigError, match=re.escape(message)):
        make()


def test_allow_plugins_reaches_the_reward_a_config_file_names_plugins_for(tmp_path, monkeypatch, capsys):
    # the command dropped --allow-plugins, so a --config naming a plug-in metric was refused with advice to
    # give the very flag that had been given
    import signal

    import caprecon.apps.reward.serve as served_module
    from clirun import run_cli

    started = {}

    class Running:
        url, replicas = "http://127.0.0.1:8123", 1

        def __init__(self, settings):
            self.manifest = settings.manifest

        def stop(self, *, everything=False):
            pass

    def fake_start(settings, **options):
        started["reward"] = settings.reward
        threading.Timer(0.2, signal.raise_signal, (signal.SIGINT,)).start()
        return Running(settings)

    monkeypatch.setattr(served_module, "start", fake_start)
    config = tmp_path / "reward.yaml"
    config.write_text("metrics: [contract_metrics:Words]\n")
    code, _, err = run_cli(["serve", "--config", config, "--preset", "offline"], capsys)
    assert code == 2 and "load only with --allow-plugins" in err and not started
    code, _, err = run_cli(["serve", "--config", config, "--preset", "offline", "--allow-plugins"], capsys)
    assert code == 0, err
    assert "serving contract_metrics:Words on http://127.0.0.1:8123" in err
    assert started["reward"]["allow_plugins"] is True


def test_a_replica_masks_secrets_in_every_record_it_logs(monkeypatch):
    # a replica set up a bare handler: another library's record (an HTTP client retrying a judge) went out whole
    import logging

    from caprecon.apps.reward.serve import replica_logging

    shown = io.StringIO()
    monkeypatch.setattr(logging.getLogger(), "handlers", [logging.StreamHandler(shown)])
    replica_logging()
    logging.getLogger("httpx").warning("retrying http://user:pw-replica-4242@judge.internal/v1")
    assert shown.getvalue() == "retrying http://***@judge.internal/v1\n"
