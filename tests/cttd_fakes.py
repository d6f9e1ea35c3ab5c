"""Deterministic stand-ins for the CTTD builder's models, reading real pixels.

Random tiny VLMs write noise, which a builder must drop; to test what the builder does
with *content*, `ScriptedVLM` plays the questioner and the judge on images of coloured
shapes on white (`oracle.render`). It writes each test category's reply in one of the
ways models break JSON, answers judge prompts from the pixels, and can log its calls
and stop mid-build (for the resume test). `WordMatcher` puts texts and images in one
bag-of-words space: an image "says" the colour words of the shapes in it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from pathlib import Path
from typing import Sequence

import numpy as np
from PIL import Image

from caprecon.models.vlm import VLMRequest
from oracle import COLOURS

# the test taxonomy: each category's reply is broken in its own way
TAXONOMY = [
    {"name": "colour", "description": "colours of the shapes (clean JSON)"},
    {"name": "count", "description": "how many shapes (in a code fence, trailing commas)"},
    {"name": "where", "description": "where shapes are (single-quoted, prose around it)"},
    {"name": "truncated", "description": "a reply cut off by the token limit"},
    {"name": "wrong-keys", "description": "the right content under other key names"},
    {"name": "two-lists", "description": "JSON of the wrong shape: fixed by the retry"},
    {"name": "garbage", "description": "no JSON at all, twice: dropped"},
]


def shapes(image: Image.Image) -> list[tuple[str, tuple[float, float, float, float]]]:
    """(colour name, normalised box) of each shape, left to right."""
    arr = np.asarray(image.convert("RGB"), dtype=np.int16)
    h, w, _ = arr.shape
    found = []
    for name, rgb in COLOURS.items():
        mask = (np.abs(arr - np.array(rgb)).sum(axis=2) < 40)
        if mask.sum() > 0.01 * h * w:
            ys, xs = np.nonzero(mask)
            box = (xs.min() / w, ys.min() / h, (xs.max() + 1) / w, (ys.max() + 1) / h)
            found.append((name, tuple(round(float(v), 3) for v in box)))
    return sorted(found, key=lambda s: s[1][0])


def _qas(image: Image.Image) -> dict[str, list[dict]]:
    found = shapes(image)
    first = found[0][0] if found else "red"
    present = {c for c, _ in found}
    absent = next(c for c in COLOURS if c not in present)
    colour_choices = [c for c in ("red", "green", "blue", "yellow") if c != first][:3] + [first]
    return {
        "colour": [
            {"question": "What colour is the leftmost shape?", "type": "mc", "choices": colour_choices,
             "answer": first},
            {"question": f"Is there a {first} shape in the image?", "type": "yesno", "answer": "yes"},
            {"question": f"Is there a {first} shape in the image ?", "type": "yesno", "answer": "yes"},  # near-twin
            {"question": "What is behind the shapes?", "type": "short"},  # no answer
            {"question": f"Is there a {absent} shape in the image?", "type": "yesno", "answer": "yes"},  # wrong
        ],
        "count": [{"question": "How many shapes are there?", "type": "short", "answer": str(len(found))}],
        "where": [{"question": "Where is the leftmost shape?", "type": "box",
                   "answer": list(found[0][1]) if found else [0, 0, 1, 1]}],
        "truncated": [{"question": f"Is the leftmost shape {first}?", "type": "yesno", "answer": "yes"},
                      {"question": "Is the background white?", "type": "yesno", "answer": "yes"}],
        "wrong-keys": [{"q": f"Is there a {first} shape in the picture?", "kind": "yes/no", "a": "yes"}],
    }


def _reply(category: str, image: Image.Image) -> str:
    qas = _qas(image)
    if category == "colour":
        return json.dumps({"qas": qas["colour"]})
    if category == "count":
        body = json.dumps({"qas": qas["count"]}, indent=1).replace("}\n ]", "},\n ],")
        return f"```json\n{body}\n```"
    if category == "where":
        return "Here are the pairs: " + repr({"qas": qas["where"]}) + " Hope this helps!"
    if category == "truncated":
        text = json.dumps({"qas": qas["truncated"]})
        return text[: text.index("white") + 3]  # cut inside the second pair's question
    if category == "wrong-keys":
        return json.dumps({"items": qas["wrong-keys"]})
    if category == "two-lists":
        return json.dumps({"qas": [], "more": []})
    return "I am sorry, I cannot help with that."


_REPAIRED = json.dumps({"qas": [{"question": "Is the background white?", "type": "yesno", "answer": "yes"}]})


def judge_answer(prompt: str, image: Image.Image) -> str:
    """What a perfect judge says about the shapes image."""
    question, *rest = prompt.split("\n")
    found = shapes(image)
    colours = [c for c, _ in found]
    if question.startswith("What colour is the leftmost shape"):
        options = [line.split(". ", 1) for line in rest if re.match(r"^[A-Z]\. ", line)]
        return next((letter for letter, text in options if found and text == colours[0]), "A")
    m = re.match(r"Is there an? (\w+) shape", question)
    if m:
        return "yes" if m.group(1) in colours else "no"
    m = re.match(r"Is the leftmost shape (\w+)", question)
    if m:
        return "yes" if colours and colours[0] == m.group(1) else "no"
    if question.startswith("Is the background white"):
        return "yes"
    if question.startswith("How many shapes"):
        return str(len(found))
    if question.startswith("Where is the leftmost shape") and found:
        return json.dumps(list(found[0][1]))
    return "I do not know"


class ScriptedVLM:
    """Questioner and judge in one, deterministic. Environment switches (for subprocess
    builds): CTTD_FAKE_LOG appends one JSON line per answered request; CTTD_FAKE_BLOCK_AFTER=K
    makes the (K+1)-th generation batch write CTTD_FAKE_LOG + '.blocked' and hang."""

    def __init__(self, delay: float = 0.0):
        self.delay = float(delay)
        self.calls = 0  # requests answered
        self.generation_batches = 0

    @property
    def fingerprint(self) -> str:
        return "scripted-vlm-v1"

    def describe(self) -> dict:
        return {"backend": "scripted", "model": "tests/cttd_fakes.py:ScriptedVLM", "fingerprint": self.fingerprint}

    def _reply(self, request: VLMRequest) -> str:
        prompt = request.prompt
        if prompt.startswith("Your previous reply could not be used"):
            return "still not JSON" if "I am sorry" in prompt else _REPAIRED
        m = re.search(r'in the category "([^"]+)"', prompt)
        if m:
            return _reply(m.group(1), request.image)
        if "different questions about it" in prompt:
            return json.dumps({"questions": ["What colour is the leftmost shape?", "How many shapes are there?"]})
        return judge_answer(prompt, request.image)

    def generate(self, requests: Sequence[VLMRequest], max_new_tokens: int = 64) -> list[str]:
        log = os.environ.get("CTTD_FAKE_LOG")
        if any('in the category "' in r.prompt for r in requests):
            block_after = os.environ.get("CTTD_FAKE_BLOCK_AFTER")
            if block_after is not None and self.generation_batches >= int(block_after):
                Path(log + ".blocked").write_text(str(self.generation_batches))
                while True:  # the test kills the process here, mid-stage
                    time.sleep(1)
            self.generation_batches += 1
        replies = []
        for r in requests:
            time.sleep(self.delay)
            replies.append(self._reply(r))
            self.calls += 1
        if log:
            with open(log, "a", encoding="utf-8") as fh:
                for r in requests:
                    digest = hashlib.sha256(r.prompt.encode() + r.image.tobytes()).hexdigest()[:16]
                    fh.write(json.dumps({"pid": os.getpid(), "call": digest}) + "\n")
        return replies

    def option_probs(self, requests: Sequence[VLMRequest], options: Sequence[Sequence[str]]) -> list[list[float]]:
        said = self.generate(requests)
        return [[1.0 if o.lower() == s.lower() else 0.0 for o in opts] for s, opts in zip(said, options)]

    def answer_prob(self, requests: Sequence[VLMRequest], answers: Sequence[str]) -> list[float]:
        said = self.generate(requests)
        return [1.0 if a.lower() == s.lower() else 0.0 for s, a in zip(said, answers)]


class ScriptedLLM:
    """A text-only LLM: names a cluster after its questions' first key word, and answers
    blind only what needs no image (the background is white; else it guesses "A")."""

    fingerprint = "scripted-llm-v1"

    def __init__(self):
        self.calls = 0

    def _reply(self, prompt: str) -> str:
        if "Name the ability" in prompt:
            words = re.findall(r"\b(colour|many|where)\b", prompt)
            name = {"many": "count"}.get(words[0], words[0]) if words else "misc"
            return json.dumps({"name": name, "description": f"questions about {name}"})
        return "yes" if "background white" in prompt else "A"

    def generate(self, prompts: Sequence[str], max_new_tokens: int = 64) -> list[str]:
        self.calls += len(prompts)
        return [self._reply(p) for p in prompts]

    def option_probs(self, prompts, options):
        raise NotImplementedError


def _word_vector(words: Sequence[str], dim: int = 128) -> np.ndarray:
    v = np.full(dim, 1e-3, dtype=np.float32)
    for w in words:
        v[int(hashlib.sha256(w.encode()).hexdigest(), 16) % dim] += 1.0
    return v / np.linalg.norm(v)


class WordMatcher:
    """Texts as bags of words; an image as the words of its shapes' colours."""

    fingerprint = "word-matcher-v1"

    def embed_texts(self, texts: Sequence[str]) -> np.ndarray:
        return np.stack([_word_vector(re.findall(r"[a-z0-9]+", t.lower())) for t in texts])

    def embed_images(self, images: Sequence[Image.Image]) -> np.ndarray:
        return np.stack([_word_vector([c for c, _ in shapes(im)] + ["shape"]) for im in images])


def write_example(folder: Path) -> None:
    """The docs' offline example (docs/question-bank.md): six shape scenes (and four images stage 1 drops), the
    test taxonomy, and a captions file with a right and a wrong caption per scene."""
    from oracle import render

    scenes = ["a red circle and a blue square", "a green triangle", "a yellow square and a red circle",
              "a blue circle", "a purple square and a green circle", "a black triangle and a yellow circle"]
    images = folder / "shapes"
    images.mkdir(parents=True, exist_ok=True)
    captions = []
    for i, scene in enumerate(scenes):
        render(scene, 96, 96).save(images / f"scene{i}.png")
        captions += [{"id": f"scene{i}-right", "image": f"shapes/scene{i}.png", "caption": scene},
                     {"id": f"scene{i}-wrong", "image": f"shapes/scene{i}.png", "caption": "a purple triangle",
                      "candidate_index": 1}]
    render("", 96, 96).save(images / "blank.png")
    render("a red circle", 20, 20).save(images / "tiny.png")
    (images / "broken.png").write_bytes(b"not an image")
    render(scenes[0], 96, 96).save(images / "scene9-copy.png")
    (folder / "taxonomy.json").write_text(json.dumps(TAXONOMY, indent=1))
    (folder / "captions.jsonl").write_text("\n".join(json.dumps(c) for c in captions) + "\n")


if __name__ == "__main__":
    import sys

    write_example(Path(sys.argv[1]))
