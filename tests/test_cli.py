"""The `caprecon` command: score end to end, list models, fail early on bad configuration."""

import json
from pathlib import Path

import numpy as np
from PIL import Image

from caprecon.cli import main


def _samples(tmp_path, n=3):
    rng = np.random.default_rng(1)
    rows = []
    for i in range(n):
        Image.fromarray(rng.integers(0, 255, (30, 40, 3), dtype=np.uint8)).save(tmp_path / f"p{i}.png")
        rows.append({"id": f"r{i}", "image": f"p{i}.png", "caption": f"picture {i}"})
    path = tmp_path / "in.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    return path


def test_score_writes_run_folder(tmp_path, tiny_sd, tiny_dinov2, capsys):
    path = _samples(tmp_path)
    out = tmp_path / "run"
    code = main(["score", "--input", str(path), "--metric", "recon", "--generator", str(tiny_sd),
                 "--generator-opt", "steps=1", "--embedder", str(tiny_dinov2), "--max-side", "32",
                 "--cache-dir", str(tmp_path / "cache"), "--out", str(out), "--template", "photo"])
    assert code == 0
    printed = capsys.readouterr().out
    assert "recon" in printed and "r2" in printed
    assert printed.rstrip().endswith(f"report: {out / 'report.html'}")  # as caption and meta end
    records = [json.loads(line) for line in (out / "scores.jsonl").read_text().splitlines()]
    assert len(records) == 3 and all(0 <= r["recon"] <= 1 for r in records)
    # every reconstruction is a distinct image file inside the cache, of the size the record states
    images = (tmp_path / "cache" / "images").resolve()
    paths = [Path(r["reconstruction"]).resolve() for r in records]
    assert len(set(paths)) == 3
    for path, record in zip(paths, records):
        assert path.is_file() and images in path.parents, path
        with Image.open(path) as image:
            assert list(image.size) == record["size"]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["metrics"]["recon"]["n"] == 3
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["config"]["template"] == "photo"
    assert manifest["reconstruction"]["template"].startswith("A photograph.")
    assert manifest["models"]["generator"]["steps"] == 1
    assert (out / "summary.csv").read_text().startswith("metric,mean,std,n")


def test_bad_model_path_stops_before_work(tmp_path, capsys):
    path = _samples(tmp_path)
    code = main(["score", "--input", str(path), "--metric", "recon", "--generator", str(tmp_path / "no-such-model"),
                 "--embedder", "dinov2", "--out", str(tmp_path / "run")])
    assert code == 2
    assert "generator folder not found" in capsys.readouterr().err
    assert not (tmp_path / "run" / "scores.jsonl").exists()


def test_uncached_hub_id_offline_says_what_to_do(tmp_path, capsys):
    path = _samples(tmp_path)
    code = main(["score", "--input", str(path), "--generator", "some-org/not-cached-model", "--embedder", "dinov2"])
    assert code == 2
    err = capsys.readouterr().err
    assert "HF_HUB_OFFLINE" in err and "hf download some-org/not-cached-model" in err


def test_uncached_hub_id_without_network_fails_fast_with_our_message(tmp_path):
    """Without HF_HUB_OFFLINE and without a Hub, the loader used to retry each file with back-off for
    minutes, row after row, and leave a run folder of failed rows ending in the library's advice about
    `local_files_only`; now one request says the Hub cannot be reached, before the run folder exists."""
    import os
    import subprocess
    import sys
    import time

    path = _samples(tmp_path)
    env = {k: v for k, v in os.environ.items() if k not in {"HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"}}
    # a port nobody listens on: no network whatever the machine the test runs on, refused at once
    env.update(HF_HOME=str(tmp_path / "hf-home"), HF_ENDPOINT="http://127.0.0.1:9",
               CAPRECON_CACHE=str(tmp_path / "cache"))
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "caprecon", "score", "--input", str(path), "--metric", "clipscore",
                           "--clip", "some-org/not-cached-clip", "--out", str(tmp_path / "run")],
                          capture_output=True, text=True, env=env, timeout=120)
    elapsed = time.monotonic() - started
    assert done.returncode == 2, done.stderr[-2000:]
    assert elapsed < 30
    err = done.stderr.strip()
    assert err.startswith("caprecon: error: embedder 'some-org/not-cached-clip' is not a local folder"), err
    assert "cannot be reached" in err and "hf download some-org/not-cached-clip" in err
    assert "local_files_only" not in err and "Traceback" not in err and "Retrying" not in err
    # no rows and no manifest: nothing that reads as a run (the folder's lock may be there)
    assert not (tmp_path / "run" / "scores.jsonl").exists() and not (tmp_path / "run" / "manifest.json").exists()


def test_unknown_metric_and_preset(tmp_path, capsys):
    path = _samples(tmp_path)
    assert main(["score", "--input", str(path), "--metric", "nope", "--generator", "x", "--embedder", "y"]) == 2
    assert "unknown metric 'nope'" in capsys.readouterr().err
    assert main(["score", "--input", str(path), "--preset", "nope"]) == 2
    assert "unknown preset" in capsys.readouterr().err


def test_models_lists_registry(capsys):
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    for name in ("paper-recon", "fast", "z-image", "dreamsim", "recon", "clip-image"):
        assert name in out


def test_dreamsim_without_weights_explains(tmp_path):
    import pytest

    from caprecon.models.common import ModelNotFoundError
    from caprecon.models.embedder import DreamSimEmbedder

    with pytest.raises(ModelNotFoundError, match="CAPRECON_DREAMSIM_DIR"):
        DreamSimEmbedder(weights_dir=tmp_path)


def test_dreamsim_checks_every_file_dreamsim_would_otherwise_download(tmp_path):
    import pytest

    from caprecon.models.common import ModelNotFoundError
    from caprecon.models.embedder import DreamSimEmbedder

    # dreamsim 0.2's layout for a single-backbone variant: the LoRA adapter is `<variant>_single_lora`,
    # beside the backbone checkpoint and (DINO) the torch.hub repository and weights
    (tmp_path / "dino_vitb16_single_lora").mkdir()
    (tmp_path / "facebookresearch_dino_main").mkdir()
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "dino_vitbase16_pretrain.pth").touch()
    with pytest.raises(ModelNotFoundError, match="missing dino_vitb16_pretrain.pth"):
        DreamSimEmbedder("dino_vitb16", weights_dir=tmp_path)
    (tmp_path / "dino_vitb16_pretrain.pth").touch()
    assert DreamSimEmbedder("dino_vitb16", weights_dir=tmp_path, device="cpu").variant == "dino_vitb16"


def test_registered_plugin_names_build(monkeypatch):
    from caprecon.models import registry
    from oracle import PixelEmbedder

    monkeypatch.setitem(registry.EMBEDDERS, "placeholder", None)  # so the name is removed after the test
    registry.register("embedder", "placeholder", "oracle:PixelEmbedder", "pixels, for tests")
    assert isinstance(registry.construct("embedder", "placeholder"), PixelEmbedder)
    assert registry.describe_registry()["embedder"]["placeholder"] == "pixels, for tests"


def test_meta_errors_read_like_every_commands(tmp_path, capsys):
    assert main(["meta", "--metric", "bleu-4"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("caprecon: error: give --judgments"), err
