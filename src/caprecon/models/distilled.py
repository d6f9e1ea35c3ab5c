"""A distilled reward model: a small head over a frozen image encoder and a frozen text encoder.

`caprecon distill` trains the head to predict a metric (say ReconScore) from the two encoders'
features of (image, caption), so that the metric's text-to-image model is not needed where the
reward is used. Two heads: `RewardHead` reads both features and learns the metric's value (or its
order); `ReconstructionHead` has the metric's own form, for metrics that compare the image with
its reconstruction: it predicts the reconstruction's embedding from the caption alone and compares
the image's embedding with it. The folder it writes holds `config.json` (the encoders, the head's
kind and shape, the affine map onto the metric's scale fitted on the training rows) and
`model.safetensors` (the head's weights).

    model = DistilledReward.from_pretrained("rewards/recon")   # an nn.Module
    model.score(images, captions)                               # the metric's scale
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
from PIL import Image
from torch import nn

from caprecon.models.build import build_model
from caprecon.models.common import ModelNotFoundError

CONFIG = "config.json"
WEIGHTS = "model.safetensors"
# the offline defaults: the demo's EfficientNet-Lite0 features, and MiniLM (the text side of its matcher)
DEFAULT_IMAGE_ENCODER = "efficientnet-lite0"
DEFAULT_TEXT_ENCODER = "imagenet-labels"


class RewardHead(nn.Module):
    """Both features projected to `hidden`, then an MLP over [image, text, image * text]: the
    product lets a small head read agreement between the two, which a sum of them cannot."""

    def __init__(self, image_dim: int, text_dim: int, hidden: int = 256):
        super().__init__()
        self.image = nn.Linear(image_dim, hidden)
        self.text = nn.Linear(text_dim, hidden)
        self.mlp = nn.Sequential(nn.GELU(), nn.Linear(3 * hidden, hidden), nn.GELU(), nn.Linear(hidden, 1))

    def forward(self, image_features: torch.Tensor, text_features: torch.Tensor) -> torch.Tensor:
        i, t = self.image(image_features), self.text(text_features)
        return self.mlp(torch.cat([i, t, i * t], dim=-1)).squeeze(-1)


class ReconstructionHead(nn.Module):
    """The metric's own form: an MLP maps the caption's text features to the embedding its
    reconstruction is expected to have (trained on the unit embeddings of the reconstructions the
    runs made, so it learns their mean over seeds), and the output is that prediction's dot product
    with the image's unit embedding: the expected cosine of the image with a reconstruction. The
    image encoder must be the metric's embedder for the two to share a space."""

    def __init__(self, image_dim: int, text_dim: int, hidden: int = 256):
        super().__init__()
        self.text = nn.Sequential(nn.Linear(text_dim, hidden), nn.GELU(), nn.Linear(hidden, image_dim))

    def reconstruction(self, text_features: torch.Tensor) -> torch.Tensor:
        return self.text(text_features)

    def forward(self, image_features: torch.Tensor, text_features: torch.Tensor) -> torch.Tensor:
        image = nn.functional.normalize(image_features, dim=-1)
        return (image * self.reconstruction(text_features)).sum(-1)


#: the heads a config.json may name (older folders name none: the value head)
HEADS = {"value": RewardHead, "reconstruction": ReconstructionHead}


def encoder_spec(model: Any) -> str:
    """How config.json names an encoder: its registry name or folder as given, or `module:Class`
    of an object (rebuilt without options when the folder is loaded)."""
    return model if isinstance(model, str) else f"{type(model).__module__}:{type(model).__qualname__}"


class DistilledReward(nn.Module):
    """The head with its encoders and the metric's scale: `forward` on features gives the
    metric's value; `score(images, captions)` computes the features first."""

    def __init__(self, config: dict[str, Any], head: RewardHead | None = None):
        super().__init__()
        self.config = config
        kind = config.get("head", "value")
        if kind not in HEADS:
            raise ModelNotFoundError(f"distilled reward: unknown head {kind!r} in config.json "
                                     f"(this caprecon knows {', '.join(HEADS)})")
        self.head = head or HEADS[kind](config["image_dim"], config["text_dim"], config["hidden"])
        self._encoders: tuple[Any, Any] | None = None

    @classmethod
    def from_pretrained(cls, folder: str | Path, *, allow_plugins: bool = False) -> "DistilledReward":
        """The model saved in `folder`. An encoder its config.json names as `module:Class` is code that
        loading would import: refused unless `allow_plugins` (a folder from someone else is a config file)."""
        from safetensors.torch import load_file

        from caprecon.models import registry

        folder = Path(folder)
        if not (folder / CONFIG).is_file() or not (folder / WEIGHTS).is_file():
            raise ModelNotFoundError(f"{folder}: not a distilled reward folder (it needs {CONFIG} and {WEIGHTS}; "
                                     f"`caprecon distill` writes them)")
        config = json.loads((folder / CONFIG).read_text(encoding="utf-8"))
        for role in ("image_encoder", "text_encoder"):
            if not allow_plugins and registry.imports_code(str(config.get(role, ""))):
                raise registry.plugin_refused(str(folder / CONFIG), role, config[role])
        model = cls(config)
        model.head.load_state_dict(load_file(str(folder / WEIGHTS)))
        model.eval()
        return model

    def save_pretrained(self, folder: str | Path) -> None:
        from safetensors.torch import save_file

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / CONFIG).write_text(json.dumps(self.config, indent=2), encoding="utf-8")
        save_file({k: v.contiguous() for k, v in self.head.state_dict().items()}, str(folder / WEIGHTS))

    @property
    def encoders(self) -> tuple[Any, Any]:
        """(image encoder, text encoder), built on first use from config.json."""
        if self._encoders is None:
            self._encoders = (build_model("embedder", self.config["image_encoder"], setting="image-encoder"),
                              build_model("matcher", self.config["text_encoder"], setting="text-encoder"))
        return self._encoders

    def use_encoders(self, image_encoder: Any, text_encoder: Any) -> None:
        """Encoders already built (the ones it was trained with), instead of building them again."""
        self._encoders = (image_encoder, text_encoder)

    def forward(self, image_features: torch.Tensor, text_features: torch.Tensor) -> torch.Tensor:
        return self.head(image_features, text_features) * self.config["target_scale"] + self.config["target_mean"]

    def predict(self, image_features: np.ndarray, text_features: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            out = self(torch.as_tensor(image_features, dtype=torch.float32),
                       torch.as_tensor(text_features, dtype=torch.float32))
        return out.numpy().astype(np.float64)

    def score(self, images: Sequence[Image.Image], captions: Sequence[str]) -> list[float]:
        image_encoder, text_encoder = self.encoders
        return self.predict(image_encoder.embed(list(images)), text_encoder.embed_texts(list(captions))).tolist()
