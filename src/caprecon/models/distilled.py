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
import math
from pathlib import Path, PurePath
from typing import Any, Sequence

import numpy as np
import torch
from PIL import Image
from torch import nn

from caprecon.core.errors import ConfigError
from caprecon.core.records import is_number
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


#: what config.json must hold, and of which type (`head`, `metric`, `objective` are optional)
CONFIG_KEYS = {"image_encoder": str, "text_encoder": str, "image_dim": int, "text_dim": int, "hidden": int,
               "target_mean": float, "target_scale": float}
#: the encoders' roles: the image encoder is an embedder, the text encoder a matcher's text side
ENCODER_ROLES = {"image_encoder": "embedder", "text_encoder": "matcher"}


def read_config(folder: Path) -> dict[str, Any]:
    """A distilled folder's config.json, checked: a JSON object with every key of `CONFIG_KEYS` of its
    type, sizes from 1 to `MAX_WIDTH`, the line onto the metric finite, a head this caprecon knows.
    Anything else is a `ConfigError` saying what is wrong."""
    from caprecon.core.checks import MAX_WIDTH

    path = folder / CONFIG
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:  # JSONDecodeError is a ValueError
        raise ConfigError(f"{path}: not valid JSON ({exc}); `caprecon distill` writes it") from None
    if not isinstance(config, dict):
        raise ConfigError(f"{path}: must be a JSON object, not {type(config).__name__}")
    missing = [key for key in CONFIG_KEYS if key not in config]
    if missing:
        raise ConfigError(f"{path}: lacks {', '.join(missing)}; `caprecon distill` writes them")
    for key, kind in CONFIG_KEYS.items():
        value = config[key]
        if kind is str and not (isinstance(value, str) and value.strip()):
            raise ConfigError(f"{path}: {key} must name a model (text), not {value!r}")
        if kind is int and not (isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_WIDTH):
            raise ConfigError(f"{path}: {key} must be a whole number from 1 to {MAX_WIDTH}, not {value!r}")
        if kind is float and not is_number(value):
            raise ConfigError(f"{path}: {key} must be a finite number, not {value!r}")
    kind = config.get("head", "value")
    if not isinstance(kind, str) or kind not in HEADS:
        raise ConfigError(f"{path}: unknown head {kind!r} (this caprecon knows {', '.join(HEADS)})")
    return config


#: room for the safetensors header beside the tensors' bytes
HEADER_ROOM = 1 << 20


def read_weights(folder: Path, head: nn.Module) -> dict[str, torch.Tensor]:
    """model.safetensors, checked against the head config.json describes (built on the meta device, so
    no memory is taken for a config that asks for too much): no larger than that head's weights can be
    (8 bytes each, and `HEADER_ROOM`), a safetensors file (read from its bytes, never unpickled nor
    mapped), the same tensor names and shapes, floating point and finite. Anything else is a
    `ConfigError` saying what is wrong."""
    from safetensors import SafetensorError
    from safetensors.torch import load

    path = folder / WEIGHTS
    expected = {name: tuple(t.shape) for name, t in head.state_dict().items()}
    most = 8 * sum(math.prod(shape) for shape in expected.values()) + HEADER_ROOM
    size = path.stat().st_size
    if size > most:
        raise ConfigError(f"{path}: {size} bytes, more than the {most} that the head config.json describes can "
                          f"take; the two files do not belong together")
    try:
        weights = load(path.read_bytes())
    except SafetensorError as exc:
        raise ConfigError(f"{path}: not a safetensors file of weights ({exc}); `caprecon distill` writes one "
                          f"(pickled weights are never loaded)") from None
    if weights.keys() != expected.keys():
        lacks, extra = sorted(expected.keys() - weights.keys()), sorted(weights.keys() - expected.keys())
        raise ConfigError(f"{path}: does not hold the {config_head(head)} head's weights"
                          + (f"; lacks {', '.join(lacks)}" if lacks else "")
                          + (f"; has unknown {', '.join(extra)}" if extra else ""))
    for name, shape in expected.items():
        tensor = weights[name]
        if tuple(tensor.shape) != shape:
            raise ConfigError(f"{path}: {name} has shape {list(tensor.shape)}, but config.json's sizes give "
                              f"{list(shape)}; the two files do not belong together")
        if not tensor.is_floating_point():
            raise ConfigError(f"{path}: {name} holds {tensor.dtype}, not floating-point weights")
        if not bool(torch.isfinite(tensor).all()):
            raise ConfigError(f"{path}: {name} holds weights that are not finite numbers (NaN or infinity)")
    return weights


def config_head(head: nn.Module) -> str:
    return next(kind for kind, cls in HEADS.items() if isinstance(head, cls))


def encoder_source(folder: Path, role: str, spec: str, allow_plugins: bool) -> str:
    """What to build the encoder config.json names as `role` from: a registry name as it is, a folder
    inside `folder` as its path, `module:Class` only with `allow_plugins`; anything else refused."""
    from caprecon.models import registry

    where = folder / CONFIG
    if spec in registry.ROLES[ENCODER_ROLES[role]][0]:
        return spec
    if registry.imports_code(spec):
        if not allow_plugins:
            raise registry.plugin_refused(str(where), role, spec)
        return spec
    inside = (folder / spec).resolve()
    if not PurePath(spec).is_absolute() and inside.is_relative_to(folder.resolve()) and inside.is_dir():
        return str(inside)
    names = ", ".join(registry.ROLES[ENCODER_ROLES[role]][0])
    raise ConfigError(f"{where}: {role} {spec!r} is neither a registered model ({names}) nor a folder inside "
                      f"{folder} (named relative to it); a distilled folder loads no model from elsewhere: copy "
                      f"the encoder into the folder and name it there (or name code as module:Class, which loads only "
                      f"with --allow-plugins)")


class DistilledReward(nn.Module):
    """The head with its encoders and the metric's scale: `forward` on features gives the
    metric's value; `score(images, captions)` computes the features first.

    Loaded from a folder (`from_pretrained`), its encoders are what config.json names, and only
    these: a registry name (`efficientnet-lite0`, `imagenet-labels`, ...), a folder inside the
    distilled folder (named relative to it), or `module:Class` code with `allow_plugins`. Any other
    path (`/etc`, `../elsewhere`) is refused: a distilled folder from someone else is a config file."""

    def __init__(self, config: dict[str, Any], head: RewardHead | None = None, *, folder: Path | None = None,
                 allow_plugins: bool = False):
        super().__init__()
        self.config = config
        kind = config.get("head", "value")
        if kind not in HEADS:
            raise ConfigError(f"distilled reward: unknown head {kind!r} in config.json "
                              f"(this caprecon knows {', '.join(HEADS)})")
        self.head = head or HEADS[kind](config["image_dim"], config["text_dim"], config["hidden"])
        self.folder, self.allow_plugins = folder, allow_plugins
        self._encoders: tuple[Any, Any] | None = None

    @classmethod
    def from_pretrained(cls, folder: str | Path, *, allow_plugins: bool = False) -> "DistilledReward":
        """The model saved in `folder`, its config.json and weights checked (`read_config`,
        `read_weights`) and its encoders' names too (see the class): a damaged or foreign folder is
        one `ConfigError` saying what is wrong. An encoder named as `module:Class` is code that
        loading would import: refused unless `allow_plugins`."""
        folder = Path(folder)
        if not (folder / CONFIG).is_file() or not (folder / WEIGHTS).is_file():
            raise ModelNotFoundError(f"{folder}: not a distilled reward folder (it needs {CONFIG} and {WEIGHTS}; "
                                     f"`caprecon distill` writes them)")
        config = read_config(folder)
        for role in ENCODER_ROLES:
            encoder_source(folder, role, config[role], allow_plugins)
        with torch.device("meta"):
            shaped = HEADS[config.get("head", "value")](config["image_dim"], config["text_dim"], config["hidden"])
        weights = read_weights(folder, shaped)
        model = cls(config, folder=folder, allow_plugins=allow_plugins)
        model.head.load_state_dict(weights)
        model.eval()
        return model

    def save_pretrained(self, folder: str | Path) -> None:
        from safetensors.torch import save_file

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        # strict JSON: a number that is not finite is refused here rather than written as `Infinity`
        (folder / CONFIG).write_text(json.dumps(self.config, indent=2, allow_nan=False), encoding="utf-8")
        save_file({k: v.contiguous() for k, v in self.head.state_dict().items()}, str(folder / WEIGHTS))

    @property
    def encoders(self) -> tuple[Any, Any]:
        """(image encoder, text encoder), built on first use from config.json (its names checked, see
        the class, when the model came from a folder)."""
        if self._encoders is None:
            built = []
            for role, kind in ENCODER_ROLES.items():
                spec = self.config[role]
                if self.folder is not None:
                    spec = encoder_source(self.folder, role, spec, self.allow_plugins)
                built.append(build_model(kind, spec, setting=role.replace("_", "-")))
            self._encoders = (built[0], built[1])
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
