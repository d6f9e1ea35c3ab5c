"""A scripted claim splitter and a scripted judge for the halluc metric, reading real pixels.

Captions name coloured shapes ("a red circle and a blue square", as `oracle.render` draws
them). `ClaimLLM` splits each named shape into two claims: an entity ("there is a red
shape") and an attribute depending on it ("the red shape is a circle"). Some captions make
it reply in the ways models break JSON. `PixelJudge` answers those questions from the
pixels with P(yes) = 0.9 when true and 0.2 when false, and logs every batch it is given.
"""

from __future__ import annotations

import json
import re
from typing import Sequence

import numpy as np
from PIL import Image

from cttd_fakes import judge_answer
from oracle import COLOURS, SHAPES

YES, NO = 0.9, 0.2
PAIR = re.compile(rf"\b({'|'.join(COLOURS)})\s+({'|'.join(SHAPES)})s?\b")


def scene(image: Image.Image) -> dict[str, str]:
    """colour -> shape of each shape drawn, the shape told by how much of its box it fills."""
    arr = np.asarray(image.convert("RGB"), dtype=np.int16)
    h, w, _ = arr.shape
    found = {}
    for name, rgb in COLOURS.items():
        mask = np.abs(arr - np.array(rgb)).sum(axis=2) < 40
        if mask.sum() > 0.005 * h * w:
            ys, xs = np.nonzero(mask)
            fill = mask.sum() / ((ys.max() - ys.min() + 1) * (xs.max() - xs.min() + 1))
            found[name] = "square" if fill > 0.9 else "circle" if fill > 0.65 else "triangle"
    return found


def claims_of(caption: str) -> list[dict]:
    out = []
    for colour, shape in PAIR.findall(caption.lower()):
        parent = len(out)
        out.append({"claim": f"there is a {colour} shape", "type": "entity", "question": f"Is there a {colour} shape?",
                    "span": f"{colour} {shape}", "depends_on": []})
        out.append({"claim": f"the {colour} shape is a {shape}", "type": "attribute",
                    "question": f"Is the {colour} shape a {shape}?", "span": shape, "depends_on": [parent]})
    return out


class ClaimLLM:
    """Captions holding a marker word get broken replies: "fenced" (a code fence, a trailing
    comma), "prose" (single quotes, prose around it), "garbled" (no JSON; the retry gives the claims of "a red circle"),
    "hopeless" (no JSON twice), "sloppy" (one entry without text, one of an unknown type, a
    dependency on a later claim)."""

    fingerprint = "claim-llm-v1"

    def __init__(self):
        self.prompts: list[str] = []

    def _reply(self, prompt: str) -> str:
        if prompt.startswith("Your previous reply could not be used"):  # it quotes the reply, not the caption
            return "still no JSON" if "(hopeless)" in prompt else json.dumps({"claims": claims_of("a red circle")})
        caption = re.search(r'Caption: "([^"]*)"', prompt).group(1)
        claims = claims_of(caption)
        if "fenced" in caption:
            return "```json\n" + json.dumps({"claims": claims}, indent=1).replace("}\n ]", "},\n ]") + "\n```"
        if "prose" in caption:
            return "Sure! Here they are: " + repr({"claims": claims}) + " Let me know."
        if "garbled" in caption:
            return "I cannot do that (garbled)."
        if "hopeless" in caption:
            return "I cannot do that (hopeless)."
        if "sloppy" in caption:
            claims = [*claims, {"type": "entity"}, {"claim": "it is sunny", "type": "weather"}]
            claims[0] = {**claims[0], "depends_on": [1]}  # a later claim: ignored
            return json.dumps({"claims": claims})
        return json.dumps({"claims": claims})

    def generate(self, prompts: Sequence[str], max_new_tokens: int = 64) -> list[str]:
        self.prompts += prompts
        return [self._reply(p) for p in prompts]

    def option_probs(self, prompts, options):
        raise NotImplementedError


class PixelJudge:
    """Answers the claims' questions from the pixels (`option_probs`; `batches` logs each
    call's (image digest, question) pairs) and QA-bank questions (`generate`)."""

    fingerprint = "pixel-judge-v1"

    def __init__(self):
        self.batches: list[list[tuple[str, str]]] = []

    def truth(self, question: str, image: Image.Image) -> bool:
        found = scene(image)
        m = re.match(r"Is there an? (\w+) shape\?", question)
        if m:
            return m.group(1) in found
        m = re.match(r"Is the (\w+) shape an? (\w+)\?", question)
        if m:
            return found.get(m.group(1)) == m.group(2)
        raise AssertionError(f"unexpected question {question!r}")

    def option_probs(self, requests, options) -> list[list[float]]:
        self.batches.append([(str(hash(r.image.tobytes())), r.prompt) for r in requests])
        out = []
        for r, opts in zip(requests, options):
            p = YES if self.truth(r.prompt, r.image) else NO
            out.append([p if o.lower() == "yes" else 1 - p if o.lower() == "no" else 0.0 for o in opts])
        return out

    def generate(self, requests, max_new_tokens: int = 64) -> list[str]:
        """QA-bank prompts (the Caption Turing Test's) answered as the CTTD tests' judge does."""
        return [judge_answer(r.prompt, r.image) for r in requests]


class ProbingClaimLLM(ClaimLLM):
    """`ClaimLLM` that also writes what `meta --probes` asks of its LLM: a paraphrase sharing
    no word with the reference, two triplets, and captions of three lengths."""

    fingerprint = "probing-claim-llm-v1"
    LENGTHS = {"briefly": "Shapes.", "50 words": "Some coloured shapes.", "120 words": "A few coloured shapes drawn."}

    def _reply(self, prompt: str) -> str:
        if prompt.startswith("Rewrite this image caption"):
            return "Paraphrase: geometry everywhere"
        if prompt.startswith("Here are captions"):
            return "<shape, is, coloured>\n<shape, sits on, white>"
        if prompt.startswith("Write a caption"):
            return next(text for cue, text in self.LENGTHS.items() if cue in prompt)
        return super()._reply(prompt)
