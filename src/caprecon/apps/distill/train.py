"""Training the distilled head: the objective (`auto` chosen from the runs), the encoder the
reconstruction objective defaults to, the head fitted, and the line or standardisation onto the metric."""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np
from tqdm.auto import tqdm

from caprecon.apps.distill.heldout import same_image_pairs
from caprecon.apps.distill.rows import Row
from caprecon.core.errors import ConfigError

OBJECTIVES = ("auto", "reconstruction", "value", "pairs")


def head_of(objective: str) -> str:
    """The head an objective trains (`caprecon.models.distilled.HEADS`): the reconstruction head for
    `reconstruction`, the value head for `value` and `pairs`."""
    return "reconstruction" if objective == "reconstruction" else "value"


def choose_objective(objective: str, rows: Sequence[Row], sources: Sequence[dict[str, Any]] = ()) -> str:
    """`auto`: reconstruction where every run describes the metric as comparing the image with its
    reconstruction by an embedder (recon, clip-image; not VQAScore on the reconstruction) and every
    row names reconstructions its run's store holds, else value. `reconstruction` on rows without
    reconstructions is refused, naming the first such row."""
    if objective == "auto":
        complete = all(s.get("compares_embeddings") for s in sources) and \
            all(r.reconstructions and all(x.path is not None for x in r.reconstructions) for r in rows)
        return "reconstruction" if complete else "value"
    if objective == "reconstruction":
        bare = next((k for k, r in enumerate(rows) if not r.reconstructions), None)
        if bare is not None:
            raise ConfigError(f"--objective reconstruction: row {bare + 1} ({rows[bare].where or rows[bare].image}) "
                              f"names no reconstruction (only reconstruction metrics' runs do); choose --objective "
                              f"value or pairs")
    return objective


def runs_embedder(sources: Sequence[dict[str, Any]]) -> str | None:
    """The embedder the runs' metric compared images with, when they all name the same one without
    options and by a name or folder (not `module:Class` code): the reconstruction head's image encoder,
    so that the reward compares in the metric's own space. None: the default encoder."""
    from caprecon.models import registry

    named = {s.get("embedder") for s in sources}
    spec = named.pop() if len(named) == 1 else None
    if isinstance(spec, str) and spec and not registry.imports_code(spec) and \
            not any(s.get("embedder_options") for s in sources):
        return spec
    return None


def train_head(image: np.ndarray, text: np.ndarray, target: np.ndarray, groups: Sequence[str], *,
               objective: str = "value", hidden: int = 256, epochs: int = 200, lr: float = 1e-3,
               weight_decay: float = 1e-4, seed: int = 0, batch: int = 256, progress: bool = False):
    """A `RewardHead` fitted to the standardised `target` (value) or to its order within each image
    (pairs); for `reconstruction`, a `ReconstructionHead` whose text MLP regresses `target`, the
    rows' mean unit reconstruction embeddings (squared error summed over the dimensions), so that
    it predicts the embedding expected over seeds."""
    import torch

    from caprecon.models.distilled import HEADS

    torch.manual_seed(seed)
    head = HEADS[head_of(objective)](image.shape[1], text.shape[1], hidden)
    opt = torch.optim.AdamW(head.parameters(), lr=lr, weight_decay=weight_decay)
    x_img, x_txt = torch.as_tensor(image, dtype=torch.float32), torch.as_tensor(text, dtype=torch.float32)
    y = torch.as_tensor(target, dtype=torch.float32)
    generator = torch.Generator().manual_seed(seed)
    count = len(y)
    if objective == "pairs":
        i, j = same_image_pairs(groups)
        decided = target[i] != target[j]
        i, j = torch.as_tensor(i[decided]), torch.as_tensor(j[decided])
        if not len(i):
            raise ConfigError("objective pairs: no two captions of one image differ in the metric")
        wins = (y[i] > y[j]).float()
        count = len(i)

    def loss_of(idx: torch.Tensor) -> torch.Tensor:
        if objective == "reconstruction":
            return ((head.reconstruction(x_txt[idx]) - y[idx]) ** 2).sum(-1).mean()
        if objective == "pairs":
            a, b = i[idx], j[idx]
            margin = head(x_img[a], x_txt[a]) - head(x_img[b], x_txt[b])
            return torch.nn.functional.binary_cross_entropy_with_logits(margin, wins[idx])
        return torch.nn.functional.mse_loss(head(x_img[idx], x_txt[idx]), y[idx])

    head.train()
    for _ in tqdm(range(epochs), desc=f"distill: training ({objective})", unit="epoch", disable=not progress):
        for idx in torch.randperm(count, generator=generator).split(batch):
            loss = loss_of(idx)
            opt.zero_grad()
            loss.backward()
            opt.step()
    head.eval()
    return head


def onto_metric(head: Any, image: np.ndarray, text: np.ndarray, truth: np.ndarray) -> tuple[float, float]:
    """(mean, scale) mapping the reconstruction head's cosine onto the metric's scale: the least-squares
    line of the metric on the head's output over the training rows (ReconScore is (1 + cos) / 2, a
    raw-cosine metric the cosine itself; the line finds either)."""
    import torch

    with torch.inference_mode():
        out = head(torch.as_tensor(image, dtype=torch.float32), torch.as_tensor(text, dtype=torch.float32)).numpy()
    if np.ptp(out) == 0:
        return float(truth.mean()), 1.0
    scale, mean = np.polyfit(out.astype(np.float64), truth, 1)
    return float(mean), float(scale)


def standardising(values: np.ndarray, rows: Sequence[Row], metric: str) -> tuple[float, float]:
    """(mean, standard deviation) of the training rows' values (a deviation of 0: 1), refused, naming
    the largest value's row, where they are too large for either to be a finite number."""
    with np.errstate(over="ignore", invalid="ignore"):
        mean, scale = float(values.mean()), float(values.std())
    if not (math.isfinite(mean) and math.isfinite(scale)):
        k = int(np.argmax(np.abs(values)))
        raise ConfigError(f"{metric}'s values are too large to learn (their mean or spread is not a finite number; "
                          f"{values[k]!r} at {rows[k].where or rows[k].image}); rescale them first")
    return mean, scale or 1.0
