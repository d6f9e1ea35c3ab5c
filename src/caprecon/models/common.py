"""What every backend shares: where a model comes from, what identifies it, where it runs.

Backends load weights lazily (on first use), but resolve and fingerprint their source
at construction: a path that does not exist, or a hub id that is neither cached nor
downloadable, stops the run before any work is done, and a fully cached re-run never
loads a model at all.
"""

from __future__ import annotations

import gc
import hashlib
import json
import os
import re
import sys
from dataclasses import dataclass
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Any

from caprecon.core.describe import installed_version
from caprecon.core.digests import known_digest, remember_digest
from caprecon.core.errors import ConfigError


class ModelNotFoundError(FileNotFoundError):
    """A configured model cannot be found: the message says how to provide it."""


@dataclass(frozen=True)
class ModelSource:
    """A model's resolved location: a local folder, or a hub id with its revision."""

    name: str  # what the user wrote
    path: Path | None  # local folder (given directly, or a cached hub snapshot)
    revision: str | None

    @property
    def load_target(self) -> str:
        return str(self.path) if self.path is not None else self.name

    @cached_property
    def files(self) -> list | None:
        """The folder's signature, read once: fingerprints are asked for on every sample."""
        return _folder_signature(self.path) if self.path is not None else None

    def fingerprint(self, **config: Any) -> str:
        """Hash of the model's identity (every file's content, or the hub id and revision)
        plus the settings that change its outputs."""
        memo = self.__dict__.setdefault("_fingerprints", {})  # asked for on every sample: hash once per config
        known = repr(sorted(config.items()))
        if known not in memo:
            ident: dict[str, Any] = {"name": self.name, "revision": self.revision, "files": self.files}
            blob = json.dumps({"model": ident, "config": config}, sort_keys=True, default=str)
            memo[known] = hashlib.sha256(blob.encode()).hexdigest()[:24]
        return memo[known]


# torch's patch releases and build labels (+cpu, +cu128) do not change numerics, and a cache shared by
# a CPU and a GPU machine should agree; transformers' and diffusers' patch releases do fix preprocessing
_MAJOR_MINOR_ONLY = {"torch"}


@lru_cache(maxsize=None)
def library_versions(packages: tuple[str, ...]) -> tuple[tuple[str, str | None], ...]:
    """The versions, as cache keys see them, of the libraries a backend computes with."""
    out = []
    for package in packages:
        version = installed_version(package)
        if version is not None:
            version = version.split("+")[0]
            if package in _MAJOR_MINOR_ONLY:
                version = ".".join(version.split(".")[:2])
        out.append((package, version))
    return tuple(out)


def computation(backend: Any) -> dict[str, Any]:
    """What decides a backend's outputs besides its weights and settings: the revision of its
    code (`code_revision`, bumped when the way it computes changes: a preprocessing fix, a
    new scoring formula) and the versions of the libraries that do its numerics
    (`numeric_libraries`). Folded into every fingerprint, hence into every cache key."""
    return {"code_revision": backend.code_revision,
            "libraries": dict(library_versions(tuple(backend.numeric_libraries)))}


def _folder_signature(folder: Path) -> list:
    """Every file by content, so retrained weights of the same size are a new model."""
    return [[p.relative_to(folder).as_posix(), file_digest(p)]
            for p in sorted(folder.rglob("*")) if p.is_file() and not p.name.startswith(".")]


_SHA256_NAME = re.compile(r"[0-9a-f]{64}")


def file_digest(path: Path) -> str:
    """sha256 of a file's content, computed once per (path, size, modification time) (see
    `caprecon.core.digests`)."""
    path = Path(path).resolve()
    if path.parent.name == "blobs" and _SHA256_NAME.fullmatch(path.name):
        return path.name  # a Hugging Face cache blob of a large (LFS) file is named by its sha256 already
    stat = path.stat()
    ident = (str(path), stat.st_size, stat.st_mtime_ns)
    digest = known_digest(ident)
    if digest is None:
        with path.open("rb") as fh:
            digest = hashlib.file_digest(fh, "sha256").hexdigest()
        remember_digest(ident, digest)
    return digest


def resolve_source(name: str | os.PathLike, revision: str | None = None, *, kind: str = "model") -> ModelSource:
    """Find a model by local path or hub id, raising `ModelNotFoundError` with advice."""
    text = str(name)
    path = Path(text).expanduser()
    if path.exists():
        if not path.is_dir():
            raise ModelNotFoundError(f"{kind} {text!r} is a file; give the folder that holds its config and weights")
        return ModelSource(text, path.resolve(), revision)
    if text.startswith((".", "/", "~")) or text.count("/") > 1:
        raise ModelNotFoundError(f"{kind} folder not found: {text}")
    try:
        from huggingface_hub import snapshot_download

        cached = snapshot_download(text, revision=revision, local_files_only=True)
        return ModelSource(text, Path(cached), revision or Path(cached).name)
    except Exception:
        pass
    if os.environ.get("HF_HUB_OFFLINE", "0") not in {"", "0", "false", "False"}:
        raise ModelNotFoundError(
            f"{kind} {text!r} is not a local folder and is not in the Hugging Face cache, and HF_HUB_OFFLINE is set. "
            f"Download it where there is network (`hf download {text}`), copy the cache or the folder here, "
            f"and pass the folder's path or set HF_HOME."
        )
    refusal = hub_refusal(text, revision)
    if refusal:
        raise ModelNotFoundError(
            f"{kind} {text!r} is not a local folder and is not in the Hugging Face cache, and cannot be downloaded: "
            f"{refusal}. Download it where there is network (`hf download {text}`), copy the cache or the folder "
            f"here, and pass the folder's path or set HF_HOME (and HF_HUB_OFFLINE=1 on a machine without network)."
        )
    return ModelSource(text, None, revision)


def hub_refusal(repo_id: str, revision: str | None) -> str | None:
    """Why the Hub will not give `repo_id`, asked once before any work; None when it may.

    Left to the loader, an unreachable Hub is found per row, each file retried with back-off for
    minutes, and ends in the library's advice about `local_files_only`; one metadata request
    (bounded by HF_HUB_ETAG_TIMEOUT, no retries) says it at once."""
    from huggingface_hub import HfApi, constants
    from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError, RevisionNotFoundError

    try:
        HfApi().model_info(repo_id, revision=revision, timeout=constants.HF_HUB_ETAG_TIMEOUT)
    except RevisionNotFoundError:
        return f"the Hub has no revision {revision!r} of it"
    except RepositoryNotFoundError:
        return "the Hub has no such model (or it is private or gated: `hf auth login`)"
    except HfHubHTTPError:
        return None  # the Hub answered: the loader reports what it said (a rate limit, a server error)
    except Exception as exc:  # no network, no DNS, a proxy that refuses, a timeout, an invalid id
        return f"the Hub at {constants.ENDPOINT} cannot be reached ({type(exc).__name__}: {exc})"
    return None


def derive_seed(*parts: Any) -> int:
    """A non-negative 63-bit seed from any parts ("|"-joined, hashed): stable across runs,
    machines and batch orders."""
    digest = hashlib.sha256("|".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


def resolve_device(device: str | None) -> str:
    """The device a model will run on; "auto" is CUDA where `accelerator_present`, else the CPU.
    Decided without importing torch, so a fully cached run never loads it."""
    if device in (None, "auto"):
        return "cuda" if accelerator_present() else "cpu"
    return device


@lru_cache(maxsize=1)
def accelerator_present() -> bool:
    """What `torch.cuda.is_available()` answers, read without importing torch (1 s, 280 MB):
    the installed torch was built for CUDA or ROCm (its `version.py`), the machine has the
    device nodes, and CUDA_VISIBLE_DEVICES does not hide them all. A broken driver can still
    make torch disagree; `torch_dtype` then stops the run before a model loads."""
    import importlib.util

    spec = importlib.util.find_spec("torch")
    if spec is None or spec.origin is None:
        return False
    try:
        built = (Path(spec.origin).parent / "version.py").read_text()
    except OSError:
        return False
    cuda = re.search(r"^cuda\b.*=\s*'", built, re.M) is not None
    rocm = re.search(r"^hip\b.*=\s*'", built, re.M) is not None
    nodes = (cuda and Path("/dev/nvidiactl").exists()) or (rocm and Path("/dev/kfd").exists())
    return nodes and os.environ.get("CUDA_VISIBLE_DEVICES", "0").strip() not in {"", "-1"}


_DTYPES = {"float32": "float32", "fp32": "float32", "float16": "float16", "fp16": "float16",
           "bfloat16": "bfloat16", "bf16": "bfloat16"}


def dtype_name(dtype: str | None, device: str) -> str:
    """The dtype a model computes in, named as `str(torch.<dtype>)` prints it ("torch.float32"),
    which is how fingerprints have always spelled it; "auto" is bfloat16 on CUDA, else float32."""
    if dtype in (None, "auto"):
        return "torch.bfloat16" if device.startswith("cuda") else "torch.float32"
    if dtype not in _DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; use one of {sorted(_DTYPES)}")
    return f"torch.{_DTYPES[dtype]}"


def torch_dtype(name: str, device: str):
    """The torch dtype `dtype_name` named, when a model is about to load on `device`; a CUDA
    device torch cannot see is a setting to fix, said before any weights are read."""
    import torch

    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"device {device!r}: this torch sees no CUDA device; pass --device cpu")
    return getattr(torch, name.removeprefix("torch."))


def release_memory() -> None:
    """Free what dropped models held: Python's garbage first, then the accelerator's cached
    blocks. Torch is used only if something already imported it."""
    gc.collect()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.cuda.empty_cache()
