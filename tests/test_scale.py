"""Scale-out: shards and their merge, stages run apart (reconstruct, then score with no
generator call), the Ray executor (same scores as local; a failing task retried), store merge."""

import json
import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import caprecon
from caprecon.cli import main
from caprecon.core.errors import ConfigError
from caprecon.models.generator import DiffusersGenerator
from caprecon.run.shards import merge, parse_shard, shard_positions
from caprecon.data.samples import Sample
from scale_models import Counting, FlakyGenerator


def _rows(tmp_path: Path, images: int = 5, captions_per_image=(1, 3, 2, 1, 2)) -> Path:
    """A JSONL of captions; image i has captions_per_image[i] candidates, one source is unreadable."""
    rng = np.random.default_rng(4)
    rows = []
    for i in range(images):
        Image.fromarray(rng.integers(0, 255, (24, 32, 3), dtype=np.uint8)).save(tmp_path / f"p{i}.png")
        for c in range(captions_per_image[i]):
            rows.append({"id": f"r{i}-{c}", "image": f"p{i}.png", "image_id": f"img{i}", "candidate": c,
                         "caption": f"a picture of {i} things, take {c}"})
    rows.append({"id": "broken", "image": "missing.png", "image_id": "gone", "caption": "nothing to see"})
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _settings(tiny_sd, tiny_dinov2, cache: Path) -> dict:
    return {"generator": str(tiny_sd), "generator_options": {"steps": 2}, "embedder": str(tiny_dinov2),
            "max_side": 32, "batch_size": 2, "cache_dir": str(cache)}


def _scored(records):
    return {r["id"]: (r.get("recon"), r.get("error")) for r in records}


# -- shards -----------------------------------------------------------------------------------


def test_shards_keep_images_whole_cover_every_row_once_and_balance():
    sizes = [5, 1, 1, 2, 3, 1, 1, 2, 4, 1]
    samples = [Sample(id=f"{i}-{c}", image=None, caption="c", image_id=f"img{i}", candidate=c)
               for i, n in enumerate(sizes) for c in range(n)]
    shards = shard_positions(samples, 3)
    flat = sorted(p for shard in shards for p in shard)
    assert flat == list(range(len(samples)))  # every row in exactly one shard
    for shard in shards:
        assert shard == sorted(shard)
        images = {samples[p].image_id for p in shard}
        for other in shards:
            if other is not shard:
                assert images.isdisjoint({samples[p].image_id for p in other})  # an image is never split
    loads = [len(s) for s in shards]
    assert max(loads) - min(loads) <= max(sizes)  # balanced to within one image's captions
    assert loads == [7, 7, 7]  # 21 rows: largest-first onto the lightest shard happens to fit exactly
    assert shard_positions(list(reversed(samples)), 3) != shards  # positions follow the input...
    assert shard_positions(samples, 3) == shards  # ...deterministically


def test_parse_shard_refuses_bad_slices():
    assert parse_shard("2/3") == (2, 3)
    for bad in ("3/3", "1", "-1/2", "a/b", "0/0"):
        with pytest.raises(ConfigError, match="shard"):
            parse_shard(bad)


def test_three_shards_merged_equal_the_unsharded_run(tmp_path, tiny_sd, tiny_dinov2):
    data = _rows(tmp_path)
    settings = _settings(tiny_sd, tiny_dinov2, tmp_path / "unused")
    whole = caprecon.score(data, ["recon"], out=tmp_path / "whole", no_cache=True, **settings)
    shards = [tmp_path / f"shard{i}" for i in range(3)]
    for i, folder in enumerate(shards):
        caprecon.score(data, ["recon"], out=folder, no_cache=True, shard=f"{i}/3", **settings)
    # each shard computed its own reconstructions (no shared cache), and none holds all rows
    assert all(0 < len((f / "scores.jsonl").read_text().splitlines()) < len(whole.records) for f in shards)

    summary = merge(list(reversed(shards)), tmp_path / "merged").summary  # order of the folders is free
    merged = [json.loads(line) for line in (tmp_path / "merged" / "scores.jsonl").read_text().splitlines()]
    assert [r["id"] for r in merged] == [r["id"] for r in whole.records]
    for ours, theirs in zip(merged, whole.records):
        assert ours.get("error") == theirs.get("error")
        if theirs.get("recon") is not None:
            assert ours["recon"] == pytest.approx(theirs["recon"], abs=1e-6)
    assert summary["samples"] == whole.summary["samples"] and summary["errors"] == whole.summary["errors"] == 1
    assert summary["metrics"]["recon"]["n"] == whole.summary["metrics"]["recon"]["n"]
    assert summary["metrics"]["recon"]["mean"] == pytest.approx(whole.summary["metrics"]["recon"]["mean"], abs=1e-6)
    manifest = json.loads((tmp_path / "merged" / "manifest.json").read_text())
    assert manifest["merged_from"] == [str(f) for f in shards] and "shard" not in manifest

    with pytest.raises(ConfigError, match=r"shard\(s\) 1/3 missing"):
        merge([shards[0], shards[2]], tmp_path / "bad")
    with pytest.raises(ConfigError, match="shard 2/3 is given twice"):
        merge([shards[0], shards[1], shards[2], shards[2]], tmp_path / "bad")
    assert not (tmp_path / "bad").exists()  # refused before writing anything
    assert main(["merge", str(shards[0]), str(shards[1]), "--out", str(tmp_path / "bad")]) == 2  # CLI: exit 2
    assert main(["merge", *map(str, shards), "--out", str(tmp_path / "cli")]) == 1  # its one failed row
    assert (tmp_path / "cli" / "scores.jsonl").read_text() == (tmp_path / "merged" / "scores.jsonl").read_text()
    with pytest.raises(ConfigError, match="scored without --shard"):
        merge([tmp_path / "whole", *shards], tmp_path / "bad")


# -- stages run apart ---------------------------------------------------------------------------


def test_score_after_reconstruct_makes_no_generator_call(tmp_path, tiny_sd, tiny_dinov2, capsys):
    data = _rows(tmp_path)
    cache = tmp_path / "cache"
    code = main(["reconstruct", "-i", str(data), "-m", "recon", "--generator", str(tiny_sd), "--generator-opt",
                 "steps=2", "--embedder", str(tiny_dinov2), "--max-side", "32", "--batch-size", "2", "--cache-dir", str(cache), "-q"])
    counts = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert code == 1 and counts["generated"] == 9 and counts["unreadable"] == 1  # 9 captions, 1 missing image
    assert len(list((cache / "images").rglob("*.png"))) == 9

    inner = DiffusersGenerator(tiny_sd, steps=2)
    counted = Counting(inner)
    settings = {**_settings(tiny_sd, tiny_dinov2, cache), "generator": counted}
    results = caprecon.score(data, ["recon"], **settings)
    assert counted.calls == 0 and results.manifest["cache"]["generated"] == 0
    assert inner._pipe is None  # the generator's weights were never even loaded
    reference = caprecon.score(data, ["recon"], no_cache=True, **_settings(tiny_sd, tiny_dinov2, cache))
    expected = _scored(reference.records)
    for key, (value, error) in _scored(results.records).items():
        assert error == expected[key][1]
        assert value == (None if expected[key][0] is None else pytest.approx(expected[key][0], abs=1e-6))

    # embed fills the embeddings from stored images alone; a later score computes none
    code = main(["embed", "-i", str(data), "-m", "recon", "--generator", str(tiny_sd), "--embedder",
                 str(tiny_dinov2), "--generator-opt", "steps=2", "--max-side", "32", "--cache-dir",
                 str(tmp_path / "cache2"), "-q"])
    counts = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert code == 1 and counts["missing_reconstruction"] == 9  # nothing reconstructed in that store: refused, counted


def test_store_merge_copies_verified_results(tmp_path, tiny_sd, tiny_dinov2, capsys):
    data = _rows(tmp_path)
    for i in range(2):
        caprecon.score(data, ["recon"], shard=f"{i}/2", **_settings(tiny_sd, tiny_dinov2, tmp_path / f"c{i}"))
    damaged = next((tmp_path / "c1" / "images").rglob("*.png"))
    damaged.write_bytes(b"not a png")
    assert main(["store", "merge", str(tmp_path / "c0"), str(tmp_path / "c1"), "--into", str(tmp_path / "all")]) == 1
    counts = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert counts["damaged"] == 1 and counts["copied"] > 9  # 9 images plus their embeddings, less the damaged one
    counted = Counting(DiffusersGenerator(tiny_sd, steps=2))
    caprecon.score(data, ["recon"], **{**_settings(tiny_sd, tiny_dinov2, tmp_path / "all"), "generator": counted})
    assert counted.calls == 1  # only the damaged image is generated again


# -- Ray ------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def local_ray():
    ray = pytest.importorskip("ray")
    pytest.importorskip("ray.data")
    tests = Path(__file__).parent
    # the workers import the caprecon this process imported (a mutant's copy of src/, under scripts/mutants.py)
    source = Path(caprecon.__file__).resolve().parents[1]
    path = os.pathsep.join([str(source), str(tests), os.environ.get("PYTHONPATH", "")])
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": path, "HF_HUB_OFFLINE": "1"}})
    yield ray
    ray.shutdown()


def test_ray_gives_the_local_scores_and_retries_a_failing_task(tmp_path, tiny_sd, tiny_dinov2, local_ray):
    import torch

    data = _rows(tmp_path)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as in each 1-CPU actor: another thread count sums floats in another order
    try:
        local = caprecon.score(data, ["recon"], out=tmp_path / "local", no_cache=True,
                               **_settings(tiny_sd, tiny_dinov2, tmp_path / "unused"))
    finally:
        torch.set_num_threads(threads)
    marker = tmp_path / "raised"
    flaky = FlakyGenerator(DiffusersGenerator(tiny_sd, steps=2), trigger="take 2", marker=str(marker))
    settings = {**_settings(tiny_sd, tiny_dinov2, tmp_path / "unused"), "generator": flaky}
    remote = caprecon.score(data, ["recon"], out=tmp_path / "ray", no_cache=True, executor="ray",
                            ray={"workers": 1, "retries": 2}, **settings)
    assert marker.exists()  # the reconstruct stage did raise once, on the batch with "take 2"
    assert remote.manifest["executor"] == "ray"
    # the stages' work is counted as the local run counts it: 9 images generated once each
    for key in ("generated", "embedded"):
        assert remote.manifest["cache"][key] == local.manifest["cache"][key] > 0
    assert local.manifest["cache"]["generated"] == 9
    assert [r["id"] for r in remote.records] == [r["id"] for r in local.records]
    for ours, theirs in zip(remote.records, local.records):
        assert ours.get("recon") == theirs.get("recon")  # identical per-sample scores
        assert ours.get("error") == theirs.get("error")
    assert remote.summary["errors"] == 1  # only the unreadable row
    written = [json.loads(line) for line in (tmp_path / "ray" / "scores.jsonl").read_text().splitlines()]
    assert written == json.loads(json.dumps(remote.records))  # the same output file, in input order

    # recon ran inside the reconstruct actors (its default); named, it gets a pool of its own:
    # the same scores and counts
    from caprecon.run.ray import StageOptions

    separate = caprecon.score(data, ["recon"], out=tmp_path / "separate", no_cache=True, executor="ray",
                              ray={"workers": 1, "stages": {"recon": StageOptions(cpus=0)}},
                              **_settings(tiny_sd, tiny_dinov2, tmp_path / "unused"))
    assert [(r["id"], r.get("recon"), r.get("error")) for r in separate.records] == \
        [(r["id"], r.get("recon"), r.get("error")) for r in local.records]
    assert separate.manifest["cache"]["generated"] == 9 and separate.manifest["cache"]["embedded"] == \
        local.manifest["cache"]["embedded"]


def test_ray_stages_keep_the_memo_in_each_runs_cache_folder(tmp_path, local_ray):
    """On Ray the stages open the photos in their own processes, which learn the memo's folder from
    the driver: two runs into two cache folders each leave exactly their own photo's digest (its real
    path and the sha256 of its bytes, computed here) in their own memo, and a --no-cache run none."""
    import hashlib

    from memo_files import memo_rows
    from oracle import OracleGenerator, PixelEmbedder, render

    for name, caption in (("a", "red circle"), ("b", "blue square"), ("c", "red circle")):
        render(caption, 32, 32).save(tmp_path / f"{name}.png")
        settings = {"no_cache": True, "out": tmp_path / "uncached"} if name == "c" else \
            {"cache_dir": str(tmp_path / f"cache-{name}")}
        caprecon.score([{"id": name, "image": str(tmp_path / f"{name}.png"), "caption": f"a {caption}"}], ["recon"],
                       generator=OracleGenerator(), embedder=PixelEmbedder(), max_side=32, executor="ray",
                       ray={"workers": 1}, **settings)
    for name in ("a", "b"):
        picture = tmp_path / f"{name}.png"
        assert memo_rows(tmp_path / f"cache-{name}") == {
            os.path.realpath(picture): hashlib.sha256(picture.read_bytes()).hexdigest()}, name
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("cache")) == ["cache-a", "cache-b"]
    assert not list((tmp_path / "uncached").rglob("digests.sqlite"))


def test_embedding_metrics_run_inside_the_reconstruct_actors_unless_named():
    """By default recon and clip-image join the reconstruct stage's actors; a metric given
    options keeps a pool of its own, as do judges and metrics of a run that generates nothing."""
    from caprecon.metrics.recon import ClipImageScore, ReconScore
    from caprecon.metrics.turing import CaptionTuringTest
    from caprecon.run.ray import RECONSTRUCT, StageOptions, default_stages

    recon, clip_image = ReconScore.__new__(ReconScore), ClipImageScore.__new__(ClipImageScore)
    judge = CaptionTuringTest.__new__(CaptionTuringTest)
    own = StageOptions(workers=2, gpus=0.25)
    stages = default_stages([recon, clip_image, judge], {"clip-image": own}, reconstructing=True)
    assert stages["recon"].with_ == RECONSTRUCT and stages["clip-image"] is own and "turing" not in stages
    assert default_stages([recon], {}, reconstructing=False) == {}


def test_ray_stage_options_are_checked():
    from caprecon.run.ray import parse_stage_options

    options = parse_stage_options(["reconstruct:workers=2,gpus=0.5,batch_size=4"])
    assert (options["reconstruct"].workers, options["reconstruct"].gpus, options["reconstruct"].batch_size) == (2, 0.5, 4)
    for bad in ("reconstruct", "reconstruct:speed=2", "recon:workers=0", "recon:gpus=lots",
                "recon:with=reconstruct,gpus=1"):
        with pytest.raises(ConfigError, match="--stage"):
            parse_stage_options([bad])
    assert parse_stage_options(["recon:with=reconstruct,batch_size=8"])["recon"].with_ == "reconstruct"


def test_a_stage_can_only_join_an_earlier_one(tmp_path, tiny_sd, tiny_dinov2):
    """`with` names a stage before it in this run; a wrong one fails before Ray starts."""
    pytest.importorskip("ray")
    from caprecon.run.ray import StageOptions

    data = _rows(tmp_path)
    for host in ("turing", "recon"):  # not in the run; itself (not earlier)
        with pytest.raises(ConfigError, match=f"with={host}: {host} is not a stage before recon"):
            caprecon.score(data, ["recon"], no_cache=True, executor="ray",
                           ray={"stages": {"recon": StageOptions(with_=host)}},
                           **_settings(tiny_sd, tiny_dinov2, tmp_path / "unused"))


def test_score_command_scale_options():
    from caprecon.cli.commands import build_parser
    from caprecon.cli.common import score_settings

    args = build_parser().parse_args(["score", "-i", "x", "--stage", "recon:workers=2"])
    with pytest.raises(ConfigError, match="need --executor ray"):
        score_settings(args)
    args = build_parser().parse_args(["score", "-i", "x", "--executor", "ray", "--ray-workers", "2", "--shard", "1/2",
                                      "--stage", "reconstruct:gpus=1"])
    settings = score_settings(args)
    assert settings["executor"] == "ray" and settings["shard"] == "1/2" and settings["ray"]["workers"] == 2
    assert settings["ray"]["stages"]["reconstruct"].gpus == 1.0


def test_the_stages_cap_image_files_as_score_does(tmp_path, capsys):
    """`reconstruct` (as `embed` and `judge`) takes score's --image-root and --max-image-bytes: a
    row whose file holds more bytes is that row's error, counted as unreadable."""
    rng = np.random.default_rng(7)
    Image.new("RGB", (24, 16), (200, 30, 30)).save(tmp_path / "small.png")
    Image.fromarray(rng.integers(0, 255, (64, 64, 3), dtype=np.uint8)).save(tmp_path / "big.png")
    small, big = (tmp_path / "small.png").stat().st_size, (tmp_path / "big.png").stat().st_size
    assert small < 1000 < big
    data = tmp_path / "in.jsonl"
    data.write_text("".join(json.dumps({"id": name, "image": f"{name}.png", "caption": "a red square"}) + "\n"
                            for name in ("small", "big")))
    code = main(["reconstruct", "-i", str(data), "-m", "recon", "-g", "oracle:OracleGenerator", "--embedder",
                 "oracle:PixelEmbedder", "--max-side", "32", "--max-image-bytes", "1000", "--image-root",
                 str(tmp_path), "--cache-dir", str(tmp_path / "c"), "-q"])
    counts = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert code == 1 and counts["unreadable"] == 1 and counts["generated"] == 1


def test_batch_invariant_reconstructions_do_not_depend_on_their_batch(tmp_path, tiny_sd, tiny_dinov2, capsys):
    """With batch_invariant every request goes through the pipeline alone: the reconstruct stage
    in batches of 3 and of 1 store the same pixels, and a cached score in batches of 4 agrees with
    a fresh one row at a time to the embedder's own batch rounding (~1e-7). Batched, the tiny SD
    puts a pixel of one of these images one level apart (float kernels sum a batch of 3 and a
    batch of 1 differently), which made a cached ReconScore differ from a fresh one by 3e-6."""
    data = _rows(tmp_path)
    cache = tmp_path / "cache"
    assert main(["reconstruct", "-i", str(data), "-m", "recon", "--generator", str(tiny_sd), "--generator-opt",
                 "steps=2", "--generator-opt", "batch_invariant=true", "--embedder", str(tiny_dinov2),
                 "--max-side", "32", "--batch-size", "3", "--cache-dir", str(cache), "-q"]) == 1
    capsys.readouterr()
    options = {"steps": 2, "batch_invariant": True}
    cached = caprecon.score(data, ["recon"], **{**_settings(tiny_sd, tiny_dinov2, cache), "batch_size": 4,
                                                "generator_options": options})
    assert cached.manifest["cache"]["generated"] == 0
    fresh = caprecon.score(data, ["recon"], no_cache=True, **{**_settings(tiny_sd, tiny_dinov2, cache),
                                                              "batch_size": 1, "generator_options": options})
    expected = _scored(fresh.records)
    for key, (value, error) in _scored(cached.records).items():
        assert error == expected[key][1]
        assert value == (None if expected[key][0] is None else pytest.approx(expected[key][0], abs=1e-6))
    # the stage again, one row at a time, into another store: the same files, pixel for pixel
    again = tmp_path / "cache-again"
    assert main(["reconstruct", "-i", str(data), "-m", "recon", "--generator", str(tiny_sd), "--generator-opt",
                 "steps=2", "--generator-opt", "batch_invariant=true", "--embedder", str(tiny_dinov2),
                 "--max-side", "32", "--batch-size", "1", "--cache-dir", str(again), "-q"]) == 1
    pictures = {p.relative_to(cache): np.asarray(Image.open(p)) for p in (cache / "images").rglob("*.png")}
    assert len(pictures) == 9
    for name, pixels in pictures.items():
        assert np.array_equal(np.asarray(Image.open(again / name)), pixels)
    with pytest.raises(ValueError, match="batch_invariant must be true or false"):
        DiffusersGenerator(tiny_sd, batch_invariant="yes")


# -- merge ends as score does, and refuses what is not one run ---------------------------------


def _oracle_shards(tmp_path: Path, count: int = 2) -> tuple[Path, list[Path]]:
    """Shards of a run of three captions over two shape pictures, scored offline by the oracle."""
    from oracle import render

    render("a red square", 32, 32).save(tmp_path / "red.png")
    render("a blue circle", 32, 32).save(tmp_path / "blue.png")
    rows = [{"id": "a", "image": str(tmp_path / "red.png"), "caption": "a red square"},
            {"id": "b", "image": str(tmp_path / "blue.png"), "caption": "a blue circle"},
            {"id": "c", "image": str(tmp_path / "red.png"), "caption": "a blue square"}]
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    shards = [tmp_path / f"part{i}" for i in range(count)]
    for i, folder in enumerate(shards):
        assert main(["score", "-i", str(data), "-m", "recon", "-g", "oracle:OracleGenerator", "--embedder",
                     "oracle:PixelEmbedder", "--max-side", "32", "--no-cache", "--shard", f"{i}/{count}",
                     "--out", str(folder), "-q"]) == 0
    return data, shards


def test_merge_ends_as_score_with_its_report_and_closing_lines(tmp_path, capsys):
    data, shards = _oracle_shards(tmp_path)
    capsys.readouterr()
    out = tmp_path / "whole"
    assert main(["merge", *map(str, shards), "--out", str(out), "-i", str(data)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    # the lines `score` ends with: rows scored, then where the outputs and the report are
    assert lines[-3:] == ["rows scored: 3 of 3", f"outputs: {out / 'scores.jsonl'}", f"report: {out / 'report.html'}"]
    html = (out / "report.html").read_text(encoding="utf-8")
    assert all(caption in html for caption in ("a red square", "a blue circle", "a blue square"))


def test_merge_refuses_an_input_that_is_not_the_shards(tmp_path, capsys):
    data, shards = _oracle_shards(tmp_path)
    other = tmp_path / "other.jsonl"
    rows = [json.loads(line) for line in data.read_text().splitlines()]
    other.write_text("".join(json.dumps({**r, "caption": r["caption"] + "!"}) + "\n" for r in rows))
    capsys.readouterr()
    # recon pools nothing, so the input adds no corpus value: a wrong one is refused all the same
    assert main(["merge", *map(str, shards), "--out", str(tmp_path / "bad"), "-i", str(other)]) == 2
    err = capsys.readouterr().err
    assert f"--input {other} is not the input the shards were scored from" in err
    assert not (tmp_path / "bad" / "scores.jsonl").exists()
    with pytest.raises(ConfigError, match="not the input the shards were scored from"):
        merge(shards, tmp_path / "bad2", samples=[{"id": "a", "image": "x.png", "caption": "another"}])


def test_merge_refuses_an_id_in_two_shards_naming_it(tmp_path, capsys):
    _, shards = _oracle_shards(tmp_path)
    # a shard's row given the id of a row of the other shard (edited by hand, or scored from another file)
    theirs = [json.loads(line) for line in (shards[0] / "scores.jsonl").read_text().splitlines()]
    ours = [json.loads(line) for line in (shards[1] / "scores.jsonl").read_text().splitlines()]
    taken = theirs[0]["id"]
    ours[0]["id"] = taken
    (shards[1] / "scores.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ours))
    with pytest.raises(ConfigError, match=rf"1 row id\(s\) appear more than once across the shards \('{taken}' in "
                                          rf"{shards[0]}, {shards[1]}\)"):
        merge(shards, tmp_path / "dup")
    capsys.readouterr()
    assert main(["merge", *map(str, shards), "--out", str(tmp_path / "dup-cli")]) == 2
    assert f"'{taken}' in {shards[0]}, {shards[1]}" in capsys.readouterr().err
    assert not (tmp_path / "dup-cli" / "scores.jsonl").exists()
    # the same id twice inside one shard is refused too (the shard holding both captions of the red picture)
    (shards[1] / "scores.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [{**ours[0], "id": "b"}]))
    both = next(f for f in shards if len((f / "scores.jsonl").read_text().splitlines()) == 2)
    rows = [json.loads(line) for line in (both / "scores.jsonl").read_text().splitlines()]
    rows[1]["id"] = rows[0]["id"]
    (both / "scores.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(ConfigError, match=rf"'{rows[0]['id']}' in {both}, {both}\)"):
        merge(shards, tmp_path / "dup-one")
