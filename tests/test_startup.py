"""Start-up: a command imports only what it uses. Checked in fresh interpreters, since this
test process has long imported everything."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import caprecon
import caprecon.core.errors

HEAVY = ("torch", "scipy", "scipy.stats", "transformers", "diffusers")
SRC = str(Path(caprecon.__file__).resolve().parents[1])


def _imported_by(argv: list[str]) -> set[str]:
    """The heavy modules loaded by `caprecon ARGV` in a fresh interpreter."""
    code = ("import sys\nfrom caprecon.cli import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
            f"print('LOADED', *[m for m in {HEAVY!r} if m in sys.modules])")
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", ""), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, env=env, timeout=300)
    line = [ln for ln in done.stdout.splitlines() if ln.startswith("LOADED")]
    assert line, done.stderr[-2000:]
    return set(line[-1].split()[1:])


@pytest.mark.parametrize("argv", [["--help"], ["models"], ["score", "--help"]])
def test_help_and_models_import_neither_scipy_nor_transformers(argv):
    assert _imported_by(argv) == set()


def _loaded_by_import(module: str) -> tuple[list[str], set[str]]:
    """caprecon's modules, and the big libraries among (HEAVY + numpy, PIL, pandas, sklearn),
    loaded by `import MODULE` in a fresh interpreter."""
    libraries = (*HEAVY, "numpy", "PIL", "pandas", "sklearn")
    code = (f"import {module}, sys\nprint([m for m in sys.modules if m.startswith('caprecon')])\n"
            f"print([m for m in {libraries!r} if m in sys.modules])")
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    ours, theirs = (eval(line) for line in done.stdout.splitlines()[-2:])
    return ours, set(theirs)


@pytest.mark.parametrize("module", ["caprecon", "caprecon.core.errors"])
def test_importing_the_package_or_its_errors_loads_nothing_else(module):
    # `except caprecon.core.errors.ConfigError` in a user's program must not cost a torch import
    ours, theirs = _loaded_by_import(module)
    assert len(ours) <= 3 and theirs == set(), (ours, theirs)


def test_the_config_loads_no_model_library():
    ours, theirs = _loaded_by_import("caprecon.run.config")
    assert not theirs & {*HEAVY, "pandas", "sklearn"}, theirs
    assert len(ours) <= 25, ours


def test_the_package_hands_out_the_public_face_on_first_use():
    code = ("import caprecon, sys\nassert 'caprecon.api' not in sys.modules\n"
            "from caprecon import *\nprint(score is caprecon.score, set(caprecon.__all__) <= set(dir(caprecon)))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")})
    assert done.stdout.split() == ["True", "True"], done.stderr[-2000:]
    with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
        caprecon.no_such_name  # noqa: B018


def test_a_fully_cached_score_imports_neither_scipy_stats_nor_transformers(tmp_path, tiny_sd, tiny_dinov2):
    rng = np.random.default_rng(0)
    rows = []
    for i in range(3):
        Image.fromarray(rng.integers(0, 255, (24, 32, 3), dtype=np.uint8)).save(tmp_path / f"{i}.png")
        rows.append({"id": str(i), "image": str(tmp_path / f"{i}.png"), "caption": f"a boat on a lake {i}"})
    samples = tmp_path / "samples.jsonl"
    samples.write_text("\n".join(json.dumps(r) for r in rows))
    argv = ["score", "-i", str(samples), "-m", "recon", "--generator", str(tiny_sd), "--embedder", str(tiny_dinov2),
            "--max-side", "32", "--generator-opt", "steps=2", "--cache-dir", str(tmp_path / "cache"), "--quiet"]
    first = caprecon.score(samples, ["recon"], generator=str(tiny_sd), embedder=str(tiny_dinov2), max_side=32,
                           generator_options={"steps": 2}, cache_dir=str(tmp_path / "cache"))
    assert first.manifest["cache"]["generated"] == 3
    loaded = _imported_by([*argv, "--out", str(tmp_path / "cached")])
    scored = [json.loads(line) for line in (tmp_path / "cached" / "scores.jsonl").open()]
    assert [r["recon"] for r in scored] == pytest.approx([r["recon"] for r in first.records])
    # the HTML report's Student-t interval takes scipy.special, a small part of scipy
    assert not loaded & {"torch", "scipy.stats", "transformers", "diffusers"}, loaded
    loaded = _imported_by(["report", str(tmp_path / "cached")])
    assert (tmp_path / "cached" / "report.html").is_file()
    assert not loaded & {"torch", "scipy.stats", "transformers", "diffusers"}, loaded


def test_meta_on_reference_metrics_imports_neither_torch_nor_scipy_stats(tmp_path):
    rows = [{"image": f"{i // 3}.jpg", "candidate": f"a dog runs on the grass {i % 4}",
             "refs": ["a dog runs on grass", "a brown dog on a lawn"], "ratings": [1 + i % 4, 1 + (i * 7) % 4, 2]}
            for i in range(12)]
    judgments = tmp_path / "expert.jsonl"
    judgments.write_text("\n".join(json.dumps(r) for r in rows))
    loaded = _imported_by(["meta", "--judgments", str(judgments), "--metric", "bleu-1", "cider",
                           "--bootstrap", "20", "--out", str(tmp_path / "meta")])
    assert (tmp_path / "meta" / "meta.csv").is_file()
    assert not loaded & {"torch", "scipy.stats", "transformers", "diffusers"}, loaded


def test_each_command_parses_with_only_its_own_module_registered():
    from caprecon.cli.commands import PLUGINS, build_parser

    def commands(parser):
        return next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction").choices

    everything = commands(build_parser())
    for name in everything:
        # a module registers all of its commands (and aliases) together; no other module is imported
        group = next((set(names) for names in PLUGINS.values() if name in names), {name})
        assert name in commands(build_parser(name)) and set(commands(build_parser(name))) <= group, name
    assert list(commands(build_parser("no-such-command"))) == list(everything)  # argparse lists them all


def test_device_and_dtype_keys_are_todays_on_cpu_and_change_with_the_device(tiny_sd, tiny_dinov2, monkeypatch):
    import torch

    import caprecon.models.common as common
    from caprecon.models.common import computation
    from caprecon.models.embedder import HFVisionEmbedder
    from caprecon.models.generator import DiffusersGenerator

    assert common.accelerator_present() == torch.cuda.is_available()
    generator, embedder = DiffusersGenerator(str(tiny_sd), steps=2), HFVisionEmbedder(str(tiny_dinov2))
    # the keys as they were built before: dtype spelled by torch itself, "auto" being float32 on a CPU
    assert generator.fingerprint == generator.source.fingerprint(
        backend="diffusers", steps=2, guidance=None, negative_prompt=None, max_sequence_length=None,
        dtype=str(torch.float32), call_kwargs={}, **computation(generator))
    assert embedder.fingerprint == embedder.source.fingerprint(backend="hf-vision", dtype=str(torch.float32),
                                                               **computation(embedder))
    assert generator.dtype is torch.float32
    on_gpu = DiffusersGenerator(str(tiny_sd), steps=2, device="cuda")
    assert on_gpu.fingerprint != generator.fingerprint and on_gpu.dtype_name == str(torch.bfloat16)
    monkeypatch.setattr(common, "accelerator_present", lambda: True)
    probed = DiffusersGenerator(str(tiny_sd), steps=2)
    assert (probed.device, probed.fingerprint) == ("cuda", on_gpu.fingerprint)
    if not torch.cuda.is_available():  # a CUDA device torch cannot see stops the load with a setting to fix
        with pytest.raises(caprecon.core.errors.ConfigError, match="--device cpu"):
            probed.dtype  # noqa: B018


def test_the_accelerator_probe_reads_the_torch_build_and_the_device_nodes(tmp_path, monkeypatch):
    import importlib.machinery
    import importlib.util

    import caprecon.models.common as common

    def probe(build: str, nodes: bool, visible: str | None = None) -> bool:
        folder = tmp_path / build.replace(" ", "_").replace("'", "")
        (folder / "torch").mkdir(parents=True, exist_ok=True)
        (folder / "torch" / "version.py").write_text(build)
        spec = importlib.machinery.ModuleSpec("torch", None, origin=str(folder / "torch" / "__init__.py"))
        monkeypatch.setattr(importlib.util, "find_spec", lambda name: spec)
        real_exists = Path.exists
        monkeypatch.setattr(Path, "exists", lambda p: nodes if str(p) in ("/dev/nvidiactl", "/dev/kfd")
                            else real_exists(p))
        if visible is None:
            monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
        else:
            monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
        common.accelerator_present.cache_clear()
        try:
            return common.accelerator_present()
        finally:
            common.accelerator_present.cache_clear()

    cuda_build, cpu_build = "cuda: Optional[str] = '12.8'\nhip = None\n", "cuda: Optional[str] = None\nhip = None\n"
    assert probe(cuda_build, nodes=True)
    assert not probe(cuda_build, nodes=False)
    assert not probe(cpu_build, nodes=True)
    assert not probe(cuda_build, nodes=True, visible="")
    assert not probe(cuda_build, nodes=True, visible="-1")
    assert probe("cuda = None\nhip: Optional[str] = '6.2'\n", nodes=True)
