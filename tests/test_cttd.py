"""The CTTD builder: each stage's core on constructed data, the pipeline end to end with
scripted models (and once with tiny real ones), resuming after a kill, and importers."""

import base64
import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import caprecon
from caprecon.cli import main
from caprecon.apps.cttd import BuildConfig, build_bank
from caprecon.apps.cttd.categorise import cluster_questions
from caprecon.apps.cttd.generate import shape_qas
from caprecon.apps.cttd.rank import relevance_diversity, top_k
from caprecon.core.errors import ConfigError
from caprecon.core.replies import ParseTally, ReplyError, parse_json_reply, read_replies
from caprecon.apps.cttd.select import density_filter
from caprecon.data.qa import load_qa_bank
from cttd_fakes import TAXONOMY, ScriptedLLM, ScriptedVLM, WordMatcher
from oracle import OracleGenerator, PixelEmbedder, render

TESTS = Path(__file__).parent
SRC = TESTS.parent / "src"
SCENES = ["a red circle and a blue square", "a green triangle", "a yellow square and a red circle", "a blue circle",
          "a purple square and a green circle", "a black triangle and a yellow circle"]


# ---------------------------------------------------------------------------------------
# stage cores on constructed data


def test_density_filter_keeps_the_middle_band_of_known_gaussians():
    from scipy.stats import multivariate_normal

    rng = np.random.default_rng(0)
    means = [np.zeros(5), np.full(5, 6.0)]
    scales = [np.array([1.0, 1.0, 2.0, 0.5, 1.0]), np.array([0.7, 1.5, 1.0, 1.0, 2.0])]
    weights = [0.6, 0.4]
    which = rng.choice(2, size=3000, p=weights)
    x = np.stack([rng.normal(means[k], scales[k]) for k in which])
    true = np.log(sum(w * multivariate_normal(m, np.diag(s ** 2)).pdf(x) for w, m, s in zip(weights, means, scales)))

    estimated, keep = density_filter(x, (0.2, 0.8), components=2, pca_dims=None)

    assert keep.mean() == pytest.approx(0.6, abs=0.01)
    ranks = lambda v: np.argsort(np.argsort(v))  # noqa: E731
    assert np.corrcoef(ranks(true), ranks(estimated))[0, 1] > 0.97
    lo, hi = np.quantile(true, [0.05, 0.95])
    assert not keep[(true < lo) | (true > hi)].any()  # neither the sparsest nor the densest
    band = (true > np.quantile(true, 0.3)) & (true < np.quantile(true, 0.7))
    assert keep[band].mean() > 0.97


def test_dbscan_recovers_constructed_clusters():
    from sklearn.metrics import adjusted_rand_score

    rng = np.random.default_rng(1)
    centres = np.eye(16)[:3]
    truth = np.repeat([0, 1, 2], 20)
    points = centres[truth] + rng.normal(0, 0.03, (60, 16))
    outliers = rng.normal(0, 1, (4, 16))
    x = np.concatenate([points, outliers])
    x /= np.linalg.norm(x, axis=1, keepdims=True)

    labels = cluster_questions(x, eps=0.05, min_samples=5)

    assert adjusted_rand_score(truth, labels[:60]) == 1.0
    assert (labels[60:] == -1).all()


def test_ranking_matches_a_hand_computation():
    qa = np.array([[2.0, 0.0], [3.0, 4.0], [0.0, 0.5]])  # unit directions (1,0), (.6,.8), (0,1)
    image = np.array([5.0, 0.0])
    # relevance 1, .6, 0; mean cosine with all three (self included) 1.6/3, 2.4/3, 1.8/3
    expected = [1 - 0.5 * 1.6 / 3, 0.6 - 0.5 * 2.4 / 3, 0 - 0.5 * 1.8 / 3]
    assert relevance_diversity(qa, image, 0.5) == pytest.approx(expected)
    assert relevance_diversity(qa, image, 0.0) == pytest.approx([1, 0.6, 0])


def test_alpha_zero_keeps_the_most_relevant_and_alpha_trades_for_diversity():
    rng = np.random.default_rng(2)
    image = rng.normal(size=8)
    qa = rng.normal(size=(12, 8))
    relevance = (qa / np.linalg.norm(qa, axis=1, keepdims=True)) @ (image / np.linalg.norm(image))
    assert top_k(relevance_diversity(qa, image, 0.0), 4) == list(np.argsort(-relevance)[:4])

    # four copies of the most relevant pair and one other: s_copy - s_other = (1 - c)(1 - 3 alpha / 5)
    # with c = 0.6 its cosine with the image and with the copies; the other wins for alpha > 5/3
    pairs = np.array([[1.0, 0.0]] * 4 + [[0.6, 0.8]])
    e = np.array([1.0, 0.0])
    assert top_k(relevance_diversity(pairs, e, 0.0), 2) == [0, 1]
    assert top_k(relevance_diversity(pairs, e, 1.5), 2) == [0, 1]
    assert top_k(relevance_diversity(pairs, e, 2.0), 2) == [4, 0]


# ---------------------------------------------------------------------------------------
# replies


GOOD = {"qas": [{"question": "Is it red?", "type": "yesno", "answer": "yes"}]}


@pytest.mark.parametrize("reply", [
    '```json\n{"qas": [{"question": "Is it red?", "type": "yesno", "answer": "yes"}]}\n```',
    '{"qas": [{"question": "Is it red?", "type": "yesno", "answer": "yes",},],}',
    "{'qas': [{'question': 'Is it red?', 'type': 'yesno', 'answer': 'yes'}]}",
    'Sure, here you go:\n{"qas": [{"question": "Is it red?", "type": "yesno", "answer": "yes"}]}\nAnything else?',
    '{"qas": [{"question": "Is it red?", "type": "yesno", "answer": "yes"}',  # cut before the closing brackets
    '```\n{"qas": [{"question": "Is it red?", "type": "yesno", "answer": "yes"},]}',  # fence never closed
], ids=["code-fence", "trailing-commas", "single-quotes", "prose-around", "truncated", "open-fence"])
def test_broken_json_is_repaired(reply):
    value, repaired = parse_json_reply(reply)
    assert repaired and value == GOOD


def test_a_reply_cut_mid_pair_keeps_the_complete_pairs_and_the_half_for_curation():
    value, repaired = parse_json_reply(
        '{"qas": [{"question": "Is it red?", "type": "yesno", "answer": "yes"}, {"question": "How ma')
    assert repaired and value == {"qas": GOOD["qas"] + [{"question": "How ma"}]}
    pairs, _ = shape_qas(value)
    assert pairs[0] == GOOD["qas"][0] and "answer" not in pairs[1]  # curation drops it as "missing answer"


def test_apostrophes_inside_double_quotes_survive_repair():
    value, _ = parse_json_reply("{'q': \"what's this?\", 'b': True, 'c': None,}")
    assert value == {"q": "what's this?", "b": True, "c": None}


@pytest.mark.parametrize("reply", ["I cannot describe this image.", "I cannot {", "[", "x {} y"])
def test_unreadable_reply_raises(reply):
    # json_repair answers "" or an empty container where it finds nothing: not a value
    with pytest.raises(ReplyError):
        parse_json_reply(reply)


def test_prose_after_a_fence_is_not_read_as_more_json():
    assert parse_json_reply('Here:\n```json\n{"a": 1}\n```\nThat is all {not json}') == ({"a": 1}, True)


def test_replies_are_retried_once_then_dropped_and_counted():
    replies = [
        json.dumps(GOOD),  # strict
        "```json\n" + json.dumps(GOOD) + "\n```",  # repaired locally
        json.dumps({"items": [{"q": "Is it red?", "kind": "Yes/No", "a": "yes"}]}),  # wrong keys: mapped
        json.dumps({"a": [], "b": []}),  # wrong shape: retried, fixed
        json.dumps([{"colour": "red"}]),  # wrong keys nothing maps: retried, still wrong, dropped
        "no JSON here",  # retried, fixed
        "no JSON here either",  # retried, still nothing: dropped
    ]
    again_replies = {3: json.dumps(GOOD), 4: json.dumps([{"colour": "red"}]), 5: json.dumps(GOOD), 6: "sorry"}
    asked_again = []

    def ask_again(prompts):
        asked_again.extend(prompts)
        return [again_replies[i] for i in (3, 4, 5, 6)]

    tally, rejects = ParseTally(), []
    values = read_replies(replies, shape_qas, "SHAPE", ask_again, tally, rejects, [{"n": i} for i in range(7)])

    assert len(asked_again) == 4 and all("SHAPE" in p for p in asked_again)
    assert tally.to_dict() == {"strict": 1, "repaired": 2, "retried": 2, "dropped": 2,
                               "drop_reasons": {"not JSON": 1, "wrong shape": 1}}
    assert values[2] == [{"question": "Is it red?", "type": "yesno", "answer": "yes"}]
    assert values[4] is None and values[6] is None
    assert [r["n"] for r in rejects] == [4, 6] and rejects[1]["retry_reply"] == "sorry"


class SameVector:
    """Every question embeds alike: any two pairs with the same answer are twins."""

    fingerprint = "same-vector"

    def embed_texts(self, texts):
        return np.ones((len(texts), 4), dtype=np.float32) / 2


class RefutesOne:
    """A judge that says "no" to one question and "yes" to every other."""

    fingerprint = "refutes-one"

    def __init__(self, refuted):
        self.refuted, self.prompts = refuted, []

    def generate(self, requests, max_new_tokens=32):
        self.prompts += [r.prompt for r in requests]
        return ["no" if self.refuted in r.prompt else "yes" for r in requests]


def test_curation_asks_the_judge_before_removing_near_duplicates(tmp_path):
    """The paper's order: inconsistent pairs go first, then near-duplicates. A (refuted) and B
    (accepted) are twins with the same answer; B is later, so removing duplicates first
    would drop it as A's twin and then A as refuted, leaving nothing."""
    import types

    from caprecon.apps.cttd import curate
    from caprecon.apps.cttd.stage import Job
    from caprecon.metrics import Context

    render("a red circle", 64, 64).save(tmp_path / "im.png")
    folder = tmp_path / "05-curate"
    folder.mkdir()
    judge = RefutesOne("Is the shape red?")
    job = Job(folder=folder, build=tmp_path, config=BuildConfig(),
              models=types.SimpleNamespace(judge=judge, matcher=SameVector()), ctx=Context(), images=[],
              progress=False)
    entry = {"image_id": "im", "key": "im-key", "path": str(tmp_path / "im.png"), "width": 64, "height": 64}
    pairs = [{"id": "im#A", "image_id": "im", "category": "colour", "question": "Is the shape red?", "type": "yesno",
              "answer": "yes"},
             {"id": "im#B", "image_id": "im", "category": "colour", "question": "Is the shape in red?",
              "type": "yesno", "answer": "yes"}]
    curate.run(job, [entry], pairs)
    kept = [json.loads(line) for line in (folder / curate.OUTPUT).read_text().splitlines()]
    dropped = [json.loads(line) for line in (folder / "dropped.jsonl").read_text().splitlines()]
    assert [r["id"] for r in kept] == ["im#B"]
    assert [(r["id"], r["dropped"]) for r in dropped] == [("im#A", "judge disagrees")]
    assert len(judge.prompts) == 2  # both asked: the judge runs before the twins are compared


# ---------------------------------------------------------------------------------------
# the pipeline


@pytest.fixture(scope="module")
def image_folder(tmp_path_factory):
    """Six scenes, and four images that stage 1 must drop, one per reason."""
    folder = tmp_path_factory.mktemp("images") / "shapes"
    folder.mkdir()
    for i, scene in enumerate(SCENES):
        render(scene, 96, 96).save(folder / f"scene{i}.png")
    render("", 96, 96).save(folder / "blank.png")  # near-uniform
    render("a red circle", 20, 20).save(folder / "tiny.png")  # too small
    (folder / "broken.png").write_bytes(b"not an image")  # unreadable
    render(SCENES[0], 96, 96).save(folder / "scene9-copy.png")  # near-duplicate of scene0
    return folder


@pytest.fixture(scope="module")
def taxonomy_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("taxonomy") / "taxonomy.json"
    path.write_text(json.dumps(TAXONOMY))
    return path


def scripted_config(taxonomy, **overrides):
    settings = dict(embedder=PixelEmbedder(), matcher=WordMatcher(), vlm=ScriptedVLM(), llm=ScriptedLLM(),
                    taxonomy=str(taxonomy), density_band=(0, 1))
    return BuildConfig(**{**settings, **overrides})


def test_scripted_build_end_to_end(image_folder, taxonomy_file, tmp_path):
    config = scripted_config(taxonomy_file, top_k=6, blind_filter=True)
    result = build_bank(image_folder, tmp_path / "build", config, progress=False)

    stages = {s["stage"]: s for s in result.datasheet["stages"]}
    assert stages["select"]["dropped"] == {"near-uniform": 1, "too small": 1, "unreadable (UnidentifiedImageError)": 1,
                                           "near-duplicate": 1}
    n = len(SCENES)
    # per image: colour strict; count, where, truncated, wrong-keys repaired locally;
    # two-lists fixed by the retry; garbage dropped after it
    assert stages["generate"]["replies"] == {"strict": n, "repaired": 4 * n, "retried": n, "dropped": n,
                                             "drop_reasons": {"not JSON": n}}
    assert stages["generate"]["model_calls"] == {"vlm-reply": 7 * n + 2 * n}
    # per image: two pairs without an answer (one written so, one the truncated reply's half
    # pair), one twin, one the judge refutes; "Is the background white?" (asked twice per
    # image) is yes/no, exempt from the blind filter
    assert stages["curate"]["dropped"] == {"missing answer": 2 * n, "near-duplicate": n, "judge disagrees": n}
    assert stages["rank"]["dropped"] == {"beyond the top k": n}  # 7 kept, top 6
    bank = load_qa_bank(result.bank)
    assert sorted(bank) == [f"scene{i}" for i in range(n)]
    assert all(len(items) == 6 for items in bank.values())
    assert {q.type for items in bank.values() for q in items} == {"mc", "yesno", "short", "box"}
    assert result.datasheet["by_source"] == {"shapes": 6 * n}
    assert sum(result.datasheet["by_type"].values()) == 6 * n
    sheet = (tmp_path / "build" / "datasheet.md").read_text()
    assert "judge disagrees: 6" in sheet and 'in the category "{category}"' in sheet

    # a rerun finds every stage finished; a new alpha reruns only the ranking, from the cache
    again = build_bank(image_folder, tmp_path / "build", config, progress=False)
    assert again.ran == [] and again.computed == {}
    config.alpha = 0.0
    third = build_bank(image_folder, tmp_path / "build", config, progress=False)
    assert third.ran == ["rank"] and third.computed == {}


def test_a_stage_whose_code_was_revised_is_redone_and_so_is_what_its_output_feeds(image_folder, taxonomy_file,
                                                                                  tmp_path, monkeypatch):
    from dataclasses import replace

    from caprecon.apps.cttd import curate, pipeline

    revised = pipeline.STAGES
    # curate: 1 issue 21 item 6's new order, 2 parents; generate 1 and rank 1: parents (issue 52)
    assert [s.revision for s in revised if s.name in ("generate", "curate", "rank")] == [1, 2, 1]

    def older_curation(job):  # stands in for the code before: it kept one question more
        next(s for s in revised if s.name == "curate").run(job)
        kept = job.folder / curate.OUTPUT
        lines = kept.read_text().splitlines(keepends=True)
        kept.write_text("".join(lines + lines[:1]))

    # a build made by the code before stages had revisions: every stage at 0
    monkeypatch.setattr(pipeline, "STAGES", tuple(
        replace(s, revision=0, run=older_curation if s.name == "curate" else s.run) for s in revised))
    config = scripted_config(taxonomy_file)
    old = build_bank(image_folder, tmp_path / "build", config, progress=False)
    assert old.ran == ["select", "propose", "categorise", "generate", "curate", "rank"]

    monkeypatch.setattr(pipeline, "STAGES", revised)
    new = build_bank(image_folder, tmp_path / "build", config, progress=False)
    # the stages before generation are found finished; the revised ones are redone from the cache
    assert new.skipped == ["select", "propose", "categorise"]
    assert new.ran == ["generate", "curate", "rank"] and new.computed == {}
    fresh = build_bank(image_folder, tmp_path / "fresh", config, progress=False)
    assert new.bank.read_text() == fresh.bank.read_text()
    again = build_bank(image_folder, tmp_path / "build", config, progress=False)
    assert again.ran == []


def test_bank_scores_captions_with_turing(image_folder, taxonomy_file, tmp_path):
    result = build_bank(image_folder, tmp_path / "build", scripted_config(taxonomy_file), progress=False)
    captions = tmp_path / "captions.jsonl"
    rows = [{"id": f"good{i}", "image": str(image_folder / f"scene{i}.png"), "caption": scene}
            for i, scene in enumerate(SCENES)]
    rows += [{"id": f"bad{i}", "image": str(image_folder / f"scene{i}.png"), "caption": "a purple triangle",
              "candidate_index": 1} for i in range(len(SCENES))]
    captions.write_text("\n".join(json.dumps(r) for r in rows))

    results = caprecon.score(captions, metrics=["turing"], generator=OracleGenerator(), judge=ScriptedVLM(),
                             qa_bank=str(result.bank), max_side=96, cache_dir=str(tmp_path / "build" / "store"))
    # curation asked this judge every kept question about the originals: the upper bound is
    # all in the build's store, and only the reconstructions are asked
    assert results.manifest["cache"]["judge-answer"] == len(rows) * 7
    by_id = {r["id"]: r for r in results.records}
    for i in range(len(SCENES)):
        good, bad = by_id[f"good{i}"], by_id[f"bad{i}"]
        assert "error" not in good and good["turing_upper"] == 1.0  # every kept answer was checked on I
        assert good["turing"] == 1.0  # the oracle rebuilds the scene exactly from a right caption
        assert bad["turing"] < good["turing"]


def test_discovered_categories(image_folder, tmp_path):
    config = scripted_config("discover", dbscan_min_samples=3, dbscan_eps=0.1)
    result = build_bank(image_folder, tmp_path / "build", config, progress=False)
    taxonomy = json.loads((tmp_path / "build" / "03-categorise" / "taxonomy.json").read_text())
    # every image proposes the same colour and count questions: two clusters of six
    assert sorted((c["name"], c["size"]) for c in taxonomy) == [("colour", 6), ("count", 6)]
    assert set(result.datasheet["by_category"]) == {"colour", "count"}


def test_tiny_real_models_run_every_stage(image_folder, tmp_path, tiny_clip):
    """The plumbing with real transformers backends: random weights write no JSON, so every
    reply is retried once, then dropped and counted."""
    from tiny_vlm import build_qwen2_lm, build_qwen2_vl

    vlm = build_qwen2_vl(tmp_path / "qwen2vl")
    llm = build_qwen2_lm(tmp_path / "qwen2lm")
    taxonomy = tmp_path / "two.json"
    taxonomy.write_text(json.dumps(TAXONOMY[:2]))
    folder = tmp_path / "one"
    folder.mkdir()
    (folder / "scene0.png").write_bytes((image_folder / "scene0.png").read_bytes())
    config = BuildConfig(embedder=str(tiny_clip), matcher=str(tiny_clip), vlm=str(vlm),  # one CLIP, two roles
                         vlm_options={"max_new_tokens": 8, "device": "cpu"}, llm=str(llm), taxonomy=str(taxonomy),
                         max_new_tokens=8, density_band=(0, 1), duplicate_cos=1.0, blind_filter=True)
    result = build_bank(folder, tmp_path / "build", config, progress=False)

    stages = {s["stage"]: s for s in result.datasheet["stages"]}
    assert stages["select"]["model_calls"] == {"embedding": 1}
    rejects = [json.loads(line) for line in (tmp_path / "build" / "04-generate" / "rejects.jsonl").read_text().splitlines()]
    assert len(rejects) == 2 and stages["generate"]["replies"]["dropped"] == 2
    # categories x (ask + retry); two garbled replies alike make one retry prompt, asked (and cached) once
    retries = len({(r["reply"], r["first_error"]) for r in rejects})
    assert stages["generate"]["model_calls"] == {"vlm-reply": 2 + retries}
    assert result.datasheet["questions"] == 0 and result.datasheet["models"]["vlm"]["backend"] == "transformers-vlm"
    assert result.datasheet["models"]["matcher"]["backend"] == "clip-matcher"
    assert stages["rank"]["model_calls"] == {}  # nothing survived to rank

    # with pairs to work on (the scripted questioner's), the tiny CLIP and LLM do the rest
    config = BuildConfig(embedder=str(tiny_clip), matcher=str(tiny_clip), vlm=ScriptedVLM(), llm=str(llm),
                         taxonomy=str(taxonomy), density_band=(0, 1), duplicate_cos=1.0, judge_check=False,
                         blind_filter=True, llm_options={"max_new_tokens": 4, "device": "cpu"})
    result = build_bank(folder, tmp_path / "build2", config, progress=False)
    stages = {s["stage"]: s for s in result.datasheet["stages"]}
    assert stages["curate"]["model_calls"]["llm-answer"] == 3 + 1  # the mc in three rotations, the short once
    assert stages["rank"]["model_calls"]["matcher-image-embedding"] == 1
    bank = load_qa_bank(result.bank)
    assert list(bank) == ["scene0"] and result.datasheet["models"]["llm"]["backend"] == "transformers-llm"


def _cli_env(**extra):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), str(TESTS)]), "HF_HUB_OFFLINE": "1", **extra}
    return env


def test_killed_build_resumes_without_redoing_finished_items(image_folder, taxonomy_file, tmp_path, monkeypatch):
    out = tmp_path / "build"
    command = [sys.executable, "-m", "caprecon.cli", "cttd", "build", "--images", str(image_folder), "--out", str(out),
               "--vlm", "cttd_fakes:ScriptedVLM", "--llm", "cttd_fakes:ScriptedLLM", "--embedder", "oracle:PixelEmbedder",
               "--matcher", "cttd_fakes:WordMatcher", "--taxonomy", str(taxonomy_file), "--density-band", "0", "1", "--quiet",
               "--allow-row-errors"]  # the fakes' garbage replies and the broken image are counted failures
    first_log = tmp_path / "first.log"
    proc = subprocess.Popen(command, env=_cli_env(CTTD_FAKE_LOG=str(first_log), CTTD_FAKE_BLOCK_AFTER="2"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    blocked = Path(str(first_log) + ".blocked")
    deadline = time.time() + 120
    while not blocked.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.2)
    assert blocked.exists(), proc.stderr.read().decode() if proc.poll() is not None else "never reached stage 4"
    proc.send_signal(signal.SIGKILL)  # mid-stage: two images' pairs written, the third in flight
    proc.wait()
    assert (out / "01-select" / "manifest.json").exists() and not (out / "04-generate" / "manifest.json").exists()
    first_calls = [json.loads(line)["call"] for line in first_log.read_text().splitlines()]
    assert len(first_calls) == 2 * 9  # two images: 7 categories + 2 retries each
    select_manifest = (out / "01-select" / "manifest.json").read_text()

    second_log = tmp_path / "second.log"
    monkeypatch.setenv("CTTD_FAKE_LOG", str(second_log))
    monkeypatch.syspath_prepend(str(TESTS))
    assert main(command[3:]) == 0
    second_calls = [json.loads(line)["call"] for line in second_log.read_text().splitlines()]
    generate = json.loads((out / "04-generate" / "manifest.json").read_text())
    assert not set(first_calls) & set(second_calls)  # nothing finished is asked again
    assert generate["computed"] == {"vlm-reply": (len(SCENES) - 2) * 9}
    assert (out / "01-select" / "manifest.json").read_text() == select_manifest  # finished: not rerun

    fresh = build_bank(image_folder, tmp_path / "fresh", scripted_config(taxonomy_file), progress=False)
    assert (out / "bank.jsonl").read_text() == fresh.bank.read_text()


def test_build_errors_name_the_problem(tmp_path, capsys):
    assert main(["cttd", "build", "--images", str(tmp_path / "none"), "--out", str(tmp_path / "b")]) == 2
    assert f"--images: not found: {tmp_path / 'none'}" in capsys.readouterr().err
    (tmp_path / "images").mkdir()  # beside the build folder: one inside the images is refused first
    assert main(["cttd", "build", "--images", str(tmp_path / "images"), "--out", str(tmp_path / "b"), "--taxonomy",
                 "nothing.json"]) == 2
    assert "taxonomy must be 'paper', 'discover' or a taxonomy JSON file" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------
# importers


def _png_base64(colour) -> tuple[str, Image.Image]:
    image = Image.new("RGB", (12, 8), colour)
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode(), image


def test_import_vlmevalkit_tsv(tmp_path):
    red, red_image = _png_base64((200, 10, 10))
    blue, _ = _png_base64((10, 10, 200))
    header = ["index", "image", "question", "hint", "A", "B", "C", "D", "answer", "category"]
    rows = [["11", red, "What colour is the image?", "Look closely.", "blue", "red", "green", "", "B", "colour"],
            ["12", "11", "Is the image red?", "", "", "", "", "", "Yes", "existence"],
            ["13", blue, "Name the colour.", "nan", "", "", "", "", "blue", "colour"]]
    tsv = tmp_path / "MMBench_DEV_EN.tsv"
    tsv.write_text("\n".join("\t".join(r) for r in [header, *rows]) + "\n")

    assert main(["cttd", "import", str(tsv), "--out", str(tmp_path / "bank"), "--id-prefix", "mmb-"]) == 0
    bank = load_qa_bank(tmp_path / "bank" / "bank.jsonl")
    [mc], [yesno], [short] = bank["mmb-11"], bank["mmb-12"], bank["mmb-13"]
    assert mc.type == "mc" and mc.choices == ("blue", "red", "green") and mc.answer == "B"
    assert mc.question == "Look closely.\nWhat colour is the image?"
    assert (yesno.type, yesno.answer, short.type, short.answer) == ("yesno", "yes", "short", "blue")
    # the image of row 12 is row 11's, by reference
    written = Image.open(tmp_path / "bank" / yesno.meta["image"])
    assert np.array_equal(np.asarray(written), np.asarray(red_image))
    sheet = json.loads((tmp_path / "bank" / "datasheet.json").read_text())
    assert sheet["by_category"] == {"colour": 2, "existence": 1} and sheet["by_source"] == {"MMBench_DEV_EN": 3}


def test_import_generic_csv_with_column_mapping(tmp_path):
    (tmp_path / "pics").mkdir()
    Image.new("RGB", (10, 10), "white").save(tmp_path / "pics" / "dog.png")
    csv_file = tmp_path / "questions.csv"
    csv_file.write_text("pic,q,correct,opts,kind\n"
                        "pics/dog.png,What animal?,dog,cat|dog|bird,\n"
                        "pics/dog.png,Is it outdoors?,no,,\n"
                        "pics/dog.png,Where is the dog?,\"[0.1, 0.2, 0.5, 0.9]\",,\n")
    args = ["cttd", "import", str(csv_file), "--out", str(tmp_path / "bank"), "--column", "image=pic",
            "--column", "question=q", "--column", "answer=correct", "--column", "choices=opts",
            "--column", "type=kind", "--category", "general"]
    assert main(args) == 0
    [mc, yesno, box] = load_qa_bank(tmp_path / "bank" / "bank.jsonl")["dog"]
    assert (mc.type, mc.answer, yesno.type, box.type) == ("mc", "B", "yesno", "box")
    assert box.answer == (0.1, 0.2, 0.5, 0.9) and mc.category == "general"
    assert (tmp_path / "bank" / "images" / "dog.png").exists()


def test_import_bad_row_names_the_line(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"image_id": "a", "question": "Colour?", "choices": ["red", "blue"], "answer": "green"})
                   + "\n")
    assert main(["cttd", "import", str(bad), "--out", str(tmp_path / "bank"), "--no-images"]) == 2
    err = capsys.readouterr().err
    assert "bad.jsonl:1" in err and "neither an option letter nor one of the choices" in err


@pytest.mark.parametrize("option, value, message", [
    ("--alpha", "nan", "--alpha must be a finite number at least 0, not nan"),
    ("--alpha", "-0.5", "--alpha must be a finite number at least 0, not -0.5"),  # would reward redundancy
    ("--top-k", "1000000000", "--top-k must be between 1 and 1000, not 1000000000"),
    ("--qas-per-category", "0", "--qas-per-category must be between 1 and 100, not 0"),
    ("--duplicate-cos", "1.5", "--duplicate-cos must be between -1 and 1, not 1.5"),
    ("--qa-duplicate-cos", "inf", "--qa-duplicate-cos must be between -1 and 1, not inf"),
    ("--dbscan-eps", "0", "--dbscan-eps must be above 0 and at most 2, not 0.0"),
    ("--gmm-components", "-3", "--gmm-components must be between 1 and 1000, not -3"),
    ("--uniform-std", "-1", "--uniform-std must be between 0 and 255, not -1.0"),
])
def test_build_numbers_have_bounds_and_domains(tmp_path, capsys, option, value, message):
    images = tmp_path / "images"
    images.mkdir()
    assert main(["cttd", "build", "--images", str(images), "--out", str(tmp_path / "b"), option, value]) == 2
    assert capsys.readouterr().err.strip().endswith(message)
    with pytest.raises(ConfigError, match="--top-k must be between 1 and 1000"):
        BuildConfig(top_k=1001)  # the API and a --config file are held to the same bounds


def test_cttd_import_refuses_a_vlmevalkit_image_that_is_neither_base64_nor_a_row(tmp_path, capsys):
    data = io.BytesIO()
    Image.new("RGB", (8, 8), (200, 0, 0)).save(data, format="PNG")
    card = base64.b64encode(data.getvalue()).decode()
    tsv = tmp_path / "cards.tsv"
    tsv.write_text("index\timage\tquestion\tanswer\tA\tB\n"
                   f"0\t{card}\tWhich colour?\tA\tred\tblue\n"
                   "1\t!!!not-base64@@@\tWhich colour?\tB\tred\tblue\n"
                   "2\t0\tWhich colour?\tA\tred\tblue\n")  # row 2 refers to row 0's image: kept
    for extra in ([], ["--no-images"]):
        out = tmp_path / f"bank{len(extra)}"
        assert main(["cttd", "import", str(tsv), "--out", str(out), *extra]) == 1
        err = capsys.readouterr().err
        assert "dropped: 1 question(s) whose image could not be used (image not base64: 1)" in err
        assert (f"{tsv}:3 (image 1): the image '!!!not-base64@@@' is neither base64 nor the index of a row holding "
                "an image") in err  # fmt: skip
        bank = [json.loads(line) for line in (out / "bank.jsonl").read_text().splitlines()]
        assert [q["id"] for q in bank] == ["0", "2"]


# ---------------------------------------------------------------------------------------
# dependencies between questions, and the blind control (issue 52)


class DependentVLM(ScriptedVLM):
    """Writes one category's pairs with dependencies: a true parent and its child, a false
    parent (the judge refutes it) and its child, an mc question naming a true parent and a
    position that is no earlier pair, and a short question a blind LLM gets right."""

    @property
    def fingerprint(self) -> str:
        return "dependent-vlm-v1"

    def _reply(self, request):
        from cttd_fakes import shapes

        if 'in the category "colour"' in request.prompt:
            found = [c for c, _ in shapes(request.image)]
            first, absent = found[0], next(c for c in ("green", "yellow", "purple") if c not in found)
            return json.dumps({"qas": [
                {"question": f"Is there a {first} shape in the image?", "type": "yesno", "answer": "yes"},
                {"question": f"Is the leftmost shape {first}?", "type": "yesno", "answer": "yes", "depends_on": [0]},
                {"question": f"Is there a {absent} shape in the image?", "type": "yesno", "answer": "yes"},
                {"question": f"Is the leftmost shape {absent}?", "type": "yesno", "answer": "no", "depends_on": [2]},
                {"question": "What colour is the leftmost shape?", "type": "mc",
                 "choices": [c for c in ("green", "yellow", "purple") if c != first][:2] + [first], "answer": first,
                 "depends_on": [0, 4, 7]},  # itself and a position past the reply: left out
                {"question": "Is the background white, in one word?", "type": "short", "answer": "yes"}]})
        return super()._reply(request)


@pytest.mark.parametrize("keep", [False, True])
def test_a_build_writes_parents_and_leaves_out_what_a_blind_llm_answers(image_folder, tmp_path, keep):
    taxonomy = tmp_path / "colour.json"
    taxonomy.write_text(json.dumps([{"name": "colour", "description": "the colours of the shapes"}]))
    folder = tmp_path / "one"
    folder.mkdir()
    (folder / "scene0.png").write_bytes((image_folder / "scene0.png").read_bytes())
    config = scripted_config(taxonomy, vlm=DependentVLM(), qas_per_category=6, **({"blind_keep": True} if keep else {}))
    assert config.blind_filter  # on by default, and what it finds is left out unless kept
    result = build_bank(folder, tmp_path / "build", config, progress=False)
    stages = {s["stage"]: s for s in result.datasheet["stages"]}
    assert stages["generate"]["dropped"] == {"dependency on no earlier pair": 2}
    # the false parent goes (judge), its child with it (parent dropped); the alphabet question is blind
    expected = {"judge disagrees": 1, "parent dropped": 1}
    assert stages["curate"]["dropped"] == (expected if keep else {**expected, "answerable without the image": 1})
    assert stages["curate"]["counts"]["blind"] == 1
    assert result.datasheet["blind_answerable"] == {"found": 1, "dropped": 0 if keep else 1,
                                                    "kept_flagged": 1 if keep else 0}
    bank = {q.question: q for q in load_qa_bank(result.bank)["scene0"]}
    parent = bank["Is there a red shape in the image?"]
    assert parent.parents == ()
    assert bank["Is the leftmost shape red?"].parents == (parent.id,)
    assert bank["What colour is the leftmost shape?"].parents == (parent.id,)
    assert ("Is the background white, in one word?" in bank) == keep  # the blind LLM knows backgrounds are white
    if keep:
        assert bank["Is the background white, in one word?"].meta["blind"] is True
    assert result.datasheet["with_parents"] == 2
    sheet = (tmp_path / "build" / "datasheet.md").read_text()
    assert "2 questions presuppose others" in sheet and "answered 1 candidate questions right" in sheet
