"""ReconScore end to end on tiny real diffusers / transformers models and on the oracle."""

import json

import numpy as np
import pytest
from PIL import Image

import caprecon
from caprecon.models.generator import DiffusersGenerator, GenerationRequest
from caprecon.models.embedder import HFVisionEmbedder
from caprecon.reconstruct.reconstructor import ReconstructionSpec
from caprecon.store.index import Store
from oracle import OracleGenerator, PixelEmbedder, render
from scale_models import Counting


def _write_samples(folder, n=6, size=(40, 30)):
    rng = np.random.default_rng(0)
    rows = []
    for i in range(n):
        path = folder / f"img{i}.png"
        Image.fromarray(rng.integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)).save(path)
        rows.append({"id": f"s{i}", "image": path.name, "caption": f"a small red house number {i} by a lake"})
    path = folder / "samples.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    return path


@pytest.mark.parametrize("model", ["tiny_sd", "tiny_flux"])
def test_same_seed_gives_byte_identical_images(model, request):
    path = request.getfixturevalue(model)
    reqs = [GenerationRequest("a red circle", seed=7, width=32, height=32),
            GenerationRequest("a red circle", seed=8, width=32, height=32)]
    first = DiffusersGenerator(path, steps=2).generate(reqs)
    again = DiffusersGenerator(path, steps=2).generate(reqs)  # a fresh pipeline: nothing carried over
    assert first[0].image.tobytes() == again[0].image.tobytes()
    assert first[0].image.tobytes() != first[1].image.tobytes()  # the seed matters


def test_generator_batch_does_not_change_images_beyond_rounding(tiny_sd):
    reqs = [GenerationRequest(f"scene {i}", seed=i, width=32, height=32) for i in range(4)]
    batched = DiffusersGenerator(tiny_sd, steps=2, batch_size=4).generate(reqs)
    single = DiffusersGenerator(tiny_sd, steps=2, batch_size=1).generate(reqs)
    for a, b in zip(batched, single):
        # one torch.Generator per request: the same noise whatever the batch; batched CPU
        # kernels round differently, by at most one grey level after 8-bit quantisation
        diff = np.abs(np.asarray(a.image, dtype=int) - np.asarray(b.image, dtype=int))
        assert diff.max() <= 1


def test_batch_size_does_not_change_scores(tmp_path, tiny_sd, tiny_dinov2):
    samples = _write_samples(tmp_path)
    runs = []
    for batch in (1, 4):
        res = caprecon.score(samples, ["recon"], generator=str(tiny_sd), embedder=str(tiny_dinov2),
                             generator_options={"steps": 2, "batch_size": batch}, embedder_options={"batch_size": batch},
                             max_side=32, batch_size=batch, cache_dir=str(tmp_path / f"cache{batch}"))
        runs.append(res.scores("recon"))
    assert all(isinstance(v, float) for v in runs[0])
    np.testing.assert_allclose(runs[0], runs[1], atol=2e-4)
    assert len(set(np.round(runs[0], 6))) > 1  # the scores do depend on the sample


def test_second_run_and_added_metric_recompute_nothing(tmp_path, tiny_sd, tiny_dinov2, tiny_clip):
    samples = _write_samples(tmp_path, n=4)
    cache = str(tmp_path / "cache")
    gen = Counting(DiffusersGenerator(tiny_sd, steps=2))
    first = caprecon.score(samples, ["recon"], generator=gen, embedder=str(tiny_dinov2), max_side=32, cache_dir=cache)
    assert gen.calls == 4 and first.manifest["cache"]["generated"] == 4
    second = caprecon.score(samples, ["recon", "clip-image"], generator=gen, embedder=str(tiny_dinov2),
                            clip=str(tiny_clip), max_side=32, cache_dir=cache)
    assert gen.calls == 4  # zero generator calls on the second run, though a metric was added
    assert second.manifest["cache"]["generated"] == 0
    assert second.scores("recon") == first.scores("recon")
    assert all(-1 <= v <= 1 for v in second.scores("clip-image"))
    # clip-image and recon shared one reconstruction per sample
    assert [r["reconstruction"] for r in second.records] == [r["reconstruction"] for r in first.records]


def test_missing_image_and_empty_caption_are_row_errors(tmp_path, tiny_sd, tiny_dinov2):
    samples = _write_samples(tmp_path, n=3)
    rows = [json.loads(line) for line in samples.read_text().splitlines()]
    rows[1]["image"] = "nowhere.png"
    rows.append({"id": "empty", "image": rows[0]["image"], "caption": "  "})
    samples.write_text("\n".join(json.dumps(r) for r in rows))
    res = caprecon.score(samples, ["recon"], generator=str(tiny_sd), embedder=str(tiny_dinov2),
                         generator_options={"steps": 1}, max_side=32, no_cache=True, out=tmp_path / "run")
    by_id = {r["id"]: r for r in res.records}
    assert "image not found" in by_id["s1"]["error"] and "s1" in by_id["s1"]["error"]
    assert "empty caption" in by_id["empty"]["error"]
    assert isinstance(by_id["s0"]["recon"], float) and isinstance(by_id["s2"]["recon"], float)
    assert res.summary["errors"] == 2 and res.summary["metrics"]["recon"]["n"] == 2
    written = [json.loads(line) for line in (tmp_path / "run" / "scores.jsonl").read_text().splitlines()]
    assert [r["id"] for r in written] == ["s0", "s1", "s2", "empty"]
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["models"]["generator"]["fingerprint"] and manifest["libraries"]["torch"]


def test_long_caption_records_cut_tokens(tmp_path, tiny_sd, tiny_dinov2):
    samples = _write_samples(tmp_path, n=1)
    rows = [json.loads(samples.read_text())]
    rows[0]["caption"] = "word " * 40  # the tiny CLIP BPE has no merges: one token per letter, none for spaces
    samples.write_text(json.dumps(rows[0]))
    res = caprecon.score(samples, ["recon"], generator=str(tiny_sd), embedder=str(tiny_dinov2),
                         generator_options={"steps": 1}, max_side=32, no_cache=True)
    # 40 words x 4 letters + start and end tokens, limit 77
    assert res.records[0]["tokens_cut"] == 40 * 4 + 2 - 77
    generator = res.manifest["models"]["generator"]
    assert generator["text_budget"] == 77 and generator["text_budget_by_encoder"] == {"tokenizer": 77}


def test_cut_tokens_are_counted_whole_whatever_the_pipeline_tokenizer_was_last_set_to(tiny_sd):
    """The pipeline's own call leaves its tokenizer truncating at 77 and padding to 77; the counts
    are of whole prompts all the same, and the pipeline's tokenizer is left as its call set it."""
    generator = DiffusersGenerator(str(tiny_sd), steps=1)
    tok = generator.pipeline.tokenizer
    tok(["word " * 40], padding="max_length", max_length=77, truncation=True)  # as encode_prompt calls it
    state = (tok.backend_tokenizer.truncation, tok.backend_tokenizer.padding)
    assert state[0] is not None and state[1] is not None
    # the tiny CLIP BPE has no merges: one token per letter, none for spaces, plus start and end
    assert generator.tokens_cut_batch(["word " * 40, "word " * 10, "a cat"]) == [
        {"tokenizer": 40 * 4 + 2 - 77}, {"tokenizer": 0}, {"tokenizer": 0}]
    assert generator.token_room("word " * 10) == 77 - (10 * 4 + 2)
    assert (tok.backend_tokenizer.truncation, tok.backend_tokenizer.padding) == state


def test_a_tokenizer_without_a_rust_one_is_called_as_it_is():
    from caprecon.models.generator import token_counts

    calls = []

    def words(prompts, add_special_tokens, verbose):  # a Python tokenizer: a token a word, start and end
        calls.append(list(prompts))
        return {"input_ids": [[0, *range(len(p.split())), 1] for p in prompts]}

    assert token_counts(words)(["a red car", "one"]) == [5, 3]
    assert calls == [["a red car", "one"]]


def test_faithful_caption_beats_perturbed_under_oracle(tmp_path):
    truth = "a red circle and a blue square"
    source = tmp_path / "scene.png"
    render(truth, 96, 96).save(source)
    captions = {"faithful": truth, "colour-swap": "a green circle and a blue square",
                "object-swap": "a red triangle and a blue square", "partial": "a red circle"}
    samples = [{"id": k, "image": str(source), "caption": c, "image_id": "scene"} for k, c in captions.items()]
    res = caprecon.score(samples, ["recon"], generator=OracleGenerator(), embedder=PixelEmbedder(), max_side=96,
                         no_cache=True)
    score = {r["id"]: r["recon"] for r in res.records}
    assert score["faithful"] == pytest.approx(1.0, abs=1e-6)
    assert score["faithful"] > score["colour-swap"] and score["faithful"] > score["object-swap"]
    assert score["faithful"] > score["partial"]


def test_metric_object_usable_alone():
    recon = caprecon.ReconScore(generator=OracleGenerator(), embedder=PixelEmbedder(), max_side=96)
    images = [render("a yellow square"), render("a purple circle")]
    scores = recon(images, ["a yellow square", "a yellow square"])
    assert scores[0] == pytest.approx(1.0, abs=1e-6) and scores[1] < scores[0]


def test_reconstruction_size_and_seed_policy():
    spec = ReconstructionSpec(max_side=1024)
    assert spec.size_for(500, 375) == (1024, 768)
    w, h = spec.size_for(333, 500)
    assert h == 1024 and w % 16 == 0 and abs(w / h - 333 / 500) < 0.02
    assert ReconstructionSpec(max_side=1024, upscale=False).size_for(500, 375) == (496, 368)
    assert spec.seed_for("img", 0) == spec.seed_for("img", 0) != spec.seed_for("img", 1)
    fixed = ReconstructionSpec(seed=5, seed_policy="fixed")
    assert fixed.seed_for("a", 0) == fixed.seed_for("b", 3) == 5
    assert ReconstructionSpec(template="remote-sensing").template.count("{caption}") == 1
    with pytest.raises(ValueError):
        ReconstructionSpec(template="no placeholder")


def test_store_keys_and_wal(tmp_path):
    from caprecon.store.index import content_key

    store = Store(tmp_path)
    k1 = content_key("reconstruction", caption="a", seed=1)
    assert k1 == content_key("reconstruction", seed=1, caption="a")
    assert k1 != content_key("reconstruction", caption="a", seed=2)
    store.put_arrays("embedding", {k1: np.arange(3, dtype=np.float32)})
    np.testing.assert_array_equal(Store(tmp_path).get_arrays([k1])[k1], [0, 1, 2])
    mode = store.connect().execute("PRAGMA journal_mode").fetchone()[0]
    assert mode == "wal"


def test_embedders_give_unit_rows(tiny_clip, tiny_dinov2):
    images = [Image.new("RGB", (40, 30), (200, 10, 10)), Image.new("RGB", (20, 50), (10, 10, 200))]
    for path in (tiny_clip, tiny_dinov2):
        vectors = HFVisionEmbedder(path).embed(images)
        np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
        assert not np.allclose(vectors[0], vectors[1])
