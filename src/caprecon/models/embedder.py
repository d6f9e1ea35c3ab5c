"""The image-embedder role: map images to unit vectors whose cosine means 'looks alike'.

Backends: Hugging Face vision towers (CLIP and SigLIP image features, DINOv2 and other
ViTs' pooled output), DreamSim (optional extra), and the packaged EfficientNet-Lite0 used
by the offline demo.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, ClassVar, Protocol, Sequence, runtime_checkable

import numpy as np
from PIL import Image

from caprecon.models.common import ModelNotFoundError, computation, dtype_name, resolve_device, resolve_source, torch_dtype


@runtime_checkable
class ImageEmbedder(Protocol):
    """Role protocol: `embed` returns an (n, d) float32 array of L2-normalised rows."""

    @property
    def fingerprint(self) -> str: ...

    def embed(self, images: Sequence[Image.Image]) -> np.ndarray: ...


def l2_normalise(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float32)
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


# families whose image features come from `get_image_features` (a joint image-text space)
_JOINT_SPACE = {"clip", "siglip", "siglip2", "chinese_clip", "altclip", "metaclip_2"}


class HFVisionEmbedder:
    """A transformers vision model: CLIP/SigLIP image features, or a ViT's pooled output.

    The family is read from the checkpoint's `config.json`: joint image-text models
    (CLIP, SigLIP, ...) give their projected image features; others (DINOv2, ViT, ...)
    give `pooler_output` (DINOv2: the layer-normed CLS token).
    """

    # bump when a change here or in ClipMatcher's text side changes the embeddings (one revision: both
    # towers share this fingerprint)
    code_revision: ClassVar[int] = 1
    numeric_libraries: ClassVar[tuple[str, ...]] = ("torch", "transformers")

    def __init__(self, model: str | Path, *, revision: str | None = None, device: str | None = "auto",
                 dtype: str | None = "float32", batch_size: int = 16):
        self.source = resolve_source(model, revision, kind="embedder")
        self.device = resolve_device(device)
        self.dtype_name = dtype_name(dtype, self.device)
        self.batch_size = max(1, int(batch_size))
        self._model = None
        self._processor = None

    @property
    def fingerprint(self) -> str:
        return self.source.fingerprint(backend="hf-vision", dtype=self.dtype_name, **computation(self))

    def describe(self) -> dict[str, Any]:
        return {"backend": "hf-vision", "model": self.source.name, "revision": self.source.revision,
                "dtype": self.dtype_name, "text_budget": None, "fingerprint": self.fingerprint}  # reads no text

    @property
    def dtype(self):
        return torch_dtype(self.dtype_name, self.device)

    @property
    def model(self):
        """The loaded model (loaded on first use); a CLIP matcher uses its text tower too."""
        if self._model is None:
            import transformers

            config = transformers.AutoConfig.from_pretrained(self.source.load_target, revision=self.source.revision)
            self.joint = config.model_type in _JOINT_SPACE
            self._model = transformers.AutoModel.from_pretrained(self.source.load_target, revision=self.source.revision,
                                                                 dtype=self.dtype).to(self.device).eval()
            # the PIL backend: no torchvision needed, and every machine preprocesses alike
            self._processor = transformers.AutoImageProcessor.from_pretrained(
                self.source.load_target, revision=self.source.revision, backend="pil")
        return self._model

    def embed(self, images: Sequence[Image.Image]) -> np.ndarray:
        import torch

        model, processor = self.model, self._processor
        chunks = []
        for start in range(0, len(images), self.batch_size):
            batch = [im if im.mode == "RGB" else im.convert("RGB") for im in images[start : start + self.batch_size]]
            pixels = processor(images=batch, return_tensors="pt")["pixel_values"].to(self.device, self.dtype)
            with torch.inference_mode():
                if self.joint:
                    feats = model.get_image_features(pixel_values=pixels).pooler_output
                else:
                    feats = model(pixel_values=pixels).pooler_output
            chunks.append(feats.float().cpu().numpy())
        if not chunks:
            return np.zeros((0, 0), dtype=np.float32)
        return l2_normalise(np.concatenate(chunks))


class DreamSimEmbedder:
    """DreamSim (Fu et al., 2023), the paper's default ReconScore feature extractor.

    Needs the `dreamsim` extra (it brings torchvision, open_clip and timm) and its weights
    in `weights_dir` (default `$CAPRECON_DREAMSIM_DIR`, else `~/.cache/caprecon/dreamsim`):
    they are never downloaded at run time.
    """

    code_revision: ClassVar[int] = 1  # bump when a change here changes the embeddings
    numeric_libraries: ClassVar[tuple[str, ...]] = ("torch", "torchvision", "dreamsim")

    # What `dreamsim(cache_dir=DIR)` (dreamsim 0.2) reads from DIR, per variant: its LoRA adapter and
    # backbone checkpoints, and for DINO backbones the torch.hub repository and weights (dreamsim
    # makes DIR torch.hub's folder). A missing one would make dreamsim download, so each is checked.
    _DINO_HUB = ("facebookresearch_dino_main", "checkpoints/dino_vitbase16_pretrain.pth")
    _DINOV2_HUB = ("facebookresearch_dinov2_main", "checkpoints/dinov2_vitb14_pretrain.pth")
    WEIGHT_FILES = {
        "ensemble": ("ensemble_lora", "dino_vitb16_pretrain.pth", "clip_vitb16_pretrain.pth.tar",
                     "open_clip_vitb16_pretrain.pth.tar", *_DINO_HUB),
        "dino_vitb16": ("dino_vitb16_single_lora", "dino_vitb16_pretrain.pth", *_DINO_HUB),
        "open_clip_vitb32": ("open_clip_vitb32_single_lora", "open_clip_vitb32_pretrain.pth.tar"),
        "clip_vitb32": ("clip_vitb32_single_lora", "clip_vitb32_pretrain.pth.tar"),
        "dinov2_vitb14": ("dinov2_vitb14_single_lora", "dinov2_vitb14_pretrain.pth", *_DINOV2_HUB),
        "synclr_vitb16": ("synclr_vitb16_single_lora", "synclr_vit_b_16.pth"),
    }

    def __init__(self, variant: str = "ensemble", *, weights_dir: str | Path | None = None,
                 device: str | None = "auto", batch_size: int = 16):
        if variant not in self.WEIGHT_FILES:
            raise ValueError(f"unknown DreamSim variant {variant!r}; choose from {sorted(self.WEIGHT_FILES)}")
        self.variant = variant
        self.weights_dir = Path(weights_dir or os.environ.get("CAPRECON_DREAMSIM_DIR")
                                or Path.home() / ".cache" / "caprecon" / "dreamsim")
        self.device = resolve_device(device)
        self.batch_size = batch_size
        self._check_weights()
        self._model = None
        self._preprocess = None

    def _check_weights(self) -> None:
        missing = [name for name in self.WEIGHT_FILES[self.variant] if not (self.weights_dir / name).exists()]
        if missing:
            raise ModelNotFoundError(
                f"DreamSim weights for {self.variant!r} are incomplete in {self.weights_dir}: missing "
                f"{', '.join(missing)}. On a machine with network run: python -c \"from dreamsim import dreamsim; "
                f"dreamsim(pretrained=True, dreamsim_type='{self.variant}', cache_dir='DIR')\", then copy DIR here "
                f"and pass --embedder-opt weights_dir=DIR or set CAPRECON_DREAMSIM_DIR."
            )

    @property
    def fingerprint(self) -> str:
        import hashlib

        from caprecon.models.common import file_digest

        files = sorted((p.relative_to(self.weights_dir).as_posix(), file_digest(p))
                       for p in self.weights_dir.rglob("*") if p.is_file())
        return hashlib.sha256(f"dreamsim|{self.variant}|{files}|{computation(self)}".encode()).hexdigest()[:24]

    def describe(self) -> dict[str, Any]:
        return {"backend": "dreamsim", "variant": self.variant, "weights_dir": str(self.weights_dir),
                "text_budget": None, "fingerprint": self.fingerprint}  # reads no text

    def _load(self):
        if self._model is None:
            try:
                from dreamsim import dreamsim
            except ImportError:
                raise ModelNotFoundError("DreamSim needs the optional extra: pip install 'caprecon[dreamsim]'") from None
            self._model, self._preprocess = dreamsim(pretrained=True, device=self.device,
                                                     cache_dir=str(self.weights_dir), dreamsim_type=self.variant)
        return self._model, self._preprocess

    def embed(self, images: Sequence[Image.Image]) -> np.ndarray:
        import torch

        model, preprocess = self._load()
        chunks = []
        for start in range(0, len(images), self.batch_size):
            batch = torch.cat([preprocess(im.convert("RGB")) for im in images[start : start + self.batch_size]])
            with torch.inference_mode():
                chunks.append(model.embed(batch.to(self.device)).float().cpu().numpy())
        return l2_normalise(np.concatenate(chunks)) if chunks else np.zeros((0, 0), dtype=np.float32)
