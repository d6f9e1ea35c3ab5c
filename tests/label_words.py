"""A retrieval stand-in that chooses its picture by word overlap with ImageNet label names, not by
MiniLM: for measuring a distilled reward whose text encoder (MiniLM, the offline default) cannot
read the stand-in's own rule (`benchmarks/reward.py`, `tests/test_distill.py`).

`LabelWordMatcher` is the offline matcher (`ImageNetLabelMatcher`: an image is the probability-
weighted mean of its top-k ImageNet classes) with the sentence encoder replaced by a bag of words
over the vocabulary of the 1000 label names: a caption is the unit vector of the label words it
uses, an image that of the words of the classes the classifier sees in it. A caption that uses no
label word matches every picture equally, and retrieval then takes the gallery's first.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from caprecon.models.generator import RetrievalGenerator
from caprecon.models.matcher import ImageNetLabelMatcher
from caprecon.models.registry import demo_gallery

_WORD = re.compile(r"[a-z]+")
# words of the label names that say nothing about what is seen ("kite (bird of prey)", "a cat having ...")
_STOP = {"a", "an", "the", "of", "and", "or", "with", "in", "on", "for", "to", "having", "photo"}


def words(text: str) -> list[str]:
    """Lower-case words, a trailing plural 's' dropped ("dogs" is "dog"), stop words left out."""
    found = []
    for word in _WORD.findall(text.lower()):
        if len(word) > 3 and word.endswith("s") and not word.endswith("ss"):
            word = word[:-1]
        if word not in _STOP:
            found.append(word)
    return found


class LabelWordMatcher(ImageNetLabelMatcher):
    """Captions and images as bags of ImageNet label words (see the module's docstring)."""

    def __init__(self, **options: Any):
        super().__init__(**options)
        self.vocabulary = sorted({w for name in self.label_names for w in words(name)})
        self.column = {w: k for k, w in enumerate(self.vocabulary)}

    @property
    def fingerprint(self) -> str:
        digest = hashlib.sha256("\n".join(self.vocabulary).encode()).hexdigest()[:16]
        return f"label-words-{digest}-{self.top_k}-{self.classifier.fingerprint}"

    def describe(self) -> dict[str, Any]:
        return {"backend": "label-words", "vocabulary": len(self.vocabulary), "top_k": self.top_k,
                "fingerprint": self.fingerprint}

    def embed_texts(self, texts: Sequence[str]) -> np.ndarray:
        out = np.zeros((len(texts), len(self.vocabulary)), dtype=np.float32)
        for row, text in enumerate(texts):
            for word in words(text):
                if word in self.column:
                    out[row, self.column[word]] += 1.0
        return out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-12)


def label_word_retrieval(gallery: str | Path | None = None) -> RetrievalGenerator:
    """The offline preset's generator (retrieval from the demo gallery, the scored photo left out)
    with `LabelWordMatcher` choosing the picture."""
    return RetrievalGenerator(gallery or demo_gallery(), LabelWordMatcher(), exclude_source=True)
